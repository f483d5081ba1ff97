//! The crisis log in the `crisis_log` table.

use async_trait::async_trait;
use parlance_core::ProductId;
use parlance_core::turn::seed::{CrisisAssessment, CrisisAudit};
use parlance_core::turn::{OwnerId, ThreadId};
use parlance_ports::{CrisisLog, CrisisLogEntry, CrisisLogRecord, PortError, PortResult};
use sqlx::{PgPool, Row as _};

use crate::error::{pg_err, stored_int};
use crate::time::{from_pg, to_pg};

/// Inserts one assessment through `ex` (the pool, or the transaction of
/// the turn that carries it); returns its `seq`.
pub(crate) async fn insert_entry<'e, E>(ex: E, e: &CrisisLogEntry) -> Result<i64, sqlx::Error>
where
    E: sqlx::PgExecutor<'e>,
{
    let turn = i64::try_from(e.turn)
        .map_err(|_| sqlx::Error::Protocol("crisis log turn out of range".to_owned()))?;
    sqlx::query(
        "INSERT INTO crisis_log (product_id, owner_id, thread_id, turn, at, level, confidence, \
         reason, needs_crisis_response, needs_clarification, classifier_path, override_kind, \
         llm_failure_occurred, route) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) RETURNING seq",
    )
    .bind(e.product_id.as_str())
    .bind(e.owner.as_str())
    .bind(e.thread.as_str())
    .bind(turn)
    .bind(to_pg(e.at))
    .bind(i16::from(e.assessment.level.min(3)))
    .bind(e.assessment.confidence)
    .bind(&e.assessment.reason)
    .bind(e.assessment.needs_crisis_response)
    .bind(e.assessment.needs_clarification)
    .bind(&e.audit.classifier_path)
    .bind(e.audit.override_kind.as_deref())
    .bind(e.audit.llm_failure_occurred)
    .bind(&e.route)
    .fetch_one(ex)
    .await
    .and_then(|row| row.try_get::<i64, _>("seq"))
}

/// The crisis log, stored in PostgreSQL.
#[derive(Debug, Clone)]
pub struct PgCrisisLog {
    pool: PgPool,
}

impl PgCrisisLog {
    /// A crisis log on `pool` (migrated).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use parlance_core::turn::seed::{CrisisAssessment, CrisisAudit};
    /// use parlance_core::turn::{OwnerId, ThreadId};
    /// use parlance_core::{ProductId, Timestamp};
    /// use parlance_ports::{CrisisLog, CrisisLogEntry};
    /// use parlance_postgres::PgCrisisLog;
    ///
    /// // A fresh, migrated database; an application opens its pool with
    /// // `connect` and runs `migrate`. `None` where no PostgreSQL is configured.
    /// let Some(pool) = parlance_postgres::testing::test_pool().await else { return Ok(()) };
    /// let log = PgCrisisLog::new(pool);
    /// let (acme, owner) = (ProductId::parse("acme")?, OwnerId::parse("user-7")?);
    /// let entry = CrisisLogEntry {
    ///     product_id: acme.clone(),
    ///     owner: owner.clone(),
    ///     thread: ThreadId::parse("t-1")?,
    ///     turn: 1,
    ///     at: Timestamp::from_secs(1_767_225_600).expect("in range"),
    ///     assessment: CrisisAssessment {
    ///         level: 0,
    ///         confidence: 0.9,
    ///         reason: "small talk".to_owned(),
    ///         needs_crisis_response: false,
    ///         needs_clarification: false,
    ///     },
    ///     audit: CrisisAudit::default(),
    ///     route: "dispatch".to_owned(),
    /// };
    /// let seq = log.record(&entry).await?;
    /// let records = log.list(&acme, &owner, None, 10).await?;
    /// assert_eq!((records[0].seq, &records[0].entry), (seq, &entry));
    /// assert_eq!(log.erase_owner(&acme, &owner).await?, 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

#[async_trait]
impl CrisisLog for PgCrisisLog {
    async fn record(&self, e: &CrisisLogEntry) -> PortResult<i64> {
        if i64::try_from(e.turn).is_err() {
            return Err(PortError::invalid("turn out of range"));
        }
        insert_entry(&self.pool, e)
            .await
            .map_err(pg_err("record crisis assessment"))
    }

    async fn erase_owner(&self, product_id: &ProductId, owner: &OwnerId) -> PortResult<usize> {
        let done = sqlx::query("DELETE FROM crisis_log WHERE product_id = $1 AND owner_id = $2")
            .bind(product_id.as_str())
            .bind(owner.as_str())
            .execute(&self.pool)
            .await
            .map_err(pg_err("erase crisis assessments"))?;
        Ok(usize::try_from(done.rows_affected()).unwrap_or(usize::MAX))
    }

    async fn list(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
        after_seq: Option<i64>,
        limit: usize,
    ) -> PortResult<Vec<CrisisLogRecord>> {
        let rows = sqlx::query(
            "SELECT seq, thread_id, turn, at, level, confidence, reason, needs_crisis_response, \
             needs_clarification, classifier_path, override_kind, llm_failure_occurred, route \
             FROM crisis_log WHERE product_id = $1 AND owner_id = $2 AND seq > $3 \
             ORDER BY seq LIMIT $4",
        )
        .bind(product_id.as_str())
        .bind(owner.as_str())
        .bind(after_seq.unwrap_or(0))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await
        .map_err(pg_err("list crisis assessments"))?;
        rows.into_iter()
            .map(|row| {
                let thread: String = row.try_get("thread_id")?;
                let turn: i64 = row.try_get("turn")?;
                let level: i16 = row.try_get("level")?;
                Ok(CrisisLogRecord {
                    seq: row.try_get("seq")?,
                    entry: CrisisLogEntry {
                        product_id: product_id.clone(),
                        owner: owner.clone(),
                        thread: ThreadId::parse(thread)
                            .map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
                        turn: stored_int("turn", turn)?,
                        at: from_pg(row.try_get("at")?),
                        assessment: CrisisAssessment {
                            level: u8::try_from(level).unwrap_or(3),
                            confidence: row.try_get("confidence")?,
                            reason: row.try_get("reason")?,
                            needs_crisis_response: row.try_get("needs_crisis_response")?,
                            needs_clarification: row.try_get("needs_clarification")?,
                        },
                        audit: CrisisAudit {
                            override_kind: row.try_get("override_kind")?,
                            classifier_path: row.try_get("classifier_path")?,
                            llm_failure_occurred: row.try_get("llm_failure_occurred")?,
                        },
                        route: row.try_get("route")?,
                    },
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(pg_err("decode crisis assessments"))
    }
}
