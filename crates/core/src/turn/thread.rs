//! A thread's checkpoint as a [`Machine`]: commit a turn, resume an
//! interrupted one, or patch the state as an operator.
//!
//! The record is the thread's [`Checkpoint`], loaded through a [`TurnKey`]:
//! the thread plus the [`LoadWindow`] the turn needs, so the state a turn
//! runs on holds only the last entries of its windowed lists.
//! [`TurnCommand::CommitTurn`] carries the [`CheckpointDelta`] of one turn
//! and the version the turn began on; deciding it checks that the thread is
//! still at that version and applies the delta. A turn a stage stopped to
//! wait for a person commits what it gained so far with the
//! [`PendingInterrupt`]; while it waits the thread takes no new turn, and
//! [`TurnCommand::ResumeTurn`] commits the rest of it once answered.
//! [`TurnCommand::UpdateState`] is an operator's patch. Every decision asks
//! the store to write its delta and nothing else ([`TurnEffect::Write`]),
//! with what wrote it, so a commit costs the same however long the thread
//! is, and each one is also an immutable entry of the thread's history.
//!
//! A thread has no modes: it has one state, `open`, and a commit is not a
//! transition. The thread's own history already records every commit, so an
//! audit entry per turn would duplicate it at the cost of one more row
//! written on the hottest path; a decision here reports no transitions and
//! no tasks.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use super::{
    Checkpoint, CheckpointDelta, CheckpointSource, LoadWindow, PendingInterrupt, ThreadKey,
    TurnError,
};
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

/// Why a turn or a resume is refused when the thread is not as it needs:
/// a new turn while an earlier one waits on an interrupt.
pub const INTERRUPT_PENDING: &str = "interrupt_pending";

/// Why a resume is refused: no turn of the thread waits on an interrupt
/// (none was made, or another resume answered it first).
pub const NO_INTERRUPT: &str = "no_interrupt";

/// Why a command is refused when its delta writes a key of the runtime's
/// own (`__` first), such as the pending interrupt.
pub const RESERVED_KEY: &str = "reserved_key";

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
///
/// A whole turn committed is shown at [`begin_turn`](super::begin_turn).
/// On the wire, tagged by `type`:
///
/// ```
/// use parlance_core::Command;
/// use parlance_core::turn::{CheckpointDelta, TurnCommand};
///
/// let mut delta = CheckpointDelta::default();
/// delta.appends.insert("history".to_owned(), vec![serde_json::json!("user: hello")]);
/// let commit = TurnCommand::commit(0, delta);
/// assert_eq!(commit.name(), "commit_turn");
///
/// let text = serde_json::to_string(&commit)?;
/// assert_eq!(
///     text,
///     r#"{"type":"commit_turn","base":0,"delta":{"appends":{"history":["user: hello"]},"objects":{}}}"#
/// );
/// assert_eq!(serde_json::from_str::<TurnCommand>(&text)?, commit);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum TurnCommand {
    /// Commits one turn: what its reducer fields gained
    /// ([`finish_turn`](super::finish_turn)), on the checkpoint it began on.
    /// With an interrupt, the turn stopped at a stage to wait for a person:
    /// what it gained so far is committed and the interrupt left pending.
    /// Refused while an earlier turn waits on an interrupt.
    CommitTurn {
        /// The checkpoint version the turn began on (0 for a new thread).
        base: u64,
        /// The turn's new list entries and replaced objects.
        delta: CheckpointDelta,
        /// The interrupt the turn stopped on, if it did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        interrupt: Option<PendingInterrupt>,
    },
    /// Commits the rest of an interrupted turn, resumed with an answer on
    /// the checkpoint that holds its interrupt: the interrupt is cleared (or
    /// replaced, when the turn stopped again). Refused when no turn waits.
    ResumeTurn {
        /// The checkpoint version the resume began on.
        base: u64,
        /// What the rest of the turn gained.
        delta: CheckpointDelta,
        /// The interrupt the resumed turn stopped on again, if it did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        interrupt: Option<PendingInterrupt>,
    },
    /// An operator's patch of the state, recorded as a checkpoint of its
    /// own: list entries appended, objects replaced.
    UpdateState {
        /// The version the patch was made for; any version when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        base: Option<u64>,
        /// The patch.
        delta: CheckpointDelta,
    },
}

impl TurnCommand {
    /// Commits the turn that began on version `base` and produced `delta`.
    pub fn commit(base: u64, delta: CheckpointDelta) -> Self {
        TurnCommand::CommitTurn {
            base,
            delta,
            interrupt: None,
        }
    }

    /// Commits the turn that began on version `base` up to the stage that
    /// stopped it with `interrupt`.
    pub fn interrupt(base: u64, delta: CheckpointDelta, interrupt: PendingInterrupt) -> Self {
        TurnCommand::CommitTurn {
            base,
            delta,
            interrupt: Some(interrupt),
        }
    }

    /// Commits the rest of the interrupted turn resumed on version `base`;
    /// `interrupt` when it stopped again.
    pub fn resume(base: u64, delta: CheckpointDelta, interrupt: Option<PendingInterrupt>) -> Self {
        TurnCommand::ResumeTurn {
            base,
            delta,
            interrupt,
        }
    }

    /// An operator's patch, on version `base` when given.
    pub fn update(base: Option<u64>, delta: CheckpointDelta) -> Self {
        TurnCommand::UpdateState { base, delta }
    }
}

impl Command for TurnCommand {
    fn name(&self) -> &'static str {
        match self {
            TurnCommand::CommitTurn { .. } => "commit_turn",
            TurnCommand::ResumeTurn { .. } => "resume_turn",
            TurnCommand::UpdateState { .. } => "update_state",
        }
    }
}

/// What a thread's decision asks of the store.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum TurnEffect {
    /// Written in the commit, and all the commit writes: the list entries
    /// appended after the stored ones, the objects replaced, the version
    /// bumped, and the new checkpoint's history entry (its patch, and what
    /// wrote it). The stored checkpoint is never rewritten whole (the
    /// decided state may hold only a window of its lists).
    Write {
        /// The new list entries and replaced objects (the pending interrupt
        /// among them, under [`INTERRUPT_KEY`](super::INTERRUPT_KEY)).
        delta: CheckpointDelta,
        /// What wrote the checkpoint.
        source: CheckpointSource,
    },
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

/// Refuses a command made for another version of the thread, or one the
/// version cannot count.
fn admit(thread: &Checkpoint, command: &TurnCommand, base: Option<u64>) -> Result<(), TurnError> {
    if base.is_some_and(|b| b != thread.version) {
        return Err(NotAllowed::new(command.name(), OPEN)
            .because(STALE_TURN)
            .into());
    }
    if thread.version == u64::MAX {
        return Err(TurnError::TurnLimit { limit: u64::MAX });
    }
    Ok(())
}

fn refuse(command: &TurnCommand, reason: &'static str) -> TurnError {
    NotAllowed::new(command.name(), OPEN).because(reason).into()
}

/// Refuses a delta that writes a key of the runtime's own (`__` first):
/// the pending interrupt is set and cleared only by the commands that mean
/// it.
fn check_keys(command: &TurnCommand, delta: &CheckpointDelta) -> Result<(), TurnError> {
    let reserved = |k: &String| k.starts_with("__");
    if delta.objects.keys().any(reserved) || delta.appends.keys().any(reserved) {
        return Err(refuse(command, RESERVED_KEY));
    }
    Ok(())
}

/// The delta a command writes and what wrote it, once the thread admits
/// it.
fn written(thread: &Checkpoint, command: &TurnCommand) -> Result<TurnEffect, TurnError> {
    let (TurnCommand::CommitTurn { delta, .. }
    | TurnCommand::ResumeTurn { delta, .. }
    | TurnCommand::UpdateState { delta, .. }) = command;
    check_keys(command, delta)?;
    let (delta, source) = match command {
        TurnCommand::CommitTurn {
            base,
            delta,
            interrupt,
        } => {
            admit(thread, command, Some(*base))?;
            if thread.is_interrupted() {
                return Err(refuse(command, INTERRUPT_PENDING));
            }
            let delta = match interrupt {
                Some(i) => delta.clone().with_interrupt(Some(i)),
                None => delta.clone(),
            };
            (delta, CheckpointSource::Turn)
        }
        TurnCommand::ResumeTurn {
            base,
            delta,
            interrupt,
        } => {
            admit(thread, command, Some(*base))?;
            if !thread.is_interrupted() {
                return Err(refuse(command, NO_INTERRUPT));
            }
            (
                delta.clone().with_interrupt(interrupt.as_ref()),
                CheckpointSource::Resume,
            )
        }
        TurnCommand::UpdateState { base, delta } => {
            admit(thread, command, *base)?;
            (delta.clone(), CheckpointSource::Update)
        }
    };
    Ok(TurnEffect::Write { delta, source })
}

/// The decision of a commit: the delta to write, nothing else.
fn committed(effect: TurnEffect) -> Decision<Checkpoint> {
    let mut decision = Decision::changed();
    decision.effect(effect);
    decision
}

impl Machine for Checkpoint {
    type Key = TurnKey;
    type Command = TurnCommand;
    type Context = ();
    type Effect = TurnEffect;
    type Error = TurnError;

    const KIND: EntityKind = EntityKind::Turn;

    /// Applies the command's delta if the thread admits it: lists extended,
    /// objects replaced, version bumped. A turn is refused while another
    /// waits on an interrupt ([`INTERRUPT_PENDING`]), a resume when none
    /// waits ([`NO_INTERRUPT`]), either on another version than the one it
    /// began on ([`STALE_TURN`]). Every command that is taken changes the
    /// thread (its version counts the checkpoints), even one whose delta is
    /// empty.
    fn decide(
        &mut self,
        _ctx: &(),
        command: &TurnCommand,
        _now: Timestamp,
    ) -> Result<Decision<Self>, TurnError> {
        let effect = written(self, command)?;
        let TurnEffect::Write { delta, .. } = &effect;
        self.apply(delta);
        Ok(committed(effect))
    }

    /// A thread is created by its first turn, which began on version 0; a
    /// turn that began on a later version, a resume or an update of a
    /// thread that does not exist creates nothing.
    fn create(
        _key: &TurnKey,
        _ctx: &(),
        command: &TurnCommand,
        _now: Timestamp,
    ) -> Result<Option<(Self, Decision<Self>)>, TurnError> {
        if !matches!(command, TurnCommand::CommitTurn { base: 0, .. }) {
            return Ok(None);
        }
        let mut thread = Checkpoint::default();
        let effect = written(&thread, command)?;
        let TurnEffect::Write { delta, .. } = &effect;
        thread.apply(delta);
        Ok(Some((thread, committed(effect))))
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
