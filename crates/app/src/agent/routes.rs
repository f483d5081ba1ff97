//! HTTP routes under `/v1/products/{product_id}/agent`: turns, threads and
//! the owner's memory. The agent's errors become answers here, and only
//! here ([`answer`]).

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{delete, get, post};
use parlance_core::turn::seed::SupportOutput;
use parlance_core::turn::{Checkpoint, MemoryEntry, MemoryId, MemoryKind, OwnerId};
use parlance_ports::CrisisLogRecord;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::Agent;
use super::service::{self, AgentError, AgentInput, MemoryView, ThreadView};
use crate::auth::Tenant;
use crate::execute::ServiceError;
use crate::http::{ApiError, ApiJson};
use crate::turn::TurnRunError;

/// The agent routes.
pub fn routes() -> Router<Agent> {
    Router::new()
        .route("/products/{product_id}/agent/turns", post(turn))
        .route("/products/{product_id}/agent/threads/{id}", get(thread))
        .route("/products/{product_id}/agent/threads/{id}/end", post(end))
        .route(
            "/products/{product_id}/agent/memory/{owner}",
            get(list_memory).post(add_memory),
        )
        .route(
            "/products/{product_id}/agent/memory/{owner}/{id}",
            delete(delete_memory),
        )
        .route(
            "/products/{product_id}/agent/crisis-log/{owner}",
            get(crisis_log),
        )
}

/// The answer to an agent error: 422 for a request without a usable owner
/// or message, 404 for a thread with no turn, 503 when a stage or the model
/// failed (the turn could not be planned; nothing was changed), the
/// executor's answers for the thread's store (503 `contended` when every
/// attempt lost its commit), 504 `deadline-exceeded` when the request's
/// budget ran out before the turn's commit (nothing was committed), 500 for
/// a graph or state that cannot run.
pub(super) fn answer(e: AgentError) -> ApiError {
    match e {
        AgentError::NoOwner | AgentError::BadId(_) | AgentError::EmptyMessage => {
            ApiError::unprocessable(e.to_string())
        }
        AgentError::NoThread => ApiError::not_found(e.to_string()),
        AgentError::Turn(TurnRunError::Service(e)) => e.into(),
        AgentError::Turn(TurnRunError::Deadline) => crate::http::exhausted_now(),
        AgentError::Turn(stage @ TurnRunError::Stage { .. }) => {
            // The answer names the stage; what made it fail is logged here.
            let cause = std::error::Error::source(&stage);
            tracing::warn!(error = %stage, cause = ?cause, "agent stage failed");
            ServiceError::<Checkpoint>::Planning(Box::new(stage)).into()
        }
        AgentError::Turn(broken) => ApiError::internal(&broken),
        AgentError::Model(_) | AgentError::Malformed(_) => {
            tracing::warn!(error = %e, source = ?std::error::Error::source(&e), "episodic summary failed");
            ApiError::unavailable(format!("{e}; retry later"))
        }
        AgentError::Port(p) => p.into(),
    }
}

async fn turn(
    State(state): State<Agent>,
    tenant: Tenant,
    ApiJson(input): ApiJson<AgentInput>,
) -> Result<axum::Json<SupportOutput>, ApiError> {
    let output = service::run_turn(&state, &tenant.0, input)
        .await
        .map_err(answer)?;
    Ok(axum::Json(output))
}

/// Whose thread: `user_id`, else the thread id itself (a session owner).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OwnerQuery {
    user_id: Option<String>,
}

async fn thread(
    State(state): State<Agent>,
    tenant: Tenant,
    Path((_, id)): Path<(String, String)>,
    Query(q): Query<OwnerQuery>,
) -> Result<axum::Json<ThreadView>, ApiError> {
    let (owner, thread) = service::resolve(q.user_id.as_deref(), Some(&id)).map_err(answer)?;
    let view = service::thread(&state, &tenant.0, owner, thread)
        .await
        .map_err(answer)?;
    Ok(axum::Json(view))
}

/// `POST .../end` body.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct EndBody {
    #[serde(default)]
    user_id: Option<String>,
}

async fn end(
    State(state): State<Agent>,
    tenant: Tenant,
    Path((_, id)): Path<(String, String)>,
    ApiJson(body): ApiJson<EndBody>,
) -> Result<(StatusCode, axum::Json<MemoryView>), ApiError> {
    let (owner, thread) = service::resolve(body.user_id.as_deref(), Some(&id)).map_err(answer)?;
    let view = service::end_session(&state, &tenant.0, owner, thread)
        .await
        .map_err(answer)?;
    Ok((StatusCode::CREATED, axum::Json(view)))
}

fn owner_id(owner: &str) -> Result<OwnerId, ApiError> {
    OwnerId::parse(owner).map_err(|e| ApiError::unprocessable(e.to_string()))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KindQuery {
    kind: Option<MemoryKind>,
}

#[derive(Debug, Serialize)]
struct MemoryList {
    entries: Vec<MemoryView>,
}

async fn list_memory(
    State(state): State<Agent>,
    tenant: Tenant,
    Path((_, owner)): Path<(String, String)>,
    Query(q): Query<KindQuery>,
) -> Result<axum::Json<MemoryList>, ApiError> {
    let owner = owner_id(&owner)?;
    let records = state.memory_store.list(&tenant.0, &owner, q.kind).await?;
    Ok(axum::Json(MemoryList {
        entries: records.into_iter().map(MemoryView::from).collect(),
    }))
}

/// `POST .../memory/{owner}` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AddBody {
    entry: MemoryEntry,
}

async fn add_memory(
    State(state): State<Agent>,
    tenant: Tenant,
    Path((_, owner)): Path<(String, String)>,
    ApiJson(body): ApiJson<AddBody>,
) -> Result<(StatusCode, axum::Json<MemoryView>), ApiError> {
    let owner = owner_id(&owner)?;
    let view = service::add_memory(&state, &tenant.0, owner, body.entry)
        .await
        .map_err(answer)?;
    Ok((StatusCode::CREATED, axum::Json(view)))
}

async fn delete_memory(
    State(state): State<Agent>,
    tenant: Tenant,
    Path((_, owner, id)): Path<(String, String, String)>,
) -> Result<StatusCode, ApiError> {
    let owner = owner_id(&owner)?;
    let id = Uuid::parse_str(&id).map_err(|_| ApiError::not_found("no such memory entry"))?;
    state
        .memory_store
        .delete(&tenant.0, &owner, MemoryId::from_uuid(id))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PageQuery {
    after_seq: Option<i64>,
    limit: Option<usize>,
}

#[derive(Debug, Serialize)]
struct CrisisLogPage {
    records: Vec<CrisisLogRecord>,
}

async fn crisis_log(
    State(state): State<Agent>,
    tenant: Tenant,
    Path((_, owner)): Path<(String, String)>,
    Query(q): Query<PageQuery>,
) -> Result<axum::Json<CrisisLogPage>, ApiError> {
    let owner = owner_id(&owner)?;
    let records = state
        .crisis_log
        .list(
            &tenant.0,
            &owner,
            q.after_seq,
            q.limit.unwrap_or(100).min(1000),
        )
        .await?;
    Ok(axum::Json(CrisisLogPage { records }))
}
