//! The audit log: every transition of every machine, with cause and time.

use async_trait::async_trait;
use parlance_core::{EntityKind, ProductId, Timestamp};
use serde::Serialize;

use crate::PortResult;

/// A transition to record.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditEntry {
    /// The tenant.
    pub product_id: ProductId,
    /// Which machine.
    pub entity_kind: EntityKind,
    /// The entity's id within its kind and product.
    pub entity_id: String,
    /// State before (wire value), if the entity existed.
    pub from: Option<String>,
    /// State after (wire value).
    pub to: String,
    /// The command or event that caused the transition.
    pub cause: String,
    /// When it happened.
    pub at: Timestamp,
    /// Extra structured detail (a JSON object, `{}` when there is none).
    pub payload: serde_json::Value,
}

/// A recorded transition: the entry plus its position in the log.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditRecord {
    /// Strictly increasing per log; gaps are allowed across entities, never
    /// reordering.
    pub seq: i64,
    /// What was recorded.
    #[serde(flatten)]
    pub entry: AuditEntry,
}

/// Append-only storage of transitions.
///
/// Implemented by [`MemoryAuditLog`](https://docs.rs/parlance-memory/latest/parlance_memory/struct.MemoryAuditLog.html) and [`PgAuditLog`](https://docs.rs/parlance-postgres/latest/parlance_postgres/struct.PgAuditLog.html), whose
/// constructors' examples call it.
#[async_trait]
pub trait AuditLog: Send + Sync + 'static {
    /// Appends entries atomically, in order.
    async fn append(&self, entries: &[AuditEntry]) -> PortResult<()>;

    /// The entity's records, oldest first, at most `limit`, starting after
    /// `after_seq` when given.
    async fn list(
        &self,
        product_id: &ProductId,
        entity_kind: EntityKind,
        entity_id: &str,
        after_seq: Option<i64>,
        limit: usize,
    ) -> PortResult<Vec<AuditRecord>>;
}
