//! The flow service: sessions, events, polls and DAG completions, each
//! loaded and saved with compare-and-swap; a transition's audit entry is
//! written in the commit that saves it.

use std::collections::BTreeMap;
use std::sync::Arc;

use parlance_core::ProductId;
use parlance_core::flow::{Actor, DialogueElement, Fired, Flow, FlowError, FlowSession, TaskError};
use parlance_ports::{
    AuditEntry, Clock, DagStart, ErrorKind, FlowAppend, FlowStore, IdGen, LlmClient, PortError,
    ProgressUpdate, StoredFlowSession,
};
use serde::Serialize;
use serde_json::{Value, json};

use super::catalog::FlowCatalog;
use super::executor::{DagJob, DagRunner};
use super::invoker::{Invoker, Invokers};

/// How many times a lost compare-and-swap is retried.
const CAS_ATTEMPTS: usize = 8;

/// Progress as the reference's clients read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AiProgress {
    /// Tasks counted so far in the running invoker chain.
    pub total_number_of_subtasks: i64,
    /// Tasks finished.
    pub number_of_subtasks_executed: i64,
    /// The state running now.
    pub label: String,
}

/// The reference's `AIResponse`, plus typed errors.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AiResponse {
    /// The session.
    pub session_id: String,
    /// What the client may send next.
    pub next_actions: Vec<String>,
    /// The latest task error's message, when the session has one.
    pub error: Option<String>,
    /// Task errors since the last successful transition.
    pub errors: Vec<TaskError>,
    /// The text to show (the rendered target template).
    pub response: Option<String>,
    /// Progress of the running invoker chain, while one runs.
    pub progress: Option<AiProgress>,
}

/// What can go wrong in the service.
#[derive(Debug, thiserror::Error)]
pub enum FlowServiceError {
    /// No such flow is loaded.
    #[error("no flow named `{0}`")]
    UnknownFlow(String),
    /// No such session in this flow for this product.
    #[error("no session `{0}` in this flow")]
    UnknownSession(String),
    /// The engine refused.
    #[error(transparent)]
    Flow(#[from] FlowError),
    /// Storage failed (or lost too many races).
    #[error(transparent)]
    Port(#[from] PortError),
}

/// The flow service over a store, a runner and a catalog.
pub struct FlowService {
    catalog: Arc<FlowCatalog>,
    store: Arc<dyn FlowStore>,
    runner: Arc<dyn DagRunner>,
    clock: Arc<dyn Clock>,
    ids: Arc<dyn IdGen>,
    invokers: Invokers,
}

/// Everything the service is built from.
pub struct FlowDeps {
    /// Loaded flows.
    pub catalog: Arc<FlowCatalog>,
    /// Session storage.
    pub store: Arc<dyn FlowStore>,
    /// Runs DAG plans.
    pub runner: Arc<dyn DagRunner>,
    /// Time.
    pub clock: Arc<dyn Clock>,
    /// Ids.
    pub ids: Arc<dyn IdGen>,
    /// The model behind the `llm` invokers.
    pub llm: Arc<dyn LlmClient>,
    /// Invokers registered from Rust.
    pub extra_invokers: BTreeMap<String, Arc<dyn Invoker>>,
}

impl FlowService {
    /// A service.
    pub fn new(deps: FlowDeps) -> Arc<Self> {
        let mut invokers = Invokers::standard(deps.llm);
        invokers.extend(&deps.extra_invokers);
        Arc::new(Self {
            catalog: deps.catalog,
            store: deps.store,
            runner: deps.runner,
            clock: deps.clock,
            ids: deps.ids,
            invokers,
        })
    }

    /// The loaded flows.
    pub fn catalog(&self) -> &FlowCatalog {
        &self.catalog
    }

    /// Session storage.
    pub fn store(&self) -> &Arc<dyn FlowStore> {
        &self.store
    }

    /// The invokers by name.
    pub fn invokers(&self) -> &Invokers {
        &self.invokers
    }

    /// Saves a transition with its audit entry; one that starts a DAG
    /// enqueues it in the same commit, with its progress.
    async fn commit(
        &self,
        product: &ProductId,
        fired: &Fired,
        expected_version: i64,
        progress: Option<ProgressUpdate>,
        audit: AuditEntry,
        now: parlance_core::Timestamp,
    ) -> Result<(), PortError> {
        let audit = [audit];
        let append = FlowAppend {
            dialogue: &fired.appended,
            audit: &audit,
        };
        match (&fired.dag, progress) {
            (Some(plan), Some(progress)) => {
                let dag = self.runner.compile(&DagJob {
                    product_id: product,
                    session_id: &fired.session.session_id,
                    flow: &fired.session.flow,
                    plan,
                });
                self.store
                    .save_and_enqueue(
                        product,
                        &fired.session,
                        expected_version,
                        append,
                        &DagStart { progress, dag },
                        now,
                    )
                    .await
                    .map(|_| ())
            }
            (_, progress) => self
                .store
                .save(
                    product,
                    &fired.session,
                    expected_version,
                    append,
                    progress.as_ref(),
                    now,
                )
                .await
                .map(|_| ()),
        }
    }

    fn flow(&self, name: &str) -> Result<Arc<Flow>, FlowServiceError> {
        self.catalog
            .get(name)
            .ok_or_else(|| FlowServiceError::UnknownFlow(name.to_owned()))
    }

    async fn load(
        &self,
        product: &ProductId,
        flow: &Flow,
        session_id: &str,
    ) -> Result<(StoredFlowSession, Vec<DialogueElement>), FlowServiceError> {
        let not_found = || FlowServiceError::UnknownSession(session_id.to_owned());
        let stored = self
            .store
            .load(product, session_id)
            .await
            .map_err(|e| match e.kind {
                ErrorKind::NotFound => not_found(),
                _ => e.into(),
            })?;
        if stored.session.flow != flow.name() {
            return Err(not_found());
        }
        let dialogue = self.store.dialogue(product, session_id).await?;
        Ok((stored, dialogue))
    }

    fn new_id(&self) -> String {
        self.ids.new_uuid().to_string()
    }

    /// Starts a session: the greeting is rendered and recorded.
    pub async fn start_session(
        &self,
        product: &ProductId,
        flow_name: &str,
    ) -> Result<AiResponse, FlowServiceError> {
        let flow = self.flow(flow_name)?;
        let now = self.clock.now();
        let fired = flow.start(&self.new_id(), now)?;
        let audit = [audit_entry(
            product,
            &fired.session,
            None,
            "start_session",
            now,
        )];
        let append = FlowAppend {
            dialogue: &fired.appended,
            audit: &audit,
        };
        self.store
            .create(product, &fired.session, append, now)
            .await?;
        Ok(AiResponse {
            session_id: fired.session.session_id.clone(),
            next_actions: flow.next_actions(&fired.session),
            error: None,
            errors: Vec::new(),
            response: fired.response,
            progress: None,
        })
    }

    /// Handles a client event: `poll`, `cancel`, `retry`, or a flow event.
    pub async fn event(
        &self,
        product: &ProductId,
        flow_name: &str,
        session_id: &str,
        event: &str,
        input: &str,
    ) -> Result<AiResponse, FlowServiceError> {
        let flow = self.flow(flow_name)?;
        if event == "poll" {
            return self.poll(product, &flow, session_id).await;
        }
        for _ in 0..CAS_ATTEMPTS {
            let (stored, dialogue) = self.load(product, &flow, session_id).await?;
            let now = self.clock.now();
            let from = stored.session.state.clone();
            let fired = match event {
                "cancel" => {
                    let session = flow.cancel(&stored.session).map_err(|_| {
                        FlowError::TransitionNotAllowed {
                            event: "cancel".into(),
                            state: stored.session.state.clone(),
                        }
                    })?;
                    Fired {
                        session,
                        appended: Vec::new(),
                        response: None,
                        dag: None,
                        transition: None,
                    }
                }
                "retry" => flow.retry(&stored.session, &dialogue, &self.new_id(), now)?,
                _ => flow.fire(
                    &stored.session,
                    &dialogue,
                    event,
                    input,
                    &self.new_id(),
                    now,
                )?,
            };
            let progress = fired.dag.as_ref().map(|plan| ProgressUpdate {
                chain_id: plan.chain_id.clone(),
                add_total: plan.counted_tasks() as i64,
                add_done: 0,
                label: Some(plan.label.clone()),
            });
            match self
                .commit(
                    product,
                    &fired,
                    stored.version,
                    progress,
                    audit_entry(product, &fired.session, Some(from), event, now),
                    now,
                )
                .await
            {
                Ok(()) => {}
                Err(e) if e.kind == ErrorKind::Conflict => continue,
                Err(e) => return Err(e.into()),
            }
            if event == "cancel"
                && let Some(r) = &stored.session.running
            {
                self.runner.cancel(r).await;
            }
            let mut response = AiResponse {
                session_id: session_id.to_owned(),
                next_actions: flow.next_actions(&fired.session),
                error: None,
                errors: fired.session.errors.clone(),
                response: fired.response.clone(),
                progress: None,
            };
            if let Some(plan) = &fired.dag {
                response.progress = Some(AiProgress {
                    total_number_of_subtasks: plan.counted_tasks() as i64,
                    number_of_subtasks_executed: 0,
                    label: plan.label.clone(),
                });
            }
            if event == "cancel" {
                response.response = last_assistant(&dialogue);
            }
            return Ok(response);
        }
        Err(PortError::conflict("the session changed too often; retry").into())
    }

    /// `poll`: progress while a DAG runs; else the latest response, the
    /// current events and any task error.
    pub async fn poll(
        &self,
        product: &ProductId,
        flow: &Flow,
        session_id: &str,
    ) -> Result<AiResponse, FlowServiceError> {
        let (mut stored, mut dialogue) = self.load(product, flow, session_id).await?;
        // A run that ended without reaching the session (its worker lost
        // on the last attempt) is failed now, so no session waits forever.
        if let Some(r) = &stored.session.running
            && let Some(err) = self.runner.failure(r).await
        {
            self.apply_outcome(product, session_id, Err(err)).await?;
            (stored, dialogue) = self.load(product, flow, session_id).await?;
        }
        let s = &stored.session;
        let mut out = AiResponse {
            session_id: session_id.to_owned(),
            next_actions: flow.next_actions(s),
            error: s.errors.last().map(|e| e.message.clone()),
            errors: s.errors.clone(),
            response: None,
            progress: None,
        };
        match &s.running {
            Some(r) => {
                if let Some(p) = self
                    .store
                    .progress(product, session_id, &r.chain_id)
                    .await?
                {
                    out.progress = Some(AiProgress {
                        total_number_of_subtasks: p.total,
                        number_of_subtasks_executed: p.done,
                        label: p.label,
                    });
                }
            }
            None => out.response = last_assistant(&dialogue),
        }
        Ok(out)
    }

    /// `task_state`: `ready` when no DAG runs.
    pub async fn task_state(
        &self,
        product: &ProductId,
        flow_name: &str,
        session_id: &str,
    ) -> Result<Value, FlowServiceError> {
        let flow = self.flow(flow_name)?;
        let (stored, _) = self.load(product, &flow, session_id).await?;
        let ready = stored.session.running.is_none();
        Ok(json!({
            "session_id": session_id,
            "ready": ready,
            "next_actions": if ready { flow.next_actions(&stored.session) } else { Vec::new() },
        }))
    }

    /// `model`: the session and its dialogue as a JSON string in `response`.
    pub async fn model(
        &self,
        product: &ProductId,
        flow_name: &str,
        session_id: &str,
    ) -> Result<AiResponse, FlowServiceError> {
        let flow = self.flow(flow_name)?;
        let (stored, dialogue) = self.load(product, &flow, session_id).await?;
        let s = &stored.session;
        let mut model = serde_json::to_value(s).unwrap_or(Value::Null);
        if let Value::Object(m) = &mut model {
            m.insert("dialogue".into(), json!(dialogue));
            m.insert("version".into(), json!(stored.version));
        }
        Ok(AiResponse {
            session_id: session_id.to_owned(),
            next_actions: flow.next_actions(s),
            error: s.errors.last().map(|e| e.message.clone()),
            errors: s.errors.clone(),
            response: Some(model.to_string()),
            progress: None,
        })
    }

    /// Applies a finished DAG under compare-and-swap; the next DAG of an
    /// invoker->invoker hop is planned and enqueued in the same commit (its
    /// progress joins the chain), so progress never has a gap.
    pub async fn apply_outcome(
        &self,
        product: &ProductId,
        session_id: &str,
        outcome: Result<(String, String), TaskError>,
    ) -> Result<(), FlowServiceError> {
        for _ in 0..CAS_ATTEMPTS {
            let stored = self.store.load(product, session_id).await?;
            let flow = self.flow(&stored.session.flow)?;
            let dialogue = self.store.dialogue(product, session_id).await?;
            let now = self.clock.now();
            let Some(running) = stored.session.running.clone() else {
                return Ok(());
            };
            let from = stored.session.state.clone();
            let result = match &outcome {
                Ok((invocation, result)) => flow.complete(
                    &stored.session,
                    &dialogue,
                    invocation,
                    result,
                    &self.new_id(),
                    now,
                ),
                Err(err) => flow.fail(&stored.session, &dialogue, err.clone(), &self.new_id(), now),
            };
            let fired = match result {
                Ok(f) => f,
                // Cancelled or superseded: the result is dropped.
                Err(FlowError::StaleInvocation { .. }) => return Ok(()),
                Err(e) => return Err(e.into()),
            };
            // The completion task counts as done only when the DAG succeeded.
            let progress = match (&fired.dag, outcome.is_ok()) {
                (Some(plan), ok) => Some(ProgressUpdate {
                    chain_id: plan.chain_id.clone(),
                    add_total: plan.counted_tasks() as i64,
                    add_done: i64::from(ok && plan.chain_id == running.chain_id),
                    label: Some(plan.label.clone()),
                }),
                (None, true) => Some(ProgressUpdate {
                    chain_id: running.chain_id.clone(),
                    add_total: 0,
                    add_done: 1,
                    label: None,
                }),
                (None, false) => None,
            };
            let cause = if outcome.is_ok() {
                "dag_completed"
            } else {
                "dag_failed"
            };
            match self
                .commit(
                    product,
                    &fired,
                    stored.version,
                    progress,
                    audit_entry(product, &fired.session, Some(from), cause, now),
                    now,
                )
                .await
            {
                Ok(()) => {}
                Err(e) if e.kind == ErrorKind::Conflict => continue,
                Err(e) => return Err(e.into()),
            }
            return Ok(());
        }
        Err(PortError::conflict("the session changed too often").into())
    }
}

/// The audit entry of a flow transition to `s.state`.
fn audit_entry(
    product: &ProductId,
    s: &FlowSession,
    from: Option<String>,
    cause: &str,
    now: parlance_core::Timestamp,
) -> AuditEntry {
    AuditEntry {
        product_id: product.clone(),
        entity_kind: "flow".into(),
        entity_id: s.session_id.clone(),
        from,
        to: s.state.clone(),
        cause: cause.to_owned(),
        at: now,
        payload: json!({"flow": s.flow}),
    }
}

fn last_assistant(dialogue: &[DialogueElement]) -> Option<String> {
    dialogue
        .iter()
        .rev()
        .find(|e| e.actor == Actor::Assistant)
        .and_then(|e| e.actor_text.clone())
}
