//! Flow sessions: compare-and-swap session records, an append-only dialogue
//! and progress per invoker chain.

use async_trait::async_trait;
use parlance_core::flow::{DialogueElement, FlowSession};
use parlance_core::{ProductId, Timestamp};
use serde::Serialize;

use crate::queue::{DagId, DagSpec};
use crate::{AuditEntry, PortResult};

/// A session as stored, with its version for compare-and-swap.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredFlowSession {
    /// The session (without its dialogue).
    pub session: FlowSession,
    /// Bumped by every save.
    pub version: i64,
    /// How many dialogue elements it has.
    pub dialogue_len: i64,
}

/// Progress of one invoker chain: totals accumulate across hops.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChainProgress {
    /// The chain (the first invocation's id).
    pub chain_id: String,
    /// Tasks counted so far (grows when a DAG joins the chain or a map expands).
    pub total: i64,
    /// Tasks finished.
    pub done: i64,
    /// What is running now.
    pub label: String,
}

/// Progress written in the same commit as a transition: a DAG joining the
/// chain adds its counted tasks, the completion task adds one done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgressUpdate {
    /// The chain; created when new, extended when it exists.
    pub chain_id: String,
    /// Added to the chain's total (a new DAG's counted tasks).
    pub add_total: i64,
    /// Added to the chain's done count.
    pub add_done: i64,
    /// The label of the state now running; `None` keeps the current one.
    pub label: Option<String>,
}

/// A DAG that starts with a transition: enqueued in the transition's commit,
/// with the progress it adds to its chain.
#[derive(Debug, Clone, PartialEq)]
pub struct DagStart {
    /// The chain progress the DAG adds (its counted tasks).
    pub progress: ProgressUpdate,
    /// The task-queue DAG that runs it.
    pub dag: DagSpec,
}

/// What a write appends beside the session, in the same commit: dialogue
/// elements and the audit entries of the transition. A write that fails
/// appends neither.
#[derive(Debug, Clone, Copy, Default)]
pub struct FlowAppend<'a> {
    /// Dialogue elements, oldest first.
    pub dialogue: &'a [DialogueElement],
    /// Audit entries, in order.
    pub audit: &'a [AuditEntry],
}

/// Storage of flow sessions.
#[async_trait]
pub trait FlowStore: Send + Sync + 'static {
    /// Stores a new session (version 1) with its first dialogue elements
    /// and audit entries; `Conflict` when the id exists for this product.
    async fn create(
        &self,
        product_id: &ProductId,
        session: &FlowSession,
        append: FlowAppend<'_>,
        now: Timestamp,
    ) -> PortResult<i64>;

    /// The session; `NotFound` when it does not exist for this product.
    async fn load(&self, product_id: &ProductId, session_id: &str)
    -> PortResult<StoredFlowSession>;

    /// Saves the session if its version is still `expected_version`,
    /// appending `append` to the dialogue and the audit log and creating or
    /// updating chain progress, all in one commit. Returns the new version; `Conflict` when
    /// the version moved, `NotFound` when the session does not exist.
    async fn save(
        &self,
        product_id: &ProductId,
        session: &FlowSession,
        expected_version: i64,
        append: FlowAppend<'_>,
        progress: Option<&ProgressUpdate>,
        now: Timestamp,
    ) -> PortResult<i64>;

    /// As [`FlowStore::save`] with `start.progress`, and enqueues
    /// `start.dag` on the store's task queue in the same commit: the run
    /// exists if and only if the save succeeded, so no poll ever sees a
    /// session waiting for a DAG that was never enqueued. The stored
    /// session's `running.dag_id` is the new run's id. Returns the new
    /// version and the run; `Conflict` when the version moved (nothing is
    /// enqueued), `Unavailable` when the store has no task queue.
    async fn save_and_enqueue(
        &self,
        product_id: &ProductId,
        session: &FlowSession,
        expected_version: i64,
        append: FlowAppend<'_>,
        start: &DagStart,
        now: Timestamp,
    ) -> PortResult<(i64, DagId)>;

    /// The whole dialogue, oldest first.
    async fn dialogue(
        &self,
        product_id: &ProductId,
        session_id: &str,
    ) -> PortResult<Vec<DialogueElement>>;

    /// Records finished tasks of a chain (`done += done`, `total +=
    /// add_total`); `NotFound` when the chain does not exist.
    async fn task_done(
        &self,
        product_id: &ProductId,
        session_id: &str,
        chain_id: &str,
        done: i64,
        add_total: i64,
    ) -> PortResult<()>;

    /// A chain's progress, if it exists.
    async fn progress(
        &self,
        product_id: &ProductId,
        session_id: &str,
        chain_id: &str,
    ) -> PortResult<Option<ChainProgress>>;
}
