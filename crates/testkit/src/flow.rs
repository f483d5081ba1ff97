//! Contract suites for flow stores: the storage protocol for
//! [`FlowRecord`] ([`Fixture`] is its [`StoreFixture`], run with
//! `parlance_testkit::machine_store_suite!`), and what only a flow store
//! does, run with `parlance_testkit::flow_store_suite!`: the dialogue
//! appended by commits and read back, the DAG a commit enqueues named in
//! the session it commits, chain progress written in commits and counted
//! by workers, and the reads a poll or a worker makes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parlance_core::flow::{
    ContextRef, Email, FlowBuilder, FlowCommand, FlowContext, FlowEffect, FlowKey, FlowRecord,
    FlowSessionId, RunnerOptions, TemplateRef, User,
};
use parlance_core::{Decision, Machine, ProductId, Task, Timestamp};
use parlance_ports::{
    AuditLog, Commit, Committed, DagId, DagState, ErrorKind, FlowStore, MachineStore, PortResult,
    Stored, TaskQueue, Version, WorkerId,
};
use serde_json::json;

use crate::store::StoreFixture;

/// Runs every case of this suite against the fixture the factory builds.
///
/// See how [the in-memory adapters](https://github.com/parlance-rs/parlance/blob/main/crates/memory/tests/it/main.rs) and [the PostgreSQL adapters](https://github.com/parlance-rs/parlance/blob/main/crates/postgres/tests/it/main.rs) run it.
///
/// ```
/// # use std::sync::Arc;
/// # use parlance_memory::{MemoryAuditLog, MemoryFlowStore, MemoryTaskQueue};
/// # use parlance_ports::{QueueConfig, SystemClock};
/// use parlance_testkit::flow::Fixture;
///
/// /// The in-memory flow store, as both ports, with its audit log and queue.
/// fn fixture() -> Fixture {
///     let audit = Arc::new(MemoryAuditLog::new());
///     let config = QueueConfig::default();
///     let queue = Arc::new(MemoryTaskQueue::new(Arc::new(SystemClock), config));
///     let limits = config.dag_limits;
///     let store = Arc::new(MemoryFlowStore::with_queue(audit.clone(), queue.clone(), limits));
///     Fixture::new(store.clone(), store, audit, queue)
/// }
///
/// // In the adapter's `tests/it/main.rs`, one `#[tokio::test]` per case:
/// mod flow {
///     parlance_testkit::flow_store_suite!(async { Some(super::fixture()) });
/// }
///
/// // What some of those tests run:
/// #[tokio::main]
/// async fn main() {
///     use parlance_testkit::flow::*;
///
///     a_session_loads_back_with_its_dialogue_in_order(fixture()).await;
///     a_commit_that_starts_a_dag_names_the_run_in_the_session(fixture()).await;
///     reads_are_scoped_by_product(fixture()).await;
/// }
/// ```
#[macro_export]
macro_rules! flow_store_suite {
    ($factory:expr) => {
        $crate::contract_tests! {
            factory = $factory;
            suite = $crate::flow;
            cases = [
                a_session_loads_back_with_its_dialogue_in_order,
                a_session_keeps_the_order_of_its_model_keys,
                a_commit_that_starts_a_dag_names_the_run_in_the_session,
                a_lost_commit_writes_no_dialogue_no_progress_and_no_run,
                of_racing_commits_only_the_winners_dialogue_is_kept,
                progress_accumulates_across_a_chain,
                each_commit_audits_its_transition_with_the_flow,
                unknown_sessions_and_chains_are_absent,
                reads_are_scoped_by_product,
                a_dialogue_prefix_is_the_dialogue_as_it_was,
                a_dag_node_names_the_context_the_store_gives_back,
                a_users_sessions_are_listed_newest_first_within_product_and_flow,
                an_ephemeral_start_is_stored_with_its_user_and_its_run,
            ]
        }
    };
}

/// A flow store under test: the same adapter as the machine's store and
/// as the flow's own port, with the audit log and the task queue its
/// commits write to.
pub struct Fixture {
    records: Arc<dyn MachineStore<FlowRecord>>,
    store: Arc<dyn FlowStore>,
    audit: Arc<dyn AuditLog>,
    queue: Arc<dyn TaskQueue>,
    context: FlowContext,
    ids: AtomicU64,
}

impl Fixture {
    /// A fixture on `records` and `store` (one adapter), writing to `audit`
    /// and enqueueing on `queue`.
    pub fn new(
        records: Arc<dyn MachineStore<FlowRecord>>,
        store: Arc<dyn FlowStore>,
        audit: Arc<dyn AuditLog>,
        queue: Arc<dyn TaskQueue>,
    ) -> Self {
        Self {
            records,
            store,
            audit,
            queue,
            context: FlowContext::new(Arc::new(flow()), RunnerOptions::default()),
            ids: AtomicU64::new(1),
        }
    }

    fn fresh_id(&self) -> String {
        format!("{:04}", self.ids.fetch_add(1, Ordering::SeqCst))
    }
}

/// `ask` (user) --user_input--> `think` (invoker) --advance--> `ponder`
/// (invoker) --advance--> `think`: every change of a created session
/// starts a DAG, and every DAG joins the first one's chain.
fn flow() -> parlance_core::flow::Flow {
    FlowBuilder::new("contract")
        .template("ask.j2", "Ask.\nA question, please.")
        .template("think.j2", "thinking about {{ actor_input }}")
        .template("ponder.j2", "pondering {{ actor_input }}")
        .field("question", json!(null))
        .field("nested", json!({"answers": 2, "seen": ["a", "b"]}))
        .user_state("ask", "ask.j2")
        .invoker_state("think", TemplateRef::Name("think.j2".into()), "template")
        .invoker_state("ponder", TemplateRef::Name("ponder.j2".into()), "template")
        .on("user_input", "ask", "think")
        .on("advance", "think", "ponder")
        .on("advance", "ponder", "think")
        .build()
        .expect("the contract flow is valid")
}

impl StoreFixture for Fixture {
    type M = FlowRecord;

    fn store(&self) -> Arc<dyn MachineStore<FlowRecord>> {
        self.records.clone()
    }

    fn audit(&self) -> Arc<dyn AuditLog> {
        self.audit.clone()
    }

    fn queue(&self) -> Arc<dyn TaskQueue> {
        self.queue.clone()
    }

    fn context(&self) -> &FlowContext {
        &self.context
    }

    fn key(&self, product: &ProductId, n: u32) -> FlowKey {
        FlowKey::new(
            product.clone(),
            FlowSessionId::parse(format!("session-{n}")).expect("a valid id"),
        )
    }

    fn create(&self, _key: &FlowKey) -> FlowCommand {
        FlowCommand::start()
    }

    /// The user's input in `ask`; the DAG's result while one runs.
    fn change(&self, state: &FlowRecord) -> FlowCommand {
        match &state.session().running {
            Some(r) => FlowCommand::Complete {
                invocation_id: r.invocation_id.clone(),
                result: format!("result of {}", r.invocation_id),
                fresh_id: self.fresh_id(),
            },
            None => FlowCommand::Fire {
                event: "user_input".into(),
                input: "why?\nand how?".into(),
                fresh_id: self.fresh_id(),
            },
        }
    }
}

fn product(p: &str) -> ProductId {
    ProductId::parse(p).expect("valid product id")
}

fn now() -> Timestamp {
    Timestamp::from_secs(1_767_225_600).expect("in range")
}

/// A decision on `stored`, committed: the record as written, its decision
/// and what the store answered.
struct Step {
    state: FlowRecord,
    decision: Decision<FlowRecord>,
    committed: Committed<FlowRecord>,
}

async fn commit(
    f: &Fixture,
    key: &FlowKey,
    expected: Option<Version>,
    command: &FlowCommand,
    state: &FlowRecord,
    decision: &Decision<FlowRecord>,
) -> PortResult<Committed<FlowRecord>> {
    f.records
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

/// Decides `command` on `stored` (or creates the record) without committing.
fn decide(
    f: &Fixture,
    key: &FlowKey,
    stored: Option<&Stored<FlowRecord>>,
    command: &FlowCommand,
) -> (FlowRecord, Decision<FlowRecord>) {
    match stored {
        Some(s) => {
            let mut state = s.state.clone();
            let d = state
                .decide(&f.context, command, now())
                .unwrap_or_else(|e| panic!("{command:?} is refused: {e}"));
            (state, d)
        }
        None => FlowRecord::create(key, &f.context, command, now())
            .unwrap_or_else(|e| panic!("{command:?} is refused: {e}"))
            .expect("the command creates a session"),
    }
}

/// Decides and commits `command` on the record as stored.
async fn step(f: &Fixture, key: &FlowKey, command: &FlowCommand) -> Step {
    let stored = f.records.load(key).await.expect("load");
    let (state, decision) = decide(f, key, stored.as_ref(), command);
    let committed = commit(
        f,
        key,
        stored.map(|s| s.version),
        command,
        &state,
        &decision,
    )
    .await
    .expect("commit");
    let (state, decision) = committed.written.clone().unwrap_or((state, decision));
    Step {
        state,
        decision,
        committed,
    }
}

async fn start(f: &Fixture, key: &FlowKey) -> Step {
    step(f, key, &FlowCommand::start()).await
}

/// The fixture's change on the record as stored.
async fn change(f: &Fixture, key: &FlowKey) -> Step {
    let stored = f.records.load(key).await.expect("load").expect("stored");
    step(f, key, &f.change(&stored.state)).await
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

fn key_of(p: &str, id: &str) -> FlowKey {
    FlowKey::new(product(p), FlowSessionId::parse(id).expect("a valid id"))
}

/// The session loads back as committed, with its whole dialogue, oldest
/// first; the session read and the dialogue read agree with it.
pub async fn a_session_loads_back_with_its_dialogue_in_order(f: Fixture) {
    let key = key_of("p", "s1");
    let created = start(&f, &key).await;
    assert_eq!(created.committed.version, Version::FIRST);
    assert_eq!(created.state.dialogue().len(), 1, "the greeting");
    let asked = change(&f, &key).await;
    let answered = change(&f, &key).await;
    assert_eq!(answered.committed.version, Version(3));
    let loaded = f.records.load(&key).await.expect("load").expect("stored");
    assert_eq!(loaded.version, Version(3));
    assert_eq!(loaded.state, answered.state, "the record as written");
    assert_eq!(
        loaded.state.dialogue().len(),
        asked.state.dialogue().len(),
        "invoker -> invoker records nothing"
    );
    assert_eq!(
        loaded.state.dialogue()[..1],
        created.state.dialogue()[..],
        "nothing is rewritten"
    );
    assert_eq!(
        f.store.dialogue(&key).await.expect("dialogue"),
        loaded.state.dialogue()
    );
    let session = f
        .store
        .session(&key)
        .await
        .expect("session")
        .expect("stored");
    assert_eq!(session.version, Version(3));
    assert_eq!(&session.state, loaded.state.session());
}

/// The model's fields, and the keys of objects inside them, load back in
/// the order they were declared in (as the reference's Python dicts keep
/// them), not sorted or reordered by the store.
pub async fn a_session_keeps_the_order_of_its_model_keys(f: Fixture) {
    let key = key_of("p", "s1");
    start(&f, &key).await;
    let keys = |m: &serde_json::Map<String, serde_json::Value>| -> Vec<String> {
        m.keys().cloned().collect()
    };
    let loaded = f.records.load(&key).await.expect("load").expect("stored");
    let session = f
        .store
        .session(&key)
        .await
        .expect("session")
        .expect("stored");
    for model in [&loaded.state.session().model, &session.state.model] {
        assert_eq!(keys(model), ["question", "nested"]);
        let nested = model["nested"].as_object().expect("an object");
        assert_eq!(keys(nested), ["answers", "seen"]);
    }
}

/// A commit whose decision starts a DAG enqueues it with the session: the
/// run exists, its roots are runnable, the session written names it, and
/// the chain's progress counts its tasks.
pub async fn a_commit_that_starts_a_dag_names_the_run_in_the_session(f: Fixture) {
    let key = key_of("p", "s1");
    start(&f, &key).await;
    let asked = change(&f, &key).await;
    let dag = asked
        .state
        .session()
        .running
        .as_ref()
        .and_then(|r| r.dag_id)
        .expect("the written session names its run");
    assert!(
        asked.committed.written.is_some(),
        "the store reports the state it completed"
    );
    let stored = f
        .store
        .session(&key)
        .await
        .expect("session")
        .expect("stored");
    assert_eq!(stored.state.running.and_then(|r| r.dag_id), Some(dag));
    let status = f
        .queue
        .dag_status(&key.product_id, DagId(dag))
        .await
        .expect("status");
    assert_eq!(status.state, DagState::Running);
    let Some(Task::Dag(spec)) = asked.decision.tasks.first() else {
        panic!("the change starts a DAG");
    };
    assert_eq!(usize::try_from(status.total).ok(), Some(spec.nodes.len()));
    assert_eq!(drain(f.queue.as_ref(), 1).await, 1, "the root is runnable");
    let chain = asked
        .state
        .session()
        .running
        .as_ref()
        .map(|r| r.chain_id.clone())
        .expect("running");
    let progress = f
        .store
        .progress(&key, &chain)
        .await
        .expect("progress")
        .expect("the chain exists with its run");
    assert_eq!((progress.done, progress.total), (0, 2));
    assert_eq!(progress.label, "think");
}

/// A commit on a stale version writes no dialogue, no progress and no run.
pub async fn a_lost_commit_writes_no_dialogue_no_progress_and_no_run(f: Fixture) {
    let key = key_of("p", "s1");
    start(&f, &key).await;
    let v1 = f.records.load(&key).await.expect("load").expect("stored");
    let command = f.change(&v1.state);
    let (state, decision) = decide(&f, &key, Some(&v1), &command);
    let chain = state
        .session()
        .running
        .as_ref()
        .map(|r| r.chain_id.clone())
        .expect("running");
    let lost = commit(&f, &key, Some(Version(7)), &command, &state, &decision).await;
    assert_eq!(
        lost.map(|_| ()).map_err(|e| e.kind),
        Err(ErrorKind::Conflict)
    );
    assert_eq!(f.records.load(&key).await.expect("load"), Some(v1.clone()));
    assert_eq!(
        f.store.dialogue(&key).await.expect("dialogue"),
        v1.state.dialogue()
    );
    assert_eq!(
        f.store.progress(&key, &chain).await.expect("progress"),
        None
    );
    assert_eq!(drain(f.queue.as_ref(), 1).await, 0, "nothing was enqueued");
}

/// Of commits racing on one version, one lands: the dialogue holds its
/// elements only.
pub async fn of_racing_commits_only_the_winners_dialogue_is_kept(f: Fixture) {
    const RACERS: usize = 8;
    let f = Arc::new(f);
    let key = key_of("p", "s1");
    start(&f, &key).await;
    let v1 = f.records.load(&key).await.expect("load").expect("stored");
    let barrier = Arc::new(tokio::sync::Barrier::new(RACERS));
    let mut racers = Vec::new();
    for i in 0..RACERS {
        let (f, key, v1, barrier) = (f.clone(), key.clone(), v1.clone(), barrier.clone());
        racers.push(tokio::spawn(async move {
            let command = FlowCommand::Fire {
                event: "user_input".into(),
                input: format!("racer {i}"),
                fresh_id: f.fresh_id(),
            };
            let (state, decision) = decide(&f, &key, Some(&v1), &command);
            barrier.wait().await;
            commit(&f, &key, Some(v1.version), &command, &state, &decision)
                .await
                .map(|_| state)
                .map_err(|e| e.kind)
        }));
    }
    let mut wins = Vec::new();
    for r in racers {
        match r.await.expect("racer") {
            Ok(state) => wins.push(state),
            Err(kind) => assert_eq!(kind, ErrorKind::Conflict),
        }
    }
    assert_eq!(wins.len(), 1, "exactly one commit lands");
    assert_eq!(
        f.store.dialogue(&key).await.expect("dialogue"),
        wins[0].dialogue(),
        "the winner's dialogue, and no loser's element"
    );
}

/// A chain's totals grow with each DAG that joins it, and with what
/// workers count; its label follows the state running.
pub async fn progress_accumulates_across_a_chain(f: Fixture) {
    let key = key_of("p", "s1");
    start(&f, &key).await;
    let asked = change(&f, &key).await;
    let chain = asked
        .state
        .session()
        .running
        .as_ref()
        .map(|r| r.chain_id.clone())
        .expect("running");
    // The invoke node finished; the completion counts itself in its commit.
    f.store.task_done(&key, &chain, 1, 0).await.expect("done");
    let hopped = change(&f, &key).await;
    assert_eq!(
        hopped
            .state
            .session()
            .running
            .as_ref()
            .map(|r| r.chain_id.as_str()),
        Some(chain.as_str()),
        "an invoker -> invoker hop stays in its chain"
    );
    f.store.task_done(&key, &chain, 1, 3).await.expect("done");
    let got = f
        .store
        .progress(&key, &chain)
        .await
        .expect("progress")
        .expect("exists");
    assert_eq!((got.total, got.done, got.label.as_str()), (7, 3, "ponder"));
    assert_eq!(
        f.store
            .task_done(&key, "no-such-chain", 1, 0)
            .await
            .expect_err("no chain")
            .kind,
        ErrorKind::NotFound
    );
}

/// Creation and every change are audited as flow transitions with the
/// flow's name as detail, in order.
pub async fn each_commit_audits_its_transition_with_the_flow(f: Fixture) {
    let key = key_of("p", "s1");
    start(&f, &key).await;
    change(&f, &key).await;
    change(&f, &key).await;
    let trail: Vec<_> = f
        .audit
        .list(
            &key.product_id,
            parlance_core::EntityKind::Flow,
            key.session_id.as_str(),
            None,
            100,
        )
        .await
        .expect("list")
        .into_iter()
        .map(|r| {
            (
                r.entry.from,
                r.entry.to,
                r.entry.cause,
                r.entry.payload,
                r.entry.at,
            )
        })
        .collect();
    let detail = json!({"flow": "contract"});
    assert_eq!(
        trail,
        [
            (
                None,
                "ask".to_owned(),
                "start_session".to_owned(),
                detail.clone(),
                now()
            ),
            (
                Some("ask".to_owned()),
                "think".to_owned(),
                "user_input".to_owned(),
                detail.clone(),
                now()
            ),
            (
                Some("think".to_owned()),
                "ponder".to_owned(),
                "dag_completed".to_owned(),
                detail,
                now()
            ),
        ]
    );
}

/// Nothing is read for a session never committed, and no chain exists.
pub async fn unknown_sessions_and_chains_are_absent(f: Fixture) {
    let key = key_of("p", "nope");
    assert_eq!(f.records.load(&key).await.expect("load"), None);
    assert_eq!(f.store.session(&key).await.expect("session"), None);
    assert_eq!(
        f.store.dialogue(&key).await.expect_err("missing").kind,
        ErrorKind::NotFound
    );
    assert_eq!(
        f.store
            .dialogue_prefix(&key, 1)
            .await
            .expect_err("missing")
            .kind,
        ErrorKind::NotFound
    );
    assert_eq!(f.store.progress(&key, "c").await.expect("progress"), None);
    assert_eq!(
        f.store
            .task_done(&key, "c", 1, 0)
            .await
            .expect_err("missing")
            .kind,
        ErrorKind::NotFound
    );
}

/// Another product's session of the same id, its dialogue and its
/// progress are its own.
pub async fn reads_are_scoped_by_product(f: Fixture) {
    let a = key_of("a", "s1");
    let b = key_of("b", "s1");
    start(&f, &a).await;
    let asked = change(&f, &a).await;
    assert_eq!(f.store.session(&b).await.expect("session"), None);
    start(&f, &b).await;
    let chain = asked
        .state
        .session()
        .running
        .as_ref()
        .map(|r| r.chain_id.clone())
        .expect("running");
    assert_eq!(f.store.progress(&b, &chain).await.expect("progress"), None);
    assert_eq!(f.store.dialogue(&b).await.expect("dialogue").len(), 1);
    assert_eq!(f.store.dialogue(&a).await.expect("dialogue").len(), 2);
    let b_session = f.store.session(&b).await.expect("session").expect("stored");
    assert_eq!(b_session.state.state, "ask");
    assert!(
        asked
            .decision
            .effects
            .iter()
            .any(|e| matches!(e, FlowEffect::Dialogue(_))),
        "the change appended to a's dialogue"
    );
}

/// The first `len` elements of the dialogue, in order: none, some, all, and
/// all when `len` is past the end.
pub async fn a_dialogue_prefix_is_the_dialogue_as_it_was(f: Fixture) {
    let key = key_of("p", "s1");
    start(&f, &key).await;
    let asked = change(&f, &key).await;
    let all = asked.state.dialogue().to_vec();
    assert_eq!(all.len(), 2, "the greeting and the question");
    assert_eq!(f.store.dialogue(&key).await.expect("dialogue"), all);
    for len in 0..=3u64 {
        let prefix = f.store.dialogue_prefix(&key, len).await.expect("prefix");
        let want = &all[..usize::try_from(len).expect("small").min(all.len())];
        assert_eq!(prefix, want, "prefix of {len}");
    }
}

/// A DAG node's payload names the render data it was planned with; the
/// session and the dialogue prefix the store holds give it back, also once
/// the session has moved on in the same chain.
pub async fn a_dag_node_names_the_context_the_store_gives_back(f: Fixture) {
    let key = key_of("p", "s1");
    start(&f, &key).await;
    let asked = change(&f, &key).await;
    let planned = f
        .context
        .flow
        .render_data(asked.state.session(), asked.state.dialogue(), now());
    let worker = WorkerId(uuid::Uuid::from_u128(9));
    let leases = f
        .queue
        .claim(
            &worker,
            parlance_core::queue::DEFAULT_QUEUE,
            10,
            Duration::from_secs(600),
        )
        .await
        .expect("claim");
    let lease = leases
        .iter()
        .find(|l| l.kind == parlance_core::flow::queue::INVOKE_KIND)
        .expect("the invoker node is runnable");
    assert!(
        lease.payload.get("context").is_none(),
        "no copy of the data"
    );
    let cr: ContextRef =
        serde_json::from_value(lease.payload["context_ref"].clone()).expect("a context reference");
    let rebuild = |session: &parlance_core::flow::FlowSession,
                   dialogue: &[parlance_core::flow::DialogueElement]| {
        f.context
            .flow
            .render_data(session, dialogue, cr.planned_at().expect("a time"))
    };
    let session = f
        .store
        .session(&key)
        .await
        .expect("session")
        .expect("stored");
    let prefix = f
        .store
        .dialogue_prefix(&key, cr.dialogue_len)
        .await
        .expect("prefix");
    assert_eq!(prefix.len() as u64, cr.dialogue_len);
    assert_eq!(rebuild(&session.state, &prefix), planned);
    // The prefix stays what it was after the session moves on.
    change(&f, &key).await;
    let later = f
        .store
        .dialogue_prefix(&key, cr.dialogue_len)
        .await
        .expect("prefix");
    assert_eq!(later, prefix);
}

fn user(email: &str) -> User {
    serde_json::from_value(json!({
        "email": email, "firstname": "Ada", "lastname": "Lovelace",
        "custom_properties": {"team": "engines"}
    }))
    .expect("a valid user")
}

/// Creates session `id` of `p` for `email` (if any) with `ctx`'s flow,
/// committed at `at` seconds past [`now`].
async fn create_at(
    f: &Fixture,
    ctx: &FlowContext,
    p: &str,
    id: &str,
    email: Option<&str>,
    at: i64,
) -> FlowKey {
    let key = key_of(p, id);
    let command = FlowCommand::Start {
        seed_data: None,
        user_info: email.map(user),
    };
    let when = Timestamp::from_secs(1_767_225_600 + at).expect("in range");
    let (state, decision) = FlowRecord::create(&key, ctx, &command, when)
        .expect("start")
        .expect("creates");
    f.records
        .commit(Commit {
            key: &key,
            expected: None,
            command: &command,
            state: &state,
            decision: &decision,
            now: when,
        })
        .await
        .expect("commit");
    key
}

/// A user's sessions are the ones created for that email, of this product
/// and this flow only, newest first (ties by id, descending), at most the
/// limit; the user round-trips with the session and changes nothing later.
pub async fn a_users_sessions_are_listed_newest_first_within_product_and_flow(f: Fixture) {
    let other_flow = FlowContext::new(
        Arc::new(
            FlowBuilder::new("other")
                .template("ask.j2", "Ask.")
                .user_state("ask", "ask.j2")
                .build()
                .expect("a valid flow"),
        ),
        RunnerOptions::default(),
    );
    let ctx = f.context.clone();
    let ada = "ada@example.com";
    create_at(&f, &ctx, "p", "s-1", Some(ada), 10).await;
    create_at(&f, &ctx, "p", "s-2", Some(ada), 30).await;
    create_at(&f, &ctx, "p", "s-3", Some(ada), 20).await;
    // Created in the same instant: the greater id first.
    create_at(&f, &ctx, "p", "s-4", Some(ada), 30).await;
    // Another user, no user, another flow, another product, another case.
    create_at(&f, &ctx, "p", "s-5", Some("bob@example.com"), 40).await;
    create_at(&f, &ctx, "p", "s-6", None, 50).await;
    create_at(&f, &other_flow, "p", "s-7", Some(ada), 60).await;
    create_at(&f, &ctx, "q", "s-8", Some(ada), 70).await;
    create_at(&f, &ctx, "p", "s-9", Some("Ada@example.com"), 80).await;
    // A later change of a session does not move it.
    change(&f, &key_of("p", "s-1")).await;

    let email = Email::parse(ada).expect("valid");
    let list = |p: &'static str, flow: &'static str, limit: usize| {
        let (store, email) = (f.store.clone(), email.clone());
        async move {
            store
                .user_sessions(&product(p), flow, &email, limit)
                .await
                .expect("user sessions")
                .into_iter()
                .map(FlowSessionId::into_string)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        list("p", "contract", 10).await,
        ["s-4", "s-2", "s-3", "s-1"]
    );
    assert_eq!(list("p", "contract", 2).await, ["s-4", "s-2"]);
    assert_eq!(list("p", "contract", 0).await, Vec::<String>::new());
    assert_eq!(list("p", "other", 10).await, ["s-7"]);
    assert_eq!(list("q", "contract", 10).await, ["s-8"], "product q's own");
    assert_eq!(list("r", "contract", 10).await, Vec::<String>::new());
    let nobody = Email::parse("nobody@example.com").expect("valid");
    assert!(
        f.store
            .user_sessions(&product("p"), "contract", &nobody, 10)
            .await
            .expect("user sessions")
            .is_empty()
    );

    let stored = f
        .store
        .session(&key_of("p", "s-2"))
        .await
        .expect("session")
        .expect("stored");
    assert_eq!(
        stored.state.user_info,
        Some(user(ada)),
        "the user round-trips"
    );
    let loaded = f
        .records
        .load(&key_of("p", "s-1"))
        .await
        .expect("load")
        .expect("stored");
    assert_eq!(
        loaded.state.session().user_info,
        Some(user(ada)),
        "and stays through a change"
    );
    assert_eq!(loaded.state.session().seed_data, None, "no seed is stored");
}

/// An ephemeral start is one commit: the session with its user and the
/// `ephemeral` mark, the event's dialogue (no greeting), its run named in
/// the session, its progress, and both audit entries; a user's listing
/// finds it.
pub async fn an_ephemeral_start_is_stored_with_its_user_and_its_run(f: Fixture) {
    let key = key_of("p", "e1");
    let command = FlowCommand::StartEphemeral {
        user_info: Some(user("ada@example.com")),
        event: "user_input".into(),
        input: "why?".into(),
        fresh_id: f.fresh_id(),
    };
    let created = step(&f, &key, &command).await;
    let session = f
        .store
        .session(&key)
        .await
        .expect("session")
        .expect("stored");
    assert_eq!(session.version, Version::FIRST);
    assert!(session.state.ephemeral);
    assert_eq!(session.state.user_info, Some(user("ada@example.com")));
    assert_eq!(session.state.state, "think");
    let running = session.state.running.expect("a run");
    assert!(running.dag_id.is_some(), "the run is named in the session");
    assert_eq!(
        created
            .state
            .session()
            .running
            .as_ref()
            .and_then(|r| r.dag_id),
        running.dag_id
    );
    let dialogue = f.store.dialogue(&key).await.expect("dialogue");
    assert_eq!(dialogue.len(), 1, "the user's input, no greeting");
    assert_eq!(dialogue[0].event, "user_input");
    let progress = f
        .store
        .progress(&key, &running.chain_id)
        .await
        .expect("progress")
        .expect("written with the creation");
    assert_eq!((progress.done, progress.total), (0, 2));
    let causes: Vec<_> = f
        .audit
        .list(
            &key.product_id,
            parlance_core::EntityKind::Flow,
            key.session_id.as_str(),
            None,
            100,
        )
        .await
        .expect("list")
        .into_iter()
        .map(|r| (r.entry.from, r.entry.to, r.entry.cause))
        .collect();
    assert_eq!(
        causes,
        [
            (None, "ask".to_owned(), "start_session".to_owned()),
            (
                Some("ask".to_owned()),
                "think".to_owned(),
                "user_input".to_owned()
            ),
        ]
    );
    let email = Email::parse("ada@example.com").expect("valid");
    assert_eq!(
        f.store
            .user_sessions(&product("p"), "contract", &email, 10)
            .await
            .expect("user sessions"),
        std::slice::from_ref(&key.session_id)
    );
    assert_eq!(drain(f.queue.as_ref(), 1).await, 1, "the root is runnable");
}
