//! HTTP routes under `/v1/products/{product_id}/agent`: turns, threads and
//! the owner's memory. The agent's errors become answers here, and only
//! here ([`answer`]). A turn or a resume asked for with
//! `Accept: text/event-stream` answers server-sent events ([`streamed`]).

use std::convert::Infallible;
use std::future::Future;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use parlance_core::ProductId;
use parlance_core::turn::seed::SupportOutput;
use parlance_core::turn::{Checkpoint, MemoryEntry, MemoryId, MemoryKind, OwnerId, ThreadId};
use parlance_ports::CrisisLogRecord;
use serde::{Deserialize, Serialize};
use serde_json::Value;
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
use crate::turn::{TurnEvent, TurnEvents, TurnRunError};

/// The agent routes.
pub fn routes() -> OpenApiRouter<Agent> {
    OpenApiRouter::new()
        .routes(routes!(turn))
        .routes(routes!(thread))
        .routes(routes!(resume))
        .routes(routes!(end))
        .routes(routes!(list_memory, add_memory))
        .routes(routes!(delete_memory))
        .routes(routes!(crisis_log))
        .merge(super::threads::routes())
}

/// The path of one thread. The id is checked by the handler, so a bad one
/// answers 422 naming it.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub(super) struct ThreadPath {
    /// The product (the key's).
    #[param(value_type = ProductId)]
    #[allow(dead_code)] // checked by `Tenant`
    pub(super) product_id: String,
    /// The thread (the session id of its turns).
    #[param(value_type = ThreadId)]
    pub(super) id: String,
}

/// The path of an owner's records. The owner is checked by the handler, so
/// a bad one answers 422 naming it.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub(super) struct OwnerPath {
    /// The product (the key's).
    #[param(value_type = ProductId)]
    #[allow(dead_code)] // checked by `Tenant`
    pub(super) product_id: String,
    /// The owner: the user id, else the session id, of the turns.
    #[param(value_type = OwnerId)]
    pub(super) owner: String,
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

/// True when the request asks for server-sent events.
fn wants_events(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/event-stream"))
}

/// A turn (or resume) answered as server-sent events: `stage_started`,
/// `stage_finished`, `token`, then `interrupt` and `output` once committed,
/// or `error` (a problem document) when it fails. The turn runs in a task
/// of its own, under the request's budget, and goes on to its commit (or
/// its failure) when the client goes away: the stream only forwards its
/// events. A turn that fails before its first event (refused, not found)
/// answers that error with its status instead of a stream.
async fn streamed<F, Fut>(go: F) -> Response
where
    F: FnOnce(TurnEvents) -> Fut,
    Fut: Future<Output = Result<SupportOutput, AgentError>> + Send + 'static,
{
    let (events, mut rx) = TurnEvents::channel();
    let (failed, failure) = tokio::sync::oneshot::channel::<ApiError>();
    let turn = go(events);
    let budget = crate::budget::current();
    tokio::spawn(async move {
        let done = match budget {
            Some(deadline) => crate::budget::scoped(deadline, turn).await,
            None => turn.await,
        };
        if let Err(e) = done {
            let _ = failed.send(answer(e));
        }
    });
    let Some(first) = rx.recv().await else {
        // The turn ended without an event: it failed before its first stage.
        return match failure.await {
            Ok(e) => e.into_response(),
            // The task ended without an answer: it panicked.
            Err(closed) => ApiError::internal(&closed).into_response(),
        };
    };
    let event = |e: TurnEvent| {
        Event::default()
            .event(e.name())
            .json_data(e.data())
            .unwrap_or_else(|_| Event::default().event(e.name()))
    };
    let rest =
        futures::stream::unfold((Some(rx), Some(failure)), move |(rx, failure)| async move {
            if let Some(mut rx) = rx
                && let Some(e) = rx.recv().await
            {
                return Some((e, (Some(rx), failure)));
            }
            // The events end with the turn; a failure is the last one.
            let problem = failure?.await.ok()?.problem();
            Some((TurnEvent::Error { problem }, (None, None)))
        });
    let all = futures::StreamExt::map(
        futures::StreamExt::chain(futures::stream::iter([first]), rest),
        move |e| Ok::<_, Infallible>(event(e)),
    );
    Sse::new(all).into_response()
}

/// Runs one turn of the support agent: the crisis gate, then the reply on
/// the route it chose. The turn is committed to its thread (the session id,
/// else the `default` thread of the user) or not at all. A turn that asks
/// before acting (a memory deletion) is committed up to its question, which
/// its output carries as `interrupt`; the thread then takes no new turn
/// (409 `not-allowed`, reason `interrupt_pending`) until it is resumed.
/// With `Accept: text/event-stream` the answer is server-sent events
/// (`stage_started`, `stage_finished`, `token`, `interrupt`, then `output`
/// with this body, or `error` with a problem).
#[utoipa::path(
    post,
    path = "/products/{product_id}/agent/turns",
    tag = "agent",
    params(crate::http::openapi::ProductPath),
    request_body = AgentInput,
    responses(
        (status = 200, description = "The turn's reply, committed to its thread (or server-sent events of it).",
            content((SupportOutput = "application/json"), (String = "text/event-stream"))),
        CommandProblems,
    ),
)]
async fn turn(
    State(state): State<Agent>,
    tenant: Tenant,
    headers: HeaderMap,
    ApiJson(input): ApiJson<AgentInput>,
) -> Result<Response, ApiError> {
    service::check(&tenant.0, &input).map_err(answer)?;
    if wants_events(&headers) {
        let product = tenant.0;
        return Ok(streamed(move |events| async move {
            service::run_turn(&state, &product, input, Some(&events)).await
        })
        .await);
    }
    let output = service::run_turn(&state, &tenant.0, input, None)
        .await
        .map_err(answer)?;
    Ok(ApiJson(output).into_response())
}

/// `POST .../resume` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = AgentResumeRequest)]
struct ResumeBody {
    /// The user whose thread it is; absent when the thread's owner is its
    /// session.
    #[serde(default)]
    user_id: Option<String>,
    /// The answer to the question the turn waits on: for a memory
    /// deletion, `true` or an explicit yes deletes, `false`, no or anything
    /// else keeps everything.
    #[schema(value_type = Value)]
    value: Value,
}

/// Resumes the turn the thread waits on with the person's answer, runs it
/// to its end (or to another question) and commits it. 409 `not-allowed`
/// with reason `no_interrupt` when no turn waits, among them the loser of
/// two racing resumes. With `Accept: text/event-stream` the answer is
/// server-sent events, as for a turn.
#[utoipa::path(
    post,
    path = "/products/{product_id}/agent/threads/{id}/resume",
    tag = "agent",
    params(ThreadPath),
    request_body = ResumeBody,
    responses(
        (status = 200, description = "The resumed turn's reply, committed to its thread (or server-sent events of it).",
            content((SupportOutput = "application/json"), (String = "text/event-stream"))),
        CommandProblems,
    ),
)]
async fn resume(
    State(state): State<Agent>,
    tenant: Tenant,
    headers: HeaderMap,
    Path(ThreadPath { id, .. }): Path<ThreadPath>,
    ApiJson(body): ApiJson<ResumeBody>,
) -> Result<Response, ApiError> {
    let (owner, thread) = service::resolve(body.user_id.as_deref(), Some(&id)).map_err(answer)?;
    if wants_events(&headers) {
        let product = tenant.0;
        return Ok(streamed(move |events| async move {
            service::resume_turn(&state, &product, owner, thread, body.value, Some(&events)).await
        })
        .await);
    }
    let output = service::resume_turn(&state, &tenant.0, owner, thread, body.value, None)
        .await
        .map_err(answer)?;
    Ok(ApiJson(output).into_response())
}

/// Whose thread: `user_id`, else the thread id itself (a session owner).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct OwnerQuery {
    /// The user whose thread it is; absent when the thread's owner is its
    /// session.
    pub(super) user_id: Option<String>,
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
