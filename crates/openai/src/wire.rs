//! The OpenAI chat-completions and embeddings wire format: port types to
//! request bodies, response bodies back to port types.

use parlance_ports::{
    CompletionChunk, CompletionRequest, CompletionResponse, FinishReason, Message, ResponseFormat,
    Role, ToolCall, ToolChoice, Usage,
};
use serde_json::{Map, Value, json};

/// Longest server error message kept, in bytes (cut on a character
/// boundary).
const MAX_ERROR_BYTES: usize = 512;

/// What a redacted secret is replaced by.
const REDACTED: &str = "[redacted]";

/// Shortest run of token characters taken for a key or token on its own
/// (hex digests, base64 and JWT-like strings).
const LONG_TOKEN: usize = 24;

/// A temperature as the decimal it was written as: widening the `f32`
/// itself would send `0.2` as `0.20000000298023224`.
fn temperature(t: f32) -> f64 {
    t.to_string().parse().unwrap_or(f64::from(t))
}

/// The body of `POST /chat/completions`.
pub(crate) fn chat_body(request: &CompletionRequest, model: &str, stream: bool) -> Value {
    let mut body = Map::new();
    body.insert(
        "model".into(),
        json!(request.model.as_deref().unwrap_or(model)),
    );
    body.insert(
        "messages".into(),
        Value::Array(request.messages.iter().map(message).collect()),
    );
    if let Some(t) = request.temperature {
        body.insert("temperature".into(), json!(temperature(t)));
    }
    if let Some(n) = request.max_tokens {
        body.insert("max_tokens".into(), json!(n));
    }
    match &request.response_format {
        ResponseFormat::Text => {}
        ResponseFormat::JsonObject => {
            body.insert("response_format".into(), json!({"type": "json_object"}));
        }
        ResponseFormat::JsonSchema {
            name,
            schema,
            strict,
        } => {
            body.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": strict}}),
            );
        }
    }
    if !request.tools.is_empty() {
        let tools = request
            .tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.name, "description": t.description, "parameters": t.parameters,
                }})
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    if let Some(choice) = &request.tool_choice {
        let v = match choice {
            ToolChoice::Auto => json!("auto"),
            ToolChoice::None => json!("none"),
            ToolChoice::Required => json!("required"),
            ToolChoice::Function(name) => json!({"type": "function", "function": {"name": name}}),
        };
        body.insert("tool_choice".into(), v);
    }
    if stream {
        body.insert("stream".into(), json!(true));
        body.insert("stream_options".into(), json!({"include_usage": true}));
    }
    Value::Object(body)
}

fn message(m: &Message) -> Value {
    let mut out = Map::new();
    out.insert("role".into(), json!(m.role.as_str()));
    if m.role == Role::Assistant && !m.tool_calls.is_empty() {
        out.insert(
            "content".into(),
            if m.content.is_empty() {
                Value::Null
            } else {
                json!(m.content)
            },
        );
        let calls = m
            .tool_calls
            .iter()
            .map(|c| {
                json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}})
            })
            .collect();
        out.insert("tool_calls".into(), Value::Array(calls));
    } else {
        out.insert("content".into(), json!(m.content));
    }
    if let Some(id) = &m.tool_call_id {
        out.insert("tool_call_id".into(), json!(id));
    }
    Value::Object(out)
}

fn text(v: &Value) -> Option<String> {
    v.as_str().map(str::to_owned)
}

fn count(v: &Value, key: &str) -> u32 {
    v.get(key)
        .and_then(Value::as_u64)
        .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX))
}

/// Usage from a `usage` object, when present and not null.
pub(crate) fn usage(v: Option<&Value>) -> Option<Usage> {
    let u = v.filter(|u| u.is_object())?;
    let prompt = count(u, "prompt_tokens");
    let completion = count(u, "completion_tokens");
    let total = u
        .get("total_tokens")
        .and_then(Value::as_u64)
        .map_or(prompt.saturating_add(completion), |n| {
            u32::try_from(n).unwrap_or(u32::MAX)
        });
    Some(Usage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        total_tokens: total,
    })
}

/// The server's call id, or `call_<index>` when it gave none (some local
/// servers omit it, and a tool result must quote one).
fn call_id(id: Option<&Value>, index: u64) -> String {
    match id.and_then(Value::as_str) {
        Some(id) if !id.is_empty() => id.to_owned(),
        _ => format!("call_{index}"),
    }
}

/// A whole chat-completion answer.
pub(crate) fn chat_response(body: &Value, model: &str) -> Result<CompletionResponse, String> {
    let choice = body
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .ok_or("response has no choices")?;
    let msg = choice.get("message").ok_or("choice has no message")?;
    let tool_calls = msg
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(|calls| {
            calls
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let f = c.get("function").unwrap_or(&Value::Null);
                    Ok(ToolCall {
                        id: call_id(c.get("id"), i as u64),
                        name: f
                            .get("name")
                            .and_then(text)
                            .ok_or("tool call has no function name")?,
                        arguments: match f.get("arguments") {
                            Some(Value::String(s)) => s.clone(),
                            // Some servers send the arguments as an object.
                            Some(v @ Value::Object(_)) => v.to_string(),
                            _ => "{}".to_owned(),
                        },
                    })
                })
                .collect::<Result<Vec<_>, &str>>()
        })
        .transpose()?
        .unwrap_or_default();
    let finish_reason = match choice.get("finish_reason").and_then(Value::as_str) {
        Some(r) => FinishReason::parse(r),
        None if !tool_calls.is_empty() => FinishReason::ToolCalls,
        None => FinishReason::Stop,
    };
    Ok(CompletionResponse {
        model: body
            .get("model")
            .and_then(text)
            .unwrap_or_else(|| model.to_owned()),
        content: msg.get("content").and_then(text).unwrap_or_default(),
        tool_calls,
        finish_reason,
        usage: usage(body.get("usage")),
    })
}

/// The chunks one streamed `chat.completion.chunk` carries. `with_model`
/// asks for a `Model` chunk (the first time a name is seen).
pub(crate) fn stream_chunks(
    body: &Value,
    with_model: bool,
) -> Result<Vec<CompletionChunk>, String> {
    if let Some(err) = body.get("error") {
        return Err(error_text(err));
    }
    let mut out = Vec::new();
    if with_model && let Some(name) = body.get("model").and_then(text) {
        out.push(CompletionChunk::Model { name });
    }
    let choices = body.get("choices").and_then(Value::as_array);
    if let Some(choice) = choices.and_then(|c| c.first()) {
        let delta = choice.get("delta").unwrap_or(&Value::Null);
        if let Some(t) = delta.get("content").and_then(Value::as_str)
            && !t.is_empty()
        {
            out.push(CompletionChunk::Content { text: t.to_owned() });
        }
        for (i, c) in delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let f = c.get("function").unwrap_or(&Value::Null);
            let index = c.get("index").and_then(Value::as_u64).unwrap_or(i as u64);
            let name = f.get("name").and_then(text);
            // The first piece (the one naming the function) always has an id.
            let id = match (c.get("id").and_then(text), &name) {
                (Some(id), _) if !id.is_empty() => Some(id),
                (_, Some(_)) => Some(call_id(None, index)),
                _ => None,
            };
            out.push(CompletionChunk::ToolCall {
                index: u32::try_from(index).map_err(|_| "tool call index out of range")?,
                id,
                name,
                arguments: f.get("arguments").and_then(text).unwrap_or_default(),
            });
        }
        if let Some(r) = choice.get("finish_reason").and_then(Value::as_str) {
            out.push(CompletionChunk::Finish {
                reason: FinishReason::parse(r),
            });
        }
    } else if choices.is_none() && body.get("usage").is_none() {
        return Err("stream chunk has neither choices nor usage".to_owned());
    }
    if let Some(u) = usage(body.get("usage")) {
        out.push(CompletionChunk::Usage { usage: u });
    }
    Ok(out)
}

/// The body of `POST /embeddings`.
pub(crate) fn embeddings_body(texts: &[String], model: &str, dimensions: Option<usize>) -> Value {
    let mut body = json!({"model": model, "input": texts, "encoding_format": "float"});
    if let Some(d) = dimensions {
        body["dimensions"] = json!(d);
    }
    body
}

/// The vectors of an embeddings answer, in input order.
pub(crate) fn embeddings_response(body: &Value, expected: usize) -> Result<Vec<Vec<f32>>, String> {
    let data = body
        .get("data")
        .and_then(Value::as_array)
        .ok_or("response has no data")?;
    if data.len() != expected {
        return Err(format!("asked for {expected} vectors, got {}", data.len()));
    }
    let mut slots: Vec<Option<Vec<f32>>> = vec![None; expected];
    for (i, item) in data.iter().enumerate() {
        let index = item
            .get("index")
            .and_then(Value::as_u64)
            .map_or(i, |n| usize::try_from(n).unwrap_or(usize::MAX));
        let vector = item
            .get("embedding")
            .and_then(Value::as_array)
            .ok_or("item has no embedding array")?
            .iter()
            .map(|x| {
                x.as_f64()
                    .map(|f| f as f32)
                    .ok_or("embedding holds a non-number")
            })
            .collect::<Result<Vec<f32>, _>>()?;
        let slot = slots.get_mut(index).ok_or("embedding index out of range")?;
        if slot.replace(vector).is_some() {
            return Err(format!("embedding index {index} given twice"));
        }
    }
    let vectors: Vec<Vec<f32>> = slots.into_iter().flatten().collect();
    if let Some(first) = vectors.first()
        && vectors.iter().any(|v| v.len() != first.len())
    {
        return Err("vectors of different dimensions".to_owned());
    }
    Ok(vectors)
}

/// The message of an error body (`{"error": {"message": ...}}`,
/// `{"error": "..."}`, or the raw text), scrubbed of anything that looks
/// like a key ([`scrub`]) and cut to [`MAX_ERROR_BYTES`]. Servers echo
/// requests, headers and keys in their errors, and these messages reach
/// logs and error values.
pub(crate) fn error_message(body: &[u8]) -> String {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    match parsed.as_ref().and_then(|v| v.get("error")) {
        Some(e) => error_text(e),
        None => scrub(String::from_utf8_lossy(body).trim()),
    }
}

fn error_text(e: &Value) -> String {
    let msg = match e {
        Value::String(s) => s.clone(),
        other => other
            .get("message")
            .and_then(text)
            .unwrap_or_else(|| other.to_string()),
    };
    scrub(&msg)
}

/// Characters a key, token or word is made of.
fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '+' | '/' | '~')
}

/// Names whose value, after `=` or `:`, is a secret.
fn names_a_secret(word: &str) -> bool {
    let w = word.to_ascii_lowercase();
    let w = w.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    [
        "api_key",
        "api-key",
        "apikey",
        "key",
        "access_token",
        "refresh_token",
        "token",
        "secret",
        "client_secret",
        "password",
        "authorization",
        "x-api-key",
    ]
    .iter()
    .any(|n| w == *n || w.ends_with(&format!("_{n}")) || w.ends_with(&format!("-{n}")))
}

/// A word that is a key on its own: an `sk-`/`pk_`/`rk-` style key, or a
/// long run of letters and digits (hex, base64, a JWT).
fn is_secret_word(word: &str) -> bool {
    let body = |p: &str| word.strip_prefix(p).is_some_and(|rest| rest.len() >= 8);
    if [
        "sk-", "sk_", "pk_", "pk-", "rk-", "rk_", "key-", "xoxb-", "ghp_",
    ]
    .iter()
    .any(|p| body(p))
    {
        return true;
    }
    word.len() >= LONG_TOKEN
        && word.chars().any(|c| c.is_ascii_digit())
        && word.chars().any(|c| c.is_ascii_alphabetic())
}

/// `s` with anything that looks like a secret replaced by `[redacted]`:
/// keys by their shape (`sk-...`, long hex or base64 runs), the word after
/// `Bearer` or `Basic`, and the value after a secret's name and `=` or `:`
/// (`api_key=...`, `"token": "..."`); then cut to [`MAX_ERROR_BYTES`] on a
/// character boundary, with `...` when cut.
pub(crate) fn scrub(s: &str) -> String {
    #[derive(PartialEq)]
    enum Next {
        Plain,
        /// After a secret's name: its value follows a `=` or `:`.
        Name,
        /// The next word is a secret.
        Secret,
    }
    let mut out = String::with_capacity(s.len().min(MAX_ERROR_BYTES + 3));
    let mut next = Next::Plain;
    let mut rest = s;
    while let Some(first) = rest.chars().next() {
        let tok = is_token_char(first);
        let end = rest
            .char_indices()
            .find(|&(_, c)| is_token_char(c) != tok)
            .map_or(rest.len(), |(i, _)| i);
        let (piece, after) = rest.split_at(end);
        rest = after;
        if !tok {
            next = match next {
                Next::Name if piece.contains(['=', ':']) => Next::Secret,
                Next::Secret if !piece.contains(['\n', ',', ';', '&']) => Next::Secret,
                _ => Next::Plain,
            };
            out.push_str(piece);
            continue;
        }
        let scheme = piece.eq_ignore_ascii_case("bearer") || piece.eq_ignore_ascii_case("basic");
        if scheme {
            // `Authorization: Bearer <token>`: the token is the secret.
            out.push_str(piece);
            next = Next::Secret;
        } else if next == Next::Secret || is_secret_word(piece) {
            out.push_str(REDACTED);
            next = Next::Plain;
        } else {
            out.push_str(piece);
            next = if names_a_secret(piece) {
                Next::Name
            } else {
                Next::Plain
            };
        }
    }
    truncate(&out)
}

/// `s` cut to at most [`MAX_ERROR_BYTES`] bytes on a character boundary,
/// with `...` appended when cut.
fn truncate(s: &str) -> String {
    if s.len() <= MAX_ERROR_BYTES {
        return s.to_owned();
    }
    let mut cut = MAX_ERROR_BYTES;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &s[..cut])
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_temperature_is_sent_as_the_decimal_it_was_written_as() {
        for (t, text) in [(0.2_f32, "0.2"), (0.7, "0.7"), (1.0, "1.0"), (0.0, "0.0")] {
            let req = parlance_ports::CompletionRequest::new(vec![]).with_temperature(t);
            let body = super::chat_body(&req, "m", false);
            assert_eq!(body["temperature"].to_string(), text);
        }
    }

    use parlance_ports::{Message, ToolDefinition};

    use super::*;

    #[test]
    fn requests_use_the_openai_shape() {
        let req = CompletionRequest::new(vec![
            Message::system("be brief"),
            Message::assistant_tool_calls(vec![ToolCall {
                id: "c1".into(),
                name: "f".into(),
                arguments: "{}".into(),
            }]),
            Message::tool("c1", "done"),
        ])
        .with_json_schema("judge", json!({"type": "object"}))
        .with_tools(vec![ToolDefinition {
            name: "f".into(),
            description: "d".into(),
            parameters: json!({"type": "object"}),
        }])
        .with_max_tokens(5)
        .with_prompt_name("never sent");
        let body = chat_body(&req, "m", true);
        assert_eq!(
            body,
            json!({
                "model": "m",
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                    {"role": "tool", "content": "done", "tool_call_id": "c1"}
                ],
                "max_tokens": 5,
                "response_format": {"type": "json_schema", "json_schema": {"name": "judge", "schema": {"type": "object"}, "strict": true}},
                "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}],
                "stream": true,
                "stream_options": {"include_usage": true}
            })
        );
    }

    #[test]
    fn answers_and_errors_are_read() {
        let body = json!({"model": "gpt", "choices": [{"message": {"content": null, "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
        ]}, "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}});
        let r = chat_response(&body, "m").unwrap();
        assert_eq!(r.tool_calls[0].arguments, r#"{"a":1}"#);
        assert_eq!(r.usage, Some(Usage::new(3, 2)));
        assert!(chat_response(&json!({"choices": []}), "m").is_err());
        let no_id = json!({"choices": [{"message": {"tool_calls": [
            {"function": {"name": "f", "arguments": "{}"}},
            {"id": "", "function": {"name": "g", "arguments": "{}"}}
        ]}}]});
        let r = chat_response(&no_id, "m").unwrap();
        assert_eq!(
            (r.tool_calls[0].id.as_str(), r.tool_calls[1].id.as_str()),
            ("call_0", "call_1")
        );
        assert_eq!(r.finish_reason, FinishReason::ToolCalls);
        let piece = json!({"choices": [{"delta": {"tool_calls": [{"index": 2, "function": {"name": "f", "arguments": ""}}]}}]});
        assert!(matches!(
            &stream_chunks(&piece, false).unwrap()[0],
            CompletionChunk::ToolCall { id: Some(id), .. } if id == "call_2"
        ));
        assert_eq!(
            error_message(br#"{"error": {"message": "bad key"}}"#),
            "bad key"
        );
        assert_eq!(
            error_message(br#"{"error": "model not found"}"#),
            "model not found"
        );
        assert_eq!(error_message(b"  plain  "), "plain");
    }

    #[test]
    fn keys_in_error_bodies_are_redacted() {
        let cases = [
            (
                r#"{"error": {"message": "Incorrect API key provided: sk-proj-AbC123xyz789. You can find your API key at https://platform.openai.com/account/api-keys."}}"#,
                "sk-proj-AbC123xyz789",
            ),
            (
                "upstream said: Authorization: Bearer abc.def-ghi_jkl was refused",
                "abc.def-ghi_jkl",
            ),
            (
                "GET /v1/models?api_key=s3cr3t-value&x=1 failed",
                "s3cr3t-value",
            ),
            (r#"{"error": {"code": 1, "api_key": "hunter2"}}"#, "hunter2"),
            (
                "digest 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 rejected",
                "9f86d081884c7d659a2feaa0c55ad015",
            ),
            (
                "token eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJl0 expired",
                "eyJhbGciOiJIUzI1NiJ9",
            ),
            ("password: letmein, user: bob", "letmein"),
            ("api-key = 'quoted-secret' used", "quoted-secret"),
        ];
        for (body, secret) in cases {
            let shown = error_message(body.as_bytes());
            assert!(!shown.contains(secret), "{secret} left in {shown}");
            assert!(shown.contains("[redacted]"), "{shown}");
        }
        let plain = "The model `gpt-4o-mini` does not exist or you do not have access to it.";
        assert_eq!(error_message(plain.as_bytes()), plain);
        assert_eq!(
            error_message(br#"{"error": {"message": "Rate limit reached for requests"}}"#),
            "Rate limit reached for requests"
        );
        assert_eq!(
            scrub("user: bob, key: k-123 and more"),
            "user: bob, key: [redacted] and more"
        );
    }

    #[test]
    fn long_error_bodies_are_cut_on_a_char_boundary() {
        let long = "é".repeat(400);
        let shown = error_message(long.as_bytes());
        assert!(shown.ends_with("..."), "{shown}");
        let kept = shown.trim_end_matches("...");
        assert!(kept.len() <= MAX_ERROR_BYTES && kept.len() >= MAX_ERROR_BYTES - 1);
        assert!(kept.chars().all(|c| c == 'é'));
        let words = "word ".repeat(1000);
        assert!(error_message(words.as_bytes()).len() <= MAX_ERROR_BYTES + 3);
        let short = "x".repeat(MAX_ERROR_BYTES);
        assert_eq!(error_message(short.as_bytes()), short);
        // A key straddling the cut is redacted before the cut, never half shown.
        let straddle = format!("{} sk-abcdefghijklmnop1234", "y ".repeat(250));
        assert!(!error_message(straddle.as_bytes()).contains("sk-abc"));
    }

    #[test]
    fn embeddings_are_put_back_in_input_order() {
        let body = json!({"data": [
            {"index": 1, "embedding": [0.0, 1.0]},
            {"index": 0, "embedding": [1.0, 0.0]}
        ]});
        assert_eq!(
            embeddings_response(&body, 2).unwrap(),
            vec![vec![1.0, 0.0], vec![0.0, 1.0]]
        );
        assert!(embeddings_response(&body, 3).is_err());
        let dup =
            json!({"data": [{"index": 0, "embedding": [1.0]}, {"index": 0, "embedding": [1.0]}]});
        assert!(embeddings_response(&dup, 2).is_err());
    }
}
