//! The session as a [`Machine`]: its key, its commands and [`decide`].
//!
//! Every command ticks the session first, as the seed's service does before
//! each operation: a timeout back to `thinking` is a transition caused by
//! `tick` (audited with `{"event": "tick"}`, or `{"event": "sweep"}` when the
//! sweeper asked), a cooldown end changes the state without one. Then the
//! event, if the command carries one, is applied. A refused event is refused
//! before anything changes, so the state is exactly as it was.
//!
//! Only [`SessionCommand::Create`] creates a session, fresh in `thinking`
//! and not audited; an event is always decided on a stored session, so a
//! session's first event is its second version.
//!
//! The decision's one effect, a [`SessionReport`], is what the tick and the
//! event did, for the caller's answer; it is left out when neither did more
//! than refresh elapsed times. `decide` never clones the state, and
//! allocates only to record a transition or a report, or to store an id
//! longer than any the session held.
//!
//! [`decide`]: Machine::decide

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::machine::{Command, Decision, EntityKey, EntityKind, Machine, Name, Transition};
use crate::outcome::StateChange;
use crate::session::state::{
    AssistState, ConversationEvent, CooldownChange, SessionError, SessionId, SessionOutcome,
    SessionState,
};
use crate::session::tours::TourCatalog;
use crate::{ProductId, Timestamp};

/// Where a session is stored: its product, then its id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionKey {
    /// The tenant.
    pub product_id: ProductId,
    /// The session's id within the product.
    pub session_id: SessionId,
}

impl SessionKey {
    /// The key of session `session_id` of product `product_id`.
    pub fn new(product_id: ProductId, session_id: SessionId) -> Self {
        Self {
            product_id,
            session_id,
        }
    }
}

impl EntityKey for SessionKey {
    fn product_id(&self) -> &ProductId {
        &self.product_id
    }

    fn entity_id(&self) -> Cow<'_, str> {
        Cow::Borrowed(self.session_id.as_str())
    }
}

/// Something that happened in a live session, tagged by `type` on the wire
/// (the body of `POST .../events`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub enum SessionEvent {
    /// A proactive trigger fired: offer help (from thinking, cooldown permitting).
    ProactiveTrigger {
        /// Which trigger, for the audit trail.
        trigger_id: String,
    },
    /// The user opened the chat (from thinking; clears a cooldown).
    OpenChat,
    /// The user sent a chat message.
    UserMessage,
    /// The user tapped a quick-reply option.
    OptionClick,
    /// The user reacted to a message.
    Reaction,
    /// A tour advanced a step.
    TourStep,
    /// A tour overlay started or ended.
    VisualGuidance {
        /// Started (true) or ended.
        active: bool,
        /// The tour provider's flow id.
        #[serde(default)]
        tour_id: Option<String>,
    },
    /// A conversation was linked to the session.
    ConversationLinked {
        /// `NEW` or `REPLY_EXISTING`.
        event: ConversationEvent,
        /// The conversation.
        #[cfg_attr(feature = "openapi", schema(min_length = 1))]
        conversation_id: String,
    },
}

impl SessionEvent {
    /// The wire name of the event type.
    pub fn kind(&self) -> &'static str {
        match self {
            SessionEvent::ProactiveTrigger { .. } => "proactive_trigger",
            SessionEvent::OpenChat => "open_chat",
            SessionEvent::UserMessage => "user_message",
            SessionEvent::OptionClick => "option_click",
            SessionEvent::Reaction => "reaction",
            SessionEvent::TourStep => "tour_step",
            SessionEvent::VisualGuidance { .. } => "visual_guidance",
            SessionEvent::ConversationLinked { .. } => "conversation_linked",
        }
    }

    /// Checks what can be checked without the session, so a bad event
    /// neither creates nor changes one.
    ///
    /// # Errors
    ///
    /// [`SessionError::EmptyConversationId`] for a link to an empty id.
    pub fn validate(&self) -> Result<(), SessionError> {
        match self {
            SessionEvent::ConversationLinked {
                conversation_id, ..
            } if conversation_id.is_empty() => Err(SessionError::EmptyConversationId),
            _ => Ok(()),
        }
    }

    /// The audit detail of a transition this event caused: the event's
    /// identifying fields, never free text.
    pub fn detail(&self) -> Value {
        match self {
            SessionEvent::ProactiveTrigger { trigger_id } => {
                json!({"event": self.kind(), "trigger_id": trigger_id})
            }
            SessionEvent::VisualGuidance { active, tour_id } => {
                json!({"event": self.kind(), "active": active, "tour_id": tour_id})
            }
            _ => json!({"event": self.kind()}),
        }
    }
}

/// What may be asked of a session: its creation, a tick (a read bringing
/// it up to date, or the sweeper's, once its deadline has come) or an
/// event. Tagged by `type` on the wire, events with their own names.
///
/// ```
/// use parlance_core::Command;
/// use parlance_core::session::{SessionCommand, SessionEvent};
///
/// let tick: SessionCommand = serde_json::from_str(r#"{"type": "tick"}"#)?;
/// assert_eq!(tick, SessionCommand::Tick);
///
/// let body = r#"{"type": "visual_guidance", "active": true, "tour_id": "t-1"}"#;
/// let event: SessionCommand = serde_json::from_str(body)?;
/// assert_eq!(
///     event,
///     SessionCommand::from(SessionEvent::VisualGuidance {
///         active: true,
///         tour_id: Some("t-1".to_owned()),
///     })
/// );
/// assert_eq!(event.name(), "visual_guidance");
/// assert!(event.event().is_some());
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum SessionCommand {
    /// Store a new session in `thinking`, as the record every event is
    /// decided on; the only command that creates one. On a session that
    /// exists, a tick.
    Create,
    /// Bring the session up to date (a read); nothing to store unless the
    /// tick timed out or ended a cooldown. Never creates a session.
    Tick,
    /// The sweeper's tick of a session whose deadline has come; always
    /// stored, so the stored deadline is the session's again. Never creates
    /// a session.
    Sweep,
    /// An event, after the tick. Never creates a session: the caller
    /// creates it first ([`SessionCommand::Create`]).
    #[serde(untagged)]
    Event(SessionEvent),
}

impl SessionCommand {
    /// The event, when the command carries one.
    pub fn event(&self) -> Option<&SessionEvent> {
        match self {
            SessionCommand::Create | SessionCommand::Tick | SessionCommand::Sweep => None,
            SessionCommand::Event(e) => Some(e),
        }
    }
}

impl From<SessionEvent> for SessionCommand {
    fn from(event: SessionEvent) -> Self {
        SessionCommand::Event(event)
    }
}

impl Command for SessionCommand {
    fn name(&self) -> &'static str {
        match self {
            SessionCommand::Create => "create",
            SessionCommand::Tick => "tick",
            SessionCommand::Sweep => "sweep",
            SessionCommand::Event(e) => e.kind(),
        }
    }
}

/// What a decision did to the session, for the caller's answer: the tick's
/// outcome, then the event's (default for a tick alone).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct SessionReport {
    /// What the tick did (a timeout, a cooldown ending).
    pub tick: SessionOutcome,
    /// What the event did.
    pub result: SessionOutcome,
}

impl SessionReport {
    /// The report of `decision`: its effect, or the default (nothing
    /// happened but elapsed times) when it has none.
    pub fn of(decision: &Decision<SessionState>) -> SessionReport {
        decision.effects.first().cloned().unwrap_or_default()
    }

    /// True when both outcomes are the default (field by field: the
    /// derived comparison would compare the `&str` reasons by content).
    fn is_empty(&self) -> bool {
        let nothing = |o: &SessionOutcome| {
            let SessionOutcome {
                transition,
                cooldown,
                ignored,
            } = o;
            transition.is_none() && *cooldown == CooldownChange::Unchanged && ignored.is_none()
        };
        nothing(&self.tick) && nothing(&self.result)
    }
}

/// True when a tick did something worth storing: a timeout or a cooldown
/// end, not a mere refresh of elapsed times.
fn ticked(tick: &SessionOutcome) -> bool {
    tick.changed_state() || tick.cooldown != CooldownChange::Unchanged
}

/// The audit line of a state change.
fn audited(change: &StateChange<AssistState>, detail: Value) -> Transition {
    Transition::new(change.from.as_str(), change.to.as_str(), change.cause).with_detail(detail)
}

impl SessionState {
    /// The session's key.
    pub fn key(&self) -> SessionKey {
        SessionKey::new(self.product_id.clone(), self.session_id.clone())
    }

    /// Refuses `event` at `now` if the state after the tick does not allow
    /// it. Changes nothing.
    fn check(
        &self,
        event: &SessionEvent,
        now: Timestamp,
        settings: (f64, f64),
    ) -> Result<(), SessionError> {
        event.validate()?;
        if let SessionEvent::ProactiveTrigger { .. } | SessionEvent::OpenChat = event {
            let state = self.state_after_tick(now, settings);
            if state != AssistState::Thinking {
                return Err(SessionError::refused(event.kind(), state));
            }
        }
        Ok(())
    }

    /// Applies a checked event.
    fn apply(&mut self, event: &SessionEvent, now: Timestamp) -> SessionOutcome {
        match event {
            SessionEvent::ProactiveTrigger { .. } => self.enter_proactive(now),
            SessionEvent::OpenChat => self.enter_reactive(now),
            SessionEvent::UserMessage => self.record_user_interaction(now),
            SessionEvent::OptionClick => self.record_option_click(now),
            SessionEvent::Reaction => self.record_reaction(now),
            SessionEvent::TourStep => self.record_tour_step(now),
            SessionEvent::VisualGuidance { active, tour_id } => {
                self.set_visual_guidance(*active, tour_id.as_deref(), now)
            }
            SessionEvent::ConversationLinked {
                event,
                conversation_id,
            } => self.link_conversation(*event, conversation_id),
        }
    }
}

impl Machine for SessionState {
    type Key = SessionKey;
    type Command = SessionCommand;
    type Context = TourCatalog;
    type Effect = SessionReport;
    type Error = SessionError;

    const KIND: EntityKind = EntityKind::Session;

    /// Ticks, then applies the command's event. The decision is `changed`
    /// unless nothing is worth storing: a tick that only refreshed elapsed
    /// times, or an ignored event after such a tick (a sweep is always
    /// stored).
    ///
    /// # Errors
    ///
    /// [`SessionError::NotAllowed`] for a proactive trigger or opening the
    /// chat when the session, ticked, is not in `thinking`;
    /// [`SessionError::EmptyConversationId`]. The session is unchanged.
    fn decide(
        &mut self,
        tours: &TourCatalog,
        command: &SessionCommand,
        now: Timestamp,
    ) -> Result<Decision<Self>, SessionError> {
        let event = command.event();
        // The tour settings in force before the command, resolved once for
        // the check and the tick; the deadline resolves them again, after
        // the tick and the event may have changed the tour.
        let settings = self.resolved_settings(tours);
        if let Some(event) = event {
            self.check(event, now, settings)?;
        }
        let tick = self.tick_in(now, settings);
        let result = match event {
            Some(event) => self.apply(event, now),
            None => SessionOutcome::default(),
        };

        let mut decision = Decision::unchanged();
        if let Some(change) = &tick.transition {
            let by = if matches!(command, SessionCommand::Sweep) {
                "sweep"
            } else {
                "tick"
            };
            decision.transition(audited(change, json!({ "event": by })));
        }
        if let (Some(change), Some(event)) = (&result.transition, event) {
            decision.transition(audited(change, event.detail()));
        }
        decision.changed = match command {
            SessionCommand::Create | SessionCommand::Tick => ticked(&tick),
            SessionCommand::Sweep => true,
            SessionCommand::Event(_) => ticked(&tick) || result.ignored.is_none(),
        };
        decision.next_deadline = self.next_deadline(tours);
        let report = SessionReport { tick, result };
        if !report.is_empty() {
            decision.effect(report);
        }
        Ok(decision)
    }

    /// A new session in `thinking` (see [`SessionState::new`]) for
    /// [`SessionCommand::Create`], not audited; every other command answers
    /// `None`. An event is decided on the session once it is stored, so
    /// creating a session and deciding its first event are two commits.
    ///
    /// # Errors
    ///
    /// None today; the signature is the protocol's.
    fn create(
        key: &SessionKey,
        tours: &TourCatalog,
        command: &SessionCommand,
        now: Timestamp,
    ) -> Result<Option<(Self, Decision<Self>)>, SessionError> {
        if !matches!(command, SessionCommand::Create) {
            return Ok(None);
        }
        let mut session = SessionState::new(key.product_id.clone(), key.session_id.clone(), now);
        let mut decision = session.decide(tours, command, now)?;
        decision.changed = true;
        Ok(Some((session, decision)))
    }

    fn next_deadline(&self, tours: &TourCatalog) -> Option<Timestamp> {
        SessionState::next_deadline(self, tours)
    }

    fn state_name(&self) -> Name {
        Cow::Borrowed(self.current_state.as_str())
    }
}
