//! Flow throughput on PostgreSQL: user events per second (user -> user),
//! invoker round trips per second (user -> invoker -> user with the
//! `template` invoker, run in process), 16 sessions in parallel, and the
//! bytes one turn writes at turn 1 and at turn 200 of one session.
//!
//! Every call goes through the flow service as the routes make it: each
//! event a command run by the executor (load, decide, one commit).
//!
//! Run with `cargo xtask bench flow` (release, `DATABASE_URL` set).

#![allow(clippy::print_stdout, missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use parlance_app::Components;
use parlance_app::auth::ApiKeys;
use parlance_app::flow::{FlowCatalog, FlowService};
use parlance_core::ProductId;
use parlance_core::flow::{ClientEvent, Flow, FlowBuilder, FlowKey, TemplateRef};
use sqlx::Row as _;

const SESSIONS: usize = 16;
const USER_EVENTS_PER_SESSION: usize = 100;
const ROUND_TRIPS_PER_SESSION: usize = 25;

fn catalog() -> FlowCatalog {
    let mut c = FlowCatalog::new();
    c.insert(
        FlowBuilder::new("chat")
            .template("a.j2", "You said: {{ actor_input }}")
            .template("b.j2", "And then: {{ actor_input }}")
            .user_state("a", "a.j2")
            .user_state("b", "b.j2")
            .on("user_input", "a", "b")
            .on("user_input", "b", "a")
            .build()
            .expect("valid flow"),
    );
    c.insert(
        FlowBuilder::new("echo")
            .template("ask.j2", "Ask.")
            .template("think.j2", "echo: {{ actor_input }}")
            .template("answer.j2", "{{ actor_input }}")
            .user_state("ask", "ask.j2")
            .invoker_state("think", TemplateRef::Name("think.j2".into()), "template")
            .user_state("answer", "answer.j2")
            .on("user_input", "ask", "think")
            .on("advance", "think", "answer")
            .on("user_input", "answer", "think")
            .build()
            .expect("valid flow"),
    );
    c
}

fn flow(svc: &FlowService, name: &str) -> Arc<Flow> {
    svc.catalog().get(name).expect("a loaded flow")
}

/// A new session of `flow`, by its key.
async fn session(svc: &FlowService, p: &ProductId, flow: &Arc<Flow>) -> FlowKey {
    let id = svc.start_session(p, flow).await.expect("start").session_id;
    FlowKey::new(p.clone(), id.parse().expect("a session id"))
}

fn user_input() -> ClientEvent {
    ClientEvent::parse("user_input")
}

async fn user_events(svc: Arc<FlowService>, p: ProductId) -> (usize, Duration) {
    let chat = flow(&svc, "chat");
    let mut keys = Vec::new();
    for _ in 0..SESSIONS {
        keys.push(session(&svc, &p, &chat).await);
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    for key in keys {
        let (svc, chat) = (svc.clone(), chat.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..USER_EVENTS_PER_SESSION {
                svc.event(&key, &chat, user_input(), &format!("message {i}"))
                    .await
                    .expect("event");
            }
        }));
    }
    for t in tasks {
        t.await.expect("join");
    }
    (SESSIONS * USER_EVENTS_PER_SESSION, started.elapsed())
}

async fn round_trips(svc: Arc<FlowService>, p: ProductId) -> (usize, Duration) {
    let echo = flow(&svc, "echo");
    let mut keys = Vec::new();
    for _ in 0..SESSIONS {
        keys.push(session(&svc, &p, &echo).await);
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    for key in keys {
        let (svc, echo) = (svc.clone(), echo.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..ROUND_TRIPS_PER_SESSION {
                svc.event(&key, &echo, user_input(), &format!("question {i}"))
                    .await
                    .expect("event");
                loop {
                    let r = svc
                        .event(&key, &echo, ClientEvent::Poll, "")
                        .await
                        .expect("poll");
                    if r.next_actions != ["poll"] {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("join");
    }
    (SESSIONS * ROUND_TRIPS_PER_SESSION, started.elapsed())
}

/// Bytes of the session row plus the dialogue rows added since `after_seq`.
async fn turn_bytes(pool: &sqlx::PgPool, id: &str, after_seq: i64) -> (i64, i64) {
    let row = sqlx::query(
        "SELECT pg_column_size(s.*)::bigint AS session_bytes, s.dialogue_len, \
         (SELECT COALESCE(SUM(pg_column_size(d.*)), 0)::bigint FROM flow_dialogue d \
          WHERE d.product_id = s.product_id AND d.session_id = s.session_id AND d.seq > $2) AS dialogue_bytes \
         FROM flow_sessions s WHERE s.session_id = $1",
    )
    .bind(id)
    .bind(after_seq)
    .fetch_one(pool)
    .await
    .expect("measure");
    let session: i64 = row.get("session_bytes");
    let dialogue: i64 = row.get("dialogue_bytes");
    (session + dialogue, row.get("dialogue_len"))
}

#[tokio::main]
async fn main() {
    let Some(pool) = parlance_postgres::testing::test_pool().await else {
        println!("flow bench: DATABASE_URL is not set; nothing measured");
        return;
    };
    let mut components = Components::postgres(pool.clone(), ApiKeys::new());
    components.flows = catalog();
    let state = components.build();
    // The DAGs run on the durable queue: a worker in this process runs them.
    let worker = state.start_worker(parlance_app::worker::WorkerConfig::default());
    let svc = state.flows.clone();
    let p = ProductId::parse("bench").expect("product");

    let (n, took) = user_events(svc.clone(), p.clone()).await;
    println!(
        "user events (user->user, {SESSIONS} sessions): {n} in {took:.2?} = {:.0}/s",
        n as f64 / took.as_secs_f64()
    );
    let (n, took) = round_trips(svc.clone(), p.clone()).await;
    println!(
        "invoker round trips (user->invoker->user, template invoker, {SESSIONS} sessions): {n} in {took:.2?} = {:.0}/s",
        n as f64 / took.as_secs_f64()
    );

    let chat = flow(&svc, "chat");
    let key = session(&svc, &p, &chat).await;
    let mut len = 1;
    for turn in 1..=200 {
        svc.event(&key, &chat, user_input(), "a message of a steady length")
            .await
            .expect("event");
        let (bytes, new_len) = turn_bytes(&pool, key.session_id.as_str(), len).await;
        if turn == 1 || turn == 200 {
            println!(
                "bytes written by turn {turn}: {bytes} (session row + {} dialogue rows)",
                new_len - len
            );
        }
        len = new_len;
    }
    worker.stop().await;
}
