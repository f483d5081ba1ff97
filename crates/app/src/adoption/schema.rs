//! Schemas of the adoption snapshots the API shows. Core writes both
//! snapshots by hand as JSON values in the reference's key layout
//! (`UserAdoptionState::to_snapshot`, `SessionSnapshot::to_snapshot`); these
//! types describe those values for the API document and are never built.
//! Timestamps are seconds since the epoch.

#![allow(dead_code)] // schemas only

use parlance_core::Timestamp;
use parlance_core::adoption::{
    CompletionRateDenominator, JourneyState, MasteryLevel, UserId, WorkflowStatus,
};
use serde_json::{Map, Value};
use utoipa::ToSchema;

/// A user's adoption state (`_v: 1`, the reference's layout); `PUT
/// .../adoption` takes the same form.
#[derive(ToSchema)]
pub(super) struct AdoptionSnapshot {
    /// The snapshot format, 1.
    #[schema(example = 1)]
    _v: u32,
    user_id: UserId,
    /// The caller's metadata, kept as given (`role` decides the plan).
    metadata: Map<String, Value>,
    journey_state: JourneyState,
    mastery: MasterySnapshot,
    /// Features seen, in order, unique.
    discovered_features: Vec<String>,
    onboarding: OnboardingSnapshot,
    first_seen_at: Timestamp,
    last_updated_at: Timestamp,
    last_judged_at: Option<Timestamp>,
    sessions: SessionsSnapshot,
}

/// The mastery axis.
#[derive(ToSchema)]
pub(super) struct MasterySnapshot {
    /// 0 to 10.
    #[schema(maximum = 10)]
    rating: u8,
    level: MasteryLevel,
    /// Why.
    description: String,
}

/// Onboarding progress.
#[derive(ToSchema)]
pub(super) struct OnboardingSnapshot {
    welcomed: bool,
    exploration_started_at: Timestamp,
    distinct_features_seen: u64,
    explore_gate_passed: bool,
    /// Progress by workflow id, in the order first seen.
    workflow_progress: std::collections::BTreeMap<String, WorkflowProgressSnapshot>,
    last_step_in: Option<StepInSnapshot>,
    last_reasoned_at: Option<Timestamp>,
    last_welcome_at: Option<Timestamp>,
    proactive_support_count: u64,
    onboarding_completed_at: Option<Timestamp>,
    summary: Option<String>,
    /// Completed share of the plan, 0 to 1.
    completion_rate: f64,
}

/// One workflow's progress.
#[derive(ToSchema)]
pub(super) struct WorkflowProgressSnapshot {
    workflow_id: String,
    status: WorkflowStatus,
    /// 0 to 1.
    confidence: f64,
    evidence: String,
    /// Who said so (`manual`, `activity`, `welcome`, ...).
    source: String,
    first_detected_at: Option<Timestamp>,
    completed_at: Option<Timestamp>,
    last_evaluated_at: Timestamp,
    /// Progress by step id, in the order first seen.
    steps: std::collections::BTreeMap<String, StepProgressSnapshot>,
}

/// One step's progress.
#[derive(ToSchema)]
pub(super) struct StepProgressSnapshot {
    step_id: String,
    status: WorkflowStatus,
    /// 0 to 1.
    confidence: f64,
    evidence: String,
    completed_at: Option<Timestamp>,
    last_evaluated_at: Timestamp,
}

/// The welcome's last step-in assessment.
#[derive(ToSchema)]
pub(super) struct StepInSnapshot {
    decided_at: Timestamp,
    should_step_in: bool,
    timing_assessment: String,
    reason: String,
    suggested_workflow_ids: Vec<String>,
}

/// The user's sessions.
#[derive(ToSchema)]
pub(super) struct SessionsSnapshot {
    count: u64,
    current_session_id: Option<String>,
    /// The newest sessions summarised (at most 50), oldest first.
    index: Vec<SessionIndexSnapshot>,
}

/// One summarised session.
#[derive(ToSchema)]
pub(super) struct SessionIndexSnapshot {
    session_id: String,
    /// 1 for the first session.
    session_number: u64,
    started_at: Timestamp,
    captured_at: Timestamp,
}

/// One session's view of the user's adoption, captured for its summary
/// (`_v: 1`).
#[derive(ToSchema)]
pub(super) struct SessionSummarySnapshot {
    /// The snapshot format, 1.
    #[schema(example = 1)]
    _v: u32,
    /// Persisted flag (the record is not enforced immutable).
    _frozen: bool,
    session_id: String,
    /// 1 for the first session.
    session_number: u64,
    user_id: String,
    started_at: Timestamp,
    captured_at: Timestamp,
    /// Seconds, rounded to hundredths.
    duration_s: f64,
    journey_state: JourneyState,
    mastery: MasterySnapshot,
    proactive_support_count: u64,
    distinct_features_seen: u64,
    discovered_features: Vec<String>,
    reached_onboarding_complete: bool,
    /// Completed catalog share, rounded to 4 places.
    completion_rate: f64,
    completion_rate_denominator: CompletionRateDenominator,
    total_catalog_workflows: u64,
    completed_workflow_ids: Vec<String>,
    in_progress_workflow_ids: Vec<String>,
    /// Catalog ids without any progress entry.
    untouched_workflow_ids: Vec<String>,
    /// Progress by workflow id, copied.
    workflow_progress: std::collections::BTreeMap<String, WorkflowProgressSnapshot>,
}

/// The explore-first gate's reason code.
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
pub(crate) enum GateCode {
    AlreadyOnboarded,
    RoleNotAllowed,
    NudgeCapReached,
    WithinCooldown,
    ExploringMinTimeNotMet,
    ExploringMinFeaturesNotMet,
    Ok,
}
