//! HTTP request bodies: arbitrary JSON (or raw bytes) sent to every body-
//! taking route of the in-memory service answers 2xx or 4xx, never 5xx.
//!
//! Input: the first byte picks the route (its low seven bits, modulo the
//! number of routes). With its high bit clear the rest is the body as it
//! is, so a real request body seeds the corpus as `[route] ++ body` (see
//! `fuzz/seeds/http_bodies/`); with it set the rest builds JSON through
//! `arbitrary`, with the keys and words the routes read.
#![no_main]

use std::sync::{Arc, OnceLock};

use arbitrary::{Arbitrary, Unstructured};
use axum::body::Body;
use axum::http::{Request, header};
use libfuzzer_sys::fuzz_target;
use parlance_app::Components;
use parlance_app::auth::{ApiKey, ApiKeys};
use parlance_core::ProductId;
use parlance_ports::{ManualClock, SequentialIds};
use tower::ServiceExt as _;

const KEY: &str = "pk_fuzz";

const ROUTES: &[(&str, &str)] = &[
    ("POST", "/v1/products/acme/sessions/s1/events"),
    ("PUT", "/v1/products/acme/tours"),
    ("PUT", "/v1/products/acme/users/u1/adoption"),
    ("POST", "/v1/products/acme/users/u1/adoption/events"),
    ("POST", "/v1/products/acme/users/u1/adoption/activity"),
    ("POST", "/v1/products/acme/users/u1/adoption/gate"),
    ("POST", "/v1/products/acme/users/u1/adoption/judge"),
    ("POST", "/v1/products/acme/users/u1/adoption/welcome"),
    ("POST", "/v1/products/acme/users/u1/adoption/followup"),
    (
        "POST",
        "/v1/products/acme/users/u1/adoption/session-summary",
    ),
    ("POST", "/v1/products/acme/tours/match"),
    ("PUT", "/v1/products/acme/onboarding-plan"),
    ("PUT", "/v1/products/acme/tour-catalog"),
    ("POST", "/v1/products/acme/conversations"),
    (
        "POST",
        "/v1/products/acme/conversations/00000000-0000-0000-0000-000000000001/replies",
    ),
    ("POST", "/v1/products/acme/contacts/c1/replies"),
    ("POST", "/v1/ai/qa/start_session"),
    ("POST", "/v1/ai/qa/event"),
];

/// JSON as `arbitrary` builds it, with the keys the routes read.
#[derive(Debug, Arbitrary)]
enum Json {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Known(u8),
    Array(Vec<Json>),
    Object(Vec<(u8, Json)>),
}

const KEYS: &[&str] = &[
    "type",
    "kind",
    "events",
    "text",
    "session_id",
    "event",
    "event_input",
    "state",
    "tours",
    "workflows",
    "contact_id",
    "objective",
    "todos",
    "actions",
    "metadata",
    "seconds_on_app",
    "trigger_id",
    "rating",
    "id",
    "instance_id",
    "version",
    "query",
    "tour_id",
    "steps",
];
const WORDS: &[&str] = &[
    "open_chat",
    "proactive_trigger",
    "option_click",
    "mark_welcomed",
    "set_mastery",
    "poll",
    "user_input",
    "cancel",
    "retry",
    "onboarded",
    "s1",
    "u1",
];

impl Json {
    fn to_value(&self, depth: usize) -> serde_json::Value {
        use serde_json::Value;
        if depth > 64 {
            return Value::Null;
        }
        match self {
            Json::Null => Value::Null,
            Json::Bool(b) => Value::Bool(*b),
            Json::Int(i) => Value::from(*i),
            Json::Float(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
            Json::Str(s) => Value::String(s.clone()),
            Json::Known(i) => Value::String(WORDS[*i as usize % WORDS.len()].to_owned()),
            Json::Array(a) => Value::Array(a.iter().map(|j| j.to_value(depth + 1)).collect()),
            Json::Object(kv) => Value::Object(
                kv.iter()
                    .map(|(k, v)| {
                        (
                            KEYS[*k as usize % KEYS.len()].to_owned(),
                            v.to_value(depth + 1),
                        )
                    })
                    .collect(),
            ),
        }
    }
}

struct Service {
    rt: tokio::runtime::Runtime,
    app: axum::Router,
}

fn service() -> &'static Service {
    static SERVICE: OnceLock<Service> = OnceLock::new();
    SERVICE.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let keys = ApiKeys::single(&ApiKey::new(KEY), ProductId::parse("acme").expect("id"));
        let mut components = Components::memory(keys);
        components.clock = Arc::new(ManualClock::new());
        components.ids = Arc::new(SequentialIds::new());
        if let Ok(catalog) = parlance_app::flow::example_catalog() {
            components.flows = catalog;
        }
        let app = rt.block_on(async { parlance_app::router(&components.build()) });
        Service { rt, app }
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let s = service();
    let (method, path) = ROUTES[usize::from(first & 0x7f) % ROUTES.len()];
    let body = if first & 0x80 == 0 {
        rest.to_vec()
    } else {
        let Ok(json) = Json::arbitrary_take_rest(Unstructured::new(rest)) else {
            return;
        };
        serde_json::to_vec(&json.to_value(0)).expect("json")
    };
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header(header::AUTHORIZATION, format!("Bearer {KEY}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .expect("a request");
    let res =
        s.rt.block_on(s.app.clone().oneshot(req))
            .expect("infallible");
    assert!(
        !res.status().is_server_error(),
        "{method} {path} answered {}",
        res.status()
    );
});
