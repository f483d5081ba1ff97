//! The session machine over HTTP: events, reads, the gate, tours, audit,
//! errors, the sweeper, and concurrent events on both backends.

use std::sync::Arc;
use std::time::Duration;

use parlance_app::AppState;
use parlance_app::session::sweep_once;
use parlance_postgres::testing::test_pool;
use parlance_testkit::{ManualClock, SequentialIds};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{TestServer, keys};

const S: &str = "/v1/products/acme/sessions/s-1";

async fn event(s: &TestServer, body: Value) -> (StatusCode, Value) {
    let (status, _, v) = s
        .send(Method::POST, &format!("{S}/events"), Some(&body), true)
        .await;
    (status, v)
}

#[tokio::test]
async fn a_session_lives_through_its_events() {
    let s = TestServer::memory().await;
    let (st, v) = event(
        &s,
        json!({"type": "proactive_trigger", "trigger_id": "trig-1"}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    insta::assert_json_snapshot!("session_event_proactive", v);

    let (st, v) = event(&s, json!({"type": "option_click"})).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(v["snapshot"]["proactive"]["user_clicked_option"], true);

    s.clock.advance(Duration::from_secs(25));
    let (st, _, v) = s.send(Method::GET, S, None, true).await;
    assert_eq!(st, StatusCode::OK);
    insta::assert_json_snapshot!("session_get_after_timeout", v);

    let (st, _, v) = s
        .send(Method::GET, &format!("{S}/proactive-gate"), None, true)
        .await;
    assert_eq!(st, StatusCode::OK);
    insta::assert_json_snapshot!("session_gate_cooldown", v);

    let (st, v) = event(
        &s,
        json!({"type": "proactive_trigger", "trigger_id": "trig-2"}),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(v["result"]["ignored"], "v2_cooldown_active");
    assert_eq!(v["snapshot"]["current_state"], "thinking");

    let (st, v) = event(&s, json!({"type": "open_chat"})).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(v["snapshot"]["current_state"], "reactive_assistance");
    assert_eq!(v["result"]["cooldown"], "cleared");

    let (st, _, v) = s.send(Method::GET, &format!("{S}/audit"), None, true).await;
    assert_eq!(st, StatusCode::OK);
    insta::assert_json_snapshot!("session_audit", v, {".records[].seq" => "[seq]"});
}

#[tokio::test]
async fn an_invalid_transition_is_409_with_the_current_state() {
    let s = TestServer::memory().await;
    event(&s, json!({"type": "open_chat"})).await;
    let (st, _, before) = s.send(Method::GET, S, None, true).await;
    assert_eq!(st, StatusCode::OK);
    let (st, v) = event(&s, json!({"type": "proactive_trigger", "trigger_id": "t"})).await;
    assert_eq!(st, StatusCode::CONFLICT);
    insta::assert_json_snapshot!("session_invalid_transition", v);
    let (_, _, after) = s.send(Method::GET, S, None, true).await;
    assert_eq!(after, before, "a refused event changes nothing");
}

#[tokio::test]
async fn visual_guidance_in_thinking_is_ignored_with_its_reason() {
    let s = TestServer::memory().await;
    let (st, v) = event(
        &s,
        json!({"type": "visual_guidance", "active": true, "tour_id": "flow_0"}),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(v["result"]["ignored"], "v2_state_thinking");
    assert_eq!(v["snapshot"]["visual_guidance_active"], false);
}

#[tokio::test]
async fn bad_event_bodies_are_422() {
    let s = TestServer::memory().await;
    let (st, v) = event(&s, json!({"type": "dance"})).await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY);
    insta::assert_json_snapshot!("session_unknown_event", v);
    let (st, v) = event(&s, json!({"type": "proactive_trigger"})).await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY);
    insta::assert_json_snapshot!("session_missing_field", v);
    let (st, v) = event(
        &s,
        json!({"type": "conversation_linked", "event": "NEW", "conversation_id": ""}),
    )
    .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    let (st, _, _) = s.send(Method::GET, S, None, true).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "a rejected body creates nothing");
    let long = format!("/v1/products/acme/sessions/{}/events", "x".repeat(257));
    let (st, _, _) = s
        .send(
            Method::POST,
            &long,
            Some(&json!({"type": "open_chat"})),
            true,
        )
        .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn missing_sessions_and_other_products_are_404() {
    let s = TestServer::memory().await;
    let (st, _, v) = s.send(Method::GET, S, None, true).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    insta::assert_json_snapshot!("session_not_found", v);
    let (st, _, _) = s
        .send(Method::GET, "/v1/products/other/sessions/s-1", None, true)
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    // An unknown session is a fresh one to the gate.
    let (st, _, v) = s
        .send(Method::GET, &format!("{S}/proactive-gate"), None, true)
        .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        v,
        json!({"allowed": true, "reason": "ok", "current_state": null})
    );
}

#[tokio::test]
async fn tour_catalogs_override_the_timeout() {
    let s = TestServer::memory().await;
    let catalog = json!({
        "default_cooldown_period_s": 5.0,
        "tours": [{"id": "chip_0", "user_tour_id": "flow_0", "user_tour_name": "Setup", "interaction_timeout_s": 60.0}]
    });
    let (st, _, v) = s
        .send(Method::PUT, "/v1/products/acme/tours", Some(&catalog), true)
        .await;
    assert_eq!(st, StatusCode::OK);
    insta::assert_json_snapshot!("tours_put", v);
    let (st, _, bad) = s
        .send(
            Method::PUT,
            "/v1/products/acme/tours",
            Some(&json!({"tours": [{"id": "a", "interaction_timeout_s": -1}]})),
            true,
        )
        .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY);
    insta::assert_json_snapshot!("tours_invalid", bad);

    event(&s, json!({"type": "proactive_trigger", "trigger_id": "t"})).await;
    event(
        &s,
        json!({"type": "visual_guidance", "active": true, "tour_id": "flow_0"}),
    )
    .await;
    s.clock.advance(Duration::from_secs(30));
    let (_, _, v) = s.send(Method::GET, S, None, true).await;
    assert_eq!(
        v["snapshot"]["current_state"], "proactive_assistance",
        "the tour's 60 s apply"
    );
    s.clock.advance(Duration::from_secs(31));
    let (_, _, v) = s.send(Method::GET, S, None, true).await;
    assert_eq!(v["snapshot"]["current_state"], "thinking");
    assert_eq!(v["snapshot"]["thinking"]["active_cooldown_period_s"], 5.0);
}

async fn sweeper_ticks_silent_sessions(state: AppState, clock: Arc<ManualClock>) {
    let s = TestServer::start(state.clone(), clock.clone()).await;
    for i in 0..3 {
        let path = format!("/v1/products/acme/sessions/quiet-{i}/events");
        let (st, _, _) = s
            .send(
                Method::POST,
                &path,
                Some(&json!({"type": "open_chat"})),
                true,
            )
            .await;
        assert_eq!(st, StatusCode::OK);
    }
    let report = sweep_once(&state.sessions, 100).await.expect("sweep");
    assert_eq!(report.claimed, 0, "nothing is due yet");
    clock.advance(Duration::from_secs(21));
    let report = sweep_once(&state.sessions, 2).await.expect("sweep");
    assert_eq!((report.claimed, report.transitions), (2, 2));
    let report = sweep_once(&state.sessions, 100).await.expect("sweep");
    assert_eq!((report.claimed, report.transitions), (1, 1));
    let (_, _, v) = s
        .send(
            Method::GET,
            "/v1/products/acme/sessions/quiet-0/audit",
            None,
            true,
        )
        .await;
    let causes: Vec<_> = v["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["to"].clone(), r["payload"]["event"].clone()))
        .collect();
    assert_eq!(
        causes,
        [
            (json!("reactive_assistance"), json!("open_chat")),
            (json!("thinking"), json!("sweep"))
        ]
    );
    // The cooldown ends 60 s later, again without traffic.
    clock.advance(Duration::from_secs(60));
    let report = sweep_once(&state.sessions, 100).await.expect("sweep");
    assert_eq!((report.claimed, report.transitions), (3, 0));
    let (_, _, v) = s
        .send(
            Method::GET,
            "/v1/products/acme/sessions/quiet-1/proactive-gate",
            None,
            true,
        )
        .await;
    assert_eq!(v["allowed"], true);
    assert_eq!(
        sweep_once(&state.sessions, 100)
            .await
            .expect("sweep")
            .claimed,
        0
    );
}

#[tokio::test]
async fn the_sweeper_ticks_silent_sessions_on_memory() {
    let clock = Arc::new(ManualClock::new());
    let state = AppState::memory_with(keys(), clock.clone(), Arc::new(SequentialIds::new()));
    sweeper_ticks_silent_sessions(state, clock).await;
}

fn pg_state(pool: parlance_postgres::PgPool, clock: Arc<ManualClock>) -> AppState {
    let mut c = parlance_app::Components::postgres(pool, keys());
    c.clock = clock;
    c.build()
}

#[tokio::test]
async fn the_sweeper_ticks_silent_sessions_on_postgres() {
    let Some(pool) = test_pool().await else {
        return;
    };
    let clock = Arc::new(ManualClock::new());
    sweeper_ticks_silent_sessions(pg_state(pool, clock.clone()), clock).await;
}

async fn concurrent_events_all_land(state: AppState, clock: Arc<ManualClock>) {
    let s = Arc::new(TestServer::start(state, clock).await);
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let s = Arc::clone(&s);
        tasks.push(tokio::spawn(async move {
            let (st, v) = event(&s, json!({"type": "reaction"})).await;
            assert_eq!(st, StatusCode::OK, "{v}");
        }));
    }
    for t in tasks {
        t.await.expect("client");
    }
    let (_, _, v) = s.send(Method::GET, S, None, true).await;
    assert_eq!(v["version"], 33, "one creation, then one save per event");
}

#[tokio::test]
async fn concurrent_events_all_land_on_memory() {
    let clock = Arc::new(ManualClock::new());
    let state = AppState::memory_with(keys(), clock.clone(), Arc::new(SequentialIds::new()));
    concurrent_events_all_land(state, clock).await;
}

#[tokio::test]
async fn concurrent_events_all_land_on_postgres() {
    let Some(pool) = test_pool().await else {
        return;
    };
    let clock = Arc::new(ManualClock::new());
    concurrent_events_all_land(pg_state(pool, clock.clone()), clock).await;
}

#[tokio::test]
async fn the_demo_plays_its_session_scene() {
    let mut out = Vec::new();
    parlance_app::demo::run(&mut out).await.expect("demo");
    let text = String::from_utf8(out).expect("utf-8");
    assert!(text.contains("== session: proactive offer, timeout, cooldown"));
    assert!(text.contains("sweeper: 1 due, 1 timed out"));
}

#[tokio::test]
async fn the_spawned_sweeper_times_out_silent_sessions_by_itself() {
    let clock = Arc::new(ManualClock::new());
    let state = AppState::memory_with(keys(), clock.clone(), Arc::new(SequentialIds::new()));
    let s = TestServer::start(state.clone(), clock.clone()).await;
    event(&s, json!({"type": "open_chat"})).await;
    clock.advance(Duration::from_secs(21));
    let sweeper = parlance_app::session::spawn_session_sweeper(state.sessions.clone());
    let key = parlance_core::session::SessionKey::new(
        parlance_core::ProductId::parse("acme").unwrap(),
        parlance_core::session::SessionId::parse("s-1").unwrap(),
    );
    let mut timed_out = false;
    for _ in 0..50 {
        let stored = state.sessions.store.load(&key).await.unwrap().unwrap();
        if stored.state.current_state() == parlance_core::session::AssistState::Thinking {
            timed_out = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    sweeper.abort();
    assert!(
        timed_out,
        "the sweeper did not tick the due session within 5 s"
    );
}
