//! The turn runtime's storage besides its threads: the memory store.
//!
//! A thread's checkpoint is a machine
//! ([`Checkpoint`](parlance_core::turn::Checkpoint)) stored through the one
//! storage protocol, `MachineStore<Checkpoint>`: `load` takes a
//! [`TurnKey`](parlance_core::turn::TurnKey), the thread plus the lists to
//! load only in part, and answers `None` for a thread with no turn; `commit`
//! writes the decision's [`TurnEffect::Write`] delta (new list entries
//! appended, objects replaced, the version bumped), never the decided state,
//! which may hold only a window of its lists. So a commit costs the same
//! however long the thread is. A thread's decisions carry no tasks: a commit
//! that carries one is refused as `Invalid` and writes nothing.
//!
//! [`TurnEffect::Write`]: parlance_core::turn::TurnEffect::Write

use async_trait::async_trait;
use parlance_core::ProductId;
use parlance_core::turn::{
    MemoryFilter, MemoryId, MemoryKind, MemoryRecord, OwnerId, ProceduralProfile, QueryEmbedding,
    Retrieved, ThreadId,
};

use crate::PortResult;

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
