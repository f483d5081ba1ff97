//! HTTP routes of the adoption state under `/v1/products/{product_id}`.

use axum::Router;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use parlance_core::Timestamp;
use parlance_core::adoption::{
    Activity, DecodeError, ExplorationGateConfig, JourneyState, MasteryLevel, OnboardingPlan,
    SessionIndexEntry, UserAdoptionState, UserId, WorkflowStatus, evaluate_hard_gate, tour,
};
use parlance_ports::StoredAdoption;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::runners::{self, RunReport};
use super::service::{self, Detected};
use crate::auth::Tenant;
use crate::http::{ApiError, ApiJson};
use crate::state::AppState;

/// The adoption routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/products/{product_id}/users/{user_id}/adoption",
            get(get_state).put(put_state).delete(delete_state),
        )
        .route(
            "/products/{product_id}/users/{user_id}/adoption/events",
            post(post_events),
        )
        .route(
            "/products/{product_id}/users/{user_id}/adoption/activity",
            post(post_activity),
        )
        .route(
            "/products/{product_id}/users/{user_id}/adoption/gate",
            post(post_gate),
        )
        .route(
            "/products/{product_id}/users/{user_id}/adoption/prompt-block",
            get(get_prompt_block),
        )
        .route(
            "/products/{product_id}/users/{user_id}/adoption/judge",
            post(post_judge),
        )
        .route(
            "/products/{product_id}/users/{user_id}/adoption/welcome",
            post(post_welcome),
        )
        .route(
            "/products/{product_id}/users/{user_id}/adoption/followup",
            post(post_followup),
        )
        .route(
            "/products/{product_id}/users/{user_id}/adoption/session-summary",
            post(post_session_summary),
        )
        .route("/products/{product_id}/tours/match", post(post_tour_match))
        .route(
            "/products/{product_id}/onboarding-plan",
            get(get_plan).put(put_plan),
        )
        .route(
            "/products/{product_id}/tour-catalog",
            get(get_catalog).put(put_catalog),
        )
}

/// The `{user_id}` path segment, validated.
fn user_id(path: Result<Path<(String, String)>, PathRejection>) -> Result<UserId, ApiError> {
    let Path((_, raw)) = path.map_err(|e| ApiError::bad_request(e.body_text()))?;
    UserId::parse(raw).map_err(|e| ApiError::unprocessable(e.to_string()))
}

fn decode_error(e: &DecodeError) -> ApiError {
    ApiError::unprocessable(format!("snapshot rejected: {e}")).with("field", e.path.clone())
}

fn body(stored: &StoredAdoption) -> Value {
    json!({
        "user_id": stored.state.user_id,
        "version": stored.version,
        "state": stored.state.to_snapshot(),
    })
}

async fn get_state(
    State(app): State<AppState>,
    Tenant(product): Tenant,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<ApiJson<Value>, ApiError> {
    let user = user_id(path)?;
    Ok(ApiJson(body(&service::get(&app, &product, &user).await?)))
}

/// `PUT .../adoption`: replace the whole state with a snapshot.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PutState {
    /// The snapshot (`_v: 1`, the reference layout).
    state: Value,
    /// The version being replaced; absent to create.
    #[serde(default)]
    expected_version: Option<i64>,
}

async fn put_state(
    State(app): State<AppState>,
    Tenant(product): Tenant,
    path: Result<Path<(String, String)>, PathRejection>,
    ApiJson(req): ApiJson<PutState>,
) -> Result<Response, ApiError> {
    let user = user_id(path)?;
    let now = app.clock.now();
    let state = UserAdoptionState::from_snapshot(&req.state, now).map_err(|e| decode_error(&e))?;
    if state.user_id != user.as_str() {
        return Err(
            ApiError::unprocessable("state.user_id does not match the path")
                .with("field", "$.user_id"),
        );
    }
    let version = app
        .adoption
        .save(&product, &state, req.expected_version)
        .await?;
    let status = if req.expected_version.is_none() {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, ApiJson(body(&StoredAdoption { state, version }))).into_response())
}

async fn delete_state(
    State(app): State<AppState>,
    Tenant(product): Tenant,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let user = user_id(path)?;
    if app.adoption.delete(&product, &user).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found("no adoption record for this user"))
    }
}

/// One change to a user's adoption state.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
enum AdoptionEvent {
    SetJourneyState {
        state: JourneyState,
    },
    SetMastery {
        rating: f64,
        level: MasteryLevel,
        #[serde(default)]
        description: String,
    },
    RecordDiscoveredFeatures {
        features: Vec<String>,
    },
    UpsertWorkflowProgress {
        workflow_id: String,
        status: WorkflowStatus,
        confidence: f64,
        #[serde(default)]
        evidence: String,
        #[serde(default)]
        source: Option<String>,
    },
    UpsertStepProgress {
        workflow_id: String,
        step_id: String,
        status: WorkflowStatus,
        confidence: f64,
        #[serde(default)]
        evidence: String,
    },
    MarkWelcomed,
    MarkJudged,
    MarkOnboardingComplete,
    SetCurrentSession {
        session_id: String,
    },
    RecordSession {
        session_id: String,
        session_number: u64,
        started_at: f64,
    },
    SetMetadata {
        metadata: Map<String, Value>,
    },
}

/// `POST .../adoption/events`: changes applied in order, all or nothing.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PostEvents {
    events: Vec<AdoptionEvent>,
    /// Metadata for a user seen for the first time.
    #[serde(default)]
    metadata: Option<Map<String, Value>>,
}

fn nonblank(field: &str, v: &str) -> Result<(), ApiError> {
    if v.trim().is_empty() {
        Err(ApiError::unprocessable(format!("{field} must not be blank")).with("field", field))
    } else {
        Ok(())
    }
}

fn apply_event(
    state: &mut UserAdoptionState,
    i: usize,
    ev: &AdoptionEvent,
    now: Timestamp,
) -> Result<(), ApiError> {
    let refuse = |e: parlance_core::adoption::AdoptionError| {
        ApiError::unprocessable(format!("events[{i}]: {e}"))
    };
    match ev {
        AdoptionEvent::SetJourneyState { state: j } => {
            state.set_journey_state(*j, now);
        }
        AdoptionEvent::SetMastery {
            rating,
            level,
            description,
        } => state
            .set_mastery(*rating, *level, description, now)
            .map_err(refuse)?,
        AdoptionEvent::RecordDiscoveredFeatures { features } => {
            state.record_discovered_features(features.iter().map(String::as_str), now);
        }
        AdoptionEvent::UpsertWorkflowProgress {
            workflow_id,
            status,
            confidence,
            evidence,
            source,
        } => {
            nonblank("workflow_id", workflow_id)?;
            state
                .onboarding
                .upsert_workflow_progress(
                    workflow_id,
                    *status,
                    *confidence,
                    evidence,
                    source.as_deref().or(Some("manual")),
                    now,
                )
                .map_err(refuse)?;
        }
        AdoptionEvent::UpsertStepProgress {
            workflow_id,
            step_id,
            status,
            confidence,
            evidence,
        } => {
            nonblank("step_id", step_id)?;
            let wp = state
                .onboarding
                .workflow_progress
                .get_mut(workflow_id)
                .ok_or_else(|| {
                    ApiError::unprocessable(format!(
                        "events[{i}]: no progress for workflow {workflow_id}"
                    ))
                })?;
            wp.upsert_step_progress(step_id, *status, *confidence, evidence, now)
                .map_err(refuse)?;
        }
        AdoptionEvent::MarkWelcomed => state.mark_welcomed(now),
        AdoptionEvent::MarkJudged => state.mark_judged(now),
        AdoptionEvent::MarkOnboardingComplete => {
            state.onboarding.mark_onboarding_complete(now);
        }
        AdoptionEvent::SetCurrentSession { session_id } => {
            state.set_current_session(session_id, now);
        }
        AdoptionEvent::RecordSession {
            session_id,
            session_number,
            started_at,
        } => {
            nonblank("session_id", session_id)?;
            let started_at = Timestamp::from_epoch_seconds(*started_at)
                .map_err(|e| ApiError::unprocessable(format!("events[{i}].started_at: {e}")))?;
            state.record_session(
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
            state.metadata = metadata.clone();
        }
    }
    Ok(())
}

async fn post_events(
    State(app): State<AppState>,
    Tenant(product): Tenant,
    path: Result<Path<(String, String)>, PathRejection>,
    ApiJson(req): ApiJson<PostEvents>,
) -> Result<ApiJson<Value>, ApiError> {
    let user = user_id(path)?;
    crate::http::check_items("events", req.events.len())?;
    let (stored, ()) = service::update(
        &app,
        &product,
        &user,
        req.metadata.as_ref(),
        |state, now| {
            for (i, ev) in req.events.iter().enumerate() {
                apply_event(state, i, ev, now)?;
            }
            Ok(())
        },
    )
    .await?;
    Ok(ApiJson(body(&stored)))
}

/// `POST .../adoption/activity`: a batch of the user's actions.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PostActivity {
    #[serde(default)]
    actions: Vec<Activity>,
    #[serde(default)]
    discovered_features: Vec<String>,
    /// Metadata for a user seen for the first time.
    #[serde(default)]
    metadata: Option<Map<String, Value>>,
}

async fn post_activity(
    State(app): State<AppState>,
    Tenant(product): Tenant,
    path: Result<Path<(String, String)>, PathRejection>,
    ApiJson(req): ApiJson<PostActivity>,
) -> Result<ApiJson<Value>, ApiError> {
    let user = user_id(path)?;
    crate::http::check_items("actions", req.actions.len())?;
    crate::http::check_items("discovered_features", req.discovered_features.len())?;
    // The role decides the plan; read it from the stored record (or the
    // metadata of a first call).
    let role = match app.adoption.load(&product, &user).await? {
        Some(s) => s.state.role().map(str::to_owned),
        None => req
            .metadata
            .as_ref()
            .and_then(|m| m.get("role"))
            .and_then(Value::as_str)
            .map(str::to_owned),
    };
    let plan = service::effective_plan(&app, &product, role.as_deref()).await?;
    let (stored, detected): (_, Detected) = service::update(
        &app,
        &product,
        &user,
        req.metadata.as_ref(),
        |state, now| {
            Ok(service::apply_activity(
                state,
                &plan,
                &req.actions,
                &req.discovered_features,
                now,
            ))
        },
    )
    .await?;
    let mut out = body(&stored);
    out["detected"] = serde_json::to_value(detected).unwrap_or(Value::Null);
    Ok(ApiJson(out))
}

/// `POST .../adoption/gate`: the explore-first gate, without side effects.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PostGate {
    seconds_on_app: f64,
    /// Defaults to the number of discovered features.
    #[serde(default)]
    distinct_features_seen: Option<u64>,
    /// Defaults to the reference defaults.
    #[serde(default)]
    config: Option<ExplorationGateConfig>,
}

async fn post_gate(
    State(app): State<AppState>,
    Tenant(product): Tenant,
    path: Result<Path<(String, String)>, PathRejection>,
    ApiJson(req): ApiJson<PostGate>,
) -> Result<ApiJson<Value>, ApiError> {
    let user = user_id(path)?;
    if req.seconds_on_app < 0.0 {
        return Err(
            ApiError::unprocessable("seconds_on_app must not be negative")
                .with("field", "seconds_on_app"),
        );
    }
    let cfg = req.config.unwrap_or_default();
    if cfg.min_seconds_on_app < 0.0 || cfg.welcome_cooldown_s < 0.0 {
        return Err(ApiError::unprocessable(
            "config durations must not be negative",
        ));
    }
    let now = app.clock.now();
    let stored = service::get_or_fresh(&app, &product, &user, now).await?;
    let distinct = req
        .distinct_features_seen
        .unwrap_or(stored.state.discovered_features.len() as u64);
    let d = evaluate_hard_gate(&stored.state, now, req.seconds_on_app, distinct, &cfg);
    Ok(ApiJson(json!({
        "passed": d.passed,
        "code": d.reason.code(),
        "reason": d.reason.to_string(),
    })))
}

async fn get_prompt_block(
    State(app): State<AppState>,
    Tenant(product): Tenant,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<ApiJson<Value>, ApiError> {
    let user = user_id(path)?;
    let stored = service::get(&app, &product, &user).await?;
    Ok(ApiJson(
        json!({ "prompt_block": stored.state.to_prompt_block() }),
    ))
}

/// `?role=` on plan and catalog routes; absent for the product-wide one.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RoleQuery {
    #[serde(default)]
    role: Option<String>,
}

/// `PUT .../onboarding-plan`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PutPlan {
    /// The role this plan is for; absent for the product-wide plan.
    #[serde(default)]
    role: Option<String>,
    /// The workflows, in the configuration form.
    workflows: Value,
}

fn role_of(r: &Option<String>) -> Option<&str> {
    r.as_deref().filter(|r| !r.trim().is_empty())
}

async fn put_plan(
    State(app): State<AppState>,
    Tenant(product): Tenant,
    ApiJson(req): ApiJson<PutPlan>,
) -> Result<ApiJson<Value>, ApiError> {
    if !req.workflows.is_array() {
        return Err(
            ApiError::unprocessable("workflows must be an array").with("field", "workflows")
        );
    }
    let load = OnboardingPlan::from_config(&req.workflows);
    if !load.errors.is_empty() {
        let errors = serde_json::to_value(&load.errors).unwrap_or(Value::Null);
        let detail = load
            .errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        return Err(
            ApiError::unprocessable(format!("plan rejected: {detail}")).with("errors", errors)
        );
    }
    app.adoption
        .put_plan(&product, role_of(&req.role), &load.plan)
        .await?;
    Ok(ApiJson(json!({
        "role": role_of(&req.role),
        "workflows": load.plan.to_config(),
        "skipped": load.skipped,
    })))
}

async fn get_plan(
    State(app): State<AppState>,
    Tenant(product): Tenant,
    q: Result<Query<RoleQuery>, QueryRejection>,
) -> Result<ApiJson<Value>, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let plan = app
        .adoption
        .get_plan(&product, role_of(&q.role))
        .await?
        .ok_or_else(|| ApiError::not_found("no onboarding plan for this role"))?;
    Ok(ApiJson(json!({
        "role": role_of(&q.role),
        "workflows": plan.to_config(),
    })))
}

/// `PUT .../tour-catalog`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PutCatalog {
    /// The role this catalog is for; absent for the product-wide catalog.
    #[serde(default)]
    role: Option<String>,
    /// The tours.
    tours: Value,
}

async fn put_catalog(
    State(app): State<AppState>,
    Tenant(product): Tenant,
    ApiJson(req): ApiJson<PutCatalog>,
) -> Result<ApiJson<Value>, ApiError> {
    if !req.tours.is_array() {
        return Err(ApiError::unprocessable("tours must be an array").with("field", "tours"));
    }
    let (catalog, skipped) = tour::catalog_from_value(&req.tours);
    app.adoption
        .put_tour_catalog(&product, role_of(&req.role), &catalog)
        .await?;
    Ok(ApiJson(json!({
        "role": role_of(&req.role),
        "tours": catalog,
        "skipped": skipped,
    })))
}

async fn get_catalog(
    State(app): State<AppState>,
    Tenant(product): Tenant,
    q: Result<Query<RoleQuery>, QueryRejection>,
) -> Result<ApiJson<Value>, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let catalog = app
        .adoption
        .get_tour_catalog(&product, role_of(&q.role))
        .await?
        .ok_or_else(|| ApiError::not_found("no tour catalog for this role"))?;
    Ok(ApiJson(
        json!({ "role": role_of(&q.role), "tours": catalog }),
    ))
}

/// A runner's report with the record after it (`user_id`, `version`,
/// `state`).
fn run_body<A: serde::Serialize>(report: &RunReport<A>) -> Value {
    let mut out = body(&report.stored);
    if let (Value::Object(o), Ok(Value::Object(r))) = (&mut out, serde_json::to_value(report)) {
        o.extend(r);
    }
    out
}

async fn post_judge(
    State(app): State<AppState>,
    Tenant(product): Tenant,
    path: Result<Path<(String, String)>, PathRejection>,
    ApiJson(req): ApiJson<runners::JudgeRequest>,
) -> Result<ApiJson<Value>, ApiError> {
    let user = user_id(path)?;
    let report = runners::judge_adoption(&app, &product, &user, &req).await?;
    Ok(ApiJson(run_body(&report)))
}

async fn post_welcome(
    State(app): State<AppState>,
    Tenant(product): Tenant,
    path: Result<Path<(String, String)>, PathRejection>,
    ApiJson(req): ApiJson<runners::WelcomeRequest>,
) -> Result<ApiJson<Value>, ApiError> {
    let user = user_id(path)?;
    let report = runners::onboarding_welcome(&app, &product, &user, &req).await?;
    Ok(ApiJson(run_body(&report)))
}

async fn post_followup(
    State(app): State<AppState>,
    Tenant(product): Tenant,
    path: Result<Path<(String, String)>, PathRejection>,
    ApiJson(req): ApiJson<runners::FollowupRequest>,
) -> Result<ApiJson<Value>, ApiError> {
    let user = user_id(path)?;
    let report = runners::onboarding_followup(&app, &product, &user, &req).await?;
    Ok(ApiJson(run_body(&report)))
}

async fn post_session_summary(
    State(app): State<AppState>,
    Tenant(product): Tenant,
    path: Result<Path<(String, String)>, PathRejection>,
    ApiJson(req): ApiJson<runners::SummaryRequest>,
) -> Result<ApiJson<Value>, ApiError> {
    let user = user_id(path)?;
    let report = runners::session_summary(&app, &product, &user, &req).await?;
    Ok(ApiJson(run_body(&report)))
}

async fn post_tour_match(
    State(app): State<AppState>,
    Tenant(product): Tenant,
    ApiJson(req): ApiJson<runners::TourMatchRequest>,
) -> Result<ApiJson<runners::TourMatchReport>, ApiError> {
    Ok(ApiJson(runners::match_tour(&app, &product, &req).await?))
}
