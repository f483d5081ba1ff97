//! Checkpoints and the memory store in maps.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;
use parlance_core::ProductId;
use parlance_core::turn::{
    Checkpoint, CheckpointDelta, LoadWindow, MemoryFilter, MemoryId, MemoryKind, MemoryRecord,
    OwnerId, ProceduralProfile, QueryEmbedding, Retrieved, ThreadId, ThreadKey, retrieve_from,
};
use parlance_ports::{Checkpointer, Committed, MemoryStore, PortError, PortResult};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Checkpoints held in memory.
#[derive(Debug, Default)]
pub struct MemoryCheckpointer {
    threads: Mutex<HashMap<ThreadKey, Checkpoint>>,
}

impl MemoryCheckpointer {
    /// No threads yet.
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl Checkpointer for MemoryCheckpointer {
    async fn load(&self, key: &ThreadKey, window: &LoadWindow) -> PortResult<Checkpoint> {
        let threads = lock(&self.threads);
        Ok(threads
            .get(key)
            .cloned()
            .unwrap_or_default()
            .windowed(window))
    }

    async fn commit(
        &self,
        key: &ThreadKey,
        expected_version: u64,
        delta: &CheckpointDelta,
    ) -> PortResult<Committed> {
        let mut threads = lock(&self.threads);
        let current = threads.get(key).map_or(0, |c| c.version);
        if current != expected_version {
            return Err(PortError::conflict(format!(
                "thread {} is at version {current}, not {expected_version}",
                key.thread
            )));
        }
        let cp = threads.entry(key.clone()).or_default();
        cp.apply(delta);
        Ok(Committed {
            version: cp.version,
            bytes_written: delta.encoded_len(),
        })
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
