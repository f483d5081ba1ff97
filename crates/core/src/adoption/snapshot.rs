//! The adoption snapshot: `_v: 1` with the reference's key layout, encoded
//! and decoded defensively.
//!
//! Decoding follows the reference where it is sound: a missing or `null`
//! field takes its default, an unknown enum value degrades to the default, a
//! container of the wrong shape (`metadata`, `sessions`, `workflow_progress`)
//! is read as empty, numbers are clamped into their ranges. What cannot be
//! represented is rejected with the field's path, never turned into a
//! maximum or into text: a wrong-typed scalar (a number where text belongs,
//! text where a number belongs), a non-integral or overflowing count, a
//! timestamp outside years 1 to 9999, a `mastery`, `onboarding` or
//! `last_step_in` that is not an object (a "falsy" one — `0`, `""`, `[]`,
//! `false` — reads as absent, as in the reference), an empty `user_id` or
//! one that is not a valid [`UserId`]. (Strict JSON cannot carry NaN or
//! infinities at all.) Decoding never panics.

use crate::Timestamp;

use super::UserId;
use super::model::{
    JourneyState, Mastery, MasteryLevel, OnboardingState, OrderedMap, SESSION_INDEX_CAP,
    SessionIndexEntry, StepInAssessment, StepProgress, UNKNOWN_SOURCE, UserAdoptionState,
    WorkflowProgress, WorkflowStatus,
};
use super::ordered::OrderedValue as V;

/// The snapshot version this code writes and reads.
pub const SNAPSHOT_VERSION: u64 = 1;

/// Why a snapshot was rejected: the field's path and the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {problem}")]
pub struct DecodeError {
    /// Where, e.g. `$.onboarding.workflow_progress.w1.confidence`.
    pub path: String,
    /// What is wrong, lowercase.
    pub problem: String,
}

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

impl WorkflowProgress {
    /// The entry as it appears in the snapshot.
    pub fn to_snapshot(&self) -> serde_json::Value {
        (&workflow_value(self)).into()
    }

    /// Decodes one entry with the snapshot's rules.
    pub fn from_snapshot(v: &V, now: Timestamp) -> Result<Self, DecodeError> {
        if !matches!(v, V::Object(_)) {
            return Err(wrong("$", "an object", v));
        }
        decode_workflow(v, "$", now)
    }
}

impl StepProgress {
    /// The entry as it appears in the snapshot.
    pub fn to_snapshot(&self) -> serde_json::Value {
        (&step_value(self)).into()
    }
}

impl UserAdoptionState {
    /// The snapshot as an ordered JSON value (the reference's key layout).
    pub fn to_ordered_snapshot(&self) -> V {
        let metadata = serde_json::Value::Object(self.metadata.clone());
        obj(vec![
            ("_v", V::Number(SNAPSHOT_VERSION.into())),
            ("user_id", s(self.user_id.as_str())),
            ("metadata", V::from(&metadata)),
            ("journey_state", s(self.journey_state.as_str())),
            ("mastery", mastery_value(&self.mastery)),
            ("discovered_features", strs(&self.discovered_features)),
            ("onboarding", onboarding_value(&self.onboarding)),
            ("first_seen_at", ts(self.first_seen_at)),
            ("last_updated_at", ts(self.last_updated_at)),
            ("last_judged_at", opt_ts(self.last_judged_at)),
            (
                "sessions",
                obj(vec![
                    ("count", V::Number(self.sessions_count.into())),
                    (
                        "current_session_id",
                        self.current_session_id.as_deref().map_or(V::Null, s),
                    ),
                    (
                        "index",
                        V::Array(
                            self.sessions_index
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

    /// The snapshot as a `serde_json::Value` (object keys sorted; use
    /// [`Self::to_snapshot_string`] to keep the map order).
    pub fn to_snapshot(&self) -> serde_json::Value {
        (&self.to_ordered_snapshot()).into()
    }

    /// The snapshot as JSON text, maps in insertion order.
    pub fn to_snapshot_string(&self) -> String {
        serde_json::to_string(&self.to_ordered_snapshot()).unwrap_or_default()
    }

    /// Decodes a snapshot value (maps are taken in the value's key order).
    /// Missing lifecycle timestamps take `now`, as in the reference.
    pub fn from_snapshot(value: &serde_json::Value, now: Timestamp) -> Result<Self, DecodeError> {
        Self::from_ordered_snapshot(&V::from(value), now)
    }

    /// Decodes snapshot text, keeping the document order of maps.
    pub fn from_snapshot_str(text: &str, now: Timestamp) -> Result<Self, DecodeError> {
        let v = V::parse(text).map_err(|e| err("$", format!("not json: {e}")))?;
        Self::from_ordered_snapshot(&v, now)
    }

    /// Decodes an ordered snapshot value.
    pub fn from_ordered_snapshot(v: &V, now: Timestamp) -> Result<Self, DecodeError> {
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
                    session_number: count(
                        item.get("session_number"),
                        &format!("{p}.session_number"),
                    )?,
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
