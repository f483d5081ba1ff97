//! HTTP routes of the adoption state under `/v1/products/{product_id}`.
//!
//! Handlers parse the request into a command, call the service or a
//! runner, and alone turn their typed errors into answers.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use parlance_core::adoption::prompts::{FollowupOutput, JudgeOutput, WelcomeOutput};
use parlance_core::adoption::{
    Activity, AdoptionCommand, AdoptionEffect, AdoptionEvent, AdoptionKey, Detected,
    ExplorationGateConfig, OnboardingPlan, OnboardingWorkflow, OrderedValue, PlanError, PlanIssue,
    TourCatalogEntry, UserAdoptionState, UserId, evaluate_hard_gate, tour,
};
use parlance_core::{ProductId, Timestamp};
use parlance_ports::{LlmError, Stored, Version};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::Adoptions;
use super::runners::{
    self, GateView, MAX_QUERY_CHARS, RunError, RunReport, SummaryAnswer, TourQuery,
};
use super::schema::AdoptionSnapshot;
use super::service;
use crate::auth::Tenant;
use crate::execute::ServiceError;
use crate::http::audit::{AuditPage, AuditQuery};
use crate::http::openapi::{CommandProblems, Problem, ProductPath, PutProblems, ReadProblems};
use crate::http::{ApiError, ApiJson};

/// The adoption routes.
pub fn routes() -> OpenApiRouter<Adoptions> {
    OpenApiRouter::new()
        .routes(routes!(get_state, put_state, delete_state))
        .routes(routes!(get_audit))
        .routes(routes!(post_events))
        .routes(routes!(post_activity))
        .routes(routes!(post_gate))
        .routes(routes!(get_prompt_block))
        .routes(routes!(post_judge))
        .routes(routes!(post_welcome))
        .routes(routes!(post_followup))
        .routes(routes!(post_session_summary))
        .routes(routes!(post_tour_match))
        .routes(routes!(get_plan, put_plan))
        .routes(routes!(get_catalog, put_catalog))
}

/// The path of one user's record. The user id is checked by the handler,
/// so a bad one answers 422 naming it.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
struct UserPath {
    /// The product (the key's).
    #[param(value_type = ProductId)]
    #[allow(dead_code)] // checked by `Tenant`
    product_id: String,
    /// The user.
    #[param(value_type = UserId)]
    user_id: String,
}

/// The record the `{user_id}` path segment names, validated, in the
/// caller's product.
fn record_key(
    product: ProductId,
    path: Result<Path<UserPath>, PathRejection>,
) -> Result<AdoptionKey, ApiError> {
    let Path(UserPath { user_id: raw, .. }) =
        path.map_err(|e| ApiError::bad_request(e.body_text()))?;
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

/// A user's adoption record as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = AdoptionRecord)]
struct RecordView {
    /// The user.
    user_id: UserId,
    /// The stored version (1 once created, one more per commit).
    version: Version,
    /// The adoption state (`_v: 1`, the reference's layout).
    #[schema(value_type = AdoptionSnapshot)]
    state: Value,
}

fn view(stored: &Stored<UserAdoptionState>) -> RecordView {
    RecordView {
        user_id: stored.state.user_id.clone(),
        version: stored.version,
        state: stored.state.to_snapshot(),
    }
}

/// A user's adoption record.
#[utoipa::path(
    get,
    path = "/products/{product_id}/users/{user_id}/adoption",
    tag = "adoption",
    params(UserPath),
    responses((status = 200, description = "The record.", body = RecordView), ReadProblems),
)]
async fn get_state(
    State(app): State<Adoptions>,
    Tenant(product): Tenant,
    path: Result<Path<UserPath>, PathRejection>,
) -> Result<ApiJson<RecordView>, ApiError> {
    let key = record_key(product, path)?;
    let stored = service::find(&app, &key).await?.ok_or_else(no_record)?;
    Ok(ApiJson(view(&stored)))
}

/// The user's journey transitions, oldest first.
#[utoipa::path(
    get,
    path = "/products/{product_id}/users/{user_id}/adoption/audit",
    operation_id = "get_adoption_audit",
    tag = "adoption",
    params(UserPath, AuditQuery),
    responses((status = 200, description = "A page of the audit trail.", body = AuditPage), ReadProblems),
)]
async fn get_audit(
    State(app): State<Adoptions>,
    Tenant(product): Tenant,
    path: Result<Path<UserPath>, PathRejection>,
    Query(q): Query<AuditQuery>,
) -> Result<ApiJson<AuditPage>, ApiError> {
    let key = record_key(product, path)?;
    service::find(&app, &key).await?.ok_or_else(no_record)?;
    let page = q
        .page(
            app.shared.audit.as_ref(),
            &key.product_id,
            parlance_core::EntityKind::Adoption,
            key.user_id.as_str(),
        )
        .await?;
    Ok(ApiJson(page))
}

/// `PUT .../adoption`: replace the whole state with a snapshot.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = AdoptionReplace)]
struct PutState {
    /// The snapshot (`_v: 1`, the reference layout), maps in document order.
    #[schema(value_type = AdoptionSnapshot)]
    state: OrderedValue,
    /// The version being replaced; absent to create.
    #[serde(default)]
    expected_version: Option<i64>,
}

/// Replaces the user's whole adoption state with a snapshot of the same
/// user. Without `expected_version` it creates the record (409 when one
/// exists); with it, it replaces that version (409 when the record moved).
#[utoipa::path(
    put,
    path = "/products/{product_id}/users/{user_id}/adoption",
    tag = "adoption",
    params(UserPath),
    request_body = PutState,
    responses(
        (status = 200, description = "The record was replaced.", body = RecordView),
        (status = 201, description = "The record was created.", body = RecordView),
        CommandProblems,
    ),
)]
async fn put_state(
    State(app): State<Adoptions>,
    Tenant(product): Tenant,
    path: Result<Path<UserPath>, PathRejection>,
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
    Ok((status, ApiJson(view(&replaced.stored))).into_response())
}

/// Deletes the user's adoption record.
#[utoipa::path(
    delete,
    path = "/products/{product_id}/users/{user_id}/adoption",
    tag = "adoption",
    params(UserPath),
    responses((status = 204, description = "The record is gone."), ReadProblems),
)]
async fn delete_state(
    State(app): State<Adoptions>,
    Tenant(product): Tenant,
    path: Result<Path<UserPath>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let key = record_key(product, path)?;
    if app.store.delete(&key).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(no_record())
    }
}

/// `POST .../adoption/events`: changes applied in order, all or nothing.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = AdoptionEvents)]
struct PostEvents {
    /// The changes, in order.
    events: Vec<AdoptionEvent>,
    /// Metadata for a user seen for the first time.
    #[serde(default)]
    metadata: Option<Map<String, Value>>,
}

/// Applies changes to the user's adoption state in order, all or nothing,
/// creating the record when the user has none.
#[utoipa::path(
    post,
    path = "/products/{product_id}/users/{user_id}/adoption/events",
    tag = "adoption",
    params(UserPath),
    request_body = PostEvents,
    responses((status = 200, description = "The record after the changes.", body = RecordView), CommandProblems),
)]
async fn post_events(
    State(app): State<Adoptions>,
    Tenant(product): Tenant,
    path: Result<Path<UserPath>, PathRejection>,
    ApiJson(req): ApiJson<PostEvents>,
) -> Result<ApiJson<RecordView>, ApiError> {
    let key = record_key(product, path)?;
    crate::http::check_items("events", req.events.len())?;
    let command = AdoptionCommand::Events {
        events: req.events,
        metadata: req.metadata,
    };
    // Field events read no plan.
    let done = service::run(&app, &key, &OnboardingPlan::default(), &command).await?;
    Ok(ApiJson(view(&Stored {
        state: done.state,
        version: done.version,
    })))
}

/// `POST .../adoption/activity`: a batch of the user's actions.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = AdoptionActivity)]
struct PostActivity {
    /// The actions, oldest first.
    #[serde(default)]
    actions: Vec<Activity>,
    /// Features the user discovered.
    #[serde(default)]
    discovered_features: Vec<String>,
    /// Metadata for a user seen for the first time.
    #[serde(default)]
    metadata: Option<Map<String, Value>>,
}

/// The record after an activity batch, and what the batch completed.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = AdoptionActivityResult)]
struct ActivityView {
    #[serde(flatten)]
    record: RecordView,
    /// What the plan's detector found in this batch.
    detected: Option<Detected>,
}

/// Records a batch of the user's actions and runs it through the detector
/// of the user's plan (by role), creating the record when the user has none.
#[utoipa::path(
    post,
    path = "/products/{product_id}/users/{user_id}/adoption/activity",
    tag = "adoption",
    params(UserPath),
    request_body = PostActivity,
    responses((status = 200, description = "The record after the batch, with what it completed.", body = ActivityView), CommandProblems),
)]
async fn post_activity(
    State(app): State<Adoptions>,
    Tenant(product): Tenant,
    path: Result<Path<UserPath>, PathRejection>,
    ApiJson(req): ApiJson<PostActivity>,
) -> Result<ApiJson<ActivityView>, ApiError> {
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
    Ok(ApiJson(ActivityView {
        record: view(&Stored {
            state: done.state,
            version: done.version,
        }),
        detected,
    }))
}

/// `POST .../adoption/gate`: the explore-first gate, without side effects.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = AdoptionGateRequest)]
struct PostGate {
    /// Seconds the user has spent on the app (not negative).
    seconds_on_app: f64,
    /// Defaults to the number of discovered features.
    #[serde(default)]
    distinct_features_seen: Option<u64>,
    /// Defaults to the reference defaults.
    #[serde(default)]
    config: Option<ExplorationGateConfig>,
}

/// The explore-first gate for the user now, without side effects: whether
/// a welcome may interrupt them. An unknown user is judged as a fresh one.
#[utoipa::path(
    post,
    path = "/products/{product_id}/users/{user_id}/adoption/gate",
    tag = "adoption",
    params(UserPath),
    request_body = PostGate,
    responses((status = 200, description = "The gate's decision.", body = GateView), PutProblems),
)]
async fn post_gate(
    State(app): State<Adoptions>,
    Tenant(product): Tenant,
    path: Result<Path<UserPath>, PathRejection>,
    ApiJson(req): ApiJson<PostGate>,
) -> Result<ApiJson<GateView>, ApiError> {
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
    Ok(ApiJson(GateView::from(&d)))
}

/// The adoption block for an assistant's prompt.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = AdoptionPromptBlock)]
struct PromptBlock {
    /// `[USER ADOPTION STATE]` with role, journey, mastery and guidance, one
    /// per line.
    prompt_block: String,
}

/// The user's adoption state as a block for an assistant's system prompt.
#[utoipa::path(
    get,
    path = "/products/{product_id}/users/{user_id}/adoption/prompt-block",
    tag = "adoption",
    params(UserPath),
    responses((status = 200, description = "The block.", body = PromptBlock), ReadProblems),
)]
async fn get_prompt_block(
    State(app): State<Adoptions>,
    Tenant(product): Tenant,
    path: Result<Path<UserPath>, PathRejection>,
) -> Result<ApiJson<PromptBlock>, ApiError> {
    let key = record_key(product, path)?;
    let stored = service::find(&app, &key).await?.ok_or_else(no_record)?;
    Ok(ApiJson(PromptBlock {
        prompt_block: stored.state.to_prompt_block(),
    }))
}

/// `?role=` on plan and catalog routes; absent for the product-wide one.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct RoleQuery {
    /// The role; absent (or blank) for the product-wide one.
    #[serde(default)]
    role: Option<String>,
}

/// `PUT .../onboarding-plan`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = OnboardingPlanPut)]
struct PutPlan {
    /// The role this plan is for; absent for the product-wide plan.
    #[serde(default)]
    role: Option<String>,
    /// The workflows, in the configuration form, read leniently: what does
    /// not read is skipped and reported.
    #[schema(value_type = Vec<OnboardingWorkflow>)]
    workflows: Value,
}

/// An onboarding plan as stored.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = OnboardingPlanView)]
struct PlanView {
    /// The role it is for; null for the product-wide plan.
    role: Option<String>,
    /// The workflows, in order.
    #[schema(value_type = Vec<OnboardingWorkflow>)]
    workflows: Value,
}

/// A stored plan, and what was skipped reading it.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = OnboardingPlanStored)]
struct PutPlanView {
    #[serde(flatten)]
    plan: PlanView,
    /// Entries and fields skipped or read as defaults, with their paths.
    skipped: Vec<PlanIssue>,
}

fn role_of(r: &Option<String>) -> Option<&str> {
    r.as_deref().filter(|r| !r.trim().is_empty())
}

/// Replaces the product's onboarding plan for a role (or the product-wide
/// plan). A plan with structural errors (a prerequisite cycle or an unknown
/// prerequisite, a URL glob over the limit) is refused with `errors`.
#[utoipa::path(
    put,
    path = "/products/{product_id}/onboarding-plan",
    tag = "adoption",
    params(ProductPath),
    request_body = PutPlan,
    responses((status = 200, description = "The plan as stored.", body = PutPlanView), PutProblems),
)]
async fn put_plan(
    State(app): State<Adoptions>,
    Tenant(product): Tenant,
    ApiJson(req): ApiJson<PutPlan>,
) -> Result<ApiJson<PutPlanView>, ApiError> {
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
    Ok(ApiJson(PutPlanView {
        plan: PlanView {
            role: role_of(&req.role).map(str::to_owned),
            workflows: load.plan.to_config(),
        },
        skipped: load.skipped,
    }))
}

/// The product's onboarding plan for a role (or the product-wide plan).
#[utoipa::path(
    get,
    path = "/products/{product_id}/onboarding-plan",
    tag = "adoption",
    params(ProductPath, RoleQuery),
    responses((status = 200, description = "The plan.", body = PlanView), ReadProblems),
)]
async fn get_plan(
    State(app): State<Adoptions>,
    Tenant(product): Tenant,
    q: Result<Query<RoleQuery>, QueryRejection>,
) -> Result<ApiJson<PlanView>, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let plan = app
        .store
        .get_plan(&product, role_of(&q.role))
        .await?
        .ok_or_else(|| ApiError::not_found("no onboarding plan for this role"))?;
    Ok(ApiJson(PlanView {
        role: role_of(&q.role).map(str::to_owned),
        workflows: plan.to_config(),
    }))
}

/// `PUT .../tour-catalog`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = TourCatalogPut)]
struct PutCatalog {
    /// The role this catalog is for; absent for the product-wide catalog.
    #[serde(default)]
    role: Option<String>,
    /// The tours, read leniently: the id from `tour_id`, `user_tour_id` or
    /// `id`, the name from `name` or `user_tour_name`, `use_when` from
    /// `use_when` or `description`; an entry without a text id is skipped
    /// and reported.
    #[schema(value_type = Vec<TourCatalogEntry>)]
    tours: Value,
}

/// A tour catalog as stored.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = TourCatalogView)]
struct CatalogView {
    /// The role it is for; null for the product-wide catalog.
    role: Option<String>,
    /// The tours.
    tours: Vec<TourCatalogEntry>,
}

/// A stored catalog, and what was skipped reading it.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = TourCatalogStored)]
struct PutCatalogView {
    #[serde(flatten)]
    catalog: CatalogView,
    /// Entries skipped, with their paths.
    skipped: Vec<PlanIssue>,
}

/// Replaces the product's tour catalog for a role (or the product-wide
/// catalog), from which tour matching and the runners' suggestions pick.
#[utoipa::path(
    put,
    path = "/products/{product_id}/tour-catalog",
    tag = "adoption",
    params(ProductPath),
    request_body = PutCatalog,
    responses((status = 200, description = "The catalog as stored.", body = PutCatalogView), PutProblems),
)]
async fn put_catalog(
    State(app): State<Adoptions>,
    Tenant(product): Tenant,
    ApiJson(req): ApiJson<PutCatalog>,
) -> Result<ApiJson<PutCatalogView>, ApiError> {
    if !req.tours.is_array() {
        return Err(ApiError::unprocessable("tours must be an array").with("field", "tours"));
    }
    let (catalog, skipped) = tour::catalog_from_value(&req.tours);
    app.store
        .put_tour_catalog(&product, role_of(&req.role), &catalog)
        .await?;
    Ok(ApiJson(PutCatalogView {
        catalog: CatalogView {
            role: role_of(&req.role).map(str::to_owned),
            tours: catalog,
        },
        skipped,
    }))
}

/// The product's tour catalog for a role (or the product-wide catalog).
#[utoipa::path(
    get,
    path = "/products/{product_id}/tour-catalog",
    tag = "adoption",
    params(ProductPath, RoleQuery),
    responses((status = 200, description = "The catalog.", body = CatalogView), ReadProblems),
)]
async fn get_catalog(
    State(app): State<Adoptions>,
    Tenant(product): Tenant,
    q: Result<Query<RoleQuery>, QueryRejection>,
) -> Result<ApiJson<CatalogView>, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let catalog = app
        .store
        .get_tour_catalog(&product, role_of(&q.role))
        .await?
        .ok_or_else(|| ApiError::not_found("no tour catalog for this role"))?;
    Ok(ApiJson(CatalogView {
        role: role_of(&q.role).map(str::to_owned),
        tours: catalog,
    }))
}

/// A runner's report with the record after it (`user_id`, `version`,
/// `state`).
#[derive(Debug, Serialize, ToSchema)]
struct RunView<A: Serialize + ToSchema> {
    #[serde(flatten)]
    record: RecordView,
    #[serde(flatten)]
    report: RunReport<A>,
}

fn run_view<A: Serialize + ToSchema>(report: RunReport<A>) -> RunView<A> {
    RunView {
        record: view(&report.stored),
        report,
    }
}

/// Asks the adoption judge about the user and applies the journey and
/// mastery it states clearly. An answer that does not parse changes nothing
/// (`applied` false, see `llm.parse_status`).
#[utoipa::path(
    post,
    path = "/products/{product_id}/users/{user_id}/adoption/judge",
    tag = "adoption",
    params(UserPath),
    request_body = runners::JudgeRequest,
    responses(
        (status = 200, description = "The judge's report and the record after it.", body = RunView<JudgeOutput>),
        (status = 502, description = LLM_FAILED, body = Problem, content_type = "application/problem+json"),
        CommandProblems,
    ),
)]
async fn post_judge(
    State(app): State<Adoptions>,
    Tenant(product): Tenant,
    path: Result<Path<UserPath>, PathRejection>,
    ApiJson(req): ApiJson<runners::JudgeRequest>,
) -> Result<ApiJson<RunView<JudgeOutput>>, ApiError> {
    let key = record_key(product, path)?;
    let report = runners::judge_adoption(&app, &key, &req).await?;
    Ok(ApiJson(run_view(report)))
}

/// The answer of a model that refused the request.
const LLM_FAILED: &str = "The language model refused the request; nothing was changed \
                          (`llm-failed`, with `llm_error` and `prompt`).";

/// Runs the explore-first gate and, only when it passes, the onboarding
/// welcome: workflow progress, the step-in assessment and, when a message is
/// to be sent, `effects` holding it. A gate that does not pass answers its
/// decision in `gate` without asking the model.
#[utoipa::path(
    post,
    path = "/products/{product_id}/users/{user_id}/adoption/welcome",
    tag = "adoption",
    params(UserPath),
    request_body = runners::WelcomeRequest,
    responses(
        (status = 200, description = "The welcome's report and the record after it.", body = RunView<WelcomeOutput>),
        (status = 502, description = LLM_FAILED, body = Problem, content_type = "application/problem+json"),
        CommandProblems,
    ),
)]
async fn post_welcome(
    State(app): State<Adoptions>,
    Tenant(product): Tenant,
    path: Result<Path<UserPath>, PathRejection>,
    ApiJson(req): ApiJson<runners::WelcomeRequest>,
) -> Result<ApiJson<RunView<WelcomeOutput>>, ApiError> {
    let key = record_key(product, path)?;
    let report = runners::onboarding_welcome(&app, &key, &req).await?;
    Ok(ApiJson(run_view(report)))
}

/// Records how a tour of the user's plan ended and asks for the follow-up
/// message, recorded with the outcome (and onboarding stamped complete when
/// nothing is outstanding and the model agrees).
#[utoipa::path(
    post,
    path = "/products/{product_id}/users/{user_id}/adoption/followup",
    tag = "adoption",
    params(UserPath),
    request_body = runners::FollowupRequest,
    responses(
        (status = 200, description = "The follow-up's report and the record after it.", body = RunView<FollowupOutput>),
        (status = 502, description = LLM_FAILED, body = Problem, content_type = "application/problem+json"),
        CommandProblems,
    ),
)]
async fn post_followup(
    State(app): State<Adoptions>,
    Tenant(product): Tenant,
    path: Result<Path<UserPath>, PathRejection>,
    ApiJson(req): ApiJson<runners::FollowupRequest>,
) -> Result<ApiJson<RunView<FollowupOutput>>, ApiError> {
    let key = record_key(product, path)?;
    let report = runners::onboarding_followup(&app, &key, &req).await?;
    Ok(ApiJson(run_view(report)))
}

/// Captures a snapshot of the user's session, asks for a handover summary
/// and stores it, recording the session in the user's index.
#[utoipa::path(
    post,
    path = "/products/{product_id}/users/{user_id}/adoption/session-summary",
    tag = "adoption",
    params(UserPath),
    request_body = runners::SummaryRequest,
    responses(
        (status = 200, description = "The summary's report and the record after it.", body = RunView<SummaryAnswer>),
        (status = 502, description = LLM_FAILED, body = Problem, content_type = "application/problem+json"),
        CommandProblems,
    ),
)]
async fn post_session_summary(
    State(app): State<Adoptions>,
    Tenant(product): Tenant,
    path: Result<Path<UserPath>, PathRejection>,
    ApiJson(req): ApiJson<runners::SummaryRequest>,
) -> Result<ApiJson<RunView<SummaryAnswer>>, ApiError> {
    let key = record_key(product, path)?;
    // Epoch seconds that are no instant are refused here; a session that
    // starts after now is the machine's to refuse.
    let started_at = Timestamp::from_epoch_seconds(req.started_at).map_err(|e| {
        ApiError::unprocessable(format!("started_at: {e}")).with("field", "started_at")
    })?;
    let report = runners::session_summary(&app, &key, &req, started_at).await?;
    Ok(ApiJson(run_view(report)))
}

/// Picks the tours that answer a user's question from the catalog visible
/// to their role. Nothing is saved; when no tour is visible the model is not
/// asked.
#[utoipa::path(
    post,
    path = "/products/{product_id}/tours/match",
    tag = "adoption",
    params(ProductPath),
    request_body = runners::TourMatchRequest,
    responses(
        (status = 200, description = "The validated answer.", body = runners::TourMatchReport),
        (status = 502, description = LLM_FAILED, body = Problem, content_type = "application/problem+json"),
        PutProblems,
    ),
)]
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
