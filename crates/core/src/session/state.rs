//! The session assistance state and its operations.
//!
//! A [`SessionState`] is one live session's mode (`thinking`,
//! `proactive_assistance`, `reactive_assistance`) with its interaction clock,
//! cooldown and conversation link. Every operation takes `now`; none reads a
//! clock, and none allocates unless it stores an id longer than any it held
//! before.
//!
//! The operations here are the seed's, one by one (the conformance replays
//! call them so). A service changes a session through
//! [`Machine::decide`](crate::Machine::decide) alone, which ticks before every
//! event (see `machine.rs`).

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::machine::{ErrorClass, MachineError, NotAllowed};
use crate::outcome::StateChange;
use crate::session::tours::TourCatalog;
use crate::{ProductId, Timestamp};

crate::id::string_id!(
    /// A session's id, chosen by the caller: non-empty, at most 256 bytes, no
    /// control characters.
    SessionId,
    "session id",
    max = 256,
    chars = |_| true,
    pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]+$"
);

/// The session default interaction timeout, in seconds.
pub const DEFAULT_INTERACTION_TIMEOUT_S: f64 = 20.0;
/// The session default cooldown period, in seconds.
pub const DEFAULT_COOLDOWN_PERIOD_S: f64 = 60.0;

/// The three modes of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum AssistState {
    /// Idle baseline: proactive offers may fire unless a cooldown runs.
    #[serde(rename = "thinking")]
    Thinking,
    /// The assistant surfaced an unsolicited offer.
    #[serde(rename = "proactive_assistance")]
    Proactive,
    /// The user opened the chat or sent a message.
    #[serde(rename = "reactive_assistance")]
    Reactive,
}

impl AssistState {
    /// Every state, the initial one first.
    pub const ALL: [AssistState; 3] = [
        AssistState::Thinking,
        AssistState::Proactive,
        AssistState::Reactive,
    ];

    /// The wire value: `thinking`, `proactive_assistance` or `reactive_assistance`.
    pub const fn as_str(self) -> &'static str {
        match self {
            AssistState::Thinking => "thinking",
            AssistState::Proactive => "proactive_assistance",
            AssistState::Reactive => "reactive_assistance",
        }
    }

    /// Parses a wire value (exact, case-sensitive).
    pub fn from_wire(s: &str) -> Option<Self> {
        AssistState::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// The `can_deliver_proactive` reason while in this state (not thinking).
    const fn gate_reason(self) -> &'static str {
        match self {
            AssistState::Thinking => "v2_state_thinking",
            AssistState::Proactive => "v2_state_proactive_assistance",
            AssistState::Reactive => "v2_state_reactive_assistance",
        }
    }
}

impl fmt::Display for AssistState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Cooldown bookkeeping, kept while thinking.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ThinkingState {
    /// While true, proactive delivery is blocked.
    pub cooldown_active: bool,
    /// When the running cooldown began; `None` when none was started or it
    /// was cleared.
    pub cooldown_started_at: Option<Timestamp>,
    /// The running cooldown's length; `None` means the session's
    /// `cooldown_period_s`.
    pub active_cooldown_period_s: Option<f64>,
}

impl ThinkingState {
    /// True when no cooldown blocks a proactive offer.
    pub fn can_go_proactive(&self) -> bool {
        !self.cooldown_active
    }

    fn start_cooldown(&mut self, now: Timestamp, period_s: Option<f64>) {
        self.cooldown_active = true;
        self.cooldown_started_at = Some(now);
        self.active_cooldown_period_s = period_s;
    }

    fn clear_cooldown(&mut self) {
        self.cooldown_active = false;
        self.cooldown_started_at = None;
        self.active_cooldown_period_s = None;
    }

    /// Clears an active cooldown once `now - started >= period`; true when
    /// it did.
    fn tick(&mut self, now: Timestamp, session_cooldown_s: f64) -> bool {
        if !self.cooldown_active {
            return false;
        }
        let period = self.active_cooldown_period_s.unwrap_or(session_cooldown_s);
        // An active cooldown without a start cannot be decoded or built; if it
        // ever were, treat it as started at the epoch (long expired).
        let started = self.cooldown_started_at.unwrap_or(Timestamp::UNIX_EPOCH);
        if now.seconds_since(started) >= period {
            self.clear_cooldown();
            true
        } else {
            false
        }
    }
}

/// What is kept while proactive.
#[derive(Debug, Clone, PartialEq)]
pub struct ProactiveState {
    /// True once the user tapped a quick-reply option.
    pub user_clicked_option: bool,
    /// Seconds since `last_message_at`, as of the last non-timeout tick.
    pub time_since_last_interaction_s: f64,
    /// The sub-state's own interaction anchor.
    pub last_message_at: Timestamp,
}

impl ProactiveState {
    /// A fresh sub-record anchored at `now`.
    pub fn new(now: Timestamp) -> Self {
        Self {
            user_clicked_option: false,
            time_since_last_interaction_s: 0.0,
            last_message_at: now,
        }
    }

    fn record(&mut self, now: Timestamp) {
        self.last_message_at = now;
        self.time_since_last_interaction_s = 0.0;
    }

    fn tick(&mut self, now: Timestamp) {
        self.time_since_last_interaction_s = now.seconds_since(self.last_message_at);
    }
}

/// What is kept while reactive.
#[derive(Debug, Clone, PartialEq)]
pub struct ReactiveState {
    /// Seconds since `last_message_at`, as of the last non-timeout tick.
    pub time_since_last_interaction_s: f64,
    /// The sub-state's own interaction anchor.
    pub last_message_at: Timestamp,
}

impl ReactiveState {
    /// A fresh sub-record anchored at `now`.
    pub fn new(now: Timestamp) -> Self {
        Self {
            time_since_last_interaction_s: 0.0,
            last_message_at: now,
        }
    }

    fn record(&mut self, now: Timestamp) {
        self.last_message_at = now;
        self.time_since_last_interaction_s = 0.0;
    }

    fn tick(&mut self, now: Timestamp) {
        self.time_since_last_interaction_s = now.seconds_since(self.last_message_at);
    }
}

/// How a conversation got linked to the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum ConversationEvent {
    /// A new conversation: always links, overwriting any previous id.
    #[serde(rename = "NEW")]
    New,
    /// A reply in an existing conversation: links only an unlinked session.
    #[serde(rename = "REPLY_EXISTING")]
    ReplyExisting,
}

/// Where a message for this session goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryRoute<'a> {
    /// Send into the linked conversation.
    SendTo(&'a str),
    /// No conversation yet: create one and link it.
    CreateAndLink,
}

/// What happened to the cooldown during an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum CooldownChange {
    /// Nothing.
    #[default]
    Unchanged,
    /// A cooldown started (on a timeout).
    Started,
    /// A running cooldown ended (elapsed, or cleared by the user opening the chat).
    Cleared,
}

/// What an operation did. Allocation-free.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionOutcome {
    /// The state change, if any.
    pub transition: Option<StateChange<AssistState>>,
    /// What happened to the cooldown.
    pub cooldown: CooldownChange,
    /// Set when the operation deliberately changed nothing, with why
    /// (`v2_cooldown_active`, `v2_state_thinking`).
    pub ignored: Option<&'static str>,
}

impl SessionOutcome {
    fn ignored(reason: &'static str) -> Self {
        Self {
            ignored: Some(reason),
            ..Self::default()
        }
    }

    fn transition(from: AssistState, to: AssistState, cause: &'static str) -> Self {
        Self {
            transition: Some(StateChange { from, to, cause }),
            ..Self::default()
        }
    }

    /// True when the state changed.
    pub fn changed_state(&self) -> bool {
        self.transition.is_some()
    }
}

/// Why an operation was refused (the session is unchanged).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// The command is not allowed in the current state: a proactive offer
    /// or opening the chat outside `thinking`.
    #[error(transparent)]
    NotAllowed(#[from] NotAllowed),
    /// A timeout or period that is negative, NaN or infinite.
    #[error("{field} must be a finite number of seconds, at least 0 (got {value})")]
    InvalidSeconds {
        /// Which setting.
        field: &'static str,
        /// The value given.
        value: f64,
    },
    /// An empty conversation id would mark the session linked but unroutable.
    #[error("conversation id must not be empty")]
    EmptyConversationId,
}

impl SessionError {
    /// `command` is not allowed in `state`.
    pub(crate) fn refused(command: &'static str, state: AssistState) -> Self {
        SessionError::NotAllowed(NotAllowed::new(command, state.as_str()))
    }
}

impl MachineError for SessionError {
    fn class(&self) -> ErrorClass {
        match self {
            SessionError::NotAllowed(_) => ErrorClass::NotAllowed,
            SessionError::InvalidSeconds { .. } | SessionError::EmptyConversationId => {
                ErrorClass::Invalid
            }
        }
    }

    fn not_allowed(&self) -> Option<&NotAllowed> {
        match self {
            SessionError::NotAllowed(e) => Some(e),
            _ => None,
        }
    }

    fn field(&self) -> Option<&str> {
        match self {
            SessionError::NotAllowed(_) => None,
            SessionError::InvalidSeconds { field, .. } => Some(field),
            SessionError::EmptyConversationId => Some("conversation_id"),
        }
    }
}

/// Checks a timeout or period: finite and not negative.
pub(crate) fn check_seconds(field: &'static str, value: f64) -> Result<f64, SessionError> {
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(SessionError::InvalidSeconds { field, value })
    }
}

/// An optional string that keeps its buffer while unset, so setting it again
/// does not allocate (a tour id, set and cleared as tours start and end).
#[derive(Clone, Default)]
pub(crate) struct TextSlot {
    text: String,
    set: bool,
}

impl TextSlot {
    pub(crate) fn from_option(value: Option<String>) -> Self {
        match value {
            Some(text) => Self { text, set: true },
            None => Self::default(),
        }
    }

    pub(crate) fn get(&self) -> Option<&str> {
        self.set.then_some(self.text.as_str())
    }

    fn set(&mut self, value: &str) {
        self.text.clear();
        self.text.push_str(value);
        self.set = true;
    }

    fn clear(&mut self) {
        self.set = false;
    }
}

impl PartialEq for TextSlot {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl fmt::Debug for TextSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.get().fmt(f)
    }
}

/// One live session's assistance state. See the module docs.
///
/// Changed through [`Machine::decide`](crate::Machine::decide) with a
/// [`SessionCommand`](crate::session::SessionCommand); a refused command
/// leaves it exactly as it was:
///
/// ```
/// use parlance_core::session::{
///     AssistState, SessionCommand, SessionError, SessionEvent, SessionId, SessionState,
///     TourCatalog,
/// };
/// use parlance_core::{ErrorClass, Machine, MachineError, ProductId, Timestamp};
///
/// let t0 = Timestamp::from_secs(1_767_225_600).expect("a date in range");
/// let mut session = SessionState::new(ProductId::parse("acme")?, SessionId::parse("s-1")?, t0)
///     .with_settings(30.0, 120.0)?;
/// let tours = TourCatalog::none();
///
/// let offer = SessionCommand::from(SessionEvent::ProactiveTrigger {
///     trigger_id: "idle-on-pricing".to_owned(),
/// });
/// let decision = session.decide(tours, &offer, t0)?;
/// assert_eq!(session.current_state(), AssistState::Proactive);
/// assert_eq!(decision.transitions[0].cause, "transition_to_proactive");
/// // Nothing happens without traffic until the timeout: the caller arms a timer.
/// assert_eq!(decision.next_deadline, Some(t0.plus_seconds(30.0)));
///
/// // Opening the chat is allowed from `thinking` only.
/// let refused = session.decide(tours, &SessionEvent::OpenChat.into(), t0).unwrap_err();
/// assert!(matches!(refused, SessionError::NotAllowed(_)));
/// assert_eq!(refused.class(), ErrorClass::NotAllowed);
/// assert_eq!(session.current_state(), AssistState::Proactive);
///
/// // Settings are checked when they are set.
/// assert!(SessionState::new(ProductId::parse("acme")?, SessionId::parse("s-2")?, t0)
///     .with_settings(-1.0, 60.0)
///     .is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// Stored as a versioned snapshot (`_v: 2`), decoded with every field
/// validated:
///
/// ```
/// use parlance_core::session::{DecodeError, SessionId, SessionState};
/// use parlance_core::{ProductId, Timestamp};
///
/// let t0 = Timestamp::from_secs(1_767_225_600).expect("a date in range");
/// let session = SessionState::new(ProductId::parse("acme")?, SessionId::parse("s-1")?, t0);
///
/// let text = session.to_snapshot_string();
/// assert_eq!(SessionState::from_snapshot_slice(text.as_bytes())?, session);
/// assert_eq!(SessionState::from_snapshot(&session.to_snapshot())?, session);
///
/// let mut doc = session.to_snapshot();
/// doc["current_state"] = "dozing".into();
/// let err = SessionState::from_snapshot(&doc).unwrap_err();
/// assert_eq!(err.path(), Some("current_state"));
/// assert!(matches!(SessionState::from_snapshot_slice(b"{"), Err(DecodeError::Syntax { .. })));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct SessionState {
    pub(crate) product_id: ProductId,
    pub(crate) session_id: SessionId,
    pub(crate) metadata: Map<String, Value>,
    pub(crate) current_state: AssistState,
    pub(crate) last_interaction_at: Timestamp,
    pub(crate) interaction_timeout_s: f64,
    pub(crate) cooldown_period_s: f64,
    pub(crate) visual_guidance_active: bool,
    pub(crate) active_tour_id: TextSlot,
    pub(crate) conversation_linked: bool,
    pub(crate) conversation_id: Option<String>,
    pub(crate) thinking: ThinkingState,
    pub(crate) proactive: ProactiveState,
    pub(crate) reactive: ReactiveState,
}

/// Replaces `slot` with `value`, reusing the existing buffer when there is one.
fn set_string(slot: &mut Option<String>, value: &str) {
    match slot {
        Some(s) => {
            s.clear();
            s.push_str(value);
        }
        None => *slot = Some(value.to_owned()),
    }
}

impl SessionState {
    /// A new session in `thinking`, with the default timeout (20 s) and
    /// cooldown (60 s), every clock anchored at `now`.
    pub fn new(product_id: ProductId, session_id: SessionId, now: Timestamp) -> Self {
        Self {
            product_id,
            session_id,
            metadata: Map::new(),
            current_state: AssistState::Thinking,
            last_interaction_at: now,
            interaction_timeout_s: DEFAULT_INTERACTION_TIMEOUT_S,
            cooldown_period_s: DEFAULT_COOLDOWN_PERIOD_S,
            visual_guidance_active: false,
            active_tour_id: TextSlot::default(),
            conversation_linked: false,
            conversation_id: None,
            thinking: ThinkingState::default(),
            proactive: ProactiveState::new(now),
            reactive: ReactiveState::new(now),
        }
    }

    /// Sets the session-level interaction timeout and cooldown period.
    ///
    /// # Errors
    ///
    /// [`SessionError::InvalidSeconds`] for a negative or non-finite value.
    pub fn with_settings(
        mut self,
        interaction_timeout_s: f64,
        cooldown_period_s: f64,
    ) -> Result<Self, SessionError> {
        self.interaction_timeout_s = check_seconds("interaction_timeout_s", interaction_timeout_s)?;
        self.cooldown_period_s = check_seconds("cooldown_period_s", cooldown_period_s)?;
        Ok(self)
    }

    /// Sets the free-form metadata.
    pub fn with_metadata(mut self, metadata: Map<String, Value>) -> Self {
        self.metadata = metadata;
        self
    }

    // ---- reads ---------------------------------------------------------

    /// The tenant.
    pub fn product_id(&self) -> &ProductId {
        &self.product_id
    }
    /// The session's id.
    pub fn session_id(&self) -> &SessionId {
        &self.session_id
    }
    /// Free-form metadata.
    pub fn metadata(&self) -> &Map<String, Value> {
        &self.metadata
    }
    /// The current mode.
    pub fn current_state(&self) -> AssistState {
        self.current_state
    }
    /// The last interaction: the clock the timeout rule uses.
    pub fn last_interaction_at(&self) -> Timestamp {
        self.last_interaction_at
    }
    /// Session-level interaction timeout, seconds.
    pub fn interaction_timeout_s(&self) -> f64 {
        self.interaction_timeout_s
    }
    /// Session-level cooldown period, seconds.
    pub fn cooldown_period_s(&self) -> f64 {
        self.cooldown_period_s
    }
    /// True while a tour overlay runs.
    pub fn visual_guidance_active(&self) -> bool {
        self.visual_guidance_active
    }
    /// The running tour's provider flow id.
    pub fn active_tour_id(&self) -> Option<&str> {
        self.active_tour_id.get()
    }
    /// True once a conversation is linked.
    pub fn conversation_linked(&self) -> bool {
        self.conversation_linked
    }
    /// The linked conversation.
    pub fn conversation_id(&self) -> Option<&str> {
        self.conversation_id.as_deref()
    }
    /// Cooldown bookkeeping.
    pub fn thinking(&self) -> &ThinkingState {
        &self.thinking
    }
    /// The proactive sub-record.
    pub fn proactive(&self) -> &ProactiveState {
        &self.proactive
    }
    /// The reactive sub-record.
    pub fn reactive(&self) -> &ReactiveState {
        &self.reactive
    }

    /// The timeout and cooldown in force: the active tour's (from `tours`,
    /// looked up by provider flow id) where it sets them, else the session's.
    pub fn resolved_settings(&self, tours: &TourCatalog) -> (f64, f64) {
        let tour = self
            .active_tour_id
            .get()
            .and_then(|id| tours.get_by_user_tour_id(id));
        match tour {
            Some(t) => (
                t.interaction_timeout_s
                    .unwrap_or(self.interaction_timeout_s),
                t.cooldown_period_s.unwrap_or(self.cooldown_period_s),
            ),
            None => (self.interaction_timeout_s, self.cooldown_period_s),
        }
    }

    /// `(allowed, reason)`: `(true, "ok")`, `(false, "v2_state_<state>")`
    /// outside thinking, `(false, "v2_cooldown_active")` during a cooldown.
    /// A pure read: tick first.
    pub fn can_deliver_proactive(&self) -> (bool, &'static str) {
        if self.current_state != AssistState::Thinking {
            (false, self.current_state.gate_reason())
        } else if self.thinking.cooldown_active {
            (false, "v2_cooldown_active")
        } else {
            (true, "ok")
        }
    }

    /// Where a message goes: the linked conversation, or create-and-link.
    /// The state never changes the route.
    pub fn delivery_route(&self) -> DeliveryRoute<'_> {
        match (&self.conversation_linked, self.conversation_id.as_deref()) {
            (true, Some(id)) => DeliveryRoute::SendTo(id),
            _ => DeliveryRoute::CreateAndLink,
        }
    }

    /// When the next tick can change something: the interaction timeout in
    /// the active states (the tour's while one runs), the cooldown end while
    /// one runs in thinking, else none.
    ///
    /// The timeout fires only once the elapsed time is strictly greater than
    /// the timeout, so a tick exactly at the deadline may still find nothing
    /// to do; the next tick after it will.
    pub fn next_deadline(&self, tours: &TourCatalog) -> Option<Timestamp> {
        match self.current_state {
            AssistState::Proactive | AssistState::Reactive => {
                let (timeout, _) = self.resolved_settings(tours);
                Some(self.last_interaction_at.plus_seconds(timeout))
            }
            AssistState::Thinking if self.thinking.cooldown_active => {
                let period = self
                    .thinking
                    .active_cooldown_period_s
                    .unwrap_or(self.cooldown_period_s);
                let started = self
                    .thinking
                    .cooldown_started_at
                    .unwrap_or(Timestamp::UNIX_EPOCH);
                Some(started.plus_seconds(period))
            }
            AssistState::Thinking => None,
        }
    }

    // ---- operations ----------------------------------------------------

    /// The state a tick at `now` would leave: `thinking` once the timeout in
    /// force has passed in an active state, else the current one. A pure
    /// read, so a command can be refused before anything changes.
    pub(crate) fn state_after_tick(&self, now: Timestamp, settings: (f64, f64)) -> AssistState {
        match self.current_state {
            AssistState::Thinking => AssistState::Thinking,
            _ if self.timed_out(now, settings.0) => AssistState::Thinking,
            active => active,
        }
    }

    /// True when `now - last_interaction_at` is strictly greater than
    /// `timeout`.
    fn timed_out(&self, now: Timestamp, timeout: f64) -> bool {
        now.seconds_since(self.last_interaction_at) > timeout
    }

    /// Evaluates the timers: the only exit from the active states.
    ///
    /// In `proactive_assistance` or `reactive_assistance`, when
    /// `now - last_interaction_at` is strictly greater than the timeout in
    /// force, returns to `thinking`, clears visual guidance and the tour, and
    /// starts a cooldown of the period in force. Otherwise refreshes the
    /// current sub-record's elapsed time. In `thinking`, clears a cooldown
    /// once `now - started >= period`.
    pub fn tick(&mut self, now: Timestamp, tours: &TourCatalog) -> SessionOutcome {
        let settings = self.resolved_settings(tours);
        self.tick_in(now, settings)
    }

    /// [`SessionState::tick`] with the settings in force, `(timeout,
    /// cooldown)`, already resolved.
    pub(crate) fn tick_in(&mut self, now: Timestamp, settings: (f64, f64)) -> SessionOutcome {
        match self.current_state {
            AssistState::Thinking => {
                if self.thinking.tick(now, self.cooldown_period_s) {
                    SessionOutcome {
                        cooldown: CooldownChange::Cleared,
                        ..SessionOutcome::default()
                    }
                } else {
                    SessionOutcome::default()
                }
            }
            from @ (AssistState::Proactive | AssistState::Reactive) => {
                let (timeout, cooldown) = settings;
                if self.timed_out(now, timeout) {
                    self.current_state = AssistState::Thinking;
                    self.visual_guidance_active = false;
                    self.active_tour_id.clear();
                    self.thinking.start_cooldown(now, Some(cooldown));
                    let mut out = SessionOutcome::transition(from, AssistState::Thinking, "tick");
                    out.cooldown = CooldownChange::Started;
                    out
                } else {
                    if from == AssistState::Proactive {
                        self.proactive.tick(now);
                    } else {
                        self.reactive.tick(now);
                    }
                    SessionOutcome::default()
                }
            }
        }
    }

    /// Surfaces a proactive offer: from `thinking` only. Flushes an expired
    /// cooldown first; while a cooldown still runs, changes nothing and the
    /// outcome is ignored with `v2_cooldown_active` (the seed's `false`).
    /// `trigger_id` is for the caller's audit record only.
    ///
    /// # Errors
    ///
    /// [`SessionError::NotAllowed`] outside `thinking`.
    pub fn transition_to_proactive(
        &mut self,
        trigger_id: &str,
        now: Timestamp,
    ) -> Result<SessionOutcome, SessionError> {
        let _ = trigger_id; // recorded by the caller, not by the state
        if self.current_state != AssistState::Thinking {
            return Err(SessionError::refused(
                "transition_to_proactive",
                self.current_state,
            ));
        }
        Ok(self.enter_proactive(now))
    }

    /// [`Self::transition_to_proactive`] once the state is known to be
    /// `thinking`.
    pub(crate) fn enter_proactive(&mut self, now: Timestamp) -> SessionOutcome {
        debug_assert_eq!(self.current_state, AssistState::Thinking);
        let flushed = self.thinking.tick(now, self.cooldown_period_s);
        if self.thinking.cooldown_active {
            return SessionOutcome::ignored("v2_cooldown_active");
        }
        self.last_interaction_at = now;
        self.current_state = AssistState::Proactive;
        self.proactive = ProactiveState::new(now);
        let mut out = SessionOutcome::transition(
            AssistState::Thinking,
            AssistState::Proactive,
            "transition_to_proactive",
        );
        if flushed {
            out.cooldown = CooldownChange::Cleared;
        }
        out
    }

    /// The user opened the chat: from `thinking` only, always allowed there;
    /// clears any cooldown.
    ///
    /// # Errors
    ///
    /// [`SessionError::NotAllowed`] outside `thinking`.
    pub fn transition_to_reactive(
        &mut self,
        now: Timestamp,
    ) -> Result<SessionOutcome, SessionError> {
        if self.current_state != AssistState::Thinking {
            return Err(SessionError::refused(
                "transition_to_reactive",
                self.current_state,
            ));
        }
        Ok(self.enter_reactive(now))
    }

    /// [`Self::transition_to_reactive`] once the state is known to be
    /// `thinking`.
    pub(crate) fn enter_reactive(&mut self, now: Timestamp) -> SessionOutcome {
        debug_assert_eq!(self.current_state, AssistState::Thinking);
        let had_cooldown = self.thinking.cooldown_active;
        self.last_interaction_at = now;
        self.current_state = AssistState::Reactive;
        self.reactive = ReactiveState::new(now);
        self.thinking.clear_cooldown();
        let mut out = SessionOutcome::transition(
            AssistState::Thinking,
            AssistState::Reactive,
            "transition_to_reactive",
        );
        if had_cooldown {
            out.cooldown = CooldownChange::Cleared;
        }
        out
    }

    /// Any chatbot or visual-guidance activity: resets the session clock only.
    pub fn record_any_interaction(&mut self, now: Timestamp) -> SessionOutcome {
        self.last_interaction_at = now;
        SessionOutcome::default()
    }

    /// Resets the session clock and the current sub-record's timer.
    fn record_and_reset_timer(&mut self, now: Timestamp) -> SessionOutcome {
        self.last_interaction_at = now;
        match self.current_state {
            AssistState::Proactive => self.proactive.record(now),
            AssistState::Reactive => self.reactive.record(now),
            AssistState::Thinking => {}
        }
        SessionOutcome::default()
    }

    /// The user sent a chat message.
    pub fn record_user_interaction(&mut self, now: Timestamp) -> SessionOutcome {
        self.record_and_reset_timer(now)
    }

    /// The user added an emotional reaction.
    pub fn record_reaction(&mut self, now: Timestamp) -> SessionOutcome {
        self.record_and_reset_timer(now)
    }

    /// Tour progress: counts as interaction even if the chat was never opened.
    pub fn record_tour_step(&mut self, now: Timestamp) -> SessionOutcome {
        self.record_and_reset_timer(now)
    }

    /// The user tapped a quick-reply option: resets the session clock; in
    /// `proactive_assistance` also marks `user_clicked_option` and resets the
    /// proactive timer.
    pub fn record_option_click(&mut self, now: Timestamp) -> SessionOutcome {
        self.last_interaction_at = now;
        if self.current_state == AssistState::Proactive {
            self.proactive.user_clicked_option = true;
            self.proactive.record(now);
        }
        SessionOutcome::default()
    }

    /// Starts (`active`) or ends a tour overlay. Starting sets the tour id
    /// and resets the session clock; ending clears both flag and id. In
    /// `thinking` nothing changes and the outcome is ignored with
    /// `v2_state_thinking`.
    pub fn set_visual_guidance(
        &mut self,
        active: bool,
        tour_id: Option<&str>,
        now: Timestamp,
    ) -> SessionOutcome {
        if self.current_state == AssistState::Thinking {
            return SessionOutcome::ignored("v2_state_thinking");
        }
        if active {
            self.visual_guidance_active = true;
            match tour_id {
                Some(id) => self.active_tour_id.set(id),
                None => self.active_tour_id.clear(),
            }
            self.last_interaction_at = now;
        } else {
            self.visual_guidance_active = false;
            self.active_tour_id.clear();
        }
        SessionOutcome::default()
    }

    /// A conversation was linked: `NEW` always links and overwrites the id;
    /// `REPLY_EXISTING` links only an unlinked session. Never unlinks.
    ///
    /// # Errors
    ///
    /// [`SessionError::EmptyConversationId`] for an empty id.
    pub fn on_conversation_linked(
        &mut self,
        event: ConversationEvent,
        conversation_id: &str,
    ) -> Result<SessionOutcome, SessionError> {
        if conversation_id.is_empty() {
            return Err(SessionError::EmptyConversationId);
        }
        Ok(self.link_conversation(event, conversation_id))
    }

    /// [`Self::on_conversation_linked`] once the id is known not to be empty.
    pub(crate) fn link_conversation(
        &mut self,
        event: ConversationEvent,
        conversation_id: &str,
    ) -> SessionOutcome {
        let link = match event {
            ConversationEvent::New => true,
            ConversationEvent::ReplyExisting => !self.conversation_linked,
        };
        if link {
            self.conversation_linked = true;
            set_string(&mut self.conversation_id, conversation_id);
        }
        SessionOutcome::default()
    }
}
