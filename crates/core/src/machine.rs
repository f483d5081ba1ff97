//! The protocol every machine implements.
//!
//! A machine is a plain value with one entry point, [`Machine::decide`]: it
//! takes a command (plain data, serialisable, so the audit log can record
//! what was asked), the current time and whatever the machine needs that is
//! not its own state (its [`Machine::Context`]: a tour catalog, a flow
//! definition, an onboarding plan), and either refuses with the machine's
//! one error type, leaving the state as it was, or moves the state and
//! returns a [`Decision`]: the transitions made (one audit entry each), the
//! tasks that must exist if and only if the new state is stored, the
//! effects the shell carries out after the commit, and the next deadline.
//!
//! [`Machine::create`] is the same decision on a record that does not exist
//! yet. The shell (`parlance-app`) loads the state, decides, and commits the
//! state with its transitions and tasks in one transaction; a lost
//! compare-and-swap is decided again on the state that won.

use std::borrow::Cow;
use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::queue::{DagSpec, TaskSpec};
use crate::{ProductId, Timestamp};

/// Which machine a stored record belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub enum EntityKind {
    /// A live session's assistance mode.
    Session,
    /// A user's adoption record.
    Adoption,
    /// A conversation instance.
    Conversation,
    /// A flow session.
    Flow,
    /// An agent turn thread.
    Turn,
}

impl EntityKind {
    /// Every kind, in declaration order.
    pub const ALL: [EntityKind; 5] = [
        EntityKind::Session,
        EntityKind::Adoption,
        EntityKind::Conversation,
        EntityKind::Flow,
        EntityKind::Turn,
    ];

    /// The wire name, as the audit log stores it.
    pub const fn as_str(self) -> &'static str {
        match self {
            EntityKind::Session => "session",
            EntityKind::Adoption => "adoption",
            EntityKind::Conversation => "conversation",
            EntityKind::Flow => "flow",
            EntityKind::Turn => "turn",
        }
    }

    /// The kind with this wire name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl fmt::Display for EntityKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where one record of a machine lives: its product first, then its id.
pub trait EntityKey: Clone + fmt::Debug + PartialEq + Send + Sync + 'static {
    /// The tenant.
    fn product_id(&self) -> &ProductId;
    /// The record's id within its machine and product, as text (the audit
    /// log's `entity_id`).
    fn entity_id(&self) -> Cow<'_, str>;
}

/// A state name or a cause: static for the machines with fixed states,
/// owned for flows, whose states and events come from a flow file.
pub type Name = Cow<'static, str>;

/// One line of the audit log: a state change with its cause (or, with
/// `from == to`, an event worth recording that changed no state).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Transition {
    /// The state before; `None` when the record was created.
    pub from: Option<Name>,
    /// The state after.
    pub to: Name,
    /// The command or event that caused it.
    pub cause: Name,
    /// Structured detail (a JSON object; `{}` when there is none). Never
    /// free text a user wrote.
    pub detail: Value,
}

impl Transition {
    /// A change from `from` to `to` caused by `cause`, with no detail.
    pub fn new(from: impl Into<Name>, to: impl Into<Name>, cause: impl Into<Name>) -> Self {
        Self {
            from: Some(from.into()),
            to: to.into(),
            cause: cause.into(),
            detail: Value::Object(serde_json::Map::new()),
        }
    }

    /// The creation of a record in state `to`.
    pub fn created(to: impl Into<Name>, cause: impl Into<Name>) -> Self {
        Self {
            from: None,
            ..Self::new("", to, cause)
        }
    }

    /// With `detail` (a JSON object).
    #[must_use]
    pub fn with_detail(mut self, detail: Value) -> Self {
        self.detail = detail;
        self
    }
}

/// Work a decision puts on the task queue, committed with the state.
#[derive(Debug, Clone, PartialEq)]
pub enum Task {
    /// One task.
    One(TaskSpec),
    /// A DAG of tasks.
    Dag(DagSpec),
}

/// What a command did: the transitions for the audit log, the tasks to
/// commit with the state, the effects for the shell, and the next deadline.
///
/// `changed` says whether the state must be written at all: a command that
/// was deliberately ignored leaves nothing to store.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision<M: Machine> {
    /// State changes, oldest first, one audit entry each.
    pub transitions: Vec<Transition>,
    /// Queue work that must exist if and only if the commit does.
    pub tasks: Vec<Task>,
    /// What the machine asks of the shell, in order: some are written with
    /// the state by the store (a transcript line), the rest are carried out
    /// after the commit (notify an operator).
    pub effects: Vec<M::Effect>,
    /// When the machine next needs a command without traffic (a timeout, a
    /// heartbeat), as of the new state.
    pub next_deadline: Option<Timestamp>,
    /// Whether the state changed and must be committed.
    pub changed: bool,
}

impl<M: Machine> Default for Decision<M> {
    fn default() -> Self {
        Self {
            transitions: Vec::new(),
            tasks: Vec::new(),
            effects: Vec::new(),
            next_deadline: None,
            changed: false,
        }
    }
}

impl<M: Machine> Decision<M> {
    /// A decision that changed the state and asks for nothing more yet.
    pub fn changed() -> Self {
        Self {
            changed: true,
            ..Self::default()
        }
    }

    /// A decision that changed nothing: there is nothing to store.
    pub fn unchanged() -> Self {
        Self::default()
    }

    /// Records a transition (and marks the state changed).
    pub fn transition(&mut self, t: Transition) -> &mut Self {
        self.changed = true;
        self.transitions.push(t);
        self
    }

    /// Asks for a task.
    pub fn task(&mut self, task: TaskSpec) -> &mut Self {
        self.tasks.push(Task::One(task));
        self
    }

    /// Asks for a DAG of tasks.
    pub fn dag(&mut self, dag: DagSpec) -> &mut Self {
        self.tasks.push(Task::Dag(dag));
        self
    }

    /// Requests an effect.
    pub fn effect(&mut self, effect: M::Effect) -> &mut Self {
        self.effects.push(effect);
        self
    }

    /// Appends `later` after this decision, as one: the state changed if
    /// either changed it; the later deadline stands.
    pub fn then(&mut self, later: Decision<M>) -> &mut Self {
        self.transitions.extend(later.transitions);
        self.tasks.extend(later.tasks);
        self.effects.extend(later.effects);
        self.next_deadline = later.next_deadline;
        self.changed |= later.changed;
        self
    }

    /// The single tasks, in order.
    pub fn single_tasks(&self) -> impl Iterator<Item = &TaskSpec> {
        self.tasks.iter().filter_map(|t| match t {
            Task::One(t) => Some(t),
            Task::Dag(_) => None,
        })
    }
}

/// A command the entity's current state does not allow. Every machine
/// reports this one way, and the service answers it the same way (409).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{command} is not allowed in state {state}{}", reason.map(|r| format!(" ({r})")).unwrap_or_default())]
pub struct NotAllowed {
    /// The refused command (its wire name).
    pub command: Name,
    /// The state it was refused in.
    pub state: Name,
    /// Why, when more than "no such transition" is known: a stable
    /// snake_case code (`dag_running`, `not_due`, ...).
    pub reason: Option<&'static str>,
}

impl NotAllowed {
    /// `command` is not allowed in `state`.
    pub fn new(command: impl Into<Name>, state: impl Into<Name>) -> Self {
        Self {
            command: command.into(),
            state: state.into(),
            reason: None,
        }
    }

    /// With a reason code.
    #[must_use]
    pub fn because(mut self, reason: &'static str) -> Self {
        self.reason = Some(reason);
        self
    }
}

/// What kind of refusal a machine error is: the service maps each class to
/// one answer, whatever the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorClass {
    /// The state does not allow the command (see [`NotAllowed`]).
    NotAllowed,
    /// The command carries an unusable value; no state would take it.
    Invalid,
    /// The command would take the record past a size or work limit.
    LimitExceeded,
    /// The stored state or the machine's own definition is broken: a bug or
    /// corrupt data, not the caller's doing.
    Internal,
}

/// The error type of a machine: classified, so every shell answers alike.
pub trait MachineError: std::error::Error + Send + Sync + 'static {
    /// The class of this refusal.
    fn class(&self) -> ErrorClass;

    /// The not-allowed refusal inside, for the answer's members.
    fn not_allowed(&self) -> Option<&NotAllowed> {
        None
    }

    /// The command field an `Invalid` refusal is about, when known.
    fn field(&self) -> Option<&str> {
        None
    }
}

/// A command: plain data, named for the audit log and for errors.
pub trait Command:
    Clone + fmt::Debug + Serialize + DeserializeOwned + Send + Sync + 'static
{
    /// The command's stable snake_case name.
    fn name(&self) -> &'static str;
}

/// A state machine: one record's state and the one way to change it.
pub trait Machine: Clone + fmt::Debug + Send + Sync + Sized + 'static {
    /// Where a record lives (product first).
    type Key: EntityKey;
    /// What may be asked of the machine.
    type Command: Command;
    /// What the machine needs besides its state, read-only (`()` for none).
    type Context: Send + Sync + ?Sized;
    /// What the machine asks of the shell beyond transitions and tasks.
    type Effect: Clone + fmt::Debug + PartialEq + Send + Sync + 'static;
    /// The machine's one error type.
    type Error: MachineError;

    /// Which machine this is.
    const KIND: EntityKind;

    /// Decides `command` at `now`. On `Ok` the state is the next state and
    /// the decision lists what happened; on `Err` the state is exactly as it
    /// was.
    ///
    /// # Errors
    ///
    /// The machine's refusal; nothing changed.
    fn decide(
        &mut self,
        ctx: &Self::Context,
        command: &Self::Command,
        now: Timestamp,
    ) -> Result<Decision<Self>, Self::Error>;

    /// Decides a command on a record that does not exist yet: the new
    /// record and what creating it did, or `Ok(None)` when this command
    /// cannot create one (the shell answers "not found").
    ///
    /// # Errors
    ///
    /// The machine's refusal; nothing is created.
    fn create(
        key: &Self::Key,
        ctx: &Self::Context,
        command: &Self::Command,
        now: Timestamp,
    ) -> Result<Option<(Self, Decision<Self>)>, Self::Error>;

    /// When the machine next needs a command without traffic, derived from
    /// the state.
    fn next_deadline(&self, ctx: &Self::Context) -> Option<Timestamp>;

    /// The current state's name (for errors and audit entries).
    fn state_name(&self) -> Name;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entity_kinds_round_trip_their_wire_names() {
        for k in EntityKind::ALL {
            assert_eq!(EntityKind::parse(k.as_str()), Some(k));
            assert_eq!(
                serde_json::to_value(k).unwrap(),
                serde_json::json!(k.as_str())
            );
        }
        assert_eq!(EntityKind::parse("sessions"), None);
    }

    #[test]
    fn not_allowed_names_command_state_and_reason() {
        let e = NotAllowed::new("pause", "COMPLETED");
        assert_eq!(e.to_string(), "pause is not allowed in state COMPLETED");
        let e = NotAllowed::new("retry", "ask".to_owned()).because("retry_not_offered");
        assert_eq!(
            e.to_string(),
            "retry is not allowed in state ask (retry_not_offered)"
        );
    }

    #[test]
    fn a_creation_has_no_from_state() {
        let t = Transition::created("CREATED", "create");
        assert_eq!(t.from, None);
        assert_eq!(t.detail, serde_json::json!({}));
    }
}
