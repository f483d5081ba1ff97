//! HTTP routes of the session machine, under `/v1/products/{product_id}`.

use axum::extract::{Path, Query, State};
use parlance_core::MachineError as _;
use parlance_core::ProductId;
use parlance_core::session::{
    AssistState, SessionEvent, SessionId, SessionKey, SessionOutcome, SessionState, TourCatalog,
};
use parlance_ports::Version;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::Sessions;
use super::service::{self, EventApplied};
use crate::auth::Tenant;
use crate::execute::ServiceError;
use crate::http::audit::{AuditPage, AuditQuery};
use crate::http::openapi::{CommandProblems, PutProblems, ReadProblems};
use crate::http::{ApiError, ApiJson};

/// The session routes.
pub fn routes() -> OpenApiRouter<Sessions> {
    OpenApiRouter::new()
        .routes(routes!(post_event))
        .routes(routes!(get_session))
        .routes(routes!(get_gate))
        .routes(routes!(get_audit))
        .routes(routes!(put_tours, get_tours))
}

/// The path of one session. The ids are checked by the handler, so a bad
/// one answers 422 naming it.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
struct SessionPath {
    /// The product (the key's).
    #[param(value_type = ProductId)]
    #[allow(dead_code)] // checked by `Tenant`
    product_id: String,
    /// The session.
    #[param(value_type = SessionId)]
    session_id: String,
}

/// Whether a proactive offer may be delivered now, and why not.
#[derive(Debug, Serialize, ToSchema)]
struct ProactiveGate {
    /// True when an offer may be delivered.
    allowed: bool,
    /// Why (`v2_allowed`, `v2_cooldown_active`, or the state that forbids it).
    #[schema(example = "v2_allowed")]
    reason: &'static str,
}

/// The session as the API shows it: the snapshot, its version and the gate.
#[derive(Debug, Serialize, ToSchema)]
struct SessionView {
    /// The stored version (1 once created, one more per commit).
    version: Version,
    /// The proactive gate now.
    proactive_gate: ProactiveGate,
    /// The session snapshot (`_v: 2`), the format `load`/`save` exchange.
    #[schema(value_type = SessionSnapshot)]
    snapshot: Value,
}

/// The answer to an event: the session after it, and what the tick before
/// it and the event itself did.
#[derive(Debug, Serialize, ToSchema)]
struct EventView {
    #[serde(flatten)]
    session: SessionView,
    /// The event type applied.
    #[schema(example = "open_chat")]
    event: &'static str,
    /// What the tick before the event did (a timeout, a cooldown ending).
    tick: SessionOutcome,
    /// What the event did.
    result: SessionOutcome,
}

/// A session snapshot (`_v: 2`). Timestamps are seconds since the epoch.
#[derive(ToSchema)]
#[allow(dead_code)] // a schema only: written by `SessionState::to_snapshot`
struct SessionSnapshot {
    /// The snapshot format, 2.
    #[schema(example = 2)]
    _v: u32,
    product_id: ProductId,
    session_id: SessionId,
    /// The caller's metadata, kept as given.
    metadata: serde_json::Map<String, Value>,
    current_state: AssistState,
    last_interaction_at: parlance_core::Timestamp,
    interaction_timeout_s: f64,
    cooldown_period_s: f64,
    visual_guidance_active: bool,
    active_tour_id: Option<String>,
    conversation_linked: bool,
    conversation_id: Option<String>,
    thinking: ThinkingSnapshot,
    proactive: ProactiveSnapshot,
    reactive: ReactiveSnapshot,
}

/// The thinking state's fields.
#[derive(ToSchema)]
#[allow(dead_code)] // a schema only
struct ThinkingSnapshot {
    cooldown_active: bool,
    cooldown_started_at: Option<parlance_core::Timestamp>,
    active_cooldown_period_s: Option<f64>,
}

/// The proactive state's fields.
#[derive(ToSchema)]
#[allow(dead_code)] // a schema only
struct ProactiveSnapshot {
    user_clicked_option: bool,
    time_since_last_interaction_s: f64,
    last_message_at: parlance_core::Timestamp,
}

/// The reactive state's fields.
#[derive(ToSchema)]
#[allow(dead_code)] // a schema only
struct ReactiveSnapshot {
    time_since_last_interaction_s: f64,
    last_message_at: parlance_core::Timestamp,
}

/// The gate of one session.
#[derive(Debug, Serialize, ToSchema)]
struct GateView {
    /// True when a proactive offer may be delivered.
    allowed: bool,
    /// Why.
    reason: &'static str,
    /// The session's state, or null when there is no such session.
    current_state: Option<&'static str>,
}

fn session_key(product: ProductId, raw: &str) -> Result<SessionKey, ApiError> {
    let sid = SessionId::parse(raw).map_err(|e| ApiError::unprocessable(e.to_string()))?;
    Ok(SessionKey::new(product, sid))
}

fn view(s: &SessionState, version: Version) -> SessionView {
    let (allowed, reason) = s.can_deliver_proactive();
    SessionView {
        version,
        proactive_gate: ProactiveGate { allowed, reason },
        snapshot: s.to_snapshot(),
    }
}

/// The answer to a failed session command: the one answer of its class,
/// and for a command the state does not allow, the session as it is now
/// (`session`) and its state (`current_state`, as `state`).
fn answer(e: ServiceError<SessionState>) -> ApiError {
    match e {
        ServiceError::Refused { error, current } => {
            let answer = ApiError::refused(&error);
            match (error.not_allowed(), current) {
                (Some(refusal), Some(current)) => answer
                    .with("current_state", refusal.state.as_ref())
                    .with("session", current.state.to_snapshot()),
                _ => answer,
            }
        }
        other => other.into(),
    }
}

/// Applies one event to the session, creating it when it was never seen.
#[utoipa::path(
    post,
    path = "/products/{product_id}/sessions/{session_id}/events",
    tag = "sessions",
    params(SessionPath),
    request_body = SessionEvent,
    responses(
        (status = 200, description = "The event was applied (or deliberately ignored; see `result.ignored`).", body = EventView),
        CommandProblems,
    ),
)]
async fn post_event(
    State(app): State<Sessions>,
    Tenant(product): Tenant,
    Path(SessionPath {
        session_id: sid, ..
    }): Path<SessionPath>,
    ApiJson(event): ApiJson<SessionEvent>,
) -> Result<ApiJson<EventView>, ApiError> {
    let key = session_key(product, &sid)?;
    let EventApplied {
        event,
        tick,
        result,
        session,
        version,
    } = service::apply_event(&app, &key, event)
        .await
        .map_err(answer)?;
    Ok(ApiJson(EventView {
        session: view(&session, version),
        event,
        tick,
        result,
    }))
}

/// The session, ticked to now.
#[utoipa::path(
    get,
    path = "/products/{product_id}/sessions/{session_id}",
    tag = "sessions",
    params(SessionPath),
    responses((status = 200, description = "The session.", body = SessionView), ReadProblems),
)]
async fn get_session(
    State(app): State<Sessions>,
    Tenant(product): Tenant,
    Path(SessionPath {
        session_id: sid, ..
    }): Path<SessionPath>,
) -> Result<ApiJson<SessionView>, ApiError> {
    let key = session_key(product, &sid)?;
    match service::load_ticked(&app, &key).await.map_err(answer)? {
        Some((s, version)) => Ok(ApiJson(view(&s, version))),
        None => Err(ApiError::not_found(format!(
            "no session {}",
            key.session_id
        ))),
    }
}

/// Whether a proactive offer may be delivered to the session now.
#[utoipa::path(
    get,
    path = "/products/{product_id}/sessions/{session_id}/proactive-gate",
    tag = "sessions",
    params(SessionPath),
    responses((status = 200, description = "The gate.", body = GateView), ReadProblems),
)]
async fn get_gate(
    State(app): State<Sessions>,
    Tenant(product): Tenant,
    Path(SessionPath {
        session_id: sid, ..
    }): Path<SessionPath>,
) -> Result<ApiJson<GateView>, ApiError> {
    let key = session_key(product, &sid)?;
    let (allowed, reason, state) = service::gate(&app, &key).await.map_err(answer)?;
    Ok(ApiJson(GateView {
        allowed,
        reason,
        current_state: state.map(|s| s.as_str()),
    }))
}

/// The session's transitions, oldest first.
#[utoipa::path(
    get,
    path = "/products/{product_id}/sessions/{session_id}/audit",
    tag = "sessions",
    params(SessionPath, AuditQuery),
    responses((status = 200, description = "A page of the audit trail.", body = AuditPage), ReadProblems),
)]
async fn get_audit(
    State(app): State<Sessions>,
    Tenant(product): Tenant,
    Path(SessionPath {
        session_id: sid, ..
    }): Path<SessionPath>,
    Query(q): Query<AuditQuery>,
) -> Result<ApiJson<AuditPage>, ApiError> {
    let key = session_key(product, &sid)?;
    let page = q
        .page(
            app.shared.audit.as_ref(),
            &key.product_id,
            parlance_core::EntityKind::Session,
            key.session_id.as_str(),
        )
        .await?;
    Ok(ApiJson(page))
}

/// Replaces the product's tour catalog.
#[utoipa::path(
    put,
    path = "/products/{product_id}/tours",
    tag = "sessions",
    params(crate::http::openapi::ProductPath),
    request_body(
        content = TourCatalog,
        description = "The tour catalog. Absent defaults are 20 and 120 seconds, `null` means the \
                       session's own; a tour's absent timeouts are the catalog's; list entries that \
                       are not objects or have no `id` are skipped, unknown keys ignored.",
    ),
    responses((status = 200, description = "The catalog as stored.", body = TourCatalog), PutProblems),
)]
async fn put_tours(
    State(app): State<Sessions>,
    Tenant(product): Tenant,
    ApiJson(doc): ApiJson<Value>,
) -> Result<ApiJson<TourCatalog>, ApiError> {
    let catalog = TourCatalog::from_value(&doc).map_err(|e| {
        let path = e.path().map(str::to_owned);
        ApiError::unprocessable(e.to_string()).with("path", path)
    })?;
    app.tours.put(&product, &catalog).await?;
    Ok(ApiJson(catalog))
}

/// The product's tour catalog.
#[utoipa::path(
    get,
    path = "/products/{product_id}/tours",
    tag = "sessions",
    params(crate::http::openapi::ProductPath),
    responses((status = 200, description = "The catalog (the defaults and no tours when none was put).", body = TourCatalog), ReadProblems),
)]
async fn get_tours(
    State(app): State<Sessions>,
    Tenant(product): Tenant,
) -> Result<ApiJson<Value>, ApiError> {
    Ok(ApiJson(app.tours.get(&product).await?.to_value()))
}
