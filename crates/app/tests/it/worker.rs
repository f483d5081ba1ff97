//! The worker runtime: `step()` on the in-memory queue, shutdown, and a real
//! `parlance worker` process killed in the middle of a DAG on PostgreSQL.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use parlance_app::worker::{
    Handlers, RECORD_KIND, SLEEP_KIND, TaskError, TaskHandler, Worker, WorkerConfig,
    register_test_handlers,
};
use parlance_core::ProductId;
use parlance_core::Timestamp;
use parlance_memory::MemoryTaskQueue;
use parlance_ports::{
    DagId, DagSpec, DagState, DagStatus, DiscardedTask, FailOutcome, Lease, ManualClock, MapSpec,
    NodeResult, NodeSpec, PortError, PortResult, QueueConfig, RecoverReport, SystemClock, TaskId,
    TaskQueue, TaskSpec, WorkerId,
};
use parlance_postgres::PgTaskQueue;
use parlance_postgres::testing::test_pool;
use serde_json::{Value, json};

use crate::support::{spawn_worker, url_for, wait_until};

fn product() -> ProductId {
    ProductId::parse("acme").unwrap()
}

fn memory_queue() -> (Arc<dyn TaskQueue>, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new());
    let queue = Arc::new(MemoryTaskQueue::new(clock.clone(), QueueConfig::default()));
    (queue, clock)
}

fn worker(queue: Arc<dyn TaskQueue>, clock: Arc<ManualClock>, handlers: Handlers) -> Worker {
    let config = WorkerConfig {
        slots: 3,
        shutdown_grace: Duration::from_millis(100),
        ..WorkerConfig::default()
    };
    Worker::new(WorkerId(uuid_from(1)), queue, handlers, clock, config)
}

fn uuid_from(n: u128) -> uuid::Uuid {
    uuid::Uuid::from_u128(n)
}

fn test_handlers() -> Handlers {
    let mut h = Handlers::new();
    register_test_handlers(&mut h);
    h
}

/// `{"node": key, "inputs": [...]}`, what the test handlers answer.
fn r(node: &str, inputs: Vec<Value>) -> Value {
    json!({"node": node, "inputs": inputs})
}

/// A chain into a fan-out of sleepers and a map, joined, then one more step:
/// `start -> s0..s{n-1} -> join -> end` and `start -> list (map over 4) -> join`.
fn mixed_dag(sleepers: usize, ms: u64, file: Option<&str>) -> DagSpec {
    let extra = |mut v: Value| {
        if let Some(f) = file {
            v["file"] = json!(f);
        }
        v
    };
    let mut dag = DagSpec::new(product())
        .node(NodeSpec::new("start", RECORD_KIND, extra(json!({}))))
        .node(
            NodeSpec::new("list", RECORD_KIND, extra(json!({"result": [1, 2, 3, 4]}))).map(
                MapSpec {
                    kind: SLEEP_KIND.to_owned(),
                    payload: extra(json!({"ms": ms})),
                    label: Some("mapping".to_owned()),
                },
            ),
        )
        .node(NodeSpec::new("join", RECORD_KIND, extra(json!({}))))
        .node(NodeSpec::new("end", RECORD_KIND, extra(json!({}))))
        .edge("start", "list");
    for i in 0..sleepers {
        dag = dag
            .node(
                NodeSpec::new(format!("s{i}"), SLEEP_KIND, extra(json!({"ms": ms})))
                    .label("sleeping"),
            )
            .edge("start", format!("s{i}"))
            .edge(format!("s{i}"), "join");
    }
    dag.edge("list", "join").edge("join", "end")
}

/// The result `end` must have when every node ran once with its inputs.
fn mixed_expected(sleepers: usize) -> Value {
    let start = r("start", vec![]);
    let mut join_inputs: Vec<Value> = (0..sleepers)
        .map(|i| r(&format!("s{i}"), vec![start.clone()]))
        .collect();
    let mapped: Vec<Value> = (0..4)
        .map(|i| r(&format!("list[{i}]"), vec![json!(i + 1)]))
        .collect();
    join_inputs.push(Value::Array(mapped));
    r("end", vec![r("join", join_inputs)])
}

/// Total nodes once the map has expanded: declared + 4 elements + combine.
fn mixed_total(sleepers: usize) -> u32 {
    u32::try_from(4 + sleepers + 4 + 1).unwrap()
}

async fn final_result(queue: &dyn TaskQueue, id: DagId) -> Value {
    queue
        .dag_results(&product(), id)
        .await
        .unwrap()
        .into_iter()
        .find(|n| n.key == "end")
        .and_then(|n| n.result)
        .unwrap_or(Value::Null)
}

#[tokio::test]
async fn step_drains_a_dag_on_memory() {
    let (queue, clock) = memory_queue();
    let w = worker(queue.clone(), clock, test_handlers());
    let id = queue.enqueue_dag(&mixed_dag(3, 0, None)).await.unwrap();
    let mut steps = 0;
    loop {
        let report = w.step().await.unwrap();
        if report.claimed == 0 {
            break;
        }
        assert_eq!(report.completed, report.claimed, "{report:?}");
        assert!(report.claimed <= 3, "never more than the slots");
        steps += 1;
    }
    assert!(steps >= 5, "a DAG runs in dependency waves: {steps}");
    let st = queue.dag_status(&product(), id).await.unwrap();
    assert_eq!(st.state, DagState::Completed);
    assert_eq!((st.done, st.total), (mixed_total(3), mixed_total(3)));
    assert_eq!(final_result(queue.as_ref(), id).await, mixed_expected(3));
}

struct Flaky {
    calls: AtomicUsize,
}

#[async_trait]
impl TaskHandler for Flaky {
    async fn run(&self, _task: &Lease) -> Result<Value, TaskError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Err(TaskError::retryable("upstream 503"))
    }
}

#[tokio::test]
async fn step_retries_with_back_off_then_discards() {
    let (queue, clock) = memory_queue();
    let flaky = Arc::new(Flaky {
        calls: AtomicUsize::new(0),
    });
    let mut handlers = Handlers::new();
    handlers.register("flaky", flaky.clone());
    let w = worker(queue.clone(), clock.clone(), handlers);
    queue
        .enqueue(&[
            TaskSpec::new(product(), "flaky", json!({})).max_attempts(2),
            TaskSpec::new(product(), "nobody-handles-this", json!({})),
        ])
        .await
        .unwrap();
    let first = w.step().await.unwrap();
    assert_eq!(
        (first.claimed, first.retried, first.discarded),
        (2, 1, 1),
        "an unknown kind is discarded at once: {first:?}"
    );
    assert_eq!(w.step().await.unwrap().claimed, 0, "backing off");
    clock.advance(Duration::from_secs(3));
    let second = w.step().await.unwrap();
    assert_eq!((second.claimed, second.discarded), (1, 1));
    assert_eq!(flaky.calls.load(Ordering::SeqCst), 2);
}

/// A queue whose first `outage` attempts at recording an outcome find it
/// unavailable, as while its database restarts, and whose first
/// `lost_claims` claims go through but answer an error, as when the
/// connection drops before the answer arrives.
struct Outage {
    inner: Arc<dyn TaskQueue>,
    outage: AtomicUsize,
    lost_claims: AtomicUsize,
    /// A kind whose completions, once committed, wait for `gate` before
    /// answering (and claim what they free, as the adapters do).
    stall: Option<&'static str>,
    stalled: AtomicUsize,
    gate: tokio::sync::Semaphore,
    unheld_calls: AtomicUsize,
}

fn take_one(n: &AtomicUsize) -> bool {
    n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

impl Outage {
    fn new(inner: Arc<dyn TaskQueue>, outage: usize, lost_claims: usize) -> Self {
        Self {
            inner,
            outage: AtomicUsize::new(outage),
            lost_claims: AtomicUsize::new(lost_claims),
            stall: None,
            stalled: AtomicUsize::new(0),
            gate: tokio::sync::Semaphore::new(0),
            unheld_calls: AtomicUsize::new(0),
        }
    }

    fn stalling(mut self, kind: &'static str) -> Self {
        self.stall = Some(kind);
        self
    }

    fn down(&self) -> bool {
        take_one(&self.outage)
    }
}

#[async_trait]
impl TaskQueue for Outage {
    async fn enqueue(&self, tasks: &[TaskSpec]) -> PortResult<Vec<Option<TaskId>>> {
        self.inner.enqueue(tasks).await
    }
    async fn enqueue_dag(&self, dag: &DagSpec) -> PortResult<DagId> {
        self.inner.enqueue_dag(dag).await
    }
    async fn claim(
        &self,
        worker: &WorkerId,
        queue: &str,
        max: usize,
        lease: Duration,
    ) -> PortResult<Vec<Lease>> {
        let leases = self.inner.claim(worker, queue, max, lease).await?;
        if !leases.is_empty() && take_one(&self.lost_claims) {
            return Err(PortError::unavailable("postgres: connection reset"));
        }
        Ok(leases)
    }
    async fn complete(&self, lease: &Lease, result: Value) -> PortResult<()> {
        if self.down() {
            return Err(PortError::unavailable("postgres: connection refused"));
        }
        self.inner.complete(lease, result).await
    }
    async fn fail(&self, lease: &Lease, error: &str, retryable: bool) -> PortResult<FailOutcome> {
        if self.down() {
            return Err(PortError::unavailable("postgres: connection refused"));
        }
        self.inner.fail(lease, error, retryable).await
    }
    async fn release(&self, lease: &Lease) -> PortResult<()> {
        self.inner.release(lease).await
    }
    async fn complete_and_claim(
        &self,
        lease: &Lease,
        result: Value,
        kinds: &[String],
        max: usize,
        lease_for: Duration,
    ) -> PortResult<Vec<Lease>> {
        if self.stall.is_none() {
            return self.complete(lease, result).await.map(|()| Vec::new());
        }
        if self.down() {
            return Err(PortError::unavailable("postgres: connection refused"));
        }
        let taken = self
            .inner
            .complete_and_claim(lease, result, kinds, max, lease_for)
            .await?;
        if self.stall == Some(lease.kind.as_str()) {
            self.stalled.fetch_add(1, Ordering::SeqCst);
            let _open = self.gate.acquire().await;
        }
        Ok(taken)
    }
    async fn release_unheld(&self, worker: &WorkerId, held: &[TaskId]) -> PortResult<u64> {
        self.unheld_calls.fetch_add(1, Ordering::SeqCst);
        self.inner.release_unheld(worker, held).await
    }
    async fn heartbeat(&self, worker: &WorkerId) -> PortResult<()> {
        self.inner.heartbeat(worker).await
    }
    async fn recover_expired(&self) -> PortResult<RecoverReport> {
        self.inner.recover_expired().await
    }
    async fn cancel_dag(&self, product: &ProductId, id: DagId) -> PortResult<DagStatus> {
        self.inner.cancel_dag(product, id).await
    }
    async fn dag_status(&self, product: &ProductId, id: DagId) -> PortResult<DagStatus> {
        self.inner.dag_status(product, id).await
    }
    async fn dag_results(&self, product: &ProductId, id: DagId) -> PortResult<Vec<NodeResult>> {
        self.inner.dag_results(product, id).await
    }
    async fn retry_discarded(&self, product: &ProductId, id: TaskId) -> PortResult<()> {
        self.inner.retry_discarded(product, id).await
    }
    async fn list_discarded(&self, queue: &str, limit: usize) -> PortResult<Vec<DiscardedTask>> {
        self.inner.list_discarded(queue, limit).await
    }
    async fn purge_finished(&self, before: Timestamp) -> PortResult<u64> {
        self.inner.purge_finished(before).await
    }
    async fn footprint(
        &self,
        product: &parlance_core::ProductId,
    ) -> PortResult<parlance_ports::QueueFootprint> {
        self.inner.footprint(product).await
    }
    async fn depth(&self, queue: &str) -> PortResult<parlance_ports::QueueDepth> {
        self.inner.depth(queue).await
    }
    async fn wait_for_work(&self, queue: &str, timeout: Duration) {
        self.inner.wait_for_work(queue, timeout).await;
    }
}

/// Answers at once.
struct Quick;

#[async_trait]
impl TaskHandler for Quick {
    async fn run(&self, _task: &Lease) -> Result<Value, TaskError> {
        Ok(json!("done"))
    }
}

/// An outcome that cannot be recorded while the queue is down is recorded
/// once it is back, within the lease: the task is not left leased until
/// its deadline (it used to be, for up to the lease's 5 minutes).
#[tokio::test]
async fn outcomes_are_recorded_once_the_queue_is_back() {
    let (inner, clock) = memory_queue();
    let queue = Arc::new(Outage::new(inner.clone(), 4, 0));
    let flaky = Arc::new(Flaky {
        calls: AtomicUsize::new(0),
    });
    let mut handlers = Handlers::new();
    handlers.register("quick", Arc::new(Quick));
    handlers.register("flaky", flaky.clone());
    let w = worker(queue.clone(), clock, handlers);
    queue
        .enqueue(&[
            TaskSpec::new(product(), "quick", json!({})),
            TaskSpec::new(product(), "flaky", json!({})),
        ])
        .await
        .unwrap();
    let report = w.step().await.unwrap();
    assert_eq!(
        (report.claimed, report.completed, report.retried),
        (2, 1, 1),
        "{report:?}"
    );
    assert_eq!(queue.outage.load(Ordering::SeqCst), 0, "the outage is over");
    assert_eq!(flaky.calls.load(Ordering::SeqCst), 1, "each ran once");
    let other = WorkerId(uuid_from(2));
    let left = inner
        .claim(&other, "default", 10, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(left.is_empty(), "nothing is left leased: {left:?}");
}

/// Tasks a claim took whose answer was lost are given back before the
/// next claim and run at once, not after their lease runs out (which the
/// manual clock here never lets happen).
#[tokio::test]
async fn tasks_of_a_claim_whose_answer_was_lost_run_at_once() {
    let (inner, clock) = memory_queue();
    let queue = Arc::new(Outage::new(inner.clone(), 0, 1));
    let mut handlers = Handlers::new();
    handlers.register("quick", Arc::new(Quick));
    let w = worker(queue.clone(), clock, handlers);
    let dag = DagSpec::new(product())
        .node(NodeSpec::new("a", "quick", json!({})))
        .node(NodeSpec::new("b", "quick", json!({})));
    let id = queue.enqueue_dag(&dag).await.unwrap();
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let run = tokio::spawn(w.run(async move {
        let _ = stopped.wait_for(|s| *s).await;
    }));
    wait_until("the run to complete", Duration::from_secs(30), || {
        let inner = inner.clone();
        async move { inner.dag_status(&product(), id).await.unwrap().state == DagState::Completed }
    })
    .await;
    assert_eq!(
        queue.lost_claims.load(Ordering::SeqCst),
        0,
        "a claim was lost"
    );
    stop.send(true).unwrap();
    run.await.unwrap().unwrap();
}

/// Counts its runs.
#[derive(Default)]
struct Counted {
    runs: AtomicUsize,
}

#[async_trait]
impl TaskHandler for Counted {
    async fn run(&self, _task: &Lease) -> Result<Value, TaskError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(json!("counted"))
    }
}

/// Answers once the test lets it.
struct Held(tokio::sync::Semaphore);

#[async_trait]
impl TaskHandler for Held {
    async fn run(&self, _task: &Lease) -> Result<Value, TaskError> {
        let _go = self.0.acquire().await;
        Ok(json!("let go"))
    }
}

/// A completion has committed, claiming the next node for this worker, and
/// its answer is not back yet when another task's failed recording makes
/// the worker give back what it leased but does not hold: the claimed node
/// is not given back (it was, and ran twice on one attempt: once here and
/// once claimed afresh, as a flow chain's progress counted it twice after a
/// database restart).
#[tokio::test]
async fn a_node_a_completion_claimed_is_not_given_back_while_its_answer_is_on_the_way() {
    let (inner, clock) = memory_queue();
    let queue = Arc::new(Outage::new(inner.clone(), 0, 0).stalling("first"));
    let counted = Arc::new(Counted::default());
    let other = Arc::new(Held(tokio::sync::Semaphore::new(0)));
    let mut handlers = Handlers::new();
    handlers.register("first", Arc::new(Quick));
    handlers.register("next", counted.clone());
    handlers.register("other", other.clone());
    let w = worker(queue.clone(), clock, handlers);
    let dag = DagSpec::new(product())
        .node(NodeSpec::new("a", "first", json!({})))
        .node(NodeSpec::new("b", "next", json!({})))
        .edge("a", "b");
    let id = queue.enqueue_dag(&dag).await.unwrap();
    queue
        .enqueue(&[TaskSpec::new(product(), "other", json!({}))])
        .await
        .unwrap();
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let run = tokio::spawn(w.run(async move {
        let _ = stopped.wait_for(|s| *s).await;
    }));
    wait_until(
        "a's completion to hold its answer",
        Duration::from_secs(30),
        || {
            let n = queue.stalled.load(Ordering::SeqCst);
            async move { n == 1 }
        },
    )
    .await;
    // The other task's outcome cannot be recorded at first.
    queue.outage.store(1, Ordering::SeqCst);
    other.0.add_permits(1);
    let given_back = tokio::time::Instant::now() + Duration::from_secs(3);
    while queue.unheld_calls.load(Ordering::SeqCst) == 0 && tokio::time::Instant::now() < given_back
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    queue.gate.add_permits(1);
    wait_until("the run to complete", Duration::from_secs(30), || {
        let inner = inner.clone();
        async move { inner.dag_status(&product(), id).await.unwrap().state == DagState::Completed }
    })
    .await;
    stop.send(true).unwrap();
    run.await.unwrap().unwrap();
    assert!(
        queue.unheld_calls.load(Ordering::SeqCst) > 0,
        "the worker never gave back unheld tasks"
    );
    assert_eq!(
        counted.runs.load(Ordering::SeqCst),
        1,
        "b ran more than once"
    );
}

#[derive(Default)]
struct Slow {
    started: AtomicUsize,
}

#[async_trait]
impl TaskHandler for Slow {
    async fn run(&self, _task: &Lease) -> Result<Value, TaskError> {
        self.started.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Ok(json!("never"))
    }
}

#[tokio::test]
async fn a_handler_past_its_deadline_fails_retryably() {
    let (queue, clock) = memory_queue();
    let mut handlers = Handlers::new();
    handlers.register("slow", Arc::new(Slow::default()));
    let w = worker(queue.clone(), clock, handlers);
    queue
        .enqueue(&[TaskSpec::new(product(), "slow", json!({})).timeout(Duration::from_millis(50))])
        .await
        .unwrap();
    let report = w.step().await.unwrap();
    assert_eq!((report.claimed, report.retried), (1, 1), "{report:?}");
}

#[tokio::test]
async fn shutdown_releases_the_leases_still_held() {
    let (queue, clock) = memory_queue();
    let slow = Arc::new(Slow::default());
    let mut handlers = Handlers::new();
    handlers.register("slow", slow.clone());
    let w = worker(queue.clone(), clock, handlers);
    queue
        .enqueue(&[
            TaskSpec::new(product(), "slow", json!({})).max_attempts(1),
            TaskSpec::new(product(), "slow", json!({})).max_attempts(1),
        ])
        .await
        .unwrap();
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let run = tokio::spawn(w.run(async move {
        let _ = stopped.wait_for(|s| *s).await;
    }));
    wait_until("both tasks to start", Duration::from_secs(30), || {
        let n = slow.started.load(Ordering::SeqCst);
        async move { n == 2 }
    })
    .await;
    let other = WorkerId(uuid_from(2));
    let probe = queue
        .claim(&other, "default", 10, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(probe.is_empty(), "the worker holds both tasks");
    stop.send(true).unwrap();
    run.await.unwrap().unwrap();
    let back = queue
        .claim(&other, "default", 10, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(back.len(), 2, "released, not lost");
    assert!(
        back.iter().all(|l| l.attempt == 1),
        "a released attempt does not count"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_process_loses_no_dag_node() {
    let Some(pool) = test_pool().await else {
        return;
    };
    let url = url_for(&pool);
    let queue = PgTaskQueue::new(pool.clone(), Arc::new(SystemClock), QueueConfig::default());
    let dir = std::env::temp_dir().join(format!("parlance-kill-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("record.jsonl");
    let _ = std::fs::remove_file(&file);
    const SLEEPERS: usize = 6;
    let id = queue
        .enqueue_dag(&mixed_dag(SLEEPERS, 600, file.to_str()))
        .await
        .unwrap();

    let mut first = spawn_worker(
        &url,
        &["--slots", "3", "--stale-after-secs", "2", "--test-handlers"],
    );
    // Kill it while sleepers run and some nodes are already done.
    wait_until(
        "nodes to finish and sleepers to run",
        Duration::from_secs(120),
        || {
            let (q, p) = (&queue, pool.clone());
            async move {
                let st = q.dag_status(&product(), id).await.unwrap();
                let running = sqlx_count(
                    &p,
                    "SELECT count(*) FROM jobs WHERE dag_run_id = $1 AND state = 1",
                    id,
                )
                .await;
                st.done >= 1 && running >= 2
            }
        },
    )
    .await;
    first.kill().expect("SIGKILL the worker");
    first.wait().unwrap();
    let cut: Vec<i64> = sqlx_ids(
        &pool,
        "SELECT node_id FROM jobs WHERE dag_run_id = $1 AND state = 1",
        id,
    )
    .await;
    assert!(!cut.is_empty(), "the kill interrupted running nodes");
    let done_at_kill = queue.dag_status(&product(), id).await.unwrap().done;
    assert!(done_at_kill < mixed_total(SLEEPERS), "killed mid-DAG");

    let mut second = spawn_worker(
        &url,
        &["--slots", "3", "--stale-after-secs", "2", "--test-handlers"],
    );
    wait_until("the DAG to finish", Duration::from_secs(180), || {
        let q = &queue;
        async move {
            q.dag_status(&product(), id)
                .await
                .unwrap()
                .state
                .is_finished()
        }
    })
    .await;
    second.kill().unwrap();
    second.wait().unwrap();

    let st = queue.dag_status(&product(), id).await.unwrap();
    assert_eq!(st.state, DagState::Completed, "{st:?}");
    assert_eq!(
        (st.done, st.total),
        (mixed_total(SLEEPERS), mixed_total(SLEEPERS))
    );
    assert_eq!(final_result(&queue, id).await, mixed_expected(SLEEPERS));
    // Each node's result was recorded by exactly one completed job.
    let per_node: Vec<(i64, i64, i32)> = sqlx::query_as(
        "SELECT node_id, count(*) FILTER (WHERE state = 2), max(attempt) \
         FROM jobs WHERE dag_run_id = $1 GROUP BY node_id",
    )
    .bind(id.0)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        per_node.len(),
        mixed_total(SLEEPERS) as usize - 1,
        "every node but the combine ran as a job"
    );
    for (node, completed, attempts) in &per_node {
        assert_eq!(*completed, 1, "node {node} completed {completed} times");
        if cut.contains(node) {
            assert_eq!(*attempts, 2, "node {node} was re-run after the kill");
        } else {
            assert_eq!(*attempts, 1, "node {node} ran once");
        }
    }
    // The handlers' own records: every node ran; only interrupted ones twice.
    let mut runs: HashMap<String, usize> = HashMap::new();
    for line in std::fs::read_to_string(&file).unwrap().lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        *runs
            .entry(v["node"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    let keys: HashMap<i64, String> = sqlx::query_as::<_, (i64, String)>(
        "SELECT id, key FROM dag_nodes WHERE dag_run_id = $1 AND role = 0",
    )
    .bind(id.0)
    .fetch_all(&pool)
    .await
    .unwrap()
    .into_iter()
    .collect();
    for (node, key) in &keys {
        let n = runs.get(key).copied().unwrap_or(0);
        if cut.contains(node) {
            assert!((1..=2).contains(&n), "{key} recorded {n} times");
        } else {
            assert_eq!(n, 1, "{key} recorded {n} times");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

async fn sqlx_count(pool: &parlance_postgres::PgPool, sql: &str, id: DagId) -> i64 {
    sqlx::query_scalar(sql)
        .bind(id.0)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn sqlx_ids(pool: &parlance_postgres::PgPool, sql: &str, id: DagId) -> Vec<i64> {
    sqlx::query_scalar(sql)
        .bind(id.0)
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn operators_list_and_retry_dead_letters() {
    use parlance_app::cli::{TasksAction, tasks};
    let Some(pool) = test_pool().await else {
        return;
    };
    let queue = PgTaskQueue::new(pool.clone(), Arc::new(SystemClock), QueueConfig::default());
    let id = queue
        .enqueue(&[TaskSpec::new(product(), "doomed", json!({}))])
        .await
        .unwrap()[0]
        .unwrap();
    let lease = queue
        .claim(
            &WorkerId(uuid_from(1)),
            "default",
            1,
            Duration::from_secs(60),
        )
        .await
        .unwrap()
        .pop()
        .unwrap();
    queue.fail(&lease, "bad input", false).await.unwrap();
    let run = |action| {
        let pool = pool.clone();
        async move {
            let mut out = Vec::new();
            tasks(pool, action, &mut out)
                .await
                .map(|()| String::from_utf8(out).unwrap())
        }
    };
    let listed = run(TasksAction::Discarded {
        queue: "default".to_owned(),
        limit: 10,
    })
    .await
    .unwrap();
    let line: Value = serde_json::from_str(listed.trim()).unwrap();
    assert_eq!(line["id"], json!(id.0));
    assert_eq!(line["last_error"], json!("bad input"));
    let retry = |product: &str| TasksAction::Retry {
        product: product.to_owned(),
        id: id.0,
    };
    let elsewhere = run(retry("default")).await.unwrap_err();
    assert!(elsewhere.to_string().contains("not found"), "{elsewhere}");
    let retried = run(retry("acme")).await.unwrap();
    assert_eq!(retried.trim(), format!("task {} is available again", id.0));
    let err = run(retry("acme")).await.unwrap_err();
    assert!(err.to_string().contains("not found"), "{err}");
}

#[tokio::test]
async fn the_embedded_worker_picks_up_work_and_stops() {
    use parlance_app::AppState;
    let clock = Arc::new(ManualClock::new());
    let state = AppState::memory_with(
        crate::support::keys(),
        clock,
        Arc::new(parlance_ports::SequentialIds::new()),
    );
    let worker = state.start_worker(parlance_app::worker::WorkerConfig::default());
    // No machine registers this kind, so the worker dead-letters it.
    let id = state
        .shared
        .queue
        .enqueue(&[TaskSpec::new(product(), "unregistered", json!({}))])
        .await
        .unwrap()[0]
        .unwrap();
    let q = state.shared.queue.clone();
    wait_until(
        "the worker to take the task",
        Duration::from_secs(30),
        || {
            let q = q.clone();
            async move {
                let dead = q.list_discarded("default", 10).await.unwrap();
                dead.first().is_some_and(|d| d.id == id)
            }
        },
    )
    .await;
    tokio::time::timeout(Duration::from_secs(15), worker.stop())
        .await
        .expect("the worker stops");
}
