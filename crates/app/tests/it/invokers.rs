//! Invokers configured per template folder (`meta.yaml`): a flow loaded
//! from disk whose templates run on a fake OpenAI-compatible server and on
//! a plain HTTP endpoint, end to end over HTTP on memory and PostgreSQL.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::http::{HeaderMap, StatusCode as AxumStatus};
use axum::routing::post;
use parlance_app::Components;
use parlance_app::flow::{FlowCatalog, Invokers};
use parlance_app::worker::{EmbeddedWorker, Worker, WorkerConfig};
use parlance_core::flow::RunnerOptions;
use parlance_core::queue::Backoff;
use parlance_ports::{Clock, QueueConfig, SystemClock, WorkerId};
use parlance_postgres::testing::test_pool;
use parlance_testkit::{ManualClock, SequentialIds};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{TestServer, keys};

/// What a fake server saw: one entry per request.
type Seen = Arc<Mutex<Vec<(HeaderMap, String)>>>;

async fn listen(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// An OpenAI-compatible chat endpoint answering each request with what
/// `answer` picks for it.
async fn fake_chat(answer: fn(&Value) -> &'static str) -> (SocketAddr, Seen) {
    let seen: Seen = Arc::default();
    let record = seen.clone();
    let app = Router::new().route(
        "/v1/chat/completions",
        post(move |headers: HeaderMap, body: String| {
            let record = record.clone();
            async move {
                let req: Value = serde_json::from_str(&body).unwrap();
                record.lock().unwrap().push((headers, body));
                Json(json!({
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "model": req["model"],
                    "choices": [{
                        "index": 0,
                        "message": {"role": "assistant", "content": answer(&req)},
                        "finish_reason": "stop",
                    }],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
                }))
            }
        }),
    );
    (listen(app).await, seen)
}

/// Answers `Paris` to a request with a system message, `yes` to any other.
async fn fake_openai() -> (SocketAddr, Seen) {
    fake_chat(|req| {
        if req["messages"][0]["role"] == "system" {
            "Paris"
        } else {
            "yes"
        }
    })
    .await
}

/// A plain endpoint that fails its first request with a 500 and answers
/// `stored` after.
async fn flaky_endpoint() -> (SocketAddr, Seen) {
    let seen: Seen = Arc::default();
    let record = seen.clone();
    let app = Router::new().route(
        "/notify",
        post(move |headers: HeaderMap, body: String| {
            let record = record.clone();
            async move {
                let mut seen = record.lock().unwrap();
                seen.push((headers, body));
                if seen.len() == 1 {
                    (AxumStatus::INTERNAL_SERVER_ERROR, "try later")
                } else {
                    (AxumStatus::OK, "stored")
                }
            }
        }),
    );
    (listen(app).await, seen)
}

fn write(root: &Path, file: &str, text: &str) {
    let path = root.join(file);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A flow whose one invoker state runs a map of three templates (a chat
/// template that spells out its messages, one in a sub-folder inheriting
/// the chat folder's settings with its own temperature, one at the root
/// on the state's own `template` invoker), then posts the combined result
/// to the HTTP endpoint.
fn flows_dir(name: &str, openai: SocketAddr, endpoint: SocketAddr) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("parlance-invokers-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let flow = dir.join("routed");
    write(
        &flow,
        "flow.yaml",
        "name: routed\ninitial: ask\nstates:\n  \
         - {id: ask, kind: user, template: ask.j2}\n  \
         - id: think\n    kind: invoker\n    \
           template: [{answer: chat/answer.j2, strict: chat/strict/check.j2, echo: echo.j2}, hook/notify.j2]\n  \
         - {id: done, kind: user, template: done.j2}\n\
         transitions:\n  \
         - {event: user_input, from: ask, to: think}\n  \
         - {event: advance, from: think, to: done}\n",
    );
    write(&flow, "templates/ask.j2", "Ask me.");
    write(&flow, "templates/echo.j2", "echo {{ actor_input }}");
    write(&flow, "templates/done.j2", "Saved: {{ actor_input }}");
    write(
        &flow,
        "templates/chat/meta.yaml",
        &format!(
            "invoker:\n  type: openai\n  base_url: http://{openai}/v1\n  model: gpt-test\n  \
             api_key_env: FAKE_OPENAI_KEY\n  temperature: 0.2\n  timeout: 5s\n"
        ),
    );
    write(
        &flow,
        "templates/chat/answer.j2",
        "- role: system\n  content: You answer in one word.\n\
         - role: user\n  content: {{ actor_input | tojson }}\n",
    );
    write(
        &flow,
        "templates/chat/strict/meta.yaml",
        "invoker:\n  temperature: 0\n",
    );
    write(
        &flow,
        "templates/chat/strict/check.j2",
        "Is this a question? {{ actor_input }}",
    );
    write(
        &flow,
        "templates/hook/meta.yaml",
        &format!(
            "invoker:\n  type: http\n  url: http://{endpoint}/notify\n  \
             content_type: application/json\n  headers_env: {{X-Hook-Token: HOOK_TOKEN}}\n  \
             timeout: 5s\n"
        ),
    );
    write(&flow, "templates/hook/notify.j2", "{{ previous_result }}");
    dir
}

/// The variables the flows' `meta.yaml` files name.
fn env(name: &str) -> Option<String> {
    match name {
        "FAKE_OPENAI_KEY" => Some("sk-fake-key".into()),
        "HOOK_TOKEN" => Some("hook-secret".into()),
        _ => None,
    }
}

async fn start(
    pool: Option<parlance_postgres::PgPool>,
    catalog: FlowCatalog,
) -> (TestServer, EmbeddedWorker) {
    let system: Arc<dyn Clock> = Arc::new(SystemClock);
    let clock = Arc::new(ManualClock::new());
    let mut c = match pool {
        Some(pool) => Components::postgres(pool, keys()),
        None => Components::memory(keys()),
    };
    c.clock = clock.clone();
    c.ids = Arc::new(SequentialIds::new());
    c.queue_clock = Some(system.clone());
    c.queue = QueueConfig {
        backoff: Backoff {
            base: Duration::from_millis(5),
            cap: Duration::from_millis(40),
        },
        ..QueueConfig::default()
    };
    c.runner = RunnerOptions {
        attempts: 3,
        task_timeout: Duration::from_secs(10),
    };
    c.flows = catalog;
    let state = c.build();
    let worker = EmbeddedWorker::spawn(Worker::new(
        WorkerId(uuid::Uuid::from_u128(11)),
        state.shared.queue.clone(),
        state.handlers(),
        system,
        WorkerConfig {
            poll_every: Duration::from_millis(5),
            ..WorkerConfig::default()
        },
    ));
    (TestServer::start(state, clock).await, worker)
}

/// Polls a session until its task graph is done; its last answer.
async fn poll_done(server: &TestServer, flow: &str, sid: &str) -> Value {
    let poll = json!({"session_id": sid, "event": "poll", "event_input": ""});
    for _ in 0..1000 {
        let (status, _, body) = server
            .send(
                Method::POST,
                &format!("/v1/ai/{flow}/event"),
                Some(&poll),
                true,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        if body["next_actions"] != json!(["poll"]) {
            return body;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the task graph of {sid} did not finish");
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> &'a str {
    h.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

async fn folder_invokers_run_end_to_end_on(pool: Option<parlance_postgres::PgPool>, name: &str) {
    let (openai, chats) = fake_openai().await;
    let (endpoint, posts) = flaky_endpoint().await;
    let dir = flows_dir(name, openai, endpoint);
    let catalog = FlowCatalog::load_dir_with(&dir, &Invokers::is_builtin, &env).unwrap();
    let invokers = catalog.template_invokers("routed").unwrap();
    assert_eq!(invokers.kind_for("chat/answer.j2"), Some("openai"));
    assert_eq!(invokers.kind_for("hook/notify.j2"), Some("http"));
    assert_eq!(invokers.kind_for("echo.j2"), None, "the state's invoker");
    let (server, _worker) = start(pool, catalog).await;

    let (status, _, body) = server
        .send(Method::POST, "/v1/ai/routed/start_session", None, true)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["response"], "Ask me.");
    let sid = body["session_id"].as_str().unwrap().to_owned();
    let event = |event: &'static str, input: &'static str| json!({"session_id": sid, "event": event, "event_input": input});
    let question = "What is the capital of \"France\"?";
    let (status, _, body) = server
        .send(
            Method::POST,
            "/v1/ai/routed/event",
            Some(&event("user_input", question)),
            true,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["next_actions"], json!(["poll"]));
    let done = poll_done(&server, "routed", &sid).await;
    assert_eq!(done["error"], Value::Null, "{done}");
    assert_eq!(done["response"], "Saved: stored", "{done}");

    // The chat server got both chat templates, each on its folder's
    // settings, with the key from the named variable.
    let chats = chats.lock().unwrap().clone();
    assert_eq!(chats.len(), 2, "{chats:?}");
    let mut requests: Vec<(HeaderMap, Value)> = chats
        .into_iter()
        .map(|(h, b)| (h, serde_json::from_str(&b).unwrap()))
        .collect();
    requests.sort_by_key(|(_, b)| b["messages"].as_array().unwrap().len());
    let (h, strict) = &requests[0];
    assert_eq!(header(h, "authorization"), "Bearer sk-fake-key");
    assert_eq!(strict["model"], "gpt-test");
    assert_eq!(strict["temperature"], json!(0.0));
    assert_eq!(
        strict["messages"],
        json!([{"role": "user", "content": format!("Is this a question? {question}")}])
    );
    let (h, answer) = &requests[1];
    assert_eq!(header(h, "authorization"), "Bearer sk-fake-key");
    assert_eq!(answer["model"], "gpt-test");
    assert_eq!(answer["temperature"], json!(0.2), "{answer}");
    assert_eq!(
        answer["messages"],
        json!([
            {"role": "system", "content": "You answer in one word."},
            {"role": "user", "content": question},
        ])
    );

    // The endpoint got the combined result twice: its 500 was retried.
    let posts = posts.lock().unwrap().clone();
    assert_eq!(posts.len(), 2, "{posts:?}");
    assert_eq!(posts[0].1, posts[1].1);
    let (h, body) = &posts[1];
    assert_eq!(header(h, "content-type"), "application/json");
    assert_eq!(header(h, "x-hook-token"), "hook-secret");
    let posted: Value = serde_json::from_str(body).unwrap();
    assert_eq!(
        posted,
        json!({"answer": "Paris", "strict": "yes", "echo": format!("echo {question}")})
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn folder_invokers_run_end_to_end() {
    folder_invokers_run_end_to_end_on(None, "memory").await;
}

#[tokio::test]
async fn folder_invokers_run_end_to_end_on_postgres() {
    let Some(pool) = test_pool().await else {
        return;
    };
    folder_invokers_run_end_to_end_on(Some(pool), "postgres").await;
}

#[test]
fn meta_problems_are_load_problems_with_file_and_field() {
    let dir = std::env::temp_dir().join(format!("parlance-invokers-bad-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let flow = dir.join("bad");
    write(
        &flow,
        "flow.yaml",
        "name: bad\ninitial: a\nstates:\n  - {id: a, kind: user, template: a.j2}\n  \
         - {id: b, kind: invoker, template: chat/meta.yaml}\n\
         transitions:\n  - {event: go, from: a, to: b}\n  - {event: advance, from: b, to: a}\n",
    );
    write(&flow, "templates/a.j2", "A");
    write(
        &flow,
        "templates/chat/meta.yaml",
        "invoker: {type: openai, model: m, api_key_env: NOT_SET_FOR_THIS_TEST, timeout: soon}\n",
    );
    let err = FlowCatalog::load_dir_with(&dir, &Invokers::is_builtin, &env)
        .unwrap_err()
        .to_string();
    let meta = flow.join("templates/chat/meta.yaml");
    for expected in [
        format!(
            "{}: invoker.api_key_env: environment variable `NOT_SET_FOR_THIS_TEST` is not set",
            meta.display()
        ),
        format!("{}: invoker.timeout: bad duration `soon`", meta.display()),
        // A meta.yaml is configuration, never a template.
        format!(
            "{}: states[1].template: unknown template `chat/meta.yaml`",
            flow.join("flow.yaml").display()
        ),
    ] {
        assert!(err.contains(&expected), "missing {expected:?} in {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Stands in for Ollama: a JSON-mode request (the classifier) gets
/// `{"category": "billing"}`, any other the drafted answer.
async fn fake_ollama() -> (SocketAddr, Seen) {
    fake_chat(|req| {
        if req["response_format"]["type"] == "json_object" {
            r#"{"category": "billing"}"#
        } else {
            "We refunded the second charge."
        }
    })
    .await
}

/// A ticket service: files whatever is posted as ticket `T-42`.
async fn fake_tickets() -> (SocketAddr, Seen) {
    let seen: Seen = Arc::default();
    let record = seen.clone();
    let app = Router::new().route(
        "/tickets",
        post(move |headers: HeaderMap, body: String| {
            let record = record.clone();
            async move {
                record.lock().unwrap().push((headers, body));
                Json(json!({"id": "T-42"}))
            }
        }),
    );
    (listen(app).await, seen)
}

/// `examples/flows/triage` copied to a scratch folder, its `meta.yaml`
/// files pointed at the fake servers.
fn triage_dir(name: &str, ollama: SocketAddr, tickets: SocketAddr) -> PathBuf {
    let example = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/flows/triage");
    let dir = std::env::temp_dir().join(format!("parlance-triage-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut pending = vec![PathBuf::new()];
    while let Some(rel) = pending.pop() {
        for entry in std::fs::read_dir(example.join(&rel)).unwrap() {
            let entry = entry.unwrap();
            let rel = rel.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                pending.push(rel);
                continue;
            }
            let text = std::fs::read_to_string(entry.path())
                .unwrap()
                .replace("http://127.0.0.1:11434/v1", &format!("http://{ollama}/v1"))
                .replace(
                    "http://127.0.0.1:8790/tickets",
                    &format!("http://{tickets}/tickets"),
                );
            write(&dir.join("triage"), rel.to_str().unwrap(), &text);
        }
    }
    dir
}

/// The example flow that uses every declarative feature: seed data and the
/// user at start, validators of each kind, a hook that fails, a flow-wide
/// hook, state values, and templates on two chat invokers and an HTTP
/// invoker configured per folder.
async fn the_triage_example_runs_end_to_end_on(
    pool: Option<parlance_postgres::PgPool>,
    name: &str,
) {
    let (ollama, chats) = fake_ollama().await;
    let (tickets, filed) = fake_tickets().await;
    let dir = triage_dir(name, ollama, tickets);
    let catalog = FlowCatalog::load_dir_with(&dir, &Invokers::is_builtin, &env).unwrap();
    let (server, _worker) = start(pool, catalog).await;
    let post = |path: &'static str, body: Value| {
        let server = &server;
        async move {
            let (status, _, body) = server
                .send(
                    Method::POST,
                    &format!("/v1/ai/triage/{path}"),
                    Some(&body),
                    true,
                )
                .await;
            (status, body)
        }
    };

    let ada = json!({"email": "ada@example.com", "firstname": "Ada", "lastname": "Lovelace"});
    let (status, body) = post(
        "start_session",
        json!({"user_info": ada, "seed_data": r#"{"plan": "team"}"#}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["response"],
        "Hello Ada! You are on the team plan. Which email address should we answer to?"
    );
    let sid = body["session_id"].as_str().unwrap().to_owned();
    let model = |path: &'static str| {
        let (server, sid) = (&server, &sid);
        async move {
            let (status, _, body) = server
                .send(
                    Method::GET,
                    &format!("/v1/ai/triage/model/{sid}?path={path}"),
                    None,
                    true,
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{body}");
            serde_json::from_str::<Value>(body["response"].as_str().unwrap()).unwrap()
        }
    };
    let event = |event: &'static str, input: &'static str| {
        post(
            "event",
            json!({"session_id": sid, "event": event, "event_input": input}),
        )
    };
    let refused = |status: StatusCode, body: &Value, key: &str, value: &str| {
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert_eq!(body[key], value, "{body}");
    };

    // Validators refuse with their messages and change nothing.
    let before = model("%40").await;
    let (status, body) = event("user_input", "not an address").await;
    refused(status, &body, "validator", "email");
    assert_eq!(body["message"], "that does not look like an email address");
    assert_eq!(model("%40").await, before);
    let (status, body) = event("user_input", "ada@example.com").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = event("user_input", "too short").await;
    refused(status, &body, "validator", "description");

    // The task graph: the classifier, then the ticket, the answer and the
    // classification in parallel, each on its folder's invoker.
    let (status, body) = event("user_input", "I was charged twice this month.").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["next_actions"], json!(["poll"]));
    assert_eq!(body["progress"]["label"], "sorting your request");
    let done = poll_done(&server, "triage", &sid).await;
    assert_eq!(done["error"], Value::Null, "{done}");
    assert_eq!(
        done["response"],
        "We refunded the second charge.\n\nYour ticket is T-42 (billing). Rate this answer from 1 \
         to 5, send your order details as JSON, or escalate.",
        "{done}"
    );
    assert_eq!(done["next_actions"], json!(["order", "rate", "escalate"]));

    let chats = chats.lock().unwrap().clone();
    assert_eq!(chats.len(), 2, "{chats:?}");
    let classify: Value = serde_json::from_str(&chats[0].1).unwrap();
    assert_eq!(classify["model"], "llama3.2");
    assert_eq!(classify["temperature"], json!(0.0));
    assert_eq!(classify["response_format"]["type"], "json_object");
    assert_eq!(classify["messages"][0]["role"], "system");
    assert_eq!(
        classify["messages"][1],
        json!({"role": "user", "content": "I was charged twice this month."})
    );
    let reply: Value = serde_json::from_str(&chats[1].1).unwrap();
    assert_eq!(reply["temperature"], json!(0.2));
    let system = reply["messages"][0]["content"].as_str().unwrap();
    assert!(
        system.contains("a team customer") && system.contains("sorted as billing"),
        "{system}"
    );
    let filed = filed.lock().unwrap().clone();
    assert_eq!(filed.len(), 1, "{filed:?}");
    assert_eq!(header(&filed[0].0, "content-type"), "application/json");
    let ticket: Value = serde_json::from_str(&filed[0].1).unwrap();
    assert_eq!(
        ticket,
        json!({"email": "ada@example.com", "plan": "team", "category": "billing",
               "text": "I was charged twice this month."})
    );

    // A JSON Schema validator, then an internal transition that assigns.
    let (status, body) = event("order", r#"{"order_id": 1234}"#).await;
    refused(status, &body, "validator", "order");
    let (status, body) = event("order", r#"{"order_id": "NL-1234"}"#).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // The hook refuses escalation on this plan, and nothing changes.
    let before = model("%40").await;
    let (status, body) = event("escalate", "").await;
    refused(status, &body, "hook", "transitions[6].before[0]");
    assert_eq!(
        body["message"],
        "escalation is for the pro plan; rate the answer instead"
    );
    assert_eq!(model("%40").await, before);

    let (status, body) = event("rate", "9").await;
    refused(status, &body, "validator", "rating");
    let (status, body) = event("rate", "5").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["response"], "Thank you, Ada. Ticket T-42 is closed.");

    let summary =
        model("%7Bstate%3A%20state%2C%20name%3A%20state_name%2C%20model%3A%20model%7D").await;
    let keys: Vec<&String> = summary.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["state", "name", "model"], "the hash's own order");
    assert_eq!(
        summary,
        json!({"state": 50, "name": "closed", "model": {
            "name": "Ada", "email": "ada@example.com", "plan": "team", "category": "billing",
            "reply": "We refunded the second charge.",
            "description": "I was charged twice this month.", "ticket": "T-42", "order_id": "NL-1234",
            "rating": 5, "escalated": false, "turns": 5,
        }})
    );
    let (status, sessions) = post("user_sessions", ada.clone()).await;
    assert_eq!(status, StatusCode::OK, "{sessions}");
    assert_eq!(sessions, json!([sid]));

    // A pro plan from the seed alone, no user: escalation goes through, and
    // its `after` hook marks it.
    let (status, body) = post("start_session", json!({"seed_data": r#"{"plan": "pro"}"#})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["response"],
        "Hello! You are on the pro plan. Which email address should we answer to?"
    );
    let pro = body["session_id"].as_str().unwrap().to_owned();
    for input in ["bob@example.com", "The export button does nothing."] {
        let (status, body) = post(
            "event",
            json!({"session_id": pro, "event": "user_input", "event_input": input}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let done = poll_done(&server, "triage", &pro).await;
    assert_eq!(
        done["next_actions"],
        json!(["order", "rate", "escalate"]),
        "{done}"
    );
    let (status, body) = post(
        "event",
        json!({"session_id": pro, "event": "escalate", "event_input": ""}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["response"],
        "Thank you. Ticket T-42 is with a person now."
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn the_triage_example_runs_end_to_end() {
    the_triage_example_runs_end_to_end_on(None, "memory").await;
}

#[tokio::test]
async fn the_triage_example_runs_end_to_end_on_postgres() {
    let Some(pool) = test_pool().await else {
        return;
    };
    the_triage_example_runs_end_to_end_on(Some(pool), "postgres").await;
}
