//! Session states in the `sessions` table and tour catalogs in
//! `tour_catalogs`.
//!
//! A commit is one statement and no transaction: a plain `UPDATE ... WHERE
//! version = $expected` (or, to create, an `INSERT ... ON CONFLICT DO
//! NOTHING`), a `Conflict` when it matched no row; a decision with
//! transitions or tasks adds its audit entries and tasks to that statement
//! as data-modifying CTEs on the written row, so they commit with it or not
//! at all. Only a decision asking for a DAG writes in a transaction of
//! several statements. The
//! row carries the decision's next deadline, indexed (`sessions_next_deadline`),
//! so a claim reads only what is due and takes it with `SKIP LOCKED`:
//! concurrent sweepers never wait on each other or take the same session.
//! Snapshots travel as text both ways: bound as the JSON text the state
//! writes and selected as `snapshot::text`, decoded straight from it.

use std::sync::LazyLock;

use async_trait::async_trait;
use parlance_core::session::{SessionKey, SessionState, TourCatalog};
use parlance_core::{ProductId, Task, Timestamp};
use parlance_ports::{
    CLAIM_LEASE, Commit, Committed, MachineStore, PortError, PortResult, SessionStore, Stored,
    TourCatalogStore, Version, audit_entries,
};
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgExecutor, PgPool, Row as _};

use crate::PgTaskQueue;
use crate::audit::insert_entries;
use crate::error::pg_err;
use crate::queue::{TaskRows, enqueue_after_u};
use crate::time::{from_pg, to_pg};

/// Session states stored in PostgreSQL, enqueueing a decision's tasks (a
/// session's decisions ask for none today) on a task queue in the same
/// database.
#[derive(Debug, Clone)]
pub struct PgSessionStore {
    pool: PgPool,
    queue: PgTaskQueue,
}

impl PgSessionStore {
    /// A store on `pool` (migrated) whose commits enqueue their tasks on
    /// `queue`, which must use the same database.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    ///
    /// use parlance_core::session::{SessionCommand, SessionId, SessionKey, SessionState, TourCatalog};
    /// use parlance_core::{Machine, ProductId};
    /// use parlance_ports::{Clock, Commit, MachineStore, ManualClock, QueueConfig, SessionStore};
    /// use parlance_postgres::{PgSessionStore, PgTaskQueue};
    ///
    /// // A fresh, migrated database; an application opens its pool with
    /// // `connect` and runs `migrate`. `None` where no PostgreSQL is configured.
    /// let Some(pool) = parlance_postgres::testing::test_pool().await else { return Ok(()) };
    /// let clock = Arc::new(ManualClock::new());
    /// // The queue must use the store's database: a commit enqueues its tasks in
    /// // the commit's transaction.
    /// let queue = PgTaskQueue::new(pool.clone(), clock.clone(), QueueConfig::default());
    /// let store = PgSessionStore::new(pool, queue);
    ///
    /// let key = SessionKey::new(ProductId::parse("acme")?, SessionId::parse("visit-1")?);
    /// let tours = TourCatalog::default();
    /// let (state, decision) = SessionState::create(&key, &tours, &SessionCommand::Create, clock.now())?
    ///     .expect("`Create` creates a session");
    /// let commit = Commit {
    ///     key: &key,
    ///     expected: None,
    ///     command: &SessionCommand::Create,
    ///     state: &state,
    ///     decision: &decision,
    ///     now: clock.now(),
    /// };
    /// let committed = store.commit(commit).await?;
    ///
    /// let stored = store.load(&key).await?.expect("committed");
    /// assert_eq!((stored.version, &stored.state), (committed.version, &state));
    /// assert!(store.delete(&key).await?);
    /// assert!(store.load(&key).await?.is_none());
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(pool: PgPool, queue: PgTaskQueue) -> Self {
        Self { pool, queue }
    }
}

/// A stored row back into a session: its snapshot is selected as text
/// (`snapshot::text`) and decoded from it, with no `Value` in between. A
/// snapshot that does not decode is reported, never replaced.
fn decode(row: &PgRow) -> PortResult<Stored<SessionState>> {
    let version: i64 = row.try_get("version").map_err(pg_err("decode session"))?;
    let snapshot: &str = row.try_get("snapshot").map_err(pg_err("decode session"))?;
    let state = SessionState::from_snapshot_slice(snapshot.as_bytes()).map_err(|e| {
        PortError::other("postgres: stored session snapshot does not decode").with_source(e)
    })?;
    Ok(Stored {
        state,
        version: Version::from_i64(version),
    })
}

/// Writes the row of `c`: inserted at version 1 when it expects none,
/// else updated if it is still at the expected version; the snapshot is
/// bound as the text the state writes (`$4::text::jsonb`), with no `Value`
/// in between. `None` when that guard matched no row (the session exists,
/// moved or is gone).
async fn write_row<'e>(
    conn: impl PgExecutor<'e>,
    c: &Commit<'_, SessionState>,
) -> PortResult<Option<Version>> {
    const INSERT: &str = "INSERT INTO sessions (product_id, session_id, version, next_deadline, snapshot) \
         VALUES ($1, $2, 1, $3, $4::text::jsonb) ON CONFLICT DO NOTHING";
    const UPDATE: &str = "UPDATE sessions SET version = version + 1, snapshot = $4::text::jsonb, \
         next_deadline = $3 WHERE product_id = $1 AND session_id = $2 AND version = $5 \
         RETURNING version";
    let deadline = c.decision.next_deadline.map(to_pg);
    match c.expected {
        None => {
            let done = sqlx::query(INSERT)
                .bind(c.key.product_id.as_str())
                .bind(c.key.session_id.as_str())
                .bind(deadline)
                .bind(c.state.to_snapshot_string())
                .execute(conn)
                .await
                .map_err(pg_err("create session"))?;
            Ok((done.rows_affected() == 1).then_some(Version::FIRST))
        }
        Some(expected) => {
            let version = sqlx::query_scalar::<_, i64>(UPDATE)
                .bind(c.key.product_id.as_str())
                .bind(c.key.session_id.as_str())
                .bind(deadline)
                .bind(c.state.to_snapshot_string())
                .bind(expected.as_i64())
                .fetch_all(conn)
                .await
                .map_err(pg_err("save session"))?;
            Ok(version.first().copied().map(Version::from_i64))
        }
    }
}

/// The conflict of a commit whose guard matched no row.
fn lost(c: &Commit<'_, SessionState>) -> PortError {
    match c.expected {
        None => PortError::conflict(format!("session {} exists", c.key.session_id)),
        Some(v) => PortError::conflict(format!("session is no longer at version {v}")),
    }
}

/// A write with audit entries or tasks, in one statement: the row guarded
/// as in [`write_row`] (`u`), the audit entries and the tasks as
/// data-modifying CTEs that insert only when it was written. Parameters:
/// `$1`-`$4` the row, `$5`-`$12` the audit entries,
/// `$13`-`$22` the tasks ([`TaskRows`]), `$23` the expected version.
fn write_all(u: &str) -> String {
    format!(
        "WITH u AS ({u}), \
         a AS (INSERT INTO audit_log (product_id, entity_kind, entity_id, from_state, to_state, cause, at, payload) \
         SELECT x.p, x.k, x.e, x.f, x.t, x.c, x.at, x.pl FROM u, \
         UNNEST($5::text[], $6::text[], $7::text[], $8::text[], $9::text[], $10::text[], \
         $11::timestamptz[], $12::jsonb[]) WITH ORDINALITY AS x(p, k, e, f, t, c, at, pl, n) \
         ORDER BY x.n), \
         {} \
         SELECT (SELECT version FROM u) AS version, (SELECT count(*) FROM hint) AS hinted",
        enqueue_after_u(13)
    )
}

static CREATE_ALL: LazyLock<String> = LazyLock::new(|| {
    write_all(
        "INSERT INTO sessions (product_id, session_id, version, next_deadline, snapshot) \
         VALUES ($1, $2, 1, $3, $4::text::jsonb) ON CONFLICT DO NOTHING RETURNING version",
    )
});

static UPDATE_ALL: LazyLock<String> = LazyLock::new(|| {
    write_all(
        "UPDATE sessions SET version = version + 1, snapshot = $4::text::jsonb, next_deadline = $3 \
         WHERE product_id = $1 AND session_id = $2 AND version = $23 RETURNING version",
    )
});

/// Writes the row of `c` with its audit entries and tasks in one statement
/// (see [`write_all`]). The version written, or `None` when the guard
/// matched no row (nothing was written), and whether a runnable task was
/// enqueued.
async fn write_with_audit_and_tasks(
    conn: &mut PgConnection,
    c: &Commit<'_, SessionState>,
    tasks: &TaskRows<'_>,
) -> PortResult<(Option<Version>, bool)> {
    let entries = audit_entries(c.key, c.decision, c.now);
    let sql: &'static str = match c.expected {
        None => &CREATE_ALL,
        Some(_) => &UPDATE_ALL,
    };
    let q = sqlx::query(sql)
        .bind(c.key.product_id.as_str())
        .bind(c.key.session_id.as_str())
        .bind(c.decision.next_deadline.map(to_pg))
        .bind(c.state.to_snapshot_string())
        .bind(
            entries
                .iter()
                .map(|e| e.product_id.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            entries
                .iter()
                .map(|e| e.entity_kind.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            entries
                .iter()
                .map(|e| e.entity_id.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            entries
                .iter()
                .map(|e| e.from.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(entries.iter().map(|e| e.to.as_str()).collect::<Vec<_>>())
        .bind(entries.iter().map(|e| e.cause.as_str()).collect::<Vec<_>>())
        .bind(entries.iter().map(|e| to_pg(e.at)).collect::<Vec<_>>())
        .bind(
            entries
                .iter()
                .map(|e| e.payload.clone())
                .collect::<Vec<_>>(),
        );
    let mut q = tasks.bind(q);
    if let Some(expected) = c.expected {
        q = q.bind(expected.as_i64());
    }
    // Read to the end: the statement's commit is done when this returns.
    let rows = q
        .fetch_all(&mut *conn)
        .await
        .map_err(pg_err("save session"))?;
    let row = rows
        .first()
        .ok_or_else(|| PortError::other("save session: no answer"))?;
    let version: Option<i64> = row.try_get("version").map_err(pg_err("save session"))?;
    let hinted: i64 = row.try_get("hinted").map_err(pg_err("save session"))?;
    Ok((version.map(Version::from_i64), hinted > 0))
}

#[async_trait]
impl MachineStore<SessionState> for PgSessionStore {
    async fn load(&self, key: &SessionKey) -> PortResult<Option<Stored<SessionState>>> {
        let row = sqlx::query(
            "SELECT version, snapshot::text AS snapshot FROM sessions \
             WHERE product_id = $1 AND session_id = $2",
        )
        .bind(key.product_id.as_str())
        .bind(key.session_id.as_str())
        .fetch_all(&self.pool)
        .await
        .map_err(pg_err("load session"))?;
        row.first().map(decode).transpose()
    }

    async fn commit(&self, c: Commit<'_, SessionState>) -> PortResult<Committed<SessionState>> {
        let d = c.decision;
        let dags = d.tasks.iter().any(|t| matches!(t, Task::Dag(_)));
        if !dags {
            // One statement, atomic on its own: the row alone, or with its
            // audit entries and tasks.
            let mut conn = self.pool.acquire().await.map_err(pg_err("save session"))?;
            let (version, runnable) = if d.transitions.is_empty() && d.tasks.is_empty() {
                (write_row(&mut *conn, &c).await?, false)
            } else {
                let tasks = TaskRows::new(&self.queue, d.single_tasks())?;
                write_with_audit_and_tasks(&mut conn, &c, &tasks).await?
            };
            if runnable {
                self.queue.wake_workers();
            }
            return match version {
                Some(version) => Ok(Committed::at(version)),
                None => Err(lost(&c)),
            };
        }
        let mut tx = self.pool.begin().await.map_err(pg_err("save session"))?;
        let Some(version) = write_row(&mut *tx, &c).await? else {
            // Dropping the transaction rolls it back.
            return Err(lost(&c));
        };
        insert_entries(&mut *tx, &audit_entries(c.key, d, c.now))
            .await
            .map_err(pg_err("append session audit entries"))?;
        let singles: Vec<_> = d.single_tasks().cloned().collect();
        if !singles.is_empty() {
            self.queue.enqueue_in(&mut tx, &singles).await?;
        }
        for task in &d.tasks {
            if let Task::Dag(dag) = task {
                self.queue.enqueue_dag_in(&mut tx, dag).await?;
            }
        }
        tx.commit().await.map_err(pg_err("save session"))?;
        self.queue.wake_workers();
        Ok(Committed::at(version))
    }
}

#[async_trait]
impl SessionStore for PgSessionStore {
    async fn delete(&self, key: &SessionKey) -> PortResult<bool> {
        let done = sqlx::query("DELETE FROM sessions WHERE product_id = $1 AND session_id = $2")
            .bind(key.product_id.as_str())
            .bind(key.session_id.as_str())
            .execute(&self.pool)
            .await
            .map_err(pg_err("delete session"))?;
        Ok(done.rows_affected() > 0)
    }

    async fn claim_due(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> PortResult<Vec<Stored<SessionState>>> {
        let rows = sqlx::query(
            "WITH due AS ( \
                 SELECT product_id, session_id, next_deadline FROM sessions \
                 WHERE next_deadline <= $1 \
                 ORDER BY next_deadline, product_id, session_id \
                 LIMIT $2 \
                 FOR UPDATE SKIP LOCKED \
             ), claimed AS ( \
                 UPDATE sessions s SET next_deadline = $3 FROM due \
                 WHERE s.product_id = due.product_id AND s.session_id = due.session_id \
                 RETURNING s.version, s.snapshot, due.next_deadline AS was_due, \
                           due.product_id, due.session_id \
             ) \
             SELECT version, snapshot::text AS snapshot FROM claimed \
             ORDER BY was_due, product_id, session_id",
        )
        .bind(to_pg(now))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .bind(to_pg(now + CLAIM_LEASE))
        .fetch_all(&self.pool)
        .await
        .map_err(pg_err("claim due sessions"))?;
        rows.iter().map(decode).collect()
    }

    async fn oldest_due(&self, now: Timestamp) -> PortResult<Option<Timestamp>> {
        let oldest: Option<time::OffsetDateTime> =
            sqlx::query_scalar("SELECT min(next_deadline) FROM sessions WHERE next_deadline <= $1")
                .bind(to_pg(now))
                .fetch_one(&self.pool)
                .await
                .map_err(pg_err("read the oldest due session"))?;
        Ok(oldest.map(from_pg))
    }
}

/// Tour catalogs stored in PostgreSQL.
#[derive(Debug, Clone)]
pub struct PgTourCatalogs {
    pool: PgPool,
}

impl PgTourCatalogs {
    /// Catalogs on `pool` (migrated).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use parlance_core::ProductId;
    /// use parlance_core::session::TourCatalog;
    /// use parlance_ports::TourCatalogStore;
    /// use parlance_postgres::PgTourCatalogs;
    ///
    /// // A fresh, migrated database; an application opens its pool with
    /// // `connect` and runs `migrate`. `None` where no PostgreSQL is configured.
    /// let Some(pool) = parlance_postgres::testing::test_pool().await else { return Ok(()) };
    /// let catalogs = PgTourCatalogs::new(pool);
    /// let acme = ProductId::parse("acme")?;
    /// assert_eq!(catalogs.get(&acme).await?, TourCatalog::default());
    /// let catalog = TourCatalog {
    ///     default_interaction_timeout_s: Some(90.0),
    ///     ..TourCatalog::default()
    /// };
    /// catalogs.put(&acme, &catalog).await?;
    /// assert_eq!(catalogs.get(&acme).await?, catalog);
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

#[async_trait]
impl TourCatalogStore for PgTourCatalogs {
    async fn get(&self, product_id: &ProductId) -> PortResult<TourCatalog> {
        let doc: Option<Value> =
            sqlx::query_scalar("SELECT catalog FROM tour_catalogs WHERE product_id = $1")
                .bind(product_id.as_str())
                .fetch_optional(&self.pool)
                .await
                .map_err(pg_err("load tour catalog"))?;
        match doc {
            None => Ok(TourCatalog::empty()),
            Some(doc) => TourCatalog::from_value(&doc).map_err(|e| {
                PortError::other("postgres: stored tour catalog does not decode").with_source(e)
            }),
        }
    }

    async fn put(&self, product_id: &ProductId, catalog: &TourCatalog) -> PortResult<()> {
        sqlx::query(
            "INSERT INTO tour_catalogs (product_id, catalog) VALUES ($1, $2) \
             ON CONFLICT (product_id) DO UPDATE SET catalog = EXCLUDED.catalog",
        )
        .bind(product_id.as_str())
        .bind(catalog.to_value())
        .execute(&self.pool)
        .await
        .map_err(pg_err("store tour catalog"))?;
        Ok(())
    }
}
