//! Turn runtime throughput on PostgreSQL: a three-stage graph with no LLM
//! over the seed-shaped state, 1 thread x 200 turns and 16 threads x 50
//! turns, each turn committed through the executor on the PostgreSQL thread
//! store, with the bytes written at turn 1 and turn 200 (the turn's delta as
//! JSON, `CheckpointDelta::encoded_len`: the list entries and objects the
//! commit writes) and the tables' growth on disk per turn.
//!
//! Run with `cargo xtask bench turn` (release, `DATABASE_URL` set).

use std::io::Write as _;
use std::sync::Arc;
use std::time::Instant;

use parlance_app::turn::{TurnRunner, echo};
use parlance_core::ProductId;
use parlance_core::turn::Checkpoint;
use parlance_core::turn::seed::{Channel, SupportInput, SupportLoaded, SupportState};
use parlance_core::turn::{
    EpisodicEntry, LoadWindow, MemoryEntry, OwnerId, SemanticEntry, ThreadId, ThreadKey,
    TurnState as _, WorkingMemoryEntry,
};
use parlance_ports::{Clock, MachineStore, SystemClock};
use parlance_postgres::PgCheckpointStore;

fn out(line: &str) {
    let _ = writeln!(std::io::stdout(), "{line}");
}

fn key(thread: usize) -> ThreadKey {
    ThreadKey {
        product_id: ProductId::parse("bench").expect("product"),
        owner: OwnerId::parse(format!("user-{thread}")).expect("owner"),
        thread: ThreadId::parse(format!("thread-{thread}")).expect("thread"),
    }
}

/// A user message of about 400 bytes, as in the reference measurement.
fn message(turn: usize) -> String {
    let mut m = format!("Turn {turn}: ");
    while m.len() < 400 {
        m.push_str("I keep worrying about work and my boss, and I can't sleep well at night. ");
    }
    m.truncate(400);
    m
}

fn input(thread: usize, turn: usize) -> SupportInput {
    SupportInput {
        message: message(turn),
        channel: Channel::Web,
        user_id: Some(format!("user-{thread}")),
        session_id: Some(format!("thread-{thread}")),
        installed_skills: vec!["grounding".to_owned(), "journaling".to_owned()],
    }
}

/// About 1.2 KB of working memory, loaded (never checkpointed).
fn loaded() -> SupportLoaded {
    let mut working_memory = Vec::new();
    for i in 0..4 {
        working_memory.push(WorkingMemoryEntry::Entry(MemoryEntry::Semantic(
            SemanticEntry {
                category: "relationship".to_owned(),
                subject: "User".to_owned(),
                predicate: "WORRIES_ABOUT".to_owned(),
                object: format!("work topic {i}"),
                evidence_quote: Some("my boss is terrible and I can't switch off".to_owned()),
            },
        )));
        working_memory.push(WorkingMemoryEntry::Entry(MemoryEntry::Episodic(
            EpisodicEntry {
                summary: "talked about loss after my dog died and how evenings feel empty."
                    .to_owned(),
                primary_themes: vec!["grief".to_owned()],
                is_catch_up: false,
                approach_used: Some("grief_support".to_owned()),
                approach_context: None,
            },
        )));
    }
    SupportLoaded {
        working_memory,
        procedural_rules: vec!["keep replies short".to_owned()],
        proactive_recall_enabled: true,
    }
}

struct Run {
    turns: usize,
    seconds: f64,
    first_bytes: usize,
    last_bytes: usize,
    retries: u32,
}

async fn run(
    runner: Arc<TurnRunner<SupportState, ()>>,
    threads: usize,
    turns: usize,
    offset: usize,
) -> Run {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..threads {
        let runner = Arc::clone(&runner);
        tasks.push(tokio::spawn(async move {
            let (mut first, mut last, mut retries) = (0, 0, 0);
            for n in 1..=turns {
                let r = runner
                    .run(&(), &key(offset + t), input(offset + t, n), loaded())
                    .await
                    .expect("turn");
                if n == 1 {
                    first = r.bytes_written;
                }
                last = r.bytes_written;
                retries += r.attempts - 1;
            }
            (first, last, retries)
        }));
    }
    let mut result = Run {
        turns: threads * turns,
        seconds: 0.0,
        first_bytes: 0,
        last_bytes: 0,
        retries: 0,
    };
    for t in tasks {
        let (first, last, retries) = t.await.expect("task");
        result.first_bytes = first;
        result.last_bytes = last;
        result.retries += retries;
    }
    result.seconds = started.elapsed().as_secs_f64();
    result
}

fn report(label: &str, threads: usize, r: &Run) {
    out(&format!(
        "{label:<28} {threads:>2} thread(s) x {:>3} turns: {:>7.1} turns/s  ({:.2} s, {} retries)  bytes written (delta as JSON): turn 1 {} B, last turn {} B",
        r.turns / threads,
        r.turns as f64 / r.seconds,
        r.seconds,
        r.retries,
        r.first_bytes,
        r.last_bytes,
    ));
}

/// Checkpoint tables' total size on disk, indexes and TOAST included.
async fn disk_bytes(pool: &parlance_postgres::PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT pg_total_relation_size('turn_list_entry') + pg_total_relation_size('turn_thread')",
    )
    .fetch_one(pool)
    .await
    .expect("relation sizes")
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let Some(pool) = parlance_postgres::testing::test_pool().await else {
        out("turn bench: DATABASE_URL is not set; nothing measured");
        return;
    };
    let cp: Arc<dyn MachineStore<Checkpoint>> = Arc::new(PgCheckpointStore::new(pool.clone()));
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    // The state's own window loads the last 40 transcript entries (the
    // history window); the full load reads the whole transcript every turn.
    let modes = [
        ("windowed load (default)", SupportState::load_window()),
        ("full transcript load", LoadWindow::all()),
    ];
    out("turn bench: echo graph (gate -> reply -> finalize_turn), PostgreSQL thread store");
    for (i, (label, window)) in modes.into_iter().enumerate() {
        let runner =
            Arc::new(echo::runner::<()>(Arc::clone(&cp), Arc::clone(&clock)).window(window));
        let base = i * 1000;
        let before = disk_bytes(&pool).await;
        let one = run(Arc::clone(&runner), 1, 200, base).await;
        let after = disk_bytes(&pool).await;
        report(label, 1, &one);
        out(&format!(
            "{:<28} on disk (tables + indexes, all pages): {} B per turn over the 200 turns",
            "",
            (after - before) / 200
        ));
        let many = run(Arc::clone(&runner), 16, 50, base + 100).await;
        report(label, 16, &many);
    }
}
