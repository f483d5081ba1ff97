//! Project automation: `cargo xtask ci | test | docs`.
//!
//! Depends on no `parlance-*` crate, so it builds in seconds. It finds the
//! workspace root from `CARGO_MANIFEST_DIR`, runs cargo through the `CARGO`
//! environment variable and prints every command before running it.

#![forbid(unsafe_code)]
#![allow(clippy::print_stdout, clippy::print_stderr)] // a command-line tool

mod pg;
mod run;
#[cfg(test)]
mod tidy;

use anyhow::{Result, bail};

use crate::run::{Cmd, cargo};

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  ci     everything CI checks: fmt, clippy, tests (PostgreSQL included), cargo-deny
         (advisories reported, not blocking), docs, tidy
  test   the workspace tests, with PostgreSQL found or started as for ci
  docs   build the API docs with warnings denied
  bench <name>  run the benchmark `crates/app/benches/<name>.rs` (release build)
                against PostgreSQL found or started as for ci
";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("test") => test(&args[1..]),
        Some("docs") => docs(),
        Some("bench") => bench(&args[1..]),
        _ => {
            eprint!("{USAGE}");
            bail!("unknown or missing command")
        }
    }
}

fn ci() -> Result<()> {
    let started = std::time::Instant::now();
    cargo(["fmt", "--all", "--check"]).run()?;
    cargo([
        "clippy",
        "--workspace",
        "--all-targets",
        "--locked",
        "--",
        "-D",
        "warnings",
    ])
    .run()?;
    test(&[])?;
    deny()?;
    let advisories = advisories();
    docs()?;
    println!("xtask: {advisories}");
    println!("xtask: ci passed in {:.0?}", started.elapsed());
    Ok(())
}

/// Runs every test of the workspace with a PostgreSQL database, then tidy.
fn test(extra: &[String]) -> Result<()> {
    let db = pg::provide()?;
    let mut cmd = cargo(["test", "--workspace", "--locked", "--exclude", "xtask"])
        .env("INSTA_UPDATE", "no")
        .env("RUST_BACKTRACE", "1");
    cmd = match &db {
        Some(db) => cmd
            .env("DATABASE_URL", db.url())
            .env("PARLANCE_REQUIRE_POSTGRES", "1"),
        None => {
            println!(
                "xtask: PostgreSQL tests will be skipped: no database could be found or started"
            );
            cmd.env_remove("DATABASE_URL")
        }
    };
    cmd.args(extra).run()?;
    drop(db);
    // Tidy: layering, module docs and stray snapshots (tests in this crate).
    cargo(["test", "--package", "xtask", "--locked"]).run()
}

/// Runs one benchmark (or all with no name) in release mode with a database.
fn bench(args: &[String]) -> Result<()> {
    let db = pg::provide()?;
    let mut cmd = cargo(["bench", "--package", "parlance-app", "--locked"]);
    if let Some(name) = args.first() {
        cmd = cmd.args(["--bench", name]);
    }
    cmd = cmd.arg("--").args(args.iter().skip(1));
    cmd = match &db {
        Some(db) => cmd.env("DATABASE_URL", db.url()),
        None => {
            bail!("benchmarks need PostgreSQL: set DATABASE_URL or run a server at 127.0.0.1:5432")
        }
    };
    cmd.run()
}

fn deny() -> Result<()> {
    if !Cmd::new("cargo-deny").arg("--version").succeeds_quietly() {
        cargo(["install", "--locked", "cargo-deny"]).run()?;
    }
    cargo([
        "deny",
        "--workspace",
        "check",
        "--hide-inclusion-graph",
        "bans",
        "licenses",
        "sources",
    ])
    .run()
}

/// `cargo deny check advisories`: reported, never blocking (the advisory
/// database changes daily and needs the network). Returns the line to print.
fn advisories() -> String {
    let result = cargo([
        "deny",
        "--workspace",
        "check",
        "--hide-inclusion-graph",
        "advisories",
    ])
    .run();
    match result {
        Ok(()) => "advisories: no known advisory affects the dependency tree".to_owned(),
        Err(e) => format!(
            "advisories: WARNING (not blocking): {e}; see the output above (a failed \
             fetch of the advisory database means the check could not run)"
        ),
    }
}

fn docs() -> Result<()> {
    cargo(["doc", "--workspace", "--no-deps", "--locked"])
        .env("RUSTDOCFLAGS", "-D warnings")
        .run()
}
