//! The crisis log in a vector.

use std::sync::Mutex;

use async_trait::async_trait;
use parlance_core::ProductId;
use parlance_core::turn::OwnerId;
use parlance_ports::{CrisisLog, CrisisLogEntry, CrisisLogRecord, PortResult};

/// An append-only crisis log held in memory.
#[derive(Debug, Default)]
pub struct MemoryCrisisLog {
    records: Mutex<Vec<CrisisLogRecord>>,
}

impl MemoryCrisisLog {
    /// An empty log.
    pub fn new() -> Self {
        Self::default()
    }
}

impl MemoryCrisisLog {
    /// Appends `entries` in order; returns the last `seq` (0 for none).
    pub(crate) fn append(&self, entries: impl IntoIterator<Item = CrisisLogEntry>) -> i64 {
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        let mut seq = records.last().map_or(0, |r| r.seq);
        for entry in entries {
            seq += 1;
            records.push(CrisisLogRecord { seq, entry });
        }
        seq
    }
}

#[async_trait]
impl CrisisLog for MemoryCrisisLog {
    async fn record(&self, entry: &CrisisLogEntry) -> PortResult<i64> {
        Ok(self.append([entry.clone()]))
    }

    async fn list(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
        after_seq: Option<i64>,
        limit: usize,
    ) -> PortResult<Vec<CrisisLogRecord>> {
        let records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        let after = after_seq.unwrap_or(i64::MIN);
        Ok(records
            .iter()
            .filter(|r| {
                r.seq > after && r.entry.product_id == *product_id && r.entry.owner == *owner
            })
            .take(limit)
            .cloned()
            .collect())
    }
}
