//! Task queue throughput on PostgreSQL, each point beside a pgbench baseline.
//!
//! `cargo xtask bench queue [SECS] [unbatched] [batched] [dag] [checkout]`
//! (needs `DATABASE_URL`; pgbench on `PATH` for the baselines). For 1, 4
//! and 16 workers at claim batch 1 (`unbatched`) and 10 (`batched`), each
//! worker (a tokio task with its own worker handle of one queue, as the
//! embedded worker runs) loops: enqueue `b` tasks, claim `b`, complete them
//! in one statement, for `SECS` seconds over a 10 000-task backlog. Then
//! pgbench runs a script of the same statements at the same concurrency,
//! and the table gives both and their ratio. `checkout` adds a column for
//! the same loop on the queue itself (a pool checkout per call). Last
//! (`dag`), DAG throughput: 10-node chains and 100-way fan-outs (root, 100
//! branches, a join) run by 4 workers at batch 10. Every point starts from a
//! truncated, re-filled, vacuumed table after a checkpoint. Without part
//! names every part runs; `SECS` defaults to 8. Every table row is also
//! printed for `cargo xtask bench all` (see `common::report_row`), and
//! `/proc/loadavg` at the start and the end.

mod common;

use std::io::Write as _;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use parlance_core::ProductId;
use parlance_ports::{DagSpec, NodeSpec, QueueConfig, SystemClock, TaskQueue, TaskSpec, WorkerId};
use parlance_postgres::queue_statements as sql;
use parlance_postgres::{DatabaseUrl, PgPool, PgTaskQueue, PoolOptions};
use serde_json::{Value, json};

const DB: &str = "parlance_bench_queue";
const BACKLOG: i64 = 10_000;
const LEASE: Duration = Duration::from_secs(300);

fn out(line: &str) {
    let _ = writeln!(std::io::stdout(), "{line}");
}

/// What to run, from the command line.
struct Parts {
    secs: u64,
    unbatched: bool,
    batched: bool,
    dag: bool,
    /// Also the loop on the queue itself, a pool checkout per call.
    checkout: bool,
}

impl Parts {
    fn parse() -> Self {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let has = |name: &str| args.iter().any(|a| a == name);
        let all = !["unbatched", "batched", "dag"].iter().any(|p| has(p));
        Self {
            secs: args.iter().find_map(|a| a.parse().ok()).unwrap_or(8),
            unbatched: all || has("unbatched"),
            batched: all || has("batched"),
            dag: all || has("dag"),
            checkout: has("checkout"),
        }
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.trim().to_owned())
        .unwrap_or_else(|e| format!("unavailable ({e})"))
}

fn main() -> anyhow::Result<()> {
    let parts = Parts::parse();
    let base = std::env::var("DATABASE_URL").context("DATABASE_URL must be set")?;
    let (head, _) = base.split_once('?').unwrap_or((&base, ""));
    let (server, _) = head
        .rsplit_once('/')
        .context("DATABASE_URL names a database")?;
    let url = format!("{server}/{DB}");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    out(&format!("loadavg at start: {}", loadavg()));
    let result = rt.block_on(run(&base, &url, &parts));
    out(&format!("loadavg at end: {}", loadavg()));
    result
}

async fn run(admin_url: &str, url: &str, parts: &Parts) -> anyhow::Result<()> {
    let secs = parts.secs;
    let admin = parlance_postgres::connect(&DatabaseUrl::new(admin_url), &PoolOptions::default())?;
    sqlx::query(&format!("DROP DATABASE IF EXISTS {DB} WITH (FORCE)"))
        .execute(&admin)
        .await?;
    sqlx::query(&format!("CREATE DATABASE {DB}"))
        .execute(&admin)
        .await?;
    admin.close().await;
    let setup = pool(url, 2)?;
    parlance_postgres::migrate(&setup).await?;
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(&setup)
        .await?;
    out(&format!(
        "queue benchmark: PostgreSQL {version}, {secs} s per point, {BACKLOG}-task backlog"
    ));
    let mut batches = Vec::new();
    if parts.unbatched {
        batches.push(1usize);
    }
    if parts.batched {
        batches.push(10);
    }
    if !batches.is_empty() {
        let mut columns = vec!["workers", "batch", "parlance jobs/s"];
        if parts.checkout {
            columns.push("checkout per call jobs/s");
        }
        columns.extend(["pgbench jobs/s", "ratio"]);
        out("");
        out(&format!("| {} |", columns.join(" | ")));
        out(&format!("|{}", "---:|".repeat(columns.len())));
        let mut cpu_lines = Vec::new();
        for &batch in &batches {
            for workers in [1usize, 4, 16] {
                reset(&setup).await?;
                let before = Cpu::now();
                let ours = steady_state(url, workers, batch, secs, Handle::Worker).await?;
                let mut cpu = vec![format!(
                    "parlance {:.0}",
                    Cpu::now().own_since(&before, ours.jobs)
                )];
                let mut cells = vec![
                    workers.to_string(),
                    batch.to_string(),
                    format!("{:.0}", ours.rate),
                ];
                if parts.checkout {
                    reset(&setup).await?;
                    let before = Cpu::now();
                    let pooled = steady_state(url, workers, batch, secs, Handle::Queue).await?;
                    cpu.push(format!(
                        "checkout per call {:.0}",
                        Cpu::now().own_since(&before, pooled.jobs)
                    ));
                    cells.push(format!("{:.0}", pooled.rate));
                }
                reset(&setup).await?;
                let before = Cpu::now();
                match pgbench(url, workers, batch, secs) {
                    Ok(r) => {
                        cpu.push(format!(
                            "pgbench {:.0}",
                            Cpu::now().children_since(&before, r.jobs)
                        ));
                        cells.extend([
                            format!("{:.0}", r.rate),
                            format!("{:.2}", ours.rate / r.rate),
                        ]);
                    }
                    Err(e) => cells.extend([format!("n/a ({e})"), "n/a".to_owned()]),
                }
                out(&format!("| {} |", cells.join(" | ")));
                common::report_row("queue steady state", &columns, &cells);
                cpu_lines.push(format!(
                    "{workers} workers, batch {batch}: {}",
                    cpu.join(", ")
                ));
            }
        }
        out("");
        out("client CPU per job (µs, user + system, from /proc/self/stat):");
        for line in cpu_lines {
            out(&format!("- {line}"));
        }
    }
    if parts.dag {
        out("");
        out("| DAG | DAGs | nodes each | workers | DAGs/s | node jobs/s |");
        out("|---|---:|---:|---:|---:|---:|");
        reset(&setup).await?;
        dag_throughput(url, "10-node chain", 200, chain(10), 10).await?;
        reset(&setup).await?;
        dag_throughput(url, "100-way fan-out", 20, fan_out(100), 102).await?;
    }
    setup.close().await;
    let admin = parlance_postgres::connect(&DatabaseUrl::new(admin_url), &PoolOptions::default())?;
    sqlx::query(&format!("DROP DATABASE IF EXISTS {DB} WITH (FORCE)"))
        .execute(&admin)
        .await?;
    admin.close().await;
    Ok(())
}

fn pool(url: &str, size: u32) -> anyhow::Result<PgPool> {
    Ok(parlance_postgres::connect(
        &DatabaseUrl::new(url),
        &PoolOptions {
            max_connections: size,
            acquire_timeout: Duration::from_secs(30),
        },
    )?)
}

/// Empties the queue, refills the backlog, vacuums and checkpoints.
async fn reset(pool: &PgPool) -> anyhow::Result<()> {
    sqlx::query("TRUNCATE jobs, dag_runs, dag_nodes, dag_edges, workers")
        .execute(pool)
        .await?;
    sqlx::query(
        "INSERT INTO jobs (product_id, queue, kind, run_at, max_attempts, args, created_at) \
         SELECT 'bench', 'default', 'noop', now(), 5, '{}'::jsonb, now() \
         FROM generate_series(1, $1)",
    )
    .bind(BACKLOG)
    .execute(pool)
    .await?;
    sqlx::query("VACUUM ANALYZE jobs").execute(pool).await?;
    sqlx::query("CHECKPOINT").execute(pool).await?;
    Ok(())
}

fn queue_on(pool: PgPool) -> Arc<PgTaskQueue> {
    Arc::new(PgTaskQueue::new(
        pool,
        Arc::new(SystemClock),
        QueueConfig::default(),
    ))
}

fn product() -> ProductId {
    ProductId::parse("bench").expect("valid")
}

/// The CPU time this process and its waited-for children have used.
struct Cpu {
    own: Duration,
    children: Duration,
}

impl Cpu {
    fn now() -> Self {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let fields: Vec<u64> = after_name
            .split_whitespace()
            .map(|f| f.parse().unwrap_or(0))
            .collect();
        // utime, stime, cutime and cstime are fields 14 to 17, in clock
        // ticks (100 a second on Linux).
        let tick = |i: usize| Duration::from_millis(fields.get(i - 3).copied().unwrap_or(0) * 10);
        Self {
            own: tick(14) + tick(15),
            children: tick(16) + tick(17),
        }
    }

    /// Microseconds of this process's CPU per job since `before`.
    fn own_since(&self, before: &Cpu, jobs: u64) -> f64 {
        (self.own.saturating_sub(before.own)).as_secs_f64() * 1e6 / jobs.max(1) as f64
    }

    /// Microseconds of the children's CPU per job since `before`.
    fn children_since(&self, before: &Cpu, jobs: u64) -> f64 {
        (self.children.saturating_sub(before.children)).as_secs_f64() * 1e6 / jobs.max(1) as f64
    }
}

/// A steady-state point's outcome.
struct Point {
    /// Jobs completed per second.
    rate: f64,
    /// Jobs completed.
    jobs: u64,
}

/// What each worker of a steady-state point calls.
#[derive(Clone, Copy)]
enum Handle {
    /// Its own worker handle ([`PgTaskQueue::for_worker`]), as the worker
    /// runtime does.
    Worker,
    /// The shared queue: a pool checkout per call.
    Queue,
}

/// Enqueue `batch`, claim `batch`, complete them, per worker, for `secs`.
async fn steady_state(
    url: &str,
    workers: usize,
    batch: usize,
    secs: u64,
    handle: Handle,
) -> anyhow::Result<Point> {
    let shared = queue_on(pool(url, u32::try_from(workers + 2)?)?);
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(secs);
    let start = Instant::now();
    let mut handles = Vec::new();
    for w in 0..workers {
        let queue = match handle {
            Handle::Worker => Arc::new(shared.for_worker()),
            Handle::Queue => Arc::clone(&shared),
        };
        let done = Arc::clone(&done);
        handles.push(tokio::spawn(async move {
            let id = WorkerId(uuid::Uuid::from_u128(w as u128 + 1));
            let specs: Vec<TaskSpec> = (0..batch)
                .map(|_| TaskSpec::new(product(), "noop", json!({})))
                .collect();
            while Instant::now() < deadline {
                queue.enqueue(&specs).await?;
                let leases = queue.claim(&id, "default", batch, LEASE).await?;
                let batch: Vec<_> = leases.into_iter().map(|l| (l, Value::Null)).collect();
                let results = queue.complete_many(&batch).await?;
                let ok = results.iter().filter(|r| r.is_ok()).count();
                done.fetch_add(ok as u64, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    for h in handles {
        h.await??;
    }
    let jobs = done.load(Ordering::Relaxed);
    Ok(Point {
        rate: jobs as f64 / start.elapsed().as_secs_f64(),
        jobs,
    })
}

/// The worker id pgbench's client `:client_id` claims as.
const PGBENCH_WORKER: &str =
    "('00000000-0000-0000-0000-' || lpad(:client_id::text, 12, '0'))::uuid";

/// Replaces each `$n` of `statement` with `args[n - 1]`.
fn substitute(statement: &str, args: &[&str]) -> anyhow::Result<String> {
    let mut sql = String::with_capacity(statement.len());
    let mut rest = statement;
    while let Some(at) = rest.find('$') {
        sql.push_str(&rest[..at]);
        let digits = rest[at + 1..]
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len() - at - 1);
        let n: usize = rest[at + 1..at + 1 + digits]
            .parse()
            .context("a numbered parameter")?;
        let arg = args
            .get(n.wrapping_sub(1))
            .with_context(|| format!("no value for ${n}"))?;
        sql.push_str(arg);
        rest = &rest[at + 1 + digits..];
    }
    sql.push_str(rest);
    Ok(sql)
}

/// The pgbench script of one steady-state loop and the variables it reads
/// (`-D`): the statements the adapter sends
/// ([`parlance_postgres::queue_statements`]), each a transaction of its
/// own as ours are, with every parameter a pgbench variable of the same
/// value (sent as a parameter of the prepared statement, as ours are), the
/// clock's time `now()`, and the worker id computed from `:client_id`.
/// Not in it: the wake-up hints our side sends after its enqueues, on their
/// own connection and coalesced, which the baseline does not pay. The
/// claim's rows come back as arrays (`\gset` takes one row) for the
/// completion's parameters.
fn pgbench_script(batch: usize) -> anyhow::Result<(String, Vec<(&'static str, String)>)> {
    let times = |v: &str| format!("{{{}}}", vec![v; batch].join(","));
    let vars = vec![
        ("products", times("bench")),
        ("queues", times("default")),
        ("kinds", times("noop")),
        ("priorities", times("0")),
        ("max_attempts", times("5")),
        ("timeouts", times("NULL")),
        ("args", times("\"{}\"")),
        ("queue", "default".to_owned()),
        ("batch", batch.to_string()),
        ("lease_ms", LEASE.as_millis().to_string()),
    ];
    let run_at = format!("array_fill(now(), ARRAY[{batch}])");
    let enqueue = substitute(
        sql::ENQUEUE,
        &[
            ":products",
            ":queues",
            ":kinds",
            ":priorities",
            &run_at,
            ":max_attempts",
            ":timeouts",
            ":args",
            "now()",
        ],
    )?;
    let claim = substitute(
        sql::CLAIM,
        &[PGBENCH_WORKER, "now()", ":queue", ":batch", ":lease_ms"],
    )?;
    let (ctes, select) = claim
        .split_once(") SELECT u.*,")
        .context("the claim is CTEs, then a select from the update")?;
    let (_, join) = select
        .split_once(" FROM u ")
        .context("the claim's select reads the update")?;
    let claim = format!(
        "{ctes}) SELECT array_agg(u.id) AS ids, array_agg(u.lease_token) AS toks, \
         array_agg({PGBENCH_WORKER}) AS ws, array_agg(u.product_id) AS ps FROM u {join} \\gset"
    );
    let complete = substitute(sql::COMPLETE, &[":ids", ":toks", "now()", ":ws", ":ps"])?;
    Ok((format!("{enqueue};\n{claim}\n{complete};\n"), vars))
}

/// pgbench running [`pgbench_script`] with `workers` clients: jobs/s.
fn pgbench(url: &str, workers: usize, batch: usize, secs: u64) -> anyhow::Result<Point> {
    let (script, vars) = pgbench_script(batch)?;
    let path = std::env::temp_dir().join(format!("parlance-queue-bench-{batch}.sql"));
    std::fs::write(&path, script)?;
    let threads = workers.min(2).to_string();
    let mut command = Command::new("pgbench");
    for (name, value) in &vars {
        command.arg("-D").arg(format!("{name}={value}"));
    }
    let output = command
        .args(["-n", "-M", "prepared", "-c"])
        .arg(workers.to_string())
        .args(["-j", &threads, "-T"])
        .arg(secs.to_string())
        .arg("-f")
        .arg(&path)
        .arg(url)
        .output()
        .context("run pgbench")?;
    if !output.status.success() {
        bail!(
            "pgbench failed: {}",
            String::from_utf8_lossy(&output.stderr)
                .lines()
                .last()
                .unwrap_or("")
        );
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let tps = text
        .lines()
        .find(|l| l.starts_with("tps = "))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|t| t.parse::<f64>().ok())
        .context("no tps in pgbench output")?;
    let scripts: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("number of transactions actually processed: "))
        .and_then(|n| n.split('/').next())
        .and_then(|n| n.trim().parse().ok())
        .context("no transaction count in pgbench output")?;
    Ok(Point {
        rate: tps * batch as f64,
        jobs: scripts * batch as u64,
    })
}

fn chain(n: usize) -> DagSpec {
    let mut dag = DagSpec::new(product());
    for i in 0..n {
        dag = dag.node(NodeSpec::new(format!("n{i}"), "noop", json!({})));
        if i > 0 {
            dag = dag.edge(format!("n{}", i - 1), format!("n{i}"));
        }
    }
    dag
}

fn fan_out(n: usize) -> DagSpec {
    let mut dag = DagSpec::new(product())
        .node(NodeSpec::new("root", "noop", json!({})))
        .node(NodeSpec::new("join", "noop", json!({})));
    for i in 0..n {
        dag = dag
            .node(NodeSpec::new(format!("b{i}"), "noop", json!({})))
            .edge("root", format!("b{i}"))
            .edge(format!("b{i}"), "join");
    }
    dag
}

/// Enqueues `count` copies of `dag` while 4 workers (batch 10) run them;
/// reports how fast they finish.
async fn dag_throughput(
    url: &str,
    name: &str,
    count: usize,
    dag: DagSpec,
    nodes: usize,
) -> anyhow::Result<()> {
    const WORKERS: usize = 4;
    // The backlog of plain tasks is not part of this run.
    let p = pool(url, 2)?;
    sqlx::query("TRUNCATE jobs").execute(&p).await?;
    p.close().await;
    let queue = queue_on(pool(url, u32::try_from(WORKERS + 2)?)?);
    let target = (count * nodes) as u64;
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut handles = Vec::new();
    for w in 0..WORKERS {
        let (queue, done) = (Arc::new(queue.for_worker()), Arc::clone(&done));
        handles.push(tokio::spawn(async move {
            let id = WorkerId(uuid::Uuid::from_u128(w as u128 + 1));
            while done.load(Ordering::Relaxed) < target {
                let leases = queue.claim(&id, "default", 10, LEASE).await?;
                if leases.is_empty() {
                    queue
                        .wait_for_work("default", Duration::from_millis(20))
                        .await;
                    continue;
                }
                let batch: Vec<_> = leases.into_iter().map(|l| (l, json!(1))).collect();
                let results = queue.complete_many(&batch).await?;
                let ok = results.iter().filter(|r| r.is_ok()).count();
                done.fetch_add(ok as u64, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    for _ in 0..count {
        queue.enqueue_dag(&dag).await?;
    }
    for h in handles {
        h.await??;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let cells = [
        name.to_owned(),
        count.to_string(),
        nodes.to_string(),
        WORKERS.to_string(),
        format!("{:.1}", count as f64 / elapsed),
        format!("{:.0}", target as f64 / elapsed),
    ];
    out(&format!("| {} |", cells.join(" | ")));
    common::report_row(
        "queue DAG throughput",
        &[
            "DAG",
            "DAGs",
            "nodes each",
            "workers",
            "DAGs/s",
            "node jobs/s",
        ],
        &cells,
    );
    Ok(())
}
