//! Conversation benchmarks: `cargo xtask bench conversation [pg|timers] [--smoke]`.
//!
//! - pg: commands per second through the executor on the PostgreSQL store
//!   with 16 clients (contact replies, operator sends, pauses and resumes,
//!   agent turns and sends: each a load and one commit), next to
//!   `pgbench -N -c 16`.
//! - timers: 10,000 due heartbeats among 1,000,000 stored instances fired by
//!   the sweeper (firings per second), and the time to find nothing due with
//!   10,000 and with 1,000,000 instances stored (it must not grow).
//!
//! `--smoke` shrinks every size, to check the benchmark itself runs. Each
//! part also prints its table as `@bench-row` lines (`common::report_row`)
//! for `cargo xtask bench all`.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a benchmark reports on stdout

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parlance_app::auth::ApiKeys;
use parlance_app::conversation::sweep_once;
use parlance_app::execute::Executor;
use parlance_app::{AppState, Components};
use parlance_core::conversation::{
    ContactId, ConversationCommand as C, ConversationContext, ConversationKey,
    ConversationState as S, Instance, InstanceId, NewInstance,
};
use parlance_core::{Machine as _, ProductId, Timestamp};
use parlance_ports::ManualClock;
use parlance_postgres::PgPool;

use crate::common::{Rng, drop_database, pgbench, report_row};

fn t0() -> Timestamp {
    Timestamp::from_secs(1_767_225_600).expect("in range")
}

fn new_instance(product: &ProductId, n: u64, interval_s: u64) -> NewInstance {
    NewInstance {
        product_id: product.clone(),
        instance_id: InstanceId::from_uuid(uuid::Uuid::from_u128(u128::from(n) + 1)),
        contact_id: ContactId::parse(format!("+1{n:010}")).expect("id"),
        channel: "loopback".into(),
        objective: "book a demo".into(),
        todos: vec![],
        heartbeat_interval_s: interval_s,
        max_follow_ups: 5,
        metadata: serde_json::Map::new(),
    }
}

/// One step of the mix, chosen from the instance's state as loaded, so
/// every command is accepted (each client has instances of its own).
fn next_command(i: &Instance, roll: u64) -> C {
    let text = |t: &str| t.to_owned();
    match i.state {
        S::Created | S::WaitingForAgent => C::BeginAgentTurn,
        S::Active => C::AgentSend {
            text: text("Which day suits you?"),
            next_heartbeat_s: None,
        },
        S::WaitingForReply => match roll % 10 {
            0..=4 => C::ContactReply {
                text: text("Maybe Tuesday?"),
            },
            5..=7 => C::OperatorSend {
                text: text("A human here: Tuesday works."),
            },
            _ => C::Pause,
        },
        S::Paused => C::Resume,
        _ => C::ContactReply {
            text: text("hello?"),
        },
    }
}

async fn bench_pg(clients: usize, per_client: u64, secs: u64) {
    let Some(pool) = parlance_postgres::testing::test_pool().await else {
        println!("pg: skipped, DATABASE_URL is not set");
        return;
    };
    let app = AppState::postgres(pool.clone(), ApiKeys::new());
    let product = ProductId::parse("bench").expect("id");
    for n in 0..(clients as u64 * per_client) {
        parlance_app::conversation::create(&app.conversations, new_instance(&product, n, 1800))
            .await
            .expect("create");
    }
    let done = Arc::new(AtomicU64::new(0));
    let warmup = Duration::from_secs(2);
    let run_for = Duration::from_secs(secs);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients as u64 {
        let (app, product, done) = (app.clone(), product.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(0x9e37_79b9 + c * 7919);
            loop {
                let elapsed = start.elapsed();
                if elapsed >= warmup + run_for {
                    break;
                }
                let n = c * per_client + rng.below(per_client);
                let key = ConversationKey {
                    product_id: product.clone(),
                    instance_id: InstanceId::from_uuid(uuid::Uuid::from_u128(u128::from(n) + 1)),
                };
                let roll = rng.next();
                let executor =
                    Executor::new(app.conversations.store.as_ref(), app.shared.clock.as_ref());
                let ctx = ConversationContext::default();
                executor
                    .run_with(&key, &ctx, |loaded| {
                        let command = loaded.map(|s| next_command(&s.state, roll));
                        async move { Ok(command) }
                    })
                    .await
                    .expect("the mix only sends commands the state allows");
                if elapsed >= warmup {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("client");
    }
    let n = done.load(Ordering::Relaxed);
    let ours = n as f64 / run_for.as_secs_f64();
    println!("pg: {clients} clients, {secs} s: {n} commands, {ours:.0} commands/s");
    drop_database(pool).await;
    let (theirs, ratio) = match pgbench(clients, secs).await {
        Ok(tps) => {
            println!(
                "pgbench -N -c {clients} -j 2 -T {secs}: {tps:.0} tps; ratio ours/pgbench = {:.2}",
                ours / tps
            );
            (format!("{tps:.0}"), format!("{:.2}", ours / tps))
        }
        Err(e) => {
            println!("pgbench: not run: {e}");
            ("not run".to_owned(), "-".to_owned())
        }
    };
    report_row(
        "conversation pg",
        &[
            "clients",
            "seconds",
            "commands",
            "parlance commands/s",
            "pgbench -N tps",
            "ratio parlance / pgbench",
        ],
        &[
            clients.to_string(),
            secs.to_string(),
            n.to_string(),
            format!("{ours:.0}"),
            theirs,
            ratio,
        ],
    );
}

/// Stores `total` instances waiting for a reply, `due` of them with a
/// heartbeat due at `t0 + 60 s` and the rest due in a day, in bulk SQL.
async fn seed(pool: &PgPool, app: &AppState, product: &ProductId, total: u64, due: u64) {
    // One real instance, so the stored record has exactly the shape the
    // store writes; the others are copies with their own ids and timers.
    let new = new_instance(product, 0, 60);
    let free = ConversationContext::default();
    let mut template = Instance::create(&new.key(), &free, &C::Create(new), t0())
        .expect("valid")
        .expect("created")
        .0;
    template
        .decide(&free, &C::BeginAgentTurn, t0())
        .expect("begin");
    let hello = C::AgentSend {
        text: "hello".into(),
        next_heartbeat_s: None,
    };
    template.decide(&free, &hello, t0()).expect("send");
    let record = serde_json::to_value(&template).expect("record");
    sqlx::query(
        "INSERT INTO conversation_instances (product_id, instance_id, contact_id, state, \
         holds_contact, version, heartbeat_due_at, created_at, record) \
         SELECT $1, id, contact, 'WAITING_FOR_REPLY', true, 3, due, $2, \
                jsonb_set(jsonb_set(jsonb_set($3::jsonb, '{instance_id}', to_jsonb(id::text)), \
                          '{contact_id}', to_jsonb(contact)), \
                          '{heartbeat_due_at}', to_jsonb(extract(epoch FROM due)::float8)) \
         FROM (SELECT ('00000000-0000-0000-0000-' || lpad(to_hex(g), 12, '0'))::uuid AS id, \
                      '+2' || lpad(g::text, 10, '0') AS contact, \
                      CASE WHEN g <= $4 THEN $2 + interval '60 seconds' ELSE $2 + interval '1 day' END AS due \
               FROM generate_series(1, $5) AS g) AS s",
    )
    .bind(product.as_str())
    .bind(time::OffsetDateTime::from_unix_timestamp(t0().as_micros() / 1_000_000).expect("time"))
    .bind(record)
    .bind(i64::try_from(due).expect("fits"))
    .bind(i64::try_from(total).expect("fits"))
    .execute(pool)
    .await
    .expect("seed instances");
    sqlx::query("ANALYZE conversation_instances")
        .execute(pool)
        .await
        .expect("analyze");
    let _ = app;
}

/// Median time of `claim_due` when nothing is due, over `rounds` calls.
async fn nothing_due(app: &AppState, rounds: usize) -> Duration {
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        let got = app
            .conversations
            .index
            .claim_due(t0(), 100, Duration::from_secs(30))
            .await
            .expect("claim");
        times.push(start.elapsed());
        assert!(got.is_empty(), "nothing is due at t0");
    }
    times.sort();
    times[times.len() / 2]
}

async fn timers_case(total: u64, due: u64) -> Option<(Duration, Duration)> {
    let pool = parlance_postgres::testing::test_pool().await?;
    let clock = Arc::new(ManualClock::at(t0()));
    let mut components = Components::postgres(pool.clone(), ApiKeys::new());
    components.clock = clock.clone();
    let app = components.build();
    let product = ProductId::parse("bench").expect("id");
    let started = Instant::now();
    seed(&pool, &app, &product, total, due).await;
    println!(
        "timers: stored {total} instances in {:.1?}",
        started.elapsed()
    );
    let idle = nothing_due(&app, 200).await;
    clock.advance(Duration::from_secs(61));
    let start = Instant::now();
    let fired = sweep_once(&app.conversations).await.expect("sweep");
    let took = start.elapsed();
    assert_eq!(fired as u64, due, "every due heartbeat fired once");
    println!(
        "timers: {due} due among {total}: fired in {took:.2?} ({:.0} firings/s); nothing due: median {idle:.2?}",
        due as f64 / took.as_secs_f64()
    );
    drop_database(pool).await;
    Some((took, idle))
}

async fn bench_timers(due: u64, big: u64) {
    let Some((small_fire, small_idle)) = timers_case(due, due).await else {
        println!("timers: skipped, DATABASE_URL is not set");
        return;
    };
    let Some((big_fire, big_idle)) = timers_case(big, due).await else {
        return;
    };
    println!(
        "timers: nothing-due lookup with {big} stored / with {due} stored = {:.2}",
        big_idle.as_secs_f64() / small_idle.as_secs_f64()
    );
    for (stored, fire, idle) in [(due, small_fire, small_idle), (big, big_fire, big_idle)] {
        report_row(
            "conversation timers",
            &[
                "stored",
                "due",
                "fired in s",
                "firings/s",
                "nothing due: median ms",
                "nothing due: ratio to smallest",
            ],
            &[
                stored.to_string(),
                due.to_string(),
                format!("{:.2}", fire.as_secs_f64()),
                format!("{:.0}", due as f64 / fire.as_secs_f64()),
                format!("{:.3}", idle.as_secs_f64() * 1e3),
                format!("{:.2}", idle.as_secs_f64() / small_idle.as_secs_f64()),
            ],
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let smoke = args.iter().any(|a| a == "--smoke");
    let picked: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| matches!(*a, "pg" | "timers"))
        .collect();
    let wants = |name: &str| picked.is_empty() || picked.contains(&name);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    if wants("pg") {
        rt.block_on(bench_pg(16, 32, if smoke { 2 } else { 10 }));
    }
    if wants("timers") {
        let (due, big) = if smoke {
            (200, 2_000)
        } else {
            (10_000, 1_000_000)
        };
        rt.block_on(bench_timers(due, big));
    }
}
