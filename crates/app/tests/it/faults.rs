//! Faults: two `parlance serve` and two `parlance worker` processes on one
//! PostgreSQL database, loaded with session events, conversation replies
//! and flow events whose task DAGs run on the workers, while conversations
//! with one-second heartbeats come due; one server and one worker are
//! killed (SIGKILL) mid-load and restarted. The fault must hit live work:
//! the server is killed with requests open on it, the worker while it holds
//! leases, and the restarted server must acknowledge requests again
//! ([`MIN_IN_FLIGHT`], [`MIN_ACKED_AFTER_RESTART`]). Afterwards nothing
//! acknowledged is lost or doubled:
//!
//! - per session, every event is accounted for by its own identity and
//!   version: each acknowledged one took its own version after the load
//!   began, versions nobody acknowledged are no more than the events whose
//!   answer was lost with the killed server, and the stored record is the
//!   last event's ([`crate::load::check_sessions`]);
//! - every acknowledged reply is in its transcript exactly once (an
//!   unanswered one at most once);
//! - every agent turn queued by a reply ran to completion (the killed
//!   worker's tasks were taken over) and no outbound message was delivered
//!   twice;
//! - every DAG run completed exactly once, and each flow session reflects
//!   each of its runs once ([`crate::load::check_dags`]);
//! - no heartbeat fired twice ([`crate::load::check_heartbeats`] says what
//!   a firing leaves behind);
//! - the audit log has no gaps ([`crate::load::check_audit`] says what a
//!   gap is).
//!
//! `PARLANCE_FAULT_SECS` sets the length of each load phase (default 2);
//! the conversations with heartbeats get that many follow-ups (at least 2),
//! so their heartbeats keep firing through the kill.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use parlance_postgres::testing::test_pool;

use crate::load::{
    Checked, Ledger, Load, abandoned, arm_heartbeats, check_all, create_conversations, drained,
    free_port, open_sessions, ready, session_versions, spawn_server, spawn_worker,
};
use crate::support::{url_for, wait_until};

/// Conversations with heartbeats armed in each batch.
const ARMED: usize = 4;

/// Requests open on the killed server at the kill, at least. Ten clients
/// (half the session and reply clients, half the flow clients) start on
/// it and each keeps a request open nearly all the time; a kill with
/// fewer than this open hit an idle server and proves little.
const MIN_IN_FLIGHT: usize = 4;

/// Requests the restarted server acknowledges in the last phase, at least.
/// The ten clients starting on it acknowledged about 115 in a two-second
/// phase on a shared two-core machine; thirty shows it serves again, not
/// one lucky request, with room for a slower machine.
const MIN_ACKED_AFTER_RESTART: usize = 30;

/// How long to wait for the killed worker to hold a lease before the kill.
const LEASE_WAIT: Duration = Duration::from_secs(30);

fn phase() -> Duration {
    Duration::from_secs(
        std::env::var("PARLANCE_FAULT_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_servers_and_workers_lose_nothing_acknowledged() {
    let Some(pool) = test_pool().await else {
        return;
    };
    let started = Instant::now();
    let url = url_for(&pool);
    let ports = [free_port(), free_port()];
    let mut servers = [spawn_server(&url, ports[0]), spawn_server(&url, ports[1])];
    // The first worker registers alone, so its id is known: its leases
    // are what the kill must interrupt.
    let first = spawn_worker(&url);
    wait_until(
        "the first worker to register",
        Duration::from_secs(60),
        || async { worker_ids(&pool).await.len() == 1 },
    )
    .await;
    let killed_worker = worker_ids(&pool).await[0];
    let mut workers = [first, spawn_worker(&url)];
    let client = reqwest::Client::new();
    for p in ports {
        ready(&client, p).await;
    }
    // The sessions start in the reactive state; the conversations exist.
    let base = open_sessions(&client, ports[0]).await;
    let ids = create_conversations(&client, ports[1]).await;
    let follow_ups = u32::try_from(phase().as_secs().max(2)).unwrap();
    let mut armed = arm_heartbeats(&client, ports[1], 1, ARMED, follow_ups).await;
    let load = Load {
        ports: ports.to_vec(),
        conversations: Arc::new(ids),
        ledger: Arc::new(Mutex::new(Ledger::default())),
        refused_is_unknown: false,
        stop: Arc::default(),
    };

    // Load; kill a server and a worker in the middle of it; load on.
    let loading = tokio::spawn({
        let load = load.clone();
        let until = Instant::now() + phase() * 2;
        async move { load.run(until, 0).await }
    });
    tokio::time::sleep(phase()).await;
    // Stop the worker (SIGSTOP) at an instant it holds leases, and kill it
    // stopped.
    let deadline = Instant::now() + LEASE_WAIT;
    let held = loop {
        workers[0].signal("STOP");
        let held = leases(&pool, killed_worker).await;
        if held > 0 {
            break held;
        }
        workers[0].signal("CONT");
        assert!(
            Instant::now() < deadline,
            "the first worker held no lease in {LEASE_WAIT:?} of load"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    // Kill the server with the ledger locked, so the requests counted
    // open on it are those open at the kill.
    let (in_flight, unanswered_before) = {
        let ledger = load.ledger.lock().unwrap();
        servers[0].kill();
        (
            ledger.in_flight.get(&ports[0]).copied().unwrap_or(0),
            ledger.unanswered_by.get(&ports[0]).copied().unwrap_or(0),
        )
    };
    // Killed while stopped holding leases (the loop above fails the test
    // when it never does). How many are still its own at the kill is not
    // fixed: a statement sent before the stop may still finish, and its
    // leases go stale and are recovered.
    workers[0].kill();
    loading.await.unwrap();
    let unanswered = load
        .ledger
        .lock()
        .unwrap()
        .unanswered_by
        .get(&ports[0])
        .copied()
        .unwrap_or(0)
        - unanswered_before;
    assert!(
        in_flight >= MIN_IN_FLIGHT,
        "{in_flight} requests open on the server at the kill, fewer than {MIN_IN_FLIGHT}"
    );
    assert!(
        unanswered >= MIN_IN_FLIGHT,
        "{unanswered} requests unanswered by the killed server, fewer than {MIN_IN_FLIGHT}"
    );

    // Restart them, arm more heartbeats and load again.
    servers[0] = spawn_server(&url, ports[0]);
    workers[0] = spawn_worker(&url);
    ready(&client, ports[0]).await;
    armed.extend(arm_heartbeats(&client, ports[0], 2, ARMED, follow_ups).await);
    let acked_before = acked_by(&load, ports[0]);
    load.run(Instant::now() + phase(), 1).await;
    let at_stop = session_versions(&pool).await;
    let acked_after_restart = acked_by(&load, ports[0]) - acked_before;
    assert!(
        acked_after_restart >= MIN_ACKED_AFTER_RESTART,
        "the restarted server acknowledged {acked_after_restart} requests, \
         fewer than {MIN_ACKED_AFTER_RESTART}"
    );

    // Every armed conversation runs out of follow-ups; every queued task
    // finishes, the killed worker's included.
    let guard = Duration::from_secs(120 + 2 * u64::from(follow_ups));
    abandoned(&pool, &armed, guard).await;
    drained(&pool, Duration::from_secs(120)).await;
    for c in servers.iter_mut().chain(workers.iter_mut()) {
        c.kill();
    }

    let ledger = std::mem::take(&mut *load.ledger.lock().unwrap());
    let Checked {
        acked_events,
        messages,
        fired,
        dags,
        audited,
        unknown,
    } = check_all(
        &pool,
        &ledger,
        (&base, &at_stop),
        (&armed, follow_ups),
        false,
    )
    .await;
    let line = format!(
        "faults: {:.0} s; killed with {in_flight} requests open ({unanswered} unanswered) \
         and {held} leases held; {acked_after_restart} requests acknowledged after the restart; \
         {acked_events} session events, {} replies and {} flow events acknowledged, \
         {unknown} unanswered (server killed), {messages} messages stored; {} flow inputs ran {} DAGs \
         ({} nodes, each once; progress exact on {} chains, {} chains re-ran a node); \
         {} heartbeats fired once each on {} conversations; {audited} audit entries, no gap, \
         {} acknowledged transitions among them",
        started.elapsed().as_secs_f64(),
        ledger.acked_replies.len(),
        ledger.flow_events,
        dags.inputs,
        dags.runs,
        dags.nodes,
        dags.exact_chains,
        dags.retried_chains,
        fired,
        armed.len(),
        ledger.transitions.values().map(Vec::len).sum::<usize>(),
    );
    std::fs::write(
        std::env::temp_dir().join("parlance-faults-summary.txt"),
        line,
    )
    .unwrap();
}

/// The registered workers' ids.
async fn worker_ids(pool: &sqlx::PgPool) -> Vec<uuid::Uuid> {
    sqlx::query_scalar("SELECT id FROM workers ORDER BY started_at")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Tasks running under a lease `worker` holds.
async fn leases(pool: &sqlx::PgPool, worker: uuid::Uuid) -> usize {
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = 1 AND leased_by = $1")
        .bind(worker)
        .fetch_one(pool)
        .await
        .unwrap();
    usize::try_from(n).unwrap()
}

/// Requests `port` acknowledged so far.
fn acked_by(load: &Load, port: u16) -> usize {
    load.ledger
        .lock()
        .unwrap()
        .acked_by
        .get(&port)
        .copied()
        .unwrap_or(0)
}
