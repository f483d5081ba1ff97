//! The `parlance` command line: `serve`, `worker`, `tasks`, `migrate`,
//! `keys`, `demo`.

#![forbid(unsafe_code)]

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use parlance_app::{LogFormat, ServeConfig, demo, serve, telemetry};
use parlance_postgres::{DatabaseUrl, PoolOptions};

/// Parlance: the state layer for conversational AI agents.
#[derive(Debug, Parser)]
#[command(name = "parlance", version, about)]
struct Cli {
    /// Log format (logs go to stderr; the filter comes from RUST_LOG).
    #[arg(long, value_enum, default_value_t = LogFormat::Pretty, global = true)]
    log_format: LogFormat,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the HTTP service (in memory unless a database URL is given).
    Serve(ServeConfig),
    /// Run queued tasks from PostgreSQL until SIGINT or SIGTERM.
    Worker(parlance_app::worker::command::WorkerArgs),
    /// Inspect and retry dead-lettered tasks.
    Tasks(parlance_app::worker::command::TasksArgs),
    /// Create, list and revoke API keys stored in PostgreSQL.
    Keys(parlance_app::keys::KeysArgs),
    /// Apply database migrations and exit.
    Migrate {
        /// PostgreSQL URL.
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
    },
    /// Play a scripted scenario through every machine and print the transcript.
    Demo,
    /// Operate conversations on a running server.
    Conversation {
        #[command(flatten)]
        client: parlance_app::conversation::cli::ClientArgs,
        #[command(subcommand)]
        command: parlance_app::conversation::cli::ConversationCommand,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(config) => {
            telemetry::init(cli.log_format);
            serve::run(config).await
        }
        Command::Worker(args) => {
            telemetry::init(cli.log_format);
            parlance_app::worker::command::run(args).await
        }
        Command::Tasks(args) => {
            telemetry::init(cli.log_format);
            parlance_app::worker::command::tasks(args, std::io::stdout().lock()).await
        }
        Command::Keys(args) => {
            telemetry::init(cli.log_format);
            parlance_app::keys::run(args, std::io::stdout().lock()).await
        }
        Command::Migrate { database_url } => {
            telemetry::init(cli.log_format);
            let url = DatabaseUrl::new(database_url);
            let pool = parlance_postgres::connect(&url, &PoolOptions::default())?;
            parlance_postgres::migrate(&pool)
                .await
                .with_context(|| format!("migrate {url}"))?;
            tracing::info!(database = %url, "migrations applied");
            Ok(())
        }
        Command::Demo => demo::run(std::io::stdout().lock()).await,
        Command::Conversation { client, command } => {
            parlance_app::conversation::cli::run(client, command, std::io::stdout().lock()).await
        }
    }
}
