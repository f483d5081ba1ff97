//! Many clients on one record: 64 clients send events to one session,
//! replies to one conversation and events to one flow session at once, each
//! on its own connection, to a service in this process and to a `parlance
//! serve` process on PostgreSQL. None is refused for contention (503): they
//! queue. Every acknowledged write is counted exactly once: acknowledged
//! session events took distinct versions and the final version is their
//! number; every acknowledged reply is in the transcript once; every flow
//! event is counted by the flow's model once.
//!
//! `PARLANCE_CONCURRENCY_EVENTS` sets the events per client (default 8; the
//! long run by hand uses 500).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use parlance_app::Components;
use parlance_app::flow::{FlowCatalog, Invokers};
use parlance_postgres::PgPool;
use parlance_postgres::testing::test_pool;
use parlance_testkit::ManualClock;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::load::{Proc, free_port};
use crate::support::{KEY, TestServer, keys, url_for, wait_until};

const CLIENTS: usize = 64;

fn per_client() -> usize {
    std::env::var("PARLANCE_CONCURRENCY_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8)
}

/// A running service: its address, a key and the key's product.
#[derive(Clone)]
struct Service {
    root: String,
    key: String,
    product: String,
}

impl Service {
    /// Sends `body` to `path` once on `client` and returns the acknowledged
    /// answer. Commands on one record queue behind each other, so none is
    /// refused for having lost races (503).
    async fn post(&self, client: &reqwest::Client, path: &str, body: &Value) -> Value {
        let url = format!("{}{path}", self.root);
        let res = client
            .request(Method::POST, &url)
            .bearer_auth(&self.key)
            .json(body)
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .expect("an answer");
        match res.status() {
            StatusCode::OK | StatusCode::CREATED => res.json().await.unwrap(),
            other => panic!("{url}: {other} {}", res.text().await.unwrap_or_default()),
        }
    }

    async fn get(&self, path: &str) -> Value {
        let res = reqwest::Client::new()
            .get(format!("{}{path}", self.root))
            .bearer_auth(&self.key)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{path}");
        res.json().await.unwrap()
    }

    /// Runs `body(client, i)` for every event of every client, each client
    /// on its own connection, all at once.
    async fn many<F, Fut>(&self, body: F)
    where
        F: Fn(Service, reqwest::Client, usize, usize) -> Fut + Clone + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        let n = per_client();
        let mut tasks = Vec::new();
        for c in 0..CLIENTS {
            let (service, body) = (self.clone(), body.clone());
            tasks.push(tokio::spawn(async move {
                let client = reqwest::Client::new();
                for e in 0..n {
                    body(service.clone(), client.clone(), c, e).await;
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    }
}

async fn session_counters_are_exact(s: &Service) {
    let n = per_client();
    let path = format!("/products/{}/sessions/hot", s.product);
    let first = s
        .post(
            &reqwest::Client::new(),
            &format!("{path}/events"),
            &json!({"type": "open_chat"}),
        )
        .await;
    let start_version = first["version"].as_i64().unwrap();
    let acked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = acked.clone();
    let events = format!("{path}/events");
    s.many(move |s, client, _, _| {
        let (sink, events) = (sink.clone(), events.clone());
        async move {
            let v = s
                .post(&client, &events, &json!({"type": "user_message"}))
                .await;
            sink.lock().unwrap().push(v["version"].as_i64().unwrap());
        }
    })
    .await;
    let acked = acked.lock().unwrap().clone();
    let distinct: BTreeSet<i64> = acked.iter().copied().collect();
    assert_eq!(acked.len(), CLIENTS * n);
    assert_eq!(
        distinct.len(),
        acked.len(),
        "two acknowledged events share a version"
    );
    let now = s.get(&path).await;
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

async fn conversation_counters_are_exact(s: &Service) {
    let n = per_client();
    let path = format!("/products/{}/conversations", s.product);
    let created = s
        .post(
            &reqwest::Client::new(),
            &path,
            &json!({"contact_id": "hot", "objective": "many replies", "todos": []}),
        )
        .await;
    let id = created["conversation"]["instance_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let replies = format!("{path}/{id}/replies");
    s.many(move |s, client, c, e| {
        let replies = replies.clone();
        async move {
            s.post(
                &client,
                &replies,
                &json!({"text": format!("reply {c}/{e}")}),
            )
            .await;
        }
    })
    .await;
    let view = s.get(&format!("{path}/{id}")).await;
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

/// A flow whose one user state takes `say` again and again, counting.
const COUNTER_FLOW: &str = "name: counter
initial: chat
model:
  said: 0
states:
  - id: chat
    kind: user
    template: chat.j2
transitions:
  - event: say
    from: chat
    to: chat
    assign:
      said: said + 1
";

/// A flows directory holding the counter flow.
fn counter_flows_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("parlance-counter-flow-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("counter/templates")).unwrap();
    std::fs::write(dir.join("counter/flow.yaml"), COUNTER_FLOW).unwrap();
    std::fs::write(dir.join("counter/templates/chat.j2"), "said {{ said }}").unwrap();
    dir
}

async fn flow_counters_are_exact(s: &Service) {
    let n = per_client();
    let started = s
        .post(
            &reqwest::Client::new(),
            "/ai/counter/start_session",
            &json!({}),
        )
        .await;
    let sid = started["session_id"].as_str().unwrap().to_owned();
    let id = sid.clone();
    s.many(move |s, client, c, e| {
        let sid = id.clone();
        async move {
            let event =
                json!({"session_id": sid, "event": "say", "event_input": format!("{c}/{e}")});
            s.post(&client, "/ai/counter/event", &event).await;
        }
    })
    .await;
    let body = s.get(&format!("/ai/counter/model/{sid}")).await;
    let model: Value = serde_json::from_str(body["response"].as_str().unwrap()).unwrap();
    assert_eq!(
        model["model"]["said"].as_u64().unwrap(),
        (CLIENTS * n) as u64,
        "every acknowledged event counted once"
    );
}

/// A service in this process, on PostgreSQL when `pool` is given; the test
/// server is kept running by the returned handle.
async fn in_process(pool: Option<PgPool>) -> (Service, TestServer) {
    let mut c = match pool {
        Some(pool) => Components::postgres(pool, keys()),
        None => Components::memory(keys()),
    };
    c.flows = FlowCatalog::load_dir(&counter_flows_dir(), &Invokers::is_builtin).unwrap();
    let server = TestServer::start(c.build(), Arc::new(ManualClock::new())).await;
    let service = Service {
        root: format!("http://{}/v1", server.addr),
        key: KEY.to_owned(),
        product: "acme".to_owned(),
    };
    (service, server)
}

async fn all_three(s: &Service) {
    session_counters_are_exact(s).await;
    conversation_counters_are_exact(s).await;
    flow_counters_are_exact(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_record_many_clients_on_memory() {
    let (service, _server) = in_process(None).await;
    all_three(&service).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_record_many_clients_on_postgres() {
    let Some(pool) = test_pool().await else {
        return;
    };
    let (service, _server) = in_process(Some(pool)).await;
    all_three(&service).await;
}

fn serve(url: &str, port: u16, flows: &Path) -> Proc {
    Proc::from(
        Command::new(env!("CARGO_BIN_EXE_parlance"))
            .args(["serve", "--no-worker", "--bind"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--flows")
            .arg(flows)
            .env("DATABASE_URL", url)
            .env("PARLANCE_API_KEY", KEY)
            .env("RUST_LOG", "warn")
            .env_remove("PARLANCE_LLM_BASE_URL")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start parlance serve"),
    )
}

/// The service as operators start it: a `parlance serve` process on
/// PostgreSQL, where racing commits meet in the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_record_many_clients_on_a_postgres_serve_process() {
    let Some(pool) = test_pool().await else {
        return;
    };
    let port = free_port();
    let _serve = serve(&url_for(&pool), port, &counter_flows_dir());
    let root = format!("http://127.0.0.1:{port}");
    wait_until(
        "parlance serve to answer",
        Duration::from_secs(30),
        || async { reqwest::get(format!("{root}/healthz")).await.is_ok() },
    )
    .await;
    let service = Service {
        root: format!("{root}/v1"),
        key: KEY.to_owned(),
        product: "default".to_owned(),
    };
    all_three(&service).await;
}
