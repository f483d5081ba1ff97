//! The reference-compatible flow routes under `/v1/ai/{flow}`, and the list
//! of loaded flows.

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::routing::{get, post};
use parlance_core::flow::FlowError;
use serde::Deserialize;
use serde_json::{Value, json};

use super::service::{AiResponse, FlowServiceError};
use crate::auth::Tenant;
use crate::http::{ApiError, ApiJson};
use crate::state::AppState;

/// The flow routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/ai/{flow}/start_session", get(start_get).post(start_post))
        .route("/ai/{flow}/event", post(event))
        .route("/ai/{flow}/task_state/{session_id}", get(task_state))
        .route("/ai/{flow}/model/{session_id}", get(model))
        .route("/products/{product_id}/flows", get(list))
}

impl From<FlowServiceError> for ApiError {
    fn from(e: FlowServiceError) -> Self {
        match e {
            FlowServiceError::UnknownFlow(_) | FlowServiceError::UnknownSession(_) => {
                ApiError::not_found(e.to_string())
            }
            FlowServiceError::Port(p) => p.into(),
            FlowServiceError::Flow(f) => flow_error(f),
        }
    }
}

fn flow_error(e: FlowError) -> ApiError {
    let detail = e.to_string();
    match e {
        FlowError::TransitionNotAllowed { event, state } => {
            ApiError::conflict("transition-not-allowed", detail)
                .with("event", event)
                .with("state", state)
        }
        FlowError::Validator { validator, message } => ApiError::unprocessable(detail)
            .with("validator", validator)
            .with("message", message),
        FlowError::EventReservedForEngine { event } => {
            ApiError::conflict("event-reserved-for-engine", detail).with("event", event)
        }
        FlowError::DagRunning { state } => {
            ApiError::conflict("dag-running", detail).with("state", state)
        }
        FlowError::RetryNotOffered { state } => {
            ApiError::conflict("retry-not-offered", detail).with("state", state)
        }
        FlowError::StaleInvocation { .. } => ApiError::conflict("nothing-running", detail),
        FlowError::Hook { .. } => ApiError::unprocessable(detail),
        FlowError::RenderLimit { what, limit } => ApiError::new(
            axum::http::StatusCode::UNPROCESSABLE_ENTITY,
            "render-limit",
            detail,
        )
        .with("template", what)
        .with("limit", limit),
        FlowError::DialogueFull { len } => {
            ApiError::conflict("dialogue-full", detail).with("len", len)
        }
        FlowError::Render { .. } | FlowError::Invalid(_) => ApiError::internal(&e),
    }
}

/// The optional body of `start_session`.
#[derive(Debug, Default, Deserialize)]
struct StartBody {
    #[allow(dead_code)] // accepted for compatibility; sessions keep no user info
    user_info: Option<Value>,
    #[allow(dead_code)] // accepted for compatibility; flows have no seed hook
    seed_data: Option<String>,
}

async fn start_get(
    State(state): State<AppState>,
    Tenant(product): Tenant,
    Path(flow): Path<String>,
) -> Result<Json<AiResponse>, ApiError> {
    Ok(Json(
        state.flow_service().start_session(&product, &flow).await?,
    ))
}

async fn start_post(
    State(state): State<AppState>,
    Tenant(product): Tenant,
    Path(flow): Path<String>,
    body: Bytes,
) -> Result<Json<AiResponse>, ApiError> {
    if !body.iter().all(u8::is_ascii_whitespace) {
        serde_json::from_slice::<StartBody>(&body)
            .map_err(|e| ApiError::unprocessable(format!("bad start_session body: {e}")))?;
    }
    start_get(State(state), Tenant(product), Path(flow)).await
}

/// `POST /event` body; every field is required, as in the reference.
#[derive(Debug, Deserialize)]
struct EventBody {
    session_id: String,
    event: String,
    event_input: String,
}

async fn event(
    State(state): State<AppState>,
    Tenant(product): Tenant,
    Path(flow): Path<String>,
    ApiJson(body): ApiJson<EventBody>,
) -> Result<Json<AiResponse>, ApiError> {
    Ok(Json(
        state
            .flow_service()
            .event(
                &product,
                &flow,
                &body.session_id,
                &body.event,
                &body.event_input,
            )
            .await?,
    ))
}

async fn task_state(
    State(state): State<AppState>,
    Tenant(product): Tenant,
    Path((flow, session_id)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(
        state
            .flow_service()
            .task_state(&product, &flow, &session_id)
            .await?,
    ))
}

async fn model(
    State(state): State<AppState>,
    Tenant(product): Tenant,
    Path((flow, session_id)): Path<(String, String)>,
) -> Result<Json<AiResponse>, ApiError> {
    Ok(Json(
        state
            .flow_service()
            .model(&product, &flow, &session_id)
            .await?,
    ))
}

async fn list(State(state): State<AppState>, Tenant(_product): Tenant) -> Json<Value> {
    let flows: Vec<Value> = state
        .flow_catalog
        .iter()
        .map(|f| {
            let def = f.def();
            json!({
                "name": def.name,
                "description": def.description,
                "initial": def.initial,
                "states": def.states.iter().map(|s| json!({
                    "id": s.id,
                    "kind": s.kind.as_str(),
                    "events": f.events_from(&s.id),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    Json(json!({ "flows": flows }))
}
