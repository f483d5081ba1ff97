//! One configuration for every command: defaults, then a TOML file
//! (`--config`), then environment variables, then command-line flags, each
//! overriding the one before. [`SETTINGS`] lists every setting once, with its
//! file key, its environment variables and its flag; `examples/parlance.toml`
//! documents each of them.
//!
//! The layers are merged with figment; [`Config::validate`] then checks what
//! one layer alone cannot (a model needs a base URL, a worker needs a
//! database), naming the setting in every spelling a user may have used.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use figment::Figment;
use figment::providers::{Format as _, Serialized, Toml};
use parlance_postgres::{DatabaseUrl, PoolOptions};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Pretty,
    /// One JSON object per line.
    Json,
}

/// A value that must never reach a log: `Debug` shows `***`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself: hand it only to what needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The HTTP service.
    pub server: ServerConfig,
    /// Where state is kept.
    pub database: DatabaseConfig,
    /// The language model and the embedder.
    pub llm: LlmConfig,
    /// Flow definitions.
    pub flows: FlowsConfig,
    /// The support agent's operator files.
    pub agent: AgentConfig,
    /// Where outbound conversation messages go.
    pub channel: ChannelConfig,
    /// Task workers (the one inside `serve` and `parlance worker`).
    pub worker: WorkerSettings,
    /// Time budgets of requests.
    pub budget: BudgetConfig,
    /// Which browser pages may call the API.
    pub cors: CorsConfig,
    /// Requests per API key.
    pub rate_limit: RateLimitConfig,
    /// Logging.
    pub log: LogConfig,
}

/// `[server]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address to listen on.
    pub bind: SocketAddr,
    /// The API key of product `default`; generated and printed once when
    /// absent.
    pub api_key: Option<Secret>,
    /// Largest accepted request body, in bytes.
    pub body_limit: usize,
    /// Whether `serve` runs a task worker in its own process.
    pub embedded_worker: bool,
    /// How long a client has to send a request head, in seconds.
    pub header_read_timeout_secs: u64,
    /// How long a client has to send a request body after its head, in
    /// seconds.
    pub body_read_timeout_secs: u64,
    /// How long a kept-alive connection may wait for its next request, or a
    /// response wait for the client to read it, in seconds.
    pub idle_timeout_secs: u64,
    /// Most connections open at once.
    pub max_connections: usize,
    /// On shutdown, how long open requests may finish, in seconds.
    pub drain_secs: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], 8080)),
            api_key: None,
            body_limit: 1024 * 1024,
            embedded_worker: true,
            header_read_timeout_secs: 10,
            body_read_timeout_secs: 30,
            idle_timeout_secs: 60,
            max_connections: 10_000,
            drain_secs: 15,
        }
    }
}

impl ServerConfig {
    /// The connection limits these settings describe.
    pub fn serve_options(&self) -> crate::http::ServeOptions {
        crate::http::ServeOptions {
            header_read_timeout: Duration::from_secs(self.header_read_timeout_secs),
            body_read_timeout: Duration::from_secs(self.body_read_timeout_secs),
            idle_timeout: Duration::from_secs(self.idle_timeout_secs),
            max_connections: self.max_connections,
            drain: Duration::from_secs(self.drain_secs),
        }
    }
}

/// `[database]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseConfig {
    /// PostgreSQL URL; without one, state lives in memory and is lost on
    /// exit.
    pub url: Option<Secret>,
    /// Most connections each process holds open.
    pub max_connections: u32,
    /// How long a request waits for a free connection, in seconds.
    pub acquire_timeout_secs: u64,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        let pool = PoolOptions::default();
        Self {
            url: None,
            max_connections: pool.max_connections,
            acquire_timeout_secs: pool.acquire_timeout.as_secs(),
        }
    }
}

/// `[llm]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LlmConfig {
    /// Base URL of an OpenAI-compatible API; without one, the offline,
    /// deterministic model answers.
    pub base_url: Option<String>,
    /// The chat model (on Azure OpenAI, the deployment name).
    pub model: Option<String>,
    /// Name of the environment variable holding the API key.
    pub api_key_env: String,
    /// Per-attempt timeout of a model call, in seconds.
    pub timeout_secs: u64,
    /// Embedding model served at `base_url`; the offline feature-hashing
    /// embedder without one.
    pub embedding_model: Option<String>,
}

impl Default for LlmConfig {
    fn default() -> Self {
        Self {
            base_url: None,
            model: None,
            api_key_env: "OPENAI_API_KEY".to_owned(),
            timeout_secs: 60,
            embedding_model: None,
        }
    }
}

/// `[flows]`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FlowsConfig {
    /// Directory of flows: one sub-directory per flow with `flow.yaml` and
    /// a `templates/` folder.
    pub dir: Option<PathBuf>,
}

/// `[agent]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    /// The crisis resource directory (JSON).
    pub resource_directory: Option<PathBuf>,
    /// The knowledge base (JSON).
    pub knowledge_base: Option<PathBuf>,
    /// Whether erasing an owner's memory (`DELETE .../agent/memory/{owner}`)
    /// also deletes the owner's crisis log. Off by default: the crisis log
    /// is a safety record and outlives the memory.
    pub erase_crisis_log: bool,
    /// How often a thread's history keeps a full copy of its objects: every
    /// this many checkpoints (at least 1). Reading a thread as of an older
    /// checkpoint folds at most this many patches.
    pub snapshot_every: u64,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            resource_directory: None,
            knowledge_base: None,
            erase_crisis_log: false,
            snapshot_every: parlance_core::turn::DEFAULT_SNAPSHOT_EVERY,
        }
    }
}

/// `[channel]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChannelConfig {
    /// Deliver outbound messages by POSTing them here, signed; the
    /// in-process loopback channel without one.
    pub webhook_url: Option<String>,
    /// Name of the environment variable holding the webhook signing secret.
    pub webhook_secret_env: String,
}

impl Default for ChannelConfig {
    fn default() -> Self {
        Self {
            webhook_url: None,
            webhook_secret_env: "PARLANCE_WEBHOOK_SECRET".to_owned(),
        }
    }
}

/// `[budget]`: how long a request may take, per route family, in
/// milliseconds; past it the client gets 504 `deadline-exceeded`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BudgetConfig {
    /// Machine commands (sessions, adoption, conversations).
    pub commands_ms: u64,
    /// Agent turns and the agent's other writes.
    pub agent_ms: u64,
    /// Flow sessions and events.
    pub flows_ms: u64,
    /// Reads.
    pub reads_ms: u64,
    /// How long the crisis gate waits for the model before its keyword
    /// classifier decides.
    pub crisis_gate_ms: u64,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        let b = crate::budget::Budgets::default();
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Self {
            commands_ms: ms(b.commands),
            agent_ms: ms(b.agent),
            flows_ms: ms(b.flows),
            reads_ms: ms(b.reads),
            crisis_gate_ms: ms(b.crisis_gate),
        }
    }
}

impl BudgetConfig {
    /// The budgets the router enforces.
    pub fn budgets(&self) -> crate::budget::Budgets {
        crate::budget::Budgets {
            commands: Duration::from_millis(self.commands_ms),
            agent: Duration::from_millis(self.agent_ms),
            flows: Duration::from_millis(self.flows_ms),
            reads: Duration::from_millis(self.reads_ms),
            crisis_gate: Duration::from_millis(self.crisis_gate_ms),
        }
    }
}

/// `[cors]`: the browser origins whose pages may call the API, and what
/// they may send. With no origin, CORS is off: no answer carries a CORS
/// header and a preflight is routed like any request (401 under `/v1`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CorsConfig {
    /// Origins (`scheme://host[:port]`) allowed, or `*` for any.
    pub allowed_origins: Vec<String>,
    /// Methods a page may use.
    pub allowed_methods: Vec<String>,
    /// Request headers a page may send.
    pub allowed_headers: Vec<String>,
    /// How long a browser may cache a preflight answer, in seconds.
    pub max_age_secs: u64,
}

impl Default for CorsConfig {
    fn default() -> Self {
        Self {
            allowed_origins: Vec::new(),
            allowed_methods: ["GET", "POST", "PUT", "PATCH", "DELETE"]
                .map(str::to_owned)
                .to_vec(),
            allowed_headers: ["authorization", "content-type", "x-request-id"]
                .map(str::to_owned)
                .to_vec(),
            max_age_secs: 600,
        }
    }
}

impl CorsConfig {
    /// The CORS policy these settings describe; `None` when no origin is
    /// allowed (CORS off).
    ///
    /// # Errors
    ///
    /// An origin, method or header that does not parse, naming the setting.
    pub fn policy(&self) -> Result<Option<crate::http::CorsPolicy>, ConfigError> {
        let origins: Vec<&str> = self
            .allowed_origins
            .iter()
            .map(|o| o.trim())
            .filter(|o| !o.is_empty())
            .collect();
        if origins.is_empty() {
            return Ok(None);
        }
        let origins = if origins == ["*"] {
            None
        } else {
            let mut parsed = Vec::new();
            for o in origins {
                parsed.push(crate::http::parse_origin(o).map_err(|problem| {
                    ConfigError::setting("cors.allowed_origins", format!("{o:?}: {problem}"))
                })?);
            }
            Some(parsed)
        };
        let mut methods = Vec::new();
        for m in &self.allowed_methods {
            methods.push(
                axum::http::Method::from_bytes(m.trim().to_ascii_uppercase().as_bytes()).map_err(
                    |_| ConfigError::setting("cors.allowed_methods", format!("{m:?} is no method")),
                )?,
            );
        }
        let mut headers = Vec::new();
        for h in &self.allowed_headers {
            headers.push(
                axum::http::HeaderName::from_bytes(h.trim().to_ascii_lowercase().as_bytes())
                    .map_err(|_| {
                        ConfigError::setting(
                            "cors.allowed_headers",
                            format!("{h:?} is no header name"),
                        )
                    })?,
            );
        }
        Ok(Some(crate::http::CorsPolicy {
            origins,
            methods,
            headers,
            max_age: Duration::from_secs(self.max_age_secs),
        }))
    }
}

/// `[rate_limit]`: how many requests each API key may make, per process.
/// Off (`per_second = 0`) by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RateLimitConfig {
    /// Requests per second a key may make on average; 0 turns the limit
    /// off.
    pub per_second: u32,
    /// Requests a key may make at once, beyond the average.
    pub burst: u32,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        Self {
            per_second: 0,
            burst: 50,
        }
    }
}

impl RateLimitConfig {
    /// The limit these settings describe; `None` when off.
    pub fn limit(&self) -> Option<crate::http::RateLimit> {
        crate::http::RateLimit::new(self.per_second, self.burst)
    }
}

/// `[worker]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerSettings {
    /// The queue to claim from.
    pub queue: String,
    /// Tasks run at once.
    pub slots: usize,
    /// Deadline of an attempt whose task sets none, in seconds.
    pub lease_secs: u64,
    /// Heartbeat interval, in milliseconds.
    pub heartbeat_ms: u64,
    /// A worker silent this long is dead and loses its tasks, in seconds.
    pub stale_after_secs: u64,
    /// Interval of the lease sweep, in milliseconds.
    pub sweep_ms: u64,
    /// Finished tasks and runs (a run with its DAG nodes and edges) are
    /// deleted after this many hours.
    pub retention_hours: u64,
    /// On shutdown, how long running tasks may finish, in seconds.
    pub grace_secs: u64,
    /// Also run the `test.sleep` and `test.record` kinds (end-to-end
    /// tests only).
    pub test_handlers: bool,
    /// Where `parlance worker` serves `GET /metrics`; none when unset
    /// (`serve` answers `/metrics` on its own address).
    pub metrics_bind: Option<SocketAddr>,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        Self {
            queue: parlance_ports::queue::DEFAULT_QUEUE.to_owned(),
            slots: 4,
            lease_secs: 300,
            heartbeat_ms: 5_000,
            stale_after_secs: 30,
            sweep_ms: 5_000,
            retention_hours: 24,
            grace_secs: 10,
            test_handlers: false,
            metrics_bind: None,
        }
    }
}

/// `[log]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// `pretty` or `json` (the filter comes from `RUST_LOG`).
    pub format: LogFormat,
}

/// How a setting's text from the environment becomes a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Text (a URL, a name, a path).
    Text,
    /// A whole number.
    Number,
    /// `true` or `false` (also `1`/`0`, `yes`/`no`).
    Switch,
    /// A list, comma-separated in the environment.
    List,
}

/// One setting: where it lives in the file, which environment variables
/// and flag set it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// The file key, `section.name`.
    pub key: &'static str,
    /// Environment variables that set it, the documented one first.
    pub env: &'static [&'static str],
    /// The command-line flag, if there is one.
    pub flag: Option<&'static str>,
    /// How environment text is read.
    pub kind: Kind,
}

impl Setting {
    /// Every spelling of the setting, for messages.
    pub fn spellings(&self) -> String {
        let mut s = format!("`{}`", self.key);
        if let Some(env) = self.env.first() {
            s.push_str(&format!(", ${env}"));
        }
        if let Some(flag) = self.flag {
            s.push_str(&format!(", --{flag}"));
        }
        s
    }
}

const fn setting(
    key: &'static str,
    env: &'static [&'static str],
    flag: Option<&'static str>,
    kind: Kind,
) -> Setting {
    Setting {
        key,
        env,
        flag,
        kind,
    }
}

/// Every setting, in file order.
pub const SETTINGS: &[Setting] = &[
    setting("server.bind", &["PARLANCE_BIND"], Some("bind"), Kind::Text),
    setting(
        "server.api_key",
        &["PARLANCE_API_KEY"],
        Some("api-key"),
        Kind::Text,
    ),
    setting(
        "server.body_limit",
        &["PARLANCE_BODY_LIMIT"],
        Some("body-limit"),
        Kind::Number,
    ),
    setting(
        "server.embedded_worker",
        &["PARLANCE_EMBEDDED_WORKER"],
        Some("no-worker"),
        Kind::Switch,
    ),
    setting(
        "server.header_read_timeout_secs",
        &["PARLANCE_HEADER_READ_TIMEOUT_SECS"],
        Some("header-read-timeout"),
        Kind::Number,
    ),
    setting(
        "server.body_read_timeout_secs",
        &["PARLANCE_BODY_READ_TIMEOUT_SECS"],
        Some("body-read-timeout"),
        Kind::Number,
    ),
    setting(
        "server.idle_timeout_secs",
        &["PARLANCE_IDLE_TIMEOUT_SECS"],
        Some("idle-timeout"),
        Kind::Number,
    ),
    setting(
        "server.max_connections",
        &["PARLANCE_MAX_CONNECTIONS"],
        Some("max-connections"),
        Kind::Number,
    ),
    setting(
        "server.drain_secs",
        &["PARLANCE_DRAIN_SECS"],
        Some("drain-secs"),
        Kind::Number,
    ),
    setting(
        "database.url",
        &["DATABASE_URL", "PARLANCE_DATABASE_URL"],
        Some("database-url"),
        Kind::Text,
    ),
    setting(
        "database.max_connections",
        &["PARLANCE_DATABASE_MAX_CONNECTIONS"],
        None,
        Kind::Number,
    ),
    setting(
        "database.acquire_timeout_secs",
        &["PARLANCE_DATABASE_ACQUIRE_TIMEOUT_SECS"],
        None,
        Kind::Number,
    ),
    setting(
        "llm.base_url",
        &["PARLANCE_LLM_BASE_URL"],
        Some("llm-base-url"),
        Kind::Text,
    ),
    setting(
        "llm.model",
        &["PARLANCE_LLM_MODEL"],
        Some("llm-model"),
        Kind::Text,
    ),
    setting(
        "llm.api_key_env",
        &["PARLANCE_LLM_API_KEY_ENV"],
        Some("llm-api-key-env"),
        Kind::Text,
    ),
    setting(
        "llm.timeout_secs",
        &["PARLANCE_LLM_TIMEOUT_SECS", "PARLANCE_LLM_TIMEOUT"],
        Some("llm-timeout"),
        Kind::Number,
    ),
    setting(
        "llm.embedding_model",
        &["PARLANCE_LLM_EMBEDDING_MODEL", "PARLANCE_EMBEDDING_MODEL"],
        Some("embedding-model"),
        Kind::Text,
    ),
    setting(
        "flows.dir",
        &["PARLANCE_FLOWS_DIR", "PARLANCE_FLOWS"],
        Some("flows"),
        Kind::Text,
    ),
    setting(
        "agent.resource_directory",
        &[
            "PARLANCE_AGENT_RESOURCE_DIRECTORY",
            "PARLANCE_RESOURCE_DIRECTORY",
        ],
        Some("resource-directory"),
        Kind::Text,
    ),
    setting(
        "agent.knowledge_base",
        &["PARLANCE_AGENT_KNOWLEDGE_BASE", "PARLANCE_KNOWLEDGE_BASE"],
        Some("knowledge-base"),
        Kind::Text,
    ),
    setting(
        "agent.erase_crisis_log",
        &["PARLANCE_AGENT_ERASE_CRISIS_LOG"],
        None,
        Kind::Switch,
    ),
    setting(
        "agent.snapshot_every",
        &["PARLANCE_AGENT_SNAPSHOT_EVERY"],
        None,
        Kind::Number,
    ),
    setting(
        "channel.webhook_url",
        &["PARLANCE_CHANNEL_WEBHOOK_URL", "PARLANCE_WEBHOOK_URL"],
        Some("webhook-url"),
        Kind::Text,
    ),
    setting(
        "channel.webhook_secret_env",
        &["PARLANCE_CHANNEL_WEBHOOK_SECRET_ENV"],
        Some("webhook-secret-env"),
        Kind::Text,
    ),
    setting(
        "worker.queue",
        &["PARLANCE_WORKER_QUEUE"],
        Some("queue"),
        Kind::Text,
    ),
    setting(
        "worker.slots",
        &["PARLANCE_WORKER_SLOTS"],
        Some("slots"),
        Kind::Number,
    ),
    setting(
        "worker.lease_secs",
        &["PARLANCE_WORKER_LEASE_SECS"],
        Some("lease-secs"),
        Kind::Number,
    ),
    setting(
        "worker.heartbeat_ms",
        &["PARLANCE_WORKER_HEARTBEAT_MS"],
        Some("heartbeat-ms"),
        Kind::Number,
    ),
    setting(
        "worker.stale_after_secs",
        &["PARLANCE_WORKER_STALE_AFTER_SECS"],
        Some("stale-after-secs"),
        Kind::Number,
    ),
    setting(
        "worker.sweep_ms",
        &["PARLANCE_WORKER_SWEEP_MS"],
        Some("sweep-ms"),
        Kind::Number,
    ),
    setting(
        "worker.retention_hours",
        &["PARLANCE_WORKER_RETENTION_HOURS"],
        Some("retention-hours"),
        Kind::Number,
    ),
    setting(
        "worker.grace_secs",
        &["PARLANCE_WORKER_GRACE_SECS"],
        Some("grace-secs"),
        Kind::Number,
    ),
    setting(
        "worker.test_handlers",
        &["PARLANCE_WORKER_TEST_HANDLERS"],
        Some("test-handlers"),
        Kind::Switch,
    ),
    setting(
        "worker.metrics_bind",
        &["PARLANCE_WORKER_METRICS_BIND"],
        Some("metrics-bind"),
        Kind::Text,
    ),
    setting(
        "budget.commands_ms",
        &["PARLANCE_BUDGET_COMMANDS_MS"],
        None,
        Kind::Number,
    ),
    setting(
        "budget.agent_ms",
        &["PARLANCE_BUDGET_AGENT_MS"],
        None,
        Kind::Number,
    ),
    setting(
        "budget.flows_ms",
        &["PARLANCE_BUDGET_FLOWS_MS"],
        None,
        Kind::Number,
    ),
    setting(
        "budget.reads_ms",
        &["PARLANCE_BUDGET_READS_MS"],
        None,
        Kind::Number,
    ),
    setting(
        "budget.crisis_gate_ms",
        &["PARLANCE_BUDGET_CRISIS_GATE_MS"],
        None,
        Kind::Number,
    ),
    setting(
        "cors.allowed_origins",
        &["PARLANCE_CORS_ALLOWED_ORIGINS"],
        None,
        Kind::List,
    ),
    setting(
        "cors.allowed_methods",
        &["PARLANCE_CORS_ALLOWED_METHODS"],
        None,
        Kind::List,
    ),
    setting(
        "cors.allowed_headers",
        &["PARLANCE_CORS_ALLOWED_HEADERS"],
        None,
        Kind::List,
    ),
    setting(
        "cors.max_age_secs",
        &["PARLANCE_CORS_MAX_AGE_SECS"],
        None,
        Kind::Number,
    ),
    setting(
        "rate_limit.per_second",
        &["PARLANCE_RATE_LIMIT_PER_SECOND"],
        None,
        Kind::Number,
    ),
    setting(
        "rate_limit.burst",
        &["PARLANCE_RATE_LIMIT_BURST"],
        None,
        Kind::Number,
    ),
    setting(
        "log.format",
        &["PARLANCE_LOG_FORMAT"],
        Some("log-format"),
        Kind::Text,
    ),
];

/// The setting with file key `key`.
///
/// # Panics
///
/// When `key` is not in [`SETTINGS`] (a programming error).
pub fn setting_for(key: &str) -> &'static Setting {
    SETTINGS
        .iter()
        .find(|s| s.key == key)
        .unwrap_or_else(|| panic!("unknown setting {key}"))
}

/// Command-line flags, shared by every command that reads the
/// configuration. Each overrides the file and the environment.
#[derive(Debug, Clone, Default, Args)]
pub struct Flags {
    /// A TOML configuration file (see `examples/parlance.toml`).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address to listen on (`server.bind`).
    #[arg(long)]
    pub bind: Option<SocketAddr>,
    /// The API key of product `default` (`server.api_key`).
    #[arg(long, hide_env_values = true)]
    pub api_key: Option<String>,
    /// Largest accepted request body, in bytes (`server.body_limit`).
    #[arg(long)]
    pub body_limit: Option<usize>,
    /// Run no task worker inside `serve` (`server.embedded_worker = false`).
    #[arg(long)]
    pub no_worker: bool,
    /// Request head timeout, in seconds (`server.header_read_timeout_secs`).
    #[arg(long)]
    pub header_read_timeout: Option<u64>,
    /// Request body timeout, in seconds (`server.body_read_timeout_secs`).
    #[arg(long)]
    pub body_read_timeout: Option<u64>,
    /// Keep-alive and send idle timeout, in seconds
    /// (`server.idle_timeout_secs`).
    #[arg(long)]
    pub idle_timeout: Option<u64>,
    /// Most open connections (`server.max_connections`).
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// Shutdown drain deadline, in seconds (`server.drain_secs`).
    #[arg(long)]
    pub drain_secs: Option<u64>,
    /// PostgreSQL URL (`database.url`).
    #[arg(long, hide_env_values = true)]
    pub database_url: Option<String>,
    /// Base URL of an OpenAI-compatible API (`llm.base_url`).
    #[arg(long)]
    pub llm_base_url: Option<String>,
    /// The chat model (`llm.model`).
    #[arg(long)]
    pub llm_model: Option<String>,
    /// Environment variable holding the model API key (`llm.api_key_env`).
    #[arg(long)]
    pub llm_api_key_env: Option<String>,
    /// Per-attempt model timeout, in seconds (`llm.timeout_secs`).
    #[arg(long)]
    pub llm_timeout: Option<u64>,
    /// Embedding model (`llm.embedding_model`).
    #[arg(long)]
    pub embedding_model: Option<String>,
    /// Directory of flows (`flows.dir`).
    #[arg(long)]
    pub flows: Option<PathBuf>,
    /// Crisis resource directory (`agent.resource_directory`).
    #[arg(long)]
    pub resource_directory: Option<PathBuf>,
    /// Knowledge base (`agent.knowledge_base`).
    #[arg(long)]
    pub knowledge_base: Option<PathBuf>,
    /// Webhook for outbound messages (`channel.webhook_url`).
    #[arg(long)]
    pub webhook_url: Option<String>,
    /// Environment variable holding the webhook secret
    /// (`channel.webhook_secret_env`).
    #[arg(long)]
    pub webhook_secret_env: Option<String>,
    /// The queue a worker claims from (`worker.queue`).
    #[arg(long)]
    pub queue: Option<String>,
    /// Tasks a worker runs at once (`worker.slots`).
    #[arg(long)]
    pub slots: Option<usize>,
    /// Attempt deadline, in seconds (`worker.lease_secs`).
    #[arg(long)]
    pub lease_secs: Option<u64>,
    /// Heartbeat interval, in milliseconds (`worker.heartbeat_ms`).
    #[arg(long)]
    pub heartbeat_ms: Option<u64>,
    /// Worker staleness, in seconds (`worker.stale_after_secs`).
    #[arg(long)]
    pub stale_after_secs: Option<u64>,
    /// Lease sweep interval, in milliseconds (`worker.sweep_ms`).
    #[arg(long)]
    pub sweep_ms: Option<u64>,
    /// Retention of finished tasks, in hours (`worker.retention_hours`).
    #[arg(long)]
    pub retention_hours: Option<u64>,
    /// Shutdown grace, in seconds (`worker.grace_secs`).
    #[arg(long)]
    pub grace_secs: Option<u64>,
    /// Run the end-to-end test task kinds (`worker.test_handlers`).
    #[arg(long)]
    pub test_handlers: bool,
    /// Address `parlance worker` serves `GET /metrics` on
    /// (`worker.metrics_bind`).
    #[arg(long)]
    pub metrics_bind: Option<SocketAddr>,
    /// Log format (`log.format`).
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
}

impl Flags {
    /// The flags that were given, as `(file key, value)`.
    fn values(&self) -> Vec<(&'static str, Value)> {
        fn text(v: &Option<impl ToString>) -> Option<Value> {
            v.as_ref().map(|v| Value::String(v.to_string()))
        }
        fn path(v: &Option<PathBuf>) -> Option<Value> {
            v.as_ref()
                .map(|v| Value::String(v.to_string_lossy().into_owned()))
        }
        fn num<T: Into<u64> + Copy>(v: Option<T>) -> Option<Value> {
            v.map(|v| Value::from(v.into()))
        }
        let usize_num = |v: Option<usize>| v.map(|v| Value::from(v as u64));
        let log = self.log_format.map(|f| {
            Value::String(match f {
                LogFormat::Pretty => "pretty".to_owned(),
                LogFormat::Json => "json".to_owned(),
            })
        });
        [
            ("server.bind", text(&self.bind)),
            ("server.api_key", text(&self.api_key)),
            ("server.body_limit", usize_num(self.body_limit)),
            (
                "server.embedded_worker",
                self.no_worker.then_some(Value::Bool(false)),
            ),
            (
                "server.header_read_timeout_secs",
                num(self.header_read_timeout),
            ),
            ("server.body_read_timeout_secs", num(self.body_read_timeout)),
            ("server.idle_timeout_secs", num(self.idle_timeout)),
            ("server.max_connections", usize_num(self.max_connections)),
            ("server.drain_secs", num(self.drain_secs)),
            ("database.url", text(&self.database_url)),
            ("llm.base_url", text(&self.llm_base_url)),
            ("llm.model", text(&self.llm_model)),
            ("llm.api_key_env", text(&self.llm_api_key_env)),
            ("llm.timeout_secs", num(self.llm_timeout)),
            ("llm.embedding_model", text(&self.embedding_model)),
            ("flows.dir", path(&self.flows)),
            ("agent.resource_directory", path(&self.resource_directory)),
            ("agent.knowledge_base", path(&self.knowledge_base)),
            ("channel.webhook_url", text(&self.webhook_url)),
            ("channel.webhook_secret_env", text(&self.webhook_secret_env)),
            ("worker.queue", text(&self.queue)),
            ("worker.slots", usize_num(self.slots)),
            ("worker.lease_secs", num(self.lease_secs)),
            ("worker.heartbeat_ms", num(self.heartbeat_ms)),
            ("worker.stale_after_secs", num(self.stale_after_secs)),
            ("worker.sweep_ms", num(self.sweep_ms)),
            ("worker.retention_hours", num(self.retention_hours)),
            ("worker.grace_secs", num(self.grace_secs)),
            (
                "worker.test_handlers",
                self.test_handlers.then_some(Value::Bool(true)),
            ),
            ("worker.metrics_bind", text(&self.metrics_bind)),
            ("log.format", log),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect()
    }
}

/// A configuration that cannot be used, naming the setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("configuration: {0}")]
pub struct ConfigError(pub String);

impl ConfigError {
    fn setting(key: &str, problem: impl std::fmt::Display) -> Self {
        ConfigError(format!("{} {problem}", setting_for(key).spellings()))
    }
}

/// Nests `(a.b, value)` pairs into `{"a": {"b": value}}`.
fn nest(pairs: Vec<(&'static str, Value)>) -> Value {
    let mut root = Map::new();
    for (key, value) in pairs {
        let (section, name) = key.split_once('.').unwrap_or(("", key));
        let entry = root
            .entry(section.to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(m) = entry {
            m.insert(name.to_owned(), value);
        }
    }
    Value::Object(root)
}

/// Reads one environment value as its setting's kind.
fn env_value(s: &Setting, var: &str, raw: &str) -> Result<Value, ConfigError> {
    let bad = |what: &str| {
        ConfigError(format!(
            "${var} ({}) must be {what}, not {raw:?}",
            s.spellings()
        ))
    };
    match s.kind {
        Kind::Text => Ok(Value::String(raw.to_owned())),
        Kind::Number => raw
            .trim()
            .parse::<u64>()
            .map(Value::from)
            .map_err(|_| bad("a whole number")),
        Kind::Switch => match raw.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(Value::Bool(true)),
            "0" | "false" | "no" | "off" | "" => Ok(Value::Bool(false)),
            _ => Err(bad("true or false")),
        },
        Kind::List => Ok(Value::Array(
            raw.split(',')
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(|v| Value::String(v.to_owned()))
                .collect(),
        )),
    }
}

impl Config {
    /// Reads the configuration: defaults, then the file named by
    /// `flags.config`, then the environment (through `env`), then the flags.
    ///
    /// # Errors
    ///
    /// A file that cannot be read or parsed, a value of the wrong type
    /// (naming its key), or a setting [`Config::validate`] refuses.
    pub fn load(flags: &Flags, env: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = &flags.config {
            if !path.is_file() {
                return Err(ConfigError(format!(
                    "--config {}: no such file",
                    path.display()
                )));
            }
            figment = figment.merge(Toml::file_exact(path));
        }
        let mut from_env = Vec::new();
        for s in SETTINGS {
            // The documented variable wins over its older aliases.
            if let Some((var, raw)) = s.env.iter().find_map(|var| env(var).map(|raw| (*var, raw))) {
                from_env.push((s.key, env_value(s, var, &raw)?));
            }
        }
        figment = figment
            .merge(Serialized::defaults(nest(from_env)))
            .merge(Serialized::defaults(nest(flags.values())));
        let config: Config = figment.extract().map_err(|e| ConfigError(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// Reads the configuration from the process environment.
    ///
    /// # Errors
    ///
    /// As [`Config::load`].
    pub fn from_env(flags: &Flags) -> Result<Self, ConfigError> {
        Self::load(flags, |name| std::env::var(name).ok())
    }

    /// Checks what no single layer can: settings that need each other and
    /// values out of range.
    ///
    /// # Errors
    ///
    /// The first problem, naming the setting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(url) = &self.database.url
            && !(url.expose().starts_with("postgres://")
                || url.expose().starts_with("postgresql://"))
        {
            return Err(ConfigError::setting(
                "database.url",
                "must be a postgres:// or postgresql:// URL",
            ));
        }
        if self.database.max_connections == 0 {
            return Err(ConfigError::setting(
                "database.max_connections",
                "must be at least 1",
            ));
        }
        let base_url = self
            .llm
            .base_url
            .as_deref()
            .filter(|u| !u.trim().is_empty());
        match base_url {
            Some(_) => {
                if self
                    .llm
                    .model
                    .as_deref()
                    .is_none_or(|m| m.trim().is_empty())
                {
                    return Err(ConfigError(format!(
                        "{} is required with {}",
                        setting_for("llm.model").spellings(),
                        setting_for("llm.base_url").spellings()
                    )));
                }
            }
            None => {
                if self.llm.embedding_model.is_some() {
                    return Err(ConfigError(format!(
                        "{} needs {}",
                        setting_for("llm.embedding_model").spellings(),
                        setting_for("llm.base_url").spellings()
                    )));
                }
            }
        }
        if self.llm.timeout_secs == 0 {
            return Err(ConfigError::setting(
                "llm.timeout_secs",
                "must be at least 1",
            ));
        }
        if self.agent.snapshot_every == 0 {
            return Err(ConfigError::setting(
                "agent.snapshot_every",
                "must be at least 1",
            ));
        }
        if self.server.body_limit == 0 {
            return Err(ConfigError::setting(
                "server.body_limit",
                "must be at least 1",
            ));
        }
        for (key, v) in [
            (
                "server.header_read_timeout_secs",
                self.server.header_read_timeout_secs,
            ),
            (
                "server.body_read_timeout_secs",
                self.server.body_read_timeout_secs,
            ),
            ("server.idle_timeout_secs", self.server.idle_timeout_secs),
            ("server.max_connections", self.server.max_connections as u64),
        ] {
            if v == 0 {
                return Err(ConfigError::setting(key, "must be at least 1"));
            }
        }
        for (key, path) in [
            ("flows.dir", &self.flows.dir),
            ("agent.resource_directory", &self.agent.resource_directory),
            ("agent.knowledge_base", &self.agent.knowledge_base),
        ] {
            if let Some(p) = path
                && !p.exists()
            {
                return Err(ConfigError::setting(
                    key,
                    format!("names {}, which does not exist", p.display()),
                ));
            }
        }
        for (key, v) in [
            ("budget.commands_ms", self.budget.commands_ms),
            ("budget.agent_ms", self.budget.agent_ms),
            ("budget.flows_ms", self.budget.flows_ms),
            ("budget.reads_ms", self.budget.reads_ms),
            ("budget.crisis_gate_ms", self.budget.crisis_gate_ms),
        ] {
            if v == 0 {
                return Err(ConfigError::setting(key, "must be at least 1"));
            }
        }
        self.cors.policy()?;
        if self.rate_limit.per_second > 0 && self.rate_limit.burst == 0 {
            return Err(ConfigError::setting(
                "rate_limit.burst",
                "must be at least 1 when `rate_limit.per_second` is set",
            ));
        }
        if self.worker.queue.is_empty() {
            return Err(ConfigError::setting("worker.queue", "must not be empty"));
        }
        if self.worker.slots == 0 {
            return Err(ConfigError::setting("worker.slots", "must be at least 1"));
        }
        for key in ["worker.heartbeat_ms", "worker.sweep_ms"] {
            let v = match key {
                "worker.heartbeat_ms" => self.worker.heartbeat_ms,
                _ => self.worker.sweep_ms,
            };
            if v == 0 {
                return Err(ConfigError::setting(key, "must be at least 1"));
            }
        }
        Ok(())
    }

    /// The database URL, which `command` cannot run without.
    ///
    /// # Errors
    ///
    /// When no database is configured.
    pub fn require_database(&self, command: &str) -> Result<DatabaseUrl, ConfigError> {
        self.database
            .url
            .as_ref()
            .map(|u| DatabaseUrl::new(u.expose()))
            .ok_or_else(|| {
                ConfigError(format!(
                    "{command} needs a database: set {}",
                    setting_for("database.url").spellings()
                ))
            })
    }

    /// The database URL, if one is configured.
    pub fn database_url(&self) -> Option<DatabaseUrl> {
        self.database
            .url
            .as_ref()
            .map(|u| DatabaseUrl::new(u.expose()))
    }

    /// The pool settings.
    pub fn pool_options(&self) -> PoolOptions {
        PoolOptions {
            max_connections: self.database.max_connections,
            acquire_timeout: Duration::from_secs(self.database.acquire_timeout_secs),
        }
    }

    /// The settings that differ from the defaults, as `file key = value`
    /// (secrets shown as `***`), for the start-up log.
    pub fn overrides(&self) -> BTreeMap<&'static str, String> {
        let ours = flatten(&serde_json::to_value(self).unwrap_or(Value::Null));
        let defaults = flatten(&serde_json::to_value(Config::default()).unwrap_or(Value::Null));
        SETTINGS
            .iter()
            .filter_map(|s| {
                let v = ours.get(s.key)?;
                if defaults.get(s.key) == Some(v) {
                    return None;
                }
                let shown = if matches!(s.key, "server.api_key" | "database.url") {
                    "***".to_owned()
                } else {
                    v.to_string()
                };
                Some((s.key, shown))
            })
            .collect()
    }
}

/// `{"a": {"b": 1}}` as `{"a.b": 1}`.
fn flatten(v: &Value) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    if let Value::Object(sections) = v {
        for (section, fields) in sections {
            if let Value::Object(fields) = fields {
                for (name, value) in fields {
                    out.insert(format!("{section}.{name}"), value.clone());
                }
            }
        }
    }
    out
}

impl WorkerSettings {
    /// The runtime tuning these settings describe.
    pub fn runtime(&self) -> crate::worker::WorkerConfig {
        crate::worker::WorkerConfig {
            queue: self.queue.clone(),
            slots: self.slots.max(1),
            lease: Duration::from_secs(self.lease_secs),
            heartbeat_every: Duration::from_millis(self.heartbeat_ms.max(1)),
            poll_every: Duration::from_secs(1),
            sweep_every: Duration::from_millis(self.sweep_ms.max(1)),
            retention: Duration::from_secs(self.retention_hours * 3600),
            shutdown_grace: Duration::from_secs(self.grace_secs),
        }
    }

    /// The queue settings these settings describe.
    pub fn queue_config(&self) -> parlance_ports::QueueConfig {
        parlance_ports::QueueConfig {
            worker_stale_after: Duration::from_secs(self.stale_after_secs),
            ..parlance_ports::QueueConfig::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn env_of(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: BTreeMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |k| vars.get(k).cloned()
    }

    fn file(text: &str) -> (tempfile_path::TempFile, Flags) {
        let f = tempfile_path::TempFile::new(text);
        let flags = Flags {
            config: Some(f.path.clone()),
            ..Flags::default()
        };
        (f, flags)
    }

    /// A file under the target directory, removed on drop.
    mod tempfile_path {
        use std::path::PathBuf;
        use std::sync::atomic::{AtomicU32, Ordering};

        pub(super) struct TempFile {
            pub(super) path: PathBuf,
        }

        impl TempFile {
            pub(super) fn new(text: &str) -> Self {
                static N: AtomicU32 = AtomicU32::new(0);
                let path = std::env::temp_dir().join(format!(
                    "parlance-config-{}-{}.toml",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::write(&path, text).unwrap();
                Self { path }
            }
        }

        impl Drop for TempFile {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }

    #[test]
    fn defaults_need_nothing() {
        let c = Config::load(&Flags::default(), env_of(&[])).unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.server.bind.to_string(), "127.0.0.1:8080");
        assert!(c.database.url.is_none());
        assert!(c.overrides().is_empty());
    }

    #[test]
    fn file_then_environment_then_flags() {
        let (_f, mut flags) = file(
            "[server]\nbind = \"127.0.0.1:9000\"\nbody_limit = 10\n\
             [worker]\nslots = 2\nqueue = \"q-file\"\n",
        );
        let env = env_of(&[
            ("PARLANCE_WORKER_SLOTS", "3"),
            ("PARLANCE_BODY_LIMIT", "20"),
        ]);
        let c = Config::load(&flags, &env).unwrap();
        assert_eq!(c.server.bind.port(), 9000, "from the file");
        assert_eq!(c.server.body_limit, 20, "the environment beats the file");
        assert_eq!(c.worker.slots, 3);
        assert_eq!(c.worker.queue, "q-file");
        flags.slots = Some(7);
        flags.no_worker = true;
        let c = Config::load(&flags, &env).unwrap();
        assert_eq!(c.worker.slots, 7, "a flag beats both");
        assert!(!c.server.embedded_worker);
        assert_eq!(c.server.body_limit, 20);
    }

    #[test]
    fn thread_history_and_erasure_settings_come_from_every_layer() {
        let c = Config::load(&Flags::default(), env_of(&[])).unwrap();
        assert!(
            !c.agent.erase_crisis_log,
            "the crisis log is kept by default"
        );
        assert_eq!(
            c.agent.snapshot_every,
            parlance_core::turn::DEFAULT_SNAPSHOT_EVERY
        );
        let (_f, flags) = file("[agent]\nerase_crisis_log = true\nsnapshot_every = 4\n");
        let c = Config::load(&flags, env_of(&[])).unwrap();
        assert!(c.agent.erase_crisis_log);
        assert_eq!(c.agent.snapshot_every, 4);
        let c = Config::load(
            &flags,
            env_of(&[
                ("PARLANCE_AGENT_ERASE_CRISIS_LOG", "no"),
                ("PARLANCE_AGENT_SNAPSHOT_EVERY", "9"),
            ]),
        )
        .unwrap();
        assert!(!c.agent.erase_crisis_log, "the environment beats the file");
        assert_eq!(c.agent.snapshot_every, 9);
        let e = Config::load(
            &Flags::default(),
            env_of(&[("PARLANCE_AGENT_SNAPSHOT_EVERY", "0")]),
        )
        .unwrap_err();
        assert!(e.to_string().contains("`agent.snapshot_every`"), "{e}");
        assert!(e.to_string().contains("at least 1"), "{e}");
    }

    #[test]
    fn documented_variables_beat_their_aliases() {
        let c = Config::load(
            &Flags::default(),
            env_of(&[
                ("PARLANCE_FLOWS", "/nonexistent-old"),
                ("PARLANCE_FLOWS_DIR", "."),
                ("DATABASE_URL", "postgres://u@h/db"),
            ]),
        )
        .unwrap();
        assert_eq!(c.flows.dir.as_deref(), Some(Path::new(".")));
        assert_eq!(c.database_url().unwrap().expose(), "postgres://u@h/db");
    }

    #[test]
    fn errors_name_the_setting() {
        let e = Config::load(
            &Flags::default(),
            env_of(&[("PARLANCE_LLM_BASE_URL", "http://127.0.0.1:1/v1")]),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "configuration: `llm.model`, $PARLANCE_LLM_MODEL, --llm-model is required with \
             `llm.base_url`, $PARLANCE_LLM_BASE_URL, --llm-base-url"
        );
        let e = Config::load(
            &Flags::default(),
            env_of(&[("PARLANCE_WORKER_SLOTS", "many")]),
        )
        .unwrap_err();
        assert!(e.to_string().contains("$PARLANCE_WORKER_SLOTS"), "{e}");
        assert!(e.to_string().contains("whole number"), "{e}");
        let (_f, flags) = file("[worker]\nslots = \"four\"\n");
        let e = Config::load(&flags, env_of(&[])).unwrap_err();
        assert!(e.to_string().contains("worker.slots"), "{e}");
        let (_f, flags) = file("[server]\nbnid = \"x\"\n");
        let e = Config::load(&flags, env_of(&[])).unwrap_err();
        assert!(e.to_string().contains("bnid"), "{e}");
        let e = Config::load(
            &Flags {
                database_url: Some("mysql://x".into()),
                ..Flags::default()
            },
            env_of(&[]),
        )
        .unwrap_err();
        assert!(e.to_string().contains("--database-url"), "{e}");
        let e = Config::default()
            .require_database("parlance worker")
            .unwrap_err();
        assert!(e.to_string().contains("$DATABASE_URL"), "{e}");
        let missing = Flags {
            config: Some(PathBuf::from("/nonexistent/parlance.toml")),
            ..Flags::default()
        };
        assert!(Config::load(&missing, env_of(&[])).is_err());
    }

    #[test]
    fn connection_limits_come_from_every_layer_and_zero_is_refused() {
        let defaults = Config::default().server.serve_options();
        assert_eq!(defaults, crate::http::ServeOptions::default());
        let (_f, mut flags) = file("[server]\nidle_timeout_secs = 5\nmax_connections = 7\n");
        flags.drain_secs = Some(3);
        let c = Config::load(
            &flags,
            env_of(&[("PARLANCE_HEADER_READ_TIMEOUT_SECS", "2")]),
        )
        .unwrap();
        let o = c.server.serve_options();
        assert_eq!(o.header_read_timeout, Duration::from_secs(2));
        assert_eq!(o.body_read_timeout, Duration::from_secs(30));
        assert_eq!(o.idle_timeout, Duration::from_secs(5));
        assert_eq!(o.max_connections, 7);
        assert_eq!(o.drain, Duration::from_secs(3));
        for var in [
            "PARLANCE_HEADER_READ_TIMEOUT_SECS",
            "PARLANCE_BODY_READ_TIMEOUT_SECS",
            "PARLANCE_IDLE_TIMEOUT_SECS",
            "PARLANCE_MAX_CONNECTIONS",
        ] {
            let e = Config::load(&Flags::default(), env_of(&[(var, "0")])).unwrap_err();
            assert!(e.to_string().contains(var), "{e}");
            assert!(e.to_string().contains("at least 1"), "{e}");
        }
    }

    #[test]
    fn cors_and_rate_limits_are_off_by_default_and_checked() {
        let c = Config::default();
        assert_eq!(c.cors.policy().unwrap(), None);
        assert_eq!(c.rate_limit.limit(), None);

        let c = Config::load(
            &Flags::default(),
            env_of(&[
                (
                    "PARLANCE_CORS_ALLOWED_ORIGINS",
                    "https://app.example.com, http://localhost:3000",
                ),
                ("PARLANCE_CORS_ALLOWED_METHODS", "get,post"),
                ("PARLANCE_RATE_LIMIT_PER_SECOND", "5"),
            ]),
        )
        .unwrap();
        let policy = c.cors.policy().unwrap().unwrap();
        assert_eq!(
            policy.origins.unwrap(),
            ["https://app.example.com", "http://localhost:3000"]
        );
        assert_eq!(
            policy.methods,
            [axum::http::Method::GET, axum::http::Method::POST]
        );
        assert_eq!(policy.headers.len(), 3);
        assert_eq!(c.rate_limit.limit(), crate::http::RateLimit::new(5, 50));

        let (_f, flags) = file("[cors]\nallowed_origins = [\"*\"]\n");
        let c = Config::load(&flags, env_of(&[])).unwrap();
        assert_eq!(c.cors.policy().unwrap().unwrap().origins, None);

        for (var, value, named) in [
            (
                "PARLANCE_CORS_ALLOWED_ORIGINS",
                "https://app.example.com/",
                "cors.allowed_origins",
            ),
            (
                "PARLANCE_CORS_ALLOWED_METHODS",
                "GE T",
                "cors.allowed_methods",
            ),
            (
                "PARLANCE_CORS_ALLOWED_HEADERS",
                "a b",
                "cors.allowed_headers",
            ),
        ] {
            let e = Config::load(
                &Flags::default(),
                env_of(&[("PARLANCE_CORS_ALLOWED_ORIGINS", "http://x"), (var, value)]),
            )
            .unwrap_err();
            assert!(e.to_string().contains(named), "{e}");
        }
        let e = Config::load(
            &Flags::default(),
            env_of(&[
                ("PARLANCE_RATE_LIMIT_PER_SECOND", "5"),
                ("PARLANCE_RATE_LIMIT_BURST", "0"),
            ]),
        )
        .unwrap_err();
        assert!(e.to_string().contains("rate_limit.burst"), "{e}");
    }

    #[test]
    fn secrets_never_show() {
        let c = Config::load(
            &Flags {
                api_key: Some("pk_secret".into()),
                database_url: Some("postgres://u:pw@h/db".into()),
                ..Flags::default()
            },
            env_of(&[]),
        )
        .unwrap();
        let shown = format!("{c:?} {:?}", c.overrides());
        assert!(
            !shown.contains("pk_secret") && !shown.contains("pw@"),
            "{shown}"
        );
    }

    #[test]
    fn every_field_is_a_setting_and_every_setting_a_field() {
        let fields: Vec<String> = flatten(&serde_json::to_value(Config::default()).unwrap())
            .into_keys()
            .collect();
        let keys: Vec<String> = SETTINGS.iter().map(|s| s.key.to_owned()).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        let mut fields_sorted = fields;
        fields_sorted.sort();
        assert_eq!(fields_sorted, sorted);
    }

    #[test]
    fn the_example_file_documents_every_setting() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/parlance.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let flags = Flags {
            config: Some(path),
            ..Flags::default()
        };
        // Parses as it is (commented-out settings take their defaults).
        Config::load(&flags, env_of(&[])).unwrap();
        for s in SETTINGS {
            let (section, name) = s.key.split_once('.').unwrap();
            assert!(
                text.contains(&format!("[{section}]")),
                "section [{section}] is not in the example"
            );
            assert!(
                text.lines().any(|l| {
                    let l = l.trim_start_matches(['#', ' ']);
                    l.starts_with(&format!("{name} ="))
                }),
                "{} is not documented in examples/parlance.toml",
                s.key
            );
            for var in s.env {
                assert!(text.contains(var), "{var} is not named in the example");
            }
            if let Some(flag) = s.flag {
                assert!(text.contains(&format!("--{flag}")), "--{flag} is not named");
            }
        }
    }
}
