//! Adoption records in `adoption_state`, plans in `adoption_plan`, tour
//! catalogs in `adoption_tour_catalog`.

use async_trait::async_trait;
use parlance_core::ProductId;
use parlance_core::adoption::{OnboardingPlan, TourCatalogEntry, UserAdoptionState, UserId};
use parlance_ports::adoption::role_key;
use parlance_ports::{AdoptionStore, PortError, PortResult, StoredAdoption};
use sqlx::{PgPool, Row as _};

use crate::error::pg_err;
use crate::time::{from_pg, to_pg};

/// The adoption store, in PostgreSQL.
#[derive(Debug, Clone)]
pub struct PgAdoptionStore {
    pool: PgPool,
}

impl PgAdoptionStore {
    /// A store on `pool` (migrated).
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

#[async_trait]
impl AdoptionStore for PgAdoptionStore {
    #[tracing::instrument(skip_all, fields(product_id = %product_id), err)]
    async fn load(
        &self,
        product_id: &ProductId,
        user_id: &UserId,
    ) -> PortResult<Option<StoredAdoption>> {
        let row = sqlx::query(
            "SELECT version, snapshot::text AS snapshot, updated_at FROM adoption_state \
             WHERE product_id = $1 AND user_id = $2",
        )
        .bind(product_id.as_str())
        .bind(user_id.as_str())
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
        Ok(Some(StoredAdoption { state, version }))
    }

    #[tracing::instrument(skip_all, fields(product_id = %product_id), err)]
    async fn save(
        &self,
        product_id: &ProductId,
        state: &UserAdoptionState,
        expected_version: Option<i64>,
    ) -> PortResult<i64> {
        let snapshot = state.to_snapshot_string();
        match expected_version {
            None => {
                let done = sqlx::query(
                    "INSERT INTO adoption_state \
                     (product_id, user_id, version, journey_state, mastery_level, snapshot, updated_at) \
                     VALUES ($1, $2, 1, $3, $4, $5::json, $6) \
                     ON CONFLICT (product_id, user_id) DO NOTHING",
                )
                .bind(product_id.as_str())
                .bind(&state.user_id)
                .bind(state.journey_state.as_str())
                .bind(state.mastery.level.as_str())
                .bind(&snapshot)
                .bind(to_pg(state.last_updated_at))
                .execute(&self.pool)
                .await
                .map_err(pg_err("insert adoption state"))?;
                if done.rows_affected() == 1 {
                    Ok(1)
                } else {
                    Err(PortError::conflict("adoption record already exists"))
                }
            }
            Some(expected) => {
                let row = sqlx::query(
                    "UPDATE adoption_state SET version = version + 1, journey_state = $4, \
                     mastery_level = $5, snapshot = $6::json, updated_at = $7 \
                     WHERE product_id = $1 AND user_id = $2 AND version = $3 \
                     RETURNING version",
                )
                .bind(product_id.as_str())
                .bind(&state.user_id)
                .bind(expected)
                .bind(state.journey_state.as_str())
                .bind(state.mastery.level.as_str())
                .bind(&snapshot)
                .bind(to_pg(state.last_updated_at))
                .fetch_optional(&self.pool)
                .await
                .map_err(pg_err("update adoption state"))?;
                if let Some(row) = row {
                    return row
                        .try_get("version")
                        .map_err(pg_err("update adoption state"));
                }
                let exists = sqlx::query(
                    "SELECT 1 FROM adoption_state WHERE product_id = $1 AND user_id = $2",
                )
                .bind(product_id.as_str())
                .bind(&state.user_id)
                .fetch_optional(&self.pool)
                .await
                .map_err(pg_err("update adoption state"))?;
                Err(match exists {
                    Some(_) => PortError::conflict("adoption record version is stale"),
                    None => PortError::not_found("no adoption record"),
                })
            }
        }
    }

    #[tracing::instrument(skip_all, fields(product_id = %product_id), err)]
    async fn delete(&self, product_id: &ProductId, user_id: &UserId) -> PortResult<bool> {
        let done = sqlx::query("DELETE FROM adoption_state WHERE product_id = $1 AND user_id = $2")
            .bind(product_id.as_str())
            .bind(user_id.as_str())
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
