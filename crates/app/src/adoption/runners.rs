//! The LLM runners of the adoption state: the adoption judge, tour matching,
//! the onboarding welcome, the onboarding follow-up and the session summary.
//!
//! Each runner is: build the prompt (pure core) -> call the model on the LLM
//! port, asking for the prompt's JSON schema -> parse the answer (pure,
//! never fails) -> send the answer's [`AdoptionCommand`] through the
//! executor, which decides it on the record as it then is and commits it
//! with the audit entries of its journey changes. A model failure is a
//! [`RunError::Model`] and an unusable answer is reported by its
//! [`ParseStatus`]; in both cases nothing is saved.

use parlance_core::adoption::prompts::{
    FollowupOutput, JudgeOutput, PromptError, WelcomeOutput, parse_followup_output,
    parse_judge_output, parse_welcome_output,
};
use parlance_core::adoption::{
    Activity, AdoptionCommand, AdoptionEffect, AdoptionError, AdoptionKey,
    CompletionRateDenominator, ExplorationGateConfig, GateDecision, OnboardingPlan, ParseStatus,
    PromptScope, RenderedPrompt, SessionIndexEntry, SessionSnapshot, SummaryOutput, TourEvent,
    TourMatchResult, UserAdoptionState, UserId, build_followup_prompt, build_judge_prompt,
    build_summary_prompt, build_tour_match_input, build_tour_match_prompt, build_welcome_prompt,
    one_line, parse_summary_output, parse_tour_match_output, with_tour_outcome,
};
use parlance_core::machine::Name;
use parlance_core::{ErrorClass, MachineError, ProductId, StructuredError, Timestamp, Transition};
use parlance_ports::{CompletionRequest, LlmError, Message, PortError, ResponseFormat, Stored};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use super::Adoptions;
use super::service;
use crate::execute::ServiceError;

/// Longest accepted tour-match query, in characters.
pub const MAX_QUERY_CHARS: usize = 2000;

/// Conversation turns given to tour matching at most (the newest).
pub const MAX_HISTORY_TURNS: usize = 20;

/// How the model was asked and how its answer read.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[schema(as = AdoptionLlmCall)]
pub struct LlmCall {
    /// The prompt's registry name.
    pub prompt: &'static str,
    /// Its version.
    pub version: &'static str,
    /// The model that answered, as it names itself.
    pub model: String,
    /// How the answer parsed (`parsed` is the only usable status).
    pub parse_status: ParseStatus,
    /// Where a JSON answer broke the prompt's schema (the parser still kept
    /// what it could use); empty when it matched.
    pub schema_violations: Vec<String>,
}

/// The gate's decision, as the gate route shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[schema(as = AdoptionGate)]
pub struct GateView {
    /// True when the model may be asked.
    pub passed: bool,
    /// The stable reason code.
    #[schema(value_type = super::schema::GateCode)]
    pub code: &'static str,
    /// The reference's reason string.
    pub reason: String,
}

impl From<&GateDecision> for GateView {
    fn from(d: &GateDecision) -> Self {
        Self {
            passed: d.passed,
            code: d.reason.code(),
            reason: d.reason.to_string(),
        }
    }
}

/// What one runner did.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RunReport<A> {
    /// The gate (the welcome only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gate: Option<GateView>,
    /// The model call; `None` when the model was not asked.
    pub llm: Option<LlmCall>,
    /// The parsed answer (the runner's output: `JudgeOutput`,
    /// `WelcomeOutput`, `FollowupOutput` or `SummaryAnswer`); null when the
    /// model was not asked.
    // utoipa drops the nullability of an `Option` of a generic parameter,
    // so the document names the answer's type in the description instead.
    #[schema(value_type = Option<Object>)]
    pub answer: Option<A>,
    /// True when the answer changed the state and it was saved.
    pub applied: bool,
    /// Journey changes made by the answer.
    pub transitions: Vec<JourneyChange>,
    /// What to deliver to the user.
    pub effects: Vec<AdoptionEffect>,
    /// The record after the run (unchanged unless `applied`).
    #[serde(skip)]
    pub stored: Stored<UserAdoptionState>,
}

/// A journey change an answer made, as a report shows it (the audit log
/// holds the same change).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct JourneyChange {
    /// The journey before.
    #[schema(value_type = Option<parlance_core::adoption::JourneyState>)]
    pub from: Option<Name>,
    /// The journey after.
    #[schema(value_type = parlance_core::adoption::JourneyState)]
    pub to: Name,
    /// The answer's command.
    #[schema(value_type = String, example = "judge_adoption")]
    pub cause: Name,
}

impl From<&Transition> for JourneyChange {
    fn from(t: &Transition) -> Self {
        Self {
            from: t.from.clone(),
            to: t.to.clone(),
            cause: t.cause.clone(),
        }
    }
}

/// Why a runner did not finish; nothing was changed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The record could not be read or changed: no record, the machine
    /// refused the answer's command, every commit lost its race, or a port
    /// failed.
    #[error(transparent)]
    Service(#[from] ServiceError<UserAdoptionState>),
    /// The model call failed.
    #[error("the language model failed on prompt {prompt}")]
    Model {
        /// The prompt's registry name.
        prompt: &'static str,
        /// The model's error.
        #[source]
        error: LlmError,
    },
    /// One of the registry's own prompts did not render (a bug).
    #[error("a registry prompt does not render")]
    Prompt(#[source] PromptError),
}

impl From<PortError> for RunError {
    fn from(e: PortError) -> Self {
        RunError::Service(e.into())
    }
}

/// The machine's refusal of a request, on the record it was checked
/// against.
fn refused(error: AdoptionError, stored: &Stored<UserAdoptionState>) -> RunError {
    ServiceError::refused(error, Some(stored.clone())).into()
}

impl<A> RunReport<A> {
    fn unchanged(
        stored: Stored<UserAdoptionState>,
        llm: Option<LlmCall>,
        answer: Option<A>,
    ) -> Self {
        Self {
            gate: None,
            llm,
            answer,
            applied: false,
            transitions: Vec::new(),
            effects: Vec::new(),
            stored,
        }
    }
}

/// The model's answer, normalised for the core parsers.
struct Answer {
    text: String,
    call: LlmCall,
}

/// The schema as sent to servers: without `$schema` (not every server
/// accepts the keyword).
fn wire_schema(schema: &Value) -> Value {
    let mut s = schema.clone();
    if let Some(m) = s.as_object_mut() {
        m.remove("$schema");
    }
    s
}

/// Finds the JSON in a raw answer: the first value valid against the schema
/// (bare, fenced or inside prose), else the first object found (with the
/// schema violations), else the raw text for the parser to classify.
fn normalise(raw: &str, schema: &Value) -> (String, Vec<String>) {
    match parlance_core::extract_valid(raw, schema) {
        Ok(v) => (v.to_string(), Vec::new()),
        Err(StructuredError::Schema { violations }) => {
            let text = parlance_core::find_json_values(raw)
                .into_iter()
                .find(Value::is_object)
                .map_or_else(|| raw.to_owned(), |v| v.to_string());
            (text, violations.iter().map(ToString::to_string).collect())
        }
        Err(_) => (raw.to_owned(), Vec::new()),
    }
}

/// Calls the model with `prompt` (as one user message; JSON prompts ask for
/// their schema, not strictly, since strict mode restricts the schema
/// language) and normalises the answer. The parse status is filled in by
/// the caller.
async fn ask(app: &Adoptions, prompt: &RenderedPrompt) -> Result<Answer, RunError> {
    let mut request = CompletionRequest::new(vec![Message::user(prompt.text.clone())])
        .with_prompt_name(prompt.name);
    if let Some(schema) = &prompt.schema {
        request = request.with_response_format(ResponseFormat::JsonSchema {
            name: prompt.name.to_owned(),
            schema: wire_schema(schema),
            strict: false,
        });
    }
    let response = app
        .shared
        .llm
        .complete(&request)
        .await
        .map_err(|error| RunError::Model {
            prompt: prompt.name,
            error,
        })?;
    tracing::debug!(
        prompt = prompt.name,
        version = prompt.version,
        model = %response.model,
        usage = ?response.usage,
        "language model answered"
    );
    let (text, schema_violations) = match &prompt.schema {
        Some(schema) => normalise(&response.content, schema),
        None => (response.content.clone(), Vec::new()),
    };
    Ok(Answer {
        text,
        call: LlmCall {
            prompt: prompt.name,
            version: prompt.version,
            model: response.model,
            parse_status: ParseStatus::Parsed,
            schema_violations,
        },
    })
}

/// Sends a usable answer's command: it is decided on the record as it is
/// when committed (again after a lost race), and commits with the audit
/// entries of its journey changes. A welcome the gate no longer allows on
/// that record is not an error: the report says nothing was applied.
async fn save_answer<A>(
    app: &Adoptions,
    key: &AdoptionKey,
    plan: &OnboardingPlan,
    call: LlmCall,
    answer: A,
    command: AdoptionCommand,
) -> Result<RunReport<A>, RunError> {
    match service::run(app, key, plan, &command).await {
        Ok(done) => Ok(RunReport {
            gate: None,
            llm: Some(call),
            answer: Some(answer),
            applied: done.committed,
            transitions: done
                .decision
                .transitions
                .iter()
                .map(JourneyChange::from)
                .collect(),
            effects: done.decision.effects,
            stored: Stored {
                state: done.state,
                version: done.version,
            },
        }),
        Err(ServiceError::Refused {
            error,
            current: Some(current),
        }) if error.class() == ErrorClass::NotAllowed => {
            Ok(RunReport::unchanged(*current, Some(call), Some(answer)))
        }
        Err(e) => Err(e.into()),
    }
}

/// `POST .../adoption/judge`: what the judge is shown besides the state.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JudgeRequest {
    /// Recent actions, oldest first.
    #[serde(default)]
    pub activity: Vec<Activity>,
    /// Anything else the caller measured (shown under `reported`).
    #[serde(default)]
    pub signals: Map<String, Value>,
}

/// Runs the adoption judge and applies journey and mastery.
pub async fn judge_adoption(
    app: &Adoptions,
    key: &AdoptionKey,
    req: &JudgeRequest,
) -> Result<RunReport<JudgeOutput>, RunError> {
    let stored = service::get(app, key).await?;
    let prompt =
        build_judge_prompt(&stored.state, &req.activity, &req.signals).map_err(RunError::Prompt)?;
    let Answer { text, mut call } = ask(app, &prompt).await?;
    let out = parse_judge_output(Some(&text));
    call.parse_status = out.status;
    if out.status != ParseStatus::Parsed {
        return Ok(RunReport::unchanged(stored, Some(call), Some(out)));
    }
    let command = AdoptionCommand::JudgeAdoption {
        answer: out.clone(),
    };
    // The judge reads no plan.
    let plan = OnboardingPlan::default();
    save_answer(app, key, &plan, call, out, command).await
}

/// `POST .../adoption/welcome`: the gate's inputs and the recent activity.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WelcomeRequest {
    /// Seconds the user has spent on the app (finite, not negative).
    pub seconds_on_app: f64,
    /// Defaults to the larger of the recorded figure and the number of
    /// discovered features.
    #[serde(default)]
    pub distinct_features_seen: Option<u64>,
    /// Gate thresholds; the reference defaults when absent.
    #[serde(default)]
    pub config: Option<ExplorationGateConfig>,
    /// Recent actions, oldest first.
    #[serde(default)]
    pub recent_activity: Vec<Activity>,
}

/// Runs the explore-first gate and, only when it passes, the onboarding
/// welcome: workflow progress, the step-in assessment and, when a message
/// is sent, `mark_welcomed`. The gate is checked again on the state being
/// saved, so two concurrent welcomes cannot both be sent.
pub async fn onboarding_welcome(
    app: &Adoptions,
    key: &AdoptionKey,
    req: &WelcomeRequest,
) -> Result<RunReport<WelcomeOutput>, RunError> {
    let stored = service::get(app, key).await?;
    let cfg = req.config.clone().unwrap_or_default();
    let now = app.shared.clock.now();
    let (gate, distinct) = stored
        .state
        .welcome_gate(req.seconds_on_app, req.distinct_features_seen, &cfg, now)
        .map_err(|e| refused(e, &stored))?;
    if !gate.passed {
        let mut report = RunReport::unchanged(stored, None, None);
        report.gate = Some(GateView::from(&gate));
        return Ok(report);
    }
    let plan = service::effective_plan(app, &key.product_id, stored.state.role()).await?;
    let (prompt, scope) = build_welcome_prompt(
        &stored.state,
        &plan,
        req.seconds_on_app,
        distinct,
        &req.recent_activity,
    )
    .map_err(RunError::Prompt)?;
    let Answer { text, mut call } = ask(app, &prompt).await?;
    let out = parse_welcome_output(Some(&text), &scope.plan_refs(), &scope.eligible_refs());
    call.parse_status = out.status;
    if out.status != ParseStatus::Parsed {
        let mut report = RunReport::unchanged(stored, Some(call), Some(out));
        report.gate = Some(GateView::from(&gate));
        return Ok(report);
    }
    let command = AdoptionCommand::OnboardingWelcome {
        seconds_on_app: req.seconds_on_app,
        distinct_features_seen: req.distinct_features_seen,
        config: cfg,
        answer: out.clone(),
    };
    let mut report = save_answer(app, key, &plan, call, out, command).await?;
    report.gate = Some(GateView::from(&gate));
    Ok(report)
}

/// `POST .../adoption/followup`: how a tour ended.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FollowupRequest {
    /// The tour's workflow (one of the user's plan).
    pub workflow_id: String,
    /// `completed` or `abandoned`.
    pub event: TourEvent,
    /// Where an abandoned tour stopped.
    #[serde(default)]
    pub abandoned_at_step: Option<String>,
    /// Recent actions, oldest first.
    #[serde(default)]
    pub recent_activity: Vec<Activity>,
}

/// Runs the onboarding follow-up after a tour: the tour's outcome is
/// recorded together with a usable answer (and onboarding stamped complete
/// when nothing is outstanding and the model agrees).
pub async fn onboarding_followup(
    app: &Adoptions,
    key: &AdoptionKey,
    req: &FollowupRequest,
) -> Result<RunReport<FollowupOutput>, RunError> {
    let stored = service::get(app, key).await?;
    let plan = service::effective_plan(app, &key.product_id, stored.state.role()).await?;
    let Some(workflow) = plan.get(&req.workflow_id).cloned() else {
        let error = AdoptionError::NotInPlan {
            workflow_id: req.workflow_id.clone(),
        };
        return Err(refused(error, &stored));
    };
    let step = req.abandoned_at_step.as_deref();
    let projected = with_tour_outcome(
        &stored.state,
        &req.workflow_id,
        req.event,
        step,
        app.shared.clock.now(),
    );
    let (prompt, scope): (RenderedPrompt, PromptScope) = build_followup_prompt(
        &projected,
        &plan,
        &workflow,
        req.event,
        step,
        &req.recent_activity,
    )
    .map_err(RunError::Prompt)?;
    let Answer { text, mut call } = ask(app, &prompt).await?;
    let out = parse_followup_output(
        Some(&text),
        &scope.outstanding_refs(),
        &scope.eligible_refs(),
    );
    call.parse_status = out.status;
    if out.status != ParseStatus::Parsed {
        return Ok(RunReport::unchanged(stored, Some(call), Some(out)));
    }
    let command = AdoptionCommand::OnboardingFollowup {
        workflow_id: req.workflow_id.clone(),
        event: req.event,
        abandoned_at_step: req.abandoned_at_step.clone(),
        answer: out.clone(),
    };
    save_answer(app, key, &plan, call, out, command).await
}

/// `POST .../adoption/session-summary`: the session being summarised.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SummaryRequest {
    /// The session's id.
    pub session_id: String,
    /// Its number; defaults to the indexed number, else the next one.
    #[serde(default)]
    pub session_number: Option<u64>,
    /// When it started, epoch seconds (not after now).
    pub started_at: f64,
}

/// The summary runner's answer: the text and the session snapshot it was
/// written from.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SummaryAnswer {
    /// The parsed text.
    #[serde(flatten)]
    pub output: SummaryOutput,
    /// The session snapshot (`_v: 1`) the prompt was rendered from.
    #[schema(value_type = super::schema::SessionSummarySnapshot)]
    pub snapshot: Value,
}

/// Captures a session snapshot, asks for a handover summary and stores it
/// (recording the session in the index when it is not there yet).
pub async fn session_summary(
    app: &Adoptions,
    key: &AdoptionKey,
    req: &SummaryRequest,
    started_at: Timestamp,
) -> Result<RunReport<SummaryAnswer>, RunError> {
    let stored = service::get(app, key).await?;
    let session_id = req.session_id.trim().to_owned();
    if session_id.is_empty() {
        let error = AdoptionError::Blank {
            field: "session_id",
        };
        return Err(refused(error, &stored));
    }
    let now = app.shared.clock.now();
    if started_at > now {
        let error = AdoptionError::InTheFuture {
            field: "started_at",
        };
        return Err(refused(error, &stored));
    }
    let plan = service::effective_plan(app, &key.product_id, stored.state.role()).await?;
    let number = req.session_number.unwrap_or_else(|| {
        stored
            .state
            .sessions_index
            .iter()
            .find(|e| e.session_id == session_id)
            .map_or(stored.state.sessions_count.saturating_add(1), |e| {
                e.session_number
            })
    });
    let snapshot = SessionSnapshot::from_adoption_state(
        &stored.state,
        &session_id,
        number,
        started_at,
        &plan.workflow_ids(),
        CompletionRateDenominator::AllCatalogWorkflows,
        now,
    );
    let prompt = build_summary_prompt(&snapshot.summary_input()).map_err(RunError::Prompt)?;
    let Answer { text, mut call } = ask(app, &prompt).await?;
    let output = parse_summary_output(Some(&text));
    call.parse_status = output.status;
    let answer = SummaryAnswer {
        output: output.clone(),
        snapshot: snapshot.to_snapshot(),
    };
    if output.status != ParseStatus::Parsed {
        return Ok(RunReport::unchanged(stored, Some(call), Some(answer)));
    }
    let command = AdoptionCommand::SessionSummary {
        session: SessionIndexEntry {
            session_id,
            session_number: number,
            started_at,
            captured_at: now,
        },
        answer: output,
    };
    save_answer(app, key, &plan, call, answer, command).await
}

/// `POST .../tours/match`: a user's question.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TourMatchRequest {
    /// The question (not blank, at most [`MAX_QUERY_CHARS`] characters).
    pub query: String,
    /// The role; read from the user's record when absent and `user_id` is
    /// given.
    #[serde(default)]
    pub role: Option<String>,
    /// The user asking (for the role).
    #[serde(default)]
    pub user_id: Option<String>,
    /// The page the user is on.
    #[serde(default)]
    pub current_page: Option<String>,
    /// Recent conversation turns, oldest first (the newest
    /// [`MAX_HISTORY_TURNS`] are used).
    #[serde(default)]
    pub history: Vec<String>,
}

/// A tour-match question as read from a [`TourMatchRequest`]: the query
/// trimmed, the user's id parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct TourQuery {
    /// The question (trimmed, not blank, at most [`MAX_QUERY_CHARS`]).
    pub text: String,
    /// The user asking, whose record gives the role when none is given.
    pub user: Option<UserId>,
}

/// Tour matching's answer, with what the prompt allowed.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TourMatchReport {
    /// The model call; `None` when no tour is visible to the role: the
    /// model is not asked and the result is empty (status `parsed`).
    pub llm: Option<LlmCall>,
    /// The validated answer.
    #[serde(flatten)]
    pub result: TourMatchResult,
    /// The role the catalog was filtered for.
    pub role: Option<String>,
    /// The tours the answer could name.
    pub allowed_tour_ids: Vec<String>,
}

/// Picks the tours for a question from the role-filtered catalog. Nothing
/// is saved.
pub async fn match_tour(
    app: &Adoptions,
    product: &ProductId,
    query: &TourQuery,
    req: &TourMatchRequest,
) -> Result<TourMatchReport, RunError> {
    let role = match (&req.role, &query.user) {
        (Some(r), _) => Some(r.clone()),
        (None, Some(user)) => {
            let key = AdoptionKey::new(product.clone(), user.clone());
            service::get(app, &key)
                .await?
                .state
                .role()
                .map(str::to_owned)
        }
        (None, None) => None,
    }
    .filter(|r| !r.trim().is_empty());
    let catalog = service::effective_catalog(app, product, role.as_deref()).await?;
    let skip = req.history.len().saturating_sub(MAX_HISTORY_TURNS);
    let history: Vec<String> = req.history.iter().skip(skip).map(|h| one_line(h)).collect();
    let input = build_tour_match_input(
        &query.text,
        &history.join("\n"),
        role.as_deref(),
        req.current_page.as_deref(),
        &catalog,
    );
    if input.allowed_tour_ids.is_empty() {
        return Ok(TourMatchReport {
            llm: None,
            result: TourMatchResult {
                status: ParseStatus::Parsed,
                primary_tour_id: None,
                related_tour_ids: Vec::new(),
                reasoning: String::new(),
                dropped_ids: Vec::new(),
            },
            role,
            allowed_tour_ids: Vec::new(),
        });
    }
    let prompt = build_tour_match_prompt(&input).map_err(RunError::Prompt)?;
    let Answer { text, mut call } = ask(app, &prompt).await?;
    let result = parse_tour_match_output(Some(&text), &catalog, role.as_deref());
    call.parse_status = result.status;
    Ok(TourMatchReport {
        llm: Some(call),
        result,
        role,
        allowed_tour_ids: input.allowed_tour_ids,
    })
}
