//! The worker: slots, the claim/execute/finish cycle and its driver loop.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use parlance_ports::{
    Clock, ErrorKind, FailOutcome, Lease, PortError, PortResult, TaskId, TaskQueue, WorkerId,
};
use tokio::task::JoinSet;
use tracing::Instrument as _;

use super::{Handlers, TaskError};

/// The first wait before recording an outcome again after the queue was
/// unavailable; it doubles up to [`RECORD_RETRY_MAX`].
const RECORD_RETRY_FIRST: Duration = Duration::from_millis(50);
/// The longest wait between two tries at recording an outcome.
const RECORD_RETRY_MAX: Duration = Duration::from_secs(2);

/// Tuning of one worker.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The queue to claim from.
    pub queue: String,
    /// Tasks run at once; the worker never claims more than its free slots.
    pub slots: usize,
    /// The deadline of an attempt whose task sets no timeout.
    pub lease: Duration,
    /// How often the worker says it is alive.
    pub heartbeat_every: Duration,
    /// The longest wait between claims when no hint arrives.
    pub poll_every: Duration,
    /// How often this worker sweeps expired leases (every worker does; the
    /// sweep is safe to run concurrently).
    pub sweep_every: Duration,
    /// Finished tasks and runs older than this are deleted.
    pub retention: Duration,
    /// On shutdown, how long running tasks may take before their leases
    /// are released.
    pub shutdown_grace: Duration,
}

impl Default for WorkerConfig {
    /// Queue `default`, 4 slots, 5 min leases, heartbeat and sweep every 5 s,
    /// poll every second, 24 h retention, 10 s grace.
    fn default() -> Self {
        Self {
            queue: parlance_ports::queue::DEFAULT_QUEUE.to_owned(),
            slots: 4,
            lease: Duration::from_secs(300),
            heartbeat_every: Duration::from_secs(5),
            poll_every: Duration::from_secs(1),
            sweep_every: Duration::from_secs(5),
            retention: Duration::from_secs(24 * 3600),
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// What one [`Worker::step`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StepReport {
    /// Tasks claimed.
    pub claimed: usize,
    /// Tasks completed.
    pub completed: usize,
    /// Failed attempts that will be retried.
    pub retried: usize,
    /// Tasks discarded (dead-lettered).
    pub discarded: usize,
    /// Failed tasks cancelled instead of retried (their DAG is over).
    pub cancelled: usize,
    /// Results dropped because the lease was lost meanwhile.
    pub lost: usize,
}

/// The leases a running worker holds, shared with its running tasks (a
/// task adds the children its completion claimed): what it gives back on
/// shutdown.
#[derive(Clone, Default)]
struct Held {
    leases: Arc<Mutex<HashMap<TaskId, Lease>>>,
    /// Set once the worker stops claiming: a completion then takes no
    /// more work.
    stopping: Arc<AtomicBool>,
    /// A completion that also claimed may have committed with its answer
    /// lost: the tasks it claimed must be given back.
    unsure: Arc<AtomicBool>,
    /// Read-held by a completion that claims, from its call until the
    /// tasks it claimed are in `leases`; write-held while the tasks this
    /// worker leased but does not hold are given back. Without it a
    /// completion's claim, committed but not yet recorded here, would be
    /// given back while this worker goes on to run it: the task would run
    /// twice on one attempt.
    recording: Arc<tokio::sync::RwLock<()>>,
}

impl Held {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TaskId, Lease>> {
        self.leases.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn insert(&self, lease: &Lease) {
        self.lock().insert(lease.task_id, lease.clone());
    }

    fn remove(&self, id: TaskId) {
        self.lock().remove(&id);
    }

    fn ids(&self) -> Vec<TaskId> {
        self.lock().keys().copied().collect()
    }

    fn all(&self) -> Vec<Lease> {
        self.lock().values().cloned().collect()
    }
}

impl StepReport {
    fn add(&mut self, finish: Finish) {
        match finish {
            Finish::Completed => self.completed += 1,
            Finish::Retried => self.retried += 1,
            Finish::Discarded => self.discarded += 1,
            Finish::Cancelled => self.cancelled += 1,
            Finish::Lost => self.lost += 1,
        }
    }
}

/// How one attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Finish {
    Completed,
    Retried,
    Discarded,
    Cancelled,
    Lost,
}

/// Runs tasks from one queue with registered handlers.
#[derive(Clone)]
pub struct Worker {
    id: WorkerId,
    queue: Arc<dyn TaskQueue>,
    handlers: Arc<Handlers>,
    clock: Arc<dyn Clock>,
    config: WorkerConfig,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("id", &self.id)
            .field("handlers", &self.handlers)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// A worker named `id` on `queue`, through the queue's
    /// [`TaskQueue::for_worker`] handle when it offers one (on PostgreSQL:
    /// one connection kept for the worker's claims and completions).
    pub fn new(
        id: WorkerId,
        queue: Arc<dyn TaskQueue>,
        handlers: Handlers,
        clock: Arc<dyn Clock>,
        config: WorkerConfig,
    ) -> Self {
        Self {
            id,
            queue: queue.for_worker().unwrap_or(queue),
            handlers: Arc::new(handlers),
            clock,
            config,
        }
    }

    /// This worker's id.
    pub fn id(&self) -> WorkerId {
        self.id
    }

    /// Claims up to one task per slot, runs them concurrently and records
    /// each outcome. Returns at once when nothing is runnable.
    ///
    /// # Errors
    ///
    /// When the claim itself fails; a failure to record one task's outcome
    /// is logged and leaves that task to the lease sweeper.
    pub async fn step(&self) -> PortResult<StepReport> {
        let leases = self.claim(self.config.slots.max(1)).await?;
        let mut report = StepReport {
            claimed: leases.len(),
            ..StepReport::default()
        };
        let mut set = JoinSet::new();
        for lease in leases {
            let this = self.clone();
            set.spawn(async move { this.execute(lease, None).await.0 });
        }
        while let Some(done) = set.join_next().await {
            if let Ok(Some(finish)) = done {
                report.add(finish);
            }
        }
        Ok(report)
    }

    /// Runs until `shutdown` resolves, then stops claiming, waits up to the
    /// grace period for running tasks and releases the leases still held.
    ///
    /// # Errors
    ///
    /// Never for a queue error (those are logged and retried after the poll
    /// interval); the `Result` is for future fatal conditions.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> PortResult<()> {
        tracing::info!(
            worker = %self.id,
            queue = %self.config.queue,
            slots = self.config.slots,
            kinds = ?self.handlers.kinds(),
            "worker started"
        );
        let background = tokio::spawn(self.clone().background());
        let mut running: JoinSet<()> = JoinSet::new();
        let held = Held::default();
        tokio::pin!(shutdown);
        loop {
            let free = self.config.slots.max(1).saturating_sub(running.len());
            let mut claimed = 0;
            // A claim (or a completion that claimed) that failed may still
            // have committed, its answer lost with the connection: before
            // the next claim, what this worker has leased but does not hold
            // is given back.
            if held.unsure.swap(false, Ordering::SeqCst) {
                let _settled = held.recording.write().await;
                let ids = held.ids();
                match self.queue.release_unheld(&self.id, &ids).await {
                    Ok(n) => {
                        if n > 0 {
                            tracing::info!(
                                released = n,
                                "tasks of a claim whose answer was lost released"
                            );
                        }
                    }
                    Err(e) => {
                        held.unsure.store(true, Ordering::SeqCst);
                        tracing::warn!(error = %e, "could not release unheld tasks; retrying")
                    }
                }
            }
            if free > 0 {
                match self.claim(free).await {
                    Ok(leases) => {
                        claimed = leases.len();
                        for lease in leases {
                            held.insert(&lease);
                            let this = self.clone();
                            let held = held.clone();
                            running.spawn(async move { this.execute_chain(lease, &held).await });
                        }
                    }
                    Err(e) => {
                        held.unsure.store(true, Ordering::SeqCst);
                        tracing::warn!(error = %e, "claim failed; retrying after the poll");
                    }
                }
            }
            if claimed > 0 && claimed == free {
                // Full batch: there may be more; loop once a slot frees.
                tokio::select! {
                    () = &mut shutdown => break,
                    Some(_) = running.join_next() => {}
                }
                continue;
            }
            tokio::select! {
                () = &mut shutdown => break,
                Some(_) = running.join_next(), if !running.is_empty() => {}
                () = self.queue.wait_for_work(&self.config.queue, self.config.poll_every), if free > 0 => {}
            }
        }
        tracing::info!(worker = %self.id, running = running.len(), "worker stopping");
        held.stopping.store(true, Ordering::SeqCst);
        let grace = tokio::time::sleep(self.config.shutdown_grace);
        tokio::pin!(grace);
        while !running.is_empty() {
            tokio::select! {
                () = &mut grace => break,
                Some(_) = running.join_next() => {}
            }
        }
        running.abort_all();
        while running.join_next().await.is_some() {}
        for lease in &held.all() {
            match self.queue.release(lease).await {
                Ok(()) => tracing::info!(task_id = %lease.task_id, "lease released"),
                Err(e) if e.is_lease_lost() => {}
                Err(e) => tracing::warn!(task_id = %lease.task_id, error = %e, "release failed"),
            }
        }
        background.abort();
        tracing::info!(worker = %self.id, "worker stopped");
        Ok(())
    }

    async fn claim(&self, max: usize) -> PortResult<Vec<Lease>> {
        let started = std::time::Instant::now();
        let leases = self
            .queue
            .claim(&self.id, &self.config.queue, max, self.config.lease)
            .await?;
        crate::monitoring::queue_claimed(&self.config.queue, started.elapsed(), leases.len());
        Ok(leases)
    }

    /// Reads how many tasks this worker's queue holds and sets the depth
    /// gauges.
    ///
    /// # Errors
    ///
    /// When the queue cannot be read; the gauges keep their last values.
    pub async fn observe_depth(&self) -> PortResult<()> {
        let depth = self.queue.depth(&self.config.queue).await?;
        crate::monitoring::queue_depth(&self.config.queue, depth);
        Ok(())
    }

    /// Heartbeats, sweeps (and reads the queue's depth), and purges until
    /// aborted.
    async fn background(self) {
        let mut heartbeat = tokio::time::interval(self.config.heartbeat_every);
        let mut sweep = tokio::time::interval(self.config.sweep_every);
        let purge_every = Duration::from_secs(3600).min(self.config.retention);
        let mut purge = tokio::time::interval(purge_every.max(Duration::from_secs(1)));
        loop {
            tokio::select! {
                _ = heartbeat.tick() => {
                    if let Err(e) = self.queue.heartbeat(&self.id).await {
                        tracing::warn!(error = %e, "heartbeat failed");
                    }
                }
                _ = sweep.tick() => {
                    match self.queue.recover_expired().await {
                        Ok(r) => {
                            crate::monitoring::leases_recovered(&r);
                            if r.requeued + r.discarded + r.cancelled > 0 {
                                tracing::info!(
                                    requeued = r.requeued,
                                    discarded = r.discarded,
                                    cancelled = r.cancelled,
                                    "expired leases recovered"
                                );
                            }
                        }
                        Err(e) => tracing::warn!(error = %e, "lease sweep failed"),
                    }
                    if let Err(e) = self.observe_depth().await {
                        tracing::warn!(error = %e, "could not read the queue depth");
                    }
                }
                _ = purge.tick() => {
                    let before = self.clock.now() - self.config.retention;
                    match self.queue.purge_finished(before).await {
                        Ok(n) if n > 0 => tracing::info!(rows = n, "finished rows purged"),
                        Ok(_) => {}
                        Err(e) => tracing::warn!(error = %e, "purge failed"),
                    }
                }
            }
        }
    }

    /// Runs one attempt and records its outcome. While the queue is
    /// unavailable (its database restarting, say) recording is tried again,
    /// with a growing wait, until it succeeds or the lease runs out, so a
    /// short outage does not leave the task leased until its deadline.
    /// `None` when recording failed for good for a reason other than a lost
    /// lease (the sweeper will return the task).
    async fn execute(&self, lease: Lease, held: Option<&Held>) -> (Option<Finish>, Vec<Lease>) {
        let span = tracing::info_span!(
            "task",
            task_id = %lease.task_id,
            kind = %lease.kind,
            attempt = lease.attempt,
            dag_id = lease.dag.as_ref().map(|d| d.dag_id.0),
            node = lease.dag.as_ref().map(|d| d.node.as_str()),
        );
        async move {
            let outcome = self.invoke(&lease).await;
            let deadline = tokio::time::Instant::now()
                + lease.expires_at.saturating_duration_since(self.clock.now());
            let mut wait = RECORD_RETRY_FIRST;
            // While the worker runs, a completion takes the next task it
            // frees (one: this slot's) in the same transaction.
            let take = held.is_some_and(|h| !h.stopping.load(Ordering::SeqCst));
            loop {
                let recorded = match held {
                    Some(h) if take => {
                        let _recording = h.recording.read().await;
                        let recorded = self.record(&lease, &outcome, take).await;
                        if let Ok((_, next)) = &recorded {
                            for taken in next {
                                h.insert(taken);
                            }
                        }
                        recorded
                    }
                    _ => self.record(&lease, &outcome, take).await,
                };
                match recorded {
                    Ok((finish, next)) => {
                        tracing::debug!(?finish, next = next.len(), "task finished");
                        return (Some(finish), next);
                    }
                    Err(e) if e.is_lease_lost() => {
                        tracing::info!("lease lost; result dropped");
                        return (Some(Finish::Lost), Vec::new());
                    }
                    Err(e)
                        if e.kind == ErrorKind::Unavailable
                            && tokio::time::Instant::now() + wait < deadline =>
                    {
                        if take && let Some(h) = held {
                            h.unsure.store(true, Ordering::SeqCst);
                        }
                        tracing::warn!(error = %e, "could not record the task's outcome; trying again");
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(RECORD_RETRY_MAX);
                    }
                    Err(e) => {
                        if take && let Some(h) = held {
                            h.unsure.store(true, Ordering::SeqCst);
                        }
                        tracing::warn!(error = %e, "could not record the task's outcome");
                        return (None, Vec::new());
                    }
                }
            }
        }
        .instrument(span)
        .await
    }

    /// Runs `first` and then, in the same slot, each task a completion
    /// claimed for this worker, holding each lease in `held` while it runs.
    async fn execute_chain(&self, first: Lease, held: &Held) {
        let mut next = Some(first);
        while let Some(lease) = next.take() {
            let id = lease.task_id;
            // What the completion claimed is already in `held`.
            let (_, taken) = self.execute(lease, Some(held)).await;
            let mut taken = taken.into_iter();
            next = taken.next();
            // Only one is asked for; any other goes back at once.
            for extra in taken {
                if let Err(e) = self.queue.release(&extra).await {
                    tracing::warn!(task_id = %extra.task_id, error = %e, "release failed");
                }
                held.remove(extra.task_id);
            }
            held.remove(id);
        }
    }

    /// Records one attempt's outcome: its result, or its failure. With
    /// `take`, the completion also claims the next task it frees of a kind
    /// this worker handles, returned to run next.
    async fn record(
        &self,
        lease: &Lease,
        outcome: &Result<serde_json::Value, TaskError>,
        take: bool,
    ) -> Result<(Finish, Vec<Lease>), PortError> {
        let completed = match outcome {
            Ok(result) if take => {
                let kinds = self.handlers.kinds();
                self.queue
                    .complete_and_claim(lease, result.clone(), &kinds, 1, self.config.lease)
                    .await
            }
            Ok(result) => self
                .queue
                .complete(lease, result.clone())
                .await
                .map(|()| Vec::new()),
            Err(err) => return self.fail(lease, err).await.map(|f| (f, Vec::new())),
        };
        match completed {
            Ok(next) => Ok((Finish::Completed, next)),
            // The queue refused the result itself (a map node that did not
            // return a list): no retry can fix that.
            Err(e) if e.kind == ErrorKind::Invalid => self
                .fail(lease, &TaskError::permanent(e.message))
                .await
                .map(|f| (f, Vec::new())),
            Err(e) => Err(e),
        }
    }

    async fn fail(&self, lease: &Lease, err: &TaskError) -> Result<Finish, PortError> {
        match self.queue.fail(lease, &err.message, err.retryable).await? {
            FailOutcome::Retrying { run_at } => {
                tracing::info!(error = %err, %run_at, "attempt failed; will retry");
                Ok(Finish::Retried)
            }
            FailOutcome::Discarded => {
                tracing::warn!(error = %err, "task discarded");
                Ok(Finish::Discarded)
            }
            FailOutcome::Cancelled => {
                tracing::info!(error = %err, "attempt failed; its DAG is over");
                Ok(Finish::Cancelled)
            }
        }
    }

    /// Calls the handler within the attempt's deadline, on its own task so a
    /// panic is contained.
    async fn invoke(&self, lease: &Lease) -> Result<serde_json::Value, TaskError> {
        let Some(handler) = self.handlers.get(&lease.kind).cloned() else {
            return Err(TaskError::permanent(format!(
                "no handler for task kind {:?}",
                lease.kind
            )));
        };
        let budget = lease.expires_at.saturating_duration_since(self.clock.now());
        let task = lease.clone();
        let mut run = AbortOnDrop(tokio::spawn(
            async move { handler.run(&task).await }.instrument(tracing::Span::current()),
        ));
        match tokio::time::timeout(budget, &mut run.0).await {
            Ok(Ok(result)) => result,
            Ok(Err(join)) => Err(TaskError::retryable(if join.is_panic() {
                "handler panicked"
            } else {
                "handler was cancelled"
            })),
            Err(_) => Err(TaskError::retryable(format!(
                "timed out after {} ms",
                budget.as_millis()
            ))),
        }
    }
}

/// Aborts the handler's task when the attempt is abandoned (timed out, or
/// the worker shutting down aborted it).
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
