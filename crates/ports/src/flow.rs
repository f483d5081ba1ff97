//! Flow sessions: what the flow machine stores beside
//! [`MachineStore<FlowRecord>`](crate::MachineStore).
//!
//! A flow session with its dialogue is the machine's record
//! ([`FlowRecord`](parlance_core::flow::FlowRecord)): it is loaded and
//! committed through the storage protocol, whose commit writes the session
//! row (compare-and-swap on its version), the dialogue elements and the
//! chain progress the decision's effects name, its audit entry and its DAG,
//! together or not at all. [`FlowStore`] holds the rest: the cheap reads a
//! poll or a worker needs (the session without its dialogue, the dialogue,
//! a chain's progress, a user's sessions) and the progress workers count
//! outside the session's compare-and-swap.

use async_trait::async_trait;
use parlance_core::ProductId;
use parlance_core::flow::{Actor, DialogueElement, Email, FlowKey, FlowSession, FlowSessionId};
use serde::Serialize;

use crate::{PortResult, Stored};

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

/// The flow store's reads and the progress workers record; loads and
/// commits of sessions go through
/// [`MachineStore<FlowRecord>`](crate::MachineStore), usually implemented
/// by the same adapter.
///
/// Implemented by [`MemoryFlowStore`](https://docs.rs/parlance-memory/latest/parlance_memory/struct.MemoryFlowStore.html) and [`PgFlowStore`](https://docs.rs/parlance-postgres/latest/parlance_postgres/struct.PgFlowStore.html), whose
/// constructors' examples call it.
#[async_trait]
pub trait FlowStore: Send + Sync + 'static {
    /// The session without its dialogue, with its version; `None` when it
    /// does not exist for this product. A poll or a worker reads this; it
    /// is as current as [`MachineStore::load`](crate::MachineStore::load)
    /// (a commit that enqueued a DAG is visible before any of its tasks
    /// can be claimed).
    async fn session(&self, key: &FlowKey) -> PortResult<Option<Stored<FlowSession>>>;

    /// The whole dialogue, oldest first; `NotFound` when the session does
    /// not exist.
    async fn dialogue(&self, key: &FlowKey) -> PortResult<Vec<DialogueElement>>;

    /// The first `len` elements of the dialogue, oldest first (all of it
    /// when it is shorter): the dialogue as it was when it had `len`
    /// elements, since it is append-only. A worker rebuilds the render data
    /// a DAG was planned with from it. `NotFound` when the session does not
    /// exist.
    async fn dialogue_prefix(&self, key: &FlowKey, len: u64) -> PortResult<Vec<DialogueElement>>;

    /// The session with its version and the first `len` elements of its
    /// dialogue, read together (one read where the adapter can): what a
    /// worker needs to rebuild the render data a DAG was planned with.
    /// `None` when the session does not exist.
    async fn session_with_prefix(
        &self,
        key: &FlowKey,
        len: u64,
    ) -> PortResult<Option<(Stored<FlowSession>, Vec<DialogueElement>)>> {
        let Some(session) = self.session(key).await? else {
            return Ok(None);
        };
        let prefix = self.dialogue_prefix(key, len).await?;
        Ok(Some((session, prefix)))
    }

    /// The session with its version and the text of the latest assistant
    /// element of its dialogue (`None` when that element has no text or
    /// there is none), read together (one read where the adapter can): what
    /// a poll answers. `None` when the session does not exist.
    async fn session_with_reply(
        &self,
        key: &FlowKey,
    ) -> PortResult<Option<(Stored<FlowSession>, Option<String>)>> {
        let Some(session) = self.session(key).await? else {
            return Ok(None);
        };
        let dialogue = self.dialogue(key).await?;
        Ok(Some((session, last_reply(&dialogue))))
    }

    /// Records finished tasks of a chain (`done += done`, `total +=
    /// add_total`); `NotFound` when the chain does not exist. Workers call
    /// it as tasks finish, outside the session's compare-and-swap.
    async fn task_done(
        &self,
        key: &FlowKey,
        chain_id: &str,
        done: i64,
        add_total: i64,
    ) -> PortResult<()>;

    /// A chain's progress, if it exists.
    async fn progress(&self, key: &FlowKey, chain_id: &str) -> PortResult<Option<ChainProgress>>;

    /// The ids of `product`'s sessions of flow `flow` started for the user
    /// whose email is `email` (exactly as written), newest first (by
    /// creation time, then by id, descending), at most `limit`. The user is
    /// set when a session is created and never changes.
    async fn user_sessions(
        &self,
        product: &ProductId,
        flow: &str,
        email: &Email,
        limit: usize,
    ) -> PortResult<Vec<FlowSessionId>>;
}

/// The text of the latest assistant element of `dialogue`.
pub fn last_reply(dialogue: &[DialogueElement]) -> Option<String> {
    dialogue
        .iter()
        .rev()
        .find(|e| e.actor == Actor::Assistant)
        .and_then(|e| e.actor_text.clone())
}
