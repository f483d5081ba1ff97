//! HTTP routes under `/v1/products/{product_id}`: conversations and contact
//! replies.

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use parlance_core::conversation::{
    ContactId, ConversationError, ConversationState, DEFAULT_HEARTBEAT_S, DEFAULT_MAX_FOLLOW_UPS,
    Instance, InstanceId, Message, NewInstance, Outcome, Todo,
};
use parlance_core::{ProductId, Timestamp};
use parlance_ports::{Applied, AuditRecord, ListFilter};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use uuid::Uuid;

use super::service;
use crate::auth::Tenant;
use crate::http::{ApiError, ApiJson};
use crate::state::AppState;

/// The conversation routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/products/{product_id}/conversations",
            post(create).get(list),
        )
        .route("/products/{product_id}/conversations/{id}", get(fetch))
        .route(
            "/products/{product_id}/conversations/{id}/replies",
            post(reply),
        )
        .route(
            "/products/{product_id}/conversations/{id}/pause",
            post(pause),
        )
        .route(
            "/products/{product_id}/conversations/{id}/resume",
            post(resume),
        )
        .route(
            "/products/{product_id}/conversations/{id}/cancel",
            post(cancel),
        )
        .route("/products/{product_id}/conversations/{id}/send", post(send))
        .route(
            "/products/{product_id}/conversations/{id}/audit",
            get(audit),
        )
        .route(
            "/products/{product_id}/contacts/{contact_id}/replies",
            post(contact_reply),
        )
}

/// A todo as text, or as `{text, done}`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum TodoInput {
    Text(String),
    Item(Todo),
}

/// `POST /conversations`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    contact_id: String,
    objective: String,
    #[serde(default)]
    todos: Vec<TodoInput>,
    #[serde(default)]
    channel: Option<String>,
    #[serde(default)]
    heartbeat_interval_s: Option<u64>,
    #[serde(default)]
    max_follow_ups: Option<u32>,
    #[serde(default)]
    metadata: Option<Map<String, Value>>,
    #[serde(default)]
    instance_id: Option<Uuid>,
}

/// `POST .../replies` and `.../send`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TextBody {
    text: String,
}

/// `GET /conversations` query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    contact_id: Option<String>,
    state: Option<String>,
    limit: Option<usize>,
}

/// An instance with its transcript.
#[derive(Debug, Serialize)]
struct View {
    conversation: Instance,
    transcript: Vec<Message>,
}

/// What a command did.
#[derive(Debug, Serialize)]
struct CommandView {
    conversation: Instance,
    transitions: Vec<TransitionView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    promoted: Option<Instance>,
}

#[derive(Debug, Serialize)]
struct TransitionView {
    from: ConversationState,
    to: ConversationState,
    cause: &'static str,
}

impl From<Applied> for CommandView {
    fn from(a: Applied) -> Self {
        Self {
            transitions: a
                .outcome
                .transitions
                .iter()
                .map(|t| TransitionView {
                    from: t.from,
                    to: t.to,
                    cause: t.cause,
                })
                .collect(),
            conversation: a.instance,
            promoted: a.promoted.map(|(p, _)| p),
        }
    }
}

fn parse_id(raw: &str) -> Result<InstanceId, ApiError> {
    raw.parse()
        .map_err(|_| ApiError::not_found(format!("no conversation {raw}")))
}

fn parse_contact(raw: String) -> Result<ContactId, ApiError> {
    ContactId::parse(raw).map_err(|e| ApiError::unprocessable(e.to_string()))
}

async fn create(
    State(state): State<AppState>,
    Tenant(product): Tenant,
    ApiJson(body): ApiJson<CreateBody>,
) -> Result<(StatusCode, ApiJson<View>), ApiError> {
    crate::http::check_items("todos", body.todos.len())?;
    let instance_id =
        InstanceId::from_uuid(body.instance_id.unwrap_or_else(|| state.ids.new_uuid()));
    let new = NewInstance {
        product_id: product,
        instance_id,
        contact_id: parse_contact(body.contact_id)?,
        channel: body.channel.unwrap_or_else(|| "loopback".to_owned()),
        objective: body.objective,
        todos: body
            .todos
            .into_iter()
            .map(|t| match t {
                TodoInput::Text(text) => Todo { text, done: false },
                TodoInput::Item(item) => item,
            })
            .collect(),
        heartbeat_interval_s: body.heartbeat_interval_s.unwrap_or(DEFAULT_HEARTBEAT_S),
        max_follow_ups: body.max_follow_ups.unwrap_or(DEFAULT_MAX_FOLLOW_UPS),
        metadata: body.metadata.unwrap_or_default(),
    };
    let instance = service::create(&state, new).await?;
    let transcript = Vec::new();
    Ok((
        StatusCode::CREATED,
        ApiJson(View {
            conversation: instance,
            transcript,
        }),
    ))
}

async fn list(
    State(state): State<AppState>,
    Tenant(product): Tenant,
    Query(q): Query<ListQuery>,
) -> Result<ApiJson<Value>, ApiError> {
    let filter = ListFilter {
        contact_id: q.contact_id.map(parse_contact).transpose()?,
        state: q
            .state
            .map(|s| {
                ConversationState::parse(&s)
                    .ok_or_else(|| ApiError::unprocessable(format!("unknown state {s:?}")))
            })
            .transpose()?,
        limit: q.limit,
    };
    let items = state.conversations.list(&product, &filter).await?;
    Ok(ApiJson(serde_json::json!({ "items": items })))
}

async fn fetch(
    State(state): State<AppState>,
    Tenant(product): Tenant,
    Path((_, id)): Path<(String, String)>,
) -> Result<ApiJson<View>, ApiError> {
    let id = parse_id(&id)?;
    let conversation = state
        .conversations
        .get(&product, id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no conversation {id}")))?;
    let transcript = state.conversations.transcript(&product, id).await?;
    Ok(ApiJson(View {
        conversation,
        transcript,
    }))
}

async fn reply(
    State(state): State<AppState>,
    Tenant(product): Tenant,
    Path((_, id)): Path<(String, String)>,
    ApiJson(body): ApiJson<TextBody>,
) -> Result<ApiJson<CommandView>, ApiError> {
    let id = parse_id(&id)?;
    check_text(&body.text)?;
    let applied = service::run(&state, &product, id, move |i, now| {
        Ok(i.contact_reply(body.text.clone(), now))
    })
    .await?;
    Ok(ApiJson(applied.into()))
}

/// A reply addressed to a contact goes to the instance holding it, else to
/// the contact's newest instance.
async fn contact_reply(
    State(state): State<AppState>,
    Tenant(product): Tenant,
    Path((_, contact)): Path<(String, String)>,
    ApiJson(body): ApiJson<TextBody>,
) -> Result<ApiJson<CommandView>, ApiError> {
    check_text(&body.text)?;
    let contact = parse_contact(contact)?;
    let filter = ListFilter {
        contact_id: Some(contact.clone()),
        ..ListFilter::default()
    };
    let instances = state.conversations.list(&product, &filter).await?;
    let target = instances
        .iter()
        .find(|i| i.holds_contact())
        .or_else(|| instances.last())
        .ok_or_else(|| ApiError::not_found(format!("no conversation with contact {contact}")))?;
    let id = target.instance_id;
    let applied = service::run(&state, &product, id, move |i, now| {
        Ok(i.contact_reply(body.text.clone(), now))
    })
    .await?;
    Ok(ApiJson(applied.into()))
}

fn check_text(text: &str) -> Result<(), ApiError> {
    if text.trim().is_empty() {
        return Err(ApiError::unprocessable("text must not be empty"));
    }
    Ok(())
}

/// A body-less operator command on one instance.
async fn operator(
    state: &AppState,
    product: &ProductId,
    raw_id: &str,
    command: fn(&mut Instance, Timestamp) -> Result<Outcome, ConversationError>,
) -> Result<ApiJson<CommandView>, ApiError> {
    let id = parse_id(raw_id)?;
    Ok(ApiJson(
        service::run(state, product, id, command).await?.into(),
    ))
}

async fn pause(
    State(state): State<AppState>,
    Tenant(product): Tenant,
    Path((_, id)): Path<(String, String)>,
) -> Result<ApiJson<CommandView>, ApiError> {
    operator(&state, &product, &id, |i, now| i.pause(now)).await
}

async fn resume(
    State(state): State<AppState>,
    Tenant(product): Tenant,
    Path((_, id)): Path<(String, String)>,
) -> Result<ApiJson<CommandView>, ApiError> {
    operator(&state, &product, &id, |i, now| i.resume(now)).await
}

async fn cancel(
    State(state): State<AppState>,
    Tenant(product): Tenant,
    Path((_, id)): Path<(String, String)>,
) -> Result<ApiJson<CommandView>, ApiError> {
    operator(&state, &product, &id, |i, now| i.cancel(now)).await
}

async fn send(
    State(state): State<AppState>,
    Tenant(product): Tenant,
    Path((_, id)): Path<(String, String)>,
    ApiJson(body): ApiJson<TextBody>,
) -> Result<ApiJson<CommandView>, ApiError> {
    let id = parse_id(&id)?;
    let applied = service::run(&state, &product, id, move |i, now| {
        i.operator_send(body.text.clone(), now)
    })
    .await?;
    Ok(ApiJson(applied.into()))
}

async fn audit(
    State(state): State<AppState>,
    Tenant(product): Tenant,
    Path((_, id)): Path<(String, String)>,
) -> Result<ApiJson<Value>, ApiError> {
    let id = parse_id(&id)?;
    if state.conversations.get(&product, id).await?.is_none() {
        return Err(ApiError::not_found(format!("no conversation {id}")));
    }
    let items: Vec<AuditRecord> = state
        .audit
        .list(&product, "conversation", &id.to_string(), None, 1000)
        .await?;
    Ok(ApiJson(serde_json::json!({ "items": items })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_map_to_409_and_422() {
        use parlance_core::conversation::ConversationError;
        let e = service::refusal(ConversationError::NotAllowed {
            command: "pause",
            state: ConversationState::Paused,
        });
        assert_eq!(e.status(), StatusCode::CONFLICT);
        let e = service::refusal(ConversationError::Invalid {
            field: "text",
            reason: "must not be empty".into(),
        });
        assert_eq!(e.status(), StatusCode::UNPROCESSABLE_ENTITY);
    }
}
