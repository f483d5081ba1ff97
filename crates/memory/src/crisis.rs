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
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use parlance_core::turn::seed::{CrisisAssessment, CrisisAudit};
    /// use parlance_core::turn::{OwnerId, ThreadId};
    /// use parlance_core::{ProductId, Timestamp};
    /// use parlance_memory::MemoryCrisisLog;
    /// use parlance_ports::{CrisisLog, CrisisLogEntry};
    ///
    /// let log = MemoryCrisisLog::new();
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
    ///
    /// // Erasing an owner removes every record of theirs.
    /// assert_eq!(log.erase_owner(&acme, &owner).await?, 1);
    /// # Ok(())
    /// # }
    /// ```
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
