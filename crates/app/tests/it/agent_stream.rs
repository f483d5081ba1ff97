//! The support agent's turns as server-sent events, a client that leaves
//! mid-turn, and a memory deletion asked by an interrupted turn and
//! answered by a resume, over HTTP on a real listener.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parlance_app::AppState;
use parlance_app::agent::AgentData;
use parlance_memory::OfflineLlm;
use parlance_ports::{CompletionRequest, CompletionResponse, LlmClient, LlmResult};
use parlance_testkit::ManualClock;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::documented::assert_documented;
use crate::support::{KEY, TestServer, wait_until};

const BASE: &str = "/v1/products/acme/agent";

/// The offline model, each answer `delay` late.
struct Slow {
    inner: OfflineLlm,
    delay: Duration,
}

#[async_trait]
impl LlmClient for Slow {
    fn describe(&self) -> String {
        "slow offline".to_owned()
    }

    fn default_model(&self) -> &str {
        self.inner.default_model()
    }

    async fn complete(&self, request: &CompletionRequest) -> LlmResult<CompletionResponse> {
        tokio::time::sleep(self.delay).await;
        self.inner.complete(request).await
    }

    async fn stream(
        &self,
        request: &CompletionRequest,
    ) -> LlmResult<parlance_ports::CompletionStream> {
        tokio::time::sleep(self.delay).await;
        self.inner.stream(request).await
    }
}

async fn server(llm: Arc<dyn LlmClient>) -> TestServer {
    let clock = Arc::new(ManualClock::new());
    let mut c = crate::support::components(&clock);
    c.llm = llm;
    c.agent_data = AgentData::examples().unwrap();
    let state: AppState = c.build();
    TestServer::start(state, clock).await
}

/// A POST of `body` to `path` asking for server-sent events.
fn sse_request(s: &TestServer, path: &str, body: &Value) -> reqwest::RequestBuilder {
    s.client
        .post(format!("http://{}{BASE}{path}", s.addr))
        .bearer_auth(KEY)
        .header("accept", "text/event-stream")
        .json(body)
}

/// The events of a whole server-sent stream: name and JSON data.
fn events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .map(|block| {
            let mut name = String::new();
            let mut data = String::new();
            for line in block.lines() {
                if let Some(n) = line.strip_prefix("event:") {
                    name = n.trim().to_owned();
                } else if let Some(d) = line.strip_prefix("data:") {
                    data.push_str(d.trim_start());
                }
            }
            (name, serde_json::from_str(&data).unwrap_or(Value::Null))
        })
        .collect()
}

async fn post(s: &TestServer, path: &str, body: Value) -> (StatusCode, Value) {
    let path = format!("{BASE}{path}");
    let (status, _, v) = s.send(Method::POST, &path, Some(&body), true).await;
    assert_documented(&Method::POST, &path, status, &v);
    (status, v)
}

async fn thread(s: &TestServer, id: &str) -> Value {
    let path = format!("{BASE}/threads/{id}?user_id=ana");
    let (status, _, v) = s.send(Method::GET, &path, None, true).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_documented(&Method::GET, &path, status, &v);
    v
}

#[tokio::test]
async fn a_streamed_turn_reports_its_stages_in_order_then_tokens_then_its_output() {
    let s = server(Arc::new(OfflineLlm::new())).await;
    let res = sse_request(
        &s,
        "/turns",
        &json!({"message": "Work has been hard lately", "user_id": "ana", "session_id": "s1"}),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(
        res.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let all = events(&res.text().await.unwrap());
    let names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.last(), Some(&"output"), "{names:?}");
    assert_eq!(names.iter().filter(|n| **n == "output").count(), 1);
    assert!(!names.contains(&"error") && !names.contains(&"interrupt"));
    // Stage events pair up, one stage at a time, in the graph's order.
    let stages: Vec<(&str, &str)> = all
        .iter()
        .filter(|(n, _)| n.starts_with("stage_"))
        .map(|(n, d)| (n.as_str(), d["stage"].as_str().unwrap()))
        .collect();
    let order = [
        "turn_memory_context",
        "crisis_gate",
        "turn_dispatch",
        "therapeutic_reply",
        "finalize_turn",
        "memory_extraction",
    ];
    let expected: Vec<(&str, &str)> = order
        .iter()
        .flat_map(|s| [("stage_started", *s), ("stage_finished", *s)])
        .collect();
    assert_eq!(stages, expected);
    assert!(
        all.iter()
            .filter(|(n, _)| n.starts_with("stage_"))
            .all(|(_, d)| d["attempt"] == 1)
    );
    // Tokens arrive while the reply stage runs, and make up its answer.
    let started = names
        .iter()
        .position(|n| *n == "stage_started")
        .and_then(|_| {
            all.iter()
                .position(|(n, d)| n == "stage_started" && d["stage"] == "therapeutic_reply")
        })
        .unwrap();
    let finished = all
        .iter()
        .position(|(n, d)| n == "stage_finished" && d["stage"] == "therapeutic_reply")
        .unwrap();
    let tokens: Vec<&Value> = all
        .iter()
        .filter(|(n, _)| n == "token")
        .map(|(_, d)| d)
        .collect();
    assert!(tokens.len() >= 2, "{names:?}");
    assert!(
        all.iter()
            .enumerate()
            .filter(|(_, (n, _))| n == "token")
            .all(|(i, _)| started < i && i < finished)
    );
    let streamed: String = tokens.iter().map(|t| t["text"].as_str().unwrap()).collect();
    let output = &all.last().unwrap().1;
    let reply = output["response_text"].as_str().unwrap();
    assert!(streamed.contains(reply), "{streamed} / {reply}");
    assert_eq!(output["response_type"], "reply");
    let t = thread(&s, "s1").await;
    assert_eq!(t["version"], 1);
    assert_eq!(t["transcript"][1]["content"], json!(reply));

    // Without the header, the same route answers JSON.
    let (status, v) = post(
        &s,
        "/turns",
        json!({"message": "Thanks", "user_id": "ana", "session_id": "s1"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(v["response_text"].is_string());
}

#[tokio::test]
async fn a_client_that_leaves_mid_turn_still_gets_the_whole_turn_committed() {
    let s = server(Arc::new(Slow {
        inner: OfflineLlm::new(),
        delay: Duration::from_millis(150),
    }))
    .await;
    let mut res = sse_request(
        &s,
        "/turns",
        &json!({"message": "Work has been hard lately", "user_id": "ana", "session_id": "gone"}),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let first = res.chunk().await.unwrap().expect("a first event");
    assert!(
        String::from_utf8_lossy(&first).contains("stage_started"),
        "{first:?}"
    );
    drop(res);
    // The turn is not done yet: the model takes its time on each call.
    let path = format!("{BASE}/threads/gone?user_id=ana");
    let (status, _, _) = s.send(Method::GET, &path, None, true).await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "committed before the client left"
    );
    wait_until("the turn's commit", Duration::from_secs(10), || async {
        s.send(Method::GET, &path, None, true).await.0 == StatusCode::OK
    })
    .await;
    let t = thread(&s, "gone").await;
    assert_eq!(t["version"], 1);
    let transcript = t["transcript"].as_array().unwrap();
    assert_eq!(transcript.len(), 2, "{t}");
    assert_eq!(transcript[0]["role"], "user");
    assert_eq!(transcript[1]["role"], "assistant");
}

#[tokio::test]
async fn a_deletion_waits_for_its_answer_and_one_of_two_racing_answers_wins() {
    let s = server(Arc::new(OfflineLlm::new())).await;
    let entry = json!({"entry": {"type": "semantic", "category": "work", "subject": "User",
        "predicate": "WORRIES_ABOUT", "object": "boss", "evidence_quote": "my boss is terrible"}});
    let (status, _) = post(&s, "/memory/ana", entry.clone()).await;
    assert_eq!(status, StatusCode::CREATED);
    let forget = json!({"message": "forget what I said about my boss", "user_id": "ana", "session_id": "s1"});
    let (status, out) = post(&s, "/turns", forget.clone()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(out["response_type"], "memory_control");
    assert_eq!(out["interrupt"]["question"], out["response_text"]);
    assert_eq!(out["interrupt"]["ids"].as_array().unwrap().len(), 1);

    // The thread shows the question, never the runtime's own key.
    let t = thread(&s, "s1").await;
    assert_eq!(t["interrupt"], out["interrupt"]);
    assert!(t["state"].get("__interrupt").is_none(), "{t}");

    // While it waits, a turn is refused, streamed or not.
    let (status, problem) = post(
        &s,
        "/turns",
        json!({"message": "yes", "user_id": "ana", "session_id": "s1"}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{problem}");
    assert_eq!(problem["type"], "urn:parlance:problem:not-allowed");
    assert_eq!(problem["reason"], "interrupt_pending");
    let res = sse_request(
        &s,
        "/turns",
        &json!({"message": "yes", "user_id": "ana", "session_id": "s1"}),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT);

    // Two answers at once: exactly one is taken.
    let resume = |value: Value| {
        post(
            &s,
            "/threads/s1/resume",
            json!({"user_id": "ana", "value": value}),
        )
    };
    let ((a, va), (b, vb)) = tokio::join!(resume(json!("yes")), resume(json!("no")));
    let mut statuses = [a.as_u16(), b.as_u16()];
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 409], "{va} {vb}");
    let refused = if a == StatusCode::CONFLICT { &va } else { &vb };
    assert_eq!(refused["reason"], "no_interrupt");
    let t = thread(&s, "s1").await;
    assert_eq!(t["version"], 2);
    assert!(t.get("interrupt").is_none(), "{t}");

    // Streamed: ask again, answer yes, and the entry is gone.
    let (_, added) = post(&s, "/memory/ana", entry).await;
    let (_, out) = post(&s, "/turns", forget).await;
    assert!(out["interrupt"].is_object(), "{out}");
    let res = sse_request(
        &s,
        "/threads/s1/resume",
        &json!({"user_id": "ana", "value": true}),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let all = events(&res.text().await.unwrap());
    let (last, output) = all.last().unwrap();
    assert_eq!(last, "output");
    assert!(
        output["response_text"]
            .as_str()
            .unwrap()
            .starts_with("Done."),
        "{output}"
    );
    let first = &all[0];
    assert_eq!(
        (first.0.as_str(), &first.1["stage"]),
        ("stage_started", &json!("memory_control")),
        "the resumed step runs first"
    );
    let (_, _, left) = s
        .send(Method::GET, &format!("{BASE}/memory/ana"), None, true)
        .await;
    assert!(
        left["entries"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["id"] != added["id"]),
        "{left}"
    );
    // Nothing waits any more.
    let (status, problem) = resume(json!(true)).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(problem["reason"], "no_interrupt");
}
