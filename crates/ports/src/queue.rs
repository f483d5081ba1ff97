//! The durable task queue: tasks, leases, DAGs of tasks, and their workers.
//!
//! Delivery is at least once. A claim hands out a [`Lease`] carrying a
//! fencing token; every [`TaskQueue::complete`], [`TaskQueue::fail`] and
//! [`TaskQueue::release`] is checked against that token, so a worker whose
//! lease expired, whose process was declared dead, or whose DAG was cancelled
//! gets a *lease lost* error ([`PortError::is_lease_lost`]) and changes
//! nothing. Handlers must therefore be idempotent towards the outside world;
//! the queue guarantees that each task's result is *recorded* once.
//!
//! Lower `priority` values run first; among equals, earlier `run_at`, then
//! enqueue order. Time comes from the adapter's clock.
//!
//! A dedup key keeps at most one live (available or running) task per
//! product and key without losing a request: a request meeting a running
//! task with its key marks that task to run again, and every operation
//! that ends a running task honours the mark in the same step: a finish
//! ([`TaskQueue::complete`], [`TaskQueue::complete_many`], a discard, a
//! cancellation) enqueues a fresh task with the folded request's payload,
//! and a requeue ([`TaskQueue::fail`] with retries left,
//! [`TaskQueue::release`], [`TaskQueue::release_unheld`], the sweep of
//! [`TaskQueue::recover_expired`]) gives the task that payload. See
//! [`TaskSpec::dedup_key`](parlance_core::queue::TaskSpec::dedup_key).
//!
//! Tasks and runs belong to a product. Every operation on one task or run
//! names its product (a [`Lease`] carries it), and an id looked up under
//! another product is not found; only the worker's scans (`claim`,
//! `recover_expired`, `release_unheld`, `list_discarded`, `purge_finished`,
//! `depth`, `wait_for_work`) span products.

use std::collections::BTreeMap;
use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parlance_core::{ProductId, Timestamp};
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use crate::{ErrorKind, PortError, PortResult};

pub use parlance_core::queue::{DEFAULT_QUEUE, DagSpec, MapSpec, NodeSpec, TaskSpec};

/// A task's id, unique per queue store; looked up with its product.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct TaskId(pub i64);

/// A DAG run's id, unique per queue store; looked up with its product.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct DagId(pub i64);

/// A worker process (or an embedded worker): the unit of liveness.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct WorkerId(pub Uuid);

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for DagId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The output of a parent node, as a child node receives it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeInput {
    /// The parent's key (for an element of a map: the map node's key).
    pub from: String,
    /// The parent's result (for an element of a map: the element).
    pub value: Value,
}

/// Where a claimed task sits in its DAG.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DagTask {
    /// The run.
    pub dag_id: DagId,
    /// The node's key (`map[3]` for the fourth element of node `map`).
    pub node: String,
    /// Parent results in edge order (the element, for a map element).
    pub inputs: Vec<NodeInput>,
    /// This node maps over its result: it must complete with an array.
    pub is_map: bool,
}

/// A claimed task: the right, until `expires_at`, to finish it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Lease {
    /// The task.
    pub task_id: TaskId,
    /// The fencing token: finishing the task requires it to still match.
    pub token: i64,
    /// Who holds the lease.
    pub worker: WorkerId,
    /// The tenant; the task is looked up under it, so a lease naming
    /// another product is lost.
    pub product_id: ProductId,
    /// The handler kind.
    pub kind: String,
    /// The queue it came from.
    pub queue: String,
    /// The handler's input.
    pub payload: Value,
    /// This attempt's number, 1 for the first.
    pub attempt: u32,
    /// Attempts allowed in all.
    pub max_attempts: u32,
    /// The hard deadline of this attempt.
    pub expires_at: Timestamp,
    /// The DAG context, for a DAG node.
    pub dag: Option<DagTask>,
}

/// Where a DAG run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DagState {
    /// Nodes are waiting or running.
    Running,
    /// Every node completed.
    Completed,
    /// A node was discarded; queued nodes were cancelled.
    Failed,
    /// Cancelled from outside.
    Cancelled,
}

impl DagState {
    /// Whether the run is over.
    pub fn is_finished(self) -> bool {
        self != DagState::Running
    }
}

/// Why a DAG failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DagFailure {
    /// The node that failed.
    pub node: String,
    /// Its last error.
    pub message: String,
}

/// Progress of a DAG run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DagStatus {
    /// The run.
    pub id: DagId,
    /// The tenant.
    pub product_id: ProductId,
    /// Where it stands.
    pub state: DagState,
    /// Nodes in the run so far (maps add theirs when they expand).
    pub total: u32,
    /// Nodes completed.
    pub done: u32,
    /// Labels of the nodes queued or running now, in node order, without
    /// repeats.
    pub labels: Vec<String>,
    /// Set when the run failed.
    pub error: Option<DagFailure>,
}

/// Where a DAG node stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// Waiting for parents.
    Pending,
    /// Its task is available or running.
    Queued,
    /// Finished with a result.
    Completed,
    /// Its task was discarded.
    Failed,
    /// Will not run: the run failed or was cancelled.
    Cancelled,
}

/// A node of a run and its result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeResult {
    /// The node's key.
    pub key: String,
    /// Where it stands.
    pub state: NodeState,
    /// Its result, once completed.
    pub result: Option<Value>,
}

/// What became of a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailOutcome {
    /// The task is available again from this time.
    Retrying {
        /// When it may run again.
        run_at: Timestamp,
    },
    /// No attempts left or not retryable: the task is `discarded`.
    Discarded,
    /// Retryable, but its DAG has already failed or been cancelled: the
    /// task is cancelled instead of retried.
    Cancelled,
}

/// A dead-lettered task, for the operator.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DiscardedTask {
    /// The task.
    pub id: TaskId,
    /// The tenant.
    pub product_id: ProductId,
    /// The handler kind.
    pub kind: String,
    /// Attempts made.
    pub attempts: u32,
    /// The last error.
    pub last_error: Option<String>,
    /// When it was discarded.
    pub discarded_at: Timestamp,
    /// Its run, for a DAG node (retry the run, not the task).
    pub dag_id: Option<DagId>,
}

/// What a sweep did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RecoverReport {
    /// Running tasks returned to `available`.
    pub requeued: u64,
    /// Running tasks with no attempts left, now `discarded`.
    pub discarded: u64,
    /// Running tasks of DAGs that already failed or were cancelled, now
    /// `cancelled` instead of requeued.
    pub cancelled: u64,
    /// The expired leases recovered (requeued, discarded or cancelled) per
    /// queue; queues with none are absent.
    pub by_queue: BTreeMap<String, u64>,
}

impl RecoverReport {
    /// Counts one recovered lease of `queue`.
    pub fn count(&mut self, queue: &str, n: u64) {
        if n > 0 {
            *self.by_queue.entry(queue.to_owned()).or_default() += n;
        }
    }
}

/// The live tasks of one queue, by where they stand (a cheap count for
/// gauges, unlike [`QueueFootprint`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct QueueDepth {
    /// Available and runnable now: waiting for a free worker slot.
    pub ready: u64,
    /// Available from a later time (a delayed task, a retry backing off).
    pub scheduled: u64,
    /// Leased by a worker.
    pub running: u64,
}

/// What the queue holds for one product: its rows, and the bytes of the
/// JSON the rows keep. A completed task or node keeps no payload (it is
/// compacted when it completes: only its result stays, for
/// [`TaskQueue::dag_results`] and its children), and
/// [`TaskQueue::purge_finished`] deletes the rows themselves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct QueueFootprint {
    /// Tasks of any state, DAG nodes' tasks included.
    pub tasks: u64,
    /// DAG runs.
    pub runs: u64,
    /// DAG nodes (a map's elements and combine node included).
    pub nodes: u64,
    /// Bytes of the payloads still kept: tasks', a request's folded into a
    /// running task, nodes', a map's element template and an element's
    /// input, as JSON text (a compacted payload
    /// counts nothing). Adapters may format the text differently, so
    /// compare figures of one adapter only.
    pub payload_bytes: u64,
    /// Bytes of the node results kept, as JSON text.
    pub result_bytes: u64,
}

/// Tuning shared by the adapters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueueConfig {
    /// A worker not heard from for this long is dead: its tasks go back.
    pub worker_stale_after: Duration,
    /// Back-off between attempts.
    pub backoff: parlance_core::queue::Backoff,
    /// Shape limits for DAGs.
    pub dag_limits: parlance_core::queue::DagLimits,
}

impl Default for QueueConfig {
    /// Workers are dead after 30 s of silence; default back-off and limits.
    fn default() -> Self {
        Self {
            worker_stale_after: Duration::from_secs(30),
            backoff: parlance_core::queue::Backoff::default(),
            dag_limits: parlance_core::queue::DagLimits::default(),
        }
    }
}

/// The marker source of a lost-lease [`PortError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseLost {
    /// The task.
    pub task_id: TaskId,
    /// The token that no longer matches.
    pub token: i64,
}

impl fmt::Display for LeaseLost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "fencing token {} no longer matches", self.token)
    }
}

impl StdError for LeaseLost {}

impl PortError {
    /// The error a fenced operation returns when its lease is gone (expired
    /// and re-claimed, its worker declared dead, or its DAG cancelled). Kind
    /// `Conflict`; tell it apart from other conflicts with
    /// [`PortError::is_lease_lost`].
    pub fn lease_lost(lease: &Lease) -> Self {
        let marker = LeaseLost {
            task_id: lease.task_id,
            token: lease.token,
        };
        PortError::new(
            ErrorKind::Conflict,
            format!("lease of task {} lost", lease.task_id),
        )
        .with_source(marker)
    }

    /// True when a fenced operation found its lease gone: drop the result.
    pub fn is_lease_lost(&self) -> bool {
        self.source
            .as_deref()
            .is_some_and(|s| s.downcast_ref::<LeaseLost>().is_some())
    }
}

/// A durable queue of tasks and DAGs of tasks.
///
/// Implemented by [`MemoryTaskQueue`](https://docs.rs/parlance-memory/latest/parlance_memory/struct.MemoryTaskQueue.html) and [`PgTaskQueue`](https://docs.rs/parlance-postgres/latest/parlance_postgres/struct.PgTaskQueue.html), whose
/// constructors' examples call it.
#[async_trait]
pub trait TaskQueue: Send + Sync + 'static {
    /// Enqueues tasks atomically. For each, the new id, or `None` when its
    /// dedup key matched a live task of the same product (earlier in this
    /// call included); dedup keys are per product. A request folded into
    /// a waiting task changes nothing; one folded into a running task marks
    /// it to run again with the request's payload and settings (the newest
    /// request's, when several are folded), as
    /// [`TaskSpec::dedup_key`](parlance_core::queue::TaskSpec::dedup_key)
    /// describes: when the task finishes, the finish enqueues a fresh task
    /// with the key in the same step; when it is requeued, it takes the
    /// request's payload and settings itself.
    async fn enqueue(&self, tasks: &[TaskSpec]) -> PortResult<Vec<Option<TaskId>>>;

    /// Validates and enqueues a DAG atomically; its root nodes are runnable
    /// at once.
    async fn enqueue_dag(&self, dag: &DagSpec) -> PortResult<DagId>;

    /// Claims up to `max` runnable tasks of `queue` for `worker`, best first;
    /// each attempt's deadline is its task's timeout, or `lease` when it has
    /// none. Claiming also counts as a heartbeat of `worker`.
    async fn claim(
        &self,
        worker: &WorkerId,
        queue: &str,
        max: usize,
        lease: Duration,
    ) -> PortResult<Vec<Lease>>;

    /// Records the result. For a DAG node this also frees its children
    /// (a join fires exactly once) and expands a map. The task (and its
    /// node) no longer keeps its payload: a completed task is never run
    /// again; when it was marked to run again (see [`TaskQueue::enqueue`]),
    /// a fresh task with its dedup key and the folded request's payload is
    /// enqueued with the completion. Lease lost: error, nothing changed.
    /// `Invalid` (nothing changed) when a map node's result is not an
    /// array.
    async fn complete(&self, lease: &Lease, result: Value) -> PortResult<()>;

    /// Completes as [`TaskQueue::complete`] does and, in the same step,
    /// claims for the lease's worker up to `max` of the tasks this
    /// completion made runnable (the DAG children it freed) whose kind is
    /// in `kinds`, as [`TaskQueue::claim`] would (fresh fencing tokens;
    /// each attempt's deadline its task's timeout, or `lease`). The worker
    /// runs them next without a claim of its own; freed tasks it does not
    /// take stay available to every worker, and so does the fresh task a
    /// completion marked to run again enqueues. Lease lost: error, nothing
    /// changed and nothing claimed. The default completes and takes
    /// nothing.
    async fn complete_and_claim(
        &self,
        lease: &Lease,
        result: Value,
        kinds: &[String],
        max: usize,
        lease_for: Duration,
    ) -> PortResult<Vec<Lease>> {
        let _ = (kinds, max, lease_for);
        self.complete(lease, result).await.map(|()| Vec::new())
    }

    /// Completes several tasks, one outcome per item in order, as
    /// [`TaskQueue::complete`] would; adapters may record tasks outside any
    /// DAG with one statement. `Err` only when nothing could be recorded.
    async fn complete_many(&self, done: &[(Lease, Value)]) -> PortResult<Vec<PortResult<()>>> {
        let mut out = Vec::with_capacity(done.len());
        for (lease, result) in done {
            out.push(self.complete(lease, result.clone()).await);
        }
        Ok(out)
    }

    /// Records a failed attempt: retried with back-off when `retryable` and
    /// attempts remain (cancelled instead when its DAG is over), else
    /// discarded (failing its DAG, which cancels the DAG's queued nodes).
    /// A task marked to run again (see [`TaskQueue::enqueue`]) takes the
    /// folded request's payload and settings when retried, and is followed
    /// by a fresh task with them when discarded or cancelled.
    /// Lease lost: error, nothing changed.
    async fn fail(&self, lease: &Lease, error: &str, retryable: bool) -> PortResult<FailOutcome>;

    /// Gives the task back untouched (available now, the attempt not
    /// counted): for a worker shutting down. A task marked to run again
    /// takes the folded request's payload and settings instead (its
    /// attempts counted afresh, available at the request's `run_at` if
    /// later). Lease lost: error.
    async fn release(&self, lease: &Lease) -> PortResult<()>;

    /// Gives back, as [`TaskQueue::release`] would, every task `worker`
    /// holds a lease on except those in `held`; returns how many. For a
    /// worker whose claim failed after the queue may have committed it
    /// (the answer lost with the connection): those tasks never reached it
    /// and would otherwise wait for their deadline.
    async fn release_unheld(&self, worker: &WorkerId, held: &[TaskId]) -> PortResult<u64>;

    /// Marks `worker` alive now.
    async fn heartbeat(&self, worker: &WorkerId) -> PortResult<()>;

    /// Returns to `available` (or `discarded`, attempts exhausted; or
    /// `cancelled`, its DAG over) every running task past its deadline or
    /// held by a worker silent for longer than the configured staleness.
    /// A task marked to run again is requeued with the folded request's
    /// payload and settings, or followed by a fresh task with them when
    /// it is discarded or cancelled. Safe to run from many processes.
    async fn recover_expired(&self) -> PortResult<RecoverReport>;

    /// Stops `product`'s run: its queued and running tasks are cancelled
    /// (their leases lost), pending nodes never run. A finished run is
    /// unchanged. `NotFound` for an unknown id or another product's run.
    async fn cancel_dag(&self, product: &ProductId, id: DagId) -> PortResult<DagStatus>;

    /// The progress of `product`'s run. `NotFound` for an unknown id or
    /// another product's run.
    async fn dag_status(&self, product: &ProductId, id: DagId) -> PortResult<DagStatus>;

    /// Every node of `product`'s run in node order (declared first, then
    /// added by maps), with results. `NotFound` for an unknown id or
    /// another product's run.
    async fn dag_results(&self, product: &ProductId, id: DagId) -> PortResult<Vec<NodeResult>>;

    /// The operator's retry of `product`'s dead-lettered task: `discarded`
    /// becomes `available` now with a fresh attempt budget. `NotFound`
    /// unless the task is `product`'s and discarded; `Invalid` for a DAG
    /// node (re-run the DAG instead).
    async fn retry_discarded(&self, product: &ProductId, id: TaskId) -> PortResult<()>;

    /// Dead-lettered tasks of `queue`, most recently discarded first, at
    /// most `limit`.
    async fn list_discarded(&self, queue: &str, limit: usize) -> PortResult<Vec<DiscardedTask>>;

    /// Deletes completed and cancelled tasks and finished DAG runs (with
    /// their nodes and edges) that finished before `before`; discarded
    /// tasks stay for the operator. Returns how many tasks and runs were
    /// deleted.
    async fn purge_finished(&self, before: Timestamp) -> PortResult<u64>;

    /// What the queue holds for `product` now (a scan of the product's
    /// rows: for operators and storage checks, not for hot paths).
    async fn footprint(&self, product: &ProductId) -> PortResult<QueueFootprint>;

    /// How many live tasks of `queue` (every product's) are ready, scheduled
    /// for later and running now: a count over live rows only, cheap enough
    /// to read every few seconds. DAG nodes waiting for their parents are
    /// not tasks yet and are not counted.
    async fn depth(&self, queue: &str) -> PortResult<QueueDepth>;

    /// Resolves when work may have arrived on `queue` (a hint: a task was
    /// enqueued or freed) or after `timeout`, whichever is first. Polling
    /// stays the source of truth.
    async fn wait_for_work(&self, queue: &str, timeout: Duration);

    /// A handle on this same queue for one worker, which calls it many
    /// times in a row: every operation keeps this trait's contract and sees
    /// the same tasks, but an adapter that pays per call for taking a
    /// connection from its pool may keep one for the handle's life. `None`
    /// (the default): the worker uses this queue itself.
    fn for_worker(&self) -> Option<Arc<dyn TaskQueue>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_lost_is_a_distinguishable_conflict() {
        let lease = Lease {
            task_id: TaskId(7),
            token: 42,
            worker: WorkerId(Uuid::nil()),
            product_id: ProductId::parse("p").unwrap(),
            kind: "k".into(),
            queue: DEFAULT_QUEUE.into(),
            payload: Value::Null,
            attempt: 1,
            max_attempts: 1,
            expires_at: Timestamp::UNIX_EPOCH,
            dag: None,
        };
        let e = PortError::lease_lost(&lease);
        assert!(e.is_conflict());
        assert!(e.is_lease_lost());
        assert_eq!(e.to_string(), "conflict: lease of task 7 lost");
        assert!(!PortError::conflict("stale version").is_lease_lost());
    }
}
