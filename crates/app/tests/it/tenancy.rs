//! Tenancy: a key for product `acme` never reaches product `beta`'s records.
//!
//! Product `beta` gets one record of every kind (session, tours, adoption
//! user, onboarding plan, tour catalog, conversation, flow session, and
//! their audit trails). Then, with `acme`'s key, every route is called
//! twice: on `beta`'s path (always 404) and on `acme`'s own path with
//! `beta`'s ids, where the answer must be exactly the answer for an id that
//! never existed (reads of a record: 404). Finally `beta`'s records, read
//! with `beta`'s key, are unchanged.

use std::path::PathBuf;
use std::sync::Arc;

use parlance_app::auth::{ApiKey, ApiKeys};
use parlance_app::flow::{FlowCatalog, Invokers};
use parlance_core::ProductId;
use parlance_testkit::{ManualClock, SequentialIds};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{KEY, TestServer, keys};

const KEY_B: &str = "pk_test_beta";

struct Fixture {
    server: TestServer,
}

/// Ids of `beta`'s records.
struct Ids {
    session: String,
    user: String,
    contact: String,
    conversation: String,
    flow_session: String,
}

impl Fixture {
    async fn new() -> Self {
        let mut keys: ApiKeys = keys();
        keys.insert(&ApiKey::new(KEY_B), ProductId::parse("beta").unwrap());
        let clock = Arc::new(ManualClock::new());
        let mut c = parlance_app::Components::memory(keys);
        c.clock = clock.clone();
        c.ids = Arc::new(SequentialIds::new());
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/flows");
        c.flows = FlowCatalog::load_dir(&dir, &Invokers::is_builtin).unwrap();
        let state = c.build();
        Self {
            server: TestServer::start(state, clock).await,
        }
    }

    async fn call(
        &self,
        key: &str,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> (StatusCode, Value) {
        let mut req = self
            .server
            .client
            .request(method, format!("http://{}{}", self.server.addr, path))
            .bearer_auth(key);
        if let Some(b) = body {
            req = req.json(b);
        }
        let res = req.send().await.unwrap();
        let status = res.status();
        let bytes = res.bytes().await.unwrap();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    async fn as_beta(&self, method: Method, path: &str, body: Option<Value>) -> Value {
        let (status, v) = self.call(KEY_B, method, path, body.as_ref()).await;
        assert!(status.is_success(), "{path}: {status} {v}");
        v
    }

    /// One record of every kind for product `beta`.
    async fn seed_beta(&self) -> Ids {
        let p = "/v1/products/beta";
        self.as_beta(
            Method::PUT,
            &format!("{p}/tours"),
            Some(json!({"tours": [{"id": "chip_0", "user_tour_id": "flow_0", "interaction_timeout_s": 60.0}]})),
        )
        .await;
        self.as_beta(
            Method::POST,
            &format!("{p}/sessions/ses-b/events"),
            Some(json!({"type": "proactive_trigger", "trigger_id": "t-b"})),
        )
        .await;
        self.as_beta(
            Method::PUT,
            &format!("{p}/onboarding-plan"),
            Some(json!({"workflows": [{"workflow_id": "secret_workflow", "name": "Beta only"}]})),
        )
        .await;
        self.as_beta(
            Method::PUT,
            &format!("{p}/tour-catalog"),
            Some(json!({"tours": [{"tour_id": "secret_tour", "name": "Beta tour"}]})),
        )
        .await;
        self.as_beta(
            Method::POST,
            &format!("{p}/users/user-b/adoption/events"),
            Some(json!({"events": [{"kind": "set_mastery", "rating": 42, "level": "proficient", "description": "beta"}]})),
        )
        .await;
        let conv = self
            .as_beta(
                Method::POST,
                &format!("{p}/conversations"),
                Some(
                    json!({"contact_id": "contact-b", "objective": "beta secret", "todos": ["x"]}),
                ),
            )
            .await;
        let flow = self
            .as_beta(Method::POST, "/v1/ai/qa/start_session", None)
            .await;
        Ids {
            session: "ses-b".into(),
            user: "user-b".into(),
            contact: "contact-b".into(),
            conversation: conv["conversation"]["instance_id"]
                .as_str()
                .unwrap()
                .to_owned(),
            flow_session: flow["session_id"].as_str().unwrap().to_owned(),
        }
    }

    /// Everything `beta` can read about its records.
    async fn beta_view(&self, ids: &Ids) -> Vec<Value> {
        let p = "/v1/products/beta";
        let mut out = Vec::new();
        for path in [
            format!("{p}/tours"),
            format!("{p}/sessions/{}", ids.session),
            format!("{p}/sessions/{}/proactive-gate", ids.session),
            format!("{p}/sessions/{}/audit", ids.session),
            format!("{p}/onboarding-plan"),
            format!("{p}/tour-catalog"),
            format!("{p}/users/{}/adoption", ids.user),
            format!("{p}/conversations"),
            format!("{p}/conversations/{}", ids.conversation),
            format!("{p}/conversations/{}/audit", ids.conversation),
            format!("/v1/ai/qa/model/{}", ids.flow_session),
            format!("/v1/ai/qa/task_state/{}", ids.flow_session),
            format!("/v1/ai/qa/audit/{}", ids.flow_session),
            format!("{p}/users/{}/adoption/audit", ids.user),
        ] {
            out.push(self.as_beta(Method::GET, &path, None).await);
        }
        out
    }
}

/// A route: method, path with `{p}` (product) and `{id}` placeholders,
/// a body (with `{id}` replaced), and whether it reads one record.
struct Route {
    method: Method,
    path: &'static str,
    body: Option<Value>,
    record_read: bool,
}

fn route(method: Method, path: &'static str, body: Option<Value>, record_read: bool) -> Route {
    Route {
        method,
        path,
        body,
        record_read,
    }
}

fn fill(route: &Route, product: &str, id: &str) -> (String, Option<Value>) {
    let path = route.path.replace("{p}", product).replace("{id}", id);
    let body = route
        .body
        .as_ref()
        .map(|b| serde_json::from_str(&b.to_string().replace("{id}", id)).unwrap());
    (path, body)
}

/// Calls each route with `acme`'s key: on `beta`'s path with `beta`'s id
/// (404), then on `acme`'s path with `beta`'s id and with a fresh id (the
/// same answer; 404 for a record read).
async fn probe(f: &Fixture, kind: &str, routes: &[Route], beta_id: &str, fresh_id: &str) {
    for r in routes {
        let (path, body) = fill(r, "beta", beta_id);
        let (status, v) = f.call(KEY, r.method.clone(), &path, body.as_ref()).await;
        assert_eq!(
            status,
            StatusCode::NOT_FOUND,
            "{kind}: {} {path}: {v}",
            r.method
        );
        assert_eq!(v["type"], "urn:parlance:problem:not-found", "{path}");
    }
    for r in routes {
        let (path, body) = fill(r, "acme", beta_id);
        let (status, v) = f.call(KEY, r.method.clone(), &path, body.as_ref()).await;
        let (fresh_path, fresh_body) = fill(r, "acme", fresh_id);
        let (fresh_status, fresh_v) = f
            .call(KEY, r.method.clone(), &fresh_path, fresh_body.as_ref())
            .await;
        assert_eq!(
            status, fresh_status,
            "{kind}: {} {path} answers {v} but a fresh id answers {fresh_v}",
            r.method
        );
        assert!(!status.is_server_error(), "{kind}: {path}: {v}");
        if r.record_read {
            assert_eq!(status, StatusCode::NOT_FOUND, "{kind}: {path}: {v}");
        }
        if r.method == Method::GET {
            let scrub = |v: &Value, id: &str| v.to_string().replace(id, "[id]");
            assert_eq!(
                scrub(&v, beta_id),
                scrub(&fresh_v, fresh_id),
                "{kind}: {path}"
            );
        }
        assert!(
            !v.to_string().contains("secret"),
            "{kind}: {path} leaks {v}"
        );
    }
}

async fn check(kind: &str, routes: Vec<Route>, pick: fn(&Ids) -> String) {
    let f = Fixture::new().await;
    let ids = f.seed_beta().await;
    let before = f.beta_view(&ids).await;
    let beta_id = pick(&ids);
    let fresh = match uuid::Uuid::parse_str(&beta_id) {
        Ok(_) => uuid::Uuid::from_u128(0xfeed).to_string(),
        Err(_) => "never-used".to_owned(),
    };
    probe(&f, kind, &routes, &beta_id, &fresh).await;
    assert_eq!(
        f.beta_view(&ids).await,
        before,
        "{kind}: beta's records changed"
    );
}

#[tokio::test]
async fn sessions_of_another_product_do_not_exist() {
    check(
        "session",
        vec![
            route(Method::GET, "/v1/products/{p}/sessions/{id}", None, true),
            route(
                Method::GET,
                "/v1/products/{p}/sessions/{id}/proactive-gate",
                None,
                false,
            ),
            route(
                Method::GET,
                "/v1/products/{p}/sessions/{id}/audit",
                None,
                false,
            ),
            route(
                Method::POST,
                "/v1/products/{p}/sessions/{id}/events",
                Some(json!({"type": "open_chat"})),
                false,
            ),
        ],
        |ids| ids.session.clone(),
    )
    .await;
}

#[tokio::test]
async fn tours_of_another_product_do_not_exist() {
    check(
        "tours",
        vec![
            route(Method::GET, "/v1/products/{p}/tours", None, false),
            route(
                Method::PUT,
                "/v1/products/{p}/tours",
                Some(json!({"tours": []})),
                false,
            ),
        ],
        |ids| ids.session.clone(),
    )
    .await;
}

#[tokio::test]
async fn adoption_users_of_another_product_do_not_exist() {
    let u = "/v1/products/{p}/users/{id}/adoption";
    check(
        "adoption user",
        vec![
            route(Method::GET, u, None, true),
            route(
                Method::GET,
                "/v1/products/{p}/users/{id}/adoption/audit",
                None,
                true,
            ),
            route(
                Method::GET,
                "/v1/products/{p}/users/{id}/adoption/prompt-block",
                None,
                false,
            ),
            route(
                Method::POST,
                "/v1/products/{p}/users/{id}/adoption/events",
                Some(json!({"events": [{"kind": "mark_welcomed"}]})),
                false,
            ),
            route(
                Method::POST,
                "/v1/products/{p}/users/{id}/adoption/activity",
                Some(json!({"events": []})),
                false,
            ),
            route(
                Method::POST,
                "/v1/products/{p}/users/{id}/adoption/gate",
                Some(json!({"seconds_on_app": 600.0})),
                false,
            ),
            route(
                Method::POST,
                "/v1/products/{p}/users/{id}/adoption/judge",
                Some(json!({})),
                false,
            ),
            route(
                Method::POST,
                "/v1/products/{p}/users/{id}/adoption/welcome",
                Some(json!({})),
                false,
            ),
            route(
                Method::POST,
                "/v1/products/{p}/users/{id}/adoption/followup",
                Some(json!({})),
                false,
            ),
            route(
                Method::POST,
                "/v1/products/{p}/users/{id}/adoption/session-summary",
                Some(json!({})),
                false,
            ),
            route(Method::PUT, u, Some(json!({"state": {}})), false),
            route(Method::DELETE, u, None, false),
        ],
        |ids| ids.user.clone(),
    )
    .await;
}

#[tokio::test]
async fn plans_and_catalogs_of_another_product_do_not_exist() {
    check(
        "onboarding plan and tour catalog",
        vec![
            route(Method::GET, "/v1/products/{p}/onboarding-plan", None, false),
            route(Method::GET, "/v1/products/{p}/tour-catalog", None, false),
            route(
                Method::POST,
                "/v1/products/{p}/tours/match",
                Some(json!({"query": "secret"})),
                false,
            ),
            route(
                Method::PUT,
                "/v1/products/{p}/onboarding-plan",
                Some(json!({"workflows": []})),
                false,
            ),
            route(
                Method::PUT,
                "/v1/products/{p}/tour-catalog",
                Some(json!({"tours": []})),
                false,
            ),
        ],
        |ids| ids.user.clone(),
    )
    .await;
}

#[tokio::test]
async fn conversations_of_another_product_do_not_exist() {
    let c = "/v1/products/{p}/conversations/{id}";
    check(
        "conversation",
        vec![
            route(Method::GET, c, None, true),
            route(Method::GET, "/v1/products/{p}/conversations/{id}/audit", None, false),
            route(Method::GET, "/v1/products/{p}/conversations", None, false),
            route(
                Method::POST,
                "/v1/products/{p}/conversations/{id}/replies",
                Some(json!({"text": "hello"})),
                false,
            ),
            route(Method::POST, "/v1/products/{p}/conversations/{id}/pause", None, false),
            route(Method::POST, "/v1/products/{p}/conversations/{id}/resume", None, false),
            route(Method::POST, "/v1/products/{p}/conversations/{id}/send", Some(json!({"text": "hi"})), false),
            route(Method::POST, "/v1/products/{p}/conversations/{id}/cancel", None, false),
            // Creating one with the other product's id makes this product's
            // own conversation, exactly as with an unused id.
            route(
                Method::POST,
                "/v1/products/{p}/conversations",
                Some(json!({"instance_id": "{id}", "contact_id": "c-a", "objective": "o", "todos": []})),
                false,
            ),
        ],
        |ids| ids.conversation.clone(),
    )
    .await;
}

#[tokio::test]
async fn contacts_of_another_product_do_not_exist() {
    check(
        "contact",
        vec![route(
            Method::POST,
            "/v1/products/{p}/contacts/{id}/replies",
            Some(json!({"text": "a reply"})),
            false,
        )],
        |ids| ids.contact.clone(),
    )
    .await;
}

#[tokio::test]
async fn flow_sessions_of_another_product_do_not_exist() {
    // Flow routes carry no product: the key's product is the only one.
    let routes = vec![
        route(Method::GET, "/v1/ai/qa/model/{id}", None, true),
        route(Method::GET, "/v1/ai/qa/task_state/{id}", None, true),
        route(Method::GET, "/v1/ai/qa/audit/{id}", None, true),
        route(
            Method::POST,
            "/v1/ai/qa/event",
            Some(json!({"session_id": "{id}", "event": "poll", "event_input": ""})),
            true,
        ),
        route(
            Method::POST,
            "/v1/ai/qa/event",
            Some(json!({"session_id": "{id}", "event": "user_input", "event_input": "hi"})),
            true,
        ),
        route(
            Method::POST,
            "/v1/ai/qa/event",
            Some(json!({"session_id": "{id}", "event": "cancel", "event_input": ""})),
            true,
        ),
    ];
    let f = Fixture::new().await;
    let ids = f.seed_beta().await;
    let before = f.beta_view(&ids).await;
    for r in &routes {
        let (path, body) = fill(r, "acme", &ids.flow_session);
        let (status, v) = f.call(KEY, r.method.clone(), &path, body.as_ref()).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path} {body:?}: {v}");
        let (fresh_path, fresh_body) = fill(r, "acme", "never-used");
        let (fresh_status, _) = f
            .call(KEY, r.method.clone(), &fresh_path, fresh_body.as_ref())
            .await;
        assert_eq!(status, fresh_status, "{path}");
    }
    assert_eq!(f.beta_view(&ids).await, before);
    let (status, _) = f
        .call(KEY, Method::GET, "/v1/products/beta/flows", None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}
