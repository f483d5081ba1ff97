//! Invokers: what an invoker task calls with its rendered text.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use parlance_ports::{CompletionRequest, LlmClient, Message, ResponseFormat};

/// Turns rendered text into a result.
#[async_trait]
pub trait Invoker: Send + Sync + 'static {
    /// Calls the invoker; an error message fails the task (it may be retried).
    async fn invoke(&self, rendered: &str) -> Result<String, String>;
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

/// Sends the rendered text as the user message to the language model.
pub struct LlmInvoker {
    llm: Arc<dyn LlmClient>,
    json: bool,
}

impl LlmInvoker {
    /// An invoker on `llm`; `json` asks for a JSON object answer.
    pub fn new(llm: Arc<dyn LlmClient>, json: bool) -> Self {
        Self { llm, json }
    }
}

#[async_trait]
impl Invoker for LlmInvoker {
    async fn invoke(&self, rendered: &str) -> Result<String, String> {
        let mut req = CompletionRequest::new(vec![Message::user(rendered)]);
        if self.json {
            req = req.with_response_format(ResponseFormat::JsonObject);
        }
        self.llm
            .complete(&req)
            .await
            .map(|r| r.content)
            .map_err(|e| e.to_string())
    }
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
