//! Tests of the turn executor on the in-memory adapters (and PostgreSQL for
//! the racing case when `DATABASE_URL` is set).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use parlance_core::Machine as _;
use parlance_core::ProductId;
use parlance_core::turn::seed::{
    Channel, Route, SupportDelta, SupportInput, SupportLoaded, SupportState,
};
use parlance_core::turn::{
    Checkpoint, CheckpointDelta, END, Graph, GraphError, MemoryEntry, MemoryId, MemoryRecord,
    OwnerId, RetrievalPath, SemanticEntry, ThreadId, ThreadKey, TurnCommand, TurnError, TurnKey,
};
use parlance_memory::{MemoryAuditLog, MemoryCheckpointStore, MemoryMemoryStore};
use parlance_ports::{
    Commit, Committed, MachineStore, ManualClock, MemoryStore, PortError, PortResult, Stored,
};
use serde_json::json;

use super::*;

type Store = Arc<dyn MachineStore<Checkpoint>>;

fn memory_store() -> Store {
    Arc::new(MemoryCheckpointStore::new(Arc::new(MemoryAuditLog::new())))
}

fn clock() -> Arc<dyn Clock> {
    Arc::new(ManualClock::new())
}

/// The echo graph's runner on `store`.
fn echo_runner(store: Store) -> TurnRunner<SupportState, ()> {
    echo::runner::<()>(store, clock())
}

/// The whole thread at `k`, if it exists.
async fn saved(store: &dyn MachineStore<Checkpoint>, k: &ThreadKey) -> Option<Checkpoint> {
    store
        .load(&TurnKey::whole(k.clone()))
        .await
        .unwrap()
        .map(|s| s.state)
}

/// The error and its sources, outermost first.
fn chain(e: &(dyn std::error::Error + 'static)) -> Vec<String> {
    std::iter::successors(Some(e), |e| e.source())
        .map(ToString::to_string)
        .collect()
}

fn key(thread: &str) -> ThreadKey {
    ThreadKey {
        product_id: ProductId::parse("p").unwrap(),
        owner: OwnerId::parse("u1").unwrap(),
        thread: ThreadId::parse(thread).unwrap(),
    }
}

fn input(message: &str) -> SupportInput {
    SupportInput {
        message: message.to_owned(),
        channel: Channel::Test,
        user_id: Some("u1".to_owned()),
        session_id: Some("t".to_owned()),
        installed_skills: vec![],
    }
}

fn contents(cp: &Checkpoint, field: &str) -> Vec<String> {
    cp.lists
        .get(field)
        .map(|l| {
            l.iter()
                .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_turn_runs_the_graph_times_its_stages_and_commits() {
    let cp = memory_store();
    let runner = echo_runner(cp.clone());
    let k = key("t");
    let r1 = runner
        .run(&(), &k, input("I slept badly"), SupportLoaded::default())
        .await
        .expect("turn 1");
    assert_eq!(r1.version, 1);
    assert_eq!(r1.attempts, 1);
    assert_eq!(
        r1.output.response_text,
        "Turn 1: I hear you saying \"I slept badly\"."
    );
    assert_eq!(r1.output.response_type, "reply");
    assert_eq!(r1.output.response_style_source, "model");
    let stages: Vec<_> = r1.timings.iter().map(|t| (t.step, t.stage)).collect();
    assert_eq!(stages, [(1, "gate"), (2, "reply"), (3, "finalize_turn")]);
    for k in ["gate_ms", "reply_ms", "finalize_turn_ms", "turn_total_ms"] {
        assert!(r1.output.diagnostics[k].is_f64(), "{k} missing");
    }
    assert_eq!(
        r1.output.diagnostics["crisis_classifier_path"],
        json!("keyword")
    );
    let r2 = runner
        .run(
            &(),
            &k,
            input("I want to hurt myself"),
            SupportLoaded::default(),
        )
        .await
        .expect("turn 2");
    assert_eq!(r2.version, 2);
    assert_eq!(r2.output.response_type, "crisis");
    assert!(
        !r2.output.diagnostics.contains_key("reply_ms"),
        "no stale timings"
    );
    let saved = saved(cp.as_ref(), &k).await.expect("stored");
    assert_eq!(
        contents(&saved, "transcript"),
        [
            "I slept badly",
            "Turn 1: I hear you saying \"I slept badly\".",
            "I want to hurt myself",
            "I'm worried about your safety. Please contact your local emergency services."
        ]
    );
    assert_eq!(saved.objects["session_progress"], json!({"turn_count": 2}));
    assert!(!saved.objects.contains_key("diagnostics"));
    assert!(!saved.objects.contains_key("route"));
}

#[tokio::test]
async fn turns_are_deterministic_given_their_inputs() {
    let mut runs = Vec::new();
    for _ in 0..2 {
        let cp = memory_store();
        let runner = echo_runner(cp.clone());
        let mut texts = Vec::new();
        for m in ["a", "b", "end it all", "c"] {
            let r = runner
                .run(&(), &key("t"), input(m), SupportLoaded::default())
                .await
                .unwrap();
            texts.push((
                r.output.response_text,
                r.output.response_type,
                r.bytes_written,
            ));
        }
        runs.push((texts, saved(cp.as_ref(), &key("t")).await));
    }
    assert_eq!(runs[0], runs[1]);
}

/// Lets another turn commit right before this one's first commit.
struct Intruder {
    inner: Store,
    armed: AtomicBool,
}

#[async_trait]
impl MachineStore<Checkpoint> for Intruder {
    async fn load(&self, key: &TurnKey) -> PortResult<Option<Stored<Checkpoint>>> {
        self.inner.load(key).await
    }

    async fn commit(&self, c: Commit<'_, Checkpoint>) -> PortResult<Committed<Checkpoint>> {
        if self.armed.swap(false, Ordering::SeqCst) {
            let mut other = CheckpointDelta::default();
            other.appends.insert(
                "transcript".to_owned(),
                vec![json!({"role": "user", "content": "intruder"})],
            );
            let base = c.expected.map_or(0, |v| v.0);
            let command = TurnCommand::commit(base, other);
            let mut state = Checkpoint {
                version: base,
                ..Checkpoint::default()
            };
            let decision = state.decide(&(), &command, c.now).expect("decide");
            self.inner
                .commit(Commit {
                    command: &command,
                    state: &state,
                    decision: &decision,
                    ..c
                })
                .await?;
        }
        self.inner.commit(c).await
    }
}

#[tokio::test]
async fn a_lost_commit_is_retried_on_the_new_state() {
    let cp = Arc::new(Intruder {
        inner: memory_store(),
        armed: AtomicBool::new(true),
    });
    let runner = echo_runner(cp.clone());
    let r = runner
        .run(&(), &key("t"), input("hello"), SupportLoaded::default())
        .await
        .expect("turn");
    assert_eq!(r.attempts, 2);
    assert_eq!(r.version, 2);
    assert_eq!(
        r.output.response_text,
        "Turn 2: I hear you saying \"hello\"."
    );
    let saved = saved(cp.as_ref(), &key("t")).await.expect("stored");
    assert_eq!(
        contents(&saved, "transcript"),
        ["intruder", "hello", "Turn 2: I hear you saying \"hello\"."]
    );
}

/// Loses every commit to a turn that is never seen.
struct AlwaysBehind {
    inner: Store,
}

#[async_trait]
impl MachineStore<Checkpoint> for AlwaysBehind {
    async fn load(&self, key: &TurnKey) -> PortResult<Option<Stored<Checkpoint>>> {
        self.inner.load(key).await
    }

    async fn commit(&self, _: Commit<'_, Checkpoint>) -> PortResult<Committed<Checkpoint>> {
        Err(PortError::conflict("another turn committed first"))
    }
}

#[tokio::test]
async fn a_turn_that_keeps_losing_its_commit_is_contended_and_commits_nothing() {
    let inner = memory_store();
    let store = Arc::new(AlwaysBehind {
        inner: inner.clone(),
    });
    let err = echo_runner(store)
        .run(&(), &key("t"), input("hello"), SupportLoaded::default())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            TurnRunError::Service(ServiceError::Contended { attempts: 16 })
        ),
        "{err}"
    );
    assert_eq!(saved(inner.as_ref(), &key("t")).await, None);
}

async fn racing_turns_all_land(cp: Store) {
    const RACERS: usize = 6;
    let runner = Arc::new(echo_runner(cp.clone()));
    let mut tasks = Vec::new();
    for r in 0..RACERS {
        let runner = Arc::clone(&runner);
        tasks.push(tokio::spawn(async move {
            runner
                .run(
                    &(),
                    &key("hot"),
                    input(&format!("racer {r}")),
                    SupportLoaded::default(),
                )
                .await
                .expect("turn")
                .version
        }));
    }
    let mut versions = Vec::new();
    for t in tasks {
        versions.push(t.await.unwrap());
    }
    versions.sort_unstable();
    assert_eq!(versions, (1..=RACERS as u64).collect::<Vec<_>>());
    let saved = saved(cp.as_ref(), &key("hot")).await.expect("stored");
    let history = contents(&saved, "transcript");
    assert_eq!(history.len(), RACERS * 2);
    for r in 0..RACERS {
        let msg = format!("racer {r}");
        let at = history.iter().position(|m| *m == msg).expect("landed");
        assert_eq!(history.iter().filter(|m| **m == msg).count(), 1);
        assert!(
            history[at + 1].ends_with(&format!("\"{msg}\".")),
            "{history:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_turns_all_land_in_memory() {
    racing_turns_all_land(memory_store()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_turns_all_land_on_postgres() {
    let Some(pool) = parlance_postgres::testing::test_pool().await else {
        return;
    };
    racing_turns_all_land(Arc::new(parlance_postgres::PgCheckpointStore::new(pool))).await;
}

struct Failing;

#[async_trait]
impl Stage<SupportState, ()> for Failing {
    async fn run(&self, _: &SupportState, _: &()) -> Result<SupportDelta, StageError> {
        Err(StageError::Port {
            dependency: Dependency::Model,
            source: PortError::unavailable("model unavailable"),
        })
    }
}

fn set_route(_: &SupportState) -> SupportDelta {
    SupportDelta {
        route: Some(Some(Route::Therapeutic)),
        ..SupportDelta::default()
    }
}

fn again(_: &SupportState) -> &'static str {
    "a"
}

#[tokio::test]
async fn failures_stop_the_turn_and_commit_nothing() {
    let cp = memory_store();
    let k = key("t");

    let failing = TurnRunner::<SupportState, ()>::new(echo::graph(), cp.clone(), clock())
        .stage("gate", PureStage(echo::gate))
        .stage("reply", Failing)
        .stage("crisis_reply", PureStage(echo::crisis_reply))
        .stage("finalize_turn", PureStage(echo::finalize_turn));
    let err = failing
        .run(&(), &k, input("x"), SupportLoaded::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, TurnRunError::Stage { stage: "reply", .. }),
        "{err}"
    );
    assert_eq!(
        chain(&err),
        [
            "stage reply failed",
            "the model failed",
            "unavailable: model unavailable"
        ]
    );

    let missing = TurnRunner::<SupportState, ()>::new(echo::graph(), cp.clone(), clock())
        .stage("gate", PureStage(echo::gate));
    let err = missing
        .run(&(), &k, input("x"), SupportLoaded::default())
        .await
        .unwrap_err();
    assert!(matches!(err, TurnRunError::MissingStage("reply")), "{err}");

    let looping = Graph::<SupportState>::builder("loop")
        .stage("a")
        .route("a", again, &["a", END])
        .step_limit(3)
        .build()
        .unwrap();
    let runner = TurnRunner::<SupportState, ()>::new(looping, cp.clone(), clock())
        .stage("a", PureStage(|_: &SupportState| SupportDelta::default()));
    let err = runner
        .run(&(), &k, input("x"), SupportLoaded::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, TurnRunError::Graph(GraphError::StepLimit { limit: 3 })),
        "{err}"
    );

    let fan = Graph::<SupportState>::builder("fan")
        .stage("start")
        .stage("left")
        .stage("right")
        .fanout("start", &["left", "right"], END)
        .build()
        .unwrap();
    let runner = TurnRunner::<SupportState, ()>::new(fan, cp.clone(), clock())
        .stage(
            "start",
            PureStage(|_: &SupportState| SupportDelta::default()),
        )
        .stage("left", PureStage(set_route))
        .stage("right", PureStage(set_route));
    let err = runner
        .run(&(), &k, input("x"), SupportLoaded::default())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            TurnRunError::Turn(TurnError::ConflictingWrites {
                field: "route",
                first: "left",
                second: "right"
            })
        ),
        "{err}"
    );
    assert_eq!(
        saved(cp.as_ref(), &k).await,
        None,
        "no failed turn committed"
    );
}

struct FixedEmbedder(Result<Vec<f32>, ()>);

#[async_trait]
impl QueryEmbedder for FixedEmbedder {
    async fn embed_query(&self, _: &str) -> Result<Vec<f32>, PortError> {
        self.0
            .clone()
            .map_err(|()| PortError::unavailable("embedding endpoint down"))
    }
}

#[tokio::test]
async fn hybrid_retrieval_reports_its_path() {
    let store = MemoryMemoryStore::new();
    let p = ProductId::parse("p").unwrap();
    let u = OwnerId::parse("u1").unwrap();
    for (n, obj, emb) in [(1u128, "work", [1.0, 0.0]), (2, "sleep", [0.0, 1.0])] {
        store
            .add(
                &p,
                &MemoryRecord {
                    id: MemoryId::from_uuid(uuid_from(n)),
                    owner: u.clone(),
                    entry: MemoryEntry::Semantic(SemanticEntry {
                        category: "concern".to_owned(),
                        subject: "User".to_owned(),
                        predicate: "WORRIES_ABOUT".to_owned(),
                        object: obj.to_owned(),
                        evidence_quote: None,
                    }),
                    embedding: Some(emb.to_vec()),
                    at: parlance_core::Timestamp::from_secs(n as i64).unwrap(),
                },
            )
            .await
            .unwrap();
    }
    let none = retrieve_hybrid(&store, None, &p, &u, "work", 2)
        .await
        .unwrap();
    assert_eq!(none.retrieved.path, RetrievalPath::TokenRecall);
    assert_eq!(none.retrieved.hits.len(), 1);
    let failing = FixedEmbedder(Err(()));
    let failed = retrieve_hybrid(&store, Some(&failing), &p, &u, "work", 2)
        .await
        .unwrap();
    assert_eq!(
        failed.retrieved.path,
        RetrievalPath::TokenRecallAfterEmbedError
    );
    let good = FixedEmbedder(Ok(vec![0.0, 1.0]));
    let hybrid = retrieve_hybrid(&store, Some(&good), &p, &u, "work", 2)
        .await
        .unwrap();
    assert_eq!(hybrid.retrieved.path, RetrievalPath::HybridRrf);
    assert_eq!(hybrid.retrieved.hits.len(), 2);
}

fn uuid_from(n: u128) -> uuid::Uuid {
    uuid::Uuid::from_u128(n)
}

/// Asks once, then answers with the value it is resumed with; counts its
/// runs and notes the questions it was resumed on.
struct Asks {
    runs: Arc<std::sync::atomic::AtomicUsize>,
    answered: Arc<std::sync::Mutex<Vec<String>>>,
}

#[async_trait]
impl Stage<SupportState, ()> for Asks {
    async fn run(&self, _: &SupportState, _: &()) -> Result<SupportDelta, StageError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Err(StageError::Interrupt {
            payload: json!({"question": "sure?"}),
        })
    }

    async fn resume(
        &self,
        s: &SupportState,
        _: &(),
        asked: &serde_json::Value,
        value: &serde_json::Value,
    ) -> Result<SupportDelta, StageError> {
        self.answered
            .lock()
            .unwrap()
            .push(asked["question"].as_str().unwrap_or_default().to_owned());
        if value == "again" {
            return Err(StageError::Interrupt {
                payload: json!({"question": "really sure?"}),
            });
        }
        Ok(SupportDelta {
            response_text: Some(format!("{}: {value}", s.message)),
            ..SupportDelta::default()
        })
    }
}

fn styled(_: &SupportState) -> SupportDelta {
    SupportDelta {
        response_style: Some(Some("styled".to_owned())),
        ..SupportDelta::default()
    }
}

/// `gate -> [style, ask] -> finalize_turn`: the fan-out's `ask` stops the
/// turn.
fn asking_runner(
    store: Store,
    runs: Arc<std::sync::atomic::AtomicUsize>,
    answered: &Arc<std::sync::Mutex<Vec<String>>>,
) -> TurnRunner<SupportState, ()> {
    let graph = Graph::builder("asking")
        .stage("gate")
        .stage("style")
        .stage("ask")
        .stage("finalize_turn")
        .fanout("gate", &["style", "ask"], "finalize_turn")
        .edge("finalize_turn", END)
        .build()
        .unwrap();
    TurnRunner::new(graph, store, clock())
        .stage("gate", PureStage(echo::gate))
        .stage("style", PureStage(styled))
        .stage(
            "ask",
            Asks {
                runs,
                answered: answered.clone(),
            },
        )
        .stage("finalize_turn", PureStage(echo::finalize_turn))
}

#[tokio::test]
async fn an_interrupt_commits_the_steps_before_it_and_a_resume_runs_its_step_again() {
    let store = memory_store();
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let answered = Arc::default();
    let runner = asking_runner(store.clone(), runs.clone(), &answered);
    let r = runner
        .run(&(), &key("t"), input("delete it"), SupportLoaded::default())
        .await
        .unwrap();
    assert_eq!(r.interrupt, Some(json!({"question": "sure?"})));
    assert_eq!(r.version, 1);
    let cp = saved(store.as_ref(), &key("t")).await.unwrap();
    let pending = cp.pending_interrupt().expect("pending");
    assert_eq!(
        (
            pending.stage.as_str(),
            pending.step,
            pending.join.as_deref()
        ),
        ("ask", 2, Some("finalize_turn"))
    );
    assert_eq!(pending.stages, ["style", "ask"]);
    assert_eq!(pending.suspended["message"], "delete it");
    assert_eq!(
        pending.suspended["route"], "therapeutic",
        "the gate's step applied"
    );
    assert_eq!(
        pending.suspended["response_style"],
        serde_json::Value::Null,
        "the stopped step's deltas dropped"
    );
    assert_eq!(contents(&cp, "transcript"), ["delete it"]);

    // A new turn is refused before any stage runs.
    let e = runner
        .run(&(), &key("t"), input("hello"), SupportLoaded::default())
        .await
        .unwrap_err();
    assert!(
        chain(&e)[0].contains("interrupt_pending"),
        "{:?}",
        chain(&e)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // Asked again on resume: still pending, with the new question.
    let r = runner.resume(&(), &key("t"), json!("again")).await.unwrap();
    assert_eq!(r.interrupt, Some(json!({"question": "really sure?"})));
    let cp = saved(store.as_ref(), &key("t")).await.unwrap();
    assert_eq!(cp.version, 2);
    assert_eq!(
        cp.pending_interrupt().unwrap().payload["question"],
        "really sure?"
    );

    let r = runner.resume(&(), &key("t"), json!("yes")).await.unwrap();
    assert_eq!(r.interrupt, None);
    assert_eq!(r.output.response_text, "delete it: \"yes\"");
    assert_eq!(
        r.output.response_style.as_deref(),
        Some("styled"),
        "the step's other stage ran again"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "resumed, never run anew");
    assert_eq!(
        *answered.lock().unwrap(),
        ["sure?", "really sure?"],
        "each resume answers the question last asked"
    );
    let cp = saved(store.as_ref(), &key("t")).await.unwrap();
    assert_eq!(cp.version, 3);
    assert!(!cp.is_interrupted());
    assert_eq!(
        contents(&cp, "transcript"),
        ["delete it", "delete it: \"yes\""]
    );

    // Nothing waits now; a thread with no turn is not found.
    let e = runner
        .resume(&(), &key("t"), json!("yes"))
        .await
        .unwrap_err();
    assert!(chain(&e)[0].contains("no_interrupt"), "{:?}", chain(&e));
    let e = runner
        .resume(&(), &key("none"), json!("yes"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            TurnRunError::Service(crate::execute::ServiceError::NotFound)
        ),
        "{e:?}"
    );
}

#[tokio::test]
async fn a_stored_step_the_graph_no_longer_has_is_an_error() {
    let store = memory_store();
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    asking_runner(store.clone(), runs, &Arc::default())
        .run(&(), &key("t"), input("x"), SupportLoaded::default())
        .await
        .unwrap();
    let e = echo_runner(store)
        .resume(&(), &key("t"), json!("yes"))
        .await
        .unwrap_err();
    assert!(
        matches!(e, TurnRunError::Graph(GraphError::NotInGraph { .. })),
        "{e:?}"
    );
}

#[tokio::test]
async fn events_follow_the_graph_and_a_retried_attempt_is_numbered() {
    let cp = Arc::new(Intruder {
        inner: memory_store(),
        armed: AtomicBool::new(true),
    });
    let (events, mut rx) = TurnEvents::channel();
    let r = echo_runner(cp)
        .run_reporting(
            &(),
            &key("t"),
            input("hello"),
            SupportLoaded::default(),
            Some(&events),
        )
        .await
        .unwrap();
    drop(events);
    let mut seen = Vec::new();
    while let Some(e) = rx.recv().await {
        seen.push(e);
    }
    let stages: Vec<(u32, &str, &str)> = seen
        .iter()
        .filter_map(|e| match e {
            TurnEvent::StageStarted { attempt, stage, .. } => Some((*attempt, "started", *stage)),
            TurnEvent::StageFinished { attempt, stage, .. } => Some((*attempt, "finished", *stage)),
            _ => None,
        })
        .collect();
    let mut expected = Vec::new();
    for attempt in [1, 2] {
        for stage in ["gate", "reply", "finalize_turn"] {
            expected.push((attempt, "started", stage));
            expected.push((attempt, "finished", stage));
        }
    }
    assert_eq!(stages, expected);
    match seen.last() {
        Some(TurnEvent::Output { output }) => {
            assert_eq!(output["response_text"], json!(r.output.response_text));
        }
        other => panic!("the last event is {other:?}"),
    }
    assert_eq!(
        seen.iter()
            .filter(|e| matches!(e, TurnEvent::Output { .. }))
            .count(),
        1,
        "one output, the committed attempt's"
    );
}
