//! The conversation agent: one turn reads the objective, the todos and the
//! transcript, asks the model for exactly one action and applies it.

use parlance_core::conversation::{
    ConversationError, ConversationState, Instance, InstanceId, Message, Outcome, Role, Todo,
};
use parlance_core::structured;
use parlance_core::{ProductId, Timestamp};
use parlance_ports::{
    CompletionRequest, CompletionResponse, Lease, LlmError, Message as LlmMessage, PortError,
    ToolChoice, ToolDefinition,
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::service;
use crate::state::AppState;
use crate::worker::{Handlers, TaskError, TaskHandler};

/// How many `update_todos` calls one turn may make before it must act.
const MAX_TODO_UPDATES: usize = 3;
/// How many transcript messages the prompt shows (the most recent).
const TRANSCRIPT_WINDOW: usize = 40;

/// What the model chose.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Send a message and wait for a reply (optionally with the next
    /// follow-up delay in seconds).
    SendMessage {
        /// The message.
        text: String,
        /// Seconds to the next follow-up.
        next_heartbeat_s: Option<u64>,
    },
    /// The objective is reached (or cannot be).
    EndConversation {
        /// What came of it.
        outcome: Option<String>,
    },
    /// A human must take over.
    RequestHuman {
        /// Why.
        reason: String,
    },
    /// Rewrite the checklist, then decide again.
    UpdateTodos {
        /// The new checklist.
        todos: Vec<Todo>,
    },
}

/// Why a turn could not finish.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The model failed; retry later.
    #[error("model call failed")]
    Model(#[from] LlmError),
    /// The model answered something that is not one of the actions.
    #[error("model answered no usable action: {0}")]
    Unusable(String),
    /// The store failed.
    #[error("conversation store failed")]
    Store(#[from] PortError),
}

/// What a turn did.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnResult {
    /// The action was applied; the instance is now in this state.
    Applied(ConversationState),
    /// There was nothing to do (the instance moved on, was paused or ended).
    Skipped(ConversationState),
}

fn tools(follow_up: bool) -> Vec<ToolDefinition> {
    let send = ToolDefinition {
        name: "send_message".into(),
        description: if follow_up {
            "Send a short, friendly follow-up to the contact, who has not replied.".into()
        } else {
            "Send a message to the contact and wait for the reply.".into()
        },
        parameters: json!({
            "type": "object",
            "properties": {
                "text": {"type": "string", "minLength": 1},
                "next_heartbeat_s": {"type": ["integer", "null"], "minimum": 1}
            },
            "required": ["text"],
            "additionalProperties": false
        }),
    };
    if follow_up {
        return vec![send];
    }
    vec![
        send,
        ToolDefinition {
            name: "end_conversation".into(),
            description: "End the conversation: the objective is reached or cannot be.".into(),
            parameters: json!({
                "type": "object",
                "properties": {"outcome": {"type": "string"}},
                "additionalProperties": false
            }),
        },
        ToolDefinition {
            name: "request_human".into(),
            description: "Hand the conversation to a human operator.".into(),
            parameters: json!({
                "type": "object",
                "properties": {"reason": {"type": "string", "minLength": 1}},
                "required": ["reason"],
                "additionalProperties": false
            }),
        },
        ToolDefinition {
            name: "update_todos".into(),
            description: "Rewrite the checklist (mark items done), then choose another action."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "todos": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "text": {"type": "string", "minLength": 1},
                                "done": {"type": "boolean"}
                            },
                            "required": ["text", "done"]
                        }
                    }
                },
                "required": ["todos"],
                "additionalProperties": false
            }),
        },
    ]
}

/// The request for one decision.
pub fn request_for(
    instance: &Instance,
    transcript: &[Message],
    follow_up: bool,
) -> CompletionRequest {
    let todos = if instance.todos.is_empty() {
        "(none)".to_owned()
    } else {
        instance
            .todos
            .iter()
            .map(|t| format!("- [{}] {}", if t.done { "x" } else { " " }, t.text))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let system = format!(
        "You hold a conversation with one contact over {channel}.\n\
         Objective: {objective}\n\
         Checklist:\n{todos}\n\
         Call exactly one tool. {task}",
        channel = instance.channel,
        objective = instance.objective,
        task = if follow_up {
            format!(
                "The contact has not answered; this is follow-up {} of {}.",
                instance.follow_ups_sent + 1,
                instance.max_follow_ups
            )
        } else {
            "Decide the next step.".to_owned()
        },
    );
    let mut messages = vec![LlmMessage::system(system)];
    let start = transcript.len().saturating_sub(TRANSCRIPT_WINDOW);
    for m in &transcript[start..] {
        messages.push(match m.role {
            Role::Contact => LlmMessage::user(m.text.clone()),
            Role::Agent => LlmMessage::assistant(m.text.clone()),
            Role::Human => LlmMessage::assistant(format!("[operator] {}", m.text)),
        });
    }
    if transcript.is_empty() {
        messages.push(LlmMessage::user(
            "(the conversation has not started; write the first message)",
        ));
    }
    let mut request = CompletionRequest::new(messages)
        .with_prompt_name(if follow_up {
            "conversation_follow_up"
        } else {
            "conversation_turn"
        })
        .with_tools(tools(follow_up))
        .with_temperature(0.2);
    request.tool_choice = Some(ToolChoice::Required);
    request
}

#[derive(Deserialize)]
struct SendArgs {
    text: String,
    #[serde(default)]
    next_heartbeat_s: Option<u64>,
}

#[derive(Deserialize)]
struct EndArgs {
    #[serde(default)]
    outcome: Option<String>,
}

#[derive(Deserialize)]
struct HumanArgs {
    reason: String,
}

#[derive(Deserialize)]
struct TodoArgs {
    todos: Vec<Todo>,
}

/// The action in an answer: its first tool call, or, from a model that
/// answers in JSON instead, `{"action": name, ...arguments}`.
pub fn parse_action(response: &CompletionResponse) -> Result<Action, AgentError> {
    let (name, args) = match response.tool_calls.first() {
        Some(call) => (call.name.clone(), call.arguments.clone()),
        None => {
            let value: Value = structured::extract_json(&response.content)
                .map_err(|e| AgentError::Unusable(e.to_string()))?;
            let name = value
                .get("action")
                .and_then(Value::as_str)
                .ok_or_else(|| AgentError::Unusable("no tool call and no action".into()))?
                .to_owned();
            (name, value.to_string())
        }
    };
    let bad = |e: serde_json::Error| AgentError::Unusable(format!("{name}: {e}"));
    match name.as_str() {
        "send_message" => {
            let a: SendArgs = serde_json::from_str(&args).map_err(bad)?;
            Ok(Action::SendMessage {
                text: a.text,
                next_heartbeat_s: a.next_heartbeat_s.filter(|s| *s > 0),
            })
        }
        "end_conversation" => {
            let a: EndArgs = serde_json::from_str(&args).map_err(bad)?;
            Ok(Action::EndConversation { outcome: a.outcome })
        }
        "request_human" => {
            let a: HumanArgs = serde_json::from_str(&args).map_err(bad)?;
            Ok(Action::RequestHuman { reason: a.reason })
        }
        "update_todos" => {
            let a: TodoArgs = serde_json::from_str(&args).map_err(bad)?;
            Ok(Action::UpdateTodos { todos: a.todos })
        }
        other => Err(AgentError::Unusable(format!("unknown action {other:?}"))),
    }
}

/// Applies an action; a refusal means the instance moved on meanwhile.
async fn act(
    state: &AppState,
    product: &ProductId,
    id: InstanceId,
    command: impl Fn(&mut Instance, Timestamp) -> Result<Outcome, ConversationError>
    + Send
    + Sync
    + 'static,
) -> Result<TurnResult, AgentError> {
    Ok(match service::apply(state, product, id, command).await? {
        Ok(applied) => TurnResult::Applied(applied.instance.state),
        Err(ConversationError::NotAllowed { state, .. }) => TurnResult::Skipped(state),
        Err(other) => return Err(AgentError::Unusable(other.to_string())),
    })
}

/// Runs one agent turn on an instance: starts the turn when the instance
/// waits for one, asks the model, applies the action.
///
/// # Errors
///
/// A model failure or an unusable answer (the task retries), or a store
/// failure.
pub async fn run_turn(
    state: &AppState,
    product: &ProductId,
    id: InstanceId,
) -> Result<TurnResult, AgentError> {
    let Some(instance) = state.conversations.get(product, id).await? else {
        return Ok(TurnResult::Skipped(ConversationState::Failed));
    };
    match instance.state {
        ConversationState::Created | ConversationState::WaitingForAgent => {
            if let TurnResult::Skipped(other) =
                act(state, product, id, |i, now| i.begin_agent_turn(now)).await?
            {
                return Ok(TurnResult::Skipped(other));
            }
        }
        ConversationState::Active => {}
        other => return Ok(TurnResult::Skipped(other)),
    }
    for _ in 0..=MAX_TODO_UPDATES {
        let Some(instance) = state.conversations.get(product, id).await? else {
            return Ok(TurnResult::Skipped(ConversationState::Failed));
        };
        if instance.state != ConversationState::Active {
            return Ok(TurnResult::Skipped(instance.state));
        }
        let transcript = state.conversations.transcript(product, id).await?;
        let response = state
            .llm
            .complete(&request_for(&instance, &transcript, false))
            .await?;
        return match parse_action(&response)? {
            Action::UpdateTodos { todos } => {
                match act(state, product, id, move |i, now| {
                    i.update_todos(todos.clone(), now)
                })
                .await?
                {
                    TurnResult::Applied(_) => continue,
                    skipped => Ok(skipped),
                }
            }
            Action::SendMessage {
                text,
                next_heartbeat_s,
            } => {
                act(state, product, id, move |i, now| {
                    i.agent_send(text.clone(), next_heartbeat_s, now)
                })
                .await
            }
            Action::EndConversation { outcome } => {
                act(state, product, id, move |i, now| {
                    i.end_conversation(outcome.clone(), now)
                })
                .await
            }
            Action::RequestHuman { reason } => {
                act(state, product, id, move |i, now| {
                    i.request_human(reason.clone(), now)
                })
                .await
            }
        };
    }
    Err(AgentError::Unusable(format!(
        "the model updated the todos {} times without acting",
        MAX_TODO_UPDATES + 1
    )))
}

/// Composes and sends the follow-up of a fired heartbeat.
///
/// # Errors
///
/// A model failure or an unusable answer (the task retries), or a store
/// failure.
pub async fn run_follow_up(
    state: &AppState,
    product: &ProductId,
    id: InstanceId,
) -> Result<TurnResult, AgentError> {
    let Some(instance) = state.conversations.get(product, id).await? else {
        return Ok(TurnResult::Skipped(ConversationState::Failed));
    };
    if instance.state != ConversationState::HeartbeatScheduled {
        return Ok(TurnResult::Skipped(instance.state));
    }
    let transcript = state.conversations.transcript(product, id).await?;
    let response = state
        .llm
        .complete(&request_for(&instance, &transcript, true))
        .await?;
    let Action::SendMessage {
        text,
        next_heartbeat_s,
    } = parse_action(&response)?
    else {
        return Err(AgentError::Unusable("a follow-up must be a message".into()));
    };
    act(state, product, id, move |i, now| {
        i.send_follow_up(text.clone(), next_heartbeat_s, now)
    })
    .await
}

pub use parlance_ports::conversation::{FOLLOW_UP_KIND, TURN_KIND};

/// Runs agent turns or follow-ups from the queue. A task whose last attempt
/// fails applies `fail(error)` to its instance.
pub struct AgentTaskHandler {
    state: AppState,
    follow_up: bool,
}

impl AgentTaskHandler {
    /// The handler of [`TURN_KIND`] (`follow_up = false`) or
    /// [`FOLLOW_UP_KIND`].
    pub fn new(state: AppState, follow_up: bool) -> Self {
        Self { state, follow_up }
    }
}

#[async_trait::async_trait]
impl TaskHandler for AgentTaskHandler {
    async fn run(&self, task: &Lease) -> Result<Value, TaskError> {
        let id = service::task_instance(task)?;
        let product = &task.product_id;
        let result = if self.follow_up {
            run_follow_up(&self.state, product, id).await
        } else {
            run_turn(&self.state, product, id).await
        };
        match result {
            Ok(TurnResult::Applied(s)) => Ok(json!({ "applied": s })),
            Ok(TurnResult::Skipped(s)) => Ok(json!({ "skipped": s })),
            Err(e) => {
                let message = match &e {
                    AgentError::Model(m) => format!("model call failed: {m}"),
                    other => other.to_string(),
                };
                if task.attempt >= task.max_attempts {
                    let reason = message.clone();
                    let failed = service::apply(&self.state, product, id, move |i, now| {
                        i.fail(reason.clone(), now)
                    })
                    .await;
                    if let Err(store) = failed {
                        return Err(TaskError::retryable(format!(
                            "{message}; marking the conversation failed: {store}"
                        )));
                    }
                    return Err(TaskError::permanent(message));
                }
                Err(TaskError::retryable(message))
            }
        }
    }
}

/// Registers the conversation agent's task kinds and deliveries.
pub fn register(handlers: &mut Handlers, state: &AppState) {
    handlers.register(
        parlance_ports::conversation::DELIVER_KIND,
        std::sync::Arc::new(service::DeliveryHandler::new(state.clone())),
    );
    handlers.register(
        TURN_KIND,
        std::sync::Arc::new(AgentTaskHandler::new(state.clone(), false)),
    );
    handlers.register(
        FOLLOW_UP_KIND,
        std::sync::Arc::new(AgentTaskHandler::new(state.clone(), true)),
    );
}
