//! Task queue throughput on PostgreSQL, each point beside a pgbench baseline.
//!
//! `cargo xtask bench queue` (needs `DATABASE_URL`; pgbench on `PATH` for the
//! baselines). For 1, 4 and 16 workers at claim batch 1 and 10, each worker
//! (a tokio task on a shared pool) loops: enqueue `b` tasks, claim `b`,
//! complete them in one statement, for `SECS` seconds over a 10 000-task
//! backlog. Then pgbench runs a script of the same statements at the same
//! concurrency, and the table gives both and their ratio. Last, DAG
//! throughput: 10-node chains and 100-way fan-outs (root, 100 branches, a
//! join) run by 4 workers at batch 10. Every point starts from a truncated,
//! re-filled, vacuumed table after a checkpoint. Pass a number to change
//! `SECS` (default 8).

use std::io::Write as _;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use parlance_core::ProductId;
use parlance_ports::{DagSpec, NodeSpec, QueueConfig, SystemClock, TaskQueue, TaskSpec, WorkerId};
use parlance_postgres::{DatabaseUrl, PgPool, PgTaskQueue, PoolOptions};
use serde_json::{Value, json};

const DB: &str = "parlance_bench_queue";
const BACKLOG: i64 = 10_000;
const LEASE: Duration = Duration::from_secs(300);

fn out(line: &str) {
    let _ = writeln!(std::io::stdout(), "{line}");
}

fn main() -> anyhow::Result<()> {
    let secs: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(8);
    let base = std::env::var("DATABASE_URL").context("DATABASE_URL must be set")?;
    let (head, _) = base.split_once('?').unwrap_or((&base, ""));
    let (server, _) = head
        .rsplit_once('/')
        .context("DATABASE_URL names a database")?;
    let url = format!("{server}/{DB}");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run(&base, &url, secs))
}

async fn run(admin_url: &str, url: &str, secs: u64) -> anyhow::Result<()> {
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
    out("");
    out("| workers | batch | parlance jobs/s | pgbench jobs/s | ratio |");
    out("|---:|---:|---:|---:|---:|");
    for batch in [1usize, 10] {
        for workers in [1usize, 4, 16] {
            reset(&setup).await?;
            let ours = steady_state(url, workers, batch, secs).await?;
            reset(&setup).await?;
            let raw = pgbench(url, workers, batch, secs);
            let (raw_txt, ratio) = match raw {
                Ok(r) => (format!("{r:.0}"), format!("{:.2}", ours / r)),
                Err(e) => (format!("n/a ({e})"), "n/a".to_owned()),
            };
            out(&format!(
                "| {workers} | {batch} | {ours:.0} | {raw_txt} | {ratio} |"
            ));
        }
    }
    out("");
    out("| DAG | DAGs | nodes each | workers | DAGs/s | node jobs/s |");
    out("|---|---:|---:|---:|---:|---:|");
    reset(&setup).await?;
    dag_throughput(url, "10-node chain", 200, chain(10), 10).await?;
    reset(&setup).await?;
    dag_throughput(url, "100-way fan-out", 20, fan_out(100), 102).await?;
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

/// Enqueue `batch`, claim `batch`, complete them, per worker, for `secs`.
async fn steady_state(url: &str, workers: usize, batch: usize, secs: u64) -> anyhow::Result<f64> {
    let queue = queue_on(pool(url, u32::try_from(workers + 2)?)?);
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(secs);
    let start = Instant::now();
    let mut handles = Vec::new();
    for w in 0..workers {
        let (queue, done) = (Arc::clone(&queue), Arc::clone(&done));
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
    Ok(done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64())
}

/// The same statements as [`steady_state`] sends (the enqueue with its
/// wake-up notify, the claim with its worker upsert, the batched
/// completion), with `now()` for the clock, run by pgbench.
fn pgbench(url: &str, workers: usize, batch: usize, secs: u64) -> anyhow::Result<f64> {
    let script = format!(
        "\\set w random(1, 1000000)\n\
         WITH ins AS (INSERT INTO jobs (product_id, queue, kind, priority, run_at, max_attempts, timeout_ms, args, created_at) \
         SELECT p, q, k, pr, ra, ma, tm, a, now() FROM UNNEST(array_fill('bench'::text, ARRAY[{batch}]), \
         array_fill('default'::text, ARRAY[{batch}]), array_fill('noop'::text, ARRAY[{batch}]), \
         array_fill(0::int2, ARRAY[{batch}]), array_fill(now(), ARRAY[{batch}]), array_fill(5, ARRAY[{batch}]), \
         array_fill(NULL::int8, ARRAY[{batch}]), array_fill('{{}}'::jsonb, ARRAY[{batch}])) \
         AS t(p, q, k, pr, ra, ma, tm, a) RETURNING id, run_at), \
         hint AS (SELECT pg_notify('parlance_jobs', '') FROM ins WHERE run_at <= now() LIMIT 1) \
         SELECT id FROM ins WHERE (SELECT count(*) FROM hint) >= 0;\n\
         WITH w AS (INSERT INTO workers (id, started_at, last_seen) SELECT ('00000000-0000-0000-0000-' || lpad(:client_id::text, 12, '0'))::uuid, now(), now() \
         FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit \
         ON CONFLICT (id) DO UPDATE SET last_seen = EXCLUDED.last_seen \
         WHERE workers.last_seen < EXCLUDED.last_seen - interval '1 second'), \
         c AS (SELECT product_id, id FROM jobs WHERE state = 0 AND queue = 'default' AND run_at <= now() \
         ORDER BY priority, run_at, id LIMIT {batch} FOR UPDATE SKIP LOCKED), \
         u AS (UPDATE jobs j SET state = 1, attempt = j.attempt + 1, \
         lease_token = nextval('job_lease_tokens'), leased_by = ('00000000-0000-0000-0000-' || lpad(:client_id::text, 12, '0'))::uuid, \
         lease_expires_at = now() + coalesce(j.timeout_ms, 300000) * interval '1 millisecond' \
         FROM c WHERE j.product_id = c.product_id AND j.id = c.id \
         RETURNING j.id, j.lease_token, j.product_id, j.kind, j.args, j.attempt, \
         j.max_attempts, j.lease_expires_at, j.node_id, j.priority, j.run_at) \
         SELECT array_agg(id) AS ids, array_agg(lease_token) AS toks, array_agg(product_id) AS ps FROM u \\gset\n\
         UPDATE jobs j SET state = 2, finished_at = now(), leased_by = NULL \
         FROM UNNEST(:ids::int8[], :toks::int8[], :ps::text[]) AS t(id, tok, p) \
         WHERE j.product_id = t.p AND j.id = t.id AND j.state = 1 AND j.lease_token = t.tok \
         AND j.leased_by = ('00000000-0000-0000-0000-' || lpad(:client_id::text, 12, '0'))::uuid RETURNING j.id;\n"
    );
    let path = std::env::temp_dir().join(format!("parlance-queue-bench-{batch}.sql"));
    std::fs::write(&path, script)?;
    let threads = workers.min(2).to_string();
    let output = Command::new("pgbench")
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
    Ok(tps * batch as f64)
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
        let (queue, done) = (Arc::clone(&queue), Arc::clone(&done));
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
    out(&format!(
        "| {name} | {count} | {nodes} | {WORKERS} | {:.1} | {:.0} |",
        count as f64 / elapsed,
        target as f64 / elapsed
    ));
    Ok(())
}
