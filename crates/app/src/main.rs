//! The `parlance` command line: `serve`, `worker`, `tasks`, `keys`,
//! `migrate`, `demo`, `conversation`.

#![forbid(unsafe_code)]

use clap::Parser as _;
use parlance_app::cli::{Cli, run};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    run(Cli::parse()).await
}
