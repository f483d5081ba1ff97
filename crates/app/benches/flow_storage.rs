//! Bytes a flow stores per user event, at event 1 and at event 200 of one
//! session, with 10 KB inputs, on both adapters.
//!
//! The flow is user -> invoker -> user: each event starts a task graph (an
//! invoker node and the completion node) run by a worker in this process,
//! whose invoker answers a fixed-size text (a model's answer does not grow
//! with the prompt). Each event is run to its answer before it is measured.
//!
//! - PostgreSQL: the growth of `pg_column_size` summed over the product's
//!   rows in `jobs`, `dag_runs`, `dag_nodes`, `dag_edges`, `flow_sessions`,
//!   `flow_dialogue` and `flow_progress` across the event: what the event
//!   left stored (the session row counts by its change in size).
//! - Memory: the growth across the event of the JSON bytes the stores hold
//!   for the product: the queue's payloads and results
//!   (`TaskQueue::footprint`) and the session record with its dialogue
//!   serialised. Per-row bookkeeping (keys, states, times) is not counted.
//!
//! Run with `cargo xtask bench flow-storage` (release, `DATABASE_URL` set).
//! Each adapter's figures are also printed as a `@bench-row` line
//! (`common::report_row`) for `cargo xtask bench all`.

#![allow(clippy::print_stdout, missing_docs)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parlance_app::Components;
use parlance_app::auth::ApiKeys;
use parlance_app::flow::{FlowCatalog, Invoker};
use parlance_app::worker::WorkerConfig;
use parlance_core::ProductId;
use parlance_core::flow::{ClientEvent, FlowBuilder, FlowKey, TemplateRef};

const EVENTS: usize = 200;
const INPUT_BYTES: usize = 10_000;

/// Answers a fixed-size digest of the prompt.
struct Digest;

#[async_trait]
impl Invoker for Digest {
    async fn invoke(&self, rendered: &str) -> Result<String, String> {
        let sum = rendered
            .bytes()
            .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
        Ok(format!("digest {sum:016x}"))
    }
}

fn components(mut c: Components) -> Components {
    let mut flows = FlowCatalog::new();
    flows.insert(
        FlowBuilder::new("storage")
            .template("ask.j2", "Ask.")
            .template("prompt.j2", "Answer this: {{ actor_input }}")
            .template("answer.j2", "{{ actor_input }}")
            .user_state("ask", "ask.j2")
            .invoker_state("think", TemplateRef::Name("prompt.j2".into()), "digest")
            .user_state("answer", "answer.j2")
            .on("user_input", "ask", "think")
            .on("advance", "think", "answer")
            .on("user_input", "answer", "think")
            .build()
            .expect("a valid flow"),
    );
    c.flows = flows;
    let mut invokers: BTreeMap<String, Arc<dyn Invoker>> = BTreeMap::new();
    invokers.insert("digest".into(), Arc::new(Digest));
    c.invokers = invokers;
    c
}

/// `INPUT_BYTES` of lowercase letters from a xorshift generator, so the
/// store's compression cannot hide a copy.
fn input(seed: u64) -> String {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..INPUT_BYTES)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'a' + u8::try_from(x % 26).expect("a letter"))
        })
        .collect()
}

/// Where the bytes are counted.
enum Store {
    Memory,
    Postgres(sqlx::PgPool),
}

/// What the stores hold for `key`'s product and session now, in bytes.
async fn stored(store: &Store, state: &parlance_app::AppState, key: &FlowKey) -> i64 {
    match store {
        Store::Memory => {
            let queue = state
                .shared
                .queue
                .footprint(&key.product_id)
                .await
                .expect("footprint");
            let flows = state.flows.store();
            let session = flows.session(key).await.expect("session").expect("stored");
            let dialogue = flows.dialogue(key).await.expect("dialogue");
            let bytes = queue.payload_bytes
                + queue.result_bytes
                + json_len(&session.state)
                + json_len(&dialogue);
            i64::try_from(bytes).expect("in range")
        }
        Store::Postgres(pool) => {
            let mut total = 0;
            for (table, filter) in [
                ("jobs", "product_id = $1"),
                ("dag_runs", "product_id = $1"),
                ("dag_nodes", "product_id = $1"),
                ("dag_edges", "product_id = $1"),
                ("flow_sessions", "product_id = $1 AND session_id = $2"),
                ("flow_dialogue", "product_id = $1 AND session_id = $2"),
                ("flow_progress", "product_id = $1 AND session_id = $2"),
            ] {
                let bytes: i64 = sqlx::query_scalar(&format!(
                    "SELECT coalesce(sum(pg_column_size(t.*)), 0)::int8 FROM {table} t \
                     WHERE {filter} AND $2 = $2"
                ))
                .bind(key.product_id.as_str())
                .bind(key.session_id.as_str())
                .fetch_one(pool)
                .await
                .expect("measure");
                total += bytes;
            }
            total
        }
    }
}

/// A value's size as compact JSON text.
fn json_len<T: serde::Serialize>(v: &T) -> u64 {
    serde_json::to_vec(v).map_or(0, |b| b.len() as u64)
}

/// Runs `EVENTS` events, each to its answer; returns the bytes stored by
/// event 1 and by event `EVENTS`.
async fn run(c: Components, store: Store) -> (i64, i64) {
    let state = components(c).build();
    let worker = state.worker(WorkerConfig::default());
    let svc = state.flows.clone();
    let product = ProductId::parse("bench").expect("product");
    let flow = svc.catalog().get("storage").expect("the flow");
    let sid = svc
        .start_session(&product, &flow)
        .await
        .expect("start")
        .session_id;
    let key = FlowKey::new(product.clone(), sid.parse().expect("a session id"));
    let mut per_event = Vec::with_capacity(EVENTS);
    for n in 0..EVENTS {
        let before = stored(&store, &state, &key).await;
        svc.event(
            &key,
            &flow,
            ClientEvent::parse("user_input"),
            &input(n as u64 + 1),
        )
        .await
        .expect("event");
        loop {
            worker.step().await.expect("step");
            let polled = svc.poll(&key, &flow).await.expect("poll");
            if polled.next_actions != ["poll"] {
                assert_eq!(polled.error, None, "the event's graph failed");
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        per_event.push(stored(&store, &state, &key).await - before);
    }
    (per_event[0], per_event[EVENTS - 1])
}

fn report(adapter: &str, (first, last): (i64, i64)) {
    #[allow(clippy::cast_precision_loss)]
    let ratio = |b: i64| b as f64 / INPUT_BYTES as f64;
    println!(
        "{adapter}: bytes stored by event 1: {first} ({:.2}x the input); by event {EVENTS}: {last} ({:.2}x)",
        ratio(first),
        ratio(last)
    );
    let by_last = format!("bytes stored by event {EVENTS}");
    let last_ratio = format!("event {EVENTS} / input");
    common::report_row(
        "flow storage",
        &[
            "adapter",
            "input bytes",
            "bytes stored by event 1",
            "event 1 / input",
            &by_last,
            &last_ratio,
        ],
        &[
            adapter.to_owned(),
            INPUT_BYTES.to_string(),
            first.to_string(),
            format!("{:.2}x", ratio(first)),
            last.to_string(),
            format!("{:.2}x", ratio(last)),
        ],
    );
}

#[tokio::main]
async fn main() {
    report(
        "memory",
        run(Components::memory(ApiKeys::new()), Store::Memory).await,
    );
    let Some(pool) = parlance_postgres::testing::test_pool().await else {
        println!("flow-storage bench: DATABASE_URL is not set; PostgreSQL not measured");
        return;
    };
    report(
        "postgres",
        run(
            Components::postgres(pool.clone(), ApiKeys::new()),
            Store::Postgres(pool),
        )
        .await,
    );
}
