//! HTTP routes of the adoption state under `/v1/products/{product_id}`.
//!
//! Handlers parse the request into a command, call the service or a
//! runner, and alone turn their typed errors into answers.

use axum::Router;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use parlance_core::adoption::{
    Activity, AdoptionCommand, AdoptionEffect, AdoptionEvent, AdoptionKey, ExplorationGateConfig,
    OnboardingPlan, OrderedValue, PlanError, UserAdoptionState, UserId, evaluate_hard_gate, tour,
};
use parlance_core::{ProductId, Timestamp};
use parlance_ports::{LlmError, Stored, Version};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::Adoptions;
use super::runners::{self, MAX_QUERY_CHARS, RunError, RunReport, TourQuery};
use super::service;
use crate::auth::Tenant;
use crate::execute::ServiceError;
use crate::http::{ApiError, ApiJson};

/// The adoption routes.
pub fn routes() -> Router<Adoptions> {
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

/// The record the `{user_id}` path segment names, validated, in the
/// caller's product.
fn record_key(
    product: ProductId,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<AdoptionKey, ApiError> {
    let Path((_, raw)) = path.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let user = UserId::parse(raw).map_err(|e| ApiError::unprocessable(e.to_string()))?;
    Ok(AdoptionKey::new(product, user))
}

/// 404 for a user without a record.
fn no_record() -> ApiError {
    ApiError::not_found("no adoption record for this user")
}

/// A runner's failure as an answer: the service's errors as every machine
/// answers them; a model that is down 503 `llm-unavailable`, one that
/// refused the request 502 `llm-failed` (with `llm_error` and `prompt`); a
/// prompt of the registry that does not render, 500.
impl From<RunError> for ApiError {
    fn from(e: RunError) -> Self {
        match e {
            RunError::Service(e) => e.into(),
            RunError::Model { prompt, error } => llm_failure(prompt, &error),
            RunError::Prompt(e) => ApiError::internal(&e),
        }
    }
}

fn llm_failure(prompt: &str, e: &LlmError) -> ApiError {
    tracing::warn!(prompt, error = %e, "language model call failed; state unchanged");
    let code = match e {
        LlmError::RateLimited { .. } => "rate_limited",
        LlmError::Unavailable { .. } => "unavailable",
        LlmError::Timeout { .. } => "timeout",
        LlmError::Invalid { .. } => "invalid",
        _ => "other",
    };
    let err = if e.is_retryable() {
        ApiError::unavailable("the language model is unavailable; nothing was changed, retry later")
    } else {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            "llm-failed",
            "the language model refused the request; nothing was changed (see the server log)",
        )
    };
    err.with("llm_error", code)
        .with("prompt", prompt.to_owned())
}

fn body(stored: &Stored<UserAdoptionState>) -> Value {
    json!({
        "user_id": stored.state.user_id,
        "version": stored.version,
        "state": stored.state.to_snapshot(),
    })
}

async fn get_state(
    State(app): State<Adoptions>,
    Tenant(product): Tenant,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<ApiJson<Value>, ApiError> {
    let key = record_key(product, path)?;
    let stored = service::find(&app, &key).await?.ok_or_else(no_record)?;
    Ok(ApiJson(body(&stored)))
}

/// `PUT .../adoption`: replace the whole state with a snapshot.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PutState {
    /// The snapshot (`_v: 1`, the reference layout), maps in document order.
    state: OrderedValue,
    /// The version being replaced; absent to create.
    #[serde(default)]
    expected_version: Option<i64>,
}

async fn put_state(
    State(app): State<Adoptions>,
    Tenant(product): Tenant,
    path: Result<Path<(String, String)>, PathRejection>,
    ApiJson(req): ApiJson<PutState>,
) -> Result<Response, ApiError> {
    let key = record_key(product, path)?;
    let expected = req.expected_version.map(Version::from_i64);
    let command = AdoptionCommand::PutState { state: req.state };
    let replaced = match service::replace(&app, &key, &command, expected).await {
        Ok(r) => r,
        Err(ServiceError::NotFound) => return Err(no_record()),
        // The client named the version it replaces: a record that moved (or
        // exists, on a create) is its conflict, not a race to retry.
        Err(ServiceError::Port(e)) if e.is_conflict() => {
            return Err(ApiError::conflict(
                "conflict",
                if expected.is_none() {
                    "adoption record already exists"
                } else {
                    "adoption record version is stale"
                },
            ));
        }
        Err(e) => return Err(e.into()),
    };
    let status = if replaced.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, ApiJson(body(&replaced.stored))).into_response())
}

async fn delete_state(
    State(app): State<Adoptions>,
    Tenant(product): Tenant,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let key = record_key(product, path)?;
    if app.store.delete(&key).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(no_record())
    }
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

async fn post_events(
    State(app): State<Adoptions>,
    Tenant(product): Tenant,
    path: Result<Path<(String, String)>, PathRejection>,
    ApiJson(req): ApiJson<PostEvents>,
) -> Result<ApiJson<Value>, ApiError> {
    let key = record_key(product, path)?;
    crate::http::check_items("events", req.events.len())?;
    let command = AdoptionCommand::Events {
        events: req.events,
        metadata: req.metadata,
    };
    // Field events read no plan.
    let done = service::run(&app, &key, &OnboardingPlan::default(), &command).await?;
    Ok(ApiJson(body(&Stored {
        state: done.state,
        version: done.version,
    })))
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
    State(app): State<Adoptions>,
    Tenant(product): Tenant,
    path: Result<Path<(String, String)>, PathRejection>,
    ApiJson(req): ApiJson<PostActivity>,
) -> Result<ApiJson<Value>, ApiError> {
    let key = record_key(product, path)?;
    crate::http::check_items("actions", req.actions.len())?;
    crate::http::check_items("discovered_features", req.discovered_features.len())?;
    // The role decides the plan; read it from the stored record (or the
    // metadata of a first call).
    let role = match service::find(&app, &key).await? {
        Some(s) => s.state.role().map(str::to_owned),
        None => req
            .metadata
            .as_ref()
            .and_then(|m| m.get("role"))
            .and_then(Value::as_str)
            .map(str::to_owned),
    };
    let plan = service::effective_plan(&app, &key.product_id, role.as_deref()).await?;
    let command = AdoptionCommand::Activity {
        actions: req.actions,
        discovered_features: req.discovered_features,
        metadata: req.metadata,
    };
    let done = service::run(&app, &key, &plan, &command).await?;
    let detected = done.decision.effects.into_iter().find_map(|e| match e {
        AdoptionEffect::Detected(d) => Some(d),
        _ => None,
    });
    let mut out = body(&Stored {
        state: done.state,
        version: done.version,
    });
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
    State(app): State<Adoptions>,
    Tenant(product): Tenant,
    path: Result<Path<(String, String)>, PathRejection>,
    ApiJson(req): ApiJson<PostGate>,
) -> Result<ApiJson<Value>, ApiError> {
    let key = record_key(product, path)?;
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
    let now = app.shared.clock.now();
    // An unknown user is judged as a fresh one; nothing is saved.
    let state = match service::find(&app, &key).await? {
        Some(s) => s.state,
        None => UserAdoptionState::new(key.user_id.clone(), Map::new(), now),
    };
    let distinct = req
        .distinct_features_seen
        .unwrap_or(state.discovered_features.len() as u64);
    let d = evaluate_hard_gate(&state, now, req.seconds_on_app, distinct, &cfg);
    Ok(ApiJson(json!({
        "passed": d.passed,
        "code": d.reason.code(),
        "reason": d.reason.to_string(),
    })))
}

async fn get_prompt_block(
    State(app): State<Adoptions>,
    Tenant(product): Tenant,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<ApiJson<Value>, ApiError> {
    let key = record_key(product, path)?;
    let stored = service::find(&app, &key).await?.ok_or_else(no_record)?;
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
    State(app): State<Adoptions>,
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
        let mut e =
            ApiError::unprocessable(format!("plan rejected: {detail}")).with("errors", errors);
        // A value over a limit names its field within the body.
        if let Some(PlanError::GlobTooLong { path, .. }) = load
            .errors
            .iter()
            .find(|e| matches!(e, PlanError::GlobTooLong { .. }))
        {
            e = e.with("field", path.replacen('$', "workflows", 1));
        }
        return Err(e);
    }
    app.store
        .put_plan(&product, role_of(&req.role), &load.plan)
        .await?;
    Ok(ApiJson(json!({
        "role": role_of(&req.role),
        "workflows": load.plan.to_config(),
        "skipped": load.skipped,
    })))
}

async fn get_plan(
    State(app): State<Adoptions>,
    Tenant(product): Tenant,
    q: Result<Query<RoleQuery>, QueryRejection>,
) -> Result<ApiJson<Value>, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let plan = app
        .store
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
    State(app): State<Adoptions>,
    Tenant(product): Tenant,
    ApiJson(req): ApiJson<PutCatalog>,
) -> Result<ApiJson<Value>, ApiError> {
    if !req.tours.is_array() {
        return Err(ApiError::unprocessable("tours must be an array").with("field", "tours"));
    }
    let (catalog, skipped) = tour::catalog_from_value(&req.tours);
    app.store
        .put_tour_catalog(&product, role_of(&req.role), &catalog)
        .await?;
    Ok(ApiJson(json!({
        "role": role_of(&req.role),
        "tours": catalog,
        "skipped": skipped,
    })))
}

async fn get_catalog(
    State(app): State<Adoptions>,
    Tenant(product): Tenant,
    q: Result<Query<RoleQuery>, QueryRejection>,
) -> Result<ApiJson<Value>, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let catalog = app
        .store
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
    State(app): State<Adoptions>,
    Tenant(product): Tenant,
    path: Result<Path<(String, String)>, PathRejection>,
    ApiJson(req): ApiJson<runners::JudgeRequest>,
) -> Result<ApiJson<Value>, ApiError> {
    let key = record_key(product, path)?;
    let report = runners::judge_adoption(&app, &key, &req).await?;
    Ok(ApiJson(run_body(&report)))
}

async fn post_welcome(
    State(app): State<Adoptions>,
    Tenant(product): Tenant,
    path: Result<Path<(String, String)>, PathRejection>,
    ApiJson(req): ApiJson<runners::WelcomeRequest>,
) -> Result<ApiJson<Value>, ApiError> {
    let key = record_key(product, path)?;
    let report = runners::onboarding_welcome(&app, &key, &req).await?;
    Ok(ApiJson(run_body(&report)))
}

async fn post_followup(
    State(app): State<Adoptions>,
    Tenant(product): Tenant,
    path: Result<Path<(String, String)>, PathRejection>,
    ApiJson(req): ApiJson<runners::FollowupRequest>,
) -> Result<ApiJson<Value>, ApiError> {
    let key = record_key(product, path)?;
    let report = runners::onboarding_followup(&app, &key, &req).await?;
    Ok(ApiJson(run_body(&report)))
}

async fn post_session_summary(
    State(app): State<Adoptions>,
    Tenant(product): Tenant,
    path: Result<Path<(String, String)>, PathRejection>,
    ApiJson(req): ApiJson<runners::SummaryRequest>,
) -> Result<ApiJson<Value>, ApiError> {
    let key = record_key(product, path)?;
    // Epoch seconds that are no instant are refused here; a session that
    // starts after now is the machine's to refuse.
    let started_at = Timestamp::from_epoch_seconds(req.started_at).map_err(|e| {
        ApiError::unprocessable(format!("started_at: {e}")).with("field", "started_at")
    })?;
    let report = runners::session_summary(&app, &key, &req, started_at).await?;
    Ok(ApiJson(run_body(&report)))
}

async fn post_tour_match(
    State(app): State<Adoptions>,
    Tenant(product): Tenant,
    ApiJson(req): ApiJson<runners::TourMatchRequest>,
) -> Result<ApiJson<runners::TourMatchReport>, ApiError> {
    let text = req.query.trim();
    if text.is_empty() || text.chars().count() > MAX_QUERY_CHARS {
        return Err(ApiError::unprocessable(format!(
            "query must not be blank and at most {MAX_QUERY_CHARS} characters"
        ))
        .with("field", "query"));
    }
    let user = req
        .user_id
        .clone()
        .map(UserId::parse)
        .transpose()
        .map_err(|e| ApiError::unprocessable(e.to_string()).with("field", "user_id"))?;
    let query = TourQuery {
        text: text.to_owned(),
        user,
    };
    Ok(ApiJson(
        runners::match_tour(&app, &product, &query, &req).await?,
    ))
}
