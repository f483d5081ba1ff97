//! Applying an activity batch and parsed LLM answers to the adoption state
//! (pure).

use serde::Serialize;

use crate::{Outcome, Timestamp};

use super::detector::{Activity, detect_completed_steps, detect_completed_workflows};
use super::gate::GateDecision;
use super::model::{JourneyState, StepInAssessment, UserAdoptionState, WorkflowStatus};
use super::plan::{OnboardingPlan, is_plan_complete, split_workflows};
use super::prompts::{JudgeOutput, ParseStatus, SuggestedFlow, WelcomeOutput};
use super::session_snapshot::round_places;

/// Source recorded on progress detected from the activity stream.
pub(crate) const ACTIVITY_SOURCE: &str = "activity";

/// What the shell must do after an adoption operation.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub enum AdoptionEffect {
    /// Deliver the welcome message to the user.
    SendWelcome {
        /// The text.
        message: String,
        /// Tours offered in it.
        suggested_flows: Vec<SuggestedFlow>,
    },
    /// Deliver the follow-up after a tour.
    SendFollowup {
        /// The text (acknowledgement, then why it mattered).
        message: String,
        /// Tours offered next.
        suggested_flows: Vec<SuggestedFlow>,
    },
    /// Report what an activity batch completed (the answer shows it).
    Detected(Detected),
}

/// What the activity detector found in one batch.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Detected {
    /// Workflows completed by this batch.
    pub workflows: Vec<DetectedItem>,
    /// Steps completed by this batch.
    pub steps: Vec<DetectedItem>,
    /// Onboarding was stamped complete by this batch.
    pub onboarding_completed: bool,
}

/// One completion the detector found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DetectedItem {
    /// The workflow.
    pub workflow_id: String,
    /// The step, for a step completion.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_id: Option<String>,
    /// What matched.
    pub evidence: String,
}

/// What applying an answer did: journey transitions and effects.
pub(crate) type AdoptionOutcome = Outcome<JourneyState, AdoptionEffect>;

/// Applies the judge's answer: journey and mastery when stated clearly, and
/// `last_judged_at`. A malformed answer changes nothing.
pub(crate) fn apply_judge_output(
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
pub(crate) fn record_gate(
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
pub(crate) fn apply_welcome_output(
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

/// Applies one batch of activity: discovered features (and
/// `distinct_features_seen`, never lowered), then workflow and step
/// completions detected by the plan's rules (source `activity`), the plan's
/// completion rate, and onboarding completion when the plan is complete.
pub(crate) fn apply_activity(
    state: &mut UserAdoptionState,
    plan: &OnboardingPlan,
    actions: &[Activity],
    features: &[String],
    now: Timestamp,
) -> Detected {
    let mut detected = Detected::default();
    state.record_discovered_features(features.iter().map(String::as_str), now);
    let done: Vec<String> = state
        .onboarding
        .completed_workflow_ids()
        .into_iter()
        .map(str::to_owned)
        .collect();
    let done_refs: Vec<&str> = done.iter().map(String::as_str).collect();
    for (id, m) in detect_completed_workflows(&plan.workflows, actions, &done_refs).iter() {
        // Confidence 1 is finite, so this cannot fail.
        let _ = state.onboarding.upsert_workflow_progress(
            id,
            WorkflowStatus::Completed,
            1.0,
            &m.evidence,
            Some(ACTIVITY_SOURCE),
            now,
        );
        detected.workflows.push(DetectedItem {
            workflow_id: id.to_owned(),
            step_id: None,
            evidence: m.evidence.clone(),
        });
    }
    for w in &plan.workflows {
        let steps_done: Vec<String> = state
            .onboarding
            .workflow_progress
            .get(&w.workflow_id)
            .map(|p| {
                p.completed_step_ids()
                    .into_iter()
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        let refs: Vec<&str> = steps_done.iter().map(String::as_str).collect();
        let found = detect_completed_steps(w, actions, &refs);
        if found.is_empty() {
            continue;
        }
        let previous = state.onboarding.workflow_progress.get(&w.workflow_id);
        if previous.map(|p| p.status) != Some(WorkflowStatus::Completed) {
            let confidence = previous.map_or(0.5, |p| p.confidence.max(0.5));
            // The confidence is at least 0.5 and finite, so this cannot fail.
            let _ = state.onboarding.upsert_workflow_progress(
                &w.workflow_id,
                WorkflowStatus::InProgress,
                confidence,
                "",
                Some(ACTIVITY_SOURCE),
                now,
            );
        }
        if let Some(wp) = state.onboarding.workflow_progress.get_mut(&w.workflow_id) {
            for (step_id, m) in found.iter() {
                let _ = wp.upsert_step_progress(
                    step_id,
                    WorkflowStatus::Completed,
                    1.0,
                    &m.evidence,
                    now,
                );
                detected.steps.push(DetectedItem {
                    workflow_id: w.workflow_id.clone(),
                    step_id: Some(step_id.to_owned()),
                    evidence: m.evidence.clone(),
                });
            }
        }
    }
    let seen = state.discovered_features.len() as u64;
    state.onboarding.distinct_features_seen = state.onboarding.distinct_features_seen.max(seen);
    if !plan.workflows.is_empty() {
        let split = split_workflows(plan, &state.onboarding.workflow_progress);
        state.onboarding.completion_rate = round_places(
            split.completed.len() as f64 / plan.workflows.len() as f64,
            4,
        );
    }
    if is_plan_complete(plan, &state.onboarding.workflow_progress) {
        detected.onboarding_completed = state.onboarding.mark_onboarding_complete(now);
    }
    detected
}
