//! Session states in the `sessions` table and tour catalogs in
//! `tour_catalogs`.
//!
//! A commit that writes no audit entry and no task, the common case (an
//! interaction refreshing the clock), is one statement and no transaction:
//! a plain `UPDATE ... WHERE version = $expected` (or, to create, an
//! `INSERT ... ON CONFLICT DO NOTHING`), a `Conflict` when it matched no row.
//! A decision with transitions or tasks writes the row, its audit entries
//! and its tasks (enqueued on the same connection) in one transaction. The
//! row carries the decision's next deadline, indexed (`sessions_next_deadline`),
//! so a claim reads only what is due and takes it with `SKIP LOCKED`:
//! concurrent sweepers never wait on each other or take the same session.

use async_trait::async_trait;
use parlance_core::session::{SessionKey, SessionState, TourCatalog};
use parlance_core::{ProductId, Task, Timestamp};
use parlance_ports::{
    CLAIM_LEASE, Commit, Committed, MachineStore, PortError, PortResult, SessionStore, Stored,
    TourCatalogStore, Version, audit_entries,
};
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::{PgExecutor, PgPool, Row as _};

use crate::PgTaskQueue;
use crate::audit::insert_entries;
use crate::error::pg_err;
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
    pub fn new(pool: PgPool, queue: PgTaskQueue) -> Self {
        Self { pool, queue }
    }
}

/// A stored row back into a session. A snapshot that does not decode is
/// reported, never replaced.
fn decode(row: &PgRow) -> PortResult<Stored<SessionState>> {
    let version: i64 = row.try_get("version").map_err(pg_err("decode session"))?;
    let snapshot: Value = row.try_get("snapshot").map_err(pg_err("decode session"))?;
    let state = SessionState::from_snapshot(&snapshot).map_err(|e| {
        PortError::other("postgres: stored session snapshot does not decode").with_source(e)
    })?;
    Ok(Stored {
        state,
        version: Version::from_i64(version),
    })
}

/// Writes the row of `c`: inserted at version 1 when it expects none,
/// else updated if it is still at the expected version. `None` when that
/// guard matched no row (the session exists, moved or is gone).
async fn write_row<'e>(
    conn: impl PgExecutor<'e>,
    c: &Commit<'_, SessionState>,
) -> PortResult<Option<Version>> {
    const INSERT: &str = "INSERT INTO sessions (product_id, session_id, version, next_deadline, snapshot) \
         VALUES ($1, $2, 1, $3, $4) ON CONFLICT DO NOTHING";
    const UPDATE: &str = "UPDATE sessions SET version = version + 1, snapshot = $4, \
         next_deadline = $3 WHERE product_id = $1 AND session_id = $2 AND version = $5 \
         RETURNING version";
    let deadline = c.decision.next_deadline.map(to_pg);
    match c.expected {
        None => {
            let done = sqlx::query(INSERT)
                .bind(c.key.product_id.as_str())
                .bind(c.key.session_id.as_str())
                .bind(deadline)
                .bind(c.state.to_snapshot())
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
                .bind(c.state.to_snapshot())
                .bind(expected.as_i64())
                .fetch_optional(conn)
                .await
                .map_err(pg_err("save session"))?;
            Ok(version.map(Version::from_i64))
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

#[async_trait]
impl MachineStore<SessionState> for PgSessionStore {
    async fn load(&self, key: &SessionKey) -> PortResult<Option<Stored<SessionState>>> {
        let row = sqlx::query(
            "SELECT version, snapshot FROM sessions WHERE product_id = $1 AND session_id = $2",
        )
        .bind(key.product_id.as_str())
        .bind(key.session_id.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(pg_err("load session"))?;
        row.map(|r| decode(&r)).transpose()
    }

    async fn commit(&self, c: Commit<'_, SessionState>) -> PortResult<Committed<SessionState>> {
        let d = c.decision;
        if d.transitions.is_empty() && d.tasks.is_empty() {
            // Nothing commits with the row: one statement, no transaction.
            return match write_row(&self.pool, &c).await? {
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
             SELECT version, snapshot FROM claimed \
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
