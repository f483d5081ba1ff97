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
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use parlance_core::{EntityKind, ProductId, Timestamp};
    /// use parlance_memory::MemoryAuditLog;
    /// use parlance_ports::{AuditEntry, AuditLog};
    ///
    /// let log = MemoryAuditLog::new();
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
    ///
    /// let records = log.list(&acme, EntityKind::Session, "visit-1", None, 10).await?;
    /// assert_eq!(records.len(), 1);
    /// assert_eq!(records[0].entry, entry);
    /// # Ok(())
    /// # }
    /// ```
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
