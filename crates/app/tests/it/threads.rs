//! The agent's threads over HTTP beyond a turn: an owner's threads, a
//! thread's history and its state at a checkpoint, forks, operator updates,
//! deletion and the erasure of an owner's memory, with both crisis-log
//! settings, on the in-memory adapters and on PostgreSQL (same snapshots).

use std::sync::Arc;
use std::time::Duration;

use parlance_app::auth::ApiKey;
use parlance_app::{AppState, Components};
use parlance_core::ProductId;
use parlance_postgres::testing::test_pool;
use parlance_testkit::{ManualClock, SequentialIds};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::documented::assert_documented;
use crate::support::{KEY, TestServer, keys};

/// The key of a second product, `beta`.
const BETA_KEY: &str = "pk_test_beta";

/// Which backend a test server runs on.
#[derive(Clone, Copy)]
enum On {
    Memory,
    Postgres,
}

/// A server on `on` whose keys open `acme` and `beta`, with a manual clock
/// and sequential ids, after `tune` adjusted its components; `None` when
/// PostgreSQL is asked for and not available.
async fn server(on: On, tune: impl FnOnce(&mut Components)) -> Option<TestServer> {
    let mut keys = keys();
    keys.insert(&ApiKey::new(BETA_KEY), ProductId::parse("beta").unwrap());
    let mut c = match on {
        On::Memory => Components::memory(keys),
        On::Postgres => Components::postgres(test_pool().await?, keys),
    };
    let clock = Arc::new(ManualClock::new());
    c.clock = clock.clone();
    c.ids = Arc::new(SequentialIds::new());
    tune(&mut c);
    let state: AppState = c.build();
    Some(TestServer::start(state, clock).await)
}

/// Replaces what varies between runs and backends: times, ids, seqs and
/// cursors (which hold a time).
fn redact(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .map(|(k, v)| {
                    let v = match k.as_str() {
                        _ if k.ends_with("_ms") => json!("[ms]"),
                        "at" | "updated_at" => json!("[time]"),
                        "id" if !v.is_null() => json!("[id]"),
                        "seq" => json!("[seq]"),
                        "next_cursor" => json!("[cursor]"),
                        _ => redact(v),
                    };
                    (k, v)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(redact).collect()),
        other => other,
    }
}

/// A request with `key` to `path` under `/v1/products/{product}/agent`,
/// its answer checked against the API document.
async fn call_as(
    s: &TestServer,
    key: &str,
    product: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let path = format!("/v1/products/{product}/agent{path}");
    let mut req = s
        .client
        .request(method.clone(), format!("http://{}{}", s.addr, path))
        .bearer_auth(key);
    if let Some(b) = &body {
        req = req.json(b);
    }
    let res = req.send().await.unwrap();
    let status = res.status();
    let bytes = res.bytes().await.unwrap();
    let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    assert_documented(&method, &path, status, &v);
    (status, v)
}

/// A request with the `acme` key.
async fn call(
    s: &TestServer,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    call_as(s, KEY, "acme", method, path, body).await
}

/// One turn of `user` in `session`, which must succeed.
async fn turn(s: &TestServer, user: &str, session: &str, message: &str) {
    let (status, v) = call(
        s,
        Method::POST,
        "/turns",
        Some(json!({"message": message, "user_id": user, "session_id": session})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    s.clock.advance(Duration::from_secs(1));
}

/// Versions in a history answer, newest first.
fn versions(v: &Value) -> Vec<u64> {
    v["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["version"].as_u64().unwrap())
        .collect()
}

/// Thread ids in a list answer, in order.
fn thread_ids(v: &Value) -> Vec<String> {
    v["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["thread_id"].as_str().unwrap().to_owned())
        .collect()
}

/// Lists, history, time travel, forks and updates; the snapshots are
/// shared by both backends.
async fn history_scenario(s: &TestServer) {
    turn(s, "ana", "s1", "Hello there").await;
    turn(s, "ana", "s2", "A second conversation").await;
    turn(s, "ana", "s1", "I have been feeling tense").await;
    turn(s, "ana", "s1", "Thanks for listening").await;

    // An owner's threads, most recently written first, a page at a time.
    let (status, page) = call(s, Method::GET, "/threads?owner=ana&limit=1", None).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(thread_ids(&page), ["s1"]);
    insta::assert_json_snapshot!("threads_list_page", redact(page.clone()));
    let cursor = page["next_cursor"].as_str().unwrap();
    let (_, next) = call(
        s,
        Method::GET,
        &format!("/threads?owner=ana&limit=1&cursor={cursor}"),
        None,
    )
    .await;
    assert_eq!(thread_ids(&next), ["s2"]);
    let cursor = next["next_cursor"].as_str().unwrap();
    let (_, last) = call(
        s,
        Method::GET,
        &format!("/threads?owner=ana&limit=1&cursor={cursor}"),
        None,
    )
    .await;
    assert_eq!(thread_ids(&last), Vec::<String>::new());
    assert!(last.get("next_cursor").is_none(), "{last}");
    let (_, all) = call(s, Method::GET, "/threads?owner=ana", None).await;
    assert_eq!(thread_ids(&all), ["s1", "s2"]);
    assert!(all.get("next_cursor").is_none(), "{all}");
    assert_eq!(all["threads"][0]["version"], 3);
    let (_, none) = call(s, Method::GET, "/threads?owner=nobody", None).await;
    assert_eq!(thread_ids(&none), Vec::<String>::new());
    let (status, v) = call(s, Method::GET, "/threads?owner=ana&cursor=zz", None).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_eq!(v["field"], "cursor");
    let (status, v) = call(s, Method::GET, "/threads?owner=ana&cursor=7b7d", None).await;
    assert_eq!(
        status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{{}} is no cursor: {v}"
    );
    let (status, v) = call(s, Method::GET, "/threads?owner=ana&limit=0", None).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_eq!(v["field"], "limit");
    let (status, _) = call(s, Method::GET, "/threads", None).await;
    assert!(status.is_client_error(), "the owner is required: {status}");

    // The history, newest first, a page at a time.
    let (status, h) = call(s, Method::GET, "/threads/s1/history?user_id=ana", None).await;
    assert_eq!(status, StatusCode::OK, "{h}");
    assert_eq!(versions(&h), [3, 2, 1]);
    insta::assert_json_snapshot!("threads_history", redact(h));
    let (_, h) = call(
        s,
        Method::GET,
        "/threads/s1/history?user_id=ana&limit=2",
        None,
    )
    .await;
    assert_eq!(versions(&h), [3, 2]);
    assert_eq!(h["next_before"], 2);
    let (_, h) = call(
        s,
        Method::GET,
        "/threads/s1/history?user_id=ana&limit=2&before=2",
        None,
    )
    .await;
    assert_eq!(versions(&h), [1]);
    assert!(h.get("next_before").is_none(), "{h}");
    let (status, h) = call(
        s,
        Method::GET,
        "/threads/s1/history?user_id=ana&before=1",
        None,
    )
    .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "an existing thread's empty page: {h}"
    );
    assert_eq!(versions(&h), Vec::<u64>::new());
    for path in [
        "/threads/nope/history?user_id=ana",
        "/threads/nope/history?user_id=ana&before=5",
        "/threads/s1/history",
    ] {
        let (status, v) = call(s, Method::GET, path, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {v}");
    }

    // The state as of a checkpoint.
    let (status, cp) = call(
        s,
        Method::GET,
        "/threads/s1/checkpoints/1?user_id=ana",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{cp}");
    assert_eq!(cp["version"], 1);
    assert_eq!(cp["transcript"].as_array().unwrap().len(), 2);
    insta::assert_json_snapshot!("threads_checkpoint", redact(cp));
    let (_, now) = call(s, Method::GET, "/threads/s1?user_id=ana", None).await;
    let (_, cp3) = call(
        s,
        Method::GET,
        "/threads/s1/checkpoints/3?user_id=ana",
        None,
    )
    .await;
    assert_eq!(cp3["transcript"], now["transcript"]);
    assert_eq!(cp3["state"], now["state"]);
    for path in [
        "/threads/s1/checkpoints/4?user_id=ana",
        "/threads/s1/checkpoints/0?user_id=ana",
        "/threads/nope/checkpoints/1?user_id=ana",
    ] {
        let (status, v) = call(s, Method::GET, path, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {v}");
    }

    // A fork: a new thread from checkpoint 1.
    let fork = |version: u64, to: &str| {
        Some(json!({"user_id": "ana", "version": version, "new_thread_id": to}))
    };
    let (status, meta) = call(s, Method::POST, "/threads/s1/fork", fork(1, "s1-alt")).await;
    assert_eq!(status, StatusCode::CREATED, "{meta}");
    insta::assert_json_snapshot!("threads_fork", redact(meta));
    let (status, alt) = call(s, Method::GET, "/threads/s1-alt?user_id=ana", None).await;
    assert_eq!(status, StatusCode::OK, "{alt}");
    assert_eq!(alt["version"], 1);
    assert_eq!(
        alt["transcript"].as_array().unwrap()[..],
        cp3["transcript"].as_array().unwrap()[..2]
    );
    let (status, v) = call(s, Method::POST, "/threads/s1/fork", fork(1, "s1-alt")).await;
    assert_eq!(status, StatusCode::CONFLICT, "the new thread exists: {v}");
    let (status, v) = call(s, Method::POST, "/threads/s1/fork", fork(2, "s2")).await;
    assert_eq!(status, StatusCode::CONFLICT, "the new thread exists: {v}");
    let (status, v) = call(s, Method::POST, "/threads/s1/fork", fork(9, "s1-b")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "no checkpoint 9: {v}");
    let (status, v) = call(s, Method::POST, "/threads/nope/fork", fork(1, "s1-b")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    turn(s, "ana", "s1-alt", "Going another way").await;
    let (_, h) = call(
        s,
        Method::GET,
        "/threads/s1/history?user_id=ana&limit=1",
        None,
    )
    .await;
    assert_eq!(
        versions(&h),
        [3],
        "a turn on the fork never reaches the original"
    );

    // An operator's update, through the thread machine.
    let update = |body: Value| Some(body);
    let (status, v) = call(
        s,
        Method::POST,
        "/threads/s1/state",
        update(json!({
            "user_id": "ana", "expected_version": 3,
            "objects": {"session_memory": {"summary": "Operator note"}, "exercise_state.exercise_step": 2}
        })),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    insta::assert_json_snapshot!("threads_update", redact(v));
    let (_, t) = call(s, Method::GET, "/threads/s1?user_id=ana", None).await;
    assert_eq!(t["version"], 4);
    assert_eq!(t["state"]["session_memory"]["summary"], "Operator note");
    assert_eq!(t["state"]["exercise_state.exercise_step"], 2);
    let (_, h) = call(
        s,
        Method::GET,
        "/threads/s1/history?user_id=ana&limit=1",
        None,
    )
    .await;
    assert_eq!(h["checkpoints"][0]["source"], "update");
    let (status, v) = call(
        s,
        Method::POST,
        "/threads/s1/state",
        update(json!({
            "user_id": "ana",
            "appends": {"transcript": [{"role": "assistant", "content": "An operator's word."}]}
        })),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["version"], 5);
    let (_, t) = call(
        s,
        Method::GET,
        "/threads/s1/checkpoints/5?user_id=ana",
        None,
    )
    .await;
    let transcript = t["transcript"].as_array().unwrap();
    assert_eq!(transcript.len(), 7);
    assert_eq!(transcript[6]["content"], "An operator's word.");
    // The thread still runs after both updates.
    turn(s, "ana", "s1", "One more thing").await;

    let (status, v) = call(
        s,
        Method::POST,
        "/threads/s1/state",
        update(json!({"user_id": "ana", "expected_version": 3, "objects": {}})),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["reason"], "stale_turn");
    insta::assert_json_snapshot!("threads_update_stale", v);
    let (status, v) = call(
        s,
        Method::POST,
        "/threads/s1/state",
        update(json!({"user_id": "ana", "objects": {"__interrupt": {"stage": "x"}}})),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["reason"], "reserved_key");
    for (patch, field) in [
        (json!({"objects": {"nope": 1}}), "objects.nope"),
        (json!({"objects": {"transcript": []}}), "objects.transcript"),
        (json!({"objects": {"history": []}}), "objects.history"),
        (json!({"objects": {"crisis": {}}}), "objects.crisis"),
        (json!({"objects": {"message": "hi"}}), "objects.message"),
        (
            json!({"appends": {"session_memory": [{}]}}),
            "appends.session_memory",
        ),
        (
            json!({"appends": {"$crisis_log": [{}]}}),
            "appends.$crisis_log",
        ),
        (
            json!({"objects": {"exercise_state.exercise_step": "three"}}),
            "objects.exercise_state.exercise_step",
        ),
        (
            json!({"appends": {"transcript": [{"role": "nobody"}]}}),
            "appends.transcript",
        ),
    ] {
        let mut body = patch.clone();
        body["user_id"] = json!("ana");
        let (status, v) = call(s, Method::POST, "/threads/s1/state", Some(body)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{patch}: {v}");
        assert_eq!(v["field"], field, "{patch}: {v}");
    }
    let (_, t) = call(s, Method::GET, "/threads/s1?user_id=ana", None).await;
    assert_eq!(t["version"], 6, "no refused update changed the thread");
    let (status, v) = call(
        s,
        Method::POST,
        "/threads/nope/state",
        update(json!({"user_id": "ana", "objects": {}})),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");

    // Another product's key reaches none of these threads, even under the
    // same owner and thread ids.
    let beta = |method: Method, path: &'static str, body: Option<Value>| {
        call_as(s, BETA_KEY, "beta", method, path, body)
    };
    let (_, v) = beta(Method::GET, "/threads?owner=ana", None).await;
    assert_eq!(thread_ids(&v), Vec::<String>::new());
    for (method, path, body) in [
        (Method::GET, "/threads/s1/history?user_id=ana", None),
        (Method::GET, "/threads/s1/checkpoints/1?user_id=ana", None),
        (Method::POST, "/threads/s1/fork", fork(1, "stolen")),
        (
            Method::POST,
            "/threads/s1/state",
            Some(json!({"user_id": "ana", "objects": {}})),
        ),
        (Method::DELETE, "/threads/s1?user_id=ana", None),
    ] {
        let (status, v) = beta(method.clone(), path, body.clone()).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {v}");
        // Nor does `beta`'s key on `acme`'s routes.
        let (status, _) = call_as(s, BETA_KEY, "acme", method.clone(), path, body).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}");
    }
    let (_, t) = call(s, Method::GET, "/threads/s1?user_id=ana", None).await;
    assert_eq!(t["version"], 6, "acme's thread is untouched");

    // Deletion: the thread and its history go; its fork stays.
    let (status, _) = call(s, Method::DELETE, "/threads/s1?user_id=ana", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = call(s, Method::DELETE, "/threads/s1?user_id=ana", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    for path in [
        "/threads/s1?user_id=ana",
        "/threads/s1/history?user_id=ana",
        "/threads/s1/checkpoints/1?user_id=ana",
    ] {
        let (status, _) = call(s, Method::GET, path, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
    }
    let (status, alt) = call(
        s,
        Method::GET,
        "/threads/s1-alt/checkpoints/1?user_id=ana",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "the fork keeps its own copy: {alt}");
    assert_eq!(alt["transcript"].as_array().unwrap().len(), 2);
    let (_, all) = call(s, Method::GET, "/threads?owner=ana", None).await;
    assert_eq!(thread_ids(&all), ["s1-alt", "s2"]);
    // A session-owned thread: no user id, the thread is its own owner.
    turn_of_session(s, "solo").await;
    let (status, _) = call(s, Method::GET, "/threads/solo/history", None).await;
    assert_eq!(status, StatusCode::OK);
    // Its fork is owned by the new thread, so it reads without a user id.
    let (status, v) = call(
        s,
        Method::POST,
        "/threads/solo/fork",
        Some(json!({"version": 1, "new_thread_id": "solo-2"})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    assert_eq!(v["parent"]["owner"], "solo");
    let (status, v) = call(s, Method::GET, "/threads/solo-2", None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["owner"], "solo-2");
    let (status, _) = call(s, Method::DELETE, "/threads/solo", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
}

async fn turn_of_session(s: &TestServer, session: &str) {
    let (status, v) = call(
        s,
        Method::POST,
        "/turns",
        Some(json!({"message": "Hi", "session_id": session})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
}

/// Memory erasure with the crisis log kept (`erase_crisis_log = false`) or
/// erased too.
async fn erasure_scenario(s: &TestServer, erase_crisis_log: bool) {
    turn(s, "ana", "s1", "My work is a lot lately").await;
    turn(s, "ana", "s1", "I want to end my life").await;
    turn(s, "bo", "b1", "I want to end my life").await;
    let entry = json!({"entry": {"type": "semantic", "category": "preference", "subject": "User",
        "predicate": "LIKES", "object": "walks", "evidence_quote": "walks help me"}});
    for owner in ["ana", "ana", "bo"] {
        let (status, v) = call(
            s,
            Method::POST,
            &format!("/memory/{owner}"),
            Some(entry.clone()),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{v}");
    }
    let (_, log) = call(s, Method::GET, "/crisis-log/ana", None).await;
    let logged = log["records"].as_array().unwrap().len();
    assert!(logged >= 2, "every turn's assessment is logged: {log}");
    let (_, log) = call(s, Method::GET, "/crisis-log/bo", None).await;
    let bo_logged = log["records"].as_array().unwrap().len();
    assert!(bo_logged >= 1, "{log}");

    let (status, v) = call(s, Method::DELETE, "/memory/ana", None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["entries_deleted"], 2);
    let expected = if erase_crisis_log { logged } else { 0 };
    assert_eq!(v["crisis_records_deleted"], expected);
    let name = if erase_crisis_log {
        "threads_erased_with_crisis_log"
    } else {
        "threads_erased_crisis_log_kept"
    };
    insta::assert_json_snapshot!(name, v);

    let (_, m) = call(s, Method::GET, "/memory/ana", None).await;
    assert_eq!(m["entries"], json!([]));
    let (_, log) = call(s, Method::GET, "/crisis-log/ana", None).await;
    let left = log["records"].as_array().unwrap().len();
    assert_eq!(left, logged - expected, "{log}");
    // Another owner's memory and log are untouched.
    let (_, m) = call(s, Method::GET, "/memory/bo", None).await;
    assert_eq!(m["entries"].as_array().unwrap().len(), 1);
    let (_, log) = call(s, Method::GET, "/crisis-log/bo", None).await;
    assert_eq!(log["records"].as_array().unwrap().len(), bo_logged);
    // Threads are kept; they are deleted one by one.
    let (status, _) = call(s, Method::GET, "/threads/s1?user_id=ana", None).await;
    assert_eq!(status, StatusCode::OK);
    // Erasing again, or an unknown owner, erases nothing.
    let (status, v) = call(s, Method::DELETE, "/memory/ana", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v["entries_deleted"], 0);
    assert_eq!(v["crisis_records_deleted"], 0);
    // Another product's key erases nothing of `acme`'s.
    let (status, v) = call_as(s, BETA_KEY, "beta", Method::DELETE, "/memory/bo", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v["entries_deleted"], 0);
    assert_eq!(v["crisis_records_deleted"], 0);
    let (status, _) = call_as(s, BETA_KEY, "acme", Method::DELETE, "/memory/bo", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, m) = call(s, Method::GET, "/memory/bo", None).await;
    assert_eq!(m["entries"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn thread_history_over_http_on_memory() {
    let s = server(On::Memory, |_| {}).await.unwrap();
    history_scenario(&s).await;
}

#[tokio::test]
async fn thread_history_over_http_on_postgres() {
    let Some(s) = server(On::Postgres, |_| {}).await else {
        return;
    };
    history_scenario(&s).await;
}

#[tokio::test]
async fn erasure_keeps_the_crisis_log_by_default() {
    for on in [On::Memory, On::Postgres] {
        let Some(s) = server(on, |_| {}).await else {
            continue;
        };
        erasure_scenario(&s, false).await;
    }
}

#[tokio::test]
async fn erasure_deletes_the_crisis_log_when_configured() {
    for on in [On::Memory, On::Postgres] {
        let Some(s) = server(on, |c| c.erase_crisis_log = true).await else {
            continue;
        };
        erasure_scenario(&s, true).await;
    }
}

#[tokio::test]
async fn the_configured_snapshot_interval_reaches_the_store() {
    let Some(pool) = test_pool().await else {
        return;
    };
    let mut keys = keys();
    keys.insert(&ApiKey::new(BETA_KEY), ProductId::parse("beta").unwrap());
    let mut c = Components::postgres(pool.clone(), keys);
    c.snapshot_every = 2;
    let s = TestServer::start(c.build(), Arc::new(ManualClock::new())).await;
    for i in 0..5 {
        turn(&s, "ana", "s1", &format!("Message {i}")).await;
    }
    let copies: Vec<i64> = sqlx::query_scalar(
        "SELECT version FROM turn_checkpoint WHERE thread_id = 's1' AND snapshot IS NOT NULL \
         ORDER BY version",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        copies,
        [1, 2, 4],
        "a copy every 2 checkpoints, as configured"
    );
    let (status, cp) = call(
        &s,
        Method::GET,
        "/threads/s1/checkpoints/3?user_id=ana",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(cp["transcript"].as_array().unwrap().len(), 6);
}
