//! The per-user adoption record: two axes, onboarding progress, lifecycle
//! timestamps and a bounded session index, with its mutators.

use serde::{Deserialize, Serialize};

use crate::Timestamp;

use super::{AdoptionError, UserId};

/// At most this many entries are kept in the session index (oldest dropped).
pub const SESSION_INDEX_CAP: usize = 50;

macro_rules! wire_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $wire:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
        pub enum $name {
            $($(#[$vmeta])* #[serde(rename = $wire)] $variant),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The wire value.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $wire),+
                }
            }

            /// Exact, case-sensitive match on the wire value.
            pub fn from_wire(s: &str) -> Option<Self> {
                match s {
                    $($wire => Some($name::$variant),)+
                    _ => None,
                }
            }

            /// The wire value, or the default for anything else (the reference's
            /// enum coercion: unknown values degrade to the safe default).
            pub fn coerce(s: &str) -> Self {
                Self::from_wire(s).unwrap_or_default()
            }
        }

        // By hand: the derived schema would not see the variants' wire
        // names through this macro and would list the Rust names.
        #[cfg(feature = "openapi")]
        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                utoipa::openapi::ObjectBuilder::new()
                    .schema_type(utoipa::openapi::schema::Type::String)
                    .enum_values(Some($name::ALL.iter().map(|v| v.as_str())))
                    .into()
            }
        }

        #[cfg(feature = "openapi")]
        impl utoipa::ToSchema for $name {}

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

wire_enum!(
    /// Coarse lifecycle stage.
    JourneyState {
        /// Still learning the product (the default).
        #[default]
        Onboarding = "onboarding",
        /// Done with onboarding.
        Onboarded = "onboarded",
    }
);

wire_enum!(
    /// Competence, ordered low to high.
    MasteryLevel {
        /// The default.
        #[default]
        Novice = "novice",
        /// Knows a little.
        Beginner = "beginner",
        /// Knows the basics.
        Intermediate = "intermediate",
        /// Uses the product well.
        Proficient = "proficient",
        /// Uses everything.
        PowerUser = "power_user",
    }
);

wire_enum!(
    /// Progress of one onboarding workflow or step.
    WorkflowStatus {
        /// The default.
        #[default]
        NotStarted = "not_started",
        /// Started, not finished.
        InProgress = "in_progress",
        /// Finished.
        Completed = "completed",
    }
);

/// A map that keeps insertion order (the derived id lists follow it).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OrderedMap<V>(Vec<(String, V)>);

impl<V> OrderedMap<V> {
    /// An empty map.
    pub fn new() -> Self {
        Self(Vec::new())
    }

    /// A map of `entries`, whose keys the caller knows to be distinct.
    pub(crate) fn from_distinct(entries: Vec<(String, V)>) -> Self {
        Self(entries)
    }

    /// The value under `key`.
    pub fn get(&self, key: &str) -> Option<&V> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The value under `key`, mutably.
    pub fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        self.0.iter_mut().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Inserts or replaces (a replaced key keeps its position).
    pub fn insert(&mut self, key: String, value: V) {
        match self.get_mut(&key) {
            Some(slot) => *slot = value,
            None => self.0.push((key, value)),
        }
    }

    /// Entries in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &V)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Keys in insertion order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(k, _)| k.as_str())
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The value under `key`, inserted with `make` first when absent.
    pub fn entry_or_insert_with(&mut self, key: &str, make: impl FnOnce() -> V) -> &mut V {
        let idx = match self.0.iter().position(|(k, _)| k == key) {
            Some(i) => i,
            None => {
                self.0.push((key.to_owned(), make()));
                self.0.len() - 1
            }
        };
        &mut self.0[idx].1
    }
}

impl<V: Serialize> Serialize for OrderedMap<V> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl<V> FromIterator<(String, V)> for OrderedMap<V> {
    fn from_iter<I: IntoIterator<Item = (String, V)>>(iter: I) -> Self {
        let mut m = OrderedMap::new();
        for (k, v) in iter {
            m.insert(k, v);
        }
        m
    }
}

/// Rating (0 to 10) plus level and a one-sentence description.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Mastery {
    /// 0 to 10.
    pub rating: u8,
    /// The level (independent of the rating, as in the reference).
    pub level: MasteryLevel,
    /// Why.
    pub description: String,
}

/// Clamps a finite number into `[low, high]`; NaN and infinities are rejected
/// (the reference maps NaN to the upper bound).
pub(crate) fn clamp_finite(
    x: f64,
    low: f64,
    high: f64,
    field: &'static str,
) -> Result<f64, AdoptionError> {
    if !x.is_finite() {
        return Err(AdoptionError::NotFinite { field });
    }
    Ok(x.clamp(low, high))
}

/// A rating as stored: clamped to 0..=10, then truncated toward zero.
pub fn clamp_rating(rating: f64) -> Result<u8, AdoptionError> {
    // Truncation after clamping: 7.9 -> 7, -0.5 -> 0, 11.5 -> 10.
    Ok(clamp_finite(rating, 0.0, 10.0, "mastery.rating")?.trunc() as u8)
}

/// Progress of one step of a workflow.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepProgress {
    /// The step.
    pub step_id: String,
    /// Status.
    pub status: WorkflowStatus,
    /// 0 to 1.
    pub confidence: f64,
    /// Why.
    pub evidence: String,
    /// First time the step was seen completed.
    pub completed_at: Option<Timestamp>,
    /// Last evaluation.
    pub last_evaluated_at: Timestamp,
}

impl StepProgress {
    /// A new, not started entry.
    pub fn new(step_id: impl Into<String>, now: Timestamp) -> Self {
        Self {
            step_id: step_id.into(),
            status: WorkflowStatus::NotStarted,
            confidence: 0.0,
            evidence: String::new(),
            completed_at: None,
            last_evaluated_at: now,
        }
    }
}

/// The evolving belief about one target workflow.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkflowProgress {
    /// The workflow (normally the map key).
    pub workflow_id: String,
    /// Status.
    pub status: WorkflowStatus,
    /// 0 to 1.
    pub confidence: f64,
    /// Why.
    pub evidence: String,
    /// Who said so: `tour`, `activity`, `judge`, `followup`, `manual`,
    /// `unknown` or any other non-blank text.
    pub source: String,
    /// When the entry was created.
    pub first_detected_at: Option<Timestamp>,
    /// First time the workflow was seen completed (never cleared).
    pub completed_at: Option<Timestamp>,
    /// Last evaluation.
    pub last_evaluated_at: Timestamp,
    /// Per-step progress.
    pub steps: OrderedMap<StepProgress>,
}

/// The source used when none is given.
pub const UNKNOWN_SOURCE: &str = "unknown";

impl WorkflowProgress {
    /// A new, not started entry detected at `now`.
    pub fn new(workflow_id: impl Into<String>, now: Timestamp) -> Self {
        Self {
            workflow_id: workflow_id.into(),
            status: WorkflowStatus::NotStarted,
            confidence: 0.0,
            evidence: String::new(),
            source: UNKNOWN_SOURCE.to_owned(),
            first_detected_at: Some(now),
            completed_at: None,
            last_evaluated_at: now,
            steps: OrderedMap::new(),
        }
    }

    /// Ids of completed steps, in map order.
    pub fn completed_step_ids(&self) -> Vec<&str> {
        self.steps
            .iter()
            .filter(|(_, s)| s.status == WorkflowStatus::Completed)
            .map(|(k, _)| k)
            .collect()
    }

    /// Creates or updates a step's progress. Confidence is clamped to
    /// `[0, 1]`; NaN and infinities are rejected; empty evidence keeps the
    /// previous text; `completed_at` is stamped the first time the step is
    /// completed.
    /// Test support for the reference replay: a record changes only
    /// through [`Machine::decide`](crate::Machine::decide).
    #[doc(hidden)]
    pub fn upsert_step_progress(
        &mut self,
        step_id: &str,
        status: WorkflowStatus,
        confidence: f64,
        evidence: &str,
        now: Timestamp,
    ) -> Result<&StepProgress, AdoptionError> {
        let confidence = clamp_finite(confidence, 0.0, 1.0, "confidence")?;
        let entry = self
            .steps
            .entry_or_insert_with(step_id, || StepProgress::new(step_id, now));
        entry.status = status;
        entry.confidence = confidence;
        if !evidence.is_empty() {
            entry.evidence = evidence.to_owned();
        }
        entry.last_evaluated_at = now;
        if status == WorkflowStatus::Completed && entry.completed_at.is_none() {
            entry.completed_at = Some(now);
        }
        Ok(entry)
    }
}

/// The latest "should I step in?" decision, kept whether or not anything was
/// sent.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepInAssessment {
    /// When it was decided.
    pub decided_at: Timestamp,
    /// Whether to speak.
    pub should_step_in: bool,
    /// The timing judgement.
    pub timing_assessment: String,
    /// Why.
    pub reason: String,
    /// Workflows suggested.
    pub suggested_workflow_ids: Vec<String>,
}

impl StepInAssessment {
    /// A "do not step in" decision at `now`.
    pub fn new(now: Timestamp) -> Self {
        Self {
            decided_at: now,
            should_step_in: false,
            timing_assessment: String::new(),
            reason: String::new(),
            suggested_workflow_ids: Vec::new(),
        }
    }
}

/// Welcome lifecycle and per-workflow progress.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OnboardingState {
    /// A welcome was sent.
    pub welcomed: bool,
    /// When exploring started.
    pub exploration_started_at: Timestamp,
    /// Distinct features seen (as last reported).
    pub distinct_features_seen: u64,
    /// The explore-first gate was passed once.
    pub explore_gate_passed: bool,
    /// Per-workflow progress, in insertion order.
    pub workflow_progress: OrderedMap<WorkflowProgress>,
    /// The latest step-in decision.
    pub last_step_in: Option<StepInAssessment>,
    /// When the agent last reasoned about stepping in.
    pub last_reasoned_at: Option<Timestamp>,
    /// When the last welcome was sent.
    pub last_welcome_at: Option<Timestamp>,
    /// Proactive messages sent so far.
    pub proactive_support_count: u64,
    /// When onboarding was completed.
    pub onboarding_completed_at: Option<Timestamp>,
    /// A handover summary.
    pub summary: Option<String>,
    /// Share of workflows completed, 0 to 1.
    pub completion_rate: f64,
}

impl OnboardingState {
    /// A fresh state: exploring since `now`.
    pub fn new(now: Timestamp) -> Self {
        Self {
            welcomed: false,
            exploration_started_at: now,
            distinct_features_seen: 0,
            explore_gate_passed: false,
            workflow_progress: OrderedMap::new(),
            last_step_in: None,
            last_reasoned_at: None,
            last_welcome_at: None,
            proactive_support_count: 0,
            onboarding_completed_at: None,
            summary: None,
            completion_rate: 0.0,
        }
    }

    fn ids_with(&self, status: WorkflowStatus) -> Vec<&str> {
        self.workflow_progress
            .iter()
            .filter(|(_, w)| w.status == status)
            .map(|(k, _)| k)
            .collect()
    }

    /// Completed workflow ids (map keys, insertion order).
    pub fn completed_workflow_ids(&self) -> Vec<&str> {
        self.ids_with(WorkflowStatus::Completed)
    }

    /// In-progress workflow ids (map keys, insertion order).
    pub fn in_progress_workflow_ids(&self) -> Vec<&str> {
        self.ids_with(WorkflowStatus::InProgress)
    }

    /// Plan ids not completed, in plan order.
    pub fn outstanding_workflow_ids<'a>(&self, plan_ids: &[&'a str]) -> Vec<&'a str> {
        let done = self.completed_workflow_ids();
        plan_ids
            .iter()
            .copied()
            .filter(|id| !done.contains(id))
            .collect()
    }

    /// True once onboarding was stamped complete.
    pub fn is_onboarding_complete(&self) -> bool {
        self.onboarding_completed_at.is_some()
    }

    /// Creates or updates a workflow's progress. A new entry is detected at
    /// `now` with the given source (or `unknown`); confidence is clamped to
    /// `[0, 1]` (NaN and infinities rejected); empty evidence and an empty
    /// source keep the previous values; `completed_at` is stamped the first
    /// time the workflow is completed and never cleared.
    /// Test support for the reference replay: a record changes only
    /// through [`Machine::decide`](crate::Machine::decide).
    #[doc(hidden)]
    pub fn upsert_workflow_progress(
        &mut self,
        workflow_id: &str,
        status: WorkflowStatus,
        confidence: f64,
        evidence: &str,
        source: Option<&str>,
        now: Timestamp,
    ) -> Result<&WorkflowProgress, AdoptionError> {
        let confidence = clamp_finite(confidence, 0.0, 1.0, "confidence")?;
        // Trimmed as the snapshot reads it back, so a stored record loads
        // as it was decided.
        let source = source.map(str::trim).filter(|s| !s.is_empty());
        let entry = self
            .workflow_progress
            .entry_or_insert_with(workflow_id, || {
                let mut w = WorkflowProgress::new(workflow_id, now);
                if let Some(s) = source {
                    w.source = s.to_owned();
                }
                w
            });
        entry.status = status;
        entry.confidence = confidence;
        if !evidence.is_empty() {
            entry.evidence = evidence.to_owned();
        }
        if let Some(s) = source {
            entry.source = s.to_owned();
        }
        entry.last_evaluated_at = now;
        if status == WorkflowStatus::Completed && entry.completed_at.is_none() {
            entry.completed_at = Some(now);
        }
        Ok(entry)
    }

    /// Records the latest step-in decision.
    /// Test support for the reference replay: a record changes only
    /// through [`Machine::decide`](crate::Machine::decide).
    #[doc(hidden)]
    pub fn record_step_in(&mut self, assessment: StepInAssessment) {
        self.last_reasoned_at = Some(assessment.decided_at);
        self.last_step_in = Some(assessment);
    }

    /// Stamps onboarding complete at `now`; false when already stamped.
    pub(crate) fn mark_onboarding_complete(&mut self, now: Timestamp) -> bool {
        if self.onboarding_completed_at.is_some() {
            return false;
        }
        self.onboarding_completed_at = Some(now);
        true
    }
}

/// One session in the user's bounded session index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionIndexEntry {
    /// The session.
    pub session_id: String,
    /// 1 for the first session.
    pub session_number: u64,
    /// When it started.
    pub started_at: Timestamp,
    /// When its snapshot was captured.
    pub captured_at: Timestamp,
}

/// Where one user is in their lifecycle, how proficient they are and how
/// onboarding is going. Keyed by `(product_id, user_id)` in storage.
///
/// Changed through [`Machine::decide`](crate::Machine::decide) with an
/// [`AdoptionCommand`](super::AdoptionCommand) and the user's effective
/// [`OnboardingPlan`](super::OnboardingPlan); the first events about a user
/// create the record:
///
/// ```
/// use parlance_core::adoption::{
///     AdoptionCommand, AdoptionKey, JourneyState, OnboardingPlan, UserAdoptionState, UserId,
///     WorkflowStatus,
/// };
/// use parlance_core::{Machine, ProductId, Timestamp};
/// use serde_json::json;
///
/// let t0 = Timestamp::from_secs(1_767_225_600).expect("a date in range");
/// let key = AdoptionKey::new(ProductId::parse("acme")?, UserId::parse("u-42")?);
/// let plan = OnboardingPlan::from_config(&json!([
///     {"workflow_id": "invite-team", "name": "Invite your team"},
/// ]))
/// .plan;
///
/// // A batch of events, all or nothing, as the API receives it.
/// let events: AdoptionCommand = serde_json::from_value(json!({
///     "command": "events",
///     "events": [
///         {"kind": "record_discovered_features", "features": ["billing"]},
///         {"kind": "upsert_workflow_progress", "workflow_id": "invite-team",
///          "status": "completed", "confidence": 0.9},
///     ],
///     "metadata": {"role": "admin"},
/// }))?;
/// let (mut user, _) = UserAdoptionState::create(&key, &plan, &events, t0)?
///     .expect("events create the record");
/// assert_eq!(user.role(), Some("admin"));
/// assert_eq!(user.discovered_features, ["billing"]);
/// assert_eq!(
///     user.onboarding.workflow_progress.get("invite-team").map(|w| w.status),
///     Some(WorkflowStatus::Completed)
/// );
///
/// // A change of journey is a transition, audited with the state.
/// let onboarded: AdoptionCommand = serde_json::from_value(json!({
///     "command": "events",
///     "events": [{"kind": "set_journey_state", "state": "onboarded"}],
/// }))?;
/// let decision = user.decide(&plan, &onboarded, t0)?;
/// assert_eq!(user.journey_state, JourneyState::Onboarded);
/// assert_eq!(decision.transitions[0].cause, "set_journey_state");
///
/// // Stored as the versioned snapshot, decoded with every field checked.
/// let text = user.to_snapshot_string();
/// assert_eq!(UserAdoptionState::from_snapshot_str(&text, t0)?, user);
/// assert!(UserAdoptionState::from_snapshot_str(r#"{"_v": 99}"#, t0).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct UserAdoptionState {
    /// The user.
    pub user_id: UserId,
    /// Schema-less identity bag; `role` is one conventional key.
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// Lifecycle stage.
    pub journey_state: JourneyState,
    /// Competence.
    pub mastery: Mastery,
    /// Features discovered, deduplicated by the mutator, order kept.
    pub discovered_features: Vec<String>,
    /// Onboarding progress.
    pub onboarding: OnboardingState,
    /// First seen.
    pub first_seen_at: Timestamp,
    /// Last change through a touching mutator.
    pub last_updated_at: Timestamp,
    /// Last judged.
    pub last_judged_at: Option<Timestamp>,
    /// Sessions recorded.
    pub sessions_count: u64,
    /// The live session.
    pub current_session_id: Option<String>,
    /// The newest sessions, at most [`SESSION_INDEX_CAP`], oldest first.
    pub sessions_index: Vec<SessionIndexEntry>,
}

impl UserAdoptionState {
    /// A fresh state first seen at `now`.
    pub fn new(
        user_id: UserId,
        metadata: serde_json::Map<String, serde_json::Value>,
        now: Timestamp,
    ) -> Self {
        Self {
            user_id,
            metadata,
            journey_state: JourneyState::Onboarding,
            mastery: Mastery::default(),
            discovered_features: Vec::new(),
            onboarding: OnboardingState::new(now),
            first_seen_at: now,
            last_updated_at: now,
            last_judged_at: None,
            sessions_count: 0,
            current_session_id: None,
            sessions_index: Vec::new(),
        }
    }

    /// `metadata.role` when it is a string; any other value is not a role.
    pub fn role(&self) -> Option<&str> {
        self.metadata.get("role").and_then(|v| v.as_str())
    }

    /// True when the journey is onboarded or onboarding was stamped complete.
    pub fn is_onboarded(&self) -> bool {
        self.journey_state == JourneyState::Onboarded
            || self.onboarding.onboarding_completed_at.is_some()
    }

    /// The distinct features the gate counts: `reported` when the caller
    /// measured it, else the larger of the recorded figure and the number of
    /// discovered features.
    pub fn distinct_features_seen(&self, reported: Option<u64>) -> u64 {
        reported.unwrap_or_else(|| {
            self.onboarding
                .distinct_features_seen
                .max(self.discovered_features.len() as u64)
        })
    }

    fn touch(&mut self, now: Timestamp) {
        self.last_updated_at = now;
    }

    /// Sets the journey; false (and no touch) when unchanged.
    pub(crate) fn set_journey_state(&mut self, new: JourneyState, now: Timestamp) -> bool {
        if self.journey_state == new {
            return false;
        }
        self.journey_state = new;
        self.touch(now);
        true
    }

    /// Replaces the mastery. The rating is clamped to 0..=10 and truncated;
    /// NaN and infinities are rejected (state unchanged).
    /// Test support for the reference replay: a record changes only
    /// through [`Machine::decide`](crate::Machine::decide).
    #[doc(hidden)]
    pub fn set_mastery(
        &mut self,
        rating: f64,
        level: MasteryLevel,
        description: &str,
        now: Timestamp,
    ) -> Result<(), AdoptionError> {
        let rating = clamp_rating(rating)?;
        self.mastery = Mastery {
            rating,
            level,
            description: description.to_owned(),
        };
        self.touch(now);
        Ok(())
    }

    /// Appends features not seen yet (trimmed, blanks ignored, order kept);
    /// returns how many were added and touches only when some were.
    /// Test support for the reference replay: a record changes only
    /// through [`Machine::decide`](crate::Machine::decide).
    #[doc(hidden)]
    pub fn record_discovered_features<'a>(
        &mut self,
        features: impl IntoIterator<Item = &'a str>,
        now: Timestamp,
    ) -> usize {
        let mut added = 0;
        for f in features {
            let f = f.trim();
            if !f.is_empty() && !self.discovered_features.iter().any(|x| x == f) {
                self.discovered_features.push(f.to_owned());
                added += 1;
            }
        }
        if added > 0 {
            self.touch(now);
        }
        added
    }

    /// A welcome was sent at `now`.
    pub(crate) fn mark_welcomed(&mut self, now: Timestamp) {
        self.mark_welcomed_at(now, now);
    }

    /// A welcome was sent at `at` (recorded at `now`).
    /// Test support for the reference replay: a record changes only
    /// through [`Machine::decide`](crate::Machine::decide).
    #[doc(hidden)]
    pub fn mark_welcomed_at(&mut self, at: Timestamp, now: Timestamp) {
        self.onboarding.welcomed = true;
        self.onboarding.last_welcome_at = Some(at);
        self.onboarding.proactive_support_count =
            self.onboarding.proactive_support_count.saturating_add(1);
        self.touch(now);
    }

    /// The judge ran at `now`.
    pub(crate) fn mark_judged(&mut self, now: Timestamp) {
        self.mark_judged_at(now, now);
    }

    /// The judge ran at `at` (recorded at `now`).
    /// Test support for the reference replay: a record changes only
    /// through [`Machine::decide`](crate::Machine::decide).
    #[doc(hidden)]
    pub fn mark_judged_at(&mut self, at: Timestamp, now: Timestamp) {
        self.last_judged_at = Some(at);
        self.touch(now);
    }

    /// Sets the handover summary (trimmed; blank clears it) and touches.
    pub(crate) fn set_summary(&mut self, summary: &str, now: Timestamp) {
        let s = summary.trim();
        self.onboarding.summary = (!s.is_empty()).then(|| s.to_owned());
        self.touch(now);
    }

    /// Sets the live session (trimmed; blank clears it).
    /// Test support for the reference replay: a record changes only
    /// through [`Machine::decide`](crate::Machine::decide).
    #[doc(hidden)]
    pub fn set_current_session(&mut self, session_id: &str, now: Timestamp) {
        let id = session_id.trim();
        self.current_session_id = (!id.is_empty()).then(|| id.to_owned());
        self.touch(now);
    }

    /// Appends a session to the index (dropping the oldest beyond the cap).
    /// Test support for the reference replay: a record changes only
    /// through [`Machine::decide`](crate::Machine::decide).
    #[doc(hidden)]
    pub fn record_session(&mut self, entry: SessionIndexEntry, now: Timestamp) {
        self.sessions_count = self.sessions_count.saturating_add(1);
        self.sessions_index.push(entry);
        let excess = self.sessions_index.len().saturating_sub(SESSION_INDEX_CAP);
        self.sessions_index.drain(..excess);
        self.touch(now);
    }

    /// The `[USER ADOPTION STATE]` block to prepend to a chat prompt: five
    /// lines, no trailing newline. The role is kept on one line (control
    /// characters become spaces) so user data cannot add prompt lines.
    pub fn to_prompt_block(&self) -> String {
        let role = match self.role() {
            Some(r) if !r.is_empty() => one_line(r),
            _ => "unknown".to_owned(),
        };
        let guidance = match self.journey_state {
            JourneyState::Onboarding => "favor step-by-step teaching and confirm basics",
            JourneyState::Onboarded => "be concise; skip basics unless asked",
        };
        format!(
            "[USER ADOPTION STATE]\nrole: {role}\njourney: {}\nmastery: {} ({}/10)\nguidance: {guidance}",
            self.journey_state, self.mastery.level, self.mastery.rating
        )
    }
}

/// Replaces control characters (newlines included) with spaces.
pub fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// The journey axis as data: the judge, an event or a replacement snapshot
/// may move a user either way; onboarding completion is stamped separately
/// and counts as onboarded for the gate.
pub const JOURNEY_TABLE: crate::TransitionTable = crate::TransitionTable {
    machine: "adoption journey",
    states: &["onboarding", "onboarded"],
    terminal: &[],
    edges: &[
        crate::Edge {
            from: "onboarding",
            to: "onboarded",
            cause: "judge_adoption",
        },
        crate::Edge {
            from: "onboarding",
            to: "onboarded",
            cause: "set_journey_state",
        },
        crate::Edge {
            from: "onboarded",
            to: "onboarding",
            cause: "judge_adoption",
        },
        crate::Edge {
            from: "onboarded",
            to: "onboarding",
            cause: "set_journey_state",
        },
        crate::Edge {
            from: "onboarding",
            to: "onboarded",
            cause: "put_state",
        },
        crate::Edge {
            from: "onboarded",
            to: "onboarding",
            cause: "put_state",
        },
    ],
};
