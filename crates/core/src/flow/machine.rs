//! A flow session as a [`Machine`]: the session with its dialogue, changed
//! only by [`FlowCommand`]s through [`Machine::decide`].
//!
//! Every decision names one transition (the audit entry the service writes:
//! from the state before, if any, to the state after, caused by
//! `start_session`, the event, `cancel`, `retry`, `dag_completed` or
//! `dag_failed`, with the flow's name as detail),
//! the DAG to enqueue as a [`Task::Dag`](crate::Task::Dag) compiled with the
//! context's [`RunnerOptions`], and [`FlowEffect`]s: the dialogue elements
//! and the chain progress the store writes in the same commit, the text to
//! answer with, and the run to stop after a `cancel`. Fresh invocation ids
//! travel inside the commands, so deciding draws nothing.

use std::borrow::Cow;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::dag::DagPlan;
use super::dialogue::{Actor, DialogueElement};
use super::engine::{Fired, Flow, FlowError, FlowSession, Running, TaskError, reason};
use super::queue::{DagJob, RunnerOptions};
use super::user::User;
use crate::machine::{Command, Decision, EntityKey, EntityKind, Machine, Name, Transition};
use crate::{ProductId, Timestamp};

/// Characters allowed in a flow session id: ASCII letters, digits, `-`,
/// `_`, `.`.
fn session_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

crate::id::string_id!(
    /// A flow session's id: the service makes one from a fresh UUID; a
    /// client hands it back. Non-empty, at most 128 bytes of ASCII letters,
    /// digits, `-`, `_` and `.`.
    FlowSessionId,
    "flow session id",
    max = 128,
    chars = session_char,
    pattern = "^[A-Za-z0-9._-]+$"
);

impl FlowSessionId {
    /// The id of a new session, from a UUID drawn by the `IdGen` port.
    pub fn from_uuid(id: uuid::Uuid) -> Self {
        Self(id.to_string())
    }
}

/// Where a flow session lives: its product, then its id.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FlowKey {
    /// The tenant.
    pub product_id: ProductId,
    /// The session.
    pub session_id: FlowSessionId,
}

impl FlowKey {
    /// The key of session `session_id` of `product_id`.
    pub fn new(product_id: ProductId, session_id: FlowSessionId) -> Self {
        Self {
            product_id,
            session_id,
        }
    }
}

impl EntityKey for FlowKey {
    fn product_id(&self) -> &ProductId {
        &self.product_id
    }

    fn entity_id(&self) -> Cow<'_, str> {
        Cow::Borrowed(self.session_id.as_str())
    }
}

/// The audit causes of the transitions a flow decision reports besides a
/// flow event's own name.
pub mod cause {
    /// A session was created in the initial state.
    pub const START: &str = "start_session";
    /// The running DAG was stopped; back to the last user state.
    pub const CANCEL: &str = "cancel";
    /// The invoker state's DAG was planned again.
    pub const RETRY: &str = "retry";
    /// A DAG finished and its result was applied.
    pub const DAG_COMPLETED: &str = "dag_completed";
    /// A DAG failed and its error was recorded.
    pub const DAG_FAILED: &str = "dag_failed";
}

/// Chain progress written in the same commit as a transition: a DAG joining
/// the chain adds its counted tasks, the completion task adds one done.
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

/// What a flow decision asks of the shell besides its transition and tasks.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum FlowEffect {
    /// Append this element to the dialogue, in the commit (one row each, so
    /// a turn writes O(1) however long the dialogue is).
    Dialogue(DialogueElement),
    /// Create or extend chain progress, in the commit.
    Progress(ProgressUpdate),
    /// Answer the client with this text: the target template rendered by
    /// the transition, or after a `cancel` the latest assistant text.
    Respond(String),
    /// After the commit, stop the task-queue run behind this handle (its
    /// late results are refused as stale anyway).
    CancelRun(Running),
}

/// What may be asked of a flow session.
///
/// Tagged by `type` on the wire; fresh ids travel inside the commands, so
/// deciding draws nothing. A whole session is shown at [`Flow`].
///
/// ```
/// use parlance_core::Command;
/// use parlance_core::flow::FlowCommand;
///
/// let fire: FlowCommand = serde_json::from_str(
///     r#"{"type": "fire", "event": "user_input", "input": "Ada", "fresh_id": "dag-1"}"#,
/// )?;
/// assert_eq!(fire.name(), "fire");
/// assert_eq!(
///     serde_json::to_value(FlowCommand::start())?,
///     serde_json::json!({"type": "start"})
/// );
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum FlowCommand {
    /// Creates the session in the initial state with its greeting: the
    /// initial state's enter hooks and the greeting see `seed_data` (then
    /// it is cleared); the session keeps `user_info`.
    Start {
        /// Text for the start only (`seed_data`, and `parsed_seed_data`
        /// when it is JSON, in the render data).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seed_data: Option<String>,
        /// The user the session is for.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user_info: Option<User>,
    },
    /// Creates the session and fires `event` on it, in one decision: no
    /// greeting is rendered or recorded; the initial state's enter hooks
    /// run, then the event is taken. A refused event creates nothing.
    StartEphemeral {
        /// The user the session is for.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user_info: Option<User>,
        /// The flow event.
        event: String,
        /// The event's input.
        input: String,
        /// A fresh id for the DAG the transition may start.
        fresh_id: String,
    },
    /// A client's flow event with its input.
    Fire {
        /// The event.
        event: String,
        /// The event's input.
        input: String,
        /// A fresh id for the DAG the transition may start.
        fresh_id: String,
    },
    /// Stops the running DAG; back to the last user state.
    Cancel,
    /// Plans the idle invoker state's DAG again.
    Retry {
        /// A fresh id for the DAG.
        fresh_id: String,
    },
    /// A DAG finished with `result`: the engine fires the invoker state's
    /// completion event with it.
    Complete {
        /// The finished DAG (`running.invocation_id`).
        invocation_id: String,
        /// Its final result.
        result: String,
        /// A fresh id for the next DAG (an invoker -> invoker hop).
        fresh_id: String,
    },
    /// A DAG failed: the error is recorded and `on_error` followed if
    /// declared.
    Fail {
        /// The failure, naming its DAG.
        error: TaskError,
        /// A fresh id for the DAG `on_error` may start.
        fresh_id: String,
    },
}

impl FlowCommand {
    /// [`FlowCommand::Start`] with no seed data and no user.
    pub fn start() -> Self {
        FlowCommand::Start {
            seed_data: None,
            user_info: None,
        }
    }
}

impl Command for FlowCommand {
    fn name(&self) -> &'static str {
        match self {
            FlowCommand::Start { .. } => "start",
            FlowCommand::StartEphemeral { .. } => "start_ephemeral",
            FlowCommand::Fire { .. } => "fire",
            FlowCommand::Cancel => "cancel",
            FlowCommand::Retry { .. } => "retry",
            FlowCommand::Complete { .. } => "complete",
            FlowCommand::Fail { .. } => "fail",
        }
    }
}

/// An `event` a client sends, parsed once at the boundary: the three the
/// API handles itself, or a flow event.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ClientEvent {
    /// Reads progress or the latest response; changes nothing.
    Poll,
    /// Stops the running DAG.
    Cancel,
    /// Runs the idle invoker state's DAG again.
    Retry,
    /// One of the flow's own events.
    Flow(String),
}

impl ClientEvent {
    /// The event named `event`: `poll`, `cancel` and `retry` are the API's
    /// (a flow may not declare them), anything else is the flow's.
    pub fn parse(event: &str) -> Self {
        match event {
            "poll" => ClientEvent::Poll,
            "cancel" => ClientEvent::Cancel,
            "retry" => ClientEvent::Retry,
            other => ClientEvent::Flow(other.to_owned()),
        }
    }

    /// The event's wire name.
    pub fn as_str(&self) -> &str {
        match self {
            ClientEvent::Poll => "poll",
            ClientEvent::Cancel => "cancel",
            ClientEvent::Retry => "retry",
            ClientEvent::Flow(e) => e,
        }
    }

    /// The command this event asks for, with its `input` and a `fresh_id`
    /// for a DAG it may start; `None` for `poll`, which is a read.
    pub fn into_command(self, input: &str, fresh_id: String) -> Option<FlowCommand> {
        match self {
            ClientEvent::Poll => None,
            ClientEvent::Cancel => Some(FlowCommand::Cancel),
            ClientEvent::Retry => Some(FlowCommand::Retry { fresh_id }),
            ClientEvent::Flow(event) => Some(FlowCommand::Fire {
                event,
                input: input.to_owned(),
                fresh_id,
            }),
        }
    }
}

/// What a flow decision needs besides the session: the flow and how its
/// DAG nodes are retried and timed out.
#[derive(Debug, Clone)]
pub struct FlowContext {
    /// The session's flow.
    pub flow: Arc<Flow>,
    /// Attempts and timeout of each node of the DAGs it enqueues.
    pub runner: RunnerOptions,
}

impl FlowContext {
    /// The context of sessions of `flow`, their DAGs run with `runner`.
    pub fn new(flow: Arc<Flow>, runner: RunnerOptions) -> Self {
        Self { flow, runner }
    }
}

/// A flow session with its dialogue: the flow machine's state.
///
/// The dialogue is stored apart, one row per element; a decision reports
/// the elements it appends as [`FlowEffect::Dialogue`] so the store writes
/// only those, and renders `chat_history` from the whole.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowRecord {
    product_id: ProductId,
    session: FlowSession,
    dialogue: Vec<DialogueElement>,
}

impl FlowRecord {
    /// A record as loaded: the session of `product_id` and its dialogue,
    /// oldest first.
    pub fn from_parts(
        product_id: ProductId,
        session: FlowSession,
        dialogue: Vec<DialogueElement>,
    ) -> Self {
        Self {
            product_id,
            session,
            dialogue,
        }
    }

    /// The record's parts.
    pub fn into_parts(self) -> (ProductId, FlowSession, Vec<DialogueElement>) {
        (self.product_id, self.session, self.dialogue)
    }

    /// Where it lives.
    pub fn key(&self) -> FlowKey {
        FlowKey::new(self.product_id.clone(), self.session.session_id.clone())
    }

    /// The tenant.
    pub fn product_id(&self) -> &ProductId {
        &self.product_id
    }

    /// The session.
    pub fn session(&self) -> &FlowSession {
        &self.session
    }

    /// The dialogue, oldest first.
    pub fn dialogue(&self) -> &[DialogueElement] {
        &self.dialogue
    }

    /// The latest assistant text (what an idle poll answers).
    pub fn last_response(&self) -> Option<&str> {
        last_assistant(&self.dialogue)
    }

    /// Records the task queue's id of the run the session waits for: the
    /// store assigns it when it enqueues the decision's DAG. Nothing
    /// changes when no DAG runs.
    pub fn set_dag_id(&mut self, dag_id: i64) {
        if let Some(r) = &mut self.session.running {
            r.dag_id = Some(dag_id);
        }
    }

    /// The decision of a command the engine turned into `fired`, with
    /// `cause` as its audit cause; moves the record to `fired`'s session.
    ///
    /// A DAG is planned on the dialogue with `fired`'s elements appended,
    /// at `now`: its nodes name that context rather than copy it.
    fn apply(
        &mut self,
        ctx: &FlowContext,
        fired: Fired,
        cause: Name,
        now: Timestamp,
        progress: impl FnOnce(Option<&DagPlan>) -> Option<ProgressUpdate>,
    ) -> Decision<Self> {
        let mut decision = Decision::changed();
        decision.transition(
            Transition::new(
                self.session.state.clone(),
                fired.session.state.clone(),
                cause,
            )
            .with_detail(json!({"flow": ctx.flow.name()})),
        );
        if let Some(plan) = &fired.dag {
            decision.dag(
                DagJob {
                    product_id: &self.product_id,
                    session_id: &fired.session.session_id,
                    flow: ctx.flow.name(),
                    plan,
                    dialogue_len: self.dialogue.len() + fired.appended.len(),
                    planned_at: now,
                }
                .to_spec(&ctx.runner),
            );
        }
        decision
            .effects
            .extend(fired.appended.iter().cloned().map(FlowEffect::Dialogue));
        if let Some(p) = progress(fired.dag.as_ref()) {
            decision.effect(FlowEffect::Progress(p));
        }
        if let Some(text) = fired.response {
            decision.effect(FlowEffect::Respond(text));
        }
        self.session = fired.session;
        self.dialogue.extend(fired.appended);
        decision
    }
}

/// The progress a new DAG adds to its chain.
fn joins(plan: &DagPlan, done: bool) -> ProgressUpdate {
    ProgressUpdate {
        chain_id: plan.chain_id.clone(),
        add_total: i64::try_from(plan.counted_tasks()).unwrap_or(i64::MAX),
        add_done: i64::from(done),
        label: Some(plan.label.clone()),
    }
}

fn last_assistant(dialogue: &[DialogueElement]) -> Option<&str> {
    dialogue
        .iter()
        .rev()
        .find(|e| e.actor == Actor::Assistant)
        .and_then(|e| e.actor_text.as_deref())
}

impl Machine for FlowRecord {
    type Key = FlowKey;
    type Command = FlowCommand;
    type Context = FlowContext;
    type Effect = FlowEffect;
    type Error = FlowError;

    const KIND: EntityKind = EntityKind::Flow;

    fn decide(
        &mut self,
        ctx: &FlowContext,
        command: &FlowCommand,
        now: Timestamp,
    ) -> Result<Decision<Self>, FlowError> {
        let flow = &*ctx.flow;
        if self.session.flow != flow.name() {
            return Err(FlowError::OtherFlow {
                session: self.session.flow.clone(),
                flow: flow.name().to_owned(),
            });
        }
        let (session, dialogue) = (&self.session, self.dialogue.as_slice());
        match command {
            FlowCommand::Start { .. } | FlowCommand::StartEphemeral { .. } => {
                Err(FlowError::not_allowed(
                    command.name(),
                    session.state.clone(),
                    Some(reason::SESSION_EXISTS),
                ))
            }
            FlowCommand::Fire {
                event,
                input,
                fresh_id,
            } => {
                let fired = flow.fire(session, dialogue, event, input, fresh_id, now)?;
                Ok(
                    self.apply(ctx, fired, Cow::Owned(event.clone()), now, |plan| {
                        plan.map(|p| joins(p, false))
                    }),
                )
            }
            FlowCommand::Cancel => {
                let idle = flow.cancel(session)?;
                let stopped = session.running.clone();
                let answer = last_assistant(dialogue).map(str::to_owned);
                let mut decision = self.apply(
                    ctx,
                    Fired::stays(idle),
                    Cow::Borrowed(cause::CANCEL),
                    now,
                    |_| None,
                );
                decision.effects.extend(answer.map(FlowEffect::Respond));
                decision.effects.extend(stopped.map(FlowEffect::CancelRun));
                Ok(decision)
            }
            FlowCommand::Retry { fresh_id } => {
                let fired = flow.retry(session, dialogue, fresh_id, now)?;
                Ok(
                    self.apply(ctx, fired, Cow::Borrowed(cause::RETRY), now, |plan| {
                        plan.map(|p| joins(p, false))
                    }),
                )
            }
            FlowCommand::Complete {
                invocation_id,
                result,
                fresh_id,
            } => {
                let fired =
                    flow.complete(session, dialogue, invocation_id, result, fresh_id, now)?;
                // `complete` refuses unless this DAG runs.
                let chain = session
                    .running
                    .as_ref()
                    .map(|r| r.chain_id.clone())
                    .unwrap_or_default();
                // The completion task counts as done, in the chain it ends.
                Ok(self.apply(
                    ctx,
                    fired,
                    Cow::Borrowed(cause::DAG_COMPLETED),
                    now,
                    |plan| match plan {
                        Some(p) => Some(joins(p, p.chain_id == chain)),
                        None => Some(ProgressUpdate {
                            chain_id: chain,
                            add_total: 0,
                            add_done: 1,
                            label: None,
                        }),
                    },
                ))
            }
            FlowCommand::Fail { error, fresh_id } => {
                let fired = flow.fail(session, dialogue, error.clone(), fresh_id, now)?;
                Ok(
                    self.apply(ctx, fired, Cow::Borrowed(cause::DAG_FAILED), now, |plan| {
                        plan.map(|p| joins(p, false))
                    }),
                )
            }
        }
    }

    fn create(
        key: &FlowKey,
        ctx: &FlowContext,
        command: &FlowCommand,
        now: Timestamp,
    ) -> Result<Option<(Self, Decision<Self>)>, FlowError> {
        let created = |state: &str, ephemeral: bool| {
            let detail = if ephemeral {
                json!({"flow": ctx.flow.name(), "ephemeral": true})
            } else {
                json!({"flow": ctx.flow.name()})
            };
            Transition::created(state.to_owned(), cause::START).with_detail(detail)
        };
        let (seed_data, user_info) = match command {
            FlowCommand::Start {
                seed_data,
                user_info,
            } => (seed_data, user_info),
            FlowCommand::StartEphemeral {
                user_info,
                event,
                input,
                fresh_id,
            } => {
                let started =
                    ctx.flow
                        .start_with(&key.session_id, None, user_info.as_ref(), false, now)?;
                let mut session = started.session;
                session.ephemeral = true;
                let initial = session.state.clone();
                let fired = ctx.flow.fire(&session, &[], event, input, fresh_id, now)?;
                let mut record =
                    FlowRecord::from_parts(key.product_id.clone(), session, Vec::new());
                let mut decision =
                    record.apply(ctx, fired, Cow::Owned(event.clone()), now, |plan| {
                        plan.map(|p| joins(p, false))
                    });
                // The creation comes first in the audit, then the event.
                decision.transitions.insert(0, created(&initial, true));
                return Ok(Some((record, decision)));
            }
            _ => return Ok(None),
        };
        let fired = ctx.flow.start_with(
            &key.session_id,
            seed_data.as_deref(),
            user_info.as_ref(),
            true,
            now,
        )?;
        let mut decision = Decision::changed();
        decision.transition(created(&fired.session.state, false));
        decision
            .effects
            .extend(fired.appended.iter().cloned().map(FlowEffect::Dialogue));
        decision
            .effects
            .extend(fired.response.map(FlowEffect::Respond));
        let record = FlowRecord::from_parts(key.product_id.clone(), fired.session, fired.appended);
        Ok(Some((record, decision)))
    }

    fn next_deadline(&self, _ctx: &FlowContext) -> Option<Timestamp> {
        None
    }

    fn state_name(&self) -> Name {
        Cow::Owned(self.session.state.clone())
    }
}

#[cfg(test)]
mod start_tests;
#[cfg(test)]
mod tests;
