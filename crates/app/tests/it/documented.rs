//! Answers checked against the committed API document: a body must match
//! the schema its operation documents for its status, members the document
//! does not list included.

use reqwest::StatusCode;
use serde_json::{Map, Value};

/// The committed document.
fn document() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");
    let text = std::fs::read_to_string(path).expect("docs/openapi.json");
    serde_json::from_str(&text).expect("docs/openapi.json is JSON")
}

/// `schema` with every `$ref` replaced by its component and every `allOf`
/// merged into one object schema (the validator knows neither); an object
/// schema that lists its properties admits no others.
fn resolve(schema: &Value, components: &Map<String, Value>) -> Value {
    match schema {
        Value::Object(s) => {
            if let Some(Value::String(r)) = s.get("$ref") {
                let name = r.trim_start_matches("#/components/schemas/");
                let target = components
                    .get(name)
                    .unwrap_or_else(|| panic!("no schema {name} in the document"));
                return resolve(target, components);
            }
            if let Some(Value::Array(parts)) = s.get("allOf") {
                let mut properties = Map::new();
                let mut required = Vec::new();
                for part in parts.iter().map(|p| resolve(p, components)) {
                    if let Some(p) = part.get("properties").and_then(Value::as_object) {
                        properties.extend(p.clone());
                    }
                    if let Some(r) = part.get("required").and_then(Value::as_array) {
                        required.extend(r.iter().cloned());
                    }
                }
                return serde_json::json!({
                    "type": "object",
                    "properties": properties,
                    "required": required,
                    "additionalProperties": false,
                });
            }
            let mut out: Map<String, Value> = s
                .iter()
                .map(|(k, v)| {
                    let v = match k.as_str() {
                        "properties" => Value::Object(
                            v.as_object()
                                .into_iter()
                                .flatten()
                                .map(|(name, p)| (name.clone(), resolve(p, components)))
                                .collect(),
                        ),
                        "items" | "additionalProperties" => resolve(v, components),
                        "oneOf" | "anyOf" => Value::Array(
                            v.as_array()
                                .into_iter()
                                .flatten()
                                .map(|b| resolve(b, components))
                                .collect(),
                        ),
                        _ => v.clone(),
                    };
                    (k.clone(), v)
                })
                .collect();
            if out.contains_key("properties") && !out.contains_key("additionalProperties") {
                out.insert("additionalProperties".to_owned(), Value::Bool(false));
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

/// The document's path template that `path` (query string ignored) fills;
/// of several, the one with the most literal segments.
fn template_of<'d>(doc: &'d Value, path: &str) -> &'d str {
    let path = path.split('?').next().unwrap_or(path);
    let segments: Vec<&str> = path.split('/').collect();
    doc["paths"]
        .as_object()
        .unwrap()
        .keys()
        .filter_map(|t| {
            let parts: Vec<&str> = t.split('/').collect();
            let fits = parts.len() == segments.len()
                && parts
                    .iter()
                    .zip(&segments)
                    .all(|(p, s)| p == s || p.starts_with('{'));
            fits.then(|| (parts.iter().filter(|p| !p.starts_with('{')).count(), t))
        })
        .max()
        .map(|(_, t)| t.as_str())
        .unwrap_or_else(|| panic!("no documented path fits {path}"))
}

/// Asserts that `body`, answered with `status` to `method path`, matches
/// the schema the document gives that answer.
pub(crate) fn assert_documented(
    method: &reqwest::Method,
    path: &str,
    status: StatusCode,
    body: &Value,
) {
    let doc = document();
    let method = method.as_str().to_lowercase();
    let template = template_of(&doc, path);
    let op = &doc["paths"][template][&method];
    assert!(op.is_object(), "{method} {template} is not documented");
    let answer = &op["responses"][status.as_str()];
    assert!(
        answer.is_object(),
        "{method} {template} does not document {status}: {body}"
    );
    let Some((_, content)) = answer["content"].as_object().and_then(|c| c.iter().next()) else {
        assert!(
            body.is_null(),
            "{method} {template} {status} documents no body: {body}"
        );
        return;
    };
    let components = doc["components"]["schemas"].as_object().unwrap();
    let schema = resolve(&content["schema"], components);
    if let Err(violations) = parlance_core::structured::validate(&schema, body) {
        panic!(
            "{method} {template} {status} does not match its documented schema: {violations:?}\n{body}"
        );
    }
}
