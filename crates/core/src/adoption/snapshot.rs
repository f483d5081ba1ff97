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
//!
//! Both directions are typed (see the `codec` module): the snapshot is written
//! straight from the state, fixed keys as bytes and values by serde_json,
//! and read in one pass from the text (or from a value) into the fields it
//! needs, with no value tree in between. The fields are checked in a fixed
//! order, so the first error, its path and its message do not depend on the
//! document's key order.

use serde::Deserialize;
use serde_json::Value;

use crate::Timestamp;

use super::UserId;
use super::codec::{
    Entries, Items, Meta, Obj, Path, Raw, StrList, boolean, count, enum_field, fields, opt_ts,
    opt_ts_out, str_list, strs, text, ts, ts_or, unit, value,
};
use super::model::{
    JourneyState, Mastery, MasteryLevel, OnboardingState, OrderedMap, SESSION_INDEX_CAP,
    SessionIndexEntry, StepInAssessment, StepProgress, UNKNOWN_SOURCE, UserAdoptionState,
    WorkflowProgress, WorkflowStatus,
};
use super::ordered::OrderedValue;

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

/// The error of a document that is not JSON.
pub(crate) fn not_json(e: &serde_json::Error) -> DecodeError {
    Path::ROOT.err(format!("not json: {e}"))
}

// ---- encoding ------------------------------------------------------------

pub(crate) fn write_mastery(out: &mut Vec<u8>, m: &Mastery) {
    out.extend_from_slice(b"{\"rating\":");
    value(out, &m.rating);
    out.extend_from_slice(b",\"level\":");
    value(out, m.level.as_str());
    out.extend_from_slice(b",\"description\":");
    value(out, &m.description);
    out.push(b'}');
}

fn write_step(out: &mut Vec<u8>, st: &StepProgress) {
    out.extend_from_slice(b"{\"step_id\":");
    value(out, &st.step_id);
    out.extend_from_slice(b",\"status\":");
    value(out, st.status.as_str());
    out.extend_from_slice(b",\"confidence\":");
    value(out, &st.confidence);
    out.extend_from_slice(b",\"evidence\":");
    value(out, &st.evidence);
    out.extend_from_slice(b",\"completed_at\":");
    opt_ts_out(out, st.completed_at);
    out.extend_from_slice(b",\"last_evaluated_at\":");
    ts(out, st.last_evaluated_at);
    out.push(b'}');
}

fn write_workflow(out: &mut Vec<u8>, w: &WorkflowProgress) {
    out.extend_from_slice(b"{\"workflow_id\":");
    value(out, &w.workflow_id);
    out.extend_from_slice(b",\"status\":");
    value(out, w.status.as_str());
    out.extend_from_slice(b",\"confidence\":");
    value(out, &w.confidence);
    out.extend_from_slice(b",\"evidence\":");
    value(out, &w.evidence);
    out.extend_from_slice(b",\"source\":");
    value(out, &w.source);
    out.extend_from_slice(b",\"first_detected_at\":");
    opt_ts_out(out, w.first_detected_at);
    out.extend_from_slice(b",\"completed_at\":");
    opt_ts_out(out, w.completed_at);
    out.extend_from_slice(b",\"last_evaluated_at\":");
    ts(out, w.last_evaluated_at);
    out.extend_from_slice(b",\"steps\":{");
    for (i, (k, st)) in w.steps.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        value(out, k);
        out.push(b':');
        write_step(out, st);
    }
    out.extend_from_slice(b"}}");
}

pub(crate) fn write_progress(out: &mut Vec<u8>, m: &OrderedMap<WorkflowProgress>) {
    out.push(b'{');
    for (i, (k, w)) in m.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        value(out, k);
        out.push(b':');
        write_workflow(out, w);
    }
    out.push(b'}');
}

fn write_step_in(out: &mut Vec<u8>, a: &StepInAssessment) {
    out.extend_from_slice(b"{\"decided_at\":");
    ts(out, a.decided_at);
    out.extend_from_slice(b",\"should_step_in\":");
    value(out, &a.should_step_in);
    out.extend_from_slice(b",\"timing_assessment\":");
    value(out, &a.timing_assessment);
    out.extend_from_slice(b",\"reason\":");
    value(out, &a.reason);
    out.extend_from_slice(b",\"suggested_workflow_ids\":");
    strs(out, &a.suggested_workflow_ids);
    out.push(b'}');
}

fn write_onboarding(out: &mut Vec<u8>, o: &OnboardingState) {
    out.extend_from_slice(b"{\"welcomed\":");
    value(out, &o.welcomed);
    out.extend_from_slice(b",\"exploration_started_at\":");
    ts(out, o.exploration_started_at);
    out.extend_from_slice(b",\"distinct_features_seen\":");
    value(out, &o.distinct_features_seen);
    out.extend_from_slice(b",\"explore_gate_passed\":");
    value(out, &o.explore_gate_passed);
    out.extend_from_slice(b",\"workflow_progress\":");
    write_progress(out, &o.workflow_progress);
    out.extend_from_slice(b",\"last_step_in\":");
    match &o.last_step_in {
        Some(a) => write_step_in(out, a),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"last_reasoned_at\":");
    opt_ts_out(out, o.last_reasoned_at);
    out.extend_from_slice(b",\"last_welcome_at\":");
    opt_ts_out(out, o.last_welcome_at);
    out.extend_from_slice(b",\"proactive_support_count\":");
    value(out, &o.proactive_support_count);
    out.extend_from_slice(b",\"onboarding_completed_at\":");
    opt_ts_out(out, o.onboarding_completed_at);
    out.extend_from_slice(b",\"summary\":");
    value(out, &o.summary);
    out.extend_from_slice(b",\"completion_rate\":");
    value(out, &o.completion_rate);
    out.push(b'}');
}

/// JSON text written by this module, as a value: the same document, key
/// for key (every number is read back exactly). The text holds no metadata
/// (see [`UserAdoptionState::to_snapshot`]), so it nests a few levels only
/// and always parses.
pub(crate) fn text_value<T: for<'a> Deserialize<'a>>(out: &[u8]) -> Option<T> {
    serde_json::from_slice(out).ok()
}

impl WorkflowProgress {
    /// The entry as it appears in the snapshot.
    pub fn to_snapshot(&self) -> Value {
        let mut out = Vec::with_capacity(256);
        write_workflow(&mut out, self);
        text_value(&out).unwrap_or_default()
    }

    /// Decodes one entry with the snapshot's rules.
    pub fn from_snapshot(v: &OrderedValue, now: Timestamp) -> Result<Self, DecodeError> {
        match Obj::<WorkflowIn<'_>>::deserialize(v).map_err(|e| not_json(&e))? {
            Obj::Fields { fields, .. } => decode_workflow(fields, &Path::ROOT, now),
            Obj::Other(s) => Err(Path::ROOT.wrong("an object", s.name)),
        }
    }
}

impl StepProgress {
    /// The entry as it appears in the snapshot.
    pub fn to_snapshot(&self) -> Value {
        let mut out = Vec::with_capacity(128);
        write_step(&mut out, self);
        text_value(&out).unwrap_or_default()
    }
}

impl UserAdoptionState {
    /// The snapshot as an ordered JSON value (the reference's key layout).
    pub fn to_ordered_snapshot(&self) -> OrderedValue {
        let mut out = Vec::with_capacity(1024);
        self.write(&mut out, false);
        let mut v = text_value(&out).unwrap_or(OrderedValue::Null);
        if let OrderedValue::Object(pairs) = &mut v
            && let Some((_, slot)) = pairs.iter_mut().find(|(k, _)| k == "metadata")
        {
            *slot = OrderedValue::from(&Value::Object(self.metadata.clone()));
        }
        v
    }

    /// The snapshot as a `serde_json::Value`, keys in the snapshot's order.
    pub fn to_snapshot(&self) -> Value {
        // Read back from the text without the metadata, which is then put in
        // its place as it is: metadata nested deeper than a parser accepts
        // (only a state built in code can hold such) is kept, not refused.
        let mut out = Vec::with_capacity(1024);
        self.write(&mut out, false);
        let mut v: Value = text_value(&out).unwrap_or_default();
        if let Some(slot) = v.get_mut("metadata") {
            *slot = Value::Object(self.metadata.clone());
        }
        v
    }

    /// The snapshot as JSON text, maps in insertion order, written straight
    /// from the state.
    pub fn to_snapshot_string(&self) -> String {
        let mut out = Vec::with_capacity(1024);
        self.write_snapshot(&mut out);
        // serde_json writes UTF-8 only, and so do the fixed keys.
        String::from_utf8(out).unwrap_or_default()
    }

    /// Appends the snapshot as JSON text (see
    /// [`UserAdoptionState::to_snapshot_string`]) to `out`.
    pub fn write_snapshot(&self, out: &mut Vec<u8>) {
        self.write(out, true);
    }

    /// Writes the snapshot, its `metadata` as `{}` unless `metadata`.
    fn write(&self, out: &mut Vec<u8>, metadata: bool) {
        out.extend_from_slice(b"{\"_v\":");
        value(out, &SNAPSHOT_VERSION);
        out.extend_from_slice(b",\"user_id\":");
        value(out, self.user_id.as_str());
        out.extend_from_slice(b",\"metadata\":");
        if metadata {
            value(out, &self.metadata);
        } else {
            out.extend_from_slice(b"{}");
        }
        out.extend_from_slice(b",\"journey_state\":");
        value(out, self.journey_state.as_str());
        out.extend_from_slice(b",\"mastery\":");
        write_mastery(out, &self.mastery);
        out.extend_from_slice(b",\"discovered_features\":");
        strs(out, &self.discovered_features);
        out.extend_from_slice(b",\"onboarding\":");
        write_onboarding(out, &self.onboarding);
        out.extend_from_slice(b",\"first_seen_at\":");
        ts(out, self.first_seen_at);
        out.extend_from_slice(b",\"last_updated_at\":");
        ts(out, self.last_updated_at);
        out.extend_from_slice(b",\"last_judged_at\":");
        opt_ts_out(out, self.last_judged_at);
        out.extend_from_slice(b",\"sessions\":{\"count\":");
        value(out, &self.sessions_count);
        out.extend_from_slice(b",\"current_session_id\":");
        value(out, &self.current_session_id);
        out.extend_from_slice(b",\"index\":[");
        for (i, e) in self.sessions_index.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"session_id\":");
            value(out, &e.session_id);
            out.extend_from_slice(b",\"session_number\":");
            value(out, &e.session_number);
            out.extend_from_slice(b",\"started_at\":");
            ts(out, e.started_at);
            out.extend_from_slice(b",\"captured_at\":");
            ts(out, e.captured_at);
            out.push(b'}');
        }
        out.extend_from_slice(b"]}}");
    }

    /// Decodes a snapshot value (maps are taken in the value's key order).
    /// Missing lifecycle timestamps take `now`, as in the reference.
    pub fn from_snapshot(value: &Value, now: Timestamp) -> Result<Self, DecodeError> {
        // Reading a value never fails: every visitor accepts any JSON.
        Doc::deserialize(value)
            .map_err(|e| not_json(&e))?
            .decode(now)
    }

    /// Decodes snapshot text, keeping the document order of maps, with no
    /// value tree in between.
    pub fn from_snapshot_str(text: &str, now: Timestamp) -> Result<Self, DecodeError> {
        let doc: Doc<'_> = serde_json::from_str(text).map_err(|e| not_json(&e))?;
        doc.decode(now)
    }

    /// Decodes snapshot bytes (UTF-8 JSON text), as
    /// [`UserAdoptionState::from_snapshot_str`].
    pub fn from_snapshot_slice(bytes: &[u8], now: Timestamp) -> Result<Self, DecodeError> {
        let doc: Doc<'_> = serde_json::from_slice(bytes).map_err(|e| not_json(&e))?;
        doc.decode(now)
    }

    /// Decodes an ordered snapshot value.
    pub fn from_ordered_snapshot(v: &OrderedValue, now: Timestamp) -> Result<Self, DecodeError> {
        Doc::deserialize(v).map_err(|e| not_json(&e))?.decode(now)
    }
}

// ---- decoding --------------------------------------------------------------

fields!(Root {
    version: OrderedValue = "_v",
    user_id: Raw<'de> = "user_id",
    metadata: Meta = "metadata",
    journey_state: Raw<'de> = "journey_state",
    mastery: Obj<MasteryIn<'de>> = "mastery",
    discovered_features: StrList = "discovered_features",
    onboarding: Obj<OnboardingIn<'de>> = "onboarding",
    first_seen_at: Raw<'de> = "first_seen_at",
    last_updated_at: Raw<'de> = "last_updated_at",
    last_judged_at: Raw<'de> = "last_judged_at",
    sessions: Obj<SessionsIn<'de>> = "sessions",
});

fields!(SessionsIn {
    count: Raw<'de> = "count",
    current_session_id: Raw<'de> = "current_session_id",
    index: Items<IndexIn<'de>> = "index",
});

fields!(IndexIn {
    session_id: Raw<'de> = "session_id",
    session_number: Raw<'de> = "session_number",
    started_at: Raw<'de> = "started_at",
    captured_at: Raw<'de> = "captured_at",
});

fields!(MasteryIn {
    rating: Raw<'de> = "rating",
    level: Raw<'de> = "level",
    description: Raw<'de> = "description",
});

fields!(OnboardingIn {
    welcomed: Raw<'de> = "welcomed",
    exploration_started_at: Raw<'de> = "exploration_started_at",
    distinct_features_seen: Raw<'de> = "distinct_features_seen",
    explore_gate_passed: Raw<'de> = "explore_gate_passed",
    workflow_progress: Entries<'de, WorkflowIn<'de>> = "workflow_progress",
    last_step_in: Obj<StepInIn<'de>> = "last_step_in",
    last_reasoned_at: Raw<'de> = "last_reasoned_at",
    last_welcome_at: Raw<'de> = "last_welcome_at",
    proactive_support_count: Raw<'de> = "proactive_support_count",
    onboarding_completed_at: Raw<'de> = "onboarding_completed_at",
    summary: Raw<'de> = "summary",
    completion_rate: Raw<'de> = "completion_rate",
});

fields!(StepInIn {
    decided_at: Raw<'de> = "decided_at",
    should_step_in: Raw<'de> = "should_step_in",
    timing_assessment: Raw<'de> = "timing_assessment",
    reason: Raw<'de> = "reason",
    suggested_workflow_ids: StrList = "suggested_workflow_ids",
});

fields!(WorkflowIn {
    workflow_id: Raw<'de> = "workflow_id",
    status: Raw<'de> = "status",
    confidence: Raw<'de> = "confidence",
    evidence: Raw<'de> = "evidence",
    source: Raw<'de> = "source",
    first_detected_at: Raw<'de> = "first_detected_at",
    completed_at: Raw<'de> = "completed_at",
    last_evaluated_at: Raw<'de> = "last_evaluated_at",
    steps: Entries<'de, StepIn<'de>> = "steps",
});

fields!(StepIn {
    step_id: Raw<'de> = "step_id",
    status: Raw<'de> = "status",
    confidence: Raw<'de> = "confidence",
    evidence: Raw<'de> = "evidence",
    completed_at: Raw<'de> = "completed_at",
    last_evaluated_at: Raw<'de> = "last_evaluated_at",
});

/// The whole document, as read.
type Doc<'de> = Obj<Root<'de>>;

/// `mastery`: absent or falsy reads as the default, an object is decoded,
/// anything else is refused.
pub(crate) fn decode_mastery(
    v: Option<Obj<MasteryIn<'_>>>,
    path: &Path<'_>,
) -> Result<Mastery, DecodeError> {
    let Some(m) = Obj::truthy(v, path)? else {
        return Ok(Mastery::default());
    };
    let rating = match m.rating {
        None | Some(Raw::Null) => 0,
        Some(Raw::Number(n)) => {
            let x = n.as_f64().unwrap_or(0.0);
            super::model::clamp_rating(x).map_err(|_| path.key("rating").err("not finite"))?
        }
        Some(other) => return Err(path.key("rating").wrong("a number", other.type_name())),
    };
    Ok(Mastery {
        rating,
        level: enum_field(m.level.as_ref(), MasteryLevel::coerce),
        description: text(m.description, &path.key("description"))?,
    })
}

fn decode_step(
    s: StepIn<'_>,
    path: &Path<'_>,
    now: Timestamp,
) -> Result<StepProgress, DecodeError> {
    Ok(StepProgress {
        step_id: text(s.step_id, &path.key("step_id"))?,
        status: enum_field(s.status.as_ref(), WorkflowStatus::coerce),
        confidence: unit(s.confidence.as_ref(), &path.key("confidence"), 0.0)?,
        evidence: text(s.evidence, &path.key("evidence"))?,
        completed_at: opt_ts(s.completed_at.as_ref(), &path.key("completed_at"))?,
        last_evaluated_at: ts_or(
            s.last_evaluated_at.as_ref(),
            &path.key("last_evaluated_at"),
            now,
        )?,
    })
}

fn decode_workflow(
    w: WorkflowIn<'_>,
    path: &Path<'_>,
    now: Timestamp,
) -> Result<WorkflowProgress, DecodeError> {
    let source = match &w.source {
        Some(Raw::String(x)) if !x.trim().is_empty() => x.trim().to_owned(),
        _ => UNKNOWN_SOURCE.to_owned(),
    };
    let mut steps = Vec::new();
    if let Some(Entries(Some(entries))) = w.steps {
        let at = path.key("steps");
        for (k, st) in entries {
            if let Some(st) = st {
                let step = decode_step(st, &at.key(&k), now)?;
                steps.push((k.into_owned(), step));
            }
        }
    }
    Ok(WorkflowProgress {
        workflow_id: text(w.workflow_id, &path.key("workflow_id"))?,
        status: enum_field(w.status.as_ref(), WorkflowStatus::coerce),
        confidence: unit(w.confidence.as_ref(), &path.key("confidence"), 0.0)?,
        evidence: text(w.evidence, &path.key("evidence"))?,
        source,
        first_detected_at: opt_ts(w.first_detected_at.as_ref(), &path.key("first_detected_at"))?,
        completed_at: opt_ts(w.completed_at.as_ref(), &path.key("completed_at"))?,
        last_evaluated_at: ts_or(
            w.last_evaluated_at.as_ref(),
            &path.key("last_evaluated_at"),
            now,
        )?,
        // Keys are distinct: repeated ones were merged when read.
        steps: OrderedMap::from_distinct(steps),
    })
}

/// A `workflow_progress` map: non-objects read as empty, entries that are
/// not objects dropped.
pub(crate) fn decode_progress(
    v: Option<Entries<'_, WorkflowIn<'_>>>,
    path: &Path<'_>,
    now: Timestamp,
) -> Result<OrderedMap<WorkflowProgress>, DecodeError> {
    let mut out = Vec::new();
    if let Some(Entries(Some(entries))) = v {
        for (k, w) in entries {
            if let Some(w) = w {
                let workflow = decode_workflow(w, &path.key(&k), now)?;
                out.push((k.into_owned(), workflow));
            }
        }
    }
    Ok(OrderedMap::from_distinct(out))
}

fn decode_onboarding(
    o: OnboardingIn<'_>,
    path: &Path<'_>,
    now: Timestamp,
) -> Result<OnboardingState, DecodeError> {
    let at = path.key("last_step_in");
    let last_step_in = match Obj::truthy(o.last_step_in, &at)? {
        None => None,
        Some(a) => Some(StepInAssessment {
            decided_at: ts_or(a.decided_at.as_ref(), &at.key("decided_at"), now)?,
            should_step_in: boolean(a.should_step_in.as_ref(), &at.key("should_step_in"))?,
            timing_assessment: text(a.timing_assessment, &at.key("timing_assessment"))?,
            reason: text(a.reason, &at.key("reason"))?,
            suggested_workflow_ids: str_list(
                a.suggested_workflow_ids,
                &at.key("suggested_workflow_ids"),
            )?,
        }),
    };
    let summary = match o.summary {
        None | Some(Raw::Null) => None,
        Some(Raw::String(x)) => Some(x.into_owned()),
        Some(other) => return Err(path.key("summary").wrong("a string", other.type_name())),
    };
    Ok(OnboardingState {
        welcomed: boolean(o.welcomed.as_ref(), &path.key("welcomed"))?,
        exploration_started_at: ts_or(
            o.exploration_started_at.as_ref(),
            &path.key("exploration_started_at"),
            now,
        )?,
        distinct_features_seen: count(
            o.distinct_features_seen.as_ref(),
            &path.key("distinct_features_seen"),
        )?,
        explore_gate_passed: boolean(
            o.explore_gate_passed.as_ref(),
            &path.key("explore_gate_passed"),
        )?,
        workflow_progress: decode_progress(
            o.workflow_progress,
            &path.key("workflow_progress"),
            now,
        )?,
        last_step_in,
        last_reasoned_at: opt_ts(o.last_reasoned_at.as_ref(), &path.key("last_reasoned_at"))?,
        last_welcome_at: opt_ts(o.last_welcome_at.as_ref(), &path.key("last_welcome_at"))?,
        proactive_support_count: count(
            o.proactive_support_count.as_ref(),
            &path.key("proactive_support_count"),
        )?,
        onboarding_completed_at: opt_ts(
            o.onboarding_completed_at.as_ref(),
            &path.key("onboarding_completed_at"),
        )?,
        summary,
        completion_rate: unit(
            o.completion_rate.as_ref(),
            &path.key("completion_rate"),
            0.0,
        )?,
    })
}

impl Doc<'_> {
    /// Checks the fields read, in the order of the reference decoder: the
    /// first error found is the one reported.
    fn decode(self, now: Timestamp) -> Result<UserAdoptionState, DecodeError> {
        let root = Path::ROOT;
        let r = match self {
            Obj::Fields { fields, .. } => fields,
            Obj::Other(s) => return Err(root.wrong("an object", s.name)),
        };
        match &r.version {
            Some(OrderedValue::Number(n)) if n.as_u64() == Some(SNAPSHOT_VERSION) => {}
            Some(other) => {
                return Err(root.key("_v").err(format!(
                    "unsupported snapshot version {}",
                    serde_json::to_string(other).unwrap_or_default()
                )));
            }
            None => return Err(root.key("_v").err("missing snapshot version")),
        }
        let user_id = match r.user_id {
            Some(Raw::String(u)) if !u.is_empty() => {
                UserId::parse(u.as_ref()).map_err(|e| root.key("user_id").err(e.to_string()))?
            }
            Some(Raw::String(_) | Raw::Null) | None => {
                return Err(root.key("user_id").err("must not be empty"));
            }
            Some(other) => return Err(root.key("user_id").wrong("a string", other.type_name())),
        };
        let metadata = r.metadata.and_then(|m| m.0).unwrap_or_default();
        let journey_state = enum_field(r.journey_state.as_ref(), JourneyState::coerce);
        let mastery = decode_mastery(r.mastery, &root.key("mastery"))?;
        let discovered_features =
            str_list(r.discovered_features, &root.key("discovered_features"))?;
        let at = root.key("onboarding");
        let onboarding = match Obj::truthy(r.onboarding, &at)? {
            None => OnboardingState::new(now),
            Some(o) => decode_onboarding(o, &at, now)?,
        };
        let first_seen_at = ts_or(r.first_seen_at.as_ref(), &root.key("first_seen_at"), now)?;
        let last_updated_at = ts_or(
            r.last_updated_at.as_ref(),
            &root.key("last_updated_at"),
            now,
        )?;
        let last_judged_at = opt_ts(r.last_judged_at.as_ref(), &root.key("last_judged_at"))?;
        let sessions = r.sessions.and_then(Obj::fields).unwrap_or_default();
        let at = root.key("sessions");
        let sessions_count = count(sessions.count.as_ref(), &at.key("count"))?;
        let current_session_id = match sessions.current_session_id {
            None | Some(Raw::Null) => None,
            Some(Raw::String(x)) if x.is_empty() => None,
            Some(Raw::String(x)) => Some(x.into_owned()),
            Some(other) => {
                return Err(at
                    .key("current_session_id")
                    .wrong("a string", other.type_name()));
            }
        };
        let mut sessions_index = Vec::new();
        if let Some(Items(Some(items))) = sessions.index {
            let index = at.key("index");
            for (i, item) in items.into_iter().enumerate() {
                let Some(item) = item else { continue };
                let p = index.index(i);
                let session_id = match item.session_id {
                    Some(Raw::String(x)) => x.into_owned(),
                    None => return Err(p.key("session_id").err("missing")),
                    Some(other) => {
                        return Err(p.key("session_id").wrong("a string", other.type_name()));
                    }
                };
                sessions_index.push(SessionIndexEntry {
                    session_id,
                    session_number: count(item.session_number.as_ref(), &p.key("session_number"))?,
                    started_at: ts_or(item.started_at.as_ref(), &p.key("started_at"), now)?,
                    captured_at: ts_or(item.captured_at.as_ref(), &p.key("captured_at"), now)?,
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
