//! Parlance's service: use-case services, the HTTP API, workers, the timer
//! sweepers and the `parlance` command line.
//!
//! Layer: top. Depends on every other `parlance-*` crate except the testkit
//! (a dev-dependency); nothing depends on it. This is the only crate that
//! installs a tracing subscriber, reads configuration and picks adapters: the
//! in-memory ones by default, PostgreSQL when a database URL is given.
//!
//! The crate root is the composition root: [`Components`] holds the adapters
//! a process runs on (chosen from a [`Config`] by
//! [`Components::from_config`]), [`Components::build`] makes the one
//! [`AppState`] from them, and [`router`] assembles every feature's routes.
//! Features (`session`, `adoption`, `conversation`, `flow`, `agent`) depend on
//! `http`, `execute` and `state`; nothing below the root depends on a feature
//! except the entry points (`cli`, `demo`).

#![forbid(unsafe_code)]

pub mod adoption;
pub mod agent;
pub mod auth;
pub mod budget;
pub mod cli;
pub mod config;
pub mod console;
pub mod conversation;
pub mod demo;
pub mod execute;
pub mod flow;
pub mod http;
pub mod models;
pub mod monitoring;
pub mod session;
pub mod state;
mod telemetry;
pub mod turn;
pub mod worker;

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context as _;
use axum::Extension;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware;
use parlance_core::ProductId;
use parlance_core::flow::{FlowRecord, RunnerOptions};
use parlance_memory::{
    HashingEmbedder, LoopbackChannel, MemoryAdoptionStore, MemoryAuditLog, MemoryCheckpointStore,
    MemoryConversationStore, MemoryFlowStore, MemoryMemoryStore, MemorySessionStore,
    MemoryTaskQueue, MemoryTourCatalogs,
};
use parlance_ports::{
    AuditLog, Channel, Clock, EmbeddingProvider, IdGen, LlmClient, QueueConfig, SystemClock,
    TaskQueue, UuidV7Ids, WorkerId,
};
use parlance_postgres::{
    PgAdoptionStore, PgAuditLog, PgCheckpointStore, PgConversationStore, PgCrisisLog, PgFlowStore,
    PgMemoryStore, PgPool, PgSessionStore, PgTaskQueue, PgTourCatalogs,
};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use config::{Config, Flags, LogFormat};
pub use state::{Backend, Shared};

use crate::adoption::Adoptions;
use crate::agent::{Agent, AgentData};
use crate::auth::{ApiKey, ApiKeys};
use crate::conversation::Conversations;
use crate::flow::{FlowCatalog, FlowDeps, FlowService, Flows, Invoker, Invokers, QueueRunner};
use crate::session::{CATALOG_TTL, CachedTourCatalogs, Sessions};
use crate::worker::{EmbeddedWorker, Handlers, Worker, WorkerConfig};

/// Everything a process serves, built once by [`Components::build`]: the
/// shared ports and one state per feature.
#[derive(Clone)]
pub struct AppState {
    /// Where state is kept.
    pub backend: Backend,
    /// Time, ids, the audit log, the queue and the models.
    pub shared: Shared,
    /// API keys and the products they open.
    pub keys: Arc<ApiKeys>,
    /// Largest accepted request body, in bytes.
    pub body_limit: usize,
    /// The session machine.
    pub sessions: Sessions,
    /// The adoption state.
    pub adoption: Adoptions,
    /// Conversation instances.
    pub conversations: Conversations,
    /// Flows.
    pub flows: Flows,
    /// The support agent.
    pub agent: Agent,
    /// Time budgets of requests, per route family.
    pub budgets: budget::Budgets,
    /// CORS and the per-key rate limit.
    pub edge: http::Edge,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("backend", &self.backend.name())
            .field("shared", &self.shared)
            .finish_non_exhaustive()
    }
}

/// The adapters and settings a process runs on. [`Components::from_config`]
/// chooses them from the configuration; tests start from
/// [`Components::memory`] and replace what they need before
/// [`Components::build`].
pub struct Components {
    /// Memory or PostgreSQL: every store is made on it.
    pub backend: Backend,
    /// The time source.
    pub clock: Arc<dyn Clock>,
    /// The id source.
    pub ids: Arc<dyn IdGen>,
    /// The language model.
    pub llm: Arc<dyn LlmClient>,
    /// The embedder.
    pub embedder: Arc<dyn EmbeddingProvider>,
    /// Where outbound conversation messages go.
    pub channel: Arc<dyn Channel>,
    /// The flows served.
    pub flows: FlowCatalog,
    /// Invokers registered from Rust, beside `template`, `llm`, `llm_json`.
    pub invokers: BTreeMap<String, Arc<dyn Invoker>>,
    /// Retries and timeouts of flow task graphs.
    pub runner: RunnerOptions,
    /// The support agent's resource directory and knowledge base.
    pub agent_data: AgentData,
    /// API keys and the products they open.
    pub keys: ApiKeys,
    /// Largest accepted request body, in bytes.
    pub body_limit: usize,
    /// Queue tuning (worker staleness, back-off, DAG limits).
    pub queue: QueueConfig,
    /// The queue's own clock, when it must differ from `clock` (a test that
    /// moves the service's clock by hand while retries back off in real
    /// time); `clock` when `None`.
    pub queue_clock: Option<Arc<dyn Clock>>,
    /// Time budgets of requests, per route family, and the crisis gate's.
    pub budgets: budget::Budgets,
    /// CORS and the per-key rate limit (both off by default).
    pub edge: http::Edge,
    /// How often a thread's history keeps a full copy of its objects
    /// (`agent.snapshot_every`).
    pub snapshot_every: u64,
    /// Whether erasing an owner's memory also deletes the owner's crisis
    /// log (`agent.erase_crisis_log`; off: the log is kept).
    pub erase_crisis_log: bool,
}

impl Components {
    /// The embedded default: in-memory adapters, the system clock, UUIDv7
    /// ids, the offline model ([`models::offline_llm`]) and embedder, the
    /// loopback channel, no flows.
    pub fn memory(keys: ApiKeys) -> Self {
        Self::on(Backend::Memory, keys)
    }

    /// The same on PostgreSQL (`pool` must be migrated).
    pub fn postgres(pool: PgPool, keys: ApiKeys) -> Self {
        Self::on(Backend::Postgres(pool), keys)
    }

    fn on(backend: Backend, keys: ApiKeys) -> Self {
        Self {
            backend,
            clock: Arc::new(SystemClock),
            ids: Arc::new(UuidV7Ids),
            llm: Arc::new(models::offline_llm()),
            embedder: Arc::new(HashingEmbedder::default()),
            channel: Arc::new(LoopbackChannel::new()),
            flows: FlowCatalog::new(),
            invokers: BTreeMap::new(),
            runner: RunnerOptions::default(),
            agent_data: AgentData::default(),
            keys,
            body_limit: Config::default().server.body_limit,
            queue: QueueConfig::default(),
            queue_clock: None,
            budgets: budget::Budgets::default(),
            edge: http::Edge::default(),
            snapshot_every: parlance_core::turn::DEFAULT_SNAPSHOT_EVERY,
            erase_crisis_log: false,
        }
    }

    /// The components `config` describes: PostgreSQL (migrated) when a
    /// database URL is given, memory otherwise; an OpenAI-compatible model
    /// when a base URL is given; flows, the agent's files and the webhook
    /// channel as configured. `keys` are the in-memory keys; with a
    /// database, the stored keys are accepted too.
    ///
    /// # Errors
    ///
    /// When the database cannot be reached or migrated, or a configured
    /// file or endpoint cannot be used; the message names the setting.
    pub async fn from_config(config: &Config, keys: ApiKeys) -> anyhow::Result<Self> {
        let mut c = match config.database_url() {
            None => Self::memory(keys),
            Some(url) => {
                let pool = parlance_postgres::connect(&url, &config.pool_options())?;
                parlance_postgres::migrate(&pool)
                    .await
                    .with_context(|| format!("migrate {url}"))?;
                let keys = keys.with_store(parlance_postgres::PgApiKeys::new(pool.clone()));
                Self::postgres(pool, keys)
            }
        };
        let models = models::Models::from_config(&config.llm)?;
        c.llm = models.llm;
        c.embedder = models.embedder;
        c.body_limit = config.server.body_limit;
        c.queue = config.worker.queue_config();
        c.budgets = config.budget.budgets();
        c.edge = http::Edge::default()
            .with_cors(config.cors.policy()?)
            .with_rate_limit(config.rate_limit.limit());
        if let Some(dir) = &config.flows.dir {
            c.flows = FlowCatalog::load_dir(dir, &Invokers::is_builtin)
                .with_context(|| format!("`flows.dir` {}", dir.display()))?;
        }
        c.snapshot_every = config.agent.snapshot_every;
        c.erase_crisis_log = config.agent.erase_crisis_log;
        c.agent_data = AgentData::load(
            config.agent.resource_directory.as_deref(),
            config.agent.knowledge_base.as_deref(),
        )?;
        if let Some(url) = &config.channel.webhook_url {
            let var = &config.channel.webhook_secret_env;
            let secret = std::env::var(var).with_context(|| {
                format!("`channel.webhook_url` needs a signing secret in ${var}")
            })?;
            c.channel = Arc::new(conversation::WebhookChannel::new(
                url.clone(),
                secret,
                std::time::Duration::from_secs(10),
            )?);
        }
        Ok(c)
    }

    /// Makes every store on the backend and the one [`AppState`].
    pub fn build(self) -> AppState {
        let Components {
            backend,
            clock,
            ids,
            llm,
            embedder,
            channel,
            flows,
            invokers,
            runner,
            agent_data,
            keys,
            body_limit,
            queue: queue_config,
            queue_clock,
            budgets,
            edge,
            snapshot_every,
            erase_crisis_log,
        } = self;
        monitoring::install();
        let queue_clock = queue_clock.unwrap_or_else(|| clock.clone());
        let stores = match &backend {
            Backend::Memory => Stores::memory(queue_clock, queue_config, snapshot_every),
            Backend::Postgres(pool) => {
                Stores::postgres(pool, queue_clock, queue_config, snapshot_every)
            }
        };
        let shared = Shared {
            clock,
            ids,
            audit: stores.audit,
            queue: stores.queue.clone(),
            // Every model and embedding call made while serving a request
            // ends by the request's deadline; each model call is metered,
            // deadline timeouts included.
            llm: Arc::new(monitoring::MeteredLlm::new(Arc::new(
                budget::BudgetedLlm::new(llm),
            ))),
            embedder: Arc::new(budget::BudgetedEmbedder::new(embedder)),
        };
        let flows = FlowService::new(FlowDeps {
            catalog: Arc::new(flows),
            records: stores.flow_records,
            audit: shared.audit.clone(),
            store: stores.flows,
            runner: Arc::new(QueueRunner::new(stores.queue)),
            options: runner,
            clock: shared.clock.clone(),
            ids: shared.ids.clone(),
            llm: shared.llm.clone(),
            extra_invokers: invokers,
        });
        AppState {
            backend,
            keys: Arc::new(keys),
            body_limit,
            sessions: Sessions {
                shared: shared.clone(),
                store: stores.sessions,
                due: stores.due_sessions,
                tours: stores.tours,
            },
            adoption: Adoptions {
                shared: shared.clone(),
                records: stores.adoption_records,
                store: stores.adoption,
            },
            conversations: Conversations {
                shared: shared.clone(),
                store: stores.conversations,
                index: stores.conversation_index,
                channel,
            },
            flows,
            agent: Agent {
                shared: shared.clone(),
                threads: stores.threads,
                memory_store: stores.memory_store,
                crisis_log: stores.crisis_log,
                agent_data: Arc::new(agent_data),
                crisis_budget: budgets.crisis_gate,
                erase_crisis_log,
            },
            shared,
            budgets,
            edge,
        }
    }
}

/// Every store, made on one backend.
struct Stores {
    audit: Arc<dyn AuditLog>,
    queue: Arc<dyn TaskQueue>,
    sessions: Arc<dyn parlance_ports::MachineStore<parlance_core::session::SessionState>>,
    due_sessions: Arc<dyn parlance_ports::SessionStore>,
    tours: Arc<dyn parlance_ports::TourCatalogStore>,
    adoption_records:
        Arc<dyn parlance_ports::MachineStore<parlance_core::adoption::UserAdoptionState>>,
    adoption: Arc<dyn parlance_ports::AdoptionStore>,
    conversations: Arc<dyn parlance_ports::MachineStore<parlance_core::conversation::Instance>>,
    conversation_index: Arc<dyn parlance_ports::ConversationStore>,
    flow_records: Arc<dyn parlance_ports::MachineStore<FlowRecord>>,
    flows: Arc<dyn parlance_ports::FlowStore>,
    threads: Arc<dyn parlance_ports::Checkpointer>,
    memory_store: Arc<dyn parlance_ports::MemoryStore>,
    crisis_log: Arc<dyn parlance_ports::CrisisLog>,
}

impl Stores {
    fn memory(clock: Arc<dyn Clock>, config: QueueConfig, snapshot_every: u64) -> Self {
        let audit = Arc::new(MemoryAuditLog::new());
        let queue: Arc<dyn TaskQueue> = Arc::new(MemoryTaskQueue::new(clock, config));
        let sessions = Arc::new(MemorySessionStore::new(audit.clone(), queue.clone()));
        let adoption = Arc::new(MemoryAdoptionStore::new(audit.clone(), queue.clone()));
        let flows = Arc::new(MemoryFlowStore::with_queue(
            audit.clone(),
            queue.clone(),
            config.dag_limits,
        ));
        let conversations = Arc::new(MemoryConversationStore::new(audit.clone(), queue.clone()));
        let memory_store = Arc::new(MemoryMemoryStore::new());
        let threads = MemoryCheckpointStore::new(audit.clone())
            .with_snapshot_every(snapshot_every)
            .with_memory_store(memory_store.clone());
        Self {
            sessions: sessions.clone(),
            due_sessions: sessions,
            tours: Arc::new(MemoryTourCatalogs::new()),
            adoption_records: adoption.clone(),
            adoption,
            conversations: conversations.clone(),
            conversation_index: conversations,
            flow_records: flows.clone(),
            flows,
            // A turn's crisis assessment is written with the turn.
            crisis_log: threads.crisis_log(),
            threads: Arc::new(threads),
            memory_store,
            audit,
            queue,
        }
    }

    fn postgres(
        pool: &PgPool,
        clock: Arc<dyn Clock>,
        config: QueueConfig,
        snapshot_every: u64,
    ) -> Self {
        let queue = PgTaskQueue::new(pool.clone(), clock, config);
        let sessions = Arc::new(PgSessionStore::new(pool.clone(), queue.clone()));
        let adoption = Arc::new(PgAdoptionStore::new(pool.clone(), queue.clone()));
        let flows = Arc::new(PgFlowStore::with_queue(
            pool.clone(),
            Arc::new(queue.clone()),
        ));
        let conversations = Arc::new(PgConversationStore::new(pool.clone(), queue.clone()));
        Self {
            audit: Arc::new(PgAuditLog::new(pool.clone())),
            sessions: sessions.clone(),
            due_sessions: sessions,
            tours: Arc::new(CachedTourCatalogs::new(
                Arc::new(PgTourCatalogs::new(pool.clone())),
                CATALOG_TTL,
            )),
            adoption_records: adoption.clone(),
            adoption,
            conversations: conversations.clone(),
            conversation_index: conversations,
            flow_records: flows.clone(),
            flows,
            threads: Arc::new(
                PgCheckpointStore::new(pool.clone()).with_snapshot_every(snapshot_every),
            ),
            memory_store: Arc::new(PgMemoryStore::new(pool.clone())),
            crisis_log: Arc::new(PgCrisisLog::new(pool.clone())),
            queue: Arc::new(queue),
        }
    }
}

impl AppState {
    /// The in-memory service with the system clock.
    pub fn memory(keys: ApiKeys) -> Self {
        Components::memory(keys).build()
    }

    /// The in-memory service with the given clock and ids.
    pub fn memory_with(keys: ApiKeys, clock: Arc<dyn Clock>, ids: Arc<dyn IdGen>) -> Self {
        let mut c = Components::memory(keys);
        c.clock = clock;
        c.ids = ids;
        c.build()
    }

    /// The service on PostgreSQL (`pool` must be migrated), system clock.
    pub fn postgres(pool: PgPool, keys: ApiKeys) -> Self {
        Components::postgres(pool, keys).build()
    }

    /// The task handlers this service's workers run: every kind a machine
    /// enqueues.
    pub fn handlers(&self) -> Handlers {
        let mut handlers = Handlers::new();
        conversation::register_handlers(&mut handlers, &self.conversations);
        flow::register_handlers(&mut handlers, &self.flows);
        handlers
    }

    /// A worker on this service's queue with its handlers.
    pub fn worker(&self, config: WorkerConfig) -> Worker {
        Worker::new(
            WorkerId(self.shared.ids.new_uuid()),
            self.shared.queue.clone(),
            self.handlers(),
            self.shared.clock.clone(),
            config,
        )
    }

    /// Starts a worker in this process. Flow task graphs then usually end
    /// here, so a poll of a running session waits up to
    /// [`flow::POLL_WAIT`] for its run to end instead of answering "still
    /// running" at once.
    pub fn start_worker(&self, config: WorkerConfig) -> EmbeddedWorker {
        self.flows.set_poll_wait(flow::POLL_WAIT);
        EmbeddedWorker::spawn(self.worker(config))
    }

    /// Starts the timer sweepers: each claims only what is due, so any
    /// number of processes can run them on one database.
    pub fn spawn_sweepers(&self) -> Vec<tokio::task::JoinHandle<()>> {
        vec![
            session::spawn_session_sweeper(self.sessions.clone()),
            conversation::spawn_sweeper(self.conversations.clone()),
        ]
    }
}

/// The key for product `default`: the configured one, or a fresh one.
///
/// # Errors
///
/// When no key is configured and the system has no randomness.
pub fn default_key(config: &Config) -> anyhow::Result<ApiKey> {
    match &config.server.api_key {
        Some(k) if !k.expose().trim().is_empty() => Ok(ApiKey::new(k.expose().trim())),
        _ => ApiKey::generate().context("generate an API key"),
    }
}

/// The in-memory keys of a process started from `config`: `key` opens
/// product `default`.
pub fn keys_for(key: &ApiKey) -> ApiKeys {
    ApiKeys::single(key, ProductId::default_product())
}

/// The whole service: health probes, metrics, the API document and the
/// operator console open, every feature's routes under `/v1` behind a key
/// (and its rate limit), every answer with a request id and an access line,
/// CORS when configured.
pub fn router(state: &AppState) -> Router {
    let (router, doc) = api(state);
    let doc = http::openapi::Document::render(&doc);
    let app = router
        .fallback(http::not_found)
        .method_not_allowed_fallback(http::method_not_allowed)
        .layer(Extension(doc))
        .layer(middleware::from_fn(http::problem_json))
        .layer(DefaultBodyLimit::max(state.body_limit))
        .layer(middleware::from_fn_with_state(
            state.body_limit,
            http::reject_large_bodies,
        ))
        .layer(middleware::from_fn(http::reject_large_heads));
    state
        .edge
        .wrap(app)
        .layer(middleware::from_fn(monitoring::track_http))
}

/// The API document (OpenAPI 3.1) of the service, as `GET /openapi.json`
/// serves it: made from the same route definitions the router serves.
pub fn openapi_document(state: &AppState) -> utoipa::openapi::OpenApi {
    api(state).1
}

/// Every route with its state, and the document the same definitions make.
fn api(state: &AppState) -> (Router, utoipa::openapi::OpenApi) {
    let (v1, v1_doc) = OpenApiRouter::new()
        .merge(session::routes().with_state(state.sessions.clone()))
        .merge(adoption::routes().with_state(state.adoption.clone()))
        .merge(conversation::routes().with_state(state.conversations.clone()))
        .merge(flow::routes().with_state(state.flows.clone()))
        .merge(agent::routes().with_state(state.agent.clone()))
        .routes(routes!(auth::me))
        .split_for_parts();
    let v1_doc = http::openapi::document_tags(v1_doc);
    let v1 = v1
        .fallback(http::not_found)
        .method_not_allowed_fallback(http::method_not_allowed)
        .route_layer(middleware::from_fn(http::check_params))
        .layer(middleware::from_fn(http::etag::tag_reads));
    let v1 = state
        .edge
        .limit_keys(v1)
        .layer(middleware::from_fn_with_state(
            state.keys.clone(),
            auth::require_key,
        ))
        .layer(middleware::from_fn_with_state(
            state.budgets,
            http::enforce_budget,
        ));
    let (root, doc) =
        OpenApiRouter::<Backend>::with_openapi(<http::openapi::Head as utoipa::OpenApi>::openapi())
            .routes(routes!(http::health::healthz))
            .routes(routes!(http::health::readyz))
            .routes(routes!(http::openapi::document))
            .routes(routes!(monitoring::render))
            .split_for_parts();
    // The console is served beside the API, not described in its document.
    (
        root.with_state(state.backend.clone())
            .nest("/v1", v1)
            .merge(console::router()),
        doc.nest("/v1", v1_doc),
    )
}
