//! User adoption state: a user's journey and mastery, onboarding progress,
//! the explore-first gate, onboarding plans, the activity detector, tour
//! matching and the versioned prompts of the LLM runners.
//!
//! Everything here is pure: time arrives as `now`, LLM answers arrive as
//! text and are parsed by functions that never fail. A runner in the app is
//! build input -> call the LLM -> parse -> apply.

mod apply;
pub mod detector;
pub mod gate;
mod model;
pub mod ordered;
pub mod plan;
pub mod prompts;
pub mod session_snapshot;
pub mod snapshot;
pub mod tour;

pub use apply::{
    AdoptionEffect, AdoptionOutcome, apply_judge_output, apply_welcome_output, record_gate,
};
pub use detector::{
    Activity, ActivitySignalRule, ActivitySignals, SignalMatch, detect_completed_steps,
    detect_completed_workflows, fnmatch,
};
pub use gate::{ExplorationGateConfig, GateDecision, GateReason, evaluate_hard_gate};
pub use model::{
    JOURNEY_TABLE, JourneyState, Mastery, MasteryLevel, OnboardingState, OrderedMap,
    SESSION_INDEX_CAP, SessionIndexEntry, StepInAssessment, StepProgress, UNKNOWN_SOURCE,
    UserAdoptionState, WorkflowProgress, WorkflowStatus, clamp_rating, one_line,
};
pub use ordered::OrderedValue;
pub use plan::{
    OnboardingPlan, OnboardingWorkflow, PlanError, PlanIssue, PlanLoad, WorkflowSplit,
    WorkflowStep, is_plan_complete, split_workflows, step_completion_ratio,
};
pub use prompts::ParseStatus;
pub use session_snapshot::{CompletionRateDenominator, SessionSnapshot, SessionSummaryInput};
pub use snapshot::{DecodeError, SNAPSHOT_VERSION};
pub use tour::{
    MAX_RELATED_TOURS, TourCatalogEntry, TourMatchInput, TourMatchResult, build_tour_match_input,
    parse_tour_match_output,
};

/// A mutator refused its input (the state is unchanged).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdoptionError {
    /// NaN or an infinity where a number is clamped into a range.
    #[error("{field} is not a finite number")]
    NotFinite {
        /// Which argument.
        field: &'static str,
    },
    /// A user id must not be empty.
    #[error("user id must not be empty")]
    EmptyUserId,
}

#[cfg(test)]
mod tests;

/// Characters allowed in a user id: anything printable except `/`.
fn user_char(c: char) -> bool {
    c != '/'
}

crate::string_id!(
    /// A user of a product: the adoption record's key within the product.
    UserId,
    "user id",
    max = 256,
    chars = user_char
);
