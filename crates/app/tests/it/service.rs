//! Probes, authentication, tenancy and limits common to every route.

use std::sync::Arc;

use parlance_app::AppState;
use parlance_postgres::testing::test_pool;
use parlance_testkit::ManualClock;
use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::support::{TestServer, keys};

#[tokio::test]
async fn healthz_and_readyz_on_memory() {
    let s = TestServer::memory().await;
    let (status, _, body) = s.send(Method::GET, "/healthz", None, false).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({"status": "ok"}));
    let (status, _, body) = s.send(Method::GET, "/readyz", None, false).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({"status": "ready", "database": "memory"}));
}

#[tokio::test]
async fn readyz_reports_postgres() {
    let Some(pool) = test_pool().await else {
        return;
    };
    let state = AppState::postgres(pool, keys());
    let s = TestServer::start(state, Arc::new(ManualClock::new())).await;
    let (status, _, body) = s.send(Method::GET, "/readyz", None, false).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({"status": "ready", "database": "postgres"}));
}

#[tokio::test]
async fn v1_without_a_key_is_401_problem_json() {
    let s = TestServer::memory().await;
    let (status, ctype, body) = s.send(Method::GET, "/v1/anything", None, false).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(ctype, "application/problem+json");
    insta::assert_json_snapshot!("v1_without_key", body);
}

#[tokio::test]
async fn v1_with_an_unknown_key_is_401() {
    let s = TestServer::memory().await;
    let res = s
        .client
        .get(format!("http://{}/v1/products/acme/sessions/x", s.addr))
        .bearer_auth("pk_not_a_key")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["detail"], "unknown API key");
}

#[tokio::test]
async fn unknown_routes_are_404_problem_json() {
    let s = TestServer::memory().await;
    let (status, ctype, body) = s.send(Method::GET, "/v1/anything", None, true).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(ctype, "application/problem+json");
    insta::assert_json_snapshot!("unknown_route", body);
    let (status, _, _) = s.send(Method::GET, "/nowhere", None, false).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn bodies_over_the_limit_are_413() {
    let s = TestServer::memory().await;
    let big = json!({"text": "x".repeat(1024 * 1024 + 1)});
    let (status, ctype, body) = s
        .send(Method::POST, "/v1/products/acme/anything", Some(&big), true)
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(ctype, "application/problem+json");
    insta::assert_json_snapshot!("payload_too_large", body);
}
