//! `parlance worker`: a worker process on PostgreSQL.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use parlance_ports::{IdGen as _, QueueConfig, SystemClock, UuidV7Ids, WorkerId};
use parlance_postgres::{DatabaseUrl, PgTaskQueue, PoolOptions};

use super::{Worker, WorkerConfig, register_test_handlers};
use crate::serve::shutdown_signal;

/// Options of `parlance worker`.
#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    /// PostgreSQL URL (a worker needs a shared, durable queue).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,

    /// The queue to claim from.
    #[arg(long, default_value = parlance_ports::queue::DEFAULT_QUEUE)]
    pub queue: String,

    /// Tasks run at once.
    #[arg(long, default_value_t = 4)]
    pub slots: usize,

    /// Deadline of an attempt whose task sets none, in seconds.
    #[arg(long, default_value_t = 300)]
    pub lease_secs: u64,

    /// Heartbeat interval, in milliseconds.
    #[arg(long, default_value_t = 5_000)]
    pub heartbeat_ms: u64,

    /// A worker silent this long is dead and loses its tasks, in seconds.
    #[arg(long, default_value_t = 30)]
    pub stale_after_secs: u64,

    /// Interval of this worker's lease sweep, in milliseconds.
    #[arg(long, default_value_t = 5_000)]
    pub sweep_ms: u64,

    /// Finished tasks and runs are deleted after this many hours.
    #[arg(long, default_value_t = 24)]
    pub retention_hours: u64,

    /// On SIGTERM, how long running tasks may finish before their leases
    /// are released, in seconds.
    #[arg(long, default_value_t = 10)]
    pub grace_secs: u64,

    /// Also run the `test.sleep` and `test.record` kinds (for end-to-end
    /// tests; `test.record` writes to a file its payload names).
    #[arg(long)]
    pub test_handlers: bool,

    /// Directory of flows, as given to `parlance serve --flows`: the flow
    /// task graphs this worker runs render their templates.
    #[arg(long, env = "PARLANCE_FLOWS")]
    pub flows: Option<std::path::PathBuf>,
}

impl WorkerArgs {
    /// The runtime configuration these options describe.
    pub fn worker_config(&self) -> WorkerConfig {
        WorkerConfig {
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
}

/// Connects, migrates and runs one worker until SIGINT or SIGTERM.
///
/// # Errors
///
/// When the database cannot be reached or migrated.
pub async fn run(args: WorkerArgs) -> anyhow::Result<()> {
    let url = DatabaseUrl::new(args.database_url.clone());
    let pool = parlance_postgres::connect(&url, &PoolOptions::default())?;
    parlance_postgres::migrate(&pool)
        .await
        .with_context(|| format!("migrate {url}"))?;
    let config = QueueConfig {
        worker_stale_after: Duration::from_secs(args.stale_after_secs),
        ..QueueConfig::default()
    };
    let clock = Arc::new(SystemClock);
    let queue = Arc::new(PgTaskQueue::new(pool.clone(), clock.clone(), config));
    let mut state = crate::state::AppState::postgres(pool.clone(), crate::auth::ApiKeys::new());
    state.queue = queue.clone();
    state.conversations = Arc::new(parlance_postgres::PgConversationStore::new(
        pool,
        (*queue).clone(),
    ));
    if let Some(dir) = &args.flows {
        let known = |name: &str| crate::flow::Invokers::is_builtin(name);
        state.flow_catalog = Arc::new(
            crate::flow::FlowCatalog::load_dir(dir, &known)
                .with_context(|| format!("load flows from {}", dir.display()))?,
        );
    }
    let mut handlers = super::standard_handlers(&state);
    if args.test_handlers {
        register_test_handlers(&mut handlers);
    }
    let worker = Worker::new(
        WorkerId(UuidV7Ids.new_uuid()),
        queue,
        handlers,
        clock,
        args.worker_config(),
    );
    let sweepers = crate::serve::spawn_sweepers(&state);
    let result = worker.run(shutdown_signal()).await;
    for sweeper in sweepers {
        sweeper.abort();
    }
    result?;
    Ok(())
}

/// Options of `parlance tasks`: the operator's view of dead letters.
#[derive(Debug, Clone, Args)]
pub struct TasksArgs {
    /// PostgreSQL URL.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,

    /// What to do.
    #[command(subcommand)]
    pub action: TasksAction,
}

/// An operator action on the queue.
#[derive(Debug, Clone, clap::Subcommand)]
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
        /// The task id.
        id: i64,
    },
}

/// Runs one operator action, writing its answer to `out`.
///
/// # Errors
///
/// When the database cannot be reached or the action is refused (unknown
/// task, a DAG node).
pub async fn tasks(args: TasksArgs, mut out: impl std::io::Write) -> anyhow::Result<()> {
    use parlance_ports::{TaskId, TaskQueue as _};
    let url = DatabaseUrl::new(args.database_url.clone());
    let pool = parlance_postgres::connect(&url, &PoolOptions::default())?;
    parlance_postgres::migrate(&pool)
        .await
        .with_context(|| format!("migrate {url}"))?;
    let queue = PgTaskQueue::new(pool, Arc::new(SystemClock), QueueConfig::default());
    match args.action {
        TasksAction::Discarded { queue: q, limit } => {
            for task in queue.list_discarded(&q, limit).await? {
                writeln!(out, "{}", serde_json::to_string(&task)?)?;
            }
        }
        TasksAction::Retry { id } => {
            queue.retry_discarded(TaskId(id)).await?;
            writeln!(out, "task {id} is available again")?;
        }
    }
    Ok(())
}
