//! Applying parsed LLM answers to the adoption state (pure).

use serde::Serialize;

use crate::{Outcome, Timestamp};

use super::gate::GateDecision;
use super::model::{JourneyState, StepInAssessment, UserAdoptionState};
use super::plan::{OnboardingPlan, is_plan_complete};
use super::prompts::{JudgeOutput, ParseStatus, SuggestedFlow, WelcomeOutput};

/// What the shell must do after an adoption operation.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AdoptionEffect {
    /// Deliver the welcome message to the user.
    SendWelcome {
        /// The text.
        message: String,
        /// Tours offered in it.
        suggested_flows: Vec<SuggestedFlow>,
    },
}

/// The outcome type of the adoption operations: journey transitions and
/// effects.
pub type AdoptionOutcome = Outcome<JourneyState, AdoptionEffect>;

/// Applies the judge's answer: journey and mastery when stated clearly, and
/// `last_judged_at`. A malformed answer changes nothing.
pub fn apply_judge_output(
    state: &mut UserAdoptionState,
    out: &JudgeOutput,
    now: Timestamp,
) -> AdoptionOutcome {
    let mut outcome = AdoptionOutcome::none();
    if out.status != ParseStatus::Parsed {
        return outcome;
    }
    if let Some(j) = out.journey_state {
        let from = state.journey_state;
        if state.set_journey_state(j, now) {
            outcome.transition(from, j, "judge_adoption");
        }
    }
    if let Some((rating, level)) = out.mastery {
        // The rating is already clamped, so this cannot fail.
        let _ = state.set_mastery(f64::from(rating), level, &out.mastery_description, now);
    }
    state.mark_judged(now);
    outcome
}

/// Records a gate evaluation: the exploration figures, and that the gate was
/// passed once.
pub fn record_gate(
    state: &mut UserAdoptionState,
    decision: &GateDecision,
    distinct_features_seen: u64,
) {
    state.onboarding.distinct_features_seen = distinct_features_seen;
    if decision.passed {
        state.onboarding.explore_gate_passed = true;
    }
}

/// Applies the welcome answer: workflow progress (source `welcome`), the
/// step-in assessment (kept whether or not a message is sent), the welcome
/// itself (`mark_welcomed` and a [`AdoptionEffect::SendWelcome`]) and
/// onboarding completion when the model says so and the plan agrees.
pub fn apply_welcome_output(
    state: &mut UserAdoptionState,
    out: &WelcomeOutput,
    plan: &OnboardingPlan,
    now: Timestamp,
) -> AdoptionOutcome {
    let mut outcome = AdoptionOutcome::none();
    for wc in &out.workflow_completion {
        // Confidence is clamped by the parser, so this cannot fail.
        let _ = state.onboarding.upsert_workflow_progress(
            &wc.workflow_id,
            wc.status,
            wc.confidence,
            &wc.evidence,
            Some("welcome"),
            now,
        );
    }
    state.onboarding.record_step_in(StepInAssessment {
        decided_at: now,
        should_step_in: out.should_send,
        timing_assessment: out.timing_assessment.clone(),
        reason: if out.status == ParseStatus::Parsed {
            out.reasoning.clone()
        } else {
            format!("unusable answer: {:?}", out.status)
        },
        suggested_workflow_ids: out
            .suggested_flows
            .iter()
            .map(|f| f.tour_id.clone())
            .collect(),
    });
    if out.should_send {
        state.mark_welcomed(now);
        outcome.effect(AdoptionEffect::SendWelcome {
            message: out.message.clone(),
            suggested_flows: out.suggested_flows.clone(),
        });
    }
    if out.onboarding_complete && is_plan_complete(plan, &state.onboarding.workflow_progress) {
        state.onboarding.mark_onboarding_complete(now);
    }
    outcome
}
