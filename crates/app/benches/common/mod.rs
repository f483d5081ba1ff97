//! Helpers the benchmarks share: a fixed pseudo-random sequence, database
//! URLs, and the `pgbench` baseline.

#![allow(dead_code)] // each benchmark uses a different part

use std::process::Command;

use parlance_postgres::PgPool;
use sqlx::{Connection as _, Executor as _};

/// xorshift64*: a fixed, dependency-free pseudo-random sequence.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// `DATABASE_URL` with its database replaced by `db`.
pub(crate) fn url_for(db: &str) -> String {
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let base = url.split('?').next().unwrap_or(&url);
    let (prefix, _) = base.rsplit_once('/').expect("a database in the URL");
    format!("{prefix}/{db}")
}

pub(crate) async fn drop_database(pool: PgPool) {
    let name: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&pool)
        .await
        .expect("database name");
    pool.close().await;
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let mut admin = sqlx::PgConnection::connect(&url).await.expect("admin");
    let _ = admin
        .execute(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)").as_str())
        .await;
}

/// `pgbench -N -c clients -j 2 -T secs` on a scratch database: its tps.
pub(crate) async fn pgbench(clients: usize, secs: u64) -> Result<f64, String> {
    const DB: &str = "parlance_bench_pgbench";
    let url = std::env::var("DATABASE_URL").map_err(|e| e.to_string())?;
    let mut admin = sqlx::PgConnection::connect(&url)
        .await
        .map_err(|e| e.to_string())?;
    admin
        .execute(format!("DROP DATABASE IF EXISTS {DB} WITH (FORCE)").as_str())
        .await
        .map_err(|e| e.to_string())?;
    admin
        .execute(format!("CREATE DATABASE {DB}").as_str())
        .await
        .map_err(|e| e.to_string())?;
    let target = url_for(DB);
    let init = Command::new("pgbench")
        .args(["-i", "-q", "-s", "10", &target])
        .output()
        .map_err(|e| format!("cannot run pgbench: {e}"))?;
    if !init.status.success() {
        return Err(String::from_utf8_lossy(&init.stderr).into_owned());
    }
    let run = Command::new("pgbench")
        .args([
            "-N",
            "-c",
            &clients.to_string(),
            "-j",
            "2",
            "-T",
            &secs.to_string(),
            &target,
        ])
        .output()
        .map_err(|e| format!("cannot run pgbench: {e}"))?;
    let out = String::from_utf8_lossy(&run.stdout).into_owned();
    let _ = admin
        .execute(format!("DROP DATABASE IF EXISTS {DB} WITH (FORCE)").as_str())
        .await;
    out.lines()
        .find(|l| l.starts_with("tps = "))
        .and_then(|l| l["tps = ".len()..].split_whitespace().next())
        .and_then(|x| x.parse().ok())
        .ok_or_else(|| format!("no tps in pgbench output: {out}"))
}

/// The prefix of a result line that `cargo xtask bench all` collects.
pub(crate) const ROW_PREFIX: &str = "@bench-row\t";

/// Prints one row of a results table for `cargo xtask bench all`, as
/// `@bench-row<TAB>{"table": .., "columns": [..], "cells": [..]}` on its
/// own line. Rows with the same `table` form one table in
/// `docs/performance.md`, in the order printed; `columns` is the header and
/// must be the same for every row of a table.
pub(crate) fn report_row(table: &str, columns: &[&str], cells: &[String]) {
    use std::io::Write as _;
    assert_eq!(columns.len(), cells.len(), "one cell per column in {table}");
    let line = serde_json::json!({ "table": table, "columns": columns, "cells": cells });
    let _ = writeln!(std::io::stdout(), "{ROW_PREFIX}{line}");
}
