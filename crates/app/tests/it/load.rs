//! Load for the fault tests: `parlance` processes on one database, clients
//! that record what each answer acknowledged, and the checks that compare
//! that ledger with the database once the load is over.
//!
//! The clients send session events, contact replies to conversations and
//! flow events (the `extraction` example: every `user_input` runs two task
//! DAGs on the workers, a chain ending in a map and a map over a list). An
//! answer is one of three things: acknowledged (2xx: it must be in the
//! database), refused (503: the service says nothing changed) or unknown
//! (no answer: it may or may not have happened). While the database itself
//! goes away, a 503 can hide a commit whose answer was lost, so the clients
//! can be told to count 503s as unknown too.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlx::{PgPool, Row as _};

use crate::support::wait_until;

/// The key of product `default` every server is started with.
pub(crate) const KEY: &str = "pk_fault_default";
/// Sessions the clients share.
pub(crate) const SESSIONS: usize = 8;
/// Conversations the clients reply to.
pub(crate) const CONVERSATIONS: usize = 4;
/// Clients sending session events and replies.
pub(crate) const CLIENTS: usize = 16;
/// Clients driving flow sessions, one session at a time each.
pub(crate) const FLOW_CLIENTS: usize = 4;
/// The flow they drive.
const FLOW: &str = "extraction";

// What a finished load must at least have acknowledged for its checks to
// mean something. The fault test's three two-second phases on a shared
// two-core machine acknowledge 290 to 520 session events, 300 to 540
// replies and store 17 to 22 flow inputs; the minimums are a third to a
// fifth of that, enough that every session and every conversation took
// many concurrent writes and flow inputs ran DAGs on the workers, with
// room for a slower machine.

/// Session events acknowledged, at least: about 12 per session.
pub(crate) const MIN_SESSION_EVENTS: usize = 100;
/// Replies acknowledged, at least: about 25 per conversation.
pub(crate) const MIN_REPLIES: usize = 100;
/// Flow inputs stored, at least (each runs two DAGs of tasks), so every
/// flow client completed a run or more.
pub(crate) const MIN_FLOW_INPUTS: usize = 4;

/// The example flows, which every server and worker loads.
pub(crate) fn flows_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/flows")
}

/// A port nothing listens on now.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `parlance` process, killed (SIGKILL) and reaped when dropped, so a
/// test that fails leaves none behind.
pub(crate) struct Proc(Child);

impl From<Child> for Proc {
    fn from(child: Child) -> Self {
        Proc(child)
    }
}

impl Proc {
    /// Kills the process (SIGKILL) and reaps it.
    pub(crate) fn kill(&mut self) {
        self.0.kill().unwrap();
        self.0.wait().unwrap();
    }

    /// The process id.
    pub(crate) fn id(&self) -> u32 {
        self.0.id()
    }

    /// Sends `signal` (`STOP`, `CONT`) to the process.
    pub(crate) fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {}", self.id());
    }

    /// Whether the process still runs.
    pub(crate) fn running(&mut self) -> bool {
        self.0.try_wait().unwrap().is_none()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `parlance serve --no-worker` on `port`, with the example flows.
pub(crate) fn spawn_server(url: &str, port: u16) -> Proc {
    let child = Command::new(env!("CARGO_BIN_EXE_parlance"))
        .args([
            "serve",
            "--no-worker",
            "--bind",
            &format!("127.0.0.1:{port}"),
        ])
        .arg("--flows")
        .arg(flows_dir())
        .env("DATABASE_URL", url)
        .env("PARLANCE_API_KEY", KEY)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start parlance serve");
    Proc(child)
}

/// `parlance worker` with the example flows; a worker silent for 2 s is
/// dead and loses its tasks.
pub(crate) fn spawn_worker(url: &str) -> Proc {
    let flows = flows_dir();
    Proc(crate::support::spawn_worker(
        url,
        &[
            "--stale-after-secs",
            "2",
            "--flows",
            flows.to_str().expect("a UTF-8 path"),
        ],
    ))
}

/// Waits for `/readyz` to answer 200.
pub(crate) async fn ready(client: &reqwest::Client, port: u16) {
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

/// Opens every session (`open_chat`: they start reactive) and returns
/// each one's version.
pub(crate) async fn open_sessions(client: &reqwest::Client, port: u16) -> Vec<i64> {
    let mut base = Vec::new();
    for s in 0..SESSIONS {
        let r = post(
            client,
            port,
            &format!("/v1/products/default/sessions/s{s}/events"),
            &json!({"type": "open_chat"}),
        )
        .await;
        let Answer::Acked(v) = r else {
            panic!("open session s{s}");
        };
        base.push(v["version"].as_i64().unwrap());
    }
    base
}

/// Creates the conversations the clients reply to; returns their ids.
pub(crate) async fn create_conversations(client: &reqwest::Client, port: u16) -> Vec<String> {
    let mut ids = Vec::new();
    for c in 0..CONVERSATIONS {
        let Answer::Acked(v) = post(
            client,
            port,
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
    ids
}

/// One transition as the audit log records it: from, to, cause.
type Step = (Option<String>, String, String);

/// What one flow session's client saw.
#[derive(Default)]
pub(crate) struct FlowLedger {
    /// `user_input` texts acknowledged.
    pub(crate) acked_inputs: Vec<String>,
    /// `user_input` texts with no answer.
    pub(crate) unknown_inputs: Vec<String>,
}

/// What the clients saw.
#[derive(Default)]
pub(crate) struct Ledger {
    /// Session -> acknowledged events: the version each took and its
    /// identity (the tour id it carried, unique per event).
    pub(crate) acked_events: BTreeMap<String, Vec<(i64, String)>>,
    /// Session -> identities of events with no answer (the server died
    /// under them).
    pub(crate) unknown_events: BTreeMap<String, Vec<String>>,
    /// Reply texts acknowledged, and those with no answer.
    pub(crate) acked_replies: BTreeSet<String>,
    pub(crate) unknown_replies: BTreeSet<String>,
    /// Flow sessions whose start was acknowledged.
    pub(crate) flows: BTreeMap<String, FlowLedger>,
    /// Flow events acknowledged (`start_session`, `user_input`, `restart`).
    pub(crate) flow_events: usize,
    /// Transitions acknowledged, by (entity kind, entity id).
    pub(crate) transitions: BTreeMap<(String, String), Vec<Step>>,
    /// Port -> requests of any kind sent and not yet answered.
    pub(crate) in_flight: BTreeMap<u16, usize>,
    /// Port -> requests of any kind acknowledged (2xx).
    pub(crate) acked_by: BTreeMap<u16, usize>,
    /// Port -> requests of any kind that got no answer.
    pub(crate) unanswered_by: BTreeMap<u16, usize>,
}

impl Ledger {
    fn transition(&mut self, kind: &str, id: &str, step: Step) {
        self.transitions
            .entry((kind.to_owned(), id.to_owned()))
            .or_default()
            .push(step);
    }
}

/// An answer.
pub(crate) enum Answer {
    /// 2xx, with its body.
    Acked(Value),
    /// No answer, or a body that did not arrive whole.
    Unknown,
    /// 503: nothing changed, retry.
    Refused,
}

async fn answer(path: &str, res: reqwest::Result<reqwest::Response>) -> Answer {
    match res {
        Err(_) => Answer::Unknown,
        Ok(r) if r.status().is_success() => match r.json().await {
            Ok(v) => Answer::Acked(v),
            Err(_) => Answer::Unknown,
        },
        Ok(r) if r.status().is_server_error() => {
            // A 5xx other than 503 would be a defect.
            assert_eq!(r.status().as_u16(), 503, "{path}");
            Answer::Refused
        }
        Ok(r) => {
            let status = r.status();
            let body = r.text().await.unwrap_or_default();
            panic!("{path}: {status} {body}")
        }
    }
}

/// POSTs `body` to `path` with the key.
pub(crate) async fn post(client: &reqwest::Client, port: u16, path: &str, body: &Value) -> Answer {
    let res = client
        .post(format!("http://127.0.0.1:{port}{path}"))
        .bearer_auth(KEY)
        .json(body)
        .timeout(Duration::from_secs(30))
        .send()
        .await;
    answer(path, res).await
}

/// GETs `path` with the key.
pub(crate) async fn get(client: &reqwest::Client, port: u16, path: &str) -> Answer {
    let res = client
        .get(format!("http://127.0.0.1:{port}{path}"))
        .bearer_auth(KEY)
        .timeout(Duration::from_secs(30))
        .send()
        .await;
    answer(path, res).await
}

/// What the clients load and how they read answers.
#[derive(Clone)]
pub(crate) struct Load {
    /// The servers; a client moves to the next one when a request goes
    /// unanswered.
    pub(crate) ports: Vec<u16>,
    /// The conversations replies go to.
    pub(crate) conversations: Arc<Vec<String>>,
    /// What was acknowledged.
    pub(crate) ledger: Arc<Mutex<Ledger>>,
    /// Count a 503 as unknown rather than as "nothing changed" (the
    /// database went away, possibly after a commit whose answer was lost).
    pub(crate) refused_is_unknown: bool,
    /// Set to stop the clients before their deadline.
    pub(crate) stop: Arc<AtomicBool>,
}

/// How a client treats one answer.
enum Seen {
    Acked(Value),
    /// May have happened: recorded as unknown.
    Unknown {
        moved: bool,
    },
    /// Did not happen.
    Refused,
}

impl Load {
    /// Sends one request to `port` and reads its answer, counting it in
    /// flight meanwhile and then as acknowledged or unanswered by `port`.
    async fn call(&self, port: u16, request: impl std::future::Future<Output = Answer>) -> Seen {
        *self
            .ledger
            .lock()
            .unwrap()
            .in_flight
            .entry(port)
            .or_default() += 1;
        let a = request.await;
        {
            let mut ledger = self.ledger.lock().unwrap();
            *ledger.in_flight.get_mut(&port).unwrap() -= 1;
            match &a {
                Answer::Acked(_) => *ledger.acked_by.entry(port).or_default() += 1,
                Answer::Unknown => *ledger.unanswered_by.entry(port).or_default() += 1,
                Answer::Refused => {}
            }
        }
        self.seen(a)
    }

    fn seen(&self, a: Answer) -> Seen {
        match a {
            Answer::Acked(v) => Seen::Acked(v),
            Answer::Unknown => Seen::Unknown { moved: true },
            Answer::Refused if self.refused_is_unknown => Seen::Unknown { moved: false },
            Answer::Refused => Seen::Refused,
        }
    }

    fn next(&self, server: usize) -> usize {
        (server + 1) % self.ports.len()
    }

    fn going(&self, until: Instant) -> bool {
        Instant::now() < until && !self.stop.load(Ordering::Relaxed)
    }

    /// What was acknowledged so far: session events, replies, flow events.
    pub(crate) fn acked(&self) -> usize {
        let ledger = self.ledger.lock().unwrap();
        ledger.acked_events.values().map(Vec::len).sum::<usize>()
            + ledger.acked_replies.len()
            + ledger.flow_events
    }

    /// Runs every client until `until`; `round` keeps texts unique.
    pub(crate) async fn run(&self, until: Instant, round: usize) {
        let mut tasks = Vec::new();
        for c in 0..CLIENTS {
            let this = self.clone();
            tasks.push(tokio::spawn(async move {
                this.client(c, until, round).await;
            }));
        }
        for c in 0..FLOW_CLIENTS {
            let this = self.clone();
            tasks.push(tokio::spawn(async move {
                this.flow_client(c, until, round).await;
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    }

    /// Session events and replies; client `c` starts on server `c % n`.
    async fn client(&self, c: usize, until: Instant, round: usize) {
        let client = reqwest::Client::new();
        let mut server = c % self.ports.len();
        let mut i = 0usize;
        while self.going(until) {
            i += 1;
            let port = self.ports[server];
            let seen = if i.is_multiple_of(2) {
                let session = format!("s{}", (c + i) % SESSIONS);
                let path = format!("/v1/products/default/sessions/{session}/events");
                // Each event carries its own identity, which the session
                // stores (`active_tour_id`) until the next event.
                let tour = format!("t{round}c{c}i{i}");
                let body = json!({"type": "visual_guidance", "active": true, "tour_id": tour});
                let seen = self.call(port, post(&client, port, &path, &body)).await;
                let mut ledger = self.ledger.lock().unwrap();
                match &seen {
                    Seen::Acked(v) => {
                        // The record the answer names is this event's.
                        assert_eq!(
                            v["snapshot"]["active_tour_id"].as_str(),
                            Some(tour.as_str()),
                            "{session}: {v}"
                        );
                        ledger
                            .acked_events
                            .entry(session.clone())
                            .or_default()
                            .push((v["version"].as_i64().unwrap(), tour));
                        for part in ["tick", "result"] {
                            let t = &v[part]["transition"];
                            if !t.is_null() {
                                ledger.transition("session", &session, step(t));
                            }
                        }
                    }
                    Seen::Unknown { .. } => {
                        ledger.unknown_events.entry(session).or_default().push(tour);
                    }
                    Seen::Refused => {}
                }
                seen
            } else {
                let id = &self.conversations[(c + i) % CONVERSATIONS];
                let text = format!("reply r{round} c{c} i{i}");
                let path = format!("/v1/products/default/conversations/{id}/replies");
                let seen = self
                    .call(port, post(&client, port, &path, &json!({"text": text})))
                    .await;
                let mut ledger = self.ledger.lock().unwrap();
                match &seen {
                    Seen::Acked(v) => {
                        ledger.acked_replies.insert(text);
                        for t in v["transitions"].as_array().unwrap() {
                            ledger.transition("conversation", id, step(t));
                        }
                    }
                    Seen::Unknown { .. } => {
                        ledger.unknown_replies.insert(text);
                    }
                    Seen::Refused => {}
                }
                seen
            };
            match seen {
                Seen::Acked(_) => {}
                Seen::Unknown { moved } => {
                    if moved {
                        server = self.next(server);
                    } else {
                        pause().await;
                    }
                }
                Seen::Refused => pause().await,
            }
        }
    }

    /// One flow session at a time: start, `user_input` (two DAGs run),
    /// poll until it is done, `restart`, `user_input` again, and so on.
    /// After an unanswered event the client reads the session back to
    /// learn where it is.
    async fn flow_client(&self, c: usize, until: Instant, round: usize) {
        #[derive(Clone, Copy)]
        enum Next {
            Start,
            Input,
            Wait,
            Restart,
            Resync,
        }
        let client = reqwest::Client::new();
        let mut server = c % self.ports.len();
        let mut session = String::new();
        let mut next = Next::Start;
        let mut n = 0usize;
        let event_path = format!("/v1/ai/{FLOW}/event");
        while self.going(until) {
            let port = self.ports[server];
            let event = |name: &str, input: &str| json!({"session_id": session, "event": name, "event_input": input});
            let (seen, then) = match next {
                Next::Start => {
                    let path = format!("/v1/ai/{FLOW}/start_session");
                    let seen = self
                        .call(port, post(&client, port, &path, &json!({})))
                        .await;
                    if let Seen::Acked(v) = &seen {
                        session = v["session_id"].as_str().unwrap().to_owned();
                        let mut ledger = self.ledger.lock().unwrap();
                        ledger.flows.entry(session.clone()).or_default();
                        ledger.flow_events += 1;
                        ledger.transition(
                            "flow",
                            &session,
                            (None, "intake".into(), "start_session".into()),
                        );
                    }
                    // An unanswered start leaves at most a session nobody
                    // knows, waiting in its first state: start another.
                    (seen, [Next::Input, Next::Start])
                }
                Next::Input => {
                    n += 1;
                    let text = format!(
                        "name: F{round}x{c}x{n}; email: f{round}x{c}x{n}@example.com; topics: a{n}, b{n}"
                    );
                    let body = event("user_input", &text);
                    let seen = self
                        .call(port, post(&client, port, &event_path, &body))
                        .await;
                    let mut ledger = self.ledger.lock().unwrap();
                    match &seen {
                        Seen::Acked(v) => {
                            assert_eq!(v["next_actions"], json!(["poll"]), "{v}");
                            ledger.flow_events += 1;
                            let flow = ledger.flows.get_mut(&session).unwrap();
                            flow.acked_inputs.push(text);
                            ledger.transition(
                                "flow",
                                &session,
                                (Some("intake".into()), "extract".into(), "user_input".into()),
                            );
                        }
                        Seen::Unknown { .. } => {
                            let flow = ledger.flows.get_mut(&session).unwrap();
                            flow.unknown_inputs.push(text);
                        }
                        Seen::Refused => {}
                    }
                    (seen, [Next::Wait, Next::Resync])
                }
                Next::Wait => {
                    let seen = self
                        .call(port, post(&client, port, &event_path, &event("poll", "")))
                        .await;
                    let mut then = [Next::Wait, Next::Wait];
                    if let Seen::Acked(v) = &seen {
                        let actions = &v["next_actions"];
                        if *actions == json!(["poll"]) {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        } else {
                            // Anything but the confirmation is a failed DAG.
                            assert_eq!(*actions, json!(["accept", "restart"]), "{v}");
                            then = [Next::Restart, Next::Wait];
                        }
                    }
                    (seen, then)
                }
                Next::Restart => {
                    let seen = self
                        .call(
                            port,
                            post(&client, port, &event_path, &event("restart", "")),
                        )
                        .await;
                    if let Seen::Acked(_) = &seen {
                        let mut ledger = self.ledger.lock().unwrap();
                        ledger.flow_events += 1;
                        ledger.transition(
                            "flow",
                            &session,
                            (Some("confirm".into()), "intake".into(), "restart".into()),
                        );
                    }
                    (seen, [Next::Input, Next::Resync])
                }
                Next::Resync => {
                    let path = format!("/v1/ai/{FLOW}/model/{session}");
                    let seen = self.call(port, get(&client, port, &path)).await;
                    let mut then = [Next::Resync, Next::Resync];
                    if let Seen::Acked(v) = &seen {
                        let model: Value =
                            serde_json::from_str(v["response"].as_str().unwrap()).unwrap();
                        let at = match model["state"].as_str().unwrap() {
                            "intake" => Next::Input,
                            "extract" | "summarize" => Next::Wait,
                            "confirm" => Next::Restart,
                            other => panic!("flow session {session} in state {other}: {model}"),
                        };
                        then = [at, at];
                    }
                    (seen, then)
                }
            };
            next = match seen {
                Seen::Acked(_) => then[0],
                Seen::Unknown { moved } => {
                    if moved {
                        server = self.next(server);
                    } else {
                        pause().await;
                    }
                    then[1]
                }
                Seen::Refused => {
                    pause().await;
                    next
                }
            };
        }
    }
}

/// A short wait before retrying a refused request.
async fn pause() {
    tokio::time::sleep(Duration::from_millis(10)).await;
}

fn step(t: &Value) -> Step {
    let s = |k: &str| t[k].as_str().unwrap_or_else(|| panic!("{t}")).to_owned();
    (Some(s("from")), s("to"), s("cause"))
}

/// Waits until no task is queued or running and no DAG run is running.
pub(crate) async fn drained(pool: &PgPool, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let open: i64 = sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM jobs WHERE state IN (0, 1)) \
             + (SELECT count(*) FROM dag_runs WHERE state = 0)",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        if open == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for every task to finish: {:?}",
            open_tasks(pool).await
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A session as stored when the load stopped.
pub(crate) struct AtStop {
    /// Its version.
    pub(crate) version: i64,
    /// The identity of the event that stored it (`active_tour_id`).
    pub(crate) tour: Option<String>,
}

/// Each session's version and last event now; read as soon as the load
/// stops, before the timer sweeper saves sessions left idle past their
/// interaction timeout (and again when the cooldown that starts ends),
/// which no event caused.
pub(crate) async fn session_versions(pool: &PgPool) -> Vec<AtStop> {
    let mut versions = Vec::new();
    for s in 0..SESSIONS {
        let row = sqlx::query(
            "SELECT version, snapshot->>'active_tour_id' AS tour FROM sessions \
             WHERE product_id = 'default' AND session_id = $1",
        )
        .bind(format!("s{s}"))
        .fetch_one(pool)
        .await
        .unwrap();
        versions.push(AtStop {
            version: row.get("version"),
            tour: row.get("tour"),
        });
    }
    versions
}

/// Per session, every event is accounted for by its identity (the unique
/// tour id it carried) and the version it took. `base` holds each
/// session's version after set-up, before the load; `at_stop` is from
/// [`session_versions`]. The store keeps a session's latest record only,
/// so an event's presence is its version: every event that commits takes
/// the next version, and the answer shows the record at that version
/// carrying the event's identity (checked as it arrives).
///
/// - every acknowledged event took its own version, after `base` and at
///   most the version at the stop, and was acknowledged once;
/// - every version after `base` that no acknowledged event took was taken
///   by an event whose answer was lost: there are no more such versions
///   than unanswered events;
/// - the stored record is the last event's: the acknowledged one holding
///   the version at the stop, or, when none does, one that was sent and
///   not answered. An acknowledged event's identity stored under another
///   version means an event was lost or doubled.
///
/// Returns the events acknowledged.
pub(crate) async fn check_sessions(
    pool: &PgPool,
    ledger: &Ledger,
    base: &[i64],
    at_stop: &[AtStop],
) -> usize {
    let mut acked_events = 0;
    for (s, &base) in base.iter().enumerate() {
        let session = format!("s{s}");
        let acked = ledger
            .acked_events
            .get(&session)
            .map_or(&[][..], Vec::as_slice);
        let unknown = ledger
            .unknown_events
            .get(&session)
            .map_or(&[][..], Vec::as_slice);
        let AtStop { version, tour } = &at_stop[s];
        let version = *version;
        let causes: Vec<String> = sqlx::query(
            "SELECT cause || ':' || coalesce(from_state, '') || '->' || to_state || ' ' || \
             payload::text || ' at ' || at::text AS c FROM audit_log \
             WHERE product_id = 'default' AND entity_id = $1 ORDER BY seq",
        )
        .bind(&session)
        .fetch_all(pool)
        .await
        .unwrap()
        .iter()
        .map(|r| r.get("c"))
        .collect();
        let mut owner: BTreeMap<i64, &str> = BTreeMap::new();
        let mut identities = BTreeSet::new();
        for (v, id) in acked {
            assert!(
                identities.insert(id.as_str()),
                "{session}: {id} acknowledged twice"
            );
            if let Some(other) = owner.insert(*v, id) {
                panic!("{session}: version {v} acknowledged for {other} and for {id}");
            }
            assert!(
                *v > base && *v <= version,
                "{session}: {id} acknowledged at version {v}, outside ({base}, {version}]"
            );
        }
        let unowned: Vec<i64> = (base + 1..=version)
            .filter(|v| !owner.contains_key(v))
            .collect();
        assert!(
            unowned.len() <= unknown.len(),
            "{session}: versions {unowned:?} taken by no acknowledged event, \
             {} events unanswered; audit {causes:?}",
            unknown.len()
        );
        match (owner.get(&version), tour.as_deref()) {
            (Some(last), stored) => assert_eq!(
                stored,
                Some(*last),
                "{session}: version {version} was acknowledged for {last}"
            ),
            (None, Some(stored)) => assert!(
                unknown.iter().any(|u| u == stored),
                "{session}: stored {stored} at version {version}, which is no unanswered event's{}",
                if identities.contains(stored) {
                    " (it was acknowledged at another version)"
                } else {
                    ""
                }
            ),
            (None, None) => assert_eq!(
                version, base,
                "{session}: version {version} stores no event"
            ),
        }
        acked_events += acked.len();
    }
    acked_events
}

/// Every acknowledged reply is in its transcript exactly once, every stored
/// reply was sent, and no outbound message (instance, outbound_seq) is
/// stored twice. Returns the messages stored.
pub(crate) async fn check_transcripts(pool: &PgPool, ledger: &Ledger) -> usize {
    let rows = sqlx::query(
        "SELECT instance_id::text AS id, role, text, outbound_seq FROM conversation_messages \
         WHERE product_id = 'default' ORDER BY seq",
    )
    .fetch_all(pool)
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
    rows.len()
}

/// Creates `n` conversations whose heartbeat is due every second, with
/// `follow_ups` follow-ups before they are abandoned; nobody replies. Each
/// has a fixed id, so a create whose answer was lost (a 503 while the
/// database went away) is tried again and then found (409).
pub(crate) async fn arm_heartbeats(
    client: &reqwest::Client,
    port: u16,
    batch: usize,
    n: usize,
    follow_ups: u32,
) -> Vec<String> {
    let mut ids = Vec::new();
    for k in 0..n {
        let id = uuid::Uuid::from_u128(((batch as u128) << 32) | k as u128).to_string();
        let body = json!({
            "instance_id": id,
            "contact_id": format!("+1555{batch}{k:03}"),
            "objective": "confirm the appointment",
            "heartbeat_interval_s": 1,
            "max_follow_ups": follow_ups,
        });
        let url = format!("http://127.0.0.1:{port}/v1/products/default/conversations");
        let created = || async {
            let res = client
                .post(&url)
                .bearer_auth(KEY)
                .json(&body)
                .timeout(Duration::from_secs(30))
                .send()
                .await;
            match res {
                Ok(r) if r.status().is_success() || r.status().as_u16() == 409 => true,
                Ok(r) if r.status().as_u16() == 503 => false,
                Ok(r) => panic!("create {id}: {}", r.status()),
                Err(_) => false,
            }
        };
        wait_until(
            "a conversation with a heartbeat",
            Duration::from_secs(60),
            created,
        )
        .await;
        ids.push(id);
    }
    ids
}

/// Waits until every conversation in `ids` is abandoned.
pub(crate) async fn abandoned(pool: &PgPool, ids: &[String], timeout: Duration) {
    let left = || async {
        sqlx::query_scalar::<_, String>(
            "SELECT instance_id::text || ' in ' || state || ', due ' || \
             coalesce(heartbeat_due_at::text, 'never') || ', claimed until ' || \
             coalesce(claimed_until::text, 'never') FROM conversation_instances \
             WHERE instance_id::text = ANY($1) AND state <> 'ABANDONED'",
        )
        .bind(ids)
        .fetch_all(pool)
        .await
        .unwrap()
    };
    let deadline = Instant::now() + timeout;
    loop {
        let open = left().await;
        if open.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for every armed conversation to be abandoned: {open:?}; \
             open tasks: {:?}",
            open_tasks(pool).await
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Queued and running tasks, described.
async fn open_tasks(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT kind || ' ' || state || ' attempt ' || attempt || ' ' || args::text || \
         ' until ' || coalesce(lease_expires_at::text, '-') || ' by ' || \
         coalesce(leased_by::text, '-') FROM jobs WHERE state IN (0, 1) ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// No heartbeat fired twice. A heartbeat that fires leaves, in the commit
/// that fires it, an audit entry `timer_fired` (`WAITING_FOR_REPLY` ->
/// `HEARTBEAT_SCHEDULED`) and a follow-up task, which appends one agent
/// message with the next `outbound_seq` and re-arms the timer
/// (`send_follow_up`); the heartbeat after the last follow-up abandons the
/// conversation instead. Each armed conversation, never replied to, must
/// therefore show exactly `follow_ups + 1` firings, `follow_ups` follow-ups,
/// one abandonment, and outbound messages 1 (the first agent message)
/// to `follow_ups + 1`, each once. Returns the firings seen.
pub(crate) async fn check_heartbeats(pool: &PgPool, ids: &[String], follow_ups: u32) -> usize {
    let mut fired = 0;
    let expected: Vec<i32> = (1..=follow_ups as i32 + 1).collect();
    for id in ids {
        let seqs: Vec<Option<i32>> = sqlx::query_scalar(
            "SELECT outbound_seq FROM conversation_messages \
             WHERE product_id = 'default' AND instance_id::text = $1 ORDER BY outbound_seq",
        )
        .bind(id)
        .fetch_all(pool)
        .await
        .unwrap();
        let seqs: Vec<i32> = seqs
            .into_iter()
            .map(|s| s.expect("only agent messages, each with its outbound_seq"))
            .collect();
        assert_eq!(
            seqs, expected,
            "{id}: first message and each follow-up once"
        );
        let rows = sqlx::query(
            "SELECT cause, from_state, to_state FROM audit_log \
             WHERE product_id = 'default' AND entity_kind = 'conversation' AND entity_id = $1 \
             ORDER BY seq",
        )
        .bind(id)
        .fetch_all(pool)
        .await
        .unwrap();
        let count = |cause: &str, to: &str| {
            rows.iter()
                .filter(|r| {
                    r.get::<String, _>("cause") == cause && r.get::<String, _>("to_state") == to
                })
                .count()
        };
        let fires = count("timer_fired", "HEARTBEAT_SCHEDULED");
        assert_eq!(
            fires,
            follow_ups as usize + 1,
            "{id}: each armed heartbeat fires once"
        );
        assert_eq!(
            count("send_follow_up", "WAITING_FOR_REPLY"),
            follow_ups as usize,
            "{id}"
        );
        assert_eq!(count("timer_fired", "ABANDONED"), 1, "{id}");
        fired += fires;
    }
    fired
}

/// What [`check_dags`] counted.
#[derive(Debug, Default)]
pub(crate) struct DagFigures {
    /// Runs, all completed.
    pub(crate) runs: usize,
    /// Their nodes, each completed once.
    pub(crate) nodes: usize,
    /// Chains whose progress is exact (no node ran twice).
    pub(crate) exact_chains: usize,
    /// Chains with a node that ran again after a lost attempt.
    pub(crate) retried_chains: usize,
    /// Chains, none of whose nodes ran twice, that counted fewer tasks
    /// than they have (a progress write lost to the database going away).
    pub(crate) short_chains: usize,
    /// Flow `user_input`s stored, each completed once.
    pub(crate) inputs: usize,
}

/// Every DAG run completed exactly once, and each flow session reflects
/// each completed run once:
///
/// - every run is completed (none running, failed or cancelled), with
///   `done_nodes == total_nodes` == its node rows, every node completed
///   with a result, and every task node run by exactly one job, completed
///   (a node completed twice would count twice in `done_nodes`);
/// - no flow session waits for a run, and each is in a user state;
/// - per session, each stored `user_input` has exactly one confirmation
///   (the rendering of its result), two runs (extraction, then the
///   summaries) and two `dag_completed` audit entries;
/// - each acknowledged input is stored exactly once, and each stored one
///   was sent;
/// - a chain's progress is exact (`done == total`) when none of its nodes
///   ran twice (a node re-run after a lost attempt counts again: progress
///   is advisory); while the database goes away a node's progress write
///   can fail on its own, so with `database_down` such a chain may only
///   count short (`done <= total`).
pub(crate) async fn check_dags(pool: &PgPool, ledger: &Ledger, database_down: bool) -> DagFigures {
    let mut figures = DagFigures::default();
    let runs = sqlx::query(
        "SELECT r.id, r.state, r.total_nodes, r.done_nodes, count(n.id) AS nodes, \
         count(n.id) FILTER (WHERE n.state = 2 AND n.result IS NOT NULL) AS completed, \
         max(n.result->>'session_id') FILTER (WHERE n.kind = 'flow.complete') AS session \
         FROM dag_runs r LEFT JOIN dag_nodes n \
         ON n.product_id = r.product_id AND n.dag_run_id = r.id \
         WHERE r.product_id = 'default' GROUP BY r.product_id, r.id ORDER BY r.id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut runs_of: BTreeMap<String, usize> = BTreeMap::new();
    for r in &runs {
        let id: i64 = r.get("id");
        let state: i16 = r.get("state");
        let total = i64::from(r.get::<i32, _>("total_nodes"));
        let done = i64::from(r.get::<i32, _>("done_nodes"));
        let nodes: i64 = r.get("nodes");
        let completed: i64 = r.get("completed");
        assert_eq!(state, 1, "run {id} is not completed");
        assert_eq!(
            (done, nodes, completed),
            (total, total, total),
            "run {id}: done, nodes and completed nodes against its total"
        );
        let session: String = r.get("session");
        *runs_of.entry(session).or_default() += 1;
        figures.nodes += nodes as usize;
    }
    figures.runs = runs.len();
    let odd: Vec<String> = sqlx::query_scalar(
        "SELECT n.key || ' of run ' || n.dag_run_id || ': ' || count(j.id) || ' jobs, ' || \
         count(j.id) FILTER (WHERE j.state = 2) || ' completed' \
         FROM dag_nodes n LEFT JOIN jobs j ON j.product_id = n.product_id AND j.node_id = n.id \
         WHERE n.role = 0 GROUP BY n.product_id, n.id HAVING count(j.id) <> 1 OR count(j.id) FILTER (WHERE j.state = 2) <> 1",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(odd.is_empty(), "task nodes not run exactly once: {odd:?}");

    let sessions = sqlx::query(
        "SELECT session_id, state, data->'running' AS running FROM flow_sessions \
         WHERE product_id = 'default'",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let dialogue = sqlx::query(
        "SELECT session_id, actor, event, actor_text FROM flow_dialogue \
         WHERE product_id = 'default' ORDER BY session_id, seq",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut inputs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut confirmations: BTreeMap<String, usize> = BTreeMap::new();
    for d in &dialogue {
        let session: String = d.get("session_id");
        let actor: String = d.get("actor");
        let event: String = d.get("event");
        match (actor.as_str(), event.as_str()) {
            ("user", "user_input") => inputs
                .entry(session)
                .or_default()
                .push(d.get::<Option<String>, _>("actor_text").unwrap_or_default()),
            ("assistant", "advance") => *confirmations.entry(session).or_default() += 1,
            _ => {}
        }
    }
    let completions: BTreeMap<String, i64> = sqlx::query(
        "SELECT entity_id, count(*) AS n FROM audit_log WHERE product_id = 'default' \
         AND entity_kind = 'flow' AND cause = 'dag_completed' GROUP BY entity_id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get("entity_id"), r.get("n")))
    .collect();
    for s in &sessions {
        let id: String = s.get("session_id");
        let state: String = s.get("state");
        let running: Option<Value> = s.get("running");
        assert!(
            running.unwrap_or(Value::Null).is_null(),
            "flow session {id} still waits for a run"
        );
        assert!(
            state == "intake" || state == "confirm",
            "flow session {id} ended in {state}"
        );
        let stored = inputs.get(&id).map_or(&[][..], Vec::as_slice);
        let n = stored.len();
        assert_eq!(
            confirmations.get(&id).copied().unwrap_or(0),
            n,
            "{id}: confirmations"
        );
        assert_eq!(runs_of.get(&id).copied().unwrap_or(0), 2 * n, "{id}: runs");
        assert_eq!(
            completions.get(&id).copied().unwrap_or(0),
            2 * n as i64,
            "{id}: completions audited"
        );
        let seen = ledger.flows.get(&id);
        for text in seen.map_or(&[][..], |f| f.acked_inputs.as_slice()) {
            assert_eq!(
                stored.iter().filter(|t| *t == text).count(),
                1,
                "{id}: acknowledged {text:?}"
            );
        }
        for text in stored {
            assert!(
                seen.is_some_and(
                    |f| f.acked_inputs.contains(text) || f.unknown_inputs.contains(text)
                ),
                "{id}: {text:?} was never sent"
            );
        }
        figures.inputs += n;
    }
    for id in ledger.flows.keys() {
        assert!(
            sessions
                .iter()
                .any(|s| s.get::<String, _>("session_id") == *id),
            "acknowledged flow session {id} is not stored"
        );
    }
    assert_eq!(
        runs_of.values().sum::<usize>(),
        runs.len(),
        "every run is a flow session's"
    );

    let attempts: BTreeMap<(String, String), i32> = sqlx::query(
        "WITH owner AS (SELECT product_id, dag_run_id, result->>'session_id' AS s, \
         result->>'chain_id' AS c FROM dag_nodes WHERE kind = 'flow.complete' AND state = 2) \
         SELECT o.s, o.c, max(j.attempt) AS a FROM dag_nodes n \
         JOIN owner o ON o.product_id = n.product_id AND o.dag_run_id = n.dag_run_id \
         JOIN jobs j ON j.product_id = n.product_id AND j.node_id = n.id \
         WHERE n.role = 0 GROUP BY 1, 2",
    )
    .fetch_all(pool)
    .await
    .unwrap()
    .iter()
    .map(|r| ((r.get("s"), r.get("c")), r.get("a")))
    .collect();
    let chains = sqlx::query(
        "SELECT session_id, chain_id, total, done FROM flow_progress WHERE product_id = 'default'",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    for p in &chains {
        let key: (String, String) = (p.get("session_id"), p.get("chain_id"));
        let (total, done): (i64, i64) = (p.get("total"), p.get("done"));
        let most = attempts.get(&key).copied().unwrap_or(0);
        if most <= 1 && database_down && done < total {
            figures.short_chains += 1;
        } else if most <= 1 {
            assert_eq!(done, total, "chain {key:?}: progress");
            figures.exact_chains += 1;
        } else {
            figures.retried_chains += 1;
        }
    }
    figures
}

/// The audit log has no gaps. Per entity (kind and id), in `seq` order,
/// each entry starts where the one before ended (`from_state` equals the
/// previous `to_state`): a transition saved without its entry, or an entry
/// written twice or out of order, breaks that chain. A conversation's or
/// flow session's trail starts with its creation (no `from_state`), a
/// session's from `thinking`, the state a session is created in; each
/// trail ends in the state stored now, and every stored conversation and
/// flow session has one. Every transition an answer acknowledged is in its
/// entity's trail (as many times as it was acknowledged, at least).
/// Returns the entries checked.
pub(crate) async fn check_audit(pool: &PgPool, ledger: &Ledger) -> usize {
    let rows = sqlx::query(
        "SELECT entity_kind, entity_id, from_state, to_state, cause FROM audit_log \
         WHERE product_id = 'default' ORDER BY seq",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut trails: BTreeMap<(String, String), Vec<Step>> = BTreeMap::new();
    for r in &rows {
        trails
            .entry((r.get("entity_kind"), r.get("entity_id")))
            .or_default()
            .push((r.get("from_state"), r.get("to_state"), r.get("cause")));
    }
    for ((kind, id), trail) in &trails {
        let first = &trail[0];
        match kind.as_str() {
            "session" => assert_eq!(
                first.0.as_deref(),
                Some("thinking"),
                "{kind} {id}: {trail:?}"
            ),
            "conversation" | "flow" => assert_eq!(first.0, None, "{kind} {id}: {trail:?}"),
            _ => {}
        }
        for w in trail.windows(2) {
            assert_eq!(
                w[1].0.as_deref(),
                Some(w[0].1.as_str()),
                "{kind} {id}: a gap in the audit trail between {:?} and {:?}",
                w[0],
                w[1]
            );
        }
    }
    let stored = sqlx::query(
        "SELECT 'session' AS kind, session_id AS id, snapshot->>'current_state' AS state \
         FROM sessions WHERE product_id = 'default' \
         UNION ALL SELECT 'conversation', instance_id::text, state FROM conversation_instances \
         WHERE product_id = 'default' \
         UNION ALL SELECT 'flow', session_id, state FROM flow_sessions WHERE product_id = 'default'",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    for s in &stored {
        let key: (String, String) = (s.get("kind"), s.get("id"));
        let state: String = s.get("state");
        match trails.get(&key) {
            Some(trail) => assert_eq!(
                trail.last().unwrap().1,
                state,
                "{key:?}: the trail does not end in the stored state"
            ),
            None => assert!(
                key.0 == "session" && state == "thinking",
                "{key:?} in {state} has no audit trail"
            ),
        }
    }
    for (key, acked) in &ledger.transitions {
        let trail = trails.get(key).map_or(&[][..], Vec::as_slice);
        let mut counts: BTreeMap<&Step, usize> = BTreeMap::new();
        for t in acked {
            *counts.entry(t).or_default() += 1;
        }
        for (t, n) in counts {
            let recorded = trail.iter().filter(|r| *r == t).count();
            assert!(
                recorded >= n,
                "{key:?}: {t:?} acknowledged {n} times, audited {recorded} times"
            );
        }
    }
    rows.len()
}

/// What the checks of a finished load counted.
pub(crate) struct Checked {
    /// Session events acknowledged.
    pub(crate) acked_events: usize,
    /// Transcript messages stored.
    pub(crate) messages: usize,
    /// Heartbeats fired, each once.
    pub(crate) fired: usize,
    /// The DAG runs.
    pub(crate) dags: DagFigures,
    /// Audit entries, the trail without a gap.
    pub(crate) audited: usize,
    /// Requests whose effect may or may not be stored (no answer, or a 503
    /// counted as unknown).
    pub(crate) unknown: usize,
}

/// Runs every check on a finished load (`database_down`: the database went
/// away during it, see [`check_dags`]) and asserts the load ran.
pub(crate) async fn check_all(
    pool: &PgPool,
    ledger: &Ledger,
    (base, at_stop): (&[i64], &[AtStop]),
    (armed, follow_ups): (&[String], u32),
    database_down: bool,
) -> Checked {
    let acked_events = check_sessions(pool, ledger, base, at_stop).await;
    let messages = check_transcripts(pool, ledger).await;
    let fired = check_heartbeats(pool, armed, follow_ups).await;
    let dags = check_dags(pool, ledger, database_down).await;
    let audited = check_audit(pool, ledger).await;
    assert!(
        acked_events >= MIN_SESSION_EVENTS,
        "the load ran: {acked_events} session events acknowledged, fewer than {MIN_SESSION_EVENTS}"
    );
    assert!(
        ledger.acked_replies.len() >= MIN_REPLIES,
        "the load ran: {} replies acknowledged, fewer than {MIN_REPLIES}",
        ledger.acked_replies.len()
    );
    assert!(
        dags.inputs >= MIN_FLOW_INPUTS,
        "the load ran: {} flow inputs stored, fewer than {MIN_FLOW_INPUTS}",
        dags.inputs
    );
    let unknown = ledger.unknown_events.values().map(Vec::len).sum::<usize>()
        + ledger.unknown_replies.len()
        + ledger
            .flows
            .values()
            .map(|f| f.unknown_inputs.len())
            .sum::<usize>();
    Checked {
        acked_events,
        messages,
        fired,
        dags,
        audited,
        unknown,
    }
}
