//! The turn runtime's storage: threads with their history
//! ([`Checkpointer`]) and the memory store.
//!
//! A thread's checkpoint is a machine
//! ([`Checkpoint`]) stored through the one
//! storage protocol, `MachineStore<Checkpoint>`: `load` takes a
//! [`TurnKey`](parlance_core::turn::TurnKey), the thread plus the lists to
//! load only in part, and answers `None` for a thread with no turn; `commit`
//! writes the decision's [`TurnEffect::Write`] delta (new list entries
//! appended, objects replaced, the version bumped), never the decided state,
//! which may hold only a window of its lists. So a commit costs the same
//! however long the thread is. A thread's decisions carry no tasks: a commit
//! that carries one is refused as `Invalid` and writes nothing.
//!
//! Each commit is also an immutable entry of the thread's history: its
//! number, parent, time and source, and what it changed (new list entries
//! and the objects patch), with a full copy of the objects every few
//! checkpoints, so the state as of any checkpoint is rebuilt from the
//! nearest copy plus at most that many patches. [`Checkpointer`] adds
//! reading that history, forking, and deleting threads.
//!
//! [`TurnEffect::Write`]: parlance_core::turn::TurnEffect::Write

use std::borrow::Cow;

use async_trait::async_trait;
use parlance_core::turn::{
    Checkpoint, CheckpointDelta, CheckpointMeta, MemoryFilter, MemoryId, MemoryKind, MemoryRecord,
    OwnerId, ProceduralProfile, QueryEmbedding, Retrieved, ThreadId, ThreadKey,
};
use parlance_core::{ProductId, Timestamp};
use serde::{Deserialize, Serialize};

use crate::{MachineStore, PortError, PortResult};

/// The reserved list of a turn's delta naming the owner's memory entries
/// the thread store deletes in the turn's commit: a confirmed deletion
/// happens with the commit that records it, or not at all.
pub const FORGET_MEMORY_DELTA: &str = "$forget_memory";

/// Adds `ids` to a turn's `delta`, for the thread store to delete from the
/// thread owner's memory in the turn's commit.
pub fn carry_forgotten(delta: &mut CheckpointDelta, ids: &[MemoryId]) {
    if ids.is_empty() {
        return;
    }
    delta
        .appends
        .entry(FORGET_MEMORY_DELTA.to_owned())
        .or_default()
        .extend(
            ids.iter()
                .map(|id| serde_json::Value::String(id.to_string())),
        );
}

/// Splits a turn's delta into what the thread stores (the delta without
/// [`FORGET_MEMORY_DELTA`], borrowed when it has none) and the memory
/// entries the same commit deletes.
///
/// # Errors
///
/// `Invalid` when an entry of the reserved list is not a memory id.
pub fn split_forgotten(
    delta: &CheckpointDelta,
) -> PortResult<(Cow<'_, CheckpointDelta>, Vec<MemoryId>)> {
    let Some(values) = delta.appends.get(FORGET_MEMORY_DELTA) else {
        return Ok((Cow::Borrowed(delta), Vec::new()));
    };
    let ids = values
        .iter()
        .map(|v| serde_json::from_value::<MemoryId>(v.clone()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| PortError::invalid(format!("a memory id to forget in a turn: {e}")))?;
    let mut kept = delta.clone();
    kept.appends.remove(FORGET_MEMORY_DELTA);
    Ok((Cow::Owned(kept), ids))
}

/// A page of a thread's history, newest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryPage {
    /// Only checkpoints older than this one (numbered below it).
    pub before: Option<u64>,
    /// At most this many.
    pub limit: usize,
}

impl HistoryPage {
    /// The newest `limit` checkpoints.
    pub fn newest(limit: usize) -> Self {
        Self {
            before: None,
            limit,
        }
    }
}

/// One of an owner's threads, as a list shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadSummary {
    /// The thread.
    pub thread: ThreadId,
    /// Its version: the number of its newest checkpoint.
    pub version: u64,
    /// When its newest checkpoint was written.
    pub updated_at: Timestamp,
    /// True when a turn of it waits on an interrupt.
    pub interrupted: bool,
}

/// Where a page of an owner's threads starts: after the last thread of the
/// previous page (threads are listed newest first, by their last write,
/// then by id).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadCursor {
    /// The last listed thread's `updated_at`.
    pub updated_at: Timestamp,
    /// The last listed thread.
    pub thread: ThreadId,
}

/// A page of an owner's threads, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadPage {
    /// Only threads after this one in the order of the list.
    pub after: Option<ThreadCursor>,
    /// At most this many.
    pub limit: usize,
}

/// The thread store with its history: `MachineStore<Checkpoint>` for the
/// current state (one read, O(1) commits), plus each thread's immutable
/// checkpoints, forks, and deletion.
///
/// Implemented by [`MemoryCheckpointStore`](https://docs.rs/parlance-memory/latest/parlance_memory/struct.MemoryCheckpointStore.html) and [`PgCheckpointStore`](https://docs.rs/parlance-postgres/latest/parlance_postgres/struct.PgCheckpointStore.html), whose
/// constructors' examples call it.
#[async_trait]
pub trait Checkpointer: MachineStore<Checkpoint> {
    /// The thread's checkpoints, newest first, as `page` says; none for a
    /// thread that does not exist.
    async fn history(
        &self,
        thread: &ThreadKey,
        page: HistoryPage,
    ) -> PortResult<Vec<CheckpointMeta>>;

    /// The thread's state as of checkpoint `version`, every list whole (its
    /// version is `version`); `None` when the thread has no such
    /// checkpoint.
    async fn load_at(&self, thread: &ThreadKey, version: u64) -> PortResult<Option<Checkpoint>>;

    /// A new thread `to` whose state is `from`'s as of checkpoint
    /// `version`: its first checkpoint (source `fork`, parent `from` at
    /// `version`), written at `now`. `NotFound` when `from` has no such
    /// checkpoint, `Conflict` when `to` exists, `Invalid` when `to` is in
    /// another product.
    async fn fork(
        &self,
        from: &ThreadKey,
        version: u64,
        to: &ThreadKey,
        now: Timestamp,
    ) -> PortResult<CheckpointMeta>;

    /// Deletes the thread with every row that belongs to it (its state, list
    /// entries and history); false when there was no such thread.
    async fn delete_thread(&self, thread: &ThreadKey) -> PortResult<bool>;

    /// The owner's threads, newest first, as `page` says.
    async fn threads(
        &self,
        product_id: &ProductId,
        owner: &OwnerId,
        page: &ThreadPage,
    ) -> PortResult<Vec<ThreadSummary>>;
}

/// Long-term memory per owner: semantic and episodic entries, the
/// procedural profile and session memory, with hybrid retrieval.
///
/// Implemented by [`MemoryMemoryStore`](https://docs.rs/parlance-memory/latest/parlance_memory/struct.MemoryMemoryStore.html) and [`PgMemoryStore`](https://docs.rs/parlance-postgres/latest/parlance_postgres/struct.PgMemoryStore.html), whose
/// constructors' examples call it.
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

    /// Erases everything kept for the owner: every entry, the procedural
    /// profile and every session memory. Returns how many entries went.
    async fn erase_owner(&self, product_id: &ProductId, owner: &OwnerId) -> PortResult<usize>;

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
