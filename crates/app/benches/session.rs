//! Session machine benchmarks: `cargo xtask bench session [core|replay|adoption|pg|sweep] [--smoke]`.
//!
//! - core: a fixed pseudo-random mix of events on one session in memory, ns
//!   per event: through the state's own operations (a tick, then the event)
//!   and through `Machine::decide` (the same, plus the audit transitions, the
//!   report and the next deadline).
//! - replay: the recorded conformance traces
//!   (`crates/core/tests/conformance/session_state_fsm.jsonl`) replayed
//!   through `SessionState` and, in the same run, through the reference
//!   (autoplay-sdk 0.13.0, in a virtual environment this benchmark makes
//!   under `target/reference-py/`, running `replay/autoplay_session.py`):
//!   ns per step with and without the snapshot round trips, one snapshot
//!   round trip (encode to JSON text, decode), and the ratios. The traces
//!   are parsed and compiled to operations before any timing.
//! - adoption: the adoption snapshots' round trip (encode to JSON text,
//!   decode it) through the typed codec and, side by side in the same run,
//!   through the value-tree codec it replaced, on realistic records (see
//!   `adoption/mod.rs`); the results also as `report_row` rows.
//! - pg: events per second through the service (`apply_event`, the executor
//!   path the routes take: catalog, load, decide, commit) and the PostgreSQL
//!   store with 16 concurrent clients, next to `pgbench -N -c 16` on the same
//!   server.
//! - sweep: the time to sweep 10,000 due sessions stored among 1,000,000,
//!   against 10,000 among 10,000 (the deadline index, not a scan).
//!
//! `--smoke` shrinks every size, to check the benchmark itself runs. Each
//! part also prints its table as `@bench-row` lines (`common::report_row`)
//! for `cargo xtask bench all`.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a benchmark reports on stdout

mod adoption;
mod common;
mod replay;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parlance_app::auth::ApiKeys;
use parlance_app::execute::ServiceError;
use parlance_app::session::{SWEEP_BATCH, apply_event, sweep_once};
use parlance_app::{AppState, Components};
use parlance_core::session::{
    ConversationEvent, SessionCommand, SessionEvent, SessionId, SessionKey, SessionState,
    TourCatalog,
};
use parlance_core::{Machine, ProductId, Timestamp};
use parlance_ports::ManualClock;

use crate::common::{Rng, drop_database, pgbench, report_row};

/// One event of the mix, as the core and the service see it.
#[derive(Clone)]
enum Ev {
    Tick,
    Proactive,
    Reactive,
    User,
    Click,
    Reaction,
    TourStep,
    Guidance(bool, Option<&'static str>),
    Link(ConversationEvent, &'static str),
}

fn mix(rng: &mut Rng) -> Ev {
    match rng.below(100) {
        0..20 => Ev::Tick,
        20..30 => Ev::Proactive,
        30..35 => Ev::Reactive,
        35..55 => Ev::User,
        55..65 => Ev::Click,
        65..75 => Ev::Reaction,
        75..85 => Ev::TourStep,
        85..90 => Ev::Guidance(true, Some(["flow_0", "flow_1"][rng.below(2) as usize])),
        90..95 => Ev::Guidance(false, None),
        _ => Ev::Link(
            if rng.below(2) == 0 {
                ConversationEvent::New
            } else {
                ConversationEvent::ReplyExisting
            },
            ["conv-1", "conv-2"][rng.below(2) as usize],
        ),
    }
}

fn as_service_event(ev: &Ev) -> SessionEvent {
    match ev {
        Ev::Tick | Ev::User => SessionEvent::UserMessage,
        Ev::Proactive => SessionEvent::ProactiveTrigger {
            trigger_id: "bench".to_owned(),
        },
        Ev::Reactive => SessionEvent::OpenChat,
        Ev::Click => SessionEvent::OptionClick,
        Ev::Reaction => SessionEvent::Reaction,
        Ev::TourStep => SessionEvent::TourStep,
        Ev::Guidance(active, tour) => SessionEvent::VisualGuidance {
            active: *active,
            tour_id: tour.map(str::to_owned),
        },
        Ev::Link(event, id) => SessionEvent::ConversationLinked {
            event: *event,
            conversation_id: (*id).to_owned(),
        },
    }
}

fn tours() -> TourCatalog {
    TourCatalog::from_value(&serde_json::json!({
        "tours": [
            {"id": "chip_0", "user_tour_id": "flow_0", "interaction_timeout_s": 40.0},
            {"id": "chip_1", "user_tour_id": "flow_1", "cooldown_period_s": 30.0},
        ]
    }))
    .expect("catalog")
}

fn t0() -> Timestamp {
    ManualClock::START
}

/// The command the machine decides for one event of the mix.
fn as_command(ev: &Ev) -> SessionCommand {
    match ev {
        Ev::Tick => SessionCommand::Tick,
        Ev::User => SessionEvent::UserMessage.into(),
        other => as_service_event(other).into(),
    }
}

/// Median and best of five rounds of `step` over `script`, in ns per item.
fn rounds<T>(
    script: &[(T, i64)],
    mut step: impl FnMut(&mut SessionState, &T, Timestamp) -> bool,
) -> (f64, f64) {
    let fresh = SessionState::new(
        ProductId::parse("bench").expect("id"),
        SessionId::parse("s").expect("id"),
        t0(),
    );
    let mut rounds = Vec::new();
    for _ in 0..5 {
        let mut s = fresh.clone();
        let mut now = t0();
        let mut changes = 0u64;
        let start = Instant::now();
        for (item, dt) in script {
            now = Timestamp::from_micros(now.as_micros() + dt).expect("in range");
            changes += u64::from(step(&mut s, item, now));
        }
        let elapsed = start.elapsed();
        std::hint::black_box((&s, changes));
        rounds.push(elapsed.as_nanos() as f64 / script.len() as f64);
    }
    rounds.sort_by(f64::total_cmp);
    (rounds[0], rounds[rounds.len() / 2])
}

const CORE_COLUMNS: &[&str] = &[
    "path",
    "events",
    "best ns/event",
    "median ns/event",
    "M events/s (median)",
];

fn core_row(path: &str, events: usize, best: f64, median: f64) {
    report_row(
        "session core",
        CORE_COLUMNS,
        &[
            path.to_owned(),
            events.to_string(),
            format!("{best:.1}"),
            format!("{median:.1}"),
            format!("{:.1}", 1_000.0 / median),
        ],
    );
}

fn bench_core(events: usize) {
    let mut rng = Rng(0x5eed_1234_abcd_ef01);
    let script: Vec<(Ev, i64)> = (0..events)
        .map(|_| (mix(&mut rng), rng.below(8_000_000) as i64)) // up to 8 s between events
        .collect();
    let tours = tours();
    // The state's own operations, as the session machine was measured
    // before it had one `decide`: a tick, then the event.
    let (best, median) = rounds(&script, |s, ev, now| {
        let t = s.tick(now, &tours);
        let r = match ev {
            Ev::Tick => Ok(t),
            Ev::Proactive => s.transition_to_proactive("bench", now),
            Ev::Reactive => s.transition_to_reactive(now),
            Ev::User => Ok(s.record_user_interaction(now)),
            Ev::Click => Ok(s.record_option_click(now)),
            Ev::Reaction => Ok(s.record_reaction(now)),
            Ev::TourStep => Ok(s.record_tour_step(now)),
            Ev::Guidance(a, tour) => Ok(s.set_visual_guidance(*a, *tour, now)),
            Ev::Link(e, id) => s.on_conversation_linked(*e, id),
        };
        let changed = matches!(&r, Ok(o) if o.changed_state());
        std::hint::black_box(&r);
        changed
    });
    println!(
        "core: {events} events (tick + event), ns/event best {best:.1}, median {median:.1}; {:.1} M events/s (median)",
        1_000.0 / median
    );
    core_row("state operations (tick + event)", events, best, median);
    // The same mix through the protocol: `decide` also builds the audit
    // transitions, the report and the next deadline the service stores.
    let commands: Vec<(SessionCommand, i64)> = script
        .iter()
        .map(|(ev, dt)| (as_command(ev), *dt))
        .collect();
    let (best, median) = rounds(&commands, |s, command, now| {
        let d = s.decide(&tours, command, now);
        let changed = matches!(&d, Ok(d) if !d.transitions.is_empty());
        std::hint::black_box(&d);
        changed
    });
    println!(
        "core: {events} events (decide: tick + event, audit, deadline), ns/event best {best:.1}, median {median:.1}; {:.1} M events/s (median)",
        1_000.0 / median
    );
    core_row(
        "decide (tick + event, audit, deadline)",
        events,
        best,
        median,
    );
}

async fn bench_pg(clients: usize, secs: u64) {
    let Some(pool) = parlance_postgres::testing::test_pool().await else {
        println!("pg: skipped, DATABASE_URL is not set");
        return;
    };
    let app = AppState::postgres(pool.clone(), ApiKeys::new());
    let product = ProductId::parse("bench").expect("id");
    app.sessions
        .tours
        .put(&product, &tours())
        .await
        .expect("tours");
    let done = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let run_for = Duration::from_secs(secs);
    let warmup = Duration::from_secs(2);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (app, product, done, refused) =
            (app.clone(), product.clone(), done.clone(), refused.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(0x1234_5678 + c as u64 * 7919);
            loop {
                let elapsed = start.elapsed();
                if elapsed >= warmup + run_for {
                    break;
                }
                let sid = SessionId::parse(format!("c{c}-s{}", rng.below(64))).expect("id");
                let key = SessionKey::new(product.clone(), sid);
                let ev = as_service_event(&mix(&mut rng));
                let ok = match apply_event(&app.sessions, &key, ev).await {
                    Ok(_) => true,
                    Err(ServiceError::Refused { .. }) => false,
                    Err(e) => panic!("event failed: {e}"),
                };
                if elapsed >= warmup {
                    done.fetch_add(1, Ordering::Relaxed);
                    refused.fetch_add(u64::from(!ok), Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("client");
    }
    let n = done.load(Ordering::Relaxed);
    let ours = n as f64 / run_for.as_secs_f64();
    println!(
        "pg: {clients} clients, {secs} s: {n} events ({} refused as not allowed), {ours:.0} events/s",
        refused.load(Ordering::Relaxed)
    );
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
        "session pg",
        &[
            "clients",
            "seconds",
            "events",
            "refused",
            "parlance events/s",
            "pgbench -N tps",
            "ratio parlance / pgbench",
        ],
        &[
            clients.to_string(),
            secs.to_string(),
            n.to_string(),
            refused.load(Ordering::Relaxed).to_string(),
            format!("{ours:.0}"),
            theirs,
            ratio,
        ],
    );
}

/// One sweep measured: the time to sweep, the time loading took, and the
/// access path of the claim query.
struct Swept {
    took: Duration,
    load: Duration,
    plan: String,
}

/// Stores `total` sessions of which `due` are past their deadline, then
/// times sweeping them all.
async fn sweep_case(total: usize, due: usize) -> Option<Swept> {
    let pool = parlance_postgres::testing::test_pool().await?;
    let clock = Arc::new(ManualClock::at(t0()));
    let mut components = Components::postgres(pool.clone(), ApiKeys::new());
    components.clock = clock.clone();
    let app = components.build();
    let product = ProductId::parse("bench").expect("id");
    let template = |proactive: bool| {
        let mut s = SessionState::new(product.clone(), SessionId::parse("x").expect("id"), t0());
        if proactive {
            s.transition_to_proactive("bench", t0()).expect("proactive");
        }
        s.to_snapshot()
    };
    let insert = "INSERT INTO sessions (product_id, session_id, version, next_deadline, snapshot) \
         SELECT 'bench', $1 || i, 1, $2, jsonb_set($3::jsonb, '{session_id}', to_jsonb($1 || i)) \
         FROM generate_series(1, $4) AS i";
    let deadline = |secs: f64| {
        let t = t0().plus_seconds(secs).as_micros();
        time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(t) * 1_000).expect("time")
    };
    let loaded = Instant::now();
    let idle = (total - due) / 2;
    let later = total - due - idle;
    for (prefix, n, at, proactive) in [
        ("due-", due, Some(deadline(20.0)), true),
        ("idle-", idle, None, false),
        ("later-", later, Some(deadline(86_400.0)), true),
    ] {
        if n == 0 {
            continue;
        }
        sqlx::query(insert)
            .bind(prefix)
            .bind(at)
            .bind(template(proactive))
            .bind(n as i64)
            .execute(&pool)
            .await
            .expect("bulk insert");
    }
    sqlx::query("VACUUM ANALYZE sessions")
        .execute(&pool)
        .await
        .expect("analyze");
    // Flush the bulk load now, so no checkpoint of it runs inside the timing.
    sqlx::query("CHECKPOINT")
        .execute(&pool)
        .await
        .expect("checkpoint");
    let load_time = loaded.elapsed();
    let plan: Vec<String> = sqlx::query_scalar(
        "EXPLAIN SELECT product_id, session_id FROM sessions WHERE next_deadline <= $1 \
         ORDER BY next_deadline, product_id, session_id LIMIT 500 FOR UPDATE SKIP LOCKED",
    )
    .bind(deadline(100.0))
    .fetch_all(&pool)
    .await
    .expect("explain");
    let access = plan
        .iter()
        .find(|l| l.contains("Index"))
        .or_else(|| plan.iter().find(|l| l.contains("Scan")))
        .map_or("?", |l| l.trim_start_matches([' ', '-', '>']))
        .to_owned();
    println!("sweep: {total} stored, claim plan: {access}");
    clock.set(t0().plus_seconds(100.0));
    let start = Instant::now();
    let mut swept = 0;
    loop {
        let r = sweep_once(&app.sessions, SWEEP_BATCH).await.expect("sweep");
        assert_eq!(r.transitions, r.claimed, "every due session times out");
        if r.claimed == 0 {
            break;
        }
        swept += r.claimed;
    }
    let took = start.elapsed();
    assert_eq!(swept, due, "swept exactly the due sessions");
    drop_database(pool).await;
    Some(Swept {
        took,
        load: load_time,
        plan: access,
    })
}

async fn bench_sweep(due: usize, big: usize) {
    let Some(small_case) = sweep_case(due, due).await else {
        println!("sweep: skipped, DATABASE_URL is not set");
        return;
    };
    let Some(large_case) = sweep_case(big, due).await else {
        return;
    };
    let (small, large, load) = (small_case.took, large_case.took, large_case.load);
    println!(
        "sweep: {due} due among {due}: {:.2} s ({:.0} us/session); {due} due among {big}: {:.2} s \
         (loading took {:.0} s); ratio {:.2}",
        small.as_secs_f64(),
        small.as_secs_f64() * 1e6 / due as f64,
        large.as_secs_f64(),
        load.as_secs_f64(),
        large.as_secs_f64() / small.as_secs_f64()
    );
    for (stored, case) in [(due, &small_case), (big, &large_case)] {
        report_row(
            "session sweep",
            &[
                "due",
                "stored",
                "claim plan",
                "sweep s",
                "us/session",
                "loading s",
                "ratio to due among due",
            ],
            &[
                due.to_string(),
                stored.to_string(),
                case.plan.clone(),
                format!("{:.2}", case.took.as_secs_f64()),
                format!("{:.0}", case.took.as_secs_f64() * 1e6 / due as f64),
                format!("{:.0}", case.load.as_secs_f64()),
                format!("{:.2}", case.took.as_secs_f64() / small.as_secs_f64()),
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
        .filter(|a| matches!(*a, "core" | "replay" | "adoption" | "pg" | "sweep"))
        .collect();
    let wants = |name: &str| picked.is_empty() || picked.contains(&name);
    if wants("core") {
        bench_core(if smoke { 20_000 } else { 2_000_000 });
    }
    if wants("replay") {
        replay::bench_replay(if smoke { 2 } else { 15 });
    }
    if wants("adoption") {
        let (rounds, n) = if smoke { (3, 200) } else { (21, 4_000) };
        adoption::bench_adoption(rounds, n);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    if wants("pg") {
        rt.block_on(bench_pg(16, if smoke { 2 } else { 10 }));
    }
    if wants("sweep") {
        let (due, big) = if smoke {
            (200, 2_000)
        } else {
            (10_000, 1_000_000)
        };
        rt.block_on(bench_sweep(due, big));
    }
}
