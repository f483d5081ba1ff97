//! A fresh, migrated database per test.
//!
//! [`test_pool`] reads `DATABASE_URL`. When it is unset the PostgreSQL tests
//! are skipped: the first skip in a process says so on stderr, and every
//! skip is recorded ([`record_skip`]) so that `cargo xtask test` can count
//! them. When `PARLANCE_REQUIRE_POSTGRES` or `CI` is set (any non-empty
//! value), a missing database fails the test instead. Each call creates its own database named
//! `parlance_test_<pid>_<n>` and applies the migrations; databases left by
//! test processes that are no longer running are dropped in the background.

use std::io::Write as _;
use std::sync::Once;
use std::sync::atomic::{AtomicU32, Ordering};

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection as _, Executor as _, PgConnection, PgPool};

/// The variable that makes a missing database an error rather than a skip.
pub const REQUIRE_ENV: &str = "PARLANCE_REQUIRE_POSTGRES";

/// The file every skipped test appends a line to (`test<TAB>reason`), when
/// set; `cargo xtask test` sets it and counts the lines.
pub const SKIP_LOG_ENV: &str = "PARLANCE_SKIP_LOG";

/// Whether a test may not skip: [`REQUIRE_ENV`] or `CI` is set to a
/// non-empty value.
pub fn skips_forbidden() -> bool {
    [REQUIRE_ENV, "CI"]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|v| !v.is_empty()))
}

/// Records that the running test skipped for `reason`: in the file named
/// by [`SKIP_LOG_ENV`] when it is set. The test's name is its thread's
/// name, as the standard test harness runs each test on a thread of that
/// name.
pub fn record_skip(reason: &str) {
    let Some(path) = std::env::var_os(SKIP_LOG_ENV).filter(|p| !p.is_empty()) else {
        return;
    };
    let test = std::thread::current()
        .name()
        .unwrap_or("unnamed")
        .to_owned();
    let line = format!("{test}\t{reason}\n");
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        let _ = writeln!(std::io::stderr(), "note: cannot record a skipped test: {e}");
    }
}

const PREFIX: &str = "parlance_test_";

static SKIP_NOTICE: Once = Once::new();
static CLEANUP: Once = Once::new();
static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A pool on a new database with every migration applied, or `None` when no
/// PostgreSQL is configured (the test should return early).
///
/// # Panics
///
/// When the database cannot be created or migrated, or when none is
/// configured and [`REQUIRE_ENV`] is set.
pub async fn test_pool() -> Option<PgPool> {
    let Some(url) = std::env::var("DATABASE_URL").ok().filter(|u| !u.is_empty()) else {
        assert!(
            !skips_forbidden(),
            "{REQUIRE_ENV} or CI is set but DATABASE_URL is not: PostgreSQL tests must run here. \
             Set DATABASE_URL=postgres://user@host:port/db (cargo xtask ci finds or starts one)"
        );
        record_skip("DATABASE_URL is not set");
        SKIP_NOTICE.call_once(|| {
            // Written to the real stderr, past the test harness's capture.
            let _ = writeln!(
                std::io::stderr(),
                "note: PostgreSQL tests skipped: DATABASE_URL is not set"
            );
        });
        return None;
    };
    let admin_opts: PgConnectOptions = url.parse().expect("DATABASE_URL is a valid postgres URL");
    let mut admin = PgConnection::connect_with(&admin_opts)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to DATABASE_URL: {e}"));
    // In the background: dropping many databases is slow, and no test needs
    // to wait for it (a later process finishes what this one leaves).
    CLEANUP.call_once(|| {
        let opts = admin_opts.clone();
        tokio::spawn(async move {
            if let Ok(mut conn) = PgConnection::connect_with(&opts).await {
                drop_stale_databases(&mut conn).await;
            }
        });
    });
    let name = format!(
        "{PREFIX}{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    admin
        .execute(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)").as_str())
        .await
        .expect("drop leftover test database");
    admin
        .execute(format!("CREATE DATABASE {name}").as_str())
        .await
        .unwrap_or_else(|e| panic!("cannot create test database {name}: {e}"));
    let _ = admin.close().await;
    // Configured as `crate::connect` configures the service's pool (no check
    // when a connection is taken), so tests and benchmarks run what it runs.
    let pool = PgPoolOptions::new()
        .max_connections(24)
        .test_before_acquire(false)
        .connect_with(admin_opts.database(&name))
        .await
        .unwrap_or_else(|e| panic!("cannot connect to test database {name}: {e}"));
    crate::migrate(&pool).await.expect("migrations apply");
    Some(pool)
}

/// Drops test databases whose creating process has exited.
async fn drop_stale_databases(admin: &mut PgConnection) {
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT datname FROM pg_database WHERE datname LIKE 'parlance\\_test\\_%'",
    )
    .fetch_all(&mut *admin)
    .await
    .unwrap_or_default();
    for name in names {
        let pid = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('_').next())
            .and_then(|p| p.parse::<u32>().ok());
        let alive = pid.is_some_and(|p| std::path::Path::new(&format!("/proc/{p}")).exists());
        if !alive {
            let _ = admin
                .execute(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)").as_str())
                .await;
        }
    }
}
