//! Faults: two `parlance serve` and two `parlance worker` processes on one
//! PostgreSQL database, loaded with session events, conversation replies
//! and flow events whose task DAGs run on the workers, while conversations
//! with one-second heartbeats come due; one server and one worker are
//! killed (SIGKILL) mid-load and restarted. Afterwards nothing acknowledged
//! is lost or doubled:
//!
//! - per session, acknowledged events took distinct versions, and the final
//!   version counts every acknowledged event plus at most the requests
//!   whose answer was lost with the killed server;
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
use crate::support::url_for;

/// Conversations with heartbeats armed in each batch.
const ARMED: usize = 4;

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
    let mut workers = [spawn_worker(&url), spawn_worker(&url)];
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
    servers[0].kill();
    workers[0].kill();
    loading.await.unwrap();

    // Restart them, arm more heartbeats and load again.
    servers[0] = spawn_server(&url, ports[0]);
    workers[0] = spawn_worker(&url);
    ready(&client, ports[0]).await;
    armed.extend(arm_heartbeats(&client, ports[0], 2, ARMED, follow_ups).await);
    load.run(Instant::now() + phase(), 1).await;
    let at_stop = session_versions(&pool).await;

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
        "faults: {:.0} s; {acked_events} session events, {} replies and {} flow events acknowledged, \
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
