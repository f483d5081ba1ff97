//! The task handlers that run flow DAG nodes on workers.
//!
//! Each node carries the session, the invocation and its plan task in its
//! payload; parent results arrive as the node's inputs. The render data is
//! not in the payload: it names the data the DAG was planned with (a
//! [`ContextRef`]: the dialogue's length then and the planning time), and
//! an invoker or map node rebuilds it from the session (which does not
//! change while it waits for the run) and that prefix of the append-only
//! dialogue, so a payload's size never depends on the dialogue's. A map's
//! elements receive only their drag-net and rebuild the rest the same way.
//! (Payloads written before this carried the data itself under `context`,
//! and a map's elements their whole render data; both still run.) Every
//! finished node
//! adds its `credit` to the chain's progress. A node's final failure (no
//! attempts left, or not retryable) is reported to the session before the
//! queue fails the DAG, so the session offers `retry` at once; the
//! completion node applies the result under the session's compare-and-swap
//! and, for invoker->invoker, enqueues the next DAG in the same commit. Its
//! own result names the session, invocation and chain, so a finished run
//! (whose nodes keep no payload) still says whose it was.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parlance_core::flow::TaskError as FlowTaskError;
use parlance_core::flow::dag;
use parlance_core::flow::queue::{
    COMBINE_KIND, COMPLETE_KIND, ContextRef, GLUE_KIND, INVOKE_KIND, MAP_KIND,
};
use parlance_core::flow::{Flow, FlowKey, FlowSession, FlowSessionId};
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
    /// The render data itself, in payloads written before `context_ref`.
    #[serde(default)]
    context: Value,
    /// The render data the DAG was planned with, by reference.
    #[serde(default)]
    context_ref: Option<ContextRef>,
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

/// A map element's value as JSON text, beside the value itself.
const MAP_VALUE_TEXT: &str = "map_value_text";

/// A drag-net as a node received it, with its objects' keys in the order
/// they were written: the queue may store node results as PostgreSQL
/// `jsonb`, which reorders keys, so the values parsed from text are parsed
/// again from the text the net carries (a chain step's `previous_result`,
/// a map element's value written beside it).
fn in_written_order(net: &Value) -> Value {
    let Value::Object(m) = net else {
        return net.clone();
    };
    let mut m = m.clone();
    if let Some(Value::String(previous)) = m.get("previous_result")
        && m.contains_key("parsed_previous_result")
    {
        let parsed = serde_json::from_str::<Value>(previous).unwrap_or(Value::Null);
        m.insert("parsed_previous_result".into(), parsed);
    }
    if let Some(Value::String(text)) = m.shift_remove(MAP_VALUE_TEXT)
        && let Ok(value) = serde_json::from_str::<Value>(&text)
    {
        m.insert("map_value".into(), value);
    }
    Value::Object(m)
}

/// The session a node runs for.
fn key(lease: &Lease, p: &Payload) -> FlowKey {
    FlowKey::new(lease.product_id.clone(), p.session_id.clone())
}

/// The session, if it still waits for this node's invocation; a cancelled
/// or superseded run does no more work.
fn waiting(session: FlowSession, p: &Payload) -> Result<FlowSession, TaskError> {
    let ours = session
        .running
        .as_ref()
        .is_some_and(|r| r.invocation_id == p.invocation_id);
    if ours {
        Ok(session)
    } else {
        Err(TaskError::permanent("the run was cancelled"))
    }
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

    /// The session, while it still waits for this invocation; a cancelled
    /// or superseded run does no more work.
    async fn current_session(&self, lease: &Lease, p: &Payload) -> Result<FlowSession, TaskError> {
        let stored = self
            .service
            .store()
            .session(&key(lease, p))
            .await
            .map_err(|e| TaskError::retryable(e.to_string()))?;
        let stored = stored.ok_or_else(|| TaskError::permanent("the run was cancelled"))?;
        waiting(stored.state, p)
    }

    /// The render data the node's DAG was planned with, while the session
    /// still waits for this invocation (else the run was cancelled): the
    /// session as it is, and the dialogue as it was when the DAG was
    /// planned, read together.
    async fn planned_context(
        &self,
        lease: &Lease,
        p: &Payload,
        flow: &Flow,
    ) -> Result<Value, TaskError> {
        let Some(cr) = p.context_ref else {
            self.current_session(lease, p).await?;
            return Ok(p.context.clone());
        };
        let planned_at = cr
            .planned_at()
            .ok_or_else(|| TaskError::permanent("the planning time is out of range"))?;
        let (stored, dialogue) = self
            .service
            .store()
            .session_with_prefix(&key(lease, p), cr.dialogue_len)
            .await
            .map_err(|e| TaskError::retryable(e.to_string()))?
            .ok_or_else(|| TaskError::permanent("the run was cancelled"))?;
        let session = waiting(stored.state, p)?;
        if dialogue.len() as u64 != cr.dialogue_len {
            return Err(TaskError::permanent(format!(
                "the dialogue holds {} elements; the run was planned on {}",
                dialogue.len(),
                cr.dialogue_len
            )));
        }
        Ok(flow.render_data(&session, &dialogue, planned_at))
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
        let flow = self.flow(p)?;
        let data = if p.element && p.context_ref.is_none() {
            // An element of an older map: its input is its whole data.
            self.current_session(lease, p).await?;
            first_input(lease)?.clone()
        } else {
            let net = if p.has_input || p.element {
                Some(in_written_order(first_input(lease)?))
            } else {
                None
            };
            let base = self.planned_context(lease, p, &flow).await?;
            dag::task_context(&base, net.as_ref())
        };
        let rendered = flow
            .render(&p.template, &data)
            .map_err(|e| TaskError::permanent(e.to_string()))?;
        // The template's folder may configure its invoker (`meta.yaml`);
        // otherwise the state's.
        let invoker =
            match self
                .service
                .catalog()
                .template_invoker(&p.flow, &p.template)
            {
                Some(invoker) => invoker,
                None => self.service.invokers().get(&p.invoker).ok_or_else(|| {
                    TaskError::permanent(format!("unknown invoker `{}`", p.invoker))
                })?,
            };
        let limit = Duration::from_millis(p.timeout_ms);
        let out = match tokio::time::timeout(limit, invoker.call(&rendered)).await {
            Ok(Ok(out)) => out,
            Ok(Err(e)) if e.retryable => return Err(TaskError::retryable(e.message)),
            Ok(Err(e)) => return Err(TaskError::permanent(e.message)),
            Err(_) => return Err(TaskError::retryable(format!("timed out after {limit:?}"))),
        };
        self.count(lease, p, p.credit, 0).await;
        Ok(Value::String(out))
    }

    async fn map(&self, lease: &Lease, p: &Payload) -> Result<Value, TaskError> {
        let flow = self.flow(p)?;
        let net = if p.has_input {
            Some(first_input(lease)?)
        } else {
            None
        };
        let base = self.planned_context(lease, p, &flow).await?;
        let data = dag::task_context(&base, net);
        let items = match flow
            .eval(&p.over, &data)
            .map_err(|e| TaskError::permanent(e.to_string()))?
        {
            Value::Array(items) => items,
            Value::Null => Vec::new(),
            other => vec![other],
        };
        // Each element is handed its drag-net (the map's, with its index
        // and value over it) and rebuilds the rest; an older map's
        // elements expect their whole render data.
        let carried = match (p.context_ref, net) {
            (None, _) => data,
            (Some(_), Some(net @ Value::Object(_))) => net.clone(),
            (Some(_), _) => Value::Object(serde_json::Map::new()),
        };
        let elements: Vec<Value> = items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let mut element = dag::task_context(&carried, Some(&dag::map_element(i, item)));
                if let Value::Object(e) = &mut element {
                    e.insert(MAP_VALUE_TEXT.into(), Value::String(item.to_string()));
                }
                element
            })
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
        // A finished run's nodes keep no payload: the completion's result
        // names whose run it was.
        Ok(serde_json::json!({
            "session_id": p.session_id,
            "invocation_id": p.invocation_id,
            "chain_id": p.chain_id,
        }))
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn keys(v: &Value) -> Vec<&str> {
        v.as_object().unwrap().keys().map(String::as_str).collect()
    }

    #[test]
    fn parsed_values_of_a_net_come_back_in_their_written_order() {
        // As `jsonb` gives them back: keys reordered.
        let glued = json!({
            "previous_result": r#"{"b": 1, "a": {"d": 1, "c": 2}}"#,
            "parsed_previous_result": {"a": {"c": 2, "d": 1}, "b": 1},
        });
        let net = in_written_order(&glued);
        assert_eq!(keys(&net["parsed_previous_result"]), ["b", "a"]);
        assert_eq!(keys(&net["parsed_previous_result"]["a"]), ["d", "c"]);
        let element = json!({
            "map_index": 0,
            "map_value": {"a": 2, "b": 1},
            MAP_VALUE_TEXT: r#"{"b":1,"a":2}"#,
        });
        let net = in_written_order(&element);
        assert_eq!(keys(&net), ["map_index", "map_value"]);
        assert_eq!(keys(&net["map_value"]), ["b", "a"]);
    }
}
