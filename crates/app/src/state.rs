//! What every request handler shares: the adapters behind the ports.

use std::sync::Arc;
use std::time::Duration;

use std::collections::BTreeMap;

use parlance_memory::{
    HashingEmbedder, LoopbackChannel, MemoryAdoptionStore, MemoryAuditLog, MemoryCheckpointer,
    MemoryConversationStore, MemoryCrisisLog, MemoryFlowStore, MemoryMemoryStore,
    MemorySessionStore, MemoryTaskQueue, MemoryTourCatalogs, OfflineLlm,
};
use parlance_ports::{
    AdoptionStore, AuditLog, Channel, Checkpointer, Clock, ConversationStore, CrisisLog,
    EmbeddingProvider, FlowStore, IdGen, LlmClient, MemoryStore, PortError, PortResult,
    QueueConfig, SessionStore, SystemClock, TaskQueue, TourCatalogStore, UuidV7Ids,
};
use parlance_postgres::{
    PgAdoptionStore, PgAuditLog, PgCheckpointer, PgConversationStore, PgCrisisLog, PgFlowStore,
    PgMemoryStore, PgPool, PgSessionStore, PgTaskQueue, PgTourCatalogs,
};

use crate::agent::AgentData;
use crate::auth::ApiKeys;
use crate::flow::{
    DagRunner, FlowCatalog, FlowDeps, FlowService, Invoker, QueueRunner, RunnerOptions,
};
use crate::session::{CATALOG_TTL, CachedTourCatalogs};

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

/// Shared, cheaply cloned service state.
#[derive(Clone)]
pub struct AppState {
    /// The storage backend.
    pub backend: Backend,
    /// Every transition, with its cause.
    pub audit: Arc<dyn AuditLog>,
    /// User adoption records, onboarding plans and tour catalogs.
    pub adoption: Arc<dyn AdoptionStore>,
    /// The durable task queue.
    pub queue: Arc<dyn TaskQueue>,
    /// Turn checkpoints per thread.
    pub checkpointer: Arc<dyn Checkpointer>,
    /// Long-term memory per owner.
    pub memory_store: Arc<dyn MemoryStore>,
    /// The support agent's crisis assessments.
    pub crisis_log: Arc<dyn CrisisLog>,
    /// The support agent's resource directory and knowledge base.
    pub agent_data: Arc<AgentData>,
    /// Session assistance states.
    pub sessions: Arc<dyn SessionStore>,
    /// Each product's tour catalog.
    pub tours: Arc<dyn TourCatalogStore>,
    /// The time source.
    pub clock: Arc<dyn Clock>,
    /// The id source.
    pub ids: Arc<dyn IdGen>,
    /// API keys and the products they open.
    pub keys: Arc<ApiKeys>,
    /// Largest accepted request body, in bytes.
    pub body_limit: usize,
    /// The language model (offline unless configured).
    pub llm: Arc<dyn LlmClient>,
    /// The embedder (feature hashing unless configured).
    pub embedder: Arc<dyn EmbeddingProvider>,
    /// Conversation instances, transcripts and delivery keys.
    pub conversations: Arc<dyn ConversationStore>,
    /// Where outbound conversation messages go.
    pub channel: Arc<dyn Channel>,
    /// Flow sessions.
    pub flow_store: Arc<dyn FlowStore>,
    /// The flows loaded at start-up (`--flows`).
    pub flow_catalog: Arc<FlowCatalog>,
    /// Compiles flow task DAGs for the task queue (`queue`), and cancels
    /// them.
    pub flow_runner: Arc<dyn DagRunner>,
    /// Invokers registered from Rust, beside `template`, `llm`, `llm_json`.
    pub flow_invokers: BTreeMap<String, Arc<dyn Invoker>>,
}

impl AppState {
    /// State on the in-memory adapters with the system clock.
    pub fn memory(keys: ApiKeys) -> Self {
        Self::memory_with(keys, Arc::new(SystemClock), Arc::new(UuidV7Ids))
    }

    /// State on the in-memory adapters with the given clock and ids.
    pub fn memory_with(keys: ApiKeys, clock: Arc<dyn Clock>, ids: Arc<dyn IdGen>) -> Self {
        let audit = Arc::new(MemoryAuditLog::new());
        let queue: Arc<dyn TaskQueue> =
            Arc::new(MemoryTaskQueue::new(clock.clone(), QueueConfig::default()));
        Self {
            backend: Backend::Memory,
            conversations: Arc::new(MemoryConversationStore::new(audit.clone(), queue.clone())),
            channel: Arc::new(LoopbackChannel::new()),
            sessions: Arc::new(MemorySessionStore::new(audit.clone())),
            flow_store: Arc::new(MemoryFlowStore::with_queue(audit.clone(), queue.clone())),
            tours: Arc::new(MemoryTourCatalogs::new()),
            audit,
            adoption: Arc::new(MemoryAdoptionStore::new()),
            flow_runner: Arc::new(QueueRunner::new(queue.clone(), RunnerOptions::default())),
            queue,
            checkpointer: Arc::new(MemoryCheckpointer::new()),
            memory_store: Arc::new(MemoryMemoryStore::new()),
            crisis_log: Arc::new(MemoryCrisisLog::new()),
            agent_data: Arc::new(AgentData::default()),
            clock,
            ids,
            keys: Arc::new(keys),
            body_limit: 1024 * 1024,
            llm: Arc::new(OfflineLlm::new()),
            embedder: Arc::new(HashingEmbedder::default()),
            flow_catalog: Arc::new(FlowCatalog::new()),
            flow_invokers: BTreeMap::new(),
        }
    }

    /// State on PostgreSQL (the pool must be migrated) with the system clock.
    pub fn postgres(pool: PgPool, keys: ApiKeys) -> Self {
        let queue = Arc::new(PgTaskQueue::new(
            pool.clone(),
            Arc::new(SystemClock),
            QueueConfig::default(),
        ));
        Self {
            audit: Arc::new(PgAuditLog::new(pool.clone())),
            conversations: Arc::new(PgConversationStore::new(pool.clone(), (*queue).clone())),
            channel: Arc::new(LoopbackChannel::new()),
            adoption: Arc::new(PgAdoptionStore::new(pool.clone())),
            flow_store: Arc::new(PgFlowStore::with_queue(pool.clone(), queue.clone())),
            flow_runner: Arc::new(QueueRunner::new(queue.clone(), RunnerOptions::default())),
            queue,
            checkpointer: Arc::new(PgCheckpointer::new(pool.clone())),
            memory_store: Arc::new(PgMemoryStore::new(pool.clone())),
            crisis_log: Arc::new(PgCrisisLog::new(pool.clone())),
            agent_data: Arc::new(AgentData::default()),
            sessions: Arc::new(PgSessionStore::new(pool.clone())),
            tours: Arc::new(CachedTourCatalogs::new(
                Arc::new(PgTourCatalogs::new(pool.clone())),
                CATALOG_TTL,
            )),
            backend: Backend::Postgres(pool),
            clock: Arc::new(SystemClock),
            ids: Arc::new(UuidV7Ids),
            keys: Arc::new(keys),
            body_limit: 1024 * 1024,
            llm: Arc::new(OfflineLlm::new()),
            embedder: Arc::new(HashingEmbedder::default()),
            flow_catalog: Arc::new(FlowCatalog::new()),
            flow_invokers: BTreeMap::new(),
        }
    }

    /// The flow service on this state's adapters.
    pub fn flow_service(&self) -> Arc<FlowService> {
        FlowService::new(FlowDeps {
            catalog: self.flow_catalog.clone(),
            store: self.flow_store.clone(),
            runner: self.flow_runner.clone(),
            clock: self.clock.clone(),
            ids: self.ids.clone(),
            llm: self.llm.clone(),
            extra_invokers: self.flow_invokers.clone(),
        })
    }
}
