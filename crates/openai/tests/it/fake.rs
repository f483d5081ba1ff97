//! A local OpenAI-compatible server on 127.0.0.1 whose answers each test
//! scripts: whole JSON answers, SSE streams, failure statuses with
//! `Retry-After`, malformed bodies and slow answers.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use axum::routing::post;
use parlance_ports::{
    CompletionRequest, Message, ResponseFormat, Role, ToolCall, ToolChoice, ToolDefinition,
};
use parlance_testkit::llm::Scripted;
use serde_json::{Value, json};

/// The model name the fake server reports.
pub(crate) const FAKE_MODEL: &str = "fake-model-1";

/// One scripted answer of the server.
pub(crate) enum Step {
    /// A portable answer: JSON, or SSE when the request asked to stream.
    Scripted(Scripted),
    /// Exactly this status, content type and body.
    Raw {
        status: u16,
        content_type: &'static str,
        body: String,
    },
    /// The inner step after a delay.
    Slow(Duration, Box<Step>),
    /// An event stream sent piece by piece, each after its delay.
    Sse(Vec<(Duration, String)>),
}

#[derive(Default)]
struct Shared {
    steps: Mutex<VecDeque<Step>>,
    bodies: Mutex<Vec<Value>>,
    headers: Mutex<Vec<HeaderMap>>,
}

/// The running server.
pub(crate) struct FakeServer {
    pub(crate) addr: SocketAddr,
    shared: Arc<Shared>,
}

impl FakeServer {
    /// Binds port 0 on 127.0.0.1 and serves in the background.
    pub(crate) async fn start() -> Self {
        let shared = Arc::new(Shared::default());
        let app = Router::new()
            .route("/v1/chat/completions", post(chat))
            .route("/v1/embeddings", post(embeddings))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self { addr, shared }
    }

    /// `http://127.0.0.1:<port>/v1`.
    pub(crate) fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Queues an answer.
    pub(crate) fn push(&self, step: Step) {
        self.shared.steps.lock().unwrap().push_back(step);
    }

    /// Request bodies received, oldest first.
    pub(crate) fn bodies(&self) -> Vec<Value> {
        self.shared.bodies.lock().unwrap().clone()
    }

    /// Request headers received, oldest first.
    pub(crate) fn headers(&self) -> Vec<HeaderMap> {
        self.shared.headers.lock().unwrap().clone()
    }

    /// How many requests arrived.
    pub(crate) fn hits(&self) -> usize {
        self.shared.bodies.lock().unwrap().len()
    }
}

fn record(shared: &Shared, headers: HeaderMap, body: &Bytes) -> Value {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    shared.bodies.lock().unwrap().push(v.clone());
    shared.headers.lock().unwrap().push(headers);
    v
}

async fn chat(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let req = record(&shared, headers, &body);
    let step = shared.steps.lock().unwrap().pop_front();
    match step {
        Some(step) => render(step, req["stream"] == json!(true)).await,
        None => raw(
            500,
            "application/json",
            r#"{"error":{"message":"nothing scripted"}}"#.into(),
        ),
    }
}

async fn embeddings(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let req = record(&shared, headers, &body);
    let step = shared.steps.lock().unwrap().pop_front();
    if let Some(step) = step {
        return render(step, false).await;
    }
    // Unscripted: one vector per input, made from the text alone
    // ([characters, first character's code, 1.0]), listed in reverse order to
    // check that clients sort by index.
    let inputs = req["input"].as_array().cloned().unwrap_or_default();
    let mut data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let t = t.as_str().unwrap_or("");
            let first = t.chars().next().map_or(0, u32::from);
            json!({"object": "embedding", "index": i,
                   "embedding": [t.chars().count() as f64, f64::from(first), 1.0]})
        })
        .collect();
    data.reverse();
    let body = json!({
        "object": "list",
        "model": req["model"],
        "data": data,
        "usage": {"prompt_tokens": inputs.len() * 2, "total_tokens": inputs.len() * 2}
    });
    raw(200, "application/json", body.to_string())
}

fn raw(status: u16, content_type: &'static str, body: String) -> Response {
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap())
        .header(header::CONTENT_TYPE, content_type)
        .body(Body::from(body))
        .unwrap()
}

fn render(step: Step, stream: bool) -> std::pin::Pin<Box<dyn Future<Output = Response> + Send>> {
    Box::pin(async move {
        match step {
            Step::Raw {
                status,
                content_type,
                body,
            } => raw(status, content_type, body),
            Step::Slow(delay, inner) => {
                tokio::time::sleep(delay).await;
                render(*inner, stream).await
            }
            Step::Sse(pieces) => sse(pieces),
            Step::Scripted(Scripted::Status {
                status,
                retry_after,
                message,
            }) => {
                let mut res = raw(
                    status,
                    "application/json",
                    json!({"error": {"message": message, "type": "scripted", "code": status}})
                        .to_string(),
                );
                if let Some(wait) = retry_after {
                    res.headers_mut().insert(
                        header::RETRY_AFTER,
                        wait.as_secs().to_string().parse().unwrap(),
                    );
                }
                res
            }
            Step::Scripted(Scripted::Answer {
                content,
                tool_calls,
                usage,
            }) => {
                let calls: Vec<(String, String, String)> = tool_calls
                    .iter()
                    .enumerate()
                    .map(|(i, (name, args))| (format!("call_{i}"), name.clone(), args.to_string()))
                    .collect();
                let finish = if calls.is_empty() {
                    "stop"
                } else {
                    "tool_calls"
                };
                let usage = json!({
                    "prompt_tokens": usage.prompt_tokens,
                    "completion_tokens": usage.completion_tokens,
                    "total_tokens": usage.total_tokens
                });
                if stream {
                    sse(stream_events(&content, &calls, finish, usage)
                        .into_iter()
                        .map(|e| (Duration::ZERO, e))
                        .collect())
                } else {
                    let tool_calls: Vec<Value> = calls
                        .iter()
                        .map(|(id, name, args)| {
                            json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}})
                        })
                        .collect();
                    let mut message = json!({"role": "assistant", "content": content});
                    if content.is_empty() {
                        message["content"] = Value::Null;
                    }
                    if !tool_calls.is_empty() {
                        message["tool_calls"] = Value::Array(tool_calls);
                    }
                    let body = json!({
                        "id": "chatcmpl-fake",
                        "object": "chat.completion",
                        "model": FAKE_MODEL,
                        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                        "usage": usage
                    });
                    raw(200, "application/json", body.to_string())
                }
            }
        }
    })
}

/// The SSE events of an answer: role, words of text, each tool call split in
/// pieces, the finish reason, usage, `[DONE]`.
pub(crate) fn stream_events(
    content: &str,
    calls: &[(String, String, String)],
    finish: &str,
    usage: Value,
) -> Vec<String> {
    let chunk = |choices: Value, usage: Value| {
        let body = json!({
            "id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": FAKE_MODEL,
            "choices": choices, "usage": usage
        });
        format!("data: {body}\n\n")
    };
    let delta = |d: Value| json!([{"index": 0, "delta": d, "finish_reason": null}]);
    let mut out = vec![chunk(
        delta(json!({"role": "assistant", "content": ""})),
        Value::Null,
    )];
    for word in content.split_inclusive(' ') {
        out.push(chunk(delta(json!({"content": word})), Value::Null));
    }
    for (i, (id, name, args)) in calls.iter().enumerate() {
        let mid = args
            .char_indices()
            .nth(args.chars().count() / 2)
            .map_or(0, |(b, _)| b);
        out.push(chunk(
            delta(
                json!({"tool_calls": [{"index": i, "id": id, "type": "function",
                "function": {"name": name, "arguments": &args[..mid]}}]}),
            ),
            Value::Null,
        ));
        out.push(chunk(
            delta(json!({"tool_calls": [{"index": i, "function": {"arguments": &args[mid..]}}]})),
            Value::Null,
        ));
    }
    out.push(chunk(
        json!([{"index": 0, "delta": {}, "finish_reason": finish}]),
        Value::Null,
    ));
    out.push(chunk(json!([]), usage));
    out.push("data: [DONE]\n\n".to_owned());
    out
}

fn sse(pieces: Vec<(Duration, String)>) -> Response {
    let stream = futures_util::stream::unfold(pieces.into_iter(), |mut it| async move {
        let (delay, text) = it.next()?;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        Some((Ok::<_, Infallible>(Bytes::from(text)), it))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap()
}

/// Reads an OpenAI request body back into port types (independently of the
/// adapter's encoder, so the two check each other).
pub(crate) fn decode_request(body: &Value) -> CompletionRequest {
    let messages = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let role = match m["role"].as_str().unwrap() {
                "system" => Role::System,
                "user" => Role::User,
                "assistant" => Role::Assistant,
                "tool" => Role::Tool,
                other => panic!("unknown role {other}"),
            };
            let tool_calls = m["tool_calls"]
                .as_array()
                .map(|calls| {
                    calls
                        .iter()
                        .map(|c| {
                            assert_eq!(c["type"], "function");
                            ToolCall {
                                id: c["id"].as_str().unwrap().to_owned(),
                                name: c["function"]["name"].as_str().unwrap().to_owned(),
                                arguments: c["function"]["arguments"].as_str().unwrap().to_owned(),
                            }
                        })
                        .collect()
                })
                .unwrap_or_default();
            Message {
                role,
                content: m["content"].as_str().unwrap_or("").to_owned(),
                tool_calls,
                tool_call_id: m["tool_call_id"].as_str().map(str::to_owned),
            }
        })
        .collect();
    let response_format = match body.get("response_format") {
        None => ResponseFormat::Text,
        Some(f) => match f["type"].as_str().unwrap() {
            "text" => ResponseFormat::Text,
            "json_object" => ResponseFormat::JsonObject,
            "json_schema" => ResponseFormat::JsonSchema {
                name: f["json_schema"]["name"].as_str().unwrap().to_owned(),
                schema: f["json_schema"]["schema"].clone(),
                strict: f["json_schema"]["strict"].as_bool().unwrap_or(false),
            },
            other => panic!("unknown response format {other}"),
        },
    };
    let tools = body["tools"]
        .as_array()
        .map(|ts| {
            ts.iter()
                .map(|t| {
                    assert_eq!(t["type"], "function");
                    ToolDefinition {
                        name: t["function"]["name"].as_str().unwrap().to_owned(),
                        description: t["function"]["description"]
                            .as_str()
                            .unwrap_or("")
                            .to_owned(),
                        parameters: t["function"]["parameters"].clone(),
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    let tool_choice = body.get("tool_choice").map(|c| match c {
        Value::String(s) if s == "auto" => ToolChoice::Auto,
        Value::String(s) if s == "none" => ToolChoice::None,
        Value::String(s) if s == "required" => ToolChoice::Required,
        other => ToolChoice::Function(other["function"]["name"].as_str().unwrap().to_owned()),
    });
    CompletionRequest {
        model: body["model"].as_str().map(str::to_owned),
        messages,
        temperature: body["temperature"].as_f64().map(|t| t as f32),
        max_tokens: body["max_tokens"].as_u64().map(|n| n as u32),
        response_format,
        tools,
        tool_choice,
        prompt_name: None,
        deadline: None,
    }
}
