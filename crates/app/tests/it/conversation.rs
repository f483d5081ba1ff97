//! Conversations over HTTP: a full conversation driven by a manual clock,
//! queueing per contact, operator commands, a human hand-off, and two real
//! worker processes sharing the heartbeats on PostgreSQL; and, through the
//! executor on both stores, commands that lose their race decided again,
//! and a reply or a resume that lands while the turn task that came before
//! it is being recorded still getting its turn.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use parlance_app::conversation::sweep_once;
use parlance_app::execute::{Executor, RecordQueues, ServiceError};
use parlance_app::worker::{TaskError, TaskHandler, Worker, WorkerConfig};
use parlance_app::{AppState, Components};
use parlance_core::ProductId;
use parlance_core::conversation::{
    ContactId, ConversationCommand, ConversationContext, ConversationKey, ConversationState,
    HANDED_BACK, InstanceId, NewInstance, Role, TURN_KIND,
};
use parlance_memory::{LoopbackChannel, OfflineLlm, Reply, When};
use parlance_ports::{Lease, WorkerId};
use parlance_postgres::testing::test_pool;
use parlance_testkit::{ManualClock, SequentialIds};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::documented::assert_documented;
use crate::support::{TestServer, keys, spawn_worker, url_for, wait_until};

const BASE: &str = "/v1/products/acme/conversations";

/// A service on the in-memory adapters with a manual clock, a loopback
/// channel the test can read, and a worker the test steps.
struct Fixture {
    server: TestServer,
    state: AppState,
    channel: Arc<LoopbackChannel>,
    worker: Worker,
}

impl Fixture {
    async fn new(llm: OfflineLlm) -> Self {
        Self::with_model(Some(llm)).await
    }

    /// With the embedded default's model, as `parlance serve` runs it.
    async fn embedded() -> Self {
        Self::with_model(None).await
    }

    async fn with_model(llm: Option<OfflineLlm>) -> Self {
        let clock = Arc::new(ManualClock::new());
        let mut c = Components::memory(keys());
        c.clock = clock.clone();
        c.ids = Arc::new(SequentialIds::new());
        let channel = Arc::new(LoopbackChannel::new());
        c.channel = channel.clone();
        if let Some(llm) = llm {
            c.llm = Arc::new(llm);
        }
        let state = c.build();
        let worker = Worker::new(
            WorkerId(uuid::Uuid::from_u128(u128::MAX)),
            state.shared.queue.clone(),
            state.handlers(),
            state.shared.clock.clone(),
            WorkerConfig::default(),
        );
        Self {
            server: TestServer::start(state.clone(), clock).await,
            state,
            channel,
            worker,
        }
    }

    async fn send(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let (status, _, json) = self.server.send(method, path, body.as_ref(), true).await;
        (status, json)
    }

    /// Runs queued agent work until none is left.
    async fn drain(&self) -> usize {
        let mut ran = 0;
        loop {
            let report = self.worker.step().await.expect("worker step");
            if report.claimed == 0 {
                return ran;
            }
            ran += report.claimed;
        }
    }

    async fn state_of(&self, id: &str) -> (String, Value) {
        let (status, body) = self.send(Method::GET, &format!("{BASE}/{id}"), None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        (
            body["conversation"]["state"].as_str().unwrap().to_owned(),
            body,
        )
    }

    async fn create(&self, contact: &str, extra: Value) -> Value {
        let mut body = json!({"contact_id": contact, "objective": "book a demo call", "todos": ["ask for a day"]});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let (status, created) = self.send(Method::POST, BASE, Some(body)).await;
        assert_eq!(status, StatusCode::CREATED, "{created}");
        created
    }
}

fn id_of(v: &Value) -> String {
    v["conversation"]["instance_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Replaces a value that varies between runs, keeping `null` visible.
fn varying(label: &'static str) -> insta::internals::Redaction {
    insta::dynamic_redaction(
        move |value, _| {
            if value.is_nil() { value } else { label.into() }
        },
    )
}

macro_rules! snapshot {
    ($name:expr, $value:expr) => {
        insta::assert_json_snapshot!($name, $value, {
            ".**.instance_id" => varying("[id]"),
            ".**.entity_id" => varying("[id]"),
            ".**.created_at" => varying("[time]"),
            ".**.updated_at" => varying("[time]"),
            ".**.ended_at" => varying("[time]"),
            ".**.heartbeat_due_at" => varying("[time]"),
            ".**.at" => varying("[time]"),
            ".**.seq" => varying("[seq]"),
        });
    };
}

#[tokio::test]
async fn a_silent_contact_is_followed_up_then_abandoned() {
    let f = Fixture::new(OfflineLlm::new()).await;
    let created = f
        .create(
            "+15550001",
            json!({"heartbeat_interval_s": 60, "max_follow_ups": 2}),
        )
        .await;
    snapshot!("conversation_created", &created);
    let id = id_of(&created);
    assert_eq!(created["conversation"]["state"], "CREATED");

    assert_eq!(f.drain().await, 2, "one agent turn and its delivery");
    let (state, _) = f.state_of(&id).await;
    assert_eq!(state, "WAITING_FOR_REPLY");

    for n in 1..=2 {
        f.server.clock.advance(Duration::from_secs(59));
        assert_eq!(
            sweep_once(&f.state.conversations).await.unwrap(),
            0,
            "not due before the interval"
        );
        f.server.clock.advance(Duration::from_secs(1));
        assert_eq!(
            sweep_once(&f.state.conversations).await.unwrap(),
            1,
            "heartbeat {n} fires"
        );
        assert_eq!(f.state_of(&id).await.0, "HEARTBEAT_SCHEDULED");
        assert_eq!(f.drain().await, 2, "one follow-up and its delivery");
        let (state, body) = f.state_of(&id).await;
        assert_eq!(state, "WAITING_FOR_REPLY");
        assert_eq!(body["conversation"]["follow_ups_sent"], n);
    }
    f.server.clock.advance(Duration::from_secs(60));
    assert_eq!(sweep_once(&f.state.conversations).await.unwrap(), 1);
    assert_eq!(
        sweep_once(&f.state.conversations).await.unwrap(),
        0,
        "a heartbeat fires once"
    );
    let (state, body) = f.state_of(&id).await;
    assert_eq!(state, "ABANDONED");
    assert_eq!(body["conversation"]["end_reason"], "abandoned");
    let transcript = body["transcript"].as_array().unwrap();
    assert_eq!(transcript.len(), 3);
    assert!(transcript.iter().all(|m| m["role"] == "agent"));
    let sent = f.channel.sent();
    assert_eq!(
        sent.iter().map(|m| m.outbound_seq).collect::<Vec<_>>(),
        [1, 2, 3]
    );

    let (status, audit) = f
        .send(Method::GET, &format!("{BASE}/{id}/audit"), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    let steps: Vec<_> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            format!(
                "{} -> {} ({})",
                r["from"].as_str().unwrap_or("-"),
                r["to"].as_str().unwrap(),
                r["cause"].as_str().unwrap()
            )
        })
        .collect();
    insta::assert_debug_snapshot!("conversation_abandoned_audit", steps);
}

#[tokio::test]
async fn one_contact_one_active_conversation_and_operator_commands() {
    let f = Fixture::new(OfflineLlm::new()).await;
    let first = id_of(&f.create("+15550002", json!({})).await);
    let queued = f.create("+15550002", json!({})).await;
    snapshot!("conversation_queued", &queued);
    let second = id_of(&queued);
    f.drain().await;
    assert_eq!(f.state_of(&first).await.0, "WAITING_FOR_REPLY");
    assert_eq!(f.state_of(&second).await.0, "QUEUED");

    let (status, replied) = f
        .send(
            Method::POST,
            &format!("{BASE}/{first}/replies"),
            Some(json!({"text": "which day?"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    snapshot!("conversation_reply", &replied);
    f.drain().await;
    assert_eq!(f.state_of(&first).await.0, "WAITING_FOR_REPLY");

    let (status, paused) = f
        .send(Method::POST, &format!("{BASE}/{first}/pause"), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    snapshot!("conversation_paused", &paused);
    let (status, refused) = f
        .send(Method::POST, &format!("{BASE}/{first}/pause"), None)
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(refused["state"], "PAUSED");
    snapshot!("conversation_invalid_transition", &refused);
    let (status, _) = f
        .send(Method::POST, &format!("{BASE}/{first}/resume"), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(f.state_of(&first).await.0, "WAITING_FOR_REPLY");

    let (status, sent) = f
        .send(
            Method::POST,
            &format!("{BASE}/{first}/send"),
            Some(json!({"text": "Hi, a human here."})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{sent}");
    assert_eq!(f.drain().await, 1, "the delivery");
    assert_eq!(f.channel.sent().last().unwrap().role, Role::Human);

    let (status, cancelled) = f
        .send(Method::POST, &format!("{BASE}/{first}/cancel"), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    snapshot!("conversation_cancelled", &cancelled);
    assert_eq!(cancelled["conversation"]["end_reason"], "cancelled");
    assert_eq!(
        cancelled["promoted"]["instance_id"].as_str(),
        Some(second.as_str())
    );
    assert_eq!(f.state_of(&second).await.0, "CREATED");

    let (status, late) = f
        .send(
            Method::POST,
            "/v1/products/acme/contacts/+15550002/replies",
            Some(json!({"text": "hello?"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        late["conversation"]["instance_id"].as_str(),
        Some(second.as_str()),
        "goes to the holder"
    );

    let (status, list) = f
        .send(
            Method::GET,
            &format!("{BASE}?contact_id=%2B15550002&state=FAILED"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    snapshot!("conversation_list", &list);
    let (status, view) = f.send(Method::GET, &format!("{BASE}/{first}"), None).await;
    assert_eq!(status, StatusCode::OK);
    snapshot!("conversation_view", &view);
    let (status, audit) = f
        .send(Method::GET, &format!("{BASE}/{first}/audit"), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    snapshot!("conversation_audit", &audit);
}

/// Every answer of the conversation routes is the one the API document
/// describes: its members documented, the required ones present, and each
/// command declaring the 409 its state may answer.
#[tokio::test]
async fn every_answer_is_the_one_the_document_describes() {
    let f = Fixture::new(OfflineLlm::new()).await;
    let (status, _, doc) = f
        .server
        .send(Method::GET, "/openapi.json", None, false)
        .await;
    assert_eq!(status, StatusCode::OK);
    let one = "/v1/products/{product_id}/conversations/{id}";
    let check = |method: &str, path: &str, status: u16, body: &Value| {
        let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
        assert_documented(&method, path, StatusCode::from_u16(status).unwrap(), body);
    };

    let created = f
        .create(
            "+15550009",
            json!({"metadata": {"crm": 7}, "todos": [{"text": "confirm", "done": true}]}),
        )
        .await;
    check(
        "post",
        "/v1/products/{product_id}/conversations",
        201,
        &created,
    );
    let first = id_of(&created);
    let second = id_of(&f.create("+15550009", json!({})).await);
    f.drain().await;

    let (_, list) = f.send(Method::GET, BASE, None).await;
    check("get", "/v1/products/{product_id}/conversations", 200, &list);
    let (_, replied) = f
        .send(
            Method::POST,
            &format!("{BASE}/{first}/replies"),
            Some(json!({"text": "which day?"})),
        )
        .await;
    assert!(!replied["transitions"].as_array().unwrap().is_empty());
    check("post", &format!("{one}/replies"), 200, &replied);
    f.drain().await;
    for command in ["pause", "resume"] {
        let (status, body) = f
            .send(Method::POST, &format!("{BASE}/{first}/{command}"), None)
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        check("post", &format!("{one}/{command}"), 200, &body);
    }
    let (_, sent) = f
        .send(
            Method::POST,
            &format!("{BASE}/{first}/send"),
            Some(json!({"text": "Hi, a human here."})),
        )
        .await;
    check("post", &format!("{one}/send"), 200, &sent);
    let (_, cancelled) = f
        .send(Method::POST, &format!("{BASE}/{first}/cancel"), None)
        .await;
    assert_eq!(cancelled["promoted"]["instance_id"], second.as_str());
    check("post", &format!("{one}/cancel"), 200, &cancelled);
    let (_, contact) = f
        .send(
            Method::POST,
            "/v1/products/acme/contacts/+15550009/replies",
            Some(json!({"text": "hello?"})),
        )
        .await;
    check(
        "post",
        "/v1/products/{product_id}/contacts/{contact_id}/replies",
        200,
        &contact,
    );
    f.drain().await;
    let (_, view) = f.send(Method::GET, &format!("{BASE}/{second}"), None).await;
    assert!(!view["transcript"].as_array().unwrap().is_empty());
    check("get", one, 200, &view);
    let (_, audit) = f
        .send(Method::GET, &format!("{BASE}/{first}/audit"), None)
        .await;
    check("get", &format!("{one}/audit"), 200, &audit);

    let created = &doc["paths"]["/v1/products/{product_id}/conversations"]["post"]["responses"];
    assert!(created.get("201").is_some() && created.get("200").is_none());
    for command in ["pause", "resume", "cancel", "send", "replies"] {
        let op = &doc["paths"][format!("{one}/{command}")]["post"];
        assert!(
            op["responses"]["409"].is_object(),
            "{command} declares no 409"
        );
    }
}

#[tokio::test]
async fn bad_requests_are_4xx_and_change_nothing() {
    let f = Fixture::new(OfflineLlm::new()).await;
    let (status, body) = f
        .send(Method::POST, BASE, Some(json!({"contact_id": "x"})))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    snapshot!("conversation_missing_field", &body);
    let (status, _) = f
        .send(
            Method::POST,
            BASE,
            Some(json!({"contact_id": "x", "objective": "  "})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let unknown = InstanceId::from_uuid(uuid::Uuid::from_u128(42));
    let (status, body) = f
        .send(Method::GET, &format!("{BASE}/{unknown}"), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    snapshot!("conversation_not_found", &body);
    let (status, _) = f
        .send(Method::POST, &format!("{BASE}/not-a-uuid/pause"), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let id = id_of(&f.create("+15550003", json!({})).await);
    let (status, _) = f
        .send(
            Method::GET,
            &format!("/v1/products/other/conversations/{id}"),
            None,
        )
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "another product's path is not found"
    );
    let (status, _) = f
        .send(
            Method::POST,
            &format!("{BASE}/{id}/replies"),
            Some(json!({"text": ""})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, list) = f.send(Method::GET, BASE, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        list["items"].as_array().unwrap().len(),
        1,
        "only the valid create stored anything"
    );
}

#[tokio::test]
async fn the_agent_hands_off_to_a_human_and_completes() {
    // Rules are tried in order: the last contact message decides, except
    // that once the operator has refunded, the agent moves on.
    let llm = OfflineLlm::new()
        .with_rule(
            When::UserContains("tuesday".into()),
            Reply::tool_call(
                "end_conversation",
                json!({"outcome": "demo booked for Tuesday"}),
            ),
        )
        .with_rule(
            When::Contains("refund done".into()),
            Reply::tool_call(
                "send_message",
                json!({"text": "Glad that is sorted. Which day suits you?"}),
            ),
        )
        .with_rule(
            When::UserContains("refund".into()),
            Reply::tool_call("request_human", json!({"reason": "asks for a refund"})),
        );
    let f = Fixture::new(llm).await;
    let id = id_of(&f.create("+15550004", json!({})).await);
    f.drain().await;
    f.send(
        Method::POST,
        &format!("{BASE}/{id}/replies"),
        Some(json!({"text": "I want a refund first"})),
    )
    .await;
    f.drain().await;
    let (state, body) = f.state_of(&id).await;
    assert_eq!(state, "NEEDS_HUMAN_INTERVENTION");
    assert_eq!(body["conversation"]["human_reason"], "asks for a refund");
    let (status, _) = f
        .send(
            Method::POST,
            &format!("{BASE}/{id}/send"),
            Some(json!({"text": "Refund done."})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    f.drain().await;
    assert_eq!(
        f.state_of(&id).await.0,
        "WAITING_FOR_REPLY",
        "the agent went on after the operator"
    );
    f.send(
        Method::POST,
        &format!("{BASE}/{id}/replies"),
        Some(json!({"text": "Tuesday works"})),
    )
    .await;
    f.drain().await;
    let (state, body) = f.state_of(&id).await;
    assert_eq!(state, "COMPLETED");
    assert_eq!(body["conversation"]["outcome"], "demo booked for Tuesday");
    let roles: Vec<_> = body["transcript"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(roles, ["agent", "contact", "human", "agent", "contact"]);
}

/// The embedded default's offline model hands a conversation to a person
/// when the contact's newest message asks for one, and the turn after an
/// operator hands it back goes on with a message, whether the operator
/// answered first or only resumed the agent.
#[tokio::test]
async fn the_default_model_hands_over_when_the_contact_asks_for_a_person() {
    let f = Fixture::embedded().await;
    let id = id_of(&f.create("+15550011", json!({})).await);
    f.drain().await;
    assert_eq!(f.state_of(&id).await.0, "WAITING_FOR_REPLY");
    let reply = |text: &'static str| {
        let f = &f;
        let id = id.clone();
        async move {
            let (status, body) = f
                .send(
                    Method::POST,
                    &format!("{BASE}/{id}/replies"),
                    Some(json!({ "text": text })),
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{body}");
            f.drain().await;
            f.state_of(&id).await
        }
    };

    let (state, _) = reply("Tuesday could work, what times?").await;
    assert_eq!(state, "WAITING_FOR_REPLY", "other messages get an answer");
    let (state, body) = reply("Can I talk to a real Person, please?").await;
    assert_eq!(state, "NEEDS_HUMAN_INTERVENTION");
    assert_eq!(
        body["conversation"]["human_reason"],
        "the contact asked for a person"
    );

    // The operator answers: the hand-back turn sends a message.
    let (status, sent) = f
        .send(
            Method::POST,
            &format!("{BASE}/{id}/send"),
            Some(json!({"text": "Sam here, from the team. How can I help?"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{sent}");
    assert_eq!(sent["conversation"]["state"], "ACTIVE");
    f.drain().await;
    let (state, body) = f.state_of(&id).await;
    assert_eq!(
        state, "WAITING_FOR_REPLY",
        "the agent goes on after the person"
    );
    let last = body["transcript"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["role"], "agent", "{body}");

    // Asked again, then only resumed: the agent goes on, it does not hand
    // the conversation straight back.
    let (state, _) = reply("I still want a HUMAN").await;
    assert_eq!(state, "NEEDS_HUMAN_INTERVENTION");
    let (status, resumed) = f
        .send(Method::POST, &format!("{BASE}/{id}/resume"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{resumed}");
    assert_eq!(resumed["conversation"]["state"], "ACTIVE");
    f.drain().await;
    let (state, body) = f.state_of(&id).await;
    assert_eq!(state, "WAITING_FOR_REPLY", "{body}");
    let roles: Vec<_> = body["transcript"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        roles,
        [
            "agent", "contact", "agent", "contact", "human", "agent", "contact", "agent"
        ]
    );

    // A later request is a fresh turn: it may hand over again.
    let (state, _) = reply("a person, please").await;
    assert_eq!(state, "NEEDS_HUMAN_INTERVENTION");
}

#[tokio::test]
async fn an_agent_out_of_retries_fails_the_conversation() {
    let llm = OfflineLlm::new().with_rule(
        When::Any,
        Reply::Error(parlance_ports::LlmError::from_status(503, None, "down")),
    );
    let f = Fixture::new(llm).await;
    let id = id_of(&f.create("+15550005", json!({})).await);
    for _ in 0..10 {
        f.drain().await;
        f.server.clock.advance(Duration::from_secs(3600));
    }
    let (state, body) = f.state_of(&id).await;
    assert_eq!(state, "FAILED");
    assert!(
        body["conversation"]["end_reason"]
            .as_str()
            .unwrap()
            .contains("model call failed"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_worker_processes_share_the_heartbeats_on_postgres() {
    let Some(pool) = test_pool().await else {
        return;
    };
    let url = url_for(&pool);
    let state = AppState::postgres(pool, keys());
    let product = ProductId::parse("acme").unwrap();
    let mut ids = Vec::new();
    for n in 0..4 {
        ids.push(created(&state, 1000 + n, &format!("+1555100{n}"), 1).await);
    }
    let mut workers = [spawn_worker(&url, &[]), spawn_worker(&url, &[])];
    let store = state.conversations.store.clone();
    let all_abandoned = || {
        let store = store.clone();
        let ids = ids.clone();
        async move {
            for key in ids {
                let i = store.load(&key).await.unwrap().unwrap().state;
                if i.state != ConversationState::Abandoned {
                    return false;
                }
            }
            true
        }
    };
    wait_until(
        "every conversation to be abandoned",
        Duration::from_secs(60),
        all_abandoned,
    )
    .await;
    for w in &mut workers {
        w.kill().unwrap();
        w.wait().unwrap();
    }
    for key in ids {
        let id = key.instance_id;
        let transcript = state.conversations.index.transcript(&key).await.unwrap();
        let seqs: Vec<_> = transcript.iter().map(|m| m.outbound_seq).collect();
        assert_eq!(
            seqs,
            [Some(1), Some(2), Some(3)],
            "first message and two follow-ups, once each"
        );
        let audit = state
            .shared
            .audit
            .list(
                &product,
                parlance_core::EntityKind::Conversation,
                &id.to_string(),
                None,
                100,
            )
            .await
            .unwrap();
        let fired = audit
            .iter()
            .filter(|r| r.entry.cause == "timer_fired" && r.entry.to == "HEARTBEAT_SCHEDULED")
            .count();
        assert_eq!(fired, 3, "each armed heartbeat fired exactly once");
    }
}

/// A conversation of product `acme` booking a demo call with `contact`,
/// instance `n`, heartbeats every `heartbeat_s` seconds, created on `state`
/// through the service.
async fn created(state: &AppState, n: u128, contact: &str, heartbeat_s: u64) -> ConversationKey {
    let new = NewInstance {
        product_id: ProductId::parse("acme").unwrap(),
        instance_id: InstanceId::from_uuid(uuid::Uuid::from_u128(n)),
        contact_id: ContactId::parse(contact).unwrap(),
        channel: "loopback".into(),
        objective: "book a demo call".into(),
        todos: vec![],
        heartbeat_interval_s: heartbeat_s,
        max_follow_ups: 2,
        metadata: serde_json::Map::new(),
    };
    parlance_app::conversation::create(&state.conversations, new)
        .await
        .unwrap()
        .state
        .key()
}

/// An instance waiting for a reply on `state`, created through the service.
async fn waiting_instance(state: &AppState, n: u128) -> ConversationKey {
    let key = created(state, n, &format!("+1555200{n}"), 100).await;
    for command in [
        ConversationCommand::BeginAgentTurn,
        ConversationCommand::AgentSend {
            text: "hello".into(),
            next_heartbeat_s: None,
        },
    ] {
        parlance_app::conversation::run(&state.conversations, &key, command)
            .await
            .unwrap();
    }
    key
}

/// Two replies decided on the same read, by executors that do not queue
/// behind each other (as in two processes): one commit lands, the other
/// finds the instance moved, writes nothing, and is decided again by the
/// executor on the version that won; both replies are kept, in one version
/// each.
async fn a_command_decided_on_a_stale_read_is_decided_again(state: AppState) {
    let key = waiting_instance(&state, 1).await;
    let start = state.conversations.store.load(&key).await.unwrap().unwrap();
    // The first two decisions wait for each other, so both are made on the
    // same version; later ones run straight through.
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let decisions = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut writers = Vec::new();
    for w in 0..2 {
        let (state, key) = (state.clone(), key.clone());
        let (barrier, decisions, seen) = (barrier.clone(), decisions.clone(), seen.clone());
        writers.push(tokio::spawn(async move {
            let own = RecordQueues::default();
            let mut executor = Executor::new(
                state.conversations.store.as_ref(),
                state.shared.clock.as_ref(),
            );
            executor.queues = &own;
            let ctx = ConversationContext::default();
            executor
                .run_with(&key, &ctx, |loaded| {
                    seen.lock().unwrap().push(loaded.map(|s| s.version));
                    let first_two = decisions.fetch_add(1, Ordering::SeqCst) < 2;
                    let barrier = barrier.clone();
                    async move {
                        if first_two {
                            barrier.wait().await;
                        }
                        Ok(Some(ConversationCommand::ContactReply {
                            text: format!("w{w}"),
                        }))
                    }
                })
                .await
                .unwrap()
        }));
    }
    let mut attempts = Vec::new();
    for w in writers {
        attempts.push(w.await.unwrap().attempts);
    }
    attempts.sort_unstable();
    assert_eq!(attempts, [1, 2], "one decision repeated");
    assert_eq!(decisions.load(Ordering::SeqCst), 3);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        &seen[..2],
        [Some(start.version), Some(start.version)],
        "a shared read"
    );
    assert_eq!(
        seen[2],
        Some(start.version.next()),
        "decided again on the write that landed"
    );
    let end = state.conversations.store.load(&key).await.unwrap().unwrap();
    assert_eq!(end.version, start.version.next().next());
    let transcript = state.conversations.index.transcript(&key).await.unwrap();
    let mut replies: Vec<_> = transcript
        .iter()
        .filter(|m| m.role == Role::Contact)
        .map(|m| m.text.clone())
        .collect();
    replies.sort();
    assert_eq!(replies, ["w0", "w1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_read_is_decided_again_on_memory() {
    a_command_decided_on_a_stale_read_is_decided_again(AppState::memory(keys())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_read_is_decided_again_on_postgres() {
    if let Some(pool) = test_pool().await {
        a_command_decided_on_a_stale_read_is_decided_again(AppState::postgres(pool, keys())).await;
    }
}

/// Sixteen writers sending ten replies each to one instance at once: every
/// reply is kept, each writer's in order, and every reply took one version.
/// A reply that lost every race changed nothing and is sent again, as a
/// client answered 503 would.
async fn concurrent_replies_are_all_kept(state: AppState) {
    let key = waiting_instance(&state, 2).await;
    let start = state.conversations.store.load(&key).await.unwrap().unwrap();
    let mut writers = Vec::new();
    for w in 0..16 {
        let (state, key) = (state.clone(), key.clone());
        writers.push(tokio::spawn(async move {
            for k in 0..10 {
                let reply = ConversationCommand::ContactReply {
                    text: format!("w{w} r{k}"),
                };
                let mut sends = 0;
                loop {
                    sends += 1;
                    match parlance_app::conversation::run(&state.conversations, &key, reply.clone())
                        .await
                    {
                        Ok(_) => break,
                        Err(ServiceError::Contended { .. }) if sends < 100 => {}
                        Err(e) => panic!("w{w} r{k}: {e}"),
                    }
                }
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    let end = state.conversations.store.load(&key).await.unwrap().unwrap();
    assert_eq!(end.version.0, start.version.0 + 160);
    let transcript = state.conversations.index.transcript(&key).await.unwrap();
    let replies = transcript
        .iter()
        .filter(|m| m.role == Role::Contact)
        .count();
    assert_eq!(replies, 160);
    for w in 0..16 {
        let mine: Vec<_> = transcript
            .iter()
            .filter(|m| m.text.starts_with(&format!("w{w} ")))
            .map(|m| m.text.clone())
            .collect();
        let expected: Vec<_> = (0..10).map(|k| format!("w{w} r{k}")).collect();
        assert_eq!(mine, expected);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_replies_are_all_kept_on_memory() {
    concurrent_replies_are_all_kept(AppState::memory(keys())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_replies_are_all_kept_on_postgres() {
    if let Some(pool) = test_pool().await {
        concurrent_replies_are_all_kept(AppState::postgres(pool, keys())).await;
    }
}

/// The agent's turn handler, followed (once armed) by a command on the
/// conversation after the turn's action has committed and before the
/// worker records the turn task completed: a contact's reply or an
/// operator's command arriving in that window. It keeps the payload of
/// every turn it ran.
struct CommandBeforeRecorded {
    inner: Arc<dyn TaskHandler>,
    state: AppState,
    key: ConversationKey,
    armed: Mutex<Option<ConversationCommand>>,
    payloads: Mutex<Vec<Value>>,
}

#[async_trait::async_trait]
impl TaskHandler for CommandBeforeRecorded {
    async fn run(&self, task: &Lease) -> Result<Value, TaskError> {
        self.payloads.lock().unwrap().push(task.payload.clone());
        let done = self.inner.run(task).await;
        let armed = self.armed.lock().unwrap().take();
        if let Some(command) = armed {
            parlance_app::conversation::run(&self.state.conversations, &self.key, command)
                .await
                .expect("the command lands while the turn task runs");
        }
        done
    }
}

/// A conversation on `state`, its turn handler wrapped in
/// [`CommandBeforeRecorded`], and a worker the test steps.
async fn turn_window(state: &AppState, n: u128) -> (Arc<CommandBeforeRecorded>, Worker) {
    let key = created(state, n, &format!("+1555300{n}"), 3600).await;
    let mut handlers = state.handlers();
    let turn = Arc::new(CommandBeforeRecorded {
        inner: handlers.get(TURN_KIND).expect("a turn handler").clone(),
        state: state.clone(),
        key,
        armed: Mutex::new(None),
        payloads: Mutex::new(Vec::new()),
    });
    handlers.register(TURN_KIND, turn.clone());
    let worker = Worker::new(
        WorkerId(uuid::Uuid::from_u128(u128::MAX - n)),
        state.shared.queue.clone(),
        handlers,
        state.shared.clock.clone(),
        WorkerConfig::default(),
    );
    (turn, worker)
}

/// Steps `worker` until it finds nothing to run.
async fn drain(worker: &Worker) {
    for _ in 0..100 {
        if worker.step().await.expect("worker step").claimed == 0 {
            return;
        }
    }
    panic!("the queue never drained");
}

/// The state and the transcript's roles of `turn`'s conversation.
async fn where_it_stands(
    state: &AppState,
    turn: &CommandBeforeRecorded,
) -> (ConversationState, Vec<Role>) {
    let instance = state
        .conversations
        .store
        .load(&turn.key)
        .await
        .unwrap()
        .unwrap()
        .state;
    let transcript = state
        .conversations
        .index
        .transcript(&turn.key)
        .await
        .unwrap();
    (instance.state, transcript.iter().map(|m| m.role).collect())
}

/// A contact's reply that lands after the agent's message is committed but
/// before its turn task is recorded completed asks for a turn while that
/// task still runs: the turn comes once the task completes (it was lost,
/// and the conversation waited for the agent for good).
async fn a_reply_while_the_turn_task_completes_gets_a_turn(state: AppState) {
    let (turn, worker) = turn_window(&state, 1).await;
    *turn.armed.lock().unwrap() = Some(ConversationCommand::ContactReply {
        text: "Tuesday works".into(),
    });
    drain(&worker).await;
    assert!(turn.armed.lock().unwrap().is_none(), "the reply landed");
    assert_eq!(
        where_it_stands(&state, &turn).await,
        (
            ConversationState::WaitingForReply,
            vec![Role::Agent, Role::Contact, Role::Agent]
        ),
        "the agent answered the reply"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_while_the_turn_task_completes_gets_a_turn_on_memory() {
    a_reply_while_the_turn_task_completes_gets_a_turn(AppState::memory(keys())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_while_the_turn_task_completes_gets_a_turn_on_postgres() {
    if let Some(pool) = test_pool().await {
        a_reply_while_the_turn_task_completes_gets_a_turn(AppState::postgres(pool, keys())).await;
    }
}

/// An operator's `resume` that lands after the agent's hand-off is
/// committed but before its turn task is recorded completed: the turn it
/// asks for comes once the task completes, marked as handed back.
async fn a_resume_while_the_hand_off_completes_gets_a_handed_back_turn(state: AppState) {
    let (turn, worker) = turn_window(&state, 2).await;
    drain(&worker).await;
    parlance_app::conversation::run(
        &state.conversations,
        &turn.key,
        ConversationCommand::ContactReply {
            text: "Can I talk to a person?".into(),
        },
    )
    .await
    .unwrap();
    *turn.armed.lock().unwrap() = Some(ConversationCommand::Resume);
    drain(&worker).await;
    assert!(turn.armed.lock().unwrap().is_none(), "the resume landed");
    assert_eq!(
        where_it_stands(&state, &turn).await,
        (
            ConversationState::WaitingForReply,
            vec![Role::Agent, Role::Contact, Role::Agent]
        ),
        "the agent went on after the resume"
    );
    let payloads = turn.payloads.lock().unwrap().clone();
    assert_eq!(payloads.len(), 3, "{payloads:?}");
    assert_eq!(payloads[2][HANDED_BACK], json!(true), "{payloads:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_while_the_hand_off_completes_gets_a_handed_back_turn_on_memory() {
    a_resume_while_the_hand_off_completes_gets_a_handed_back_turn(AppState::memory(keys())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_while_the_hand_off_completes_gets_a_handed_back_turn_on_postgres() {
    if let Some(pool) = test_pool().await {
        a_resume_while_the_hand_off_completes_gets_a_handed_back_turn(AppState::postgres(
            pool,
            keys(),
        ))
        .await;
    }
}

/// Runs `parlance conversation ARGS` against `server` and returns the JSON
/// it prints.
async fn parlance_conversation(server: &TestServer, args: &[&str]) -> Value {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_parlance"));
    command
        .arg("conversation")
        .args(["--server", &format!("http://{}", server.addr)])
        .args(["--api-key", crate::support::KEY, "--product", "acme"])
        .args(args)
        .env("RUST_LOG", "warn");
    let out = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .expect("run parlance conversation");
    assert!(
        out.status.success(),
        "parlance conversation {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the command prints JSON")
}

/// The operator's command line against a running server: a contact id with
/// characters that mean something in a URL reaches the server intact in the
/// query, a conversation id in the path, and `--heartbeat` takes humantime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_sends_ids_intact() {
    let server = TestServer::memory().await;
    // `&state=...` would filter the list if the query were not encoded.
    let contact = "+56 9/x?y#z&state=CANCELLED%20é";
    let create = |contact: &'static str| {
        let server = &server;
        async move {
            parlance_conversation(
                server,
                &[
                    "create",
                    "--contact",
                    contact,
                    "--objective",
                    "book a demo",
                    "--heartbeat",
                    "1h 30m",
                ],
            )
            .await
        }
    };
    let created = create(contact).await;
    assert_eq!(created["conversation"]["contact_id"], contact);
    assert_eq!(created["conversation"]["heartbeat_interval_s"], 5400);
    create("+56 9").await;

    let listed = parlance_conversation(&server, &["list", "--contact", contact]).await;
    let items = listed["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{listed}");
    assert_eq!(items[0]["contact_id"], contact);

    let id = created["conversation"]["instance_id"].as_str().unwrap();
    let got = parlance_conversation(&server, &["get", id]).await;
    assert_eq!(got["conversation"]["instance_id"], id);
    assert_eq!(got["conversation"]["contact_id"], contact);
}
