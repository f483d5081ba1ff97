//! The turn runtime's storage: checkpoints per thread and the memory store.

use async_trait::async_trait;
use parlance_core::ProductId;
use parlance_core::turn::{
    Checkpoint, CheckpointDelta, LoadWindow, MemoryFilter, MemoryId, MemoryKind, MemoryRecord,
    OwnerId, ProceduralProfile, QueryEmbedding, Retrieved, ThreadId, ThreadKey,
};
use serde::Serialize;

use crate::PortResult;

/// What a successful commit reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Committed {
    /// The thread's version after the commit.
    pub version: u64,
    /// The payload bytes the commit wrote (new list entries and replaced
    /// objects); independent of how long the thread already is.
    pub bytes_written: usize,
}

/// Checkpoints of turn state, per (product, owner, thread).
///
/// List reducers are stored append-only, objects replaced whole; a commit is
/// a compare-and-swap on the thread's version.
#[async_trait]
pub trait Checkpointer: Send + Sync + 'static {
    /// The thread's checkpoint (version 0 and empty for a new thread), with
    /// the lists named in `window` cut to their last entries.
    async fn load(&self, key: &ThreadKey, window: &LoadWindow) -> PortResult<Checkpoint>;

    /// Appends the delta's list entries and replaces its objects, if the
    /// thread is still at `expected_version` (0 for a new thread); the
    /// version then goes up by one. A stale version is a `Conflict` and
    /// writes nothing.
    async fn commit(
        &self,
        key: &ThreadKey,
        expected_version: u64,
        delta: &CheckpointDelta,
    ) -> PortResult<Committed>;
}

/// Long-term memory per owner: semantic and episodic entries, the
/// procedural profile and session memory, with hybrid retrieval.
#[async_trait]
pub trait MemoryStore: Send + Sync + 'static {
    /// Stores an entry (its id is new; a repeated id is a `Conflict`).
    async fn add(&self, product_id: &ProductId, record: &MemoryRecord) -> PortResult<()>;

    /// The owner's entries (of one kind when given), oldest first.
    async fn list(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
        kind: Option<MemoryKind>,
    ) -> PortResult<Vec<MemoryRecord>>;

    /// Deletes one entry; `NotFound` when the owner has no such entry.
    async fn delete(&self, product_id: &ProductId, owner: &OwnerId, id: MemoryId)
    -> PortResult<()>;

    /// Deletes the owner's entries matching `filter`; returns how many.
    async fn delete_where(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
        filter: &MemoryFilter,
    ) -> PortResult<usize>;

    /// The owner's procedural profile (the default when none was stored).
    async fn profile(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
    ) -> PortResult<ProceduralProfile>;

    /// Replaces the owner's procedural profile.
    async fn put_profile(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
        profile: &ProceduralProfile,
    ) -> PortResult<()>;

    /// The session memory kept for one of the owner's sessions, if any.
    async fn session_memory(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
        session: &ThreadId,
    ) -> PortResult<Option<serde_json::Value>>;

    /// Replaces the session memory of one of the owner's sessions.
    async fn put_session_memory(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
        session: &ThreadId,
        value: &serde_json::Value,
    ) -> PortResult<()>;

    /// The `k` entries best matching `query`: token recall, fused with
    /// cosine similarity by reciprocal rank fusion when `embedding` holds
    /// the query's vector. The path taken is reported.
    async fn retrieve(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
        query: &str,
        k: usize,
        embedding: QueryEmbedding<'_>,
    ) -> PortResult<Retrieved>;
}
