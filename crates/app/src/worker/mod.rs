//! The worker runtime: runs queued tasks with handlers registered by kind.
//!
//! A [`Worker`] owns N task slots and claims only as many tasks as it has
//! free slots. [`Worker::step`] runs one claim/execute/finish cycle (tests
//! drain a queue with it, without sleeping); [`Worker::run`] is the driver
//! loop: claim, wait for a wake-up hint or the 1 s poll, heartbeat, sweep
//! expired leases and purge old rows in the background, and on shutdown stop
//! claiming, let running tasks finish for a grace period, then release the
//! leases still held so another worker picks them up at once.

mod builtin;
mod runtime;

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use parlance_ports::{Clock, Lease, TaskQueue, WorkerId};
use serde_json::Value;

pub use builtin::{RECORD_KIND, SLEEP_KIND, register_test_handlers};
pub use runtime::{StepReport, Worker, WorkerConfig};

/// Why a task attempt failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct TaskError {
    /// What went wrong (stored as the task's last error; no secrets).
    pub message: String,
    /// Whether another attempt may succeed.
    pub retryable: bool,
}

impl TaskError {
    /// A failure worth retrying (a timeout, a 503).
    pub fn retryable(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: true,
        }
    }

    /// A failure no retry can fix (bad input).
    pub fn permanent(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: false,
        }
    }
}

/// Runs the tasks of one kind. Delivery is at least once: a handler may run
/// again for the same task after a crash, so its effects must be idempotent.
#[async_trait]
pub trait TaskHandler: Send + Sync + 'static {
    /// Runs one attempt and returns the task's result.
    async fn run(&self, task: &Lease) -> Result<Value, TaskError>;
}

/// Handlers by task kind.
#[derive(Clone, Default)]
pub struct Handlers {
    by_kind: HashMap<String, Arc<dyn TaskHandler>>,
}

impl std::fmt::Debug for Handlers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut kinds: Vec<&String> = self.by_kind.keys().collect();
        kinds.sort();
        f.debug_struct("Handlers").field("kinds", &kinds).finish()
    }
}

impl Handlers {
    /// No handlers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `handler` for `kind`, replacing any earlier one.
    pub fn register(&mut self, kind: impl Into<String>, handler: Arc<dyn TaskHandler>) {
        self.by_kind.insert(kind.into(), handler);
    }

    /// The handler for `kind`.
    pub fn get(&self, kind: &str) -> Option<&Arc<dyn TaskHandler>> {
        self.by_kind.get(kind)
    }

    /// Registered kinds, sorted.
    pub fn kinds(&self) -> Vec<String> {
        let mut kinds: Vec<String> = self.by_kind.keys().cloned().collect();
        kinds.sort();
        kinds
    }
}

/// A worker running inside `parlance serve`, on the service's own queue.
#[derive(Debug)]
pub struct EmbeddedWorker {
    stop: tokio::sync::watch::Sender<bool>,
    handle: tokio::task::JoinHandle<()>,
}

impl EmbeddedWorker {
    /// Starts worker `id` on `queue` with `handlers` and `config`.
    pub fn start(
        id: WorkerId,
        queue: Arc<dyn TaskQueue>,
        handlers: Handlers,
        clock: Arc<dyn Clock>,
        config: WorkerConfig,
    ) -> Self {
        Self::spawn(Worker::new(id, queue, handlers, clock, config))
    }

    /// Runs `worker` in the background until [`EmbeddedWorker::stop`].
    pub fn spawn(worker: Worker) -> Self {
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let handle = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.wait_for(|s| *s).await;
            };
            if let Err(e) = worker.run(shutdown).await {
                tracing::error!(error = %e, "embedded worker failed");
            }
        });
        Self { stop, handle }
    }

    /// Stops claiming, lets running tasks finish (within the grace period)
    /// and returns once the worker has released what it still held.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.handle.await;
    }
}
