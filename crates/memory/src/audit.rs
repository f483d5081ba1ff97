//! The audit log in a vector.

use std::sync::Mutex;

use async_trait::async_trait;
use parlance_core::{EntityKind, ProductId};
use parlance_ports::{AuditEntry, AuditLog, AuditRecord, PortResult};

/// An append-only audit log held in memory.
#[derive(Debug, Default)]
pub struct MemoryAuditLog {
    records: Mutex<Vec<AuditRecord>>,
}

impl MemoryAuditLog {
    /// An empty log.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends without awaiting, so other in-memory adapters can write their
    /// audit entries while holding their own lock (atomically with the change).
    pub fn push(&self, entries: &[AuditEntry]) {
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        for entry in entries {
            let seq = records.last().map_or(1, |r| r.seq + 1);
            records.push(AuditRecord {
                seq,
                entry: entry.clone(),
            });
        }
    }
}

#[async_trait]
impl AuditLog for MemoryAuditLog {
    async fn append(&self, entries: &[AuditEntry]) -> PortResult<()> {
        self.push(entries);
        Ok(())
    }

    async fn list(
        &self,
        product_id: &ProductId,
        entity_kind: EntityKind,
        entity_id: &str,
        after_seq: Option<i64>,
        limit: usize,
    ) -> PortResult<Vec<AuditRecord>> {
        let records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        let after = after_seq.unwrap_or(i64::MIN);
        // Records are in seq order, so skip what is at or before the cursor.
        let start = records.partition_point(|r| r.seq <= after);
        Ok(records[start..]
            .iter()
            .filter(|r| {
                r.entry.product_id == *product_id
                    && r.entry.entity_kind == entity_kind
                    && r.entry.entity_id == entity_id
            })
            .take(limit)
            .cloned()
            .collect())
    }
}
