//! The documented scale-out set-up, as an operator starts it: one
//! configuration file, a PostgreSQL-backed `parlance serve` without a worker
//! and a separate `parlance worker`. The worker must run with everything
//! the file configures: the model (a local OpenAI-compatible server), the
//! webhook channel (a local receiver) and the flows.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::routing::post;
use parlance_postgres::testing::test_pool;
use serde_json::{Value, json};

use crate::load::free_port;
use crate::support::{url_for, wait_until};

/// What a local server received: each request's headers and JSON body.
type Received = Arc<Mutex<Vec<(HeaderMap, Value)>>>;
/// What the webhook received: each delivery's headers and body as sent.
type Deliveries = Arc<Mutex<Vec<(HeaderMap, Bytes)>>>;

const MODEL_KEY: &str = "sk-scale-out-test";
const WEBHOOK_SECRET: &str = "whsec-scale-out-test";
const SERVICE_KEY: &str = "pk_scale_out";

/// An OpenAI-compatible chat endpoint: a request offering tools gets a
/// `send_message` call, any other gets a plain answer.
async fn fake_model() -> (SocketAddr, Received) {
    let got: Received = Arc::default();
    let sink = got.clone();
    let app = Router::new().route(
        "/v1/chat/completions",
        post(move |headers: HeaderMap, body: Bytes| {
            let sink = sink.clone();
            async move {
                let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let wants_tool = request.get("tools").is_some();
                sink.lock().unwrap().push((headers, request));
                let message = if wants_tool {
                    json!({"role": "assistant", "content": null, "tool_calls": [{
                        "id": "call-1", "type": "function",
                        "function": {"name": "send_message",
                                     "arguments": "{\"text\":\"Hello from the configured model\"}"}
                    }]})
                } else {
                    json!({"role": "assistant", "content": "the configured model answers"})
                };
                axum::Json(json!({
                    "id": "chatcmpl-1", "object": "chat.completion", "model": "fake-model",
                    "choices": [{"index": 0, "message": message,
                                 "finish_reason": if wants_tool { "tool_calls" } else { "stop" }}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
                }))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, got)
}

/// A webhook receiver that accepts every delivery.
async fn webhook() -> (String, Deliveries) {
    let got: Deliveries = Arc::default();
    let sink = got.clone();
    let app = Router::new().route(
        "/outbound",
        post(move |headers: HeaderMap, body: Bytes| {
            let sink = sink.clone();
            async move {
                sink.lock().unwrap().push((headers, body));
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/outbound", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, got)
}

/// A `parlance` process, killed when dropped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn parlance(command: &str, config: &PathBuf, url: &str) -> Process {
    Process(
        Command::new(env!("CARGO_BIN_EXE_parlance"))
            .args([command, "--config"])
            .arg(config)
            // The file names the variables that hold the secrets.
            .env("SCALE_OUT_MODEL_KEY", MODEL_KEY)
            .env("SCALE_OUT_WEBHOOK_SECRET", WEBHOOK_SECRET)
            .env("PARLANCE_API_KEY", SERVICE_KEY)
            .env("DATABASE_URL", url)
            .env("RUST_LOG", "warn")
            .env_remove("PARLANCE_LLM_BASE_URL")
            .env_remove("PARLANCE_FLOWS")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start parlance {command}: {e}")),
    )
}

async fn call(port: u16, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
    let client = reqwest::Client::new();
    let mut req = client
        .request(method, format!("http://127.0.0.1:{port}{path}"))
        .bearer_auth(SERVICE_KEY);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let res = req.send().await.unwrap();
    let status = res.status();
    let body: Value = res.json().await.unwrap_or(Value::Null);
    assert!(status.is_success(), "{path}: {status} {body}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_separate_worker_runs_with_everything_the_file_configures() {
    let Some(pool) = test_pool().await else {
        return;
    };
    let url = url_for(&pool);
    let (model, model_calls) = fake_model().await;
    let (hook, deliveries) = webhook().await;
    let port = free_port();
    let flows = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/flows");
    let dir = std::env::temp_dir().join(format!("parlance-scale-out-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("parlance.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nbind = \"127.0.0.1:{port}\"\nembedded_worker = false\n\n\
             [database]\nurl = \"{url}\"\n\n\
             [llm]\nbase_url = \"http://{model}/v1\"\nmodel = \"fake-model\"\n\
             api_key_env = \"SCALE_OUT_MODEL_KEY\"\ntimeout_secs = 10\n\n\
             [flows]\ndir = \"{}\"\n\n\
             [channel]\nwebhook_url = \"{hook}\"\nwebhook_secret_env = \"SCALE_OUT_WEBHOOK_SECRET\"\n\n\
             [worker]\nheartbeat_ms = 200\nsweep_ms = 250\n",
            flows.display()
        ),
    )
    .unwrap();
    let _serve = parlance("serve", &config, &url);
    wait_until(
        "serve to be ready",
        Duration::from_secs(60),
        || async move {
            reqwest::get(format!("http://127.0.0.1:{port}/readyz"))
                .await
                .is_ok_and(|r| r.status().is_success())
        },
    )
    .await;

    // Work enqueued while no worker runs waits on the queue.
    let started = call(port, reqwest::Method::POST, "/v1/ai/qa/start_session", None).await;
    let sid = started["session_id"].as_str().unwrap().to_owned();
    let asked = call(
        port,
        reqwest::Method::POST,
        "/v1/ai/qa/event",
        Some(json!({"session_id": sid, "event": "user_input", "event_input": "What is Parlance?"})),
    )
    .await;
    assert_eq!(asked["next_actions"], json!(["poll"]));
    let created = call(
        port,
        reqwest::Method::POST,
        "/v1/products/default/conversations",
        Some(json!({"contact_id": "+15550123", "objective": "book a demo"})),
    )
    .await;
    let conversation = created["conversation"]["instance_id"]
        .as_str()
        .unwrap()
        .to_owned();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        model_calls.lock().unwrap().is_empty(),
        "`serve` without a worker ran a task"
    );

    let _worker = parlance("worker", &config, &url);
    wait_until(
        "the worker's delivery to reach the webhook",
        Duration::from_secs(60),
        || {
            let deliveries = deliveries.clone();
            async move { !deliveries.lock().unwrap().is_empty() }
        },
    )
    .await;
    let flow_done = || {
        let sid = sid.clone();
        async move {
            let polled = reqwest::Client::new()
                .post(format!("http://127.0.0.1:{port}/v1/ai/qa/event"))
                .bearer_auth(SERVICE_KEY)
                .json(&json!({"session_id": sid, "event": "poll", "event_input": ""}))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap();
            polled["next_actions"] != json!(["poll"])
        }
    };
    wait_until(
        "the flow's llm invoker to finish",
        Duration::from_secs(60),
        flow_done,
    )
    .await;

    // The conversation's agent turn asked the configured model, with the
    // key from the variable the file names; the channel is the webhook.
    let calls = model_calls.lock().unwrap().clone();
    let turn = calls
        .iter()
        .find(|(_, body)| body.get("tools").is_some())
        .expect("the agent turn called the configured model");
    assert_eq!(turn.0["authorization"], format!("Bearer {MODEL_KEY}"));
    assert_eq!(turn.1["model"], "fake-model");
    let (headers, body) = deliveries.lock().unwrap()[0].clone();
    let delivered: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(delivered["text"], "Hello from the configured model");
    assert_eq!(delivered["instance_id"], conversation);
    // The secret has no `whsec_` prefix, so its bytes are the key.
    standardwebhooks::Webhook::from_bytes(WEBHOOK_SECRET.as_bytes().to_vec())
        .unwrap()
        .verify(&body, &headers)
        .expect("the delivery is signed with the configured secret");
    // The flow's `llm` invoker asked the same model with the rendered
    // template, and its answer reached the session.
    let invoker = calls
        .iter()
        .find(|(_, body)| body.get("tools").is_none())
        .expect("the flow's llm invoker called the configured model");
    assert!(
        invoker
            .1
            .to_string()
            .contains("Question: What is Parlance?"),
        "{}",
        invoker.1
    );
    let model_view = call(
        port,
        reqwest::Method::GET,
        &format!("/v1/ai/qa/model/{sid}"),
        None,
    )
    .await;
    let session: Value = serde_json::from_str(model_view["response"].as_str().unwrap()).unwrap();
    assert!(
        session["dialogue"]
            .to_string()
            .contains("the configured model answers"),
        "{session}"
    );
    let conv = call(
        port,
        reqwest::Method::GET,
        &format!("/v1/products/default/conversations/{conversation}"),
        None,
    )
    .await;
    assert_eq!(conv["conversation"]["state"], "WAITING_FOR_REPLY");
    let _ = std::fs::remove_dir_all(&dir);
}
