//! A frozen per-session snapshot of a user's adoption, and the input of the
//! session summary prompt built from it.

use serde::{Deserialize, Serialize};

use crate::Timestamp;

use super::codec::{
    Entries, Obj, Path, Raw, StrList, boolean, enum_field, fields, str_list, strs, ts, value,
};
use super::model::{JourneyState, Mastery, OrderedMap, UserAdoptionState, WorkflowProgress};
use super::ordered::OrderedValue as V;
use super::snapshot::{
    DecodeError, MasteryIn, WorkflowIn, decode_mastery, decode_progress, not_json, text_value,
    write_mastery, write_progress,
};

/// What the completion rate is measured against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum CompletionRateDenominator {
    /// Every catalog workflow (the default).
    #[default]
    AllCatalogWorkflows,
    /// The workflows assigned to the user.
    AssignedWorkflows,
}

impl CompletionRateDenominator {
    /// The wire value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AllCatalogWorkflows => "all_catalog_workflows",
            Self::AssignedWorkflows => "assigned_workflows",
        }
    }

    /// The wire value or the default.
    pub fn coerce(s: &str) -> Self {
        match s {
            "assigned_workflows" => Self::AssignedWorkflows,
            _ => Self::AllCatalogWorkflows,
        }
    }
}

/// One session's view of the user's adoption, captured at its end.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionSnapshot {
    /// The session.
    pub session_id: String,
    /// 1 for the first session.
    pub session_number: u64,
    /// The user.
    pub user_id: String,
    /// When the session started.
    pub started_at: Timestamp,
    /// When this was captured.
    pub captured_at: Timestamp,
    /// Seconds, rounded to hundredths.
    pub duration_s: f64,
    /// Journey at capture.
    pub journey_state: JourneyState,
    /// Mastery at capture.
    pub mastery: Mastery,
    /// Proactive messages so far.
    pub proactive_support_count: u64,
    /// Distinct features seen.
    pub distinct_features_seen: u64,
    /// Features discovered.
    pub discovered_features: Vec<String>,
    /// Onboarding was stamped complete.
    pub reached_onboarding_complete: bool,
    /// Completed catalog share, rounded to 4 places.
    pub completion_rate: f64,
    /// What the rate is measured against.
    pub completion_rate_denominator: CompletionRateDenominator,
    /// Catalog size.
    pub total_catalog_workflows: u64,
    /// Completed workflow ids (all of the user's).
    pub completed_workflow_ids: Vec<String>,
    /// In-progress workflow ids.
    pub in_progress_workflow_ids: Vec<String>,
    /// Catalog ids without any progress entry.
    pub untouched_workflow_ids: Vec<String>,
    /// Progress, copied.
    pub workflow_progress: OrderedMap<WorkflowProgress>,
    /// Persisted flag (the record is not enforced immutable).
    pub frozen: bool,
}

/// Python's `round(x, places)`: correctly rounded, ties to even on the exact
/// binary value (Rust's formatting rounds the same way).
pub(crate) fn round_places(x: f64, places: usize) -> f64 {
    format!("{x:.places$}").parse().unwrap_or(x)
}

impl SessionSnapshot {
    /// Captures `state` at `now`. Completed ids count only catalog workflows,
    /// so the rate never exceeds 1.
    #[allow(clippy::too_many_arguments)]
    pub fn from_adoption_state(
        state: &UserAdoptionState,
        session_id: &str,
        session_number: u64,
        started_at: Timestamp,
        catalog_workflow_ids: &[&str],
        denominator: CompletionRateDenominator,
        now: Timestamp,
    ) -> Self {
        let o = &state.onboarding;
        let completed: Vec<String> = o
            .completed_workflow_ids()
            .into_iter()
            .map(str::to_owned)
            .collect();
        let in_catalog = completed
            .iter()
            .filter(|id| catalog_workflow_ids.contains(&id.as_str()))
            .count();
        let total = catalog_workflow_ids.len();
        let completion_rate = if total == 0 {
            0.0
        } else {
            round_places(in_catalog as f64 / total as f64, 4)
        };
        SessionSnapshot {
            session_id: session_id.to_owned(),
            session_number,
            user_id: state.user_id.as_str().to_owned(),
            started_at,
            captured_at: now,
            duration_s: round_places(now.seconds_since(started_at).max(0.0), 2),
            journey_state: state.journey_state,
            mastery: state.mastery.clone(),
            proactive_support_count: o.proactive_support_count,
            distinct_features_seen: o.distinct_features_seen,
            discovered_features: state.discovered_features.clone(),
            reached_onboarding_complete: o.onboarding_completed_at.is_some(),
            completion_rate,
            completion_rate_denominator: denominator,
            total_catalog_workflows: u64::try_from(total).unwrap_or(u64::MAX),
            completed_workflow_ids: completed,
            in_progress_workflow_ids: o
                .in_progress_workflow_ids()
                .into_iter()
                .map(str::to_owned)
                .collect(),
            untouched_workflow_ids: catalog_workflow_ids
                .iter()
                .filter(|id| o.workflow_progress.get(id).is_none())
                .map(|s| (*s).to_owned())
                .collect(),
            workflow_progress: o.workflow_progress.clone(),
            frozen: true,
        }
    }

    /// The snapshot (the reference's key order).
    pub fn to_ordered_snapshot(&self) -> V {
        text_value(self.to_snapshot_string().as_bytes()).unwrap_or(V::Null)
    }

    /// The snapshot as a `serde_json::Value`, keys in the snapshot's order.
    pub fn to_snapshot(&self) -> serde_json::Value {
        text_value(self.to_snapshot_string().as_bytes()).unwrap_or_default()
    }

    /// The snapshot as JSON text, written straight from the snapshot.
    pub fn to_snapshot_string(&self) -> String {
        let mut out = Vec::with_capacity(1024);
        self.write_snapshot(&mut out);
        // serde_json writes UTF-8 only, and so do the fixed keys.
        String::from_utf8(out).unwrap_or_default()
    }

    /// Appends the snapshot as JSON text to `out`.
    pub fn write_snapshot(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"_v\":1,\"_frozen\":");
        value(out, &self.frozen);
        out.extend_from_slice(b",\"session_id\":");
        value(out, &self.session_id);
        out.extend_from_slice(b",\"session_number\":");
        value(out, &self.session_number);
        out.extend_from_slice(b",\"user_id\":");
        value(out, &self.user_id);
        out.extend_from_slice(b",\"started_at\":");
        ts(out, self.started_at);
        out.extend_from_slice(b",\"captured_at\":");
        ts(out, self.captured_at);
        out.extend_from_slice(b",\"duration_s\":");
        value(out, &self.duration_s);
        out.extend_from_slice(b",\"journey_state\":");
        value(out, self.journey_state.as_str());
        out.extend_from_slice(b",\"mastery\":");
        write_mastery(out, &self.mastery);
        out.extend_from_slice(b",\"proactive_support_count\":");
        value(out, &self.proactive_support_count);
        out.extend_from_slice(b",\"distinct_features_seen\":");
        value(out, &self.distinct_features_seen);
        out.extend_from_slice(b",\"discovered_features\":");
        strs(out, &self.discovered_features);
        out.extend_from_slice(b",\"reached_onboarding_complete\":");
        value(out, &self.reached_onboarding_complete);
        out.extend_from_slice(b",\"completion_rate\":");
        value(out, &self.completion_rate);
        out.extend_from_slice(b",\"completion_rate_denominator\":");
        value(out, self.completion_rate_denominator.as_str());
        out.extend_from_slice(b",\"total_catalog_workflows\":");
        value(out, &self.total_catalog_workflows);
        out.extend_from_slice(b",\"completed_workflow_ids\":");
        strs(out, &self.completed_workflow_ids);
        out.extend_from_slice(b",\"in_progress_workflow_ids\":");
        strs(out, &self.in_progress_workflow_ids);
        out.extend_from_slice(b",\"untouched_workflow_ids\":");
        strs(out, &self.untouched_workflow_ids);
        out.extend_from_slice(b",\"workflow_progress\":");
        write_progress(out, &self.workflow_progress);
        out.push(b'}');
    }

    /// Decodes snapshot text with no value tree in between (see
    /// [`SessionSnapshot::from_ordered_snapshot`] for the rules).
    pub fn from_snapshot_str(text: &str, now: Timestamp) -> Result<Self, DecodeError> {
        let doc: Obj<SnapIn<'_>> = serde_json::from_str(text).map_err(|e| not_json(&e))?;
        decode(doc, now)
    }

    /// Decodes a snapshot. The version must be 1; the rest is read as
    /// leniently as the reference reads this archival record: a field of the
    /// wrong type takes its default (numbers 0, times `now`, lists empty; a
    /// time outside years 1 to 9999 is `now` too), except that a non-object
    /// `mastery`, a list or object as the denominator, an empty id and a
    /// flag (`_frozen`, `reached_onboarding_complete`) that is neither a
    /// boolean nor `null` are rejected. `_frozen` is true when absent and
    /// false when `null`, as the reference reads it.
    pub fn from_ordered_snapshot(v: &V, now: Timestamp) -> Result<Self, DecodeError> {
        let doc = Obj::<SnapIn<'_>>::deserialize(v).map_err(|e| not_json(&e))?;
        decode(doc, now)
    }

    /// The input of the session summary prompt.
    pub fn summary_input(&self) -> SessionSummaryInput {
        SessionSummaryInput {
            session_number: self.session_number,
            duration_minutes: round_places(self.duration_s / 60.0, 1),
            journey_state: self.journey_state,
            mastery_level: self.mastery.level,
            mastery_rating: self.mastery.rating,
            reached_onboarding_complete: self.reached_onboarding_complete,
            completion_rate: self.completion_rate,
            completed_workflow_ids_json: python_json_list(&self.completed_workflow_ids),
            in_progress_workflow_ids_json: python_json_list(&self.in_progress_workflow_ids),
            untouched_workflow_ids_json: python_json_list(&self.untouched_workflow_ids),
            discovered_features_json: python_json_list(&self.discovered_features),
        }
    }
}

fields!(SnapIn {
    version: Raw<'de> = "_v",
    frozen: Raw<'de> = "_frozen",
    session_id: Raw<'de> = "session_id",
    session_number: Raw<'de> = "session_number",
    user_id: Raw<'de> = "user_id",
    started_at: Raw<'de> = "started_at",
    captured_at: Raw<'de> = "captured_at",
    duration_s: Raw<'de> = "duration_s",
    journey_state: Raw<'de> = "journey_state",
    mastery: Obj<MasteryIn<'de>> = "mastery",
    proactive_support_count: Raw<'de> = "proactive_support_count",
    distinct_features_seen: Raw<'de> = "distinct_features_seen",
    discovered_features: StrList = "discovered_features",
    reached_onboarding_complete: Raw<'de> = "reached_onboarding_complete",
    completion_rate: Raw<'de> = "completion_rate",
    completion_rate_denominator: Raw<'de> = "completion_rate_denominator",
    total_catalog_workflows: Raw<'de> = "total_catalog_workflows",
    completed_workflow_ids: StrList = "completed_workflow_ids",
    in_progress_workflow_ids: StrList = "in_progress_workflow_ids",
    untouched_workflow_ids: StrList = "untouched_workflow_ids",
    workflow_progress: Entries<'de, WorkflowIn<'de>> = "workflow_progress",
});

/// A required id: non-empty text.
fn required(v: Option<Raw<'_>>, path: &Path<'_>) -> Result<String, DecodeError> {
    match v {
        Some(Raw::String(s)) if !s.is_empty() => Ok(s.into_owned()),
        Some(Raw::String(_) | Raw::Null) | None => Err(path.err("must not be empty")),
        Some(other) => Err(path.wrong("a string", other.type_name())),
    }
}

/// Any number, else 0.
fn number(v: Option<&Raw<'_>>) -> f64 {
    match v {
        Some(Raw::Number(n)) => n.as_f64().unwrap_or(0.0),
        _ => 0.0,
    }
}

/// Any number truncated into `[0, 2^63 - 1]`, else 0.
fn lenient_count(v: Option<&Raw<'_>>) -> u64 {
    match v {
        Some(Raw::Number(n)) => {
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
    }
}

/// A timestamp, `now` for anything else or one out of range.
fn time(v: Option<&Raw<'_>>, now: Timestamp) -> Timestamp {
    match v {
        Some(Raw::Number(n)) => n
            .as_f64()
            .and_then(|x| Timestamp::from_epoch_seconds(x).ok())
            .unwrap_or(now),
        _ => now,
    }
}

/// A list of strings when it is a list, else empty.
fn list(v: Option<StrList>, path: &Path<'_>) -> Result<Vec<String>, DecodeError> {
    match v {
        Some(l @ StrList::List { .. }) => str_list(Some(l), path),
        _ => Ok(Vec::new()),
    }
}

/// Checks the fields read, in the order of the reference decoder: the first
/// error found is the one reported.
fn decode(doc: Obj<SnapIn<'_>>, now: Timestamp) -> Result<SessionSnapshot, DecodeError> {
    let root = Path::ROOT;
    let r = match doc {
        Obj::Fields { fields, .. } => fields,
        Obj::Other(s) => return Err(root.wrong("an object", s.name)),
    };
    match &r.version {
        Some(Raw::Number(n)) if n.as_u64() == Some(1) => {}
        _ => {
            return Err(root
                .key("_v")
                .err("unsupported or missing snapshot version"));
        }
    }
    let frozen = match &r.frozen {
        None => true,
        Some(Raw::Null) => false,
        other => boolean(other.as_ref(), &root.key("_frozen"))?,
    };
    let denominator = match &r.completion_rate_denominator {
        Some(x @ (Raw::Array { .. } | Raw::Object { .. })) => {
            return Err(root
                .key("completion_rate_denominator")
                .wrong("a string", x.type_name()));
        }
        other => enum_field(other.as_ref(), CompletionRateDenominator::coerce),
    };
    Ok(SessionSnapshot {
        session_id: required(r.session_id, &root.key("session_id"))?,
        session_number: lenient_count(r.session_number.as_ref()),
        user_id: required(r.user_id, &root.key("user_id"))?,
        started_at: time(r.started_at.as_ref(), now),
        captured_at: time(r.captured_at.as_ref(), now),
        duration_s: number(r.duration_s.as_ref()),
        journey_state: enum_field(r.journey_state.as_ref(), JourneyState::coerce),
        mastery: decode_mastery(r.mastery, &root.key("mastery"))?,
        proactive_support_count: lenient_count(r.proactive_support_count.as_ref()),
        distinct_features_seen: lenient_count(r.distinct_features_seen.as_ref()),
        discovered_features: list(r.discovered_features, &root.key("discovered_features"))?,
        reached_onboarding_complete: boolean(
            r.reached_onboarding_complete.as_ref(),
            &root.key("reached_onboarding_complete"),
        )?,
        completion_rate: number(r.completion_rate.as_ref()).clamp(0.0, 1.0),
        completion_rate_denominator: denominator,
        total_catalog_workflows: lenient_count(r.total_catalog_workflows.as_ref()),
        completed_workflow_ids: list(
            r.completed_workflow_ids,
            &root.key("completed_workflow_ids"),
        )?,
        in_progress_workflow_ids: list(
            r.in_progress_workflow_ids,
            &root.key("in_progress_workflow_ids"),
        )?,
        untouched_workflow_ids: list(
            r.untouched_workflow_ids,
            &root.key("untouched_workflow_ids"),
        )?,
        workflow_progress: decode_progress(
            r.workflow_progress,
            &root.key("workflow_progress"),
            now,
        )?,
        frozen,
    })
}

/// The facts the session summary prompt is given.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionSummaryInput {
    /// 1 for the first session.
    pub session_number: u64,
    /// Minutes, one decimal.
    pub duration_minutes: f64,
    /// Journey.
    pub journey_state: JourneyState,
    /// Level.
    pub mastery_level: super::model::MasteryLevel,
    /// Rating.
    pub mastery_rating: u8,
    /// Onboarding done.
    pub reached_onboarding_complete: bool,
    /// Completion rate.
    pub completion_rate: f64,
    /// JSON list text.
    pub completed_workflow_ids_json: String,
    /// JSON list text.
    pub in_progress_workflow_ids_json: String,
    /// JSON list text.
    pub untouched_workflow_ids_json: String,
    /// JSON list text.
    pub discovered_features_json: String,
}

impl SessionSummaryInput {
    /// Placeholder values for the `session_summary` prompt.
    pub fn prompt_values(&self) -> Vec<(&'static str, String)> {
        vec![
            ("session_number", self.session_number.to_string()),
            ("duration_minutes", format_float(self.duration_minutes)),
            ("journey_state", self.journey_state.as_str().to_owned()),
            ("mastery_level", self.mastery_level.as_str().to_owned()),
            ("mastery_rating", self.mastery_rating.to_string()),
            (
                "reached_onboarding_complete",
                self.reached_onboarding_complete.to_string(),
            ),
            ("completion_rate", format_float(self.completion_rate)),
            (
                "completed_workflow_ids_json",
                self.completed_workflow_ids_json.clone(),
            ),
            (
                "in_progress_workflow_ids_json",
                self.in_progress_workflow_ids_json.clone(),
            ),
            (
                "untouched_workflow_ids_json",
                self.untouched_workflow_ids_json.clone(),
            ),
            (
                "discovered_features_json",
                self.discovered_features_json.clone(),
            ),
        ]
    }
}

/// A float as Python prints it when it is integral (`0.0`), else shortest.
fn format_float(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e16 {
        format!("{x:.1}")
    } else {
        x.to_string()
    }
}

/// A list of strings as Python's default JSON encoder writes it: `", "`
/// between items, non-ASCII escaped as `\uXXXX`.
pub(crate) fn python_json_list(xs: &[String]) -> String {
    let items: Vec<String> = xs.iter().map(|x| ascii_json_string(x)).collect();
    format!("[{}]", items.join(", "))
}

fn ascii_json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(mutate: impl FnOnce(&mut serde_json::Value)) -> Result<SessionSnapshot, DecodeError> {
        let mut v = serde_json::json!({"_v": 1, "session_id": "s", "user_id": "u",
            "started_at": 100.0, "captured_at": 160.0});
        mutate(&mut v);
        SessionSnapshot::from_ordered_snapshot(
            &V::from(&v),
            Timestamp::from_epoch_seconds(500.0).unwrap(),
        )
    }

    #[test]
    fn frozen_flag_and_times_read_as_documented() {
        let frozen = |v: Option<serde_json::Value>| {
            decode(|s| {
                if let Some(v) = v {
                    s["_frozen"] = v;
                }
            })
            .map(|s| s.frozen)
        };
        assert_eq!(frozen(None), Ok(true));
        assert_eq!(frozen(Some(serde_json::Value::Null)), Ok(false));
        assert_eq!(frozen(Some(false.into())), Ok(false));
        for other in [
            serde_json::json!(0),
            serde_json::json!(1),
            serde_json::json!("yes"),
            serde_json::json!([]),
        ] {
            let e = frozen(Some(other.clone())).unwrap_err();
            assert!(e.to_string().starts_with("$._frozen"), "{other}: {e}");
        }
        // A time no timestamp holds reads as now; one in the future is kept.
        let s = decode(|s| s["started_at"] = 1e12.into()).unwrap();
        assert_eq!(s.started_at.as_epoch_seconds(), 500.0);
        let s = decode(|s| s["started_at"] = 900.0.into()).unwrap();
        assert_eq!(s.started_at.as_epoch_seconds(), 900.0);
    }

    #[test]
    fn rounds_like_python() {
        assert_eq!(round_places(0.005000114, 2), 0.01);
        assert_eq!(round_places(2.675, 2), 2.67);
        assert_eq!(round_places(0.125, 2), 0.12);
        assert_eq!(round_places(1.0 / 3.0, 4), 0.3333);
        assert_eq!(
            python_json_list(&["a".into(), "ü".into()]),
            "[\"a\", \"\\u00fc\"]"
        );
    }
}
