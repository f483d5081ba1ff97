//! Tests against a live `parlance serve`: schemathesis on its API document
//! (`xtask/api-test/`), the Python client's pytest suite
//! (`clients/python/tests`) and the operator console in a headless Chromium
//! (`xtask/browser/`), in memory and on PostgreSQL.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::pg;
use crate::py::{self, Venv};
use crate::run::{Cmd, on_ci, root};
use crate::serve::{self, API_KEY, PRODUCT, Server};

/// Where the service keeps its state for a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backend {
    Memory,
    Postgres,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Postgres => "postgres",
        }
    }
}

/// What to run against each backend's server.
pub(crate) struct Plan {
    pub(crate) backends: Vec<Backend>,
    /// Schemathesis' time budget per backend; `None` runs no schemathesis.
    pub(crate) schemathesis: Option<Duration>,
    /// Whether to run the client's pytest suite.
    pub(crate) pytest: bool,
    /// Whether to run the console's browser test.
    pub(crate) browser: bool,
}

/// `cargo xtask api-test [--minutes N] [--backend memory|postgres]
/// [--with-client]`: N minutes (default 2) of schemathesis, split between
/// the backends, and with `--with-client` the client's tests and the
/// console's browser test on each (what `cargo xtask ci` runs).
pub(crate) fn api_test(args: &[String]) -> Result<()> {
    let mut minutes = 2.0_f64;
    let mut backends = vec![Backend::Memory, Backend::Postgres];
    let mut pytest = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--minutes" => {
                minutes = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|m: &f64| *m > 0.0)
                    .context("--minutes needs a positive number")?;
            }
            "--backend" => backends = vec![backend(it.next())?],
            "--with-client" => pytest = true,
            other => bail!("unknown api-test argument `{other}`"),
        }
    }
    let each = Duration::from_secs_f64(minutes * 60.0 / backends.len() as f64);
    run(&Plan {
        backends,
        schemathesis: Some(each),
        pytest,
        browser: pytest,
    })
}

/// `cargo xtask client-test [--backend memory|postgres]`: the Python
/// client's tests (memory by default).
pub(crate) fn client_test(args: &[String]) -> Result<()> {
    let mut backends = vec![Backend::Memory];
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--backend" => backends = vec![backend(it.next())?],
            other => bail!("unknown client-test argument `{other}`"),
        }
    }
    run(&Plan {
        backends,
        schemathesis: None,
        pytest: true,
        browser: false,
    })
}

/// `cargo xtask browser-test [--backend memory|postgres]`: the operator
/// console's browser test (both backends by default).
pub(crate) fn browser_test(args: &[String]) -> Result<()> {
    let mut backends = vec![Backend::Memory, Backend::Postgres];
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--backend" => backends = vec![backend(it.next())?],
            other => bail!("unknown browser-test argument `{other}`"),
        }
    }
    run(&Plan {
        backends,
        schemathesis: None,
        pytest: false,
        browser: true,
    })
}

fn backend(v: Option<&String>) -> Result<Backend> {
    match v.map(String::as_str) {
        Some("memory") => Ok(Backend::Memory),
        Some("postgres") => Ok(Backend::Postgres),
        _ => bail!("--backend takes memory or postgres"),
    }
}

/// Runs the plan; every backend runs even when one fails, then the first
/// failure is returned. Without python3 (or PostgreSQL for that backend)
/// the part is skipped and said so, except under `CI`, where it fails.
pub(crate) fn run(plan: &Plan) -> Result<()> {
    if py::interpreter().is_none() && !root().join("target/py/venv/bin/python").is_file() {
        if on_ci() {
            bail!("CI is set and python3 (with venv) is missing: the API tests cannot run");
        }
        println!("xtask: API tests and the Python client's tests skipped: no python3 with venv");
        return Ok(());
    }
    let venv = py::ensure()?;
    let bin = serve::build()?;
    let chromium = plan.browser && chromium()?;
    let mut failures = Vec::new();
    for &b in &plan.backends {
        let started = Instant::now();
        let result = run_backend(plan, &venv, &bin, b, chromium);
        println!(
            "xtask: {} against `serve` on {} in {:.0?}",
            what(plan),
            b.name(),
            started.elapsed()
        );
        if let Err(e) = result {
            eprintln!("xtask: {} on {}: {e:#}", what(plan), b.name());
            failures.push(format!("{}: {e:#}", b.name()));
        }
    }
    if !failures.is_empty() {
        bail!("{} failed: {}", what(plan), failures.join("; "));
    }
    Ok(())
}

fn what(plan: &Plan) -> &'static str {
    match (plan.schemathesis.is_some(), plan.pytest, plan.browser) {
        (true, true, true) => "schemathesis, the client's tests and the console's browser test",
        (true, true, false) => "schemathesis and the client's tests",
        (true, false, _) => "schemathesis",
        (false, true, true) => "the client's tests and the console's browser test",
        (false, false, true) => "the console's browser test",
        _ => "the client's tests",
    }
}

fn run_backend(plan: &Plan, venv: &Venv, bin: &Path, b: Backend, chromium: bool) -> Result<()> {
    // Dropped in reverse order: the server stops before its database goes.
    let (db, scratch) = match b {
        Backend::Memory => (None, None),
        Backend::Postgres => {
            let Some(db) = pg::provide()? else {
                if on_ci() {
                    bail!("CI is set and no PostgreSQL is available");
                }
                println!("xtask: PostgreSQL part skipped: no database could be found or started");
                return Ok(());
            };
            let scratch = pg::Scratch::create(&db, "api")?;
            (Some(db), Some(scratch))
        }
    };
    let server = Server::start(
        &bin.to_path_buf(),
        b.name(),
        scratch.as_ref().map(pg::Scratch::url),
    )?;
    let mut result = Ok(());
    if let Some(budget) = plan.schemathesis {
        result = schemathesis(venv, &server, b, budget);
    }
    if plan.pytest {
        let r = pytest(venv, &server);
        result = result.and(r);
    }
    if chromium {
        let r = browser(
            venv,
            bin,
            &server,
            b,
            scratch.as_ref().map(pg::Scratch::url),
        );
        result = result.and(r);
    }
    drop(server);
    drop(scratch);
    drop(db);
    result
}

fn schemathesis(venv: &Venv, server: &Server, b: Backend, budget: Duration) -> Result<()> {
    let out = root().join("target").join("py");
    let report = out.join(format!("schemathesis-{}.json", b.name()));
    let tally = out.join(format!("schemathesis-{}-tally.json", b.name()));
    for f in [&report, &tally] {
        if f.exists() {
            std::fs::remove_file(f)?;
        }
    }
    let status = Cmd::new(venv.bin("schemathesis"))
        .args(["--config-file", "xtask/api-test/schemathesis.toml", "run"])
        .arg(format!("{}/openapi.json", server.url))
        .args(["--max-time", &budget.as_secs().max(1).to_string()])
        .args(["--workers", "2", "--report", "json", "--report-json-path"])
        .arg(&report)
        .env("PARLANCE_API_KEY", API_KEY)
        .env("PARLANCE_PRODUCT", PRODUCT)
        .env("PARLANCE_API_TEST_TALLY", &tally)
        .env("HYPOTHESIS_STORAGE_DIRECTORY", out.join("hypothesis"))
        .run();
    let figures = Figures::read(&report, &tally);
    match &figures {
        Ok(f) => println!("xtask: schemathesis on {}: {f}", b.name()),
        Err(e) => eprintln!("xtask: schemathesis on {}: no figures: {e:#}", b.name()),
    }
    status?;
    figures.map(drop)
}

fn pytest(venv: &Venv, server: &Server) -> Result<()> {
    Cmd::new(venv.bin("python"))
        .args([
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "clients/python",
        ])
        .env("PARLANCE_URL", &server.url)
        .env("PARLANCE_API_KEY", API_KEY)
        .env("PARLANCE_PRODUCT", PRODUCT)
        .run()
}

/// Debian's Chromium, which the browser test drives (never a browser
/// Playwright downloads).
pub(crate) const CHROMIUM: &str = "/usr/bin/chromium";

/// Whether Chromium is there to run the browser test, installing Debian's
/// `chromium` and `chromium-driver` with `apt-get` when it is missing (after
/// `apt-get update` when the first try fails). Under `CI` a failed install
/// is an error; elsewhere the test is skipped with the reason printed.
pub(crate) fn chromium() -> Result<bool> {
    if Path::new(CHROMIUM).is_file() {
        return Ok(true);
    }
    println!("xtask: {CHROMIUM} is missing; installing Debian's chromium");
    let install = || {
        Cmd::new("apt-get")
            .args(["install", "-y", "chromium", "chromium-driver"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .run()
    };
    let installed = install()
        .or_else(|_| {
            Cmd::new("apt-get")
                .args(["update"])
                .env("DEBIAN_FRONTEND", "noninteractive")
                .run()?;
            install()
        })
        .and_then(|()| {
            if Path::new(CHROMIUM).is_file() {
                Ok(())
            } else {
                bail!("apt-get installed chromium but {CHROMIUM} is still missing")
            }
        });
    match installed {
        Ok(()) => Ok(true),
        Err(e) if on_ci() => {
            Err(e.context("CI is set and Chromium could not be installed for the browser test"))
        }
        Err(e) => {
            println!("xtask: console browser test skipped: no {CHROMIUM} ({e:#})");
            Ok(false)
        }
    }
}

/// The console's browser test (`xtask/browser/console_test.py`) against
/// `server`. On PostgreSQL a second product's key is made with `parlance
/// keys create` on the server's database, so the test also checks that it
/// does not see the first product's conversation; the in-memory server's
/// keys live in its process, out of the command's reach.
fn browser(
    venv: &Venv,
    bin: &Path,
    server: &Server,
    b: Backend,
    database_url: Option<&str>,
) -> Result<()> {
    let shots = root()
        .join("target")
        .join("console-screenshots")
        .join(b.name());
    let checks_file = root()
        .join("target")
        .join("py")
        .join(format!("console-checks-{}.txt", b.name()));
    let _ = std::fs::remove_file(&checks_file);
    let second_key = match database_url {
        Some(url) => {
            let out = Cmd::new(bin)
                .args(["keys", "create", "--product", "console-second"])
                .args(["--label", "console browser test"])
                .env("DATABASE_URL", url)
                .output()?;
            let made: serde_json::Value =
                serde_json::from_str(out.trim()).context("read `keys create`'s answer")?;
            made["key"]
                .as_str()
                .context("`keys create` printed no key")?
                .to_owned()
        }
        None => String::new(),
    };
    let status = Cmd::new(venv.bin("python"))
        .arg("xtask/browser/console_test.py")
        .env("PARLANCE_URL", &server.url)
        .env("PARLANCE_API_KEY", API_KEY)
        .env("PARLANCE_PRODUCT", PRODUCT)
        .env("PARLANCE_SECOND_KEY", &second_key)
        .env("PARLANCE_CHROMIUM", CHROMIUM)
        .env("PARLANCE_SCREENSHOTS", &shots)
        .env("PARLANCE_CHECKS_FILE", &checks_file)
        .run();
    let checks = std::fs::read_to_string(&checks_file)
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "no".to_owned());
    let mut pictures: Vec<_> = std::fs::read_dir(&shots)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    pictures.sort();
    for p in &pictures {
        println!("xtask: screenshot {}", p.display());
    }
    println!(
        "xtask: console browser test on {}: {checks} checks{}, screenshots in {}",
        b.name(),
        if second_key.is_empty() {
            " (no second product: its keys cannot be made for the in-memory server)"
        } else {
            ""
        },
        shots.display()
    );
    status
}

/// The counts of one schemathesis run, from its JSON report and the
/// requests the hook in `xtask/api-test/checks.py` tallied by status.
struct Figures {
    operations: u64,
    tested: u64,
    test_cases: u64,
    requests: BTreeMap<String, u64>,
    failures: u64,
    errors: u64,
}

impl Figures {
    fn read(report: &Path, tally: &Path) -> Result<Self> {
        let r: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(report)
                .with_context(|| format!("read {}", report.display()))?,
        )?;
        let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
        let requests: BTreeMap<String, u64> = serde_json::from_str(
            &std::fs::read_to_string(tally).with_context(|| format!("read {}", tally.display()))?,
        )?;
        Ok(Self {
            operations: n(&r["operations"]["total"]),
            tested: n(&r["operations"]["tested"]),
            test_cases: n(&r["test_cases"]["generated"]),
            requests,
            failures: n(&r["test_cases"]["unique_failures"]),
            errors: r["errors"].as_array().map_or(0, |e| e.len() as u64),
        })
    }
}

impl std::fmt::Display for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let total: u64 = self.requests.values().sum();
        let by_status: Vec<String> = self
            .requests
            .iter()
            .map(|(s, n)| format!("{s}: {n}"))
            .collect();
        write!(
            f,
            "{} operations ({} tested), {} test cases, {total} requests ({}), \
             {} unique failures, {} errors",
            self.operations,
            self.tested,
            self.test_cases,
            by_status.join(", "),
            self.failures,
            self.errors
        )
    }
}
