//! Service configuration, as parsed from the command line and environment.

use std::net::SocketAddr;

use clap::{Args, ValueEnum};
use parlance_postgres::DatabaseUrl;

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Pretty,
    /// One JSON object per line.
    Json,
}

/// Options of `parlance serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeConfig {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub bind: SocketAddr,

    /// PostgreSQL URL; without one, state lives in memory and is lost on exit.
    #[arg(long, env = "DATABASE_URL", value_parser = parse_database_url, hide_env_values = true)]
    pub database_url: Option<DatabaseUrl>,

    /// The API key for product `default`; when absent one is generated and
    /// printed once at start-up.
    #[arg(long, env = "PARLANCE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,

    /// Largest accepted request body, in bytes.
    #[arg(long, default_value_t = 1024 * 1024)]
    pub body_limit: usize,

    /// Base URL of an OpenAI-compatible API (e.g. `https://api.openai.com/v1`,
    /// `http://127.0.0.1:11434/v1`); without one the offline, deterministic
    /// model answers.
    #[arg(long, env = "PARLANCE_LLM_BASE_URL")]
    pub llm_base_url: Option<String>,

    /// The chat model (on Azure OpenAI: the deployment name); required with
    /// `--llm-base-url`.
    #[arg(long, env = "PARLANCE_LLM_MODEL")]
    pub llm_model: Option<String>,

    /// Name of the environment variable holding the API key (the key itself
    /// is never passed on the command line, nor logged).
    #[arg(
        long,
        env = "PARLANCE_LLM_API_KEY_ENV",
        default_value = "OPENAI_API_KEY"
    )]
    pub llm_api_key_env: String,

    /// Per-attempt timeout of a model call, in seconds.
    #[arg(long, env = "PARLANCE_LLM_TIMEOUT", default_value_t = 60)]
    pub llm_timeout: u64,

    /// Embedding model served at `--llm-base-url`; without one the offline
    /// feature-hashing embedder is used.
    #[arg(long, env = "PARLANCE_EMBEDDING_MODEL")]
    pub embedding_model: Option<String>,
    /// Run no task worker inside the service (run `parlance worker` instead).
    #[arg(long)]
    pub no_worker: bool,

    /// Directory of flows: one sub-directory per flow with `flow.yaml` and
    /// a `templates/` folder. Every flow is validated at start-up.
    #[arg(long, env = "PARLANCE_FLOWS")]
    pub flows: Option<std::path::PathBuf>,

    /// The support agent's crisis resource directory (JSON: verified
    /// hotlines by region). Without one the crisis reply gives only the
    /// universal advice to contact local emergency services.
    #[arg(long, env = "PARLANCE_RESOURCE_DIRECTORY")]
    pub resource_directory: Option<std::path::PathBuf>,

    /// The support agent's knowledge base (JSON: vetted answers). Without
    /// one, factual questions get no answer rather than a guess.
    #[arg(long, env = "PARLANCE_KNOWLEDGE_BASE")]
    pub knowledge_base: Option<std::path::PathBuf>,

    /// Deliver outbound conversation messages by POSTing them here (signed
    /// with HMAC-SHA256); without it they go to the in-process loopback
    /// channel.
    #[arg(long, env = "PARLANCE_WEBHOOK_URL")]
    pub webhook_url: Option<String>,

    /// Name of the environment variable holding the webhook signing secret.
    #[arg(long, default_value = "PARLANCE_WEBHOOK_SECRET")]
    pub webhook_secret_env: String,
}

impl ServeConfig {
    /// Defaults for tests and the demo: memory backend, port 0, no key, the
    /// offline model.
    pub fn embedded() -> Self {
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            database_url: None,
            api_key: None,
            body_limit: 1024 * 1024,
            llm_base_url: None,
            llm_model: None,
            llm_api_key_env: "OPENAI_API_KEY".to_owned(),
            llm_timeout: 60,
            embedding_model: None,
            no_worker: false,
            flows: None,
            resource_directory: None,
            knowledge_base: None,
            webhook_url: None,
            webhook_secret_env: "PARLANCE_WEBHOOK_SECRET".to_owned(),
        }
    }
}

fn parse_database_url(s: &str) -> Result<DatabaseUrl, String> {
    if s.starts_with("postgres://") || s.starts_with("postgresql://") {
        Ok(DatabaseUrl::new(s))
    } else {
        Err("expected a postgres:// or postgresql:// URL".to_owned())
    }
}
