//! The operator console: a single page served at `/console`, its script and
//! style sheet embedded in the binary.
//!
//! The pages hold no data and are served without a key; nor does
//! `machines.json`, the machines' states and transitions the pages draw. Everything they
//! show comes from the `/v1` API, called from the browser with the key the
//! operator signs in with, so the API's own key checks and product scoping
//! apply. Every answer here carries a strict content security policy: the
//! page loads nothing but its own files and talks to nothing but this
//! service.

use std::sync::LazyLock;

use axum::Router;
use axum::extract::{Path, Request};
use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, ETAG, HeaderName, REFERRER_POLICY,
    X_CONTENT_TYPE_OPTIONS,
};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use parlance_core::TransitionTable;
use parlance_core::flow::Flow;
use parlance_core::turn::Graph;
use serde_json::{Value, json};

use crate::http::ApiError;
use crate::http::etag::{none_match, tag_of};

/// The policy every console answer carries.
pub const CONTENT_SECURITY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; \
     form-action 'none'";

/// One embedded file with its type and entity tag.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
    etag: HeaderValue,
}

impl Asset {
    fn new(name: &'static str, content_type: &'static str, body: &'static [u8]) -> Self {
        Self {
            name,
            content_type,
            body,
            etag: tag_of(body),
        }
    }

    /// The file, or 304 when the client's copy has the same tag.
    fn answer(&self, headers: &HeaderMap) -> Response {
        let cached = none_match(headers, &self.etag);
        let head = [
            (ETAG, self.etag.clone()),
            (CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ];
        if cached {
            return (StatusCode::NOT_MODIFIED, head).into_response();
        }
        (
            head,
            [(CONTENT_TYPE, HeaderValue::from_static(self.content_type))],
            self.body,
        )
            .into_response()
    }
}

/// The page every console path answers.
static INDEX: LazyLock<Asset> = LazyLock::new(|| {
    Asset::new(
        "index.html",
        "text/html; charset=utf-8",
        include_bytes!("assets/index.html"),
    )
});

/// The files under `/console/assets/`.
static ASSETS: LazyLock<[Asset; 2]> = LazyLock::new(|| {
    [
        Asset::new(
            "console.js",
            "text/javascript; charset=utf-8",
            include_bytes!("assets/console.js"),
        ),
        Asset::new(
            "console.css",
            "text/css; charset=utf-8",
            include_bytes!("assets/console.css"),
        ),
    ]
});

/// The console's routes: the page at `/console` and every path below it
/// (the page routes on the client), the embedded files at
/// `/console/assets/{file}`, and the machines' diagrams at
/// `/console/machines.json`. None needs a key.
pub fn router() -> Router {
    Router::new()
        .route("/console", get(index))
        .route("/console/", get(index))
        .route("/console/{*path}", get(index))
        .route("/console/assets/{file}", get(asset))
        .route("/console/machines.json", get(machines))
        .layer(middleware::from_fn(secure))
}

/// The machines' diagrams as data, built once from their tables: the
/// product's code, not its data, so served without a key. The body lives as
/// long as the process, like the embedded files.
static MACHINES: LazyLock<Asset> = LazyLock::new(|| {
    let body = serde_json::to_vec(&machines_json()).expect("the machines serialize");
    Asset::new(
        "machines.json",
        "application/json",
        Box::leak(body.into_boxed_slice()),
    )
});

async fn machines(headers: HeaderMap) -> Response {
    MACHINES.answer(&headers)
}

/// One machine's diagram: its states (initial first), the terminal ones and
/// every edge with its cause.
fn machine(
    name: &str,
    title: &str,
    initial: &str,
    states: Vec<String>,
    terminal: Vec<String>,
    edges: Vec<(String, String, String)>,
) -> Value {
    json!({
        "name": name,
        "title": title,
        "initial": initial,
        "states": states,
        "terminal": terminal,
        "edges": edges
            .into_iter()
            .map(|(from, to, cause)| json!({"from": from, "to": to, "cause": cause}))
            .collect::<Vec<_>>(),
    })
}

/// A transition table as a diagram; an edge from `[*]` (how an instance is
/// created) names the initial state instead of being drawn.
fn from_table(name: &str, table: &TransitionTable) -> Value {
    let initial = table
        .edges
        .iter()
        .find(|e| e.from == "[*]")
        .map_or(table.states[0], |e| e.to);
    machine(
        name,
        table.machine,
        initial,
        table.states.iter().map(|s| (*s).to_owned()).collect(),
        table.terminal.iter().map(|s| (*s).to_owned()).collect(),
        table
            .edges
            .iter()
            .filter(|e| e.from != "[*]")
            .map(|e| (e.from.to_owned(), e.to.to_owned(), e.cause.to_owned()))
            .collect(),
    )
}

/// The agent's turn graph, read from its Mermaid flowchart: plain edges
/// have no cause, route targets `route`; `END` is its terminal state.
fn from_graph<S>(name: &str, graph: &Graph<S>) -> Value {
    let mut states: Vec<String> = graph.stages().iter().map(|s| (*s).to_owned()).collect();
    let mut initial = String::new();
    let mut edges = Vec::new();
    for line in graph.to_mermaid().lines().skip(1) {
        let line = line.trim();
        if let Some(entry) = line.strip_prefix("START([start]) --> ") {
            entry.clone_into(&mut initial);
            continue;
        }
        let (from, to, cause) = match (line.split_once(" -.-> "), line.split_once(" --> ")) {
            (Some((f, t)), _) => (f, t, "route"),
            (None, Some((f, t))) => (f, t, ""),
            (None, None) => continue,
        };
        for s in [from, to] {
            if !states.iter().any(|k| k == s) {
                states.push(s.to_owned());
            }
        }
        let edge = (from.to_owned(), to.to_owned(), cause.to_owned());
        if !edges.contains(&edge) {
            edges.push(edge);
        }
    }
    let terminal = states.iter().filter(|s| *s == "END").cloned().collect();
    machine(name, graph.name(), &initial, states, terminal, edges)
}

/// A flow's diagram: its declared states and transitions, events sharing
/// endpoints kept apart.
fn from_flow(name: &str, flow: &Flow) -> Value {
    let def = flow.def();
    let states: Vec<String> = def.states.iter().map(|s| s.id.clone()).collect();
    let terminal = states
        .iter()
        .filter(|s| !def.transitions.iter().any(|t| &t.from == *s))
        .cloned()
        .collect();
    let initial = def.initial.clone().unwrap_or_else(|| states[0].clone());
    machine(
        name,
        &format!("flow {}", def.name),
        &initial,
        states,
        terminal,
        def.transitions
            .iter()
            .map(|t| (t.from.clone(), t.to.clone(), t.event.clone()))
            .collect(),
    )
}

/// Every machine the console draws: the four tables and graphs of the
/// service, and the reference flow (`qa`) for the flow machine (each loaded
/// flow is drawn from `GET /v1/products/{p}/flows`).
fn machines_json() -> Value {
    let catalog = crate::flow::example_catalog().expect("the example flows are valid");
    let qa = catalog.get("qa").expect("the qa example is built in");
    json!({
        "machines": [
            from_table("session", &parlance_core::session::TRANSITIONS),
            from_table("adoption", &parlance_core::adoption::JOURNEY_TABLE),
            from_table("conversation", &parlance_core::conversation::TABLE),
            from_graph("turn", &crate::agent::graph()),
            from_flow("flow", &qa),
        ]
    })
}

async fn index(headers: HeaderMap) -> Response {
    INDEX.answer(&headers)
}

async fn asset(Path(file): Path<String>, headers: HeaderMap) -> Response {
    match ASSETS.iter().find(|a| a.name == file) {
        Some(a) => a.answer(&headers),
        None => ApiError::not_found(format!("no console asset {file}")).into_response(),
    }
}

/// Adds the security headers to every console answer, errors included.
async fn secure(req: Request, next: Next) -> Response {
    let mut res = next.run(req).await;
    let headers = res.headers_mut();
    let set: [(HeaderName, &'static str); 3] = [
        (CONTENT_SECURITY_POLICY, CONTENT_SECURITY),
        (REFERRER_POLICY, "no-referrer"),
        (X_CONTENT_TYPE_OPTIONS, "nosniff"),
    ];
    for (name, value) in set {
        headers.insert(name, HeaderValue::from_static(value));
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_differ_per_file_and_are_quoted() {
        let tags: Vec<_> = ASSETS.iter().map(|a| a.etag.clone()).collect();
        assert_ne!(tags[0], tags[1]);
        assert_ne!(tags[0], INDEX.etag);
        assert!(tags[0].to_str().unwrap().starts_with('"'));
    }

    #[test]
    fn a_matching_tag_answers_not_modified() {
        use axum::http::header::IF_NONE_MATCH;
        let a = &ASSETS[0];
        let mut headers = HeaderMap::new();
        headers.insert(IF_NONE_MATCH, HeaderValue::from_static("\"other\""));
        assert_eq!(a.answer(&headers).status(), StatusCode::OK);
        headers.insert(IF_NONE_MATCH, a.etag.clone());
        assert_eq!(a.answer(&headers).status(), StatusCode::NOT_MODIFIED);
    }
}
