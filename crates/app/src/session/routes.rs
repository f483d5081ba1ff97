//! HTTP routes of the session machine, under `/v1/products/{product_id}`.

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::routing::{get, post, put};
use parlance_core::MachineError as _;
use parlance_core::ProductId;
use parlance_core::session::{SessionEvent, SessionId, SessionKey, SessionState, TourCatalog};
use parlance_ports::Version;
use serde::Deserialize;
use serde_json::{Value, json};

use super::Sessions;
use super::service::{self, EventApplied};
use crate::auth::Tenant;
use crate::execute::ServiceError;
use crate::http::{ApiError, ApiJson};

/// The session routes.
pub fn routes() -> Router<Sessions> {
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

fn session_key(product: ProductId, raw: &str) -> Result<SessionKey, ApiError> {
    let sid = SessionId::parse(raw).map_err(|e| ApiError::unprocessable(e.to_string()))?;
    Ok(SessionKey::new(product, sid))
}

/// The session as the API shows it: the snapshot, its version and the gate.
fn view(s: &SessionState, version: Version) -> Value {
    let (allowed, reason) = s.can_deliver_proactive();
    json!({
        "version": version,
        "proactive_gate": {"allowed": allowed, "reason": reason},
        "snapshot": s.to_snapshot(),
    })
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

async fn post_event(
    State(app): State<Sessions>,
    Tenant(product): Tenant,
    Path((_, sid)): Path<(String, String)>,
    ApiJson(event): ApiJson<SessionEvent>,
) -> Result<ApiJson<Value>, ApiError> {
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
    let mut body = view(&session, version);
    body["event"] = json!(event);
    body["tick"] = json!(tick);
    body["result"] = json!(result);
    Ok(ApiJson(body))
}

async fn get_session(
    State(app): State<Sessions>,
    Tenant(product): Tenant,
    Path((_, sid)): Path<(String, String)>,
) -> Result<ApiJson<Value>, ApiError> {
    let key = session_key(product, &sid)?;
    match service::load_ticked(&app, &key).await.map_err(answer)? {
        Some((s, version)) => Ok(ApiJson(view(&s, version))),
        None => Err(ApiError::not_found(format!(
            "no session {}",
            key.session_id
        ))),
    }
}

async fn get_gate(
    State(app): State<Sessions>,
    Tenant(product): Tenant,
    Path((_, sid)): Path<(String, String)>,
) -> Result<ApiJson<Value>, ApiError> {
    let key = session_key(product, &sid)?;
    let (allowed, reason, state) = service::gate(&app, &key).await.map_err(answer)?;
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
    State(app): State<Sessions>,
    Tenant(product): Tenant,
    Path((_, sid)): Path<(String, String)>,
    Query(q): Query<AuditQuery>,
) -> Result<ApiJson<Value>, ApiError> {
    let key = session_key(product, &sid)?;
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let records = app
        .shared
        .audit
        .list(
            &key.product_id,
            parlance_core::EntityKind::Session,
            key.session_id.as_str(),
            q.after_seq,
            limit,
        )
        .await?;
    Ok(ApiJson(json!({ "records": records })))
}

async fn put_tours(
    State(app): State<Sessions>,
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
    State(app): State<Sessions>,
    Tenant(product): Tenant,
) -> Result<ApiJson<Value>, ApiError> {
    Ok(ApiJson(app.tours.get(&product).await?.to_value()))
}
