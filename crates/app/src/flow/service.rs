//! The flow service: sessions, client events, polls and DAG outcomes.
//!
//! Every change of a session is a [`FlowCommand`] run through the
//! [`Executor`]: loaded, decided with the flow's [`FlowContext`] and
//! committed with its dialogue, progress, audit entry and DAG in one
//! commit, decided again when a compare-and-swap is lost. Answers come from
//! the decision's effects. Polls and the other reads write nothing, except
//! that a poll that finds the session's run ended without reaching it
//! decides the failure.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parlance_core::ProductId;
use parlance_core::flow::{
    ClientEvent, Email, Flow, FlowCommand, FlowContext, FlowEffect, FlowKey, FlowRecord,
    FlowSession, FlowSessionId, RunnerOptions, TaskError, User, reason,
};
use parlance_ports::{AuditLog, Clock, FlowStore, IdGen, LlmClient, MachineStore, Stored};
use serde::Serialize;
use serde_json::{Value, json};

use super::catalog::FlowCatalog;
use super::executor::DagRunner;
use super::invoker::{Invoker, Invokers};
use super::waiters::{RECHECK, Waiters};
use crate::execute::{Executed, Executor, ServiceError};

/// Progress as the reference's clients read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct AiProgress {
    /// Tasks counted so far in the running invoker chain.
    pub total_number_of_subtasks: i64,
    /// Tasks finished.
    pub number_of_subtasks_executed: i64,
    /// The state running now.
    pub label: String,
}

/// The reference's `AIResponse`, plus typed errors.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
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

/// The reference's `task_state` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[schema(as = FlowTaskState)]
pub struct TaskState {
    /// What the client may send next (empty while a DAG runs).
    pub next_actions: Vec<String>,
    /// Whether no DAG runs.
    pub ready: bool,
    /// The session.
    pub session_id: String,
}

/// The most session ids [`FlowService::user_sessions`] answers: the
/// newest this many.
pub const MAX_USER_SESSIONS: usize = 100;

/// How long a poll waits for a running task graph to end when a worker
/// runs in this process (see [`FlowService::set_poll_wait`]).
pub const POLL_WAIT: Duration = Duration::from_millis(250);

/// The flow service over its stores, a runner and a catalog.
pub struct FlowService {
    catalog: Arc<FlowCatalog>,
    records: Arc<dyn MachineStore<FlowRecord>>,
    audit: Arc<dyn AuditLog>,
    store: Arc<dyn FlowStore>,
    runner: Arc<dyn DagRunner>,
    options: RunnerOptions,
    clock: Arc<dyn Clock>,
    ids: Arc<dyn IdGen>,
    invokers: Invokers,
    /// Polls waiting for their session's run to end.
    waiters: Waiters,
    /// How long a poll of a running session waits for it to end, in
    /// milliseconds (0: it answers at once).
    poll_wait_ms: AtomicU64,
}

/// Everything the service is built from.
pub struct FlowDeps {
    /// Loaded flows.
    pub catalog: Arc<FlowCatalog>,
    /// Sessions with their dialogue, loaded and committed.
    pub records: Arc<dyn MachineStore<FlowRecord>>,
    /// The audit log the records' transitions are written to, read for a
    /// session's trail.
    pub audit: Arc<dyn AuditLog>,
    /// The flow store's own reads and progress counts.
    pub store: Arc<dyn FlowStore>,
    /// Stops runs and reports how they ended.
    pub runner: Arc<dyn DagRunner>,
    /// Attempts and timeout of the DAG nodes sessions enqueue.
    pub options: RunnerOptions,
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
            records: deps.records,
            audit: deps.audit,
            store: deps.store,
            runner: deps.runner,
            options: deps.options,
            clock: deps.clock,
            ids: deps.ids,
            invokers,
            waiters: Waiters::default(),
            poll_wait_ms: AtomicU64::new(0),
        })
    }

    /// Lets a poll of a session whose task graph runs wait up to `wait`
    /// for the run to end before it answers with the progress: woken as
    /// soon as the session's change commits in this process, and
    /// re-reading the session every 20 ms otherwise. Set when a worker
    /// runs in this process (the run usually ends here); zero (the
    /// default) answers at once.
    pub fn set_poll_wait(&self, wait: Duration) {
        let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        self.poll_wait_ms.store(ms, Ordering::Relaxed);
    }

    fn poll_wait(&self) -> Duration {
        Duration::from_millis(self.poll_wait_ms.load(Ordering::Relaxed))
    }

    /// The loaded flows.
    pub fn catalog(&self) -> &FlowCatalog {
        &self.catalog
    }

    /// The flow store's reads and progress counts.
    pub fn store(&self) -> &Arc<dyn FlowStore> {
        &self.store
    }

    /// The invokers by name.
    pub fn invokers(&self) -> &Invokers {
        &self.invokers
    }

    fn executor(&self) -> Executor<'_, FlowRecord> {
        Executor::new(&*self.records, &*self.clock)
    }

    fn context(&self, flow: &Arc<Flow>) -> FlowContext {
        FlowContext::new(flow.clone(), self.options)
    }

    fn new_id(&self) -> String {
        self.ids.new_uuid().to_string()
    }

    /// Runs `command` on the session at `key` of `flow`; a session of
    /// another flow is not found.
    async fn run(
        &self,
        key: &FlowKey,
        flow: &Arc<Flow>,
        command: FlowCommand,
    ) -> Result<Executed<FlowRecord>, ServiceError<FlowRecord>> {
        let done = self
            .executor()
            .run_with(key, &self.context(flow), |loaded| {
                let ours = loaded.is_none_or(|s| s.state.session().flow == flow.name());
                std::future::ready(if ours {
                    Ok(Some(command.clone()))
                } else {
                    Err(ServiceError::NotFound)
                })
            })
            .await?;
        // Committed: a poll waiting on the session reads it again.
        self.waiters.wake(key);
        Ok(done)
    }

    /// The session at `key` without its dialogue, if it runs `flow`.
    async fn session(
        &self,
        key: &FlowKey,
        flow: &Flow,
    ) -> Result<Stored<FlowSession>, ServiceError<FlowRecord>> {
        self.store
            .session(key)
            .await?
            .filter(|s| s.state.flow == flow.name())
            .ok_or(ServiceError::NotFound)
    }

    /// Starts a session of `flow` for `product`: the greeting is rendered
    /// and recorded.
    ///
    /// # Errors
    ///
    /// What the flow refuses (a hook or the greeting's template), or a
    /// storage failure.
    pub async fn start_session(
        &self,
        product: &ProductId,
        flow: &Arc<Flow>,
    ) -> Result<AiResponse, ServiceError<FlowRecord>> {
        self.start_session_with(product, flow, None, None).await
    }

    /// Starts a session of `flow` for `product` and `user_info`: the
    /// initial state's enter hooks and the greeting see `seed_data`, which
    /// is not kept; the session keeps the user.
    ///
    /// # Errors
    ///
    /// As [`FlowService::start_session`].
    pub async fn start_session_with(
        &self,
        product: &ProductId,
        flow: &Arc<Flow>,
        seed_data: Option<String>,
        user_info: Option<User>,
    ) -> Result<AiResponse, ServiceError<FlowRecord>> {
        let key = self.new_key(product);
        let command = FlowCommand::Start {
            seed_data,
            user_info,
        };
        let done = self.run(&key, flow, command).await?;
        Ok(AiResponse {
            session_id: key.session_id.to_string(),
            next_actions: flow.next_actions(done.state.session()),
            error: None,
            errors: Vec::new(),
            response: respond(&done),
            progress: None,
        })
    }

    /// Starts a session of `flow` for `product` and `user_info` and fires
    /// `event` with `input` on it, in one commit: no greeting; the initial
    /// state's enter hooks run, then the event. A refused event leaves no
    /// session. The session is marked `ephemeral` and kept like any other.
    ///
    /// # Errors
    ///
    /// What the flow refuses (the event, a validator, a hook, a template),
    /// or a storage failure.
    pub async fn start_ephemeral_session(
        &self,
        product: &ProductId,
        flow: &Arc<Flow>,
        user_info: Option<User>,
        event: &str,
        input: &str,
    ) -> Result<AiResponse, ServiceError<FlowRecord>> {
        let key = self.new_key(product);
        let command = FlowCommand::StartEphemeral {
            user_info,
            event: event.to_owned(),
            input: input.to_owned(),
            fresh_id: self.new_id(),
        };
        let done = self.run(&key, flow, command).await?;
        Ok(self.answer(&key, flow, &done))
    }

    /// The ids of `product`'s sessions of `flow` started for the user with
    /// `email`, newest first, at most [`MAX_USER_SESSIONS`].
    ///
    /// # Errors
    ///
    /// A storage failure.
    pub async fn user_sessions(
        &self,
        product: &ProductId,
        flow: &Flow,
        email: &Email,
    ) -> Result<Vec<FlowSessionId>, ServiceError<FlowRecord>> {
        Ok(self
            .store
            .user_sessions(product, flow.name(), email, MAX_USER_SESSIONS)
            .await?)
    }

    fn new_key(&self, product: &ProductId) -> FlowKey {
        FlowKey::new(
            product.clone(),
            FlowSessionId::from_uuid(self.ids.new_uuid()),
        )
    }

    /// The answer to a decided command: the session's next actions and
    /// errors, the decision's text and the progress it wrote.
    fn answer(&self, key: &FlowKey, flow: &Flow, done: &Executed<FlowRecord>) -> AiResponse {
        let session = done.state.session();
        AiResponse {
            session_id: key.session_id.to_string(),
            next_actions: flow.next_actions(session),
            error: None,
            errors: session.errors.clone(),
            response: respond(done),
            progress: done.decision.effects.iter().find_map(|e| match e {
                FlowEffect::Progress(p) => Some(AiProgress {
                    total_number_of_subtasks: p.add_total,
                    number_of_subtasks_executed: p.add_done,
                    label: p.label.clone().unwrap_or_default(),
                }),
                _ => None,
            }),
        }
    }

    /// Handles a client event: `poll` reads; `cancel`, `retry` and the
    /// flow's events are decided.
    ///
    /// # Errors
    ///
    /// [`ServiceError::NotFound`] for a session that is not this flow's,
    /// the flow's refusal, [`ServiceError::Contended`], or a storage failure.
    pub async fn event(
        &self,
        key: &FlowKey,
        flow: &Arc<Flow>,
        event: ClientEvent,
        input: &str,
    ) -> Result<AiResponse, ServiceError<FlowRecord>> {
        let fresh_id = match event {
            ClientEvent::Poll => return self.poll(key, flow).await,
            // A cancel starts nothing.
            ClientEvent::Cancel => String::new(),
            ClientEvent::Retry | ClientEvent::Flow(_) => self.new_id(),
        };
        let Some(command) = event.into_command(input, fresh_id) else {
            return self.poll(key, flow).await;
        };
        let done = self.run(key, flow, command).await?;
        for effect in &done.decision.effects {
            if let FlowEffect::CancelRun(running) = effect {
                self.runner.cancel(&key.product_id, running).await;
            }
        }
        Ok(self.answer(key, flow, &done))
    }

    /// `poll`: progress while a DAG runs; else the latest response, the
    /// current events and any task error. A run that ended without reaching
    /// the session (its worker lost on the last attempt, or cancelled by an
    /// operator) is failed first, so no session waits forever.
    ///
    /// # Errors
    ///
    /// [`ServiceError::NotFound`] for a session that is not this flow's, or
    /// a storage failure.
    pub async fn poll(
        &self,
        key: &FlowKey,
        flow: &Arc<Flow>,
    ) -> Result<AiResponse, ServiceError<FlowRecord>> {
        let wait = self.poll_wait();
        let (mut stored, mut reply) = if wait.is_zero() {
            self.session_with_reply(key, flow).await?
        } else {
            self.session_after_run(key, flow, wait).await?
        };
        if let Some(r) = &stored.state.running
            && let Some(err) = self.runner.failure(&key.product_id, r).await
        {
            self.fail(key, flow, err).await?;
            (stored, reply) = self.session_with_reply(key, flow).await?;
        }
        let s = &stored.state;
        let mut out = AiResponse {
            session_id: key.session_id.to_string(),
            next_actions: flow.next_actions(s),
            error: s.errors.last().map(|e| e.message.clone()),
            errors: s.errors.clone(),
            response: None,
            progress: None,
        };
        match &s.running {
            Some(r) => {
                if let Some(p) = self.store.progress(key, &r.chain_id).await? {
                    out.progress = Some(AiProgress {
                        total_number_of_subtasks: p.total,
                        number_of_subtasks_executed: p.done,
                        label: p.label,
                    });
                }
            }
            None => out.response = reply,
        }
        Ok(out)
    }

    /// The session at `key`, if it runs `flow`, with its latest reply (one
    /// read).
    async fn session_with_reply(
        &self,
        key: &FlowKey,
        flow: &Flow,
    ) -> Result<(Stored<FlowSession>, Option<String>), ServiceError<FlowRecord>> {
        self.store
            .session_with_reply(key)
            .await?
            .filter(|(s, _)| s.state.flow == flow.name())
            .ok_or(ServiceError::NotFound)
    }

    /// The session (with its latest reply) once its run has ended, or as
    /// it is after `wait`.
    async fn session_after_run(
        &self,
        key: &FlowKey,
        flow: &Arc<Flow>,
        wait: Duration,
    ) -> Result<(Stored<FlowSession>, Option<String>), ServiceError<FlowRecord>> {
        let deadline = tokio::time::Instant::now() + wait;
        let waiter = self.waiters.waiter(key);
        loop {
            // Enabled before the read, so a commit between the read and
            // the wait still wakes it.
            let woken = waiter.notify().notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let stored = self.session_with_reply(key, flow).await?;
            let now = tokio::time::Instant::now();
            if stored.0.state.running.is_none() || now >= deadline {
                return Ok(stored);
            }
            let _ = tokio::time::timeout_at(deadline.min(now + RECHECK), woken).await;
        }
    }

    /// `task_state`: `ready` when no DAG runs.
    ///
    /// # Errors
    ///
    /// [`ServiceError::NotFound`] for a session that is not this flow's, or
    /// a storage failure.
    pub async fn task_state(
        &self,
        key: &FlowKey,
        flow: &Flow,
    ) -> Result<TaskState, ServiceError<FlowRecord>> {
        let stored = self.session(key, flow).await?;
        let ready = stored.state.running.is_none();
        Ok(TaskState {
            next_actions: if ready {
                flow.next_actions(&stored.state)
            } else {
                Vec::new()
            },
            ready,
            session_id: key.session_id.to_string(),
        })
    }

    /// The log the sessions' transitions are written to, once `key` is
    /// known to be a session of `flow`.
    ///
    /// # Errors
    ///
    /// [`ServiceError::NotFound`] for a session that is not this flow's, or
    /// a storage failure.
    pub async fn audit_of(
        &self,
        key: &FlowKey,
        flow: &Flow,
    ) -> Result<&dyn AuditLog, ServiceError<FlowRecord>> {
        self.session(key, flow).await?;
        Ok(self.audit.as_ref())
    }

    /// `model`: the session and its dialogue as a JSON string in `response`.
    ///
    /// # Errors
    ///
    /// [`ServiceError::NotFound`] for a session that is not this flow's, or
    /// a storage failure.
    pub async fn model(
        &self,
        key: &FlowKey,
        flow: &Flow,
    ) -> Result<AiResponse, ServiceError<FlowRecord>> {
        let (mut answer, model) = self.model_value(key, flow).await?;
        answer.response = Some(model.to_string());
        Ok(answer)
    }

    /// `model` as a value beside an answer without `response`: the
    /// session, its dialogue and its version as one JSON object, for a
    /// caller that shows part of it.
    ///
    /// # Errors
    ///
    /// As [`FlowService::model`].
    pub async fn model_value(
        &self,
        key: &FlowKey,
        flow: &Flow,
    ) -> Result<(AiResponse, Value), ServiceError<FlowRecord>> {
        let Stored { state, version } = self
            .records
            .load(key)
            .await?
            .filter(|s| s.state.session().flow == flow.name())
            .ok_or(ServiceError::NotFound)?;
        let (_, session, dialogue) = state.into_parts();
        let mut model = serde_json::to_value(&session).unwrap_or(Value::Null);
        if let Value::Object(m) = &mut model {
            // The reference's `state` is the state's value; the id stays
            // beside it as `state_name`.
            if let Some(state) = m.get_mut("state") {
                *state = flow.state_value(&session.state);
            }
            m.insert("state_name".into(), json!(session.state));
            m.insert("dialogue".into(), json!(dialogue));
            m.insert("version".into(), json!(version));
        }
        let answer = AiResponse {
            session_id: key.session_id.to_string(),
            next_actions: flow.next_actions(&session),
            error: session.errors.last().map(|e| e.message.clone()),
            errors: session.errors.clone(),
            response: None,
            progress: None,
        };
        Ok((answer, model))
    }

    /// Applies a finished DAG: the invoker state's completion event fires
    /// with `result`; an invoker->invoker hop enqueues the next DAG in the
    /// same commit (its progress joins the chain), so progress never has a
    /// gap. The result of a run the session no longer waits for is dropped.
    ///
    /// # Errors
    ///
    /// What the flow refuses, [`ServiceError::NotFound`] when the session
    /// is gone, [`ServiceError::Contended`], or a storage failure.
    pub async fn complete(
        &self,
        key: &FlowKey,
        flow: &Arc<Flow>,
        invocation_id: String,
        result: String,
    ) -> Result<(), ServiceError<FlowRecord>> {
        let command = FlowCommand::Complete {
            invocation_id,
            result,
            fresh_id: self.new_id(),
        };
        self.outcome(key, flow, command).await
    }

    /// Applies a failed DAG: the error is recorded and the invoker state's
    /// `on_error` followed if declared. The failure of a run the session no
    /// longer waits for is dropped.
    ///
    /// # Errors
    ///
    /// As [`FlowService::complete`].
    pub async fn fail(
        &self,
        key: &FlowKey,
        flow: &Arc<Flow>,
        error: TaskError,
    ) -> Result<(), ServiceError<FlowRecord>> {
        let command = FlowCommand::Fail {
            error,
            fresh_id: self.new_id(),
        };
        self.outcome(key, flow, command).await
    }

    async fn outcome(
        &self,
        key: &FlowKey,
        flow: &Arc<Flow>,
        command: FlowCommand,
    ) -> Result<(), ServiceError<FlowRecord>> {
        match self.run(key, flow, command).await {
            Ok(_) => Ok(()),
            // Cancelled or superseded: the outcome is dropped.
            Err(ServiceError::Refused { error, .. })
                if error.reason() == Some(reason::STALE_INVOCATION) =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

/// The text a decision answers with.
fn respond(done: &Executed<FlowRecord>) -> Option<String> {
    done.decision.effects.iter().find_map(|e| match e {
        FlowEffect::Respond(text) => Some(text.clone()),
        _ => None,
    })
}
