//! The activity detector: workflow and step completion inferred from an
//! activity stream by declarative rules.

use serde::{Deserialize, Serialize};

use super::model::OrderedMap;
use super::ordered::OrderedValue as V;
use super::plan::{OnboardingWorkflow, PlanError, PlanIssue};

/// One observed user action. Fields that are absent never match a rule.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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

/// The longest `canonical_url_glob` a plan may hold, in characters. Matching
/// takes time proportional to the pattern's length times the URL's; this
/// bounds the first factor (a URL glob is a path pattern, tens of
/// characters long).
pub const MAX_URL_GLOB_CHARS: usize = 1_024;

/// One rule: every set field must hold (AND), `min_count` matching actions
/// complete it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
    /// `canonical_url_glob`, compiled once when the rule is read.
    #[serde(skip)]
    url_glob: Option<UrlGlob>,
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
    /// A URL glob over [`MAX_URL_GLOB_CHARS`] is a plan error, and the rule
    /// is left out.
    pub(crate) fn from_value(
        v: &V,
        path: &str,
        issues: &mut Vec<PlanIssue>,
        errors: &mut Vec<PlanError>,
    ) -> Option<Self> {
        let field = |k: &str| match v.get(k) {
            Some(V::String(s)) if !s.trim().is_empty() => Some(s.trim().to_owned()),
            _ => None,
        };
        let canonical_url_glob = field("canonical_url_glob");
        let url_glob = match canonical_url_glob.as_deref().map(UrlGlob::new) {
            None => None,
            Some(Ok(glob)) => Some(glob),
            Some(Err(GlobError::TooLong { length, max })) => {
                errors.push(PlanError::GlobTooLong {
                    path: format!("{path}.canonical_url_glob"),
                    length,
                    max,
                });
                return None;
            }
        };
        let rule = ActivitySignalRule {
            event_type: field("event_type"),
            canonical_url_glob,
            canonical_url_prefix: field("canonical_url_prefix"),
            title_contains: field("title_contains"),
            kind: field("type"),
            min_count: at_least_one(v.get("min_count"), &format!("{path}.min_count"), issues),
            url_glob,
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
        if let Some(glob) = &self.url_glob {
            match &a.canonical_url {
                Some(url) if glob.is_match(url) => {}
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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
        errors: &mut Vec<PlanError>,
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
            if let Some(rule) = ActivitySignalRule::from_value(item, &p, issues, errors) {
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

/// Why a URL glob cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GlobError {
    /// Longer than [`MAX_URL_GLOB_CHARS`].
    #[error("the pattern is {length} characters long; at most {max}")]
    TooLong {
        /// The pattern's length, in characters.
        length: usize,
        /// The limit.
        max: usize,
    },
}

/// A shell-style URL pattern, as Python's `fnmatch.fnmatchcase`: `*` (any
/// run of characters, `/` included), `?` (one character), `[seq]`,
/// `[!seq]` (with ranges `a-z`; an unclosed `[` is a literal);
/// case-sensitive, no escapes.
///
/// Compiled once into a regular expression of the `regex` crate, whose
/// matching takes time linear in the URL's length for a given pattern
/// (never backtracking), so a rule is compiled when its plan is read and
/// matched against every action.
#[derive(Clone)]
pub struct UrlGlob {
    pattern: String,
    /// `None` when no text can match (a class whose every range is empty,
    /// or a pattern too large to compile).
    regex: Option<regex::Regex>,
}

impl UrlGlob {
    /// Compiles `pattern`.
    ///
    /// # Errors
    ///
    /// [`GlobError::TooLong`] over [`MAX_URL_GLOB_CHARS`] characters.
    pub fn new(pattern: &str) -> Result<Self, GlobError> {
        let length = pattern.chars().count();
        if length > MAX_URL_GLOB_CHARS {
            return Err(GlobError::TooLong {
                length,
                max: MAX_URL_GLOB_CHARS,
            });
        }
        Ok(Self::compile(pattern))
    }

    fn compile(pattern: &str) -> Self {
        let regex = translate(pattern).and_then(|re| regex::Regex::new(&re).ok());
        Self {
            pattern: pattern.to_owned(),
            regex,
        }
    }

    /// True when the whole of `text` matches.
    pub fn is_match(&self, text: &str) -> bool {
        self.regex.as_ref().is_some_and(|r| r.is_match(text))
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.pattern
    }
}

impl PartialEq for UrlGlob {
    fn eq(&self, other: &Self) -> bool {
        self.pattern == other.pattern
    }
}

impl Eq for UrlGlob {}

impl std::fmt::Debug for UrlGlob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("UrlGlob").field(&self.pattern).finish()
    }
}

/// Shell-style matching as Python's `fnmatch.fnmatchcase` (see [`UrlGlob`]),
/// compiling `pattern` for this one call and without the length limit; a
/// pattern too large to compile matches nothing. Rules compile their
/// pattern once instead.
pub fn fnmatch(pattern: &str, text: &str) -> bool {
    UrlGlob::compile(pattern).is_match(text)
}

/// The anchored regular expression for a shell-style pattern, or `None`
/// when nothing can match it.
fn translate(pattern: &str) -> Option<String> {
    let p: Vec<char> = pattern.chars().collect();
    let mut re = String::with_capacity(pattern.len() * 2 + 16);
    re.push_str(r"\A(?s:");
    let mut i = 0;
    while i < p.len() {
        match p[i] {
            '*' => {
                // A run of stars is one star.
                while i < p.len() && p[i] == '*' {
                    i += 1;
                }
                re.push_str(".*");
                continue;
            }
            '?' => re.push('.'),
            '[' => match parse_class(&p, i) {
                Some(class) => {
                    if class.ranges.is_empty() {
                        if !class.negated {
                            // Every range was empty: this position can
                            // match no character, so the pattern nothing.
                            return None;
                        }
                        re.push('.');
                    } else {
                        re.push('[');
                        if class.negated {
                            re.push('^');
                        }
                        for (lo, hi) in class.ranges {
                            push_class_char(&mut re, lo);
                            if lo != hi {
                                re.push('-');
                                push_class_char(&mut re, hi);
                            }
                        }
                        re.push(']');
                    }
                    i = class.next;
                    continue;
                }
                // An unclosed `[` is a literal.
                None => re.push_str(r"\["),
            },
            c => re.push_str(&regex::escape(c.encode_utf8(&mut [0; 4]))),
        }
        i += 1;
    }
    re.push_str(r")\z");
    Some(re)
}

/// A character class of a pattern: its (non-empty) ranges, whether it is
/// negated, and the index after its `]`.
struct Class {
    ranges: Vec<(char, char)>,
    negated: bool,
    next: usize,
}

/// Reads the class starting at `p[start] == '['`; `None` when it is
/// unclosed. A `]` right after `[` or `[!` is a member; `a-z` is a range
/// unless the `-` is followed by the closing `]`; a range whose ends are
/// reversed holds nothing.
fn parse_class(p: &[char], start: usize) -> Option<Class> {
    let mut i = start + 1;
    let negated = i < p.len() && p[i] == '!';
    if negated {
        i += 1;
    }
    let first = i;
    let mut ranges = Vec::new();
    loop {
        if i >= p.len() {
            return None;
        }
        if p[i] == ']' && i > first {
            break;
        }
        if i + 2 < p.len() && p[i + 1] == '-' && p[i + 2] != ']' {
            if p[i] <= p[i + 2] {
                ranges.push((p[i], p[i + 2]));
            }
            i += 3;
        } else {
            ranges.push((p[i], p[i]));
            i += 1;
        }
    }
    Some(Class {
        ranges,
        negated,
        next: i + 1,
    })
}

/// A class member as an escape (`\x{5D}`), which no class syntax can
/// misread.
fn push_class_char(re: &mut String, c: char) {
    re.push_str(&format!("\\x{{{:X}}}", u32::from(c)));
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

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

    #[test]
    fn fnmatch_edge_cases() {
        // One character is one code point; `*` and `?` cross `/` and `\n`.
        assert!(fnmatch("/caf?", "/caf\u{e9}"));
        assert!(fnmatch("/[\u{e9}\u{1F600}]", "/\u{1F600}"));
        assert!(fnmatch("a*b", "a/\n/b"));
        assert!(fnmatch("a?b", "a\nb"));
        // Regex syntax is literal text; so is a backslash.
        assert!(fnmatch("/a.b+(c)|{d}$^", "/a.b+(c)|{d}$^"));
        assert!(!fnmatch("/a.b", "/axb"));
        assert!(fnmatch("/a\\*", "/a\\xyz"));
        assert!(fnmatch("[\\]", "\\"));
        // Class syntax of the regex crate is literal inside a class.
        assert!(fnmatch("[[:alpha:]]", "[]"));
        assert!(fnmatch("[a&&b]", "&"));
        assert!(fnmatch("[^a]", "^"));
        assert!(!fnmatch("[^a]", "b"));
        assert!(fnmatch("[a-]", "-"));
        assert!(fnmatch("[!]]", "x"));
        assert!(!fnmatch("[!]]", "]"));
        // A reversed range holds nothing.
        assert!(!fnmatch("[z-a]", "m"));
        assert!(fnmatch("[!z-a]", "m"));
        assert!(fnmatch("[z-ax]", "x"));
        // Unclosed classes are literals.
        assert!(fnmatch("[!", "[!"));
        assert!(fnmatch("[a-", "[a-"));
        assert!(fnmatch("x[", "x["));
    }

    #[test]
    fn a_glob_over_the_limit_is_refused() {
        let at_limit = "a".repeat(MAX_URL_GLOB_CHARS);
        assert!(UrlGlob::new(&at_limit).is_ok());
        let over = "\u{e9}".repeat(MAX_URL_GLOB_CHARS + 1);
        assert_eq!(
            UrlGlob::new(&over).unwrap_err(),
            GlobError::TooLong {
                length: MAX_URL_GLOB_CHARS + 1,
                max: MAX_URL_GLOB_CHARS
            }
        );
    }

    #[test]
    fn a_plan_with_a_glob_over_the_limit_is_refused_naming_the_field() {
        use crate::adoption::{OnboardingPlan, PlanError};
        let long = format!("*{}b", "a".repeat(23_998));
        let raw = serde_json::json!([
            {"workflow_id": "w1", "steps": [
                {"step_id": "s1"},
                {"step_id": "s2", "activity_signals": {"any_of": [
                    {"canonical_url_glob": "/ok/*"},
                    {"canonical_url_glob": long}
                ]}}
            ]}
        ]);
        let load = OnboardingPlan::from_config(&raw);
        assert_eq!(
            load.errors,
            vec![PlanError::GlobTooLong {
                path: "$[0].steps[1].activity_signals.any_of[1].canonical_url_glob".into(),
                length: 24_000,
                max: MAX_URL_GLOB_CHARS,
            }]
        );
        // Read leniently anyway (a stored plan), the rule is left out rather
        // than matched.
        let signals = load.plan.workflows[0].steps[1].activity_signals.as_ref();
        assert_eq!(signals.map(|s| s.any_of.len()), Some(1));
        let at_limit = serde_json::json!([{"workflow_id": "w1", "activity_signals": {"any_of": [
            {"canonical_url_glob": "*".repeat(MAX_URL_GLOB_CHARS)}
        ]}}]);
        assert!(OnboardingPlan::from_config(&at_limit).errors.is_empty());
    }

    /// The worst case of a backtracking matcher (one star, then a long
    /// literal that fails at its last character against a long URL) at the
    /// longest pattern allowed: the old matcher made about pattern x URL
    /// steps; this one is linear in the URL. The bound is a latency
    /// requirement with a generous margin, not a benchmark.
    #[test]
    fn the_longest_glob_against_a_long_url_is_quick() {
        let url = "a".repeat(48_000);
        let worst = [
            format!("*{}b", "a".repeat(MAX_URL_GLOB_CHARS - 2)),
            "*a".repeat(MAX_URL_GLOB_CHARS / 2 - 1) + "*b",
            "*[a-z]?".repeat(MAX_URL_GLOB_CHARS / 7 - 1) + "b",
        ];
        for pattern in worst {
            assert!(pattern.chars().count() <= MAX_URL_GLOB_CHARS);
            let started = std::time::Instant::now();
            let glob = UrlGlob::new(&pattern).unwrap();
            assert!(!glob.is_match(&url));
            assert!(glob.is_match(&format!("{url}b")) || !pattern.starts_with("*a"));
            let took = started.elapsed();
            assert!(
                took < std::time::Duration::from_secs(2),
                "took {took:?} for a pattern of {} characters",
                pattern.len()
            );
        }
    }

    /// The matcher this one replaced (star backtracking, quadratic in the
    /// worst case), kept as the reference for its semantics.
    fn reference(pattern: &str, text: &str) -> bool {
        let p: Vec<char> = pattern.chars().collect();
        let t: Vec<char> = text.chars().collect();
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
                    '[' => match parse_class(&p, pi) {
                        Some(class) => {
                            let c = t[ti];
                            let inside = class.ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi);
                            if inside != class.negated {
                                pi = class.next;
                                ti += 1;
                                continue;
                            }
                        }
                        None if t[ti] == '[' => {
                            pi += 1;
                            ti += 1;
                            continue;
                        }
                        None => {}
                    },
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

    proptest! {
        #[test]
        fn matches_as_the_reference_did(
            p in "[ab/*?\\[\\]!\\-\\\\.^\u{e9}]{0,12}",
            t in "[ab/\\[\\]!\\-\\\\.^\u{e9}]{0,12}",
        ) {
            prop_assert_eq!(fnmatch(&p, &t), reference(&p, &t), "pattern {:?} text {:?}", p, t);
        }

        #[test]
        fn a_pattern_matches_itself_when_it_has_no_special_character(t in "\\PC{0,24}") {
            let literal: String = t.chars().filter(|c| !matches!(c, '*' | '?' | '[')).collect();
            prop_assert!(fnmatch(&literal, &literal));
        }
    }
}
