//! A thread's checkpoint as a [`Machine`]: one command, commit a turn.
//!
//! The record is the thread's [`Checkpoint`], loaded through a [`TurnKey`]:
//! the thread plus the [`LoadWindow`] the turn needs, so the state a turn
//! runs on holds only the last entries of its windowed lists. The one
//! command, [`TurnCommand::CommitTurn`], carries the [`CheckpointDelta`] of
//! one turn and the version the turn began on; deciding it checks that the
//! thread is still at that version and applies the delta. The decision asks
//! the store to write that delta and nothing else
//! ([`TurnEffect::Write`]), so a commit costs the same however long the
//! thread is.
//!
//! A thread has no modes: it has one state, `open`, and a committed turn is
//! not a transition. The thread's own rows already record every turn (each
//! list entry carries the version that wrote it), so an audit entry per turn
//! would duplicate them at the cost of one more row written on the hottest
//! path; a decision here reports no transitions and no tasks.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use super::{Checkpoint, CheckpointDelta, LoadWindow, ThreadKey, TurnError};
use crate::machine::{
    Command, Decision, EntityKey, EntityKind, ErrorClass, Machine, MachineError, Name, NotAllowed,
};
use crate::table::TransitionTable;
use crate::{ProductId, Timestamp};

/// The one state of a thread.
pub const OPEN: &str = "open";

/// Why a commit is refused when the turn began on another version of the
/// thread: its delta was computed on a state that is gone, and the turn must
/// run again on the thread as it is.
pub const STALE_TURN: &str = "stale_turn";

/// A thread's states; a committed turn is not a transition, so there are no
/// edges.
pub const TABLE: TransitionTable = TransitionTable {
    machine: "turn thread",
    states: &[OPEN],
    terminal: &[],
    edges: &[],
};

/// Where a thread's checkpoint lives, and how much of its lists a load
/// returns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnKey {
    /// The thread: product, owner, thread id.
    pub thread: ThreadKey,
    /// The lists to load only in part (their last entries).
    pub window: LoadWindow,
}

impl TurnKey {
    /// The checkpoint of `thread`, its lists cut as `window` says.
    pub fn new(thread: ThreadKey, window: LoadWindow) -> Self {
        Self { thread, window }
    }

    /// The whole checkpoint of `thread`, every list in full.
    pub fn whole(thread: ThreadKey) -> Self {
        Self::new(thread, LoadWindow::all())
    }
}

impl EntityKey for TurnKey {
    fn product_id(&self) -> &ProductId {
        &self.thread.product_id
    }

    /// `owner/thread`: thread ids are unique per owner, and neither id may
    /// contain `/`.
    fn entity_id(&self) -> Cow<'_, str> {
        Cow::Owned(format!("{}/{}", self.thread.owner, self.thread.thread))
    }
}

/// What may be asked of a thread.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TurnCommand {
    /// Commits one turn: what its reducer fields gained
    /// ([`finish_turn`](super::finish_turn)), on the checkpoint it began on.
    CommitTurn {
        /// The checkpoint version the turn began on (0 for a new thread).
        base: u64,
        /// The turn's new list entries and replaced objects.
        delta: CheckpointDelta,
    },
}

impl TurnCommand {
    /// Commits the turn that began on version `base` and produced `delta`.
    pub fn commit(base: u64, delta: CheckpointDelta) -> Self {
        TurnCommand::CommitTurn { base, delta }
    }
}

impl Command for TurnCommand {
    fn name(&self) -> &'static str {
        match self {
            TurnCommand::CommitTurn { .. } => "commit_turn",
        }
    }
}

/// What a thread's decision asks of the store.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnEffect {
    /// Written in the commit, and all the commit writes: the list entries
    /// appended after the stored ones, the objects replaced, the version
    /// bumped. The stored checkpoint is never rewritten whole (the decided
    /// state may hold only a window of its lists).
    Write(CheckpointDelta),
}

impl MachineError for TurnError {
    fn class(&self) -> ErrorClass {
        match self {
            TurnError::NotAllowed(_) => ErrorClass::NotAllowed,
            TurnError::TurnLimit { .. } => ErrorClass::LimitExceeded,
            // A graph whose stages collide, a stored value that no longer
            // decodes, a value that does not encode: never the caller's doing.
            TurnError::ConflictingWrites { .. }
            | TurnError::Decode { .. }
            | TurnError::Encode { .. } => ErrorClass::Internal,
        }
    }

    fn not_allowed(&self) -> Option<&NotAllowed> {
        match self {
            TurnError::NotAllowed(n) => Some(n),
            _ => None,
        }
    }
}

/// Refuses a commit of a turn that did not begin on this version, or one
/// the version cannot count.
fn admit(thread: &Checkpoint, command: &TurnCommand, base: u64) -> Result<(), TurnError> {
    if base != thread.version {
        return Err(NotAllowed::new(command.name(), OPEN)
            .because(STALE_TURN)
            .into());
    }
    if thread.version == u64::MAX {
        return Err(TurnError::TurnLimit { limit: u64::MAX });
    }
    Ok(())
}

/// The decision of a commit: the delta to write, nothing else.
fn committed(delta: &CheckpointDelta) -> Decision<Checkpoint> {
    let mut decision = Decision::changed();
    decision.effect(TurnEffect::Write(delta.clone()));
    decision
}

impl Machine for Checkpoint {
    type Key = TurnKey;
    type Command = TurnCommand;
    type Context = ();
    type Effect = TurnEffect;
    type Error = TurnError;

    const KIND: EntityKind = EntityKind::Turn;

    /// Applies the turn's delta if the thread is still at the turn's base:
    /// lists extended, objects replaced, version bumped. Every commit
    /// changes the thread (its version counts the turns), even one whose
    /// delta is empty.
    fn decide(
        &mut self,
        _ctx: &(),
        command: &TurnCommand,
        _now: Timestamp,
    ) -> Result<Decision<Self>, TurnError> {
        let TurnCommand::CommitTurn { base, delta } = command;
        admit(self, command, *base)?;
        self.apply(delta);
        Ok(committed(delta))
    }

    /// A thread is created by its first turn, which began on version 0; a
    /// turn that began on a later version of a thread that does not exist
    /// creates nothing.
    fn create(
        _key: &TurnKey,
        _ctx: &(),
        command: &TurnCommand,
        _now: Timestamp,
    ) -> Result<Option<(Self, Decision<Self>)>, TurnError> {
        let TurnCommand::CommitTurn { base, delta } = command;
        if *base != 0 {
            return Ok(None);
        }
        let mut thread = Checkpoint::default();
        thread.apply(delta);
        Ok(Some((thread, committed(delta))))
    }

    /// Threads have no timers.
    fn next_deadline(&self, _ctx: &()) -> Option<Timestamp> {
        None
    }

    fn state_name(&self) -> Name {
        Cow::Borrowed(OPEN)
    }
}

#[cfg(test)]
mod tests;
