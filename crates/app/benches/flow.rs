//! Flow throughput on PostgreSQL.
//!
//! In process: user events per second (user -> user), invoker round trips
//! per second (user -> invoker -> user with the `template` invoker), 16
//! sessions in parallel through the flow service, and the bytes one turn
//! writes at turn 1 and at turn 200 of one session.
//!
//! Over HTTP, side by side in one run: the release `parlance serve` on
//! PostgreSQL (started as a user starts it, with the flow in
//! `benches/flows/perf`) and genie-flow 0.12.0 under uvicorn with a Celery
//! worker (prefork, 2) on the local Redis (`benches/genie`), the same
//! one-invoker flow driven by the same closed-loop client
//! (`benches/genie/client.py`, polling every 5 ms) with 1 and 16 clients.
//! The reference is installed with the pins of `benches/genie/freeze.txt`
//! into a virtual environment under `target/genie`. A breakdown of our
//! round trip (queue waits and runs of the two nodes, from the queue's
//! rows) follows.
//!
//! Run with `cargo xtask bench flow` (release, `DATABASE_URL` set);
//! `cargo xtask bench flow --quick` measures 5 s per client count instead
//! of 30; `--no-reference` leaves genie-flow out.

#![allow(clippy::print_stdout, missing_docs)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
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

/// The key `parlance serve` is started with (it opens product `default`).
const API_KEY: &str = "pk_bench_flow";

/// How long each client count is measured, its warm-up, and the client's
/// poll interval (the reference's).
struct Load {
    duration: &'static str,
    warmup: &'static str,
    clients: [usize; 2],
}

/// One closed-loop client run, as `client.py` writes it.
#[derive(Debug, Clone, Default)]
struct ClientRun {
    rt_per_s: f64,
    median_ms: f64,
    p95_ms: f64,
    polls_per_rt: f64,
    errors: u64,
    cpu_ms_per_rt: Option<f64>,
    load: String,
}

impl ClientRun {
    fn read(path: &Path) -> Self {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let v: serde_json::Value = serde_json::from_str(&text).expect("client result JSON");
        let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
        let la = |k: &str| {
            v[k].as_array()
                .and_then(|a| a.first())
                .and_then(|x| x.as_str())
                .unwrap_or("?")
                .to_owned()
        };
        Self {
            rt_per_s: f("rt_per_s"),
            median_ms: f("lat_median_ms"),
            p95_ms: f("lat_p95_ms"),
            polls_per_rt: f("polls_per_rt"),
            errors: v["n_errors"].as_u64().unwrap_or(0),
            cpu_ms_per_rt: v["cpu_ms_per_rt_genie"].as_f64(),
            load: format!("{} -> {}", la("loadavg_start"), la("loadavg_end")),
        }
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn bench_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("benches")
}

/// `target/` (the bench runs from `target/release/deps/`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the bench's path");
    exe.ancestors()
        .nth(3)
        .expect("target/release/deps/<bench>")
        .to_path_buf()
}

fn run(cmd: &mut Command) {
    let status = cmd.status().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    assert!(status.success(), "{cmd:?} failed: {status}");
}

/// `target/genie/` holding the reference's files (copied from
/// `benches/genie`) and `venv/` with the pins of `freeze.txt`, made with
/// `$PARLANCE_PYTHON` or `python3` and reinstalled when the pins change.
fn reference_env() -> PathBuf {
    let src = bench_dir().join("genie");
    let here = target_dir().join("genie");
    std::fs::create_dir_all(here.join("templates")).expect("target/genie");
    copy_tree(&src, &here);
    let venv = here.join("venv");
    let python = venv.join("bin").join("python");
    let pins = std::fs::read_to_string(src.join("freeze.txt")).expect("freeze.txt");
    let stamp = here.join("installed-freeze.txt");
    if !python.is_file() {
        let interpreter = std::env::var_os("PARLANCE_PYTHON").unwrap_or_else(|| "python3".into());
        run(Command::new(interpreter).args(["-m", "venv"]).arg(&venv));
    }
    if std::fs::read_to_string(&stamp).ok().as_deref() != Some(pins.as_str()) {
        println!(
            "installing genie-flow 0.12.0 and its pins into {}",
            venv.display()
        );
        // Every package is pinned, so `--no-deps` installs exactly them.
        run(Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--no-deps", "-r"])
            .arg(src.join("freeze.txt")));
        run(Command::new(&python).args(["-m", "pip", "check"]));
        std::fs::write(&stamp, &pins).expect("write the stamp");
    }
    here
}

fn copy_tree(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).expect("read the bench files") {
        let entry = entry.expect("an entry");
        let dest = to.join(entry.file_name());
        if entry.file_type().expect("a type").is_dir() {
            std::fs::create_dir_all(&dest).expect("mkdir");
            copy_tree(&entry.path(), &dest);
        } else {
            std::fs::copy(entry.path(), &dest).expect("copy a bench file");
        }
    }
}

/// A `parlance serve` child, killed when dropped.
struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// The release `parlance serve` on `database_url` with the bench's flow,
/// as a user starts it (its embedded worker runs the task graphs).
fn start_serve(database_url: &str, port: u16, log: &Path) -> Serve {
    let out = std::fs::File::create(log).expect("serve log");
    let child = Command::new(env!("CARGO_BIN_EXE_parlance"))
        .args(["serve", "--bind", &format!("127.0.0.1:{port}")])
        .arg("--flows")
        .arg(bench_dir().join("flows"))
        .env("DATABASE_URL", database_url)
        .env("PARLANCE_API_KEY", API_KEY)
        .env("NO_COLOR", "1")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("log"))
        .stderr(out)
        .spawn()
        .expect("start parlance serve");
    let mut serve = Serve(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(Some(status)) = serve.0.try_wait() {
            panic!("parlance serve exited ({status}); see {}", log.display());
        }
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return serve;
        }
        assert!(Instant::now() < deadline, "parlance serve did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The closed-loop client against `port` with `clients` clients.
fn client(
    here: &Path,
    port: u16,
    clients: usize,
    load: &Load,
    label: &str,
    pid: u32,
    out: &Path,
) -> ClientRun {
    run(Command::new(here.join("venv").join("bin").join("python"))
        .current_dir(here)
        .arg("client.py")
        .args([
            "--port",
            &port.to_string(),
            "--clients",
            &clients.to_string(),
        ])
        .args(["--duration", load.duration, "--warmup", load.warmup])
        .args(["--poll-interval", "0.005", "--per-session", "10"])
        .args(["--label", label, "--pid", &format!("parlance={pid}")])
        .args(["--header", &format!("Authorization: Bearer {API_KEY}")])
        .arg("--out")
        .arg(out)
        .stdout(Stdio::null()));
    ClientRun::read(out)
}

/// genie-flow over HTTP with its Celery worker, by its own harness
/// (`bench.py redis`), for each client count.
fn reference(here: &Path, load: &Load) -> Vec<ClientRun> {
    let clients = load
        .clients
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(" ");
    run(Command::new(here.join("venv").join("bin").join("python"))
        .current_dir(here)
        .args(["bench.py", "redis"])
        .env("CLIENTS", clients)
        .env("DURATION", load.duration)
        .env("WARMUP", load.warmup)
        .env("POLL", "0.005")
        .env("PORT", free_port().to_string())
        // The machine is shared: measure now and report the load.
        .env("LOAD_LIMIT", "1000")
        .stdout(std::fs::File::create(here.join("bench-py.log")).expect("bench.py log")));
    load.clients
        .iter()
        .map(|n| ClientRun::read(&here.join("results").join(format!("redis-c{n}.json"))))
        .collect()
}

/// Medians over the runs of `product` since some time, in ms: the invoke
/// node's wait for a worker and its run (to its fenced completion), the
/// completion node's wait and its run (the session's commit included),
/// and the whole, from the run's enqueue to the completion's end.
struct Breakdown {
    runs: i64,
    invoke_wait: f64,
    invoke_run: f64,
    complete_wait: f64,
    complete_run: f64,
    whole: f64,
}

impl Breakdown {
    fn line(&self) -> String {
        format!(
            "{} runs; medians: invoke waits {:.1} ms, runs {:.1} ms; completion waits {:.1} ms, \
             runs {:.1} ms; enqueue -> completion done {:.1} ms",
            self.runs,
            self.invoke_wait,
            self.invoke_run,
            self.complete_wait,
            self.complete_run,
            self.whole
        )
    }

    /// The breakdown's columns of a result row.
    const COLUMNS: [&str; 6] = [
        "runs",
        "invoke wait ms",
        "invoke run ms",
        "completion wait ms",
        "completion run ms",
        "enqueue -> done ms",
    ];

    fn cells(&self) -> Vec<String> {
        vec![
            self.runs.to_string(),
            format!("{:.1}", self.invoke_wait),
            format!("{:.1}", self.invoke_run),
            format!("{:.1}", self.complete_wait),
            format!("{:.1}", self.complete_run),
            format!("{:.1}", self.whole),
        ]
    }
}

async fn breakdown(pool: &sqlx::PgPool, product: &str, since: time::OffsetDateTime) -> Breakdown {
    let row = sqlx::query(
        "WITH j AS (SELECT dag_run_id, kind, created_at, finished_at, \
           lease_expires_at - coalesce(timeout_ms, 300000) * interval '1 millisecond' AS claimed_at \
           FROM jobs WHERE product_id = $1 AND created_at >= $2 AND state = 2 AND attempt = 1), \
         r AS (SELECT extract(epoch FROM i.claimed_at - i.created_at) * 1000 AS i_wait, \
           extract(epoch FROM i.finished_at - i.claimed_at) * 1000 AS i_run, \
           extract(epoch FROM c.claimed_at - i.finished_at) * 1000 AS c_wait, \
           extract(epoch FROM c.finished_at - c.claimed_at) * 1000 AS c_run, \
           extract(epoch FROM c.finished_at - i.created_at) * 1000 AS whole \
           FROM j i JOIN j c ON c.dag_run_id = i.dag_run_id AND c.kind = 'flow.complete' \
           WHERE i.kind = 'flow.invoke') \
         SELECT count(*) AS n, \
           percentile_cont(0.5) WITHIN GROUP (ORDER BY i_wait) AS i_wait, \
           percentile_cont(0.5) WITHIN GROUP (ORDER BY i_run) AS i_run, \
           percentile_cont(0.5) WITHIN GROUP (ORDER BY c_wait) AS c_wait, \
           percentile_cont(0.5) WITHIN GROUP (ORDER BY c_run) AS c_run, \
           percentile_cont(0.5) WITHIN GROUP (ORDER BY whole) AS whole FROM r",
    )
    .bind(product)
    .bind(since)
    .fetch_one(pool)
    .await
    .expect("breakdown");
    let f = |k: &str| {
        row.try_get::<Option<f64>, _>(k)
            .ok()
            .flatten()
            .unwrap_or(f64::NAN)
    };
    Breakdown {
        runs: row.get::<i64, _>("n"),
        invoke_wait: f("i_wait"),
        invoke_run: f("i_run"),
        complete_wait: f("c_wait"),
        complete_run: f("c_run"),
        whole: f("whole"),
    }
}

/// A figure with one decimal, or `-` when there is none.
fn fig(x: Option<f64>) -> String {
    x.filter(|x| x.is_finite())
        .map_or_else(|| "-".to_owned(), |x| format!("{x:.1}"))
}

/// A figure with two decimals, or `-` when there is none.
fn fig2(x: Option<f64>) -> String {
    x.filter(|x| x.is_finite())
        .map_or_else(|| "-".to_owned(), |x| format!("{x:.2}"))
}

/// Transactions committed in this database so far.
async fn transactions(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(pool)
    .await
    .expect("pg_stat_database")
}

/// Ours and the reference over HTTP, side by side.
async fn over_http(pool: &sqlx::PgPool, load: &Load, with_reference: bool, in_process: f64) {
    let here = reference_env();
    let db: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(pool)
        .await
        .expect("database name");
    let port = free_port();
    let serve = start_serve(&common::url_for(&db), port, &here.join("logs-serve.log"));
    let pid = serve.0.id();
    println!(
        "$ parlance serve --bind 127.0.0.1:{port} --flows crates/app/benches/flows (PostgreSQL; pid {pid})"
    );
    // A first round trip through the worker before measuring.
    std::fs::create_dir_all(here.join("results")).expect("results dir");
    let warm = Load {
        duration: "1",
        warmup: "0",
        clients: [1, 1],
    };
    client(
        &here,
        port,
        1,
        &warm,
        "parlance warm-up",
        pid,
        &here.join("results").join("parlance-warm.json"),
    );
    let mut ours = Vec::new();
    for &n in &load.clients {
        let since = time::OffsetDateTime::now_utc();
        let xacts = transactions(pool).await;
        let out = here.join("results").join(format!("parlance-c{n}.json"));
        let r = client(
            &here,
            port,
            n,
            load,
            &format!("parlance clients={n}"),
            pid,
            &out,
        );
        // The statistics reach `pg_stat_database` within a second.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let xacts = transactions(pool).await - xacts;
        let all_rts = std::fs::read_to_string(&out)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .map_or(0.0, |v| v["round_trips"].as_f64().unwrap_or(0.0));
        println!(
            "parlance serve, {n} client(s): {:.1} round trips/s, median {:.1} ms, p95 {:.1} ms, \
             {:.2} polls per round trip, {} failed, {:.2} ms server CPU per round trip, load {}",
            r.rt_per_s,
            r.median_ms,
            r.p95_ms,
            r.polls_per_rt,
            r.errors,
            r.cpu_ms_per_rt.unwrap_or(f64::NAN),
            r.load
        );
        let parts = breakdown(pool, "default", since).await;
        println!("  breakdown: {}", parts.line());
        let window =
            load.duration.parse::<f64>().unwrap_or(1.0) + load.warmup.parse::<f64>().unwrap_or(0.0);
        let rts = all_rts * window / load.duration.parse::<f64>().unwrap_or(1.0);
        let per_rt = xacts as f64 / rts;
        println!(
            "  database transactions (statements outside a transaction count one each) per round trip: \
             {per_rt:.1} (warm-up and drain included: {xacts} over ~{rts:.0} round trips)",
        );
        let mut columns = vec!["clients"];
        columns.extend(Breakdown::COLUMNS);
        columns.push("transactions per round trip");
        let mut cells = vec![n.to_string()];
        cells.extend(parts.cells());
        cells.push(format!("{per_rt:.1}"));
        common::report_row(
            "flow: parlance serve round trip breakdown",
            &columns,
            &cells,
        );
        ours.push(r);
    }
    drop(serve);
    let theirs = if with_reference {
        reference(&here, load)
    } else {
        Vec::new()
    };
    for (n, t) in load.clients.iter().zip(&theirs) {
        println!(
            "genie-flow 0.12.0 + Celery, {n} client(s): {:.1} round trips/s, median {:.1} ms, \
             p95 {:.1} ms, {:.2} polls per round trip, {} failed, {:.2} ms server CPU per round trip, load {}",
            t.rt_per_s,
            t.median_ms,
            t.p95_ms,
            t.polls_per_rt,
            t.errors,
            t.cpu_ms_per_rt.unwrap_or(f64::NAN),
            t.load
        );
    }
    if with_reference {
        println!(
            "| clients | parlance rt/s | genie-flow rt/s | ratio (goal >= 4) | parlance median ms | genie-flow median ms |"
        );
        println!("|---|---|---|---|---|---|");
        for ((n, o), t) in load.clients.iter().zip(&ours).zip(&theirs) {
            println!(
                "| {n} | {:.1} | {:.1} | {:.2} | {:.1} | {:.1} |",
                o.rt_per_s,
                t.rt_per_s,
                o.rt_per_s / t.rt_per_s,
                o.median_ms,
                t.median_ms
            );
        }
    }
    let columns = [
        "clients",
        "parlance serve rt/s",
        "genie-flow + Celery rt/s",
        "ratio (goal >= 4)",
        "parlance median / p95 ms",
        "genie-flow median / p95 ms",
        "polls per round trip (ours / theirs)",
        "server CPU ms per round trip (ours / theirs)",
        "failed (ours / theirs)",
        "load (ours / theirs)",
    ];
    for (i, (n, o)) in load.clients.iter().zip(&ours).enumerate() {
        let t = theirs.get(i);
        let theirs_or = |f: &dyn Fn(&ClientRun) -> String| t.map_or_else(|| "-".to_owned(), f);
        let cells = [
            n.to_string(),
            fig(Some(o.rt_per_s)),
            theirs_or(&|t| fig(Some(t.rt_per_s))),
            theirs_or(&|t| fig2(Some(o.rt_per_s / t.rt_per_s))),
            format!("{} / {}", fig(Some(o.median_ms)), fig(Some(o.p95_ms))),
            theirs_or(&|t| format!("{} / {}", fig(Some(t.median_ms)), fig(Some(t.p95_ms)))),
            format!(
                "{} / {}",
                fig2(Some(o.polls_per_rt)),
                theirs_or(&|t| fig2(Some(t.polls_per_rt)))
            ),
            format!(
                "{} / {}",
                fig2(o.cpu_ms_per_rt),
                theirs_or(&|t| fig2(t.cpu_ms_per_rt))
            ),
            format!("{} / {}", o.errors, theirs_or(&|t| t.errors.to_string())),
            format!("{} / {}", o.load, theirs_or(&|t| t.load.clone())),
        ];
        common::report_row("flow: over HTTP, side by side", &columns, &cells);
    }
    if let Some(o) = ours.last() {
        println!(
            "parlance serve over HTTP, {} clients / in-process round trips: {:.1} / {:.1} = {:.2} (goal >= 0.8)",
            load.clients[1],
            o.rt_per_s,
            in_process,
            o.rt_per_s / in_process
        );
        common::report_row(
            "flow: over HTTP against in process",
            &[
                "clients",
                "parlance serve rt/s",
                "in-process rt/s",
                "ratio (goal >= 0.8)",
            ],
            &[
                load.clients[1].to_string(),
                fig(Some(o.rt_per_s)),
                fig(Some(in_process)),
                fig2(Some(o.rt_per_s / in_process)),
            ],
        );
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let with_reference = !args.iter().any(|a| a == "--no-reference");
    let load = Load {
        duration: if quick { "5" } else { "30" },
        warmup: if quick { "1" } else { "3" },
        clients: [1, 16],
    };
    let start = loadavg();
    println!(
        "flow bench: {} (load average at start {start})",
        if quick { "quick" } else { "full" },
    );
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
    let events_per_s = n as f64 / took.as_secs_f64();
    println!(
        "user events (user->user, {SESSIONS} sessions): {n} in {took:.2?} = {events_per_s:.0}/s"
    );
    let in_process_columns = ["measure", "value"];
    common::report_row(
        "flow: in process",
        &in_process_columns,
        &[
            format!("user events/s (user -> user, {SESSIONS} sessions)"),
            format!("{events_per_s:.0}"),
        ],
    );
    let since = time::OffsetDateTime::now_utc();
    let (n, took) = round_trips(svc.clone(), p.clone()).await;
    let in_process = n as f64 / took.as_secs_f64();
    println!(
        "invoker round trips in process (user->invoker->user, template invoker, {SESSIONS} sessions, \
         polling every 1 ms): {n} in {took:.2?} = {in_process:.0}/s"
    );
    let parts = breakdown(&pool, "bench", since).await;
    println!("  breakdown: {}", parts.line());
    common::report_row(
        "flow: in process",
        &in_process_columns,
        &[
            format!(
                "invoker round trips/s (template invoker, {SESSIONS} sessions, polling every 1 ms)"
            ),
            format!("{in_process:.0}"),
        ],
    );
    common::report_row(
        "flow: in process",
        &in_process_columns,
        &[
            "in process: enqueue -> completion done, median ms".to_owned(),
            format!("{:.1}", parts.whole),
        ],
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
            common::report_row(
                "flow: in process",
                &in_process_columns,
                &[
                    format!("bytes written by turn {turn} of one session"),
                    bytes.to_string(),
                ],
            );
        }
        len = new_len;
    }
    worker.stop().await;

    over_http(&pool, &load, with_reference, in_process).await;
    let end = loadavg();
    println!("load average at the end {end}");
    common::report_row(
        "flow: load averages",
        &["at start", "at end"],
        &[start, end],
    );
}
