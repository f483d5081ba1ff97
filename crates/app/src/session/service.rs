//! Each event is load-or-create, `tick(now)`, apply, save; retried on a
//! version conflict, with the transitions appended to the audit log in the
//! same save.

use parlance_core::session::{
    AssistState, ConversationEvent, CooldownChange, SessionError, SessionId, SessionOutcome,
    SessionState,
};
use parlance_core::{ProductId, Timestamp};
use parlance_ports::{AuditEntry, PortError, SessionSave};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::state::AppState;

/// Attempts of load -> apply -> save before a request gives up with 503.
pub const MAX_ATTEMPTS: usize = 16;

/// Waits a random time before retry `attempt` (1-based), up to a ceiling
/// doubling from 1 ms to 32 ms, so racing writers spread out.
async fn backoff(attempt: usize) {
    let ceiling_us = 1_000u64 << attempt.min(5);
    let jitter = getrandom::u64().unwrap_or(ceiling_us / 2) % ceiling_us;
    tokio::time::sleep(std::time::Duration::from_micros(jitter)).await;
}

/// An event sent to a session (`POST .../events`), tagged by `type`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
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

    /// Applies the event to `s` at `now`.
    fn apply(&self, s: &mut SessionState, now: Timestamp) -> Result<SessionOutcome, SessionError> {
        match self {
            SessionEvent::ProactiveTrigger { trigger_id } => {
                s.transition_to_proactive(trigger_id, now)
            }
            SessionEvent::OpenChat => s.transition_to_reactive(now),
            SessionEvent::UserMessage => Ok(s.record_user_interaction(now)),
            SessionEvent::OptionClick => Ok(s.record_option_click(now)),
            SessionEvent::Reaction => Ok(s.record_reaction(now)),
            SessionEvent::TourStep => Ok(s.record_tour_step(now)),
            SessionEvent::VisualGuidance { active, tour_id } => {
                Ok(s.set_visual_guidance(*active, tour_id.as_deref(), now))
            }
            SessionEvent::ConversationLinked {
                event,
                conversation_id,
            } => s.on_conversation_linked(*event, conversation_id),
        }
    }

    /// Checks what can be checked without the session, so a bad event
    /// neither creates nor loads one.
    fn validate(&self) -> Result<(), SessionError> {
        match self {
            SessionEvent::ConversationLinked {
                conversation_id, ..
            } if conversation_id.is_empty() => Err(SessionError::EmptyConversationId),
            _ => Ok(()),
        }
    }

    /// Audit payload: the event's identifying detail (never free text).
    fn payload(&self) -> Value {
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

/// What an applied event did.
#[derive(Debug, Clone, PartialEq)]
pub struct EventApplied {
    /// The event type.
    pub event: &'static str,
    /// What the tick before the event did (a timeout, a cooldown ending).
    pub tick: SessionOutcome,
    /// What the event did.
    pub result: SessionOutcome,
    /// The session after both, as saved.
    pub session: SessionState,
    /// The version saved.
    pub version: i64,
}

/// Why the service refused or failed an event.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The event does not fit the state; `session` is the current state
    /// (ticked and saved).
    #[error("{error}")]
    Machine {
        /// The machine's refusal.
        error: SessionError,
        /// The session as it now is.
        session: Box<SessionState>,
    },
    /// The event itself is invalid, whatever the state.
    #[error("{error}")]
    Invalid {
        /// Why.
        error: SessionError,
    },
    /// A port failed.
    #[error("{0}")]
    Port(#[from] PortError),
    /// Every attempt lost a save race.
    #[error("gave up after {attempts} conflicting saves")]
    Contended {
        /// How many attempts were made.
        attempts: usize,
    },
}

/// True when a tick did something worth saving: a timeout or a cooldown end.
fn ticked(tick: &SessionOutcome) -> bool {
    tick.changed_state() || tick.cooldown != CooldownChange::Unchanged
}

fn audit_entry(
    s: &SessionState,
    out: &SessionOutcome,
    now: Timestamp,
    payload: &Value,
) -> Option<AuditEntry> {
    let tr = out.transition.as_ref()?;
    Some(AuditEntry {
        product_id: s.product_id().clone(),
        entity_kind: "session".to_owned(),
        entity_id: s.session_id().as_str().to_owned(),
        from: Some(tr.from.as_str().to_owned()),
        to: tr.to.as_str().to_owned(),
        cause: tr.cause.to_owned(),
        at: now,
        payload: payload.clone(),
    })
}

/// Applies `event` to the session (created on first sight): tick, apply,
/// save, retried on conflict up to [`MAX_ATTEMPTS`] times.
///
/// # Errors
///
/// [`ServiceError::Machine`] when the event does not fit the state (the
/// tick before it is still saved), a port error, or
/// [`ServiceError::Contended`].
pub async fn apply_event(
    app: &AppState,
    product_id: &ProductId,
    session_id: &SessionId,
    event: &SessionEvent,
) -> Result<EventApplied, ServiceError> {
    event
        .validate()
        .map_err(|error| ServiceError::Invalid { error })?;
    let tours = app.tours.get(product_id).await?;
    let payload = event.payload();
    let tick_payload = json!({"event": "tick"});
    for attempt in 0..MAX_ATTEMPTS {
        if attempt > 0 {
            backoff(attempt).await;
        }
        let now = app.clock.now();
        let stored = app
            .sessions
            .get_or_create(product_id, session_id, now)
            .await?;
        let mut s = stored.state;
        let tick = s.tick(now, &tours);
        let applied = event.apply(&mut s, now);
        let result = match applied {
            Ok(out) => out,
            Err(error) => {
                if !ticked(&tick) {
                    // A refused event changes nothing; there is nothing to save.
                    return Err(ServiceError::Machine {
                        error,
                        session: Box::new(s),
                    });
                }
                let audit: Vec<AuditEntry> = audit_entry(&s, &tick, now, &tick_payload)
                    .into_iter()
                    .collect();
                let save = SessionSave {
                    state: &s,
                    expected_version: stored.version,
                    next_deadline: s.next_deadline(&tours),
                    audit: &audit,
                };
                match app.sessions.save(save).await {
                    Ok(_) => {}
                    Err(e) if e.is_conflict() => continue,
                    Err(e) => return Err(e.into()),
                }
                return Err(ServiceError::Machine {
                    error,
                    session: Box::new(s),
                });
            }
        };
        if result.ignored.is_some() && !ticked(&tick) {
            // Ignored in thinking with nothing to tick: the state is as stored.
            return Ok(EventApplied {
                event: event.kind(),
                tick,
                result,
                session: s,
                version: stored.version,
            });
        }
        let audit: Vec<AuditEntry> = audit_entry(&s, &tick, now, &tick_payload)
            .into_iter()
            .chain(audit_entry(&s, &result, now, &payload))
            .collect();
        let save = SessionSave {
            state: &s,
            expected_version: stored.version,
            next_deadline: s.next_deadline(&tours),
            audit: &audit,
        };
        let version = match app.sessions.save(save).await {
            Ok(v) => v,
            Err(e) if e.is_conflict() => continue,
            Err(e) => return Err(e.into()),
        };
        return Ok(EventApplied {
            event: event.kind(),
            tick,
            result,
            session: s,
            version,
        });
    }
    Err(ServiceError::Contended {
        attempts: MAX_ATTEMPTS,
    })
}

/// The stored session ticked to now, saved when the tick changed anything
/// (so a timeout is recorded once), or `None` when there is no session.
///
/// # Errors
///
/// A port error, or [`ServiceError::Contended`].
pub async fn load_ticked(
    app: &AppState,
    product_id: &ProductId,
    session_id: &SessionId,
) -> Result<Option<(SessionState, i64)>, ServiceError> {
    let tours = app.tours.get(product_id).await?;
    let payload = json!({"event": "tick"});
    for attempt in 0..MAX_ATTEMPTS {
        if attempt > 0 {
            backoff(attempt).await;
        }
        let now = app.clock.now();
        let Some(stored) = app.sessions.get(product_id, session_id).await? else {
            return Ok(None);
        };
        let mut s = stored.state;
        let tick = s.tick(now, &tours);
        if !ticked(&tick) {
            // At most the elapsed time was refreshed: nothing worth a write.
            return Ok(Some((s, stored.version)));
        }
        let audit: Vec<AuditEntry> = audit_entry(&s, &tick, now, &payload).into_iter().collect();
        let save = SessionSave {
            state: &s,
            expected_version: stored.version,
            next_deadline: s.next_deadline(&tours),
            audit: &audit,
        };
        match app.sessions.save(save).await {
            Ok(v) => return Ok(Some((s, v))),
            Err(e) if e.is_conflict() => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(ServiceError::Contended {
        attempts: MAX_ATTEMPTS,
    })
}

/// `(allowed, reason)` for a proactive offer, after a tick. A session never
/// seen is a fresh one in thinking: allowed.
///
/// # Errors
///
/// As [`load_ticked`].
pub async fn gate(
    app: &AppState,
    product_id: &ProductId,
    session_id: &SessionId,
) -> Result<(bool, &'static str, Option<AssistState>), ServiceError> {
    Ok(match load_ticked(app, product_id, session_id).await? {
        Some((s, _)) => {
            let (allowed, reason) = s.can_deliver_proactive();
            (allowed, reason, Some(s.current_state()))
        }
        None => (true, "ok", None),
    })
}
