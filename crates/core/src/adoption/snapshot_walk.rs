//! The adoption snapshots' first codec, kept to test the typed one (and
//! compiled outside the tests only with the `tree-codec` feature, for the
//! benchmark that compares them): it encodes by building an ordered value
//! tree and decodes by walking one, tracking each field's path by hand. The
//! property tests hold the typed codec to it: the same text, the same state
//! or the same error (path and message).

use crate::Timestamp;

use super::UserId;
use super::model::{
    JourneyState, Mastery, MasteryLevel, OnboardingState, OrderedMap, SESSION_INDEX_CAP,
    SessionIndexEntry, StepInAssessment, StepProgress, UNKNOWN_SOURCE, UserAdoptionState,
    WorkflowProgress, WorkflowStatus,
};
use super::ordered::OrderedValue as V;
use super::session_snapshot::{CompletionRateDenominator, SessionSnapshot};
use super::snapshot::{DecodeError, SNAPSHOT_VERSION};

pub(crate) fn err(path: &str, problem: impl Into<String>) -> DecodeError {
    DecodeError {
        path: path.to_owned(),
        problem: problem.into(),
    }
}

pub(crate) fn wrong(path: &str, expected: &str, found: &V) -> DecodeError {
    err(
        path,
        format!("expected {expected}, found {}", found.type_name()),
    )
}

fn num(n: f64) -> V {
    // Every f64 we write is finite (timestamps, clamped rates).
    serde_json::Number::from_f64(n).map_or(V::Null, V::Number)
}

fn ts(t: Timestamp) -> V {
    num(t.as_epoch_seconds())
}

fn opt_ts(t: Option<Timestamp>) -> V {
    t.map_or(V::Null, ts)
}

fn s(x: &str) -> V {
    V::String(x.to_owned())
}

fn obj(pairs: Vec<(&str, V)>) -> V {
    V::Object(pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
}

fn strs<'a>(xs: impl IntoIterator<Item = &'a String>) -> V {
    V::Array(xs.into_iter().map(|x| s(x)).collect())
}

pub(crate) fn mastery_value(m: &Mastery) -> V {
    obj(vec![
        ("rating", V::Number(m.rating.into())),
        ("level", s(m.level.as_str())),
        ("description", s(&m.description)),
    ])
}

pub(crate) fn step_value(st: &StepProgress) -> V {
    obj(vec![
        ("step_id", s(&st.step_id)),
        ("status", s(st.status.as_str())),
        ("confidence", num(st.confidence)),
        ("evidence", s(&st.evidence)),
        ("completed_at", opt_ts(st.completed_at)),
        ("last_evaluated_at", ts(st.last_evaluated_at)),
    ])
}

pub(crate) fn workflow_value(w: &WorkflowProgress) -> V {
    obj(vec![
        ("workflow_id", s(&w.workflow_id)),
        ("status", s(w.status.as_str())),
        ("confidence", num(w.confidence)),
        ("evidence", s(&w.evidence)),
        ("source", s(&w.source)),
        ("first_detected_at", opt_ts(w.first_detected_at)),
        ("completed_at", opt_ts(w.completed_at)),
        ("last_evaluated_at", ts(w.last_evaluated_at)),
        (
            "steps",
            V::Object(
                w.steps
                    .iter()
                    .map(|(k, st)| (k.to_owned(), step_value(st)))
                    .collect(),
            ),
        ),
    ])
}

pub(crate) fn progress_value(m: &OrderedMap<WorkflowProgress>) -> V {
    V::Object(
        m.iter()
            .map(|(k, w)| (k.to_owned(), workflow_value(w)))
            .collect(),
    )
}

fn step_in_value(a: &StepInAssessment) -> V {
    obj(vec![
        ("decided_at", ts(a.decided_at)),
        ("should_step_in", V::Bool(a.should_step_in)),
        ("timing_assessment", s(&a.timing_assessment)),
        ("reason", s(&a.reason)),
        ("suggested_workflow_ids", strs(&a.suggested_workflow_ids)),
    ])
}

fn onboarding_value(o: &OnboardingState) -> V {
    obj(vec![
        ("welcomed", V::Bool(o.welcomed)),
        ("exploration_started_at", ts(o.exploration_started_at)),
        (
            "distinct_features_seen",
            V::Number(o.distinct_features_seen.into()),
        ),
        ("explore_gate_passed", V::Bool(o.explore_gate_passed)),
        ("workflow_progress", progress_value(&o.workflow_progress)),
        (
            "last_step_in",
            o.last_step_in.as_ref().map_or(V::Null, step_in_value),
        ),
        ("last_reasoned_at", opt_ts(o.last_reasoned_at)),
        ("last_welcome_at", opt_ts(o.last_welcome_at)),
        (
            "proactive_support_count",
            V::Number(o.proactive_support_count.into()),
        ),
        ("onboarding_completed_at", opt_ts(o.onboarding_completed_at)),
        ("summary", o.summary.as_deref().map_or(V::Null, s)),
        ("completion_rate", num(o.completion_rate)),
    ])
}

/// The old `WorkflowProgress::from_snapshot`.
#[cfg(test)]
pub(crate) fn decode_workflow_entry(
    v: &V,
    now: Timestamp,
) -> Result<WorkflowProgress, DecodeError> {
    if !matches!(v, V::Object(_)) {
        return Err(wrong("$", "an object", v));
    }
    decode_workflow(v, "$", now)
}

/// The old `UserAdoptionState::to_ordered_snapshot`.
pub fn encode_state(state: &UserAdoptionState) -> V {
    let metadata = serde_json::Value::Object(state.metadata.clone());
    obj(vec![
        ("_v", V::Number(SNAPSHOT_VERSION.into())),
        ("user_id", s(state.user_id.as_str())),
        ("metadata", V::from(&metadata)),
        ("journey_state", s(state.journey_state.as_str())),
        ("mastery", mastery_value(&state.mastery)),
        ("discovered_features", strs(&state.discovered_features)),
        ("onboarding", onboarding_value(&state.onboarding)),
        ("first_seen_at", ts(state.first_seen_at)),
        ("last_updated_at", ts(state.last_updated_at)),
        ("last_judged_at", opt_ts(state.last_judged_at)),
        (
            "sessions",
            obj(vec![
                ("count", V::Number(state.sessions_count.into())),
                (
                    "current_session_id",
                    state.current_session_id.as_deref().map_or(V::Null, s),
                ),
                (
                    "index",
                    V::Array(
                        state
                            .sessions_index
                            .iter()
                            .map(|e| {
                                obj(vec![
                                    ("session_id", s(&e.session_id)),
                                    ("session_number", V::Number(e.session_number.into())),
                                    ("started_at", ts(e.started_at)),
                                    ("captured_at", ts(e.captured_at)),
                                ])
                            })
                            .collect(),
                    ),
                ),
            ]),
        ),
    ])
}

/// The old `UserAdoptionState::from_ordered_snapshot`.
pub fn decode_state(v: &V, now: Timestamp) -> Result<UserAdoptionState, DecodeError> {
    let V::Object(_) = v else {
        return Err(wrong("$", "an object", v));
    };
    match v.get("_v") {
        Some(V::Number(n)) if n.as_u64() == Some(SNAPSHOT_VERSION) => {}
        Some(other) => {
            return Err(err(
                "$._v",
                format!(
                    "unsupported snapshot version {}",
                    serde_json::to_string(other).unwrap_or_default()
                ),
            ));
        }
        None => return Err(err("$._v", "missing snapshot version")),
    }
    let user_id = match v.get("user_id") {
        Some(V::String(u)) if !u.is_empty() => {
            UserId::parse(u.as_str()).map_err(|e| err("$.user_id", e.to_string()))?
        }
        Some(V::String(_)) | None | Some(V::Null) => {
            return Err(err("$.user_id", "must not be empty"));
        }
        Some(other) => return Err(wrong("$.user_id", "a string", other)),
    };
    let metadata = match v.get("metadata") {
        Some(m @ V::Object(_)) => match serde_json::Value::from(m) {
            serde_json::Value::Object(m) => m,
            _ => serde_json::Map::new(),
        },
        _ => serde_json::Map::new(),
    };
    let journey_state = enum_field(v.get("journey_state"), JourneyState::coerce);
    let mastery = decode_mastery(v.get("mastery"), "$.mastery")?;
    let discovered_features = str_list(v.get("discovered_features"), "$.discovered_features")?;
    let onboarding = match v.get("onboarding") {
        None => OnboardingState::new(now),
        Some(o) if is_falsy(o) => OnboardingState::new(now),
        Some(o @ V::Object(_)) => decode_onboarding(o, "$.onboarding", now)?,
        Some(other) => return Err(wrong("$.onboarding", "an object", other)),
    };
    let first_seen_at = ts_or(v.get("first_seen_at"), "$.first_seen_at", now)?;
    let last_updated_at = ts_or(v.get("last_updated_at"), "$.last_updated_at", now)?;
    let last_judged_at = opt_ts_field(v.get("last_judged_at"), "$.last_judged_at")?;
    let empty = V::Object(Vec::new());
    let sessions = match v.get("sessions") {
        Some(o @ V::Object(_)) => o,
        _ => &empty,
    };
    let sessions_count = count(sessions.get("count"), "$.sessions.count")?;
    let current_session_id = match sessions.get("current_session_id") {
        None | Some(V::Null) => None,
        Some(V::String(x)) if x.is_empty() => None,
        Some(V::String(x)) => Some(x.clone()),
        Some(other) => return Err(wrong("$.sessions.current_session_id", "a string", other)),
    };
    let mut sessions_index = Vec::new();
    if let Some(V::Array(items)) = sessions.get("index") {
        for (i, item) in items.iter().enumerate() {
            if !matches!(item, V::Object(_)) {
                continue;
            }
            let p = format!("$.sessions.index[{i}]");
            sessions_index.push(SessionIndexEntry {
                session_id: req_str(item.get("session_id"), &format!("{p}.session_id"))?,
                session_number: count(item.get("session_number"), &format!("{p}.session_number"))?,
                started_at: ts_or(item.get("started_at"), &format!("{p}.started_at"), now)?,
                captured_at: ts_or(item.get("captured_at"), &format!("{p}.captured_at"), now)?,
            });
        }
    }
    let excess = sessions_index.len().saturating_sub(SESSION_INDEX_CAP);
    sessions_index.drain(..excess);
    Ok(UserAdoptionState {
        user_id,
        metadata,
        journey_state,
        mastery,
        discovered_features,
        onboarding,
        first_seen_at,
        last_updated_at,
        last_judged_at,
        sessions_count,
        current_session_id,
        sessions_index,
    })
}

/// True for the values the reference reads as "absent" where an object is
/// expected: `null`, `false`, `0`, `""`, `[]`, `{}`.
pub(crate) fn is_falsy(v: &V) -> bool {
    match v {
        V::Null => true,
        V::Bool(b) => !*b,
        V::Number(n) => n.as_f64() == Some(0.0),
        V::String(s) => s.is_empty(),
        V::Array(a) => a.is_empty(),
        V::Object(o) => o.is_empty(),
    }
}

/// An enum field: a known wire string, else the default.
pub(crate) fn enum_field<T: Default>(v: Option<&V>, coerce: fn(&str) -> T) -> T {
    match v {
        Some(V::String(x)) => coerce(x),
        _ => T::default(),
    }
}

pub(crate) fn decode_mastery(v: Option<&V>, path: &str) -> Result<Mastery, DecodeError> {
    let m = match v {
        None => return Ok(Mastery::default()),
        Some(m) if is_falsy(m) => return Ok(Mastery::default()),
        Some(m @ V::Object(_)) => m,
        Some(other) => return Err(wrong(path, "an object", other)),
    };
    let rating = match m.get("rating") {
        None | Some(V::Null) => 0,
        Some(V::Number(n)) => {
            let x = n.as_f64().unwrap_or(0.0);
            super::model::clamp_rating(x)
                .map_err(|_| err(&format!("{path}.rating"), "not finite"))?
        }
        Some(other) => return Err(wrong(&format!("{path}.rating"), "a number", other)),
    };
    Ok(Mastery {
        rating,
        level: enum_field(m.get("level"), MasteryLevel::coerce),
        description: text(m.get("description"), &format!("{path}.description"))?,
    })
}

/// Text, `""` when missing or null.
pub(crate) fn text(v: Option<&V>, path: &str) -> Result<String, DecodeError> {
    match v {
        None | Some(V::Null) => Ok(String::new()),
        Some(V::String(x)) => Ok(x.clone()),
        Some(other) => Err(wrong(path, "a string", other)),
    }
}

fn req_str(v: Option<&V>, path: &str) -> Result<String, DecodeError> {
    match v {
        Some(V::String(x)) => Ok(x.clone()),
        None => Err(err(path, "missing")),
        Some(other) => Err(wrong(path, "a string", other)),
    }
}

/// A list of strings, empty when missing or null.
pub(crate) fn str_list(v: Option<&V>, path: &str) -> Result<Vec<String>, DecodeError> {
    match v {
        None | Some(V::Null) => Ok(Vec::new()),
        Some(V::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, x)| match x {
                V::String(x) => Ok(x.clone()),
                other => Err(wrong(&format!("{path}[{i}]"), "a string", other)),
            })
            .collect(),
        Some(other) => Err(wrong(path, "an array of strings", other)),
    }
}

pub(crate) fn boolean(v: Option<&V>, path: &str) -> Result<bool, DecodeError> {
    match v {
        None | Some(V::Null) => Ok(false),
        Some(V::Bool(b)) => Ok(*b),
        Some(other) => Err(wrong(path, "a boolean", other)),
    }
}

/// A non-negative count: integral numbers only; negatives read as 0 (as in
/// the reference); beyond 2^63 rejected as an overflow.
pub(crate) fn count(v: Option<&V>, path: &str) -> Result<u64, DecodeError> {
    const LIMIT: u64 = i64::MAX as u64;
    match v {
        None | Some(V::Null) => Ok(0),
        Some(V::Number(n)) => {
            if let Some(u) = n.as_u64() {
                if u > LIMIT {
                    return Err(err(path, format!("count {u} overflows")));
                }
                return Ok(u);
            }
            if n.as_i64().is_some() {
                // A negative integer.
                return Ok(0);
            }
            let x = n.as_f64().unwrap_or(f64::NAN);
            if x.fract() != 0.0 || !x.is_finite() {
                return Err(err(path, format!("expected an integer count, found {x}")));
            }
            if x < 0.0 {
                return Ok(0);
            }
            if x >= LIMIT as f64 {
                return Err(err(path, format!("count {x} overflows")));
            }
            Ok(x as u64)
        }
        Some(other) => Err(wrong(path, "an integer count", other)),
    }
}

/// A number clamped into `[low, high]`, `default` when missing or null.
pub(crate) fn unit(v: Option<&V>, path: &str, default: f64) -> Result<f64, DecodeError> {
    match v {
        None | Some(V::Null) => Ok(default),
        Some(V::Number(n)) => Ok(n.as_f64().unwrap_or(0.0).clamp(0.0, 1.0)),
        Some(other) => Err(wrong(path, "a number", other)),
    }
}

/// A timestamp, `None` when missing or null.
pub(crate) fn opt_ts_field(v: Option<&V>, path: &str) -> Result<Option<Timestamp>, DecodeError> {
    match v {
        None | Some(V::Null) => Ok(None),
        Some(V::Number(n)) => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            Timestamp::from_epoch_seconds(x)
                .map(Some)
                .map_err(|e| err(path, e.to_string()))
        }
        Some(other) => Err(wrong(path, "epoch seconds", other)),
    }
}

/// A timestamp, `now` when missing or null.
pub(crate) fn ts_or(v: Option<&V>, path: &str, now: Timestamp) -> Result<Timestamp, DecodeError> {
    Ok(opt_ts_field(v, path)?.unwrap_or(now))
}

pub(crate) fn decode_step(v: &V, path: &str, now: Timestamp) -> Result<StepProgress, DecodeError> {
    Ok(StepProgress {
        step_id: text(v.get("step_id"), &format!("{path}.step_id"))?,
        status: enum_field(v.get("status"), WorkflowStatus::coerce),
        confidence: unit(v.get("confidence"), &format!("{path}.confidence"), 0.0)?,
        evidence: text(v.get("evidence"), &format!("{path}.evidence"))?,
        completed_at: opt_ts_field(v.get("completed_at"), &format!("{path}.completed_at"))?,
        last_evaluated_at: ts_or(
            v.get("last_evaluated_at"),
            &format!("{path}.last_evaluated_at"),
            now,
        )?,
    })
}

pub(crate) fn decode_workflow(
    v: &V,
    path: &str,
    now: Timestamp,
) -> Result<WorkflowProgress, DecodeError> {
    let source = match v.get("source") {
        Some(V::String(x)) if !x.trim().is_empty() => x.trim().to_owned(),
        _ => UNKNOWN_SOURCE.to_owned(),
    };
    let mut steps = OrderedMap::new();
    if let Some(V::Object(pairs)) = v.get("steps") {
        for (k, st) in pairs {
            if matches!(st, V::Object(_)) {
                steps.insert(
                    k.clone(),
                    decode_step(st, &format!("{path}.steps.{k}"), now)?,
                );
            }
        }
    }
    Ok(WorkflowProgress {
        workflow_id: text(v.get("workflow_id"), &format!("{path}.workflow_id"))?,
        status: enum_field(v.get("status"), WorkflowStatus::coerce),
        confidence: unit(v.get("confidence"), &format!("{path}.confidence"), 0.0)?,
        evidence: text(v.get("evidence"), &format!("{path}.evidence"))?,
        source,
        first_detected_at: opt_ts_field(
            v.get("first_detected_at"),
            &format!("{path}.first_detected_at"),
        )?,
        completed_at: opt_ts_field(v.get("completed_at"), &format!("{path}.completed_at"))?,
        last_evaluated_at: ts_or(
            v.get("last_evaluated_at"),
            &format!("{path}.last_evaluated_at"),
            now,
        )?,
        steps,
    })
}

/// A `workflow_progress` map: non-objects read as empty, entries that are
/// not objects dropped.
pub(crate) fn decode_progress(
    v: Option<&V>,
    path: &str,
    now: Timestamp,
) -> Result<OrderedMap<WorkflowProgress>, DecodeError> {
    let mut out = OrderedMap::new();
    if let Some(V::Object(pairs)) = v {
        for (k, w) in pairs {
            if matches!(w, V::Object(_)) {
                out.insert(k.clone(), decode_workflow(w, &format!("{path}.{k}"), now)?);
            }
        }
    }
    Ok(out)
}

fn decode_onboarding(o: &V, path: &str, now: Timestamp) -> Result<OnboardingState, DecodeError> {
    let p = |k: &str| format!("{path}.{k}");
    let last_step_in = match o.get("last_step_in") {
        None => None,
        Some(a) if is_falsy(a) => None,
        Some(a @ V::Object(_)) => {
            let q = p("last_step_in");
            Some(StepInAssessment {
                decided_at: ts_or(a.get("decided_at"), &format!("{q}.decided_at"), now)?,
                should_step_in: boolean(a.get("should_step_in"), &format!("{q}.should_step_in"))?,
                timing_assessment: text(
                    a.get("timing_assessment"),
                    &format!("{q}.timing_assessment"),
                )?,
                reason: text(a.get("reason"), &format!("{q}.reason"))?,
                suggested_workflow_ids: str_list(
                    a.get("suggested_workflow_ids"),
                    &format!("{q}.suggested_workflow_ids"),
                )?,
            })
        }
        Some(other) => return Err(wrong(&p("last_step_in"), "an object", other)),
    };
    let summary = match o.get("summary") {
        None | Some(V::Null) => None,
        Some(V::String(x)) => Some(x.clone()),
        Some(other) => return Err(wrong(&p("summary"), "a string", other)),
    };
    Ok(OnboardingState {
        welcomed: boolean(o.get("welcomed"), &p("welcomed"))?,
        exploration_started_at: ts_or(
            o.get("exploration_started_at"),
            &p("exploration_started_at"),
            now,
        )?,
        distinct_features_seen: count(
            o.get("distinct_features_seen"),
            &p("distinct_features_seen"),
        )?,
        explore_gate_passed: boolean(o.get("explore_gate_passed"), &p("explore_gate_passed"))?,
        workflow_progress: decode_progress(
            o.get("workflow_progress"),
            &p("workflow_progress"),
            now,
        )?,
        last_step_in,
        last_reasoned_at: opt_ts_field(o.get("last_reasoned_at"), &p("last_reasoned_at"))?,
        last_welcome_at: opt_ts_field(o.get("last_welcome_at"), &p("last_welcome_at"))?,
        proactive_support_count: count(
            o.get("proactive_support_count"),
            &p("proactive_support_count"),
        )?,
        onboarding_completed_at: opt_ts_field(
            o.get("onboarding_completed_at"),
            &p("onboarding_completed_at"),
        )?,
        summary,
        completion_rate: unit(o.get("completion_rate"), &p("completion_rate"), 0.0)?,
    })
}

/// The old `SessionSnapshot::to_ordered_snapshot`.
pub fn encode_session(snap: &SessionSnapshot) -> V {
    let num = |x: f64| serde_json::Number::from_f64(x).map_or(V::Null, V::Number);
    let strs = |xs: &[String]| V::Array(xs.iter().map(|x| V::String(x.clone())).collect());
    let pairs: Vec<(&str, V)> = vec![
        ("_v", V::Number(1.into())),
        ("_frozen", V::Bool(snap.frozen)),
        ("session_id", V::String(snap.session_id.clone())),
        ("session_number", V::Number(snap.session_number.into())),
        ("user_id", V::String(snap.user_id.clone())),
        ("started_at", num(snap.started_at.as_epoch_seconds())),
        ("captured_at", num(snap.captured_at.as_epoch_seconds())),
        ("duration_s", num(snap.duration_s)),
        (
            "journey_state",
            V::String(snap.journey_state.as_str().to_owned()),
        ),
        ("mastery", mastery_value(&snap.mastery)),
        (
            "proactive_support_count",
            V::Number(snap.proactive_support_count.into()),
        ),
        (
            "distinct_features_seen",
            V::Number(snap.distinct_features_seen.into()),
        ),
        ("discovered_features", strs(&snap.discovered_features)),
        (
            "reached_onboarding_complete",
            V::Bool(snap.reached_onboarding_complete),
        ),
        ("completion_rate", num(snap.completion_rate)),
        (
            "completion_rate_denominator",
            V::String(snap.completion_rate_denominator.as_str().to_owned()),
        ),
        (
            "total_catalog_workflows",
            V::Number(snap.total_catalog_workflows.into()),
        ),
        ("completed_workflow_ids", strs(&snap.completed_workflow_ids)),
        (
            "in_progress_workflow_ids",
            strs(&snap.in_progress_workflow_ids),
        ),
        ("untouched_workflow_ids", strs(&snap.untouched_workflow_ids)),
        ("workflow_progress", progress_value(&snap.workflow_progress)),
    ];
    V::Object(pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
}

/// The old `SessionSnapshot::from_ordered_snapshot`.
pub fn decode_session(v: &V, now: Timestamp) -> Result<SessionSnapshot, DecodeError> {
    if !matches!(v, V::Object(_)) {
        return Err(wrong("$", "an object", v));
    }
    match v.get("_v") {
        Some(V::Number(n)) if n.as_u64() == Some(1) => {}
        _ => return Err(err("$._v", "unsupported or missing snapshot version")),
    }
    let req = |k: &str| -> Result<String, DecodeError> {
        match v.get(k) {
            Some(V::String(s)) if !s.is_empty() => Ok(s.clone()),
            Some(V::String(_)) | None | Some(V::Null) => {
                Err(err(&format!("$.{k}"), "must not be empty"))
            }
            Some(other) => Err(wrong(&format!("$.{k}"), "a string", other)),
        }
    };
    let number = |k: &str| match v.get(k) {
        Some(V::Number(n)) => n.as_f64().unwrap_or(0.0),
        _ => 0.0,
    };
    let lenient_count = |k: &str| match v.get(k) {
        Some(V::Number(n)) => {
            let x = n.as_f64().unwrap_or(0.0).trunc();
            if x <= 0.0 {
                0
            } else if x >= i64::MAX as f64 {
                i64::MAX as u64
            } else {
                x as u64
            }
        }
        _ => 0,
    };
    let time = |k: &str| match v.get(k) {
        Some(V::Number(n)) => n
            .as_f64()
            .and_then(|x| Timestamp::from_epoch_seconds(x).ok())
            .unwrap_or(now),
        _ => now,
    };
    let list = |k: &str| -> Result<Vec<String>, DecodeError> {
        match v.get(k) {
            Some(a @ V::Array(_)) => str_list(Some(a), &format!("$.{k}")),
            _ => Ok(Vec::new()),
        }
    };
    let frozen = match v.get("_frozen") {
        None => true,
        Some(V::Null) => false,
        other => boolean(other, "$._frozen")?,
    };
    let denominator = match v.get("completion_rate_denominator") {
        Some(x @ (V::Array(_) | V::Object(_))) => {
            return Err(wrong("$.completion_rate_denominator", "a string", x));
        }
        other => enum_field(other, CompletionRateDenominator::coerce),
    };
    Ok(SessionSnapshot {
        session_id: req("session_id")?,
        session_number: lenient_count("session_number"),
        user_id: req("user_id")?,
        started_at: time("started_at"),
        captured_at: time("captured_at"),
        duration_s: number("duration_s"),
        journey_state: enum_field(v.get("journey_state"), JourneyState::coerce),
        mastery: decode_mastery(v.get("mastery"), "$.mastery")?,
        proactive_support_count: lenient_count("proactive_support_count"),
        distinct_features_seen: lenient_count("distinct_features_seen"),
        discovered_features: list("discovered_features")?,
        reached_onboarding_complete: boolean(
            v.get("reached_onboarding_complete"),
            "$.reached_onboarding_complete",
        )?,
        completion_rate: number("completion_rate").clamp(0.0, 1.0),
        completion_rate_denominator: denominator,
        total_catalog_workflows: lenient_count("total_catalog_workflows"),
        completed_workflow_ids: list("completed_workflow_ids")?,
        in_progress_workflow_ids: list("in_progress_workflow_ids")?,
        untouched_workflow_ids: list("untouched_workflow_ids")?,
        workflow_progress: decode_progress(v.get("workflow_progress"), "$.workflow_progress", now)?,
        frozen,
    })
}

/// The old `UserAdoptionState::from_snapshot_str`.
pub fn decode_state_str(text: &str, now: Timestamp) -> Result<UserAdoptionState, DecodeError> {
    let v = V::parse(text).map_err(|e| err("$", format!("not json: {e}")))?;
    decode_state(&v, now)
}
