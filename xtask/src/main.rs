//! Project automation: `cargo xtask ci | test | features | docs | fuzz | bench |
//! soak | api-test | client-test | browser-test`.
//!
//! Depends on no `parlance-*` crate, so it builds in seconds. It finds the
//! workspace root from `CARGO_MANIFEST_DIR`, runs cargo through the `CARGO`
//! environment variable and prints every command before running it.

#![forbid(unsafe_code)]
#![allow(clippy::print_stdout, clippy::print_stderr)] // a command-line tool

mod api;
mod bench_all;
mod pg;
mod py;
mod run;
mod serve;
#[cfg(test)]
mod tidy;

use anyhow::{Context as _, Result, bail};

use crate::run::{Cmd, cargo};

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  ci     everything CI checks: fmt, clippy, the feature checks, tests (PostgreSQL
         included), schemathesis and the Python client's tests against a live serve
         (a minute of schemathesis on each backend), cargo-deny (advisories reported,
         not blocking), docs, tidy, `cargo package` of the library crates (verified;
         offline when the cargo cache holds every dependency), the library examples
         (examples/library), and the fuzz smoke run (needs a nightly toolchain;
         skipped without one unless CI is set)
  test   the workspace tests, with PostgreSQL found or started as for ci
  features
         `cargo check` of each library crate (core, ports, memory, postgres, testkit)
         with no default features, then with each machine feature alone (session,
         adoption, conversation, turn, flow); then `cargo tree` of parlance-core with
         `session` alone, failing if a template, YAML or JSON Schema crate is in it
  docs   build the API docs with warnings denied
  package
         `cargo package` of the six library crates, each verified (as ci does)
  examples
         run every example of examples/library, with PostgreSQL found or started
         as for ci
  fuzz [--smoke | --secs N] [target...]
         run the cargo-fuzz targets in fuzz/ (nightly; cargo-fuzz is installed
         when missing): --smoke runs each for 30 s on an unoptimised build
         (quick to compile), --secs N for N seconds on an optimised one
  bench <name> [part...] [--smoke]
                run the benchmark `crates/app/benches/<name>.rs` (release build)
                against PostgreSQL found or started as for ci (`session core`
                and `session replay` need none; replay makes a venv with the
                reference SDK under target/; `console [memory] [pg]` loads the
                operator console's pages in Chromium with 10,000 conversations
                stored, with the venv and Chromium of the browser test)
  bench all [--from-log FILE]
                every benchmark but soak, one after the other after one release
                build, the output logged under target/bench-all/; then the tables
                they print are written into docs/performance.md (between the
                bench-all markers). --from-log renders a saved log, running nothing
  api-test [--minutes N] [--backend memory|postgres] [--with-client]
         schemathesis against `parlance serve` on its /openapi.json: every operation,
         positive and negative data, stateful links; N minutes (default 2) split
         between memory and PostgreSQL; --with-client runs the Python client's tests
         and the console's browser test against the same servers (as ci does);
         Python tools in target/py/venv
  client-test [--backend memory|postgres]
         the Python client's tests (clients/python) against `parlance serve`
  browser-test [--backend memory|postgres]
         the operator console in headless Chromium against `parlance serve`
  soak [--minutes N] [--out DIR]
         mixed load on every machine against two serves and two workers on
         PostgreSQL, with slow clients and oversized inputs; records requests,
         answers by status, memory and sockets per process (target/soak/), and
         fails on growth without bound or a lost acknowledged write
";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("test") => test(&args[1..]),
        Some("features") => features().map(drop),
        Some("docs") => docs(),
        Some("package") => package(),
        Some("examples") => examples(),
        Some("bench") => bench(&args[1..]),
        Some("soak") => soak(&args[1..]),
        Some("fuzz") => fuzz(&args[1..]),
        Some("api-test") => api::api_test(&args[1..]),
        Some("client-test") => api::client_test(&args[1..]),
        Some("browser-test") => api::browser_test(&args[1..]),
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
    let features_took = features()?;
    test(&[])?;
    let live = std::time::Instant::now();
    api::api_test(&["--with-client".to_owned()])?;
    let live = live.elapsed();
    deny()?;
    let advisories = advisories();
    docs()?;
    package()?;
    examples()?;
    if nightly_available() {
        fuzz(&["--smoke".to_owned()])?;
    } else if run::on_ci() {
        bail!("the fuzz smoke run needs a nightly toolchain: rustup toolchain install nightly");
    } else {
        println!("xtask: fuzz smoke run skipped: no nightly toolchain");
    }
    println!("xtask: {advisories}");
    println!("xtask: the feature checks took {features_took:.0?}");
    println!("xtask: schemathesis and the Python client's tests took {live:.0?}");
    println!("xtask: ci passed in {:.0?}", started.elapsed());
    Ok(())
}

/// The library crates whose machines are cargo features.
const FEATURE_CRATES: [&str; 5] = [
    "parlance-core",
    "parlance-ports",
    "parlance-memory",
    "parlance-postgres",
    "parlance-testkit",
];

/// One feature per machine; each crate of [`FEATURE_CRATES`] has them all,
/// on by default.
const MACHINE_FEATURES: [&str; 5] = ["session", "adoption", "conversation", "turn", "flow"];

/// Crates only the flow machine needs: the template engine, YAML and JSON
/// Schema. A build of parlance-core with `session` alone must not hold one.
const FLOW_ONLY_CRATES: [&str; 4] = ["minijinja", "serde_norway", "serde_yaml", "jsonschema"];

/// Checks that every library crate builds with no machine and with each
/// machine alone, and that a session-only parlance-core pulls in none of
/// [`FLOW_ONLY_CRATES`]. Libraries only, `cargo check`: no code generated.
/// Returns how long it took.
fn features() -> Result<std::time::Duration> {
    let started = std::time::Instant::now();
    // One crate at a time: checked together, the crates would share the
    // features of their third-party dependencies, hiding a crate that uses
    // a feature only another one turns on.
    for krate in FEATURE_CRATES {
        let check = || cargo(["check", "--package", krate, "--lib", "--locked"]);
        check_without_warnings(check().arg("--no-default-features"))?;
        for machine in MACHINE_FEATURES {
            let alone = check().args(["--no-default-features", "--features", machine]);
            check_without_warnings(alone)?;
        }
    }
    let tree = cargo([
        "tree",
        "--package",
        "parlance-core",
        "--no-default-features",
        "--features",
        "session",
        "--edges",
        "normal",
        "--prefix",
        "none",
        "--locked",
    ])
    .output()?;
    let names = tree_crate_names(&tree);
    let found = flow_only(&names);
    if !found.is_empty() {
        bail!(
            "parlance-core with `session` alone depends on {}: flow-only crates must be \
             optional and enabled by the `flow` feature",
            found.join(", ")
        );
    }
    let took = started.elapsed();
    println!(
        "xtask: {} crates checked with no machine and with each of {} machines alone; \
         a session-only parlance-core has {} crates; took {took:.0?}",
        FEATURE_CRATES.len(),
        MACHINE_FEATURES.len(),
        names.len()
    );
    Ok(took)
}

/// Runs `check` (a `cargo check`) and fails on a warning as on an error: code
/// only one machine uses must be gated with it, else a build without that
/// machine warns of dead code. Diagnostics are printed as rustc renders them.
fn check_without_warnings(check: Cmd) -> Result<()> {
    let (mut command, shown) = check.arg("--message-format=json").into_parts();
    println!("$ {shown}");
    let out = command
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("could not start `{shown}`"))?;
    let mut warnings = 0;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if message["reason"] != "compiler-message" {
            continue;
        }
        if let Some(rendered) = message["message"]["rendered"].as_str() {
            print!("{rendered}");
        }
        if message["message"]["level"] == "warning" {
            warnings += 1;
        }
    }
    if !out.status.success() {
        bail!("`{shown}` failed: {}", out.status);
    }
    if warnings > 0 {
        bail!("`{shown}`: warnings: {warnings}");
    }
    Ok(())
}

/// The crates of `names` that are in [`FLOW_ONLY_CRATES`].
fn flow_only<'a>(names: &[&'a str]) -> Vec<&'a str> {
    names
        .iter()
        .copied()
        .filter(|n| FLOW_ONLY_CRATES.contains(n))
        .collect()
}

/// The distinct crate names of a `cargo tree --prefix none` listing.
fn tree_crate_names(tree: &str) -> Vec<&str> {
    let mut names: Vec<&str> = tree
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// The library crates a release publishes, dependencies first.
const LIBRARY_CRATES: &[&str] = &[
    "parlance-core",
    "parlance-ports",
    "parlance-testkit",
    "parlance-memory",
    "parlance-postgres",
    "parlance-openai",
];

/// The root manifest's `[profile.dev]` settings as `--config` values. A
/// packaged crate is a root of its own, so the workspace's profiles are not
/// in it; given to `cargo package`, they let the verification builds reuse
/// the test build's dependencies instead of building them all again with
/// full debug information. A test checks them against `Cargo.toml`.
const DEV_PROFILE: [&str; 2] = [
    "profile.dev.debug=\"line-tables-only\"",
    "profile.dev.package.\"*\".debug=false",
];

/// `cargo package` of every library crate in one run, each verified by
/// building it from its `.crate` (cargo overlays the crates not yet on
/// crates.io as a local registry). The builds share the workspace's target
/// directory and, through [`DEV_PROFILE`], its profile, so they reuse what
/// the tests built. Offline first: once any build has fetched the
/// dependencies nothing needs the network; with a cold cache it runs again
/// with registry access. `--allow-dirty` lets it run before the change is
/// committed.
fn package() -> Result<()> {
    let started = std::time::Instant::now();
    let cmd = || {
        let mut c = cargo(["package", "--locked", "--allow-dirty"]);
        for krate in LIBRARY_CRATES {
            c = c.args(["--package", krate]);
        }
        for setting in DEV_PROFILE {
            c = c.args(["--config", setting]);
        }
        c
    };
    forget_packaged_library_crates()?;
    if let Err(e) = cmd().arg("--offline").run() {
        println!("xtask: offline packaging failed ({e:#}); again with registry access");
        forget_packaged_library_crates()?;
        cmd().run()?;
    }
    println!(
        "xtask: {} library crates packaged and verified in {:.0?}",
        LIBRARY_CRATES.len(),
        started.elapsed()
    );
    Ok(())
}

/// Forgets what an earlier packaging left of the library crates: their
/// sources cargo unpacked from its local registry and what it built from
/// them. A verification builds a crate against its dependencies as
/// packaged, taken from that registry, which cargo treats as a published
/// version: it keeps the unpacked sources
/// (`$CARGO_HOME/registry/src/-<hash>/<name>-<version>/`, the registry has
/// no name, hence the leading `-`) and the build as they are once they
/// exist, since a published version never changes. Ours do change between
/// runs at the same version, so without this a verification would build a
/// crate against a dependency as it was packaged the first time.
fn forget_packaged_library_crates() -> Result<()> {
    forget_unpacked_library_crates()?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| run::root().join("target"), std::path::PathBuf::from);
    let profile = target.join("debug");
    let Ok(deps) = std::fs::read_dir(profile.join("deps")) else {
        return Ok(());
    };
    for file in deps {
        let path = file?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(unit) = name.strip_suffix(".d") else {
            continue;
        };
        let Some((lib, hash)) = unit.rsplit_once('-') else {
            continue;
        };
        let Some(krate) = LIBRARY_CRATES.iter().find(|c| c.replace('-', "_") == lib) else {
            continue;
        };
        // A dependency file lists the sources a unit was built from.
        let sources = std::fs::read_to_string(&path).unwrap_or_default();
        if sources.contains("/registry/src/-") {
            let fingerprint = profile.join(".fingerprint").join(format!("{krate}-{hash}"));
            if fingerprint.exists() {
                std::fs::remove_dir_all(&fingerprint)
                    .with_context(|| format!("removing {}", fingerprint.display()))?;
            }
            std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }
    Ok(())
}

/// Removes the library crates cargo unpacked from an earlier packaging's
/// local registry (see [`forget_packaged_library_crates`]).
fn forget_unpacked_library_crates() -> Result<()> {
    let home = std::env::var_os("CARGO_HOME").map_or_else(
        || {
            std::env::var_os("HOME")
                .map(|h| std::path::PathBuf::from(h).join(".cargo"))
                .unwrap_or_default()
        },
        std::path::PathBuf::from,
    );
    let Ok(registries) = std::fs::read_dir(home.join("registry").join("src")) else {
        return Ok(());
    };
    for registry in registries {
        let registry = registry?.path();
        let unnamed = registry
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with('-'));
        if !unnamed {
            continue;
        }
        for unpacked in std::fs::read_dir(&registry)? {
            let unpacked = unpacked?.path();
            let ours = unpacked
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| LIBRARY_CRATES.iter().any(|c| is_unpacked(n, c)));
            if ours {
                std::fs::remove_dir_all(&unpacked)
                    .with_context(|| format!("removing {}", unpacked.display()))?;
            }
        }
    }
    Ok(())
}

/// Whether `dir` is the unpacked directory of crate `name` at some version
/// (`parlance-core-0.1.0` is `parlance-core`'s, not `parlance-co`'s).
fn is_unpacked(dir: &str, name: &str) -> bool {
    dir.strip_prefix(name)
        .and_then(|rest| rest.strip_prefix('-'))
        .and_then(|version| version.chars().next())
        .is_some_and(|c| c.is_ascii_digit())
}

/// Runs every example of `examples/library` (each asserts what it shows
/// and must exit 0); `postgres_axum` gets a database of its own on the
/// server the tests use.
fn examples() -> Result<()> {
    let dir = run::root().join("examples/library/examples");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "rs")
            && let Some(stem) = path.file_stem().and_then(|s| s.to_str())
        {
            names.push(stem.to_owned());
        }
    }
    names.sort();
    if names.is_empty() {
        bail!("no examples found in {}", dir.display());
    }
    let db = pg::provide()?;
    let scratch = db
        .as_ref()
        .map(|db| pg::Scratch::create(db, "examples"))
        .transpose()?;
    for name in &names {
        let cmd =
            cargo(["run", "--package", "parlance-examples", "--locked"]).args(["--example", name]);
        let cmd = match &scratch {
            Some(s) => cmd
                .env("DATABASE_URL", s.url())
                .env("PARLANCE_REQUIRE_POSTGRES", "1"),
            None => cmd.env_remove("DATABASE_URL"),
        };
        cmd.run()?;
    }
    drop(scratch);
    drop(db);
    println!("xtask: {} library examples ran", names.len());
    Ok(())
}

/// Cargo on the nightly toolchain, whatever `rust-toolchain.toml` pins.
fn nightly(c: Cmd) -> Cmd {
    c.env("RUSTUP_TOOLCHAIN", "nightly")
        .env_remove("CARGO")
        .env_remove("RUSTC")
}

fn nightly_available() -> bool {
    nightly(Cmd::new("cargo").arg("--version")).succeeds_quietly()
}

/// Runs every test of the workspace with a PostgreSQL database, then tidy,
/// and says how many tests skipped and why (under `CI` any skip fails).
fn test(extra: &[String]) -> Result<()> {
    let db = pg::provide()?;
    let skip_log = run::root().join("target").join("test-skips.log");
    if skip_log.exists() {
        std::fs::remove_file(&skip_log)?;
    }
    let mut cmd = cargo(["test", "--workspace", "--locked", "--exclude", "xtask"])
        .env("INSTA_UPDATE", "no")
        .env("RUST_BACKTRACE", "1")
        .env("PARLANCE_SKIP_LOG", &skip_log);
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
    report_skips(&skip_log)?;
    // Tidy: layering, module docs and stray snapshots (tests in this crate).
    cargo(["test", "--package", "xtask", "--locked"]).run()
}

/// Prints how many tests skipped, by reason, from the lines the skipping
/// tests wrote (`test<TAB>reason`); any skip is an error under `CI`.
fn report_skips(log: &std::path::Path) -> Result<()> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut by_reason = std::collections::BTreeMap::<&str, usize>::new();
    for line in text.lines() {
        let reason = line.split_once('\t').map_or(line, |(_, r)| r);
        *by_reason.entry(reason).or_default() += 1;
    }
    let total: usize = by_reason.values().sum();
    println!("xtask: {total} tests skipped");
    for (reason, n) in &by_reason {
        println!("xtask:   {n} skipped: {reason}");
    }
    if total > 0 && run::on_ci() {
        bail!("{total} tests skipped under CI; every test must run");
    }
    Ok(())
}

/// Runs one benchmark (or all with no name) in release mode with a database;
/// `bench all` is [`bench_all::bench_all`].
fn bench(args: &[String]) -> Result<()> {
    if args.first().map(String::as_str) == Some("all") {
        return bench_all::bench_all(&args[1..]);
    }
    let db = if in_memory_only(args) {
        None
    } else {
        pg::provide()?
    };
    if db.is_none() && !in_memory_only(args) {
        bail!("benchmarks need PostgreSQL: set DATABASE_URL or run a server at 127.0.0.1:5432");
    }
    let url = db.as_ref().map(pg::Db::url);
    let cmd = match args.split_first() {
        Some((name, rest)) => bench_cmd(name, rest, url)?,
        None => with_url(
            cargo(["bench", "--package", "parlance-app", "--locked"]),
            url,
        ),
    };
    // The lines `bench all --from-log` reads around the benchmark's rows.
    let command = match args.split_first() {
        Some((name, rest)) => bench_all::xtask_command(name, rest),
        None => "cargo xtask bench".to_owned(),
    };
    println!("{}", bench_all::start_line(&command));
    let result = cmd.run();
    let outcome = match &result {
        Ok(()) => "ok".to_owned(),
        Err(e) => format!("failed: {e:#}"),
    };
    println!("{}", bench_all::end_line(&command, &outcome));
    result
}

/// `cargo bench` of the benchmark `name` with its arguments, on the
/// database at `url` when there is one. The console's benchmark also gets
/// the Python venv (with Playwright) and Debian's Chromium, made or
/// installed when missing, as the browser test does.
fn bench_cmd(name: &str, args: &[String], url: Option<&str>) -> Result<Cmd> {
    let mut cmd = cargo(["bench", "--package", "parlance-app", "--locked"])
        .args(["--bench", name])
        .arg("--")
        .args(args);
    if name == "console" {
        let venv = py::ensure()?;
        if !api::chromium()? {
            bail!("the console benchmark needs Chromium ({})", api::CHROMIUM);
        }
        cmd = cmd
            .env("PARLANCE_BENCH_PYTHON", venv.bin("python"))
            .env("PARLANCE_CHROMIUM", api::CHROMIUM);
    }
    Ok(with_url(cmd, url))
}

fn with_url(cmd: Cmd, url: Option<&str>) -> Cmd {
    match url {
        Some(url) => cmd.env("DATABASE_URL", url),
        None => cmd,
    }
}

/// True for benchmark parts that touch no database (`session core`,
/// `session replay`, `session adoption`, `console memory`): they run
/// without PostgreSQL.
fn in_memory_only(args: &[String]) -> bool {
    let parts: Vec<&str> = args
        .iter()
        .skip(1)
        .map(String::as_str)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let memory_parts: &[&str] = match args.first().map(String::as_str) {
        Some("session") => &["core", "replay", "adoption"],
        Some("console") => &["memory"],
        _ => return false,
    };
    !parts.is_empty() && parts.iter().all(|p| memory_parts.contains(p))
}

/// The soak run (`crates/app/benches/soak.rs`) in release mode.
fn soak(args: &[String]) -> Result<()> {
    let mut all = vec!["soak".to_owned()];
    all.extend(args.iter().cloned());
    bench(&all)
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

/// The cargo-fuzz targets, in `fuzz/Cargo.toml` order.
const FUZZ_TARGETS: &[&str] = &[
    "session_snapshot",
    "adoption_snapshot",
    "flow_file",
    "structured_output",
    "http_bodies",
];

/// Runs fuzz targets for a bounded time each; fails on the first crash.
fn fuzz(args: &[String]) -> Result<()> {
    let mut secs: u64 = 30;
    let mut smoke = false;
    let mut targets: Vec<String> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--smoke" => {
                secs = 30;
                smoke = true;
            }
            "--secs" => {
                secs = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| anyhow::anyhow!("--secs needs a number"))?;
            }
            t if FUZZ_TARGETS.contains(&t) => targets.push(t.to_owned()),
            other => bail!("unknown fuzz argument or target `{other}`; targets: {FUZZ_TARGETS:?}"),
        }
    }
    if targets.is_empty() {
        targets = FUZZ_TARGETS.iter().map(|t| (*t).to_owned()).collect();
    }
    if !nightly_available() {
        bail!("fuzzing needs a nightly toolchain: rustup toolchain install nightly");
    }
    if !Cmd::new("cargo-fuzz").arg("--version").succeeds_quietly() {
        cargo(["install", "--locked", "cargo-fuzz"]).run()?;
    }
    // A smoke run compiles without optimisation: a fraction of the build
    // time, for a run that only has to reach the shallow paths.
    let profile = if smoke { "--dev" } else { "-O" };
    let root = run::root();
    nightly(Cmd::new("cargo"))
        .args(["fuzz", "build", profile])
        .arg("--fuzz-dir")
        .arg(root.join("fuzz"))
        .run()?;
    let started = std::time::Instant::now();
    for t in &targets {
        let corpus = root.join("fuzz/corpus").join(t);
        std::fs::create_dir_all(&corpus)?;
        // The committed seeds (real request bodies, snapshots and flow
        // files) join the corpus first, so every run starts from them.
        let seeds = root.join("fuzz/seeds").join(t);
        let mut seeded = 0usize;
        if seeds.is_dir() {
            for entry in std::fs::read_dir(&seeds)? {
                let entry = entry?;
                if entry.file_type()?.is_file() {
                    std::fs::copy(entry.path(), corpus.join(entry.file_name()))?;
                    seeded += 1;
                }
            }
        }
        let mut cmd = std::process::Command::new("cargo");
        cmd.current_dir(&root)
            .env("RUSTUP_TOOLCHAIN", "nightly")
            .env_remove("CARGO")
            .env_remove("RUSTC")
            .args(["fuzz", "run", profile, t])
            .arg("--fuzz-dir")
            .arg(root.join("fuzz"))
            .arg(&corpus)
            .args([
                "--",
                &format!("-max_total_time={secs}"),
                "-rss_limit_mb=2048",
            ]);
        println!(
            "$ cargo fuzz run {profile} {t} ({seeded} seeds copied into {})",
            corpus.display()
        );
        let (status, last) = run_teeing_stderr(cmd)?;
        if !status.success() {
            bail!("fuzzing {t} failed: {status}");
        }
        let Some(stats) = last.as_deref().and_then(FuzzStats::parse) else {
            bail!("fuzzing {t} printed no `#N ... cov: X ... corp: Y` line");
        };
        println!(
            "xtask: fuzz {t}: corpus {} inputs, coverage {} ({seeded} seeds)",
            stats.corpus, stats.coverage
        );
    }
    println!(
        "xtask: fuzz: {} targets, {secs} s each, no crash ({:.0?})",
        targets.len(),
        started.elapsed()
    );
    Ok(())
}

/// The figures of libFuzzer's status line `#N ... cov: X ... corp: Y/Zb ...`.
#[derive(Debug, PartialEq, Eq)]
struct FuzzStats {
    coverage: u64,
    corpus: u64,
}

impl FuzzStats {
    fn parse(line: &str) -> Option<Self> {
        if !line.starts_with('#') {
            return None;
        }
        let mut words = line.split_whitespace();
        let mut coverage = None;
        let mut corpus = None;
        while let Some(w) = words.next() {
            match w {
                "cov:" => coverage = words.next().and_then(|v| v.parse().ok()),
                "corp:" => {
                    corpus = words
                        .next()
                        .and_then(|v| v.split('/').next())
                        .and_then(|v| v.parse().ok());
                }
                _ => {}
            }
        }
        Some(Self {
            coverage: coverage?,
            corpus: corpus?,
        })
    }
}

/// Runs `cmd`, passing its stderr through line by line, and returns its
/// exit status with the last libFuzzer status line it printed.
fn run_teeing_stderr(
    mut cmd: std::process::Command,
) -> Result<(std::process::ExitStatus, Option<String>)> {
    use std::io::{BufRead as _, Write as _};
    let mut child = cmd.stderr(std::process::Stdio::piped()).spawn()?;
    let stderr = child
        .stderr
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stderr"))?;
    let mut last = None;
    let mut out = std::io::stderr().lock();
    for line in std::io::BufReader::new(stderr).split(b'\n') {
        let line = String::from_utf8_lossy(&line?).into_owned();
        writeln!(out, "{line}")?;
        if FuzzStats::parse(&line).is_some() {
            last = Some(line);
        }
    }
    Ok((child.wait()?, last))
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

#[cfg(test)]
mod feature_checks {
    use super::{flow_only, tree_crate_names};

    #[test]
    fn reads_each_crate_of_a_tree_once() {
        let tree = "parlance-core v0.1.0 (/w/crates/core)\nserde v1.0.228\n\
                    serde_derive v1.0.228 (proc-macro)\nserde v1.0.228 (*)\n\n";
        assert_eq!(
            tree_crate_names(tree),
            ["parlance-core", "serde", "serde_derive"]
        );
    }

    #[test]
    fn finds_the_flow_only_crates_of_a_tree() {
        let tree = "parlance-core v0.1.0\nminijinja v3.0.0\nregex v1.12.2\n\
                    serde_norway v0.9.42\njsonschema v0.61.0\nserde_yaml v0.9.34\n";
        assert_eq!(
            flow_only(&tree_crate_names(tree)),
            ["jsonschema", "minijinja", "serde_norway", "serde_yaml"]
        );
        assert!(flow_only(&["parlance-core", "serde", "uuid"]).is_empty());
    }
}

#[cfg(test)]
mod fuzz_stats {
    use super::FuzzStats;

    #[test]
    fn reads_the_figures_of_a_status_line() {
        let line = "#760\tDONE   cov: 36612 ft: 40518 corp: 67/397b lim: 6 exec/s: 24 rss: 165Mb";
        assert_eq!(
            FuzzStats::parse(line),
            Some(FuzzStats {
                coverage: 36612,
                corpus: 67
            })
        );
        assert_eq!(FuzzStats::parse("INFO: seed corpus: files: 169"), None);
        assert_eq!(FuzzStats::parse("#2\tINITED exec/s: 0 rss: 40Mb"), None);
    }
}

#[cfg(test)]
mod package_profile {
    use super::{DEV_PROFILE, is_unpacked};

    #[test]
    fn an_unpacked_directory_names_its_crate_and_version() {
        assert!(is_unpacked("parlance-core-0.1.0", "parlance-core"));
        assert!(is_unpacked(
            "parlance-testkit-12.0.0-rc.1",
            "parlance-testkit"
        ));
        assert!(!is_unpacked("parlance-core-0.1.0", "parlance-co"));
        assert!(!is_unpacked("parlance-core-extra-0.1.0", "parlance-core"));
        assert!(!is_unpacked("parlance-core", "parlance-core"));
    }

    /// The `key = value` lines of `[section]` in `manifest`, comments and
    /// blank lines left out.
    fn section(manifest: &str, name: &str) -> Vec<String> {
        let header = format!("[{name}]");
        manifest
            .lines()
            .skip_while(|l| l.trim() != header)
            .skip(1)
            .take_while(|l| !l.trim_start().starts_with('['))
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| l.replace(' ', ""))
            .collect()
    }

    #[test]
    fn the_packaging_profile_is_the_root_manifests() {
        let manifest = std::fs::read_to_string(crate::run::root().join("Cargo.toml")).unwrap();
        let mut found: Vec<String> = section(&manifest, "profile.dev")
            .into_iter()
            .map(|kv| format!("profile.dev.{kv}"))
            .collect();
        found.extend(
            section(&manifest, "profile.dev.package.\"*\"")
                .into_iter()
                .map(|kv| format!("profile.dev.package.\"*\".{kv}")),
        );
        assert_eq!(
            found, DEV_PROFILE,
            "[profile.dev] in Cargo.toml and DEV_PROFILE differ"
        );
    }
}
