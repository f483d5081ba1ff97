//! The audit log in the `audit_log` table.

use async_trait::async_trait;
use parlance_core::{EntityKind, ProductId};
use parlance_ports::{AuditEntry, AuditLog, AuditRecord, PortResult};
use sqlx::{PgPool, Postgres, QueryBuilder, Row as _};

use crate::error::pg_err;
use crate::time::{from_pg, to_pg};

/// The audit log, stored in PostgreSQL.
#[derive(Debug, Clone)]
pub struct PgAuditLog {
    pool: PgPool,
}

impl PgAuditLog {
    /// An audit log on `pool` (migrated).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use parlance_core::{EntityKind, ProductId, Timestamp};
    /// use parlance_ports::{AuditEntry, AuditLog};
    /// use parlance_postgres::PgAuditLog;
    ///
    /// // A fresh, migrated database; an application opens its pool with
    /// // `connect` and runs `migrate`. `None` where no PostgreSQL is configured.
    /// let Some(pool) = parlance_postgres::testing::test_pool().await else { return Ok(()) };
    /// let log = PgAuditLog::new(pool);
    /// let acme = ProductId::parse("acme")?;
    /// let entry = AuditEntry {
    ///     product_id: acme.clone(),
    ///     entity_kind: EntityKind::Session,
    ///     entity_id: "visit-1".to_owned(),
    ///     from: Some("thinking".to_owned()),
    ///     to: "reactive_assistance".to_owned(),
    ///     cause: "open_chat".to_owned(),
    ///     at: Timestamp::from_secs(1_767_225_600).expect("in range"),
    ///     payload: serde_json::json!({}),
    /// };
    /// log.append(&[entry.clone()]).await?;
    /// let records = log.list(&acme, EntityKind::Session, "visit-1", None, 10).await?;
    /// assert_eq!(records[0].entry, entry);
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

/// Appends entries with one `INSERT` on `executor`, so callers that save a
/// machine can write its audit entries in the same transaction.
pub(crate) async fn insert_entries<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    entries: &[AuditEntry],
) -> Result<(), sqlx::Error> {
    if entries.is_empty() {
        return Ok(());
    }
    let mut q: QueryBuilder<'_, Postgres> = QueryBuilder::new(
        "INSERT INTO audit_log (product_id, entity_kind, entity_id, from_state, to_state, cause, at, payload) ",
    );
    q.push_values(entries, |mut b, e| {
        b.push_bind(e.product_id.as_str())
            .push_bind(e.entity_kind.as_str())
            .push_bind(&e.entity_id)
            .push_bind(e.from.as_deref())
            .push_bind(&e.to)
            .push_bind(&e.cause)
            .push_bind(to_pg(e.at))
            .push_bind(&e.payload);
    });
    q.build().execute(executor).await.map(|_| ())
}

#[async_trait]
impl AuditLog for PgAuditLog {
    async fn append(&self, entries: &[AuditEntry]) -> PortResult<()> {
        insert_entries(&self.pool, entries)
            .await
            .map_err(pg_err("append audit entries"))
    }

    async fn list(
        &self,
        product_id: &ProductId,
        entity_kind: EntityKind,
        entity_id: &str,
        after_seq: Option<i64>,
        limit: usize,
    ) -> PortResult<Vec<AuditRecord>> {
        let rows = sqlx::query(
            "SELECT seq, from_state, to_state, cause, at, payload FROM audit_log \
             WHERE product_id = $1 AND entity_kind = $2 AND entity_id = $3 AND seq > $4 \
             ORDER BY seq LIMIT $5",
        )
        .bind(product_id.as_str())
        .bind(entity_kind.as_str())
        .bind(entity_id)
        .bind(after_seq.unwrap_or(0))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await
        .map_err(pg_err("list audit entries"))?;
        rows.into_iter()
            .map(|row| {
                Ok(AuditRecord {
                    seq: row.try_get("seq")?,
                    entry: AuditEntry {
                        product_id: product_id.clone(),
                        entity_kind,
                        entity_id: entity_id.to_owned(),
                        from: row.try_get("from_state")?,
                        to: row.try_get("to_state")?,
                        cause: row.try_get("cause")?,
                        at: from_pg(row.try_get("at")?),
                        payload: row.try_get("payload")?,
                    },
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(pg_err("decode audit entries"))
    }
}
