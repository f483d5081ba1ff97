//! Session states in the `sessions` table and tour catalogs in `tour_catalogs`.

use async_trait::async_trait;
use parlance_core::session::{SessionId, SessionState, TourCatalog};
use parlance_core::{ProductId, Timestamp};
use parlance_ports::{
    CLAIM_LEASE, PortError, PortResult, SessionSave, SessionStore, StoredSession, TourCatalogStore,
};
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row as _};

use crate::audit::insert_entries;
use crate::error::pg_err;
use crate::time::to_pg;

/// Session states stored in PostgreSQL.
#[derive(Debug, Clone)]
pub struct PgSessionStore {
    pool: PgPool,
}

impl PgSessionStore {
    /// A store on `pool` (migrated).
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }

    async fn select(
        &self,
        product_id: &ProductId,
        session_id: &SessionId,
    ) -> PortResult<Option<StoredSession>> {
        let row = sqlx::query(
            "SELECT version, snapshot FROM sessions WHERE product_id = $1 AND session_id = $2",
        )
        .bind(product_id.as_str())
        .bind(session_id.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(pg_err("load session"))?;
        row.map(|r| decode(&r)).transpose()
    }
}

/// A stored row back into a session. A snapshot that does not decode is
/// reported, never replaced.
fn decode(row: &PgRow) -> PortResult<StoredSession> {
    let version: i64 = row.try_get("version").map_err(pg_err("decode session"))?;
    let snapshot: Value = row.try_get("snapshot").map_err(pg_err("decode session"))?;
    let state = SessionState::from_snapshot(&snapshot).map_err(|e| {
        PortError::other("postgres: stored session snapshot does not decode").with_source(e)
    })?;
    Ok(StoredSession { state, version })
}

#[async_trait]
impl SessionStore for PgSessionStore {
    async fn get(
        &self,
        product_id: &ProductId,
        session_id: &SessionId,
    ) -> PortResult<Option<StoredSession>> {
        self.select(product_id, session_id).await
    }

    async fn get_or_create(
        &self,
        product_id: &ProductId,
        session_id: &SessionId,
        now: Timestamp,
    ) -> PortResult<StoredSession> {
        if let Some(found) = self.select(product_id, session_id).await? {
            return Ok(found);
        }
        let fresh = SessionState::new(product_id.clone(), session_id.clone(), now);
        let inserted = sqlx::query(
            "INSERT INTO sessions (product_id, session_id, version, next_deadline, snapshot) \
             VALUES ($1, $2, 1, NULL, $3) ON CONFLICT DO NOTHING",
        )
        .bind(product_id.as_str())
        .bind(session_id.as_str())
        .bind(fresh.to_snapshot())
        .execute(&self.pool)
        .await
        .map_err(pg_err("create session"))?;
        if inserted.rows_affected() == 1 {
            return Ok(StoredSession {
                state: fresh,
                version: 1,
            });
        }
        // Another caller created it first; its row is committed by now.
        self.select(product_id, session_id)
            .await?
            .ok_or_else(|| PortError::conflict("session was deleted while being created"))
    }

    async fn save(&self, save: SessionSave<'_>) -> PortResult<i64> {
        const UPDATE: &str = "UPDATE sessions SET version = version + 1, snapshot = $3, \
             next_deadline = $4 WHERE product_id = $1 AND session_id = $2 AND version = $5 \
             RETURNING version";
        let state = save.state;
        let query = sqlx::query_scalar::<_, i64>(UPDATE)
            .bind(state.product_id().as_str())
            .bind(state.session_id().as_str())
            .bind(state.to_snapshot())
            .bind(save.next_deadline.map(to_pg))
            .bind(save.expected_version);
        let stale = || {
            PortError::conflict(format!(
                "session is no longer at version {}",
                save.expected_version
            ))
        };
        if save.audit.is_empty() {
            return query
                .fetch_optional(&self.pool)
                .await
                .map_err(pg_err("save session"))?
                .ok_or_else(stale);
        }
        let mut tx = self.pool.begin().await.map_err(pg_err("save session"))?;
        let Some(version) = query
            .fetch_optional(&mut *tx)
            .await
            .map_err(pg_err("save session"))?
        else {
            // Dropping the transaction rolls it back.
            return Err(stale());
        };
        insert_entries(&mut *tx, save.audit)
            .await
            .map_err(pg_err("append session audit entries"))?;
        tx.commit().await.map_err(pg_err("save session"))?;
        Ok(version)
    }

    async fn delete(&self, product_id: &ProductId, session_id: &SessionId) -> PortResult<bool> {
        let done = sqlx::query("DELETE FROM sessions WHERE product_id = $1 AND session_id = $2")
            .bind(product_id.as_str())
            .bind(session_id.as_str())
            .execute(&self.pool)
            .await
            .map_err(pg_err("delete session"))?;
        Ok(done.rows_affected() > 0)
    }

    async fn claim_due(&self, now: Timestamp, limit: usize) -> PortResult<Vec<StoredSession>> {
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
