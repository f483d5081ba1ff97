//! The task handlers that run flow DAG nodes on workers.
//!
//! Each node carries the session, the invocation and its plan task in its
//! payload; parent results arrive as the node's inputs. Every finished node
//! adds its `credit` to the chain's progress. A node's final failure (no
//! attempts left, or not retryable) is reported to the session before the
//! queue fails the DAG, so the session offers `retry` at once; the
//! completion node applies the result under the session's compare-and-swap
//! and, for invoker->invoker, enqueues the next DAG in the same commit.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parlance_core::flow::TaskError as FlowTaskError;
use parlance_core::flow::dag;
use parlance_core::flow::queue::{COMBINE_KIND, COMPLETE_KIND, GLUE_KIND, INVOKE_KIND, MAP_KIND};
use parlance_core::flow::{Flow, FlowKey, FlowSessionId};
use parlance_ports::Lease;
use serde::Deserialize;
use serde_json::Value;

use super::Flows;
use super::executor::{as_text, plan_task_of};
use super::service::FlowService;
use crate::execute::ServiceError;
use crate::worker::{Handlers, TaskError, TaskHandler};

/// Registers the flow node kinds.
pub fn register(handlers: &mut Handlers, service: &Flows) {
    for kind in [
        INVOKE_KIND,
        GLUE_KIND,
        COMBINE_KIND,
        MAP_KIND,
        COMPLETE_KIND,
    ] {
        handlers.register(
            kind,
            Arc::new(FlowTask {
                service: service.clone(),
            }),
        );
    }
}

/// What every flow node's payload carries.
#[derive(Debug, Deserialize)]
struct Payload {
    session_id: FlowSessionId,
    flow: String,
    invocation_id: String,
    chain_id: String,
    task: String,
    #[serde(default)]
    credit: i64,
    #[serde(default)]
    timeout_ms: u64,
    #[serde(default)]
    template: String,
    #[serde(default)]
    invoker: String,
    #[serde(default)]
    context: Value,
    #[serde(default)]
    has_input: bool,
    #[serde(default)]
    element: bool,
    #[serde(default)]
    keys: Vec<String>,
    #[serde(default)]
    over: String,
}

struct FlowTask {
    service: Arc<FlowService>,
}

/// The session a node runs for.
fn key(lease: &Lease, p: &Payload) -> FlowKey {
    FlowKey::new(lease.product_id.clone(), p.session_id.clone())
}

fn inputs(lease: &Lease) -> Vec<&Value> {
    lease
        .dag
        .as_ref()
        .map(|d| d.inputs.iter().map(|i| &i.value).collect())
        .unwrap_or_default()
}

fn first_input(lease: &Lease) -> Result<&Value, TaskError> {
    inputs(lease)
        .into_iter()
        .next()
        .ok_or_else(|| TaskError::permanent("the node has no input"))
}

impl FlowTask {
    /// Adds finished tasks to the chain's progress (best effort: progress
    /// is advisory, the session's state is the truth).
    async fn count(&self, lease: &Lease, p: &Payload, done: i64, add_total: i64) {
        if done == 0 && add_total == 0 {
            return;
        }
        if let Err(e) = self
            .service
            .store()
            .task_done(&key(lease, p), &p.chain_id, done, add_total)
            .await
        {
            tracing::warn!(error = %e, session = %p.session_id, "progress not recorded");
        }
    }

    /// Whether the session still waits for this invocation (a cancelled or
    /// superseded run does no more work).
    async fn is_current(&self, lease: &Lease, p: &Payload) -> Result<bool, TaskError> {
        match self.service.store().session(&key(lease, p)).await {
            Ok(s) => Ok(s.is_some_and(|s| {
                s.state
                    .running
                    .is_some_and(|r| r.invocation_id == p.invocation_id)
            })),
            Err(e) => Err(TaskError::retryable(e.to_string())),
        }
    }

    /// The node's flow.
    fn flow(&self, p: &Payload) -> Result<Arc<Flow>, TaskError> {
        self.service
            .catalog()
            .get(&p.flow)
            .ok_or_else(|| TaskError::permanent(format!("no flow named `{}`", p.flow)))
    }

    async fn step(&self, lease: &Lease, p: &Payload) -> Result<Value, TaskError> {
        match lease.kind.as_str() {
            INVOKE_KIND => self.invoke(lease, p).await,
            GLUE_KIND => {
                let net = dag::glue(&as_text(first_input(lease)?));
                self.count(lease, p, p.credit, 0).await;
                Ok(net)
            }
            COMBINE_KIND => {
                let parts: Vec<String> = inputs(lease).into_iter().map(as_text).collect();
                let combined = dag::combine(&p.keys, &parts);
                self.count(lease, p, p.credit, 0).await;
                Ok(Value::String(combined))
            }
            MAP_KIND => self.map(lease, p).await,
            COMPLETE_KIND => self.complete(lease, p).await,
            other => Err(TaskError::permanent(format!(
                "not a flow task kind: {other}"
            ))),
        }
    }

    async fn invoke(&self, lease: &Lease, p: &Payload) -> Result<Value, TaskError> {
        if !self.is_current(lease, p).await? {
            return Err(TaskError::permanent("the run was cancelled"));
        }
        let data = if p.element {
            first_input(lease)?.clone()
        } else {
            let net = if p.has_input {
                Some(first_input(lease)?)
            } else {
                None
            };
            dag::task_context(&p.context, net)
        };
        let flow = self.flow(p)?;
        let rendered = flow
            .render(&p.template, &data)
            .map_err(|e| TaskError::permanent(e.to_string()))?;
        let invoker = self
            .service
            .invokers()
            .get(&p.invoker)
            .ok_or_else(|| TaskError::permanent(format!("unknown invoker `{}`", p.invoker)))?;
        let limit = Duration::from_millis(p.timeout_ms);
        let out = match tokio::time::timeout(limit, invoker.invoke(&rendered)).await {
            Ok(Ok(out)) => out,
            Ok(Err(e)) => return Err(TaskError::retryable(e)),
            Err(_) => return Err(TaskError::retryable(format!("timed out after {limit:?}"))),
        };
        self.count(lease, p, p.credit, 0).await;
        Ok(Value::String(out))
    }

    async fn map(&self, lease: &Lease, p: &Payload) -> Result<Value, TaskError> {
        if !self.is_current(lease, p).await? {
            return Err(TaskError::permanent("the run was cancelled"));
        }
        let net = if p.has_input {
            Some(first_input(lease)?)
        } else {
            None
        };
        let data = dag::task_context(&p.context, net);
        let flow = self.flow(p)?;
        let items = match flow
            .eval(&p.over, &data)
            .map_err(|e| TaskError::permanent(e.to_string()))?
        {
            Value::Array(items) => items,
            Value::Null => Vec::new(),
            other => vec![other],
        };
        // Each element is handed its whole render data.
        let elements: Vec<Value> = items
            .iter()
            .enumerate()
            .map(|(i, item)| dag::task_context(&data, Some(&dag::map_element(i, item))))
            .collect();
        self.count(lease, p, p.credit, elements.len() as i64).await;
        Ok(Value::Array(elements))
    }

    async fn complete(&self, lease: &Lease, p: &Payload) -> Result<Value, TaskError> {
        let result = as_text(first_input(lease)?);
        // Map-over-lists feeding the completion are done with it.
        self.count(lease, p, p.credit, 0).await;
        let flow = self.flow(p)?;
        self.service
            .complete(&key(lease, p), &flow, p.invocation_id.clone(), result)
            .await
            .map_err(|e| match e {
                ServiceError::Port(_) | ServiceError::Contended { .. } => {
                    TaskError::retryable(e.to_string())
                }
                other => TaskError::permanent(other.to_string()),
            })?;
        Ok(Value::Null)
    }
}

#[async_trait]
impl TaskHandler for FlowTask {
    async fn run(&self, lease: &Lease) -> Result<Value, TaskError> {
        let p: Payload = serde_json::from_value(lease.payload.clone())
            .map_err(|e| TaskError::permanent(format!("bad flow task payload: {e}")))?;
        let outcome = self.step(lease, &p).await;
        if let Err(err) = &outcome {
            let last = !err.retryable || lease.attempt >= lease.max_attempts;
            if last && lease.kind != COMPLETE_KIND {
                let node = lease
                    .dag
                    .as_ref()
                    .map_or(p.task.clone(), |d| d.node.clone());
                let failure = FlowTaskError {
                    invocation_id: p.invocation_id.clone(),
                    task: plan_task_of(&node),
                    message: err.message.clone(),
                };
                let recorded = match self.flow(&p) {
                    Ok(flow) => self
                        .service
                        .fail(&key(lease, &p), &flow, failure)
                        .await
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(e.message),
                };
                if let Err(e) = recorded {
                    tracing::error!(error = %e, session = %p.session_id, "flow failure not recorded");
                }
            }
        }
        outcome
    }
}
