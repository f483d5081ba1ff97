//! The agent's use cases: run a turn (AgentInput -> AgentOutput), resume a
//! turn that waits for the person's answer, read a thread, end a session
//! with an episodic summary, and the owner's memory.
//! Each answers a typed [`AgentError`]; the routes turn it into an answer.

use parlance_core::turn::seed::{
    Channel, Message, Role, SupportInput, SupportLoaded, SupportOutput,
};
use parlance_core::turn::{
    Checkpoint, EpisodicEntry, MemoryEntry, MemoryId, MemoryRecord, OwnerId, ThreadId, ThreadKey,
    TurnKey, WorkingMemoryEntry,
};
use parlance_core::{IdError, ProductId, StructuredError, parse_structured};
use parlance_ports::{CompletionRequest, LlmError, Message as LlmMessage, PortError};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use utoipa::ToSchema;

use super::Agent;
use super::stages::{AgentContext, embed, runner};
use crate::turn::{TurnEvents, TurnRunError};

/// The thread used when a caller gives a user id but no session id.
pub(super) const DEFAULT_THREAD: &str = "default";

/// Why an agent request did not complete.
#[derive(Debug, thiserror::Error)]
pub(super) enum AgentError {
    /// Neither a user id nor a session id was given.
    #[error("user_id or session_id is required")]
    NoOwner,
    /// An owner or thread id is not a valid id.
    #[error(transparent)]
    BadId(#[from] IdError),
    /// The turn's message is empty.
    #[error("message must not be empty")]
    EmptyMessage,
    /// The thread has no turn.
    #[error("no such thread")]
    NoThread,
    /// The turn did not complete and committed nothing.
    #[error(transparent)]
    Turn(#[from] TurnRunError),
    /// The model could not summarise the session.
    #[error("the language model is unavailable")]
    Model(#[source] LlmError),
    /// The model's summary is not the JSON asked for.
    #[error("the language model answered malformed JSON")]
    Malformed(#[source] StructuredError),
    /// A store failed.
    #[error(transparent)]
    Port(#[from] PortError),
}

/// The public input of a turn.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct AgentInput {
    /// The user's message.
    pub message: String,
    /// Transport surface.
    #[serde(default)]
    pub channel: Channel,
    /// Persistent owner; required when `session_id` is absent.
    #[serde(default)]
    pub user_id: Option<String>,
    /// The thread; the fallback owner.
    #[serde(default)]
    pub session_id: Option<String>,
    /// Earlier turns the caller holds (prompt context; not stored).
    #[serde(default)]
    pub history: Vec<Message>,
    /// Memory entries the caller supplies, before the retrieved ones.
    #[serde(default)]
    pub working_memory: Vec<WorkingMemoryEntry>,
    /// Skill names.
    #[serde(default)]
    pub installed_skills: Vec<String>,
}

/// Owner and thread from `user_id` / `session_id`: memory is namespaced by
/// the user id, falling back to the session id; the thread is the session id
/// (or [`DEFAULT_THREAD`]).
///
/// # Errors
///
/// [`AgentError::NoOwner`] when neither is given, [`AgentError::BadId`]
/// when one is not a valid id.
pub(super) fn resolve(
    user_id: Option<&str>,
    session_id: Option<&str>,
) -> Result<(OwnerId, ThreadId), AgentError> {
    let user = user_id.filter(|s| !s.trim().is_empty());
    let session = session_id.filter(|s| !s.trim().is_empty());
    let owner = match (user, session) {
        (Some(u), _) => u,
        (None, Some(s)) => s,
        (None, None) => return Err(AgentError::NoOwner),
    };
    let owner = OwnerId::parse(owner)?;
    let thread = ThreadId::parse(session.unwrap_or(DEFAULT_THREAD))?;
    Ok((owner, thread))
}

fn context(
    state: &Agent,
    product_id: &ProductId,
    owner: OwnerId,
    thread: ThreadId,
    history: Vec<Message>,
) -> AgentContext {
    AgentContext {
        product_id: product_id.clone(),
        owner,
        thread,
        llm: state.shared.llm.clone(),
        response_llm: None,
        memory_store: state.memory_store.clone(),
        crisis_budget: state.crisis_budget,
        embedder: Some(state.shared.embedder.clone()),
        data: state.agent_data.clone(),
        clock: state.shared.clock.clone(),
        ids: state.shared.ids.clone(),
        caller_history: history,
    }
}

/// The thread of a turn's input, once the input is usable.
///
/// # Errors
///
/// As [`resolve`] for the owner, or [`AgentError::EmptyMessage`].
pub(super) fn check(product_id: &ProductId, input: &AgentInput) -> Result<ThreadKey, AgentError> {
    let (owner, thread) = resolve(input.user_id.as_deref(), input.session_id.as_deref())?;
    if input.message.trim().is_empty() {
        return Err(AgentError::EmptyMessage);
    }
    Ok(ThreadKey {
        product_id: product_id.clone(),
        owner,
        thread,
    })
}

/// Runs one turn of the support agent, reporting to `events` as it runs
/// when given. A turn whose stage asks the person first (a memory
/// deletion) is committed up to that question; its output carries the
/// question as `interrupt`.
///
/// # Errors
///
/// As [`check`], or [`AgentError::Turn`] when the turn did not complete
/// (among them the thread's refusal while an earlier turn waits on its
/// answer, reason `interrupt_pending`).
pub(super) async fn run_turn(
    state: &Agent,
    product_id: &ProductId,
    input: AgentInput,
    events: Option<&TurnEvents>,
) -> Result<SupportOutput, AgentError> {
    let ThreadKey { owner, thread, .. } = check(product_id, &input)?;
    let ctx = context(
        state,
        product_id,
        owner.clone(),
        thread.clone(),
        input.history,
    );
    let key = ThreadKey {
        product_id: product_id.clone(),
        owner,
        thread,
    };
    let turn_input = SupportInput {
        message: input.message,
        channel: input.channel,
        user_id: input.user_id,
        session_id: input.session_id,
        installed_skills: input.installed_skills,
    };
    let loaded = SupportLoaded {
        working_memory: input.working_memory,
        ..SupportLoaded::default()
    };
    let report = runner(state.threads.clone(), state.shared.clock.clone())
        .run_reporting(&ctx, &key, turn_input, loaded, events)
        .await?;
    Ok(report.output)
}

/// Resumes the turn `thread` waits on with the person's answer `value`,
/// reporting to `events` when given.
///
/// # Errors
///
/// [`AgentError::Turn`] when the turn did not complete: among them the
/// thread's refusal when no turn waits (reason `no_interrupt`, also the
/// answer to the loser of two racing resumes), and not found for a thread
/// with no turn.
pub(super) async fn resume_turn(
    state: &Agent,
    product_id: &ProductId,
    owner: OwnerId,
    thread: ThreadId,
    value: Value,
    events: Option<&TurnEvents>,
) -> Result<SupportOutput, AgentError> {
    let ctx = context(state, product_id, owner.clone(), thread.clone(), Vec::new());
    let key = ThreadKey {
        product_id: product_id.clone(),
        owner,
        thread,
    };
    let report = runner(state.threads.clone(), state.shared.clock.clone())
        .resume_reporting(&ctx, &key, value, events)
        .await?;
    Ok(report.output)
}

/// A thread as stored: its transcript and persisted reducer fields.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = AgentThread)]
pub(super) struct ThreadView {
    /// The thread.
    pub thread_id: ThreadId,
    /// Its owner.
    pub owner: OwnerId,
    /// Turns committed.
    pub version: u64,
    /// Every message, oldest first.
    #[schema(value_type = Vec<Message>)]
    pub transcript: Vec<Value>,
    /// Session memory, progress and exercise state (the persisted
    /// fields; the runtime's own keys are not among them).
    pub state: Map<String, Value>,
    /// What the turn the thread waits on asks (resume the thread with the
    /// answer); absent when no turn waits.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub interrupt: Option<Value>,
}

/// Reads a thread.
///
/// # Errors
///
/// [`AgentError::NoThread`] for a thread with no turn, or a store failure.
pub(super) async fn thread(
    state: &Agent,
    product_id: &ProductId,
    owner: OwnerId,
    thread: ThreadId,
) -> Result<ThreadView, AgentError> {
    let key = TurnKey::whole(ThreadKey {
        product_id: product_id.clone(),
        owner: owner.clone(),
        thread: thread.clone(),
    });
    let cp = state
        .threads
        .load(&key)
        .await?
        .ok_or(AgentError::NoThread)?
        .state;
    Ok(ThreadView::of(thread, owner, &cp))
}

impl ThreadView {
    /// The view of `owner`'s thread `thread` as `cp` holds it.
    pub(super) fn of(thread: ThreadId, owner: OwnerId, cp: &Checkpoint) -> Self {
        Self {
            thread_id: thread,
            owner,
            version: cp.version,
            transcript: cp.lists.get("transcript").cloned().unwrap_or_default(),
            state: cp
                .field_objects()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            interrupt: cp.pending_interrupt().map(|i| i.payload),
        }
    }
}

#[derive(Debug, Deserialize)]
struct Summary {
    summary: String,
    primary_themes: Vec<String>,
    approach_used: Option<String>,
}

fn summary_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "summary": {"type": "string", "minLength": 1, "maxLength": 600},
            "primary_themes": {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 3},
            "approach_used": {"type": ["string", "null"]}
        },
        "required": ["summary", "primary_themes", "approach_used"],
        "additionalProperties": false
    })
}

/// A stored memory entry as the API shows it (without its vector).
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = AgentMemoryView)]
pub(super) struct MemoryView {
    /// Its id.
    pub id: MemoryId,
    /// Whose it is.
    pub owner: OwnerId,
    /// What it says.
    pub entry: MemoryEntry,
    /// When it was stored.
    pub at: parlance_core::Timestamp,
}

impl From<MemoryRecord> for MemoryView {
    fn from(r: MemoryRecord) -> Self {
        Self {
            id: r.id,
            owner: r.owner,
            entry: r.entry,
            at: r.at,
        }
    }
}

/// Ends a session: the model summarises the transcript into an episodic
/// entry in the owner's memory, and the summary becomes the thread's session
/// memory.
///
/// # Errors
///
/// [`AgentError::NoThread`] for a thread with no turn,
/// [`AgentError::Model`] or [`AgentError::Malformed`] when the model fails,
/// or a store failure.
pub(super) async fn end_session(
    state: &Agent,
    product_id: &ProductId,
    owner: OwnerId,
    thread_id: ThreadId,
) -> Result<MemoryView, AgentError> {
    let view = thread(state, product_id, owner.clone(), thread_id.clone()).await?;
    let transcript: Vec<Message> = view
        .transcript
        .iter()
        .filter_map(|v| serde_json::from_value(v.clone()).ok())
        .collect();
    let lines: Vec<String> = transcript
        .iter()
        .map(|m| {
            format!(
                "{}: {}",
                if m.role == Role::User {
                    "User"
                } else {
                    "Assistant"
                },
                m.content
            )
        })
        .collect();
    let schema = summary_schema();
    let request = CompletionRequest::new(vec![
        LlmMessage::system(
            "Summarise this support session for next time, in one or two sentences from the \
             agent's point of view, with up to three primary themes (single words, most important \
             first) and the therapeutic approach used, if any. Answer only JSON.",
        ),
        LlmMessage::user(lines.join("\n")),
    ])
    .with_prompt_name("episodic_summary")
    .with_temperature(0.0)
    .with_json_schema("episodic_summary", schema.clone());
    let answer = state
        .shared
        .llm
        .complete(&request)
        .await
        .map_err(AgentError::Model)?;
    let s: Summary = parse_structured(&answer.content, &schema).map_err(AgentError::Malformed)?;
    let entry = MemoryEntry::Episodic(EpisodicEntry {
        summary: s.summary.clone(),
        primary_themes: s.primary_themes,
        is_catch_up: false,
        approach_used: s.approach_used,
        approach_context: None,
    });
    let ctx = context(
        state,
        product_id,
        owner.clone(),
        thread_id.clone(),
        Vec::new(),
    );
    let record = MemoryRecord {
        id: MemoryId::from_uuid(state.shared.ids.new_uuid()),
        owner: owner.clone(),
        embedding: embed(&ctx, &entry.search_text()).await,
        entry,
        at: state.shared.clock.now(),
    };
    state.memory_store.add(product_id, &record).await?;
    let mut memory = state
        .memory_store
        .session_memory(product_id, &owner, &thread_id)
        .await?
        .and_then(|v| v.as_object().cloned())
        .unwrap_or_default();
    memory.insert("summary".to_owned(), json!(s.summary));
    state
        .memory_store
        .put_session_memory(product_id, &owner, &thread_id, &Value::Object(memory))
        .await?;
    Ok(record.into())
}

/// Stores an entry for an owner.
///
/// # Errors
///
/// A store failure.
pub(super) async fn add_memory(
    state: &Agent,
    product_id: &ProductId,
    owner: OwnerId,
    entry: MemoryEntry,
) -> Result<MemoryView, AgentError> {
    let ctx = context(
        state,
        product_id,
        owner.clone(),
        ThreadId::parse(DEFAULT_THREAD)?,
        Vec::new(),
    );
    let record = MemoryRecord {
        id: MemoryId::from_uuid(state.shared.ids.new_uuid()),
        owner,
        embedding: embed(&ctx, &entry.search_text()).await,
        entry,
        at: state.shared.clock.now(),
    };
    state.memory_store.add(product_id, &record).await?;
    Ok(record.into())
}
