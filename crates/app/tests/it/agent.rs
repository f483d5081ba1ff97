//! The support agent over HTTP: turns on each route, the thread, session
//! end with an episodic summary, the owner's memory and the crisis log, on
//! the in-memory adapters and on PostgreSQL (same snapshots).

use std::sync::Arc;

use parlance_app::AppState;
use parlance_app::agent::AgentData;
use parlance_memory::{OfflineLlm, Reply, When};
use parlance_postgres::testing::test_pool;
use parlance_testkit::ManualClock;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::documented::assert_documented;
use crate::support::{TestServer, keys};

const BASE: &str = "/v1/products/acme/agent";

/// A model scripted per prompt.
fn model() -> OfflineLlm {
    let gate = |level: u8, crisis: bool| {
        Reply::json(&json!({
            "level": level, "confidence": 0.9, "reason": if crisis { "explicit intent" } else { "no risk" },
            "needs_crisis_response": crisis, "needs_clarification": false
        }))
    };
    OfflineLlm::new()
        .with_rule(
            When::PromptName("episodic_summary".into()),
            Reply::json(&json!({
                "summary": "Talked about stress with a difficult boss.",
                "primary_themes": ["work"], "approach_used": "cbt"
            })),
        )
        .with_rule(When::UserContains("end my life".into()), gate(3, true))
        .with_rule(When::PromptName("crisis_gate".into()), gate(0, false))
        .with_rule(
            When::PromptName("therapeutic_reply".into()),
            Reply::json(&json!({
                "response_style": "reflective", "therapeutic_approach": "cbt",
                "reply": "It sounds like work has been weighing on you."
            })),
        )
        .with_rule(
            When::Contains("My boss is terrible".into()),
            Reply::json(&json!({"facts": [{
                "category": "work", "subject": "User", "predicate": "WORRIES_ABOUT",
                "object": "boss", "evidence_quote": "My boss is terrible"
            }]})),
        )
        .with_rule(
            When::PromptName("memory_extraction".into()),
            Reply::json(&json!({"facts": []})),
        )
}

fn prepare(mut c: parlance_app::Components) -> AppState {
    c.llm = Arc::new(model());
    c.agent_data = AgentData::examples().unwrap();
    c.build()
}

/// Replaces what varies between runs and backends: timings, ids, seqs.
fn redact(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .map(|(k, v)| {
                    let v = match k.as_str() {
                        _ if k.ends_with("_ms") => json!("[ms]"),
                        "id" if !v.is_null() => json!("[id]"),
                        "seq" => json!("[seq]"),
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

async fn call(
    s: &TestServer,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let path = format!("{BASE}{path}");
    let (status, _, v) = s.send(method.clone(), &path, body.as_ref(), true).await;
    assert_documented(&method, &path, status, &v);
    (status, redact(v))
}

async fn turn(s: &TestServer, message: &str) -> (StatusCode, Value) {
    call(
        s,
        Method::POST,
        "/turns",
        Some(json!({"message": message, "user_id": "ana", "session_id": "s1", "channel": "WEB"})),
    )
    .await
}

/// The whole scenario; the snapshots are shared by both backends.
async fn scenario(s: &TestServer) {
    let (status, v) = call(s, Method::POST, "/turns", Some(json!({"message": "hi"}))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    insta::assert_json_snapshot!("agent_turn_without_owner", v);

    let (status, v) = turn(s, "My boss is terrible and I dread Mondays").await;
    assert_eq!(status, StatusCode::OK);
    insta::assert_json_snapshot!("agent_turn_therapeutic", v);

    let (_, v) = turn(s, "What do you remember about me?").await;
    insta::assert_json_snapshot!("agent_turn_memory_control", v);

    let (_, v) = turn(s, "What is box breathing?").await;
    insta::assert_json_snapshot!("agent_turn_grounded", v);

    let (_, v) = turn(s, "I want to end my life. I live in the UK.").await;
    insta::assert_json_snapshot!("agent_turn_crisis", v);

    let (status, v) = call(s, Method::GET, "/threads/s1?user_id=ana", None).await;
    assert_eq!(status, StatusCode::OK);
    insta::assert_json_snapshot!("agent_thread", v);
    let (status, _) = call(s, Method::GET, "/threads/nope?user_id=ana", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let (status, v) = call(
        s,
        Method::POST,
        "/threads/s1/end",
        Some(json!({"user_id": "ana"})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    insta::assert_json_snapshot!("agent_thread_end", v);

    let (status, v) = call(s, Method::GET, "/memory/ana", None).await;
    assert_eq!(status, StatusCode::OK);
    insta::assert_json_snapshot!("agent_memory_list", v);

    let entry = json!({"entry": {"type": "semantic", "category": "preference", "subject": "User",
        "predicate": "LIKES", "object": "walks", "evidence_quote": "walks help me"}});
    let (status, _, added) = s
        .send(
            Method::POST,
            &format!("{BASE}/memory/ana"),
            Some(&entry),
            true,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_documented(&Method::POST, &format!("{BASE}/memory/ana"), status, &added);
    insta::assert_json_snapshot!("agent_memory_add", redact(added.clone()));
    let id = added["id"].as_str().unwrap().to_owned();
    let (status, _) = call(s, Method::DELETE, &format!("/memory/ana/{id}"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = call(s, Method::DELETE, &format!("/memory/ana/{id}"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, v) = call(s, Method::GET, "/memory/ana?kind=semantic", None).await;
    assert_eq!(v["entries"].as_array().unwrap().len(), 1);

    let (status, v) = call(s, Method::GET, "/crisis-log/ana", None).await;
    assert_eq!(status, StatusCode::OK);
    insta::assert_json_snapshot!("agent_crisis_log", v);
}

#[tokio::test]
async fn the_agent_over_http_on_memory() {
    let clock = Arc::new(ManualClock::new());
    let s = TestServer::start(prepare(crate::support::components(&clock)), clock).await;
    scenario(&s).await;
}

#[tokio::test]
async fn the_agent_over_http_on_postgres() {
    let Some(pool) = test_pool().await else {
        return;
    };
    // The same manual clock and ids as on memory: both answer the same.
    let clock = Arc::new(ManualClock::new());
    let mut c = parlance_app::Components::postgres(pool, keys());
    c.clock = clock.clone();
    c.ids = Arc::new(parlance_testkit::SequentialIds::new());
    let s = TestServer::start(prepare(c), clock).await;
    scenario(&s).await;
}

#[tokio::test]
async fn session_id_alone_owns_the_memory() {
    let clock = Arc::new(ManualClock::new());
    let s = TestServer::start(prepare(crate::support::components(&clock)), clock).await;
    let (status, v) = call(
        &s,
        Method::POST,
        "/turns",
        Some(json!({"message": "My boss is terrible", "session_id": "anon-1"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (_, v) = call(&s, Method::GET, "/memory/anon-1", None).await;
    assert_eq!(v["entries"].as_array().unwrap().len(), 1);
    let (status, v) = call(&s, Method::GET, "/threads/anon-1", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v["version"], 1);
    let (status, _, _) = s
        .send(
            Method::POST,
            "/v1/products/other/agent/turns",
            Some(&json!({"message": "x", "session_id": "a"})),
            true,
        )
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "another product's path is not the key's"
    );
}

#[tokio::test]
async fn the_demo_plays_the_support_agent_scene() {
    let mut out = Vec::new();
    parlance_app::demo::run(&mut out).await.expect("demo");
    let text = String::from_utf8(out).expect("utf-8");
    assert!(text.contains("== support agent:"), "{text}");
    assert!(text.contains("agent (reflective): Last time you told me"));
    assert!(text.contains("Done. I've deleted 2 memories about exams."));
    assert!(text.contains("crisis level 2 via keyword_fallback; resources: found"));
}

#[tokio::test]
async fn caller_history_and_working_memory_reach_the_prompt() {
    let clock = Arc::new(ManualClock::new());
    let mut c = crate::support::components(&clock);
    let llm = Arc::new(model());
    c.llm = llm.clone();
    let s = TestServer::start(c.build(), clock).await;
    let (status, v) = call(
        &s,
        Method::POST,
        "/turns",
        Some(json!({"message": "   ", "user_id": "ana"})),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    let body = json!({
        "message": "It happened again",
        "user_id": "ana",
        "history": [
            {"role": "user", "content": "My neighbour plays loud music at night"},
            {"role": "assistant", "content": "That sounds exhausting."}
        ],
        "working_memory": [
            {"type": "episodic", "summary": "talked about poor sleep", "primary_themes": ["sleep"]},
            "Prefers short answers"
        ],
        "installed_skills": ["sleep_hygiene"]
    });
    let (status, v) = call(&s, Method::POST, "/turns", Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let prompt: String = llm
        .received()
        .iter()
        .filter(|r| r.prompt_name.as_deref() == Some("therapeutic_reply"))
        .flat_map(|r| r.messages.iter().map(|m| m.content.clone()))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        prompt.contains("Last session (sleep): talked about poor sleep"),
        "{prompt}"
    );
    assert!(prompt.contains("Prefers short answers"));
    assert!(prompt.contains("My neighbour plays loud music at night"));
    assert!(prompt.contains("Installed skills: sleep_hygiene"));
    let (_, thread) = call(&s, Method::GET, "/threads/default?user_id=ana", None).await;
    assert_eq!(
        thread["transcript"].as_array().unwrap().len(),
        2,
        "the caller's history is context, not stored"
    );
}
