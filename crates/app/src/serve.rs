//! `parlance serve`: build the state, bind, serve until SIGINT or SIGTERM.

use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use parlance_core::ProductId;
use parlance_postgres::PoolOptions;
use tokio::net::TcpListener;

use crate::auth::{ApiKey, ApiKeys};
use crate::config::ServeConfig;
use crate::flow::{FlowCatalog, Invokers};
use crate::http::router;
use crate::models::Models;
use crate::state::AppState;

/// Builds the service state from configuration: PostgreSQL (migrated) when a
/// URL is given, memory otherwise; an OpenAI-compatible model when a base URL
/// is given, the offline one otherwise. Returns the key for product `default`
/// too.
///
/// # Errors
///
/// When the database cannot be reached or migrated, the model settings are
/// incomplete, or no key can be made.
pub async fn build_state(config: &ServeConfig) -> anyhow::Result<(AppState, ApiKey)> {
    let models = Models::from_config(config)?;
    let key = match &config.api_key {
        Some(k) if !k.trim().is_empty() => ApiKey::new(k.trim()),
        _ => ApiKey::generate().context("generate an API key")?,
    };
    let keys = ApiKeys::single(&key, ProductId::default_product());
    let mut state = match &config.database_url {
        None => AppState::memory(keys),
        Some(url) => {
            let pool = parlance_postgres::connect(url, &PoolOptions::default())?;
            parlance_postgres::migrate(&pool)
                .await
                .with_context(|| format!("migrate {url}"))?;
            let keys = keys.with_store(parlance_postgres::PgApiKeys::new(pool.clone()));
            AppState::postgres(pool, keys)
        }
    };
    state.body_limit = config.body_limit;
    state.llm = models.llm;
    state.embedder = models.embedder;
    if let Some(dir) = &config.flows {
        let extra = state.flow_invokers.clone();
        let known = |name: &str| Invokers::is_builtin(name) || extra.contains_key(name);
        state.flow_catalog = Arc::new(FlowCatalog::load_dir(dir, &known)?);
    }
    state.agent_data = Arc::new(crate::agent::AgentData::load(
        config.resource_directory.as_deref(),
        config.knowledge_base.as_deref(),
    )?);
    if let Some(url) = &config.webhook_url {
        let secret = std::env::var(&config.webhook_secret_env).with_context(|| {
            format!(
                "--webhook-url needs a signing secret in ${}",
                config.webhook_secret_env
            )
        })?;
        state.channel = Arc::new(crate::conversation::webhook::WebhookChannel::new(
            url.clone(),
            secret,
            std::time::Duration::from_secs(10),
        )?);
    }
    Ok((state, key))
}

/// Runs the service until a shutdown signal, then drains open requests.
///
/// # Errors
///
/// When the state cannot be built or the address cannot be bound.
pub async fn run(config: ServeConfig) -> anyhow::Result<()> {
    let (state, key) = build_state(&config).await?;
    let listener = TcpListener::bind(config.bind)
        .await
        .with_context(|| format!("bind {}", config.bind))?;
    let addr: SocketAddr = listener.local_addr()?;
    if config.api_key.is_none() {
        // The one place the key is shown: stdout, once, for the operator.
        let _ = writeln!(
            std::io::stdout(),
            "API key for product `default` (shown once): {}",
            key.expose()
        );
    }
    tracing::info!(
        llm = %state.llm.describe(),
        model = state.llm.default_model(),
        embedder = state.embedder.model(),
        "language model"
    );
    tracing::info!(%addr, backend = state.backend.name(), "parlance listening");
    let worker = (!config.no_worker).then(|| crate::worker::EmbeddedWorker::start(&state));
    let sweepers = spawn_sweepers(&state);
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown_signal())
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

/// Starts the timer sweepers `serve` and `worker` run: each claims only
/// what is due, so any number of processes can run them on one database.
pub fn spawn_sweepers(state: &AppState) -> Vec<tokio::task::JoinHandle<()>> {
    vec![
        crate::session::spawn_session_sweeper(state.clone()),
        crate::conversation::sweeper::spawn(state.clone()),
    ]
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
