//! User adoption state: a user's journey and mastery, onboarding progress,
//! the explore-first gate, onboarding plans, the activity detector, tour
//! matching and the versioned prompts of the LLM runners.
//!
//! Everything here is pure: time arrives as `now`, LLM answers arrive as
//! text and are parsed by functions that never fail. A record is changed by
//! deciding an [`AdoptionCommand`] (see the [`crate::Machine`] impl of
//! [`UserAdoptionState`]); a runner in the app is build input -> call the
//! LLM -> parse -> decide the answer's command.

mod apply;
mod codec;
pub mod detector;
mod error;
pub mod gate;
mod machine;
mod model;
pub mod ordered;
pub mod plan;
pub mod prompts;
pub mod runner;
pub mod session_snapshot;
pub mod snapshot;
// The value-tree codec the typed one replaced: the tests' oracle, and the
// baseline of `cargo xtask bench session adoption`.
#[cfg(any(test, feature = "tree-codec"))]
#[doc(hidden)]
pub mod snapshot_walk;
pub mod tour;

pub use apply::{AdoptionEffect, Detected, DetectedItem};
pub use detector::{
    Activity, ActivitySignalRule, ActivitySignals, GlobError, MAX_URL_GLOB_CHARS, SignalMatch,
    UrlGlob, detect_completed_steps, detect_completed_workflows, fnmatch,
};
pub use error::AdoptionError;
pub use gate::{ExplorationGateConfig, GateDecision, GateReason, evaluate_hard_gate};
pub use machine::{AdoptionCommand, AdoptionEvent, AdoptionKey};
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
pub use runner::{
    PromptScope, RenderedPrompt, SummaryOutput, TourEvent, build_followup_prompt,
    build_judge_prompt, build_summary_prompt, build_tour_match_prompt, build_welcome_prompt,
    parse_summary_output, with_tour_outcome,
};
pub use session_snapshot::{CompletionRateDenominator, SessionSnapshot, SessionSummaryInput};
pub use snapshot::{DecodeError, SNAPSHOT_VERSION};
pub use tour::{
    MAX_RELATED_TOURS, TourCatalogEntry, TourMatchInput, TourMatchResult, build_tour_match_input,
    parse_tour_match_output,
};

#[cfg(test)]
mod codec_tests;
#[cfg(test)]
mod machine_tests;
#[cfg(test)]
mod tests;

/// Characters allowed in a user id: anything printable except `/`.
fn user_char(c: char) -> bool {
    c != '/'
}

crate::id::string_id!(
    /// A user of a product: the adoption record's key within the product.
    UserId,
    "user id",
    max = 256,
    chars = user_char,
    pattern = "^[^/\\u0000-\\u001F\\u007F-\\u009F]+$"
);
