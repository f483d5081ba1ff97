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

/// An OpenAI-compatible chat endpoint: answers `Paris` to a request with a
/// system message, `yes` to any other.
async fn fake_openai() -> (SocketAddr, Seen) {
    let seen: Seen = Arc::default();
    let record = seen.clone();
    let app = Router::new().route(
        "/v1/chat/completions",
        post(move |headers: HeaderMap, body: String| {
            let record = record.clone();
            async move {
                let req: Value = serde_json::from_str(&body).unwrap();
                record.lock().unwrap().push((headers, body));
                let answer = if req["messages"][0]["role"] == "system" {
                    "Paris"
                } else {
                    "yes"
                };
                Json(json!({
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "model": req["model"],
                    "choices": [{
                        "index": 0,
                        "message": {"role": "assistant", "content": answer},
                        "finish_reason": "stop",
                    }],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
                }))
            }
        }),
    );
    (listen(app).await, seen)
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
    let mut done = Value::Null;
    for _ in 0..1000 {
        let (status, _, body) = server
            .send(
                Method::POST,
                "/v1/ai/routed/event",
                Some(&event("poll", "")),
                true,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        if body["next_actions"] != json!(["poll"]) {
            done = body;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
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
