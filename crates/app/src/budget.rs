//! Request budgets: every request under `/v1` gets a deadline from its
//! route family ([`Family`]), set when it arrives (`http::budget::enforce`).
//!
//! The deadline is visible to everything the request runs
//! ([`current`]): the model and the embedder ([`BudgetedLlm`],
//! [`BudgetedEmbedder`]) hand it to every call, cut by a reserve
//! ([`Deadline::model_deadline`]) so that what follows a model that did
//! not answer (a fallback, the commit) still fits; the turn runner commits
//! no turn whose budget ran out while it was planned. When the budget runs
//! out the request stops where it is and the client gets a 504
//! `deadline-exceeded` (`http::budget::exhausted`); every commit is one atomic write,
//! so a stopped request has committed either a whole commit or nothing.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use axum::http::Method;
use parlance_ports::{
    CompletionRequest, CompletionResponse, CompletionStream, EmbeddingProvider, Embeddings,
    LlmClient, LlmError, LlmResult,
};

/// The longest part of a budget kept back from model calls for what
/// follows them.
const MODEL_RESERVE_MAX: Duration = Duration::from_secs(1);

/// A family of routes sharing a budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Commands to the machines: sessions, adoption, conversations.
    Commands,
    /// Agent turns and the agent's other writes (ending a session, memory,
    /// thread forks, updates and deletion, erasure).
    Agent,
    /// Flow sessions and their events (`/ai/...`).
    Flows,
    /// Reads (`GET`, `HEAD`) other than starting a flow session.
    Reads,
}

impl Family {
    /// The family of a request to `path` (below `/v1`) with `method`.
    pub fn of(method: &Method, path: &str) -> Self {
        let read =
            (method == Method::GET || method == Method::HEAD) && !path.ends_with("/start_session");
        if read {
            Family::Reads
        } else if path.starts_with("/ai/") || path.contains("/ai/") {
            Family::Flows
        } else if path.contains("/agent/") {
            Family::Agent
        } else {
            Family::Commands
        }
    }

    /// Its name, for logs and answers.
    pub fn as_str(self) -> &'static str {
        match self {
            Family::Commands => "commands",
            Family::Agent => "agent",
            Family::Flows => "flows",
            Family::Reads => "reads",
        }
    }
}

/// The budget of each family, and the crisis gate's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budgets {
    /// Machine commands.
    pub commands: Duration,
    /// Agent turns and the agent's other writes.
    pub agent: Duration,
    /// Flow sessions and events.
    pub flows: Duration,
    /// Reads.
    pub reads: Duration,
    /// How long the crisis gate waits for the model before its keyword
    /// classifier decides.
    pub crisis_gate: Duration,
}

impl Default for Budgets {
    /// 30 s for commands, agent turns and flows, 10 s for reads, 3 s for
    /// the crisis gate's model.
    fn default() -> Self {
        Self {
            commands: Duration::from_secs(30),
            agent: Duration::from_secs(30),
            flows: Duration::from_secs(30),
            reads: Duration::from_secs(10),
            crisis_gate: Duration::from_secs(3),
        }
    }
}

impl Budgets {
    /// The budget of `family`.
    pub fn of(&self, family: Family) -> Duration {
        match family {
            Family::Commands => self.commands,
            Family::Agent => self.agent,
            Family::Flows => self.flows,
            Family::Reads => self.reads,
        }
    }
}

/// The deadline of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    /// The request's family.
    pub family: Family,
    /// Its whole budget.
    pub budget: Duration,
    /// When it runs out.
    pub at: Instant,
}

impl Deadline {
    /// A deadline `budget` after `now`.
    pub fn new(family: Family, budget: Duration, now: Instant) -> Self {
        Self {
            family,
            budget,
            at: now + budget,
        }
    }

    /// When model calls must have ended: the deadline less a tenth of the
    /// budget (at most a second), kept for what follows them.
    pub fn model_deadline(&self) -> Instant {
        self.at - (self.budget / 10).min(MODEL_RESERVE_MAX)
    }

    /// True once the deadline has passed.
    pub fn expired(&self, now: Instant) -> bool {
        now >= self.at
    }
}

tokio::task_local! {
    static CURRENT: Deadline;
}

/// The deadline of the request being served, if any (none outside a
/// request: in a worker, a sweeper, a test calling a service directly).
pub fn current() -> Option<Deadline> {
    CURRENT.try_with(|d| *d).ok()
}

/// Runs `f` with `deadline` as the [`current`] one, without stopping it:
/// what it calls observes the deadline on its own.
pub async fn scoped<F: Future>(deadline: Deadline, f: F) -> F::Output {
    CURRENT.scope(deadline, f).await
}

/// Runs `f` with `deadline` as the [`current`] one, stopping it when the
/// deadline passes (`None` then).
pub async fn within<F: Future>(deadline: Deadline, f: F) -> Option<F::Output> {
    tokio::time::timeout_at(deadline.at.into(), CURRENT.scope(deadline, f))
        .await
        .ok()
}

/// A model whose every call ends by the request's model deadline: the
/// request carries it (the earlier one wins when the caller set its own),
/// and the call is stopped there even when the model ignores it.
pub struct BudgetedLlm {
    inner: Arc<dyn LlmClient>,
}

impl BudgetedLlm {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn LlmClient>) -> Self {
        Self { inner }
    }

    fn bounded(request: &CompletionRequest) -> CompletionRequest {
        match current() {
            Some(d) => request.clone().with_deadline(d.model_deadline()),
            None => request.clone(),
        }
    }
}

/// Runs `f`, stopping it at `until` (when given) as a model timeout.
async fn until<T>(until: Option<Instant>, f: impl Future<Output = LlmResult<T>>) -> LlmResult<T> {
    let Some(at) = until else {
        return f.await;
    };
    let started = Instant::now();
    tokio::time::timeout_at(at.into(), f)
        .await
        .unwrap_or_else(|_| {
            Err(LlmError::Timeout {
                after: started.elapsed(),
            })
        })
}

#[async_trait]
impl LlmClient for BudgetedLlm {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn default_model(&self) -> &str {
        self.inner.default_model()
    }

    async fn complete(&self, request: &CompletionRequest) -> LlmResult<CompletionResponse> {
        let request = Self::bounded(request);
        until(request.deadline, self.inner.complete(&request)).await
    }

    async fn stream(&self, request: &CompletionRequest) -> LlmResult<CompletionStream> {
        let request = Self::bounded(request);
        until(request.deadline, self.inner.stream(&request)).await
    }
}

/// An embedder whose every call ends by the request's model deadline.
pub struct BudgetedEmbedder {
    inner: Arc<dyn EmbeddingProvider>,
}

impl BudgetedEmbedder {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn EmbeddingProvider>) -> Self {
        Self { inner }
    }
}

#[async_trait]
impl EmbeddingProvider for BudgetedEmbedder {
    fn model(&self) -> &str {
        self.inner.model()
    }

    fn dimension(&self) -> Option<usize> {
        self.inner.dimension()
    }

    async fn embed(&self, texts: &[String]) -> LlmResult<Embeddings> {
        until(
            current().map(|d| d.model_deadline()),
            self.inner.embed(texts),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_by_method_and_path() {
        let cases = [
            (Method::GET, "/products/acme/agent/threads/t", Family::Reads),
            (Method::POST, "/products/acme/agent/turns", Family::Agent),
            (Method::GET, "/products/acme/agent/threads", Family::Reads),
            (
                Method::GET,
                "/products/acme/agent/threads/t/history",
                Family::Reads,
            ),
            (
                Method::GET,
                "/products/acme/agent/threads/t/checkpoints/3",
                Family::Reads,
            ),
            (
                Method::POST,
                "/products/acme/agent/threads/t/fork",
                Family::Agent,
            ),
            (
                Method::POST,
                "/products/acme/agent/threads/t/state",
                Family::Agent,
            ),
            (
                Method::DELETE,
                "/products/acme/agent/threads/t",
                Family::Agent,
            ),
            (
                Method::DELETE,
                "/products/acme/agent/memory/ana",
                Family::Agent,
            ),
            (Method::POST, "/ai/qa/event", Family::Flows),
            (Method::GET, "/ai/qa/start_session", Family::Flows),
            (Method::GET, "/ai/qa/task_state/s1", Family::Reads),
            (
                Method::POST,
                "/products/acme/users/u/adoption/welcome",
                Family::Commands,
            ),
            (
                Method::POST,
                "/products/acme/sessions/s/events",
                Family::Commands,
            ),
        ];
        for (method, path, family) in cases {
            assert_eq!(Family::of(&method, path), family, "{method} {path}");
        }
    }

    #[test]
    fn model_calls_leave_a_reserve() {
        let now = Instant::now();
        let d = Deadline::new(Family::Agent, Duration::from_secs(2), now);
        assert_eq!(d.model_deadline(), now + Duration::from_millis(1800));
        let d = Deadline::new(Family::Agent, Duration::from_secs(60), now);
        assert_eq!(d.model_deadline(), now + Duration::from_secs(59));
        assert!(!d.expired(now));
        assert!(d.expired(now + Duration::from_secs(60)));
    }

    #[tokio::test]
    async fn the_model_gets_the_request_deadline() {
        let offline = Arc::new(parlance_memory::OfflineLlm::new());
        let llm = BudgetedLlm::new(offline.clone());
        let request = CompletionRequest::new(vec![parlance_ports::Message::user("hi")]);
        llm.complete(&request).await.unwrap();
        assert_eq!(offline.received().last().unwrap().deadline, None);
        let now = Instant::now();
        let d = Deadline::new(Family::Commands, Duration::from_secs(10), now);
        within(d, llm.complete(&request)).await.unwrap().unwrap();
        assert_eq!(
            offline.received().last().unwrap().deadline,
            Some(d.model_deadline())
        );
        let earlier = request.clone().with_deadline(now + Duration::from_secs(1));
        within(d, llm.complete(&earlier)).await.unwrap().unwrap();
        assert_eq!(
            offline.received().last().unwrap().deadline,
            Some(now + Duration::from_secs(1))
        );
    }
}
