//! The crisis log: every crisis-gate assessment, with its provenance, for
//! safety review.
//!
//! A turn's assessment is committed with the turn or not at all: the turn
//! carries it in its checkpoint delta, in the reserved list
//! [`CRISIS_LOG_DELTA`], and the thread store writes it to the crisis log in
//! the same commit (never to the thread). A turn whose commit is lost, or
//! that fails before its commit, leaves no entry, and a turn run again after
//! a lost commit leaves exactly one.

use std::borrow::Cow;

use async_trait::async_trait;
use parlance_core::turn::seed::{CrisisAssessment, CrisisAudit};
use parlance_core::turn::{CheckpointDelta, OwnerId, ThreadId, ThreadKey};
use parlance_core::{ProductId, Timestamp};
use serde::{Deserialize, Serialize};

use crate::{PortError, PortResult};

/// The checkpoint-delta list whose entries are [`CrisisLogEntry`] values
/// (as JSON) for the thread store to write to the crisis log in the turn's
/// commit. No state field can have this name (`$` is not a field
/// character), so it never reaches a thread.
pub const CRISIS_LOG_DELTA: &str = "$crisis_log";

/// Adds `entries` to a turn's `delta`, for the thread store to write to
/// the crisis log in the turn's commit.
///
/// # Errors
///
/// `Invalid` when an entry does not encode.
pub fn carry_crisis_entries(
    delta: &mut CheckpointDelta,
    entries: &[CrisisLogEntry],
) -> PortResult<()> {
    if entries.is_empty() {
        return Ok(());
    }
    let values = entries
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| PortError::invalid(format!("crisis log entry does not encode: {e}")))?;
    delta
        .appends
        .entry(CRISIS_LOG_DELTA.to_owned())
        .or_default()
        .extend(values);
    Ok(())
}

/// Splits the delta of a turn on `thread` into what the thread stores (the
/// delta without [`CRISIS_LOG_DELTA`], borrowed when it has none) and the
/// crisis-log entries the same commit writes.
///
/// # Errors
///
/// `Invalid` when an entry of the reserved list is not a crisis-log entry,
/// or names another product, owner or thread than the turn's.
pub fn split_crisis_entries<'d>(
    thread: &ThreadKey,
    delta: &'d CheckpointDelta,
) -> PortResult<(Cow<'d, CheckpointDelta>, Vec<CrisisLogEntry>)> {
    let Some(values) = delta.appends.get(CRISIS_LOG_DELTA) else {
        return Ok((Cow::Borrowed(delta), Vec::new()));
    };
    let entries = values
        .iter()
        .map(|v| serde_json::from_value::<CrisisLogEntry>(v.clone()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| PortError::invalid(format!("a crisis log entry in a turn: {e}")))?;
    if entries.iter().any(|e| {
        e.product_id != thread.product_id || e.owner != thread.owner || e.thread != thread.thread
    }) {
        return Err(PortError::invalid(
            "a turn carries a crisis log entry of another thread",
        ));
    }
    let mut kept = delta.clone();
    kept.appends.remove(CRISIS_LOG_DELTA);
    Ok((Cow::Owned(kept), entries))
}

/// One assessment to record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CrisisLogRecord {
    /// Strictly increasing per log.
    pub seq: i64,
    /// What was recorded.
    #[serde(flatten)]
    pub entry: CrisisLogEntry,
}

/// Append-only storage of crisis assessments.
///
/// Implemented by [`MemoryCrisisLog`](https://docs.rs/parlance-memory/latest/parlance_memory/struct.MemoryCrisisLog.html) and [`PgCrisisLog`](https://docs.rs/parlance-postgres/latest/parlance_postgres/struct.PgCrisisLog.html), whose
/// constructors' examples call it.
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

    /// Deletes every record of the owner; returns how many.
    async fn erase_owner(&self, product_id: &ProductId, owner: &OwnerId) -> PortResult<usize>;
}
