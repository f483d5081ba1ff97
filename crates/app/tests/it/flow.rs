//! Flows over HTTP: the reference's routes and shapes, the example flows
//! driven to completion by polling, and each reference defect fixed.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use parlance_app::Components;
use parlance_app::flow::{
    FlowCatalog, FlowDeps, FlowService, Invoker, Invokers, QueueRunner, example_catalog,
};
use parlance_app::worker::{EmbeddedWorker, Worker, WorkerConfig};
use parlance_core::flow::{
    ClientEvent, Condition, Flow, FlowBuilder, FlowKey, FlowRecord, HookContext, HookPoint,
    HookScope, RunnerOptions, TemplateRef, TransitionDef,
};
use parlance_core::queue::Backoff;
use parlance_memory::{MemoryAuditLog, MemoryFlowStore};
use parlance_ports::{
    AuditLog, Clock, Commit, Committed, MachineStore, PortError, PortResult, QueueConfig, Stored,
    SystemClock, TaskQueue, WorkerId,
};
use parlance_postgres::testing::test_pool;
use parlance_testkit::{ManualClock, SequentialIds};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::documented::assert_documented;
use crate::support::{KEY, TestServer, keys};

/// Echoes the rendered text once a permit is released.
struct Gated(Arc<Semaphore>);

#[async_trait]
impl Invoker for Gated {
    async fn invoke(&self, rendered: &str) -> Result<String, String> {
        self.0.acquire().await.map_err(|e| e.to_string())?.forget();
        Ok(rendered.to_owned())
    }
}

/// Always fails.
struct Failing(Arc<AtomicUsize>);

#[async_trait]
impl Invoker for Failing {
    async fn invoke(&self, _rendered: &str) -> Result<String, String> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Err("the model is down".into())
    }
}

/// Counts calls and answers a fixed text.
struct Counting(Arc<AtomicUsize>, &'static str);

#[async_trait]
impl Invoker for Counting {
    async fn invoke(&self, _rendered: &str) -> Result<String, String> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(self.1.to_owned())
    }
}

fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/flows")
}

/// Small flows built in Rust for the defect tests.
fn rust_flows() -> Vec<Flow> {
    let mut only_yes = TransitionDef::new("advance", "think", "answer");
    only_yes.cond = vec![Condition::Expr("actor_input == 'yes'".into())];
    vec![
        // user -> invoker (gated) -> user
        FlowBuilder::new("gated")
            .template("ask.j2", "Ask.")
            .template("think.j2", "thinking about {{ actor_input }}")
            .template("answer.j2", "Answer: {{ actor_input }}")
            .user_state("ask", "ask.j2")
            .invoker_state("think", TemplateRef::Name("think.j2".into()), "gated")
            .user_state("answer", "answer.j2")
            .on("user_input", "ask", "think")
            .on("advance", "think", "answer")
            .on("again", "answer", "ask")
            .build()
            .unwrap(),
        // an invoker that always fails
        FlowBuilder::new("failing")
            .template("ask.j2", "Ask.")
            .template("think.j2", "{{ actor_input }}")
            .template("answer.j2", "Answer: {{ actor_input }}")
            .user_state("ask", "ask.j2")
            .invoker_state("think", TemplateRef::Name("think.j2".into()), "failing")
            .user_state("answer", "answer.j2")
            .on("user_input", "ask", "think")
            .on("advance", "think", "answer")
            .build()
            .unwrap(),
        // an invoker whose result no transition accepts
        FlowBuilder::new("picky")
            .template("ask.j2", "Ask.")
            .template("think.j2", "{{ actor_input }}")
            .template("answer.j2", "Answer: {{ actor_input }}")
            .user_state("ask", "ask.j2")
            .invoker_state("think", TemplateRef::Name("think.j2".into()), "counting")
            .user_state("answer", "answer.j2")
            .on("user_input", "ask", "think")
            .transition(only_yes)
            .build()
            .unwrap(),
    ]
}

/// A flow whose templates and expressions fail, or build too much, on
/// some inputs: each event from `ask` leads to a state whose template, or
/// through a transition whose `cond` or `assign`, does one such thing.
fn fragile_flow() -> Flow {
    let mut cond = TransitionDef::new("cond_int", "ask", "plain");
    cond.cond = vec![Condition::Expr("(actor_input | int) > 0".into())];
    let mut unknown = TransitionDef::new("assign_unknown", "ask", "plain");
    unknown.assign = vec![("n".into(), "no_such_function(actor_input)".into())];
    let mut assign_big = TransitionDef::new("assign_big", "ask", "plain");
    assign_big.assign = vec![("n".into(), "'x' * 100000000".into())];
    // A test named by the input: looked up, and found unknown, when it runs.
    let mut cond_select = TransitionDef::new("cond_select", "ask", "plain");
    cond_select.cond = vec![Condition::Expr("[1] | select(actor_input) | list".into())];
    FlowBuilder::new("fragile")
        .template("ask.j2", "Ask.")
        .template("plain.j2", "ok")
        .template("int.j2", "{{ actor_input | int + 1 }}")
        .template("huge.j2", "{{ 'x' * 10**9 }}")
        .template("big.j2", "{{ ('x' * 100000000) | length }}")
        .template("div.j2", "{{ 10 // (actor_input | length) }}")
        .template("map.j2", "{{ [1] | map(actor_input) | list }}")
        .template("include.j2", "{% include actor_input %}")
        .field("n", json!(0))
        .field("alpha", json!({"b": 1, "a": 2}))
        .user_state("ask", "ask.j2")
        .user_state("plain", "plain.j2")
        .user_state("int", "int.j2")
        .user_state("huge", "huge.j2")
        .user_state("big", "big.j2")
        .user_state("div", "div.j2")
        .user_state("map", "map.j2")
        .user_state("include", "include.j2")
        .state_value("ask", json!(1))
        .on("to_int", "ask", "int")
        .on("to_huge", "ask", "huge")
        .on("to_big", "ask", "big")
        .on("to_div", "ask", "div")
        .on("to_map", "ask", "map")
        .on("to_include", "ask", "include")
        .transition(cond)
        .transition(cond_select)
        .transition(unknown)
        .transition(assign_big)
        .build()
        .unwrap()
}

/// `greet` (user, initial) --say--> `said` (user). The initial state's
/// enter hook copies the seed's `topic` into the model; the greeting shows
/// the user's computed name and the parsed seed, `said` what is left of
/// both once started.
fn seeded_flow() -> Flow {
    FlowBuilder::new("seeded")
        .template(
            "greet.j2",
            "Hello {{ user_info.name if user_info else 'stranger' }}\
             {% if parsed_seed_data %}, about {{ parsed_seed_data.topic }}{% endif %}.",
        )
        .template(
            "said.j2",
            "{{ user_info.firstname if user_info else 'stranger' }} said {{ actor_input }}; \
             topic {{ topic }}; seed {{ seed_data }}.",
        )
        .field("topic", Value::Null)
        .user_state("greet", "greet.j2")
        .user_state("said", "said.j2")
        .on("say", "greet", "said")
        .hook(
            HookPoint::Enter,
            HookScope::State("greet".into()),
            |h: &mut HookContext<'_>| {
                let topic = h
                    .session
                    .seed_data
                    .as_deref()
                    .and_then(|s| serde_json::from_str::<Value>(s).ok())
                    .and_then(|v| v.get("topic").cloned());
                if let Some(t) = topic {
                    h.session.model.insert("topic".into(), t);
                }
                Ok(())
            },
        )
        .build()
        .unwrap()
}

struct Fixture {
    server: TestServer,
    gate: Arc<Semaphore>,
    failures: Arc<AtomicUsize>,
    calls: Arc<AtomicUsize>,
    /// The queue the flows' task graphs run on.
    queue: Arc<dyn TaskQueue>,
    /// The audit log the flow store writes to.
    audit: Arc<dyn AuditLog>,
    /// The flow service behind the server.
    flows: parlance_app::flow::Flows,
    /// Runs the flows' task graphs off the queue.
    _worker: EmbeddedWorker,
}

async fn fixture(pool: Option<parlance_postgres::PgPool>) -> Fixture {
    fixture_with(
        pool,
        RunnerOptions {
            attempts: 2,
            task_timeout: Duration::from_secs(10),
        },
        Duration::from_millis(5),
    )
    .await
}

/// The queue's own clock and back-off: retries are due after `backoff` of
/// real time (the sessions keep the manual clock).
fn queue_config(backoff: Duration) -> QueueConfig {
    QueueConfig {
        backoff: Backoff {
            base: backoff,
            cap: backoff * 8,
        },
        ..QueueConfig::default()
    }
}

async fn fixture_with(
    pool: Option<parlance_postgres::PgPool>,
    options: RunnerOptions,
    backoff: Duration,
) -> Fixture {
    fixture_polling(pool, options, backoff, Duration::ZERO).await
}

/// A fixture whose polls of a running session wait up to `poll_wait` for
/// the run to end.
async fn fixture_polling(
    pool: Option<parlance_postgres::PgPool>,
    options: RunnerOptions,
    backoff: Duration,
    poll_wait: Duration,
) -> Fixture {
    let system: Arc<dyn Clock> = Arc::new(SystemClock);
    let clock = Arc::new(ManualClock::new());
    let mut c = match pool {
        Some(pool) => Components::postgres(pool, keys()),
        None => Components::memory(keys()),
    };
    c.clock = clock.clone();
    c.ids = Arc::new(SequentialIds::new());
    // Retries back off in real time while the test moves the service clock.
    c.queue_clock = Some(system.clone());
    c.queue = queue_config(backoff);
    c.runner = options;
    let gate = Arc::new(Semaphore::new(0));
    let failures = Arc::new(AtomicUsize::new(0));
    let calls = Arc::new(AtomicUsize::new(0));
    let mut extra: BTreeMap<String, Arc<dyn Invoker>> = BTreeMap::new();
    extra.insert("gated".into(), Arc::new(Gated(gate.clone())));
    extra.insert("failing".into(), Arc::new(Failing(failures.clone())));
    extra.insert("counting".into(), Arc::new(Counting(calls.clone(), "no")));
    // The examples' `template` invoker, gated so each poll sees a known step.
    extra.insert("template".into(), Arc::new(Gated(gate.clone())));
    let known = |n: &str| Invokers::is_builtin(n) || extra.contains_key(n);
    let mut catalog = FlowCatalog::load_dir(&examples_dir(), &known).unwrap();
    for f in rust_flows()
        .into_iter()
        .chain([fragile_flow(), seeded_flow()])
    {
        catalog.insert(f);
    }
    c.flows = catalog;
    c.invokers = extra;
    let state = c.build();
    state.flows.set_poll_wait(poll_wait);
    let worker = EmbeddedWorker::spawn(Worker::new(
        WorkerId(uuid::Uuid::from_u128(1)),
        state.shared.queue.clone(),
        state.handlers(),
        system,
        WorkerConfig {
            poll_every: Duration::from_millis(5),
            ..WorkerConfig::default()
        },
    ));
    let queue = state.shared.queue.clone();
    let audit = state.shared.audit.clone();
    let flows = state.flows.clone();
    Fixture {
        server: TestServer::start(state, clock).await,
        gate,
        failures,
        calls,
        queue,
        audit,
        flows,
        _worker: worker,
    }
}

impl Fixture {
    async fn start(&self, flow: &str) -> Value {
        let (status, _, body) = self
            .server
            .send(
                Method::POST,
                &format!("/v1/ai/{flow}/start_session"),
                None,
                true,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    }

    async fn event(
        &self,
        flow: &str,
        session: &str,
        event: &str,
        input: &str,
    ) -> (StatusCode, Value) {
        let (status, _, body) = self
            .server
            .send(
                Method::POST,
                &format!("/v1/ai/{flow}/event"),
                Some(&json!({"session_id": session, "event": event, "event_input": input})),
                true,
            )
            .await;
        (status, body)
    }

    async fn poll(&self, flow: &str, session: &str) -> Value {
        let (status, body) = self.event(flow, session, "poll", "").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    }

    /// Polls until `done` holds, returning that poll's answer.
    async fn poll_until(&self, flow: &str, session: &str, done: impl Fn(&Value) -> bool) -> Value {
        for _ in 0..1000 {
            let body = self.poll(flow, session).await;
            if done(&body) {
                return body;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("poll never reached the expected answer");
    }

    async fn model(&self, flow: &str, session: &str) -> Value {
        let (status, _, body) = self
            .server
            .send(
                Method::GET,
                &format!("/v1/ai/{flow}/model/{session}"),
                None,
                true,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        serde_json::from_str(body["response"].as_str().unwrap()).unwrap()
    }
}

fn progress(body: &Value) -> (i64, i64, String) {
    let p = &body["progress"];
    (
        p["number_of_subtasks_executed"].as_i64().unwrap_or(-1),
        p["total_number_of_subtasks"].as_i64().unwrap_or(-1),
        p["label"].as_str().unwrap_or("").to_owned(),
    )
}

async fn drive_extraction(f: &Fixture) {
    let start = f.start("extraction").await;
    let sid = start["session_id"].as_str().unwrap().to_owned();
    assert_eq!(start["next_actions"], json!(["user_input"]));
    let (status, body) = f
        .event(
            "extraction",
            &sid,
            "user_input",
            "name: Ada Lovelace; email: ada@example.com; topics: engines, poetry",
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["next_actions"], json!(["poll"]));
    assert_eq!(body["response"], Value::Null);
    // Progress exists as the event returns: no gap before the first poll.
    let label = "extracting contact details";
    assert_eq!(progress(&body), (0, 6, label.into()));
    assert_eq!(
        progress(&f.poll("extraction", &sid).await),
        (0, 6, label.into())
    );
    // One permit per invoker call; glue, combine and completion run alone.
    let steps = [
        (2, 6, label),
        (3, 6, label),
        (6, 10, "summarising topics"),
        (7, 10, "summarising topics"),
    ];
    for (done, total, label) in steps {
        f.gate.add_permits(1);
        let body = f
            .poll_until("extraction", &sid, |b| {
                progress(b) == (done, total, label.to_owned())
            })
            .await;
        assert_eq!(body["next_actions"], json!(["poll"]));
        let model = f.model("extraction", &sid).await;
        if done >= 6 {
            assert_eq!(model["state"], "summarize");
            assert_eq!(model["model"]["email"], "ada@example.com");
            assert_eq!(model["model"]["topics"], json!(["engines", "poetry"]));
        } else {
            assert_eq!(model["state"], "extract");
            assert_eq!(model["model"]["email"], Value::Null);
        }
        // Invoker->invoker records nothing: greeting and the user's input.
        assert_eq!(model["dialogue"].as_array().unwrap().len(), 2);
    }
    f.gate.add_permits(1);
    let done = f
        .poll_until("extraction", &sid, |b| b["next_actions"] != json!(["poll"]))
        .await;
    assert_eq!(done["next_actions"], json!(["accept", "restart"]));
    assert_eq!(done["progress"], Value::Null);
    assert_eq!(done["error"], Value::Null);
    assert_eq!(
        done["response"],
        "Thanks Ada Lovelace. We will write to ada@example.com about: engines, poetry.\n\
         Send `accept` to finish or `restart` to start over."
    );
    let model = f.model("extraction", &sid).await;
    assert_eq!(model["state"], "confirm");
    assert_eq!(model["model"]["complete"], true);
    assert_eq!(
        model["model"]["summary"][1],
        json!({"index": 1, "topic": "poetry", "note": "Notes on poetry for Ada Lovelace"})
    );
    insta::assert_json_snapshot!("extraction_model", model, {
        ".session_id" => "[id]",
        ".dialogue[].timestamp" => "[time]",
    });
    let (status, fin) = f.event("extraction", &sid, "accept", "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(fin["response"], "All set, Ada Lovelace.");
    assert_eq!(fin["next_actions"], json!([]));
}

#[tokio::test]
async fn extraction_flow_runs_to_completion_with_cumulative_progress_on_memory() {
    drive_extraction(&fixture(None).await).await;
}

#[tokio::test]
async fn extraction_flow_runs_to_completion_with_cumulative_progress_on_postgres() {
    let Some(pool) = test_pool().await else {
        return;
    };
    drive_extraction(&fixture(Some(pool)).await).await;
}

#[tokio::test]
async fn condition_routes_on_the_dag_result() {
    let f = fixture(None).await;
    let sid = f.start("extraction").await["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    f.event("extraction", &sid, "user_input", "name: Bob; topics: x")
        .await;
    f.gate.add_permits(3);
    let body = f
        .poll_until("extraction", &sid, |b| b["next_actions"] != json!(["poll"]))
        .await;
    assert_eq!(body["next_actions"], json!(["user_input"]));
    assert!(
        body["response"]
            .as_str()
            .unwrap()
            .starts_with("I could not find an email")
    );
    assert_eq!(f.model("extraction", &sid).await["state"], "missing");
}

#[tokio::test]
async fn keeps_reference_paths_and_response_shapes() {
    let f = fixture(None).await;
    let (status, _, start) = f
        .server
        .send(Method::GET, "/v1/ai/qa/start_session", None, true)
        .await;
    assert_eq!(status, StatusCode::OK);
    insta::assert_json_snapshot!("qa_start", start, {".session_id" => "[id]"});
    let sid = start["session_id"].as_str().unwrap().to_owned();
    let (status, asked) = f.event("qa", &sid, "user_input", "What is Rust?").await;
    assert_eq!(status, StatusCode::OK);
    insta::assert_json_snapshot!("qa_asked", asked, {".session_id" => "[id]"});
    let answered = f
        .poll_until("qa", &sid, |b| b["next_actions"] != json!(["poll"]))
        .await;
    assert_eq!(answered["next_actions"], json!(["user_input", "done"]));
    let text = answered["response"].as_str().unwrap();
    assert!(
        text.ends_with("Anything else? Ask another question, or send `done`."),
        "{text}"
    );
    let (status, _, ts) = f
        .server
        .send(
            Method::GET,
            &format!("/v1/ai/qa/task_state/{sid}"),
            None,
            true,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        ts,
        json!({"session_id": sid, "ready": true, "next_actions": ["user_input", "done"]})
    );
    let model = f.model("qa", &sid).await;
    assert_eq!(model["model"]["question"], "What is Rust?");
    assert_eq!(model["model"]["answers"], 1);
    let (_, bye) = f.event("qa", &sid, "done", "").await;
    assert_eq!(bye["response"], "Thank you. 1 answer given.");
    let (status, _, list) = f
        .server
        .send(Method::GET, "/v1/products/acme/flows", None, true)
        .await;
    assert_eq!(status, StatusCode::OK);
    let names: Vec<&str> = list["flows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "extraction",
            "failing",
            "fragile",
            "gated",
            "picky",
            "qa",
            "seeded",
            "triage"
        ]
    );
    let (status, _, _) = f
        .server
        .send(Method::GET, "/v1/products/other/flows", None, true)
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "another product's flows do not exist"
    );
}

/// Every answer of the flow routes is the one the API document describes,
/// and `start_session`'s body is documented as optional and an object.
#[tokio::test]
async fn every_answer_is_the_one_the_document_describes() {
    let f = fixture(None).await;
    let (status, _, doc) = f
        .server
        .send(Method::GET, "/openapi.json", None, false)
        .await;
    assert_eq!(status, StatusCode::OK);
    let check = |method: &str, path: &str, body: &Value| {
        let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
        assert_documented(&method, path, StatusCode::OK, body);
    };
    let start = "/v1/ai/{flow}/start_session";
    let (_, _, started) = f
        .server
        .send(Method::GET, "/v1/ai/qa/start_session", None, true)
        .await;
    check("get", start, &started);
    let (status, _, started) = f
        .server
        .send(
            Method::POST,
            "/v1/ai/qa/start_session",
            Some(&json!({"user_info": user("ada@example.com"), "seed_data": "x"})),
            true,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{started}");
    check("post", start, &started);
    let (status, _, refused) = f
        .server
        .send(
            Method::POST,
            "/v1/ai/qa/start_session",
            Some(&json!({"user_info": {"name": "Ada"}})),
            true,
        )
        .await;
    assert_eq!(
        status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "a user_info that is not a user: {refused}"
    );
    let sid = started["session_id"].as_str().unwrap().to_owned();
    let (_, asked) = f.event("qa", &sid, "user_input", "What is Rust?").await;
    assert!(asked["progress"].is_object(), "{asked}");
    check("post", "/v1/ai/{flow}/event", &asked);
    let answered = f
        .poll_until("qa", &sid, |b| b["next_actions"] != json!(["poll"]))
        .await;
    check("post", "/v1/ai/{flow}/event", &answered);
    let (_, _, ts) = f
        .server
        .send(
            Method::GET,
            &format!("/v1/ai/qa/task_state/{sid}"),
            None,
            true,
        )
        .await;
    check("get", "/v1/ai/{flow}/task_state/{session_id}", &ts);
    let (_, _, model) = f
        .server
        .send(Method::GET, &format!("/v1/ai/qa/model/{sid}"), None, true)
        .await;
    check("get", "/v1/ai/{flow}/model/{session_id}", &model);
    let (_, _, list) = f
        .server
        .send(Method::GET, "/v1/products/acme/flows", None, true)
        .await;
    check("get", "/v1/products/{product_id}/flows", &list);

    let body = &doc["paths"][start]["post"]["requestBody"];
    assert_ne!(body["required"], true, "the body is optional");
    assert_eq!(
        body["content"]["application/json"]["schema"]["$ref"], "#/components/schemas/FlowStart",
        "an object, not null"
    );
    let (status, _, refused) = f
        .server
        .send(
            Method::POST,
            "/v1/ai/qa/start_session",
            Some(&Value::Null),
            true,
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
}

#[tokio::test]
async fn missing_event_fields_are_422_and_unknown_sessions_404() {
    let f = fixture(None).await;
    let (status, _, _) = f
        .server
        .send(
            Method::POST,
            "/v1/ai/qa/event",
            Some(&json!({"session_id": "x", "event": "poll"})),
            true,
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, body) = f.event("qa", "nope", "poll", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, _) = f.event("nope", "nope", "poll", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, _) = f
        .server
        .send(Method::GET, "/v1/ai/qa/start_session", None, false)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn defect_1_a_refused_event_is_409_not_200_with_the_old_response() {
    let f = fixture(None).await;
    let sid = f.start("qa").await["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, body) = f.event("qa", &sid, "done", "").await;
    assert_eq!(status, StatusCode::CONFLICT);
    insta::assert_json_snapshot!("transition_not_allowed", body);
    let (status, body) = f.event("qa", &sid, "user_input", "   ").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["validator"], "non_empty_input");
    let model = f.model("qa", &sid).await;
    assert_eq!(model["state"], "ask");
    assert_eq!(
        model["dialogue"].as_array().unwrap().len(),
        1,
        "nothing recorded"
    );
}

#[tokio::test]
async fn defect_2_a_result_no_transition_accepts_never_reruns_the_dag() {
    let f = fixture(None).await;
    let sid = f.start("picky").await["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    f.event("picky", &sid, "user_input", "q").await;
    let body = f
        .poll_until("picky", &sid, |b| b["next_actions"] != json!(["poll"]))
        .await;
    assert_eq!(body["next_actions"], json!(["retry"]));
    assert_eq!(body["errors"][0]["task"], "complete");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(f.calls.load(Ordering::SeqCst), 1, "the invoker ran once");
    let (status, _) = f.event("picky", &sid, "retry", "").await;
    assert_eq!(status, StatusCode::OK);
    f.poll_until("picky", &sid, |b| b["next_actions"] != json!(["poll"]))
        .await;
    assert_eq!(f.calls.load(Ordering::SeqCst), 2, "once more, on request");
}

#[tokio::test]
async fn defect_3_events_while_a_dag_runs_are_409_and_the_completion_event_is_the_engines() {
    let f = fixture(None).await;
    let sid = f.start("gated").await["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, body) = f.event("gated", &sid, "user_input", "q").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = f.event("gated", &sid, "advance", "fake answer").await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["type"], "urn:parlance:problem:not-allowed");
    assert_eq!(body["reason"], "reserved_for_engine");
    let (status, body) = f.event("gated", &sid, "again", "").await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["type"], "urn:parlance:problem:not-allowed");
    assert_eq!(body["reason"], "dag_running");
    f.gate.add_permits(1);
    let done = f
        .poll_until("gated", &sid, |b| b["next_actions"] != json!(["poll"]))
        .await;
    assert_eq!(done["response"], "Answer: thinking about q");
}

#[tokio::test]
async fn defect_4_and_5_a_failed_task_is_reported_by_poll_with_retry_and_cleared_later() {
    defect_4_and_5_a_failed_task_is_reported_by_poll_with_retry_and_cleared_later_on(
        fixture(None).await,
    )
    .await;
}

#[tokio::test]
async fn defect_4_and_5_a_failed_task_is_reported_by_poll_with_retry_and_cleared_later_on_postgres()
{
    let Some(pool) = test_pool().await else {
        return;
    };
    defect_4_and_5_a_failed_task_is_reported_by_poll_with_retry_and_cleared_later_on(
        fixture(Some(pool)).await,
    )
    .await;
}

async fn defect_4_and_5_a_failed_task_is_reported_by_poll_with_retry_and_cleared_later_on(
    f: Fixture,
) {
    let sid = f.start("failing").await["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    f.event("failing", &sid, "user_input", "q").await;
    let body = f
        .poll_until("failing", &sid, |b| b["next_actions"] != json!(["poll"]))
        .await;
    assert_eq!(body["next_actions"], json!(["retry"]));
    assert_eq!(body["error"], "the model is down");
    assert_eq!(
        body["errors"],
        json!([{"invocation_id": "think-00000000-0000-0000-0000-000000000002", "task": "0", "message": "the model is down"}])
    );
    assert_eq!(
        f.failures.load(Ordering::SeqCst),
        2,
        "one retry, then it stops"
    );
    let (status, _, ts) = f
        .server
        .send(
            Method::GET,
            &format!("/v1/ai/failing/task_state/{sid}"),
            None,
            true,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(ts["ready"], true, "never stuck in poll");
    // Polls keep answering 200 with the typed error.
    assert_eq!(f.poll("failing", &sid).await["error"], "the model is down");
}

#[tokio::test]
async fn defect_7_progress_is_visible_as_soon_as_the_event_returns() {
    let f = fixture(None).await;
    let sid = f.start("gated").await["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (_, body) = f.event("gated", &sid, "user_input", "q").await;
    assert_eq!(progress(&body), (0, 2, "think".into()));
    let poll = f.poll("gated", &sid).await;
    assert_eq!(poll["next_actions"], json!(["poll"]));
    assert_eq!(progress(&poll), (0, 2, "think".into()));
    assert_eq!(poll["response"], Value::Null, "never the user's own input");
    f.gate.add_permits(1);
}

/// With a poll wait, a poll of a running session answers once the run has
/// ended (woken by the completion's commit), not "still running" at once;
/// when the run does not end within the wait it answers the progress.
/// Before, every poll answered at once, so a client polled many times per
/// round trip.
#[tokio::test]
async fn a_poll_waits_for_the_run_to_end_within_the_poll_wait() {
    async fn check(pool: Option<parlance_postgres::PgPool>) {
        let f = fixture_polling(
            pool,
            RunnerOptions {
                attempts: 2,
                task_timeout: Duration::from_secs(10),
            },
            Duration::from_millis(5),
            Duration::from_secs(20),
        )
        .await;
        let sid = f.start("gated").await["session_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let (_, body) = f.event("gated", &sid, "user_input", "q").await;
        assert_eq!(body["next_actions"], json!(["poll"]));
        let gate = f.gate.clone();
        let release = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            gate.add_permits(1);
        });
        let started = std::time::Instant::now();
        let poll = f.poll("gated", &sid).await;
        assert_eq!(poll["next_actions"], json!(["again"]), "{poll}");
        assert_eq!(poll["response"], "Answer: thinking about q");
        assert!(started.elapsed() >= Duration::from_millis(100));
        release.await.unwrap();
        // A run that does not end within the wait: the progress, after it.
        let (_, body) = f.event("gated", &sid, "again", "").await;
        assert_eq!(body["next_actions"], json!(["user_input"]), "{body}");
        f.event("gated", &sid, "user_input", "r").await;
        let short = Duration::from_millis(50);
        f.flows.set_poll_wait(short);
        let started = std::time::Instant::now();
        let poll = f.poll("gated", &sid).await;
        assert_eq!(poll["next_actions"], json!(["poll"]));
        assert_eq!(progress(&poll), (0, 2, "think".into()));
        assert!(started.elapsed() >= short);
        f.gate.add_permits(1);
    }
    check(None).await;
    if let Some(pool) = test_pool().await {
        check(Some(pool)).await;
    }
}

/// The audit trail of a flow session: from, to and cause of each entry.
async fn flow_trail(f: &Fixture, sid: &str) -> Vec<(Option<String>, String, String)> {
    let product = parlance_core::ProductId::parse("acme").unwrap();
    f.audit
        .list(&product, parlance_core::EntityKind::Flow, sid, None, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.entry.from, r.entry.to, r.entry.cause))
        .collect()
}

async fn every_transition_is_audited_on(f: Fixture) {
    let sid = f.start("gated").await["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, _) = f.event("gated", &sid, "user_input", "q").await;
    assert_eq!(status, StatusCode::OK);
    f.gate.add_permits(1);
    f.poll_until("gated", &sid, |b| b["next_actions"] != json!(["poll"]))
        .await;
    let (status, _) = f.event("gated", &sid, "again", "").await;
    assert_eq!(status, StatusCode::OK);
    let step = |from: Option<&str>, to: &str, cause: &str| {
        (from.map(str::to_owned), to.to_owned(), cause.to_owned())
    };
    assert_eq!(
        flow_trail(&f, &sid).await,
        [
            step(None, "ask", "start_session"),
            step(Some("ask"), "think", "user_input"),
            step(Some("think"), "answer", "dag_completed"),
            step(Some("answer"), "ask", "again"),
        ]
    );
}

#[tokio::test]
async fn every_flow_transition_is_audited() {
    every_transition_is_audited_on(fixture(None).await).await;
}

#[tokio::test]
async fn every_flow_transition_is_audited_on_postgres() {
    let Some(pool) = test_pool().await else {
        return;
    };
    every_transition_is_audited_on(fixture(Some(pool)).await).await;
}

/// A transition and its audit entry are one commit: when the entry cannot
/// be written, the event fails and nothing is saved or enqueued (it used
/// to be saved and answered 200, its entry dropped with a warning).
#[tokio::test]
async fn a_flow_transition_whose_audit_entry_fails_is_not_saved_on_postgres() {
    let Some(pool) = test_pool().await else {
        return;
    };
    let f = fixture(Some(pool.clone())).await;
    let sid = f.start("gated").await["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let before = f.model("gated", &sid).await;
    sqlx::raw_sql(
        "CREATE FUNCTION refuse_flow_audit() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN IF NEW.entity_kind = 'flow' THEN RAISE EXCEPTION 'audit refused'; END IF; \
         RETURN NEW; END $$; \
         CREATE TRIGGER refuse_flow_audit BEFORE INSERT ON audit_log \
         FOR EACH ROW EXECUTE FUNCTION refuse_flow_audit();",
    )
    .execute(&pool)
    .await
    .unwrap();
    let (status, _) = f.event("gated", &sid, "user_input", "q").await;
    assert!(status.is_server_error(), "{status}");
    assert_eq!(f.model("gated", &sid).await, before, "nothing saved");
    let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM dag_runs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(runs, 0, "nothing enqueued");
    assert_eq!(flow_trail(&f, &sid).await.len(), 1);
    sqlx::raw_sql("DROP TRIGGER refuse_flow_audit ON audit_log")
        .execute(&pool)
        .await
        .unwrap();
    let (status, _) = f.event("gated", &sid, "user_input", "q").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(flow_trail(&f, &sid).await.len(), 2);
    f.gate.add_permits(1);
}

#[tokio::test]
async fn defect_16_polls_write_nothing() {
    let f = fixture(None).await;
    let sid = f.start("qa").await["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let before = f.model("qa", &sid).await["version"].clone();
    for _ in 0..3 {
        f.poll("qa", &sid).await;
    }
    assert_eq!(f.model("qa", &sid).await["version"], before);
}

/// A session store whose changes always find the session moved: every
/// commit on a version loses its compare-and-swap; creations land.
struct AlwaysMoved(Arc<MemoryFlowStore>);

#[async_trait]
impl MachineStore<FlowRecord> for AlwaysMoved {
    async fn load(&self, key: &FlowKey) -> PortResult<Option<Stored<FlowRecord>>> {
        self.0.load(key).await
    }

    async fn commit(&self, c: Commit<'_, FlowRecord>) -> PortResult<Committed<FlowRecord>> {
        if c.expected.is_some() {
            return Err(PortError::conflict("the session moved"));
        }
        self.0.commit(c).await
    }
}

/// An event that loses its compare-and-swap on every attempt changed
/// nothing and asks the client to retry: 503 `contended` with
/// `Retry-After` (it used to answer 409 after 8 attempts, like a refusal).
#[tokio::test]
async fn an_event_that_keeps_losing_its_race_is_503_with_retry_after() {
    let clock = Arc::new(ManualClock::new());
    let mut c = Components::memory(keys());
    c.clock = clock.clone();
    let mut state = c.build();
    let store = Arc::new(MemoryFlowStore::with_queue(
        Arc::new(MemoryAuditLog::new()),
        state.shared.queue.clone(),
        QueueConfig::default().dag_limits,
    ));
    state.flows = FlowService::new(FlowDeps {
        catalog: Arc::new(example_catalog().unwrap()),
        records: Arc::new(AlwaysMoved(store.clone())),
        audit: state.shared.audit.clone(),
        store,
        runner: Arc::new(QueueRunner::new(state.shared.queue.clone())),
        options: RunnerOptions::default(),
        clock: clock.clone(),
        ids: state.shared.ids.clone(),
        llm: state.shared.llm.clone(),
        extra_invokers: BTreeMap::new(),
    });
    let server = TestServer::start(state, clock).await;
    let (status, _, start) = server
        .send(Method::POST, "/v1/ai/qa/start_session", None, true)
        .await;
    assert_eq!(status, StatusCode::OK, "{start}");
    let sid = start["session_id"].as_str().unwrap().to_owned();
    let res = server
        .client
        .post(format!("http://{}/v1/ai/qa/event", server.addr))
        .bearer_auth(KEY)
        .json(&json!({"session_id": sid, "event": "user_input", "event_input": "Why?"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        res.headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["type"], "urn:parlance:problem:contended");
    let (status, _, model) = server
        .send(Method::GET, &format!("/v1/ai/qa/model/{sid}"), None, true)
        .await;
    assert_eq!(status, StatusCode::OK);
    let model: Value = serde_json::from_str(model["response"].as_str().unwrap()).unwrap();
    assert_eq!(model["state"], "ask", "nothing changed");
    assert_eq!(model["version"], 1);
}

#[tokio::test]
async fn cancel_stops_the_dag_and_returns_to_the_last_user_state() {
    cancel_stops_the_dag_and_returns_to_the_last_user_state_on(fixture(None).await).await;
}

#[tokio::test]
async fn cancel_stops_the_dag_and_returns_to_the_last_user_state_on_postgres() {
    let Some(pool) = test_pool().await else {
        return;
    };
    cancel_stops_the_dag_and_returns_to_the_last_user_state_on(fixture(Some(pool)).await).await;
}

async fn cancel_stops_the_dag_and_returns_to_the_last_user_state_on(f: Fixture) {
    let sid = f.start("gated").await["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    f.event("gated", &sid, "user_input", "q").await;
    let (status, body) = f.event("gated", &sid, "cancel", "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["next_actions"], json!(["user_input"]));
    f.gate.add_permits(1);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let model = f.model("gated", &sid).await;
    assert_eq!(model["state"], "ask", "the late result is dropped");
    let (status, _) = f.event("gated", &sid, "cancel", "").await;
    assert_eq!(status, StatusCode::CONFLICT, "nothing to cancel");
}

#[tokio::test]
async fn a_run_that_ends_without_reaching_the_session_is_failed_by_the_next_poll() {
    a_run_that_ends_without_reaching_the_session_is_failed_by_the_next_poll_on(fixture(None).await)
        .await;
}

#[tokio::test]
async fn a_run_that_ends_without_reaching_the_session_is_failed_by_the_next_poll_on_postgres() {
    let Some(pool) = test_pool().await else {
        return;
    };
    a_run_that_ends_without_reaching_the_session_is_failed_by_the_next_poll_on(
        fixture(Some(pool)).await,
    )
    .await;
}

async fn a_run_that_ends_without_reaching_the_session_is_failed_by_the_next_poll_on(f: Fixture) {
    let sid = f.start("gated").await["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    f.event("gated", &sid, "user_input", "q").await;
    let model = f.model("gated", &sid).await;
    let dag = model["running"]["dag_id"]
        .as_i64()
        .expect("the session names its run");
    // The run ends behind the session's back (an operator, or a worker
    // lost on the last attempt): no handler reports it.
    f.queue
        .cancel_dag(
            &parlance_core::ProductId::parse("acme").unwrap(),
            parlance_ports::DagId(dag),
        )
        .await
        .unwrap();
    let body = f.poll("gated", &sid).await;
    assert_eq!(body["next_actions"], json!(["retry"]));
    assert_eq!(body["error"], "the task graph was cancelled");
    f.gate.add_permits(1);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let model = f.model("gated", &sid).await;
    assert_eq!(model["state"], "think");
    assert_eq!(model["running"], Value::Null, "the late result is dropped");
    let (status, _) = f.event("gated", &sid, "retry", "").await;
    assert_eq!(status, StatusCode::OK);
    f.gate.add_permits(1);
    let done = f
        .poll_until("gated", &sid, |b| b["next_actions"] != json!(["poll"]))
        .await;
    assert_eq!(done["response"], "Answer: thinking about q");
}

#[test]
fn example_flows_load_and_validate() {
    let catalog = FlowCatalog::load_dir(&examples_dir(), &Invokers::is_builtin).unwrap();
    let names: Vec<&str> = catalog.iter().map(|f| f.name()).collect();
    assert_eq!(names, ["extraction", "qa", "triage"]);
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("parlance-flows-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn loading_reports_every_problem_with_the_file_and_location() {
    let dir = scratch("bad");
    let flow = dir.join("broken");
    std::fs::create_dir_all(flow.join("templates")).unwrap();
    std::fs::write(flow.join("templates/a.j2"), "A").unwrap();
    std::fs::write(
        flow.join("flow.yaml"),
        "name: broken\ninitial: a\nstates:\n  - {id: a, kind: user, template: a.j2}\n  \
         - {id: b, kind: invoker, template: nope.j2, invoker: telepathy}\n\
         transitions:\n  - {event: go, from: a, to: b}\n  - {event: advance, from: b, to: a}\n",
    )
    .unwrap();
    let err = FlowCatalog::load_dir(&dir, &Invokers::is_builtin)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("broken/flow.yaml: states[1].template: unknown template `nope.j2`"),
        "{err}"
    );
    assert!(
        err.contains("broken/flow.yaml: states[1].invoker: unknown invoker `telepathy`"),
        "{err}"
    );
    std::fs::write(flow.join("templates/nope.j2"), "N").unwrap();
    assert!(FlowCatalog::load_dir(&dir, &|_: &str| true).is_ok());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A flow folder whose file declares a validator and hooks.
const SIGNUP: &str = r#"
name: signup
initial: ask
model: {greeting: "", email: null}
validators:
  email: {regex: '^[^@\s]+@[^@\s]+$', message: "that is not an email address"}
states:
  - id: ask
    kind: user
    template: ask.j2
    on_enter: [{assign: {greeting: "'Your email, please'"}}]
  - {id: done, kind: user, template: done.j2}
transitions:
  - event: give
    from: ask
    to: done
    validators: [email]
    before:
      - {fail: "no spam, please", when: "'spam' in actor_input"}
      - {assign: {email: actor_input}}
"#;

#[tokio::test]
async fn hooks_and_validators_declared_in_a_flow_file_refuse_with_422_and_change_nothing() {
    let dir = scratch("declared");
    let folder = dir.join("signup");
    std::fs::create_dir_all(folder.join("templates")).unwrap();
    std::fs::write(folder.join("flow.yaml"), SIGNUP).unwrap();
    std::fs::write(folder.join("templates/ask.j2"), "{{ greeting }}").unwrap();
    std::fs::write(folder.join("templates/done.j2"), "Thanks, {{ email }}").unwrap();
    let clock = Arc::new(ManualClock::new());
    let mut c = Components::memory(keys());
    c.clock = clock.clone();
    c.flows = FlowCatalog::load_dir(&dir, &Invokers::is_builtin).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let server = TestServer::start(c.build(), clock).await;
    let (status, _, start) = server
        .send(Method::POST, "/v1/ai/signup/start_session", None, true)
        .await;
    assert_eq!(status, StatusCode::OK, "{start}");
    assert_eq!(start["response"], "Your email, please", "enter hooks ran");
    let sid = start["session_id"].as_str().unwrap().to_owned();
    let model = || async {
        let (status, _, body) = server
            .send(
                Method::GET,
                &format!("/v1/ai/signup/model/{sid}"),
                None,
                true,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        serde_json::from_str::<Value>(body["response"].as_str().unwrap()).unwrap()
    };
    let event = |input: &'static str| {
        let body = json!({"session_id": sid, "event": "give", "event_input": input});
        let server = &server;
        async move {
            let (status, _, body) = server
                .send(Method::POST, "/v1/ai/signup/event", Some(&body), true)
                .await;
            (status, body)
        }
    };
    let before = model().await;

    let (status, body) = event("not an address").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["type"], "urn:parlance:problem:invalid-request");
    assert_eq!(body["validator"], "email");
    assert_eq!(body["message"], "that is not an email address");
    assert_eq!(body["field"], "event_input");
    assert_eq!(model().await, before, "nothing changed");

    let (status, body) = event("spam@example.com").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["type"], "urn:parlance:problem:invalid-request");
    assert_eq!(body["hook"], "transitions[0].before[0]");
    assert_eq!(body["message"], "no spam, please");
    assert_eq!(model().await, before, "nothing changed");

    let (status, body) = event("ann@example.com").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["response"], "Thanks, ann@example.com");
    let after = model().await;
    assert_eq!(after["state"], "done");
    assert_eq!(after["model"]["email"], "ann@example.com", "{after}");
}

#[cfg(unix)]
#[test]
fn templates_never_follow_links_out_of_the_folder() {
    let dir = scratch("links");
    let secret = dir.join("secret.txt");
    std::fs::write(&secret, "do not read").unwrap();
    let templates = dir.join("templates");
    std::fs::create_dir_all(templates.join("sub")).unwrap();
    std::fs::write(templates.join("sub/a.j2"), "A").unwrap();
    std::os::unix::fs::symlink(&secret, templates.join("leak.j2")).unwrap();
    let read = parlance_app::flow::read_templates(&templates).unwrap();
    assert_eq!(read.keys().collect::<Vec<_>>(), ["sub/a.j2"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_task_over_its_timeout_is_retried_then_fails_the_dag() {
    a_task_over_its_timeout_is_retried_then_fails_the_dag_on(None).await;
}

#[tokio::test]
async fn a_task_over_its_timeout_is_retried_then_fails_the_dag_on_postgres() {
    let Some(pool) = test_pool().await else {
        return;
    };
    a_task_over_its_timeout_is_retried_then_fails_the_dag_on(Some(pool)).await;
}

async fn a_task_over_its_timeout_is_retried_then_fails_the_dag_on(
    pool: Option<parlance_postgres::PgPool>,
) {
    let f = fixture_with(
        pool,
        RunnerOptions {
            attempts: 2,
            task_timeout: Duration::from_millis(20),
        },
        Duration::from_millis(1),
    )
    .await;
    let sid = f.start("gated").await["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    f.event("gated", &sid, "user_input", "q").await;
    let body = f
        .poll_until("gated", &sid, |b| b["next_actions"] != json!(["poll"]))
        .await;
    assert_eq!(body["next_actions"], json!(["retry"]));
    assert_eq!(body["error"], "timed out after 20ms");
    assert_eq!(f.model("gated", &sid).await["state"], "think");
}

/// A flow's task graph is durable: enqueued on PostgreSQL, its first task
/// claimed by a worker that then dies with the whole process, it is finished
/// by a fresh process's worker once the dead worker's lease runs out, and
/// the session completes (through the invoker->invoker hop) as if nothing
/// happened.
#[tokio::test]
async fn a_flow_dag_survives_a_restart_on_postgres() {
    let Some(pool) = test_pool().await else {
        return;
    };
    let product = parlance_core::ProductId::parse("acme").unwrap();
    let input = "name: Ada Lovelace; email: ada@example.com; topics: engines, poetry";
    let session_id = {
        // The first process: the event enqueues the DAG with the session.
        let mut c = Components::postgres(pool.clone(), keys());
        c.flows = parlance_app::flow::example_catalog().unwrap();
        let state = c.build();
        let svc = state.flows.clone();
        let flow = svc.catalog().get("extraction").unwrap();
        let sid = svc.start_session(&product, &flow).await.unwrap().session_id;
        let key = FlowKey::new(product.clone(), sid.parse().unwrap());
        let asked = svc
            .event(&key, &flow, ClientEvent::parse("user_input"), input)
            .await
            .unwrap();
        assert_eq!(asked.next_actions, ["poll"]);
        // Its worker claims the first task for a moment, then the process
        // dies: the task is neither completed nor released.
        let leases = state
            .shared
            .queue
            .claim(
                &WorkerId(uuid::Uuid::from_u128(7)),
                parlance_ports::queue::DEFAULT_QUEUE,
                1,
                Duration::from_secs(300),
            )
            .await
            .unwrap();
        assert_eq!(leases.len(), 1);
        assert_eq!(leases[0].kind, "flow.invoke");
        sid
    };
    // A fresh process on the same database; it declares a worker dead
    // after 50 ms of silence (30 s by default) so the test need not wait.
    let mut c = Components::postgres(pool.clone(), keys());
    c.queue = QueueConfig {
        worker_stale_after: Duration::from_millis(50),
        ..QueueConfig::default()
    };
    c.flows = parlance_app::flow::example_catalog().unwrap();
    let state = c.build();
    let svc = state.flows.clone();
    let flow = svc.catalog().get("extraction").unwrap();
    let key = FlowKey::new(product.clone(), session_id.parse().unwrap());
    let polled = svc.poll(&key, &flow).await.unwrap();
    assert_eq!(
        polled.next_actions,
        ["poll"],
        "still running after the crash"
    );
    let worker = Worker::new(
        WorkerId(uuid::Uuid::from_u128(8)),
        state.shared.queue.clone(),
        state.handlers(),
        Arc::new(SystemClock),
        WorkerConfig::default(),
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut done = None;
    for _ in 0..200 {
        state.shared.queue.recover_expired().await.unwrap();
        worker.step().await.unwrap();
        let polled = svc.poll(&key, &flow).await.unwrap();
        if polled.next_actions != ["poll"] {
            done = Some(polled);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let done = done.expect("the session completed after the restart");
    assert_eq!(done.next_actions, ["accept", "restart"]);
    assert_eq!(done.error, None);
    assert_eq!(
        done.response.as_deref(),
        Some(
            "Thanks Ada Lovelace. We will write to ada@example.com about: engines, poetry.\n\
             Send `accept` to finish or `restart` to start over."
        )
    );
    let model = svc.model(&key, &flow).await.unwrap();
    let model: Value = serde_json::from_str(&model.response.unwrap()).unwrap();
    assert_eq!(model["state"], "confirm");
    assert_eq!(model["model"]["topics"], json!(["engines", "poetry"]));
    assert_eq!(model["model"]["complete"], true);
}

/// A template, condition or assignment that fails on the input, or would
/// build a value over its size limit, answers a 422 problem and leaves the
/// session, its dialogue and its audit trail exactly as they were.
async fn input_dependent_render_failures_are_422_and_change_nothing_on(f: Fixture) {
    let sid = f.start("fragile").await["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let before = (f.model("fragile", &sid).await, flow_trail(&f, &sid).await);
    for (event, input, kind, member) in [
        ("to_int", "text", "invalid-request", "template"),
        ("cond_int", "text", "invalid-request", "expression"),
        ("to_div", "", "invalid-request", "template"),
        ("assign_unknown", "x", "invalid-request", "expression"),
        ("to_map", "no_such_filter", "invalid-request", "template"),
        ("to_include", "no_such.j2", "invalid-request", "template"),
        (
            "cond_select",
            "no_such_test",
            "invalid-request",
            "expression",
        ),
        ("to_huge", "", "limit-exceeded", "limit"),
        ("to_big", "", "limit-exceeded", "limit"),
        ("assign_big", "", "limit-exceeded", "limit"),
    ] {
        let (status, _, body) = f
            .server
            .send(
                Method::POST,
                "/v1/ai/fragile/event",
                Some(&json!({"session_id": sid, "event": event, "event_input": input})),
                true,
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{event}: {body}");
        assert_eq!(
            body["type"],
            format!("urn:parlance:problem:{kind}"),
            "{event}: {body}"
        );
        assert!(body.get(member).is_some(), "{event}: {body}");
        if kind == "limit-exceeded" {
            let limit = body["limit"].as_str().unwrap();
            assert!(limit.ends_with("bytes per value"), "{event}: {body}");
        }
        let after = (f.model("fragile", &sid).await, flow_trail(&f, &sid).await);
        assert_eq!(after, before, "{event} changed the session");
    }
    // The same session still takes an input its templates can use.
    let (status, body) = f.event("fragile", &sid, "to_int", "41").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["response"], "42");
}

#[tokio::test]
async fn input_dependent_render_failures_are_422_and_change_nothing() {
    input_dependent_render_failures_are_422_and_change_nothing_on(fixture(None).await).await;
}

#[tokio::test]
async fn input_dependent_render_failures_are_422_and_change_nothing_on_postgres() {
    let Some(pool) = test_pool().await else {
        return;
    };
    input_dependent_render_failures_are_422_and_change_nothing_on(fixture(Some(pool)).await).await;
}

fn user(email: &str) -> Value {
    json!({
        "email": email, "firstname": "Ada", "lastname": "Lovelace",
        "custom_properties": {"team": "engines"}
    })
}

impl Fixture {
    async fn post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        let (status, _, answer) = self.server.send(Method::POST, path, Some(body), true).await;
        (status, answer)
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let (status, _, answer) = self.server.send(Method::GET, path, None, true).await;
        (status, answer)
    }

    /// The ids `user_sessions` answers for `email` in `flow`.
    async fn user_sessions(&self, flow: &str, email: &str) -> Vec<String> {
        let path = format!("/v1/ai/{flow}/user_sessions");
        let (status, body) = self.post(&path, &user(email)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_documented(&Method::POST, &path, status, &body);
        serde_json::from_value(body).unwrap()
    }
}

async fn start_keeps_the_user_and_shows_the_seed_to_the_start_only_on(f: Fixture) {
    let (status, started) = f
        .post(
            "/v1/ai/seeded/start_session",
            &json!({"user_info": user("ada@example.com"), "seed_data": r#"{"topic": "engines"}"#}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{started}");
    assert_documented(
        &Method::POST,
        "/v1/ai/seeded/start_session",
        status,
        &started,
    );
    assert_eq!(started["response"], "Hello Ada Lovelace, about engines.");
    let sid = started["session_id"].as_str().unwrap().to_owned();
    let model = f.model("seeded", &sid).await;
    assert_eq!(
        model["model"]["topic"], "engines",
        "the enter hook saw the seed"
    );
    assert_eq!(
        model["user_info"],
        user("ada@example.com"),
        "the user is kept"
    );
    assert!(model.get("seed_data").is_none(), "the seed is not: {model}");
    assert_eq!(model["dialogue"][0]["actor_text"], started["response"]);
    let (status, said) = f.event("seeded", &sid, "say", "hi").await;
    assert_eq!(status, StatusCode::OK, "{said}");
    assert_eq!(said["response"], "Ada said hi; topic engines; seed None.");

    // Without a body, or with an empty one: no user, no seed.
    let (status, _, bare) = f
        .server
        .send(Method::GET, "/v1/ai/seeded/start_session", None, true)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(bare["response"], "Hello stranger.");
    let (status, empty) = f.post("/v1/ai/seeded/start_session", &json!({})).await;
    assert_eq!(status, StatusCode::OK);
    let bare = f
        .model("seeded", empty["session_id"].as_str().unwrap())
        .await;
    assert!(bare.get("user_info").is_none(), "{bare}");

    // A user that is not one, or holds text no store keeps, starts nothing.
    let refused = [
        json!({"user_info": {"email": "ada@example.com"}}),
        json!({"user_info": {"email": "not an email", "firstname": "A", "lastname": "B"}}),
        json!({"user_info": {"email": "ada@example.com", "firstname": "A\nB", "lastname": "B"}}),
        json!({"user_info": {"plan": "pro"}}),
        json!({"user_info": user("ada@example.com"), "seed_data": 7}),
    ];
    for body in refused {
        let (status, problem) = f.post("/v1/ai/seeded/start_session", &body).await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{body}: {problem}"
        );
        assert_eq!(problem["type"], "urn:parlance:problem:invalid-request");
    }
    let mut nul = user("ada@example.com");
    nul["custom_properties"]["team"] = json!("a\u{0}b");
    let (status, problem) = f
        .post("/v1/ai/seeded/start_session", &json!({"user_info": nul}))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{problem}");
    assert_eq!(problem["field"], "user_info.custom_properties.team");
    assert_eq!(
        f.user_sessions("seeded", "ada@example.com").await,
        [sid],
        "no refused start left a session"
    );
}

#[tokio::test]
async fn start_keeps_the_user_and_shows_the_seed_to_the_start_only() {
    start_keeps_the_user_and_shows_the_seed_to_the_start_only_on(fixture(None).await).await;
}

#[tokio::test]
async fn start_keeps_the_user_and_shows_the_seed_to_the_start_only_on_postgres() {
    let Some(pool) = test_pool().await else {
        return;
    };
    start_keeps_the_user_and_shows_the_seed_to_the_start_only_on(fixture(Some(pool)).await).await;
}

async fn an_ephemeral_session_takes_its_event_in_one_call_on(f: Fixture) {
    let path = "/v1/ai/qa/start_ephemeral_session";
    let body = json!({
        "event": "user_input", "event_input": "What is Rust?",
        "user_info": user("eph@example.com")
    });
    let (status, asked) = f.post(path, &body).await;
    assert_eq!(status, StatusCode::OK, "{asked}");
    assert_documented(&Method::POST, path, status, &asked);
    assert_eq!(asked["next_actions"], json!(["poll"]));
    assert_eq!(asked["response"], Value::Null);
    assert_eq!(
        progress(&asked).1,
        2,
        "progress is written with the creation"
    );
    insta::assert_json_snapshot!("qa_ephemeral_asked", asked, {".session_id" => "[id]"});
    let sid = asked["session_id"].as_str().unwrap().to_owned();
    let model = f.model("qa", &sid).await;
    assert_eq!(model["ephemeral"], true);
    assert_eq!(model["model"]["question"], "What is Rust?");
    assert_eq!(model["user_info"]["email"], "eph@example.com");
    let events: Vec<&str> = model["dialogue"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(events[0], "user_input", "no greeting is recorded");
    assert!(!events.contains(&"init"), "{events:?}");
    let answered = f
        .poll_until("qa", &sid, |b| b["next_actions"] != json!(["poll"]))
        .await;
    assert_eq!(answered["next_actions"], json!(["user_input", "done"]));
    let trail = flow_trail(&f, &sid).await;
    assert_eq!(
        trail[..2],
        [
            (None, "ask".to_owned(), "start_session".to_owned()),
            (
                Some("ask".to_owned()),
                "answer".to_owned(),
                "user_input".to_owned()
            ),
        ]
    );

    // A user -> user event answers its target, rendered; the initial
    // state's enter hook ran first (no seed: no topic).
    let (status, said) = f
        .post(
            "/v1/ai/seeded/start_ephemeral_session",
            &json!({"event": "say", "event_input": "hi", "user_info": user("eph@example.com")}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{said}");
    assert_eq!(said["response"], "Ada said hi; topic None; seed None.");
    assert_eq!(said["next_actions"], json!([]));

    // A refused event, a refusing validator, or a bad body leaves no session.
    let gone = "gone@example.com";
    for (body, want) in [
        (
            json!({"event": "done", "event_input": "", "user_info": user(gone)}),
            StatusCode::CONFLICT,
        ),
        (
            json!({"event": "user_input", "event_input": "  ", "user_info": user(gone)}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            json!({"event": "poll", "event_input": "", "user_info": user(gone)}),
            StatusCode::CONFLICT,
        ),
        (
            json!({"event": "user_input", "user_info": user(gone)}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
    ] {
        let (status, problem) = f.post(path, &body).await;
        assert_eq!(status, want, "{body}: {problem}");
    }
    let (status, conflict) = f
        .post(
            path,
            &json!({"event": "done", "event_input": "", "user_info": user(gone)}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    insta::assert_json_snapshot!("qa_ephemeral_refused", conflict);
    assert!(f.user_sessions("qa", gone).await.is_empty());
    let (status, _) = f.post("/v1/ai/nope/start_ephemeral_session", &body).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn an_ephemeral_session_takes_its_event_in_one_call() {
    let f = fixture(None).await;
    f.gate.add_permits(100);
    an_ephemeral_session_takes_its_event_in_one_call_on(f).await;
}

#[tokio::test]
async fn an_ephemeral_session_takes_its_event_in_one_call_on_postgres() {
    let Some(pool) = test_pool().await else {
        return;
    };
    let f = fixture(Some(pool)).await;
    f.gate.add_permits(100);
    an_ephemeral_session_takes_its_event_in_one_call_on(f).await;
}

async fn user_sessions_are_a_users_newest_first_on(f: Fixture) {
    let mut ada = Vec::new();
    for flow in ["qa", "seeded", "qa", "qa"] {
        let (status, started) = f
            .post(
                &format!("/v1/ai/{flow}/start_session"),
                &json!({"user_info": user("ada@example.com")}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{started}");
        if flow == "qa" {
            ada.push(started["session_id"].as_str().unwrap().to_owned());
        }
        f.server.clock.advance_secs(1.0);
    }
    let (status, _) = f
        .post(
            "/v1/ai/qa/start_session",
            &json!({"user_info": user("bob@example.com")}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    f.start("qa").await;
    ada.reverse();
    let listed = f.user_sessions("qa", "ada@example.com").await;
    assert_eq!(listed, ada, "newest first");
    assert_eq!(f.user_sessions("seeded", "ada@example.com").await.len(), 1);
    assert_eq!(f.user_sessions("qa", "bob@example.com").await.len(), 1);
    assert!(f.user_sessions("qa", "Ada@example.com").await.is_empty());
    assert!(f.user_sessions("gated", "ada@example.com").await.is_empty());
    let listed = json!(listed);
    insta::assert_json_snapshot!("user_sessions", listed, {"[]" => "[id]"});

    let path = "/v1/ai/qa/user_sessions";
    for body in [
        json!({"email": "ada@example.com"}),
        json!({"email": "nope", "firstname": "A", "lastname": "B"}),
    ] {
        let (status, problem) = f.post(path, &body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{problem}");
    }
    let (status, _) = f
        .post("/v1/ai/nope/user_sessions", &user("ada@example.com"))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn user_sessions_are_a_users_newest_first() {
    user_sessions_are_a_users_newest_first_on(fixture(None).await).await;
}

#[tokio::test]
async fn user_sessions_are_a_users_newest_first_on_postgres() {
    let Some(pool) = test_pool().await else {
        return;
    };
    user_sessions_are_a_users_newest_first_on(fixture(Some(pool)).await).await;
}

async fn model_path_selects_with_jmespath_on(f: Fixture) {
    let (_, started) = f
        .post(
            "/v1/ai/seeded/start_session",
            &json!({"user_info": user("ada@example.com"), "seed_data": r#"{"topic": "engines"}"#}),
        )
        .await;
    let sid = started["session_id"].as_str().unwrap().to_owned();
    let at = |path: &str| format!("/v1/ai/seeded/model/{sid}?path={path}");
    for (path, want) in [
        ("model.topic", json!("engines")),
        ("user_info.email", json!("ada@example.com")),
        ("dialogue[0].event", json!("init")),
        ("{s: state, v: version}", json!({"s": "greet", "v": 1})),
        ("length(dialogue)", json!(1)),
        ("no_such_member", Value::Null),
    ] {
        let (status, body) = f
            .get(&at(
                &url::form_urlencoded::byte_serialize(path.as_bytes()).collect::<String>()
            ))
            .await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
        assert_documented(&Method::GET, &at(path), status, &body);
        let got: Value = serde_json::from_str(body["response"].as_str().unwrap()).unwrap();
        assert_eq!(got, want, "{path}");
        assert_eq!(body["next_actions"], json!(["say"]));
    }
    let (status, whole) = f.get(&format!("/v1/ai/seeded/model/{sid}")).await;
    assert_eq!(status, StatusCode::OK);
    let (_, all) = f.get(&at("%40")).await;
    assert_eq!(
        all["response"], whole["response"],
        "`@` is the whole model, with its keys in the same order"
    );
    // Objects keep the session's key order; a multiselect hash, its own.
    let keys = |path: &str| {
        let f = &f;
        let path = at(path);
        async move {
            let (_, body) = f.get(&path).await;
            let v: Value = serde_json::from_str(body["response"].as_str().unwrap()).unwrap();
            v.as_object().unwrap().keys().cloned().collect::<Vec<_>>()
        }
    };
    assert_eq!(
        keys("user_info").await,
        ["email", "firstname", "lastname", "custom_properties"]
    );
    assert_eq!(
        keys("%7Bzeta%3A%20state%2C%20alpha%3A%20version%7D").await,
        ["zeta", "alpha"]
    );

    // A bad expression is refused before anything is read, naming `path`.
    for (path, session) in [
        ("model%5B", sid.as_str()),
        ("length(state_id%2C%20state)", sid.as_str()),
        ("abs(state)", sid.as_str()),
        ("model%5B", "no-such-session"),
    ] {
        let (status, problem) = f
            .get(&format!("/v1/ai/seeded/model/{session}?path={path}"))
            .await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{path}: {problem}"
        );
        assert_eq!(problem["field"], "path", "{problem}");
        assert_eq!(problem["type"], "urn:parlance:problem:invalid-request");
    }
    let (status, _) = f
        .get("/v1/ai/seeded/model/no-such-session?path=state")
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn model_path_selects_with_jmespath() {
    model_path_selects_with_jmespath_on(fixture(None).await).await;
}

#[tokio::test]
async fn model_path_selects_with_jmespath_on_postgres() {
    let Some(pool) = test_pool().await else {
        return;
    };
    model_path_selects_with_jmespath_on(fixture(Some(pool)).await).await;
}

/// `/model` shows the state's value as `state` (as the reference does) and
/// its id as `state_name`, and the model's fields in declaration order.
async fn the_model_shows_the_state_value_and_the_fields_in_order_on(f: Fixture) {
    let sid = f.start("fragile").await["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let keys = |v: &Value| -> Vec<String> { v.as_object().unwrap().keys().cloned().collect() };
    let model = f.model("fragile", &sid).await;
    assert_eq!(
        (&model["state"], &model["state_name"]),
        (&json!(1), &json!("ask"))
    );
    assert_eq!(keys(&model["model"]), ["n", "alpha"]);
    assert_eq!(keys(&model["model"]["alpha"]), ["b", "a"]);
    let (status, body) = f.event("fragile", &sid, "to_int", "41").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let model = f.model("fragile", &sid).await;
    assert_eq!(
        (&model["state"], &model["state_name"]),
        (&json!("int"), &json!("int"))
    );
    assert_eq!(keys(&model["model"]["alpha"]), ["b", "a"]);
}

#[tokio::test]
async fn the_model_shows_the_state_value_and_the_fields_in_order() {
    the_model_shows_the_state_value_and_the_fields_in_order_on(fixture(None).await).await;
}

#[tokio::test]
async fn the_model_shows_the_state_value_and_the_fields_in_order_on_postgres() {
    let Some(pool) = test_pool().await else {
        return;
    };
    the_model_shows_the_state_value_and_the_fields_in_order_on(fixture(Some(pool)).await).await;
}
