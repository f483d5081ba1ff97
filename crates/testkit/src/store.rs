//! Contract suite for [`MachineStore`] adapters: the one storage protocol,
//! checked for every machine on every adapter.
//!
//! A machine's testkit module implements [`StoreFixture`] (how to make keys
//! and the commands that create and change a record); every adapter runs
//! the suite with `parlance_testkit::machine_store_suite!(factory)`, where
//! the factory is an async expression producing `Option<Fixture>`.
//!
//! What it holds every adapter to: a record is created once and loads back
//! as it was committed; a commit is a compare-and-swap on the version; a
//! commit that fails writes no state, no audit entry and no task; a
//! committed decision's audit entries and tasks are there after it; of
//! racing commits on one version exactly one wins; records are scoped by
//! product.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use parlance_core::queue::TaskSpec;
use parlance_core::{Decision, EntityKey, Machine, ProductId, Task, Timestamp};
use parlance_ports::{
    AuditLog, Commit, Committed, ErrorKind, MachineStore, PortResult, Stored, TaskQueue, Version,
    WorkerId,
};

/// Runs every case of this suite against the fixture the factory builds.
///
/// See how [the in-memory adapters](https://github.com/parlance-rs/parlance/blob/main/crates/memory/tests/it/main.rs) and [the PostgreSQL adapters](https://github.com/parlance-rs/parlance/blob/main/crates/postgres/tests/it/main.rs) run it.
///
/// Any machine's fixture will do; here, conversations on the in-memory store
/// (the [`conversation::Subject`](crate::conversation::Subject) is their
/// fixture):
///
/// ```
/// # use std::sync::Arc;
/// # use parlance_memory::{MemoryAuditLog, MemoryConversationStore, MemoryTaskQueue};
/// # use parlance_ports::{QueueConfig, SystemClock};
/// use parlance_testkit::conversation::Subject;
///
/// fn fixture() -> Subject {
///     let audit = Arc::new(MemoryAuditLog::new());
///     let queue = Arc::new(MemoryTaskQueue::new(Arc::new(SystemClock), QueueConfig::default()));
///     let store = Arc::new(MemoryConversationStore::new(audit.clone(), queue.clone()));
///     Subject { store: store.clone(), index: store, audit, queue }
/// }
///
/// // In the adapter's `tests/it/main.rs`, one `#[tokio::test]` per case:
/// mod conversation_protocol {
///     parlance_testkit::machine_store_suite!(async { Some(super::fixture()) });
/// }
///
/// // What some of those tests run:
/// #[tokio::main]
/// async fn main() {
///     use parlance_testkit::store::*;
///
///     a_record_is_created_once_and_loads_back(fixture()).await;
///     a_commit_is_a_compare_and_swap(fixture()).await;
///     a_commit_writes_its_audit_entries_and_tasks(fixture()).await;
///     records_are_scoped_by_product(fixture()).await;
/// }
/// ```
#[macro_export]
macro_rules! machine_store_suite {
    ($factory:expr) => {
        $crate::contract_tests! {
            factory = $factory;
            suite = $crate::store;
            cases = [
                a_missing_record_loads_as_none,
                a_record_is_created_once_and_loads_back,
                a_commit_is_a_compare_and_swap,
                a_failed_commit_writes_no_audit_entry_and_no_task,
                a_commit_writes_its_audit_entries_and_tasks,
                an_invalid_task_fails_the_commit_and_writes_nothing,
                racing_commits_on_one_version_exactly_one_wins,
                records_are_scoped_by_product,
            ]
        }
    };
}

/// What the suite needs to know about one machine and one adapter.
pub trait StoreFixture: Send + Sync + 'static {
    /// The machine under test.
    type M: Machine + PartialEq;

    /// The store under test.
    fn store(&self) -> Arc<dyn MachineStore<Self::M>>;
    /// The audit log the store's commits write to.
    fn audit(&self) -> Arc<dyn AuditLog>;
    /// The task queue the store's commits enqueue on.
    fn queue(&self) -> Arc<dyn TaskQueue>;
    /// The context decisions are made with.
    fn context(&self) -> &<Self::M as Machine>::Context;
    /// The key of record `n` of `product`.
    fn key(&self, product: &ProductId, n: u32) -> <Self::M as Machine>::Key;
    /// A command that creates the record at `key` ([`Machine::create`]
    /// answers `Some`).
    fn create(&self, key: &<Self::M as Machine>::Key) -> <Self::M as Machine>::Command;
    /// A command `state` accepts that changes it, recording at least one
    /// transition and asking for at least one task when the machine has
    /// any ([`StoreFixture::audits_and_enqueues`]). It is decided once per
    /// commit the suite makes, on the state as it then is.
    fn change(&self, state: &Self::M) -> <Self::M as Machine>::Command;

    /// Whether the machine's changes record transitions and ask for tasks
    /// (a turn thread does neither): when true, every change the suite
    /// commits must, so the audit and task checks cannot pass vacuously.
    fn audits_and_enqueues(&self) -> bool {
        true
    }
}

fn product(p: &str) -> ProductId {
    ProductId::parse(p).expect("valid product id")
}

fn now() -> Timestamp {
    Timestamp::from_secs(1_767_225_600).expect("in range")
}

type Key<F> = <<F as StoreFixture>::M as Machine>::Key;

/// Decides the creation of the record at `key`.
fn decide_create<F: StoreFixture>(f: &F, key: &Key<F>) -> (F::M, Decision<F::M>) {
    F::M::create(key, f.context(), &f.create(key), now())
        .unwrap_or_else(|e| panic!("the fixture's create command is refused: {e}"))
        .expect("the fixture's create command creates a record")
}

/// Decides the fixture's change on `stored`.
fn decide_change<F: StoreFixture>(
    f: &F,
    stored: &Stored<F::M>,
) -> (F::M, <F::M as Machine>::Command, Decision<F::M>) {
    let command = f.change(&stored.state);
    let mut state = stored.state.clone();
    let decision = state
        .decide(f.context(), &command, now())
        .unwrap_or_else(|e| panic!("the fixture's change command is refused: {e}"));
    assert!(
        decision.changed,
        "the fixture's change must change the state"
    );
    if f.audits_and_enqueues() {
        assert!(
            !decision.transitions.is_empty() && !decision.tasks.is_empty(),
            "the fixture's change must record a transition and ask for a task"
        );
    }
    (state, command, decision)
}

async fn commit<F: StoreFixture>(
    f: &F,
    key: &Key<F>,
    expected: Option<Version>,
    command: &<F::M as Machine>::Command,
    state: &F::M,
    decision: &Decision<F::M>,
) -> PortResult<Committed<F::M>> {
    f.store()
        .commit(Commit {
            key,
            expected,
            command,
            state,
            decision,
            now: now(),
        })
        .await
}

/// Creates the record at `key` and returns it as loaded.
async fn created<F: StoreFixture>(f: &F, key: &Key<F>) -> Stored<F::M> {
    let (state, decision) = decide_create(f, key);
    let command = f.create(key);
    let done = commit(f, key, None, &command, &state, &decision)
        .await
        .expect("create");
    assert_eq!(done.version, Version::FIRST, "a new record is at version 1");
    f.store()
        .load(key)
        .await
        .expect("load")
        .expect("the created record loads")
}

/// The audit entries of the record at `key`.
async fn audit_len<F: StoreFixture>(f: &F, key: &Key<F>) -> usize {
    f.audit()
        .list(key.product_id(), F::M::KIND, &key.entity_id(), None, 10_000)
        .await
        .expect("list audit entries")
        .len()
}

/// Claims every runnable task; returns how many there were.
async fn drain(queue: &dyn TaskQueue, worker: u128) -> usize {
    let worker = WorkerId(uuid::Uuid::from_u128(worker));
    let mut n = 0;
    loop {
        let got = queue
            .claim(
                &worker,
                parlance_core::queue::DEFAULT_QUEUE,
                1_000,
                Duration::from_secs(600),
            )
            .await
            .expect("claim");
        if got.is_empty() {
            return n;
        }
        n += got.len();
    }
}

/// The jobs a committed decision makes runnable at once: each single task
/// (due now) and each DAG's roots.
fn runnable_jobs<M: Machine>(decision: &Decision<M>) -> usize {
    decision
        .tasks
        .iter()
        .map(|t| match t {
            Task::One(spec) => usize::from(spec.run_at.is_none_or(|at| at <= now())),
            Task::Dag(dag) => {
                let children: HashSet<&str> = dag.edges.iter().map(|(_, c)| c.as_str()).collect();
                dag.nodes
                    .iter()
                    .filter(|n| !children.contains(n.key.as_str()))
                    .count()
            }
        })
        .sum()
}

/// Nothing is stored under a key never committed.
pub async fn a_missing_record_loads_as_none<F: StoreFixture>(f: F) {
    let key = f.key(&product("p"), 1);
    assert!(f.store().load(&key).await.expect("load").is_none());
}

/// A created record loads back exactly, at version 1; creating it again is
/// a conflict that changes nothing.
pub async fn a_record_is_created_once_and_loads_back<F: StoreFixture>(f: F) {
    let key = f.key(&product("p"), 1);
    let (state, decision) = decide_create(&f, &key);
    let stored = created(&f, &key).await;
    assert_eq!(stored.version, Version::FIRST);
    assert_eq!(stored.state, state, "the record loads as it was committed");
    let again = commit(&f, &key, None, &f.create(&key), &state, &decision).await;
    assert_eq!(
        again.map(|c| c.version).map_err(|e| e.kind),
        Err(ErrorKind::Conflict),
        "a second create is a conflict"
    );
    let reloaded = f
        .store()
        .load(&key)
        .await
        .expect("load")
        .expect("still there");
    assert_eq!(reloaded, stored, "the refused create changed nothing");
}

/// A commit names the version it was decided on: the current one wins and
/// bumps it, a stale one is a conflict and changes nothing.
pub async fn a_commit_is_a_compare_and_swap<F: StoreFixture>(f: F) {
    let key = f.key(&product("p"), 1);
    let v1 = created(&f, &key).await;
    let (state, command, decision) = decide_change(&f, &v1);
    let done = commit(&f, &key, Some(v1.version), &command, &state, &decision)
        .await
        .expect("commit on the current version");
    assert_eq!(done.version, Version(2));
    let v2 = f.store().load(&key).await.expect("load").expect("stored");
    assert_eq!(v2.version, Version(2));
    let (stale_state, stale_command, stale) = decide_change(&f, &v1);
    let lost = commit(
        &f,
        &key,
        Some(v1.version),
        &stale_command,
        &stale_state,
        &stale,
    )
    .await;
    assert_eq!(
        lost.map(|c| c.version).map_err(|e| e.kind),
        Err(ErrorKind::Conflict),
        "a commit on a stale version is a conflict"
    );
    let after = f.store().load(&key).await.expect("load").expect("stored");
    assert_eq!(after, v2, "the lost commit changed nothing");
}

/// A commit that fails writes none of its audit entries and none of its
/// tasks.
pub async fn a_failed_commit_writes_no_audit_entry_and_no_task<F: StoreFixture>(f: F) {
    let key = f.key(&product("p"), 1);
    let v1 = created(&f, &key).await;
    let (state, command, decision) = decide_change(&f, &v1);
    commit(&f, &key, Some(v1.version), &command, &state, &decision)
        .await
        .expect("first change");
    drain(f.queue().as_ref(), 1).await;
    let audit_before = audit_len(&f, &key).await;
    let (stale_state, stale_command, stale) = decide_change(&f, &v1);
    let lost = commit(
        &f,
        &key,
        Some(v1.version),
        &stale_command,
        &stale_state,
        &stale,
    )
    .await;
    assert_eq!(
        lost.map(|_| ()).map_err(|e| e.kind),
        Err(ErrorKind::Conflict)
    );
    assert_eq!(
        audit_len(&f, &key).await,
        audit_before,
        "a failed commit wrote an audit entry"
    );
    assert_eq!(
        drain(f.queue().as_ref(), 2).await,
        0,
        "a failed commit enqueued a task"
    );
}

/// After a commit, its transitions are in the audit log, in order, and its
/// tasks are on the queue.
pub async fn a_commit_writes_its_audit_entries_and_tasks<F: StoreFixture>(f: F) {
    let key = f.key(&product("p"), 1);
    let v1 = created(&f, &key).await;
    drain(f.queue().as_ref(), 1).await;
    let audit_before = audit_len(&f, &key).await;
    let (state, command, decision) = decide_change(&f, &v1);
    let done = commit(&f, &key, Some(v1.version), &command, &state, &decision)
        .await
        .expect("commit");
    let written = done.written.as_ref().map_or(&decision, |(_, d)| d);
    let records = f
        .audit()
        .list(
            &key.product_id().clone(),
            F::M::KIND,
            &key.entity_id(),
            None,
            10_000,
        )
        .await
        .expect("list");
    let new: Vec<(Option<&str>, &str, &str)> = records[audit_before..]
        .iter()
        .map(|r| {
            (
                r.entry.from.as_deref(),
                r.entry.to.as_str(),
                r.entry.cause.as_str(),
            )
        })
        .collect();
    let expected: Vec<(Option<&str>, &str, &str)> = written
        .transitions
        .iter()
        .map(|t| (t.from.as_deref(), t.to.as_ref(), t.cause.as_ref()))
        .collect();
    assert_eq!(new, expected, "the decision's transitions, in order");
    for r in &records[audit_before..] {
        assert_eq!(r.entry.at, now());
        assert_eq!(&r.entry.product_id, key.product_id());
    }
    assert_eq!(
        drain(f.queue().as_ref(), 2).await,
        runnable_jobs(written),
        "the decision's tasks are on the queue"
    );
}

/// A decision whose task cannot be stored fails its commit: the state, the
/// audit log and the queue are as they were.
pub async fn an_invalid_task_fails_the_commit_and_writes_nothing<F: StoreFixture>(f: F) {
    let key = f.key(&product("p"), 1);
    let v1 = created(&f, &key).await;
    drain(f.queue().as_ref(), 1).await;
    let audit_before = audit_len(&f, &key).await;
    let (state, command, mut decision) = decide_change(&f, &v1);
    decision.task(TaskSpec::new(
        key.product_id().clone(),
        "",
        serde_json::json!({}),
    ));
    let refused = commit(&f, &key, Some(v1.version), &command, &state, &decision).await;
    assert_eq!(
        refused.map(|_| ()).map_err(|e| e.kind),
        Err(ErrorKind::Invalid),
        "a task with an empty kind is refused"
    );
    let after = f.store().load(&key).await.expect("load").expect("stored");
    assert_eq!(after, v1, "the refused commit changed the state");
    assert_eq!(
        audit_len(&f, &key).await,
        audit_before,
        "it wrote audit entries"
    );
    assert_eq!(drain(f.queue().as_ref(), 2).await, 0, "it enqueued tasks");
}

/// Of concurrent commits decided on one version, exactly one lands, and
/// only its audit entries and tasks are written.
pub async fn racing_commits_on_one_version_exactly_one_wins<F: StoreFixture>(f: F) {
    const RACERS: usize = 8;
    let f = Arc::new(f);
    let key = f.key(&product("p"), 1);
    let v1 = created(f.as_ref(), &key).await;
    drain(f.queue().as_ref(), 1).await;
    let audit_before = audit_len(f.as_ref(), &key).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(RACERS));
    let mut racers = Vec::new();
    for _ in 0..RACERS {
        let (f, key, v1, barrier) = (f.clone(), key.clone(), v1.clone(), barrier.clone());
        racers.push(tokio::spawn(async move {
            let (state, command, decision) = decide_change(f.as_ref(), &v1);
            barrier.wait().await;
            let result = commit(
                f.as_ref(),
                &key,
                Some(v1.version),
                &command,
                &state,
                &decision,
            )
            .await
            .map(|c| {
                (
                    c.version,
                    runnable_jobs(c.written.as_ref().map_or(&decision, |(_, d)| d)),
                )
            })
            .map_err(|e| e.kind);
            (result, decision.transitions.len())
        }));
    }
    let mut wins = Vec::new();
    for r in racers {
        let (result, transitions) = r.await.expect("racer");
        match result {
            Ok((version, jobs)) => wins.push((version, jobs, transitions)),
            Err(kind) => assert_eq!(kind, ErrorKind::Conflict, "a lost race is a conflict"),
        }
    }
    assert_eq!(wins.len(), 1, "exactly one commit wins: {wins:?}");
    let (version, jobs, transitions) = wins[0];
    assert_eq!(version, Version(2));
    assert_eq!(
        audit_len(f.as_ref(), &key).await,
        audit_before + transitions,
        "only the winner's audit entries"
    );
    assert_eq!(
        drain(f.queue().as_ref(), 2).await,
        jobs,
        "only the winner's tasks"
    );
}

/// The same id under two products is two records.
pub async fn records_are_scoped_by_product<F: StoreFixture>(f: F) {
    let a = f.key(&product("a"), 1);
    let b = f.key(&product("b"), 1);
    let only_in_a = f.key(&product("a"), 2);
    let a1 = created(&f, &a).await;
    let b1 = created(&f, &b).await;
    created(&f, &only_in_a).await;
    assert!(
        f.store()
            .load(&f.key(&product("b"), 2))
            .await
            .expect("load")
            .is_none(),
        "another product's record is not visible"
    );
    let (state, command, decision) = decide_change(&f, &a1);
    commit(&f, &a, Some(a1.version), &command, &state, &decision)
        .await
        .expect("change a");
    let b_after = f.store().load(&b).await.expect("load").expect("stored");
    assert_eq!(b_after, b1, "changing product a's record left b's alone");
}
