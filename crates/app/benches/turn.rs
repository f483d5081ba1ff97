//! Turn runtime throughput on PostgreSQL, side by side with LangGraph's
//! PostgreSQL checkpointer in one run.
//!
//! Ours: a three-stage graph with no LLM over the seed-shaped state, 1
//! thread x 200 turns and 16 threads x 50 turns, each turn committed through
//! the executor on the PostgreSQL thread store, with the bytes written at
//! turn 1 and turn 200 (the turn's delta as JSON,
//! `CheckpointDelta::encoded_len`: the list entries and objects the commit
//! writes) and the tables' growth on disk per turn.
//!
//! The reference, right after ours on the same server: LangGraph 1.2.22 with
//! langgraph-checkpoint-postgres 3.2.0 (`benches/langgraph/bench.py`, pins in
//! `benches/langgraph/freeze.txt`, installed into a virtual environment under
//! `target/langgraph`), on a scratch database of its own: the same turn
//! counts, and the rows one turn adds at turn 1 and turn 200. The bench prints
//! both sides, their ratios and `/proc/loadavg` at start and end, and emits
//! the tables as result rows.
//!
//! Run with `cargo xtask bench turn` (release, `DATABASE_URL` set);
//! `cargo xtask bench turn --no-reference` leaves LangGraph out. Outside CI a
//! reference that cannot be installed (no `python3`, no network) is reported
//! and left out; under `CI` it fails the run.

mod common;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
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
use serde_json::Value;
use sqlx::{Connection as _, Executor as _};

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

/// Our side: for each load, 1 thread x 200 turns (with the tables' growth)
/// and 16 threads x 50 turns.
struct Ours {
    label: &'static str,
    one: Run,
    on_disk_per_turn: i64,
    many: Run,
}

async fn ours(pool: &parlance_postgres::PgPool) -> Vec<Ours> {
    let cp: Arc<dyn MachineStore<Checkpoint>> = Arc::new(PgCheckpointStore::new(pool.clone()));
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    // The state's own window loads the last 40 transcript entries (the
    // history window); the full load reads the whole transcript every turn.
    let modes = [
        ("windowed load (default)", SupportState::load_window()),
        ("full transcript load", LoadWindow::all()),
    ];
    out("ours: echo graph (gate -> reply -> finalize_turn), PostgreSQL thread store");
    let mut all = Vec::new();
    for (i, (label, window)) in modes.into_iter().enumerate() {
        let runner =
            Arc::new(echo::runner::<()>(Arc::clone(&cp), Arc::clone(&clock)).window(window));
        let base = i * 1000;
        let before = disk_bytes(pool).await;
        let one = run(Arc::clone(&runner), 1, TURNS, base).await;
        let after = disk_bytes(pool).await;
        report(label, 1, &one);
        let on_disk_per_turn = (after - before) / TURNS as i64;
        out(&format!(
            "{:<28} on disk (tables + indexes, all pages): {on_disk_per_turn} B per turn over the {TURNS} turns",
            ""
        ));
        let many = run(Arc::clone(&runner), THREADS, TURNS_EACH, base + 100).await;
        report(label, THREADS, &many);
        all.push(Ours {
            label,
            one,
            on_disk_per_turn,
            many,
        });
    }
    all
}

const TURNS: usize = 200;
const THREADS: usize = 16;
const TURNS_EACH: usize = 50;
/// The reference's scratch database on the same server.
const REFERENCE_DB: &str = "parlance_bench_langgraph";

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.trim().to_owned())
        .unwrap_or_else(|e| format!("unknown ({e})"))
}

fn on_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty())
}

fn bench_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("benches")
        .join("langgraph")
}

/// `target/` (the bench runs from `target/release/deps/`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the bench's path");
    exe.ancestors()
        .nth(3)
        .expect("target/release/deps/<bench>")
        .to_path_buf()
}

fn try_run(cmd: &mut Command) -> Result<(), String> {
    match cmd.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("{cmd:?} failed: {s}")),
        Err(e) => Err(format!("cannot run {cmd:?}: {e}")),
    }
}

/// The interpreter of `target/langgraph/venv`, made with `$PARLANCE_PYTHON`
/// or `python3` and given exactly the pins of `freeze.txt` (reinstalled
/// when they change).
fn reference_python() -> Result<PathBuf, String> {
    let here = target_dir().join("langgraph");
    let venv = here.join("venv");
    let python = venv.join("bin").join("python");
    let freeze = bench_dir().join("freeze.txt");
    let pins = std::fs::read_to_string(&freeze).expect("benches/langgraph/freeze.txt");
    let stamp = here.join("installed-freeze.txt");
    if !python.is_file() {
        std::fs::create_dir_all(&here).map_err(|e| format!("{}: {e}", here.display()))?;
        let interpreter = std::env::var_os("PARLANCE_PYTHON").unwrap_or_else(|| "python3".into());
        try_run(Command::new(interpreter).args(["-m", "venv"]).arg(&venv))?;
    }
    if std::fs::read_to_string(&stamp).ok().as_deref() != Some(pins.as_str()) {
        out(&format!(
            "installing langgraph 1.2.22, langgraph-checkpoint-postgres 3.2.0 and their pins into {}",
            venv.display()
        ));
        // Every package is pinned, so `--no-deps` installs exactly them.
        try_run(
            Command::new(&python)
                .args(["-m", "pip", "install", "--quiet", "--no-deps", "-r"])
                .arg(&freeze),
        )?;
        try_run(Command::new(&python).args(["-m", "pip", "check"]))?;
        std::fs::write(&stamp, &pins).map_err(|e| format!("{}: {e}", stamp.display()))?;
    }
    Ok(python)
}

/// `bench.py` on a scratch database of its own (created here, dropped
/// after): its JSON results.
async fn reference(python: &Path, extra: &[String]) -> Value {
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let mut admin = sqlx::PgConnection::connect(&url).await.expect("admin");
    admin
        .execute(format!("DROP DATABASE IF EXISTS {REFERENCE_DB} WITH (FORCE)").as_str())
        .await
        .expect("drop the reference's database");
    admin
        .execute(format!("CREATE DATABASE {REFERENCE_DB}").as_str())
        .await
        .expect("create the reference's database");
    let output = Command::new(python)
        .arg(bench_dir().join("bench.py"))
        .args(["--dsn", &common::url_for(REFERENCE_DB)])
        .args(["--parts", "single,concurrent,size"])
        .args(["--turns", &TURNS.to_string()])
        .args(["--threads", &THREADS.to_string()])
        .args(["--turns-each", &TURNS_EACH.to_string()])
        .args(extra)
        .stderr(Stdio::inherit())
        .output()
        .expect("run benches/langgraph/bench.py");
    let _ = admin
        .execute(format!("DROP DATABASE IF EXISTS {REFERENCE_DB} WITH (FORCE)").as_str())
        .await;
    assert!(
        output.status.success(),
        "benches/langgraph/bench.py failed: {}",
        output.status
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("bench.py printed no JSON result ({e}): {stdout}"))
}

/// A figure of the reference's results, if its part ran.
fn num(v: Option<&Value>, path: &[&str]) -> Option<f64> {
    path.iter().fold(v?, |v, k| &v[*k]).as_f64()
}

fn ratio(a: f64, b: f64) -> String {
    format!("{:.1}x", a / b)
}

/// The side-by-side lines and result rows.
fn compare(ours: &[Ours], lg: Option<&Value>) {
    const SPEED: &str = "Turn runtime vs LangGraph: turns/s";
    const SPEED_COLS: [&str; 5] = [
        "ours: load",
        "threads x turns",
        "ours turns/s",
        "LangGraph turns/s",
        "ours / LangGraph",
    ];
    const BYTES: &str = "Turn runtime vs LangGraph: bytes per turn";
    const BYTES_COLS: [&str; 4] = ["measure", "ours", "LangGraph", "LangGraph / ours"];
    let missing = || "not run".to_owned();
    if let Some(lg) = lg {
        let m = &lg["meta"];
        out(&format!(
            "LangGraph {} (langgraph-checkpoint {}, langgraph-checkpoint-postgres {}, psycopg {}, Python {}), durability={}; PostgreSQL {} (fsync {}, synchronous_commit {})",
            m["langgraph"].as_str().unwrap_or("?"),
            m["langgraph-checkpoint"].as_str().unwrap_or("?"),
            m["langgraph-checkpoint-postgres"].as_str().unwrap_or("?"),
            m["psycopg"].as_str().unwrap_or("?"),
            m["python"].as_str().unwrap_or("?"),
            m["durability"].as_str().unwrap_or("?"),
            m["server_version"].as_str().unwrap_or("?"),
            m["fsync"].as_str().unwrap_or("?"),
            m["synchronous_commit"].as_str().unwrap_or("?"),
        ));
    }
    for o in ours {
        for (threads, r, part) in [(1, &o.one, "single"), (THREADS, &o.many, "concurrent")] {
            let mine = r.turns as f64 / r.seconds;
            let theirs = num(lg, &[part, "turns_per_s"]);
            let shape = format!("{threads} x {}", r.turns / threads);
            if let Some(theirs) = theirs {
                out(&format!(
                    "turns/s, {shape:<8} {:<24}: ours {mine:>7.1}, LangGraph {theirs:>6.1}, ours / LangGraph {}",
                    o.label,
                    ratio(mine, theirs)
                ));
            }
            common::report_row(
                SPEED,
                &SPEED_COLS,
                &[
                    o.label.to_owned(),
                    shape,
                    format!("{mine:.1}"),
                    theirs.map_or_else(missing, |t| format!("{t:.1}")),
                    theirs.map_or_else(missing, |t| ratio(mine, t)),
                ],
            );
        }
    }
    // Bytes: ours from the default load's single-thread run.
    let o = &ours[0];
    let rows: [(&str, f64, Option<f64>); 4] = [
        (
            "written at turn 1 (ours: delta as JSON; LangGraph: octet_length of the rows' payload)",
            o.one.first_bytes as f64,
            num(lg, &["size", "turn_1", "logical"]),
        ),
        (
            "written at turn 200 (ours: delta as JSON; LangGraph: octet_length of the rows' payload)",
            o.one.last_bytes as f64,
            num(lg, &["size", "turn_last", "logical"]),
        ),
        (
            "stored at turn 200 (LangGraph: pg_column_size of the rows' payload)",
            o.one.last_bytes as f64,
            num(lg, &["size", "turn_last", "stored"]),
        ),
        (
            "on disk per turn over 200 turns (tables + indexes, pg_total_relation_size)",
            o.on_disk_per_turn as f64,
            num(lg, &["size", "on_disk_per_turn"]),
        ),
    ];
    for (what, mine, theirs) in rows {
        if let Some(theirs) = theirs {
            out(&format!(
                "bytes, {what}: ours {mine:.0} B, LangGraph {theirs:.0} B, LangGraph / ours {}",
                ratio(theirs, mine)
            ));
        }
        common::report_row(
            BYTES,
            &BYTES_COLS,
            &[
                what.to_owned(),
                format!("{mine:.0} B"),
                theirs.map_or_else(missing, |t| format!("{t:.0} B")),
                theirs.map_or_else(missing, |t| ratio(t, mine)),
            ],
        );
    }
    let added = |what| num(lg, &["size", "turn_last", what]);
    if let (Some(c), Some(b), Some(w)) = (added("checkpoints"), added("blobs"), added("writes")) {
        out(&format!(
            "LangGraph rows added at turn 200: {c} checkpoints, {b} blobs, {w} writes"
        ));
    }
    // Reading an older state and listing the history: LangGraph's side only
    // (`--reference-arg=--parts=history`).
    if let Some(h) = lg.map(|lg| &lg["history"]).filter(|h| h.is_object()) {
        out(&format!("LangGraph history of a long thread: {h}"));
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let with_reference = !args.iter().any(|a| a == "--no-reference");
    // Arguments for bench.py, e.g. `--reference-arg=--parts=single`.
    let extra: Vec<String> = args
        .iter()
        .filter_map(|a| a.strip_prefix("--reference-arg="))
        .map(str::to_owned)
        .collect();
    let start_load = loadavg();
    out(&format!("turn bench: /proc/loadavg at start: {start_load}"));
    let Some(pool) = parlance_postgres::testing::test_pool().await else {
        out("turn bench: DATABASE_URL is not set; nothing measured");
        return;
    };
    // The reference is installed before anything is measured.
    let python = if with_reference {
        match reference_python() {
            Ok(p) => Some(p),
            Err(e) if on_ci() => panic!("the LangGraph reference cannot be installed: {e}"),
            Err(e) => {
                out(&format!(
                    "LangGraph reference: not run, it cannot be installed: {e} (CI=true makes this an error)"
                ));
                None
            }
        }
    } else {
        out("LangGraph reference: left out (--no-reference)");
        None
    };
    let ours = ours(&pool).await;
    common::drop_database(pool).await;
    let lg = match &python {
        Some(python) => {
            out(
                "LangGraph: the same turns on its PostgreSQL checkpointer (benches/langgraph/bench.py)",
            );
            Some(reference(python, &extra).await)
        }
        None => None,
    };
    compare(&ours, lg.as_ref());
    let end_load = loadavg();
    out(&format!("turn bench: /proc/loadavg at end: {end_load}"));
    common::report_row(
        "Turn runtime vs LangGraph: load",
        &["when", "/proc/loadavg"],
        &["start".to_owned(), start_load],
    );
    common::report_row(
        "Turn runtime vs LangGraph: load",
        &["when", "/proc/loadavg"],
        &["end".to_owned(), end_load],
    );
}
