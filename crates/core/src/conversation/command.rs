//! The conversation machine: its key, commands, context, effects and error,
//! and the one decision every command goes through.

use std::borrow::Cow;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{ConversationState, Instance, InstanceId, Message, NewInstance, Role, Todo};
use crate::machine::{
    Command, Decision, EntityKey, EntityKind, ErrorClass, Machine, MachineError, Name, NotAllowed,
    Transition,
};
use crate::queue::TaskSpec;
use crate::{ProductId, Timestamp};

use ConversationState as S;

/// Task kind of an agent turn.
pub const TURN_KIND: &str = "conversation.agent_turn";
/// Task kind of a follow-up.
pub const FOLLOW_UP_KIND: &str = "conversation.follow_up";
/// Task kind of an outbound message's delivery to its channel.
pub const DELIVER_KIND: &str = "conversation.deliver";
/// The payload member (`true`) of the agent turn that follows an operator's
/// hand-back: the turn goes on without offering the hand-off again.
pub const HANDED_BACK: &str = "handed_back";

/// Longest message text accepted, in bytes.
const MAX_TEXT_BYTES: usize = 64 * 1024;

/// Where one conversation instance lives.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ConversationKey {
    /// The tenant.
    pub product_id: ProductId,
    /// The instance.
    pub instance_id: InstanceId,
}

impl EntityKey for ConversationKey {
    fn product_id(&self) -> &ProductId {
        &self.product_id
    }

    fn entity_id(&self) -> Cow<'_, str> {
        Cow::Owned(self.instance_id.to_string())
    }
}

/// What a conversation decision reads besides the instance: whether another
/// instance of the same contact holds it. Creation reads it (a held contact
/// queues the new instance) and so does promotion (a held contact refuses
/// it); every other command ignores it. A store reads it under the
/// contact's lock and decides again under that lock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConversationContext {
    /// Another instance of the contact is non-terminal and not `QUEUED`.
    pub contact_held: bool,
}

/// What may be asked of a conversation instance: the operator's, the
/// agent's, the contact's, the timer's and the store's commands.
///
/// Plain data tagged by `type`, as the audit log records it:
///
/// ```
/// use parlance_core::Command;
/// use parlance_core::conversation::ConversationCommand;
///
/// let reply: ConversationCommand =
///     serde_json::from_str(r#"{"type": "contact_reply", "text": "Tuesday works"}"#)?;
/// assert_eq!(reply.name(), "contact_reply");
/// assert_eq!(
///     serde_json::to_value(&ConversationCommand::Pause)?,
///     serde_json::json!({"type": "pause"})
/// );
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ConversationCommand {
    /// Create the instance: `CREATED`, or `QUEUED` when the contact is held.
    Create(NewInstance),
    /// The agent starts a turn.
    BeginAgentTurn,
    /// The agent sends a message and waits for the reply.
    AgentSend {
        /// The message.
        text: String,
        /// Seconds to the follow-up instead of the instance's interval.
        next_heartbeat_s: Option<u64>,
    },
    /// The heartbeat timer fires.
    TimerFired,
    /// The agent sends the follow-up of a fired heartbeat.
    SendFollowUp {
        /// The message.
        text: String,
        /// Seconds to the next follow-up instead of the instance's interval.
        next_heartbeat_s: Option<u64>,
    },
    /// The contact wrote.
    ContactReply {
        /// What they wrote.
        text: String,
    },
    /// The agent ends the conversation.
    EndConversation {
        /// What came of it.
        outcome: Option<String>,
    },
    /// The agent hands the conversation to a human.
    RequestHuman {
        /// Why.
        reason: String,
    },
    /// The agent rewrites its checklist.
    UpdateTodos {
        /// The new checklist.
        todos: Vec<Todo>,
    },
    /// The operator pauses the instance.
    Pause,
    /// The operator resumes a paused or handed-off instance.
    Resume,
    /// The operator writes to the contact.
    OperatorSend {
        /// The message.
        text: String,
    },
    /// The operator cancels the instance.
    Cancel,
    /// An unrecoverable error (an agent task out of retries).
    Fail {
        /// The error, kept as the end reason.
        error: String,
    },
    /// The contact was freed: a queued instance takes it.
    Promote,
}

impl Command for ConversationCommand {
    fn name(&self) -> &'static str {
        match self {
            Self::Create(_) => "create",
            Self::BeginAgentTurn => "begin_agent_turn",
            Self::AgentSend { .. } => "agent_send",
            Self::TimerFired => "timer_fired",
            Self::SendFollowUp { .. } => "send_follow_up",
            Self::ContactReply { .. } => "contact_reply",
            Self::EndConversation { .. } => "end_conversation",
            Self::RequestHuman { .. } => "request_human",
            Self::UpdateTodos { .. } => "update_todos",
            Self::Pause => "pause",
            Self::Resume => "resume",
            Self::OperatorSend { .. } => "operator_send",
            Self::Cancel => "cancel",
            Self::Fail { .. } => "fail",
            Self::Promote => "promote",
        }
    }
}

/// What a decision asks of the shell beyond its transitions and tasks, in
/// order.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "effect", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ConversationEffect {
    /// Append to the transcript (every message, inbound or outbound),
    /// written by the store with the state.
    Append(Message),
    /// If the contact now has no instance holding it, promote its oldest
    /// `QUEUED` instance (the store decides [`ConversationCommand::Promote`]
    /// on it in the same transaction).
    PromoteNextQueued,
    /// Tell an operator a human is needed (after the commit).
    NotifyOperator {
        /// The agent's reason.
        reason: String,
    },
}

/// Why a command was refused. The instance is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConversationError {
    /// The command does not apply in the instance's state: a terminal
    /// state, a heartbeat that is not due (`not_due`), a promotion while the
    /// contact is held (`contact_held`), a creation of an instance that
    /// exists (`already_exists`).
    #[error(transparent)]
    NotAllowed(#[from] NotAllowed),
    /// A field of the command is unusable.
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// Which field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// Every outbound sequence number is taken: the instance cannot send
    /// another message.
    #[error("no outbound sequence number is left after {sent} messages")]
    LimitExceeded {
        /// The messages sent.
        sent: u32,
    },
}

impl MachineError for ConversationError {
    fn class(&self) -> ErrorClass {
        match self {
            Self::NotAllowed(_) => ErrorClass::NotAllowed,
            Self::Invalid { .. } => ErrorClass::Invalid,
            Self::LimitExceeded { .. } => ErrorClass::LimitExceeded,
        }
    }

    fn not_allowed(&self) -> Option<&NotAllowed> {
        match self {
            Self::NotAllowed(n) => Some(n),
            _ => None,
        }
    }

    fn field(&self) -> Option<&str> {
        match self {
            Self::Invalid { field, .. } => Some(field),
            _ => None,
        }
    }
}

fn check_text(field: &'static str, text: &str) -> Result<(), ConversationError> {
    if text.trim().is_empty() {
        return Err(ConversationError::Invalid {
            field,
            reason: "must not be empty".to_owned(),
        });
    }
    if text.len() > MAX_TEXT_BYTES {
        return Err(ConversationError::Invalid {
            field,
            reason: format!(
                "is {} bytes long, at most {MAX_TEXT_BYTES} are allowed",
                text.len()
            ),
        });
    }
    Ok(())
}

fn check_delay(next_heartbeat_s: Option<u64>) -> Result<(), ConversationError> {
    match next_heartbeat_s {
        Some(0) => Err(ConversationError::Invalid {
            field: "next_heartbeat_s",
            reason: "must be at least 1 second".to_owned(),
        }),
        _ => Ok(()),
    }
}

/// A decision on an instance.
type D = Decision<Instance>;

impl Machine for Instance {
    type Key = ConversationKey;
    type Command = ConversationCommand;
    type Context = ConversationContext;
    type Effect = ConversationEffect;
    type Error = ConversationError;

    const KIND: EntityKind = EntityKind::Conversation;

    fn decide(
        &mut self,
        ctx: &ConversationContext,
        command: &ConversationCommand,
        now: Timestamp,
    ) -> Result<D, ConversationError> {
        use ConversationCommand as C;
        // Every arm checks all it refuses on before it changes anything.
        let mut d = D::changed();
        match command {
            C::Create(_) => return Err(self.refuse(command).because("already_exists").into()),
            C::BeginAgentTurn => self.begin_agent_turn(command, now, &mut d)?,
            C::AgentSend {
                text,
                next_heartbeat_s,
            } => self.agent_send(command, text, *next_heartbeat_s, now, &mut d)?,
            C::TimerFired => self.fire_heartbeat(command, now, &mut d)?,
            C::SendFollowUp {
                text,
                next_heartbeat_s,
            } => self.send_follow_up(command, text, *next_heartbeat_s, now, &mut d)?,
            C::ContactReply { text } => self.contact_reply(text, now, &mut d),
            C::EndConversation { outcome } => {
                self.end_conversation(command, outcome.as_deref(), now, &mut d)?;
            }
            C::RequestHuman { reason } => self.request_human(command, reason, now, &mut d)?,
            C::UpdateTodos { todos } => self.update_todos(command, todos, now)?,
            C::Pause => self.pause(command, now, &mut d)?,
            C::Resume => self.resume(command, now, &mut d)?,
            C::OperatorSend { text } => self.operator_send(command, text, now, &mut d)?,
            C::Cancel => self.end_failed(command, "cancelled", now, &mut d)?,
            C::Fail { error } => {
                let reason = if error.trim().is_empty() {
                    "failed"
                } else {
                    error
                };
                self.end_failed(command, reason, now, &mut d)?;
            }
            C::Promote => self.promote(ctx, command, now, &mut d)?,
        }
        d.next_deadline = self.heartbeat_due_at;
        Ok(d)
    }

    /// Creates the instance from [`ConversationCommand::Create`]: `CREATED`
    /// with an agent turn when the contact is free, `QUEUED` when the
    /// context says another instance holds it. Every other command finds
    /// nothing to act on (`Ok(None)`).
    fn create(
        key: &ConversationKey,
        ctx: &ConversationContext,
        command: &ConversationCommand,
        now: Timestamp,
    ) -> Result<Option<(Self, D)>, ConversationError> {
        let ConversationCommand::Create(new) = command else {
            return Ok(None);
        };
        let mismatch = |field| ConversationError::Invalid {
            field,
            reason: "does not match the record's key".to_owned(),
        };
        if new.product_id != key.product_id {
            return Err(mismatch("product_id"));
        }
        if new.instance_id != key.instance_id {
            return Err(mismatch("instance_id"));
        }
        check_text("objective", &new.objective)?;
        check_text("channel", &new.channel)?;
        if new.heartbeat_interval_s == 0 {
            return Err(ConversationError::Invalid {
                field: "heartbeat_interval_s",
                reason: "must be at least 1 second".to_owned(),
            });
        }
        let state = if ctx.contact_held {
            S::Queued
        } else {
            S::Created
        };
        let new = new.clone();
        let instance = Instance {
            product_id: new.product_id,
            instance_id: new.instance_id,
            contact_id: new.contact_id,
            channel: new.channel,
            objective: new.objective,
            todos: new.todos,
            state,
            previous_state: None,
            follow_ups_sent: 0,
            max_follow_ups: new.max_follow_ups,
            heartbeat_interval_s: new.heartbeat_interval_s,
            heartbeat_due_at: None,
            paused_remaining_s: None,
            pending_contact_reply: false,
            end_reason: None,
            outcome: None,
            human_reason: None,
            outbound_seq: 0,
            metadata: new.metadata,
            created_at: now,
            updated_at: now,
            ended_at: None,
        };
        let mut d = D::changed();
        d.transition(
            Transition::created(state.as_str(), "create")
                .with_detail(serde_json::json!({ "contact_id": instance.contact_id.as_str() })),
        );
        if state == S::Created {
            instance.agent_task(TURN_KIND, &mut d);
        }
        Ok(Some((instance, d)))
    }

    fn next_deadline(&self, _ctx: &ConversationContext) -> Option<Timestamp> {
        self.heartbeat_due_at
    }

    fn state_name(&self) -> Name {
        Cow::Borrowed(self.state.as_str())
    }
}

impl Instance {
    fn refuse(&self, command: &ConversationCommand) -> NotAllowed {
        NotAllowed::new(command.name(), self.state.as_str())
    }

    /// Refuses `command` unless the instance is in one of `states`.
    fn require(
        &self,
        command: &ConversationCommand,
        states: &[ConversationState],
    ) -> Result<(), ConversationError> {
        if states.contains(&self.state) {
            Ok(())
        } else {
            Err(self.refuse(command).into())
        }
    }

    /// The next outbound sequence number, or the refusal when none is left.
    fn next_outbound_seq(&self) -> Result<u32, ConversationError> {
        self.outbound_seq
            .checked_add(1)
            .ok_or(ConversationError::LimitExceeded {
                sent: self.outbound_seq,
            })
    }

    /// A task of `kind` for this instance; a delivery names its message.
    fn task(&self, kind: &'static str, outbound_seq: Option<u32>) -> TaskSpec {
        let mut payload = Map::new();
        payload.insert(
            "instance_id".to_owned(),
            Value::String(self.instance_id.to_string()),
        );
        if let Some(seq) = outbound_seq {
            payload.insert("outbound_seq".to_owned(), Value::from(seq));
        }
        TaskSpec::new(self.product_id.clone(), kind, Value::Object(payload))
    }

    /// Asks for an agent turn or a follow-up: one pending task per instance
    /// and kind, so a second request while one waits is folded into it.
    fn agent_task(&self, kind: &'static str, d: &mut D) {
        self.ask_agent(kind, false, d);
    }

    /// Asks for the agent turn that follows an operator's hand-back
    /// (`resume` or `operator_send` from `NEEDS_HUMAN_INTERVENTION`): its
    /// payload says so ([`HANDED_BACK`]).
    fn handed_back_turn(&self, d: &mut D) {
        self.ask_agent(TURN_KIND, true, d);
    }

    fn ask_agent(&self, kind: &'static str, handed_back: bool, d: &mut D) {
        if d.single_tasks().any(|t| t.kind == kind) {
            return;
        }
        let mut task = self
            .task(kind, None)
            .dedup_key(format!("{kind}:{}:{}", self.product_id, self.instance_id));
        if let (true, Value::Object(payload)) = (handed_back, &mut task.payload) {
            payload.insert(HANDED_BACK.to_owned(), Value::Bool(true));
        }
        d.task(task);
    }

    /// Moves to `to` (recording the transition unless the state stays), and
    /// clears what a terminal state must not keep; a terminal state frees
    /// the contact for the next queued instance.
    fn move_to(&mut self, to: ConversationState, cause: &'static str, now: Timestamp, d: &mut D) {
        if self.state != to {
            d.transition(Transition::new(self.state.as_str(), to.as_str(), cause));
        }
        self.state = to;
        self.updated_at = now;
        if to.is_terminal() {
            self.ended_at = Some(now);
            self.heartbeat_due_at = None;
            self.paused_remaining_s = None;
            self.previous_state = None;
            d.effect(ConversationEffect::PromoteNextQueued);
        }
    }

    /// Appends an outbound message and asks for its delivery. The caller
    /// checked that a sequence number is left.
    fn outbound(&mut self, role: Role, text: &str, seq: u32, now: Timestamp, d: &mut D) {
        self.outbound_seq = seq;
        d.effect(ConversationEffect::Append(Message {
            role,
            text: text.to_owned(),
            at: now,
            outbound_seq: Some(seq),
        }));
        d.task(self.task(DELIVER_KIND, Some(seq)));
    }

    fn arm(&mut self, next_heartbeat_s: Option<u64>, now: Timestamp) {
        self.heartbeat_due_at = (self.max_follow_ups > 0).then(|| {
            let secs = next_heartbeat_s.unwrap_or(self.heartbeat_interval_s);
            now + Duration::from_secs(secs)
        });
    }

    /// `CREATED` or `WAITING_FOR_AGENT` -> `ACTIVE`.
    fn begin_agent_turn(
        &mut self,
        command: &ConversationCommand,
        now: Timestamp,
        d: &mut D,
    ) -> Result<(), ConversationError> {
        self.require(command, &[S::Created, S::WaitingForAgent])?;
        self.move_to(S::Active, "begin_agent_turn", now, d);
        Ok(())
    }

    /// `ACTIVE` -> `WAITING_FOR_REPLY`; the heartbeat is armed at
    /// `now + (next_heartbeat_s or the interval)` unless follow-ups are off.
    fn agent_send(
        &mut self,
        command: &ConversationCommand,
        text: &str,
        next_heartbeat_s: Option<u64>,
        now: Timestamp,
        d: &mut D,
    ) -> Result<(), ConversationError> {
        self.require(command, &[S::Active])?;
        self.send_and_wait(text, next_heartbeat_s, "agent_send", now, d)
    }

    /// Sends the agent's `text`, moves to `WAITING_FOR_REPLY` by `cause`
    /// and arms the timer; checks the text, the delay and the sequence
    /// number first, so a refusal changes nothing.
    fn send_and_wait(
        &mut self,
        text: &str,
        next_heartbeat_s: Option<u64>,
        cause: &'static str,
        now: Timestamp,
        d: &mut D,
    ) -> Result<(), ConversationError> {
        check_text("text", text)?;
        check_delay(next_heartbeat_s)?;
        let seq = self.next_outbound_seq()?;
        self.outbound(Role::Agent, text, seq, now, d);
        self.move_to(S::WaitingForReply, cause, now, d);
        self.arm(next_heartbeat_s, now);
        Ok(())
    }

    /// `WAITING_FOR_REPLY` -> `HEARTBEAT_SCHEDULED` with a follow-up task,
    /// or at once `ABANDONED` when every follow-up was sent. Fires once
    /// however late it is.
    fn fire_heartbeat(
        &mut self,
        command: &ConversationCommand,
        now: Timestamp,
        d: &mut D,
    ) -> Result<(), ConversationError> {
        self.require(command, &[S::WaitingForReply])?;
        if self.heartbeat_due_at.is_none_or(|due| due > now) {
            return Err(self.refuse(command).because("not_due").into());
        }
        self.heartbeat_due_at = None;
        self.move_to(S::HeartbeatScheduled, "timer_fired", now, d);
        if self.follow_ups_sent >= self.max_follow_ups {
            self.end_reason = Some("abandoned".to_owned());
            self.move_to(S::Abandoned, "timer_fired", now, d);
        } else {
            self.agent_task(FOLLOW_UP_KIND, d);
        }
        Ok(())
    }

    /// `HEARTBEAT_SCHEDULED` -> `WAITING_FOR_REPLY`: the follow-up is sent,
    /// counted, and the timer re-armed.
    fn send_follow_up(
        &mut self,
        command: &ConversationCommand,
        text: &str,
        next_heartbeat_s: Option<u64>,
        now: Timestamp,
        d: &mut D,
    ) -> Result<(), ConversationError> {
        self.require(command, &[S::HeartbeatScheduled])?;
        self.send_and_wait(text, next_heartbeat_s, "send_follow_up", now, d)?;
        self.follow_ups_sent += 1;
        Ok(())
    }

    /// A contact reply, appended in every state. From `WAITING_FOR_REPLY` or
    /// `HEARTBEAT_SCHEDULED` it moves to `WAITING_FOR_AGENT` (timer and
    /// pending follow-up cancelled, follow-up count reset, agent turn
    /// enqueued); while `PAUSED` it waits for `resume`; after the end it is
    /// a late reply, recorded from and to the terminal state. Never refused.
    fn contact_reply(&mut self, text: &str, now: Timestamp, d: &mut D) {
        d.effect(ConversationEffect::Append(Message {
            role: Role::Contact,
            text: text.to_owned(),
            at: now,
            outbound_seq: None,
        }));
        match self.state {
            S::WaitingForReply | S::HeartbeatScheduled => {
                self.heartbeat_due_at = None;
                self.follow_ups_sent = 0;
                self.move_to(S::WaitingForAgent, "contact_reply", now, d);
                self.agent_task(TURN_KIND, d);
            }
            S::Paused => {
                self.pending_contact_reply = true;
                self.updated_at = now;
            }
            s if s.is_terminal() => {
                d.transition(Transition::new(s.as_str(), s.as_str(), "late_reply"));
            }
            _ => self.updated_at = now,
        }
    }

    /// `ACTIVE` -> `COMPLETED` with an optional outcome text.
    fn end_conversation(
        &mut self,
        command: &ConversationCommand,
        outcome: Option<&str>,
        now: Timestamp,
        d: &mut D,
    ) -> Result<(), ConversationError> {
        self.require(command, &[S::Active])?;
        self.end_reason = Some("completed".to_owned());
        self.outcome = outcome.filter(|o| !o.trim().is_empty()).map(str::to_owned);
        self.move_to(S::Completed, "end_conversation", now, d);
        Ok(())
    }

    /// `ACTIVE` -> `NEEDS_HUMAN_INTERVENTION`; an operator is notified.
    fn request_human(
        &mut self,
        command: &ConversationCommand,
        reason: &str,
        now: Timestamp,
        d: &mut D,
    ) -> Result<(), ConversationError> {
        self.require(command, &[S::Active])?;
        check_text("reason", reason)?;
        self.human_reason = Some(reason.to_owned());
        self.move_to(S::NeedsHumanIntervention, "request_human", now, d);
        d.effect(ConversationEffect::NotifyOperator {
            reason: reason.to_owned(),
        });
        Ok(())
    }

    /// The agent rewrites its checklist (in `ACTIVE`, no transition).
    fn update_todos(
        &mut self,
        command: &ConversationCommand,
        todos: &[Todo],
        now: Timestamp,
    ) -> Result<(), ConversationError> {
        self.require(command, &[S::Active])?;
        for t in todos {
            check_text("todos", &t.text)?;
        }
        self.todos = todos.to_vec();
        self.updated_at = now;
        Ok(())
    }

    /// Any non-terminal state but `PAUSED` -> `PAUSED`: the previous state
    /// is recorded and an armed timer is frozen with its remaining time.
    fn pause(
        &mut self,
        command: &ConversationCommand,
        now: Timestamp,
        d: &mut D,
    ) -> Result<(), ConversationError> {
        if self.state == S::Paused || self.state.is_terminal() {
            return Err(self.refuse(command).into());
        }
        self.paused_remaining_s = self
            .heartbeat_due_at
            .take()
            .map(|due| due.seconds_since(now).max(0.0));
        self.previous_state = Some(self.state);
        self.pending_contact_reply = false;
        self.move_to(S::Paused, "pause", now, d);
        Ok(())
    }

    /// From `NEEDS_HUMAN_INTERVENTION`: back to `ACTIVE` with an agent turn
    /// marked as handed back.
    /// From `PAUSED`: back to the previous state with a frozen timer resumed
    /// for its remaining time; a reply that arrived while paused is
    /// processed now (`WAITING_FOR_AGENT` when the instance was waiting for
    /// one); work the pause interrupted is asked for again.
    fn resume(
        &mut self,
        command: &ConversationCommand,
        now: Timestamp,
        d: &mut D,
    ) -> Result<(), ConversationError> {
        match self.state {
            S::NeedsHumanIntervention => {
                self.human_reason = None;
                self.move_to(S::Active, "resume", now, d);
                self.handed_back_turn(d);
            }
            S::Paused => {
                let previous = self.previous_state.take().unwrap_or(S::Active);
                let remaining = self.paused_remaining_s.take();
                let replied = std::mem::take(&mut self.pending_contact_reply);
                let waiting = matches!(previous, S::WaitingForReply | S::HeartbeatScheduled);
                if replied && waiting {
                    self.follow_ups_sent = 0;
                    self.move_to(S::WaitingForAgent, "resume", now, d);
                    self.agent_task(TURN_KIND, d);
                    return Ok(());
                }
                self.move_to(previous, "resume", now, d);
                match previous {
                    S::WaitingForReply => {
                        self.heartbeat_due_at = remaining.map(|r| now.plus_seconds(r));
                    }
                    S::HeartbeatScheduled => self.agent_task(FOLLOW_UP_KIND, d),
                    S::Created | S::Active | S::WaitingForAgent => self.agent_task(TURN_KIND, d),
                    // The holder may have ended while this one was paused.
                    S::Queued => {
                        d.effect(ConversationEffect::PromoteNextQueued);
                    }
                    _ => {}
                }
            }
            _ => return Err(self.refuse(command).into()),
        }
        Ok(())
    }

    /// A message written by an operator. From `NEEDS_HUMAN_INTERVENTION` it
    /// returns the instance to `ACTIVE` with an agent turn (marked as handed
    /// back) so the conversation goes on; while waiting for a reply it re-arms the timer
    /// and leaves the follow-up count alone.
    fn operator_send(
        &mut self,
        command: &ConversationCommand,
        text: &str,
        now: Timestamp,
        d: &mut D,
    ) -> Result<(), ConversationError> {
        self.require(
            command,
            &[
                S::NeedsHumanIntervention,
                S::WaitingForReply,
                S::HeartbeatScheduled,
            ],
        )?;
        check_text("text", text)?;
        let seq = self.next_outbound_seq()?;
        self.outbound(Role::Human, text, seq, now, d);
        if self.state == S::NeedsHumanIntervention {
            self.human_reason = None;
            self.move_to(S::Active, "operator_send", now, d);
            self.handed_back_turn(d);
        } else {
            self.move_to(S::WaitingForReply, "operator_send", now, d);
            self.arm(None, now);
        }
        Ok(())
    }

    /// Any non-terminal state -> `FAILED` with `reason` (`cancelled` for a
    /// cancellation, the error for a failure); no farewell message.
    fn end_failed(
        &mut self,
        command: &ConversationCommand,
        reason: &str,
        now: Timestamp,
        d: &mut D,
    ) -> Result<(), ConversationError> {
        if self.state.is_terminal() {
            return Err(self.refuse(command).into());
        }
        self.end_reason = Some(reason.to_owned());
        self.move_to(S::Failed, command.name(), now, d);
        Ok(())
    }

    /// `QUEUED` -> `CREATED` with an agent turn, once no other instance
    /// holds the contact.
    fn promote(
        &mut self,
        ctx: &ConversationContext,
        command: &ConversationCommand,
        now: Timestamp,
        d: &mut D,
    ) -> Result<(), ConversationError> {
        self.require(command, &[S::Queued])?;
        if ctx.contact_held {
            return Err(self.refuse(command).because("contact_held").into());
        }
        self.move_to(S::Created, "promote", now, d);
        self.agent_task(TURN_KIND, d);
        Ok(())
    }
}
