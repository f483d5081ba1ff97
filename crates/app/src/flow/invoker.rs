//! Invokers: what an invoker task calls with its rendered text.
//!
//! A task runs on the invoker of its template's folder when that folder (or
//! a parent) configures one in `meta.yaml` (see [`super::meta`]), else on
//! the invoker its state names: `template`, `llm`, `llm_json`, or one
//! registered from Rust. Chat invokers send a render that is a YAML list of
//! `role`/`content` messages as those messages ([`chat_messages`]), any
//! other render as one user message.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use parlance_ports::{CompletionRequest, LlmClient, LlmError, Message, ResponseFormat, Role};

/// Why an invoker call failed, and whether another attempt may succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct InvokeError {
    /// What went wrong (recorded on the session: no secrets, no URLs).
    pub message: String,
    /// Whether the task's next attempt may succeed (a timeout, a 503);
    /// false fails the task at once (a 400, a bad key).
    pub retryable: bool,
}

impl InvokeError {
    /// A failure worth retrying.
    pub fn retryable(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: true,
        }
    }

    /// A failure no retry can fix.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: false,
        }
    }
}

impl From<LlmError> for InvokeError {
    fn from(e: LlmError) -> Self {
        Self {
            retryable: e.is_retryable(),
            message: e.to_string(),
        }
    }
}

/// Turns rendered text into a result.
#[async_trait]
pub trait Invoker: Send + Sync + 'static {
    /// Calls the invoker; an error message fails the task (it may be retried).
    async fn invoke(&self, rendered: &str) -> Result<String, String>;

    /// Calls the invoker, saying whether a failure is worth another
    /// attempt. Task handlers call this; by default it is
    /// [`invoke`](Self::invoke) with every failure retryable.
    async fn call(&self, rendered: &str) -> Result<String, InvokeError> {
        self.invoke(rendered).await.map_err(InvokeError::retryable)
    }
}

/// Returns the rendered text itself: the offline default.
#[derive(Debug, Default)]
pub struct TemplateInvoker;

#[async_trait]
impl Invoker for TemplateInvoker {
    async fn invoke(&self, rendered: &str) -> Result<String, String> {
        Ok(rendered.to_owned())
    }
}

/// A chat model call: the rendered text as messages ([`chat_messages`]) or
/// as one user message, with the invoker's model, temperature, token limit
/// and answer format.
pub struct LlmInvoker {
    llm: Arc<dyn LlmClient>,
    json: bool,
    model: Option<String>,
    temperature: Option<f32>,
    max_tokens: Option<u32>,
}

impl LlmInvoker {
    /// An invoker on `llm` with its default model; `json` asks for a JSON
    /// object answer.
    pub fn new(llm: Arc<dyn LlmClient>, json: bool) -> Self {
        Self {
            llm,
            json,
            model: None,
            temperature: None,
            max_tokens: None,
        }
    }

    /// Names the model of every request (else the client's default).
    pub fn with_model(mut self, model: impl Into<String>) -> Self {
        self.model = Some(model.into());
        self
    }

    /// Sets the sampling temperature (else the server's default).
    pub fn with_temperature(mut self, temperature: Option<f32>) -> Self {
        self.temperature = temperature;
        self
    }

    /// Sets the answer's token limit (else the server's default).
    pub fn with_max_tokens(mut self, max_tokens: Option<u32>) -> Self {
        self.max_tokens = max_tokens;
        self
    }

    /// The request for `rendered`.
    fn request(&self, rendered: &str) -> CompletionRequest {
        let messages = chat_messages(rendered).unwrap_or_else(|| vec![Message::user(rendered)]);
        let mut req = CompletionRequest::new(messages);
        req.model.clone_from(&self.model);
        req.temperature = self.temperature;
        req.max_tokens = self.max_tokens;
        if self.json {
            req = req.with_response_format(ResponseFormat::JsonObject);
        }
        req
    }
}

#[async_trait]
impl Invoker for LlmInvoker {
    async fn invoke(&self, rendered: &str) -> Result<String, String> {
        self.call(rendered).await.map_err(|e| e.message)
    }

    async fn call(&self, rendered: &str) -> Result<String, InvokeError> {
        let req = self.request(rendered);
        Ok(self.llm.complete(&req).await?.content)
    }
}

/// The messages a rendered chat template spells out, if it is a message
/// list: YAML that parses as a non-empty sequence whose every item is a
/// mapping of exactly two keys, `role` (`system`, `user` or `assistant`)
/// and `content`, both plain strings. Anything else (prose, a list of
/// strings, an item with a third key, an unknown role, a number as
/// content) is `None`: the render is sent as one user message.
pub fn chat_messages(rendered: &str) -> Option<Vec<Message>> {
    use serde_norway::Value;
    // Only a render that starts as a block or flow sequence can be one: a
    // cheap test that spares parsing prose as YAML.
    let starts_as_list = rendered
        .lines()
        .map(str::trim_start)
        .find(|l| !l.is_empty() && !l.starts_with('#') && *l != "---")
        .is_some_and(|l| l.starts_with("- ") || l == "-" || l.starts_with('['));
    if !starts_as_list {
        return None;
    }
    let Ok(Value::Sequence(items)) = serde_norway::from_str::<Value>(rendered) else {
        return None;
    };
    if items.is_empty() {
        return None;
    }
    let message = |item: &Value| -> Option<Message> {
        let map = item.as_mapping()?;
        if map.len() != 2 {
            return None;
        }
        let role = match map.get("role")? {
            Value::String(r) => r.as_str(),
            _ => return None,
        };
        let Value::String(content) = map.get("content")? else {
            return None;
        };
        let role = match role {
            "system" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            _ => return None,
        };
        Some(match role {
            Role::System => Message::system(content.clone()),
            Role::Assistant => Message::assistant(content.clone()),
            _ => Message::user(content.clone()),
        })
    };
    items.iter().map(message).collect()
}

/// Invokers by name: `template`, `llm`, `llm_json`, and any registered from
/// Rust.
#[derive(Clone)]
pub struct Invokers {
    by_name: BTreeMap<String, Arc<dyn Invoker>>,
}

impl Invokers {
    /// The built-in invokers on `llm`.
    pub fn standard(llm: Arc<dyn LlmClient>) -> Self {
        let mut by_name: BTreeMap<String, Arc<dyn Invoker>> = BTreeMap::new();
        by_name.insert("template".into(), Arc::new(TemplateInvoker));
        by_name.insert("llm".into(), Arc::new(LlmInvoker::new(llm.clone(), false)));
        by_name.insert("llm_json".into(), Arc::new(LlmInvoker::new(llm, true)));
        Self { by_name }
    }

    /// Adds (or replaces) an invoker.
    pub fn register(&mut self, name: &str, invoker: Arc<dyn Invoker>) {
        self.by_name.insert(name.to_owned(), invoker);
    }

    /// Adds every invoker of `other`.
    pub fn extend(&mut self, other: &BTreeMap<String, Arc<dyn Invoker>>) {
        self.by_name
            .extend(other.iter().map(|(k, v)| (k.clone(), v.clone())));
    }

    /// An invoker by name.
    pub fn get(&self, name: &str) -> Option<Arc<dyn Invoker>> {
        self.by_name.get(name).cloned()
    }

    /// Whether `name` is a built-in invoker.
    pub fn is_builtin(name: &str) -> bool {
        matches!(name, "template" | "llm" | "llm_json")
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use parlance_ports::{CompletionResponse, CompletionStream, LlmResult};

    use super::*;

    fn roles(messages: &[Message]) -> Vec<(&str, &str)> {
        messages
            .iter()
            .map(|m| (m.role.as_str(), m.content.as_str()))
            .collect()
    }

    #[test]
    fn a_yaml_list_of_role_and_content_is_messages() {
        let text = "# a ported prompt\n---\n- role: system\n  content: |\n    Be brief.\n    Answer in English.\n\
                    - role: user\n  content: What is 2+2?\n- role: assistant\n  content: '4'\n\
                    - {role: user, content: \"and 3+3?\"}\n";
        let m = chat_messages(text).unwrap();
        assert_eq!(
            roles(&m),
            [
                ("system", "Be brief.\nAnswer in English.\n"),
                ("user", "What is 2+2?"),
                ("assistant", "4"),
                ("user", "and 3+3?"),
            ]
        );
        let flow = chat_messages("[{role: user, content: hi}]").unwrap();
        assert_eq!(roles(&flow), [("user", "hi")]);
    }

    #[test]
    fn anything_else_is_text() {
        for text in [
            "",
            "What is 2+2?",
            "role: user\ncontent: a mapping, not a list",
            "- one\n- two",
            "[]",
            "- role: user\n  content: hi\n- just text",
            "- role: user\n  content: hi\n  name: ada",
            "- role: tool\n  content: hi",
            "- role: User\n  content: hi",
            "- role: user\n  content: 42",
            "- role: user\n  content: [a, b]",
            "- role: user\n  content:",
            "- role: user",
            "- content: hi",
            "- role: user\n  content: hi\n  role: system",
            "- role: user\n  content: !shout hi",
            "- role: user\n  content: \"unterminated",
            "Summarise:\n- role: user\n  content: hi",
        ] {
            assert_eq!(chat_messages(text), None, "{text:?}");
        }
    }

    /// Records every request and answers "ok".
    #[derive(Default)]
    struct Recorder(Mutex<Vec<CompletionRequest>>);

    #[async_trait]
    impl LlmClient for Recorder {
        fn describe(&self) -> String {
            "recorder".into()
        }
        fn default_model(&self) -> &str {
            "default"
        }
        async fn complete(&self, request: &CompletionRequest) -> LlmResult<CompletionResponse> {
            self.0.lock().unwrap().push(request.clone());
            Ok(CompletionResponse {
                content: "ok".into(),
                ..CompletionResponse::default()
            })
        }
        async fn stream(&self, _request: &CompletionRequest) -> LlmResult<CompletionStream> {
            Err(LlmError::Other {
                message: "no streams".into(),
            })
        }
    }

    #[tokio::test]
    async fn the_llm_invoker_sends_a_message_list_as_messages_and_text_as_one_user_message() {
        let llm = Arc::new(Recorder::default());
        let invoker = LlmInvoker::new(llm.clone(), true)
            .with_model("small")
            .with_temperature(Some(0.5))
            .with_max_tokens(Some(64));
        let listed = "- role: system\n  content: You extract JSON.\n- role: user\n  content: Ada";
        assert_eq!(invoker.call(listed).await.unwrap(), "ok");
        assert_eq!(invoker.call("Just Ada").await.unwrap(), "ok");
        let seen = llm.0.lock().unwrap();
        assert_eq!(
            roles(&seen[0].messages),
            [("system", "You extract JSON."), ("user", "Ada")]
        );
        assert_eq!(roles(&seen[1].messages), [("user", "Just Ada")]);
        for r in seen.iter() {
            assert_eq!(r.model.as_deref(), Some("small"));
            assert_eq!(r.temperature, Some(0.5));
            assert_eq!(r.max_tokens, Some(64));
            assert_eq!(r.response_format, ResponseFormat::JsonObject);
        }
    }

    #[test]
    fn model_errors_keep_their_retry_class() {
        let busy: InvokeError = LlmError::Unavailable {
            message: "503".into(),
            retry_after: None,
        }
        .into();
        assert!(busy.retryable);
        let refused: InvokeError = LlmError::Invalid {
            status: 401,
            message: "bad key".into(),
        }
        .into();
        assert!(!refused.retryable);
        assert_eq!(refused.message, "invalid model request (401): bad key");
    }
}
