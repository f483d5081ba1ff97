//! API keys in the `api_keys` table, held only as SHA-256 digests.

use parlance_core::{ProductId, Timestamp};
use parlance_ports::{PortError, PortResult};
use sqlx::{PgPool, Row as _};
use time::OffsetDateTime;

use crate::error::pg_err;
use crate::time::{from_pg, to_pg};

/// One stored key, without its secret (which is never stored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeyRecord {
    /// The product the key opens.
    pub product_id: ProductId,
    /// The key's number, unique per database.
    pub id: i64,
    /// The operator's label.
    pub label: String,
    /// When the key was made.
    pub created_at: Timestamp,
    /// When the key was revoked, if it was.
    pub revoked_at: Option<Timestamp>,
}

/// The API keys stored in PostgreSQL.
#[derive(Debug, Clone)]
pub struct PgApiKeys {
    pool: PgPool,
}

impl PgApiKeys {
    /// Keys on `pool` (migrated).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use parlance_core::{ProductId, Timestamp};
    /// use parlance_postgres::PgApiKeys;
    ///
    /// // A fresh, migrated database; an application opens its pool with
    /// // `connect` and runs `migrate`. `None` where no PostgreSQL is configured.
    /// let Some(pool) = parlance_postgres::testing::test_pool().await else { return Ok(()) };
    /// let keys = PgApiKeys::new(pool);
    /// let acme = ProductId::parse("acme")?;
    /// let now = Timestamp::from_secs(1_767_225_600).expect("in range");
    /// // Only a digest of the key is stored (SHA-256 of the key, say).
    /// let digest = [7u8; 32];
    /// let record = keys.create(&acme, &digest, "ci", now).await?;
    /// assert_eq!(keys.product_for(&digest).await?, Some(acme.clone()));
    ///
    /// keys.revoke(&acme, record.id, now).await?;
    /// assert_eq!(keys.product_for(&digest).await?, None);
    /// assert!(keys.list(Some(&acme)).await?[0].revoked_at.is_some());
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }

    /// Stores the digest of a new key for `product`.
    ///
    /// # Errors
    ///
    /// `Conflict` when the digest is already stored; `Unavailable` when the
    /// database is unreachable.
    pub async fn create(
        &self,
        product: &ProductId,
        digest: &[u8; 32],
        label: &str,
        now: Timestamp,
    ) -> PortResult<ApiKeyRecord> {
        let row = sqlx::query(
            "INSERT INTO api_keys (product_id, key_hash, label, created_at) \
             VALUES ($1, $2, $3, $4) RETURNING id",
        )
        .bind(product.as_str())
        .bind(&digest[..])
        .bind(label)
        .bind(to_pg(now))
        .fetch_one(&self.pool)
        .await
        .map_err(pg_err("create api key"))?;
        Ok(ApiKeyRecord {
            product_id: product.clone(),
            id: row.get("id"),
            label: label.to_owned(),
            created_at: now,
            revoked_at: None,
        })
    }

    /// Every key, revoked ones included, of `product` (or of every product),
    /// oldest first.
    ///
    /// # Errors
    ///
    /// `Unavailable` when the database is unreachable; `Invalid` when a
    /// stored product id no longer parses.
    pub async fn list(&self, product: Option<&ProductId>) -> PortResult<Vec<ApiKeyRecord>> {
        let rows = sqlx::query(
            "SELECT product_id, id, label, created_at, revoked_at FROM api_keys \
             WHERE $1::text IS NULL OR product_id = $1 ORDER BY id",
        )
        .bind(product.map(ProductId::as_str))
        .fetch_all(&self.pool)
        .await
        .map_err(pg_err("list api keys"))?;
        rows.into_iter()
            .map(|row| {
                let product: String = row.get("product_id");
                Ok(ApiKeyRecord {
                    product_id: ProductId::parse(&product)
                        .map_err(|e| PortError::invalid(format!("stored api key product: {e}")))?,
                    id: row.get("id"),
                    label: row.get("label"),
                    created_at: from_pg(row.get("created_at")),
                    revoked_at: row
                        .get::<Option<OffsetDateTime>, _>("revoked_at")
                        .map(from_pg),
                })
            })
            .collect()
    }

    /// Revokes key `id` of `product`; revoking twice keeps the first time.
    ///
    /// # Errors
    ///
    /// `NotFound` when the product has no such key.
    pub async fn revoke(&self, product: &ProductId, id: i64, now: Timestamp) -> PortResult<()> {
        let done = sqlx::query(
            "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $3) \
             WHERE product_id = $1 AND id = $2",
        )
        .bind(product.as_str())
        .bind(id)
        .bind(to_pg(now))
        .execute(&self.pool)
        .await
        .map_err(pg_err("revoke api key"))?;
        if done.rows_affected() == 0 {
            return Err(PortError::not_found(format!(
                "no api key {id} for product {product}"
            )));
        }
        Ok(())
    }

    /// The product a key with this digest opens, unless it is revoked.
    ///
    /// # Errors
    ///
    /// `Unavailable` when the database is unreachable.
    pub async fn product_for(&self, digest: &[u8; 32]) -> PortResult<Option<ProductId>> {
        let row = sqlx::query(
            "SELECT product_id FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL",
        )
        .bind(&digest[..])
        .fetch_optional(&self.pool)
        .await
        .map_err(pg_err("look up api key"))?;
        row.map(|r| {
            let p: String = r.get("product_id");
            ProductId::parse(&p)
                .map_err(|e| PortError::invalid(format!("stored api key product: {e}")))
        })
        .transpose()
    }
}
