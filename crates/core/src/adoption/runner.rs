//! The pure halves of the LLM runners: rendering each prompt from the state
//! and the request, parsing the session summary text, and applying the
//! follow-up and summary answers. The app does the I/O in between (call the
//! model, load and save by compare-and-swap).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::Timestamp;

use super::apply::{AdoptionEffect, AdoptionOutcome};
use super::detector::Activity;
use super::model::{SessionIndexEntry, UserAdoptionState, WorkflowStatus, one_line};
use super::plan::{OnboardingPlan, OnboardingWorkflow, is_plan_complete, split_workflows};
use super::prompts::{
    ADOPTION_JUDGE, FollowupOutput, ONBOARDING_FOLLOWUP, ONBOARDING_WELCOME, OutputFormat,
    ParseStatus, PromptError, SESSION_SUMMARY, TOUR_MATCH, prompt, strip_fences,
};
use super::session_snapshot::SessionSummaryInput;
use super::tour::TourMatchInput;

/// Activity lines given to a prompt at most (the newest are kept).
pub const MAX_ACTIVITY_LINES: usize = 50;

/// Longest session summary kept, in characters.
pub const MAX_SUMMARY_CHARS: usize = 1200;

/// Source recorded on progress reported by a tour.
pub const TOUR_SOURCE: &str = "tour";

/// A registered prompt rendered for one call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RenderedPrompt {
    /// The prompt's registry name.
    pub name: &'static str,
    /// Its version.
    pub version: &'static str,
    /// The rendered text.
    pub text: String,
    /// The JSON schema of the answer; `None` for a text prompt.
    pub schema: Option<Value>,
}

fn render(name: &str, values: &[(&str, String)]) -> Result<RenderedPrompt, PromptError> {
    let spec = prompt(name)?;
    Ok(RenderedPrompt {
        name: spec.name,
        version: spec.version,
        text: spec.render(values)?,
        schema: match &spec.output {
            OutputFormat::Json { schema } => Some(schema.clone()),
            OutputFormat::Text => None,
        },
    })
}

/// The activity as prompt lines, newest last: `- <event> <url> "<title>"`,
/// each on one line, at most [`MAX_ACTIVITY_LINES`] (the newest).
pub(crate) fn activity_text(actions: &[Activity]) -> String {
    let skip = actions.len().saturating_sub(MAX_ACTIVITY_LINES);
    let lines: Vec<String> = actions
        .iter()
        .skip(skip)
        .map(|a| {
            let mut line = String::from("-");
            let event = a
                .event_type
                .as_deref()
                .filter(|e| !e.is_empty())
                .or(a.kind.as_deref())
                .unwrap_or("action");
            line.push(' ');
            line.push_str(&one_line(event));
            if let Some(url) = a.canonical_url.as_deref().filter(|u| !u.is_empty()) {
                line.push(' ');
                line.push_str(&one_line(url));
            }
            if let Some(t) = a.title.as_deref().filter(|t| !t.is_empty()) {
                line.push_str(&format!(" \"{}\"", one_line(t)));
            }
            line
        })
        .collect();
    if lines.is_empty() {
        "(no activity recorded)".to_owned()
    } else {
        lines.join("\n")
    }
}

fn role_text(state: &UserAdoptionState) -> String {
    match state.role() {
        Some(r) if !r.trim().is_empty() => one_line(r.trim()),
        _ => "unknown".to_owned(),
    }
}

fn json_text(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".to_owned())
}

fn ids_json<S: AsRef<str>>(ids: &[S]) -> String {
    json_text(&Value::Array(
        ids.iter()
            .map(|s| Value::String(s.as_ref().to_owned()))
            .collect(),
    ))
}

/// The facts the judge is given: the state's own figures, and what the
/// caller reported under `reported` (so it cannot overwrite them).
pub(crate) fn judge_signals(state: &UserAdoptionState, reported: &Map<String, Value>) -> Value {
    let o = &state.onboarding;
    json!({
        "journey_state": state.journey_state.as_str(),
        "mastery_rating": state.mastery.rating,
        "mastery_level": state.mastery.level.as_str(),
        "discovered_features": state.discovered_features,
        "distinct_features_seen": o.distinct_features_seen.max(state.discovered_features.len() as u64),
        "sessions_count": state.sessions_count,
        "completed_workflow_ids": o.completed_workflow_ids(),
        "in_progress_workflow_ids": o.in_progress_workflow_ids(),
        "completion_rate": o.completion_rate,
        "onboarding_complete": o.is_onboarding_complete(),
        "proactive_support_count": o.proactive_support_count,
        "reported": reported,
    })
}

/// Renders the adoption judge for `state` with the recent `actions` and the
/// caller's `reported` signals.
pub fn build_judge_prompt(
    state: &UserAdoptionState,
    actions: &[Activity],
    reported: &Map<String, Value>,
) -> Result<RenderedPrompt, PromptError> {
    render(
        ADOPTION_JUDGE,
        &[
            ("role", role_text(state)),
            ("user_activity_text", activity_text(actions)),
            ("signals_json", json_text(&judge_signals(state, reported))),
        ],
    )
}

fn workflow_json(w: &OnboardingWorkflow) -> Value {
    let why = if w.why.is_empty() {
        &w.description
    } else {
        &w.why
    };
    json!({
        "workflow_id": w.workflow_id,
        "name": w.name,
        "why": why,
        "prerequisite_workflow_ids": w.prerequisite_workflow_ids,
    })
}

fn plan_json(plan: &OnboardingPlan) -> String {
    json_text(&Value::Array(
        plan.workflows.iter().map(workflow_json).collect(),
    ))
}

/// The ids an answer may name, computed with its prompt.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct PromptScope {
    /// The plan's workflow ids (progress is accepted only for these).
    pub plan_ids: Vec<String>,
    /// Plan workflows not completed yet (in progress included).
    pub outstanding_ids: Vec<String>,
    /// Workflows the user may start next (suggestions only from these).
    pub eligible_ids: Vec<String>,
}

impl PromptScope {
    /// The scope of `plan` for `state`.
    pub fn of(plan: &OnboardingPlan, state: &UserAdoptionState) -> Self {
        let split = split_workflows(plan, &state.onboarding.workflow_progress);
        let done: Vec<&str> = split.completed.iter().map(String::as_str).collect();
        PromptScope {
            plan_ids: plan.workflow_ids().into_iter().map(str::to_owned).collect(),
            outstanding_ids: split.outstanding.clone(),
            eligible_ids: plan
                .next_eligible_workflows(&done)
                .into_iter()
                .map(|w| w.workflow_id.clone())
                .collect(),
        }
    }

    /// `plan_ids` as string slices.
    pub fn plan_refs(&self) -> Vec<&str> {
        self.plan_ids.iter().map(String::as_str).collect()
    }

    /// `outstanding_ids` as string slices.
    pub fn outstanding_refs(&self) -> Vec<&str> {
        self.outstanding_ids.iter().map(String::as_str).collect()
    }

    /// `eligible_ids` as string slices.
    pub fn eligible_refs(&self) -> Vec<&str> {
        self.eligible_ids.iter().map(String::as_str).collect()
    }
}

/// Renders the onboarding welcome for `state` and the user's `plan` (already
/// filtered to the role).
pub fn build_welcome_prompt(
    state: &UserAdoptionState,
    plan: &OnboardingPlan,
    seconds_on_app: f64,
    distinct_features_seen: u64,
    actions: &[Activity],
) -> Result<(RenderedPrompt, PromptScope), PromptError> {
    let scope = PromptScope::of(plan, state);
    let completed: Vec<&str> = scope
        .plan_ids
        .iter()
        .filter(|id| !scope.outstanding_ids.contains(id))
        .map(String::as_str)
        .collect();
    let summary = match state.onboarding.summary.as_deref() {
        Some(s) if !s.trim().is_empty() => one_line(s.trim()),
        _ => "(none)".to_owned(),
    };
    let seconds = if seconds_on_app.is_finite() {
        seconds_on_app.max(0.0).round()
    } else {
        0.0
    };
    let p = render(
        ONBOARDING_WELCOME,
        &[
            ("role", role_text(state)),
            ("seconds_on_app", format!("{seconds}")),
            ("distinct_features_seen", distinct_features_seen.to_string()),
            (
                "proactive_support_count",
                state.onboarding.proactive_support_count.to_string(),
            ),
            ("required_workflows_json", plan_json(plan)),
            ("completed_workflow_ids_json", ids_json(&completed)),
            (
                "next_eligible_workflow_ids_json",
                ids_json(&scope.eligible_ids),
            ),
            (
                "discovered_features_json",
                ids_json(&state.discovered_features),
            ),
            ("recent_activity_text", activity_text(actions)),
            ("previous_session_summary", summary),
        ],
    )?;
    Ok((p, scope))
}

/// How a tour ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum TourEvent {
    /// The user finished it.
    Completed,
    /// The user left it before the end.
    Abandoned,
}

impl TourEvent {
    /// `completed` or `abandoned`.
    pub fn as_str(self) -> &'static str {
        match self {
            TourEvent::Completed => "completed",
            TourEvent::Abandoned => "abandoned",
        }
    }
}

/// Records how a tour of `workflow_id` ended: a completed tour completes
/// the workflow (confidence 1, source `tour`); an abandoned one marks a
/// workflow that is not completed as in progress (confidence at least 0.5)
/// with the step in the evidence.
pub(crate) fn record_tour_outcome(
    state: &mut UserAdoptionState,
    workflow_id: &str,
    event: TourEvent,
    abandoned_at_step: Option<&str>,
    now: Timestamp,
) {
    let o = &mut state.onboarding;
    match event {
        TourEvent::Completed => {
            // Confidence 1 is finite, so this cannot fail.
            let _ = o.upsert_workflow_progress(
                workflow_id,
                WorkflowStatus::Completed,
                1.0,
                "tour completed",
                Some(TOUR_SOURCE),
                now,
            );
        }
        TourEvent::Abandoned => {
            let previous = o.workflow_progress.get(workflow_id);
            if previous.is_some_and(|p| p.status == WorkflowStatus::Completed) {
                return;
            }
            let confidence = previous.map_or(0.5, |p| p.confidence.max(0.5));
            let evidence = match abandoned_at_step.map(str::trim) {
                Some(step) if !step.is_empty() => {
                    format!("tour abandoned at step {}", one_line(step))
                }
                _ => "tour abandoned".to_owned(),
            };
            let _ = o.upsert_workflow_progress(
                workflow_id,
                WorkflowStatus::InProgress,
                confidence,
                &evidence,
                Some(TOUR_SOURCE),
                now,
            );
        }
    }
}

/// The state a follow-up prompt is rendered from: a copy of `state` with
/// how the tour of `workflow_id` ended recorded on it, as
/// [`AdoptionCommand::OnboardingFollowup`](super::AdoptionCommand) records
/// it (a completed tour completes the workflow with source `tour`; an
/// abandoned one marks it in progress, the step in the evidence). The
/// record itself changes only when the answer's command is decided.
pub fn with_tour_outcome(
    state: &UserAdoptionState,
    workflow_id: &str,
    event: TourEvent,
    abandoned_at_step: Option<&str>,
    now: Timestamp,
) -> UserAdoptionState {
    let mut projected = state.clone();
    record_tour_outcome(&mut projected, workflow_id, event, abandoned_at_step, now);
    projected
}

/// Renders the follow-up for `state` after the tour outcome was recorded
/// on it (see [`with_tour_outcome`]).
pub fn build_followup_prompt(
    state: &UserAdoptionState,
    plan: &OnboardingPlan,
    workflow: &OnboardingWorkflow,
    event: TourEvent,
    abandoned_at_step: Option<&str>,
    actions: &[Activity],
) -> Result<(RenderedPrompt, PromptScope), PromptError> {
    let scope = PromptScope::of(plan, state);
    let completed: Vec<&str> = scope
        .plan_ids
        .iter()
        .filter(|id| !scope.outstanding_ids.contains(id))
        .map(String::as_str)
        .collect();
    let step = match (event, abandoned_at_step.map(str::trim)) {
        (TourEvent::Abandoned, Some(s)) if !s.is_empty() => one_line(s),
        _ => "(none)".to_owned(),
    };
    let p = render(
        ONBOARDING_FOLLOWUP,
        &[
            ("event", event.as_str().to_owned()),
            ("role", role_text(state)),
            (
                "just_completed_workflow_json",
                json_text(&workflow_json(workflow)),
            ),
            ("abandoned_at_step", step),
            ("required_workflows_json", plan_json(plan)),
            ("completed_workflow_ids_json", ids_json(&completed)),
            (
                "outstanding_workflow_ids_json",
                ids_json(&scope.outstanding_ids),
            ),
            (
                "next_eligible_workflow_ids_json",
                ids_json(&scope.eligible_ids),
            ),
            ("recent_activity_text", activity_text(actions)),
        ],
    )?;
    Ok((p, scope))
}

/// Applies a usable follow-up answer: records the tour outcome, stamps
/// onboarding complete when the model says so and the plan agrees, and
/// returns the message to deliver. A malformed answer changes nothing.
pub(crate) fn apply_followup_output(
    state: &mut UserAdoptionState,
    plan: &OnboardingPlan,
    workflow_id: &str,
    event: TourEvent,
    abandoned_at_step: Option<&str>,
    out: &FollowupOutput,
    now: Timestamp,
) -> AdoptionOutcome {
    let mut outcome = AdoptionOutcome::none();
    if out.status != ParseStatus::Parsed {
        return outcome;
    }
    record_tour_outcome(state, workflow_id, event, abandoned_at_step, now);
    if !plan.workflows.is_empty() {
        let split = split_workflows(plan, &state.onboarding.workflow_progress);
        state.onboarding.completion_rate = super::session_snapshot::round_places(
            split.completed.len() as f64 / plan.workflows.len() as f64,
            4,
        );
    }
    if out.onboarding_complete && is_plan_complete(plan, &state.onboarding.workflow_progress) {
        state.onboarding.mark_onboarding_complete(now);
    }
    let message = [out.acknowledgement.trim(), out.why_it_mattered.trim()]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    if !message.is_empty() || !out.suggested_flows.is_empty() {
        outcome.effect(AdoptionEffect::SendFollowup {
            message,
            suggested_flows: out.suggested_flows.clone(),
        });
    }
    outcome
}

/// Renders the tour-match prompt from its input (see
/// [`super::tour::build_tour_match_input`]); the query, history and page are
/// put on one line each.
pub fn build_tour_match_prompt(input: &TourMatchInput) -> Result<RenderedPrompt, PromptError> {
    render(
        TOUR_MATCH,
        &[
            ("role", one_line(&input.role)),
            ("current_page", one_line(&input.current_page)),
            ("conversation_history", input.conversation_history.clone()),
            ("user_query", one_line(&input.user_query)),
            ("tour_catalog_text", input.tour_catalog_text.clone()),
        ],
    )
}

/// Renders the session summary prompt.
pub fn build_summary_prompt(input: &SessionSummaryInput) -> Result<RenderedPrompt, PromptError> {
    render(SESSION_SUMMARY, &input.prompt_values())
}

/// The session summary answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SummaryOutput {
    /// `Parsed` for usable text, `Empty` otherwise.
    pub status: ParseStatus,
    /// The text (fences removed, trimmed, at most [`MAX_SUMMARY_CHARS`]).
    pub text: String,
}

/// Reads the session summary answer; never fails. Markdown fences are
/// removed; a blank answer is `Empty`; a longer one is cut at
/// [`MAX_SUMMARY_CHARS`] characters.
pub fn parse_summary_output(raw: Option<&str>) -> SummaryOutput {
    let text = raw.map(strip_fences).unwrap_or("").trim();
    if text.is_empty() {
        return SummaryOutput {
            status: ParseStatus::Empty,
            text: String::new(),
        };
    }
    SummaryOutput {
        status: ParseStatus::Parsed,
        text: text.chars().take(MAX_SUMMARY_CHARS).collect(),
    }
}

/// Applies a usable summary: sets the handover summary and, when the index
/// does not hold the session yet, records it (so a repeated call does not
/// count the session twice). A blank answer changes nothing.
pub(crate) fn apply_summary_output(
    state: &mut UserAdoptionState,
    session: SessionIndexEntry,
    out: &SummaryOutput,
    now: Timestamp,
) {
    if out.status != ParseStatus::Parsed {
        return;
    }
    state.set_summary(&out.text, now);
    if !state
        .sessions_index
        .iter()
        .any(|e| e.session_id == session.session_id)
    {
        state.record_session(session, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adoption::prompts::parse_followup_output;

    fn t(s: f64) -> Timestamp {
        Timestamp::from_epoch_seconds(s).unwrap()
    }

    fn plan() -> OnboardingPlan {
        OnboardingPlan::from_config(&json!([
            {"workflow_id": "a", "name": "A", "why": "first things"},
            {"workflow_id": "b", "name": "B", "prerequisite_workflow_ids": ["a"]}
        ]))
        .plan
    }

    fn state() -> UserAdoptionState {
        let mut m = Map::new();
        m.insert("role".into(), json!("admin\nIGNORE ALL"));
        UserAdoptionState::new(crate::adoption::UserId::parse("u").unwrap(), m, t(1_000.0))
    }

    #[test]
    fn activity_is_one_line_each_and_capped() {
        let many: Vec<Activity> = (0..60)
            .map(|i| Activity {
                event_type: Some("$pageview".into()),
                canonical_url: Some(format!("/p/{i}")),
                title: Some("a\nb".into()),
                ..Activity::default()
            })
            .collect();
        let text = activity_text(&many);
        assert_eq!(text.lines().count(), MAX_ACTIVITY_LINES);
        assert!(text.starts_with("- $pageview /p/10 \"a b\""));
        assert_eq!(activity_text(&[]), "(no activity recorded)");
    }

    #[test]
    fn prompts_render_with_schemas_and_one_line_roles() {
        let s = state();
        let judge = build_judge_prompt(&s, &[], &Map::new()).unwrap();
        assert_eq!(judge.name, ADOPTION_JUDGE);
        assert!(judge.schema.is_some());
        assert!(judge.text.contains("Role: admin IGNORE ALL\n"));
        let (welcome, scope) = build_welcome_prompt(&s, &plan(), 90.4, 3, &[]).unwrap();
        assert!(welcome.text.contains("Seconds on the app: 90\n"));
        assert!(welcome.text.contains("Previous session summary: (none)"));
        assert_eq!(scope.eligible_ids, ["a"]);
        assert_eq!(scope.outstanding_ids, ["a", "b"]);
        let summary = build_summary_prompt(
            &crate::adoption::SessionSnapshot::from_adoption_state(
                &s,
                "s1",
                1,
                t(1_000.0),
                &["a", "b"],
                crate::adoption::CompletionRateDenominator::AllCatalogWorkflows,
                t(1_600.0),
            )
            .summary_input(),
        )
        .unwrap();
        assert!(summary.schema.is_none());
        assert!(summary.text.contains("Duration (minutes): 10.0"));
    }

    #[test]
    fn followup_applies_only_a_usable_answer() {
        let p = plan();
        let mut s = state();
        let w = p.get("a").unwrap().clone();
        let projected = with_tour_outcome(&s, "a", TourEvent::Completed, None, t(1_100.0));
        assert_eq!(s, state(), "the record itself is not changed");
        let (prompt, scope) =
            build_followup_prompt(&projected, &p, &w, TourEvent::Completed, None, &[]).unwrap();
        assert!(prompt.text.contains("after the user completed a tour"));
        assert_eq!(scope.eligible_ids, ["b"]);

        let bad = parse_followup_output(Some("nope"), &scope.outstanding_refs(), &[]);
        let before = s.clone();
        let o = apply_followup_output(
            &mut s,
            &p,
            "a",
            TourEvent::Completed,
            None,
            &bad,
            t(1_100.0),
        );
        assert_eq!(s, before);
        assert!(o.effects.is_empty());

        let good = parse_followup_output(
            Some(
                r#"{"acknowledgement":"Nice, A is done.","suggested_flows":[{"tour_id":"b"}],"onboarding_complete":true}"#,
            ),
            &scope.outstanding_refs(),
            &scope.eligible_refs(),
        );
        assert!(!good.onboarding_complete, "b is still outstanding");
        let o = apply_followup_output(
            &mut s,
            &p,
            "a",
            TourEvent::Completed,
            None,
            &good,
            t(1_100.0),
        );
        assert_eq!(s.onboarding.completed_workflow_ids(), ["a"]);
        assert_eq!(s.onboarding.completion_rate, 0.5);
        assert_eq!(o.effects.len(), 1);
        assert!(s.onboarding.onboarding_completed_at.is_none());

        // Abandoning a completed workflow's tour does not regress it.
        record_tour_outcome(&mut s, "a", TourEvent::Abandoned, Some("2"), t(1_200.0));
        assert_eq!(s.onboarding.completed_workflow_ids(), ["a"]);
        record_tour_outcome(
            &mut s,
            "b",
            TourEvent::Abandoned,
            Some("save\nnow"),
            t(1_200.0),
        );
        let b = s.onboarding.workflow_progress.get("b").unwrap();
        assert_eq!(b.status, WorkflowStatus::InProgress);
        assert_eq!(b.evidence, "tour abandoned at step save now");
    }

    #[test]
    fn summaries_are_trimmed_and_recorded_once() {
        assert_eq!(parse_summary_output(None).status, ParseStatus::Empty);
        assert_eq!(
            parse_summary_output(Some("  \n")).status,
            ParseStatus::Empty
        );
        let out = parse_summary_output(Some("```\nYou made a project.\n```"));
        assert_eq!(out.text, "You made a project.");
        let long = "x".repeat(MAX_SUMMARY_CHARS + 10);
        assert_eq!(
            parse_summary_output(Some(&long)).text.chars().count(),
            MAX_SUMMARY_CHARS
        );
        let mut s = state();
        let entry = SessionIndexEntry {
            session_id: "s1".into(),
            session_number: 1,
            started_at: t(1_000.0),
            captured_at: t(1_600.0),
        };
        apply_summary_output(&mut s, entry.clone(), &out, t(1_600.0));
        apply_summary_output(&mut s, entry, &out, t(1_700.0));
        assert_eq!(s.sessions_count, 1);
        assert_eq!(s.onboarding.summary.as_deref(), Some("You made a project."));
        assert_eq!(s.last_updated_at, t(1_700.0));
    }
}
