//! The storable-value policy over HTTP, on both backends: text holding NUL
//! (in a path, a query, or a body) and integers outside `i64` answer 422
//! `invalid-request` naming the field, before any handler runs, so the
//! in-memory and PostgreSQL services answer alike; the records stay
//! readable afterwards.

use std::sync::Arc;

use parlance_app::AppState;
use parlance_postgres::testing::test_pool;
use parlance_testkit::ManualClock;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{TestServer, keys};

const BASE: &str = "/v1/products/acme";

async fn postgres() -> Option<TestServer> {
    let pool = test_pool().await?;
    Some(
        TestServer::start(
            AppState::postgres(pool, keys()),
            Arc::new(ManualClock::new()),
        )
        .await,
    )
}

/// Sends a request and requires 422 `invalid-request` naming `field`.
async fn refused(s: &TestServer, method: Method, path: &str, body: Option<Value>, field: &str) {
    let (status, ctype, got) = s.send(method, path, body.as_ref(), true).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{path}: {got}");
    assert_eq!(ctype, "application/problem+json", "{path}");
    assert_eq!(
        got["type"], "urn:parlance:problem:invalid-request",
        "{path}: {got}"
    );
    assert_eq!(got["field"], field, "{path}: {got}");
}

async fn ok(s: &TestServer, method: Method, path: &str, body: Option<Value>) -> Value {
    let (status, _, got) = s.send(method, path, body.as_ref(), true).await;
    assert!(status.is_success(), "{path}: {status} {got}");
    got
}

async fn nul_in_a_flow_session_id_or_event_input(s: TestServer) {
    refused(
        &s,
        Method::GET,
        "/v1/ai/qa/task_state/a%00b",
        None,
        "session_id",
    )
    .await;
    refused(&s, Method::GET, "/v1/ai/qa/model/%00", None, "session_id").await;
    let event = json!({"session_id": "s-1", "event": "user_input", "event_input": "hi\u{0}"});
    refused(
        &s,
        Method::POST,
        "/v1/ai/qa/event",
        Some(event),
        "event_input",
    )
    .await;
}

async fn nul_in_a_contact_reply_or_a_query(s: TestServer) {
    let created = ok(
        &s,
        Method::POST,
        &format!("{BASE}/conversations"),
        Some(json!({"contact_id": "c-1", "objective": "book a demo"})),
    )
    .await;
    let reply = json!({"text": "yes\u{0}please"});
    refused(
        &s,
        Method::POST,
        &format!("{BASE}/contacts/c-1/replies"),
        Some(reply.clone()),
        "text",
    )
    .await;
    refused(
        &s,
        Method::POST,
        &format!("{BASE}/contacts/c%00/replies"),
        Some(json!({"text": "yes"})),
        "contact_id",
    )
    .await;
    refused(
        &s,
        Method::GET,
        &format!("{BASE}/conversations?contact_id=c%00"),
        None,
        "contact_id",
    )
    .await;
    // The conversation is readable and unchanged.
    let list = ok(
        &s,
        Method::GET,
        &format!("{BASE}/conversations?contact_id=c-1"),
        None,
    )
    .await;
    assert!(list.to_string().contains("book a demo"), "{list} {created}");
    assert!(!list.to_string().contains("please"), "{list}");
}

async fn nul_in_an_agent_message(s: TestServer) {
    refused(
        &s,
        Method::POST,
        &format!("{BASE}/agent/turns"),
        Some(json!({"message": "help\u{0}", "session_id": "t-1"})),
        "message",
    )
    .await;
    refused(
        &s,
        Method::GET,
        &format!("{BASE}/agent/threads/t%00"),
        None,
        "id",
    )
    .await;
}

async fn a_session_number_over_i64_is_refused_and_the_user_stays_readable(s: TestServer) {
    let events = format!("{BASE}/users/u-1/adoption/events");
    ok(
        &s,
        Method::POST,
        &events,
        Some(json!({"events": [
            {"kind": "record_session", "session_id": "s-1", "session_number": 1, "started_at": 1767225500.5}
        ]})),
    )
    .await;
    refused(
        &s,
        Method::POST,
        &events,
        Some(json!({"events": [
            {"kind": "set_journey_state", "state": "onboarded"},
            {"kind": "record_session", "session_id": "s-2",
             "session_number": 9_223_372_036_854_775_808_u64, "started_at": 1767225501.5}
        ]})),
        "events[1].session_number",
    )
    .await;
    // i64::MAX itself is storable.
    ok(
        &s,
        Method::POST,
        &events,
        Some(json!({"events": [
            {"kind": "record_session", "session_id": "s-3",
             "session_number": i64::MAX, "started_at": 1767225502.5}
        ]})),
    )
    .await;
    let user = ok(&s, Method::GET, &format!("{BASE}/users/u-1/adoption"), None).await;
    assert!(!user.to_string().contains("s-2"), "{user}");
    assert!(user.to_string().contains("s-3"), "{user}");
    ok(
        &s,
        Method::POST,
        &events,
        Some(json!({"events": [{"kind": "mark_welcomed"}]})),
    )
    .await;
}

async fn a_plan_with_a_glob_over_the_limit_is_refused(s: TestServer) {
    let plan = json!({"workflows": [{"workflow_id": "w1", "activity_signals": {"any_of": [
        {"canonical_url_glob": format!("*{}b", "a".repeat(23_998))}
    ]}}]});
    refused(
        &s,
        Method::PUT,
        &format!("{BASE}/onboarding-plan"),
        Some(plan),
        "workflows[0].activity_signals.any_of[0].canonical_url_glob",
    )
    .await;
}

macro_rules! on_both {
    ($($case:ident),* $(,)?) => {
        mod on_memory {
            $(
                #[tokio::test]
                async fn $case() {
                    super::$case(crate::support::TestServer::memory().await).await;
                }
            )*
        }
        mod on_postgres {
            $(
                #[tokio::test]
                async fn $case() {
                    let Some(s) = super::postgres().await else { return };
                    super::$case(s).await;
                }
            )*
        }
    };
}

on_both![
    nul_in_a_flow_session_id_or_event_input,
    nul_in_a_contact_reply_or_a_query,
    nul_in_an_agent_message,
    a_session_number_over_i64_is_refused_and_the_user_stays_readable,
    a_plan_with_a_glob_over_the_limit_is_refused,
];
