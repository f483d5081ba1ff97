//! The activity detector: workflow and step completion inferred from an
//! activity stream by declarative rules.

use serde::{Deserialize, Serialize};

use super::model::OrderedMap;
use super::ordered::OrderedValue as V;
use super::plan::{OnboardingWorkflow, PlanIssue};

/// One observed user action. Fields that are absent never match a rule.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Activity {
    /// Event type, e.g. `$pageview`.
    pub event_type: Option<String>,
    /// Action type, e.g. `click`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// Canonical URL path.
    pub canonical_url: Option<String>,
    /// Page or element title.
    pub title: Option<String>,
}

/// One rule: every set field must hold (AND), `min_count` matching actions
/// complete it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ActivitySignalRule {
    /// Exact event type (or the action's type when it has no event type).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_type: Option<String>,
    /// Shell-style URL glob (`*`, `?`, `[...]`; `*` also crosses `/`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub canonical_url_glob: Option<String>,
    /// URL prefix (case-sensitive).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub canonical_url_prefix: Option<String>,
    /// Case-insensitive title substring.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title_contains: Option<String>,
    /// Case-insensitive action type.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Matching actions needed, at least 1.
    #[serde(skip_serializing_if = "is_one")]
    pub min_count: u32,
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

/// Reads a "count at least 1" config value: integral numbers (below 1 read
/// as 1); anything else reads as 1 and is reported.
fn at_least_one(v: Option<&V>, path: &str, issues: &mut Vec<PlanIssue>) -> u32 {
    match v {
        None | Some(V::Null) => 1,
        Some(V::Number(n)) => {
            if let Some(u) = n.as_u64() {
                return u32::try_from(u).unwrap_or(u32::MAX).max(1);
            }
            if n.as_i64().is_some() {
                return 1;
            }
            let x = n.as_f64().unwrap_or(0.0);
            if x.fract() == 0.0 && x.is_finite() {
                if x < 1.0 {
                    return 1;
                }
                return if x > f64::from(u32::MAX) {
                    u32::MAX
                } else {
                    x as u32
                };
            }
            issues.push(PlanIssue::new(path, "not an integer, read as 1"));
            1
        }
        Some(other) => {
            issues.push(PlanIssue::new(
                path,
                format!(
                    "expected an integer, found {}, read as 1",
                    other.type_name()
                ),
            ));
            1
        }
    }
}

impl ActivitySignalRule {
    /// Parses a rule; `None` (reported) when no matchable field is set.
    pub(crate) fn from_value(v: &V, path: &str, issues: &mut Vec<PlanIssue>) -> Option<Self> {
        let field = |k: &str| match v.get(k) {
            Some(V::String(s)) if !s.trim().is_empty() => Some(s.trim().to_owned()),
            _ => None,
        };
        let rule = ActivitySignalRule {
            event_type: field("event_type"),
            canonical_url_glob: field("canonical_url_glob"),
            canonical_url_prefix: field("canonical_url_prefix"),
            title_contains: field("title_contains"),
            kind: field("type"),
            min_count: at_least_one(v.get("min_count"), &format!("{path}.min_count"), issues),
        };
        if rule.event_type.is_none()
            && rule.canonical_url_glob.is_none()
            && rule.canonical_url_prefix.is_none()
            && rule.title_contains.is_none()
            && rule.kind.is_none()
        {
            issues.push(PlanIssue::new(path, "rule has no matchable field, skipped"));
            return None;
        }
        Some(rule)
    }

    /// True when every set field holds for `a`.
    pub fn matches(&self, a: &Activity) -> bool {
        if let Some(want) = &self.event_type {
            let got = match a.event_type.as_deref() {
                Some(e) if !e.is_empty() => Some(e),
                _ => a.kind.as_deref(),
            };
            if got != Some(want.as_str()) {
                return false;
            }
        }
        if let Some(glob) = &self.canonical_url_glob {
            match &a.canonical_url {
                Some(url) if fnmatch(glob, url) => {}
                _ => return false,
            }
        }
        if let Some(prefix) = &self.canonical_url_prefix {
            match &a.canonical_url {
                Some(url) if url.starts_with(prefix.as_str()) => {}
                _ => return false,
            }
        }
        if let Some(needle) = &self.title_contains {
            match &a.title {
                Some(t) if t.to_lowercase().contains(&needle.to_lowercase()) => {}
                _ => return false,
            }
        }
        if let Some(kind) = &self.kind {
            match &a.kind {
                Some(k) if k.to_lowercase() == kind.to_lowercase() => {}
                _ => return false,
            }
        }
        true
    }

    /// A short description: `event=..,url~..,url^..,title~..,type=..,xN`.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        if let Some(v) = &self.event_type {
            parts.push(format!("event={v}"));
        }
        if let Some(v) = &self.canonical_url_glob {
            parts.push(format!("url~{v}"));
        }
        if let Some(v) = &self.canonical_url_prefix {
            parts.push(format!("url^{v}"));
        }
        if let Some(v) = &self.title_contains {
            parts.push(format!("title~{v}"));
        }
        if let Some(v) = &self.kind {
            parts.push(format!("type={v}"));
        }
        if self.min_count != 1 {
            parts.push(format!("x{}", self.min_count));
        }
        if parts.is_empty() {
            "<empty>".to_owned()
        } else {
            parts.join(",")
        }
    }
}

/// Rules any one of which completes a workflow or step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ActivitySignals {
    /// Rules, in order; the first to reach its count wins.
    pub any_of: Vec<ActivitySignalRule>,
    /// Parsed and kept; not used by detection (as in the reference).
    #[serde(skip_serializing_if = "is_one")]
    pub completion_threshold: u32,
}

impl ActivitySignals {
    /// Parses a signal block; `None` when absent or when no rule is usable
    /// (reported).
    pub(crate) fn from_value(
        v: Option<&V>,
        path: &str,
        issues: &mut Vec<PlanIssue>,
    ) -> Option<Self> {
        let v = match v {
            None | Some(V::Null) => return None,
            Some(o @ V::Object(_)) => o,
            Some(other) => {
                issues.push(PlanIssue::new(
                    path,
                    format!("expected an object, found {}, ignored", other.type_name()),
                ));
                return None;
            }
        };
        let items = match v.get("any_of") {
            Some(V::Array(items)) if !items.is_empty() => items,
            _ => {
                issues.push(PlanIssue::new(
                    format!("{path}.any_of"),
                    "expected a non-empty array, signals ignored",
                ));
                return None;
            }
        };
        let mut any_of = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let p = format!("{path}.any_of[{i}]");
            if !matches!(item, V::Object(_)) {
                issues.push(PlanIssue::new(&p, "not an object, skipped"));
                continue;
            }
            if let Some(rule) = ActivitySignalRule::from_value(item, &p, issues) {
                any_of.push(rule);
            }
        }
        if any_of.is_empty() {
            issues.push(PlanIssue::new(path, "no usable rule, signals ignored"));
            return None;
        }
        let completion_threshold = at_least_one(
            v.get("completion_threshold"),
            &format!("{path}.completion_threshold"),
            issues,
        );
        Some(ActivitySignals {
            any_of,
            completion_threshold,
        })
    }

    /// The first rule that at least `min_count` actions match.
    pub fn first_match(&self, actions: &[Activity]) -> Option<&ActivitySignalRule> {
        self.any_of.iter().find(|rule| {
            let need = rule.min_count as usize;
            actions
                .iter()
                .filter(|a| rule.matches(a))
                .take(need)
                .count()
                >= need
        })
    }
}

/// A detected completion.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SignalMatch {
    /// The rule that fired.
    pub rule: ActivitySignalRule,
    /// Matching actions counted (counting stops at the rule's `min_count`).
    pub match_count: u32,
    /// Rules that fired (the first match wins, so always 1).
    pub rules_fired: u32,
    /// `activity_signal[<summary>] matched x<count>`.
    pub evidence: String,
}

fn signal_match(rule: &ActivitySignalRule) -> SignalMatch {
    SignalMatch {
        rule: rule.clone(),
        match_count: rule.min_count,
        rules_fired: 1,
        evidence: format!(
            "activity_signal[{}] matched x{}",
            rule.summary(),
            rule.min_count
        ),
    }
}

/// Workflows (with signals, not already completed) whose signals the actions
/// satisfy, keyed by workflow id in plan order.
pub fn detect_completed_workflows(
    workflows: &[OnboardingWorkflow],
    actions: &[Activity],
    already_completed: &[&str],
) -> OrderedMap<SignalMatch> {
    let mut out = OrderedMap::new();
    if actions.is_empty() {
        return out;
    }
    let done: Vec<&str> = already_completed.iter().map(|s| s.trim()).collect();
    for w in workflows {
        if w.workflow_id.is_empty() || done.contains(&w.workflow_id.as_str()) {
            continue;
        }
        if let Some(rule) = w
            .activity_signals
            .as_ref()
            .and_then(|s| s.first_match(actions))
        {
            out.insert(w.workflow_id.clone(), signal_match(rule));
        }
    }
    out
}

/// Steps of one workflow (with signals, not already completed) whose signals
/// the actions satisfy, keyed by step id in declared order.
pub fn detect_completed_steps(
    workflow: &OnboardingWorkflow,
    actions: &[Activity],
    already_completed: &[&str],
) -> OrderedMap<SignalMatch> {
    let mut out = OrderedMap::new();
    if actions.is_empty() {
        return out;
    }
    let done: Vec<&str> = already_completed.iter().map(|s| s.trim()).collect();
    for step in &workflow.steps {
        if step.step_id.is_empty() || done.contains(&step.step_id.as_str()) {
            continue;
        }
        if let Some(rule) = step
            .activity_signals
            .as_ref()
            .and_then(|s| s.first_match(actions))
        {
            out.insert(step.step_id.clone(), signal_match(rule));
        }
    }
    out
}

/// Shell-style matching as Python's `fnmatch.fnmatchcase`: `*` (crossing
/// `/`), `?`, `[seq]`, `[!seq]`; case-sensitive.
pub fn fnmatch(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    // Iterative matcher with star backtracking.
    let (mut pi, mut ti) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() {
            match p[pi] {
                '*' => {
                    star = Some((pi, ti));
                    pi += 1;
                    continue;
                }
                '?' => {
                    pi += 1;
                    ti += 1;
                    continue;
                }
                '[' => {
                    if let Some((matched, next)) = class_match(&p, pi, t[ti]) {
                        if matched {
                            pi = next;
                            ti += 1;
                            continue;
                        }
                    } else if t[ti] == '[' {
                        // An unclosed `[` is a literal.
                        pi += 1;
                        ti += 1;
                        continue;
                    }
                }
                c if c == t[ti] => {
                    pi += 1;
                    ti += 1;
                    continue;
                }
                _ => {}
            }
        }
        match star {
            Some((sp, st)) => {
                pi = sp + 1;
                ti = st + 1;
                star = Some((sp, st + 1));
            }
            None => return false,
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Matches `c` against the class starting at `p[start] == '['`; returns
/// `(matched, index after the class)`, or `None` when the class is unclosed.
fn class_match(p: &[char], start: usize, c: char) -> Option<(bool, usize)> {
    let mut i = start + 1;
    let negate = i < p.len() && p[i] == '!';
    if negate {
        i += 1;
    }
    let first = i;
    let mut matched = false;
    loop {
        if i >= p.len() {
            return None;
        }
        if p[i] == ']' && i > first {
            break;
        }
        if i + 2 < p.len() && p[i + 1] == '-' && p[i + 2] != ']' {
            if p[i] <= c && c <= p[i + 2] {
                matched = true;
            }
            i += 3;
        } else {
            if p[i] == c {
                matched = true;
            }
            i += 1;
        }
    }
    Some((matched != negate, i + 1))
}

#[cfg(test)]
mod tests {
    use super::fnmatch;

    #[test]
    fn fnmatch_like_python() {
        assert!(fnmatch("/projects/*", "/projects/1/edit"));
        assert!(fnmatch("*report*", "/reports/q1-report"));
        assert!(!fnmatch("/projects/*", "/project"));
        assert!(fnmatch("/a/?", "/a/c"));
        assert!(fnmatch("/a/[bc]", "/a/c"));
        assert!(!fnmatch("/a/[!bc]", "/a/c"));
        assert!(fnmatch("/a/[a-z]x", "/a/qx"));
        assert!(fnmatch("[", "["));
        assert!(fnmatch("[]]", "]"));
        assert!(!fnmatch("abc", "ABC"));
        assert!(fnmatch("", ""));
        assert!(fnmatch("**", ""));
    }
}
