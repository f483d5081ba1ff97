//! Contract suite for [`LlmClient`] adapters.
//!
//! An adapter is tested through an [`LlmFixture`]: its client, a way to
//! script what the backend answers next, and what the backend received, as
//! port types (the offline client records requests; an HTTP adapter's fake
//! server decodes the wire body). Run it with
//! `parlance_testkit::llm_client_suite!(async { Some(fixture) });`.
//! Clients under test must not retry: each scripted answer is used once.

use std::sync::Arc;
use std::time::Duration;

use parlance_core::parse_structured;
use parlance_ports::{
    ChunkAccumulator, CompletionRequest, FinishReason, LlmClient, LlmError, Message,
    ResponseFormat, Role, ToolCall, ToolChoice, ToolDefinition, Usage,
};
use serde_json::{Value, json};

/// Runs every case of this suite against the fixture the factory builds.
///
/// See how [the in-memory adapters](https://github.com/parlance-rs/parlance/blob/main/crates/memory/tests/it/main.rs) and [the OpenAI-compatible client](https://github.com/parlance-rs/parlance/blob/main/crates/openai/tests/it/contract.rs) run it.
///
/// ```
/// # use std::sync::Arc;
/// use parlance_memory::{OfflineLlm, Reply};
/// use parlance_ports::{CompletionRequest, LlmClient, LlmError};
/// use parlance_testkit::llm::{LlmFixture, Scripted, Subject};
///
/// /// The offline client, scripted one reply at a time.
/// struct Offline(Arc<OfflineLlm>);
///
/// impl LlmFixture for Offline {
///     fn client(&self) -> Arc<dyn LlmClient> {
///         self.0.clone()
///     }
///
///     fn script(&self, answer: Scripted) {
///         self.0.push_reply(match answer {
///             Scripted::Answer { content, tool_calls, usage } => {
///                 Reply::Answer { content, tool_calls, usage: Some(usage) }
///             }
///             Scripted::Status { status, retry_after, message } => {
///                 Reply::Error(LlmError::from_status(status, retry_after, &message))
///             }
///         });
///     }
///
///     fn received(&self) -> Vec<CompletionRequest> {
///         self.0.received()
///     }
/// }
///
/// fn subject() -> Subject {
///     Arc::new(Offline(Arc::new(OfflineLlm::new())))
/// }
///
/// // In the adapter's `tests/it/main.rs`, one `#[tokio::test]` per case:
/// mod llm {
///     parlance_testkit::llm_client_suite!(async { Some(super::subject()) });
/// }
///
/// // What some of those tests run:
/// #[tokio::main]
/// async fn main() {
///     use parlance_testkit::llm::*;
///
///     text_answer_reports_usage(subject()).await;
///     tool_calls_come_back_and_results_go_out(subject()).await;
///     errors_are_classified(subject()).await;
///     streaming_adds_up_to_the_answer(subject()).await;
/// }
/// ```
#[macro_export]
macro_rules! llm_client_suite {
    ($factory:expr) => {
        $crate::contract_tests! {
            factory = $factory;
            suite = $crate::llm;
            cases = [
                text_answer_reports_usage,
                request_shape_reaches_the_backend,
                json_schema_mode_round_trips,
                json_object_mode_is_requested,
                tool_calls_come_back_and_results_go_out,
                errors_are_classified,
                streaming_adds_up_to_the_answer,
                streaming_carries_tool_calls,
                streaming_errors_are_classified,
            ]
        }
    };
}

/// What the backend answers next.
#[derive(Debug, Clone, PartialEq)]
pub enum Scripted {
    /// An answer with text, tool calls (`(name, arguments)`) and usage.
    Answer {
        /// The text.
        content: String,
        /// Calls of offered tools.
        tool_calls: Vec<(String, Value)>,
        /// Tokens the backend reports.
        usage: Usage,
    },
    /// An HTTP failure status with an optional `Retry-After`.
    Status {
        /// The status code.
        status: u16,
        /// The wait asked for.
        retry_after: Option<Duration>,
        /// The error message.
        message: String,
    },
}

impl Scripted {
    /// A text answer.
    pub fn text(content: &str, usage: Usage) -> Self {
        Scripted::Answer {
            content: content.to_owned(),
            tool_calls: Vec::new(),
            usage,
        }
    }

    /// A failure status.
    pub fn status(status: u16, retry_after: Option<Duration>) -> Self {
        Scripted::Status {
            status,
            retry_after,
            message: format!("scripted failure {status}"),
        }
    }
}

/// An adapter with a scriptable backend.
pub trait LlmFixture: Send + Sync + 'static {
    /// The client under test (configured not to retry).
    fn client(&self) -> Arc<dyn LlmClient>;
    /// Queues the backend's next answer.
    fn script(&self, answer: Scripted);
    /// Every request the backend received, oldest first.
    fn received(&self) -> Vec<CompletionRequest>;
}

/// The subject of this suite.
pub type Subject = Arc<dyn LlmFixture>;

fn last_received(f: &Subject) -> CompletionRequest {
    f.received().pop().expect("the backend received a request")
}

fn tools() -> Vec<ToolDefinition> {
    vec![
        ToolDefinition {
            name: "send_message".into(),
            description: "Send a message to the contact.".into(),
            parameters: json!({
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
                "additionalProperties": false
            }),
        },
        ToolDefinition {
            name: "request_human".into(),
            description: "Hand the conversation to a human.".into(),
            parameters: json!({
                "type": "object",
                "properties": {"reason": {"type": "string"}},
                "required": ["reason"]
            }),
        },
    ]
}

/// A text answer comes back with its finish reason, model and usage.
pub async fn text_answer_reports_usage(f: Subject) {
    f.script(Scripted::text("Hello there.", Usage::new(12, 3)));
    let req = CompletionRequest::new(vec![Message::system("Be brief."), Message::user("Hi")]);
    let r = f.client().complete(&req).await.expect("complete");
    assert_eq!(r.content, "Hello there.");
    assert!(r.tool_calls.is_empty());
    assert_eq!(r.finish_reason, FinishReason::Stop);
    assert!(!r.model.is_empty());
    assert_eq!(
        r.usage,
        Some(Usage {
            prompt_tokens: 12,
            completion_tokens: 3,
            total_tokens: 15
        })
    );
}

/// Every message role, the sampling options and the tools reach the backend
/// unchanged.
pub async fn request_shape_reaches_the_backend(f: Subject) {
    f.script(Scripted::text("ok", Usage::new(1, 1)));
    let call = ToolCall {
        id: "call_a".into(),
        name: "send_message".into(),
        arguments: r#"{"text":"earlier"}"#.into(),
    };
    let mut req = CompletionRequest::new(vec![
        Message::system("You are the agent."),
        Message::user("Objective: book a demo. Naïve ✓ text\nwith two lines."),
        Message::assistant_tool_calls(vec![call]),
        Message::tool("call_a", r#"{"delivered":true}"#),
        Message::assistant("Sent."),
        Message::user("And now?"),
    ])
    .with_temperature(0.25)
    .with_max_tokens(128)
    .with_tools(tools());
    req.tool_choice = Some(ToolChoice::Function("send_message".into()));
    f.client().complete(&req).await.expect("complete");
    let got = last_received(&f);
    assert_eq!(got.messages, req.messages);
    assert_eq!(
        got.messages.iter().map(|m| m.role).collect::<Vec<_>>(),
        [
            Role::System,
            Role::User,
            Role::Assistant,
            Role::Tool,
            Role::Assistant,
            Role::User
        ]
    );
    assert_eq!(got.temperature, Some(0.25));
    assert_eq!(got.max_tokens, Some(128));
    assert_eq!(got.tools, req.tools);
    assert_eq!(got.tool_choice, req.tool_choice);
    assert_eq!(got.response_format, ResponseFormat::Text);
    let model = got
        .model
        .unwrap_or_else(|| f.client().default_model().to_owned());
    assert_eq!(model, f.client().default_model());
}

/// A JSON-schema request carries its schema; a fenced answer still parses
/// against it.
pub async fn json_schema_mode_round_trips(f: Subject) {
    let schema = json!({
        "type": "object",
        "properties": {
            "journey_state": {"type": "string", "enum": ["onboarding", "onboarded"]},
            "mastery_rating": {"type": "integer", "minimum": 0, "maximum": 10}
        },
        "required": ["journey_state", "mastery_rating"],
        "additionalProperties": false
    });
    f.script(Scripted::text(
        "Here is my judgement:\n```json\n{\"journey_state\": \"onboarded\", \"mastery_rating\": 6}\n```",
        Usage::new(40, 20),
    ));
    let req = CompletionRequest::new(vec![Message::user("Judge this user.")])
        .with_json_schema("adoption_judge", schema.clone());
    let r = f.client().complete(&req).await.expect("complete");
    let got = last_received(&f);
    assert_eq!(
        got.response_format,
        ResponseFormat::JsonSchema {
            name: "adoption_judge".into(),
            schema: schema.clone(),
            strict: true
        }
    );
    let v: Value = parse_structured(&r.content, &schema).expect("structured answer");
    assert_eq!(
        v,
        json!({"journey_state": "onboarded", "mastery_rating": 6})
    );
}

/// JSON-object mode is asked for as such.
pub async fn json_object_mode_is_requested(f: Subject) {
    f.script(Scripted::text(r#"{"ok": true}"#, Usage::new(5, 4)));
    let req = CompletionRequest::new(vec![Message::user("Answer in JSON.")])
        .with_response_format(ResponseFormat::JsonObject);
    let r = f.client().complete(&req).await.expect("complete");
    assert_eq!(
        last_received(&f).response_format,
        ResponseFormat::JsonObject
    );
    assert_eq!(
        serde_json::from_str::<Value>(&r.content).expect("json"),
        json!({"ok": true})
    );
}

/// A scripted tool call comes back with an id, the function name and JSON
/// arguments; its result goes back quoting that id.
pub async fn tool_calls_come_back_and_results_go_out(f: Subject) {
    f.script(Scripted::Answer {
        content: String::new(),
        tool_calls: vec![("send_message".into(), json!({"text": "Hi Ana!"}))],
        usage: Usage::new(30, 8),
    });
    let req = CompletionRequest::new(vec![
        Message::system("Pick one tool."),
        Message::user("Contact replied: hello"),
    ])
    .with_tools(tools());
    let r = f.client().complete(&req).await.expect("complete");
    assert_eq!(r.finish_reason, FinishReason::ToolCalls);
    assert_eq!(r.tool_calls.len(), 1);
    let call = r.tool_calls[0].clone();
    assert_eq!(call.name, "send_message");
    assert!(!call.id.is_empty());
    let args: Value = serde_json::from_str(&call.arguments).expect("arguments are json");
    assert_eq!(args, json!({"text": "Hi Ana!"}));
    assert_eq!(last_received(&f).tools, tools());

    f.script(Scripted::text("Done.", Usage::new(40, 2)));
    let mut follow = req.messages.clone();
    follow.push(Message::assistant_tool_calls(vec![call.clone()]));
    follow.push(Message::tool(call.id.clone(), r#"{"delivered":true}"#));
    let next = CompletionRequest::new(follow.clone()).with_tools(tools());
    let r = f.client().complete(&next).await.expect("complete");
    assert_eq!(r.content, "Done.");
    let got = last_received(&f);
    assert_eq!(got.messages, follow);
    assert_eq!(
        got.messages[3].tool_call_id.as_deref(),
        Some(call.id.as_str())
    );
}

/// Failures arrive classified: 429 with its wait, 5xx unavailable, other 4xx
/// invalid with the status.
pub async fn errors_are_classified(f: Subject) {
    let req = CompletionRequest::new(vec![Message::user("Hi")]);
    f.script(Scripted::status(429, Some(Duration::from_secs(2))));
    assert_eq!(
        f.client().complete(&req).await.expect_err("429"),
        LlmError::RateLimited {
            retry_after: Some(Duration::from_secs(2))
        }
    );
    f.script(Scripted::status(429, None));
    assert_eq!(
        f.client().complete(&req).await.expect_err("429"),
        LlmError::RateLimited { retry_after: None }
    );
    for status in [500, 502, 503] {
        f.script(Scripted::status(status, None));
        let e = f.client().complete(&req).await.expect_err("5xx");
        assert!(matches!(e, LlmError::Unavailable { .. }), "{status}: {e:?}");
        assert!(e.is_retryable());
    }
    for status in [400, 401, 404, 422] {
        f.script(Scripted::status(status, None));
        let e = f.client().complete(&req).await.expect_err("4xx");
        match e {
            LlmError::Invalid { status: s, message } => {
                assert_eq!(s, status);
                assert!(message.contains("scripted failure"), "{message}");
            }
            other => panic!("{status}: expected invalid, got {other:?}"),
        }
    }
    // After failures the client still answers.
    f.script(Scripted::text("back", Usage::new(1, 1)));
    assert_eq!(f.client().complete(&req).await.expect("ok").content, "back");
}

/// A streamed answer, folded, equals the whole answer: text and usage.
pub async fn streaming_adds_up_to_the_answer(f: Subject) {
    let text = "One two three. Four five six seven, eight nine ten.";
    f.script(Scripted::text(text, Usage::new(9, 12)));
    let req = CompletionRequest::new(vec![Message::user("Count to ten.")]);
    let mut stream = f.client().stream(&req).await.expect("stream");
    let mut acc = ChunkAccumulator::new();
    let mut pieces = 0;
    while let Some(chunk) = futures_next(&mut stream).await {
        acc.push(chunk.expect("chunk"));
        pieces += 1;
    }
    let r = acc.finish();
    assert!(pieces >= 3, "model, content and finish at least: {pieces}");
    assert_eq!(r.content, text);
    assert_eq!(r.finish_reason, FinishReason::Stop);
    assert_eq!(r.usage, Some(Usage::new(9, 12)));
    assert!(!r.model.is_empty());
    assert_eq!(last_received(&f).messages, req.messages);
}

/// A streamed tool call arrives whole once folded.
pub async fn streaming_carries_tool_calls(f: Subject) {
    f.script(Scripted::Answer {
        content: String::new(),
        tool_calls: vec![(
            "request_human".into(),
            json!({"reason": "asked for a refund"}),
        )],
        usage: Usage::new(20, 10),
    });
    let req = CompletionRequest::new(vec![Message::user("I want a refund")]).with_tools(tools());
    let mut stream = f.client().stream(&req).await.expect("stream");
    let mut acc = ChunkAccumulator::new();
    while let Some(chunk) = futures_next(&mut stream).await {
        acc.push(chunk.expect("chunk"));
    }
    let r = acc.finish();
    assert_eq!(r.finish_reason, FinishReason::ToolCalls);
    assert_eq!(r.tool_calls.len(), 1);
    assert_eq!(r.tool_calls[0].name, "request_human");
    assert!(!r.tool_calls[0].id.is_empty());
    let args: Value = serde_json::from_str(&r.tool_calls[0].arguments).expect("json");
    assert_eq!(args, json!({"reason": "asked for a refund"}));
}

/// A stream refused up front reports the classified error.
pub async fn streaming_errors_are_classified(f: Subject) {
    let req = CompletionRequest::new(vec![Message::user("Hi")]);
    f.script(Scripted::status(429, Some(Duration::from_secs(1))));
    let e = f.client().stream(&req).await.err().expect("429");
    assert_eq!(
        e,
        LlmError::RateLimited {
            retry_after: Some(Duration::from_secs(1))
        }
    );
    f.script(Scripted::status(400, None));
    let e = f.client().stream(&req).await.err().expect("400");
    assert!(matches!(e, LlmError::Invalid { status: 400, .. }), "{e:?}");
}

/// The next item of a stream (a tiny `StreamExt::next`, so the testkit
/// needs no futures dependency).
pub async fn futures_next<S>(stream: &mut S) -> Option<S::Item>
where
    S: futures_core::Stream + Unpin + ?Sized,
{
    std::future::poll_fn(|cx| std::pin::Pin::new(&mut *stream).poll_next(cx)).await
}
