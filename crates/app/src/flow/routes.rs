//! The reference-compatible flow routes under `/v1/ai/{flow}`, and the list
//! of loaded flows.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use parlance_core::flow::{
    ClientEvent, Flow, FlowError, FlowKey, FlowRecord, FlowSessionId, StateKind, User,
};
use parlance_core::{ProductId, storable};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::openapi::{OpenApi, Ref};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::Flows;
use super::service::{AiResponse, TaskState};
use crate::auth::Tenant;
use crate::execute::ServiceError;
use crate::http::audit::{AuditPage, AuditQuery};
use crate::http::openapi::{CommandProblems, Problem, ReadProblems, SearchProblems, StateProblems};
use crate::http::{ApiError, ApiJson};

/// The flow routes.
pub fn routes() -> OpenApiRouter<Flows> {
    let mut router = OpenApiRouter::new()
        .routes(routes!(start_get, start_post))
        .routes(routes!(start_ephemeral))
        .routes(routes!(event))
        .routes(routes!(task_state))
        .routes(routes!(model))
        .routes(routes!(audit))
        .routes(routes!(user_sessions))
        .routes(routes!(list));
    start_body_not_nullable(router.get_openapi_mut());
    router
}

/// utoipa says a request body is optional only when its type is an
/// `Option`, and then also lets it be JSON `null`, which `start_session`
/// refuses (422, as every body that is not an object). This keeps the body
/// optional and describes it as the object alone.
fn start_body_not_nullable(doc: &mut OpenApi) {
    let content = doc
        .paths
        .paths
        .get_mut("/ai/{flow}/start_session")
        .and_then(|item| item.post.as_mut())
        .and_then(|op| op.request_body.as_mut())
        .and_then(|body| body.content.get_mut("application/json"));
    if let Some(content) = content {
        content.schema = Some(Ref::from_schema_name(StartBody::name()).into());
    }
}

/// The path of a flow's routes. The flow is looked up by the handler: an
/// unknown name answers 404.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
struct FlowPath {
    /// The flow's name, as loaded with `--flows`.
    #[param(example = "qa")]
    flow: String,
}

/// The path of one flow session. The id is checked by the handler: one the
/// service cannot have issued names no session, so it answers 404.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
struct FlowSessionPath {
    /// The flow's name, as loaded with `--flows`.
    #[param(example = "qa")]
    flow: String,
    /// The session, as `start_session` answered it.
    #[param(value_type = FlowSessionId)]
    session_id: String,
}

/// The answer to a flow call that failed: one answer per meaning, as for
/// every machine ([`ApiError::from`]), keeping what only a flow knows: a
/// validator's name and message, a declared hook's `fail` action and its
/// message, the template and limit of a render over its budget, the
/// template or expression that failed on its data and why, the length of a
/// full dialogue, and which session or flow does not exist.
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
                FlowError::HookFail { hook, message } => {
                    api.with("hook", hook).with("message", message)
                }
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
#[derive(Debug, Default, Deserialize, ToSchema)]
#[schema(as = FlowStart)]
struct StartBody {
    /// The user the session is for: kept with the session, shown to
    /// templates as `user_info`, and what `user_sessions` finds it by.
    #[serde(default)]
    user_info: Option<User>,
    /// Text for the start only: the initial state's enter hooks and the
    /// greeting see it as `seed_data` (and as `parsed_seed_data` when it is
    /// JSON); it is not kept.
    #[serde(default)]
    seed_data: Option<String>,
}

/// Starts a session of the flow in its initial state, and answers the
/// greeting.
#[utoipa::path(
    get,
    path = "/ai/{flow}/start_session",
    operation_id = "start_flow_session",
    tag = "flows",
    params(FlowPath),
    responses(
        (status = 200, description = "The new session.", body = AiResponse),
        StateProblems,
    ),
)]
async fn start_get(
    State(state): State<Flows>,
    Tenant(product): Tenant,
    Path(FlowPath { flow: name }): Path<FlowPath>,
) -> Result<ApiJson<AiResponse>, ApiError> {
    start(&state, product, &name, StartBody::default()).await
}

async fn start(
    state: &Flows,
    product: ProductId,
    name: &str,
    body: StartBody,
) -> Result<ApiJson<AiResponse>, ApiError> {
    let flow = flow(state, name)?;
    state
        .start_session_with(&product, &flow, body.seed_data, body.user_info)
        .await
        .map(ApiJson)
        .map_err(|e| answer(e, None))
}

/// Starts a session of the flow, as `GET` does, for the body's user and
/// seed data. The body is optional and of any content type; when present it
/// must be a JSON object of this shape, else 422.
#[utoipa::path(
    post,
    path = "/ai/{flow}/start_session",
    operation_id = "post_start_flow_session",
    tag = "flows",
    params(FlowPath),
    request_body(
        content = Option<StartBody>,
        description = "Optional: the user the session is for, and seed data for its start.",
        content_type = "application/json",
    ),
    responses(
        (status = 200, description = "The new session.", body = AiResponse),
        (
            status = 413,
            description = "The body is over the limit (`payload-too-large`).",
            content_type = "application/problem+json",
            body = Problem,
        ),
        StateProblems,
    ),
)]
async fn start_post(
    State(state): State<Flows>,
    Tenant(product): Tenant,
    Path(path): Path<FlowPath>,
    body: Bytes,
) -> Result<ApiJson<AiResponse>, ApiError> {
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        StartBody::default()
    } else {
        let bad =
            |e: serde_json::Error| ApiError::unprocessable(format!("bad start_session body: {e}"));
        // The storable-text policy of every JSON body: the user and the
        // seed reach the store.
        storable::check_json(&serde_json::from_slice::<Value>(&body).map_err(bad)?)?;
        serde_json::from_slice::<StartBody>(&body).map_err(bad)?
    };
    start(&state, product, &path.flow, body).await
}

/// The body of `start_ephemeral_session`: the first event, with the user
/// the session is for.
#[derive(Debug, Deserialize, ToSchema)]
#[schema(as = FlowEphemeralStart)]
struct EphemeralBody {
    /// One of the flow's events out of its initial state.
    #[schema(example = "user_input")]
    event: String,
    /// The event's input.
    event_input: String,
    /// The user the session is for, as in `start_session`.
    #[serde(default)]
    user_info: Option<User>,
}

/// Starts a session of the flow and sends it its first event, in one
/// commit: no greeting is rendered or recorded; the initial state's enter
/// hooks run, then the event is taken. A refused event (409, 422) leaves no
/// session behind. The session is marked `ephemeral` in its model and is
/// otherwise kept, read and changed like any other; the answer is the
/// event's, with `["poll"]` when the event started a task graph.
#[utoipa::path(
    post,
    path = "/ai/{flow}/start_ephemeral_session",
    operation_id = "start_ephemeral_flow_session",
    tag = "flows",
    params(FlowPath),
    request_body = EphemeralBody,
    responses(
        (status = 200, description = "The new session after its event.", body = AiResponse),
        CommandProblems,
    ),
)]
async fn start_ephemeral(
    State(state): State<Flows>,
    Tenant(product): Tenant,
    Path(FlowPath { flow: name }): Path<FlowPath>,
    ApiJson(body): ApiJson<EphemeralBody>,
) -> Result<ApiJson<AiResponse>, ApiError> {
    let flow = flow(&state, &name)?;
    state
        .start_ephemeral_session(
            &product,
            &flow,
            body.user_info,
            &body.event,
            &body.event_input,
        )
        .await
        .map(ApiJson)
        .map_err(|e| answer(e, None))
}

/// The sessions of this flow started for a user: the ids of this product's
/// sessions whose `user_info.email` is the body's (compared as written),
/// newest first, at most 100. The other members of the body are read and
/// checked, not compared.
#[utoipa::path(
    post,
    path = "/ai/{flow}/user_sessions",
    operation_id = "list_flow_user_sessions",
    tag = "flows",
    params(FlowPath),
    request_body = User,
    responses(
        (status = 200, description = "The session ids, newest first.", body = Vec<FlowSessionId>),
        SearchProblems,
    ),
)]
async fn user_sessions(
    State(state): State<Flows>,
    Tenant(product): Tenant,
    Path(FlowPath { flow: name }): Path<FlowPath>,
    ApiJson(user): ApiJson<User>,
) -> Result<ApiJson<Vec<FlowSessionId>>, ApiError> {
    let flow = flow(&state, &name)?;
    state
        .user_sessions(&product, &flow, &user.email)
        .await
        .map(ApiJson)
        .map_err(|e| answer(e, None))
}

/// An event for a session; every member is required, as in the reference.
#[derive(Debug, Deserialize, ToSchema)]
#[schema(as = FlowEvent)]
struct EventBody {
    /// The session, as `start_session` answered it (an unknown one answers
    /// 404).
    #[schema(value_type = FlowSessionId)]
    session_id: String,
    /// `poll`, `cancel`, `retry`, or one of the flow's events (see
    /// `next_actions`).
    #[schema(example = "user_input")]
    event: String,
    /// The user's input (empty for `poll`, `cancel` and `retry`).
    event_input: String,
}

/// Sends an event to a session: `poll` reads progress or the latest
/// response and changes nothing; `cancel` stops the running task graph and
/// returns to the last user state; `retry` runs the task graph of a state
/// whose run failed again; any other event is the flow's, fired with
/// `event_input`.
#[utoipa::path(
    post,
    path = "/ai/{flow}/event",
    operation_id = "post_flow_event",
    tag = "flows",
    params(FlowPath),
    request_body = EventBody,
    responses(
        (status = 200, description = "The session after the event.", body = AiResponse),
        CommandProblems,
    ),
)]
async fn event(
    State(state): State<Flows>,
    Tenant(product): Tenant,
    Path(FlowPath { flow: name }): Path<FlowPath>,
    ApiJson(body): ApiJson<EventBody>,
) -> Result<ApiJson<AiResponse>, ApiError> {
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
        .map(ApiJson)
        .map_err(|e| answer(e, Some(&key.session_id)))
}

/// Whether a session is ready for its next event (no task graph runs), and
/// which events it takes.
#[utoipa::path(
    get,
    path = "/ai/{flow}/task_state/{session_id}",
    operation_id = "get_flow_task_state",
    tag = "flows",
    params(FlowSessionPath),
    responses((status = 200, description = "The session's readiness.", body = TaskState), ReadProblems),
)]
async fn task_state(
    State(state): State<Flows>,
    Tenant(product): Tenant,
    Path(FlowSessionPath {
        flow: name,
        session_id,
    }): Path<FlowSessionPath>,
) -> Result<ApiJson<TaskState>, ApiError> {
    let flow = flow(&state, &name)?;
    let key = key(product, &session_id)?;
    state
        .task_state(&key, &flow)
        .await
        .map(ApiJson)
        .map_err(|e| answer(e, Some(&key.session_id)))
}

/// The session's transitions, oldest first.
#[utoipa::path(
    get,
    path = "/ai/{flow}/audit/{session_id}",
    operation_id = "get_flow_audit",
    tag = "flows",
    params(FlowSessionPath, AuditQuery),
    responses((status = 200, description = "A page of the audit trail.", body = AuditPage), ReadProblems),
)]
async fn audit(
    State(state): State<Flows>,
    Tenant(product): Tenant,
    Path(FlowSessionPath {
        flow: name,
        session_id,
    }): Path<FlowSessionPath>,
    Query(q): Query<AuditQuery>,
) -> Result<ApiJson<AuditPage>, ApiError> {
    let flow = flow(&state, &name)?;
    let key = key(product, &session_id)?;
    let log = state
        .audit_of(&key, &flow)
        .await
        .map_err(|e| answer(e, Some(&key.session_id)))?;
    let page = q
        .page(
            log,
            &key.product_id,
            parlance_core::EntityKind::Flow,
            key.session_id.as_str(),
        )
        .await?;
    Ok(ApiJson(page))
}

/// The query of `model`.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct ModelQuery {
    /// A JMESPath expression: `response` is then what it selects from the
    /// session's JSON object (`null` when it selects nothing). A bad
    /// expression, or one that fails on the object, is 422 naming `path`.
    #[param(example = "model")]
    path: Option<String>,
}

/// The 422 of a JMESPath `path` that does not compile or fails.
fn bad_path(e: &jmespath::JmespathError) -> ApiError {
    ApiError::unprocessable(format!("bad JMESPath expression in `path`: {}", e.reason))
        .with("field", "path")
}

/// What `path` selects from `model`.
///
/// A compiled expression holds `Rc`s, so it never lives across an await:
/// the handler compiles `path` once to refuse it before any read, and again
/// here, after the read, to search.
fn select(model: &Value, path: &str) -> Result<Value, ApiError> {
    let expr = jmespath::compile(path).map_err(|e| bad_path(&e))?;
    let found = expr.search(model).map_err(|e| bad_path(&e))?;
    let mut found = serde_json::to_value(&*found).map_err(|e| ApiError::internal(&e))?;
    let mut rank = HashMap::new();
    key_ranks(model, &mut rank);
    let mut hashes = Vec::new();
    multi_hashes(expr.as_ast(), &mut hashes);
    reorder(&mut found, &rank, &hashes);
    Ok(found)
}

/// Ranks every object key of `v` by where it first appears.
fn key_ranks(v: &Value, rank: &mut HashMap<String, usize>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                let next = rank.len();
                rank.entry(k.clone()).or_insert(next);
                key_ranks(v, rank);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| key_ranks(v, rank)),
        _ => {}
    }
}

/// The keys of every multiselect hash (`{a: x, b: y}`) in the expression,
/// each in its written order.
fn multi_hashes(ast: &jmespath::ast::Ast, hashes: &mut Vec<Vec<String>>) {
    use jmespath::ast::Ast;
    let mut children: Vec<&Ast> = Vec::new();
    match ast {
        Ast::MultiHash { elements, .. } => {
            hashes.push(elements.iter().map(|kv| kv.key.clone()).collect());
            children.extend(elements.iter().map(|kv| &kv.value));
        }
        Ast::Comparison { lhs, rhs, .. }
        | Ast::And { lhs, rhs, .. }
        | Ast::Or { lhs, rhs, .. }
        | Ast::Projection { lhs, rhs, .. }
        | Ast::Subexpr { lhs, rhs, .. } => children.extend([&**lhs, &**rhs]),
        Ast::Condition {
            predicate, then, ..
        } => children.extend([&**predicate, &**then]),
        Ast::Expref { ast, .. } => children.push(ast),
        Ast::Flatten { node, .. } | Ast::Not { node, .. } | Ast::ObjectValues { node, .. } => {
            children.push(node);
        }
        Ast::Function { args, .. } => children.extend(args),
        Ast::MultiList { elements, .. } => children.extend(elements),
        Ast::Identity { .. }
        | Ast::Field { .. }
        | Ast::Index { .. }
        | Ast::Literal { .. }
        | Ast::Slice { .. } => {}
    }
    for c in children {
        multi_hashes(c, hashes);
    }
}

/// Puts every object's keys back in order, since the JMESPath crate builds
/// sorted maps and the reference answers in Python's dict order: an object
/// with exactly a multiselect hash's keys in the hash's order, any other in
/// the order its keys first appear in the session (keys it lacks last,
/// sorted).
fn reorder(v: &mut Value, rank: &HashMap<String, usize>, hashes: &[Vec<String>]) {
    match v {
        Value::Object(m) => {
            let hash = hashes
                .iter()
                .find(|h| h.len() == m.len() && h.iter().all(|k| m.contains_key(k)));
            let r = |k: &String| match hash {
                Some(h) => h.iter().position(|x| x == k).unwrap_or(usize::MAX),
                None => rank.get(k).copied().unwrap_or(usize::MAX),
            };
            let mut entries: Vec<(String, Value)> = std::mem::take(m).into_iter().collect();
            entries.sort_by(|(a, _), (b, _)| r(a).cmp(&r(b)).then_with(|| a.cmp(b)));
            for (k, mut v) in entries {
                reorder(&mut v, rank, hashes);
                m.insert(k, v);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| reorder(v, rank, hashes)),
        _ => {}
    }
}

/// The session's state, model and dialogue, as a JSON string in `response`,
/// or the part of it a JMESPath `path` selects.
#[utoipa::path(
    get,
    path = "/ai/{flow}/model/{session_id}",
    operation_id = "get_flow_model",
    tag = "flows",
    params(FlowSessionPath, ModelQuery),
    responses(
        (
            status = 200,
            description = "The session; `response` is a JSON object as a string: the session's \
                           state (`state` is the state's value, `state_name` its id), model \
                           fields, errors, running task graph and user, with `dialogue` and \
                           `version`; or, with `path`, the JSON of what the expression \
                           selects from that object.",
            body = AiResponse,
        ),
        ReadProblems,
    ),
)]
async fn model(
    State(state): State<Flows>,
    Tenant(product): Tenant,
    Path(FlowSessionPath {
        flow: name,
        session_id,
    }): Path<FlowSessionPath>,
    query: Result<Query<ModelQuery>, QueryRejection>,
) -> Result<ApiJson<AiResponse>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    if let Some(path) = &query.path {
        jmespath::compile(path).map_err(|e| bad_path(&e))?;
    }
    let flow = flow(&state, &name)?;
    let key = key(product, &session_id)?;
    let (mut out, model) = state
        .model_value(&key, &flow)
        .await
        .map_err(|e| answer(e, Some(&key.session_id)))?;
    let shown = match &query.path {
        Some(path) => select(&model, path)?,
        None => model,
    };
    out.response = Some(shown.to_string());
    Ok(ApiJson(out))
}

/// The loaded flows.
#[derive(Debug, Serialize, ToSchema)]
struct FlowList {
    /// The flows, by name.
    flows: Vec<FlowSummary>,
}

// The members below are in alphabetical order: the order the answer had
// when it was built as a `serde_json::Value`, so its bytes are unchanged.

/// One loaded flow.
#[derive(Debug, Serialize, ToSchema)]
struct FlowSummary {
    /// A human description.
    description: String,
    /// The initial state.
    initial: Option<String>,
    /// The flow's name, its key in `/v1/ai/{flow}`.
    name: String,
    /// Its states, in declaration order.
    states: Vec<FlowStateSummary>,
    /// Its transitions, in declaration order.
    transitions: Vec<FlowTransitionSummary>,
}

/// One transition of a flow.
#[derive(Debug, Serialize, ToSchema)]
struct FlowTransitionSummary {
    /// The event that fires it.
    event: String,
    /// Source state.
    from: String,
    /// Target state.
    to: String,
}

/// One state of a flow.
#[derive(Debug, Serialize, ToSchema)]
struct FlowStateSummary {
    /// The events that leave it, in declaration order.
    events: Vec<String>,
    /// The state's id.
    id: String,
    /// `user` (waits for the user) or `invoker` (runs a task graph).
    kind: StateKind,
}

/// The flows loaded with `--flows`, with their states and the events that
/// leave each.
#[utoipa::path(
    get,
    path = "/products/{product_id}/flows",
    operation_id = "list_flows",
    tag = "flows",
    params(crate::http::openapi::ProductPath),
    responses((status = 200, description = "The loaded flows.", body = FlowList), ReadProblems),
)]
async fn list(State(state): State<Flows>, Tenant(_product): Tenant) -> ApiJson<FlowList> {
    let flows = state
        .catalog()
        .iter()
        .map(|f| {
            let def = f.def();
            FlowSummary {
                name: def.name.clone(),
                description: def.description.clone(),
                initial: def.initial.clone(),
                states: def
                    .states
                    .iter()
                    .map(|s| FlowStateSummary {
                        id: s.id.clone(),
                        kind: s.kind,
                        events: f.events_from(&s.id),
                    })
                    .collect(),
                transitions: def
                    .transitions
                    .iter()
                    .map(|t| FlowTransitionSummary {
                        event: t.event.clone(),
                        from: t.from.clone(),
                        to: t.to.clone(),
                    })
                    .collect(),
            }
        })
        .collect();
    ApiJson(FlowList { flows })
}
