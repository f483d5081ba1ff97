//! HTTP routes of the agent's threads beyond a turn: an owner's threads,
//! a thread's history and its state at any checkpoint, forks, operator
//! updates, deletion, and the erasure of an owner's memory.
//!
//! Every route acts on the key's product. A thread's owner is resolved as
//! for `GET .../threads/{id}`: `user_id` when given, else the thread id
//! itself (a session owner). Errors become answers through
//! [`answer`](super::routes::answer) or the port's own mapping.

use std::collections::BTreeMap;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use parlance_core::turn::seed::{SupportInput, SupportLoaded, SupportState};
use parlance_core::turn::{
    Checkpoint, CheckpointDelta, CheckpointMeta, LoadWindow, OwnerId, Reducer, ThreadId, ThreadKey,
    TurnCommand, TurnError, TurnKey, TurnState,
};
use parlance_core::{ProductId, Timestamp};
use parlance_ports::{HistoryPage, ThreadCursor, ThreadPage, ThreadSummary};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::Agent;
use super::routes::{OwnerPath, OwnerQuery, ThreadPath, answer};
use super::service::{self, ThreadView};
use crate::auth::Tenant;
use crate::execute::Executor;
use crate::http::openapi::{CommandProblems, ReadProblems};
use crate::http::{ApiError, ApiJson};

/// The most entries a page of threads or of a history holds.
const MAX_PAGE: usize = 1000;

/// Entries in a page when the request does not say.
const DEFAULT_PAGE: usize = 50;

/// The thread routes: lists, history, time travel, forks, updates,
/// deletion and erasure.
pub(super) fn routes() -> OpenApiRouter<Agent> {
    OpenApiRouter::new()
        .routes(routes!(list_threads))
        .routes(routes!(history))
        .routes(routes!(checkpoint))
        .routes(routes!(fork))
        .routes(routes!(update_state))
        .routes(routes!(delete_thread))
        .routes(routes!(erase_memory))
}

/// The path of one checkpoint of a thread.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
struct CheckpointPath {
    /// The product (the key's).
    #[param(value_type = ProductId)]
    #[allow(dead_code)] // checked by `Tenant`
    product_id: String,
    /// The thread.
    #[param(value_type = ThreadId)]
    id: String,
    /// The checkpoint's number (1 first).
    #[param(minimum = 1, maximum = 9_223_372_036_854_775_807_u64)]
    version: u64,
}

/// The thread `id` of the caller's product, its owner resolved from
/// `user_id`.
fn thread_key(
    product_id: &ProductId,
    user_id: Option<&str>,
    id: &str,
) -> Result<ThreadKey, ApiError> {
    let (owner, thread) = service::resolve(user_id, Some(id)).map_err(answer)?;
    Ok(ThreadKey {
        product_id: product_id.clone(),
        owner,
        thread,
    })
}

fn owner_id(owner: &str) -> Result<OwnerId, ApiError> {
    OwnerId::parse(owner).map_err(|e| ApiError::unprocessable(e.to_string()).with("field", "owner"))
}

/// The page size asked for: [`DEFAULT_PAGE`] when absent; 422 outside
/// `1..=MAX_PAGE`.
fn page_limit(limit: Option<usize>) -> Result<usize, ApiError> {
    match limit.unwrap_or(DEFAULT_PAGE) {
        n @ 1..=MAX_PAGE => Ok(n),
        n => Err(
            ApiError::unprocessable(format!("limit {n} is not between 1 and {MAX_PAGE}"))
                .with("field", "limit"),
        ),
    }
}

/// One of an owner's threads, as the list shows it.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = AgentThreadSummary)]
struct SummaryView {
    /// The thread.
    thread_id: ThreadId,
    /// Its version: the number of its newest checkpoint.
    version: u64,
    /// When its newest checkpoint was written.
    updated_at: Timestamp,
    /// True when a turn of it waits on an interrupt.
    interrupted: bool,
}

impl From<ThreadSummary> for SummaryView {
    fn from(s: ThreadSummary) -> Self {
        Self {
            thread_id: s.thread,
            version: s.version,
            updated_at: s.updated_at,
            interrupted: s.interrupted,
        }
    }
}

/// A page of an owner's threads, newest first.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = AgentThreadList)]
struct ThreadList {
    /// The threads, most recently written first.
    threads: Vec<SummaryView>,
    /// Pass as `cursor` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

/// Which of an owner's threads to list.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct ThreadsQuery {
    /// The owner: the user id, else the session id, of the turns.
    #[param(value_type = OwnerId)]
    owner: String,
    /// At most this many threads (1 to 1,000; default 50).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<usize>,
    /// The `next_cursor` of the previous page.
    cursor: Option<String>,
}

/// The opaque text of a cursor: its JSON, hex-encoded.
fn encode_cursor(cursor: &ThreadCursor) -> String {
    hex::encode(serde_json::to_vec(cursor).unwrap_or_default())
}

/// The cursor `text` encodes; 422 naming `cursor` when it is not one.
fn decode_cursor(text: &str) -> Result<ThreadCursor, ApiError> {
    hex::decode(text)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .ok_or_else(|| {
            ApiError::unprocessable("cursor is not a cursor this service gave")
                .with("field", "cursor")
        })
}

/// The owner's threads, most recently written first, a page at a time.
#[utoipa::path(
    get,
    path = "/products/{product_id}/agent/threads",
    tag = "agent",
    params(crate::http::openapi::ProductPath, ThreadsQuery),
    responses((status = 200, description = "A page of the owner's threads (none for an unknown owner).", body = ThreadList), ReadProblems),
)]
async fn list_threads(
    State(state): State<Agent>,
    tenant: Tenant,
    Query(q): Query<ThreadsQuery>,
) -> Result<ApiJson<ThreadList>, ApiError> {
    let owner = owner_id(&q.owner)?;
    let limit = page_limit(q.limit)?;
    let after = q.cursor.as_deref().map(decode_cursor).transpose()?;
    let page = ThreadPage { after, limit };
    let threads = state.threads.threads(&tenant.0, &owner, &page).await?;
    let next_cursor = (threads.len() == limit)
        .then(|| threads.last())
        .flatten()
        .map(|last| {
            encode_cursor(&ThreadCursor {
                updated_at: last.updated_at,
                thread: last.thread.clone(),
            })
        });
    Ok(ApiJson(ThreadList {
        threads: threads.into_iter().map(SummaryView::from).collect(),
        next_cursor,
    }))
}

/// The checkpoint another follows.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = AgentCheckpointParent)]
struct ParentView {
    /// The thread's owner.
    owner: OwnerId,
    /// The thread.
    thread_id: ThreadId,
    /// The checkpoint's number.
    version: u64,
}

/// What wrote a checkpoint.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(as = AgentCheckpointSource)]
enum SourceView {
    /// A turn committed (whole, or up to an interrupt).
    Turn,
    /// An interrupted turn resumed and committed.
    Resume,
    /// An operator's update of the state.
    Update,
    /// The first checkpoint of a forked thread.
    Fork,
}

/// One checkpoint of a thread's history, without its state.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = AgentCheckpointMeta)]
struct MetaView {
    /// Its number: the thread's version once it was written (1 first).
    version: u64,
    /// The checkpoint it follows: the thread's previous one, or for the
    /// first checkpoint of a fork, the one it was forked from; null for a
    /// thread's first turn.
    parent: Option<ParentView>,
    /// When it was written.
    at: Timestamp,
    /// What wrote it.
    source: SourceView,
    /// True when it left a turn waiting on an interrupt.
    interrupted: bool,
}

impl TryFrom<CheckpointMeta> for MetaView {
    type Error = ApiError;

    fn try_from(m: CheckpointMeta) -> Result<Self, ApiError> {
        use parlance_core::turn::CheckpointSource as S;
        let source = match m.source {
            S::Turn => SourceView::Turn,
            S::Resume => SourceView::Resume,
            S::Update => SourceView::Update,
            S::Fork => SourceView::Fork,
            other => {
                let e = std::io::Error::other(format!("checkpoint source {other:?} has no name"));
                return Err(ApiError::internal(&e));
            }
        };
        Ok(Self {
            version: m.version,
            parent: m.parent.map(|p| ParentView {
                owner: p.owner,
                thread_id: p.thread,
                version: p.version,
            }),
            at: m.at,
            source,
            interrupted: m.interrupted,
        })
    }
}

/// A page of a thread's history, newest first.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = AgentThreadHistory)]
struct HistoryView {
    /// The checkpoints, newest first.
    checkpoints: Vec<MetaView>,
    /// Pass as `before` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_before: Option<u64>,
}

/// Which checkpoints of a thread to list.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct HistoryQuery {
    /// The user whose thread it is; absent when the thread's owner is its
    /// session.
    user_id: Option<String>,
    /// Only checkpoints numbered below this one.
    #[param(minimum = 0)]
    before: Option<u64>,
    /// At most this many checkpoints (1 to 1,000; default 50).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<usize>,
}

/// A thread's checkpoints, newest first, a page at a time: one per
/// committed turn, resume, update or fork.
#[utoipa::path(
    get,
    path = "/products/{product_id}/agent/threads/{id}/history",
    tag = "agent",
    params(ThreadPath, HistoryQuery),
    responses((status = 200, description = "A page of the thread's history.", body = HistoryView), ReadProblems),
)]
async fn history(
    State(state): State<Agent>,
    tenant: Tenant,
    Path(ThreadPath { id, .. }): Path<ThreadPath>,
    Query(q): Query<HistoryQuery>,
) -> Result<ApiJson<HistoryView>, ApiError> {
    let key = thread_key(&tenant.0, q.user_id.as_deref(), &id)?;
    let limit = page_limit(q.limit)?;
    let page = HistoryPage {
        before: q.before,
        limit,
    };
    let metas = state.threads.history(&key, page).await?;
    if metas.is_empty()
        && (q.before.is_none()
            || state
                .threads
                .history(&key, HistoryPage::newest(1))
                .await?
                .is_empty())
    {
        return Err(ApiError::not_found("no such thread"));
    }
    let next_before = (metas.len() == limit)
        .then(|| metas.last().map(|m| m.version))
        .flatten()
        .filter(|&v| v > 1);
    Ok(ApiJson(HistoryView {
        checkpoints: metas
            .into_iter()
            .map(MetaView::try_from)
            .collect::<Result<_, _>>()?,
        next_before,
    }))
}

/// The thread as it stood at one of its checkpoints (time travel): its
/// transcript up to then and its persisted state.
#[utoipa::path(
    get,
    path = "/products/{product_id}/agent/threads/{id}/checkpoints/{version}",
    tag = "agent",
    params(CheckpointPath, OwnerQuery),
    responses((status = 200, description = "The thread as of the checkpoint.", body = ThreadView), ReadProblems),
)]
async fn checkpoint(
    State(state): State<Agent>,
    tenant: Tenant,
    Path(CheckpointPath { id, version, .. }): Path<CheckpointPath>,
    Query(q): Query<OwnerQuery>,
) -> Result<ApiJson<ThreadView>, ApiError> {
    let key = thread_key(&tenant.0, q.user_id.as_deref(), &id)?;
    let cp = state
        .threads
        .load_at(&key, version)
        .await?
        .ok_or_else(|| ApiError::not_found("no such checkpoint"))?;
    Ok(ApiJson(ThreadView::of(key.thread, key.owner, &cp)))
}

/// `POST .../threads/{id}/fork` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = AgentForkRequest)]
struct ForkBody {
    /// The user whose thread it is; absent when the thread's owner is its
    /// session. The new thread has the same owner rule: this user's, else
    /// its own id is its owner.
    #[serde(default)]
    user_id: Option<String>,
    /// The checkpoint to fork from.
    #[schema(minimum = 1)]
    version: u64,
    /// The new thread; it must not exist.
    #[schema(value_type = ThreadId)]
    new_thread_id: String,
}

/// A new thread whose state is this thread's as of one of its checkpoints:
/// its first checkpoint (source `fork`) has that checkpoint as parent.
/// Turns on either thread never reach the other.
#[utoipa::path(
    post,
    path = "/products/{product_id}/agent/threads/{id}/fork",
    tag = "agent",
    params(ThreadPath),
    request_body = ForkBody,
    responses(
        (status = 201, description = "The new thread's first checkpoint.", body = MetaView),
        CommandProblems,
    ),
)]
async fn fork(
    State(state): State<Agent>,
    tenant: Tenant,
    Path(ThreadPath { id, .. }): Path<ThreadPath>,
    ApiJson(body): ApiJson<ForkBody>,
) -> Result<(StatusCode, ApiJson<MetaView>), ApiError> {
    let from = thread_key(&tenant.0, body.user_id.as_deref(), &id)?;
    let to = thread_key(&tenant.0, body.user_id.as_deref(), &body.new_thread_id)?;
    let meta = state
        .threads
        .fork(&from, body.version, &to, state.shared.clock.now())
        .await?;
    Ok((StatusCode::CREATED, ApiJson(MetaView::try_from(meta)?)))
}

/// `POST .../threads/{id}/state` body: an operator's patch.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = AgentStateUpdate)]
struct UpdateBody {
    /// The user whose thread it is; absent when the thread's owner is its
    /// session.
    #[serde(default)]
    user_id: Option<String>,
    /// The thread's version the patch was made for; refused (409
    /// `stale_turn`) when the thread has moved on. Any version when absent.
    #[serde(default)]
    expected_version: Option<u64>,
    /// New values of persisted `merge` and last-value fields, by field
    /// name (e.g. `session_memory`, `exercise_state.exercise_type`): each
    /// replaces the field's value whole.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    objects: BTreeMap<String, Value>,
    /// Entries to append to persisted `append` fields (`transcript`), by
    /// field name.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    appends: BTreeMap<String, Vec<Value>>,
}

/// The thread after an update.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = AgentStateUpdated)]
struct UpdatedView {
    /// The thread.
    thread_id: ThreadId,
    /// Its new version: the update's checkpoint.
    version: u64,
}

/// 422 naming `field` in the patch part `part` (`objects` or `appends`).
fn bad_field(part: &str, field: &str, problem: &str) -> ApiError {
    ApiError::unprocessable(format!("{part}.{field}: {problem}"))
        .with("field", format!("{part}.{field}"))
}

/// The checkpoint delta of an operator's patch, checked against the
/// support state's schema: only persisted reducer fields, `append` fields
/// through `appends` and the others through `objects`, each value one the
/// field decodes. Keys of the runtime's own (`__` first) are passed on for
/// the thread machine to refuse.
fn patch_of(body: UpdateBody) -> Result<CheckpointDelta, ApiError> {
    let schema = SupportState::schema();
    let kind = |part: &str, name: &str| -> Result<Option<Reducer>, ApiError> {
        if name.starts_with("__") {
            return Ok(None);
        }
        let spec = schema
            .field(name)
            .filter(|f| f.lifecycle.is_persisted() && f.view_of.is_none())
            .ok_or_else(|| bad_field(part, name, "not a persisted field of the thread"))?;
        Ok(spec.reducer)
    };
    for name in body.objects.keys() {
        if kind("objects", name)? == Some(Reducer::Append) {
            return Err(bad_field(
                "objects",
                name,
                "an append field; add entries through `appends`",
            ));
        }
    }
    let mut entries = 0;
    for (name, list) in &body.appends {
        match kind("appends", name)? {
            None | Some(Reducer::Append) => entries += list.len(),
            Some(_) => {
                return Err(bad_field(
                    "appends",
                    name,
                    "not an append field; replace it through `objects`",
                ));
            }
        }
    }
    crate::http::check_items("appends", entries)?;
    // Each value must be one a turn can restore, or the thread would no
    // longer run.
    let probe = Checkpoint {
        version: 0,
        lists: body.appends.clone(),
        objects: body.objects.clone(),
    };
    if let Err(TurnError::Decode { field, message }) =
        SupportState::restore(&probe, SupportInput::default(), SupportLoaded::default())
    {
        let part = if body.appends.contains_key(field) {
            "appends"
        } else {
            "objects"
        };
        return Err(bad_field(
            part,
            field,
            &format!("does not decode: {message}"),
        ));
    }
    Ok(CheckpointDelta {
        appends: body.appends,
        objects: body.objects,
    })
}

/// An operator's update of the thread's persisted state, recorded as a
/// checkpoint of its own (source `update`): entries appended to `append`
/// fields, other fields replaced. Refused while the thread is at another
/// version than `expected_version`, and for the runtime's own keys.
#[utoipa::path(
    post,
    path = "/products/{product_id}/agent/threads/{id}/state",
    tag = "agent",
    params(ThreadPath),
    request_body = UpdateBody,
    responses(
        (status = 200, description = "The update is committed.", body = UpdatedView),
        CommandProblems,
    ),
)]
async fn update_state(
    State(state): State<Agent>,
    tenant: Tenant,
    Path(ThreadPath { id, .. }): Path<ThreadPath>,
    ApiJson(body): ApiJson<UpdateBody>,
) -> Result<ApiJson<UpdatedView>, ApiError> {
    let key = thread_key(&tenant.0, body.user_id.as_deref(), &id)?;
    let base = body.expected_version;
    let delta = patch_of(body)?;
    let thread = key.thread.clone();
    // The machine decides on the version and the objects only: no list
    // entry is loaded, however long the thread.
    let window = SupportState::schema()
        .fields
        .iter()
        .filter(|f| f.lifecycle.is_persisted() && f.reducer == Some(Reducer::Append))
        .fold(LoadWindow::all(), |w, f| w.tail(f.name, 0));
    let executed = Executor::new(state.threads.as_ref(), state.shared.clock.as_ref())
        .run(
            &TurnKey::new(key, window),
            &(),
            &TurnCommand::update(base, delta),
        )
        .await
        .map_err(|e| match e {
            crate::execute::ServiceError::NotFound => ApiError::not_found("no such thread"),
            e => e.into(),
        })?;
    Ok(ApiJson(UpdatedView {
        thread_id: thread,
        version: executed.version.0,
    }))
}

/// Deletes the thread with everything stored for it: its state, its
/// transcript and its history. The owner's memory and crisis log are kept.
#[utoipa::path(
    delete,
    path = "/products/{product_id}/agent/threads/{id}",
    tag = "agent",
    params(ThreadPath, OwnerQuery),
    responses((status = 204, description = "The thread is gone."), ReadProblems),
)]
async fn delete_thread(
    State(state): State<Agent>,
    tenant: Tenant,
    Path(ThreadPath { id, .. }): Path<ThreadPath>,
    Query(q): Query<OwnerQuery>,
) -> Result<StatusCode, ApiError> {
    let key = thread_key(&tenant.0, q.user_id.as_deref(), &id)?;
    if state.threads.delete_thread(&key).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found("no such thread"))
    }
}

/// What an erasure removed.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = AgentMemoryErased)]
struct ErasedView {
    /// Memory entries deleted.
    entries_deleted: usize,
    /// Crisis-log records deleted: 0 unless the service is configured to
    /// erase the crisis log too (`agent.erase_crisis_log`).
    crisis_records_deleted: usize,
}

/// Erases the owner's memory: every entry, the procedural profile and
/// every session memory. The crisis log, a safety record, is kept unless
/// the service is configured to erase it too (`agent.erase_crisis_log`).
/// Threads are not touched: delete each with `DELETE .../threads/{id}`.
#[utoipa::path(
    delete,
    path = "/products/{product_id}/agent/memory/{owner}",
    tag = "agent",
    params(OwnerPath),
    responses((status = 200, description = "What was erased (nothing for an unknown owner).", body = ErasedView), ReadProblems),
)]
async fn erase_memory(
    State(state): State<Agent>,
    tenant: Tenant,
    Path(OwnerPath { owner, .. }): Path<OwnerPath>,
) -> Result<ApiJson<ErasedView>, ApiError> {
    let owner = owner_id(&owner)?;
    let entries_deleted = state.memory_store.erase_owner(&tenant.0, &owner).await?;
    let crisis_records_deleted = if state.erase_crisis_log {
        state.crisis_log.erase_owner(&tenant.0, &owner).await?
    } else {
        0
    };
    tracing::info!(
        product_id = %tenant.0,
        entries_deleted,
        crisis_records_deleted,
        "owner's memory erased"
    );
    Ok(ApiJson(ErasedView {
        entries_deleted,
        crisis_records_deleted,
    }))
}
