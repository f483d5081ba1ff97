//! The crisis log in a vector.

use std::sync::Mutex;

use async_trait::async_trait;
use parlance_core::ProductId;
use parlance_core::turn::OwnerId;
use parlance_ports::{CrisisLog, CrisisLogEntry, CrisisLogRecord, PortResult};

/// An append-only crisis log held in memory.
#[derive(Debug, Default)]
pub struct MemoryCrisisLog {
    log: Mutex<Log>,
}

/// The records, and the last `seq` given (never reused, even once erased).
#[derive(Debug, Default)]
struct Log {
    last: i64,
    records: Vec<CrisisLogRecord>,
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
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        for entry in entries {
            log.last += 1;
            let seq = log.last;
            log.records.push(CrisisLogRecord { seq, entry });
        }
        log.last
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
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let after = after_seq.unwrap_or(i64::MIN);
        Ok(log
            .records
            .iter()
            .filter(|r| {
                r.seq > after && r.entry.product_id == *product_id && r.entry.owner == *owner
            })
            .take(limit)
            .cloned()
            .collect())
    }

    async fn erase_owner(&self, product_id: &ProductId, owner: &OwnerId) -> PortResult<usize> {
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let before = log.records.len();
        log.records
            .retain(|r| !(r.entry.product_id == *product_id && r.entry.owner == *owner));
        Ok(before - log.records.len())
    }
}
