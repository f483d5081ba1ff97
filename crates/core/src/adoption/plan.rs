//! Onboarding plans: the workflows a product wants its users (per role) to
//! complete, loaded leniently from configuration.

use serde::Serialize;

use super::detector::ActivitySignals;
use super::model::{OrderedMap, WorkflowProgress, WorkflowStatus};
use super::ordered::OrderedValue as V;

/// Something the lenient loader skipped or read differently, with where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PlanIssue {
    /// Where, e.g. `$[2].steps[0].step_id`.
    pub path: String,
    /// What happened, lowercase.
    pub problem: String,
}

impl PlanIssue {
    pub(crate) fn new(path: impl Into<String>, problem: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            problem: problem.into(),
        }
    }
}

/// A plan that cannot work as configured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum PlanError {
    /// Prerequisites form a cycle: none of these can ever become eligible.
    #[error("prerequisite cycle: {}", workflow_ids.join(" -> "))]
    PrerequisiteCycle {
        /// The cycle, first id repeated at the end.
        workflow_ids: Vec<String>,
    },
    /// A `canonical_url_glob` over the length limit
    /// ([`MAX_URL_GLOB_CHARS`](super::detector::MAX_URL_GLOB_CHARS)); its
    /// rule is left out of the plan.
    #[error("{path} is {length} characters long; at most {max}")]
    GlobTooLong {
        /// Where, e.g. `$[0].activity_signals.any_of[1].canonical_url_glob`.
        path: String,
        /// The pattern's length, in characters.
        length: usize,
        /// The limit.
        max: usize,
    },
    /// A prerequisite names no workflow of the plan.
    #[error("workflow {workflow_id} requires unknown workflow {prerequisite}")]
    UnknownPrerequisite {
        /// The workflow.
        workflow_id: String,
        /// The missing prerequisite.
        prerequisite: String,
    },
}

/// One step of a workflow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkflowStep {
    /// Unique within the workflow.
    pub step_id: String,
    /// Display name.
    pub name: String,
    /// Description.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// Whether the step counts toward completion. The configuration form
    /// writes `required: false` for an optional step and leaves the key out
    /// for a required one, as the reference does.
    #[serde(skip_serializing_if = "is_true")]
    pub required: bool,
    /// Detection rules.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub activity_signals: Option<ActivitySignals>,
}

fn is_true(b: &bool) -> bool {
    *b
}

/// One workflow of the plan (its id lines up with a tour id).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OnboardingWorkflow {
    /// Unique within the plan.
    pub workflow_id: String,
    /// Display name.
    pub name: String,
    /// Description.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// Why it matters.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub why: String,
    /// The role it is for (trimmed); `None` means every role.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// Steps, declared order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<WorkflowStep>,
    /// Workflows to complete first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub prerequisite_workflow_ids: Vec<String>,
    /// Detection rules.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub activity_signals: Option<ActivitySignals>,
}

impl OnboardingWorkflow {
    /// Ids of required steps, declared order.
    pub fn required_step_ids(&self) -> Vec<&str> {
        self.steps
            .iter()
            .filter(|s| s.required)
            .map(|s| s.step_id.as_str())
            .collect()
    }

    /// The compact configuration form (what `from_config` reads).
    pub fn to_config(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
}

/// The result of lenient loading: the plan, what was skipped, and the plan
/// errors (URL globs over the length limit, prerequisite cycles, unknown
/// prerequisites).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanLoad {
    /// The usable plan.
    pub plan: OnboardingPlan,
    /// Entries and fields skipped or read as defaults, with their paths.
    pub skipped: Vec<PlanIssue>,
    /// Structural errors of the loaded plan.
    pub errors: Vec<PlanError>,
}

/// The workflows a product wants its users to complete, in order.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(transparent)]
pub struct OnboardingPlan {
    /// Workflows, declared order, ids unique.
    pub workflows: Vec<OnboardingWorkflow>,
}

fn opt_text(v: Option<&V>, path: &str, issues: &mut Vec<PlanIssue>) -> String {
    match v {
        None | Some(V::Null) => String::new(),
        Some(V::String(s)) => s.clone(),
        Some(other) => {
            issues.push(PlanIssue::new(
                path,
                format!("expected a string, found {}, ignored", other.type_name()),
            ));
            String::new()
        }
    }
}

/// Whether a step is required, from its `required` value.
///
/// An absent key means required; `true` and `false` are themselves. Any
/// other value is read as the reference reads it, by its truth value (not
/// required when it is `null`, `0`, `""`, `[]` or `{}`; required otherwise,
/// `"false"` included), and reported. Reading `null` or `0` as required
/// would turn a step the configuration made optional into a required one,
/// and the normalised plan would no longer say `required: false`.
fn step_required(v: Option<&V>, path: &str, issues: &mut Vec<PlanIssue>) -> bool {
    let value = match v {
        None => return true,
        Some(V::Bool(b)) => return *b,
        Some(value) => value,
    };
    let required = match value {
        V::Null => false,
        V::Number(n) => n.as_f64().is_none_or(|x| x != 0.0),
        V::String(s) => !s.is_empty(),
        V::Array(items) => !items.is_empty(),
        V::Object(pairs) => !pairs.is_empty(),
        V::Bool(b) => *b,
    };
    issues.push(PlanIssue::new(
        path,
        format!(
            "expected a boolean, found {}, read as {required}",
            value.type_name()
        ),
    ));
    required
}

fn parse_step(
    v: &V,
    path: &str,
    issues: &mut Vec<PlanIssue>,
    errors: &mut Vec<PlanError>,
) -> Option<WorkflowStep> {
    let step_id = match v.get("step_id") {
        Some(V::String(s)) if !s.is_empty() => s.clone(),
        _ => {
            issues.push(PlanIssue::new(
                format!("{path}.step_id"),
                "missing or not a non-empty string, step skipped",
            ));
            return None;
        }
    };
    Some(WorkflowStep {
        step_id,
        name: opt_text(v.get("name"), &format!("{path}.name"), issues),
        description: opt_text(v.get("description"), &format!("{path}.description"), issues),
        required: step_required(v.get("required"), &format!("{path}.required"), issues),
        activity_signals: ActivitySignals::from_value(
            v.get("activity_signals"),
            &format!("{path}.activity_signals"),
            issues,
            errors,
        ),
    })
}

fn parse_workflow(
    v: &V,
    path: &str,
    issues: &mut Vec<PlanIssue>,
    errors: &mut Vec<PlanError>,
) -> Option<OnboardingWorkflow> {
    let workflow_id = match v.get("workflow_id") {
        Some(V::String(s)) if !s.is_empty() => s.clone(),
        _ => {
            issues.push(PlanIssue::new(
                format!("{path}.workflow_id"),
                "missing or not a non-empty string, workflow skipped",
            ));
            return None;
        }
    };
    let role = match v.get("role") {
        None | Some(V::Null) => None,
        Some(V::String(s)) => Some(s.trim().to_owned()).filter(|r| !r.is_empty()),
        Some(other) => {
            // Reading it as "every role" would widen who sees the workflow.
            issues.push(PlanIssue::new(
                format!("{path}.role"),
                format!(
                    "expected a string, found {}, workflow skipped",
                    other.type_name()
                ),
            ));
            return None;
        }
    };
    let mut prerequisite_workflow_ids = Vec::new();
    match v.get("prerequisite_workflow_ids") {
        None | Some(V::Null) => {}
        Some(V::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                match item {
                    V::String(s) if !s.trim().is_empty() => {
                        prerequisite_workflow_ids.push(s.trim().to_owned())
                    }
                    V::String(_) => {}
                    other => issues.push(PlanIssue::new(
                        format!("{path}.prerequisite_workflow_ids[{i}]"),
                        format!("expected a string, found {}, skipped", other.type_name()),
                    )),
                }
            }
        }
        Some(other) => issues.push(PlanIssue::new(
            format!("{path}.prerequisite_workflow_ids"),
            format!("expected an array, found {}, ignored", other.type_name()),
        )),
    }
    let mut steps: Vec<WorkflowStep> = Vec::new();
    match v.get("steps") {
        None | Some(V::Null) => {}
        Some(V::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                let p = format!("{path}.steps[{i}]");
                if !matches!(item, V::Object(_)) {
                    issues.push(PlanIssue::new(&p, "not an object, skipped"));
                    continue;
                }
                if let Some(step) = parse_step(item, &p, issues, errors) {
                    if steps.iter().any(|s| s.step_id == step.step_id) {
                        issues.push(PlanIssue::new(
                            format!("{p}.step_id"),
                            format!("duplicate step id {:?}, skipped", step.step_id),
                        ));
                        continue;
                    }
                    steps.push(step);
                }
            }
        }
        Some(other) => issues.push(PlanIssue::new(
            format!("{path}.steps"),
            format!("expected an array, found {}, ignored", other.type_name()),
        )),
    }
    Some(OnboardingWorkflow {
        name: opt_text(v.get("name"), &format!("{path}.name"), issues),
        description: opt_text(v.get("description"), &format!("{path}.description"), issues),
        why: opt_text(v.get("why"), &format!("{path}.why"), issues),
        workflow_id,
        role,
        steps,
        prerequisite_workflow_ids,
        activity_signals: ActivitySignals::from_value(
            v.get("activity_signals"),
            &format!("{path}.activity_signals"),
            issues,
            errors,
        ),
    })
}

fn norm_role(r: &str) -> String {
    r.trim().to_lowercase()
}

impl OnboardingPlan {
    /// Loads a plan from configuration, never failing: entries that cannot
    /// be used are skipped and reported; duplicate workflow and step ids keep
    /// the first; prerequisite problems are reported as errors.
    pub fn from_config(raw: &serde_json::Value) -> PlanLoad {
        Self::from_ordered_config(&V::from(raw))
    }

    /// [`Self::from_config`] on an ordered value.
    pub fn from_ordered_config(raw: &V) -> PlanLoad {
        let mut skipped = Vec::new();
        let mut errors = Vec::new();
        let mut workflows: Vec<OnboardingWorkflow> = Vec::new();
        match raw {
            V::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    let p = format!("$[{i}]");
                    if !matches!(item, V::Object(_)) {
                        skipped.push(PlanIssue::new(&p, "not an object, skipped"));
                        continue;
                    }
                    if let Some(w) = parse_workflow(item, &p, &mut skipped, &mut errors) {
                        if workflows.iter().any(|x| x.workflow_id == w.workflow_id) {
                            skipped.push(PlanIssue::new(
                                format!("{p}.workflow_id"),
                                format!("duplicate workflow id {:?}, skipped", w.workflow_id),
                            ));
                            continue;
                        }
                        workflows.push(w);
                    }
                }
            }
            other => skipped.push(PlanIssue::new(
                "$",
                format!("expected an array, found {}, empty plan", other.type_name()),
            )),
        }
        let plan = OnboardingPlan { workflows };
        errors.extend(plan.check());
        PlanLoad {
            plan,
            skipped,
            errors,
        }
    }

    /// Workflow ids, declared order.
    pub fn workflow_ids(&self) -> Vec<&str> {
        self.workflows
            .iter()
            .map(|w| w.workflow_id.as_str())
            .collect()
    }

    /// The workflow with `id`.
    pub fn get(&self, id: &str) -> Option<&OnboardingWorkflow> {
        self.workflows.iter().find(|w| w.workflow_id == id)
    }

    /// The compact configuration form.
    pub fn to_config(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }

    /// The workflows for `role`: those without a role, and those whose role
    /// equals it trimmed and case-insensitively. A missing role keeps only
    /// role-less workflows.
    pub fn for_role(&self, role: Option<&str>) -> OnboardingPlan {
        let want = norm_role(role.unwrap_or(""));
        OnboardingPlan {
            workflows: self
                .workflows
                .iter()
                .filter(|w| w.role.as_deref().is_none_or(|r| norm_role(r) == want))
                .cloned()
                .collect(),
        }
    }

    /// Workflows not completed whose every prerequisite is, in plan order.
    /// Completed ids are trimmed; blanks ignored.
    pub fn next_eligible_workflows(&self, completed_ids: &[&str]) -> Vec<&OnboardingWorkflow> {
        let done: Vec<&str> = completed_ids
            .iter()
            .map(|s| s.trim())
            .filter(|s| !s.is_empty())
            .collect();
        self.workflows
            .iter()
            .filter(|w| !done.contains(&w.workflow_id.as_str()))
            .filter(|w| {
                w.prerequisite_workflow_ids
                    .iter()
                    .all(|p| done.contains(&p.as_str()))
            })
            .collect()
    }

    /// Unknown prerequisites and prerequisite cycles (each cycle once).
    pub fn check(&self) -> Vec<PlanError> {
        let mut errors = Vec::new();
        for w in &self.workflows {
            for p in &w.prerequisite_workflow_ids {
                if self.get(p).is_none() {
                    errors.push(PlanError::UnknownPrerequisite {
                        workflow_id: w.workflow_id.clone(),
                        prerequisite: p.clone(),
                    });
                }
            }
        }
        // Depth-first search with colours; a back edge closes a cycle.
        let n = self.workflows.len();
        let mut colour = vec![0u8; n];
        let index = |id: &str| self.workflows.iter().position(|w| w.workflow_id == id);
        for start in 0..n {
            if colour[start] != 0 {
                continue;
            }
            let mut stack: Vec<(usize, usize)> = vec![(start, 0)];
            colour[start] = 1;
            while let Some(&mut (node, ref mut next)) = stack.last_mut() {
                let prereqs = &self.workflows[node].prerequisite_workflow_ids;
                if *next < prereqs.len() {
                    let p = &prereqs[*next];
                    *next += 1;
                    let Some(j) = index(p) else { continue };
                    match colour[j] {
                        0 => {
                            colour[j] = 1;
                            stack.push((j, 0));
                        }
                        1 => {
                            let pos = stack.iter().position(|(k, _)| *k == j).unwrap_or(0);
                            let mut ids: Vec<String> = stack[pos..]
                                .iter()
                                .map(|(k, _)| self.workflows[*k].workflow_id.clone())
                                .collect();
                            ids.push(self.workflows[j].workflow_id.clone());
                            errors.push(PlanError::PrerequisiteCycle { workflow_ids: ids });
                        }
                        _ => {}
                    }
                } else {
                    colour[node] = 2;
                    stack.pop();
                }
            }
        }
        errors
    }
}

/// A plan's workflows split by progress.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct WorkflowSplit {
    /// Completed, plan order.
    pub completed: Vec<String>,
    /// In progress, plan order.
    pub in_progress: Vec<String>,
    /// Not completed (in progress included), plan order.
    pub outstanding: Vec<String>,
}

/// Splits the plan's ids by their progress status (absent = not started).
pub fn split_workflows(
    plan: &OnboardingPlan,
    progress: &OrderedMap<WorkflowProgress>,
) -> WorkflowSplit {
    let mut split = WorkflowSplit::default();
    for w in &plan.workflows {
        let id = w.workflow_id.clone();
        match progress.get(&w.workflow_id).map(|p| p.status) {
            Some(WorkflowStatus::Completed) => split.completed.push(id),
            Some(WorkflowStatus::InProgress) => {
                split.in_progress.push(id.clone());
                split.outstanding.push(id);
            }
            _ => split.outstanding.push(id),
        }
    }
    split
}

/// True when the plan is non-empty and nothing is outstanding.
pub fn is_plan_complete(plan: &OnboardingPlan, progress: &OrderedMap<WorkflowProgress>) -> bool {
    !plan.workflows.is_empty() && split_workflows(plan, progress).outstanding.is_empty()
}

/// Share of the workflow's declared steps completed in `progress` (0 when it
/// has no steps or there is no progress).
pub fn step_completion_ratio(
    workflow: &OnboardingWorkflow,
    progress: Option<&WorkflowProgress>,
) -> f64 {
    let Some(wp) = progress else { return 0.0 };
    if workflow.steps.is_empty() {
        return 0.0;
    }
    let mut done: Vec<&str> = Vec::new();
    for s in &workflow.steps {
        let completed = wp
            .steps
            .get(&s.step_id)
            .is_some_and(|p| p.status == WorkflowStatus::Completed);
        if completed && !done.contains(&s.step_id.as_str()) {
            done.push(&s.step_id);
        }
    }
    done.len() as f64 / workflow.steps.len() as f64
}
