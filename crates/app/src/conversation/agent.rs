//! The conversation agent: one turn reads the objective, the todos and the
//! transcript, asks the model for exactly one action and applies it.

use parlance_core::conversation::{
    ConversationCommand, ConversationError, ConversationKey, ConversationState, HANDED_BACK,
    Instance, Message, Role, Todo,
};
use parlance_core::structured;
use parlance_memory::{Reply, Rule, When};
use parlance_ports::{
    CompletionRequest, CompletionResponse, Lease, LlmError, Message as LlmMessage, PortError,
    ToolChoice, ToolDefinition,
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::Conversations;
use super::service;
use crate::execute::ServiceError;
use crate::worker::{Handlers, TaskError, TaskHandler};

/// How many `update_todos` calls one turn may make before it must act.
const MAX_TODO_UPDATES: usize = 3;
/// How many transcript messages the prompt shows (the most recent).
const TRANSCRIPT_WINDOW: usize = 40;

/// What the model chose.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Action {
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
pub(super) enum AgentError {
    /// The model failed; retry later.
    #[error("model call failed")]
    Model(#[from] LlmError),
    /// The model answered something that is not one of the actions.
    #[error("model answered no usable action: {0}")]
    Unusable(String),
    /// The store failed.
    #[error("conversation store failed")]
    Store(#[from] PortError),
    /// The action could not be committed (the store failed, or every
    /// attempt lost its race).
    #[error("conversation command failed")]
    Command(#[source] ServiceError<Instance>),
}

/// What a turn did.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum TurnResult {
    /// The action was applied; the instance is now in this state.
    Applied(ConversationState),
    /// There was nothing to do (the instance moved on, was paused or ended).
    Skipped(ConversationState),
}

/// What one request to the model is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ask {
    /// The next step of a turn: every tool.
    Turn,
    /// The next step of the turn that follows an operator's hand-back: every
    /// tool but `request_human`, since a person has just answered.
    HandedBack,
    /// A follow-up to a silent contact: `send_message` only.
    FollowUp,
}

/// The words of a contact's message that ask for a person, for the offline
/// model's hand-off rule.
const ASKS_FOR_A_PERSON: [&str; 2] = ["person", "human"];

/// The rule the embedded default's offline model answers the agent with: a
/// request that offers `request_human` calls it when the newest message is
/// the contact's and asks for a person (holds "person" or "human", in any
/// case). Any other request gets the model's fallback (for a turn, the
/// first tool: a message).
pub fn offline_hand_off() -> Rule {
    Rule {
        when: When::All(vec![
            When::ToolOffered("request_human".to_owned()),
            When::LastFromUser,
            When::AnyOf(
                ASKS_FOR_A_PERSON
                    .iter()
                    .map(|w| When::UserContains((*w).to_owned()))
                    .collect(),
            ),
        ]),
        reply: Reply::tool_call(
            "request_human",
            json!({"reason": "the contact asked for a person"}),
        ),
        remaining: None,
    }
}

fn tools(ask: Ask) -> Vec<ToolDefinition> {
    let follow_up = ask == Ask::FollowUp;
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
    let mut tools = vec![
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
    ];
    if ask == Ask::HandedBack {
        tools.retain(|t| t.name != "request_human");
    }
    tools
}

/// The request for one decision.
pub(super) fn request_for(
    instance: &Instance,
    transcript: &[Message],
    ask: Ask,
) -> CompletionRequest {
    let follow_up = ask == Ask::FollowUp;
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
        } else if transcript.is_empty() {
            "Nothing has been said yet: write the first message.".to_owned()
        } else if ask == Ask::HandedBack {
            "A person has just dealt with the contact and handed the conversation back to you: \
             go on towards the objective."
                .to_owned()
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
    let mut request = CompletionRequest::new(messages)
        .with_prompt_name(if follow_up {
            "conversation_follow_up"
        } else {
            "conversation_turn"
        })
        .with_tools(tools(ask))
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
pub(super) fn parse_action(response: &CompletionResponse) -> Result<Action, AgentError> {
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
    state: &Conversations,
    key: &ConversationKey,
    command: ConversationCommand,
) -> Result<TurnResult, AgentError> {
    match service::run(state, key, command).await {
        Ok(executed) => Ok(TurnResult::Applied(executed.state.state)),
        Err(ServiceError::Refused {
            error: ConversationError::NotAllowed(_),
            current: Some(current),
        }) => Ok(TurnResult::Skipped(current.state.state)),
        Err(ServiceError::Refused { error, .. }) => Err(AgentError::Unusable(error.to_string())),
        Err(ServiceError::NotFound) => Ok(TurnResult::Skipped(ConversationState::Failed)),
        Err(other) => Err(AgentError::Command(other)),
    }
}

/// The instance at `key` as stored, if it exists.
async fn load(
    state: &Conversations,
    key: &ConversationKey,
) -> Result<Option<Instance>, AgentError> {
    Ok(state.store.load(key).await?.map(|s| s.state))
}

/// Runs one agent turn on an instance: starts the turn when the instance
/// waits for one, asks the model, applies the action. `ask` is
/// [`Ask::HandedBack`] for the turn that follows an operator's hand-back.
///
/// # Errors
///
/// A model failure or an unusable answer (the task retries), or a store
/// failure.
pub(super) async fn run_turn(
    state: &Conversations,
    key: &ConversationKey,
    ask: Ask,
) -> Result<TurnResult, AgentError> {
    let Some(instance) = load(state, key).await? else {
        return Ok(TurnResult::Skipped(ConversationState::Failed));
    };
    match instance.state {
        ConversationState::Created | ConversationState::WaitingForAgent => {
            if let TurnResult::Skipped(other) =
                act(state, key, ConversationCommand::BeginAgentTurn).await?
            {
                return Ok(TurnResult::Skipped(other));
            }
        }
        ConversationState::Active => {}
        other => return Ok(TurnResult::Skipped(other)),
    }
    for _ in 0..=MAX_TODO_UPDATES {
        let Some(instance) = load(state, key).await? else {
            return Ok(TurnResult::Skipped(ConversationState::Failed));
        };
        if instance.state != ConversationState::Active {
            return Ok(TurnResult::Skipped(instance.state));
        }
        let transcript = state.index.transcript(key).await?;
        let response = state
            .shared
            .llm
            .complete(&request_for(&instance, &transcript, ask))
            .await?;
        return match parse_action(&response)? {
            Action::UpdateTodos { todos } => {
                match act(state, key, ConversationCommand::UpdateTodos { todos }).await? {
                    TurnResult::Applied(_) => continue,
                    skipped => Ok(skipped),
                }
            }
            Action::SendMessage {
                text,
                next_heartbeat_s,
            } => {
                let command = ConversationCommand::AgentSend {
                    text,
                    next_heartbeat_s,
                };
                act(state, key, command).await
            }
            Action::EndConversation { outcome } => {
                act(state, key, ConversationCommand::EndConversation { outcome }).await
            }
            Action::RequestHuman { reason } => {
                act(state, key, ConversationCommand::RequestHuman { reason }).await
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
pub(super) async fn run_follow_up(
    state: &Conversations,
    key: &ConversationKey,
) -> Result<TurnResult, AgentError> {
    let Some(instance) = load(state, key).await? else {
        return Ok(TurnResult::Skipped(ConversationState::Failed));
    };
    if instance.state != ConversationState::HeartbeatScheduled {
        return Ok(TurnResult::Skipped(instance.state));
    }
    let transcript = state.index.transcript(key).await?;
    let response = state
        .shared
        .llm
        .complete(&request_for(&instance, &transcript, Ask::FollowUp))
        .await?;
    let Action::SendMessage {
        text,
        next_heartbeat_s,
    } = parse_action(&response)?
    else {
        return Err(AgentError::Unusable("a follow-up must be a message".into()));
    };
    let command = ConversationCommand::SendFollowUp {
        text,
        next_heartbeat_s,
    };
    act(state, key, command).await
}

pub(super) use parlance_ports::conversation::{FOLLOW_UP_KIND, TURN_KIND};

/// Runs agent turns or follow-ups from the queue. A task whose last attempt
/// fails applies `fail(error)` to its instance.
pub(super) struct AgentTaskHandler {
    state: Conversations,
    follow_up: bool,
}

impl AgentTaskHandler {
    /// The handler of [`TURN_KIND`] (`follow_up = false`) or
    /// [`FOLLOW_UP_KIND`].
    pub(super) fn new(state: Conversations, follow_up: bool) -> Self {
        Self { state, follow_up }
    }
}

#[async_trait::async_trait]
impl TaskHandler for AgentTaskHandler {
    async fn run(&self, task: &Lease) -> Result<Value, TaskError> {
        let key = service::task_key(task)?;
        let result = if self.follow_up {
            run_follow_up(&self.state, &key).await
        } else {
            let ask = if task.payload.get(HANDED_BACK) == Some(&Value::Bool(true)) {
                Ask::HandedBack
            } else {
                Ask::Turn
            };
            run_turn(&self.state, &key, ask).await
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
                    let command = ConversationCommand::Fail {
                        error: message.clone(),
                    };
                    match service::run(&self.state, &key, command).await {
                        // Failed now, or ended (or gone) before: either way
                        // the task is done.
                        Ok(_) | Err(ServiceError::Refused { .. } | ServiceError::NotFound) => {}
                        Err(e) => {
                            return Err(TaskError::retryable(format!(
                                "{message}; marking the conversation failed: {e}"
                            )));
                        }
                    }
                    return Err(TaskError::permanent(message));
                }
                Err(TaskError::retryable(message))
            }
        }
    }
}

/// Registers the conversation agent's task kinds and deliveries.
pub fn register(handlers: &mut Handlers, state: &Conversations) {
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
