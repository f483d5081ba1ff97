//! HTTP routes under `/v1/products/{product_id}`: conversations and contact
//! replies.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use parlance_core::ProductId;
use parlance_core::conversation::{
    ContactId, ConversationCommand, ConversationKey, ConversationState, DEFAULT_HEARTBEAT_S,
    DEFAULT_MAX_FOLLOW_UPS, Instance, InstanceId, Message, NewInstance, Todo,
};
use parlance_core::machine::Name;
use parlance_ports::{AuditRecord, ListCursor, ListFilter, ListOrder, MAX_LIST, Stored};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::Conversations;
use super::service;
use crate::auth::Tenant;
use crate::execute::Executed;
use crate::http::openapi::{CommandProblems, ReadProblems, StateProblems};
use crate::http::{ApiError, ApiJson};

/// The conversation routes.
pub fn routes() -> OpenApiRouter<Conversations> {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(fetch))
        .routes(routes!(reply))
        .routes(routes!(pause))
        .routes(routes!(resume))
        .routes(routes!(cancel))
        .routes(routes!(send))
        .routes(routes!(audit))
        .routes(routes!(contact_reply))
}

/// The path of one conversation. The id is checked by the handler: one that
/// is not a UUID names no conversation, so it answers 404.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
struct ConversationPath {
    /// The product (the key's).
    #[param(value_type = ProductId)]
    #[allow(dead_code)] // checked by `Tenant`
    product_id: String,
    /// The conversation instance.
    #[param(value_type = InstanceId)]
    id: String,
}

/// The path of one contact. The id is checked by the handler, so a bad one
/// answers 422 naming it.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
struct ContactPath {
    /// The product (the key's).
    #[param(value_type = ProductId)]
    #[allow(dead_code)] // checked by `Tenant`
    product_id: String,
    /// The contact the reply comes from.
    #[param(value_type = ContactId)]
    contact_id: String,
}

/// A todo as text, or as `{text, done}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
#[schema(as = ConversationTodoInput)]
enum TodoInput {
    /// The todo's text; it is not done.
    Text(String),
    /// The todo with its state.
    Item(Todo),
}

/// A new conversation instance.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = NewConversation)]
struct CreateBody {
    /// Who the conversation is with (a phone number, a chat handle).
    #[schema(value_type = ContactId)]
    contact_id: String,
    /// What the agent must achieve.
    objective: String,
    /// The agent's checklist (at most 1,000 items).
    #[serde(default)]
    todos: Vec<TodoInput>,
    /// The channel name (default `loopback`).
    #[serde(default)]
    #[schema(example = "webhook")]
    channel: Option<String>,
    /// Seconds between an unanswered message and its follow-up (default
    /// 1,800).
    #[serde(default)]
    heartbeat_interval_s: Option<u64>,
    /// Follow-ups before the instance is abandoned (default 5; 0: never
    /// follow up).
    #[serde(default)]
    max_follow_ups: Option<u32>,
    /// A free JSON object, kept as given.
    #[serde(default)]
    metadata: Option<Map<String, Value>>,
    /// The new instance's id; one is generated when absent. An id that
    /// exists answers 409.
    #[serde(default)]
    instance_id: Option<Uuid>,
}

/// A message's text.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = ConversationText)]
struct TextBody {
    /// The text (for a reply: not blank).
    text: String,
}

/// Which conversations to list.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    /// Only this contact's.
    #[param(value_type = Option<ContactId>)]
    contact_id: Option<String>,
    /// Only those in one of these states, comma-separated
    /// (`NEEDS_HUMAN_INTERVENTION,PAUSED`); any state when absent or empty.
    #[param(style = Form, explode = false, value_type = Option<Vec<ConversationState>>)]
    state: Option<String>,
    /// By creation: `oldest` first (the default) or `newest` first.
    #[param(inline)]
    order: Option<ConversationOrder>,
    /// The `next_cursor` of the page before: this page goes on after it.
    #[param(example = "1042")]
    after: Option<String>,
    /// At most this many (at most 1,000, the default).
    #[param(minimum = 0)]
    limit: Option<usize>,
}

/// The order of a listing, by creation.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum ConversationOrder {
    /// The oldest first.
    Oldest,
    /// The newest first.
    Newest,
}

impl ListQuery {
    /// The filter the query asks for; 422 naming the parameter that is not
    /// a contact, a state or a cursor.
    fn filter(self) -> Result<ListFilter, ApiError> {
        let states = self
            .state
            .iter()
            .flat_map(|s| s.split(','))
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                ConversationState::parse(s).ok_or_else(|| {
                    ApiError::unprocessable(format!("unknown state {s:?}")).with("field", "state")
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let after = self
            .after
            .map(|a| {
                a.parse::<u64>().map(ListCursor).map_err(|_| {
                    ApiError::unprocessable(format!(
                        "{a:?} is not a cursor: pass the `next_cursor` of the page before"
                    ))
                    .with("field", "after")
                })
            })
            .transpose()?;
        Ok(ListFilter {
            contact_id: self.contact_id.map(parse_contact).transpose()?,
            states,
            order: match self.order {
                Some(ConversationOrder::Newest) => ListOrder::NewestFirst,
                Some(ConversationOrder::Oldest) | None => ListOrder::OldestFirst,
            },
            after,
            limit: self.limit,
        })
    }
}

/// An instance as stored: the record and its version.
#[derive(Debug, Serialize, ToSchema)]
struct ConversationInstance {
    #[serde(flatten)]
    instance: Instance,
    /// The stored version (1 once created, one more per commit).
    version: u64,
}

impl From<Stored<Instance>> for ConversationInstance {
    fn from(s: Stored<Instance>) -> Self {
        Self {
            instance: s.state,
            version: s.version.0,
        }
    }
}

/// An instance with its transcript.
#[derive(Debug, Serialize, ToSchema)]
struct ConversationView {
    /// The instance.
    conversation: ConversationInstance,
    /// Its messages, oldest first.
    transcript: Vec<Message>,
}

/// A page of instances.
#[derive(Debug, Serialize, ToSchema)]
struct ConversationList {
    /// The instances, in the order asked for.
    items: Vec<ConversationInstance>,
    /// Where the next page starts (pass it as `after`), when more instances
    /// match than this page holds; `null` on the last page.
    #[schema(example = "1042")]
    next_cursor: Option<String>,
}

/// What a command did.
#[derive(Debug, Serialize, ToSchema)]
struct ConversationCommandView {
    /// The instance after the command.
    conversation: ConversationInstance,
    /// The state changes the command made, in order.
    transitions: Vec<ConversationTransition>,
    /// The contact's next queued instance, when the command ended this one
    /// and promoted it.
    #[serde(skip_serializing_if = "Option::is_none")]
    promoted: Option<ConversationInstance>,
}

/// One state change.
#[derive(Debug, Serialize, ToSchema)]
struct ConversationTransition {
    /// The state left.
    #[schema(value_type = ConversationState)]
    from: Name,
    /// The state entered.
    #[schema(value_type = ConversationState)]
    to: Name,
    /// The command or event that caused it.
    #[schema(value_type = String, example = "contact_reply")]
    cause: Name,
}

/// An instance's transitions, oldest first.
#[derive(Debug, Serialize, ToSchema)]
struct ConversationAudit {
    /// The records (at most 1,000).
    items: Vec<AuditRecord>,
}

impl From<Executed<Instance>> for ConversationCommandView {
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
                    Some(ConversationTransition {
                        from,
                        to: t.to,
                        cause: t.cause,
                    })
                })
                .collect(),
            conversation: ConversationInstance {
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

/// Creates a conversation instance. When another instance holds the
/// contact, the new one waits in `QUEUED` until it ends.
#[utoipa::path(
    post,
    path = "/products/{product_id}/conversations",
    operation_id = "create_conversation",
    tag = "conversations",
    params(crate::http::openapi::ProductPath),
    request_body = CreateBody,
    responses(
        (status = 201, description = "The instance was created.", body = ConversationView),
        CommandProblems,
    ),
)]
async fn create(
    State(state): State<Conversations>,
    Tenant(product): Tenant,
    ApiJson(body): ApiJson<CreateBody>,
) -> Result<(StatusCode, ApiJson<ConversationView>), ApiError> {
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
        ApiJson(ConversationView {
            conversation: ConversationInstance {
                instance: created.state,
                version: created.version.0,
            },
            transcript: Vec::new(),
        }),
    ))
}

/// The product's conversation instances, a page at a time.
///
/// Filtered by contact and by states, oldest or newest first; each page
/// holds at most `limit`, and the next one is asked for with the
/// `next_cursor` of the one before.
#[utoipa::path(
    get,
    path = "/products/{product_id}/conversations",
    operation_id = "list_conversations",
    tag = "conversations",
    params(crate::http::openapi::ProductPath, ListQuery),
    responses((status = 200, description = "The instances.", body = ConversationList), ReadProblems),
)]
async fn list(
    State(state): State<Conversations>,
    Tenant(product): Tenant,
    Query(q): Query<ListQuery>,
) -> Result<ApiJson<ConversationList>, ApiError> {
    let page = state.index.list(&product, &q.filter()?).await?;
    Ok(ApiJson(ConversationList {
        items: page
            .items
            .into_iter()
            .map(ConversationInstance::from)
            .collect(),
        next_cursor: page.next.map(|c| c.0.to_string()),
    }))
}

/// A conversation instance and its transcript.
#[utoipa::path(
    get,
    path = "/products/{product_id}/conversations/{id}",
    operation_id = "get_conversation",
    tag = "conversations",
    params(ConversationPath),
    responses((status = 200, description = "The instance.", body = ConversationView), ReadProblems),
)]
async fn fetch(
    State(state): State<Conversations>,
    Tenant(product): Tenant,
    Path(ConversationPath { id, .. }): Path<ConversationPath>,
) -> Result<ApiJson<ConversationView>, ApiError> {
    let key = parse_key(&product, &id)?;
    let conversation = state
        .store
        .load(&key)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no conversation {}", key.instance_id)))?;
    let transcript = state.index.transcript(&key).await?;
    Ok(ApiJson(ConversationView {
        conversation: conversation.into(),
        transcript,
    }))
}

/// The contact's reply to a conversation. Awaited (`WAITING_FOR_REPLY`,
/// `HEARTBEAT_SCHEDULED`), it queues an agent turn; otherwise it is only
/// added to the transcript (a paused conversation takes it up on `resume`;
/// an ended one records it as a late reply).
#[utoipa::path(
    post,
    path = "/products/{product_id}/conversations/{id}/replies",
    operation_id = "post_conversation_reply",
    tag = "conversations",
    params(ConversationPath),
    request_body = TextBody,
    responses(
        (status = 200, description = "The reply was recorded.", body = ConversationCommandView),
        CommandProblems,
    ),
)]
async fn reply(
    State(state): State<Conversations>,
    Tenant(product): Tenant,
    Path(ConversationPath { id, .. }): Path<ConversationPath>,
    ApiJson(body): ApiJson<TextBody>,
) -> Result<ApiJson<ConversationCommandView>, ApiError> {
    let key = parse_key(&product, &id)?;
    check_text(&body.text)?;
    let command = ConversationCommand::ContactReply { text: body.text };
    Ok(ApiJson(service::run(&state, &key, command).await?.into()))
}

/// A reply from a contact, for the conversation that holds the contact, or
/// else the contact's newest one; then as a reply to that conversation.
#[utoipa::path(
    post,
    path = "/products/{product_id}/contacts/{contact_id}/replies",
    operation_id = "post_contact_reply",
    tag = "conversations",
    params(ContactPath),
    request_body = TextBody,
    responses(
        (status = 200, description = "The reply was recorded.", body = ConversationCommandView),
        CommandProblems,
    ),
)]
async fn contact_reply(
    State(state): State<Conversations>,
    Tenant(product): Tenant,
    Path(ContactPath {
        contact_id: contact,
        ..
    }): Path<ContactPath>,
    ApiJson(body): ApiJson<TextBody>,
) -> Result<ApiJson<ConversationCommandView>, ApiError> {
    check_text(&body.text)?;
    let contact = parse_contact(contact)?;
    let filter = ListFilter {
        contact_id: Some(contact.clone()),
        order: ListOrder::NewestFirst,
        limit: Some(MAX_LIST),
        ..ListFilter::default()
    };
    let instances = state.index.list(&product, &filter).await?.items;
    let target = instances
        .iter()
        .find(|i| i.state.holds_contact())
        .or_else(|| instances.first())
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
) -> Result<ApiJson<ConversationCommandView>, ApiError> {
    let key = parse_key(product, raw_id)?;
    Ok(ApiJson(service::run(state, &key, command).await?.into()))
}

/// Pauses a conversation that has not ended: its state and the time left on
/// its heartbeat are kept for `resume`.
#[utoipa::path(
    post,
    path = "/products/{product_id}/conversations/{id}/pause",
    operation_id = "pause_conversation",
    tag = "conversations",
    params(ConversationPath),
    responses(
        (status = 200, description = "The instance is paused.", body = ConversationCommandView),
        StateProblems,
    ),
)]
async fn pause(
    State(state): State<Conversations>,
    Tenant(product): Tenant,
    Path(ConversationPath { id, .. }): Path<ConversationPath>,
) -> Result<ApiJson<ConversationCommandView>, ApiError> {
    operator(&state, &product, &id, ConversationCommand::Pause).await
}

/// Resumes a paused conversation in the state it was paused in (waiting for
/// the agent when the contact replied meanwhile), or hands a conversation
/// that needs a person back to the agent (`ACTIVE`).
#[utoipa::path(
    post,
    path = "/products/{product_id}/conversations/{id}/resume",
    operation_id = "resume_conversation",
    tag = "conversations",
    params(ConversationPath),
    responses(
        (status = 200, description = "The instance is resumed.", body = ConversationCommandView),
        StateProblems,
    ),
)]
async fn resume(
    State(state): State<Conversations>,
    Tenant(product): Tenant,
    Path(ConversationPath { id, .. }): Path<ConversationPath>,
) -> Result<ApiJson<ConversationCommandView>, ApiError> {
    operator(&state, &product, &id, ConversationCommand::Resume).await
}

/// Cancels a conversation that has not ended: it ends `FAILED` with
/// `end_reason` `cancelled`, and the contact's next queued conversation
/// starts.
#[utoipa::path(
    post,
    path = "/products/{product_id}/conversations/{id}/cancel",
    operation_id = "cancel_conversation",
    tag = "conversations",
    params(ConversationPath),
    responses(
        (status = 200, description = "The instance is cancelled.", body = ConversationCommandView),
        StateProblems,
    ),
)]
async fn cancel(
    State(state): State<Conversations>,
    Tenant(product): Tenant,
    Path(ConversationPath { id, .. }): Path<ConversationPath>,
) -> Result<ApiJson<ConversationCommandView>, ApiError> {
    operator(&state, &product, &id, ConversationCommand::Cancel).await
}

/// Sends an operator's message to the contact, while the conversation
/// waits for a reply or needs a person (which hands it back to the agent).
#[utoipa::path(
    post,
    path = "/products/{product_id}/conversations/{id}/send",
    operation_id = "send_conversation_message",
    tag = "conversations",
    params(ConversationPath),
    request_body = TextBody,
    responses(
        (status = 200, description = "The message is queued for delivery.", body = ConversationCommandView),
        CommandProblems,
    ),
)]
async fn send(
    State(state): State<Conversations>,
    Tenant(product): Tenant,
    Path(ConversationPath { id, .. }): Path<ConversationPath>,
    ApiJson(body): ApiJson<TextBody>,
) -> Result<ApiJson<ConversationCommandView>, ApiError> {
    let key = parse_key(&product, &id)?;
    let command = ConversationCommand::OperatorSend { text: body.text };
    Ok(ApiJson(service::run(&state, &key, command).await?.into()))
}

/// The conversation's transitions, oldest first (the first 1,000).
#[utoipa::path(
    get,
    path = "/products/{product_id}/conversations/{id}/audit",
    operation_id = "get_conversation_audit",
    tag = "conversations",
    params(ConversationPath),
    responses((status = 200, description = "The audit trail.", body = ConversationAudit), ReadProblems),
)]
async fn audit(
    State(state): State<Conversations>,
    Tenant(product): Tenant,
    Path(ConversationPath { id, .. }): Path<ConversationPath>,
) -> Result<ApiJson<ConversationAudit>, ApiError> {
    let key = parse_key(&product, &id)?;
    let id = key.instance_id;
    if state.store.load(&key).await?.is_none() {
        return Err(ApiError::not_found(format!("no conversation {id}")));
    }
    let items = state
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
    Ok(ApiJson(ConversationAudit { items }))
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
