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

    /// Run no task worker inside the service (run `parlance worker` instead).
    #[arg(long)]
    pub no_worker: bool,
}

impl ServeConfig {
    /// Defaults for tests and the demo: memory backend, port 0, no key.
    pub fn embedded() -> Self {
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            database_url: None,
            api_key: None,
            body_limit: 1024 * 1024,
            no_worker: false,
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
