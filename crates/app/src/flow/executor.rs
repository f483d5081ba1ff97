//! Running a DAG plan: the seam between the flow service and the task queue.
//!
//! The service hands a [`DagJob`] (a pure-data [`DagPlan`] plus where to
//! report) to a [`DagRunner`]. [`InProcessRunner`] runs the plan on a tokio
//! task in this process, with retries, a per-task timeout and cancellation;
//! it is replaced by the durable task queue, which runs the same plan's
//! tasks on workers. Whatever runs the plan reports each finished task to
//! the [`FlowStore`] (progress) and the outcome to the [`DagSink`].

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use parlance_core::ProductId;
use parlance_core::flow::dag::{self, DagPlan, TaskKind};
use parlance_core::flow::{Flow, TaskError};
use parlance_ports::FlowStore;
use serde_json::Value;

use super::invoker::Invokers;

/// Where a finished DAG is reported.
#[async_trait]
pub trait DagSink: Send + Sync + 'static {
    /// The DAG `invocation_id` of the session finished with its final result,
    /// or failed (after its retries).
    async fn finished(
        &self,
        product_id: ProductId,
        session_id: String,
        outcome: Result<(String, String), TaskError>,
    );
}

/// One DAG to run.
pub struct DagJob {
    /// The tenant.
    pub product_id: ProductId,
    /// The session.
    pub session_id: String,
    /// What to run.
    pub plan: DagPlan,
    /// The flow (its templates).
    pub flow: Arc<Flow>,
    /// The invokers by name.
    pub invokers: Invokers,
    /// Where progress is counted.
    pub store: Arc<dyn FlowStore>,
    /// Where the outcome goes.
    pub sink: Arc<dyn DagSink>,
}

/// Runs DAG plans.
pub trait DagRunner: Send + Sync + 'static {
    /// Starts running `job`; returns at once.
    fn start(&self, job: DagJob);
    /// Stops the run `invocation_id` before its next task; its outcome is
    /// never reported.
    fn cancel(&self, invocation_id: &str);
}

/// Retry and timeout settings of a runner.
#[derive(Debug, Clone, Copy)]
pub struct RunnerOptions {
    /// Attempts per task (the first included).
    pub attempts: u32,
    /// Delay before the second attempt; doubles each time.
    pub backoff: Duration,
    /// Longest one attempt may take.
    pub task_timeout: Duration,
}

impl Default for RunnerOptions {
    fn default() -> Self {
        Self {
            attempts: 3,
            backoff: Duration::from_millis(50),
            task_timeout: Duration::from_secs(120),
        }
    }
}

/// Runs plans on tokio tasks in this process (until the task queue takes
/// over). Map branches run one after another, in declaration order.
#[derive(Debug, Default)]
pub struct InProcessRunner {
    options: RunnerOptions,
    runs: Arc<Mutex<Runs>>,
}

/// Invocations running, and those of them asked to stop.
#[derive(Debug, Default)]
struct Runs {
    running: HashSet<String>,
    cancelled: HashSet<String>,
}

impl InProcessRunner {
    /// A runner with `options`.
    pub fn new(options: RunnerOptions) -> Self {
        Self {
            options,
            runs: Arc::default(),
        }
    }
}

impl DagRunner for InProcessRunner {
    fn start(&self, job: DagJob) {
        let options = self.options;
        let runs = self.runs.clone();
        let invocation = job.plan.invocation_id.clone();
        lock(&runs).running.insert(invocation.clone());
        tokio::spawn(async move {
            let is_cancelled = || lock(&runs).cancelled.contains(&invocation);
            let outcome = run_plan(&job, options, &is_cancelled).await;
            let cancelled = {
                let mut r = lock(&runs);
                r.running.remove(&invocation);
                r.cancelled.remove(&invocation)
            };
            if cancelled {
                return;
            }
            let outcome = match outcome {
                Ok(result) => Ok((invocation, result)),
                Err((task, message)) => Err(TaskError {
                    invocation_id: invocation,
                    task,
                    message,
                }),
            };
            job.sink
                .finished(job.product_id.clone(), job.session_id.clone(), outcome)
                .await;
        });
    }

    fn cancel(&self, invocation_id: &str) {
        let mut r = lock(&self.runs);
        if r.running.contains(invocation_id) {
            r.cancelled.insert(invocation_id.to_owned());
        }
    }
}

fn lock(runs: &Mutex<Runs>) -> std::sync::MutexGuard<'_, Runs> {
    runs.lock().unwrap_or_else(|e| e.into_inner())
}

/// One invocation with retries and a timeout.
async fn invoke(
    job: &DagJob,
    options: RunnerOptions,
    template: &str,
    invoker: &str,
    data: &Value,
) -> Result<String, String> {
    let rendered = job.flow.render(template, data).map_err(|e| e.to_string())?;
    let inv = job
        .invokers
        .get(invoker)
        .ok_or_else(|| format!("unknown invoker `{invoker}`"))?;
    let mut delay = options.backoff;
    let mut last = String::new();
    for attempt in 0..options.attempts.max(1) {
        if attempt > 0 {
            tokio::time::sleep(delay).await;
            delay *= 2;
        }
        match tokio::time::timeout(options.task_timeout, inv.invoke(&rendered)).await {
            Ok(Ok(out)) => return Ok(out),
            Ok(Err(e)) => last = e,
            Err(_) => last = format!("timed out after {:?}", options.task_timeout),
        }
    }
    Err(last)
}

async fn count(job: &DagJob, done: i64, add_total: i64) {
    if let Err(e) = job
        .store
        .task_done(
            &job.product_id,
            &job.session_id,
            &job.plan.chain_id,
            done,
            add_total,
        )
        .await
    {
        tracing::warn!(error = %e, session = %job.session_id, "progress not recorded");
    }
}

/// Runs every task but the completion; returns the final result or the
/// failing task's id and message.
async fn run_plan(
    job: &DagJob,
    options: RunnerOptions,
    is_cancelled: &(dyn Fn() -> bool + Sync),
) -> Result<String, (String, String)> {
    let plan = &job.plan;
    let mut results: Vec<String> = vec![String::new(); plan.tasks.len()];
    let mut nets: Vec<Option<Value>> = vec![None; plan.tasks.len()];
    for task in &plan.tasks {
        if is_cancelled() {
            return Err((task.id.to_string(), "cancelled".into()));
        }
        let fail = |m: String| (task.id.to_string(), m);
        match &task.kind {
            TaskKind::Invoke {
                template,
                invoker,
                input,
            } => {
                let data = dag::task_context(&plan.context, input.and_then(|i| nets[i].as_ref()));
                results[task.id] = invoke(job, options, template, invoker, &data)
                    .await
                    .map_err(fail)?;
            }
            TaskKind::Glue { from } => {
                nets[task.id] = Some(dag::glue(&results[*from]));
            }
            TaskKind::Combine { keys, from } => {
                let parts: Vec<String> = from.iter().map(|i| results[*i].clone()).collect();
                results[task.id] = dag::combine(keys, &parts);
            }
            TaskKind::MapOver {
                template,
                invoker,
                over,
                input,
            } => {
                let data = dag::task_context(&plan.context, input.and_then(|i| nets[i].as_ref()));
                let items = match job
                    .flow
                    .eval(over, &data)
                    .map_err(|e| fail(e.to_string()))?
                {
                    Value::Array(items) => items,
                    Value::Null => Vec::new(),
                    other => vec![other],
                };
                count(job, 0, items.len() as i64).await;
                let mut parts = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    if is_cancelled() {
                        return Err(fail("cancelled".into()));
                    }
                    let element = dag::task_context(&data, Some(&dag::map_element(i, item)));
                    parts.push(
                        invoke(job, options, template, invoker, &element)
                            .await
                            .map_err(fail)?,
                    );
                    count(job, 1, 0).await;
                }
                results[task.id] = dag::map_results(&parts);
            }
            TaskKind::Complete { from } => return Ok(results[*from].clone()),
        }
        count(job, 1, 0).await;
    }
    Err(("complete".into(), "the plan has no completion task".into()))
}
