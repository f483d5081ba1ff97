//! HTTP routes of the session machine, under `/v1/products/{product_id}`.

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::routing::{get, post, put};
use parlance_core::session::{SessionError, SessionId, SessionState, TourCatalog};
use serde::Deserialize;
use serde_json::{Value, json};

use super::service::{self, EventApplied, ServiceError, SessionEvent};
use crate::auth::Tenant;
use crate::http::{ApiError, ApiJson};
use crate::state::AppState;

/// The session routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/products/{product_id}/sessions/{session_id}/events",
            post(post_event),
        )
        .route(
            "/products/{product_id}/sessions/{session_id}",
            get(get_session),
        )
        .route(
            "/products/{product_id}/sessions/{session_id}/proactive-gate",
            get(get_gate),
        )
        .route(
            "/products/{product_id}/sessions/{session_id}/audit",
            get(get_audit),
        )
        .route(
            "/products/{product_id}/tours",
            put(put_tours).get(get_tours),
        )
}

fn session_id(raw: &str) -> Result<SessionId, ApiError> {
    SessionId::parse(raw).map_err(|e| ApiError::unprocessable(e.to_string()))
}

/// The session as the API shows it: the snapshot, its version and the gate.
fn view(s: &SessionState, version: i64) -> Value {
    let (allowed, reason) = s.can_deliver_proactive();
    json!({
        "version": version,
        "proactive_gate": {"allowed": allowed, "reason": reason},
        "snapshot": s.to_snapshot(),
    })
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> Self {
        match e {
            ServiceError::Machine { error, session } => match error {
                SessionError::InvalidTransition { from, command } => ApiError::conflict(
                    "invalid-transition",
                    format!("cannot {command} from state {from}"),
                )
                .with("current_state", from.as_str())
                .with("session", session.to_snapshot()),
                other => ApiError::unprocessable(other.to_string()),
            },
            ServiceError::Invalid { error } => ApiError::unprocessable(error.to_string()),
            ServiceError::Port(p) => ApiError::from(p),
            ServiceError::Contended { attempts } => {
                tracing::warn!(attempts, "session save kept conflicting");
                ApiError::unavailable("the session is too busy; retry")
            }
        }
    }
}

async fn post_event(
    State(app): State<AppState>,
    Tenant(product): Tenant,
    Path((_, sid)): Path<(String, String)>,
    ApiJson(event): ApiJson<SessionEvent>,
) -> Result<ApiJson<Value>, ApiError> {
    let sid = session_id(&sid)?;
    let EventApplied {
        event,
        tick,
        result,
        session,
        version,
    } = service::apply_event(&app, &product, &sid, &event).await?;
    let mut body = view(&session, version);
    body["event"] = json!(event);
    body["tick"] = json!(tick);
    body["result"] = json!(result);
    Ok(ApiJson(body))
}

async fn get_session(
    State(app): State<AppState>,
    Tenant(product): Tenant,
    Path((_, sid)): Path<(String, String)>,
) -> Result<ApiJson<Value>, ApiError> {
    let sid = session_id(&sid)?;
    match service::load_ticked(&app, &product, &sid).await? {
        Some((s, version)) => Ok(ApiJson(view(&s, version))),
        None => Err(ApiError::not_found(format!("no session {sid}"))),
    }
}

async fn get_gate(
    State(app): State<AppState>,
    Tenant(product): Tenant,
    Path((_, sid)): Path<(String, String)>,
) -> Result<ApiJson<Value>, ApiError> {
    let sid = session_id(&sid)?;
    let (allowed, reason, state) = service::gate(&app, &product, &sid).await?;
    Ok(ApiJson(json!({
        "allowed": allowed,
        "reason": reason,
        "current_state": state.map(|s| s.as_str()),
    })))
}

/// Paging of the audit trail.
#[derive(Debug, Deserialize)]
struct AuditQuery {
    after_seq: Option<i64>,
    limit: Option<usize>,
}

async fn get_audit(
    State(app): State<AppState>,
    Tenant(product): Tenant,
    Path((_, sid)): Path<(String, String)>,
    Query(q): Query<AuditQuery>,
) -> Result<ApiJson<Value>, ApiError> {
    let sid = session_id(&sid)?;
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let records = app
        .audit
        .list(&product, "session", sid.as_str(), q.after_seq, limit)
        .await?;
    Ok(ApiJson(json!({ "records": records })))
}

async fn put_tours(
    State(app): State<AppState>,
    Tenant(product): Tenant,
    ApiJson(doc): ApiJson<Value>,
) -> Result<ApiJson<Value>, ApiError> {
    let catalog = TourCatalog::from_value(&doc).map_err(|e| {
        let path = e.path().map(str::to_owned);
        ApiError::unprocessable(e.to_string()).with("path", path)
    })?;
    app.tours.put(&product, &catalog).await?;
    Ok(ApiJson(catalog.to_value()))
}

async fn get_tours(
    State(app): State<AppState>,
    Tenant(product): Tenant,
) -> Result<ApiJson<Value>, ApiError> {
    Ok(ApiJson(app.tours.get(&product).await?.to_value()))
}
