//! The crisis log: every crisis-gate assessment, with its provenance, for
//! safety review.

use async_trait::async_trait;
use parlance_core::turn::seed::{CrisisAssessment, CrisisAudit};
use parlance_core::turn::{OwnerId, ThreadId};
use parlance_core::{ProductId, Timestamp};
use serde::{Deserialize, Serialize};

use crate::PortResult;

/// One assessment to record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CrisisLogEntry {
    /// The tenant.
    pub product_id: ProductId,
    /// Whose conversation.
    pub owner: OwnerId,
    /// Which thread.
    pub thread: ThreadId,
    /// The turn number in the thread (1 first).
    pub turn: u64,
    /// When the gate decided.
    pub at: Timestamp,
    /// What it decided.
    pub assessment: CrisisAssessment,
    /// How it decided.
    pub audit: CrisisAudit,
    /// The route the turn took after the gate (`crisis` or `dispatch`).
    pub route: String,
}

/// A recorded assessment with its position in the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CrisisLogRecord {
    /// Strictly increasing per log.
    pub seq: i64,
    /// What was recorded.
    #[serde(flatten)]
    pub entry: CrisisLogEntry,
}

/// Append-only storage of crisis assessments.
#[async_trait]
pub trait CrisisLog: Send + Sync + 'static {
    /// Appends one assessment; returns its `seq`.
    async fn record(&self, entry: &CrisisLogEntry) -> PortResult<i64>;

    /// The owner's records, oldest first, at most `limit`, after `after_seq`
    /// when given.
    async fn list(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
        after_seq: Option<i64>,
        limit: usize,
    ) -> PortResult<Vec<CrisisLogRecord>>;
}
