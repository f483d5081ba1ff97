//! Turn runtime throughput and history reads on PostgreSQL, side by side
//! with LangGraph's PostgreSQL checkpointer in one run.
//!
//! Ours: a three-stage graph with no LLM over the seed-shaped state, 1
//! thread x 200 turns and 16 threads x 50 turns, each turn committed through
//! the executor on the PostgreSQL thread store, with the JSON payload a turn
//! writes at turn 1 and turn 200 (its list entries, its objects patch into
//! the thread's head row and again as its history row's patch, and the
//! history's copy of the objects, amortised over the checkpoints that share
//! one) and the thread tables' growth on disk per turn, history included.
//! Then the history part: one thread of 1,000 turns (`--long-turns=N`)
//! written through the same runner, the state at its middle checkpoint read
//! with `Checkpointer::load_at` and its whole history listed with
//! `Checkpointer::history`, page by page, each timed several times (median
//! and p95).
//!
//! The reference, right after ours on the same server: LangGraph 1.2.22 with
//! langgraph-checkpoint-postgres 3.2.0 (`benches/langgraph/bench.py`, pins in
//! `benches/langgraph/freeze.txt`, installed into a virtual environment under
//! `target/langgraph`), on a scratch database of its own: the same turn
//! counts, the rows one turn adds at turn 1 and turn 200, and its history
//! part (`aget_state` by checkpoint id at the middle turn, `aget_state_history`
//! of the whole thread) on a thread of the same length. The bench prints
//! both sides, their ratios and `/proc/loadavg` at start and end, and emits
//! the tables as result rows.
//!
//! Run with `cargo xtask bench turn` (release, `DATABASE_URL` set);
//! `cargo xtask bench turn --no-reference` leaves LangGraph out, and
//! `--reference-arg=ARG` passes `ARG` to `bench.py` (e.g.
//! `--reference-arg=--lists=1`). Outside CI a reference that cannot be
//! installed (no `python3`, no network) is reported and left out; under `CI`
//! it fails the run.

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
    DEFAULT_SNAPSHOT_EVERY, EpisodicEntry, LoadWindow, MemoryEntry, OwnerId, SemanticEntry,
    ThreadId, ThreadKey, TurnState as _, WorkingMemoryEntry,
};
use parlance_ports::{Checkpointer, Clock, HistoryPage, MachineStore, SystemClock};
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

/// The thread tables' total size on disk (the head rows, the list entries
/// and the history), indexes and TOAST included.
async fn disk_bytes(pool: &parlance_postgres::PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT pg_total_relation_size('turn_list_append') + pg_total_relation_size('turn_thread') \
         + pg_total_relation_size('turn_checkpoint')",
    )
    .fetch_one(pool)
    .await
    .expect("relation sizes")
}

/// What one turn wrote as JSON payload, from the rows of its checkpoint:
/// `octet_length` of the values as text (as on LangGraph's side), and their
/// `pg_column_size` as stored.
#[derive(Debug, Clone, Copy, Default)]
struct Written {
    /// The list entries it appended (`turn_list_append.entries`).
    entries: i64,
    /// The objects it replaced (`turn_checkpoint.patch`, the same JSON the
    /// commit patches into the head row).
    patch: i64,
    /// The latest full copy of the objects at or before its checkpoint
    /// (`turn_checkpoint.snapshot`).
    copy: i64,
    /// The same three, as stored.
    stored: [i64; 3],
}

impl Written {
    /// The turn's JSON payload: its entries, its objects patch twice (into
    /// the head row and as the history row's patch) and the copy of the
    /// objects: whole at turn 1 (a thread's first checkpoint always holds
    /// one), else amortised over the [`DEFAULT_SNAPSHOT_EVERY`] checkpoints
    /// that share one.
    fn total(&self, turn: usize) -> f64 {
        Self::sum(self.entries, self.patch, self.copy, turn)
    }

    /// [`Written::total`] as stored.
    fn stored_total(&self, turn: usize) -> f64 {
        let [entries, patch, copy] = self.stored;
        Self::sum(entries, patch, copy, turn)
    }

    fn sum(entries: i64, patch: i64, copy: i64, turn: usize) -> f64 {
        let copy = if turn == 1 {
            copy as f64
        } else {
            copy as f64 / DEFAULT_SNAPSHOT_EVERY as f64
        };
        (entries + 2 * patch) as f64 + copy
    }

    /// `entries + 2 x patch + copy` spelled out.
    fn breakdown(&self, turn: usize) -> String {
        let copy = if turn == 1 {
            format!("{} B (turn 1 writes the first copy whole)", self.copy)
        } else {
            format!(
                "{} B / {DEFAULT_SNAPSHOT_EVERY} (one copy every {DEFAULT_SNAPSHOT_EVERY} checkpoints)",
                self.copy
            )
        };
        format!(
            "list entries {} B + objects patch {} B x 2 (head row, history row) + copy of the objects {copy} = {:.0} B",
            self.entries,
            self.patch,
            self.total(turn)
        )
    }
}

/// What the turn that made checkpoint `version` of `thread` wrote.
async fn written(pool: &parlance_postgres::PgPool, thread: &ThreadKey, version: usize) -> Written {
    const WHERE: &str = "product_id = $1 AND owner_id = $2 AND thread_id = $3";
    let sql = format!(
        "SELECT \
           (SELECT coalesce(sum(octet_length(entries::text)), 0) FROM turn_list_append \
             WHERE {WHERE} AND version = $4)::bigint AS entries, \
           (SELECT coalesce(sum(pg_column_size(entries)), 0) FROM turn_list_append \
             WHERE {WHERE} AND version = $4)::bigint AS entries_stored, \
           coalesce((SELECT octet_length(patch::text) FROM turn_checkpoint \
             WHERE {WHERE} AND version = $4), 0)::bigint AS patch, \
           coalesce((SELECT pg_column_size(patch) FROM turn_checkpoint \
             WHERE {WHERE} AND version = $4), 0)::bigint AS patch_stored, \
           coalesce((SELECT octet_length(snapshot::text) FROM turn_checkpoint \
             WHERE {WHERE} AND version <= $4 AND snapshot IS NOT NULL \
             ORDER BY version DESC LIMIT 1), 0)::bigint AS copy, \
           coalesce((SELECT pg_column_size(snapshot) FROM turn_checkpoint \
             WHERE {WHERE} AND version <= $4 AND snapshot IS NOT NULL \
             ORDER BY version DESC LIMIT 1), 0)::bigint AS copy_stored"
    );
    let row: (i64, i64, i64, i64, i64, i64) = sqlx::query_as(&sql)
        .bind(thread.product_id.as_str())
        .bind(thread.owner.as_str())
        .bind(thread.thread.as_str())
        .bind(i64::try_from(version).expect("a version"))
        .fetch_one(pool)
        .await
        .expect("the turn's rows");
    let (entries, entries_stored, patch, patch_stored, copy, copy_stored) = row;
    assert!(
        entries > 0 && patch > 0 && copy > 0,
        "turn {version} wrote no rows: {row:?}"
    );
    Written {
        entries,
        patch,
        copy,
        stored: [entries_stored, patch_stored, copy_stored],
    }
}

/// Our side: for each load, 1 thread x 200 turns (with the tables' growth)
/// and 16 threads x 50 turns.
struct Ours {
    label: &'static str,
    one: Run,
    on_disk_per_turn: i64,
    many: Run,
    /// What the single thread's turn 1 and turn 200 wrote.
    first: Written,
    last: Written,
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
            "{:<28} on disk (turn_thread + turn_list_append + turn_checkpoint, indexes, all pages): {on_disk_per_turn} B per turn over the {TURNS} turns",
            ""
        ));
        let first = written(pool, &key(base), 1).await;
        let last = written(pool, &key(base), TURNS).await;
        for (turn, w) in [(1, &first), (TURNS, &last)] {
            out(&format!(
                "{:<28} JSON payload written by turn {turn}: {}",
                "",
                w.breakdown(turn)
            ));
        }
        let many = run(Arc::clone(&runner), THREADS, TURNS_EACH, base + 100).await;
        report(label, THREADS, &many);
        all.push(Ours {
            label,
            one,
            on_disk_per_turn,
            many,
            first,
            last,
        });
    }
    all
}

/// Timings' median and p95 (nearest rank), in milliseconds.
#[derive(Debug, Clone, Copy)]
struct Spread {
    n: usize,
    median: f64,
    p95: f64,
}

impl Spread {
    fn of(seconds: &[f64]) -> Self {
        let mut ms: Vec<f64> = seconds.iter().map(|s| s * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        let n = ms.len();
        assert!(n > 0, "no timings");
        let median = if n % 2 == 1 {
            ms[n / 2]
        } else {
            (ms[n / 2 - 1] + ms[n / 2]) / 2.0
        };
        let rank = (95 * n).div_ceil(100).max(1);
        Self {
            n,
            median,
            p95: ms[rank - 1],
        }
    }

    /// The spread in a LangGraph result (`{"n", "median_ms", "p95_ms"}`).
    fn from_json(v: &Value) -> Option<Self> {
        Some(Self {
            n: usize::try_from(v["n"].as_u64()?).ok()?,
            median: v["median_ms"].as_f64()?,
            p95: v["p95_ms"].as_f64()?,
        })
    }
}

/// Our side of the history part: a thread of `turns` turns written
/// through the same runner as the turn runs, the state at its middle
/// checkpoint read [`READS`] times, and its whole history listed [`LISTS`]
/// times, [`PAGE`] checkpoints a page.
struct History {
    turns: usize,
    at: u64,
    build_seconds: f64,
    on_disk: i64,
    load_at: Spread,
    listed: usize,
    pages: usize,
    listing: Spread,
}

/// The long thread's turns unless `--long-turns=N` says otherwise.
const LONG_TURNS: usize = 1000;
/// Reads of the state at the middle checkpoint.
const READS: usize = 50;
/// Listings of the whole history.
const LISTS: usize = 20;
/// Checkpoints a page of the history listing.
const PAGE: usize = 100;

async fn history(pool: &parlance_postgres::PgPool, turns: usize) -> History {
    let store = Arc::new(PgCheckpointStore::new(pool.clone()));
    let cp: Arc<dyn MachineStore<Checkpoint>> = store.clone();
    let runner = echo::runner::<()>(cp, Arc::new(SystemClock));
    let n = 5000;
    let thread = key(n);
    let before = disk_bytes(pool).await;
    let started = Instant::now();
    for turn in 1..=turns {
        runner
            .run(&(), &thread, input(n, turn), loaded())
            .await
            .expect("turn");
    }
    let build_seconds = started.elapsed().as_secs_f64();
    let on_disk = disk_bytes(pool).await - before;
    let at = (turns / 2) as u64;

    let mut reads = Vec::new();
    for _ in 0..READS {
        let started = Instant::now();
        let state = store.load_at(&thread, at).await.expect("load_at");
        reads.push(started.elapsed().as_secs_f64());
        let state = state.expect("the middle checkpoint");
        assert_eq!(state.version, at);
        assert_eq!(
            state.lists.get("transcript").map(Vec::len),
            Some(2 * turns / 2),
            "the transcript as of checkpoint {at}"
        );
    }

    let mut listings = Vec::new();
    let (mut listed, mut pages) = (0, 0);
    for _ in 0..LISTS {
        let started = Instant::now();
        let mut all = Vec::with_capacity(turns);
        pages = 0;
        loop {
            let before = all
                .last()
                .map(|m: &parlance_core::turn::CheckpointMeta| m.version);
            let page = store
                .history(
                    &thread,
                    HistoryPage {
                        before,
                        limit: PAGE,
                    },
                )
                .await
                .expect("history");
            pages += 1;
            let full = page.len() == PAGE;
            all.extend(page);
            if !full {
                break;
            }
        }
        listings.push(started.elapsed().as_secs_f64());
        let versions: Vec<u64> = all.iter().map(|m| m.version).collect();
        assert_eq!(versions, (1..=turns as u64).rev().collect::<Vec<_>>());
        listed = all.len();
    }
    History {
        turns,
        at,
        build_seconds,
        on_disk,
        load_at: Spread::of(&reads),
        listed,
        pages,
        listing: Spread::of(&listings),
    }
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
async fn reference(python: &Path, long_turns: usize, extra: &[String]) -> Value {
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
        .args(["--parts", "single,concurrent,size,history"])
        .args(["--turns", &TURNS.to_string()])
        .args(["--threads", &THREADS.to_string()])
        .args(["--turns-each", &TURNS_EACH.to_string()])
        .args(["--long-turns", &long_turns.to_string()])
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
fn compare(ours: &[Ours], history: &History, lg: Option<&Value>) {
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
    out(
        "bytes written are the JSON payload of the rows a turn writes (ours: its list entries, its objects patch into the head row and again as its history row's patch, and the history's periodic copy of the objects; LangGraph: its checkpoints, blobs and writes)",
    );
    let rows: [(&str, f64, Option<f64>); 4] = [
        (
            "written at turn 1 (octet_length of the payload; ours: entries + objects patch x 2 + the first copy of the objects)",
            o.first.total(1),
            num(lg, &["size", "turn_1", "logical"]),
        ),
        (
            "written at turn 200 (octet_length of the payload; ours: entries + objects patch x 2 + the copy of the objects / 32)",
            o.last.total(TURNS),
            num(lg, &["size", "turn_last", "logical"]),
        ),
        (
            "stored at turn 200 (pg_column_size of the same payload)",
            o.last.stored_total(TURNS),
            num(lg, &["size", "turn_last", "stored"]),
        ),
        (
            "on disk per turn over 200 turns (all the thread tables with indexes, pg_total_relation_size; ours: turn_thread, turn_list_append, turn_checkpoint)",
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
    compare_history(
        history,
        lg.map(|lg| &lg["history"]).filter(|h| h.is_object()),
    );
}

/// The history part side by side: reading the state at the middle
/// checkpoint and listing the whole history, then the long thread itself.
fn compare_history(h: &History, lg: Option<&Value>) {
    const READS_TABLE: &str = "Turn runtime vs LangGraph: reading a long thread's history";
    const READS_COLS: [&str; 6] = [
        "measure",
        "ours median",
        "ours p95",
        "LangGraph median",
        "LangGraph p95",
        "LangGraph / ours (median)",
    ];
    const THREAD_TABLE: &str = "Turn runtime vs LangGraph: the long thread";
    const THREAD_COLS: [&str; 3] = ["measure", "ours", "LangGraph"];
    let missing = || "not run".to_owned();
    let lg_turns = lg.and_then(|v| v["turns"].as_u64());
    let lg_at = lg.and_then(|v| v["state_at_turn"].as_u64());
    let lg_entries = lg.and_then(|v| v["history_entries"].as_u64());
    let of = |n: Option<u64>| n.map_or_else(missing, |n| n.to_string());
    let runs = |part: &str| of(lg.and_then(|v| v[part]["n"].as_u64()));
    let reads = [
        (
            format!(
                "state at checkpoint {} of a {}-turn thread (ours: load_at, {} reads; LangGraph: aget_state by checkpoint_id at turn {} of {}, {} reads)",
                h.at,
                h.turns,
                h.load_at.n,
                of(lg_at),
                of(lg_turns),
                runs("state_at"),
            ),
            h.load_at,
            lg.and_then(|v| Spread::from_json(&v["state_at"])),
        ),
        (
            format!(
                "whole history (ours: history, {} checkpoints in {} pages of up to {PAGE}, {} listings; LangGraph: aget_state_history, {} checkpoints, {} listings)",
                h.listed,
                h.pages,
                h.listing.n,
                of(lg_entries),
                runs("history"),
            ),
            h.listing,
            lg.and_then(|v| Spread::from_json(&v["history"])),
        ),
    ];
    for (what, mine, theirs) in reads {
        let cell = |s: Option<Spread>, f: fn(&Spread) -> f64| {
            s.map_or_else(missing, |s| format!("{:.2} ms", f(&s)))
        };
        out(&format!(
            "history, {what}: ours median {:.2} ms, p95 {:.2} ms; LangGraph {}",
            mine.median,
            mine.p95,
            theirs.map_or_else(missing, |t| format!(
                "median {:.2} ms, p95 {:.2} ms, LangGraph / ours {}",
                t.median,
                t.p95,
                ratio(t.median, mine.median)
            )),
        ));
        common::report_row(
            READS_TABLE,
            &READS_COLS,
            &[
                what,
                format!("{:.2} ms", mine.median),
                format!("{:.2} ms", mine.p95),
                cell(theirs, |s| s.median),
                cell(theirs, |s| s.p95),
                theirs.map_or_else(missing, |t| ratio(t.median, mine.median)),
            ],
        );
    }
    let lg_num = |k: &str| lg.and_then(|v| v[k].as_f64());
    let thread = [
        (
            "turns written".to_owned(),
            h.turns.to_string(),
            of(lg_turns),
        ),
        (
            "time to write them".to_owned(),
            format!("{:.1} s", h.build_seconds),
            lg_num("build_seconds").map_or_else(missing, |s| format!("{s:.1} s")),
        ),
        (
            "on disk after them (ours: growth of the thread tables; LangGraph: its three tables)"
                .to_owned(),
            format!("{:.1} MB", h.on_disk as f64 / 1e6),
            lg_num("on_disk_bytes").map_or_else(missing, |b| format!("{:.1} MB", b / 1e6)),
        ),
    ];
    for (what, mine, theirs) in thread {
        out(&format!(
            "long thread, {what}: ours {mine}, LangGraph {theirs}"
        ));
        common::report_row(THREAD_TABLE, &THREAD_COLS, &[what, mine, theirs]);
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
    // The long thread of the history part, on both sides.
    let long_turns = args
        .iter()
        .find_map(|a| a.strip_prefix("--long-turns="))
        .map_or(LONG_TURNS, |n| n.parse().expect("--long-turns=N"));
    assert!(long_turns >= 2, "--long-turns must be at least 2");
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
    out(&format!(
        "ours: history of one thread of {long_turns} turns (same runner, default load)"
    ));
    let history = history(&pool, long_turns).await;
    common::drop_database(pool).await;
    let lg = match &python {
        Some(python) => {
            out(
                "LangGraph: the same turns on its PostgreSQL checkpointer (benches/langgraph/bench.py)",
            );
            Some(reference(python, long_turns, &extra).await)
        }
        None => None,
    };
    compare(&ours, &history, lg.as_ref());
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
