//! Many clients on one record: 64 clients send events to one session and
//! replies to one conversation at once. Every acknowledged write is counted
//! exactly once: acknowledged session events took distinct versions and the
//! final version is their number; every acknowledged reply is in the
//! transcript once.
//!
//! `PARLANCE_CONCURRENCY_EVENTS` sets the events per client (default 8; the
//! long run by hand uses 500).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use parlance_app::AppState;
use parlance_postgres::testing::test_pool;
use parlance_testkit::ManualClock;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{KEY, TestServer, keys};

const CLIENTS: usize = 64;

fn per_client() -> usize {
    std::env::var("PARLANCE_CONCURRENCY_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8)
}

/// Sends `body` to `path` until it is acknowledged (a 503 means the write
/// lost too many races and changed nothing: the client retries). Returns
/// the acknowledged answer.
async fn until_acknowledged(client: &reqwest::Client, url: &str, body: &Value) -> Value {
    for _ in 0..1000 {
        let res = client
            .request(Method::POST, url)
            .bearer_auth(KEY)
            .json(body)
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .expect("an answer");
        match res.status() {
            StatusCode::OK | StatusCode::CREATED => return res.json().await.unwrap(),
            StatusCode::SERVICE_UNAVAILABLE => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            other => panic!("{url}: {other} {}", res.text().await.unwrap_or_default()),
        }
    }
    panic!("{url}: never acknowledged");
}

async fn session_counters_are_exact(server: TestServer) {
    let n = per_client();
    let base = format!("http://{}/v1/products/acme/sessions/hot", server.addr);
    let first = until_acknowledged(
        &server.client,
        &format!("{base}/events"),
        &json!({"type": "open_chat"}),
    )
    .await;
    let start_version = first["version"].as_i64().unwrap();
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let client = server.client.clone();
        let url = format!("{base}/events");
        tasks.push(tokio::spawn(async move {
            let mut versions = Vec::new();
            for _ in 0..n {
                let v = until_acknowledged(&client, &url, &json!({"type": "user_message"})).await;
                versions.push(v["version"].as_i64().unwrap());
            }
            versions
        }));
    }
    let mut acked = Vec::new();
    for t in tasks {
        acked.extend(t.await.unwrap());
    }
    let distinct: BTreeSet<i64> = acked.iter().copied().collect();
    assert_eq!(acked.len(), CLIENTS * n);
    assert_eq!(
        distinct.len(),
        acked.len(),
        "two acknowledged events share a version"
    );
    let (_, _, now) = server
        .send(Method::GET, "/v1/products/acme/sessions/hot", None, true)
        .await;
    assert_eq!(
        now["version"].as_i64().unwrap(),
        start_version + (CLIENTS * n) as i64,
        "the final version counts every acknowledged event once"
    );
    assert_eq!(
        *distinct.last().unwrap(),
        start_version + (CLIENTS * n) as i64
    );
}

async fn conversation_counters_are_exact(server: TestServer) {
    let n = per_client();
    let (status, _, created) = server
        .send(
            Method::POST,
            "/v1/products/acme/conversations",
            Some(&json!({"contact_id": "hot", "objective": "many replies", "todos": []})),
            true,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["conversation"]["instance_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let url = format!(
        "http://{}/v1/products/acme/conversations/{id}/replies",
        server.addr
    );
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let client = server.client.clone();
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            for e in 0..n {
                until_acknowledged(&client, &url, &json!({"text": format!("reply {c}/{e}")})).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (_, _, view) = server
        .send(
            Method::GET,
            &format!("/v1/products/acme/conversations/{id}"),
            None,
            true,
        )
        .await;
    let replies: Vec<&str> = view["transcript"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "contact")
        .map(|m| m["text"].as_str().unwrap())
        .collect();
    let distinct: BTreeSet<&str> = replies.iter().copied().collect();
    assert_eq!(replies.len(), CLIENTS * n, "every acknowledged reply once");
    assert_eq!(distinct.len(), CLIENTS * n);
}

async fn postgres_server() -> Option<TestServer> {
    let pool = test_pool().await?;
    let state = AppState::postgres(pool, keys());
    Some(TestServer::start(state, Arc::new(ManualClock::new())).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_session_many_clients_on_memory() {
    session_counters_are_exact(TestServer::memory().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_session_many_clients_on_postgres() {
    if let Some(server) = postgres_server().await {
        session_counters_are_exact(server).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_conversation_many_clients_on_memory() {
    conversation_counters_are_exact(TestServer::memory().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_conversation_many_clients_on_postgres() {
    if let Some(server) = postgres_server().await {
        conversation_counters_are_exact(server).await;
    }
}
