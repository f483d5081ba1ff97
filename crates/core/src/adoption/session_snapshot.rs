//! A frozen per-session snapshot of a user's adoption, and the input of the
//! session summary prompt built from it.

use serde::Serialize;

use crate::Timestamp;

use super::model::{JourneyState, Mastery, OrderedMap, UserAdoptionState, WorkflowProgress};
use super::ordered::OrderedValue as V;
use super::snapshot::{
    DecodeError, boolean, decode_mastery, decode_progress, enum_field, err, mastery_value,
    progress_value, str_list, wrong,
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
pub fn round_places(x: f64, places: usize) -> f64 {
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
        let num = |x: f64| serde_json::Number::from_f64(x).map_or(V::Null, V::Number);
        let strs = |xs: &[String]| V::Array(xs.iter().map(|x| V::String(x.clone())).collect());
        let pairs: Vec<(&str, V)> = vec![
            ("_v", V::Number(1.into())),
            ("_frozen", V::Bool(self.frozen)),
            ("session_id", V::String(self.session_id.clone())),
            ("session_number", V::Number(self.session_number.into())),
            ("user_id", V::String(self.user_id.clone())),
            ("started_at", num(self.started_at.as_epoch_seconds())),
            ("captured_at", num(self.captured_at.as_epoch_seconds())),
            ("duration_s", num(self.duration_s)),
            (
                "journey_state",
                V::String(self.journey_state.as_str().to_owned()),
            ),
            ("mastery", mastery_value(&self.mastery)),
            (
                "proactive_support_count",
                V::Number(self.proactive_support_count.into()),
            ),
            (
                "distinct_features_seen",
                V::Number(self.distinct_features_seen.into()),
            ),
            ("discovered_features", strs(&self.discovered_features)),
            (
                "reached_onboarding_complete",
                V::Bool(self.reached_onboarding_complete),
            ),
            ("completion_rate", num(self.completion_rate)),
            (
                "completion_rate_denominator",
                V::String(self.completion_rate_denominator.as_str().to_owned()),
            ),
            (
                "total_catalog_workflows",
                V::Number(self.total_catalog_workflows.into()),
            ),
            ("completed_workflow_ids", strs(&self.completed_workflow_ids)),
            (
                "in_progress_workflow_ids",
                strs(&self.in_progress_workflow_ids),
            ),
            ("untouched_workflow_ids", strs(&self.untouched_workflow_ids)),
            ("workflow_progress", progress_value(&self.workflow_progress)),
        ];
        V::Object(pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
    }

    /// The snapshot as a `serde_json::Value`.
    pub fn to_snapshot(&self) -> serde_json::Value {
        (&self.to_ordered_snapshot()).into()
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
            workflow_progress: decode_progress(
                v.get("workflow_progress"),
                "$.workflow_progress",
                now,
            )?,
            frozen,
        })
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
pub fn python_json_list(xs: &[String]) -> String {
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
