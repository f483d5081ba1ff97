//! The support agent's graph and stages over the seed-shaped
//! [`SupportState`]: turn memory context -> crisis gate -> crisis response,
//! or turn dispatch -> one reply node -> turn finalization -> memory
//! extraction. Build initial state is the runtime's `begin_turn` (the user
//! turn appended, the turn count from the checkpoint); `turn_total_ms` is
//! stamped by the runner outside the graph.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parlance_core::ProductId;
use parlance_core::agent::crisis::{self, LlmAssessment};
use parlance_core::agent::directory::{Location, crisis_reply, grounded_reply, lookup_status};
use parlance_core::agent::exercise::{self, GROUNDING, GROUNDING_APPROACH};
use parlance_core::agent::triage::{
    self, Confirmation, Dispatch, MemoryCommand, PendingAction, parse_confirmation,
};
use parlance_core::parse_structured;
use parlance_core::turn::seed::{Message, Role, Route, SessionMemory, SupportDelta, SupportState};
use parlance_core::turn::{
    Checkpoint, CheckpointDelta, END, Graph, MemoryEntry, MemoryId, MemoryKind, MemoryRecord,
    OwnerId, SemanticEntry, ThreadId, WorkingMemoryEntry, format_working_memory_entries,
};
use parlance_ports::{
    Clock, CompletionRequest, CrisisLogEntry, EmbeddingProvider, IdGen, LlmClient, LlmError,
    MachineStore, MemoryStore, Message as LlmMessage, PortError, carry_crisis_entries,
    carry_forgotten,
};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::data::AgentData;
use crate::turn::{
    Dependency, OutboxCommit, QueryEmbedder, Stage, StageError, TurnRunner, retrieve_hybrid,
};

/// How many memory entries a turn retrieves.
pub(super) const RETRIEVE_K: usize = 5;

/// How many recent messages the model prompts see.
const PROMPT_WINDOW: usize = 12;

/// The runtime dependencies of one turn (never in the state).
#[derive(Clone)]
pub(super) struct AgentContext {
    /// The tenant.
    pub product_id: ProductId,
    /// Whose memory.
    pub owner: OwnerId,
    /// Which thread.
    pub thread: ThreadId,
    /// The classifier and extraction model.
    pub llm: Arc<dyn LlmClient>,
    /// The reply model (the classifier's when `None`).
    pub response_llm: Option<Arc<dyn LlmClient>>,
    /// Long-term memory.
    pub memory_store: Arc<dyn MemoryStore>,
    /// How long the crisis gate waits for the model.
    pub crisis_budget: Duration,
    /// The embedding provider, for retrieval and stored facts.
    pub embedder: Option<Arc<dyn EmbeddingProvider>>,
    /// The operator's directory and knowledge base.
    pub data: Arc<AgentData>,
    /// Time, for stored records.
    pub clock: Arc<dyn Clock>,
    /// Ids, for stored records.
    pub ids: Arc<dyn IdGen>,
    /// History the caller sent with the turn (prompt context only).
    pub caller_history: Vec<Message>,
}

impl AgentContext {
    fn response_llm(&self) -> &dyn LlmClient {
        self.response_llm.as_deref().unwrap_or(self.llm.as_ref())
    }

    /// The caller's history, then the thread's window (which ends with this
    /// turn's user message), cut to the last `PROMPT_WINDOW` messages.
    fn prompt_history(&self, s: &SupportState) -> Vec<LlmMessage> {
        let all: Vec<&Message> = self.caller_history.iter().chain(s.history.iter()).collect();
        all[all.len().saturating_sub(PROMPT_WINDOW)..]
            .iter()
            .map(|m| match m.role {
                Role::User => LlmMessage::user(m.content.clone()),
                Role::Assistant => LlmMessage::assistant(m.content.clone()),
            })
            .collect()
    }
}

/// An embedding provider as the retrieval seam wants it.
pub(super) struct ProviderEmbedder(pub Arc<dyn EmbeddingProvider>);

#[async_trait]
impl QueryEmbedder for ProviderEmbedder {
    async fn embed_query(&self, text: &str) -> Result<Vec<f32>, PortError> {
        let out = self.0.embed(&[text.to_owned()]).await?;
        out.vectors
            .into_iter()
            .next()
            .ok_or_else(|| PortError::other("embedding provider returned no vector"))
    }
}

fn diag(pairs: &[(&str, Value)]) -> Option<Map<String, Value>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect(),
    )
}

fn text(s: impl Into<String>) -> Option<String> {
    Some(s.into())
}

/// After the gate: the crisis response, or dispatch.
fn after_gate(s: &SupportState) -> &'static str {
    if s.route == Some(Route::Crisis) {
        "crisis_response"
    } else {
        "turn_dispatch"
    }
}

/// After dispatch: the reply node dispatch chose (recorded in diagnostics).
fn after_dispatch(s: &SupportState) -> &'static str {
    match s.diagnostics.get("dispatch").and_then(Value::as_str) {
        Some("safety_check") => "safety_check",
        Some("memory_control") => "memory_control",
        Some("guided_exercise") => "guided_exercise",
        Some("grounded_lookup") => "grounded_lookup",
        _ => "therapeutic_reply",
    }
}

/// The reference agent's graph.
pub(crate) fn graph() -> Graph<SupportState> {
    const REPLIES: [&str; 5] = [
        "therapeutic_reply",
        "safety_check",
        "guided_exercise",
        "memory_control",
        "grounded_lookup",
    ];
    let mut b = Graph::builder("support_agent")
        .stage("turn_memory_context")
        .stage("crisis_gate")
        .stage("crisis_response")
        .stage("turn_dispatch");
    for r in REPLIES {
        b = b.stage(r);
    }
    b = b
        .stage("finalize_turn")
        .stage("memory_extraction")
        .edge("turn_memory_context", "crisis_gate")
        .route(
            "crisis_gate",
            after_gate,
            &["crisis_response", "turn_dispatch"],
        )
        .route("turn_dispatch", after_dispatch, &REPLIES)
        .edge("crisis_response", "finalize_turn");
    for r in REPLIES {
        b = b.edge(r, "finalize_turn");
    }
    b.edge("finalize_turn", "memory_extraction")
        .edge("memory_extraction", END)
        .step_limit(8)
        .build()
        .expect("the support agent graph is valid")
}

/// A runner of the agent's graph with every stage, on the threads in
/// `store`, committing at `clock`'s time.
pub(super) fn runner(
    store: Arc<dyn MachineStore<Checkpoint>>,
    clock: Arc<dyn Clock>,
) -> TurnRunner<SupportState, AgentContext> {
    TurnRunner::new(graph(), store, clock)
        .stage("turn_memory_context", TurnMemoryContext)
        .stage("crisis_gate", CrisisGate)
        .stage("crisis_response", CrisisResponse)
        .stage("turn_dispatch", TurnDispatch)
        .stage("therapeutic_reply", TherapeuticReply)
        .stage("safety_check", SafetyCheck)
        .stage("guided_exercise", GuidedExercise)
        .stage("memory_control", MemoryControl)
        .stage("grounded_lookup", GroundedLookup)
        .stage("finalize_turn", FinalizeTurn)
        .stage("memory_extraction", MemoryExtraction)
        .outbox(outbox)
}

/// The crisis gate's assessment of this turn, carried into the turn's
/// commit for the crisis log: it is recorded with the turn or not at all,
/// once however often the turn is planned.
/// What a commit of the agent's turn carries: the crisis gate's assessment
/// (with a turn's first commit only, a resume runs no gate) and the memory
/// entries a confirmed deletion removes.
fn outbox(
    s: &SupportState,
    c: &AgentContext,
    commit: OutboxCommit,
) -> Result<CheckpointDelta, StageError> {
    let mut carried = match commit {
        OutboxCommit::Turn => crisis_log_entry(s, c)?,
        OutboxCommit::Resume => CheckpointDelta::default(),
    };
    carry_forgotten(&mut carried, &s.forget);
    Ok(carried)
}

fn crisis_log_entry(s: &SupportState, c: &AgentContext) -> Result<CheckpointDelta, StageError> {
    let mut carried = CheckpointDelta::default();
    if !s.diagnostics.contains_key("crisis_classifier_path") {
        // The gate did not run (a graph without it): nothing to record.
        return Ok(carried);
    }
    let entry = CrisisLogEntry {
        product_id: c.product_id.clone(),
        owner: c.owner.clone(),
        thread: c.thread.clone(),
        turn: s.session_progress.turn_count.unwrap_or(0),
        at: c.clock.now(),
        assessment: s.crisis.clone(),
        audit: s.crisis_audit.clone(),
        route: if s.crisis.needs_crisis_response {
            "crisis"
        } else {
            "dispatch"
        }
        .to_owned(),
    };
    carry_crisis_entries(&mut carried, &[entry])
        .map_err(StageError::port(Dependency::CrisisLog))?;
    Ok(carried)
}

/// Loads `working_memory` by hybrid retrieval, the procedural profile and
/// the session memory; records `load_memory_ms` and `retrieval_path`. A
/// failing store is recorded and the turn goes on (the gate must run).
pub(super) struct TurnMemoryContext;

#[async_trait]
impl Stage<SupportState, AgentContext> for TurnMemoryContext {
    async fn run(&self, s: &SupportState, c: &AgentContext) -> Result<SupportDelta, StageError> {
        let embedder = c.embedder.clone().map(ProviderEmbedder);
        let mut d = SupportDelta::default();
        let mut diagnostics = Map::new();
        match retrieve_hybrid(
            c.memory_store.as_ref(),
            embedder.as_ref().map(|e| e as &dyn QueryEmbedder),
            &c.product_id,
            &c.owner,
            &s.message,
            RETRIEVE_K,
        )
        .await
        {
            Ok(report) => {
                let mut wm = s.working_memory.clone();
                for hit in report.retrieved.hits {
                    let e = WorkingMemoryEntry::Entry(hit.record.entry);
                    if !wm.contains(&e) {
                        wm.push(e);
                    }
                }
                d.working_memory = Some(wm);
                diagnostics.insert("load_memory_ms".into(), json!(report.millis));
                diagnostics.insert(
                    "retrieval_path".into(),
                    json!(report.retrieved.path.as_str()),
                );
            }
            Err(e) => {
                tracing::warn!(error = %e, "memory retrieval failed; the turn goes on without it");
                diagnostics.insert("retrieval_path".into(), json!("unavailable"));
            }
        }
        match c.memory_store.profile(&c.product_id, &c.owner).await {
            Ok(p) => {
                d.procedural_rules = Some(p.procedural_rules);
                d.proactive_recall_enabled = Some(p.proactive_recall_enabled);
            }
            Err(e) => tracing::warn!(error = %e, "procedural profile unavailable"),
        }
        match c
            .memory_store
            .session_memory(&c.product_id, &c.owner, &c.thread)
            .await
        {
            Ok(Some(v)) => {
                d.session_memory = serde_json::from_value::<SessionMemory>(v).ok();
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "session memory unavailable"),
        }
        d.diagnostics = Some(diagnostics);
        Ok(d)
    }
}

/// The model classifier first, given the gate's own short budget; the
/// keyword classifier when it fails, has not answered within that budget,
/// or answers malformed JSON, and as a floor otherwise. The assessment is
/// recorded in the crisis log by the turn's commit ([`crisis_log_entry`]).
pub(super) struct CrisisGate;

#[async_trait]
impl Stage<SupportState, AgentContext> for CrisisGate {
    async fn run(&self, s: &SupportState, c: &AgentContext) -> Result<SupportDelta, StageError> {
        let keyword = crisis::keyword_assessment(&s.message);
        let schema = crisis::llm_schema();
        let mut messages = vec![LlmMessage::system(crisis::LLM_PROMPT)];
        messages.extend(c.prompt_history(s));
        let request = CompletionRequest::new(messages)
            .with_prompt_name("crisis_gate")
            .with_temperature(0.0)
            .with_json_schema("crisis_assessment", schema.clone())
            .with_deadline(Instant::now() + c.crisis_budget);
        // The gate's own budget bounds the call even for a model that
        // ignores the request's deadline.
        let called = tokio::time::timeout(c.crisis_budget, c.llm.complete(&request))
            .await
            .unwrap_or(Err(LlmError::Timeout {
                after: c.crisis_budget,
            }));
        let llm = match called {
            Ok(answer) => match parse_structured::<LlmAssessment>(&answer.content, &schema) {
                Ok(a) => Some(a),
                Err(e) => {
                    tracing::warn!(error = %e, "crisis classifier answered malformed JSON; keyword classifier decides");
                    None
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, "crisis classifier failed; keyword classifier decides");
                None
            }
        };
        let (assessment, audit) = crisis::decide(llm, &keyword);
        let crisis_route = assessment.needs_crisis_response;
        Ok(SupportDelta {
            route: crisis_route.then_some(Some(Route::Crisis)),
            diagnostics: diag(&[
                ("crisis_classifier_path", json!(audit.classifier_path)),
                // Written by the turn's commit: a turn that answers has it.
                ("crisis_log", json!("recorded")),
            ]),
            crisis: Some(assessment),
            crisis_audit: Some(audit),
            ..SupportDelta::default()
        })
    }
}

/// The crisis response: the universal advice, and only the directory's
/// resources for the inferred location.
pub(super) struct CrisisResponse;

#[async_trait]
impl Stage<SupportState, AgentContext> for CrisisResponse {
    async fn run(&self, s: &SupportState, c: &AgentContext) -> Result<SupportDelta, StageError> {
        let user_texts = std::iter::once(s.message.as_str()).chain(
            c.caller_history
                .iter()
                .chain(s.history.iter())
                .rev()
                .filter(|m| m.role == Role::User)
                .map(|m| m.content.as_str()),
        );
        let location = c.data.directory.infer_location(user_texts);
        let found = match &location {
            Location::Known(region) => c.data.directory.lookup(region),
            _ => Vec::new(),
        };
        let status = lookup_status(&location, &found);
        let place = match &location {
            Location::Known(r) => Some(r.clone()),
            _ => None,
        };
        let exercise_active = s.exercise_type.is_some();
        Ok(SupportDelta {
            // A crisis ends any exercise, and a pending deletion must not be
            // confirmed by an answer to "are you safe?".
            pending_action: s.pending_action.is_some().then_some(None),
            exercise_type: exercise_active.then_some(None),
            exercise_step: exercise_active.then_some(None),
            exercise_therapeutic_approach: exercise_active.then_some(None),
            grounded_status: Some(text("not_attempted")),
            diagnostics: diag(&[
                ("resource_lookup_status", json!(status)),
                ("inferred_location", json!(place)),
                ("resources_found", json!(found.len())),
            ]),
            response_text: Some(crisis_reply(&location, &found)),
            response_style: Some(text("crisis_response")),
            therapeutic_approach: Some(text("pfa")),
            inferred_location: Some(match location {
                Location::Known(r) => Some(r),
                _ => None,
            }),
            found_resources: Some(found),
            resource_lookup_status: Some(text(status)),
            ..SupportDelta::default()
        })
    }
}

/// Triage by rule: safety check, memory control, the exercise, a factual
/// question, or a therapeutic reply.
pub(super) struct TurnDispatch;

#[async_trait]
impl Stage<SupportState, AgentContext> for TurnDispatch {
    async fn run(&self, s: &SupportState, _c: &AgentContext) -> Result<SupportDelta, StageError> {
        // A deletion is confirmed by resuming the turn that asked, never by
        // a later message: an action a thread still holds from before lapses.
        let decision = triage::dispatch(
            &s.message,
            s.crisis.needs_clarification,
            false,
            s.exercise_type.is_some(),
        );
        let mut d = SupportDelta::default();
        if s.pending_action.is_some() {
            d.pending_action = Some(None);
        }
        let (route, name) = match &decision {
            Dispatch::SafetyCheck => (Route::Therapeutic, "safety_check"),
            Dispatch::MemoryControl => {
                let action = serde_json::to_value(triage::parse_memory_command(&s.message))
                    .unwrap_or(Value::Null);
                d.memory_action = Some(Some(action));
                (Route::MemoryControl, "memory_control")
            }
            Dispatch::Exercise => (Route::Therapeutic, "guided_exercise"),
            Dispatch::GroundedLookup(q) => {
                d.grounded_query = Some(Some(q.clone()));
                (Route::GroundedLookup, "grounded_lookup")
            }
            Dispatch::Therapeutic => (Route::Therapeutic, "therapeutic_reply"),
        };
        d.route = Some(Some(route));
        d.resource_lookup_status = Some(text("not_attempted"));
        if d.grounded_query.is_none() {
            d.grounded_status = Some(text("not_attempted"));
        }
        d.diagnostics = diag(&[("dispatch", json!(name))]);
        Ok(d)
    }
}

const STYLES: [&str; 6] = [
    "supportive",
    "reflective",
    "clarifying",
    "psychoeducation",
    "technique",
    "closing",
];

const APPROACHES: [&str; 8] = [
    "none",
    "motivational_interviewing",
    "cbt",
    "act",
    "dbt_skills",
    "grief_support",
    "interpersonal_therapy",
    "pfa",
];

#[derive(Debug, Deserialize)]
struct TherapeuticAnswer {
    response_style: String,
    therapeutic_approach: String,
    reply: String,
}

fn therapeutic_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "response_style": {"type": "string", "enum": STYLES},
            "therapeutic_approach": {"type": "string", "enum": APPROACHES},
            "reply": {"type": "string", "minLength": 1}
        },
        "required": ["response_style", "therapeutic_approach", "reply"],
        "additionalProperties": false
    })
}

/// The therapeutic prompt: role, procedural rules (always applied), recalled
/// memory (formatted here, one of its three surfaces), session memory, skills.
fn therapeutic_prompt(s: &SupportState) -> String {
    let mut p = String::from(
        "You are a warm, careful support companion, not a clinician. Reply briefly and kindly. \
         Never name hotlines, phone numbers or websites: verified resources are given \
         separately. Answer only JSON with response_style, therapeutic_approach and reply.",
    );
    if !s.procedural_rules.is_empty() {
        p.push_str("\nAlways follow these style rules:");
        for r in &s.procedural_rules {
            p.push_str(&format!("\n- {r}"));
        }
    }
    if !s.working_memory.is_empty() {
        p.push_str("\nWhat you remember about the user:\n");
        p.push_str(&format_working_memory_entries(&s.working_memory));
        p.push_str(if s.proactive_recall_enabled {
            "\nYou may bring these up when they help."
        } else {
            "\nUse these only when the user's message relates to them; do not bring them up otherwise."
        });
    }
    if let Some(summary) = &s.session_memory.summary {
        p.push_str(&format!("\nThis session so far: {summary}"));
    }
    if let Some(concerns) = &s.session_memory.active_concerns {
        p.push_str(&format!("\nActive concerns: {}", concerns.join(", ")));
    }
    if !s.installed_skills.is_empty() {
        p.push_str(&format!(
            "\nInstalled skills: {}",
            s.installed_skills.join(", ")
        ));
    }
    p
}

/// The therapeutic reply via the response model, with a style and an
/// approach from the seed's lists; a plain supportive reply when the model
/// fails.
pub(super) struct TherapeuticReply;

#[async_trait]
impl Stage<SupportState, AgentContext> for TherapeuticReply {
    async fn run(&self, s: &SupportState, c: &AgentContext) -> Result<SupportDelta, StageError> {
        let schema = therapeutic_schema();
        let mut messages = vec![LlmMessage::system(therapeutic_prompt(s))];
        messages.extend(c.prompt_history(s));
        let request = CompletionRequest::new(messages)
            .with_prompt_name("therapeutic_reply")
            .with_json_schema("therapeutic_reply", schema.clone());
        let answer = match crate::turn::complete(c.response_llm(), &request).await {
            Ok(a) => parse_structured::<TherapeuticAnswer>(&a.content, &schema)
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        let (reply, style, approach, source) = match answer {
            Ok(a) => (a.reply, a.response_style, a.therapeutic_approach, "model"),
            Err(e) => {
                tracing::warn!(error = %e, "response model failed; a plain supportive reply");
                (
                    "I'm here with you. Would you like to tell me more about what's on your mind?"
                        .to_owned(),
                    "supportive".to_owned(),
                    "none".to_owned(),
                    "fallback",
                )
            }
        };
        Ok(SupportDelta {
            response_text: Some(reply),
            response_style: Some(Some(style)),
            therapeutic_approach: Some(Some(approach)),
            diagnostics: diag(&[("reply_source", json!(source))]),
            ..SupportDelta::default()
        })
    }
}

/// The gate was unsure: ask about safety, without the model.
pub(super) struct SafetyCheck;

#[async_trait]
impl Stage<SupportState, AgentContext> for SafetyCheck {
    async fn run(&self, s: &SupportState, _c: &AgentContext) -> Result<SupportDelta, StageError> {
        Ok(SupportDelta {
            // The answer to a safety question must not confirm a deletion.
            pending_action: s.pending_action.is_some().then_some(None),
            response_text: Some(crisis::SAFETY_CHECK.to_owned()),
            response_style: Some(text("safety_check")),
            therapeutic_approach: Some(text("pfa")),
            ..SupportDelta::default()
        })
    }
}

/// The 5-4-3-2-1 grounding exercise, one step per turn, approach pinned.
pub(super) struct GuidedExercise;

#[async_trait]
impl Stage<SupportState, AgentContext> for GuidedExercise {
    async fn run(&self, s: &SupportState, _c: &AgentContext) -> Result<SupportDelta, StageError> {
        let current = s.exercise_type.as_ref().and(s.exercise_step);
        let t = exercise::grounding_turn(current, &s.message);
        let pinned = s
            .exercise_therapeutic_approach
            .clone()
            .filter(|_| current.is_some())
            .unwrap_or_else(|| GROUNDING_APPROACH.to_owned());
        let active = t.step.is_some();
        Ok(SupportDelta {
            exercise_type: Some(active.then(|| GROUNDING.to_owned())),
            exercise_step: Some(t.step),
            exercise_therapeutic_approach: Some(active.then(|| pinned.clone())),
            response_text: Some(t.reply),
            response_style: Some(text("guided_exercise")),
            therapeutic_approach: Some(Some(pinned)),
            should_persist_memory: Some(t.cause == "complete"),
            diagnostics: diag(&[(
                "exercise_transition",
                json!(format!("{} -> {} ({})", t.from, t.to, t.cause)),
            )]),
            ..SupportDelta::default()
        })
    }
}

/// The answers a deletion question accepts, as its payload lists them.
const YES: [&str; 7] = ["yes", "yeah", "yep", "confirm", "sure", "ok", "okay"];
const NO: [&str; 4] = ["no", "nope", "cancel", "keep"];

/// What a person's answer to a deletion question says: `true` or an
/// explicit yes confirms; `false`, an explicit no or anything unclear
/// cancels.
fn confirmation(value: &Value) -> Confirmation {
    match value {
        Value::Bool(true) => Confirmation::Confirm,
        Value::String(s) if parse_confirmation(s) == Confirmation::Confirm => Confirmation::Confirm,
        _ => Confirmation::Cancel,
    }
}

/// Memory commands: recall lists; forgetting stops the turn to ask
/// ([`StageError::Interrupt`], with the question, what would be deleted and
/// the accepted answers), and the turn resumed with the answer deletes
/// (yes) or keeps everything (no, or anything unclear), by rule.
pub(super) struct MemoryControl;

impl MemoryControl {
    /// The reply, and the entries it deletes: named in the turn's
    /// `memory_control.forget`, they are deleted by the turn's commit (the
    /// thread store's [`FORGET_MEMORY_DELTA`](parlance_ports::FORGET_MEMORY_DELTA)),
    /// so a resume that loses its commit deletes nothing.
    fn answered(reply: triage::MemoryReply) -> SupportDelta {
        let deleted = reply.delete.len();
        SupportDelta {
            response_text: Some(reply.text),
            response_style: Some(text("memory_control")),
            forget: (!reply.delete.is_empty()).then_some(reply.delete),
            diagnostics: diag(&[("memories_deleted", json!(deleted))]),
            ..SupportDelta::default()
        }
    }
}

#[async_trait]
impl Stage<SupportState, AgentContext> for MemoryControl {
    async fn run(&self, s: &SupportState, c: &AgentContext) -> Result<SupportDelta, StageError> {
        let action = s.memory_action.clone().unwrap_or(Value::Null);
        let command: MemoryCommand =
            serde_json::from_value(action).map_err(|source| StageError::Decode {
                field: "memory_control.action",
                source,
            })?;
        let records = c
            .memory_store
            .list(&c.product_id, &c.owner, None)
            .await
            .map_err(StageError::port(Dependency::MemoryStore))?;
        let reply = triage::command_reply(&command, &records);
        if let Some(pending) = &reply.pending {
            let summary: Vec<String> = records
                .iter()
                .filter(|r| pending.ids.contains(&r.id))
                .map(|r| r.entry.search_text())
                .collect();
            return Err(StageError::Interrupt {
                payload: json!({
                    "question": reply.text,
                    "kind": pending.kind,
                    "topic": pending.topic,
                    "ids": pending.ids,
                    "summary": summary,
                    "accepted": {"yes": YES, "no": NO, "boolean": true},
                }),
            });
        }
        Ok(Self::answered(reply))
    }

    /// The answer to the deletion question: deletes exactly what the
    /// question listed on a yes, nothing otherwise.
    async fn resume(
        &self,
        _s: &SupportState,
        _c: &AgentContext,
        asked: &Value,
        value: &Value,
    ) -> Result<SupportDelta, StageError> {
        let pending = PendingAction::from_value(asked).ok_or(StageError::State {
            field: "memory_control.action",
            problem: "a deletion question without the action it asks about",
        })?;
        let reply = triage::confirmation_reply(&pending, confirmation(value));
        Ok(Self::answered(reply))
    }
}

/// A factual question answered only from the operator's knowledge base.
pub(super) struct GroundedLookup;

#[async_trait]
impl Stage<SupportState, AgentContext> for GroundedLookup {
    async fn run(&self, s: &SupportState, c: &AgentContext) -> Result<SupportDelta, StageError> {
        let query = s.grounded_query.as_deref().unwrap_or(&s.message);
        let hit = c.data.knowledge.lookup(query);
        let (reply, status) = grounded_reply(hit);
        Ok(SupportDelta {
            response_text: Some(reply),
            response_style: Some(text("grounded_lookup")),
            grounded_status: Some(text(status)),
            diagnostics: diag(&[
                ("grounded_lookup_status", json!(status)),
                ("knowledge_entry", json!(hit.map(|e| e.id.clone()))),
            ]),
            ..SupportDelta::default()
        })
    }
}

/// The assistant turn appended to the transcript (and so to the history
/// window), stamped with the reply's style.
pub(super) struct FinalizeTurn;

#[async_trait]
impl Stage<SupportState, AgentContext> for FinalizeTurn {
    async fn run(&self, s: &SupportState, _c: &AgentContext) -> Result<SupportDelta, StageError> {
        let route = match s.route {
            Some(Route::Crisis) => "crisis",
            Some(Route::Therapeutic) => "therapeutic",
            Some(Route::MemoryControl) => "memory_control",
            Some(Route::GroundedLookup) => "grounded_lookup",
            None => "none",
        };
        Ok(SupportDelta {
            transcript: vec![Message {
                role: Role::Assistant,
                content: s.response_text.clone(),
                response_style: s.response_style.clone(),
            }],
            diagnostics: diag(&[("route", json!(route))]),
            ..SupportDelta::default()
        })
    }
}

#[derive(Debug, Deserialize)]
struct Extracted {
    facts: Vec<SemanticEntry>,
}

fn extraction_schema() -> Value {
    let s = json!({"type": "string", "minLength": 1, "maxLength": 200});
    json!({
        "type": "object",
        "properties": {
            "facts": {
                "type": "array",
                "maxItems": 5,
                "items": {
                    "type": "object",
                    "properties": {
                        "category": s, "subject": s, "predicate": s, "object": s,
                        "evidence_quote": s
                    },
                    "required": ["category", "subject", "predicate", "object", "evidence_quote"],
                    "additionalProperties": false
                }
            }
        },
        "required": ["facts"],
        "additionalProperties": false
    })
}

const EXTRACTION_PROMPT: &str = "Extract lasting facts about the user from their latest message \
(worries, relationships, goals, preferences, health). Answer only JSON: {\"facts\": [{category, \
subject (usually User), predicate (UPPER_SNAKE, e.g. WORRIES_ABOUT), object, evidence_quote (the \
user's exact words)}]}. No facts: an empty list.";

/// Semantic facts from the user's message into the memory store: each with
/// an evidence quote that must be the user's own words (others are dropped),
/// none stored twice. Skipped on the crisis and memory-control routes and
/// for safety checks.
pub(super) struct MemoryExtraction;

#[async_trait]
impl Stage<SupportState, AgentContext> for MemoryExtraction {
    async fn run(&self, s: &SupportState, c: &AgentContext) -> Result<SupportDelta, StageError> {
        let skip = match s.route {
            Some(Route::Crisis) => Some("skipped_crisis"),
            Some(Route::MemoryControl) => Some("skipped_memory_control"),
            _ if s.crisis.needs_clarification => Some("skipped_safety_check"),
            _ => None,
        };
        if let Some(why) = skip {
            return Ok(SupportDelta {
                diagnostics: diag(&[("memory_extraction", json!(why))]),
                ..SupportDelta::default()
            });
        }
        let schema = extraction_schema();
        let request = CompletionRequest::new(vec![
            LlmMessage::system(EXTRACTION_PROMPT),
            LlmMessage::user(s.message.clone()),
        ])
        .with_prompt_name("memory_extraction")
        .with_temperature(0.0)
        .with_json_schema("memory_facts", schema.clone());
        let facts = match c.llm.complete(&request).await {
            Ok(a) => match parse_structured::<Extracted>(&a.content, &schema) {
                Ok(x) => x.facts,
                Err(e) => {
                    tracing::warn!(error = %e, "memory extraction answered malformed JSON");
                    return Ok(SupportDelta {
                        diagnostics: diag(&[("memory_extraction", json!("malformed"))]),
                        ..SupportDelta::default()
                    });
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, "memory extraction failed");
                return Ok(SupportDelta {
                    diagnostics: diag(&[("memory_extraction", json!("llm_failed"))]),
                    ..SupportDelta::default()
                });
            }
        };
        let store_err = StageError::port(Dependency::MemoryStore);
        let existing = c
            .memory_store
            .list(&c.product_id, &c.owner, Some(MemoryKind::Semantic))
            .await
            .map_err(store_err)?;
        let lower = s.message.to_lowercase();
        let same = |a: &SemanticEntry, b: &SemanticEntry| {
            a.subject.eq_ignore_ascii_case(&b.subject)
                && a.predicate.eq_ignore_ascii_case(&b.predicate)
                && a.object.eq_ignore_ascii_case(&b.object)
        };
        let mut added = 0usize;
        let mut dropped = 0usize;
        let mut kept: Vec<SemanticEntry> = Vec::new();
        for f in facts {
            let quoted = f
                .evidence_quote
                .as_deref()
                .is_some_and(|q| !q.trim().is_empty() && lower.contains(&q.trim().to_lowercase()));
            if !quoted {
                dropped += 1;
                continue;
            }
            let dup = existing.iter().any(|r| match &r.entry {
                MemoryEntry::Semantic(e) => same(e, &f),
                MemoryEntry::Episodic(_) => false,
            }) || kept.iter().any(|k| same(k, &f));
            if !dup {
                kept.push(f);
            }
        }
        let concerns: Vec<String> = kept
            .iter()
            .filter(|f| f.predicate.to_uppercase().contains("WORRIES"))
            .map(|f| f.object.clone())
            .collect();
        for f in kept {
            let entry = MemoryEntry::Semantic(f);
            let embedding = embed(c, &entry.search_text()).await;
            let record = MemoryRecord {
                id: MemoryId::from_uuid(c.ids.new_uuid()),
                owner: c.owner.clone(),
                entry,
                embedding,
                at: c.clock.now(),
            };
            c.memory_store
                .add(&c.product_id, &record)
                .await
                .map_err(store_err)?;
            added += 1;
        }
        if !concerns.is_empty() {
            note_concerns(c, &s.session_memory, concerns)
                .await
                .map_err(store_err)?;
        }
        Ok(SupportDelta {
            diagnostics: diag(&[
                ("memory_extraction", json!("ran")),
                ("memory_facts_added", json!(added)),
                ("memory_facts_dropped", json!(dropped)),
            ]),
            ..SupportDelta::default()
        })
    }
}

/// Adds `concerns` to the thread's session memory in the store (loaded into
/// `session_memory` on the next turn).
async fn note_concerns(
    c: &AgentContext,
    current: &SessionMemory,
    concerns: Vec<String>,
) -> Result<(), PortError> {
    let mut all = current.active_concerns.clone().unwrap_or_default();
    for concern in concerns {
        if !all.iter().any(|a| a.eq_ignore_ascii_case(&concern)) {
            all.push(concern);
        }
    }
    let mut memory = c
        .memory_store
        .session_memory(&c.product_id, &c.owner, &c.thread)
        .await?
        .and_then(|v| v.as_object().cloned())
        .unwrap_or_default();
    memory.insert("active_concerns".to_owned(), json!(all));
    c.memory_store
        .put_session_memory(&c.product_id, &c.owner, &c.thread, &Value::Object(memory))
        .await
}

/// The embedding of `text`, or `None` without a provider or when it fails
/// (token recall still finds the entry).
pub(super) async fn embed(c: &AgentContext, text: &str) -> Option<Vec<f32>> {
    let e = c.embedder.as_ref()?;
    match e.embed(&[text.to_owned()]).await {
        Ok(out) => out.vectors.into_iter().next(),
        Err(err) => {
            tracing::warn!(error = %err, "embedding failed; stored without a vector");
            None
        }
    }
}
