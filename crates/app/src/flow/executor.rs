//! The seam between the flow service and the runs of its task graphs.
//!
//! A flow decision compiles its DAG plan into a task-queue `DagSpec` in core
//! (`parlance_core::flow::queue`), and the flow store enqueues it in the
//! commit of the transition that starts it; workers run its nodes with the
//! handlers of [`super::tasks`]. What is left to the service is to stop a
//! run a `cancel` left behind and to learn how a run ended that never
//! reached its session: a [`DagRunner`] does both.

use async_trait::async_trait;
use parlance_core::ProductId;
use parlance_core::flow::{Running, TaskError};
use parlance_ports::{DagId, DagState, TaskQueue};
use serde_json::Value;
use std::sync::Arc;

pub(crate) use parlance_core::flow::queue::plan_task_of;

/// Stops the runs of DAGs and reports how they ended.
#[async_trait]
pub trait DagRunner: Send + Sync + 'static {
    /// Stops the run behind `running` of `product`'s session (cancelled by
    /// the user); its late results are dropped by the session's
    /// compare-and-swap anyway.
    async fn cancel(&self, product: &ProductId, running: &Running);

    /// The error that ended the run behind `running` of `product`'s session
    /// without reaching the session (a worker lost on the last attempt), if
    /// the run is over.
    async fn failure(&self, product: &ProductId, running: &Running) -> Option<TaskError>;
}

/// The runs of DAGs on the durable task queue.
pub struct QueueRunner {
    queue: Arc<dyn TaskQueue>,
}

impl std::fmt::Debug for QueueRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueRunner").finish_non_exhaustive()
    }
}

impl QueueRunner {
    /// The runs on `queue`.
    pub fn new(queue: Arc<dyn TaskQueue>) -> Self {
        Self { queue }
    }
}

#[async_trait]
impl DagRunner for QueueRunner {
    async fn cancel(&self, product: &ProductId, running: &Running) {
        let Some(id) = running.dag_id else { return };
        if let Err(e) = self.queue.cancel_dag(product, DagId(id)).await {
            tracing::warn!(error = %e, dag_id = id, "flow dag not cancelled");
        }
    }

    async fn failure(&self, product: &ProductId, running: &Running) -> Option<TaskError> {
        let id = running.dag_id?;
        let status = match self.queue.dag_status(product, DagId(id)).await {
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
/// map's list of element results as a JSON list (elements parsed when JSON),
/// anything else as JSON; JSON is written as the reference's `json.dumps`
/// writes it.
pub(crate) fn as_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(items) => {
            let parts: Vec<String> = items.iter().map(as_text).collect();
            parlance_core::flow::dag::map_results(&parts)
        }
        other => parlance_core::flow::pyjson::dumps(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn results_hand_on_text_and_map_lists_as_json() {
        assert_eq!(as_text(&json!("plain")), "plain");
        // As Python's `json.dumps` writes them.
        assert_eq!(
            as_text(&json!(["{\"z\":1,\"a\":0.5}", "b\u{e9}"])),
            r#"[{"z": 1, "a": 0.5}, "b\u00e9"]"#
        );
        assert_eq!(
            as_text(&json!({"b": 1.0, "a": null})),
            r#"{"b": 1.0, "a": null}"#
        );
        assert_eq!(plan_task_of("3[1]"), "3");
        assert_eq!(plan_task_of("3#combine"), "3");
        assert_eq!(plan_task_of("12"), "12");
    }
}
