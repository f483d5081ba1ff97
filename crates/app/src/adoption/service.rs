//! Adoption use cases: load -> apply (pure core) -> compare-and-swap save,
//! retried on conflict.

use parlance_core::adoption::session_snapshot::round_places;
use parlance_core::adoption::{
    Activity, JourneyState, OnboardingPlan, UserAdoptionState, UserId, WorkflowStatus,
    detect_completed_steps, detect_completed_workflows, is_plan_complete, split_workflows,
};
use parlance_core::{ProductId, Timestamp};
use parlance_ports::{AuditEntry, ErrorKind, StoredAdoption};
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::http::ApiError;
use crate::state::AppState;

/// Attempts of one load -> apply -> save cycle before giving up with 503.
const MAX_ATTEMPTS: usize = 8;

/// Source recorded on progress detected from the activity stream.
const ACTIVITY_SOURCE: &str = "activity";

/// The stored record, or 404.
pub(crate) async fn get(
    app: &AppState,
    product: &ProductId,
    user: &UserId,
) -> Result<StoredAdoption, ApiError> {
    app.adoption
        .load(product, user)
        .await?
        .ok_or_else(|| ApiError::not_found("no adoption record for this user"))
}

/// The stored record, or a fresh, unsaved one at `now` (version 0).
pub(crate) async fn get_or_fresh(
    app: &AppState,
    product: &ProductId,
    user: &UserId,
    now: Timestamp,
) -> Result<StoredAdoption, ApiError> {
    match app.adoption.load(product, user).await? {
        Some(s) => Ok(s),
        None => Ok(StoredAdoption {
            state: UserAdoptionState::new(user.as_str(), Map::new(), now)
                .map_err(|e| ApiError::unprocessable(e.to_string()))?,
            version: 0,
        }),
    }
}

/// Runs `apply` on the user's state and saves it by compare-and-swap,
/// reloading and re-applying on a lost race. A missing record is created
/// with `metadata` first. `apply` must be pure: it may run more than once.
/// Journey changes are written to the audit log after the save.
pub(crate) async fn update<R>(
    app: &AppState,
    product: &ProductId,
    user: &UserId,
    metadata: Option<&Map<String, Value>>,
    mut apply: impl FnMut(&mut UserAdoptionState, Timestamp) -> Result<R, ApiError>,
) -> Result<(StoredAdoption, R), ApiError> {
    for _ in 0..MAX_ATTEMPTS {
        let now = app.clock.now();
        let (mut state, expected) = match app.adoption.load(product, user).await? {
            Some(s) => (s.state, Some(s.version)),
            None => (
                UserAdoptionState::new(user.as_str(), metadata.cloned().unwrap_or_default(), now)
                    .map_err(|e| ApiError::unprocessable(e.to_string()))?,
                None,
            ),
        };
        let before = state.journey_state;
        let result = apply(&mut state, now)?;
        match app.adoption.save(product, &state, expected).await {
            Ok(version) => {
                if state.journey_state != before {
                    audit_journey(app, product, user, before, state.journey_state, now).await;
                }
                return Ok((StoredAdoption { state, version }, result));
            }
            Err(e) if matches!(e.kind, ErrorKind::Conflict | ErrorKind::NotFound) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(ApiError::unavailable(
        "the adoption record changed too often concurrently; retry",
    ))
}

async fn audit_journey(
    app: &AppState,
    product: &ProductId,
    user: &UserId,
    from: JourneyState,
    to: JourneyState,
    at: Timestamp,
) {
    let entry = AuditEntry {
        product_id: product.clone(),
        entity_kind: "adoption".to_owned(),
        entity_id: user.as_str().to_owned(),
        from: Some(from.as_str().to_owned()),
        to: to.as_str().to_owned(),
        cause: "set_journey_state".to_owned(),
        at,
        payload: json!({}),
    };
    // The state is saved; a failed audit append is logged, not fatal.
    if let Err(e) = app.audit.append(&[entry]).await {
        tracing::warn!(error = %e, "audit append failed");
    }
}

/// The plan that applies to `role`: the role's own plan when one is stored,
/// else the product-wide plan, filtered to the role.
pub(crate) async fn effective_plan(
    app: &AppState,
    product: &ProductId,
    role: Option<&str>,
) -> Result<OnboardingPlan, ApiError> {
    let plan = match app.adoption.get_plan(product, role).await? {
        Some(p) if role.is_some_and(|r| !r.trim().is_empty()) => p,
        _ => app
            .adoption
            .get_plan(product, None)
            .await?
            .unwrap_or_default(),
    };
    Ok(plan.for_role(role))
}

/// What the activity detector found in one batch.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Detected {
    /// Workflows completed by this batch.
    pub(crate) workflows: Vec<DetectedItem>,
    /// Steps completed by this batch.
    pub(crate) steps: Vec<DetectedItem>,
    /// Onboarding was stamped complete by this batch.
    pub(crate) onboarding_completed: bool,
}

/// One detected completion.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct DetectedItem {
    pub(crate) workflow_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) step_id: Option<String>,
    pub(crate) evidence: String,
}

/// Applies one batch of activity to the state (pure): discovered features
/// (and `distinct_features_seen`, never lowered), then workflow and step
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
        let status = state
            .onboarding
            .workflow_progress
            .get(&w.workflow_id)
            .map(|p| p.status);
        if status != Some(WorkflowStatus::Completed) {
            let confidence = state
                .onboarding
                .workflow_progress
                .get(&w.workflow_id)
                .map_or(0.5, |p| p.confidence.max(0.5));
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
