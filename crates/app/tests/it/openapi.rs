//! The API document: served without a key, the one committed in
//! `docs/openapi.json`, and describing exactly the routes the router serves.

use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::support::TestServer;

/// The committed document.
fn committed() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");
    let text = std::fs::read_to_string(path).expect("docs/openapi.json");
    serde_json::from_str(&text).expect("docs/openapi.json is JSON")
}

#[tokio::test]
async fn the_served_document_is_the_committed_one() {
    let server = TestServer::memory().await;
    let (status, ctype, served) = server.send(Method::GET, "/openapi.json", None, false).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(ctype, "application/json");
    assert_eq!(served["openapi"], "3.1.0");
    assert!(
        served == committed(),
        "docs/openapi.json is not the document the service generates; regenerate it with \
         `cargo run -p parlance-app -- openapi > docs/openapi.json`"
    );
}

/// Every `description` in `v`, with its JSON path.
fn descriptions<'a>(v: &'a Value, path: String, out: &mut Vec<(String, &'a str)>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("description", Value::String(s)) => out.push((path.clone(), s)),
                    _ => descriptions(x, format!("{path}.{k}"), out),
                }
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                descriptions(x, format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// The document describes the wire, not the Rust API: a type's doc
/// comment carries code examples and intra-doc links for rustdoc, which
/// its schema must not repeat (it gets a `schema(description = ...)`).
#[test]
fn no_description_carries_rust_examples_or_links() {
    let doc = committed();
    let mut all = Vec::new();
    descriptions(&doc, "$".to_owned(), &mut all);
    assert!(all.len() > 100, "only {} descriptions found", all.len());
    let leaked: Vec<&String> = all
        .iter()
        .filter(|(_, d)| d.contains("```") || d.contains("](crate::") || d.contains("](super::"))
        .map(|(p, _)| p)
        .collect();
    assert!(
        leaked.is_empty(),
        "rustdoc text in the API document at {leaked:?}"
    );
}

const METHODS: [&str; 5] = ["get", "put", "post", "delete", "patch"];

/// Fills a path template: the test key's product, a plausible id elsewhere.
fn concrete(template: &str) -> String {
    template
        .split('/')
        .map(|seg| match seg {
            "{product_id}" => "acme",
            s if s.starts_with('{') => "x1",
            s => s,
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// Whether an answer came from the router's fallbacks rather than a route.
fn unrouted(status: StatusCode, body: &Value) -> bool {
    status == StatusCode::METHOD_NOT_ALLOWED
        || (status == StatusCode::NOT_FOUND && body["detail"] == "no such route")
}

#[tokio::test]
async fn every_documented_operation_is_served_and_no_other_method_is() {
    let server = TestServer::memory().await;
    let doc = committed();
    let paths = doc["paths"].as_object().expect("paths");
    assert!(paths.len() >= 40, "only {} paths documented", paths.len());
    let mut operations = 0;
    for (template, item) in paths {
        let path = concrete(template);
        for method in METHODS {
            let documented = item.get(method).is_some();
            let m = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let (status, _, body) = server.send(m, &path, None, true).await;
            if documented {
                operations += 1;
                assert!(
                    !unrouted(status, &body),
                    "{method} {template} is documented but not served: {status} {body}"
                );
            } else {
                assert_eq!(
                    status,
                    StatusCode::METHOD_NOT_ALLOWED,
                    "{method} {template} is served but not documented: {body}"
                );
            }
        }
    }
    assert!(operations >= 45, "only {operations} operations documented");
}

/// Routes the router serves on purpose without describing them: the
/// operator console's page (at every path below `/console`, which it routes
/// itself), its embedded files and the machines' diagrams it draws. They are
/// not part of the API.
const UNDOCUMENTED: [&str; 5] = [
    "/console",
    "/console/",
    "/console/{*path}",
    "/console/assets/{file}",
    "/console/machines.json",
];

#[tokio::test]
async fn only_the_named_exceptions_are_served_without_being_documented() {
    let server = TestServer::memory().await;
    let doc = committed();
    let paths = doc["paths"].as_object().expect("paths");
    for template in UNDOCUMENTED {
        assert!(
            !paths.contains_key(template) && !paths.keys().any(|p| p.starts_with("/console")),
            "{template} is an exception yet documented"
        );
        let path = match template {
            "/console/{*path}" => "/console/conversations/x1".to_owned(),
            "/console/assets/{file}" => "/console/assets/console.js".to_owned(),
            t => t.to_owned(),
        };
        let (status, _, body) = server.send(Method::GET, &path, None, false).await;
        assert_eq!(status, StatusCode::OK, "{template} is not served: {body}");
        for method in ["put", "post", "delete", "patch"] {
            let m = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let (status, _, _) = server.send(m, &path, None, false).await;
            assert_eq!(
                status,
                StatusCode::METHOD_NOT_ALLOWED,
                "{method} {template} is served"
            );
        }
    }
    // Anything else outside the document is not routed.
    for path in ["/consoles", "/v1/console", "/assets/console.js"] {
        let (status, _, body) = server.send(Method::GET, path, None, true).await;
        assert!(unrouted(status, &body), "{path} answers {status} {body}");
    }
}

#[tokio::test]
async fn every_operation_declares_its_problems_and_the_key_it_needs() {
    let doc = committed();
    for (template, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let responses = op["responses"].as_object().unwrap();
            assert!(
                responses.keys().any(|s| s.starts_with('2')),
                "{method} {template} has no success answer"
            );
            let open = op.get("security") == Some(&serde_json::json!([{}]));
            if template.starts_with("/v1/") {
                assert!(!open, "{method} {template} is documented without a key");
                for status in ["401", "404", "422", "500", "503", "504"] {
                    let problem = &responses[status]["content"]["application/problem+json"];
                    assert!(
                        problem.is_object(),
                        "{method} {template} does not document its {status} problem"
                    );
                }
            } else {
                assert!(open, "{method} {template} needs no key but does not say so");
            }
        }
    }
}

/// Every `$ref` in `value`, with where it was found.
fn refs<'v>(value: &'v Value, at: String, out: &mut Vec<(String, &'v str)>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("$ref", Value::String(target)) => out.push((at.clone(), target)),
                    _ => refs(v, format!("{at}/{k}"), out),
                }
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                refs(v, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

#[test]
fn every_reference_in_the_document_resolves() {
    let doc = committed();
    let mut found = Vec::new();
    refs(&doc, String::new(), &mut found);
    assert!(found.len() > 100, "only {} references", found.len());
    let dangling: Vec<String> = found
        .iter()
        .filter(|(_, target)| {
            let pointer = target.strip_prefix('#').unwrap_or("(not local)");
            doc.pointer(pointer).is_none()
        })
        .map(|(at, target)| format!("{at} -> {target}"))
        .collect();
    assert!(
        dangling.is_empty(),
        "references to nothing:\n{}",
        dangling.join("\n")
    );
}
