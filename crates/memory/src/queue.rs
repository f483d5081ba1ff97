//! The task queue in process: one mutex over every task, run and worker.
//!
//! Same semantics as the PostgreSQL queue (the shared contract suite holds
//! both to them), minus durability. Every operation takes the lock once, so
//! each is atomic: a claim never hands a task to two workers, and a DAG join
//! fires exactly once because the dependency counter is decremented under the
//! same lock as the fenced completion.
//!
//! As in PostgreSQL, a task or run is found only under its own product: an
//! id looked up under another product is not found, and a lease naming
//! another product is lost.
//!
//! A request whose dedup key a running task holds is kept on that task,
//! and every change that ends the task's run takes it under the same lock:
//! a finish enqueues it as a fresh task, a requeue runs it in the task's
//! place.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use parlance_core::queue::{
    RetryDecision, decide_retry, jitter_from_seed, map_combine_key, map_element_key,
};
use parlance_core::{ProductId, Timestamp};
use parlance_ports::{
    Clock, DagFailure, DagId, DagSpec, DagState, DagStatus, DagTask, DiscardedTask, FailOutcome,
    Lease, MapSpec, NodeInput, NodeResult, NodeState, PortError, PortResult, QueueConfig,
    QueueDepth, QueueFootprint, RecoverReport, TaskId, TaskQueue, TaskSpec, WorkerId,
};
use serde_json::Value;
use tokio::sync::Notify;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JobState {
    Available,
    Running,
    Completed,
    Discarded,
    Cancelled,
}

#[derive(Debug)]
struct Job {
    product_id: ProductId,
    queue: String,
    kind: String,
    payload: Value,
    state: JobState,
    priority: i16,
    run_at: Timestamp,
    attempt: u32,
    max_attempts: u32,
    timeout: Option<Duration>,
    token: i64,
    leased_by: Option<WorkerId>,
    expires_at: Timestamp,
    dag: Option<(i64, usize)>,
    dedup_key: Option<String>,
    /// The newest request folded into this task while it ran.
    rerun: Option<Request>,
    last_error: Option<String>,
    finished_at: Option<Timestamp>,
}

/// What a task is asked to run: its queue, payload and settings. A task
/// is made from one; a request folded into a running task with its dedup
/// key is kept as one, for the task's next run (see
/// `TaskSpec::dedup_key`).
#[derive(Debug, Clone)]
struct Request {
    queue: String,
    payload: Value,
    priority: i16,
    run_at: Timestamp,
    max_attempts: u32,
    timeout: Option<Duration>,
}

impl Request {
    fn of(spec: &TaskSpec, now: Timestamp) -> Self {
        Self {
            queue: spec.queue.clone(),
            payload: spec.payload.clone(),
            priority: spec.priority,
            run_at: spec.run_at.unwrap_or(now),
            max_attempts: spec.max_attempts,
            timeout: spec.timeout,
        }
    }
}

impl Job {
    /// A task of `product_id` and `kind` available from the request's
    /// `run_at`, not yet attempted.
    fn available(
        product_id: ProductId,
        kind: String,
        r: Request,
        dag: Option<(i64, usize)>,
        dedup_key: Option<String>,
        now: Timestamp,
    ) -> Self {
        Job {
            product_id,
            queue: r.queue,
            kind,
            payload: r.payload,
            state: JobState::Available,
            priority: r.priority,
            run_at: r.run_at,
            attempt: 0,
            max_attempts: r.max_attempts,
            timeout: r.timeout,
            token: 0,
            leased_by: None,
            expires_at: now,
            dag,
            dedup_key,
            rerun: None,
            last_error: None,
            finished_at: None,
        }
    }

    /// Makes the running task available again from `run_at`. A request
    /// folded into it is what runs next: the task takes its payload and
    /// settings, with its attempts counted afresh.
    fn requeue(&mut self, run_at: Timestamp) {
        self.state = JobState::Available;
        self.run_at = run_at;
        self.leased_by = None;
        if let Some(r) = self.rerun.take() {
            self.queue = r.queue;
            self.payload = r.payload;
            self.priority = r.priority;
            self.run_at = run_at.max(r.run_at);
            self.max_attempts = r.max_attempts;
            self.timeout = r.timeout;
            self.attempt = 0;
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Task,
    Combine,
}

#[derive(Debug)]
struct Node {
    key: String,
    kind: String,
    payload: Value,
    label: Option<String>,
    priority: i16,
    max_attempts: u32,
    timeout: Option<Duration>,
    map: Option<MapSpec>,
    role: Role,
    /// For a map element: the element.
    input: Option<(String, Value)>,
    remaining: u32,
    state: NodeState,
    result: Option<Value>,
}

impl Node {
    /// Drops what only running the node needed (its payload, a map's
    /// element template, an element's input): a completed node keeps its
    /// key, state and result.
    fn compact(&mut self) {
        self.payload = Value::Null;
        self.map = None;
        self.input = None;
    }
}

/// Bytes of `v` as JSON text; nothing for `null`.
fn json_bytes(v: &Value) -> u64 {
    if v.is_null() {
        return 0;
    }
    serde_json::to_vec(v).map_or(0, |b| b.len() as u64)
}

#[derive(Debug)]
struct Dag {
    product_id: ProductId,
    queue: String,
    state: DagState,
    total: u32,
    done: u32,
    error: Option<DagFailure>,
    nodes: Vec<Node>,
    /// `(parent, child, position)`.
    edges: Vec<(usize, usize, u32)>,
    finished_at: Option<Timestamp>,
}

#[derive(Debug, Default)]
struct State {
    last_task: i64,
    last_token: i64,
    last_dag: i64,
    jobs: BTreeMap<i64, Job>,
    dags: BTreeMap<i64, Dag>,
    workers: HashMap<WorkerId, Timestamp>,
}

/// A task queue held in memory.
pub struct MemoryTaskQueue {
    clock: Arc<dyn Clock>,
    config: QueueConfig,
    state: Mutex<State>,
    notify: Notify,
}

impl std::fmt::Debug for MemoryTaskQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryTaskQueue")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl MemoryTaskQueue {
    /// An empty queue reading time from `clock`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    /// use std::time::Duration;
    ///
    /// use parlance_core::ProductId;
    /// use parlance_core::queue::TaskSpec;
    /// use parlance_memory::MemoryTaskQueue;
    /// use parlance_ports::{IdGen, ManualClock, QueueConfig, SequentialIds, TaskQueue, WorkerId};
    /// use serde_json::json;
    ///
    /// let queue = MemoryTaskQueue::new(Arc::new(ManualClock::new()), QueueConfig::default());
    /// let task = TaskSpec::new(ProductId::parse("acme")?, "send_welcome", json!({"user": "u-1"}));
    /// queue.enqueue(&[task]).await?;
    ///
    /// // A worker claims from a queue, runs the handler of the task's kind and
    /// // completes the lease; a task whose lease expires is claimed again.
    /// let worker = WorkerId(SequentialIds::new().new_uuid());
    /// let leases = queue.claim(&worker, "default", 10, Duration::from_secs(30)).await?;
    /// assert_eq!(leases.len(), 1);
    /// assert_eq!(leases[0].kind, "send_welcome");
    /// assert_eq!(leases[0].payload["user"], "u-1");
    /// queue.complete(&leases[0], json!({"sent": true})).await?;
    ///
    /// assert!(queue.claim(&worker, "default", 10, Duration::from_secs(30)).await?.is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(clock: Arc<dyn Clock>, config: QueueConfig) -> Self {
        Self {
            clock,
            config,
            state: Mutex::new(State::default()),
            notify: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wake(&self) {
        wake(&self.notify);
    }

    /// Completes `lease`'s task under the lock (see
    /// [`TaskQueue::complete`]); the caller wakes the workers.
    fn complete_locked(
        &self,
        st: &mut State,
        lease: &Lease,
        result: Value,
        now: Timestamp,
    ) -> PortResult<()> {
        let dag = st.leased(lease)?.dag;
        // (run, node, is a map, run still running), while the run is kept.
        let node = dag.and_then(|(d, n)| {
            st.dags.get(&d).map(|g| {
                let is_map = g.nodes[n].map.is_some();
                (d, n, is_map, g.state == DagState::Running)
            })
        });
        if let Some((d, n, true, _)) = node
            && !result.is_array()
        {
            return Err(PortError::invalid(format!(
                "map node {:?} must return an array",
                st.dags[&d].nodes[n].key
            )));
        }
        if let Some((d, n, true, _)) = node
            && let Some(items) = result.as_array()
            && items.len() > self.config.dag_limits.max_nodes
        {
            return Err(PortError::invalid(format!(
                "map node {:?} returned {} items; a map fans out to at most {}",
                st.dags[&d].nodes[n].key,
                items.len(),
                self.config.dag_limits.max_nodes
            )));
        }
        let job = st.leased(lease)?;
        job.state = JobState::Completed;
        job.finished_at = Some(now);
        job.leased_by = None;
        // A completed task never runs again: its payload goes.
        job.payload = Value::Null;
        st.ended(lease.task_id.0, now);
        match node {
            Some((d, n, true, true)) => {
                let items = result.as_array().cloned().unwrap_or_default();
                // The map node itself is done; its children now wait for the
                // combine node, which the expansion adds.
                if let Some(dag) = st.dags.get_mut(&d) {
                    dag.nodes[n].state = NodeState::Completed;
                    dag.nodes[n].result = Some(result);
                    dag.done += 1;
                }
                st.expand_map(d, n, &items, now);
                if let Some(dag) = st.dags.get_mut(&d) {
                    dag.nodes[n].compact();
                }
            }
            Some((d, n, _, _)) => st.finish_node(d, n, result, now),
            None => {}
        }
        Ok(())
    }
}

impl State {
    fn insert_job(&mut self, job: Job) -> i64 {
        self.last_task += 1;
        self.jobs.insert(self.last_task, job);
        self.last_task
    }

    /// The live (available or running) task of `product` holding `key`.
    fn live_with_key(&mut self, product: &ProductId, key: &str) -> Option<&mut Job> {
        self.jobs.values_mut().find(|j| {
            &j.product_id == product
                && j.dedup_key.as_deref() == Some(key)
                && matches!(j.state, JobState::Available | JobState::Running)
        })
    }

    /// After task `id` finished (completed, discarded or cancelled): the
    /// request folded into it while it ran, if any, is enqueued as a fresh
    /// task of its kind with its key.
    fn ended(&mut self, id: i64, now: Timestamp) {
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        let Some(r) = job.rerun.take() else {
            return;
        };
        let fresh = Job::available(
            job.product_id.clone(),
            job.kind.clone(),
            r,
            None,
            job.dedup_key.clone(),
            now,
        );
        self.insert_job(fresh);
    }

    /// Enqueues node `n` of run `dag_id` (its parents are all done).
    fn enqueue_node(&mut self, dag_id: i64, n: usize, now: Timestamp) {
        let Some(dag) = self.dags.get_mut(&dag_id) else {
            return;
        };
        let node = &mut dag.nodes[n];
        node.state = NodeState::Queued;
        let request = Request {
            queue: dag.queue.clone(),
            payload: node.payload.clone(),
            priority: node.priority,
            run_at: now,
            max_attempts: node.max_attempts,
            timeout: node.timeout,
        };
        let job = Job::available(
            dag.product_id.clone(),
            node.kind.clone(),
            request,
            Some((dag_id, n)),
            None,
            now,
        );
        self.insert_job(job);
    }

    /// Marks node `n` completed with `result` and frees its children;
    /// combine nodes that become ready resolve at once, in a loop.
    fn finish_node(&mut self, dag_id: i64, n: usize, result: Value, now: Timestamp) {
        let mut work = vec![(n, result)];
        while let Some((n, result)) = work.pop() {
            let mut ready = Vec::new();
            {
                let Some(dag) = self.dags.get_mut(&dag_id) else {
                    return;
                };
                dag.nodes[n].state = NodeState::Completed;
                dag.nodes[n].result = Some(result);
                dag.nodes[n].compact();
                dag.done += 1;
                if dag.state != DagState::Running {
                    continue;
                }
                let children: Vec<usize> =
                    dag.edges.iter().filter(|e| e.0 == n).map(|e| e.1).collect();
                for c in children {
                    let child = &mut dag.nodes[c];
                    child.remaining -= 1;
                    if child.remaining == 0 {
                        ready.push(c);
                    }
                }
            }
            for c in ready {
                let dag = self.dags.get_mut(&dag_id).expect("run exists");
                if dag.nodes[c].role == Role::Combine {
                    let mut parents: Vec<(u32, usize)> = dag
                        .edges
                        .iter()
                        .filter(|e| e.1 == c)
                        .map(|e| (e.2, e.0))
                        .collect();
                    parents.sort_unstable();
                    let list = parents
                        .iter()
                        .map(|&(_, p)| dag.nodes[p].result.clone().unwrap_or(Value::Null))
                        .collect();
                    work.push((c, Value::Array(list)));
                } else {
                    self.enqueue_node(dag_id, c, now);
                }
            }
            let dag = self.dags.get_mut(&dag_id).expect("run exists");
            if dag.state == DagState::Running && dag.done == dag.total {
                dag.state = DagState::Completed;
                dag.finished_at = Some(now);
            }
        }
    }

    /// Replaces map node `n`'s outgoing edges by a combine node fed by one
    /// new node per element.
    fn expand_map(&mut self, dag_id: i64, n: usize, items: &[Value], now: Timestamp) {
        let dag = self.dags.get_mut(&dag_id).expect("run exists");
        let map = dag.nodes[n].map.clone().expect("a map node");
        let key = dag.nodes[n].key.clone();
        let (priority, max_attempts, timeout) = {
            let m = &dag.nodes[n];
            (m.priority, m.max_attempts, m.timeout)
        };
        let combine = dag.nodes.len() + items.len();
        let mut new_nodes = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            new_nodes.push(dag.nodes.len());
            dag.nodes.push(Node {
                key: map_element_key(&key, i),
                kind: map.kind.clone(),
                payload: map.payload.clone(),
                label: map.label.clone(),
                priority,
                max_attempts,
                timeout,
                map: None,
                role: Role::Task,
                input: Some((key.clone(), item.clone())),
                remaining: 0,
                state: NodeState::Pending,
                result: None,
            });
        }
        dag.nodes.push(Node {
            key: map_combine_key(&key),
            kind: String::new(),
            payload: Value::Null,
            label: None,
            priority,
            max_attempts,
            timeout,
            map: None,
            role: Role::Combine,
            input: None,
            remaining: u32::try_from(items.len()).unwrap_or(u32::MAX),
            state: NodeState::Pending,
            result: None,
        });
        for e in dag.edges.iter_mut().filter(|e| e.0 == n) {
            e.0 = combine;
        }
        for (i, &el) in new_nodes.iter().enumerate() {
            dag.edges
                .push((el, combine, u32::try_from(i).unwrap_or(u32::MAX)));
        }
        dag.total += u32::try_from(items.len() + 1).unwrap_or(u32::MAX);
        for el in new_nodes {
            self.enqueue_node(dag_id, el, now);
        }
        if items.is_empty() {
            self.finish_node(dag_id, combine, Value::Array(Vec::new()), now);
        }
    }

    /// Ends run `dag_id` (failed or cancelled): cancels its available tasks
    /// (and its running ones when `running_too`) and its waiting nodes.
    fn stop_dag(
        &mut self,
        dag_id: i64,
        state: DagState,
        error: Option<DagFailure>,
        running_too: bool,
        now: Timestamp,
    ) {
        let Some(dag) = self.dags.get_mut(&dag_id) else {
            return;
        };
        if dag.state != DagState::Running {
            return;
        }
        dag.state = state;
        dag.error = error;
        dag.finished_at = Some(now);
        // A run's tasks carry no dedup key, so no request was folded into
        // one of them.
        for job in self.jobs.values_mut() {
            let Some((d, n)) = job.dag else { continue };
            let stop =
                job.state == JobState::Available || (running_too && job.state == JobState::Running);
            if d == dag_id && stop {
                job.state = JobState::Cancelled;
                job.finished_at = Some(now);
                dag.nodes[n].state = NodeState::Cancelled;
            }
        }
        for node in &mut dag.nodes {
            if node.state == NodeState::Pending {
                node.state = NodeState::Cancelled;
            }
        }
    }

    /// Discards task `id` with `error`, failing its run if it has one.
    fn discard(&mut self, id: i64, error: &str, now: Timestamp) {
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        job.state = JobState::Discarded;
        job.last_error = Some(error.to_owned());
        job.finished_at = Some(now);
        job.leased_by = None;
        let dag = job.dag;
        self.ended(id, now);
        if let Some((d, n)) = dag {
            let Some(dag) = self.dags.get_mut(&d) else {
                return;
            };
            dag.nodes[n].state = NodeState::Failed;
            let failure = DagFailure {
                node: dag.nodes[n].key.clone(),
                message: error.to_owned(),
            };
            self.stop_dag(d, DagState::Failed, Some(failure), false, now);
        }
    }

    /// Whether task `id` belongs to a run that is over.
    fn run_over(&self, id: i64) -> bool {
        self.jobs
            .get(&id)
            .and_then(|j| j.dag)
            .and_then(|(d, _)| self.dags.get(&d))
            .is_some_and(|d| d.state != DagState::Running)
    }

    /// Cancels task `id` and its node.
    fn cancel_job(&mut self, id: i64, now: Timestamp) {
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        job.state = JobState::Cancelled;
        job.finished_at = Some(now);
        job.leased_by = None;
        let dag = job.dag;
        self.ended(id, now);
        if let Some((d, n)) = dag
            && let Some(dag) = self.dags.get_mut(&d)
        {
            dag.nodes[n].state = NodeState::Cancelled;
        }
    }

    /// The running task `lease` names (under its product), if the lease
    /// still holds.
    fn leased(&mut self, lease: &Lease) -> PortResult<&mut Job> {
        match self.jobs.get_mut(&lease.task_id.0) {
            Some(j)
                if j.product_id == lease.product_id
                    && j.state == JobState::Running
                    && j.token == lease.token
                    && j.leased_by == Some(lease.worker) =>
            {
                Ok(j)
            }
            _ => Err(PortError::lease_lost(lease)),
        }
    }

    /// `product`'s run `id`; `NotFound` for an unknown run or another
    /// product's.
    fn dag(&self, product: &ProductId, id: DagId) -> PortResult<&Dag> {
        self.dags
            .get(&id.0)
            .filter(|d| &d.product_id == product)
            .ok_or_else(|| PortError::not_found(format!("dag run {id}")))
    }

    fn status(&self, product: &ProductId, id: DagId) -> PortResult<DagStatus> {
        let dag = self.dag(product, id)?;
        let mut labels: Vec<String> = Vec::new();
        for n in &dag.nodes {
            if n.state == NodeState::Queued
                && let Some(l) = &n.label
                && !labels.contains(l)
            {
                labels.push(l.clone());
            }
        }
        Ok(DagStatus {
            id,
            product_id: dag.product_id.clone(),
            state: dag.state,
            total: dag.total,
            done: dag.done,
            labels,
            error: dag.error.clone(),
        })
    }

    /// Leases available job `id` to `worker` with a fresh token.
    fn lease_job(&mut self, id: i64, worker: &WorkerId, lease: Duration, now: Timestamp) -> Lease {
        self.last_token += 1;
        let token = self.last_token;
        let job = self.jobs.get_mut(&id).expect("an available job");
        job.state = JobState::Running;
        job.attempt += 1;
        job.token = token;
        job.leased_by = Some(*worker);
        job.expires_at = now + job.timeout.unwrap_or(lease);
        let job = self.jobs.get(&id).expect("an available job");
        Lease {
            task_id: TaskId(id),
            token,
            worker: *worker,
            product_id: job.product_id.clone(),
            kind: job.kind.clone(),
            queue: job.queue.clone(),
            payload: job.payload.clone(),
            attempt: job.attempt,
            max_attempts: job.max_attempts,
            expires_at: job.expires_at,
            dag: self.dag_task(job),
        }
    }

    fn dag_task(&self, job: &Job) -> Option<DagTask> {
        let (d, n) = job.dag?;
        let dag = self.dags.get(&d)?;
        let node = &dag.nodes[n];
        let inputs = match &node.input {
            Some((from, value)) => vec![NodeInput {
                from: from.clone(),
                value: value.clone(),
            }],
            None => {
                let mut parents: Vec<(u32, usize)> = dag
                    .edges
                    .iter()
                    .filter(|e| e.1 == n)
                    .map(|e| (e.2, e.0))
                    .collect();
                parents.sort_unstable();
                parents
                    .into_iter()
                    .map(|(_, p)| NodeInput {
                        from: dag.nodes[p].key.clone(),
                        value: dag.nodes[p].result.clone().unwrap_or(Value::Null),
                    })
                    .collect()
            }
        };
        Some(DagTask {
            dag_id: DagId(d),
            node: node.key.clone(),
            inputs,
            is_map: node.map.is_some(),
        })
    }
}

#[async_trait]
impl TaskQueue for MemoryTaskQueue {
    async fn enqueue(&self, tasks: &[TaskSpec]) -> PortResult<Vec<Option<TaskId>>> {
        for t in tasks {
            t.validate()?;
        }
        let now = self.clock.now();
        let mut ids = Vec::with_capacity(tasks.len());
        {
            let mut st = self.lock();
            for t in tasks {
                if let Some(key) = &t.dedup_key
                    && let Some(live) = st.live_with_key(&t.product_id, key)
                {
                    // Folded: a waiting task answers the request as it is;
                    // a running one runs again with it.
                    if live.state == JobState::Running {
                        live.rerun = Some(Request::of(t, now));
                    }
                    ids.push(None);
                    continue;
                }
                let id = st.insert_job(Job::available(
                    t.product_id.clone(),
                    t.kind.clone(),
                    Request::of(t, now),
                    None,
                    t.dedup_key.clone(),
                    now,
                ));
                ids.push(Some(TaskId(id)));
            }
        }
        self.wake();
        Ok(ids)
    }

    async fn enqueue_dag(&self, spec: &DagSpec) -> PortResult<DagId> {
        let plan = spec.plan(&self.config.dag_limits)?;
        let now = self.clock.now();
        let mut st = self.lock();
        st.last_dag += 1;
        let id = st.last_dag;
        let nodes = spec
            .nodes
            .iter()
            .zip(&plan.remaining_deps)
            .map(|(n, &remaining)| Node {
                key: n.key.clone(),
                kind: n.kind.clone(),
                payload: n.payload.clone(),
                label: n.label.clone(),
                priority: n.priority,
                max_attempts: n.max_attempts,
                timeout: n.timeout,
                map: n.map.clone(),
                role: Role::Task,
                input: None,
                remaining,
                state: NodeState::Pending,
                result: None,
            })
            .collect();
        st.dags.insert(
            id,
            Dag {
                product_id: spec.product_id.clone(),
                queue: spec.queue.clone(),
                state: DagState::Running,
                total: u32::try_from(spec.nodes.len()).unwrap_or(u32::MAX),
                done: 0,
                error: None,
                nodes,
                edges: plan.edges.clone(),
                finished_at: None,
            },
        );
        for &r in &plan.roots {
            st.enqueue_node(id, r, now);
        }
        drop(st);
        self.wake();
        Ok(DagId(id))
    }

    async fn claim(
        &self,
        worker: &WorkerId,
        queue: &str,
        max: usize,
        lease: Duration,
    ) -> PortResult<Vec<Lease>> {
        let now = self.clock.now();
        let mut st = self.lock();
        st.workers.insert(*worker, now);
        let mut runnable: Vec<(i16, Timestamp, i64)> = st
            .jobs
            .iter()
            .filter(|(_, j)| j.state == JobState::Available && j.queue == queue && j.run_at <= now)
            .map(|(&id, j)| (j.priority, j.run_at, id))
            .collect();
        runnable.sort_unstable();
        runnable.truncate(max);
        Ok(runnable
            .into_iter()
            .map(|(_, _, id)| st.lease_job(id, worker, lease, now))
            .collect())
    }

    async fn complete(&self, lease: &Lease, result: Value) -> PortResult<()> {
        let now = self.clock.now();
        let mut st = self.lock();
        self.complete_locked(&mut st, lease, result, now)?;
        drop(st);
        self.wake();
        Ok(())
    }

    async fn complete_and_claim(
        &self,
        lease: &Lease,
        result: Value,
        kinds: &[String],
        max: usize,
        lease_for: Duration,
    ) -> PortResult<Vec<Lease>> {
        let now = self.clock.now();
        let mut st = self.lock();
        let first_new = st.last_task + 1;
        let is_map = st
            .leased(lease)?
            .dag
            .and_then(|(d, n)| st.dags.get(&d).map(|g| g.nodes[n].map.is_some()))
            .unwrap_or(false);
        self.complete_locked(&mut st, lease, result, now)?;
        // The children this completion freed (not a map's elements, nor
        // the task a folded request enqueued), best first.
        let mut freed: Vec<(i16, Timestamp, i64)> = st
            .jobs
            .range(first_new..)
            .filter(|(_, j)| {
                !is_map
                    && j.dag.is_some()
                    && j.state == JobState::Available
                    && j.queue == lease.queue
                    && j.run_at <= now
            })
            .map(|(&id, j)| (j.priority, j.run_at, id))
            .collect();
        freed.sort_unstable();
        let left = st.jobs.range(first_new..).count();
        let taken: Vec<Lease> = freed
            .into_iter()
            .filter(|&(_, _, id)| kinds.contains(&st.jobs[&id].kind))
            .take(max)
            .map(|(_, _, id)| id)
            .collect::<Vec<_>>()
            .into_iter()
            .map(|id| st.lease_job(id, &lease.worker, lease_for, now))
            .collect();
        drop(st);
        // Other workers are woken only for the work left to them.
        if left > taken.len() {
            self.wake();
        }
        Ok(taken)
    }

    async fn fail(&self, lease: &Lease, error: &str, retryable: bool) -> PortResult<FailOutcome> {
        let now = self.clock.now();
        let mut st = self.lock();
        let first_new = st.last_task + 1;
        let job = st.leased(lease)?;
        let decision = decide_retry(
            job.attempt,
            job.max_attempts,
            retryable,
            &self.config.backoff,
            jitter_from_seed(lease.token.unsigned_abs()),
        );
        let outcome = match decision {
            RetryDecision::RetryAfter(_) if st.run_over(lease.task_id.0) => {
                st.cancel_job(lease.task_id.0, now);
                FailOutcome::Cancelled
            }
            RetryDecision::RetryAfter(delay) => {
                let job = st.leased(lease)?;
                job.last_error = Some(error.to_owned());
                job.requeue(now + delay);
                FailOutcome::Retrying { run_at: job.run_at }
            }
            RetryDecision::Discard => {
                st.discard(lease.task_id.0, error, now);
                FailOutcome::Discarded
            }
        };
        // A folded request enqueued by the finish.
        let enqueued = st.last_task >= first_new;
        drop(st);
        if enqueued {
            self.wake();
        }
        Ok(outcome)
    }

    async fn release(&self, lease: &Lease) -> PortResult<()> {
        let now = self.clock.now();
        let mut st = self.lock();
        let job = st.leased(lease)?;
        job.attempt = job.attempt.saturating_sub(1);
        job.requeue(now);
        drop(st);
        self.wake();
        Ok(())
    }

    async fn release_unheld(&self, worker: &WorkerId, held: &[TaskId]) -> PortResult<u64> {
        let now = self.clock.now();
        let mut st = self.lock();
        let mut released = 0;
        for (id, job) in &mut st.jobs {
            if matches!(job.state, JobState::Running)
                && job.leased_by == Some(*worker)
                && !held.contains(&TaskId(*id))
            {
                job.attempt = job.attempt.saturating_sub(1);
                job.requeue(now);
                released += 1;
            }
        }
        drop(st);
        if released > 0 {
            self.wake();
        }
        Ok(released)
    }

    async fn heartbeat(&self, worker: &WorkerId) -> PortResult<()> {
        let now = self.clock.now();
        self.lock().workers.insert(*worker, now);
        Ok(())
    }

    async fn recover_expired(&self) -> PortResult<RecoverReport> {
        let now = self.clock.now();
        let stale_before = now - self.config.worker_stale_after;
        let mut st = self.lock();
        let first_new = st.last_task + 1;
        let stale = |st: &State, w: &Option<WorkerId>| {
            w.as_ref()
                .is_none_or(|w| st.workers.get(w).is_none_or(|&seen| seen < stale_before))
        };
        let lost: Vec<(i64, bool)> = st
            .jobs
            .iter()
            .filter(|(_, j)| {
                j.state == JobState::Running && (j.expires_at <= now || stale(&st, &j.leased_by))
            })
            .map(|(&id, j)| (id, j.attempt >= j.max_attempts))
            .collect();
        let mut report = RecoverReport::default();
        for (id, exhausted) in lost {
            let queue = st.jobs.get(&id).expect("listed above").queue.clone();
            report.count(&queue, 1);
            if st.run_over(id) {
                st.cancel_job(id, now);
                report.cancelled += 1;
            } else if exhausted {
                st.discard(id, "lease expired with no attempts left", now);
                report.discarded += 1;
            } else {
                let job = st.jobs.get_mut(&id).expect("listed above");
                job.last_error = Some("lease expired".to_owned());
                job.requeue(now);
                report.requeued += 1;
            }
        }
        st.workers.retain(|_, seen| *seen >= stale_before);
        // Folded requests enqueued by the finishes.
        let enqueued = st.last_task >= first_new;
        drop(st);
        if report.requeued > 0 || enqueued {
            self.wake();
        }
        Ok(report)
    }

    async fn cancel_dag(&self, product: &ProductId, id: DagId) -> PortResult<DagStatus> {
        let now = self.clock.now();
        let mut st = self.lock();
        st.dag(product, id)?;
        st.stop_dag(id.0, DagState::Cancelled, None, true, now);
        st.status(product, id)
    }

    async fn dag_status(&self, product: &ProductId, id: DagId) -> PortResult<DagStatus> {
        self.lock().status(product, id)
    }

    async fn dag_results(&self, product: &ProductId, id: DagId) -> PortResult<Vec<NodeResult>> {
        let st = self.lock();
        let dag = st.dag(product, id)?;
        Ok(dag
            .nodes
            .iter()
            .map(|n| NodeResult {
                key: n.key.clone(),
                state: n.state,
                result: n.result.clone(),
            })
            .collect())
    }

    async fn retry_discarded(&self, product: &ProductId, id: TaskId) -> PortResult<()> {
        let now = self.clock.now();
        let mut st = self.lock();
        match st.jobs.get_mut(&id.0) {
            Some(j) if &j.product_id == product && j.state == JobState::Discarded => {
                if j.dag.is_some() {
                    return Err(PortError::invalid(format!(
                        "task {id} is a dag node: re-run its dag"
                    )));
                }
                j.state = JobState::Available;
                j.attempt = 0;
                j.run_at = now;
                j.finished_at = None;
            }
            _ => return Err(PortError::not_found(format!("discarded task {id}"))),
        }
        drop(st);
        self.wake();
        Ok(())
    }

    async fn list_discarded(&self, queue: &str, limit: usize) -> PortResult<Vec<DiscardedTask>> {
        let st = self.lock();
        let mut dead: Vec<DiscardedTask> = st
            .jobs
            .iter()
            .filter(|(_, j)| j.state == JobState::Discarded && j.queue == queue)
            .map(|(&id, j)| DiscardedTask {
                id: TaskId(id),
                product_id: j.product_id.clone(),
                kind: j.kind.clone(),
                attempts: j.attempt,
                last_error: j.last_error.clone(),
                discarded_at: j.finished_at.unwrap_or(Timestamp::UNIX_EPOCH),
                dag_id: j.dag.map(|(d, _)| DagId(d)),
            })
            .collect();
        dead.sort_by(|a, b| b.discarded_at.cmp(&a.discarded_at).then(b.id.cmp(&a.id)));
        dead.truncate(limit);
        Ok(dead)
    }

    async fn purge_finished(&self, before: Timestamp) -> PortResult<u64> {
        let mut st = self.lock();
        let old = |f: Option<Timestamp>| f.is_some_and(|f| f < before);
        let jobs = st.jobs.len();
        st.jobs.retain(|_, j| {
            !(matches!(j.state, JobState::Completed | JobState::Cancelled) && old(j.finished_at))
        });
        let dags = st.dags.len();
        st.dags.retain(|_, d| !old(d.finished_at));
        Ok((jobs - st.jobs.len() + dags - st.dags.len()) as u64)
    }

    async fn footprint(&self, product: &ProductId) -> PortResult<QueueFootprint> {
        let st = self.lock();
        let mut f = QueueFootprint::default();
        for job in st.jobs.values().filter(|j| &j.product_id == product) {
            f.tasks += 1;
            f.payload_bytes += json_bytes(&job.payload);
            f.payload_bytes += job.rerun.as_ref().map_or(0, |r| json_bytes(&r.payload));
        }
        for dag in st.dags.values().filter(|d| &d.product_id == product) {
            f.runs += 1;
            for node in &dag.nodes {
                f.nodes += 1;
                f.payload_bytes += json_bytes(&node.payload);
                if let Some(m) = &node.map {
                    f.payload_bytes += json_bytes(&m.payload);
                }
                if let Some((_, input)) = &node.input {
                    f.payload_bytes += json_bytes(input);
                }
                f.result_bytes += node.result.as_ref().map_or(0, json_bytes);
            }
        }
        Ok(f)
    }

    async fn depth(&self, queue: &str) -> PortResult<QueueDepth> {
        let now = self.clock.now();
        let st = self.lock();
        let mut d = QueueDepth::default();
        for job in st.jobs.values().filter(|j| j.queue == queue) {
            match job.state {
                JobState::Available if job.run_at <= now => d.ready += 1,
                JobState::Available => d.scheduled += 1,
                JobState::Running => d.running += 1,
                JobState::Completed | JobState::Discarded | JobState::Cancelled => {}
            }
        }
        Ok(d)
    }

    async fn wait_for_work(&self, _queue: &str, timeout: Duration) {
        let _ = tokio::time::timeout(timeout, self.notify.notified()).await;
    }
}

/// Wakes every worker waiting for work now and leaves a permit for the next
/// wait, so a hint that arrives between a worker's empty claim and its wait
/// is not lost (at worst it costs one extra claim).
fn wake(notify: &tokio::sync::Notify) {
    notify.notify_waiters();
    notify.notify_one();
}
