//! The reference-compatible flow routes under `/v1/ai/{flow}`, and the list
//! of loaded flows.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::routing::{get, post};
use parlance_core::ProductId;
use parlance_core::flow::{ClientEvent, Flow, FlowError, FlowKey, FlowRecord, FlowSessionId};
use serde::Deserialize;
use serde_json::{Value, json};

use super::Flows;
use super::service::{AiResponse, TaskState};
use crate::auth::Tenant;
use crate::execute::ServiceError;
use crate::http::{ApiError, ApiJson};

/// The flow routes.
pub fn routes() -> Router<Flows> {
    Router::new()
        .route("/ai/{flow}/start_session", get(start_get).post(start_post))
        .route("/ai/{flow}/event", post(event))
        .route("/ai/{flow}/task_state/{session_id}", get(task_state))
        .route("/ai/{flow}/model/{session_id}", get(model))
        .route("/products/{product_id}/flows", get(list))
}

/// The answer to a flow call that failed: one answer per meaning, as for
/// every machine ([`ApiError::from`]), keeping what only a flow knows: a
/// validator's name and message, the template and limit of a render over
/// its budget, the template or expression that failed on its data and why, the length of a full dialogue, and which session or flow
/// does not exist.
fn answer(e: ServiceError<FlowRecord>, session: Option<&FlowSessionId>) -> ApiError {
    match (e, session) {
        (ServiceError::NotFound, Some(session)) => {
            ApiError::not_found(format!("no session `{session}` in this flow"))
        }
        (ServiceError::Refused { error, .. }, _) => {
            let api = ApiError::refused(&error);
            match error {
                FlowError::Validator { validator, message } => {
                    api.with("validator", validator).with("message", message)
                }
                FlowError::RenderLimit { what, limit } => {
                    api.with("template", what).with("limit", limit)
                }
                FlowError::DialogueFull { len } => api.with("len", len),
                FlowError::Template { what, message } => {
                    api.with("template", what).with("message", message)
                }
                FlowError::Expression { expr, message } => {
                    api.with("expression", expr).with("message", message)
                }
                _ => api,
            }
        }
        (other, _) => other.into(),
    }
}

/// The flow named `name`, or the answer that there is none.
fn flow(flows: &Flows, name: &str) -> Result<Arc<Flow>, ApiError> {
    flows
        .catalog()
        .get(name)
        .ok_or_else(|| ApiError::not_found(format!("no flow named `{name}`")))
}

/// The session `id` of `product`, or the answer that there is none (an id
/// the service cannot have issued names no session).
fn key(product: ProductId, id: &str) -> Result<FlowKey, ApiError> {
    FlowSessionId::parse(id)
        .map(|session_id| FlowKey::new(product, session_id))
        .map_err(|_| ApiError::not_found(format!("no session `{id}` in this flow")))
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
    State(state): State<Flows>,
    Tenant(product): Tenant,
    Path(name): Path<String>,
) -> Result<Json<AiResponse>, ApiError> {
    let flow = flow(&state, &name)?;
    state
        .start_session(&product, &flow)
        .await
        .map(Json)
        .map_err(|e| answer(e, None))
}

async fn start_post(
    State(state): State<Flows>,
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
    State(state): State<Flows>,
    Tenant(product): Tenant,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<EventBody>,
) -> Result<Json<AiResponse>, ApiError> {
    let flow = flow(&state, &name)?;
    let key = key(product, &body.session_id)?;
    state
        .event(
            &key,
            &flow,
            ClientEvent::parse(&body.event),
            &body.event_input,
        )
        .await
        .map(Json)
        .map_err(|e| answer(e, Some(&key.session_id)))
}

async fn task_state(
    State(state): State<Flows>,
    Tenant(product): Tenant,
    Path((name, session_id)): Path<(String, String)>,
) -> Result<Json<TaskState>, ApiError> {
    let flow = flow(&state, &name)?;
    let key = key(product, &session_id)?;
    state
        .task_state(&key, &flow)
        .await
        .map(Json)
        .map_err(|e| answer(e, Some(&key.session_id)))
}

async fn model(
    State(state): State<Flows>,
    Tenant(product): Tenant,
    Path((name, session_id)): Path<(String, String)>,
) -> Result<Json<AiResponse>, ApiError> {
    let flow = flow(&state, &name)?;
    let key = key(product, &session_id)?;
    state
        .model(&key, &flow)
        .await
        .map(Json)
        .map_err(|e| answer(e, Some(&key.session_id)))
}

async fn list(State(state): State<Flows>, Tenant(_product): Tenant) -> Json<Value> {
    let flows: Vec<Value> = state
        .catalog()
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
