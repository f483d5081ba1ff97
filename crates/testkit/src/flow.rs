//! Contract suite for [`FlowStore`] adapters.
//!
//! Run it from an adapter's tests with
//! `parlance_testkit::flow_store_suite!(async { Some(store) });`.

use std::sync::Arc;

use parlance_core::flow::{Actor, DialogueElement, FlowSession, Running};
use parlance_core::{ProductId, Timestamp};
use parlance_ports::{ErrorKind, FlowAppend, FlowStore, ProgressUpdate};
use serde_json::json;

/// Runs every case of this suite against the adapter the factory builds.
#[macro_export]
macro_rules! flow_store_suite {
    ($factory:expr) => {
        $crate::contract_tests! {
            factory = $factory;
            suite = $crate::flow;
            cases = [
                create_then_load_round_trips,
                create_twice_conflicts,
                save_with_a_stale_version_conflicts,
                dialogue_is_appended_in_order,
                unknown_sessions_are_not_found,
                sessions_are_scoped_by_product,
                progress_accumulates_across_a_chain,
                concurrent_saves_exactly_one_wins,
            ]
        }
    };
}

/// Runs the cases of a store that enqueues DAGs on a task queue.
#[macro_export]
macro_rules! flow_store_enqueue_suite {
    ($factory:expr) => {
        $crate::contract_tests! {
            factory = $factory;
            suite = $crate::flow::enqueue;
            cases = [
                a_save_that_starts_a_dag_enqueues_it_with_the_session,
                a_stale_save_enqueues_nothing,
            ]
        }
    };
}

/// Runs the cases about the audit entries a store writes with its changes.
#[macro_export]
macro_rules! flow_store_audit_suite {
    ($factory:expr) => {
        $crate::contract_tests! {
            factory = $factory;
            suite = $crate::flow::audit;
            cases = [
                each_write_appends_its_audit_entries,
                a_write_that_fails_appends_no_audit_entry,
            ]
        }
    };
}

/// The subject of this suite.
pub type Subject = Arc<dyn FlowStore>;

/// Dialogue elements to append, with no audit entry.
fn append(dialogue: &[DialogueElement]) -> FlowAppend<'_> {
    FlowAppend {
        dialogue,
        audit: &[],
    }
}

/// Nothing to append.
fn nothing() -> FlowAppend<'static> {
    FlowAppend::default()
}

fn product(p: &str) -> ProductId {
    ProductId::parse(p).expect("valid product id")
}

fn at(micros: i64) -> Timestamp {
    Timestamp::from_micros(1_767_225_600_000_000 + micros).expect("in range")
}

fn session(id: &str, state: &str) -> FlowSession {
    FlowSession {
        session_id: id.to_owned(),
        flow: "qa".to_owned(),
        state: state.to_owned(),
        model: json!({"question": "why?", "answers": 2, "nested": {"a": [1, 2]}})
            .as_object()
            .cloned()
            .unwrap_or_default(),
        actor: Some(Actor::User),
        actor_input: "line one\nline two".to_owned(),
        source_type: None,
        target_type: None,
        errors: Vec::new(),
        running: None,
        last_user_state: "ask".to_owned(),
    }
}

fn el(actor: Actor, text: Option<&str>, t: i64) -> DialogueElement {
    DialogueElement {
        actor,
        event: "user_input".to_owned(),
        actor_text: text.map(str::to_owned),
        timestamp: at(t),
    }
}

/// What is created is what is loaded, version 1.
pub async fn create_then_load_round_trips(store: Subject) {
    let p = product("p");
    let mut s = session("s1", "ask");
    s.running = Some(Running {
        invocation_id: "answer-1".into(),
        chain_id: "answer-1".into(),
        state: "answer".into(),
        dag_id: Some(7),
    });
    let init = [el(Actor::Assistant, Some("hello\n  there"), 1)];
    assert_eq!(
        store
            .create(&p, &s, append(&init), at(1))
            .await
            .expect("create"),
        1
    );
    let got = store.load(&p, "s1").await.expect("load");
    assert_eq!(got.session, s);
    assert_eq!(got.version, 1);
    assert_eq!(got.dialogue_len, 1);
    assert_eq!(store.dialogue(&p, "s1").await.expect("dialogue"), init);
}

/// A second create with the same id is a conflict.
pub async fn create_twice_conflicts(store: Subject) {
    let p = product("p");
    store
        .create(&p, &session("s1", "ask"), nothing(), at(1))
        .await
        .expect("create");
    let err = store
        .create(&p, &session("s1", "ask"), nothing(), at(2))
        .await
        .expect_err("duplicate");
    assert_eq!(err.kind, ErrorKind::Conflict);
}

/// Saving against an old version fails and changes nothing.
pub async fn save_with_a_stale_version_conflicts(store: Subject) {
    let p = product("p");
    store
        .create(&p, &session("s1", "ask"), nothing(), at(1))
        .await
        .expect("create");
    let v2 = store
        .save(&p, &session("s1", "answer"), 1, nothing(), None, at(2))
        .await
        .expect("save");
    assert_eq!(v2, 2);
    let err = store
        .save(
            &p,
            &session("s1", "followup"),
            1,
            append(&[el(Actor::User, Some("lost"), 3)]),
            None,
            at(3),
        )
        .await
        .expect_err("stale");
    assert_eq!(err.kind, ErrorKind::Conflict);
    let got = store.load(&p, "s1").await.expect("load");
    assert_eq!((got.session.state.as_str(), got.version), ("answer", 2));
    assert!(store.dialogue(&p, "s1").await.expect("dialogue").is_empty());
}

/// Saves append to the dialogue; nothing is rewritten.
pub async fn dialogue_is_appended_in_order(store: Subject) {
    let p = product("p");
    let first = el(Actor::Assistant, Some("hi"), 1);
    store
        .create(
            &p,
            &session("s1", "ask"),
            append(std::slice::from_ref(&first)),
            at(1),
        )
        .await
        .expect("create");
    let turn = [
        el(Actor::User, Some("question"), 2),
        el(Actor::Assistant, None, 3),
    ];
    store
        .save(&p, &session("s1", "ask"), 1, append(&turn), None, at(2))
        .await
        .expect("save");
    store
        .save(&p, &session("s1", "ask"), 2, nothing(), None, at(3))
        .await
        .expect("save");
    let got = store.dialogue(&p, "s1").await.expect("dialogue");
    assert_eq!(got, [first, turn[0].clone(), turn[1].clone()]);
    assert_eq!(store.load(&p, "s1").await.expect("load").dialogue_len, 3);
}

/// Unknown sessions and chains are `NotFound` (or absent progress).
pub async fn unknown_sessions_are_not_found(store: Subject) {
    let p = product("p");
    assert_eq!(
        store.load(&p, "nope").await.expect_err("missing").kind,
        ErrorKind::NotFound
    );
    assert_eq!(
        store.dialogue(&p, "nope").await.expect_err("missing").kind,
        ErrorKind::NotFound
    );
    assert_eq!(
        store
            .save(&p, &session("nope", "ask"), 1, nothing(), None, at(1))
            .await
            .expect_err("missing")
            .kind,
        ErrorKind::NotFound
    );
    assert_eq!(
        store.progress(&p, "nope", "c").await.expect("progress"),
        None
    );
}

/// Another product never sees the session.
pub async fn sessions_are_scoped_by_product(store: Subject) {
    store
        .create(&product("a"), &session("s1", "ask"), nothing(), at(1))
        .await
        .expect("create");
    assert_eq!(
        store
            .load(&product("b"), "s1")
            .await
            .expect_err("other product")
            .kind,
        ErrorKind::NotFound
    );
    store
        .create(&product("b"), &session("s1", "other"), nothing(), at(1))
        .await
        .expect("same id, other product");
    assert_eq!(
        store
            .load(&product("a"), "s1")
            .await
            .expect("load")
            .session
            .state,
        "ask"
    );
}

/// A chain's totals grow with each DAG that joins it; done counts tasks.
pub async fn progress_accumulates_across_a_chain(store: Subject) {
    let p = product("p");
    store
        .create(&p, &session("s1", "ask"), nothing(), at(1))
        .await
        .expect("create");
    let start = |total, label: &str| ProgressUpdate {
        chain_id: "c1".into(),
        add_total: total,
        add_done: 0,
        label: Some(label.into()),
    };
    store
        .save(
            &p,
            &session("s1", "one"),
            1,
            nothing(),
            Some(&start(2, "one")),
            at(2),
        )
        .await
        .expect("save");
    store.task_done(&p, "s1", "c1", 2, 0).await.expect("done");
    store
        .save(
            &p,
            &session("s1", "two"),
            2,
            nothing(),
            Some(&start(4, "two")),
            at(3),
        )
        .await
        .expect("save");
    store.task_done(&p, "s1", "c1", 1, 3).await.expect("done");
    let finish = ProgressUpdate {
        chain_id: "c1".into(),
        add_total: 0,
        add_done: 1,
        label: None,
    };
    store
        .save(
            &p,
            &session("s1", "ask"),
            3,
            nothing(),
            Some(&finish),
            at(4),
        )
        .await
        .expect("save");
    let got = store
        .progress(&p, "s1", "c1")
        .await
        .expect("progress")
        .expect("exists");
    assert_eq!((got.total, got.done, got.label.as_str()), (9, 4, "two"));
    assert_eq!(
        store
            .task_done(&p, "s1", "other", 1, 0)
            .await
            .expect_err("no chain")
            .kind,
        ErrorKind::NotFound
    );
}

/// Of many saves against one version, exactly one succeeds.
pub async fn concurrent_saves_exactly_one_wins(store: Subject) {
    let p = product("p");
    store
        .create(&p, &session("s1", "ask"), nothing(), at(1))
        .await
        .expect("create");
    let mut handles = Vec::new();
    for i in 0..8 {
        let store = store.clone();
        let p = p.clone();
        handles.push(tokio::spawn(async move {
            store
                .save(
                    &p,
                    &session("s1", &format!("s{i}")),
                    1,
                    append(&[el(Actor::User, Some("x"), i)]),
                    None,
                    at(i),
                )
                .await
        }));
    }
    let mut wins = 0;
    for h in handles {
        match h.await.expect("join") {
            Ok(_) => wins += 1,
            Err(e) => assert_eq!(e.kind, ErrorKind::Conflict),
        }
    }
    assert_eq!(wins, 1);
    assert_eq!(store.dialogue(&p, "s1").await.expect("dialogue").len(), 1);
}

/// Cases of [`FlowStore::save_and_enqueue`]: the subject is the store and
/// the task queue it enqueues on.
pub mod enqueue {
    use std::sync::Arc;
    use std::time::Duration;

    use parlance_core::flow::Running;
    use parlance_ports::{
        DagSpec, DagStart, DagState, ErrorKind, FlowStore, NodeSpec, ProgressUpdate, TaskQueue,
        WorkerId,
    };
    use serde_json::json;

    use super::{append, at, el, nothing, product, session};
    use parlance_core::flow::Actor;

    /// The subject of these cases.
    pub type Subject = (Arc<dyn FlowStore>, Arc<dyn TaskQueue>);

    const QUEUE: &str = "flow-contract";

    fn start(p: &parlance_core::ProductId) -> DagStart {
        let mut dag = DagSpec::new(p.clone())
            .node(NodeSpec::new("0", "test.flow", json!({"n": 0})))
            .node(NodeSpec::new("1", "test.flow", json!({"n": 1})))
            .edge("0", "1");
        dag.queue = QUEUE.to_owned();
        DagStart {
            progress: ProgressUpdate {
                chain_id: "think-1".into(),
                add_total: 2,
                add_done: 0,
                label: Some("think".into()),
            },
            dag,
        }
    }

    fn running() -> parlance_core::flow::FlowSession {
        let mut s = session("s1", "think");
        s.running = Some(Running {
            invocation_id: "think-1".into(),
            chain_id: "think-1".into(),
            state: "think".into(),
            dag_id: None,
        });
        s
    }

    /// The run, the session naming it, the dialogue and the progress are
    /// written together.
    pub async fn a_save_that_starts_a_dag_enqueues_it_with_the_session(subject: Subject) {
        let (store, queue) = subject;
        let p = product("p");
        store
            .create(&p, &session("s1", "ask"), nothing(), at(1))
            .await
            .expect("create");
        let (version, dag) = store
            .save_and_enqueue(
                &p,
                &running(),
                1,
                append(&[el(Actor::User, Some("q"), 2)]),
                &start(&p),
                at(2),
            )
            .await
            .expect("save and enqueue");
        assert_eq!(version, 2);
        let got = store.load(&p, "s1").await.expect("load");
        assert_eq!(got.session.running.and_then(|r| r.dag_id), Some(dag.0));
        assert_eq!(got.dialogue_len, 1);
        let progress = store
            .progress(&p, "s1", "think-1")
            .await
            .expect("progress")
            .expect("chain exists");
        assert_eq!((progress.done, progress.total), (0, 2));
        let status = queue.dag_status(dag).await.expect("status");
        assert_eq!((status.state, status.total), (DagState::Running, 2));
        let leases = queue
            .claim(
                &WorkerId(uuid::Uuid::nil()),
                QUEUE,
                10,
                Duration::from_secs(30),
            )
            .await
            .expect("claim");
        assert_eq!(leases.len(), 1, "the root node is runnable");
        assert_eq!(leases[0].payload, json!({"n": 0}));
    }

    /// A lost compare-and-swap leaves no run behind.
    pub async fn a_stale_save_enqueues_nothing(subject: Subject) {
        let (store, queue) = subject;
        let p = product("p");
        store
            .create(&p, &session("s1", "ask"), nothing(), at(1))
            .await
            .expect("create");
        let err = store
            .save_and_enqueue(&p, &running(), 5, nothing(), &start(&p), at(2))
            .await
            .expect_err("stale");
        assert_eq!(err.kind, ErrorKind::Conflict);
        let leases = queue
            .claim(
                &WorkerId(uuid::Uuid::nil()),
                QUEUE,
                10,
                Duration::from_secs(30),
            )
            .await
            .expect("claim");
        assert!(leases.is_empty(), "nothing was enqueued");
        let got = store.load(&p, "s1").await.expect("load");
        assert_eq!((got.version, got.session.running), (1, None));
        assert_eq!(
            store.progress(&p, "s1", "think-1").await.expect("progress"),
            None
        );
    }
}

/// Cases of the audit entries a write appends: the subject is the store and
/// the audit log it writes to.
pub mod audit {
    use std::sync::Arc;

    use parlance_core::flow::Actor;
    use parlance_ports::{AuditEntry, AuditLog, ErrorKind, FlowAppend, FlowStore};
    use serde_json::json;

    use super::{at, el, product, session};

    /// The subject of these cases.
    pub type Subject = (Arc<dyn FlowStore>, Arc<dyn AuditLog>);

    fn entry(from: Option<&str>, to: &str, cause: &str, t: i64) -> AuditEntry {
        AuditEntry {
            product_id: product("p"),
            entity_kind: "flow".to_owned(),
            entity_id: "s1".to_owned(),
            from: from.map(str::to_owned),
            to: to.to_owned(),
            cause: cause.to_owned(),
            at: at(t),
            payload: json!({"flow": "qa"}),
        }
    }

    fn audited(audit: &[AuditEntry]) -> FlowAppend<'_> {
        FlowAppend {
            dialogue: &[],
            audit,
        }
    }

    async fn trail(log: &dyn AuditLog) -> Vec<AuditEntry> {
        log.list(&product("p"), "flow", "s1", None, 100)
            .await
            .expect("list audit entries")
            .into_iter()
            .map(|r| r.entry)
            .collect()
    }

    /// Creation and each save append their entries, in order.
    pub async fn each_write_appends_its_audit_entries(subject: Subject) {
        let (store, log) = subject;
        let p = product("p");
        let created = [entry(None, "ask", "start_session", 1)];
        store
            .create(&p, &session("s1", "ask"), audited(&created), at(1))
            .await
            .expect("create");
        let asked = [entry(Some("ask"), "answer", "user_input", 2)];
        let turn = [el(Actor::User, Some("why?"), 2)];
        let append = FlowAppend {
            dialogue: &turn,
            audit: &asked,
        };
        store
            .save(&p, &session("s1", "answer"), 1, append, None, at(2))
            .await
            .expect("save");
        let answered = [entry(Some("answer"), "ask", "dag_completed", 3)];
        store
            .save(
                &p,
                &session("s1", "ask"),
                2,
                audited(&answered),
                None,
                at(3),
            )
            .await
            .expect("save");
        assert_eq!(
            trail(&*log).await,
            [created[0].clone(), asked[0].clone(), answered[0].clone()]
        );
    }

    /// A create or save that is refused appends nothing.
    pub async fn a_write_that_fails_appends_no_audit_entry(subject: Subject) {
        let (store, log) = subject;
        let p = product("p");
        let created = [entry(None, "ask", "start_session", 1)];
        store
            .create(&p, &session("s1", "ask"), audited(&created), at(1))
            .await
            .expect("create");
        let again = [entry(None, "ask", "start_session", 2)];
        let err = store
            .create(&p, &session("s1", "ask"), audited(&again), at(2))
            .await
            .expect_err("duplicate");
        assert_eq!(err.kind, ErrorKind::Conflict);
        let stale = [entry(Some("ask"), "answer", "user_input", 3)];
        let err = store
            .save(
                &p,
                &session("s1", "answer"),
                7,
                audited(&stale),
                None,
                at(3),
            )
            .await
            .expect_err("stale");
        assert_eq!(err.kind, ErrorKind::Conflict);
        assert_eq!(trail(&*log).await, created);
    }
}
