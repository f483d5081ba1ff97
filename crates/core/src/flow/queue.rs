//! A flow's DAG plan as a task-queue DAG: the node kinds the flow task
//! handlers run, the runner's retry and timeout options, and the pure
//! compilation of a [`DagPlan`] into a [`DagSpec`].
//!
//! One node per plan task, keyed by its index: a chain is a sequence through
//! glue nodes, a map is branches fanning in to a combine node, a map over a
//! list is a node with a [`MapSpec`] whose elements the queue adds when it
//! runs, and every DAG ends in the completion node.
//!
//! A node's payload does not copy the render data: it names the session and
//! the render data as it was when the DAG was planned ([`ContextRef`]). The
//! dialogue is append-only and the session does not change while it waits
//! for the run, so the worker rebuilds the same data from the flow store,
//! and a node's payload stays the same size however long the dialogue.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::dag::{DagPlan, TaskKind};
use super::machine::FlowSessionId;
use crate::queue::{DagSpec, MapSpec, NodeSpec};
use crate::{ProductId, Timestamp};

/// Task kind of an invoker call (a named template, or one map element).
pub const INVOKE_KIND: &str = "flow.invoke";
/// Task kind of a chain's glue step.
pub const GLUE_KIND: &str = "flow.glue";
/// Task kind of a map's combine step.
pub const COMBINE_KIND: &str = "flow.combine";
/// Task kind of a map-over-list (evaluates the list; the queue fans out).
pub const MAP_KIND: &str = "flow.map";
/// Task kind of the completion: applies the result to the session.
pub const COMPLETE_KIND: &str = "flow.complete";

/// How much longer than the invoker's own timeout a node's lease lasts: the
/// handler times the invoker out first and reports it, the queue's deadline
/// is only the backstop for a hung worker.
pub(crate) const LEASE_MARGIN: Duration = Duration::from_secs(30);

/// Retry and timeout settings of the nodes a flow enqueues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunnerOptions {
    /// Attempts per task (the first included); the back-off between them
    /// is the queue's.
    pub attempts: u32,
    /// Longest one invoker call may take.
    pub task_timeout: Duration,
}

impl Default for RunnerOptions {
    fn default() -> Self {
        Self {
            attempts: 3,
            task_timeout: Duration::from_secs(120),
        }
    }
}

/// Names the render data a DAG was planned with, in a node's payload
/// (`context_ref`): the session's first `dialogue_len` dialogue elements and
/// the planning time. With the session's stored state (unchanged while the
/// session waits for the run) they give back the plan's context exactly:
/// `Flow::render_data(session, &dialogue[..dialogue_len], planned_at)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextRef {
    /// Dialogue elements the plan saw (the dialogue is append-only).
    pub dialogue_len: u64,
    /// When the DAG was planned (its `current_datetime`), in microseconds
    /// since the Unix epoch.
    pub planned_at_us: i64,
}

impl ContextRef {
    /// The planning time.
    pub fn planned_at(&self) -> Option<Timestamp> {
        Timestamp::from_micros(self.planned_at_us)
    }
}

/// One DAG to run: the plan and whose it is.
#[derive(Debug, Clone, Copy)]
pub struct DagJob<'a> {
    /// The tenant.
    pub product_id: &'a ProductId,
    /// The session.
    pub session_id: &'a FlowSessionId,
    /// The flow's name.
    pub flow: &'a str,
    /// What to run.
    pub plan: &'a DagPlan,
    /// Dialogue elements the plan's context was rendered from: the stored
    /// dialogue's length once the planning commit is written.
    pub dialogue_len: usize,
    /// When the plan was made (the decision's time).
    pub planned_at: Timestamp,
}

impl DagJob<'_> {
    /// The task-queue DAG that runs this job with `options`.
    pub fn to_spec(&self, options: &RunnerOptions) -> DagSpec {
        let plan = self.plan;
        let timeout_ms = u64::try_from(options.task_timeout.as_millis()).unwrap_or(u64::MAX);
        let context_ref = json!(ContextRef {
            dialogue_len: self.dialogue_len as u64,
            planned_at_us: self.planned_at.as_micros(),
        });
        let base = |task: usize, credit: usize| {
            json!({
                "session_id": self.session_id,
                "flow": self.flow,
                "invocation_id": plan.invocation_id,
                "chain_id": plan.chain_id,
                "task": node_key(task),
                "credit": credit,
                "timeout_ms": timeout_ms,
            })
        };
        let is_map = |id: usize| {
            plan.tasks
                .get(id)
                .is_some_and(|t| matches!(t.kind, TaskKind::MapOver { .. }))
        };
        let mut spec = DagSpec::new(self.product_id.clone());
        for task in &plan.tasks {
            // A map-over-list counts as done once its elements are: its
            // consumer credits it.
            let maps = task.deps.iter().filter(|d| is_map(**d)).count();
            // The completion is counted in the commit it makes, a map over
            // a list by its consumer.
            let own = usize::from(!matches!(
                task.kind,
                TaskKind::Complete { .. } | TaskKind::MapOver { .. }
            ));
            let mut payload = base(task.id, own + maps);
            let mut map = None;
            let kind = match &task.kind {
                TaskKind::Invoke {
                    template,
                    invoker,
                    input,
                } => {
                    payload["template"] = json!(template);
                    payload["invoker"] = json!(invoker);
                    payload["context_ref"] = context_ref.clone();
                    payload["has_input"] = json!(input.is_some());
                    INVOKE_KIND
                }
                TaskKind::Glue { .. } => GLUE_KIND,
                TaskKind::Combine { keys, .. } => {
                    payload["keys"] = json!(keys);
                    COMBINE_KIND
                }
                TaskKind::MapOver {
                    template,
                    invoker,
                    over,
                    input,
                } => {
                    payload["over"] = json!(over);
                    payload["context_ref"] = context_ref.clone();
                    payload["has_input"] = json!(input.is_some());
                    // An element's input is its drag-net only; it rebuilds
                    // the context as its map node does.
                    let mut element = base(task.id, 1);
                    element["template"] = json!(template);
                    element["invoker"] = json!(invoker);
                    element["element"] = json!(true);
                    element["context_ref"] = context_ref.clone();
                    map = Some(MapSpec {
                        kind: INVOKE_KIND.to_owned(),
                        payload: element,
                        label: Some(plan.label.clone()),
                    });
                    MAP_KIND
                }
                TaskKind::Complete { .. } => COMPLETE_KIND,
            };
            let mut node = NodeSpec::new(node_key(task.id), kind, payload)
                .label(plan.label.clone())
                .max_attempts(options.attempts.max(1))
                .timeout(options.task_timeout + LEASE_MARGIN);
            if let Some(m) = map {
                node = node.map(m);
            }
            spec = spec.node(node);
            for d in &task.deps {
                spec = spec.edge(node_key(*d), node_key(task.id));
            }
        }
        spec
    }
}

/// The key of a plan task's node.
fn node_key(id: usize) -> String {
    id.to_string()
}

/// The plan task a node key belongs to (`3[1]`, an element of map `3`, and
/// `3#combine` belong to task `3`).
pub fn plan_task_of(node: &str) -> String {
    node.split(['[', '#']).next().unwrap_or(node).to_owned()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::flow::TemplateRef;
    use crate::flow::dag::compile;
    use crate::queue::DagLimits;

    fn name(n: &str) -> TemplateRef {
        TemplateRef::Name(n.to_owned())
    }

    fn spec(template: &TemplateRef) -> DagSpec {
        let plan = compile(
            template,
            "template",
            "s-1".into(),
            "s-1".into(),
            "s".into(),
            "label".into(),
            json!({"items": [1, 2]}),
        );
        DagJob {
            product_id: &ProductId::parse("p").unwrap(),
            session_id: &FlowSessionId::parse("sess").unwrap(),
            flow: "f",
            plan: &plan,
            dialogue_len: 3,
            planned_at: Timestamp::from_secs(1_700_000_000).unwrap(),
        }
        .to_spec(&RunnerOptions::default())
    }

    /// `(key, kind)` of each node, or `(parent, child)` of each edge.
    type Pairs<'a> = Vec<(&'a str, &'a str)>;

    fn shape(spec: &DagSpec) -> (Pairs<'_>, Pairs<'_>) {
        (
            spec.nodes
                .iter()
                .map(|n| (n.key.as_str(), n.kind.as_str()))
                .collect(),
            spec.edges
                .iter()
                .map(|(p, c)| (p.as_str(), c.as_str()))
                .collect(),
        )
    }

    #[test]
    fn a_chain_is_a_sequence_through_glue_nodes() {
        let s = spec(&TemplateRef::Chain(vec![name("a"), name("b")]));
        assert_eq!(
            shape(&s),
            (
                vec![
                    ("0", INVOKE_KIND),
                    ("1", GLUE_KIND),
                    ("2", INVOKE_KIND),
                    ("3", COMPLETE_KIND)
                ],
                vec![("0", "1"), ("1", "2"), ("2", "3")]
            )
        );
        assert_eq!(s.nodes[0].payload["template"], "a");
        assert_eq!(s.nodes[0].payload["session_id"], "sess");
        assert_eq!(s.nodes[2].payload["has_input"], true);
        assert_eq!(
            s.nodes[3].payload["credit"], 0,
            "the completion counts itself"
        );
        assert!(s.nodes.iter().all(|n| n.max_attempts == 3));
        assert_eq!(
            s.nodes[0].timeout,
            Some(Duration::from_secs(120) + LEASE_MARGIN)
        );
        s.plan(&DagLimits::default()).expect("a valid queue DAG");
    }

    #[test]
    fn a_map_fans_out_to_a_combine_node() {
        let s = spec(&TemplateRef::Map(vec![
            ("x".into(), name("x")),
            ("y".into(), name("y")),
        ]));
        assert_eq!(
            shape(&s),
            (
                vec![
                    ("0", INVOKE_KIND),
                    ("1", INVOKE_KIND),
                    ("2", COMBINE_KIND),
                    ("3", COMPLETE_KIND)
                ],
                vec![("0", "2"), ("1", "2"), ("2", "3")]
            )
        );
        assert_eq!(s.nodes[2].payload["keys"], json!(["x", "y"]));
        s.plan(&DagLimits::default()).expect("a valid queue DAG");
    }

    #[test]
    fn a_map_over_a_list_is_a_dynamic_fan_out() {
        let s = spec(&TemplateRef::MapOver {
            map: "m".into(),
            over: "items".into(),
        });
        assert_eq!(
            shape(&s),
            (
                vec![("0", MAP_KIND), ("1", COMPLETE_KIND)],
                vec![("0", "1")]
            )
        );
        let map = s.nodes[0].map.as_ref().expect("a map node");
        assert_eq!(map.kind, INVOKE_KIND);
        assert_eq!(map.payload["template"], "m");
        assert_eq!(map.payload["element"], true);
        assert_eq!(s.nodes[0].payload["credit"], 0, "done with its elements");
        assert_eq!(s.nodes[1].payload["credit"], 1, "credits the map");
    }

    #[test]
    fn runner_options_set_attempts_and_lease() {
        let plan = compile(
            &name("a"),
            "template",
            "s-1".into(),
            "s-1".into(),
            "s".into(),
            "label".into(),
            json!({}),
        );
        let options = RunnerOptions {
            attempts: 0,
            task_timeout: Duration::from_millis(20),
        };
        let s = DagJob {
            product_id: &ProductId::parse("p").unwrap(),
            session_id: &FlowSessionId::parse("sess").unwrap(),
            flow: "f",
            plan: &plan,
            dialogue_len: 3,
            planned_at: Timestamp::from_secs(1_700_000_000).unwrap(),
        }
        .to_spec(&options);
        assert!(s.nodes.iter().all(|n| n.max_attempts == 1), "at least one");
        assert_eq!(s.nodes[0].payload["timeout_ms"], 20);
        assert_eq!(
            s.nodes[0].timeout,
            Some(Duration::from_millis(20) + LEASE_MARGIN)
        );
    }

    #[test]
    fn node_keys_map_back_to_their_plan_task() {
        assert_eq!(plan_task_of("3[1]"), "3");
        assert_eq!(plan_task_of("3#combine"), "3");
        assert_eq!(plan_task_of("12"), "12");
    }
}
