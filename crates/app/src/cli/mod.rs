//! The `parlance` command line: `serve`, `worker`, `tasks`, `keys`,
//! `migrate`, `demo` and the operator's `conversation` client. Every
//! command but the client reads the one [`Config`].

mod conversation;
mod keys;

pub use conversation::{ClientArgs, ConversationCommand};
pub use keys::KeysAction;

use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use parlance_core::ProductId;
use parlance_ports::{QueueConfig, SystemClock, TaskId, TaskQueue as _};
use parlance_postgres::{PgPool, PgTaskQueue};
use tokio::net::TcpListener;

use crate::auth::ApiKeys;
use crate::config::{Config, Flags};
use crate::{Components, default_key, keys_for, router, telemetry};

/// Parlance: the state layer for conversational AI agents.
#[derive(Debug, Parser)]
#[command(name = "parlance", version, about)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// A command.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP service (in memory unless a database URL is given).
    Serve {
        /// Settings.
        #[command(flatten)]
        flags: Flags,
    },
    /// Run queued tasks and due timers from PostgreSQL until SIGINT or
    /// SIGTERM.
    Worker {
        /// Settings.
        #[command(flatten)]
        flags: Flags,
    },
    /// Inspect and retry dead-lettered tasks.
    Tasks {
        /// Settings.
        #[command(flatten)]
        flags: Flags,
        /// What to do.
        #[command(subcommand)]
        action: TasksAction,
    },
    /// Create, list and revoke API keys stored in PostgreSQL.
    Keys {
        /// Settings.
        #[command(flatten)]
        flags: Flags,
        /// What to do.
        #[command(subcommand)]
        action: keys::KeysAction,
    },
    /// Apply database migrations and exit.
    Migrate {
        /// Settings.
        #[command(flatten)]
        flags: Flags,
    },
    /// Play a scripted scenario through every machine and print the
    /// transcript.
    Demo {
        /// Settings.
        #[command(flatten)]
        flags: Flags,
    },
    /// Print the API document (OpenAPI 3.1, as `GET /openapi.json` serves
    /// it) and exit.
    Openapi,
    /// Operate conversations on a running server.
    Conversation {
        /// The server and key.
        #[command(flatten)]
        client: conversation::ClientArgs,
        /// What to do.
        #[command(subcommand)]
        command: conversation::ConversationCommand,
    },
}

/// An operator action on the queue.
#[derive(Debug, Clone, Subcommand)]
pub enum TasksAction {
    /// List discarded (dead-lettered) tasks, newest first, one JSON per line.
    Discarded {
        /// The queue.
        #[arg(long, default_value = parlance_ports::queue::DEFAULT_QUEUE)]
        queue: String,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Make a discarded task available again with a fresh attempt budget.
    Retry {
        /// The product the task belongs to (`discarded` shows it).
        #[arg(long, default_value = "default")]
        product: String,
        /// The task id.
        id: i64,
    },
}

/// Reads the configuration and installs the log subscriber.
fn configure(flags: &Flags) -> anyhow::Result<Config> {
    let config = Config::from_env(flags)?;
    telemetry::init(config.log.format);
    let overrides = config.overrides();
    if !overrides.is_empty() {
        tracing::debug!(?overrides, "configuration");
    }
    Ok(config)
}

/// A migrated pool on the configured database, which `command` needs.
async fn database(config: &Config, command: &str) -> anyhow::Result<PgPool> {
    let url = config.require_database(command)?;
    let pool = parlance_postgres::connect(&url, &config.pool_options())?;
    parlance_postgres::migrate(&pool)
        .await
        .with_context(|| format!("migrate {url}"))?;
    Ok(pool)
}

/// Runs a command.
///
/// # Errors
///
/// Whatever the command reports; configuration errors name the setting.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve { flags } => serve(configure(&flags)?).await,
        Command::Worker { flags } => worker(configure(&flags)?).await,
        Command::Tasks { flags, action } => {
            let config = configure(&flags)?;
            let pool = database(&config, "parlance tasks").await?;
            tasks(pool, action, std::io::stdout().lock()).await
        }
        Command::Keys { flags, action } => {
            let config = configure(&flags)?;
            let pool = database(&config, "parlance keys").await?;
            keys::run(pool, action, std::io::stdout().lock()).await
        }
        Command::Migrate { flags } => {
            let config = configure(&flags)?;
            let url = config.require_database("parlance migrate")?;
            database(&config, "parlance migrate").await?;
            tracing::info!(database = %url, "migrations applied");
            Ok(())
        }
        Command::Demo { flags } => {
            // The demo prints its own transcript; it installs no log
            // subscriber, but a configuration it cannot read still fails.
            Config::from_env(&flags)?;
            crate::demo::run(std::io::stdout().lock()).await
        }
        Command::Openapi => {
            let state = Components::memory(ApiKeys::default()).build();
            let doc = crate::openapi_document(&state).to_pretty_json()?;
            writeln!(std::io::stdout(), "{doc}")?;
            Ok(())
        }
        Command::Conversation { client, command } => {
            conversation::run(client, command, std::io::stdout().lock()).await
        }
    }
}

/// `parlance serve`: builds the state from `config`, binds, serves until
/// SIGINT or SIGTERM with the connection limits of `[server]`, then drains
/// open requests until `server.drain_secs` and drops what is left.
///
/// # Errors
///
/// When the state cannot be built or the address cannot be bound.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    let key = default_key(&config)?;
    let state = Components::from_config(&config, keys_for(&key))
        .await?
        .build();
    let bind = config.server.bind;
    let listener = TcpListener::bind(bind)
        .await
        .with_context(|| format!("bind {bind} (`server.bind`)"))?;
    let addr: SocketAddr = listener.local_addr()?;
    if config.server.api_key.is_none() {
        // The one place the key is shown: stdout, once, for the operator.
        let _ = writeln!(
            std::io::stdout(),
            "API key for product `default` (shown once): {}",
            key.expose()
        );
    }
    tracing::info!(
        llm = %state.shared.llm.describe(),
        model = state.shared.llm.default_model(),
        embedder = state.shared.embedder.model(),
        "language model"
    );
    tracing::info!(%addr, backend = state.backend.name(), "parlance listening");
    let worker = config
        .server
        .embedded_worker
        .then(|| state.start_worker(config.worker.runtime()));
    let sweepers = state.spawn_sweepers();
    raise_open_files_limit(config.server.max_connections);
    crate::http::serve(
        listener,
        router(&state),
        config.server.serve_options(),
        shutdown_signal(),
    )
    .await
    .context("serve")?;
    for sweeper in sweepers {
        sweeper.abort();
    }
    if let Some(worker) = worker {
        worker.stop().await;
    }
    tracing::info!("parlance stopped");
    Ok(())
}

/// Raises the soft limit on open files to the hard limit, so that
/// `server.max_connections` can be reached, and warns when it still cannot.
fn raise_open_files_limit(max_connections: usize) {
    // Connections, plus room for the database pool, logs and the listener.
    let wanted = max_connections as u64 + 256;
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) if limit < wanted => tracing::warn!(
            open_files = limit,
            max_connections,
            "the open-file limit is below `server.max_connections`; accepts will fail \
             with `Too many open files` before the connection cap is reached"
        ),
        Ok(limit) => tracing::debug!(open_files = limit, "open-file limit"),
        Err(e) => tracing::warn!(error = %e, "could not read the open-file limit"),
    }
}

/// `parlance worker`: the same state as `serve` on the configured database
/// (model, embedder, channel, flows, the agent's files), running queued
/// tasks and the timer sweepers until SIGINT or SIGTERM, and serving
/// `GET /metrics` on `worker.metrics_bind` when it is set.
///
/// # Errors
///
/// When no database is configured, the state cannot be built or the
/// metrics address cannot be bound.
pub async fn worker(config: Config) -> anyhow::Result<()> {
    config.require_database("parlance worker")?;
    let state = Components::from_config(&config, ApiKeys::new())
        .await?
        .build();
    tracing::info!(
        llm = %state.shared.llm.describe(),
        model = state.shared.llm.default_model(),
        queue = %config.worker.queue,
        slots = config.worker.slots,
        "parlance worker started"
    );
    let mut handlers = state.handlers();
    if config.worker.test_handlers {
        crate::worker::register_test_handlers(&mut handlers);
    }
    let worker = crate::worker::Worker::new(
        parlance_ports::WorkerId(state.shared.ids.new_uuid()),
        state.shared.queue.clone(),
        handlers,
        state.shared.clock.clone(),
        config.worker.runtime(),
    );
    let metrics = match config.worker.metrics_bind {
        Some(bind) => Some(serve_metrics(bind).await?),
        None => None,
    };
    let sweepers = state.spawn_sweepers();
    let result = worker.run(shutdown_signal()).await;
    for sweeper in sweepers {
        sweeper.abort();
    }
    if let Some((stop, server)) = metrics {
        let _ = stop.send(());
        let _ = server.await;
    }
    result?;
    Ok(())
}

/// Serves `GET /metrics` alone on `bind` (`worker.metrics_bind`) with the
/// service's serving loop, until the returned sender fires.
async fn serve_metrics(
    bind: SocketAddr,
) -> anyhow::Result<(
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<()>>,
)> {
    let listener = TcpListener::bind(bind)
        .await
        .with_context(|| format!("bind {bind} (`worker.metrics_bind`)"))?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, "metrics listening");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let options = crate::http::ServeOptions {
        // Scrapers are few; nothing is left to drain once the worker stops.
        max_connections: 64,
        drain: std::time::Duration::from_secs(1),
        ..crate::http::ServeOptions::default()
    };
    let server = tokio::spawn(crate::http::serve(
        listener,
        crate::monitoring::router(),
        options,
        async move {
            let _ = stopped.await;
        },
    ));
    Ok((stop, server))
}

/// Runs one operator action on the queue, writing its answer to `out`.
///
/// # Errors
///
/// When the database cannot be reached, the product id is invalid, or the
/// action is refused (unknown task or another product's, a DAG node).
pub async fn tasks(
    pool: PgPool,
    action: TasksAction,
    mut out: impl std::io::Write,
) -> anyhow::Result<()> {
    let queue = PgTaskQueue::new(pool, Arc::new(SystemClock), QueueConfig::default());
    match action {
        TasksAction::Discarded { queue: q, limit } => {
            for task in queue.list_discarded(&q, limit).await? {
                writeln!(out, "{}", serde_json::to_string(&task)?)?;
            }
        }
        TasksAction::Retry { product, id } => {
            let product =
                ProductId::parse(&product).with_context(|| format!("product id {product:?}"))?;
            queue.retry_discarded(&product, TaskId(id)).await?;
            writeln!(out, "task {id} is available again")?;
        }
    }
    Ok(())
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
    tracing::info!("shutdown signal received, draining");
}
