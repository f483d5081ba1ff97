//! The offline language model: answers every request deterministically, with
//! no network, so every flow runs in tests, demos and the embedded default.
//!
//! Scripted rules come first (tried in the order added; a rule may be
//! limited to a number of uses): they match on the prompt name, on text in
//! the messages (any, or the last user message), on whether the newest
//! message is the user's, on an offered tool, or on several of these at
//! once ([`When::All`], [`When::AnyOf`]), and reply with text, JSON, tool
//! calls or an error. Without a matching rule the fallback answers:
//!
//! - a tool call when the request requires one (`ToolChoice::Required` or a
//!   named function), its arguments filled from the tool's parameter schema;
//! - for a JSON schema, a value filled from the schema and the facts the
//!   prompt states (`key: value` lines and the members of JSON objects in
//!   the messages): a stated value where a property has its name, otherwise
//!   the most conservative choice (the first `enum` value, `null` where
//!   allowed, `false`, the smallest allowed number, `""`, arrays of
//!   `minItems` items);
//! - `{}` for JSON-object mode;
//! - otherwise a short text that quotes the last user message.
//!
//! Streamed, an answer's text arrives a word at a time ([`text_pieces`]).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use parlance_core::find_json_values;
use parlance_ports::{
    CompletionChunk, CompletionRequest, CompletionResponse, CompletionStream, FinishReason,
    LlmClient, LlmError, LlmResult, ResponseFormat, Role, ToolCall, ToolChoice, Usage, chunks_of,
};
use serde_json::{Map, Value, json};

/// The model name the offline client reports.
pub const OFFLINE_MODEL: &str = "offline";

/// Which requests a rule answers.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum When {
    /// Every request.
    Any,
    /// Requests naming this prompt (`CompletionRequest::prompt_name`).
    PromptName(String),
    /// Requests with this text in any message (case-insensitive).
    Contains(String),
    /// Requests whose last user message holds this text (case-insensitive).
    UserContains(String),
    /// Requests offering a tool of this name.
    ToolOffered(String),
    /// Requests whose newest message is a user message (not the model's,
    /// nor a tool result, nor instructions).
    LastFromUser,
    /// Requests every one of these matches (every request when empty).
    All(Vec<When>),
    /// Requests at least one of these matches (none when empty).
    AnyOf(Vec<When>),
}

impl When {
    fn matches(&self, request: &CompletionRequest) -> bool {
        match self {
            When::Any => true,
            When::PromptName(name) => request.prompt_name.as_deref() == Some(name.as_str()),
            When::Contains(text) => {
                let needle = text.to_lowercase();
                request
                    .messages
                    .iter()
                    .any(|m| m.content.to_lowercase().contains(&needle))
            }
            When::UserContains(text) => request
                .last_user_text()
                .to_lowercase()
                .contains(&text.to_lowercase()),
            When::ToolOffered(name) => request.tools.iter().any(|t| &t.name == name),
            When::LastFromUser => request
                .messages
                .last()
                .is_some_and(|m| m.role == Role::User),
            When::All(all) => all.iter().all(|w| w.matches(request)),
            When::AnyOf(any) => any.iter().any(|w| w.matches(request)),
        }
    }
}

/// What a rule answers.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Reply {
    /// An answer: text (returned verbatim, even in JSON mode, so callers'
    /// parsers can be tested on fenced or broken JSON) and tool calls.
    Answer {
        /// The text.
        content: String,
        /// Tool calls: `(function name, arguments)`; ids are assigned.
        tool_calls: Vec<(String, Value)>,
        /// Reported usage; estimated from the text when `None`.
        usage: Option<Usage>,
    },
    /// A failure, as a real server might give.
    Error(LlmError),
}

impl Reply {
    /// Plain text.
    pub fn text(content: impl Into<String>) -> Self {
        Reply::Answer {
            content: content.into(),
            tool_calls: Vec::new(),
            usage: None,
        }
    }

    /// A JSON value, as compact text.
    pub fn json(value: &Value) -> Self {
        Self::text(value.to_string())
    }

    /// One call of the offered tool `name` with `arguments`.
    pub fn tool_call(name: impl Into<String>, arguments: Value) -> Self {
        Reply::Answer {
            content: String::new(),
            tool_calls: vec![(name.into(), arguments)],
            usage: None,
        }
    }

    /// The same answer, reporting `usage`.
    pub fn with_usage(self, usage: Usage) -> Self {
        match self {
            Reply::Answer {
                content,
                tool_calls,
                ..
            } => Reply::Answer {
                content,
                tool_calls,
                usage: Some(usage),
            },
            e @ Reply::Error(_) => e,
        }
    }
}

/// A scripted reply and when it applies.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// Which requests it answers.
    pub when: When,
    /// The answer.
    pub reply: Reply,
    /// How many more requests it answers (`None`: every one).
    pub remaining: Option<usize>,
}

/// The offline client. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct OfflineLlm {
    model: String,
    rules: Mutex<Vec<Rule>>,
    received: Mutex<Vec<CompletionRequest>>,
    calls: AtomicU64,
}

impl Default for OfflineLlm {
    fn default() -> Self {
        Self::new()
    }
}

impl OfflineLlm {
    /// No rules: the fallback answers everything.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use parlance_memory::{OfflineLlm, Reply, When};
    /// use parlance_ports::{CompletionRequest, LlmClient, LlmError, Message};
    ///
    /// let llm = OfflineLlm::new()
    ///     .with_rule(When::UserContains("refund".to_owned()), Reply::text("Refunds take five days."));
    /// llm.push_reply(Reply::Error(LlmError::from_status(503, None, "overloaded")));
    ///
    /// let ask = |text: &str| CompletionRequest::new(vec![Message::user(text)]);
    /// // Rules answer in order: the refund rule, then the pushed reply (once),
    /// // then the fallback, which quotes the user.
    /// assert!(llm.complete(&ask("hello")).await.unwrap_err().is_retryable());
    /// assert_eq!(llm.complete(&ask("Where is my refund?")).await?.content, "Refunds take five days.");
    /// assert!(llm.complete(&ask("hello")).await?.content.starts_with("(offline reply)"));
    /// assert_eq!(llm.received().len(), 3);
    /// # Ok(())
    /// # }
    /// ```
    pub fn new() -> Self {
        Self {
            model: OFFLINE_MODEL.to_owned(),
            rules: Mutex::new(Vec::new()),
            received: Mutex::new(Vec::new()),
            calls: AtomicU64::new(0),
        }
    }

    /// Adds a rule that answers every matching request.
    pub fn with_rule(self, when: When, reply: Reply) -> Self {
        self.add_rule(Rule {
            when,
            reply,
            remaining: None,
        });
        self
    }

    /// Adds a rule after the existing ones.
    pub fn add_rule(&self, rule: Rule) {
        lock(&self.rules).push(rule);
    }

    /// Adds a reply for the next request that no earlier rule answers.
    pub fn push_reply(&self, reply: Reply) {
        self.add_rule(Rule {
            when: When::Any,
            reply,
            remaining: Some(1),
        });
    }

    /// Every request received, oldest first.
    pub fn received(&self) -> Vec<CompletionRequest> {
        lock(&self.received).clone()
    }

    fn scripted(&self, request: &CompletionRequest) -> Option<Reply> {
        let mut rules = lock(&self.rules);
        let i = rules
            .iter()
            .position(|r| r.remaining != Some(0) && r.when.matches(request))?;
        let rule = &mut rules[i];
        let reply = rule.reply.clone();
        if let Some(n) = rule.remaining.as_mut() {
            *n -= 1;
        }
        rules.retain(|r| r.remaining != Some(0));
        Some(reply)
    }

    fn next_call_id(&self) -> String {
        format!("call_{}", self.calls.fetch_add(1, Ordering::Relaxed) + 1)
    }

    fn answer(
        &self,
        request: &CompletionRequest,
        content: String,
        calls: Vec<(String, Value)>,
        usage: Option<Usage>,
    ) -> LlmResult<CompletionResponse> {
        let mut tool_calls = Vec::with_capacity(calls.len());
        for (name, arguments) in calls {
            if !request.tools.iter().any(|t| t.name == name) {
                return Err(LlmError::Invalid {
                    status: 400,
                    message: format!("tool {name:?} was not offered"),
                });
            }
            tool_calls.push(ToolCall {
                id: self.next_call_id(),
                name,
                arguments: arguments.to_string(),
            });
        }
        let usage = usage.unwrap_or_else(|| estimate_usage(request, &content, &tool_calls));
        Ok(CompletionResponse {
            model: request.model.clone().unwrap_or_else(|| self.model.clone()),
            finish_reason: if tool_calls.is_empty() {
                FinishReason::Stop
            } else {
                FinishReason::ToolCalls
            },
            content,
            tool_calls,
            usage: Some(usage),
        })
    }

    fn fallback(&self, request: &CompletionRequest) -> LlmResult<CompletionResponse> {
        let facts = prompt_facts(request);
        let forced = match &request.tool_choice {
            Some(ToolChoice::Required) => request.tools.first(),
            Some(ToolChoice::Function(name)) => request.tools.iter().find(|t| &t.name == name),
            _ => None,
        };
        if let Some(tool) = forced {
            let args = fill_schema(&tool.parameters, &facts);
            return self.answer(
                request,
                String::new(),
                vec![(tool.name.clone(), args)],
                None,
            );
        }
        let content = match &request.response_format {
            ResponseFormat::JsonSchema { schema, .. } => fill_schema(schema, &facts).to_string(),
            ResponseFormat::JsonObject => "{}".to_owned(),
            ResponseFormat::Text => text_reply(request.last_user_text()),
        };
        self.answer(request, content, Vec::new(), None)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain data behind; keep serving.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[async_trait]
impl LlmClient for OfflineLlm {
    fn describe(&self) -> String {
        "offline (deterministic, no network)".to_owned()
    }

    fn default_model(&self) -> &str {
        &self.model
    }

    async fn complete(&self, request: &CompletionRequest) -> LlmResult<CompletionResponse> {
        if request.messages.is_empty() {
            return Err(LlmError::Invalid {
                status: 400,
                message: "a request needs at least one message".to_owned(),
            });
        }
        lock(&self.received).push(request.clone());
        // It answers at once, so only a deadline already gone is missed.
        if request
            .remaining(std::time::Instant::now())
            .is_some_and(|left| left.is_zero())
        {
            return Err(LlmError::Timeout {
                after: std::time::Duration::ZERO,
            });
        }
        match self.scripted(request) {
            Some(Reply::Error(e)) => Err(e),
            Some(Reply::Answer {
                content,
                tool_calls,
                usage,
            }) => self.answer(request, content, tool_calls, usage),
            None => self.fallback(request),
        }
    }

    /// The whole answer ([`LlmClient::complete`]) replayed as a stream, its
    /// text split into several pieces ([`text_pieces`]) as a served model
    /// streams it.
    async fn stream(&self, request: &CompletionRequest) -> LlmResult<CompletionStream> {
        let response = self.complete(request).await?;
        let chunks: Vec<LlmResult<CompletionChunk>> = chunks_of(&response)
            .into_iter()
            .flat_map(|chunk| match chunk {
                CompletionChunk::Content { text } => text_pieces(&text)
                    .into_iter()
                    .map(|text| CompletionChunk::Content { text })
                    .collect(),
                other => vec![other],
            })
            .map(Ok)
            .collect();
        Ok(Box::pin(futures::stream::iter(chunks)))
    }
}

/// The most characters one streamed piece of text carries.
const PIECE_CHARS: usize = 24;

/// `text` in the pieces a stream of it carries: each word with the
/// whitespace after it (the first with any before it), a longer one cut
/// every 24 characters (compact JSON has few spaces), so the
/// pieces concatenate to `text`.
pub fn text_pieces(text: &str) -> Vec<String> {
    let mut words: Vec<String> = Vec::new();
    let mut current = String::new();
    let mut in_space = false;
    for c in text.chars() {
        let space = c.is_whitespace();
        if !space && in_space && current.chars().any(|c| !c.is_whitespace()) {
            words.push(std::mem::take(&mut current));
        }
        in_space = space;
        current.push(c);
    }
    if !current.is_empty() {
        words.push(current);
    }
    let mut pieces = Vec::with_capacity(words.len());
    for word in words {
        let chars: Vec<char> = word.chars().collect();
        pieces.extend(
            chars
                .chunks(PIECE_CHARS)
                .map(|c| c.iter().collect::<String>()),
        );
    }
    pieces
}

/// The text fallback: one line quoting the start of the last user message.
fn text_reply(last_user: &str) -> String {
    let line = last_user
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    let mut quoted: String = line.trim().chars().take(160).collect();
    if quoted.is_empty() {
        return "(offline reply) Hello.".to_owned();
    }
    if line.trim().chars().count() > 160 {
        quoted.push_str("...");
    }
    format!("(offline reply) Noted: {quoted}")
}

/// Roughly four characters a token, four tokens of overhead a message.
fn estimate_usage(request: &CompletionRequest, content: &str, calls: &[ToolCall]) -> Usage {
    let tokens = |s: &str| u32::try_from(s.chars().count().div_ceil(4)).unwrap_or(u32::MAX);
    let prompt = request.messages.iter().fold(0u32, |acc, m| {
        acc.saturating_add(4).saturating_add(tokens(&m.content))
    });
    let completion = calls
        .iter()
        .fold(tokens(content), |acc, c| {
            acc.saturating_add(tokens(&c.name))
                .saturating_add(tokens(&c.arguments))
        })
        .max(1);
    Usage::new(prompt, completion)
}

/// What the fallback knows about a request.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct PromptFacts {
    /// Facts stated in the messages, keys in `snake_case`.
    pub(crate) stated: BTreeMap<String, Value>,
    /// The text fallback's reply, used for a string that must not be empty
    /// and has no stated value.
    pub(crate) reply: String,
}

/// Facts stated in the request's messages: `key: value` (or `key = value`)
/// lines and the members of JSON objects, keys normalized to `snake_case`.
/// Later messages override earlier ones.
pub(crate) fn prompt_facts(request: &CompletionRequest) -> PromptFacts {
    let mut facts = BTreeMap::new();
    for message in &request.messages {
        for line in message.content.lines() {
            if let Some((key, value)) = fact_line(line) {
                facts.insert(key, Value::String(value));
            }
        }
        for value in find_json_values(&message.content) {
            if let Value::Object(map) = value {
                for (k, v) in map {
                    facts.insert(normalize_key(&k), v);
                }
            }
        }
    }
    PromptFacts {
        stated: facts,
        reply: text_reply(request.last_user_text()),
    }
}

fn fact_line(line: &str) -> Option<(String, String)> {
    let line = line.trim().trim_start_matches(['-', '*', ' ']);
    let (key, value) = line.split_once(':').or_else(|| line.split_once('='))?;
    let key = key.trim();
    let ok = !key.is_empty()
        && key.chars().count() <= 48
        && key
            .chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == ' ' || c == '-');
    let value = value.trim();
    if !ok || value.is_empty() {
        return None;
    }
    Some((normalize_key(key), value.to_owned()))
}

fn normalize_key(key: &str) -> String {
    key.trim()
        .chars()
        .map(|c| {
            if c == ' ' || c == '-' {
                '_'
            } else {
                c.to_ascii_lowercase()
            }
        })
        .collect()
}

/// A value valid against `schema`, taken from `facts` where a property of
/// the same name is stated and otherwise the most conservative choice: the
/// first `enum` value (schemas list their safest value first), `null` where
/// allowed, `false`, the smallest allowed number (0 when unbounded), `""`
/// (or, where a string must not be empty, the text fallback's reply), and
/// arrays of `minItems` (usually no) items.
pub(crate) fn fill_schema(schema: &Value, facts: &PromptFacts) -> Value {
    fill(schema, None, facts, 0)
}

fn fill(schema: &Value, name: Option<&str>, facts: &PromptFacts, depth: usize) -> Value {
    let Some(s) = schema.as_object() else {
        return Value::Null;
    };
    if depth > 32 {
        return Value::Null;
    }
    let fact = name.and_then(|n| facts.stated.get(&normalize_key(n)));
    if let Some(c) = s.get("const") {
        return c.clone();
    }
    if let Some(Value::Array(options)) = s.get("enum")
        && let Some(first) = options.first()
    {
        let stated = fact.and_then(|f| {
            options.iter().find(|o| match (o, f) {
                (Value::String(o), Value::String(f)) => o.eq_ignore_ascii_case(f.trim()),
                (o, f) => *o == f,
            })
        });
        return stated.unwrap_or(first).clone();
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(branches)) = s.get(key)
            && !branches.is_empty()
        {
            if branches
                .iter()
                .any(|b| b.get("type") == Some(&json!("null")))
            {
                return Value::Null;
            }
            return fill(&branches[0], name, facts, depth + 1);
        }
    }
    let types: Vec<&str> = match s.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ if s.contains_key("properties") => vec!["object"],
        _ if s.contains_key("items") => vec!["array"],
        _ => Vec::new(),
    };
    let nullable = types.contains(&"null");
    // A stated fact of a fitting type wins over null.
    for ty in types.iter().filter(|t| **t != "null") {
        if let Some(v) = fact.and_then(|f| from_fact(s, ty, f)) {
            return v;
        }
    }
    if nullable || types.is_empty() {
        return Value::Null;
    }
    match types[0] {
        "object" => {
            let mut out = Map::new();
            if let Some(props) = s.get("properties").and_then(Value::as_object) {
                for (key, prop) in props {
                    out.insert(key.clone(), fill(prop, Some(key), facts, depth + 1));
                }
            }
            Value::Object(out)
        }
        "array" => {
            let min = s.get("minItems").and_then(Value::as_u64).unwrap_or(0);
            let item = s.get("items").cloned().unwrap_or(Value::Bool(true));
            let items = (0..min.min(16))
                .map(|_| fill(&item, None, facts, depth + 1))
                .collect();
            Value::Array(items)
        }
        "boolean" => Value::Bool(false),
        "integer" => number_in(s, None, true),
        "number" => number_in(s, None, false),
        "string" => {
            let min = s.get("minLength").and_then(Value::as_u64).unwrap_or(0) as usize;
            if min == 0 {
                return Value::String(String::new());
            }
            let max = s
                .get("maxLength")
                .and_then(Value::as_u64)
                .map(|m| m as usize);
            let mut text: String = facts
                .reply
                .chars()
                .take(max.unwrap_or(usize::MAX))
                .collect();
            let short = min.saturating_sub(text.chars().count());
            text.extend(std::iter::repeat_n('.', short));
            Value::String(text)
        }
        _ => Value::Null,
    }
}

/// The fact as a value of type `ty` valid for `schema`, if it can be one.
fn from_fact(schema: &Map<String, Value>, ty: &str, fact: &Value) -> Option<Value> {
    let text = match fact {
        Value::String(s) => Some(s.trim()),
        _ => None,
    };
    match ty {
        "string" => {
            let s = match fact {
                Value::String(s) => s.trim().to_owned(),
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                _ => return None,
            };
            let max = schema.get("maxLength").and_then(Value::as_u64);
            let min = schema.get("minLength").and_then(Value::as_u64).unwrap_or(0);
            let s: String = match max {
                Some(m) => s.chars().take(m as usize).collect(),
                None => s,
            };
            (s.chars().count() as u64 >= min).then_some(Value::String(s))
        }
        "boolean" => match (fact, text) {
            (Value::Bool(b), _) => Some(Value::Bool(*b)),
            (_, Some(t)) if t.eq_ignore_ascii_case("true") => Some(Value::Bool(true)),
            (_, Some(t)) if t.eq_ignore_ascii_case("false") => Some(Value::Bool(false)),
            _ => None,
        },
        "integer" | "number" => {
            let n = match (fact, text) {
                (Value::Number(n), _) => n.as_f64(),
                (_, Some(t)) => t.parse::<f64>().ok(),
                _ => None,
            }?;
            n.is_finite()
                .then(|| number_in(schema, Some(n), ty == "integer"))
        }
        "array" | "object" => {
            let fits = match fact {
                Value::Array(_) => ty == "array",
                Value::Object(_) => ty == "object",
                _ => false,
            };
            let mut whole = schema.clone();
            whole.insert("type".to_owned(), json!(ty));
            (fits && parlance_core::validate(&Value::Object(whole), fact).is_ok())
                .then(|| fact.clone())
        }
        _ => None,
    }
}

/// `wanted` (or the smallest allowed value, 0 when unbounded) clamped into
/// the schema's bounds.
fn number_in(schema: &Map<String, Value>, wanted: Option<f64>, integer: bool) -> Value {
    let get = |k: &str| schema.get(k).and_then(Value::as_f64);
    let step = if integer { 1.0 } else { 1e-6 };
    let lo = match (get("minimum"), get("exclusiveMinimum")) {
        (Some(a), Some(b)) => Some(a.max(b + step)),
        (a, b) => a.or(b.map(|b| b + step)),
    };
    let hi = match (get("maximum"), get("exclusiveMaximum")) {
        (Some(a), Some(b)) => Some(a.min(b - step)),
        (a, b) => a.or(b.map(|b| b - step)),
    };
    let mut n = wanted.unwrap_or_else(|| lo.unwrap_or(0.0));
    if integer {
        n = n.round();
    }
    if let Some(lo) = lo {
        n = n.max(if integer { lo.ceil() } else { lo });
    }
    if let Some(hi) = hi {
        n = n.min(if integer { hi.floor() } else { hi });
    }
    if integer { json!(n as i64) } else { json!(n) }
}

#[cfg(test)]
mod tests {
    use parlance_ports::{ChunkAccumulator, Message, ToolDefinition};
    use proptest::prelude::*;

    use super::*;

    #[tokio::test]
    async fn a_streamed_answer_arrives_in_pieces_that_make_the_whole() {
        use futures::StreamExt as _;
        let llm = OfflineLlm::new();
        let request = CompletionRequest::new(vec![Message::user("tell me about the sea")]);
        let whole = llm.complete(&request).await.unwrap();
        let chunks: Vec<CompletionChunk> = llm
            .stream(&request)
            .await
            .unwrap()
            .map(Result::unwrap)
            .collect()
            .await;
        let texts = chunks
            .iter()
            .filter(|c| matches!(c, CompletionChunk::Content { .. }))
            .count();
        assert!(texts > 1, "{chunks:?}");
        let mut folded = ChunkAccumulator::new();
        for c in chunks {
            folded.push(c);
        }
        let folded = folded.finish();
        assert_eq!(folded.content, whole.content);
        assert_eq!(folded.usage, whole.usage);
    }

    proptest! {
        #[test]
        fn text_pieces_concatenate_to_the_text(text in "[ a-z\\n]{0,80}") {
            let pieces = text_pieces(&text);
            prop_assert_eq!(pieces.concat(), text.clone());
            prop_assert!(pieces.iter().all(|p| !p.is_empty()));
            prop_assert!(pieces.iter().all(|p| p.chars().count() <= PIECE_CHARS));
            prop_assert!(pieces.len() >= text.split_whitespace().count());
        }
    }

    fn judge_schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "schema_version": {"const": 1},
                "journey_state": {"type": "string", "enum": ["onboarding", "onboarded"]},
                "mastery_rating": {"type": "integer", "minimum": 0, "maximum": 10},
                "mastery_level": {"type": "string", "enum": ["novice", "beginner", "intermediate", "proficient", "power_user"]},
                "mastery_description": {"type": "string"},
                "reasoning": {"type": "string", "minLength": 3}
            },
            "required": ["schema_version", "journey_state", "mastery_rating", "mastery_level", "mastery_description", "reasoning"],
            "additionalProperties": false
        })
    }

    fn welcome_schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "should_send": {"type": "boolean"},
                "reasoning": {"type": "string"},
                "timing_assessment": {"type": "string"},
                "workflow_completion": {"type": "array", "items": {
                    "type": "object",
                    "properties": {
                        "workflow_id": {"type": "string"},
                        "status": {"type": "string", "enum": ["not_started", "in_progress", "completed"]},
                        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                        "evidence": {"type": "string"}
                    },
                    "required": ["workflow_id", "status", "confidence", "evidence"]
                }},
                "onboarding_complete": {"type": "boolean"},
                "message": {"type": "string", "maxLength": 400},
                "suggested_flows": {"type": "array", "items": {"type": "object"}, "maxItems": 2},
                "primary_tour_id": {"type": ["string", "null"]}
            },
            "required": ["should_send", "reasoning", "timing_assessment", "workflow_completion", "onboarding_complete", "message", "suggested_flows"]
        })
    }

    #[test]
    fn conservative_fill_is_valid_for_the_project_prompts() {
        for schema in [judge_schema(), welcome_schema()] {
            let v = fill_schema(&schema, &PromptFacts::default());
            assert_eq!(parlance_core::validate(&schema, &v), Ok(()), "{v}");
        }
        let v = fill_schema(&welcome_schema(), &PromptFacts::default());
        assert_eq!(v["should_send"], false);
        assert_eq!(v["onboarding_complete"], false);
        assert_eq!(v["workflow_completion"], json!([]));
        assert_eq!(v["primary_tour_id"], Value::Null);
        let v = fill_schema(&judge_schema(), &PromptFacts::default());
        assert_eq!(v["journey_state"], "onboarding");
        assert_eq!(v["mastery_level"], "novice");
        assert_eq!(v["mastery_rating"], 0);
        assert_eq!(v["schema_version"], 1);
    }

    #[test]
    fn stated_facts_fill_matching_properties() {
        let request = CompletionRequest::new(vec![
            Message::system("You judge adoption."),
            Message::user(
                "Role: admin\nmastery rating: 42\n- journey_state: ONBOARDED\nsignals: {\"should_send\": true, \"primary_tour_id\": \"t-7\"}",
            ),
        ]);
        let facts = prompt_facts(&request);
        let judge = fill_schema(&judge_schema(), &facts);
        assert_eq!(judge["journey_state"], "onboarded");
        assert_eq!(judge["mastery_rating"], 10, "clamped to the maximum");
        let welcome = fill_schema(&welcome_schema(), &facts);
        assert_eq!(welcome["should_send"], true);
        assert_eq!(welcome["primary_tour_id"], "t-7");
        assert_eq!(parlance_core::validate(&welcome_schema(), &welcome), Ok(()));
    }

    #[test]
    fn numbers_respect_exclusive_bounds() {
        let s = json!({"type": "integer", "exclusiveMinimum": 2, "maximum": 9});
        assert_eq!(fill_schema(&s, &PromptFacts::default()), json!(3));
        let s = json!({"type": "number", "minimum": -5, "maximum": -1});
        assert_eq!(fill_schema(&s, &PromptFacts::default()), json!(-5.0));
        let s = json!({"type": "number"});
        assert_eq!(fill_schema(&s, &PromptFacts::default()), json!(0.0));
    }

    fn arb_schema() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            (0u64..4, 0u64..20).prop_map(
                |(min, extra)| json!({"type": "string", "minLength": min, "maxLength": min + extra})
            ),
            (-20i64..20, 0i64..10).prop_map(
                |(lo, span)| json!({"type": "integer", "minimum": lo, "maximum": lo + span})
            ),
            (-5.0f64..5.0, 0.0f64..3.0).prop_map(
                |(lo, span)| json!({"type": "number", "minimum": lo, "maximum": lo + span})
            ),
            (-5i64..5).prop_map(|lo| json!({"type": "integer", "exclusiveMinimum": lo})),
            Just(json!({"type": "boolean"})),
            Just(json!({"type": ["string", "null"]})),
            prop::collection::vec("[a-z_]{1,8}", 1..4)
                .prop_map(|e| json!({"type": "string", "enum": e})),
        ];
        leaf.prop_recursive(3, 20, 4, |inner| {
            prop_oneof![
                prop::collection::btree_map("[a-d]", inner.clone(), 0..4).prop_map(|props| {
                    let required: Vec<&String> = props.keys().collect();
                    json!({"type": "object", "properties": props, "required": required, "additionalProperties": false})
                }),
                (inner, 0u64..3, 0u64..3).prop_map(|(items, min, extra)| {
                    json!({"type": "array", "items": items, "minItems": min, "maxItems": min + extra})
                }),
            ]
        })
    }

    proptest::proptest! {
        #[test]
        fn the_fallback_always_fits_its_schema(
            schema in arb_schema(),
            prompt in "([a-d]: ([a-z_]{1,8}|-?[0-9]{1,3}(\\.[0-9])?|true|false|null)\n){0,6}",
            json_facts in proptest::option::of(arb_schema()),
        ) {
            let mut text = prompt;
            if let Some(v) = json_facts {
                // Another schema's fill, stated as JSON facts.
                text.push_str(&fill_schema(&v, &PromptFacts::default()).to_string());
            }
            let request = CompletionRequest::new(vec![Message::user(text)]);
            let v = fill_schema(&schema, &prompt_facts(&request));
            proptest::prop_assert_eq!(parlance_core::validate(&schema, &v), Ok(()), "{} for {}", v, schema);
        }
    }

    #[tokio::test]
    async fn a_passed_deadline_is_a_timeout() {
        let llm = OfflineLlm::new();
        let now = std::time::Instant::now();
        let late = CompletionRequest::new(vec![Message::user("hello")]).with_deadline(now);
        assert!(matches!(
            llm.complete(&late).await,
            Err(LlmError::Timeout { .. })
        ));
        let in_time = CompletionRequest::new(vec![Message::user("hello")])
            .with_deadline(now + std::time::Duration::from_secs(60));
        assert!(llm.complete(&in_time).await.is_ok());
    }

    #[tokio::test]
    async fn rules_then_fallback() {
        let llm =
            OfflineLlm::new().with_rule(When::PromptName("judge".into()), Reply::text("scripted"));
        llm.push_reply(Reply::Error(LlmError::RateLimited { retry_after: None }));
        let req = CompletionRequest::new(vec![Message::user("hello there")]);
        assert!(matches!(
            llm.complete(&req).await,
            Err(LlmError::RateLimited { .. })
        ));
        let r = llm.complete(&req).await.unwrap();
        assert_eq!(r.content, "(offline reply) Noted: hello there");
        llm.add_rule(Rule {
            when: When::UserContains("REFUND".into()),
            reply: Reply::text("refunds go to a human"),
            remaining: Some(1),
        });
        let refund = CompletionRequest::new(vec![
            Message::system("Never promise a refund."),
            Message::user("I want a refund"),
        ]);
        assert_eq!(
            llm.complete(&refund).await.unwrap().content,
            "refunds go to a human"
        );
        let system_only =
            CompletionRequest::new(vec![Message::system("refund policy"), Message::user("hi")]);
        llm.add_rule(Rule {
            when: When::UserContains("refund".into()),
            reply: Reply::text("unused"),
            remaining: None,
        });
        assert_eq!(
            llm.complete(&system_only).await.unwrap().content,
            "(offline reply) Noted: hi"
        );
        let named = req.clone().with_prompt_name("judge");
        assert_eq!(llm.complete(&named).await.unwrap().content, "scripted");
        assert_eq!(llm.complete(&named).await.unwrap().content, "scripted");
        assert_eq!(llm.received().len(), 6);
    }

    #[tokio::test]
    async fn combined_conditions_match_as_a_whole() {
        let tool = ToolDefinition {
            name: "request_human".into(),
            description: "hand over".into(),
            parameters: json!({"type": "object", "properties": {"reason": {"type": "string"}}}),
        };
        let hand_off = When::All(vec![
            When::ToolOffered("request_human".into()),
            When::LastFromUser,
            When::AnyOf(vec![
                When::UserContains("person".into()),
                When::UserContains("human".into()),
            ]),
        ]);
        let llm = OfflineLlm::new().with_rule(
            hand_off,
            Reply::tool_call("request_human", json!({"reason": "asked for a person"})),
        );
        let ask = |messages: Vec<Message>, offered: bool| {
            let request = CompletionRequest::new(messages);
            if offered {
                request.with_tools(vec![tool.clone()])
            } else {
                request
            }
        };
        let wants = || vec![Message::system("be kind"), Message::user("A HUMAN please")];
        let called = llm.complete(&ask(wants(), true)).await.unwrap();
        assert_eq!(called.tool_calls[0].name, "request_human");
        assert_eq!(
            called.tool_calls[0].arguments,
            r#"{"reason":"asked for a person"}"#
        );
        let person = vec![Message::user("can I talk to a person?")];
        assert_eq!(
            llm.complete(&ask(person, true))
                .await
                .unwrap()
                .tool_calls
                .len(),
            1
        );

        // Each part is needed: the tool offered, the newest message the
        // user's, and one of the words in it.
        let not_offered = llm.complete(&ask(wants(), false)).await.unwrap();
        assert!(not_offered.tool_calls.is_empty());
        let mut answered = wants();
        answered.push(Message::assistant("[operator] Sam here, how can I help?"));
        assert!(
            llm.complete(&ask(answered, true))
                .await
                .unwrap()
                .tool_calls
                .is_empty()
        );
        let other = vec![Message::user("Tuesday is fine")];
        assert!(
            llm.complete(&ask(other, true))
                .await
                .unwrap()
                .tool_calls
                .is_empty()
        );

        let empty = CompletionRequest::new(vec![Message::user("hi")]);
        assert!(When::All(Vec::new()).matches(&empty));
        assert!(!When::AnyOf(Vec::new()).matches(&empty));
        assert!(!When::LastFromUser.matches(&CompletionRequest::new(vec![Message::system("x")])));
    }

    #[tokio::test]
    async fn required_tool_choice_calls_a_tool() {
        let llm = OfflineLlm::new();
        let mut req = CompletionRequest::new(vec![Message::user("outcome: booked")]).with_tools(vec![
            ToolDefinition {
                name: "end_conversation".into(),
                description: "end".into(),
                parameters: json!({"type": "object", "properties": {"outcome": {"type": "string"}}, "required": ["outcome"]}),
            },
        ]);
        req.tool_choice = Some(ToolChoice::Required);
        let r = llm.complete(&req).await.unwrap();
        assert_eq!(r.finish_reason, FinishReason::ToolCalls);
        assert_eq!(r.tool_calls[0].name, "end_conversation");
        assert_eq!(r.tool_calls[0].arguments, r#"{"outcome":"booked"}"#);
        // A string that must not be empty and has no stated value gets the
        // text fallback's reply.
        req.messages = vec![Message::user("Can we talk tomorrow?")];
        req.tools[0].parameters =
            json!({"type": "object", "properties": {"text": {"type": "string", "minLength": 1}}});
        let r = llm.complete(&req).await.unwrap();
        assert_eq!(
            r.tool_calls[0].arguments,
            json!({"text": "(offline reply) Noted: Can we talk tomorrow?"}).to_string()
        );
        // Without a requirement the fallback answers in text.
        req.tool_choice = None;
        assert!(llm.complete(&req).await.unwrap().tool_calls.is_empty());
    }
}
