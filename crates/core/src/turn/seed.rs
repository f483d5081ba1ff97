//! The support agent's turn state, declared field by field as the seed's
//! field reference lists it, with the gaps settled: lifecycles per leaf
//! field, `diagnostics` and `memory_control.action` turn-scoped,
//! `working_memory` and `procedural_profile.*` loaded and never
//! checkpointed, `route` one writer per step, `turn_count` from the
//! checkpoint only.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{MemoryId, TurnState, TurnView, WorkingMemoryEntry};
use crate::merge_by_some;

/// Transport surface of a turn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = TurnChannel))]
pub enum Channel {
    /// Tests and the CLI.
    #[default]
    Test,
    /// The web widget.
    Web,
    /// Voice.
    Voice,
}

/// Who spoke.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = TurnRole))]
pub enum Role {
    /// The user.
    #[default]
    User,
    /// The agent.
    Assistant,
}

/// One conversation turn as kept in `history` and `transcript`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = TurnMessage))]
pub struct Message {
    /// Who spoke.
    pub role: Role,
    /// What was said.
    pub content: String,
    /// The reply's style, stamped onto assistant turns at finalization.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_style: Option<String>,
}

/// Prompt-visible session continuity.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionMemory {
    /// A running summary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// What the user is worried about now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_concerns: Option<Vec<String>>,
    /// Threads left open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_loops: Option<Vec<String>>,
    /// The user's current goal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_goal: Option<String>,
}
merge_by_some!(SessionMemory {
    summary,
    active_concerns,
    open_loops,
    current_goal
});

/// Turn-count continuity.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionProgress {
    /// Turns so far, this one included: the previous turn's count plus
    /// one (the checkpoint version plus one on a thread without a count).
    /// A resumed turn is the turn it resumes, though it writes a checkpoint
    /// of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_count: Option<u64>,
    /// Whether the opening check-in happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checked_in: Option<bool>,
}
merge_by_some!(SessionProgress {
    turn_count,
    checked_in
});

/// The crisis gate's assessment.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CrisisAssessment {
    /// 0 (none) to 3 (imminent).
    pub level: u8,
    /// 0 to 1.
    pub confidence: f64,
    /// Why.
    pub reason: String,
    /// Whether the crisis route must answer.
    pub needs_crisis_response: bool,
    /// Whether to ask before deciding.
    pub needs_clarification: bool,
}

/// Classifier provenance, read by crisis logging.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CrisisAudit {
    /// Whether and how a rule overrode the classifier.
    pub override_kind: Option<String>,
    /// `llm_primary` or `keyword_fallback`.
    pub classifier_path: String,
    /// Whether the LLM classifier failed.
    pub llm_failure_occurred: bool,
}

/// Which reply path the turn takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Route {
    /// The crisis response.
    Crisis,
    /// A therapeutic reply.
    Therapeutic,
    /// A memory command.
    MemoryControl,
    /// A factual answer from the knowledge base.
    GroundedLookup,
}

/// A verified hotline.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resource {
    /// Its name.
    pub name: String,
    /// Its phone number.
    pub phone: String,
    /// Its website.
    pub website: String,
    /// Where it serves.
    pub region: String,
}

/// Per-turn timing, routing and retrieval metadata (key-wise merged).
pub type Diagnostics = Map<String, Value>;

crate::turn_state! {
    /// The support agent's state for one turn.
    pub struct SupportState {
        input SupportInput {
            /// Current user message being processed.
            message: String, by ["caller"];
            /// Transport surface: TEST, WEB, VOICE.
            channel: Channel, by ["caller"];
            /// Persistent owner; memory is namespaced by it. Required if `session_id` is absent.
            user_id: Option<String>, by ["caller"];
            /// Thread id for persistence; the fallback memory owner.
            session_id: Option<String>, by ["caller"];
            /// Skill names resolved into prompt behaviour.
            installed_skills: Vec<String>, by ["caller"];
        }
        loaded SupportLoaded {
            /// Structured semantic and episodic entries, formatted on demand.
            working_memory: Vec<WorkingMemoryEntry> => last, by ["turn memory context"];
            /// Style directives that shape every reply.
            procedural_rules: Vec<String> as "procedural_profile.procedural_rules" => last, by ["turn memory context"];
            /// Whether the agent may proactively reference recalled content.
            proactive_recall_enabled: bool as "procedural_profile.proactive_recall_enabled" => last, by ["turn memory context"];
        }
        reducer {
            /// The full durable conversation record: the user turn at turn start, the assistant turn at finalization.
            transcript: Vec<Message> => append, by ["begin_turn", "finalize_turn"];
            /// The prompt window: the last 40 entries of `transcript`, served from its rows.
            history: Vec<Message> => window(transcript, 40), by ["begin_turn", "finalize_turn"];
            /// Summary, active concerns, open loops, current goal.
            session_memory: SessionMemory => merge, by ["turn memory context"];
            /// Turn count (one more than the previous turn's, so a resume is no turn of its own) and sibling flags.
            session_progress: SessionProgress => merge, by ["begin_turn"];
            /// Active exercise identifier, e.g. `grounding_5_4_3_2_1`.
            exercise_type: Option<String> as "exercise_state.exercise_type" => last, by ["guided exercise flow", "crisis resource lookup"];
            /// Current step index; cleared when the exercise ends.
            exercise_step: Option<u32> as "exercise_state.exercise_step" => last, by ["guided exercise flow", "crisis resource lookup"];
            /// Approach pinned at exercise start.
            exercise_therapeutic_approach: Option<String> as "exercise_state.exercise_therapeutic_approach" => last, by ["guided exercise flow", "turn triage", "crisis resource lookup"];
            /// A destructive memory action awaiting confirmation on the next turn, as threads stored before confirmations became interrupts hold it; the next turn clears it and never acts on it.
            pending_action: Option<Value> as "memory_control.pending_action" => last, by ["turn triage", "crisis resource lookup", "safety check"];
        }
        turn_scoped {
            /// Detected memory command (kind, args).
            memory_action: Option<Value> as "memory_control.action" => last, by ["turn triage"];
            /// Memory entries a confirmed deletion removes, in the turn's commit.
            forget: Vec<MemoryId> as "memory_control.forget" => last, by ["memory control"];
            /// Level 0-3, confidence, reason, needs_crisis_response, needs_clarification.
            crisis: CrisisAssessment => last, by ["crisis gate"];
            /// Classifier provenance.
            crisis_audit: CrisisAudit => last, by ["crisis gate"];
            /// crisis / therapeutic / memory_control / grounded_lookup.
            route: Option<Route> => last, by ["crisis gate", "turn dispatch"];
            /// The reply.
            response_text: String => last, by ["reply node"];
            /// The reply's style, e.g. supportive, guided_exercise, crisis_response.
            response_style: Option<String> => last, by ["reply node", "gates"];
            /// The approach used, e.g. cbt, act, none.
            therapeutic_approach: Option<String> => last, by ["therapeutic agent"];
            /// Hint that the turn is worth summarizing.
            should_persist_memory: bool => last, by ["guided exercise flow"];
            /// Factual query extracted by triage.
            grounded_query: Option<String> as "grounded_lookup.query" => last, by ["turn triage"];
            /// answered / no_verified_answer / not_attempted.
            grounded_status: Option<String> as "grounded_lookup.status" => last, by ["grounded lookup tool", "turn triage"];
            /// Region taken from recent context for hotline lookup.
            inferred_location: Option<String> => last, by ["crisis resource lookup"];
            /// Verified hotlines; empty on failure or missing location.
            found_resources: Vec<Resource> => last, by ["crisis resource lookup"];
            /// found / no_location / location_refused / no_verified_results / not_attempted.
            resource_lookup_status: Option<String> => last, by ["crisis resource lookup", "turn triage"];
            /// Timing, routing and retrieval metadata for this turn.
            diagnostics: Diagnostics => merge, by ["every stage", "runtime"];
        }
        delta SupportDelta;
    }
}

/// The public output of a turn.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SupportOutput {
    /// The reply.
    pub response_text: String,
    /// What kind of answer it is: `crisis`, `reply`, `memory_control` or
    /// `grounded_answer` (from the route; `reply` when none was set).
    #[cfg_attr(feature = "openapi", schema(value_type = TurnResponseType))]
    pub response_type: &'static str,
    /// The crisis assessment.
    pub crisis: CrisisAssessment,
    /// The reply's style.
    pub response_style: Option<String>,
    /// The style's family: `therapeutic` (supportive, reflective,
    /// clarifying, psychoeducation, technique, closing), `exercise`
    /// (guided_exercise), `safety` (safety_check, crisis_response) or
    /// `utility` (memory_control, grounded_lookup); `none` without a style.
    #[cfg_attr(feature = "openapi", schema(value_type = ResponseStyleType))]
    pub response_style_type: &'static str,
    /// Who chose the style: `exercise` for a guided-exercise step, `gate`
    /// for crisis and utility routes, `model` otherwise; `none` without one.
    #[cfg_attr(feature = "openapi", schema(value_type = ResponseStyleSource))]
    pub response_style_source: &'static str,
    /// The approach used.
    pub therapeutic_approach: Option<String>,
    /// Whether the turn is worth summarizing.
    pub should_persist_memory: bool,
    /// This turn's diagnostics.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub diagnostics: Diagnostics,
    /// Set when the turn stopped to wait for the person's answer (resume
    /// the thread with it): what the stage asks. For a memory deletion:
    /// `question` (also the `response_text`), `kind`, `topic`, `ids` and
    /// `summary` of what would be deleted, and the `accepted` answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub interrupt: Option<Value>,
}

/// What kind of answer a turn gave, from its route.
#[cfg(feature = "openapi")]
#[derive(utoipa::ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)] // a schema only
enum TurnResponseType {
    Crisis,
    Reply,
    MemoryControl,
    GroundedAnswer,
}

/// The family of a reply's style.
#[cfg(feature = "openapi")]
#[derive(utoipa::ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)] // a schema only
enum ResponseStyleType {
    Therapeutic,
    Exercise,
    Safety,
    Utility,
    None,
}

/// Who chose a reply's style.
#[cfg(feature = "openapi")]
#[derive(utoipa::ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)] // a schema only
enum ResponseStyleSource {
    Exercise,
    Gate,
    Model,
    None,
}

impl TurnView for SupportState {
    type Output = SupportOutput;

    fn opening(&self) -> SupportDelta {
        let user = Message {
            role: Role::User,
            content: self.message.clone(),
            response_style: None,
        };
        SupportDelta {
            transcript: vec![user],
            session_progress: Some(SessionProgress {
                turn_count: Some(
                    self.session_progress
                        .turn_count
                        .unwrap_or(self.book().base_version)
                        + 1,
                ),
                checked_in: None,
            }),
            ..SupportDelta::default()
        }
    }

    fn output(&self) -> SupportOutput {
        let response_type = match self.route {
            Some(Route::Crisis) => "crisis",
            Some(Route::MemoryControl) => "memory_control",
            Some(Route::GroundedLookup) => "grounded_answer",
            Some(Route::Therapeutic) | None => "reply",
        };
        let response_style_type = match self.response_style.as_deref() {
            None => "none",
            Some("guided_exercise") => "exercise",
            Some("safety_check" | "crisis_response") => "safety",
            Some("memory_control" | "grounded_lookup") => "utility",
            Some(_) => "therapeutic",
        };
        let response_style_source = match (&self.response_style, self.route) {
            (None, _) => "none",
            (Some(style), _) if style == "guided_exercise" => "exercise",
            (_, Some(Route::Crisis | Route::MemoryControl | Route::GroundedLookup)) => "gate",
            _ => "model",
        };
        SupportOutput {
            response_text: self.response_text.clone(),
            response_type,
            crisis: self.crisis.clone(),
            response_style: self.response_style.clone(),
            response_style_type,
            response_style_source,
            therapeutic_approach: self.therapeutic_approach.clone(),
            should_persist_memory: self.should_persist_memory,
            diagnostics: self.diagnostics.clone(),
            interrupt: None,
        }
    }

    /// The output before the interrupted step, answering with the
    /// payload's `question` (when it has one) and carrying the payload.
    fn interrupted(&self, payload: &Value) -> SupportOutput {
        let mut out = self.output();
        if let Some(q) = payload.get("question").and_then(Value::as_str) {
            out.response_text = q.to_owned();
        }
        out.interrupt = Some(payload.clone());
        out
    }

    fn record_stage_time(&mut self, stage: &'static str, millis: f64) {
        self.diagnostics
            .insert(format!("{stage}_ms"), serde_json::json!(millis));
    }
}
