//! What every feature shares: the backend, time, ids, the audit log, the
//! task queue and the models. Each feature keeps its own stores beside it;
//! nothing here names a feature.

use std::sync::Arc;
use std::time::Duration;

use parlance_ports::{
    AuditLog, Clock, EmbeddingProvider, IdGen, LlmClient, PortError, PortResult, TaskQueue,
};
use parlance_postgres::PgPool;

/// Where state is kept.
#[derive(Debug, Clone)]
pub enum Backend {
    /// In process; lost on exit.
    Memory,
    /// A PostgreSQL database (migrated).
    Postgres(PgPool),
}

impl Backend {
    /// `"memory"` or `"postgres"`.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Postgres(_) => "postgres",
        }
    }

    /// Whether the backend answers now (within two seconds).
    pub async fn check(&self) -> PortResult<()> {
        match self {
            Backend::Memory => Ok(()),
            Backend::Postgres(pool) => {
                tokio::time::timeout(Duration::from_secs(2), parlance_postgres::ping(pool))
                    .await
                    .unwrap_or_else(|_| {
                        Err(PortError::unavailable("database did not answer within 2s"))
                    })
            }
        }
    }
}

/// The ports every feature uses, cheaply cloned.
#[derive(Clone)]
pub struct Shared {
    /// The time source.
    pub clock: Arc<dyn Clock>,
    /// The id source.
    pub ids: Arc<dyn IdGen>,
    /// Every transition of every machine.
    pub audit: Arc<dyn AuditLog>,
    /// The durable task queue.
    pub queue: Arc<dyn TaskQueue>,
    /// The language model (offline unless configured).
    pub llm: Arc<dyn LlmClient>,
    /// The embedder (feature hashing unless configured).
    pub embedder: Arc<dyn EmbeddingProvider>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("llm", &self.llm.describe())
            .field("embedder", &self.embedder.model())
            .finish_non_exhaustive()
    }
}
