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

use crate::support::{TestServer, url_for};

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
