//! Running a DAG plan: the seam between the flow service and the task queue.
//!
//! The service hands a [`DagJob`] (a pure-data [`DagPlan`] and whose it is)
//! to a [`DagRunner`], which compiles it into what the executor runs. The
//! [`QueueRunner`] compiles it into a durable task-queue [`DagSpec`]: one
//! node per plan task (chain = sequence, map = fan-out plus a combine node,
//! map-over-list = a dynamic fan-out via [`MapSpec`]) ending in the
//! completion node. The flow store enqueues that spec in the same commit as
//! the transition that starts it, and workers run the nodes with the
//! handlers of [`super::tasks`].

use std::time::Duration;

use async_trait::async_trait;
use parlance_core::ProductId;
use parlance_core::flow::dag::{DagPlan, TaskKind};
use parlance_core::flow::{Running, TaskError};
use parlance_ports::{DagId, DagSpec, DagState, MapSpec, NodeSpec, TaskQueue};
use serde_json::{Value, json};
use std::sync::Arc;

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
const LEASE_MARGIN: Duration = Duration::from_secs(30);

/// One DAG to run.
#[derive(Debug, Clone, Copy)]
pub struct DagJob<'a> {
    /// The tenant.
    pub product_id: &'a ProductId,
    /// The session.
    pub session_id: &'a str,
    /// The flow's name.
    pub flow: &'a str,
    /// What to run.
    pub plan: &'a DagPlan,
}

/// Runs DAG plans.
#[async_trait]
pub trait DagRunner: Send + Sync + 'static {
    /// The task-queue DAG that runs `job`; the flow store enqueues it in
    /// the commit of the transition that starts it.
    fn compile(&self, job: &DagJob<'_>) -> DagSpec;

    /// Stops the run behind `running` (cancelled by the user); its late
    /// results are dropped by the session's compare-and-swap anyway.
    async fn cancel(&self, running: &Running);

    /// The error that ended the run behind `running` without reaching the
    /// session (a worker lost on the last attempt), if the run is over.
    async fn failure(&self, running: &Running) -> Option<TaskError>;
}

/// Retry and timeout settings of a runner.
#[derive(Debug, Clone, Copy)]
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

/// Runs plans as DAGs on the durable task queue.
pub struct QueueRunner {
    queue: Arc<dyn TaskQueue>,
    options: RunnerOptions,
}

impl std::fmt::Debug for QueueRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueRunner")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl QueueRunner {
    /// A runner on `queue`.
    pub fn new(queue: Arc<dyn TaskQueue>, options: RunnerOptions) -> Self {
        Self { queue, options }
    }
}

/// The key of a plan task's node.
fn node_key(id: usize) -> String {
    id.to_string()
}

/// The plan task a node key belongs to (`3[1]`, an element of map `3`, and
/// `3#combine` belong to task `3`).
pub(crate) fn plan_task_of(node: &str) -> String {
    node.split(['[', '#']).next().unwrap_or(node).to_owned()
}

#[async_trait]
impl DagRunner for QueueRunner {
    fn compile(&self, job: &DagJob<'_>) -> DagSpec {
        let plan = job.plan;
        let timeout_ms = u64::try_from(self.options.task_timeout.as_millis()).unwrap_or(u64::MAX);
        let base = |task: usize, credit: usize| {
            json!({
                "session_id": job.session_id,
                "flow": job.flow,
                "invocation_id": plan.invocation_id,
                "chain_id": plan.chain_id,
                "task": node_key(task),
                "credit": credit,
                "timeout_ms": timeout_ms,
            })
        };
        let is_map = |id: usize| matches!(plan.tasks[id].kind, TaskKind::MapOver { .. });
        let mut spec = DagSpec::new(job.product_id.clone());
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
                    payload["context"] = plan.context.clone();
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
                    payload["context"] = plan.context.clone();
                    payload["has_input"] = json!(input.is_some());
                    let mut element = base(task.id, 1);
                    element["template"] = json!(template);
                    element["invoker"] = json!(invoker);
                    element["element"] = json!(true);
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
                .max_attempts(self.options.attempts.max(1))
                .timeout(self.options.task_timeout + LEASE_MARGIN);
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

    async fn cancel(&self, running: &Running) {
        let Some(id) = running.dag_id else { return };
        if let Err(e) = self.queue.cancel_dag(DagId(id)).await {
            tracing::warn!(error = %e, dag_id = id, "flow dag not cancelled");
        }
    }

    async fn failure(&self, running: &Running) -> Option<TaskError> {
        let id = running.dag_id?;
        let status = match self.queue.dag_status(DagId(id)).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, dag_id = id, "flow dag status unavailable");
                return None;
            }
        };
        let (task, message) = match (status.state, status.error) {
            (DagState::Failed, Some(f)) => (plan_task_of(&f.node), f.message),
            (DagState::Failed, None) => ("dag".to_owned(), "the task graph failed".to_owned()),
            (DagState::Cancelled, _) => {
                ("dag".to_owned(), "the task graph was cancelled".to_owned())
            }
            _ => return None,
        };
        Some(TaskError {
            invocation_id: running.invocation_id.clone(),
            task,
            message,
        })
    }
}

/// A node result as the text the reference hands on: a string as is, a
/// map's list of element results as a JSON list (elements parsed when JSON).
pub(crate) fn as_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(items) => {
            let parts: Vec<String> = items.iter().map(as_text).collect();
            parlance_core::flow::dag::map_results(&parts)
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parlance_core::flow::TemplateRef;
    use parlance_core::flow::dag::compile;
    use parlance_memory::MemoryTaskQueue;
    use parlance_ports::{QueueConfig, SystemClock};

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
        let queue = Arc::new(MemoryTaskQueue::new(
            Arc::new(SystemClock),
            QueueConfig::default(),
        ));
        let product = ProductId::parse("p").unwrap();
        QueueRunner::new(queue, RunnerOptions::default()).compile(&DagJob {
            product_id: &product,
            session_id: "sess",
            flow: "f",
            plan: &plan,
        })
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
        s.plan(&parlance_core::queue::DagLimits::default())
            .expect("a valid queue DAG");
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
    fn results_hand_on_text_and_map_lists_as_json() {
        assert_eq!(as_text(&json!("plain")), "plain");
        assert_eq!(as_text(&json!(["{\"a\":1}", "b"])), "[{\"a\":1},\"b\"]");
        assert_eq!(plan_task_of("3[1]"), "3");
        assert_eq!(plan_task_of("3#combine"), "3");
        assert_eq!(plan_task_of("12"), "12");
    }
}
