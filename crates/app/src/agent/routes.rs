//! HTTP routes under `/v1/products/{product_id}/agent`: turns, threads and
//! the owner's memory. The agent's errors become answers here, and only
//! here ([`answer`]).

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use parlance_core::ProductId;
use parlance_core::turn::seed::SupportOutput;
use parlance_core::turn::{Checkpoint, MemoryEntry, MemoryId, MemoryKind, OwnerId, ThreadId};
use parlance_ports::CrisisLogRecord;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::Agent;
use super::service::{self, AgentError, AgentInput, MemoryView, ThreadView};
use crate::auth::Tenant;
use crate::execute::ServiceError;
use crate::http::openapi::{CommandProblems, PutProblems, ReadProblems};
use crate::http::{ApiError, ApiJson};
use crate::turn::TurnRunError;

/// The agent routes.
pub fn routes() -> OpenApiRouter<Agent> {
    OpenApiRouter::new()
        .routes(routes!(turn))
        .routes(routes!(thread))
        .routes(routes!(end))
        .routes(routes!(list_memory, add_memory))
        .routes(routes!(delete_memory))
        .routes(routes!(crisis_log))
}

/// The path of one thread. The id is checked by the handler, so a bad one
/// answers 422 naming it.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
struct ThreadPath {
    /// The product (the key's).
    #[param(value_type = ProductId)]
    #[allow(dead_code)] // checked by `Tenant`
    product_id: String,
    /// The thread (the session id of its turns).
    #[param(value_type = ThreadId)]
    id: String,
}

/// The path of an owner's records. The owner is checked by the handler, so
/// a bad one answers 422 naming it.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
struct OwnerPath {
    /// The product (the key's).
    #[param(value_type = ProductId)]
    #[allow(dead_code)] // checked by `Tenant`
    product_id: String,
    /// The owner: the user id, else the session id, of the turns.
    #[param(value_type = OwnerId)]
    owner: String,
}

/// The path of one memory entry.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
struct MemoryPath {
    /// The product (the key's).
    #[param(value_type = ProductId)]
    #[allow(dead_code)] // checked by `Tenant`
    product_id: String,
    /// The owner.
    #[param(value_type = OwnerId)]
    owner: String,
    /// The entry; an id that is no UUID names no entry (404).
    #[param(value_type = MemoryId)]
    id: String,
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

/// Runs one turn of the support agent: the crisis gate, then the reply on
/// the route it chose. The turn is committed to its thread (the session id,
/// else the `default` thread of the user) or not at all.
#[utoipa::path(
    post,
    path = "/products/{product_id}/agent/turns",
    tag = "agent",
    params(crate::http::openapi::ProductPath),
    request_body = AgentInput,
    responses(
        (status = 200, description = "The turn's reply, committed to its thread.", body = SupportOutput),
        CommandProblems,
    ),
)]
async fn turn(
    State(state): State<Agent>,
    tenant: Tenant,
    ApiJson(input): ApiJson<AgentInput>,
) -> Result<ApiJson<SupportOutput>, ApiError> {
    let output = service::run_turn(&state, &tenant.0, input)
        .await
        .map_err(answer)?;
    Ok(ApiJson(output))
}

/// Whose thread: `user_id`, else the thread id itself (a session owner).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct OwnerQuery {
    /// The user whose thread it is; absent when the thread's owner is its
    /// session.
    user_id: Option<String>,
}

/// A thread as stored: its transcript and its persisted state.
#[utoipa::path(
    get,
    path = "/products/{product_id}/agent/threads/{id}",
    tag = "agent",
    params(ThreadPath, OwnerQuery),
    responses((status = 200, description = "The thread.", body = ThreadView), ReadProblems),
)]
async fn thread(
    State(state): State<Agent>,
    tenant: Tenant,
    Path(ThreadPath { id, .. }): Path<ThreadPath>,
    Query(q): Query<OwnerQuery>,
) -> Result<ApiJson<ThreadView>, ApiError> {
    let (owner, thread) = service::resolve(q.user_id.as_deref(), Some(&id)).map_err(answer)?;
    let view = service::thread(&state, &tenant.0, owner, thread)
        .await
        .map_err(answer)?;
    Ok(ApiJson(view))
}

/// `POST .../end` body.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = AgentEndRequest)]
struct EndBody {
    /// The user whose thread it is; absent when the thread's owner is its
    /// session.
    #[serde(default)]
    user_id: Option<String>,
}

/// Ends a session: the model summarises the thread's transcript into an
/// episodic entry of the owner's memory, and the summary becomes the
/// thread's session memory. A model that fails answers 503 and changes
/// nothing.
#[utoipa::path(
    post,
    path = "/products/{product_id}/agent/threads/{id}/end",
    tag = "agent",
    params(ThreadPath),
    request_body = EndBody,
    responses(
        (status = 201, description = "The episodic entry stored.", body = MemoryView),
        CommandProblems,
    ),
)]
async fn end(
    State(state): State<Agent>,
    tenant: Tenant,
    Path(ThreadPath { id, .. }): Path<ThreadPath>,
    ApiJson(body): ApiJson<EndBody>,
) -> Result<(StatusCode, ApiJson<MemoryView>), ApiError> {
    let (owner, thread) = service::resolve(body.user_id.as_deref(), Some(&id)).map_err(answer)?;
    let view = service::end_session(&state, &tenant.0, owner, thread)
        .await
        .map_err(answer)?;
    Ok((StatusCode::CREATED, ApiJson(view)))
}

fn owner_id(owner: &str) -> Result<OwnerId, ApiError> {
    OwnerId::parse(owner).map_err(|e| ApiError::unprocessable(e.to_string()))
}

/// Which entries to list.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct KindQuery {
    /// Only entries of this kind; every entry when absent.
    #[param(inline)]
    kind: Option<MemoryKind>,
}

/// An owner's memory entries.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = AgentMemoryList)]
struct MemoryList {
    /// The entries.
    entries: Vec<MemoryView>,
}

/// The owner's long-term memory entries.
#[utoipa::path(
    get,
    path = "/products/{product_id}/agent/memory/{owner}",
    tag = "agent",
    params(OwnerPath, KindQuery),
    responses((status = 200, description = "The entries (none for an unknown owner).", body = MemoryList), ReadProblems),
)]
async fn list_memory(
    State(state): State<Agent>,
    tenant: Tenant,
    Path(OwnerPath { owner, .. }): Path<OwnerPath>,
    Query(q): Query<KindQuery>,
) -> Result<ApiJson<MemoryList>, ApiError> {
    let owner = owner_id(&owner)?;
    let records = state.memory_store.list(&tenant.0, &owner, q.kind).await?;
    Ok(ApiJson(MemoryList {
        entries: records.into_iter().map(MemoryView::from).collect(),
    }))
}

/// `POST .../memory/{owner}` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = AgentMemoryAdd)]
struct AddBody {
    /// The entry to store.
    entry: MemoryEntry,
}

/// Stores an entry in the owner's long-term memory (embedded for recall).
#[utoipa::path(
    post,
    path = "/products/{product_id}/agent/memory/{owner}",
    tag = "agent",
    params(OwnerPath),
    request_body = AddBody,
    responses((status = 201, description = "The entry as stored.", body = MemoryView), PutProblems),
)]
async fn add_memory(
    State(state): State<Agent>,
    tenant: Tenant,
    Path(OwnerPath { owner, .. }): Path<OwnerPath>,
    ApiJson(body): ApiJson<AddBody>,
) -> Result<(StatusCode, ApiJson<MemoryView>), ApiError> {
    let owner = owner_id(&owner)?;
    let view = service::add_memory(&state, &tenant.0, owner, body.entry)
        .await
        .map_err(answer)?;
    Ok((StatusCode::CREATED, ApiJson(view)))
}

/// Deletes one entry of the owner's memory.
#[utoipa::path(
    delete,
    path = "/products/{product_id}/agent/memory/{owner}/{id}",
    tag = "agent",
    params(MemoryPath),
    responses((status = 204, description = "The entry is gone."), ReadProblems),
)]
async fn delete_memory(
    State(state): State<Agent>,
    tenant: Tenant,
    Path(MemoryPath { owner, id, .. }): Path<MemoryPath>,
) -> Result<StatusCode, ApiError> {
    let owner = owner_id(&owner)?;
    let id = Uuid::parse_str(&id).map_err(|_| ApiError::not_found("no such memory entry"))?;
    state
        .memory_store
        .delete(&tenant.0, &owner, MemoryId::from_uuid(id))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Paging of the crisis log.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct PageQuery {
    /// Only records after this sequence number.
    after_seq: Option<i64>,
    /// At most this many records (up to 1,000; default 100).
    #[param(minimum = 0)]
    limit: Option<usize>,
}

/// A page of the crisis log, oldest first.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = AgentCrisisLogPage)]
struct CrisisLogPage {
    /// The records.
    records: Vec<CrisisLogRecord>,
}

/// The owner's crisis-gate assessments, oldest first, for safety review.
#[utoipa::path(
    get,
    path = "/products/{product_id}/agent/crisis-log/{owner}",
    tag = "agent",
    params(OwnerPath, PageQuery),
    responses((status = 200, description = "A page of the crisis log.", body = CrisisLogPage), ReadProblems),
)]
async fn crisis_log(
    State(state): State<Agent>,
    tenant: Tenant,
    Path(OwnerPath { owner, .. }): Path<OwnerPath>,
    Query(q): Query<PageQuery>,
) -> Result<ApiJson<CrisisLogPage>, ApiError> {
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
    Ok(ApiJson(CrisisLogPage { records }))
}
