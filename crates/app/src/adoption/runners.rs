//! The LLM runners of the adoption state: the adoption judge, tour matching,
//! the onboarding welcome, the onboarding follow-up and the session summary.
//!
//! Each runner is: build the prompt (pure core) -> call the model on the LLM
//! port, asking for the prompt's JSON schema -> parse the answer (pure,
//! never fails) -> apply it (pure) -> save by compare-and-swap, re-applying
//! on a lost race, with journey changes written to the audit log. A model
//! failure is an error (503 or 502) and an unusable answer is reported by
//! its [`ParseStatus`]; in both cases nothing is saved.

use axum::http::StatusCode;
use parlance_core::adoption::prompts::{
    FollowupOutput, JudgeOutput, WelcomeOutput, parse_followup_output, parse_judge_output,
    parse_welcome_output,
};
use parlance_core::adoption::{
    Activity, AdoptionEffect, AdoptionOutcome, CompletionRateDenominator, ExplorationGateConfig,
    GateDecision, JourneyState, ParseStatus, PromptScope, RenderedPrompt, SessionIndexEntry,
    SessionSnapshot, SummaryOutput, TourEvent, TourMatchResult, UserAdoptionState, UserId,
    apply_followup_output, apply_judge_output, apply_summary_output, apply_welcome_output,
    build_followup_prompt, build_judge_prompt, build_summary_prompt, build_tour_match_input,
    build_tour_match_prompt, build_welcome_prompt, evaluate_hard_gate, one_line,
    parse_summary_output, parse_tour_match_output, record_gate, record_tour_outcome,
};
use parlance_core::{ProductId, StructuredError, Timestamp, Transition};
use parlance_ports::{CompletionRequest, LlmError, Message, ResponseFormat, StoredAdoption};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::service::{self, Missing, Step};
use crate::http::ApiError;
use crate::state::AppState;

/// Longest accepted tour-match query, in characters.
pub const MAX_QUERY_CHARS: usize = 2000;

/// Conversation turns given to tour matching at most (the newest).
pub const MAX_HISTORY_TURNS: usize = 20;

/// How the model was asked and how its answer read.
#[derive(Debug, Clone, PartialEq, Serialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GateView {
    /// True when the model may be asked.
    pub passed: bool,
    /// The stable reason code.
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
#[derive(Debug, Clone, Serialize)]
pub struct RunReport<A> {
    /// The gate (the welcome only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gate: Option<GateView>,
    /// The model call; `None` when the model was not asked.
    pub llm: Option<LlmCall>,
    /// The parsed answer; `None` when the model was not asked.
    pub answer: Option<A>,
    /// True when the answer changed the state and it was saved.
    pub applied: bool,
    /// Journey changes made by the answer.
    pub transitions: Vec<Transition<JourneyState>>,
    /// What to deliver to the user.
    pub effects: Vec<AdoptionEffect>,
    /// The record after the run (unchanged unless `applied`).
    #[serde(skip)]
    pub stored: StoredAdoption,
}

impl<A> RunReport<A> {
    fn unchanged(stored: StoredAdoption, llm: Option<LlmCall>, answer: Option<A>) -> Self {
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

fn llm_failure(prompt: &str, e: &LlmError) -> ApiError {
    tracing::warn!(prompt, error = %e, "language model call failed; state unchanged");
    let code = match e {
        LlmError::RateLimited { .. } => "rate_limited",
        LlmError::Unavailable { .. } => "unavailable",
        LlmError::Timeout { .. } => "timeout",
        LlmError::Invalid { .. } => "invalid",
        _ => "other",
    };
    let err = if e.is_retryable() {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "llm-unavailable",
            "the language model is unavailable; nothing was changed, retry later",
        )
    } else {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            "llm-failed",
            "the language model refused the request; nothing was changed (see the server log)",
        )
    };
    err.with("llm_error", code)
        .with("prompt", prompt.to_owned())
}

fn prompt_failure(e: &parlance_core::adoption::prompts::PromptError) -> ApiError {
    // The registry's own prompts always render; this is a programming error.
    ApiError::internal(e)
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
async fn ask(app: &AppState, prompt: &RenderedPrompt) -> Result<Answer, ApiError> {
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
        .llm
        .complete(&request)
        .await
        .map_err(|e| llm_failure(prompt.name, &e))?;
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

/// Saves a usable answer: `apply` runs on the freshly loaded state inside
/// the compare-and-swap loop (it may run more than once); `None` from it
/// means "nothing to apply any more" and saves nothing.
async fn save_answer<A>(
    app: &AppState,
    product: &ProductId,
    user: &UserId,
    cause: &'static str,
    call: LlmCall,
    answer: A,
    mut apply: impl FnMut(&mut UserAdoptionState, Timestamp) -> Option<AdoptionOutcome>,
) -> Result<RunReport<A>, ApiError> {
    let (stored, outcome, saved) = service::update_as(
        app,
        product,
        user,
        Missing::NotFound,
        cause,
        |state, now| {
            Ok(match apply(state, now) {
                Some(o) => Step::Save(o),
                None => Step::Keep(AdoptionOutcome::none()),
            })
        },
    )
    .await?;
    Ok(RunReport {
        gate: None,
        llm: Some(call),
        answer: Some(answer),
        applied: saved,
        transitions: outcome.transitions,
        effects: outcome.effects,
        stored,
    })
}

/// `POST .../adoption/judge`: what the judge is shown besides the state.
#[derive(Debug, Clone, Default, Deserialize)]
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
    app: &AppState,
    product: &ProductId,
    user: &UserId,
    req: &JudgeRequest,
) -> Result<RunReport<JudgeOutput>, ApiError> {
    let stored = service::get(app, product, user).await?;
    let prompt = build_judge_prompt(&stored.state, &req.activity, &req.signals)
        .map_err(|e| prompt_failure(&e))?;
    let Answer { text, mut call } = ask(app, &prompt).await?;
    let out = parse_judge_output(Some(&text));
    call.parse_status = out.status;
    if out.status != ParseStatus::Parsed {
        return Ok(RunReport::unchanged(stored, Some(call), Some(out)));
    }
    let applied = out.clone();
    save_answer(
        app,
        product,
        user,
        "judge_adoption",
        call,
        out,
        |state, now| Some(apply_judge_output(state, &applied, now)),
    )
    .await
}

/// `POST .../adoption/welcome`: the gate's inputs and the recent activity.
#[derive(Debug, Clone, Deserialize)]
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

impl WelcomeRequest {
    /// Refuses unusable numbers (422 naming the field).
    pub fn validate(&self) -> Result<(), ApiError> {
        if !self.seconds_on_app.is_finite() || self.seconds_on_app < 0.0 {
            return Err(ApiError::unprocessable(
                "seconds_on_app must be a finite number, not negative",
            )
            .with("field", "seconds_on_app"));
        }
        if let Some(cfg) = &self.config {
            for (field, v) in [
                ("config.min_seconds_on_app", cfg.min_seconds_on_app),
                ("config.welcome_cooldown_s", cfg.welcome_cooldown_s),
            ] {
                if !v.is_finite() || v < 0.0 {
                    return Err(ApiError::unprocessable(format!(
                        "{field} must be a finite number, not negative"
                    ))
                    .with("field", field));
                }
            }
        }
        Ok(())
    }
}

fn distinct_seen(state: &UserAdoptionState, given: Option<u64>) -> u64 {
    given.unwrap_or_else(|| {
        state
            .onboarding
            .distinct_features_seen
            .max(state.discovered_features.len() as u64)
    })
}

/// Runs the explore-first gate and, only when it passes, the onboarding
/// welcome: workflow progress, the step-in assessment and, when a message
/// is sent, `mark_welcomed`. The gate is checked again on the state being
/// saved, so two concurrent welcomes cannot both be sent.
pub async fn onboarding_welcome(
    app: &AppState,
    product: &ProductId,
    user: &UserId,
    req: &WelcomeRequest,
) -> Result<RunReport<WelcomeOutput>, ApiError> {
    req.validate()?;
    let stored = service::get(app, product, user).await?;
    let cfg = req.config.clone().unwrap_or_default();
    let distinct = distinct_seen(&stored.state, req.distinct_features_seen);
    let now = app.clock.now();
    let gate = evaluate_hard_gate(&stored.state, now, req.seconds_on_app, distinct, &cfg);
    if !gate.passed {
        let mut report = RunReport::unchanged(stored, None, None);
        report.gate = Some(GateView::from(&gate));
        return Ok(report);
    }
    let plan = service::effective_plan(app, product, stored.state.role()).await?;
    let (prompt, scope) = build_welcome_prompt(
        &stored.state,
        &plan,
        req.seconds_on_app,
        distinct,
        &req.recent_activity,
    )
    .map_err(|e| prompt_failure(&e))?;
    let Answer { text, mut call } = ask(app, &prompt).await?;
    let out = parse_welcome_output(Some(&text), &scope.plan_refs(), &scope.eligible_refs());
    call.parse_status = out.status;
    if out.status != ParseStatus::Parsed {
        let mut report = RunReport::unchanged(stored, Some(call), Some(out));
        report.gate = Some(GateView::from(&gate));
        return Ok(report);
    }
    let applied = out.clone();
    let mut report = save_answer(
        app,
        product,
        user,
        "onboarding_welcome",
        call,
        out,
        |state, now| {
            let distinct = distinct_seen(state, req.distinct_features_seen);
            let again = evaluate_hard_gate(state, now, req.seconds_on_app, distinct, &cfg);
            if !again.passed {
                return None;
            }
            // The recorded figure is never lowered.
            record_gate(
                state,
                &again,
                distinct.max(state.onboarding.distinct_features_seen),
            );
            Some(apply_welcome_output(state, &applied, &plan, now))
        },
    )
    .await?;
    report.gate = Some(GateView::from(&gate));
    Ok(report)
}

/// `POST .../adoption/followup`: how a tour ended.
#[derive(Debug, Clone, Deserialize)]
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
    app: &AppState,
    product: &ProductId,
    user: &UserId,
    req: &FollowupRequest,
) -> Result<RunReport<FollowupOutput>, ApiError> {
    let stored = service::get(app, product, user).await?;
    let plan = service::effective_plan(app, product, stored.state.role()).await?;
    let Some(workflow) = plan.get(&req.workflow_id).cloned() else {
        return Err(ApiError::unprocessable(format!(
            "workflow {} is not in this user's onboarding plan",
            one_line(&req.workflow_id)
        ))
        .with("field", "workflow_id"));
    };
    let step = req.abandoned_at_step.as_deref();
    let mut projected = stored.state.clone();
    record_tour_outcome(
        &mut projected,
        &req.workflow_id,
        req.event,
        step,
        app.clock.now(),
    );
    let (prompt, scope): (RenderedPrompt, PromptScope) = build_followup_prompt(
        &projected,
        &plan,
        &workflow,
        req.event,
        step,
        &req.recent_activity,
    )
    .map_err(|e| prompt_failure(&e))?;
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
    let applied = out.clone();
    save_answer(
        app,
        product,
        user,
        "onboarding_followup",
        call,
        out,
        |state, now| {
            Some(apply_followup_output(
                state,
                &plan,
                &req.workflow_id,
                req.event,
                step,
                &applied,
                now,
            ))
        },
    )
    .await
}

/// `POST .../adoption/session-summary`: the session being summarised.
#[derive(Debug, Clone, Deserialize)]
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
#[derive(Debug, Clone, Serialize)]
pub struct SummaryAnswer {
    /// The parsed text.
    #[serde(flatten)]
    pub output: SummaryOutput,
    /// The session snapshot (`_v: 1`) the prompt was rendered from.
    pub snapshot: Value,
}

/// Captures a session snapshot, asks for a handover summary and stores it
/// (recording the session in the index when it is not there yet).
pub async fn session_summary(
    app: &AppState,
    product: &ProductId,
    user: &UserId,
    req: &SummaryRequest,
) -> Result<RunReport<SummaryAnswer>, ApiError> {
    let session_id = req.session_id.trim().to_owned();
    if session_id.is_empty() {
        return Err(
            ApiError::unprocessable("session_id must not be blank").with("field", "session_id")
        );
    }
    let now = app.clock.now();
    let started_at = Timestamp::from_epoch_seconds(req.started_at)
        .ok()
        .filter(|t| *t <= now)
        .ok_or_else(|| {
            ApiError::unprocessable("started_at must be epoch seconds, not after now")
                .with("field", "started_at")
        })?;
    let stored = service::get(app, product, user).await?;
    let plan = service::effective_plan(app, product, stored.state.role()).await?;
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
    let prompt = build_summary_prompt(&snapshot.summary_input()).map_err(|e| prompt_failure(&e))?;
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
    let entry = SessionIndexEntry {
        session_id,
        session_number: number,
        started_at,
        captured_at: now,
    };
    save_answer(
        app,
        product,
        user,
        "session_summary",
        call,
        answer,
        |state, now| {
            apply_summary_output(state, entry.clone(), &output, now);
            Some(AdoptionOutcome::none())
        },
    )
    .await
}

/// `POST .../tours/match`: a user's question.
#[derive(Debug, Clone, Deserialize)]
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

/// Tour matching's answer, with what the prompt allowed.
#[derive(Debug, Clone, Serialize)]
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
    app: &AppState,
    product: &ProductId,
    req: &TourMatchRequest,
) -> Result<TourMatchReport, ApiError> {
    let query = req.query.trim();
    if query.is_empty() || query.chars().count() > MAX_QUERY_CHARS {
        return Err(ApiError::unprocessable(format!(
            "query must not be blank and at most {MAX_QUERY_CHARS} characters"
        ))
        .with("field", "query"));
    }
    let role = match (&req.role, &req.user_id) {
        (Some(r), _) => Some(r.clone()),
        (None, Some(u)) => {
            let user = UserId::parse(u.clone())
                .map_err(|e| ApiError::unprocessable(e.to_string()).with("field", "user_id"))?;
            service::get(app, product, &user)
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
        query,
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
    let prompt = build_tour_match_prompt(&input).map_err(|e| prompt_failure(&e))?;
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
