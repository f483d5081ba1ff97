//! HTTP routes under `/v1/products/{product_id}`: conversations and contact
//! replies.

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use parlance_core::ProductId;
use parlance_core::conversation::{
    ContactId, ConversationCommand, ConversationKey, ConversationState, DEFAULT_HEARTBEAT_S,
    DEFAULT_MAX_FOLLOW_UPS, Instance, InstanceId, Message, NewInstance, Todo,
};
use parlance_core::machine::Name;
use parlance_ports::{AuditRecord, ListFilter, Stored};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use uuid::Uuid;

use super::Conversations;
use super::service;
use crate::auth::Tenant;
use crate::execute::Executed;
use crate::http::{ApiError, ApiJson};

/// The conversation routes.
pub fn routes() -> Router<Conversations> {
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

/// An instance as stored: the record and its version.
#[derive(Debug, Serialize)]
struct InstanceView {
    #[serde(flatten)]
    instance: Instance,
    version: u64,
}

impl From<Stored<Instance>> for InstanceView {
    fn from(s: Stored<Instance>) -> Self {
        Self {
            instance: s.state,
            version: s.version.0,
        }
    }
}

/// An instance with its transcript.
#[derive(Debug, Serialize)]
struct View {
    conversation: InstanceView,
    transcript: Vec<Message>,
}

/// What a command did.
#[derive(Debug, Serialize)]
struct CommandView {
    conversation: InstanceView,
    transitions: Vec<TransitionView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    promoted: Option<InstanceView>,
}

#[derive(Debug, Serialize)]
struct TransitionView {
    from: Name,
    to: Name,
    cause: Name,
}

impl From<Executed<Instance>> for CommandView {
    fn from(e: Executed<Instance>) -> Self {
        Self {
            // State changes only: a late reply, from and to the terminal
            // state, is audited, not shown here.
            transitions: e
                .decision
                .transitions
                .into_iter()
                .filter_map(|t| {
                    let from = t.from.filter(|from| *from != t.to)?;
                    Some(TransitionView {
                        from,
                        to: t.to,
                        cause: t.cause,
                    })
                })
                .collect(),
            conversation: InstanceView {
                instance: e.state,
                version: e.version.0,
            },
            promoted: e.also.into_iter().next().map(|(p, _)| p.into()),
        }
    }
}

fn parse_key(product: &ProductId, raw: &str) -> Result<ConversationKey, ApiError> {
    let instance_id: InstanceId = raw
        .parse()
        .map_err(|_| ApiError::not_found(format!("no conversation {raw}")))?;
    Ok(ConversationKey {
        product_id: product.clone(),
        instance_id,
    })
}

fn parse_contact(raw: String) -> Result<ContactId, ApiError> {
    ContactId::parse(raw).map_err(|e| ApiError::unprocessable(e.to_string()))
}

async fn create(
    State(state): State<Conversations>,
    Tenant(product): Tenant,
    ApiJson(body): ApiJson<CreateBody>,
) -> Result<(StatusCode, ApiJson<View>), ApiError> {
    crate::http::check_items("todos", body.todos.len())?;
    let instance_id = InstanceId::from_uuid(
        body.instance_id
            .unwrap_or_else(|| state.shared.ids.new_uuid()),
    );
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
    let created = service::create(&state, new).await?;
    Ok((
        StatusCode::CREATED,
        ApiJson(View {
            conversation: InstanceView {
                instance: created.state,
                version: created.version.0,
            },
            transcript: Vec::new(),
        }),
    ))
}

async fn list(
    State(state): State<Conversations>,
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
    let items: Vec<InstanceView> = state
        .index
        .list(&product, &filter)
        .await?
        .into_iter()
        .map(InstanceView::from)
        .collect();
    Ok(ApiJson(serde_json::json!({ "items": items })))
}

async fn fetch(
    State(state): State<Conversations>,
    Tenant(product): Tenant,
    Path((_, id)): Path<(String, String)>,
) -> Result<ApiJson<View>, ApiError> {
    let key = parse_key(&product, &id)?;
    let conversation = state
        .store
        .load(&key)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no conversation {}", key.instance_id)))?;
    let transcript = state.index.transcript(&key).await?;
    Ok(ApiJson(View {
        conversation: conversation.into(),
        transcript,
    }))
}

async fn reply(
    State(state): State<Conversations>,
    Tenant(product): Tenant,
    Path((_, id)): Path<(String, String)>,
    ApiJson(body): ApiJson<TextBody>,
) -> Result<ApiJson<CommandView>, ApiError> {
    let key = parse_key(&product, &id)?;
    check_text(&body.text)?;
    let command = ConversationCommand::ContactReply { text: body.text };
    Ok(ApiJson(service::run(&state, &key, command).await?.into()))
}

/// A reply addressed to a contact goes to the instance holding it, else to
/// the contact's newest instance.
async fn contact_reply(
    State(state): State<Conversations>,
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
    let instances = state.index.list(&product, &filter).await?;
    let target = instances
        .iter()
        .find(|i| i.state.holds_contact())
        .or_else(|| instances.last())
        .ok_or_else(|| ApiError::not_found(format!("no conversation with contact {contact}")))?;
    let key = target.state.key();
    let command = ConversationCommand::ContactReply { text: body.text };
    Ok(ApiJson(service::run(&state, &key, command).await?.into()))
}

fn check_text(text: &str) -> Result<(), ApiError> {
    if text.trim().is_empty() {
        return Err(ApiError::unprocessable("text must not be empty"));
    }
    Ok(())
}

/// A body-less operator command on one instance.
async fn operator(
    state: &Conversations,
    product: &ProductId,
    raw_id: &str,
    command: ConversationCommand,
) -> Result<ApiJson<CommandView>, ApiError> {
    let key = parse_key(product, raw_id)?;
    Ok(ApiJson(service::run(state, &key, command).await?.into()))
}

async fn pause(
    State(state): State<Conversations>,
    Tenant(product): Tenant,
    Path((_, id)): Path<(String, String)>,
) -> Result<ApiJson<CommandView>, ApiError> {
    operator(&state, &product, &id, ConversationCommand::Pause).await
}

async fn resume(
    State(state): State<Conversations>,
    Tenant(product): Tenant,
    Path((_, id)): Path<(String, String)>,
) -> Result<ApiJson<CommandView>, ApiError> {
    operator(&state, &product, &id, ConversationCommand::Resume).await
}

async fn cancel(
    State(state): State<Conversations>,
    Tenant(product): Tenant,
    Path((_, id)): Path<(String, String)>,
) -> Result<ApiJson<CommandView>, ApiError> {
    operator(&state, &product, &id, ConversationCommand::Cancel).await
}

async fn send(
    State(state): State<Conversations>,
    Tenant(product): Tenant,
    Path((_, id)): Path<(String, String)>,
    ApiJson(body): ApiJson<TextBody>,
) -> Result<ApiJson<CommandView>, ApiError> {
    let key = parse_key(&product, &id)?;
    let command = ConversationCommand::OperatorSend { text: body.text };
    Ok(ApiJson(service::run(&state, &key, command).await?.into()))
}

async fn audit(
    State(state): State<Conversations>,
    Tenant(product): Tenant,
    Path((_, id)): Path<(String, String)>,
) -> Result<ApiJson<Value>, ApiError> {
    let key = parse_key(&product, &id)?;
    let id = key.instance_id;
    if state.store.load(&key).await?.is_none() {
        return Err(ApiError::not_found(format!("no conversation {id}")));
    }
    let items: Vec<AuditRecord> = state
        .shared
        .audit
        .list(
            &product,
            parlance_core::EntityKind::Conversation,
            &id.to_string(),
            None,
            1000,
        )
        .await?;
    Ok(ApiJson(serde_json::json!({ "items": items })))
}

#[cfg(test)]
mod tests {
    use parlance_core::NotAllowed;
    use parlance_core::conversation::ConversationError;

    use super::*;
    use crate::execute::ServiceError;

    fn answer(e: ConversationError) -> ApiError {
        ServiceError::<Instance>::refused(e, None).into()
    }

    #[test]
    fn refusals_map_to_409_and_422() {
        let e = answer(ConversationError::NotAllowed(NotAllowed::new(
            "pause",
            ConversationState::Paused.as_str(),
        )));
        assert_eq!(e.status(), StatusCode::CONFLICT);
        let e = answer(ConversationError::Invalid {
            field: "text",
            reason: "must not be empty".into(),
        });
        assert_eq!(e.status(), StatusCode::UNPROCESSABLE_ENTITY);
    }
}
