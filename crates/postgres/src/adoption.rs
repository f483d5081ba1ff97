//! Adoption records in `adoption_state`, plans in `adoption_plan`, tour
//! catalogs in `adoption_tour_catalog`.
//!
//! A commit is one guarded statement on the record's row (an insert that
//! does nothing when the row exists, or an update on the expected
//! `version`), so a lost race writes nothing. When the decision has audit
//! entries (a journey change) or tasks, the statement, the entries and the
//! tasks run in one transaction; a decision with neither is the single
//! statement alone, as cheap as a plain save. The record has no timers, so
//! no deadline is stored.

use async_trait::async_trait;
use parlance_core::adoption::{AdoptionKey, OnboardingPlan, TourCatalogEntry, UserAdoptionState};
use parlance_core::{ProductId, Task};
use parlance_ports::adoption::role_key;
use parlance_ports::{
    AdoptionStore, Commit, Committed, MachineStore, PortError, PortResult, Stored, Version,
    audit_entries,
};
use sqlx::{PgExecutor, PgPool, Row as _};

use crate::PgTaskQueue;
use crate::audit::insert_entries;
use crate::error::pg_err;
use crate::time::{from_pg, to_pg};

/// The adoption store, in PostgreSQL.
#[derive(Debug, Clone)]
pub struct PgAdoptionStore {
    pool: PgPool,
    queue: PgTaskQueue,
}

impl PgAdoptionStore {
    /// A store on `pool` (migrated) whose commits enqueue their tasks on
    /// `queue` (on the same database), in the commit's transaction.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    ///
    /// use parlance_core::adoption::{AdoptionCommand, AdoptionKey, UserAdoptionState, UserId};
    /// use parlance_core::{Machine, ProductId};
    /// use parlance_ports::{AdoptionStore, Clock, Commit, MachineStore, ManualClock, QueueConfig};
    /// use parlance_postgres::{PgAdoptionStore, PgTaskQueue};
    ///
    /// // A fresh, migrated database; an application opens its pool with
    /// // `connect` and runs `migrate`. `None` where no PostgreSQL is configured.
    /// let Some(pool) = parlance_postgres::testing::test_pool().await else { return Ok(()) };
    /// let clock = Arc::new(ManualClock::new());
    /// let queue = PgTaskQueue::new(pool.clone(), clock.clone(), QueueConfig::default());
    /// let store = PgAdoptionStore::new(pool, queue);
    /// let acme = ProductId::parse("acme")?;
    /// let key = AdoptionKey::new(acme.clone(), UserId::parse("user-7")?);
    ///
    /// // The product's plan is the context every decision on its users reads.
    /// let plan = store.get_plan(&acme, None).await?.unwrap_or_default();
    /// let seen = AdoptionCommand::Events { events: vec![], metadata: None };
    /// let (state, decision) = UserAdoptionState::create(&key, &plan, &seen, clock.now())?
    ///     .expect("a user seen for the first time is created");
    /// let committed = store
    ///     .commit(Commit {
    ///         key: &key,
    ///         expected: None,
    ///         command: &seen,
    ///         state: &state,
    ///         decision: &decision,
    ///         now: clock.now(),
    ///     })
    ///     .await?;
    /// assert_eq!(store.load(&key).await?.map(|s| s.version), Some(committed.version));
    /// assert!(store.delete(&key).await?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(pool: PgPool, queue: PgTaskQueue) -> Self {
        Self { pool, queue }
    }
}

/// Writes the record's row by compare-and-swap: `expected: None` inserts
/// (a `Conflict` when the row exists), `Some(v)` updates version `v` (a
/// `Conflict` when the row is at another version or gone). One statement.
async fn write_row<'e>(
    executor: impl PgExecutor<'e>,
    key: &AdoptionKey,
    expected: Option<Version>,
    state: &UserAdoptionState,
) -> PortResult<Version> {
    let snapshot = state.to_snapshot_string();
    match expected {
        None => {
            let done = sqlx::query(
                "INSERT INTO adoption_state \
                 (product_id, user_id, version, journey_state, mastery_level, snapshot, updated_at) \
                 VALUES ($1, $2, 1, $3, $4, $5::json, $6) \
                 ON CONFLICT (product_id, user_id) DO NOTHING",
            )
            .bind(key.product_id.as_str())
            .bind(key.user_id.as_str())
            .bind(state.journey_state.as_str())
            .bind(state.mastery.level.as_str())
            .bind(&snapshot)
            .bind(to_pg(state.last_updated_at))
            .execute(executor)
            .await
            .map_err(pg_err("insert adoption state"))?;
            if done.rows_affected() == 1 {
                Ok(Version::FIRST)
            } else {
                Err(PortError::conflict("adoption record already exists"))
            }
        }
        Some(expected) => {
            let version: Option<i64> = sqlx::query_scalar(
                "UPDATE adoption_state SET version = version + 1, journey_state = $4, \
                 mastery_level = $5, snapshot = $6::json, updated_at = $7 \
                 WHERE product_id = $1 AND user_id = $2 AND version = $3 \
                 RETURNING version",
            )
            .bind(key.product_id.as_str())
            .bind(key.user_id.as_str())
            .bind(expected.as_i64())
            .bind(state.journey_state.as_str())
            .bind(state.mastery.level.as_str())
            .bind(&snapshot)
            .bind(to_pg(state.last_updated_at))
            .fetch_optional(executor)
            .await
            .map_err(pg_err("update adoption state"))?;
            version.map(Version::from_i64).ok_or_else(|| {
                PortError::conflict(format!(
                    "adoption record is no longer at version {expected}"
                ))
            })
        }
    }
}

#[async_trait]
impl MachineStore<UserAdoptionState> for PgAdoptionStore {
    #[tracing::instrument(skip_all, fields(product_id = %key.product_id), err)]
    async fn load(&self, key: &AdoptionKey) -> PortResult<Option<Stored<UserAdoptionState>>> {
        let row = sqlx::query(
            "SELECT version, snapshot::text AS snapshot, updated_at FROM adoption_state \
             WHERE product_id = $1 AND user_id = $2",
        )
        .bind(key.product_id.as_str())
        .bind(key.user_id.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(pg_err("load adoption state"))?;
        let Some(row) = row else { return Ok(None) };
        let version: i64 = row
            .try_get("version")
            .map_err(pg_err("decode adoption state"))?;
        let text: String = row
            .try_get("snapshot")
            .map_err(pg_err("decode adoption state"))?;
        let updated = from_pg(
            row.try_get("updated_at")
                .map_err(pg_err("decode adoption state"))?,
        );
        let state = UserAdoptionState::from_snapshot_str(&text, updated).map_err(|e| {
            PortError::other("stored adoption state does not decode").with_source(e)
        })?;
        Ok(Some(Stored {
            state,
            version: Version::from_i64(version),
        }))
    }

    #[tracing::instrument(skip_all, fields(product_id = %c.key.product_id), err)]
    async fn commit(
        &self,
        c: Commit<'_, UserAdoptionState>,
    ) -> PortResult<Committed<UserAdoptionState>> {
        if c.decision.transitions.is_empty() && c.decision.tasks.is_empty() {
            let version = write_row(&self.pool, c.key, c.expected, c.state).await?;
            return Ok(Committed::at(version));
        }
        let mut tx = self.pool.begin().await.map_err(pg_err("begin"))?;
        let version = write_row(&mut *tx, c.key, c.expected, c.state).await?;
        insert_entries(&mut *tx, &audit_entries(c.key, c.decision, c.now))
            .await
            .map_err(pg_err("append adoption audit entries"))?;
        let singles: Vec<_> = c.decision.single_tasks().cloned().collect();
        if !singles.is_empty() {
            self.queue.enqueue_in(&mut tx, &singles).await?;
        }
        for task in &c.decision.tasks {
            if let Task::Dag(dag) = task {
                self.queue.enqueue_dag_in(&mut tx, dag).await?;
            }
        }
        tx.commit().await.map_err(pg_err("commit"))?;
        if !c.decision.tasks.is_empty() {
            self.queue.wake_workers();
        }
        Ok(Committed::at(version))
    }
}

#[async_trait]
impl AdoptionStore for PgAdoptionStore {
    #[tracing::instrument(skip_all, fields(product_id = %key.product_id), err)]
    async fn delete(&self, key: &AdoptionKey) -> PortResult<bool> {
        let done = sqlx::query("DELETE FROM adoption_state WHERE product_id = $1 AND user_id = $2")
            .bind(key.product_id.as_str())
            .bind(key.user_id.as_str())
            .execute(&self.pool)
            .await
            .map_err(pg_err("delete adoption state"))?;
        Ok(done.rows_affected() > 0)
    }

    #[tracing::instrument(skip_all, fields(product_id = %product_id), err)]
    async fn put_plan(
        &self,
        product_id: &ProductId,
        role: Option<&str>,
        plan: &OnboardingPlan,
    ) -> PortResult<()> {
        sqlx::query(
            "INSERT INTO adoption_plan (product_id, role, config) VALUES ($1, $2, $3) \
             ON CONFLICT (product_id, role) DO UPDATE SET config = EXCLUDED.config",
        )
        .bind(product_id.as_str())
        .bind(role_key(role))
        .bind(plan.to_config())
        .execute(&self.pool)
        .await
        .map_err(pg_err("put onboarding plan"))?;
        Ok(())
    }

    #[tracing::instrument(skip_all, fields(product_id = %product_id), err)]
    async fn get_plan(
        &self,
        product_id: &ProductId,
        role: Option<&str>,
    ) -> PortResult<Option<OnboardingPlan>> {
        let row =
            sqlx::query("SELECT config FROM adoption_plan WHERE product_id = $1 AND role = $2")
                .bind(product_id.as_str())
                .bind(role_key(role))
                .fetch_optional(&self.pool)
                .await
                .map_err(pg_err("get onboarding plan"))?;
        let Some(row) = row else { return Ok(None) };
        let config: serde_json::Value = row
            .try_get("config")
            .map_err(pg_err("get onboarding plan"))?;
        // Stored plans were normalised on the way in, so nothing is skipped.
        Ok(Some(OnboardingPlan::from_config(&config).plan))
    }

    #[tracing::instrument(skip_all, fields(product_id = %product_id), err)]
    async fn put_tour_catalog(
        &self,
        product_id: &ProductId,
        role: Option<&str>,
        catalog: &[TourCatalogEntry],
    ) -> PortResult<()> {
        let value = serde_json::to_value(catalog)
            .map_err(|e| PortError::invalid("tour catalog does not serialise").with_source(e))?;
        sqlx::query(
            "INSERT INTO adoption_tour_catalog (product_id, role, catalog) VALUES ($1, $2, $3) \
             ON CONFLICT (product_id, role) DO UPDATE SET catalog = EXCLUDED.catalog",
        )
        .bind(product_id.as_str())
        .bind(role_key(role))
        .bind(value)
        .execute(&self.pool)
        .await
        .map_err(pg_err("put tour catalog"))?;
        Ok(())
    }

    #[tracing::instrument(skip_all, fields(product_id = %product_id), err)]
    async fn get_tour_catalog(
        &self,
        product_id: &ProductId,
        role: Option<&str>,
    ) -> PortResult<Option<Vec<TourCatalogEntry>>> {
        let row = sqlx::query(
            "SELECT catalog FROM adoption_tour_catalog WHERE product_id = $1 AND role = $2",
        )
        .bind(product_id.as_str())
        .bind(role_key(role))
        .fetch_optional(&self.pool)
        .await
        .map_err(pg_err("get tour catalog"))?;
        let Some(row) = row else { return Ok(None) };
        let value: serde_json::Value =
            row.try_get("catalog").map_err(pg_err("get tour catalog"))?;
        serde_json::from_value(value)
            .map(Some)
            .map_err(|e| PortError::other("stored tour catalog does not decode").with_source(e))
    }
}
