//! Security: API keys stored hashed and managed by `parlance keys`, limits
//! on what one request may ask for, and logs free of secrets.

use std::process::Command;
use std::sync::Arc;

use parlance_app::AppState;
use parlance_app::auth::{ApiKey, ApiKeys};
use parlance_postgres::PgApiKeys;
use parlance_postgres::testing::test_pool;
use parlance_testkit::ManualClock;
use reqwest::{Method, StatusCode};
use serde_json::Value;
use sqlx::Row as _;

use crate::support::{Captured, TestServer, url_for};

fn parlance_keys(url: &str, args: &[&str]) -> Vec<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_parlance"))
        .arg("keys")
        .args(args)
        .env("DATABASE_URL", url)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run parlance keys");
    assert!(
        out.status.success(),
        "parlance keys {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

async fn status_with(server: &TestServer, key: &str, path: &str) -> StatusCode {
    server
        .client
        .request(Method::GET, format!("http://{}{}", server.addr, path))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_made_by_the_cli_are_stored_hashed_and_can_be_revoked() {
    let Some(pool) = test_pool().await else {
        return;
    };
    let url = url_for(&pool);
    let made = parlance_keys(&url, &["create", "--product", "acme", "--label", "ci"]);
    let key = made[0]["key"].as_str().unwrap().to_owned();
    let id = made[0]["id"].as_i64().unwrap();
    assert!(key.starts_with("pk_") && key.len() == 67);

    // Only the digest is stored.
    let rows = sqlx::query("SELECT key_hash, label FROM api_keys")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    let hash: Vec<u8> = rows[0].get("key_hash");
    assert_eq!(hash, ApiKey::digest(&key).to_vec());
    let dump: String = sqlx::query("SELECT string_agg(t::text, ' ') AS d FROM api_keys t")
        .fetch_one(&pool)
        .await
        .unwrap()
        .get("d");
    assert!(!dump.contains(&key[3..]));

    let listed = parlance_keys(&url, &["list"]);
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["id"], id);
    assert_eq!(listed[0]["label"], "ci");
    assert!(listed[0].get("key").is_none());
    assert!(listed[0]["revoked_at"].is_null());

    let keys = ApiKeys::new().with_store(PgApiKeys::new(pool.clone()));
    let state = AppState::postgres(pool.clone(), keys);
    let server = TestServer::start(state, Arc::new(ManualClock::new())).await;
    let path = "/v1/products/acme/tours";
    assert_eq!(status_with(&server, &key, path).await, StatusCode::OK);
    assert_eq!(
        status_with(&server, &key, "/v1/products/other/tours").await,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        status_with(&server, "pk_not_a_key", path).await,
        StatusCode::UNAUTHORIZED
    );

    let revoked = parlance_keys(&url, &["revoke", "--product", "acme", &id.to_string()]);
    assert_eq!(revoked[0]["revoked"], true);
    assert_eq!(
        status_with(&server, &key, path).await,
        StatusCode::UNAUTHORIZED
    );
    assert!(!parlance_keys(&url, &["list", "--product", "acme"])[0]["revoked_at"].is_null());
}

/// Every string under a key that carries message text, in `v`.
fn texts(v: &Value, out: &mut Vec<String>) {
    const TEXT_KEYS: [&str; 9] = [
        "text",
        "objective",
        "event_input",
        "content",
        "message",
        "reply",
        "response",
        "summary",
        "welcome",
    ];
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match x {
                    Value::String(s) if TEXT_KEYS.contains(&k.as_str()) => out.push(s.clone()),
                    _ => texts(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| texts(x, out)),
        _ => {}
    }
}

#[tokio::test]
async fn the_demo_logs_no_key_and_no_message_text_at_info() {
    let logs = Captured::default();
    let mut transcript = Vec::new();
    {
        let _guard = tracing::subscriber::set_default(logs.subscriber());
        crate::support::register_request_callsites().await;
        tracing::info!("capture started");
        parlance_app::demo::run(&mut transcript).await.unwrap();
    }
    let logs = logs.text();
    assert!(logs.contains("capture started"), "the capture works");
    let transcript = String::from_utf8(transcript).unwrap();

    // Every message text the demo sent or received, as the transcript shows it.
    let mut said = Vec::new();
    for line in transcript.lines() {
        let json = line
            .strip_prefix("-> ")
            .and_then(|l| l.find(" {").map(|i| &l[i + 1..]))
            .or_else(|| {
                line.strip_prefix("<- ")
                    .and_then(|l| l.find(' ').map(|i| &l[i + 1..]))
            });
        if let Some(v) = json.and_then(|j| serde_json::from_str::<Value>(j).ok()) {
            texts(&v, &mut said);
        }
    }
    said.retain(|s| s.trim().len() >= 12);
    said.sort();
    said.dedup();
    assert!(
        said.len() >= 5,
        "the demo exchanged message texts: {said:?}"
    );
    assert!(!logs.contains("pk_demo"), "the API key was logged");
    // The access lines are among what is checked: the demo's authenticated
    // requests each have one, with the product and the request id.
    let authenticated = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| {
            v["fields"]["message"] == "served"
                && v["span"]["product"].is_string()
                && v["span"]["request_id"].is_string()
                && v["span"]["route"]
                    .as_str()
                    .is_some_and(|r| r.starts_with("/v1/"))
        })
        .count();
    assert!(
        authenticated >= 5,
        "too few access lines of authenticated requests:\n{logs}"
    );
    for text in &said {
        let escaped = serde_json::to_string(text).unwrap();
        let escaped = escaped.trim_matches('"');
        assert!(
            !logs.contains(text.as_str()) && !logs.contains(escaped),
            "message text {text:?} was logged:\n{logs}"
        );
    }
}

/// A model server that fails twice, then answers.
async fn flaky_model() -> std::net::SocketAddr {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let calls = Arc::new(AtomicUsize::new(0));
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move || {
            let calls = calls.clone();
            async move {
                if calls.fetch_add(1, Ordering::SeqCst) < 2 {
                    return (
                        axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                        axum::Json(serde_json::json!({"error": {"message": "try again"}})),
                    );
                }
                (
                    axum::http::StatusCode::OK,
                    axum::Json(serde_json::json!({
                        "id": "c1", "object": "chat.completion", "created": 0, "model": "m",
                        "choices": [{"index": 0, "finish_reason": "stop",
                            "message": {"role": "assistant", "content": "the model's private answer text"}}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
                    })),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

#[tokio::test]
async fn model_calls_log_no_llm_key_and_no_message_text_at_info() {
    use parlance_ports::{CompletionRequest, Message};
    const LLM_KEY: &str = "sk-log-test-0123456789abcdef";
    let addr = flaky_model().await;
    let logs = Captured::default();
    {
        let _guard = tracing::subscriber::set_default(logs.subscriber());
        let config = parlance_app::config::LlmConfig {
            base_url: Some(format!("http://{addr}/v1")),
            model: Some("m".into()),
            timeout_secs: 5,
            ..parlance_app::config::LlmConfig::default()
        };
        let models = parlance_app::models::Models::from_config_with(&config, |name| {
            (name == "OPENAI_API_KEY").then(|| LLM_KEY.to_owned())
        })
        .unwrap();
        tracing::info!(llm = %models.llm.describe(), model = models.llm.default_model(), "language model");
        let request = CompletionRequest::new(vec![
            Message::system("the system prompt stays private"),
            Message::user("the user's private question text"),
        ]);
        let answer = models.llm.complete(&request).await.unwrap();
        assert!(format!("{answer:?}").contains("private answer"));
        // A second call, its outcome logged as callers log one.
        let e = models
            .llm
            .complete(&CompletionRequest::new(vec![Message::user("x")]))
            .await;
        tracing::info!(result = ?e.map(|_| ()), "second call");
    }
    let logs = logs.text();
    assert!(logs.contains("language model"), "the capture works: {logs}");
    for secret in [
        LLM_KEY,
        "the system prompt stays private",
        "the user's private question text",
        "private answer text",
    ] {
        assert!(!logs.contains(secret), "{secret:?} was logged:\n{logs}");
    }
}

#[tokio::test]
async fn too_many_items_in_one_request_are_refused_and_change_nothing() {
    use parlance_app::http::MAX_ITEMS_PER_REQUEST;
    let s = TestServer::memory().await;
    let events: Vec<Value> = (0..=MAX_ITEMS_PER_REQUEST)
        .map(|_| serde_json::json!({"kind": "mark_welcomed"}))
        .collect();
    let user = "/v1/products/acme/users/u-1/adoption";
    let cases = [
        (
            format!("{user}/events"),
            serde_json::json!({"events": events}),
            "events",
        ),
        (
            format!("{user}/activity"),
            serde_json::json!({"discovered_features": vec!["/a"; MAX_ITEMS_PER_REQUEST + 1]}),
            "discovered_features",
        ),
        (
            "/v1/products/acme/conversations".to_owned(),
            serde_json::json!({"contact_id": "c", "objective": "o", "todos": vec!["t"; MAX_ITEMS_PER_REQUEST + 1]}),
            "todos",
        ),
    ];
    for (path, body, field) in cases {
        let (status, ctype, v) = s.send(Method::POST, &path, Some(&body), true).await;
        assert_eq!(
            (status, ctype.as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, "application/problem+json"),
            "{path}: {v}"
        );
        assert_eq!(v["type"], "urn:parlance:problem:limit-exceeded");
        assert_eq!(v["field"], field);
        assert_eq!(v["max"], MAX_ITEMS_PER_REQUEST);
    }
    let (status, _, _) = s.send(Method::GET, user, None, true).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "no user was created");
    let (_, _, list) = s
        .send(Method::GET, "/v1/products/acme/conversations", None, true)
        .await;
    assert_eq!(list["items"], serde_json::json!([]), "{list}");

    // The limit itself is accepted.
    let events: Vec<Value> = (0..MAX_ITEMS_PER_REQUEST)
        .map(|_| serde_json::json!({"kind": "mark_welcomed"}))
        .collect();
    let (status, _, v) = s
        .send(
            Method::POST,
            &format!("{user}/events"),
            Some(&serde_json::json!({"events": events})),
            true,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
}
