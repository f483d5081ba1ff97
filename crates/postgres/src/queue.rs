//! The task queue in the `jobs`, `dag_runs`, `dag_nodes`, `dag_edges` and
//! `workers` tables.
//!
//! Claims are one statement: a batched `FOR UPDATE SKIP LOCKED` select over
//! the partial claim index feeding an `UPDATE … RETURNING` that hands out
//! fresh fencing tokens, with the claimed nodes' DAG context (key, element
//! input or parents' results) joined in the same statement. A claim commits without waiting for its WAL flush
//! (`synchronous_commit = off` for that transaction only): a claim lost in a
//! server crash leaves its task `available` and the task simply runs again,
//! while enqueues and completions stay synchronous, and a completion's flush
//! makes every earlier claim durable too. Every completion, failure and
//! release is fenced by `state = running AND lease_token = $token AND
//! leased_by = $worker`; the worker is part of the fence because a token
//! drawn by a claim the crash lost may be drawn again. Plain enqueues are one
//! statement. A DAG node's completion runs in
//! one transaction that first locks the run row, then applies the fenced
//! update, stores the result, decrements the children's remaining-dependency
//! counters and inserts jobs for the children that reached zero, so a join
//! fires exactly once; `complete_and_claim` leases some of those jobs to
//! the completing worker in the same transaction, as the claim would.
//! Every operation that touches a run locks the run row before any of its
//! jobs, which keeps lock order acyclic. Time comes from the
//! injected clock (bound as a parameter), never from `now()`.
//!
//! A dedup key holds one live job per product (the partial unique index
//! `jobs_dedup`), and a request meeting a running job with its key is
//! kept on that job (`rerun`, migration 0016) by the enqueue's own
//! statement (`ON CONFLICT … DO UPDATE … WHERE jobs.state = 1`). The
//! statements that end a run read the mark on the row they change: a
//! requeue moves it into the job in its `SET` list; a finish first tries
//! its plain fenced update with `rerun IS NULL` added, and only when that
//! finds no row runs the statement that locks the row, reads its mark,
//! finishes it and inserts the fresh job (see [`fenced_finish`] for why no
//! interleaving loses a request). Unmarked jobs, all but a few, pay one
//! predicate.
//!
//! Wake-ups are hints; polling is the truth. After a commit that made tasks
//! runnable, the queue wakes this process's workers at once and asks its
//! hint sender to `pg_notify` the other processes. The hint is sent on its
//! own short transaction, never inside the one that wrote the tasks:
//! PostgreSQL serialises the commits of transactions that notify under one
//! lock held across their WAL flush, which halves the throughput of
//! concurrent writers. Requests that arrive while a hint is on its way are
//! answered by the next one.
//!
//! Every table is keyed by `product_id` first (migration 0010), and every
//! statement about one task or run names its product next to its id, so
//! each is a single-product lookup; only the worker's scans (claim, rescue,
//! release of unheld leases, the dead-letter list and retention) span
//! products. See docs/distributed.md.
//!
//! A worker calls the queue through its own handle
//! ([`PgTaskQueue::for_worker`]), which keeps one pooled connection for the
//! worker's calls: a call then costs its statements' round trips only, not
//! a pool checkout and the pool's check of the connection given back.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use parlance_core::queue::{
    RetryDecision, decide_retry, jitter_from_seed, map_combine_key, map_element_key,
};
use parlance_core::{ProductId, Timestamp};
use parlance_ports::{
    Clock, DagFailure, DagId, DagSpec, DagState, DagStatus, DagTask, DiscardedTask, FailOutcome,
    Lease, NodeInput, NodeResult, NodeState, PortError, PortResult, QueueConfig, QueueDepth,
    QueueFootprint, RecoverReport, TaskId, TaskQueue, TaskSpec, WorkerId,
};
use serde_json::{Value, json};
use sqlx::pool::PoolConnection;
use sqlx::postgres::PgListener;
use sqlx::{Connection as _, PgConnection, PgPool, Postgres, Row as _};
use tokio::sync::{Mutex, MutexGuard, Notify};

use crate::error::pg_err;
use crate::time::{from_pg, to_pg};

/// The channel of the cross-process wake-up hint.
const CHANNEL: &str = "parlance_jobs";

/// Rows handled per statement by the sweeper and the retention purge.
const BATCH: i64 = 1_000;

mod job {
    pub(super) const AVAILABLE: i16 = 0;
    pub(super) const RUNNING: i16 = 1;
    pub(super) const COMPLETED: i16 = 2;
    pub(super) const DISCARDED: i16 = 3;
    pub(super) const CANCELLED: i16 = 4;
}

mod run {
    pub(super) const RUNNING: i16 = 0;
    pub(super) const COMPLETED: i16 = 1;
    pub(super) const FAILED: i16 = 2;
    pub(super) const CANCELLED: i16 = 3;
}

mod node {
    pub(super) const PENDING: i16 = 0;
    pub(super) const QUEUED: i16 = 1;
    pub(super) const COMPLETED: i16 = 2;
    pub(super) const FAILED: i16 = 3;
    pub(super) const CANCELLED: i16 = 4;
    pub(super) const ROLE_COMBINE: i16 = 1;
}

/// The end of a claim statement, after its CTE `c` naming the jobs to
/// claim (`product_id`, `id`): leases them to worker `$1` at time `$2` with
/// fresh fencing tokens (deadline: the job's timeout, else `$5` ms) and
/// returns them with their node's DAG context (its key, its element input
/// or its parents' results in edge order), read in the same statement.
macro_rules! claim_tail {
    () => {
        "u AS (UPDATE jobs j SET state = 1, attempt = j.attempt + 1, \
     lease_token = nextval('job_lease_tokens'), leased_by = $1, \
     lease_expires_at = $2 + coalesce(j.timeout_ms, $5) * interval '1 millisecond' \
     FROM c WHERE j.product_id = c.product_id AND j.id = c.id \
     RETURNING j.id, j.lease_token, j.product_id, j.queue, j.kind, j.args, j.attempt, \
     j.max_attempts, j.lease_expires_at, j.node_id, j.priority, j.run_at) \
     SELECT u.*, n.dag_run_id, n.key AS node_key, n.input_from, n.input, \
     n.map_spec IS NOT NULL AS is_map, \
     CASE WHEN n.id IS NOT NULL AND n.input_from IS NULL THEN \
     (SELECT coalesce(jsonb_agg(jsonb_build_array(p.key, p.result) ORDER BY e.position), \
     '[]'::jsonb) FROM dag_edges e JOIN dag_nodes p \
     ON p.product_id = e.product_id AND p.id = e.parent_id \
     WHERE e.product_id = n.product_id AND e.child_id = n.id) END AS parents \
     FROM u LEFT JOIN dag_nodes n ON n.product_id = u.product_id AND n.id = u.node_id"
    };
}

/// The statements of a worker's loop, as this adapter sends them: for
/// baselines that replay the same SQL with another client (the queue
/// benchmark's pgbench script).
pub mod statements {
    /// Enqueues tasks without dedup keys, returning their ids in order:
    /// `$1` to `$8` the columns `product_id`, `queue`, `kind`, `priority`
    /// (`int2`), `run_at`, `max_attempts` (`int4`), `timeout_ms` (`int8`)
    /// and `args` (`jsonb`) as arrays, one element per task; `$9` the
    /// clock's time.
    pub const ENQUEUE: &str = "INSERT INTO jobs (product_id, queue, kind, priority, run_at, \
         max_attempts, timeout_ms, args, created_at) \
         SELECT p, q, k, pr, ra, ma, tm, a, $9 FROM UNNEST($1::text[], $2::text[], \
         $3::text[], $4::int2[], $5::timestamptz[], $6::int4[], $7::int8[], $8::jsonb[]) \
         AS t(p, q, k, pr, ra, ma, tm, a) RETURNING id";

    /// Claims up to `$4` runnable tasks of queue `$3` for worker `$1` at
    /// time `$2`, each leased for its own timeout or `$5` ms, and counts as
    /// the worker's heartbeat (written at most once a second), with each
    /// claimed node's DAG context. Commits without waiting for its flush:
    /// see the module documentation.
    pub const CLAIM: &str = concat!(
        "WITH w AS (INSERT INTO workers (id, started_at, last_seen) SELECT $1, $2, $2 \
         FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit \
         ON CONFLICT (id) DO UPDATE SET last_seen = EXCLUDED.last_seen \
         WHERE workers.last_seen < EXCLUDED.last_seen - interval '1 second'), \
         c AS (SELECT product_id, id FROM jobs WHERE state = 0 AND queue = $3 \
         AND run_at <= $2 ORDER BY priority, run_at, id LIMIT $4 FOR UPDATE SKIP LOCKED), ",
        claim_tail!()
    );

    /// Completes the running tasks `$1` (ids) leased with tokens `$2` by
    /// workers `$4` under products `$5` at time `$3`, fenced per task;
    /// returns the ids it recorded. A task a request was folded into is
    /// left to the completion that enqueues the request (it is not
    /// recorded here).
    pub const COMPLETE: &str = "UPDATE jobs j SET state = 2, finished_at = $3, leased_by = NULL, \
         args = 'null'::jsonb FROM UNNEST($1::int8[], $2::int8[], $4::uuid[], $5::text[]) AS t(id, tok, w, p) \
         WHERE j.product_id = t.p AND j.id = t.id AND j.state = 1 \
         AND j.lease_token = t.tok AND j.leased_by = t.w AND j.rerun IS NULL RETURNING j.id";
}

struct Shared {
    notify: Arc<Notify>,
    /// The payload of this queue's hints. The queue wakes its own workers
    /// directly, so its listener skips these, which would only send the
    /// workers to claim again for nothing.
    own_hint: String,
    listener: OnceLock<tokio::task::JoinHandle<()>>,
    /// Asks the hint sender for one more `pg_notify` (a stored permit:
    /// requests made while one is being sent are answered by one more).
    hint_wanted: Arc<Notify>,
    hinter: OnceLock<tokio::task::JoinHandle<()>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        for h in [self.listener.get(), self.hinter.get()]
            .into_iter()
            .flatten()
        {
            h.abort();
        }
    }
}

/// The task queue, stored in PostgreSQL.
///
/// Each call takes a connection from the pool for its statements, and the
/// pool checks the connection with a round trip when it goes back. A
/// worker's handle ([`PgTaskQueue::for_worker`]) keeps one connection
/// instead for the single-statement calls of the worker's loop.
#[derive(Clone)]
pub struct PgTaskQueue {
    pool: PgPool,
    clock: Arc<dyn Clock>,
    config: QueueConfig,
    shared: Arc<Shared>,
    /// A worker's handle's connection between calls (`None` inside: not
    /// taken yet, or given back after a failed statement); `None`: not a
    /// worker's handle.
    held: Option<Arc<Mutex<Option<PoolConnection<Postgres>>>>>,
}

/// The connection one call runs its statements on: a worker's handle's own
/// when the handle is not busy with another call, else one from the pool.
enum Conn<'a> {
    Held {
        slot: MutexGuard<'a, Option<PoolConnection<Postgres>>>,
        conn: PoolConnection<Postgres>,
    },
    Pooled(PoolConnection<Postgres>),
}

impl Conn<'_> {
    /// After statements that succeeded: a worker's handle keeps its
    /// connection. One not kept (a statement failed, or the call was
    /// dropped half-way) goes back to the pool, which checks it with a
    /// round trip and closes it when it is broken or mid-statement.
    fn keep(self) {
        if let Conn::Held { mut slot, conn } = self {
            *slot = Some(conn);
        }
    }
}

impl std::ops::Deref for Conn<'_> {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        match self {
            Conn::Held { conn, .. } | Conn::Pooled(conn) => conn,
        }
    }
}

impl std::ops::DerefMut for Conn<'_> {
    fn deref_mut(&mut self) -> &mut PgConnection {
        match self {
            Conn::Held { conn, .. } | Conn::Pooled(conn) => conn,
        }
    }
}

impl std::fmt::Debug for PgTaskQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTaskQueue")
            .field("config", &self.config)
            .field("worker_handle", &self.held.is_some())
            .finish_non_exhaustive()
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn to_i32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

fn run_state(s: i16) -> DagState {
    match s {
        run::COMPLETED => DagState::Completed,
        run::FAILED => DagState::Failed,
        run::CANCELLED => DagState::Cancelled,
        _ => DagState::Running,
    }
}

fn node_state(s: i16) -> NodeState {
    match s {
        node::QUEUED => NodeState::Queued,
        node::COMPLETED => NodeState::Completed,
        node::FAILED => NodeState::Failed,
        node::CANCELLED => NodeState::Cancelled,
        _ => NodeState::Pending,
    }
}

/// The `ON CONFLICT` clause of an enqueue with dedup keys: a live job
/// holding the key takes no new row; a running one is marked to run again
/// with the request's fields (`$fields`, a `jsonb` expression), a waiting
/// one is left as it is. `RETURNING` answers a marked job's row with
/// `rerun` set and a new row with `rerun` null; a waiting job's, none.
macro_rules! on_dedup_conflict {
    ($fields:expr) => {
        concat!(
            "ON CONFLICT (product_id, dedup_key) WHERE dedup_key IS NOT NULL AND state IN (0, 1) \
             DO UPDATE SET rerun = ",
            $fields,
            " WHERE jobs.state = 1"
        )
    };
}

/// The fields of a folded request as `jobs.rerun` keeps them, from the row
/// an `INSERT` proposed.
macro_rules! rerun_of_excluded {
    () => {
        "jsonb_build_object('queue', EXCLUDED.queue, 'args', EXCLUDED.args, \
         'priority', EXCLUDED.priority, 'run_at', EXCLUDED.run_at, \
         'max_attempts', EXCLUDED.max_attempts, 'timeout_ms', EXCLUDED.timeout_ms)"
    };
}

/// The data-modifying CTEs that enqueue single tasks inside another
/// statement, after its CTE `u` (the guarded row write): the tasks are
/// inserted only when `u` wrote a row, so they commit exactly with it, with
/// the same dedup rule as [`PgTaskQueue::enqueue_in`]: of the tasks sharing
/// a key, the first is proposed (the later ones would meet it waiting) and
/// the last marks a running job holding the key (it replaces the earlier
/// ones' marks). The CTE `hint` has one row when a runnable task was
/// inserted: the caller then calls [`PgTaskQueue::wake_workers`] after the
/// commit. Parameters `$first` to `$first + 9` are bound by
/// [`TaskRows::bind`].
#[cfg(any(feature = "session", feature = "conversation"))]
pub(crate) fn enqueue_after_u(first: usize) -> String {
    let p = |i: usize| format!("${}", first + i);
    let now = p(9);
    format!(
        "x AS (SELECT * FROM UNNEST({}::text[], {}::text[], {}::text[], {}::int2[], \
         {}::timestamptz[], {}::int4[], {}::int8[], {}::jsonb[], {}::text[]) WITH ORDINALITY \
         AS x(p, q, k, pr, ra, ma, tm, a, d, n)), \
         t AS (INSERT INTO jobs (product_id, queue, kind, priority, run_at, max_attempts, \
         timeout_ms, args, dedup_key, created_at) \
         SELECT x.p, x.q, x.k, x.pr, x.ra, x.ma, x.tm, x.a, x.d, {now} FROM u, x \
         WHERE x.d IS NULL OR NOT EXISTS (SELECT 1 FROM x y \
         WHERE y.p = x.p AND y.d = x.d AND y.n < x.n) ORDER BY x.n {} \
         RETURNING run_at, rerun IS NULL AS fresh), \
         hint AS (SELECT 1 FROM t WHERE fresh AND run_at <= {now} LIMIT 1)",
        p(0),
        p(1),
        p(2),
        p(3),
        p(4),
        p(5),
        p(6),
        p(7),
        p(8),
        on_dedup_conflict!(
            "(SELECT jsonb_build_object('queue', y.q, 'args', y.a, 'priority', y.pr, \
             'run_at', y.ra, 'max_attempts', y.ma, 'timeout_ms', y.tm) FROM x y \
             WHERE y.p = EXCLUDED.product_id AND y.d = EXCLUDED.dedup_key \
             ORDER BY y.n DESC LIMIT 1)"
        ),
    )
}

/// Single tasks as the columns of `jobs`, for [`enqueue_after_u`].
#[cfg(any(feature = "session", feature = "conversation"))]
pub(crate) struct TaskRows<'a> {
    tasks: Vec<&'a TaskSpec>,
    now: Timestamp,
}

#[cfg(any(feature = "session", feature = "conversation"))]
impl<'a> TaskRows<'a> {
    /// The rows of `tasks`, validated, enqueued at the queue's time (as
    /// [`PgTaskQueue::enqueue_in`] does).
    pub(crate) fn new(
        queue: &PgTaskQueue,
        tasks: impl IntoIterator<Item = &'a TaskSpec>,
    ) -> PortResult<Self> {
        let now = queue.clock.now();
        let tasks: Vec<&TaskSpec> = tasks.into_iter().collect();
        for t in &tasks {
            t.validate()?;
        }
        Ok(Self { tasks, now })
    }

    /// Binds the eleven parameters of [`enqueue_after_u`], in order.
    pub(crate) fn bind<'q>(
        &self,
        q: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>
    where
        'a: 'q,
    {
        let t = &self.tasks;
        q.bind(t.iter().map(|t| t.product_id.as_str()).collect::<Vec<_>>())
            .bind(t.iter().map(|t| t.queue.as_str()).collect::<Vec<_>>())
            .bind(t.iter().map(|t| t.kind.as_str()).collect::<Vec<_>>())
            .bind(t.iter().map(|t| t.priority).collect::<Vec<_>>())
            .bind(
                t.iter()
                    .map(|t| to_pg(t.run_at.unwrap_or(self.now)))
                    .collect::<Vec<_>>(),
            )
            .bind(t.iter().map(|t| to_i32(t.max_attempts)).collect::<Vec<_>>())
            .bind(t.iter().map(|t| t.timeout.map(millis)).collect::<Vec<_>>())
            .bind(t.iter().map(|t| t.payload.clone()).collect::<Vec<_>>())
            .bind(t.iter().map(|t| t.dedup_key.as_deref()).collect::<Vec<_>>())
            .bind(to_pg(self.now))
    }
}

/// What a completing worker takes of the tasks its completion frees (see
/// [`TaskQueue::complete_and_claim`]).
#[derive(Clone, Copy)]
struct Take<'a> {
    worker: &'a WorkerId,
    queue: &'a str,
    kinds: &'a [String],
    max: usize,
    lease: Duration,
}

impl PgTaskQueue {
    /// A queue on `pool` (migrated), reading time from `clock`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    /// use std::time::Duration;
    ///
    /// use parlance_core::ProductId;
    /// use parlance_core::queue::TaskSpec;
    /// use parlance_ports::{IdGen, ManualClock, QueueConfig, SequentialIds, TaskQueue, WorkerId};
    /// use parlance_postgres::PgTaskQueue;
    /// use serde_json::json;
    ///
    /// // A fresh, migrated database; an application opens its pool with
    /// // `connect` and runs `migrate`. `None` where no PostgreSQL is configured.
    /// let Some(pool) = parlance_postgres::testing::test_pool().await else { return Ok(()) };
    /// let queue = PgTaskQueue::new(pool, Arc::new(ManualClock::new()), QueueConfig::default());
    /// let task = TaskSpec::new(ProductId::parse("acme")?, "send_welcome", json!({"user": "u-1"}));
    /// queue.enqueue(&[task]).await?;
    ///
    /// // Any number of processes may claim from one queue; a task is leased to
    /// // one worker at a time.
    /// let worker = WorkerId(SequentialIds::new().new_uuid());
    /// let leases = queue.claim(&worker, "default", 10, Duration::from_secs(30)).await?;
    /// assert_eq!(leases.len(), 1);
    /// assert_eq!(leases[0].payload["user"], "u-1");
    /// queue.complete(&leases[0], json!({"sent": true})).await?;
    /// assert!(queue.claim(&worker, "default", 10, Duration::from_secs(30)).await?.is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(pool: PgPool, clock: Arc<dyn Clock>, config: QueueConfig) -> Self {
        Self {
            clock,
            config,
            shared: Arc::new(Shared {
                notify: Arc::new(Notify::new()),
                own_hint: parlance_ports::IdGen::new_uuid(&parlance_ports::UuidV7Ids)
                    .simple()
                    .to_string(),
                listener: OnceLock::new(),
                hint_wanted: Arc::new(Notify::new()),
                hinter: OnceLock::new(),
            }),
            pool,
            held: None,
        }
    }

    /// The same queue as a worker's handle ([`TaskQueue::for_worker`]):
    /// what a worker does to its own tasks (plain enqueues, claims,
    /// completions, failures, releases, heartbeats) runs on one connection
    /// the handle keeps between calls (taken from the pool at its first
    /// call, given back when the handle is dropped), so it skips the pool
    /// checkout and the check the pool makes of every connection given
    /// back, a round trip per call. A call made while another runs on the
    /// handle takes a pooled connection as usual; the rest (DAG enqueues,
    /// enqueues with dedup keys, cancels, sweeps, reads) uses the pool. A
    /// call that fails gives the connection back to the pool, which closes
    /// it when it is broken; the next call takes another. Clones share the
    /// connection.
    pub fn for_worker(&self) -> Self {
        Self {
            held: Some(Arc::new(Mutex::new(None))),
            ..self.clone()
        }
    }

    /// The connection for one call (see [`Conn`]).
    async fn conn(&self) -> PortResult<Conn<'_>> {
        if let Some(held) = &self.held
            && let Ok(mut slot) = held.try_lock()
        {
            let conn = match slot.take() {
                Some(conn) => conn,
                None => self.pool.acquire().await.map_err(pg_err("acquire"))?,
            };
            return Ok(Conn::Held { slot, conn });
        }
        Ok(Conn::Pooled(
            self.pool.acquire().await.map_err(pg_err("acquire"))?,
        ))
    }

    /// Enqueues tasks on `conn`, typically inside the caller's transaction so
    /// the tasks exist exactly when the caller's change commits. Nobody is
    /// woken: the caller calls [`PgTaskQueue::wake_workers`] once its
    /// transaction has committed (workers also poll).
    ///
    /// # Errors
    ///
    /// `Invalid` for a bad spec; database errors classified.
    pub async fn enqueue_in(
        &self,
        conn: &mut PgConnection,
        tasks: &[TaskSpec],
    ) -> PortResult<Vec<Option<TaskId>>> {
        Ok(self.enqueue_rows(conn, tasks).await?.0)
    }

    /// As [`PgTaskQueue::enqueue_in`], also answering whether a task was
    /// inserted that is runnable now.
    async fn enqueue_rows(
        &self,
        conn: &mut PgConnection,
        tasks: &[TaskSpec],
    ) -> PortResult<(Vec<Option<TaskId>>, bool)> {
        for t in tasks {
            t.validate()?;
        }
        let now = self.clock.now();
        let mut ids: Vec<Option<TaskId>> = Vec::with_capacity(tasks.len());
        let mut i = 0;
        while i < tasks.len() {
            if let Some(key) = &tasks[i].dedup_key {
                let t = &tasks[i];
                // A row comes back for a new job (`rerun` null) or for a
                // running one this request marked; a waiting job returns
                // none.
                let id: Vec<(i64, bool)> = sqlx::query_as(concat!(
                    "INSERT INTO jobs (product_id, queue, kind, priority, run_at, \
                     max_attempts, timeout_ms, args, dedup_key, created_at) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ",
                    on_dedup_conflict!(rerun_of_excluded!()),
                    " RETURNING id, rerun IS NULL"
                ))
                .bind(t.product_id.as_str())
                .bind(&t.queue)
                .bind(&t.kind)
                .bind(t.priority)
                .bind(to_pg(t.run_at.unwrap_or(now)))
                .bind(to_i32(t.max_attempts))
                .bind(t.timeout.map(millis))
                .bind(&t.payload)
                .bind(key)
                .bind(to_pg(now))
                .fetch_all(&mut *conn)
                .await
                .map_err(pg_err("enqueue task"))?;
                let new = id.first().filter(|(_, fresh)| *fresh);
                ids.push(new.map(|&(id, _)| TaskId(id)));
                i += 1;
                continue;
            }
            let end = tasks[i..]
                .iter()
                .position(|t| t.dedup_key.is_some())
                .map_or(tasks.len(), |p| i + p);
            let batch = &tasks[i..end];
            // One statement for the rows.
            let mut got: Vec<i64> = sqlx::query_scalar(statements::ENQUEUE)
                .bind(
                    batch
                        .iter()
                        .map(|t| t.product_id.as_str())
                        .collect::<Vec<_>>(),
                )
                .bind(batch.iter().map(|t| t.queue.as_str()).collect::<Vec<_>>())
                .bind(batch.iter().map(|t| t.kind.as_str()).collect::<Vec<_>>())
                .bind(batch.iter().map(|t| t.priority).collect::<Vec<_>>())
                .bind(
                    batch
                        .iter()
                        .map(|t| to_pg(t.run_at.unwrap_or(now)))
                        .collect::<Vec<_>>(),
                )
                .bind(
                    batch
                        .iter()
                        .map(|t| to_i32(t.max_attempts))
                        .collect::<Vec<_>>(),
                )
                .bind(
                    batch
                        .iter()
                        .map(|t| t.timeout.map(millis))
                        .collect::<Vec<_>>(),
                )
                .bind(batch.iter().map(|t| t.payload.clone()).collect::<Vec<_>>())
                .bind(to_pg(now))
                .fetch_all(&mut *conn)
                .await
                .map_err(pg_err("enqueue tasks"))?;
            // Identity values follow insertion order within one statement.
            got.sort_unstable();
            ids.extend(got.into_iter().map(|id| Some(TaskId(id))));
            i = end;
        }
        let runnable = tasks
            .iter()
            .zip(&ids)
            .any(|(t, id)| id.is_some() && t.run_at.is_none_or(|r| r <= now));
        Ok((ids, runnable))
    }

    /// Validates and enqueues a DAG inside the caller's transaction (see
    /// [`TaskQueue::enqueue_dag`]): the run exists only if the caller
    /// commits. Nobody is woken: the caller calls
    /// [`PgTaskQueue::wake_workers`] once its transaction has committed (a
    /// wake before the commit sends workers to claim rows they cannot see
    /// yet).
    ///
    /// # Errors
    ///
    /// `Invalid` for a bad spec; database errors classified.
    pub async fn enqueue_dag_in(
        &self,
        conn: &mut PgConnection,
        spec: &DagSpec,
    ) -> PortResult<DagId> {
        self.insert_dag(conn, spec).await
    }

    /// Inserts the run, its nodes and edges, and queues its roots.
    async fn insert_dag(&self, conn: &mut PgConnection, spec: &DagSpec) -> PortResult<DagId> {
        let plan = spec.plan(&self.config.dag_limits)?;
        let now = self.clock.now();
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO dag_runs (product_id, queue, total_nodes, created_at) \
             VALUES ($1, $2, $3, $4) RETURNING id",
        )
        .bind(spec.product_id.as_str())
        .bind(&spec.queue)
        .bind(i32::try_from(spec.nodes.len()).unwrap_or(i32::MAX))
        .bind(to_pg(now))
        .fetch_one(&mut *conn)
        .await
        .map_err(pg_err("insert dag run"))?;
        let n = &spec.nodes;
        let map_specs: Vec<Option<Value>> = n
            .iter()
            .map(|x| {
                x.map
                    .as_ref()
                    .map(|m| json!({"kind": m.kind, "payload": m.payload, "label": m.label}))
            })
            .collect();
        let mut node_ids: Vec<i64> = sqlx::query_scalar(
            "INSERT INTO dag_nodes (product_id, dag_run_id, key, kind, label, payload, map_spec, \
             priority, max_attempts, timeout_ms, remaining_deps) \
             SELECT $11, $1, k, kd, l, p, m, pr, ma, tm, rd FROM UNNEST($2::text[], $3::text[], \
             $4::text[], $5::jsonb[], $6::jsonb[], $7::int2[], $8::int4[], $9::int8[], \
             $10::int4[]) WITH ORDINALITY AS t(k, kd, l, p, m, pr, ma, tm, rd, ord) \
             ORDER BY ord RETURNING id",
        )
        .bind(id)
        .bind(n.iter().map(|x| x.key.as_str()).collect::<Vec<_>>())
        .bind(n.iter().map(|x| x.kind.as_str()).collect::<Vec<_>>())
        .bind(n.iter().map(|x| x.label.as_deref()).collect::<Vec<_>>())
        .bind(n.iter().map(|x| x.payload.clone()).collect::<Vec<_>>())
        .bind(map_specs)
        .bind(n.iter().map(|x| x.priority).collect::<Vec<_>>())
        .bind(n.iter().map(|x| to_i32(x.max_attempts)).collect::<Vec<_>>())
        .bind(n.iter().map(|x| x.timeout.map(millis)).collect::<Vec<_>>())
        .bind(
            plan.remaining_deps
                .iter()
                .map(|&d| to_i32(d))
                .collect::<Vec<_>>(),
        )
        .bind(spec.product_id.as_str())
        .fetch_all(&mut *conn)
        .await
        .map_err(pg_err("insert dag nodes"))?;
        node_ids.sort_unstable();
        if !plan.edges.is_empty() {
            sqlx::query(
                "INSERT INTO dag_edges (product_id, dag_run_id, parent_id, child_id, position) \
                 SELECT $5, $1, p, c, pos FROM UNNEST($2::int8[], $3::int8[], $4::int4[]) \
                 AS t(p, c, pos)",
            )
            .bind(id)
            .bind(plan.edges.iter().map(|e| node_ids[e.0]).collect::<Vec<_>>())
            .bind(plan.edges.iter().map(|e| node_ids[e.1]).collect::<Vec<_>>())
            .bind(
                plan.edges
                    .iter()
                    .map(|e| i32::try_from(e.2).unwrap_or(i32::MAX))
                    .collect::<Vec<_>>(),
            )
            .bind(spec.product_id.as_str())
            .execute(&mut *conn)
            .await
            .map_err(pg_err("insert dag edges"))?;
        }
        let roots: Vec<i64> = plan.roots.iter().map(|&r| node_ids[r]).collect();
        enqueue_nodes(&mut *conn, &spec.product_id, &roots, now).await?;
        Ok(DagId(id))
    }

    /// Wakes the workers waiting for work, after a commit that made tasks
    /// runnable: this process's at once, other processes' through a
    /// `pg_notify` sent on its own transaction (see the module docs).
    pub fn wake_workers(&self) {
        wake(&self.shared.notify);
        self.shared.hinter.get_or_init(|| {
            tokio::spawn(send_hints(
                self.pool.clone(),
                Arc::clone(&self.shared.hint_wanted),
                self.shared.own_hint.clone(),
            ))
        });
        self.shared.hint_wanted.notify_one();
    }

    /// One claim of up to `max` tasks (see [`TaskQueue::claim`]): one
    /// statement, the claimed nodes' DAG context included.
    async fn claim_now(
        &self,
        worker: &WorkerId,
        queue: &str,
        max: usize,
        lease: Duration,
    ) -> PortResult<Vec<Lease>> {
        let now = self.clock.now();
        let mut conn = self.conn().await?;
        let rows = sqlx::query(statements::CLAIM)
            .bind(worker.0)
            .bind(to_pg(now))
            .bind(queue)
            .bind(i64::try_from(max).unwrap_or(i64::MAX))
            .bind(millis(lease))
            .fetch_all(&mut *conn)
            .await
            .map_err(pg_err("claim tasks"))?;
        conn.keep();
        claimed_leases(rows, worker)
    }

    fn ensure_listener(&self) {
        self.shared.listener.get_or_init(|| {
            let pool = self.pool.clone();
            let notify = Arc::clone(&self.shared.notify);
            let own_hint = self.shared.own_hint.clone();
            tokio::spawn(async move {
                loop {
                    if let Ok(mut l) = PgListener::connect_with(&pool).await
                        && l.listen(CHANNEL).await.is_ok()
                    {
                        // Whatever was sent while we were away: poll now.
                        wake(&notify);
                        while let Ok(hint) = l.recv().await {
                            // This process woke its workers itself.
                            if hint.payload() != own_hint {
                                wake(&notify);
                            }
                        }
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            })
        });
    }

    /// Completes DAG nodes of one run in one transaction that locks the run
    /// first; one outcome per item. A lost lease or a map node's non-array
    /// result refuses that item only.
    async fn complete_in_run(
        &self,
        product: &ProductId,
        dag: DagId,
        items: &[(&Lease, &Value)],
        take: Option<Take<'_>>,
    ) -> PortResult<(Vec<PortResult<()>>, Vec<Lease>)> {
        let now = self.clock.now();
        let mut conn = self.conn().await?;
        let mut tx = conn.begin().await.map_err(pg_err("begin"))?;
        match lock_run(&mut tx, product, dag).await {
            // No such run under the leases' product: no lease can hold.
            Err(e) if e.is_not_found() => {
                let lost = items
                    .iter()
                    .map(|(l, _)| Err(PortError::lease_lost(l)))
                    .collect();
                return Ok((lost, Vec::new()));
            }
            other => other?,
        };
        let mut out = Vec::with_capacity(items.len());
        let mut enqueued = false;
        // Jobs the completions inserted for freed children.
        let mut freed: Vec<i64> = Vec::new();
        for &(lease, result) in items {
            let is_map = lease.dag.as_ref().is_some_and(|d| d.is_map);
            if is_map && !result.is_array() {
                let node = lease.dag.as_ref().map(|d| d.node.as_str()).unwrap_or("");
                out.push(Err(PortError::invalid(format!(
                    "map node {node:?} must return an array"
                ))));
                continue;
            }
            let max = self.config.dag_limits.max_nodes;
            if is_map && result.as_array().is_some_and(|a| a.len() > max) {
                let node = lease.dag.as_ref().map(|d| d.node.as_str()).unwrap_or("");
                let len = result.as_array().map_or(0, Vec::len);
                out.push(Err(PortError::invalid(format!(
                    "map node {node:?} returned {len} items; a map fans out to at most {max}"
                ))));
                continue;
            }
            let finished = fenced_finish(&mut tx, lease, job::COMPLETED, None, now).await;
            let node_id = match finished {
                Ok(Finished {
                    node: Some(n),
                    rerun_runnable,
                }) => {
                    enqueued |= rerun_runnable;
                    n
                }
                Ok(Finished { node: None, .. }) => {
                    out.push(Err(PortError::other("dag task without a node")));
                    continue;
                }
                Err(e) if e.is_lease_lost() => {
                    out.push(Err(e));
                    continue;
                }
                Err(e) => return Err(e),
            };
            if is_map {
                let items = result.as_array().map(Vec::as_slice).unwrap_or_default();
                if mark_done(&mut tx, product, dag, node_id, result, false, now).await? {
                    let key = lease.dag.as_ref().map(|d| d.node.as_str()).unwrap_or("");
                    enqueued |= expand_map(&mut tx, product, dag, node_id, key, items, now).await?;
                }
            } else {
                freed.extend(
                    finish_node(&mut tx, product, dag, node_id, result.clone(), now).await?,
                );
            }
            out.push(Ok(()));
        }
        // The completing worker takes freed children itself, in this
        // transaction: no claim of its own, no wait for a wake-up.
        let mut taken = Vec::new();
        if let Some(take) = take
            && take.max > 0
            && !freed.is_empty()
        {
            let sql = format!(
                "WITH c AS (SELECT product_id, id FROM jobs WHERE product_id = $3 \
                 AND id = ANY($4) AND state = 0 AND queue = $6 AND kind = ANY($7) \
                 AND run_at <= $2 ORDER BY priority, run_at, id LIMIT $8 FOR UPDATE), \
                 {CLAIM_TAIL}"
            );
            let rows = sqlx::query(&sql)
                .bind(take.worker.0)
                .bind(to_pg(now))
                .bind(product.as_str())
                .bind(&freed)
                .bind(millis(take.lease))
                .bind(take.queue)
                .bind(take.kinds)
                .bind(i64::try_from(take.max).unwrap_or(i64::MAX))
                .fetch_all(&mut *tx)
                .await
                .map_err(pg_err("claim freed tasks"))?;
            taken = claimed_leases(rows, take.worker)?;
        }
        // Other workers are woken only for the work left to them.
        enqueued |= freed.len() > taken.len();
        tx.commit().await.map_err(pg_err("commit"))?;
        conn.keep();
        if enqueued {
            self.wake_workers();
        }
        Ok((out, taken))
    }

    /// Discards the running job `lease` names (fenced) in its own
    /// transaction, failing its run first-locked.
    async fn discard(&self, lease: &Lease, error: &str) -> PortResult<()> {
        let now = self.clock.now();
        let mut conn = self.conn().await?;
        let mut tx = conn.begin().await.map_err(pg_err("begin"))?;
        let product = &lease.product_id;
        if let Some(dag) = &lease.dag {
            lock_lease_run(&mut tx, lease, dag.dag_id).await?;
        }
        let finished = fenced_finish(&mut tx, lease, job::DISCARDED, Some(error), now).await?;
        if let (Some(dag), Some(node_id)) = (&lease.dag, finished.node) {
            fail_run(&mut tx, product, dag.dag_id, node_id, error, now).await?;
        }
        tx.commit().await.map_err(pg_err("commit"))?;
        conn.keep();
        if finished.rerun_runnable {
            self.wake_workers();
        }
        Ok(())
    }

    async fn status(
        &self,
        conn: &mut PgConnection,
        product: &ProductId,
        id: DagId,
    ) -> PortResult<DagStatus> {
        let row = sqlx::query(
            "SELECT r.product_id, r.state, r.total_nodes, r.done_nodes, r.error, \
             ARRAY(SELECT label FROM dag_nodes WHERE product_id = $3 AND dag_run_id = r.id \
             AND state = $2 AND label IS NOT NULL GROUP BY label ORDER BY min(id)) AS labels \
             FROM dag_runs r WHERE r.product_id = $3 AND r.id = $1",
        )
        .bind(id.0)
        .bind(node::QUEUED)
        .bind(product.as_str())
        .fetch_optional(&mut *conn)
        .await
        .map_err(pg_err("load dag status"))?
        .ok_or_else(|| PortError::not_found(format!("dag run {id}")))?;
        let decode = || -> Result<DagStatus, sqlx::Error> {
            let product: String = row.try_get("product_id")?;
            let error: Option<Value> = row.try_get("error")?;
            Ok(DagStatus {
                id,
                product_id: ProductId::parse(product)
                    .map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
                state: run_state(row.try_get("state")?),
                total: u32::try_from(row.try_get::<i32, _>("total_nodes")?).unwrap_or(0),
                done: u32::try_from(row.try_get::<i32, _>("done_nodes")?).unwrap_or(0),
                labels: row.try_get("labels")?,
                error: error.map(|e| DagFailure {
                    node: e["node"].as_str().unwrap_or_default().to_owned(),
                    message: e["message"].as_str().unwrap_or_default().to_owned(),
                }),
            })
        };
        decode().map_err(pg_err("decode dag status"))
    }
}

const CLAIM_TAIL: &str = claim_tail!();

/// The leases of a statement ending in [`CLAIM_TAIL`], best first
/// (priority, then `run_at`, then enqueue order).
fn claimed_leases(rows: Vec<sqlx::postgres::PgRow>, worker: &WorkerId) -> PortResult<Vec<Lease>> {
    let mut leases = Vec::with_capacity(rows.len());
    for r in rows {
        let decoded = (|| -> Result<_, sqlx::Error> {
            let product: String = r.try_get("product_id")?;
            let node: Option<i64> = r.try_get("node_id")?;
            let dag = match node {
                None => None,
                Some(_) => {
                    let from: Option<String> = r.try_get("input_from")?;
                    let inputs = match from {
                        Some(from) => vec![NodeInput {
                            from,
                            value: r
                                .try_get::<Option<Value>, _>("input")?
                                .unwrap_or(Value::Null),
                        }],
                        None => r
                            .try_get::<Option<Value>, _>("parents")?
                            .as_ref()
                            .and_then(Value::as_array)
                            .map(|ps| {
                                ps.iter()
                                    .map(|p| NodeInput {
                                        from: p[0].as_str().unwrap_or_default().to_owned(),
                                        value: p[1].clone(),
                                    })
                                    .collect()
                            })
                            .unwrap_or_default(),
                    };
                    Some(DagTask {
                        dag_id: DagId(r.try_get("dag_run_id")?),
                        node: r.try_get("node_key")?,
                        inputs,
                        is_map: r.try_get("is_map")?,
                    })
                }
            };
            let lease = Lease {
                task_id: TaskId(r.try_get("id")?),
                token: r.try_get("lease_token")?,
                worker: *worker,
                product_id: ProductId::parse(product)
                    .map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
                kind: r.try_get("kind")?,
                queue: r.try_get("queue")?,
                payload: r.try_get("args")?,
                attempt: u32::try_from(r.try_get::<i32, _>("attempt")?).unwrap_or(0),
                max_attempts: u32::try_from(r.try_get::<i32, _>("max_attempts")?).unwrap_or(1),
                expires_at: from_pg(r.try_get("lease_expires_at")?),
                dag,
            };
            let key = (
                r.try_get::<i16, _>("priority")?,
                from_pg(r.try_get("run_at")?),
                lease.task_id,
            );
            Ok((key, lease))
        })()
        .map_err(pg_err("decode claimed tasks"))?;
        leases.push(decoded);
    }
    leases.sort_by_key(|(k, _)| *k);
    Ok(leases.into_iter().map(|(_, l)| l).collect())
}

/// Sends the wake-up hints `shared` asks for, one at a time, each a
/// `pg_notify` in its own transaction committed without waiting for its
/// flush (a hint lost in a crash costs latency, never work). The payload is
/// the queue's id, so its own listener skips it: this process's workers were
/// woken directly. A failed hint is not retried; workers also poll.
async fn send_hints(pool: PgPool, wanted: Arc<Notify>, payload: String) {
    loop {
        wanted.notified().await;
        let sent = sqlx::query(
            "SELECT pg_notify($1, $2) \
             FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit",
        )
        .bind(CHANNEL)
        .bind(&payload)
        .execute(&pool)
        .await;
        if let Err(e) = sent {
            tracing::debug!(error = %e, "wake-up hint not sent; workers poll");
        }
    }
}

/// Locks `product`'s run row: every change to a run and its jobs starts
/// here. `NotFound` for an unknown run or another product's.
async fn lock_run(conn: &mut PgConnection, product: &ProductId, dag: DagId) -> PortResult<i16> {
    sqlx::query_scalar("SELECT state FROM dag_runs WHERE product_id = $2 AND id = $1 FOR UPDATE")
        .bind(dag.0)
        .bind(product.as_str())
        .fetch_optional(conn)
        .await
        .map_err(pg_err("lock dag run"))?
        .ok_or_else(|| PortError::not_found(format!("dag run {dag}")))
}

/// Locks the run of `lease`'s DAG node; a run not found under the lease's
/// product means the lease is lost.
async fn lock_lease_run(conn: &mut PgConnection, lease: &Lease, dag: DagId) -> PortResult<i16> {
    lock_run(conn, &lease.product_id, dag).await.map_err(|e| {
        if e.is_not_found() {
            PortError::lease_lost(lease)
        } else {
            e
        }
    })
}

/// Binds a fenced finish's parameters: the lease's task `$1`, token `$2`,
/// worker `$6` and product `$7`, the new state `$3`, the time `$4` and the
/// error `$5`.
macro_rules! bind_finish {
    ($q:expr, $lease:expr, $state:expr, $error:expr, $now:expr) => {
        $q.bind($lease.task_id.0)
            .bind($lease.token)
            .bind($state)
            .bind(to_pg($now))
            .bind($error)
            .bind($lease.worker.0)
            .bind($lease.product_id.as_str())
    };
}

/// What a fenced finish did.
#[derive(Debug, Clone, Copy)]
struct Finished {
    /// The job's node; `None` for a task outside any DAG.
    node: Option<i64>,
    /// A request folded into the job was enqueued as a fresh job that is
    /// runnable now: the workers are to be woken after the commit.
    rerun_runnable: bool,
}

/// The fenced end of a lease: moves the job (looked up under the lease's
/// product) from running to `state` (completed, discarded or cancelled); a
/// completed job drops its payload (it never runs again). A request folded
/// into the job while it ran is enqueued as a fresh job with its key in
/// the same statement. Lease lost is an error.
///
/// The plain update runs first, with `rerun IS NULL` added to its fence;
/// only when it finds no row (the job was marked, or the lease is lost)
/// does [`finish_marked`] run. Why no interleaving with an enqueue of the
/// job's key loses the request, under READ COMMITTED:
///
/// - The enqueue marks the job with `ON CONFLICT … DO UPDATE … WHERE
///   jobs.state = 1`, which locks the row it conflicts with and reads its
///   newest version; a row another transaction changed and committed since
///   the enqueue's check makes it start over, so it never marks a finished
///   row, and only marks a row that is running at that moment.
/// - Updates of one row are serialised by its row lock. If the mark comes
///   first, the finish's update (waiting for the lock, or finding a newer
///   version than its snapshot's) evaluates its fence again on the newest
///   version, where `rerun IS NULL` fails; [`finish_marked`] then locks
///   the row (`FOR UPDATE` returns its newest version, so the newest mark)
///   and finishes it with the fresh job, and while it holds the lock no
///   other mark can come.
/// - If the finish comes first, the row stays live in `jobs_dedup` until
///   the finish commits: the enqueue's check finds the row's index entry,
///   sees its version changed by a transaction in progress, and waits for
///   that transaction (or, having found it first, its attempt to lock the
///   row waits). After the commit the row is finished (a change of `state`
///   is never a HOT update: `state` is in the indexes' predicates), so the
///   enqueue starts over and finds no conflict and inserts its own job, or
///   finds the fresh job the finish inserted, waiting, and is answered by
///   it as any request meeting a waiting job.
///
/// So a request that answers `None` is either taken by the job's next run
/// (the mark) or by a waiting job, and two live jobs never share a key.
async fn fenced_finish(
    conn: &mut PgConnection,
    lease: &Lease,
    state: i16,
    error: Option<&str>,
    now: Timestamp,
) -> PortResult<Finished> {
    let row: Vec<(Option<i64>,)> = bind_finish!(
        sqlx::query_as(
            "UPDATE jobs SET state = $3, finished_at = $4, leased_by = NULL, \
             last_error = coalesce($5, last_error), \
             args = CASE WHEN $3 = 2 THEN 'null'::jsonb ELSE args END \
             WHERE product_id = $7 AND id = $1 AND state = 1 AND lease_token = $2 \
             AND leased_by = $6 AND rerun IS NULL RETURNING node_id",
        ),
        lease,
        state,
        error,
        now
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(pg_err("finish task"))?;
    if let Some((node,)) = row.into_iter().next() {
        return Ok(Finished {
            node,
            rerun_runnable: false,
        });
    }
    finish_marked(conn, lease, state, error, now)
        .await?
        .ok_or_else(|| PortError::lease_lost(lease))
}

/// [`fenced_finish`] of a job a request was folded into: one statement
/// locks the running job (its newest version, with the newest mark),
/// finishes it with the mark cleared, and inserts the fresh job the mark
/// describes, of the job's kind and with its key. `None` when the lease
/// does not hold.
async fn finish_marked(
    conn: &mut PgConnection,
    lease: &Lease,
    state: i16,
    error: Option<&str>,
    now: Timestamp,
) -> PortResult<Option<Finished>> {
    let row: Option<(Option<i64>, bool)> = bind_finish!(
        sqlx::query_as(
            "WITH o AS (SELECT product_id, id, rerun FROM jobs \
             WHERE product_id = $7 AND id = $1 AND state = 1 AND lease_token = $2 \
             AND leased_by = $6 FOR UPDATE), \
             f AS (UPDATE jobs j SET state = $3, finished_at = $4, leased_by = NULL, rerun = NULL, \
             last_error = coalesce($5, j.last_error), \
             args = CASE WHEN $3 = 2 THEN 'null'::jsonb ELSE j.args END \
             FROM o WHERE j.product_id = o.product_id AND j.id = o.id \
             RETURNING j.product_id, j.kind, j.dedup_key, j.node_id, o.rerun), \
             r AS (INSERT INTO jobs (product_id, queue, kind, priority, run_at, max_attempts, \
             timeout_ms, args, dedup_key, created_at) \
             SELECT f.product_id, f.rerun->>'queue', f.kind, (f.rerun->>'priority')::int2, \
             (f.rerun->>'run_at')::timestamptz, (f.rerun->>'max_attempts')::int4, \
             (f.rerun->>'timeout_ms')::int8, f.rerun->'args', f.dedup_key, $4 \
             FROM f WHERE f.rerun IS NOT NULL RETURNING run_at) \
             SELECT f.node_id, EXISTS (SELECT 1 FROM r WHERE r.run_at <= $4) FROM f",
        ),
        lease,
        state,
        error,
        now
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(pg_err("finish task and enqueue what was folded into it"))?;
    Ok(row.map(|(node, rerun_runnable)| Finished {
        node,
        rerun_runnable,
    }))
}

/// The `SET` list that makes a running job available again from `run_at`
/// with `attempt` attempts made (SQL expressions on the row). A request
/// folded into the job is what runs next: the job takes its payload and
/// settings, its attempts counted afresh, not before the request's
/// `run_at`, and the mark goes. `SET` reads the newest version of the row
/// its `UPDATE` locked, so a mark made before the requeue is taken, and an
/// enqueue after it finds the job waiting (see [`fenced_finish`]).
fn requeue_set(run_at: &str, attempt: &str) -> String {
    format!(
        "state = 0, leased_by = NULL, rerun = NULL, \
         run_at = CASE WHEN rerun IS NULL THEN {run_at} \
         ELSE greatest({run_at}, (rerun->>'run_at')::timestamptz) END, \
         attempt = CASE WHEN rerun IS NULL THEN {attempt} ELSE 0 END, \
         args = coalesce(rerun->'args', args), queue = coalesce(rerun->>'queue', queue), \
         priority = coalesce((rerun->>'priority')::int2, priority), \
         max_attempts = coalesce((rerun->>'max_attempts')::int4, max_attempts), \
         timeout_ms = CASE WHEN rerun IS NULL THEN timeout_ms \
         ELSE (rerun->>'timeout_ms')::int8 END"
    )
}

/// Stores a node's result and counts it done, finishing the run when that
/// was its last node (`may_finish`: a map node never is, since its
/// expansion grows the total); says whether the run is still running (only
/// then do children move). The node drops its payload and an element's
/// input; a map node keeps its element template until it has expanded.
async fn mark_done(
    conn: &mut PgConnection,
    product: &ProductId,
    dag: DagId,
    node_id: i64,
    result: &Value,
    may_finish: bool,
    now: Timestamp,
) -> PortResult<bool> {
    let state: i16 = sqlx::query_scalar(
        "WITH n AS (UPDATE dag_nodes SET state = $3, result = $4, payload = 'null'::jsonb, \
         input = NULL WHERE product_id = $9 AND id = $2) \
         UPDATE dag_runs SET done_nodes = done_nodes + 1, \
         state = CASE WHEN $5 AND state = $6 AND done_nodes + 1 = total_nodes \
         THEN $7 ELSE state END, \
         finished_at = CASE WHEN $5 AND state = $6 AND done_nodes + 1 = total_nodes \
         THEN $8 ELSE finished_at END \
         WHERE product_id = $9 AND id = $1 RETURNING state",
    )
    .bind(dag.0)
    .bind(node_id)
    .bind(node::COMPLETED)
    .bind(result)
    .bind(may_finish)
    .bind(run::RUNNING)
    .bind(run::COMPLETED)
    .bind(to_pg(now))
    .bind(product.as_str())
    .fetch_one(&mut *conn)
    .await
    .map_err(pg_err("store node result"))?;
    Ok(state == run::RUNNING)
}

/// Completes `node_id` with `result` and frees its children: one statement
/// decrements their counters and enqueues those that reached zero; combine
/// nodes that reached zero resolve in the same transaction. Returns the
/// ids of the jobs enqueued.
async fn finish_node(
    conn: &mut PgConnection,
    product: &ProductId,
    dag: DagId,
    node_id: i64,
    result: Value,
    now: Timestamp,
) -> PortResult<Vec<i64>> {
    let mut work = vec![(node_id, result)];
    let mut enqueued = Vec::new();
    while let Some((n, result)) = work.pop() {
        if !mark_done(conn, product, dag, n, &result, true, now).await? {
            continue;
        }
        let (jobs, combines): (Vec<i64>, Vec<i64>) = sqlx::query_as(
            "WITH d AS (UPDATE dag_nodes SET remaining_deps = remaining_deps - 1, \
             state = CASE WHEN remaining_deps = 1 AND role = 0 THEN $2 ELSE state END \
             WHERE product_id = $5 \
             AND id IN (SELECT child_id FROM dag_edges WHERE product_id = $5 AND parent_id = $1) \
             AND remaining_deps > 0 \
             RETURNING id, role, remaining_deps, kind, priority, max_attempts, timeout_ms, \
             payload, dag_run_id), \
             ins AS (INSERT INTO jobs (product_id, queue, kind, priority, run_at, max_attempts, \
             timeout_ms, dag_run_id, node_id, args, created_at) \
             SELECT r.product_id, r.queue, d.kind, d.priority, $3, d.max_attempts, d.timeout_ms, \
             r.id, d.id, d.payload, $3 FROM d JOIN dag_runs r \
             ON r.product_id = $5 AND r.id = d.dag_run_id \
             WHERE d.remaining_deps = 0 AND d.role = 0 ORDER BY d.id RETURNING id) \
             SELECT (SELECT coalesce(array_agg(id), '{}') FROM ins), \
             coalesce(array_agg(d.id ORDER BY d.id) FILTER (WHERE d.remaining_deps = 0 \
             AND d.role = $4), '{}') FROM d",
        )
        .bind(n)
        .bind(node::QUEUED)
        .bind(to_pg(now))
        .bind(node::ROLE_COMBINE)
        .bind(product.as_str())
        .fetch_one(&mut *conn)
        .await
        .map_err(pg_err("free child nodes"))?;
        enqueued.extend(jobs);
        for child in combines {
            let list: Value = sqlx::query_scalar(
                "SELECT coalesce(jsonb_agg(p.result ORDER BY e.position), '[]'::jsonb) \
                 FROM dag_edges e JOIN dag_nodes p \
                 ON p.product_id = e.product_id AND p.id = e.parent_id \
                 WHERE e.product_id = $2 AND e.child_id = $1",
            )
            .bind(child)
            .bind(product.as_str())
            .fetch_one(&mut *conn)
            .await
            .map_err(pg_err("combine results"))?;
            work.push((child, list));
        }
    }
    Ok(enqueued)
}

/// Inserts jobs for `product`'s nodes whose parents are all done.
async fn enqueue_nodes(
    conn: &mut PgConnection,
    product: &ProductId,
    nodes: &[i64],
    now: Timestamp,
) -> PortResult<bool> {
    if nodes.is_empty() {
        return Ok(false);
    }
    sqlx::query(
        "WITH n AS (UPDATE dag_nodes SET state = $2 WHERE product_id = $4 AND id = ANY($1) \
         RETURNING *) \
         INSERT INTO jobs (product_id, queue, kind, priority, run_at, max_attempts, timeout_ms, \
         dag_run_id, node_id, args, created_at) \
         SELECT r.product_id, r.queue, n.kind, n.priority, $3, n.max_attempts, n.timeout_ms, \
         r.id, n.id, n.payload, $3 FROM n JOIN dag_runs r \
         ON r.product_id = $4 AND r.id = n.dag_run_id ORDER BY n.id",
    )
    .bind(nodes)
    .bind(node::QUEUED)
    .bind(to_pg(now))
    .bind(product.as_str())
    .execute(conn)
    .await
    .map_err(pg_err("enqueue dag nodes"))?;
    Ok(true)
}

/// Replaces map node `node_id`'s outgoing edges by a combine node fed by one
/// new node per element, and enqueues the elements.
async fn expand_map(
    conn: &mut PgConnection,
    product: &ProductId,
    dag: DagId,
    node_id: i64,
    key: &str,
    items: &[Value],
    now: Timestamp,
) -> PortResult<bool> {
    let keys: Vec<String> = (0..items.len()).map(|i| map_element_key(key, i)).collect();
    let mut elements: Vec<i64> = sqlx::query_scalar(
        "INSERT INTO dag_nodes (product_id, dag_run_id, key, kind, label, payload, input_from, \
         input, priority, max_attempts, timeout_ms, remaining_deps) \
         SELECT m.product_id, m.dag_run_id, k, m.map_spec->>'kind', m.map_spec->>'label', \
         m.map_spec->'payload', m.key, v, m.priority, m.max_attempts, m.timeout_ms, 0 \
         FROM dag_nodes m, UNNEST($3::text[], $4::jsonb[]) WITH ORDINALITY AS t(k, v, ord) \
         WHERE m.product_id = $5 AND m.id = $1 AND m.dag_run_id = $2 ORDER BY ord RETURNING id",
    )
    .bind(node_id)
    .bind(dag.0)
    .bind(&keys)
    .bind(items)
    .bind(product.as_str())
    .fetch_all(&mut *conn)
    .await
    .map_err(pg_err("add map elements"))?;
    elements.sort_unstable();
    let combine: i64 = sqlx::query_scalar(
        "INSERT INTO dag_nodes (product_id, dag_run_id, key, kind, role, payload, priority, \
         max_attempts, timeout_ms, remaining_deps) \
         SELECT product_id, dag_run_id, $2, '', $3, 'null'::jsonb, priority, max_attempts, \
         timeout_ms, $4 FROM dag_nodes WHERE product_id = $5 AND id = $1 RETURNING id",
    )
    .bind(node_id)
    .bind(map_combine_key(key))
    .bind(node::ROLE_COMBINE)
    .bind(i32::try_from(items.len()).unwrap_or(i32::MAX))
    .bind(product.as_str())
    .fetch_one(&mut *conn)
    .await
    .map_err(pg_err("add map combine node"))?;
    // Expanded: the map node keeps no element template.
    sqlx::query("UPDATE dag_nodes SET map_spec = NULL WHERE product_id = $2 AND id = $1")
        .bind(node_id)
        .bind(product.as_str())
        .execute(&mut *conn)
        .await
        .map_err(pg_err("compact map node"))?;
    sqlx::query("UPDATE dag_edges SET parent_id = $2 WHERE product_id = $3 AND parent_id = $1")
        .bind(node_id)
        .bind(combine)
        .bind(product.as_str())
        .execute(&mut *conn)
        .await
        .map_err(pg_err("re-point map edges"))?;
    sqlx::query(
        "INSERT INTO dag_edges (product_id, dag_run_id, parent_id, child_id, position) \
         SELECT $4, $1, p, $2, ord - 1 FROM UNNEST($3::int8[]) WITH ORDINALITY AS t(p, ord)",
    )
    .bind(dag.0)
    .bind(combine)
    .bind(&elements)
    .bind(product.as_str())
    .execute(&mut *conn)
    .await
    .map_err(pg_err("add map edges"))?;
    sqlx::query(
        "UPDATE dag_runs SET total_nodes = total_nodes + $2 WHERE product_id = $3 AND id = $1",
    )
    .bind(dag.0)
    .bind(i32::try_from(items.len() + 1).unwrap_or(i32::MAX))
    .bind(product.as_str())
    .execute(&mut *conn)
    .await
    .map_err(pg_err("grow dag total"))?;
    if items.is_empty() {
        let freed = finish_node(conn, product, dag, combine, json!([]), now).await?;
        return Ok(!freed.is_empty());
    }
    enqueue_nodes(conn, product, &elements, now).await
}

/// Marks `node_id` failed and, if the run is still running, fails it with
/// the node's error and cancels its queued jobs and waiting nodes. The run
/// row must be locked.
async fn fail_run(
    conn: &mut PgConnection,
    product: &ProductId,
    dag: DagId,
    node_id: i64,
    error: &str,
    now: Timestamp,
) -> PortResult<()> {
    let key: String = sqlx::query_scalar(
        "UPDATE dag_nodes SET state = $2 WHERE product_id = $3 AND id = $1 RETURNING key",
    )
    .bind(node_id)
    .bind(node::FAILED)
    .bind(product.as_str())
    .fetch_one(&mut *conn)
    .await
    .map_err(pg_err("fail dag node"))?;
    let failure = json!({"node": key, "message": error});
    stop_run(
        conn,
        product,
        dag,
        run::FAILED,
        Some(failure),
        &[job::AVAILABLE],
        now,
    )
    .await
}

/// Ends a running run in `state`, cancelling its jobs in `job_states` and
/// every node that has not finished. A run's jobs carry no dedup key, so
/// no request was folded into one of them.
async fn stop_run(
    conn: &mut PgConnection,
    product: &ProductId,
    dag: DagId,
    state: i16,
    error: Option<Value>,
    job_states: &[i16],
    now: Timestamp,
) -> PortResult<()> {
    let stopped = sqlx::query(
        "UPDATE dag_runs SET state = $2, error = $3, finished_at = $4 \
         WHERE product_id = $6 AND id = $1 AND state = $5",
    )
    .bind(dag.0)
    .bind(state)
    .bind(error)
    .bind(to_pg(now))
    .bind(run::RUNNING)
    .bind(product.as_str())
    .execute(&mut *conn)
    .await
    .map_err(pg_err("stop dag run"))?
    .rows_affected();
    if stopped == 0 {
        return Ok(());
    }
    sqlx::query(
        "WITH c AS (UPDATE jobs SET state = $3, finished_at = $4, leased_by = NULL \
         WHERE product_id = $7 AND dag_run_id = $1 AND state = ANY($2) RETURNING node_id) \
         UPDATE dag_nodes SET state = $5 WHERE product_id = $7 \
         AND (id IN (SELECT node_id FROM c) OR (dag_run_id = $1 AND state = $6))",
    )
    .bind(dag.0)
    .bind(job_states)
    .bind(job::CANCELLED)
    .bind(to_pg(now))
    .bind(node::CANCELLED)
    .bind(node::PENDING)
    .bind(product.as_str())
    .execute(conn)
    .await
    .map_err(pg_err("cancel dag jobs"))?;
    Ok(())
}

#[async_trait]
impl TaskQueue for PgTaskQueue {
    #[tracing::instrument(level = "debug", skip_all, fields(tasks = tasks.len()))]
    async fn enqueue(&self, tasks: &[TaskSpec]) -> PortResult<Vec<Option<TaskId>>> {
        if tasks.iter().all(|t| t.dedup_key.is_none()) {
            // Without dedup keys `enqueue_in` sends one statement, atomic
            // on its own: no transaction round trips.
            let mut conn = self.conn().await?;
            let (ids, runnable) = self.enqueue_rows(&mut conn, tasks).await?;
            conn.keep();
            if runnable {
                self.wake_workers();
            }
            return Ok(ids);
        }
        let mut tx = self.pool.begin().await.map_err(pg_err("begin"))?;
        let (ids, runnable) = self.enqueue_rows(&mut tx, tasks).await?;
        tx.commit().await.map_err(pg_err("commit"))?;
        if runnable {
            self.wake_workers();
        }
        Ok(ids)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(product_id = %spec.product_id, nodes = spec.nodes.len()))]
    async fn enqueue_dag(&self, spec: &DagSpec) -> PortResult<DagId> {
        let mut tx = self.pool.begin().await.map_err(pg_err("begin"))?;
        let id = self.enqueue_dag_in(&mut tx, spec).await?;
        tx.commit().await.map_err(pg_err("commit"))?;
        self.wake_workers();
        Ok(id)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(worker = %worker, queue = %queue, max = max))]
    async fn claim(
        &self,
        worker: &WorkerId,
        queue: &str,
        max: usize,
        lease: Duration,
    ) -> PortResult<Vec<Lease>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        // A wake-up left before this claim began is answered by it: it
        // sees every commit that woke. Left in place, the permit sends the
        // worker straight back to claim again for nothing, twice per task.
        // A claim that comes back full (or fails) leaves it, for the work
        // it may not have taken.
        let had_permit = take_permit(&self.shared.notify);
        let claimed = self.claim_now(worker, queue, max, lease).await;
        if had_permit && claimed.as_ref().map_or(true, |l| l.len() >= max) {
            self.shared.notify.notify_one();
        }
        claimed
    }

    #[tracing::instrument(level = "debug", skip_all, fields(task_id = %lease.task_id))]
    async fn complete(&self, lease: &Lease, result: Value) -> PortResult<()> {
        if let Some(dag) = &lease.dag {
            let (mut out, _) = self
                .complete_in_run(&lease.product_id, dag.dag_id, &[(lease, &result)], None)
                .await?;
            return out.pop().unwrap_or(Ok(()));
        }
        let now = self.clock.now();
        let mut conn = self.conn().await?;
        match fenced_finish(&mut conn, lease, job::COMPLETED, None, now).await {
            Ok(finished) => {
                conn.keep();
                if finished.rerun_runnable {
                    self.wake_workers();
                }
                Ok(())
            }
            Err(e) if e.is_lease_lost() => {
                conn.keep();
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    #[tracing::instrument(level = "debug", skip_all, fields(task_id = %lease.task_id))]
    async fn complete_and_claim(
        &self,
        lease: &Lease,
        result: Value,
        kinds: &[String],
        max: usize,
        lease_for: Duration,
    ) -> PortResult<Vec<Lease>> {
        let Some(dag) = &lease.dag else {
            return self.complete(lease, result).await.map(|()| Vec::new());
        };
        let take = Take {
            worker: &lease.worker,
            queue: &lease.queue,
            kinds,
            max,
            lease: lease_for,
        };
        let (mut out, taken) = self
            .complete_in_run(
                &lease.product_id,
                dag.dag_id,
                &[(lease, &result)],
                Some(take),
            )
            .await?;
        out.pop().unwrap_or(Ok(()))?;
        Ok(taken)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(tasks = done.len()))]
    async fn complete_many(&self, done: &[(Lease, Value)]) -> PortResult<Vec<PortResult<()>>> {
        let now = self.clock.now();
        let plain: Vec<&Lease> = done
            .iter()
            .map(|(l, _)| l)
            .filter(|l| l.dag.is_none())
            .collect();
        let mut recorded = std::collections::HashSet::new();
        // Tasks a request was folded into whose completion failed.
        let mut failed: HashMap<i64, PortError> = HashMap::new();
        let mut wake = false;
        if !plain.is_empty() {
            let mut conn = self.conn().await?;
            let ids: Vec<i64> = sqlx::query_scalar(statements::COMPLETE)
                .bind(plain.iter().map(|l| l.task_id.0).collect::<Vec<_>>())
                .bind(plain.iter().map(|l| l.token).collect::<Vec<_>>())
                .bind(to_pg(now))
                .bind(plain.iter().map(|l| l.worker.0).collect::<Vec<_>>())
                .bind(
                    plain
                        .iter()
                        .map(|l| l.product_id.as_str())
                        .collect::<Vec<_>>(),
                )
                .fetch_all(&mut *conn)
                .await
                .map_err(pg_err("complete tasks"))?;
            recorded.extend(ids);
            // What the batch left are lost leases and tasks a request was
            // folded into: each of those is completed by a statement of
            // its own, which enqueues the request.
            let left: Vec<&Lease> = plain
                .iter()
                .filter(|l| !recorded.contains(&l.task_id.0))
                .copied()
                .collect();
            for lease in left {
                match finish_marked(&mut conn, lease, job::COMPLETED, None, now).await {
                    Ok(Some(finished)) => {
                        recorded.insert(lease.task_id.0);
                        wake |= finished.rerun_runnable;
                    }
                    Ok(None) => {}
                    Err(e) => {
                        failed.insert(lease.task_id.0, e);
                    }
                }
            }
            if failed.is_empty() {
                conn.keep();
            }
            if wake {
                self.wake_workers();
            }
        }
        // DAG nodes: one transaction per run, in the order given.
        let mut runs: Vec<(&ProductId, DagId)> = Vec::new();
        for (lease, _) in done {
            if let Some(d) = &lease.dag
                && !runs.contains(&(&lease.product_id, d.dag_id))
            {
                runs.push((&lease.product_id, d.dag_id));
            }
        }
        let mut dag_out: HashMap<(i64, i64), PortResult<()>> = HashMap::new();
        for (product, run) in runs {
            let items: Vec<(&Lease, &Value)> = done
                .iter()
                .filter(|(l, _)| {
                    &l.product_id == product && l.dag.as_ref().is_some_and(|d| d.dag_id == run)
                })
                .map(|(l, v)| (l, v))
                .collect();
            match self.complete_in_run(product, run, &items, None).await {
                Ok((results, _)) => {
                    for ((l, _), r) in items.iter().zip(results) {
                        dag_out.insert((l.task_id.0, l.token), r);
                    }
                }
                Err(e) => {
                    for (l, _) in &items {
                        let copy = PortError::new(e.kind, e.message.clone());
                        dag_out.insert((l.task_id.0, l.token), Err(copy));
                    }
                }
            }
        }
        Ok(done
            .iter()
            .map(|(lease, _)| match &lease.dag {
                Some(_) => dag_out
                    .remove(&(lease.task_id.0, lease.token))
                    .unwrap_or_else(|| Err(PortError::lease_lost(lease))),
                None if recorded.contains(&lease.task_id.0) => Ok(()),
                None => match failed.remove(&lease.task_id.0) {
                    Some(e) => Err(e),
                    None => Err(PortError::lease_lost(lease)),
                },
            })
            .collect())
    }

    #[tracing::instrument(level = "debug", skip_all, fields(task_id = %lease.task_id, retryable = retryable))]
    async fn fail(&self, lease: &Lease, error: &str, retryable: bool) -> PortResult<FailOutcome> {
        let now = self.clock.now();
        let decision = decide_retry(
            lease.attempt,
            lease.max_attempts,
            retryable,
            &self.config.backoff,
            jitter_from_seed(lease.token.unsigned_abs()),
        );
        match decision {
            RetryDecision::RetryAfter(delay) => {
                let run_at = now + delay;
                let mut conn = self.conn().await?;
                let mut tx = conn.begin().await.map_err(pg_err("begin"))?;
                if let Some(dag) = &lease.dag
                    && lock_lease_run(&mut tx, lease, dag.dag_id).await? != run::RUNNING
                {
                    let finished =
                        fenced_finish(&mut tx, lease, job::CANCELLED, Some(error), now).await?;
                    sqlx::query(
                        "UPDATE dag_nodes SET state = $2 WHERE product_id = $3 AND id = $1",
                    )
                    .bind(finished.node)
                    .bind(node::CANCELLED)
                    .bind(lease.product_id.as_str())
                    .execute(&mut *tx)
                    .await
                    .map_err(pg_err("cancel dag node"))?;
                    tx.commit().await.map_err(pg_err("commit"))?;
                    conn.keep();
                    return Ok(FailOutcome::Cancelled);
                }
                let retried: Option<time::OffsetDateTime> = sqlx::query_scalar(&format!(
                    "UPDATE jobs SET {}, last_error = $4 \
                     WHERE product_id = $6 AND id = $1 AND state = 1 AND lease_token = $2 \
                     AND leased_by = $5 RETURNING run_at",
                    requeue_set("$3", "attempt")
                ))
                .bind(lease.task_id.0)
                .bind(lease.token)
                .bind(to_pg(run_at))
                .bind(error)
                .bind(lease.worker.0)
                .bind(lease.product_id.as_str())
                .fetch_optional(&mut *tx)
                .await
                .map_err(pg_err("retry task"))?;
                let Some(run_at) = retried else {
                    return Err(PortError::lease_lost(lease));
                };
                tx.commit().await.map_err(pg_err("commit"))?;
                conn.keep();
                Ok(FailOutcome::Retrying {
                    run_at: from_pg(run_at),
                })
            }
            RetryDecision::Discard => {
                self.discard(lease, error).await?;
                Ok(FailOutcome::Discarded)
            }
        }
    }

    async fn release(&self, lease: &Lease) -> PortResult<()> {
        let now = self.clock.now();
        let mut conn = self.conn().await?;
        let n = sqlx::query(&format!(
            "UPDATE jobs SET {} WHERE product_id = $5 AND id = $1 AND state = 1 \
             AND lease_token = $2 AND leased_by = $4",
            requeue_set("$3", "greatest(attempt - 1, 0)")
        ))
        .bind(lease.task_id.0)
        .bind(lease.token)
        .bind(to_pg(now))
        .bind(lease.worker.0)
        .bind(lease.product_id.as_str())
        .execute(&mut *conn)
        .await
        .map_err(pg_err("release task"))?
        .rows_affected();
        conn.keep();
        if n == 0 {
            return Err(PortError::lease_lost(lease));
        }
        wake(&self.shared.notify);
        Ok(())
    }

    async fn release_unheld(&self, worker: &WorkerId, held: &[TaskId]) -> PortResult<u64> {
        let now = self.clock.now();
        let held: Vec<i64> = held.iter().map(|t| t.0).collect();
        let n = sqlx::query(&format!(
            "UPDATE jobs SET {} WHERE state = 1 AND leased_by = $1 AND NOT (id = ANY($2))",
            requeue_set("$3", "greatest(attempt - 1, 0)")
        ))
        .bind(worker.0)
        .bind(&held)
        .bind(to_pg(now))
        .execute(&self.pool)
        .await
        .map_err(pg_err("release unheld tasks"))?
        .rows_affected();
        if n > 0 {
            self.wake_workers();
        }
        Ok(n)
    }

    async fn heartbeat(&self, worker: &WorkerId) -> PortResult<()> {
        let now = self.clock.now();
        let mut conn = self.conn().await?;
        sqlx::query(
            "INSERT INTO workers (id, started_at, last_seen) VALUES ($1, $2, $2) \
             ON CONFLICT (id) DO UPDATE SET last_seen = EXCLUDED.last_seen",
        )
        .bind(worker.0)
        .bind(to_pg(now))
        .execute(&mut *conn)
        .await
        .map_err(pg_err("heartbeat"))?;
        conn.keep();
        Ok(())
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn recover_expired(&self) -> PortResult<RecoverReport> {
        let now = self.clock.now();
        let stale = now - self.config.worker_stale_after;
        let lost = "state = 1 AND (lease_expires_at <= $1 OR NOT EXISTS (SELECT 1 FROM workers w \
                    WHERE w.id = jobs.leased_by AND w.last_seen >= $2))";
        let mut report = RecoverReport::default();
        let live_run = "(dag_run_id IS NULL OR EXISTS (SELECT 1 FROM dag_runs r \
                        WHERE r.product_id = jobs.product_id AND r.id = jobs.dag_run_id \
                        AND r.state = 0))";
        // Tasks of runs that are over are cancelled, not retried. They are
        // DAG nodes' tasks, which carry no dedup key: no request was folded
        // into them. Each batch answers how many tasks of each queue it
        // took.
        let per_queue = |report: &mut RecoverReport, rows: &[(String, i64)]| -> u64 {
            let mut total = 0;
            for (queue, n) in rows {
                let n = u64::try_from(*n).unwrap_or(0);
                report.count(queue, n);
                total += n;
            }
            total
        };
        loop {
            let rows: Vec<(String, i64)> = sqlx::query_as(&format!(
                "WITH c AS (UPDATE jobs j SET state = 4, finished_at = $1, leased_by = NULL \
                 FROM (SELECT product_id, id FROM jobs WHERE {lost} AND NOT {live_run} \
                 ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED) c \
                 WHERE j.product_id = c.product_id AND j.id = c.id \
                 RETURNING j.product_id, j.node_id, j.queue), \
                 n AS (UPDATE dag_nodes SET state = 4 \
                 WHERE (product_id, id) IN (SELECT product_id, node_id FROM c)) \
                 SELECT queue, count(*) FROM c GROUP BY queue"
            ))
            .bind(to_pg(now))
            .bind(to_pg(stale))
            .bind(BATCH)
            .fetch_all(&self.pool)
            .await
            .map_err(pg_err("cancel expired tasks"))?;
            let n = per_queue(&mut report, &rows);
            report.cancelled += n;
            if n < BATCH as u64 {
                break;
            }
        }
        // Tasks with attempts left go back, in batches.
        loop {
            let rows: Vec<(String, i64)> = sqlx::query_as(&format!(
                "WITH r AS (UPDATE jobs j SET {}, last_error = 'lease expired' \
                 FROM (SELECT product_id, id, queue AS leased_from FROM jobs WHERE {lost} \
                 AND attempt < max_attempts AND {live_run} ORDER BY id LIMIT $3 \
                 FOR UPDATE SKIP LOCKED) c \
                 WHERE j.product_id = c.product_id AND j.id = c.id RETURNING c.leased_from AS queue) \
                 SELECT queue, count(*) FROM r GROUP BY queue",
                requeue_set("$1", "j.attempt")
            ))
            .bind(to_pg(now))
            .bind(to_pg(stale))
            .bind(BATCH)
            .fetch_all(&self.pool)
            .await
            .map_err(pg_err("requeue expired tasks"))?;
            let n = per_queue(&mut report, &rows);
            report.requeued += n;
            if n < BATCH as u64 {
                break;
            }
        }
        // Exhausted ones are discarded, each fenced on the token seen, so a
        // completion racing with the sweep wins or loses cleanly.
        type Exhausted = (
            String,
            i64,
            i64,
            Option<uuid::Uuid>,
            Option<i64>,
            Option<String>,
            String,
        );
        let exhausted: Vec<Exhausted> = sqlx::query_as(&format!(
            "SELECT j.product_id, j.id, j.lease_token, j.leased_by, j.dag_run_id, \
             (SELECT key FROM dag_nodes WHERE product_id = j.product_id AND id = j.node_id), \
             j.queue FROM jobs j WHERE {} AND attempt >= max_attempts ORDER BY id LIMIT $3",
            lost.replace("jobs.leased_by", "j.leased_by")
        ))
        .bind(to_pg(now))
        .bind(to_pg(stale))
        .bind(BATCH)
        .fetch_all(&self.pool)
        .await
        .map_err(pg_err("find exhausted tasks"))?;
        for (product, id, token, worker, dag, key, queue) in exhausted {
            let product_id = ProductId::parse(product)
                .map_err(|e| PortError::other("decode exhausted task").with_source(e))?;
            let lease = Lease {
                task_id: TaskId(id),
                token,
                worker: WorkerId(worker.unwrap_or_default()),
                product_id,
                kind: String::new(),
                queue,
                payload: Value::Null,
                attempt: 0,
                max_attempts: 0,
                expires_at: now,
                dag: dag.map(|d| DagTask {
                    dag_id: DagId(d),
                    node: key.unwrap_or_default(),
                    inputs: Vec::new(),
                    is_map: false,
                }),
            };
            match self
                .discard(&lease, "lease expired with no attempts left")
                .await
            {
                Ok(()) => {
                    report.discarded += 1;
                    report.count(&lease.queue, 1);
                }
                Err(e) if e.is_lease_lost() => {}
                Err(e) => return Err(e),
            }
        }
        sqlx::query("DELETE FROM workers WHERE last_seen < $1")
            .bind(to_pg(stale))
            .execute(&self.pool)
            .await
            .map_err(pg_err("forget dead workers"))?;
        if report.requeued > 0 {
            self.wake_workers();
        }
        Ok(report)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(product_id = %product, dag_id = %id))]
    async fn cancel_dag(&self, product: &ProductId, id: DagId) -> PortResult<DagStatus> {
        let now = self.clock.now();
        let mut tx = self.pool.begin().await.map_err(pg_err("begin"))?;
        lock_run(&mut tx, product, id).await?;
        stop_run(
            &mut tx,
            product,
            id,
            run::CANCELLED,
            None,
            &[job::AVAILABLE, job::RUNNING],
            now,
        )
        .await?;
        let status = self.status(&mut tx, product, id).await?;
        tx.commit().await.map_err(pg_err("commit"))?;
        Ok(status)
    }

    async fn dag_status(&self, product: &ProductId, id: DagId) -> PortResult<DagStatus> {
        let mut conn = self.pool.acquire().await.map_err(pg_err("acquire"))?;
        self.status(&mut conn, product, id).await
    }

    async fn dag_results(&self, product: &ProductId, id: DagId) -> PortResult<Vec<NodeResult>> {
        let rows: Vec<(String, i16, Option<Value>)> = sqlx::query_as(
            "SELECT key, state, result FROM dag_nodes WHERE product_id = $2 AND dag_run_id = $1 \
             ORDER BY id",
        )
        .bind(id.0)
        .bind(product.as_str())
        .fetch_all(&self.pool)
        .await
        .map_err(pg_err("load dag results"))?;
        if rows.is_empty() {
            return Err(PortError::not_found(format!("dag run {id}")));
        }
        Ok(rows
            .into_iter()
            .map(|(key, state, result)| NodeResult {
                key,
                state: node_state(state),
                result,
            })
            .collect())
    }

    #[tracing::instrument(level = "debug", skip_all, fields(product_id = %product, task_id = %id))]
    async fn retry_discarded(&self, product: &ProductId, id: TaskId) -> PortResult<()> {
        let now = self.clock.now();
        let retried = sqlx::query(
            "UPDATE jobs SET state = 0, attempt = 0, run_at = $2, finished_at = NULL \
             WHERE product_id = $4 AND id = $1 AND state = $3 AND dag_run_id IS NULL",
        )
        .bind(id.0)
        .bind(to_pg(now))
        .bind(job::DISCARDED)
        .bind(product.as_str())
        .execute(&self.pool)
        .await
        .map_err(pg_err("retry discarded task"))?
        .rows_affected();
        if retried == 0 {
            let in_dag: Option<bool> = sqlx::query_scalar(
                "SELECT dag_run_id IS NOT NULL FROM jobs \
                 WHERE product_id = $3 AND id = $1 AND state = $2",
            )
            .bind(id.0)
            .bind(job::DISCARDED)
            .bind(product.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(pg_err("load discarded task"))?;
            return Err(match in_dag {
                Some(true) => {
                    PortError::invalid(format!("task {id} is a dag node: re-run its dag"))
                }
                _ => PortError::not_found(format!("discarded task {id}")),
            });
        }
        self.wake_workers();
        Ok(())
    }

    async fn list_discarded(&self, queue: &str, limit: usize) -> PortResult<Vec<DiscardedTask>> {
        let rows = sqlx::query(
            "SELECT id, product_id, kind, attempt, last_error, finished_at, dag_run_id \
             FROM jobs WHERE state = $1 AND queue = $2 \
             ORDER BY finished_at DESC, id DESC LIMIT $3",
        )
        .bind(job::DISCARDED)
        .bind(queue)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await
        .map_err(pg_err("list discarded tasks"))?;
        rows.into_iter()
            .map(|r| {
                let product: String = r.try_get("product_id")?;
                let finished: Option<time::OffsetDateTime> = r.try_get("finished_at")?;
                Ok(DiscardedTask {
                    id: TaskId(r.try_get("id")?),
                    product_id: ProductId::parse(product)
                        .map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
                    kind: r.try_get("kind")?,
                    attempts: u32::try_from(r.try_get::<i32, _>("attempt")?).unwrap_or(0),
                    last_error: r.try_get("last_error")?,
                    discarded_at: finished.map_or(Timestamp::UNIX_EPOCH, from_pg),
                    dag_id: r.try_get::<Option<i64>, _>("dag_run_id")?.map(DagId),
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(pg_err("decode discarded tasks"))
    }

    async fn purge_finished(&self, before: Timestamp) -> PortResult<u64> {
        let mut total = 0;
        for sql in [
            "DELETE FROM jobs WHERE (product_id, id) IN (SELECT product_id, id FROM jobs \
             WHERE state IN (2, 4) AND finished_at < $1 LIMIT $2)",
            "DELETE FROM dag_runs WHERE (product_id, id) IN (SELECT product_id, id \
             FROM dag_runs WHERE finished_at < $1 LIMIT $2)",
        ] {
            loop {
                let n = sqlx::query(sql)
                    .bind(to_pg(before))
                    .bind(BATCH)
                    .execute(&self.pool)
                    .await
                    .map_err(pg_err("purge finished rows"))?
                    .rows_affected();
                total += n;
                if n < BATCH as u64 {
                    break;
                }
            }
        }
        Ok(total)
    }

    async fn footprint(&self, product: &ProductId) -> PortResult<QueueFootprint> {
        let (tasks, runs, nodes, job_bytes, node_bytes, result_bytes): (
            i64,
            i64,
            i64,
            i64,
            i64,
            i64,
        ) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM jobs WHERE product_id = $1), \
             (SELECT count(*) FROM dag_runs WHERE product_id = $1), \
             (SELECT count(*) FROM dag_nodes WHERE product_id = $1), \
             (SELECT coalesce(sum(coalesce(octet_length(nullif(args, 'null'::jsonb)::text), 0) \
              + coalesce(octet_length(nullif(rerun->'args', 'null'::jsonb)::text), 0)), 0)::int8 \
              FROM jobs WHERE product_id = $1), \
             (SELECT coalesce(sum(coalesce(octet_length(nullif(payload, 'null'::jsonb)::text), 0) \
              + coalesce(octet_length((map_spec->'payload')::text), 0) \
              + coalesce(octet_length(input::text), 0)), 0)::int8 \
              FROM dag_nodes WHERE product_id = $1), \
             (SELECT coalesce(sum(octet_length(nullif(result, 'null'::jsonb)::text)), 0)::int8 \
              FROM dag_nodes WHERE product_id = $1)",
        )
        .bind(product.as_str())
        .fetch_one(&self.pool)
        .await
        .map_err(pg_err("measure queue footprint"))?;
        let n = |v: i64| u64::try_from(v).unwrap_or(0);
        Ok(QueueFootprint {
            tasks: n(tasks),
            runs: n(runs),
            nodes: n(nodes),
            payload_bytes: n(job_bytes) + n(node_bytes),
            result_bytes: n(result_bytes),
        })
    }

    async fn depth(&self, queue: &str) -> PortResult<QueueDepth> {
        // Each count reads one partial index (`jobs_claim`, `jobs_running`):
        // only live rows are visited.
        let (ready, scheduled, running): (i64, i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE run_at <= $2), count(*) FILTER (WHERE run_at > $2), \
             (SELECT count(*) FROM jobs WHERE state = 1 AND queue = $1) \
             FROM jobs WHERE state = 0 AND queue = $1",
        )
        .bind(queue)
        .bind(to_pg(self.clock.now()))
        .fetch_one(&self.pool)
        .await
        .map_err(pg_err("count queue depth"))?;
        let n = |v: i64| u64::try_from(v).unwrap_or(0);
        Ok(QueueDepth {
            ready: n(ready),
            scheduled: n(scheduled),
            running: n(running),
        })
    }

    async fn wait_for_work(&self, _queue: &str, timeout: Duration) {
        self.ensure_listener();
        let _ = tokio::time::timeout(timeout, self.shared.notify.notified()).await;
    }

    fn for_worker(&self) -> Option<Arc<dyn TaskQueue>> {
        Some(Arc::new(PgTaskQueue::for_worker(self)))
    }
}

/// Takes the wake-up permit `notify` holds, if any.
fn take_permit(notify: &Notify) -> bool {
    let notified = notify.notified();
    tokio::pin!(notified);
    notified.as_mut().enable()
}

/// Wakes every worker waiting for work now and leaves a permit for the next
/// wait, so a hint that arrives between a worker's empty claim and its wait
/// is not lost (at worst it costs one extra claim).
fn wake(notify: &tokio::sync::Notify) {
    notify.notify_waiters();
    notify.notify_one();
}

#[cfg(all(test, any(feature = "session", feature = "conversation")))]
mod tests {
    use parlance_ports::ManualClock;

    use super::*;
    use crate::testing::test_pool;

    /// Enqueues `tasks` as a machine store's write does (after a CTE `u`
    /// that wrote a row); answers whether the hint asks for a wake-up.
    async fn after_u(queue: &PgTaskQueue, tasks: &[TaskSpec]) -> bool {
        let rows = TaskRows::new(queue, tasks).expect("valid tasks");
        let sql = format!(
            "WITH u AS (SELECT 1), {} SELECT count(*) FROM hint",
            enqueue_after_u(1)
        );
        let hinted: i64 = rows
            .bind(sqlx::query(&sql))
            .fetch_one(&queue.pool)
            .await
            .expect("enqueue after u")
            .get(0);
        hinted > 0
    }

    fn asked(n: u32) -> TaskSpec {
        TaskSpec::new(
            ProductId::parse("acme").expect("id"),
            "turn",
            json!({ "n": n }),
        )
        .dedup_key("k")
    }

    async fn claim(queue: &PgTaskQueue) -> Vec<Lease> {
        let worker = WorkerId(uuid::Uuid::from_u128(1));
        queue
            .claim(&worker, "default", 10, Duration::from_secs(60))
            .await
            .expect("claim")
    }

    /// Tasks sharing a key in one write: with no live task the first is
    /// inserted; a waiting task takes none; a running one is marked with
    /// the last, which runs once it completes.
    #[tokio::test]
    async fn a_write_with_one_key_twice_keeps_the_dedup_rule() {
        let Some(pool) = test_pool().await else {
            return;
        };
        let queue = PgTaskQueue::new(pool, Arc::new(ManualClock::new()), QueueConfig::default());
        let plain = TaskSpec::new(ProductId::parse("acme").expect("id"), "other", json!({}));
        assert!(
            after_u(&queue, &[asked(1), asked(2), plain]).await,
            "runnable"
        );
        let mut first = claim(&queue).await;
        first.sort_by_key(|l| l.kind.clone());
        let payloads: Vec<&Value> = first.iter().map(|l| &l.payload).collect();
        assert_eq!(payloads, [&json!({}), &json!({"n": 1})]);
        for l in &first {
            queue.complete(l, json!(null)).await.expect("complete");
        }
        // Waiting.
        assert!(after_u(&queue, &[asked(3)]).await);
        assert!(!after_u(&queue, &[asked(4), asked(5)]).await, "nothing new");
        let running = claim(&queue).await;
        assert_eq!(running.len(), 1);
        assert_eq!(running[0].payload, json!({"n": 3}));
        // Running.
        assert!(!after_u(&queue, &[asked(6), asked(7)]).await, "nothing new");
        assert!(claim(&queue).await.is_empty(), "one live task");
        queue
            .complete(&running[0], json!(null))
            .await
            .expect("complete");
        let rerun = claim(&queue).await;
        assert_eq!(rerun.len(), 1);
        assert_eq!(rerun[0].payload, json!({"n": 7}), "the last request");
        queue
            .complete(&rerun[0], json!(null))
            .await
            .expect("complete");
        assert!(claim(&queue).await.is_empty());
    }
}
