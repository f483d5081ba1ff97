//! Tour matching: the prompt input for a query and the validated answer.

use serde::{Deserialize, Serialize};

use super::model::one_line;
use super::ordered::OrderedValue as V;
use super::plan::PlanIssue;
use super::prompts::{ParseStatus, parse_json_object};

/// Related tours kept at most.
pub const MAX_RELATED_TOURS: usize = 3;

/// One tour of a product's catalog.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TourCatalogEntry {
    /// The tour (and workflow) id.
    pub tour_id: String,
    /// Display name.
    #[serde(default)]
    pub name: String,
    /// When to suggest it.
    #[serde(default)]
    pub use_when: String,
    /// The role it is for; `None` means every role, `""` only users without
    /// a role (as in the reference).
    #[serde(default)]
    pub role: Option<String>,
}

fn first_string(v: &V, keys: &[&str]) -> Option<String> {
    keys.iter().find_map(|k| match v.get(k) {
        Some(V::String(s)) if !s.is_empty() => Some(s.clone()),
        _ => None,
    })
}

impl TourCatalogEntry {
    /// Reads one entry: the id from `tour_id`, `user_tour_id` or `id`, the
    /// name from `name` or `user_tour_name`, `use_when` from `use_when` or
    /// `description`. `None` without a text id or with a non-text role.
    pub fn from_value(v: &V) -> Option<Self> {
        let tour_id = first_string(v, &["tour_id", "user_tour_id", "id"])?;
        let role = match v.get("role") {
            None | Some(V::Null) => None,
            Some(V::String(s)) => Some(s.clone()),
            Some(_) => return None,
        };
        Some(TourCatalogEntry {
            tour_id,
            name: first_string(v, &["name", "user_tour_name"]).unwrap_or_default(),
            use_when: first_string(v, &["use_when", "description"]).unwrap_or_default(),
            role,
        })
    }

    /// True when this tour is for `role` (trimmed, case-insensitive).
    pub fn visible_to(&self, role: Option<&str>) -> bool {
        match &self.role {
            None => true,
            Some(r) => r.trim().to_lowercase() == role.unwrap_or("").trim().to_lowercase(),
        }
    }
}

/// Reads a catalog leniently: entries without a text id (or with a non-text
/// role) are skipped and reported.
pub fn catalog_from_value(raw: &serde_json::Value) -> (Vec<TourCatalogEntry>, Vec<PlanIssue>) {
    let raw = V::from(raw);
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    match &raw {
        V::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                match TourCatalogEntry::from_value(item) {
                    Some(e) => out.push(e),
                    None => skipped.push(PlanIssue::new(
                        format!("$[{i}]"),
                        "no text tour id (or a non-text role), skipped",
                    )),
                }
            }
        }
        other => skipped.push(PlanIssue::new(
            "$",
            format!(
                "expected an array, found {}, empty catalog",
                other.type_name()
            ),
        )),
    }
    (out, skipped)
}

/// The catalog entries visible to `role`, in order.
pub fn filter_catalog<'a>(
    catalog: &'a [TourCatalogEntry],
    role: Option<&str>,
) -> Vec<&'a TourCatalogEntry> {
    catalog.iter().filter(|e| e.visible_to(role)).collect()
}

/// The values the tour-match prompt is rendered with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TourMatchInput {
    /// The user's question.
    pub user_query: String,
    /// Recent conversation, `(none)` when empty.
    pub conversation_history: String,
    /// The role, `unknown` when missing or empty.
    pub role: String,
    /// The page, `unknown` when missing or empty.
    pub current_page: String,
    /// One line per visible tour: `id :: name :: use_when`.
    pub tour_catalog_text: String,
    /// Ids the answer may use.
    pub allowed_tour_ids: Vec<String>,
}

/// Builds the tour-match prompt input from the role-filtered catalog. Each
/// catalog field is kept on one line (control characters become spaces).
pub fn build_tour_match_input(
    user_query: &str,
    conversation_history: &str,
    role: Option<&str>,
    current_page: Option<&str>,
    catalog: &[TourCatalogEntry],
) -> TourMatchInput {
    let visible = filter_catalog(catalog, role);
    let lines: Vec<String> = visible
        .iter()
        .map(|e| {
            let line = format!(
                "{} :: {} :: {}",
                one_line(&e.tour_id),
                one_line(&e.name),
                one_line(&e.use_when)
            );
            line.trim_end_matches([':', ' ']).to_owned()
        })
        .collect();
    let or = |x: Option<&str>, d: &str| match x {
        Some(s) if !s.is_empty() => s.to_owned(),
        _ => d.to_owned(),
    };
    TourMatchInput {
        user_query: user_query.to_owned(),
        conversation_history: or(Some(conversation_history), "(none)"),
        role: or(role, "unknown"),
        current_page: or(current_page, "unknown"),
        tour_catalog_text: if lines.is_empty() {
            "(no tours available)".to_owned()
        } else {
            lines.join("\n")
        },
        allowed_tour_ids: visible.iter().map(|e| e.tour_id.clone()).collect(),
    }
}

/// The validated tour-match answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TourMatchResult {
    /// How the raw answer parsed.
    pub status: ParseStatus,
    /// The best tour, only if visible to the role.
    pub primary_tour_id: Option<String>,
    /// Up to three other visible tours, deduplicated, primary excluded.
    pub related_tour_ids: Vec<String>,
    /// The model's one-sentence reason (empty when absent).
    pub reasoning: String,
    /// Ids the answer named that are not visible to the role (or beyond the
    /// cap), for logs.
    pub dropped_ids: Vec<String>,
}

/// Parses and validates a tour-match answer. Never fails: malformed output
/// gives an empty result with a non-`Parsed` status. Accepts JSON wrapped in
/// Markdown fences.
pub fn parse_tour_match_output(
    raw: Option<&str>,
    catalog: &[TourCatalogEntry],
    role: Option<&str>,
) -> TourMatchResult {
    let mut result = TourMatchResult {
        status: ParseStatus::Parsed,
        primary_tour_id: None,
        related_tour_ids: Vec::new(),
        reasoning: String::new(),
        dropped_ids: Vec::new(),
    };
    let obj = match parse_json_object(raw) {
        Ok(o) => o,
        Err(status) => {
            result.status = status;
            return result;
        }
    };
    let allowed: Vec<&str> = filter_catalog(catalog, role)
        .iter()
        .map(|e| e.tour_id.as_str())
        .collect();
    match obj.get("primary_tour_id") {
        Some(serde_json::Value::String(id)) if !id.is_empty() => {
            if allowed.contains(&id.as_str()) {
                result.primary_tour_id = Some(id.clone());
            } else {
                result.dropped_ids.push(id.clone());
            }
        }
        _ => {}
    }
    if let Some(serde_json::Value::Array(items)) = obj.get("related_tour_ids") {
        for item in items {
            let Some(id) = item.as_str() else { continue };
            if result.primary_tour_id.as_deref() == Some(id)
                || result.related_tour_ids.iter().any(|x| x == id)
            {
                continue;
            }
            if allowed.contains(&id) && result.related_tour_ids.len() < MAX_RELATED_TOURS {
                result.related_tour_ids.push(id.to_owned());
            } else {
                result.dropped_ids.push(id.to_owned());
            }
        }
    }
    if let Some(serde_json::Value::String(r)) = obj.get("reasoning") {
        result.reasoning = r.clone();
    }
    result
}
