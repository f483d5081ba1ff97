//! Turn threads and the memory store in maps.
//!
//! Threads are [`Records`] of [`Checkpoint`], committed under the records'
//! gate like every in-memory machine; a record holds the whole thread, and a
//! commit applies the decision's [`TurnEffect::Write`] delta to it (the
//! decided state may hold only a window of its lists, so it is never stored
//! as is). The crisis-log entries a turn carries
//! ([`CRISIS_LOG_DELTA`](parlance_ports::CRISIS_LOG_DELTA)) are appended to
//! the store's crisis log under the same gate, only when the thread is
//! written.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use parlance_core::ProductId;
use parlance_core::queue::DagLimits;
use parlance_core::turn::CheckpointDelta;
use parlance_core::turn::{
    Checkpoint, MemoryFilter, MemoryId, MemoryKind, MemoryRecord, OwnerId, ProceduralProfile,
    QueryEmbedding, Retrieved, ThreadId, TurnEffect, TurnKey, retrieve_from,
};
use parlance_ports::{
    Commit, Committed, MachineStore, MemoryStore, PortError, PortResult, Stored,
    split_crisis_entries,
};

use crate::{MemoryAuditLog, MemoryCrisisLog, Records};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Turn threads held in memory: one record per thread, every list whole.
#[derive(Debug)]
pub struct MemoryCheckpointStore {
    records: Records<Checkpoint>,
    crisis_log: Arc<MemoryCrisisLog>,
}

impl MemoryCheckpointStore {
    /// No threads yet; commits write their audit entries (a thread's
    /// decisions have none today) to `audit`, and the crisis-log entries
    /// turns carry to a crisis log of its own ([`Self::crisis_log`]).
    pub fn new(audit: Arc<MemoryAuditLog>) -> Self {
        Self {
            records: Records::new(audit, None, DagLimits::default()),
            crisis_log: Arc::new(MemoryCrisisLog::new()),
        }
    }

    /// Writes the crisis-log entries turns carry to `log` instead.
    pub fn with_crisis_log(mut self, log: Arc<MemoryCrisisLog>) -> Self {
        self.crisis_log = log;
        self
    }

    /// The crisis log this store's commits write to.
    pub fn crisis_log(&self) -> Arc<MemoryCrisisLog> {
        self.crisis_log.clone()
    }
}

/// The whole thread `current` (a new one when `None`) with `deltas`
/// applied in order; its version is set when it is stored.
fn written(current: Option<&Stored<Checkpoint>>, deltas: &[CheckpointDelta]) -> Checkpoint {
    let mut thread = current.map(|s| s.state.clone()).unwrap_or_default();
    for delta in deltas {
        thread.apply(delta);
    }
    thread
}

#[async_trait]
impl MachineStore<Checkpoint> for MemoryCheckpointStore {
    async fn load(&self, key: &TurnKey) -> PortResult<Option<Stored<Checkpoint>>> {
        Ok(self.records.load(key).await.map(|s| Stored {
            state: s.state.windowed(&key.window),
            version: s.version,
        }))
    }

    async fn commit(&self, c: Commit<'_, Checkpoint>) -> PortResult<Committed<Checkpoint>> {
        if !c.decision.tasks.is_empty() {
            return Err(PortError::invalid("a turn thread enqueues no tasks"));
        }
        // The thread's deltas, and the crisis-log entries they carry.
        let mut deltas = Vec::with_capacity(c.decision.effects.len());
        let mut entries = Vec::new();
        for effect in &c.decision.effects {
            let TurnEffect::Write(delta) = effect;
            let (thread, carried) = split_crisis_entries(&c.key.thread, delta)?;
            deltas.push(thread.into_owned());
            entries.extend(carried);
        }
        let version = self
            .records
            .commit(
                &c,
                Checkpoint::default(),
                |current| Ok(written(current, &deltas)),
                |stored, _, thread| {
                    stored.state = thread;
                    stored.state.version = stored.version.0;
                    // Under the gate, with the thread: both or neither.
                    self.crisis_log.append(entries);
                },
            )
            .await?;
        Ok(Committed::at(version))
    }
}

type OwnerKey = (ProductId, OwnerId);

/// The memory store held in memory.
#[derive(Debug, Default)]
pub struct MemoryMemoryStore {
    entries: Mutex<HashMap<OwnerKey, Vec<MemoryRecord>>>,
    profiles: Mutex<HashMap<OwnerKey, ProceduralProfile>>,
    sessions: Mutex<HashMap<(ProductId, OwnerId, ThreadId), serde_json::Value>>,
}

impl MemoryMemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

fn key(product_id: &ProductId, owner: &OwnerId) -> OwnerKey {
    (product_id.clone(), owner.clone())
}

#[async_trait]
impl MemoryStore for MemoryMemoryStore {
    async fn add(&self, product_id: &ProductId, record: &MemoryRecord) -> PortResult<()> {
        let mut entries = lock(&self.entries);
        if entries
            .iter()
            .filter(|((p, _), _)| p == product_id)
            .flat_map(|(_, list)| list)
            .any(|r| r.id == record.id)
        {
            return Err(PortError::conflict(format!(
                "memory entry {} already exists",
                record.id
            )));
        }
        let list = entries.entry(key(product_id, &record.owner)).or_default();
        list.push(record.clone());
        // Oldest first, then by id, as PostgreSQL lists them.
        list.sort_by_key(|r| (r.at, r.id));
        Ok(())
    }

    async fn list(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
        kind: Option<MemoryKind>,
    ) -> PortResult<Vec<MemoryRecord>> {
        let entries = lock(&self.entries);
        Ok(entries
            .get(&key(product_id, owner))
            .map(|list| {
                list.iter()
                    .filter(|r| kind.is_none_or(|k| r.entry.kind() == k))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default())
    }

    async fn delete(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
        id: MemoryId,
    ) -> PortResult<()> {
        let mut entries = lock(&self.entries);
        let list = entries.entry(key(product_id, owner)).or_default();
        let before = list.len();
        list.retain(|r| r.id != id);
        if list.len() == before {
            return Err(PortError::not_found(format!("memory entry {id}")));
        }
        Ok(())
    }

    async fn delete_where(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
        filter: &MemoryFilter,
    ) -> PortResult<usize> {
        let mut entries = lock(&self.entries);
        let list = entries.entry(key(product_id, owner)).or_default();
        let before = list.len();
        list.retain(|r| !filter.matches(r));
        Ok(before - list.len())
    }

    async fn profile(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
    ) -> PortResult<ProceduralProfile> {
        Ok(lock(&self.profiles)
            .get(&key(product_id, owner))
            .cloned()
            .unwrap_or_default())
    }

    async fn put_profile(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
        profile: &ProceduralProfile,
    ) -> PortResult<()> {
        lock(&self.profiles).insert(key(product_id, owner), profile.clone());
        Ok(())
    }

    async fn session_memory(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
        session: &ThreadId,
    ) -> PortResult<Option<serde_json::Value>> {
        Ok(lock(&self.sessions)
            .get(&(product_id.clone(), owner.clone(), session.clone()))
            .cloned())
    }

    async fn put_session_memory(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
        session: &ThreadId,
        value: &serde_json::Value,
    ) -> PortResult<()> {
        lock(&self.sessions).insert(
            (product_id.clone(), owner.clone(), session.clone()),
            value.clone(),
        );
        Ok(())
    }

    async fn retrieve(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
        query: &str,
        k: usize,
        embedding: QueryEmbedding<'_>,
    ) -> PortResult<Retrieved> {
        let entries = lock(&self.entries);
        let candidates = entries
            .get(&key(product_id, owner))
            .map(Vec::as_slice)
            .unwrap_or_default();
        Ok(retrieve_from(candidates, query, k, embedding))
    }
}
