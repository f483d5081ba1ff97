//! The language-model port: chat completions (whole or streamed), JSON
//! output, tool calls, token usage, and classified errors.
//!
//! The types follow the OpenAI chat-completions model, which every supported
//! server speaks (OpenAI, Azure OpenAI, vLLM, Ollama, llama.cpp), without
//! naming any wire format: adapters translate.

use std::fmt;
use std::pin::Pin;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_core::Stream;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{ErrorKind, PortError};

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Instructions from the application.
    System,
    /// The end user (or the application speaking for them).
    User,
    /// The model.
    Assistant,
    /// The result of a tool call, answering an assistant's call by id.
    Tool,
}

impl Role {
    /// The lowercase wire name: `system`, `user`, `assistant`, `tool`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// One call of a function the request offered, as the model made it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id, quoted back by the `tool` message that answers it.
    pub id: String,
    /// The function's name.
    pub name: String,
    /// The arguments as JSON text, exactly as the model wrote them (they may
    /// be malformed: parse them with the structured-output helper).
    pub arguments: String,
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// Who wrote it.
    pub role: Role,
    /// The text (empty for an assistant message made only of tool calls).
    pub content: String,
    /// Tool calls of an assistant message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For a `tool` message: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new(Role::System, content)
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new(Role::User, content)
    }

    /// An assistant message with text.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new(Role::Assistant, content)
    }

    /// An assistant message that made tool calls (to send back with the
    /// tools' results).
    pub fn assistant_tool_calls(calls: Vec<ToolCall>) -> Self {
        Self {
            tool_calls: calls,
            ..Self::new(Role::Assistant, "")
        }
    }

    /// The result of the tool call `call_id`.
    pub fn tool(call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            tool_call_id: Some(call_id.into()),
            ..Self::new(Role::Tool, content)
        }
    }
}

/// A function the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDefinition {
    /// The function's name (`[a-zA-Z0-9_-]`, at most 64 characters).
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// A JSON schema of its arguments (an object schema).
    pub parameters: Value,
}

/// Whether and which tool the model must call.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides (the default when tools are offered).
    #[default]
    Auto,
    /// No tool call.
    None,
    /// At least one tool call.
    Required,
    /// A call of this function.
    Function(String),
}

/// The shape the answer must have.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum ResponseFormat {
    /// Free text.
    #[default]
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON valid against `schema`.
    JsonSchema {
        /// A name for the schema (`[a-zA-Z0-9_-]`).
        name: String,
        /// The JSON schema.
        schema: Value,
        /// Ask the server to enforce the schema strictly, where it can.
        strict: bool,
    },
}

impl ResponseFormat {
    /// The schema asked for, if any.
    pub fn schema(&self) -> Option<&Value> {
        match self {
            ResponseFormat::JsonSchema { schema, .. } => Some(schema),
            _ => None,
        }
    }

    /// True unless the format is free text.
    pub fn is_json(&self) -> bool {
        !matches!(self, ResponseFormat::Text)
    }
}

/// One chat-completion request.
///
/// Built from messages, then narrowed with the `with_*` methods:
///
/// ```
/// use std::time::{Duration, Instant};
///
/// use parlance_ports::{CompletionRequest, Message};
/// use serde_json::json;
///
/// let request = CompletionRequest::new(vec![
///     Message::system("Classify the request."),
///     Message::user("I cannot find the export button"),
/// ])
/// .with_prompt_name("classify")
/// .with_json_schema(
///     "label",
///     json!({"type": "object", "properties": {"label": {"type": "string"}}}),
/// )
/// .with_temperature(0.0)
/// .with_deadline(Instant::now() + Duration::from_secs(10));
///
/// assert!(request.response_format.is_json());
/// assert_eq!(request.last_user_text(), "I cannot find the export button");
/// assert!(request.remaining(Instant::now()).is_some());
/// ```
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct CompletionRequest {
    /// The model; `None` uses the adapter's configured model.
    pub model: Option<String>,
    /// The conversation so far, oldest first.
    pub messages: Vec<Message>,
    /// Sampling temperature; `None` leaves the server's default.
    pub temperature: Option<f32>,
    /// Largest number of tokens to generate.
    pub max_tokens: Option<u32>,
    /// Text, any JSON object, or JSON matching a schema.
    pub response_format: ResponseFormat,
    /// Functions the model may call.
    pub tools: Vec<ToolDefinition>,
    /// Whether and which tool to call; `None` is the server's default.
    pub tool_choice: Option<ToolChoice>,
    /// The name of the prompt this request renders (for logs and scripted
    /// replies; never sent to the server).
    pub prompt_name: Option<String>,
    /// When the caller stops waiting: a client starts no attempt and no
    /// back-off wait that would end after it, and cuts an attempt's time
    /// limit to what is left; past it the call fails as
    /// [`LlmError::Timeout`]. `None` leaves only the client's own limits.
    /// Never sent to the server, nor serialised.
    #[serde(skip)]
    pub deadline: Option<Instant>,
}

impl CompletionRequest {
    /// A request made of `messages` with every option at its default.
    pub fn new(messages: Vec<Message>) -> Self {
        Self {
            messages,
            ..Self::default()
        }
    }

    /// Names the prompt.
    pub fn with_prompt_name(mut self, name: impl Into<String>) -> Self {
        self.prompt_name = Some(name.into());
        self
    }

    /// Sets the response format.
    pub fn with_response_format(mut self, format: ResponseFormat) -> Self {
        self.response_format = format;
        self
    }

    /// Asks for JSON matching `schema`, strictly.
    pub fn with_json_schema(self, name: impl Into<String>, schema: Value) -> Self {
        self.with_response_format(ResponseFormat::JsonSchema {
            name: name.into(),
            schema,
            strict: true,
        })
    }

    /// Offers tools.
    pub fn with_tools(mut self, tools: Vec<ToolDefinition>) -> Self {
        self.tools = tools;
        self
    }

    /// Sets the temperature.
    pub fn with_temperature(mut self, temperature: f32) -> Self {
        self.temperature = Some(temperature);
        self
    }

    /// Sets the token limit of the answer.
    pub fn with_max_tokens(mut self, max_tokens: u32) -> Self {
        self.max_tokens = Some(max_tokens);
        self
    }

    /// Sets the deadline, or keeps the one already set when it is earlier.
    pub fn with_deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(self.deadline.map_or(deadline, |d| d.min(deadline)));
        self
    }

    /// What is left until the deadline (zero once it passed); `None`
    /// without a deadline.
    pub fn remaining(&self, now: Instant) -> Option<Duration> {
        self.deadline.map(|d| d.saturating_duration_since(now))
    }

    /// The text of the last user message, or `""`.
    pub fn last_user_text(&self) -> &str {
        self.messages
            .iter()
            .rev()
            .find(|m| m.role == Role::User)
            .map_or("", |m| m.content.as_str())
    }
}

/// Tokens spent by one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens of the prompt.
    pub prompt_tokens: u32,
    /// Tokens generated.
    pub completion_tokens: u32,
    /// Their sum (as the server reports it).
    pub total_tokens: u32,
}

impl Usage {
    /// Usage whose total is the sum of the two parts.
    pub fn new(prompt_tokens: u32, completion_tokens: u32) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens.saturating_add(completion_tokens),
        }
    }
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FinishReason {
    /// A natural end.
    #[default]
    Stop,
    /// The token limit was reached: the answer is cut off.
    Length,
    /// The model called tools.
    ToolCalls,
    /// The server withheld content.
    ContentFilter,
    /// Any other reason the server gave.
    Other(String),
}

impl FinishReason {
    /// Reads the server's wire name.
    pub fn parse(s: &str) -> Self {
        match s {
            "stop" => FinishReason::Stop,
            "length" => FinishReason::Length,
            "tool_calls" | "function_call" => FinishReason::ToolCalls,
            "content_filter" => FinishReason::ContentFilter,
            other => FinishReason::Other(other.to_owned()),
        }
    }
}

/// The model's answer.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct CompletionResponse {
    /// The model that answered, as the server names it.
    pub model: String,
    /// The text of the answer (empty when the model only called tools).
    pub content: String,
    /// Tool calls, in order.
    pub tool_calls: Vec<ToolCall>,
    /// Why generation stopped.
    pub finish_reason: FinishReason,
    /// Tokens spent, when the server reports them.
    pub usage: Option<Usage>,
}

/// A piece of a streamed answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
#[non_exhaustive]
pub enum CompletionChunk {
    /// More text.
    Content {
        /// The text to append.
        text: String,
    },
    /// A piece of the tool call at `index`: the first piece carries its id
    /// and name, later ones more argument text.
    ToolCall {
        /// Which call (0-based, in order).
        index: u32,
        /// The call's id, on its first piece.
        id: Option<String>,
        /// The function's name, on its first piece.
        name: Option<String>,
        /// Argument text to append.
        arguments: String,
    },
    /// The model stopped.
    Finish {
        /// Why.
        reason: FinishReason,
    },
    /// Tokens spent (usually last).
    Usage {
        /// The usage.
        usage: Usage,
    },
    /// The model that answers, as the server names it (usually first).
    Model {
        /// Its name.
        name: String,
    },
}

/// A boxed stream of chunks; an `Err` item ends it.
pub type CompletionStream = Pin<Box<dyn Stream<Item = LlmResult<CompletionChunk>> + Send>>;

/// Folds streamed chunks into the [`CompletionResponse`] they amount to.
///
/// ```
/// use parlance_ports::{ChunkAccumulator, CompletionChunk, CompletionResponse, Usage, chunks_of};
///
/// let whole = CompletionResponse {
///     model: "m".to_owned(),
///     content: "Hello there".to_owned(),
///     usage: Some(Usage::new(12, 2)),
///     ..CompletionResponse::default()
/// };
/// let mut acc = ChunkAccumulator::new();
/// for chunk in chunks_of(&whole) {
///     acc.push(chunk);
/// }
/// assert_eq!(acc.finish(), whole);
///
/// let mut acc = ChunkAccumulator::new();
/// acc.push(CompletionChunk::Content { text: "Hel".to_owned() });
/// acc.push(CompletionChunk::Content { text: "lo".to_owned() });
/// assert_eq!(acc.finish().content, "Hello");
/// ```
#[derive(Debug, Default, Clone)]
pub struct ChunkAccumulator {
    response: CompletionResponse,
}

impl ChunkAccumulator {
    /// An empty answer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one chunk.
    pub fn push(&mut self, chunk: CompletionChunk) {
        let r = &mut self.response;
        match chunk {
            CompletionChunk::Content { text } => r.content.push_str(&text),
            CompletionChunk::ToolCall {
                index,
                id,
                name,
                arguments,
            } => {
                let index = index as usize;
                // Servers send indexes in order; a gap is filled so no piece is lost.
                while r.tool_calls.len() <= index {
                    r.tool_calls.push(ToolCall {
                        id: String::new(),
                        name: String::new(),
                        arguments: String::new(),
                    });
                }
                let call = &mut r.tool_calls[index];
                if let Some(id) = id {
                    call.id = id;
                }
                if let Some(name) = name {
                    call.name.push_str(&name);
                }
                call.arguments.push_str(&arguments);
            }
            CompletionChunk::Finish { reason } => r.finish_reason = reason,
            CompletionChunk::Usage { usage } => r.usage = Some(usage),
            CompletionChunk::Model { name } => r.model = name,
        }
    }

    /// The answer so far.
    pub fn finish(self) -> CompletionResponse {
        self.response
    }
}

/// Splits a whole answer into the chunks a stream of it would carry: the
/// model, the text, each tool call, the finish reason, then usage.
pub fn chunks_of(response: &CompletionResponse) -> Vec<CompletionChunk> {
    let mut out = vec![CompletionChunk::Model {
        name: response.model.clone(),
    }];
    if !response.content.is_empty() {
        out.push(CompletionChunk::Content {
            text: response.content.clone(),
        });
    }
    for (i, call) in response.tool_calls.iter().enumerate() {
        out.push(CompletionChunk::ToolCall {
            index: u32::try_from(i).unwrap_or(u32::MAX),
            id: Some(call.id.clone()),
            name: Some(call.name.clone()),
            arguments: call.arguments.clone(),
        });
    }
    out.push(CompletionChunk::Finish {
        reason: response.finish_reason.clone(),
    });
    if let Some(usage) = response.usage {
        out.push(CompletionChunk::Usage { usage });
    }
    out
}

/// A failed model call, classified for the caller.
///
/// ```
/// use std::time::Duration;
///
/// use parlance_ports::{ErrorKind, LlmError, PortError};
///
/// let err = LlmError::from_status(429, Some(Duration::from_secs(2)), "slow down");
/// assert!(err.is_retryable());
/// assert_eq!(err.retry_after(), Some(Duration::from_secs(2)));
///
/// let err = LlmError::from_status(401, None, "bad key");
/// assert!(!err.is_retryable());
/// assert_eq!(PortError::from(err).kind, ErrorKind::Invalid);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LlmError {
    /// Too many requests (HTTP 429): wait `retry_after` when the server said.
    #[error("rate limited{}", retry_hint(*retry_after))]
    RateLimited {
        /// How long the server asked to wait.
        retry_after: Option<Duration>,
    },
    /// The server is down, overloaded or unreachable (5xx, connection
    /// refused): retry later.
    #[error("model unavailable: {message}")]
    Unavailable {
        /// What happened.
        message: String,
        /// How long the server asked to wait (a 503 may say).
        retry_after: Option<Duration>,
    },
    /// The request was refused (4xx other than 429: bad request, bad key,
    /// unknown model, context too long): do not retry as is.
    #[error("invalid model request ({status}): {message}")]
    Invalid {
        /// The HTTP status (400 for a request refused before sending).
        status: u16,
        /// The server's explanation.
        message: String,
    },
    /// No answer within the time limit.
    #[error("model request timed out after {}ms", after.as_millis())]
    Timeout {
        /// The limit that passed.
        after: Duration,
    },
    /// Anything else: an unreadable answer, an unexpected status.
    #[error("model error: {message}")]
    Other {
        /// What happened.
        message: String,
    },
}

fn retry_hint(after: Option<Duration>) -> String {
    after.map_or_else(String::new, |d| {
        format!(" (retry after {}ms)", d.as_millis())
    })
}

/// Shorthand for model-port results.
pub type LlmResult<T> = Result<T, LlmError>;

impl LlmError {
    /// Classifies an HTTP error status: 429 is `RateLimited`, 408 `Timeout`,
    /// other 4xx `Invalid`, 5xx `Unavailable`, anything else `Other`.
    pub fn from_status(status: u16, retry_after: Option<Duration>, message: &str) -> Self {
        let message = message.to_owned();
        match status {
            429 => LlmError::RateLimited { retry_after },
            408 => LlmError::Timeout {
                after: Duration::ZERO,
            },
            400..=499 => LlmError::Invalid { status, message },
            500..=599 => LlmError::Unavailable {
                message: if message.is_empty() {
                    format!("server answered {status}")
                } else {
                    message
                },
                retry_after,
            },
            _ => LlmError::Other {
                message: format!("unexpected status {status}: {message}"),
            },
        }
    }

    /// True for errors worth retrying (rate limits, unavailability,
    /// timeouts).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            LlmError::RateLimited { .. } | LlmError::Unavailable { .. } | LlmError::Timeout { .. }
        )
    }

    /// The wait the server asked for, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            LlmError::RateLimited { retry_after } | LlmError::Unavailable { retry_after, .. } => {
                *retry_after
            }
            _ => None,
        }
    }

    /// The matching port error kind: `Invalid` for refused requests,
    /// `Other` for unreadable answers, `Unavailable` for the rest.
    pub fn kind(&self) -> ErrorKind {
        match self {
            LlmError::Invalid { .. } => ErrorKind::Invalid,
            LlmError::Other { .. } => ErrorKind::Other,
            _ => ErrorKind::Unavailable,
        }
    }
}

impl From<LlmError> for PortError {
    fn from(e: LlmError) -> Self {
        PortError::new(e.kind(), e.to_string())
    }
}

/// A chat model.
///
/// Implemented by [`OfflineLlm`](https://docs.rs/parlance-memory/latest/parlance_memory/struct.OfflineLlm.html) and [`OpenAiClient`](https://docs.rs/parlance-openai/latest/parlance_openai/struct.OpenAiClient.html), whose
/// constructors' examples call it.
#[async_trait]
pub trait LlmClient: Send + Sync + 'static {
    /// What this client talks to, for logs (`offline`, or the base URL).
    fn describe(&self) -> String;

    /// The model used when a request names none.
    fn default_model(&self) -> &str;

    /// Sends the request and waits for the whole answer.
    async fn complete(&self, request: &CompletionRequest) -> LlmResult<CompletionResponse>;

    /// Sends the request and returns the answer as it is generated. The
    /// default waits for [`complete`](Self::complete) and replays it as
    /// chunks ([`chunks_of`]).
    async fn stream(&self, request: &CompletionRequest) -> LlmResult<CompletionStream> {
        let response = self.complete(request).await?;
        let chunks: Vec<LlmResult<CompletionChunk>> =
            chunks_of(&response).into_iter().map(Ok).collect();
        Ok(Box::pin(Replay {
            chunks: chunks.into_iter(),
        }))
    }
}

impl fmt::Debug for dyn LlmClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LlmClient({})", self.describe())
    }
}

/// A stream over chunks already in hand.
struct Replay {
    chunks: std::vec::IntoIter<LlmResult<CompletionChunk>>,
}

impl Stream for Replay {
    type Item = LlmResult<CompletionChunk>;

    fn poll_next(
        mut self: Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        std::task::Poll::Ready(self.chunks.next())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_classified() {
        let wait = Some(Duration::from_secs(2));
        assert_eq!(
            LlmError::from_status(429, wait, "slow down"),
            LlmError::RateLimited { retry_after: wait }
        );
        assert!(matches!(
            LlmError::from_status(401, None, "bad key"),
            LlmError::Invalid { status: 401, .. }
        ));
        assert!(matches!(
            LlmError::from_status(404, None, "no model"),
            LlmError::Invalid { status: 404, .. }
        ));
        assert!(matches!(
            LlmError::from_status(503, wait, ""),
            LlmError::Unavailable { retry_after, .. } if retry_after == wait
        ));
        assert!(matches!(
            LlmError::from_status(500, None, "boom"),
            LlmError::Unavailable { .. }
        ));
        assert!(matches!(
            LlmError::from_status(302, None, ""),
            LlmError::Other { .. }
        ));
        assert!(LlmError::from_status(500, None, "").is_retryable());
        assert!(!LlmError::from_status(400, None, "").is_retryable());
        assert_eq!(
            PortError::from(LlmError::from_status(400, None, "x")).kind,
            ErrorKind::Invalid
        );
    }

    #[test]
    fn messages_are_lowercase_and_carry_data() {
        let e = LlmError::RateLimited {
            retry_after: Some(Duration::from_millis(1500)),
        };
        assert_eq!(e.to_string(), "rate limited (retry after 1500ms)");
        let e = LlmError::Timeout {
            after: Duration::from_secs(3),
        };
        assert_eq!(e.to_string(), "model request timed out after 3000ms");
    }

    #[test]
    fn the_earlier_deadline_wins() {
        let now = Instant::now();
        let soon = now + Duration::from_secs(1);
        let later = now + Duration::from_secs(5);
        let r = CompletionRequest::default().with_deadline(later);
        assert_eq!(r.deadline, Some(later));
        let r = r.with_deadline(soon).with_deadline(later);
        assert_eq!(r.deadline, Some(soon));
        assert_eq!(r.remaining(now), Some(Duration::from_secs(1)));
        assert_eq!(r.remaining(later), Some(Duration::ZERO));
        assert_eq!(CompletionRequest::default().remaining(now), None);
    }

    #[test]
    fn chunks_fold_back_into_the_answer() {
        let response = CompletionResponse {
            model: "m".into(),
            content: "hello".into(),
            tool_calls: vec![ToolCall {
                id: "c1".into(),
                name: "send_message".into(),
                arguments: r#"{"text":"hi"}"#.into(),
            }],
            finish_reason: FinishReason::ToolCalls,
            usage: Some(Usage::new(10, 5)),
        };
        let mut acc = ChunkAccumulator::new();
        for c in chunks_of(&response) {
            acc.push(c);
        }
        assert_eq!(acc.finish(), response);
    }

    #[test]
    fn split_tool_call_pieces_are_joined() {
        let mut acc = ChunkAccumulator::new();
        acc.push(CompletionChunk::ToolCall {
            index: 0,
            id: Some("a".into()),
            name: Some("f".into()),
            arguments: "{\"x\":".into(),
        });
        acc.push(CompletionChunk::ToolCall {
            index: 0,
            id: None,
            name: None,
            arguments: "1}".into(),
        });
        let r = acc.finish();
        assert_eq!(r.tool_calls.len(), 1);
        assert_eq!(r.tool_calls[0].arguments, "{\"x\":1}");
    }
}
