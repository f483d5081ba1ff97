//! Faults: two `parlance serve` and two `parlance worker` processes on one
//! PostgreSQL database, loaded with session events and conversation
//! replies; one server and one worker are killed (SIGKILL) mid-load and
//! restarted. Afterwards nothing acknowledged is lost or doubled:
//!
//! - per session, acknowledged events took distinct versions, and the final
//!   version counts every acknowledged event plus at most the requests
//!   whose answer was lost with the killed server;
//! - every acknowledged reply is in its transcript exactly once (an
//!   unanswered one at most once);
//! - every agent turn queued by a reply ran to completion (the killed
//!   worker's tasks were taken over) and no outbound message was delivered
//!   twice.
//!
//! `PARLANCE_FAULT_SECS` sets the length of each load phase (default 2).

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use parlance_postgres::testing::test_pool;
use serde_json::{Value, json};
use sqlx::Row as _;

use crate::support::{url_for, wait_until};

const KEY: &str = "pk_fault_default";
const SESSIONS: usize = 8;
const CONVERSATIONS: usize = 4;
const CLIENTS: usize = 16;

fn phase() -> Duration {
    Duration::from_secs(
        std::env::var("PARLANCE_FAULT_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2),
    )
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn spawn_server(url: &str, port: u16) -> Child {
    Command::new(env!("CARGO_BIN_EXE_parlance"))
        .args([
            "serve",
            "--no-worker",
            "--bind",
            &format!("127.0.0.1:{port}"),
        ])
        .env("DATABASE_URL", url)
        .env("PARLANCE_API_KEY", KEY)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start parlance serve")
}

fn spawn_worker(url: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_parlance"))
        .args([
            "worker",
            "--heartbeat-ms",
            "200",
            "--sweep-ms",
            "250",
            "--stale-after-secs",
            "2",
        ])
        .env("DATABASE_URL", url)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start parlance worker")
}

async fn ready(client: &reqwest::Client, port: u16) {
    wait_until(
        "the server to be ready",
        Duration::from_secs(60),
        || async {
            client
                .get(format!("http://127.0.0.1:{port}/readyz"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        },
    )
    .await;
}

/// What the clients saw.
#[derive(Default)]
struct Ledger {
    /// Session -> acknowledged versions.
    acked_versions: BTreeMap<String, Vec<i64>>,
    /// Session -> requests with no answer (the server died under them).
    unknown_events: BTreeMap<String, usize>,
    /// Reply texts acknowledged, and those with no answer.
    acked_replies: BTreeSet<String>,
    unknown_replies: BTreeSet<String>,
}

enum Answer {
    Acked(Value),
    Unknown,
    Refused,
}

async fn post(client: &reqwest::Client, port: u16, path: &str, body: &Value) -> Answer {
    let res = client
        .post(format!("http://127.0.0.1:{port}{path}"))
        .bearer_auth(KEY)
        .json(body)
        .timeout(Duration::from_secs(30))
        .send()
        .await;
    match res {
        Err(_) => Answer::Unknown,
        Ok(r) if r.status().is_success() => match r.json().await {
            Ok(v) => Answer::Acked(v),
            Err(_) => Answer::Unknown,
        },
        Ok(r) if r.status().is_server_error() => {
            // A 5xx other than 503 would be a defect; 503 changed nothing.
            assert_eq!(r.status().as_u16(), 503, "{path}");
            Answer::Refused
        }
        Ok(r) => panic!("{path}: {}", r.status()),
    }
}

/// Loads both servers until `until`; client `c` starts on server `c % 2`
/// and moves to the other one when a request goes unanswered.
async fn load(
    ports: [u16; 2],
    conversations: Arc<Vec<String>>,
    ledger: Arc<Mutex<Ledger>>,
    until: Instant,
    round: usize,
) {
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let ledger = ledger.clone();
        let conversations = conversations.clone();
        tasks.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut server = c % 2;
            let mut i = 0usize;
            while Instant::now() < until {
                i += 1;
                let port = ports[server];
                if i.is_multiple_of(2) {
                    let session = format!("s{}", (c + i) % SESSIONS);
                    let path = format!("/v1/products/default/sessions/{session}/events");
                    // The first event opens the chat; the rest are messages.
                    let body = json!({"type": "user_message"});
                    match post(&client, port, &path, &body).await {
                        Answer::Acked(v) => ledger
                            .lock()
                            .unwrap()
                            .acked_versions
                            .entry(session)
                            .or_default()
                            .push(v["version"].as_i64().unwrap()),
                        Answer::Unknown => {
                            *ledger
                                .lock()
                                .unwrap()
                                .unknown_events
                                .entry(session)
                                .or_default() += 1;
                            server = 1 - server;
                        }
                        Answer::Refused => {}
                    }
                } else {
                    let id = &conversations[(c + i) % CONVERSATIONS];
                    let text = format!("reply r{round} c{c} i{i}");
                    let path = format!("/v1/products/default/conversations/{id}/replies");
                    match post(&client, port, &path, &json!({"text": text})).await {
                        Answer::Acked(_) => {
                            ledger.lock().unwrap().acked_replies.insert(text);
                        }
                        Answer::Unknown => {
                            ledger.lock().unwrap().unknown_replies.insert(text);
                            server = 1 - server;
                        }
                        Answer::Refused => {}
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_servers_and_workers_lose_nothing_acknowledged() {
    let Some(pool) = test_pool().await else {
        return;
    };
    let url = url_for(&pool);
    let ports = [free_port(), free_port()];
    let mut servers = [spawn_server(&url, ports[0]), spawn_server(&url, ports[1])];
    let mut workers = [spawn_worker(&url), spawn_worker(&url)];
    let client = reqwest::Client::new();
    for p in ports {
        ready(&client, p).await;
    }
    // The sessions start in the reactive state; the conversations exist.
    let mut base = Vec::new();
    for s in 0..SESSIONS {
        let r = post(
            &client,
            ports[0],
            &format!("/v1/products/default/sessions/s{s}/events"),
            &json!({"type": "open_chat"}),
        )
        .await;
        let Answer::Acked(v) = r else {
            panic!("open session s{s}");
        };
        base.push(v["version"].as_i64().unwrap());
    }
    let mut ids = Vec::new();
    for c in 0..CONVERSATIONS {
        let Answer::Acked(v) = post(
            &client,
            ports[1],
            "/v1/products/default/conversations",
            &json!({"contact_id": format!("+1555000{c}"), "objective": "book a demo call", "todos": ["ask for a day"]}),
        )
        .await
        else {
            panic!("create a conversation");
        };
        ids.push(
            v["conversation"]["instance_id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    let ids = Arc::new(ids);
    let ledger = Arc::new(Mutex::new(Ledger::default()));

    // Load; kill a server and a worker in the middle of it; load on.
    let loading = tokio::spawn(load(
        ports,
        ids.clone(),
        ledger.clone(),
        Instant::now() + phase() * 2,
        0,
    ));
    tokio::time::sleep(phase()).await;
    servers[0].kill().unwrap();
    servers[0].wait().unwrap();
    workers[0].kill().unwrap();
    workers[0].wait().unwrap();
    loading.await.unwrap();

    // Restart them and load again.
    servers[0] = spawn_server(&url, ports[0]);
    workers[0] = spawn_worker(&url);
    ready(&client, ports[0]).await;
    load(
        ports,
        ids.clone(),
        ledger.clone(),
        Instant::now() + phase(),
        1,
    )
    .await;

    // Every queued task finishes, the killed worker's included.
    let p = pool.clone();
    wait_until("every task to finish", Duration::from_secs(120), || {
        let p = p.clone();
        async move {
            let open: i64 = sqlx::query("SELECT count(*) AS n FROM jobs WHERE state IN (0, 1)")
                .fetch_one(&p)
                .await
                .unwrap()
                .get("n");
            open == 0
        }
    })
    .await;
    for c in servers.iter_mut().chain(workers.iter_mut()) {
        c.kill().unwrap();
        c.wait().unwrap();
    }

    let ledger = std::mem::take(&mut *ledger.lock().unwrap());
    let mut acked_events = 0;
    for (s, &base) in base.iter().enumerate() {
        let session = format!("s{s}");
        let acked = ledger
            .acked_versions
            .get(&session)
            .cloned()
            .unwrap_or_default();
        let unknown = ledger.unknown_events.get(&session).copied().unwrap_or(0);
        let distinct: BTreeSet<i64> = acked.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            acked.len(),
            "{session}: a version acknowledged twice"
        );
        let version: i64 = sqlx::query(
            "SELECT version FROM sessions WHERE product_id = 'default' AND session_id = $1",
        )
        .bind(&session)
        .fetch_one(&pool)
        .await
        .unwrap()
        .get("version");
        // Versions up to `base` are the set-up's.
        let committed = version - base;
        let causes: Vec<String> = sqlx::query(
            "SELECT cause || ':' || coalesce(from_state, '') || '->' || to_state AS c FROM audit_log \
             WHERE product_id = 'default' AND entity_id = $1 ORDER BY seq",
        )
        .bind(&session)
        .fetch_all(&pool)
        .await
        .unwrap()
        .iter()
        .map(|r| r.get("c"))
        .collect();
        assert!(
            committed >= acked.len() as i64 && committed <= (acked.len() + unknown) as i64,
            "{session}: version {version}, {} acknowledged, {unknown} unanswered; audit {causes:?}",
            acked.len()
        );
        assert!(
            distinct.iter().all(|v| *v >= 2 && *v <= version),
            "{session}"
        );
        acked_events += acked.len();
    }
    let rows = sqlx::query(
        "SELECT instance_id::text AS id, role, text, outbound_seq FROM conversation_messages \
         WHERE product_id = 'default' ORDER BY seq",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let mut contact_texts: BTreeMap<String, usize> = BTreeMap::new();
    let mut deliveries = BTreeSet::new();
    for r in &rows {
        let role: String = r.get("role");
        if role == "contact" {
            *contact_texts.entry(r.get("text")).or_default() += 1;
        }
        if let Some(seq) = r.get::<Option<i32>, _>("outbound_seq") {
            let id: String = r.get("id");
            assert!(
                deliveries.insert((id, seq)),
                "outbound message {seq} delivered twice"
            );
        }
    }
    for text in &ledger.acked_replies {
        assert_eq!(contact_texts.get(text), Some(&1), "acknowledged {text:?}");
    }
    for (text, n) in &contact_texts {
        assert_eq!(*n, 1, "{text:?} stored {n} times");
        assert!(
            ledger.acked_replies.contains(text) || ledger.unknown_replies.contains(text),
            "{text:?} was never sent"
        );
    }
    assert!(
        acked_events > 0 && !ledger.acked_replies.is_empty(),
        "the load ran"
    );
    let unknown: usize =
        ledger.unknown_events.values().sum::<usize>() + ledger.unknown_replies.len();
    let line = format!(
        "faults: {acked_events} session events and {} replies acknowledged, {unknown} unanswered (server killed), {} messages stored",
        ledger.acked_replies.len(),
        rows.len()
    );
    std::fs::write(
        std::env::temp_dir().join("parlance-faults-summary.txt"),
        line,
    )
    .unwrap();
}
