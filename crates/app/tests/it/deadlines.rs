//! Request budgets end to end, against a model endpoint that accepts the
//! connection and never answers (a local TCP listener): an agent turn
//! answers within its budget with the keyword classifier's route, and a
//! request that needs the model gets a problem+json within its budget. And
//! the crisis log on both adapters: racing turns on one thread, the loser
//! planned twice, leave one entry each.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parlance_app::agent::AgentData;
use parlance_app::{Components, Config, Flags};
use parlance_memory::OfflineLlm;
use parlance_ports::{CompletionRequest, CompletionResponse, LlmClient, LlmResult};
use parlance_postgres::testing::test_pool;
use parlance_testkit::ManualClock;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{TestServer, keys};

const BASE: &str = "/v1/products/acme/agent";

/// The agent's budget in these tests; answers must come within twice it.
const BUDGET: Duration = Duration::from_secs(2);

/// An OpenAI-compatible base URL whose server accepts every connection,
/// reads nothing and never answers.
async fn silent_endpoint() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    format!("http://{addr}/v1")
}

/// A service configured as `serve` is, with the model at the silent
/// endpoint (5 s per attempt, the client's default retries) and budgets of
/// [`BUDGET`] (500 ms for the crisis gate).
async fn server() -> TestServer {
    let base_url = silent_endpoint().await;
    let env = move |name: &str| -> Option<String> {
        match name {
            "PARLANCE_LLM_BASE_URL" => Some(base_url.clone()),
            "PARLANCE_LLM_MODEL" => Some("never-answers".to_owned()),
            "PARLANCE_LLM_TIMEOUT_SECS" => Some("5".to_owned()),
            "PARLANCE_BUDGET_AGENT_MS" | "PARLANCE_BUDGET_COMMANDS_MS" => Some("2000".to_owned()),
            "PARLANCE_BUDGET_CRISIS_GATE_MS" => Some("500".to_owned()),
            _ => None,
        }
    };
    let config = Config::load(&Flags::default(), env).unwrap();
    let mut c = Components::from_config(&config, keys()).await.unwrap();
    c.agent_data = AgentData::examples().unwrap();
    TestServer::start(c.build(), Arc::new(ManualClock::new())).await
}

/// Sends and times a request, failing (rather than waiting minutes) when no
/// answer comes within five budgets.
async fn timed(
    s: &TestServer,
    method: Method,
    path: &str,
    body: Option<&Value>,
) -> (StatusCode, String, Value, Duration) {
    let started = Instant::now();
    let (status, ctype, body) = tokio::time::timeout(5 * BUDGET, s.send(method, path, body, true))
        .await
        .unwrap_or_else(|_| panic!("{path}: no answer within {:?}", 5 * BUDGET));
    (status, ctype, body, started.elapsed())
}

#[tokio::test]
async fn a_crisis_turn_answers_within_its_budget_by_keywords() {
    let s = server().await;
    let turn = json!({"message": "I want to end my life", "user_id": "u1", "session_id": "s1"});
    let (status, _, out, took) =
        timed(&s, Method::POST, &format!("{BASE}/turns"), Some(&turn)).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert!(took < 2 * BUDGET, "the turn took {took:?}");
    assert_eq!(out["response_type"], "crisis");
    assert_eq!(out["crisis"]["needs_crisis_response"], true);
    assert_eq!(
        out["diagnostics"]["crisis_classifier_path"],
        "keyword_fallback"
    );
    assert_eq!(out["diagnostics"]["route"], "crisis");
    let (status, _, log, _) = timed(&s, Method::GET, &format!("{BASE}/crisis-log/u1"), None).await;
    assert_eq!(status, StatusCode::OK);
    let records = log["records"].as_array().unwrap();
    assert_eq!(records.len(), 1, "{log}");
    assert_eq!(records[0]["audit"]["classifier_path"], "keyword_fallback");
    assert_eq!(records[0]["audit"]["llm_failure_occurred"], true);
}

#[tokio::test]
async fn a_turn_needing_the_model_answers_within_its_budget() {
    let s = server().await;
    let turn =
        json!({"message": "Work has been stressful lately", "user_id": "u1", "session_id": "s1"});
    let (status, _, out, took) =
        timed(&s, Method::POST, &format!("{BASE}/turns"), Some(&turn)).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert!(took < 2 * BUDGET, "the turn took {took:?}");
    assert_eq!(
        out["diagnostics"]["crisis_classifier_path"],
        "keyword_fallback"
    );
    assert_eq!(out["diagnostics"]["reply_source"], "fallback");
    assert_eq!(out["diagnostics"]["memory_extraction"], "llm_failed");
}

#[tokio::test]
async fn a_request_that_needs_the_model_gets_a_problem_within_its_budget() {
    let s = server().await;
    let turn = json!({"message": "I want to end my life", "user_id": "u1", "session_id": "s1"});
    let (status, _, out, _) = timed(&s, Method::POST, &format!("{BASE}/turns"), Some(&turn)).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    // Ending the session asks the model for its summary.
    let (status, ctype, problem, took) = timed(
        &s,
        Method::POST,
        &format!("{BASE}/threads/s1/end"),
        Some(&json!({"user_id": "u1"})),
    )
    .await;
    assert!(took < 2 * BUDGET, "the answer took {took:?}");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{problem}");
    assert_eq!(ctype, "application/problem+json");
    assert_eq!(problem["type"], "urn:parlance:problem:unavailable");
}

/// The crisis gate of one thread's turns answers slowly, so two turns sent
/// together both plan on the same version and one of them commits second
/// and is planned again.
struct SlowGate(OfflineLlm);

#[async_trait]
impl LlmClient for SlowGate {
    fn describe(&self) -> String {
        "slow gate".to_owned()
    }

    fn default_model(&self) -> &str {
        self.0.default_model()
    }

    async fn complete(&self, request: &CompletionRequest) -> LlmResult<CompletionResponse> {
        if request.prompt_name.as_deref() == Some("crisis_gate") {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        self.0.complete(request).await
    }
}

async fn racing_turns_log_once_each(mut c: Components) {
    c.llm = Arc::new(SlowGate(OfflineLlm::new()));
    c.agent_data = AgentData::examples().unwrap();
    let s = TestServer::start(c.build(), Arc::new(ManualClock::new())).await;
    let turn = |m: &str| json!({"message": m, "user_id": "u1", "session_id": "s1"});
    let (a, b) = (
        turn("I want to end my life"),
        turn("I feel like I want to die"),
    );
    let path = format!("{BASE}/turns");
    let ((sa, _, oa), (sb, _, ob)) = tokio::join!(
        s.send(Method::POST, &path, Some(&a), true),
        s.send(Method::POST, &path, Some(&b), true),
    );
    assert_eq!((sa, sb), (StatusCode::OK, StatusCode::OK), "{oa} {ob}");
    let (_, _, thread) = s
        .send(
            Method::GET,
            &format!("{BASE}/threads/s1?user_id=u1"),
            None,
            true,
        )
        .await;
    assert_eq!(thread["version"], 2);
    let (_, _, log) = s
        .send(Method::GET, &format!("{BASE}/crisis-log/u1"), None, true)
        .await;
    let records = log["records"].as_array().unwrap();
    let mut turns: Vec<u64> = records
        .iter()
        .map(|r| r["turn"].as_u64().unwrap())
        .collect();
    turns.sort_unstable();
    assert_eq!(turns, [1, 2], "one entry per committed turn: {log}");
}

#[tokio::test]
async fn racing_turns_log_once_each_on_memory() {
    racing_turns_log_once_each(Components::memory(keys())).await;
}

#[tokio::test]
async fn racing_turns_log_once_each_on_postgres() {
    let Some(pool) = test_pool().await else {
        return;
    };
    racing_turns_log_once_each(Components::postgres(pool, keys())).await;
}
