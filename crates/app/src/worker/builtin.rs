//! Handlers for exercising workers end to end: one that sleeps and one that
//! records what it saw.
//!
//! Both return `{"node": <node key or kind>, "inputs": [<input values>]}`
//! (or the payload's `result` when it has one), so a DAG's final result
//! spells out every path through it; both append a JSON line per attempt to
//! the file named by the payload's `file`, if any, so a test can see how
//! often each ran. They are registered only on request
//! (`parlance worker --test-handlers`), never by default: `file` names a
//! path on the worker's host.

use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parlance_ports::Lease;
use serde_json::{Value, json};

use super::{Handlers, TaskError, TaskHandler};

/// Sleeps `ms` milliseconds, then answers.
pub const SLEEP_KIND: &str = "test.sleep";
/// Answers at once.
pub const RECORD_KIND: &str = "test.record";

/// Registers [`SLEEP_KIND`] and [`RECORD_KIND`].
pub fn register_test_handlers(handlers: &mut Handlers) {
    handlers.register(SLEEP_KIND, Arc::new(Sleep));
    handlers.register(RECORD_KIND, Arc::new(Record));
}

struct Sleep;
struct Record;

#[async_trait]
impl TaskHandler for Sleep {
    async fn run(&self, task: &Lease) -> Result<Value, TaskError> {
        let ms = task.payload["ms"].as_u64().unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        answer(task)
    }
}

#[async_trait]
impl TaskHandler for Record {
    async fn run(&self, task: &Lease) -> Result<Value, TaskError> {
        answer(task)
    }
}

fn answer(task: &Lease) -> Result<Value, TaskError> {
    let result = match task.payload.get("result") {
        Some(r) => r.clone(),
        None => {
            let (node, inputs) = match &task.dag {
                Some(d) => (
                    d.node.clone(),
                    d.inputs.iter().map(|i| i.value.clone()).collect(),
                ),
                None => (task.kind.clone(), Vec::new()),
            };
            json!({"node": node, "inputs": inputs})
        }
    };
    if let Some(path) = task.payload["file"].as_str() {
        let line = json!({
            "task": task.task_id.0,
            "attempt": task.attempt,
            "node": task.dag.as_ref().map(|d| d.node.clone()),
        });
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| TaskError::retryable(format!("open record file: {e}")))?;
        // One `write` of the whole line: a process killed mid-task leaves
        // either the line or nothing, never half of it.
        f.write_all(format!("{line}\n").as_bytes())
            .map_err(|e| TaskError::retryable(format!("record: {e}")))?;
    }
    Ok(result)
}
