//! The adoption record as a [`Machine`]: its key, its commands and the one
//! decision that applies them.
//!
//! Every change to a user's record is a command: a batch of field events
//! (all or nothing), a batch of activity, a whole replacement snapshot, and
//! one command per usable LLM answer (the judge, the welcome with its gate
//! checked again on the state being changed, the follow-up after a tour, the
//! session summary). The context is the user's effective onboarding plan.
//! A change of journey is a [`Transition`] of the decision, so its audit
//! entry is written with the state or not at all.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::machine::{Command, Decision, EntityKey, EntityKind, Machine, Name, NotAllowed};
use crate::{ProductId, Timestamp, Transition};

use super::UserId;
use super::apply::{
    AdoptionEffect, AdoptionOutcome, apply_activity, apply_judge_output, apply_welcome_output,
    record_gate,
};
use super::detector::Activity;
use super::error::AdoptionError;
use super::gate::{ExplorationGateConfig, GateDecision, evaluate_hard_gate};
use super::model::{
    JourneyState, MasteryLevel, SessionIndexEntry, UserAdoptionState, WorkflowStatus,
};
use super::ordered::OrderedValue;
use super::plan::OnboardingPlan;
use super::prompts::{FollowupOutput, JudgeOutput, ParseStatus, WelcomeOutput};
use super::runner::{SummaryOutput, TourEvent, apply_followup_output, apply_summary_output};

/// Where one adoption record lives: the product, then the user.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AdoptionKey {
    /// The tenant.
    pub product_id: ProductId,
    /// The user.
    pub user_id: UserId,
}

impl AdoptionKey {
    /// The record of `user_id` in `product_id`.
    pub fn new(product_id: ProductId, user_id: UserId) -> Self {
        Self {
            product_id,
            user_id,
        }
    }
}

impl EntityKey for AdoptionKey {
    fn product_id(&self) -> &ProductId {
        &self.product_id
    }

    fn entity_id(&self) -> Cow<'_, str> {
        Cow::Borrowed(self.user_id.as_str())
    }
}

/// One change to a user's adoption state, as a batch of events lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub enum AdoptionEvent {
    /// Sets the journey (a change is a transition caused by
    /// `set_journey_state`).
    SetJourneyState {
        /// The new journey.
        state: JourneyState,
    },
    /// Replaces the mastery (the rating is clamped to 0..=10, truncated).
    SetMastery {
        /// 0 to 10.
        rating: f64,
        /// The level.
        level: MasteryLevel,
        /// Why.
        #[serde(default)]
        description: String,
    },
    /// Appends features not seen yet.
    RecordDiscoveredFeatures {
        /// The features (trimmed, blanks ignored).
        features: Vec<String>,
    },
    /// Creates or updates a workflow's progress (source `manual` unless
    /// given).
    UpsertWorkflowProgress {
        /// The workflow (not blank).
        workflow_id: String,
        /// Its status.
        status: WorkflowStatus,
        /// 0 to 1 (clamped).
        confidence: f64,
        /// Why; empty keeps the previous text.
        #[serde(default)]
        evidence: String,
        /// Who says so.
        #[serde(default)]
        source: Option<String>,
    },
    /// Creates or updates a step of a workflow that has progress.
    UpsertStepProgress {
        /// The workflow (must have progress).
        workflow_id: String,
        /// The step (not blank).
        step_id: String,
        /// Its status.
        status: WorkflowStatus,
        /// 0 to 1 (clamped).
        confidence: f64,
        /// Why; empty keeps the previous text.
        #[serde(default)]
        evidence: String,
    },
    /// A welcome was sent.
    MarkWelcomed,
    /// The judge ran.
    MarkJudged,
    /// Onboarding is complete (stamped once).
    MarkOnboardingComplete,
    /// Sets the live session (blank clears it).
    SetCurrentSession {
        /// The session.
        session_id: String,
    },
    /// Appends a session to the index.
    RecordSession {
        /// The session (not blank).
        session_id: String,
        /// 1 for the first session.
        session_number: u64,
        /// When it started, epoch seconds.
        started_at: f64,
    },
    /// Replaces the metadata.
    SetMetadata {
        /// The new metadata.
        metadata: Map<String, Value>,
    },
}

/// What may be asked of a user's adoption record.
///
/// Tagged by `command` on the wire. A batch refused anywhere changes
/// nothing (see [`UserAdoptionState`] for a whole decision):
///
/// ```
/// use parlance_core::adoption::{
///     AdoptionCommand, AdoptionError, AdoptionEvent, JourneyState, OnboardingPlan,
///     UserAdoptionState, UserId,
/// };
/// use parlance_core::{Command, Machine, Timestamp};
///
/// let t0 = Timestamp::from_secs(1_767_225_600).expect("a date in range");
/// let mut user = UserAdoptionState::new(UserId::parse("u-42")?, Default::default(), t0);
/// let before = user.clone();
///
/// let batch = AdoptionCommand::Events {
///     events: vec![
///         AdoptionEvent::SetJourneyState { state: JourneyState::Onboarded },
///         AdoptionEvent::RecordSession {
///             session_id: " ".to_owned(), // blank: refused
///             session_number: 1,
///             started_at: 1_767_225_600.0,
///         },
///     ],
///     metadata: None,
/// };
/// assert_eq!(batch.name(), "events");
///
/// let err = user.decide(&OnboardingPlan::default(), &batch, t0).unwrap_err();
/// assert!(matches!(err, AdoptionError::Event { index: 1, .. }));
/// assert_eq!(err.to_string(), "events[1]: session_id must not be blank");
/// assert_eq!(user, before); // the first event was not applied either
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum AdoptionCommand {
    /// Field events applied in order, all or nothing. Creates the record
    /// (with `metadata`) when the user has none.
    Events {
        /// The events.
        events: Vec<AdoptionEvent>,
        /// Metadata for a user seen for the first time.
        #[serde(default)]
        metadata: Option<Map<String, Value>>,
    },
    /// A batch of the user's actions, run through the plan's detector.
    /// Creates the record (with `metadata`) when the user has none.
    Activity {
        /// The actions, oldest first.
        #[serde(default)]
        actions: Vec<Activity>,
        /// Features the user discovered.
        #[serde(default)]
        discovered_features: Vec<String>,
        /// Metadata for a user seen for the first time.
        #[serde(default)]
        metadata: Option<Map<String, Value>>,
    },
    /// Replaces the whole state with a snapshot (`_v: 1`, the reference
    /// layout) of the same user. Creates the record when the user has none.
    PutState {
        /// The snapshot, maps in document order.
        state: OrderedValue,
    },
    /// A usable answer of the adoption judge: journey and mastery when
    /// stated, and `last_judged_at`.
    JudgeAdoption {
        /// The parsed answer.
        answer: JudgeOutput,
    },
    /// A usable answer of the onboarding welcome, recorded only if the
    /// explore-first gate still passes on the state being changed.
    OnboardingWelcome {
        /// Seconds the user has spent on the app (finite, not negative).
        seconds_on_app: f64,
        /// Distinct features the caller measured; by default the larger of
        /// the recorded figure and the number of discovered features.
        #[serde(default)]
        distinct_features_seen: Option<u64>,
        /// The gate's thresholds.
        #[serde(default)]
        config: ExplorationGateConfig,
        /// The parsed answer.
        answer: WelcomeOutput,
    },
    /// A usable answer of the follow-up after a tour of a plan workflow,
    /// recorded with the tour's outcome.
    OnboardingFollowup {
        /// The tour's workflow (one of the plan's).
        workflow_id: String,
        /// How the tour ended.
        event: TourEvent,
        /// Where an abandoned tour stopped.
        #[serde(default)]
        abandoned_at_step: Option<String>,
        /// The parsed answer.
        answer: FollowupOutput,
    },
    /// A usable session summary, recorded with the session it summarises.
    SessionSummary {
        /// The session, as the index records it.
        session: SessionIndexEntry,
        /// The parsed answer.
        answer: SummaryOutput,
    },
}

impl AdoptionCommand {
    /// The cause recorded on a journey change this command makes.
    fn journey_cause(&self) -> &'static str {
        match self {
            AdoptionCommand::Events { .. } | AdoptionCommand::Activity { .. } => {
                "set_journey_state"
            }
            other => other.name(),
        }
    }
}

impl Command for AdoptionCommand {
    fn name(&self) -> &'static str {
        match self {
            AdoptionCommand::Events { .. } => "events",
            AdoptionCommand::Activity { .. } => "activity",
            AdoptionCommand::PutState { .. } => "put_state",
            AdoptionCommand::JudgeAdoption { .. } => "judge_adoption",
            AdoptionCommand::OnboardingWelcome { .. } => "onboarding_welcome",
            AdoptionCommand::OnboardingFollowup { .. } => "onboarding_followup",
            AdoptionCommand::SessionSummary { .. } => "session_summary",
        }
    }
}

fn nonblank(field: &'static str, v: &str) -> Result<(), AdoptionError> {
    if v.trim().is_empty() {
        Err(AdoptionError::Blank { field })
    } else {
        Ok(())
    }
}

fn non_negative(field: &'static str, v: f64) -> Result<(), AdoptionError> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(AdoptionError::Negative { field })
    }
}

/// A replacement snapshot of `user`, decoded at `now`.
fn replacement(
    user: &UserId,
    snapshot: &OrderedValue,
    now: Timestamp,
) -> Result<UserAdoptionState, AdoptionError> {
    let state =
        UserAdoptionState::from_ordered_snapshot(snapshot, now).map_err(AdoptionError::Snapshot)?;
    if state.user_id != *user {
        return Err(AdoptionError::OtherUser);
    }
    Ok(state)
}

/// The decision of an applied answer: its effects (journey changes are
/// added by the caller).
fn answered(outcome: AdoptionOutcome) -> Decision<UserAdoptionState> {
    let mut d = Decision::changed();
    d.effects = outcome.effects;
    d
}

impl UserAdoptionState {
    /// The explore-first gate for a welcome at `now`, as
    /// [`AdoptionCommand::OnboardingWelcome`] checks it: the inputs first
    /// (`seconds_on_app` and the config's durations finite and not
    /// negative), then [`evaluate_hard_gate`] with the distinct features
    /// [`UserAdoptionState::distinct_features_seen`] counts. Returns the
    /// gate's decision and that count. A runner asks this before calling
    /// the model, so a closed gate or a bad input never costs a call.
    ///
    /// # Errors
    ///
    /// An input that is not a finite, non-negative number (`Invalid`,
    /// naming the field).
    pub fn welcome_gate(
        &self,
        seconds_on_app: f64,
        distinct_features_seen: Option<u64>,
        config: &ExplorationGateConfig,
        now: Timestamp,
    ) -> Result<(GateDecision, u64), AdoptionError> {
        non_negative("seconds_on_app", seconds_on_app)?;
        non_negative("config.min_seconds_on_app", config.min_seconds_on_app)?;
        non_negative("config.welcome_cooldown_s", config.welcome_cooldown_s)?;
        let distinct = self.distinct_features_seen(distinct_features_seen);
        let gate = evaluate_hard_gate(self, now, seconds_on_app, distinct, config);
        Ok((gate, distinct))
    }

    /// Applies one event (the state may be partly changed on `Err`: the
    /// batch runs on a copy).
    fn apply_event(&mut self, ev: &AdoptionEvent, now: Timestamp) -> Result<(), AdoptionError> {
        match ev {
            AdoptionEvent::SetJourneyState { state } => {
                self.set_journey_state(*state, now);
            }
            AdoptionEvent::SetMastery {
                rating,
                level,
                description,
            } => self.set_mastery(*rating, *level, description, now)?,
            AdoptionEvent::RecordDiscoveredFeatures { features } => {
                self.record_discovered_features(features.iter().map(String::as_str), now);
            }
            AdoptionEvent::UpsertWorkflowProgress {
                workflow_id,
                status,
                confidence,
                evidence,
                source,
            } => {
                nonblank("workflow_id", workflow_id)?;
                self.onboarding.upsert_workflow_progress(
                    workflow_id,
                    *status,
                    *confidence,
                    evidence,
                    source.as_deref().or(Some("manual")),
                    now,
                )?;
            }
            AdoptionEvent::UpsertStepProgress {
                workflow_id,
                step_id,
                status,
                confidence,
                evidence,
            } => {
                nonblank("step_id", step_id)?;
                let wp = self
                    .onboarding
                    .workflow_progress
                    .get_mut(workflow_id)
                    .ok_or_else(|| AdoptionError::NoWorkflowProgress {
                        workflow_id: workflow_id.clone(),
                    })?;
                wp.upsert_step_progress(step_id, *status, *confidence, evidence, now)?;
            }
            AdoptionEvent::MarkWelcomed => self.mark_welcomed(now),
            AdoptionEvent::MarkJudged => self.mark_judged(now),
            AdoptionEvent::MarkOnboardingComplete => {
                self.onboarding.mark_onboarding_complete(now);
            }
            AdoptionEvent::SetCurrentSession { session_id } => {
                self.set_current_session(session_id, now);
            }
            AdoptionEvent::RecordSession {
                session_id,
                session_number,
                started_at,
            } => {
                nonblank("session_id", session_id)?;
                let started_at = Timestamp::from_epoch_seconds(*started_at).map_err(|reason| {
                    AdoptionError::BadTimestamp {
                        field: "started_at",
                        reason,
                    }
                })?;
                self.record_session(
                    SessionIndexEntry {
                        session_id: session_id.clone(),
                        session_number: *session_number,
                        started_at,
                        captured_at: now,
                    },
                    now,
                );
            }
            AdoptionEvent::SetMetadata { metadata } => {
                self.metadata = metadata.clone();
            }
        }
        Ok(())
    }

    /// Applies a batch of events, all or nothing.
    fn apply_events(
        &mut self,
        events: &[AdoptionEvent],
        now: Timestamp,
    ) -> Result<(), AdoptionError> {
        let mut next = self.clone();
        for (index, ev) in events.iter().enumerate() {
            next.apply_event(ev, now)
                .map_err(|e| AdoptionError::Event {
                    index,
                    error: Box::new(e),
                })?;
        }
        *self = next;
        Ok(())
    }

    /// Decides `command` without the journey's transition.
    fn decide_change(
        &mut self,
        plan: &OnboardingPlan,
        command: &AdoptionCommand,
        now: Timestamp,
    ) -> Result<Decision<Self>, AdoptionError> {
        match command {
            AdoptionCommand::Events { events, .. } => {
                self.apply_events(events, now)?;
                Ok(Decision::changed())
            }
            AdoptionCommand::Activity {
                actions,
                discovered_features,
                ..
            } => {
                let detected = apply_activity(self, plan, actions, discovered_features, now);
                let mut d = Decision::changed();
                d.effect(AdoptionEffect::Detected(detected));
                Ok(d)
            }
            AdoptionCommand::PutState { state } => {
                *self = replacement(&self.user_id, state, now)?;
                Ok(Decision::changed())
            }
            AdoptionCommand::JudgeAdoption { answer } => {
                if answer.status != ParseStatus::Parsed {
                    return Ok(Decision::unchanged());
                }
                Ok(answered(apply_judge_output(self, answer, now)))
            }
            AdoptionCommand::OnboardingWelcome {
                seconds_on_app,
                distinct_features_seen,
                config,
                answer,
            } => {
                let (gate, distinct) =
                    self.welcome_gate(*seconds_on_app, *distinct_features_seen, config, now)?;
                if !gate.passed {
                    return Err(NotAllowed::new(command.name(), self.state_name())
                        .because(gate.reason.code())
                        .into());
                }
                // The recorded figure is never lowered.
                let seen = distinct.max(self.onboarding.distinct_features_seen);
                record_gate(self, &gate, seen);
                Ok(answered(apply_welcome_output(self, answer, plan, now)))
            }
            AdoptionCommand::OnboardingFollowup {
                workflow_id,
                event,
                abandoned_at_step,
                answer,
            } => {
                if plan.get(workflow_id).is_none() {
                    return Err(AdoptionError::NotInPlan {
                        workflow_id: workflow_id.clone(),
                    });
                }
                if answer.status != ParseStatus::Parsed {
                    return Ok(Decision::unchanged());
                }
                Ok(answered(apply_followup_output(
                    self,
                    plan,
                    workflow_id,
                    *event,
                    abandoned_at_step.as_deref(),
                    answer,
                    now,
                )))
            }
            AdoptionCommand::SessionSummary { session, answer } => {
                nonblank("session_id", &session.session_id)?;
                if session.started_at > now {
                    return Err(AdoptionError::InTheFuture {
                        field: "started_at",
                    });
                }
                if answer.status != ParseStatus::Parsed {
                    return Ok(Decision::unchanged());
                }
                apply_summary_output(self, session.clone(), answer, now);
                Ok(Decision::changed())
            }
        }
    }
}

impl Machine for UserAdoptionState {
    type Key = AdoptionKey;
    type Command = AdoptionCommand;
    type Context = OnboardingPlan;
    type Effect = AdoptionEffect;
    type Error = AdoptionError;

    const KIND: EntityKind = EntityKind::Adoption;

    /// Applies `command` with the user's effective plan. A refused command
    /// (an invalid event anywhere in a batch, a snapshot of another user, a
    /// welcome the gate no longer allows) changes nothing. An answer that
    /// did not parse changes nothing and asks for no commit. A change of
    /// journey is one transition from the journey before to the journey
    /// after, caused by `set_journey_state` (events), `put_state` or
    /// `judge_adoption`.
    fn decide(
        &mut self,
        plan: &OnboardingPlan,
        command: &AdoptionCommand,
        now: Timestamp,
    ) -> Result<Decision<Self>, AdoptionError> {
        let from = self.journey_state;
        let mut d = self.decide_change(plan, command, now)?;
        if self.journey_state != from {
            d.transition(Transition::new(
                from.as_str(),
                self.journey_state.as_str(),
                command.journey_cause(),
            ));
        }
        Ok(d)
    }

    /// Events and activity create a fresh record (with their metadata) and
    /// apply themselves to it; a snapshot creates the record it describes.
    /// LLM answers apply only to an existing record (`Ok(None)`).
    fn create(
        key: &AdoptionKey,
        plan: &OnboardingPlan,
        command: &AdoptionCommand,
        now: Timestamp,
    ) -> Result<Option<(Self, Decision<Self>)>, AdoptionError> {
        let metadata = match command {
            AdoptionCommand::Events { metadata, .. }
            | AdoptionCommand::Activity { metadata, .. } => metadata.clone().unwrap_or_default(),
            AdoptionCommand::PutState { state } => {
                let state = replacement(&key.user_id, state, now)?;
                return Ok(Some((state, Decision::changed())));
            }
            AdoptionCommand::JudgeAdoption { .. }
            | AdoptionCommand::OnboardingWelcome { .. }
            | AdoptionCommand::OnboardingFollowup { .. }
            | AdoptionCommand::SessionSummary { .. } => return Ok(None),
        };
        let mut state = UserAdoptionState::new(key.user_id.clone(), metadata, now);
        let d = state.decide(plan, command, now)?;
        Ok(Some((state, d)))
    }

    /// The adoption record has no timers.
    fn next_deadline(&self, _plan: &OnboardingPlan) -> Option<Timestamp> {
        None
    }

    /// The journey (`onboarding` or `onboarded`).
    fn state_name(&self) -> Name {
        Cow::Borrowed(self.journey_state.as_str())
    }
}
