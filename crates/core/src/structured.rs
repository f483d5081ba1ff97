//! Structured model output: find the JSON in a raw answer (bare, inside
//! Markdown fences or inside prose), check it against a JSON schema, and
//! return a typed value or a typed error. Nothing here panics, whatever the
//! input.
//!
//! The validator covers the subset of JSON Schema the project's prompts use:
//! `type` (one name or a list), `properties`, `required`,
//! `additionalProperties` (boolean or schema), `items`, `enum`, `const`,
//! `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`,
//! `minLength`, `maxLength`, `minItems`, `maxItems`, `anyOf` and `oneOf`
//! (treated as `anyOf`). Other keywords are ignored.

use std::fmt;

use serde::de::DeserializeOwned;
use serde_json::Value;

/// How deep a schema and value are followed before giving up (serde_json
/// already refuses documents nested deeper than 128).
const MAX_DEPTH: usize = 160;

/// Longest excerpt of the raw answer kept in an error.
const PREVIEW_CHARS: usize = 120;

/// Why a raw answer did not yield the value asked for.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum StructuredError {
    /// The answer is empty or whitespace.
    #[error("empty answer")]
    Empty,
    /// No JSON value could be read anywhere in the answer.
    #[error("no json found in answer starting {preview:?}")]
    NoJson {
        /// The first characters of the answer.
        preview: String,
    },
    /// JSON was found but breaks the schema.
    #[error("answer does not match the schema: {}", join(violations))]
    Schema {
        /// Every violation, with its path.
        violations: Vec<Violation>,
    },
    /// JSON matches the schema but not the Rust type.
    #[error("answer does not fit the expected type: {message}")]
    Shape {
        /// serde's explanation.
        message: String,
    },
}

fn join(violations: &[Violation]) -> String {
    violations
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// One way a value breaks a schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Where, as a JSON pointer (`""` is the root, `/a/0` the first item of `a`).
    pub path: String,
    /// What is wrong, lowercase.
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = if self.path.is_empty() {
            "/"
        } else {
            &self.path
        };
        write!(f, "{path}: {}", self.message)
    }
}

/// Extracts, validates and converts a model answer in one step.
///
/// The answer may be bare JSON, fenced, or inside prose; the first JSON
/// value that satisfies `schema` is converted to `T`:
///
/// ```
/// use parlance_core::{StructuredError, parse_structured};
/// use serde::Deserialize;
/// use serde_json::json;
///
/// #[derive(Debug, Deserialize, PartialEq)]
/// struct Verdict {
///     score: u8,
/// }
///
/// let schema = json!({
///     "type": "object",
///     "properties": {"score": {"type": "integer", "minimum": 0, "maximum": 10}},
///     "required": ["score"],
/// });
/// let raw = "Sure! Here it is:\n```json\n{\"score\": 7}\n```";
/// assert_eq!(parse_structured::<Verdict>(raw, &schema)?, Verdict { score: 7 });
///
/// let err = parse_structured::<Verdict>(r#"{"score": 11}"#, &schema).unwrap_err();
/// assert!(matches!(err, StructuredError::Schema { .. }));
/// let err = parse_structured::<Verdict>("no idea", &schema).unwrap_err();
/// assert!(matches!(err, StructuredError::NoJson { .. }));
/// # Ok::<(), StructuredError>(())
/// ```
///
/// # Errors
///
/// [`StructuredError`] says which step failed.
pub fn parse_structured<T: DeserializeOwned>(
    raw: &str,
    schema: &Value,
) -> Result<T, StructuredError> {
    let value = extract_valid(raw, schema)?;
    serde_json::from_value(value).map_err(|e| StructuredError::Shape {
        message: e.to_string(),
    })
}

/// The first JSON value in `raw` that satisfies `schema`; when none does,
/// the violations of the first JSON value found.
///
/// # Errors
///
/// `Empty`, `NoJson` or `Schema`.
pub fn extract_valid(raw: &str, schema: &Value) -> Result<Value, StructuredError> {
    if raw.trim().is_empty() {
        return Err(StructuredError::Empty);
    }
    let candidates = json_candidates(raw);
    let mut first_violations = None;
    for value in candidates {
        match validate(schema, &value) {
            Ok(()) => return Ok(value),
            Err(v) => {
                first_violations.get_or_insert(v);
            }
        }
    }
    match first_violations {
        Some(violations) => Err(StructuredError::Schema { violations }),
        None => Err(StructuredError::NoJson {
            preview: preview(raw),
        }),
    }
}

/// The first JSON value in `raw`: the whole text, else a fenced block, else
/// the first balanced object or array inside prose. Objects and arrays are
/// preferred to bare scalars found in prose.
///
/// # Errors
///
/// `Empty` or `NoJson`.
pub fn extract_json(raw: &str) -> Result<Value, StructuredError> {
    if raw.trim().is_empty() {
        return Err(StructuredError::Empty);
    }
    json_candidates(raw)
        .into_iter()
        .next()
        .ok_or_else(|| StructuredError::NoJson {
            preview: preview(raw),
        })
}

/// Every JSON value that can be read from `raw`, most likely first: the
/// whole text, fenced blocks, then balanced objects and arrays in prose.
pub fn find_json_values(raw: &str) -> Vec<Value> {
    json_candidates(raw)
}

fn preview(raw: &str) -> String {
    raw.trim().chars().take(PREVIEW_CHARS).collect()
}

/// Every JSON value that can be read from `raw`, most likely first.
fn json_candidates(raw: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let trimmed = raw.trim().trim_start_matches('\u{feff}');
    if let Ok(v) = serde_json::from_str::<Value>(trimmed) {
        out.push(v);
        return out;
    }
    for block in fenced_blocks(raw) {
        if let Ok(v) = serde_json::from_str::<Value>(block.trim()) {
            out.push(v);
        } else {
            out.extend(balanced_values(block));
        }
    }
    out.extend(balanced_values(raw));
    out
}

/// The bodies of Markdown code fences (```` ``` ```` or `~~~`, any info
/// string), in order; an unclosed fence runs to the end.
fn fenced_blocks(raw: &str) -> Vec<&str> {
    let mut blocks = Vec::new();
    let mut rest = raw;
    while let Some((start, fence)) = find_fence(rest) {
        let after = &rest[start + fence.len()..];
        // Skip the info string (`json`, `JSON`, ...) up to the end of the line;
        // a fence closed on the same line holds an inline body.
        let body_start = match after.find('\n') {
            Some(nl) if !after[..nl].contains(fence) => nl + 1,
            _ => after
                .char_indices()
                .find(|(_, c)| !c.is_alphanumeric() && *c != '_' && *c != '-')
                .map_or(after.len(), |(i, _)| i),
        };
        let body = &after[body_start..];
        match body.find(fence) {
            Some(end) => {
                blocks.push(&body[..end]);
                rest = &body[end + fence.len()..];
            }
            None => {
                blocks.push(body);
                break;
            }
        }
    }
    blocks
}

fn find_fence(s: &str) -> Option<(usize, &'static str)> {
    let back = s.find("```").map(|i| (i, "```"));
    let tilde = s.find("~~~").map(|i| (i, "~~~"));
    match (back, tilde) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// Values parsed from balanced `{...}` / `[...]` spans of `text`, scanning
/// left to right; a span that does not parse is skipped one character on.
fn balanced_values(text: &str) -> Vec<Value> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    // Bounds the work on adversarial input: at most this many scans.
    let mut scans = 0usize;
    while i < bytes.len() && scans < 256 {
        if bytes[i] == b'{' || bytes[i] == b'[' {
            scans += 1;
            if let Some(end) = balanced_end(bytes, i) {
                // `i` and `end` sit on ASCII brackets, so both are char boundaries.
                if let Some(span) = text.get(i..=end)
                    && let Ok(v) = serde_json::from_str::<Value>(span)
                {
                    out.push(v);
                    i = end + 1;
                    continue;
                }
            }
        }
        i += 1;
    }
    out
}

/// The index of the bracket closing the one at `start`, skipping brackets
/// inside strings; `None` when it never closes.
fn balanced_end(bytes: &[u8], start: usize) -> Option<usize> {
    let mut stack: Vec<u8> = Vec::new();
    let mut in_string = false;
    let mut escaped = false;
    for (offset, &b) in bytes[start..].iter().enumerate() {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' => stack.push(b'}'),
            b'[' => stack.push(b']'),
            b'}' | b']' => {
                if stack.pop() != Some(b) {
                    return None;
                }
                if stack.is_empty() {
                    return Some(start + offset);
                }
            }
            _ => {}
        }
        if stack.len() > MAX_DEPTH {
            return None;
        }
    }
    None
}

/// Checks `value` against `schema`.
///
/// # Errors
///
/// Every violation found, with its path.
pub fn validate(schema: &Value, value: &Value) -> Result<(), Vec<Violation>> {
    let mut violations = Vec::new();
    check(schema, value, &mut String::new(), 0, &mut violations);
    if violations.is_empty() {
        Ok(())
    } else {
        Err(violations)
    }
}

fn push(out: &mut Vec<Violation>, path: &str, message: String) {
    out.push(Violation {
        path: path.to_owned(),
        message,
    });
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(n) if n.as_f64().is_some_and(|f| f.fract() == 0.0) => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn has_type(value: &Value, ty: &str) -> bool {
    let actual = type_name(value);
    actual == ty || (ty == "number" && actual == "integer")
}

fn check(schema: &Value, value: &Value, path: &mut String, depth: usize, out: &mut Vec<Violation>) {
    if depth > MAX_DEPTH {
        push(out, path, "nested too deeply".to_owned());
        return;
    }
    let schema = match schema {
        Value::Bool(true) => return,
        Value::Bool(false) => {
            push(out, path, "no value is allowed here".to_owned());
            return;
        }
        Value::Object(s) => s,
        // A schema that is not a schema constrains nothing.
        _ => return,
    };

    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(branches)) = schema.get(key)
            && !branches.is_empty()
        {
            let fits = branches.iter().any(|b| {
                let mut scratch = Vec::new();
                check(b, value, &mut path.clone(), depth + 1, &mut scratch);
                scratch.is_empty()
            });
            if !fits {
                push(out, path, format!("matches none of the {key} branches"));
            }
        }
    }

    if let Some(ty) = schema.get("type") {
        let allowed: Vec<&str> = match ty {
            Value::String(t) => vec![t.as_str()],
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        if !allowed.is_empty() && !allowed.iter().any(|t| has_type(value, t)) {
            push(
                out,
                path,
                format!(
                    "expected {}, found {}",
                    allowed.join(" or "),
                    type_name(value)
                ),
            );
            // The other keywords would only repeat the type mismatch.
            return;
        }
    }

    if let Some(Value::Array(options)) = schema.get("enum")
        && !options.iter().any(|o| json_eq(o, value))
    {
        push(
            out,
            path,
            format!("{} is not one of {}", short(value), short_list(options)),
        );
    }
    if let Some(c) = schema.get("const")
        && !json_eq(c, value)
    {
        push(out, path, format!("expected {}", short(c)));
    }

    match value {
        Value::Number(n) => check_number(schema, n.as_f64().unwrap_or(f64::NAN), path, out),
        Value::String(s) => {
            let len = s.chars().count() as u64;
            if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
                && len < min
            {
                push(out, path, format!("shorter than {min} characters"));
            }
            if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
                && len > max
            {
                push(out, path, format!("longer than {max} characters"));
            }
        }
        Value::Array(items) => {
            let len = items.len() as u64;
            if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
                && len < min
            {
                push(out, path, format!("fewer than {min} items"));
            }
            if let Some(max) = schema.get("maxItems").and_then(Value::as_u64)
                && len > max
            {
                push(out, path, format!("more than {max} items"));
            }
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    let len = path.len();
                    path.push('/');
                    path.push_str(&i.to_string());
                    check(item_schema, item, path, depth + 1, out);
                    path.truncate(len);
                }
            }
        }
        Value::Object(map) => {
            if let Some(Value::Array(required)) = schema.get("required") {
                for name in required.iter().filter_map(Value::as_str) {
                    if !map.contains_key(name) {
                        push(out, path, format!("missing required property {name:?}"));
                    }
                }
            }
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties");
            for (key, v) in map {
                let len = path.len();
                path.push('/');
                path.push_str(&escape_pointer(key));
                match properties.and_then(|p| p.get(key)) {
                    Some(s) => check(s, v, path, depth + 1, out),
                    None => match additional {
                        Some(Value::Bool(false)) => {
                            path.truncate(len);
                            push(out, path, format!("unexpected property {key:?}"));
                        }
                        Some(s @ Value::Object(_)) => check(s, v, path, depth + 1, out),
                        _ => {}
                    },
                }
                path.truncate(len);
            }
        }
        Value::Null | Value::Bool(_) => {}
    }
}

fn check_number(
    schema: &serde_json::Map<String, Value>,
    n: f64,
    path: &str,
    out: &mut Vec<Violation>,
) {
    let bound = |k: &str| schema.get(k).and_then(Value::as_f64);
    if let Some(min) = bound("minimum")
        && n < min
    {
        push(out, path, format!("{n} is less than the minimum {min}"));
    }
    if let Some(max) = bound("maximum")
        && n > max
    {
        push(out, path, format!("{n} is greater than the maximum {max}"));
    }
    if let Some(min) = bound("exclusiveMinimum")
        && n <= min
    {
        push(out, path, format!("{n} is not greater than {min}"));
    }
    if let Some(max) = bound("exclusiveMaximum")
        && n >= max
    {
        push(out, path, format!("{n} is not less than {max}"));
    }
}

/// Equality where `1` and `1.0` are the same number.
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| json_eq(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 40 {
        let cut: String = s.chars().take(40).collect();
        format!("{cut}...")
    } else {
        s
    }
}

fn short_list(options: &[Value]) -> String {
    let items: Vec<String> = options.iter().take(10).map(short).collect();
    let more = if options.len() > 10 { ", ..." } else { "" };
    format!("[{}{more}]", items.join(", "))
}

fn escape_pointer(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde::Deserialize;
    use serde_json::json;

    use super::*;

    fn judge_schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "journey_state": {"type": "string", "enum": ["onboarding", "onboarded"]},
                "mastery_rating": {"type": "integer", "minimum": 0, "maximum": 10},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                "primary_tour_id": {"type": ["string", "null"]}
            },
            "required": ["journey_state", "mastery_rating"],
            "additionalProperties": false
        })
    }

    #[derive(Debug, Deserialize, PartialEq)]
    struct Judge {
        journey_state: String,
        mastery_rating: u8,
    }

    #[test]
    fn bare_fenced_and_prose_json_are_found() {
        let schema = judge_schema();
        let want = Judge {
            journey_state: "onboarded".into(),
            mastery_rating: 7,
        };
        let body = r#"{"journey_state": "onboarded", "mastery_rating": 7}"#;
        for raw in [
            body.to_owned(),
            format!("```json\n{body}\n```"),
            format!("Here you go:\n```\n{body}\n```\nAnything else?"),
            format!("~~~JSON\n{body}\n~~~"),
            format!("The answer is {body} as requested."),
            format!("```json\n{body}"),
            format!("```json {body} ```"),
        ] {
            assert_eq!(
                parse_structured::<Judge>(&raw, &schema).unwrap(),
                want,
                "{raw}"
            );
        }
    }

    #[test]
    fn the_first_valid_candidate_wins() {
        let raw = r#"Example: {"journey_state": "x"}. Real: {"journey_state": "onboarding", "mastery_rating": 0}"#;
        let v = extract_valid(raw, &judge_schema()).unwrap();
        assert_eq!(v["journey_state"], "onboarding");
    }

    #[test]
    fn violations_name_their_paths() {
        let v =
            json!({"journey_state": "lost", "mastery_rating": 11, "tags": ["a", 1], "extra": true});
        let errs = validate(&judge_schema(), &v).unwrap_err();
        let text: Vec<String> = errs.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            // In the order of the answer's own keys.
            [
                "/journey_state: \"lost\" is not one of [\"onboarding\", \"onboarded\"]",
                "/mastery_rating: 11 is greater than the maximum 10",
                "/tags/1: expected string, found integer",
                "/: unexpected property \"extra\"",
            ]
        );
        let missing = validate(&judge_schema(), &json!({})).unwrap_err();
        assert_eq!(missing.len(), 2);
        assert!(validate(&judge_schema(), &json!([])).is_err());
    }

    #[test]
    fn nullable_types_any_of_and_numbers() {
        let schema = judge_schema();
        let ok =
            json!({"journey_state": "onboarding", "mastery_rating": 3, "primary_tour_id": null});
        assert!(validate(&schema, &ok).is_ok());
        let s = json!({"anyOf": [{"type": "string"}, {"type": "integer", "minimum": 1}]});
        assert!(validate(&s, &json!("x")).is_ok());
        assert!(validate(&s, &json!(2)).is_ok());
        assert!(validate(&s, &json!(0)).is_err());
        // 3.0 is an integer in JSON Schema; 3.5 is not.
        let int = json!({"type": "integer"});
        assert!(validate(&int, &json!(3.0)).is_ok());
        assert!(validate(&int, &json!(3.5)).is_err());
        assert!(validate(&json!({"type": "number"}), &json!(3)).is_ok());
        assert!(validate(&json!({"enum": [1]}), &json!(1.0)).is_ok());
    }

    #[test]
    fn typed_errors() {
        let schema = judge_schema();
        assert_eq!(
            parse_structured::<Judge>("  ", &schema),
            Err(StructuredError::Empty)
        );
        assert!(matches!(
            parse_structured::<Judge>("no json here", &schema),
            Err(StructuredError::NoJson { .. })
        ));
        assert!(matches!(
            parse_structured::<Judge>(r#"{"journey_state": 1}"#, &schema),
            Err(StructuredError::Schema { .. })
        ));
        // Valid for a permissive schema, but not for the type.
        assert!(matches!(
            parse_structured::<Judge>(r#"{"a": 1}"#, &json!({})),
            Err(StructuredError::Shape { .. })
        ));
        let e = parse_structured::<Judge>(r#"{"journey_state": 1}"#, &schema).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("answer does not match the schema: "),
            "{e}"
        );
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        // Deeper than any parser here follows: no value is found in it.
        assert!(extract_json(&deep).is_err());
        assert!(find_json_values(&deep).is_empty());
        // A nesting within the limits is found whole.
        let nested = format!("{}{}", "[".repeat(100), "]".repeat(100));
        let expected = (1..100).fold(json!([]), |v, _| json!([v]));
        assert_eq!(extract_json(&nested).unwrap(), expected);
        let deep_obj = format!("x {}", "{\"a\":".repeat(5_000));
        assert!(extract_json(&deep_obj).is_err());
        let deep_schema = (0..300).fold(json!({}), |s, _| json!({"items": s}));
        let deep_value = (0..120).fold(json!(1), |v, _| json!([v]));
        assert!(validate(&deep_schema, &deep_value).is_ok());
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i32>().prop_map(|n| json!(n)),
            "[a-zA-Z0-9 {}\\[\\]\"\\\\é✓]{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-z{}]{1,6}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn random_text_yields_values_that_agree(raw in any::<String>()) {
            found_values_are_consistent(&raw, &judge_schema())?;
            if parse_structured::<Judge>(&raw, &judge_schema()).is_ok() {
                prop_assert!(extract_valid(&raw, &judge_schema()).is_ok());
            }
        }

        #[test]
        fn bracket_soup_yields_values_that_agree(raw in "[\\[\\]{}\"\\\\`~a:,0-9 \n]{0,200}") {
            found_values_are_consistent(&raw, &json!({"type": "object"}))?;
        }

        #[test]
        fn json_inside_fences_is_found(
            value in arb_json().prop_filter("containers", |v| v.is_object() || v.is_array()),
            before in "[a-zA-Z .,:!\n]{0,40}",
            after in "[a-zA-Z .,:!\n]{0,40}",
            info in prop_oneof![Just(""), Just("json"), Just("JSON")],
            pretty in any::<bool>(),
        ) {
            let body = if pretty {
                serde_json::to_string_pretty(&value).unwrap()
            } else {
                serde_json::to_string(&value).unwrap()
            };
            let raw = format!("{before}\n```{info}\n{body}\n```\n{after}");
            prop_assert_eq!(extract_json(&raw).unwrap(), value);
        }

        #[test]
        fn objects_inside_prose_are_found(
            value in arb_json().prop_filter("objects", Value::is_object),
            before in "[a-zA-Z .,:!]{0,40}",
            after in "[a-zA-Z .,:!]{0,40}",
        ) {
            let raw = format!("{before} {} {after}", serde_json::to_string(&value).unwrap());
            prop_assert_eq!(extract_valid(&raw, &json!({"type": "object"})).unwrap(), value);
        }

        #[test]
        fn validation_names_its_violations_and_is_stable(schema in arb_json(), value in arb_json()) {
            let first = validate(&schema, &value);
            // A refusal names at least one violation, and the same input
            // is judged the same way again; the empty schema takes all.
            if let Err(violations) = &first {
                prop_assert!(!violations.is_empty());
            }
            prop_assert_eq!(first.is_ok(), validate(&schema, &value).is_ok());
            let anything = json!({});
            prop_assert!(validate(&anything, &value).is_ok());
        }
    }

    /// What the finders return on `raw` agrees: the value `extract_json`
    /// picks is one `find_json_values` lists, and the value `extract_valid`
    /// picks is one of them too, valid under `schema`.
    fn found_values_are_consistent(raw: &str, schema: &Value) -> Result<(), TestCaseError> {
        let all = find_json_values(raw);
        match extract_json(raw) {
            Ok(v) => prop_assert!(all.contains(&v), "{v} not among {all:?}"),
            Err(_) => prop_assert!(all.is_empty(), "values found but none extracted: {all:?}"),
        }
        if let Ok(v) = extract_valid(raw, schema) {
            prop_assert!(all.contains(&v));
            prop_assert!(validate(schema, &v).is_ok());
        }
        Ok(())
    }
}
