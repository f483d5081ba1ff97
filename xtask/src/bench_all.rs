//! `cargo xtask bench all`: every benchmark in one run, its output kept in a
//! log under `target/bench-all/`, and the tables the benchmarks print
//! (`@bench-row` lines) written into `docs/performance.md` between the
//! `<!-- bench-all:begin -->` and `<!-- bench-all:end -->` markers.
//!
//! The log holds everything the benchmarks printed, with lines of our own
//! around each benchmark (`@bench-start` and `@bench-end`: the command, the
//! UTC time, the commit and `/proc/loadavg`) and around the whole run
//! (`@bench-run-start`, `@bench-run-end`). The section is always rendered
//! from the log file, so `--from-log <file>` gives the same text as the run
//! that wrote it. `cargo xtask bench <name>` prints the same lines around a
//! single benchmark, so the output of single runs renders too.
//!
//! A failed benchmark does not stop the run: the others still run and their
//! tables are written, the failed one is named as failed with its rows left
//! out (they may be from a part run), and the command exits with an error.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead as _, BufReader, Read, Write};
use std::process::{ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, Result, anyhow, bail, ensure};
use serde_json::{Value, json};

use crate::run::{self, Cmd};

/// The benchmarks `bench all` runs, in order, each with its arguments.
///
/// `soak` is not one of them: it is a pass/fail endurance run (its own
/// serves and workers for minutes, judged on growth and lost writes, figures
/// in `docs/reliability.md`), run on its own with `cargo xtask soak`.
pub(crate) const BENCHES: &[(&str, &[&str])] = &[
    ("queue", &[]),
    ("turn", &[]),
    ("session", &[]),
    ("flow", &[]),
    ("conversation", &[]),
    ("flow-storage", &[]),
    ("console", &[]),
];

pub(crate) const BEGIN: &str = "<!-- bench-all:begin -->";
pub(crate) const END: &str = "<!-- bench-all:end -->";
const ROW: &str = "@bench-row\t";
const RUN_START: &str = "@bench-run-start\t";
const RUN_END: &str = "@bench-run-end\t";
const START: &str = "@bench-start\t";
const FINISH: &str = "@bench-end\t";

/// The document the section is written into, from the workspace root.
const DOC: &str = "docs/performance.md";

/// How long the output of a finished benchmark may keep coming (from a
/// process it started and left behind) before the run moves on.
const DRAIN: Duration = Duration::from_secs(10);

/// `cargo xtask bench all [--from-log FILE]`.
pub(crate) fn bench_all(args: &[String]) -> Result<()> {
    match args {
        [] => run_all(),
        [flag, file] if flag == "--from-log" => {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("cannot read the log {file}"))?;
            let run = parse_log(&text).with_context(|| format!("in the log {file}"))?;
            write_doc(&run)?;
            if !run.failed().is_empty() {
                println!(
                    "xtask: the log records failed benchmarks: {}",
                    run.failed().join(", ")
                );
            }
            Ok(())
        }
        _ => bail!("usage: cargo xtask bench all [--from-log FILE]"),
    }
}

/// The command line a benchmark is run with, as a user types it.
pub(crate) fn xtask_command(name: &str, args: &[String]) -> String {
    let mut s = format!("cargo xtask bench {name}");
    for a in args {
        s.push(' ');
        s.push_str(a);
    }
    s
}

/// The line printed before a benchmark runs.
pub(crate) fn start_line(command: &str) -> String {
    format!(
        "{START}{}",
        json!({"command": command, "at": now(), "commit": commit(), "loadavg": loadavg()})
    )
}

/// The line printed after a benchmark ran: `ok`, or what went wrong.
pub(crate) fn end_line(command: &str, outcome: &str) -> String {
    format!(
        "{FINISH}{}",
        json!({"command": command, "at": now(), "loadavg": loadavg(), "status": outcome})
    )
}

/// The current UTC time, to the second: `2026-11-25T00:40:00Z`.
#[allow(clippy::disallowed_methods)] // the wall-clock time a run is stamped with
fn now() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

/// `/proc/loadavg`'s three averages, or `?` where there is none.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").map_or_else(
        |_| "?".to_owned(),
        |s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
    )
}

/// `git rev-parse --short HEAD`, with `-dirty` when the tree has changes;
/// `?` without git.
fn commit() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(run::root())
            .stderr(Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let Some(head) = git(&["rev-parse", "--short", "HEAD"]) else {
        return "?".to_owned();
    };
    match git(&["status", "--porcelain"]) {
        Some(changes) if changes.is_empty() => head,
        _ => format!("{head}-dirty"),
    }
}

/// The log file, shared by the threads copying a benchmark's output.
type Log = Arc<Mutex<File>>;

fn log_line(log: &Log, line: &str) {
    let mut f = log
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let _ = writeln!(f, "{line}");
}

/// Prints a line of our own and writes it to the log.
fn say(log: &Log, line: &str) {
    println!("{line}");
    log_line(log, line);
}

fn run_all() -> Result<()> {
    let Some(db) = crate::pg::provide()? else {
        bail!("benchmarks need PostgreSQL: set DATABASE_URL or run a server at 127.0.0.1:5432");
    };
    let dir = run::root().join("target").join("bench-all");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("{}.log", now().replace(':', "-")));
    let log: Log = Arc::new(Mutex::new(
        File::create(&path).with_context(|| format!("cannot create {}", path.display()))?,
    ));
    println!("xtask: logging to {}", path.display());
    say(
        &log,
        &format!(
            "{RUN_START}{}",
            json!({"at": now(), "commit": commit(), "loadavg": loadavg(),
                   "benches": BENCHES.iter().map(|(n, _)| *n).collect::<Vec<_>>()})
        ),
    );

    // One release build of every benchmark first, so none of them is timed
    // beside the compiler. It sees the `DATABASE_URL` the benches get: the
    // sqlx macros read it, so a build without it is rebuilt by the first
    // bench.
    let mut build = run::cargo(["bench", "--package", "parlance-app", "--locked", "--no-run"])
        .env("DATABASE_URL", db.url());
    for (name, _) in BENCHES {
        build = build.args(["--bench", name]);
    }
    let status = run_teed(build, &log)?;
    if !status.success() {
        say(
            &log,
            &format!(
                "{RUN_END}{}",
                json!({"at": now(), "loadavg": loadavg(), "status": format!("build failed: {status}")})
            ),
        );
        bail!("the release build of the benchmarks failed: {status}; nothing was run");
    }

    let mut failed = Vec::new();
    for (name, args) in BENCHES {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let command = xtask_command(name, &args);
        say(&log, &start_line(&command));
        let ran = crate::bench_cmd(name, &args, Some(db.url())).and_then(|c| run_teed(c, &log));
        let outcome = match ran {
            Ok(s) if s.success() => "ok".to_owned(),
            Ok(s) => format!("failed: {s}"),
            Err(e) => format!("failed: {e:#}"),
        };
        if outcome != "ok" {
            failed.push(format!("{command} ({outcome})"));
        }
        say(&log, &end_line(&command, &outcome));
    }
    say(
        &log,
        &format!(
            "{RUN_END}{}",
            json!({"at": now(), "loadavg": loadavg(), "status": if failed.is_empty() { "ok" } else { "failed" }})
        ),
    );
    drop(db);

    let text = std::fs::read_to_string(&path)?;
    let run = parse_log(&text).with_context(|| format!("in the log {}", path.display()))?;
    write_doc(&run)?;
    println!("xtask: log: {}", path.display());
    if !failed.is_empty() {
        bail!(
            "{} of {} benchmarks failed: {}; the others' tables were written",
            failed.len(),
            BENCHES.len(),
            failed.join("; ")
        );
    }
    Ok(())
}

/// Runs `cmd`, copying its stdout and stderr line by line to ours and to
/// the log; returns its exit status.
fn run_teed(cmd: Cmd, log: &Log) -> Result<ExitStatus> {
    let (mut command, shown) = cmd.into_parts();
    say(log, &format!("$ {shown}"));
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("could not start `{shown}`"))?;
    let (done_tx, done_rx) = mpsc::channel();
    let out = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
    let err = child.stderr.take().ok_or_else(|| anyhow!("no stderr"))?;
    copy_lines(out, std::io::stdout, log.clone(), done_tx.clone());
    copy_lines(err, std::io::stderr, log.clone(), done_tx);
    let status = child.wait()?;
    // Both copies end when every holder of the pipes has exited; a process
    // the benchmark left running would hold them open for ever.
    let deadline = std::time::Instant::now() + DRAIN;
    for _ in 0..2 {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if done_rx.recv_timeout(left).is_err() {
            eprintln!(
                "xtask: `{shown}` exited but its output is still open after {DRAIN:?} \
                 (a process it started is still running); going on"
            );
            break;
        }
    }
    Ok(status)
}

fn copy_lines<R, W>(from: R, to: fn() -> W, log: Log, done: mpsc::Sender<()>)
where
    R: Read + Send + 'static,
    W: Write + 'static,
{
    std::thread::spawn(move || {
        for line in BufReader::new(from).split(b'\n') {
            let Ok(line) = line else { break };
            let line = String::from_utf8_lossy(&line);
            let line = line.strip_suffix('\r').unwrap_or(&line);
            let _ = writeln!(to(), "{line}");
            log_line(&log, line);
        }
        let _ = done.send(());
    });
}

fn write_doc(run: &Run) -> Result<()> {
    let path = run::root().join(DOC);
    let doc = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let new = rewrite(&doc, &render(run)?).with_context(|| format!("in {DOC}"))?;
    if new == doc {
        println!("xtask: {DOC} unchanged");
    } else {
        std::fs::write(&path, new)?;
        println!("xtask: wrote the figures into {DOC}");
    }
    Ok(())
}

/// One row of a table, as a benchmark printed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Row {
    pub(crate) table: String,
    pub(crate) columns: Vec<String>,
    pub(crate) cells: Vec<String>,
}

/// What the log says about one benchmark.
#[derive(Debug, Default)]
pub(crate) struct Bench {
    pub(crate) command: String,
    pub(crate) start: Value,
    /// `None` when the log has no end line for it (the run was cut short).
    pub(crate) end: Option<Value>,
    pub(crate) rows: Vec<Row>,
}

impl Bench {
    fn status(&self) -> String {
        match &self.end {
            Some(end) => end["status"].as_str().unwrap_or("?").to_owned(),
            None => "no end recorded: the run was cut short".to_owned(),
        }
    }

    fn ok(&self) -> bool {
        self.status() == "ok"
    }
}

/// What a log says about a run.
#[derive(Debug, Default)]
pub(crate) struct Run {
    /// `None` for output of single benchmarks put together.
    pub(crate) start: Option<Value>,
    pub(crate) end: Option<Value>,
    pub(crate) benches: Vec<Bench>,
}

impl Run {
    pub(crate) fn failed(&self) -> Vec<String> {
        self.benches
            .iter()
            .filter(|b| !b.ok())
            .map(|b| b.command.clone())
            .collect()
    }
}

fn meta(line: &str, prefix: &str, n: usize) -> Result<Option<Value>> {
    let Some(rest) = line.strip_prefix(prefix) else {
        return Ok(None);
    };
    let v: Value = serde_json::from_str(rest)
        .with_context(|| format!("line {n}: `{}` is not followed by JSON", prefix.trim_end()))?;
    ensure!(
        v.is_object(),
        "line {n}: `{}` wants a JSON object",
        prefix.trim_end()
    );
    Ok(Some(v))
}

fn strings(v: &Value, key: &str, n: usize) -> Result<Vec<String>> {
    v[key]
        .as_array()
        .and_then(|a| a.iter().map(|c| c.as_str().map(str::to_owned)).collect())
        .ok_or_else(|| anyhow!("line {n}: a result row's `{key}` must be an array of strings"))
}

/// Reads a row's JSON (what follows `@bench-row<TAB>`).
fn parse_row(json: &str, n: usize) -> Result<Row> {
    let v: Value = serde_json::from_str(json)
        .with_context(|| format!("line {n}: a result row is not JSON"))?;
    let table = v["table"]
        .as_str()
        .filter(|t| !t.is_empty())
        .ok_or_else(|| anyhow!("line {n}: a result row has no `table`"))?
        .to_owned();
    let columns = strings(&v, "columns", n)?;
    let cells = strings(&v, "cells", n)?;
    ensure!(
        columns.len() == cells.len(),
        "line {n}: table `{table}`: {} columns but {} cells",
        columns.len(),
        cells.len()
    );
    Ok(Row {
        table,
        columns,
        cells,
    })
}

/// Reads a log: our own lines and the result rows; every other line is the
/// benchmarks' own output and is passed over.
pub(crate) fn parse_log(text: &str) -> Result<Run> {
    let mut run = Run::default();
    let mut open = false;
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let line = line.strip_suffix('\r').unwrap_or(line);
        if let Some(v) = meta(line, RUN_START, n)? {
            run.start = Some(v);
        } else if let Some(v) = meta(line, RUN_END, n)? {
            run.end = Some(v);
        } else if let Some(v) = meta(line, START, n)? {
            let command = v["command"]
                .as_str()
                .ok_or_else(|| anyhow!("line {n}: `@bench-start` has no command"))?
                .to_owned();
            run.benches.push(Bench {
                command,
                start: v,
                ..Bench::default()
            });
            open = true;
        } else if let Some(v) = meta(line, FINISH, n)? {
            let bench = run
                .benches
                .last_mut()
                .filter(|_| open)
                .ok_or_else(|| anyhow!("line {n}: `@bench-end` without a `@bench-start`"))?;
            ensure!(
                v["command"] == bench.start["command"],
                "line {n}: `@bench-end` of {} inside `{}`",
                v["command"],
                bench.command
            );
            bench.end = Some(v);
            open = false;
        } else if let Some(json) = line.strip_prefix(ROW) {
            let row = parse_row(json, n)?;
            let bench = run.benches.last_mut().filter(|_| open).ok_or_else(|| {
                anyhow!(
                    "line {n}: a result row (table `{}`) outside any benchmark: \
                     no `@bench-start` line before it",
                    row.table
                )
            })?;
            bench.rows.push(row);
        }
    }
    Ok(run)
}

/// One table of a benchmark: its id, its header and its rows' cells.
#[derive(Debug)]
pub(crate) struct Table<'a> {
    pub(crate) id: &'a str,
    pub(crate) columns: &'a [String],
    pub(crate) rows: Vec<&'a [String]>,
}

/// A benchmark's rows as tables: one per table id, in the order each id
/// first appears, rows in the order printed. Rows of one table must have
/// the same columns.
pub(crate) fn tables(rows: &[Row]) -> Result<Vec<Table<'_>>> {
    let mut order: Vec<Table<'_>> = Vec::new();
    let mut index = BTreeMap::new();
    for row in rows {
        match index.get(row.table.as_str()) {
            Some(&i) => {
                let table: &mut Table<'_> = &mut order[i];
                ensure!(
                    table.columns == row.columns.as_slice(),
                    "table `{}`: a row has the columns {:?}, the table's first row {:?}",
                    row.table,
                    row.columns,
                    table.columns
                );
                table.rows.push(&row.cells);
            }
            None => {
                index.insert(row.table.as_str(), order.len());
                order.push(Table {
                    id: &row.table,
                    columns: &row.columns,
                    rows: vec![&row.cells],
                });
            }
        }
    }
    Ok(order)
}

/// `2026-11-25T00:40:00Z` as `2026-11-25 00:40:00 UTC`.
fn when(v: &Value) -> String {
    match v["at"].as_str() {
        Some(t) => match t.strip_suffix('Z') {
            Some(t) => format!("{} UTC", t.replacen('T', " ", 1)),
            None => t.to_owned(),
        },
        None => "an unrecorded time".to_owned(),
    }
}

fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or("?")
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// Right-aligned when every cell of the column starts like a number.
fn numeric(rows: &[&[String]], col: usize) -> bool {
    rows.iter().all(|r| {
        let s = r[col].trim_start_matches(['-', '+', '~', '≈']);
        s.starts_with(|c: char| c.is_ascii_digit())
    })
}

/// The section between the markers (the markers included).
pub(crate) fn render(run: &Run) -> Result<String> {
    let mut s = String::new();
    s.push_str(BEGIN);
    s.push_str("\n## Current figures (`cargo xtask bench all`)\n\n");
    s.push_str(
        "This section is written by `cargo xtask bench all` from the tables the benchmarks \
         print; edit the benchmarks, not this text. Each table comes from one process run, \
         and a ratio is taken side by side within it.\n\n",
    );
    match &run.start {
        Some(start) => {
            s.push_str(&format!(
                "Run started {} at commit `{}`, load average {} at the start",
                when(start),
                text(start, "commit"),
                text(start, "loadavg"),
            ));
            match &run.end {
                Some(end) => s.push_str(&format!(
                    "; ended {}, load average {} at the end.\n\n",
                    when(end),
                    text(end, "loadavg")
                )),
                None => s.push_str("; the log has no end: the run was cut short.\n\n"),
            }
        }
        None => s.push_str(
            "These tables come from single benchmark runs put together, not from one \
             `cargo xtask bench all` run.\n\n",
        ),
    }
    let failed: Vec<&Bench> = run.benches.iter().filter(|b| !b.ok()).collect();
    if !failed.is_empty() {
        s.push_str("**Failed in this run** (their rows are left out):\n\n");
        for b in &failed {
            s.push_str(&format!("- `{}`: {}\n", b.command, b.status()));
        }
        s.push('\n');
    }
    for b in &run.benches {
        s.push_str(&format!("### `{}`\n\n", b.command));
        let mut about = format!(
            "Started {} at commit `{}`, load average {} at the start",
            when(&b.start),
            text(&b.start, "commit"),
            text(&b.start, "loadavg")
        );
        if let Some(end) = &b.end {
            about.push_str(&format!(", {} at the end", text(end, "loadavg")));
        }
        s.push_str(&about);
        s.push_str(".\n\n");
        if !b.ok() {
            s.push_str(&format!("Failed ({}); no figures.\n\n", b.status()));
            continue;
        }
        let tables = tables(&b.rows).with_context(|| format!("in `{}`", b.command))?;
        if tables.is_empty() {
            s.push_str("No tables: this benchmark prints no result rows; see its output.\n\n");
        }
        for Table { id, columns, rows } in tables {
            s.push_str(&format!("#### {id}\n\n|"));
            for c in columns {
                s.push_str(&format!(" {} |", cell(c)));
            }
            s.push_str("\n|");
            for i in 0..columns.len() {
                s.push_str(if numeric(&rows, i) { "---:|" } else { "---|" });
            }
            s.push('\n');
            for r in rows {
                s.push('|');
                for c in r {
                    s.push_str(&format!(" {} |", cell(c)));
                }
                s.push('\n');
            }
            s.push('\n');
        }
    }
    // One blank line before the end marker, not two.
    while s.ends_with("\n\n\n") {
        s.pop();
    }
    s.push_str(END);
    Ok(s)
}

/// Byte offsets of the lines that are exactly `marker`.
fn marker_lines(doc: &str, marker: &str) -> Vec<usize> {
    let mut at = Vec::new();
    let mut start = 0;
    for line in doc.split_inclusive('\n') {
        if line.trim_end_matches(['\n', '\r']) == marker {
            at.push(start);
        }
        start += line.len();
    }
    at
}

/// `doc` with the part between the markers (the markers included) replaced
/// by `section`; every byte outside stays as it was. Without either marker,
/// the section goes in before the first `## ` heading (after the intro).
pub(crate) fn rewrite(doc: &str, section: &str) -> Result<String> {
    let begins = marker_lines(doc, BEGIN);
    let ends = marker_lines(doc, END);
    match (begins.as_slice(), ends.as_slice()) {
        ([], []) => {
            let at = doc
                .split_inclusive('\n')
                .scan(0, |pos, line| {
                    let here = *pos;
                    *pos += line.len();
                    Some((here, line))
                })
                .find(|(_, line)| line.starts_with("## "))
                .map_or(doc.len(), |(at, _)| at);
            let mut out = String::with_capacity(doc.len() + section.len() + 2);
            out.push_str(&doc[..at]);
            if !out.is_empty() && !out.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(section);
            out.push_str("\n\n");
            out.push_str(&doc[at..]);
            Ok(out)
        }
        ([b], [e]) if b < e => {
            let end = e + END.len();
            Ok(format!("{}{section}{}", &doc[..*b], &doc[end..]))
        }
        _ => bail!(
            "expected one `{BEGIN}` line and, after it, one `{END}` line; found {} and {}{}",
            begins.len(),
            ends.len(),
            if begins.len() == 1 && ends.len() == 1 {
                " in the wrong order"
            } else {
                ""
            }
        ),
    }
}

/// The log a run would have written, for the tests.
#[cfg(test)]
pub(crate) fn sample_log() -> String {
    [
        r#"@bench-run-start	{"at":"2026-11-25T00:40:00Z","commit":"08f6f21","loadavg":"0.10 0.20 0.30"}"#,
        "$ cargo bench --package parlance-app --locked --bench session -- core",
        r#"@bench-start	{"command":"cargo xtask bench session","at":"2026-11-25T00:41:00Z","commit":"08f6f21","loadavg":"0.50 0.40 0.30"}"#,
        "core: 2000000 events (tick + event), ns/event best 51.0, median 52.0",
        r#"@bench-row	{"table":"session core","columns":["path","ns/event"],"cells":["state operations","52.0"]}"#,
        r#"@bench-row	{"table":"session replay","columns":["measure","ours","theirs","ratio"],"cells":["whole traces","80.1","4000.2","49.9x"]}"#,
        r#"@bench-row	{"table":"session core","columns":["path","ns/event"],"cells":["decide | audit","60.5"]}"#,
        r#"@bench-end	{"command":"cargo xtask bench session","at":"2026-11-25T00:45:00Z","loadavg":"1.50 1.00 0.50","status":"ok"}"#,
        r#"@bench-start	{"command":"cargo xtask bench turn","at":"2026-11-25T00:45:01Z","commit":"08f6f21","loadavg":"1.50 1.00 0.50"}"#,
        r#"@bench-row	{"table":"turn","columns":["threads"],"cells":["1"]}"#,
        "thread 'main' panicked at crates/app/benches/turn.rs:10:5",
        r#"@bench-end	{"command":"cargo xtask bench turn","at":"2026-11-25T00:46:00Z","loadavg":"1.60 1.10 0.60","status":"failed: exit status: 101"}"#,
        r#"@bench-start	{"command":"cargo xtask bench queue","at":"2026-11-25T00:46:01Z","commit":"08f6f21","loadavg":"1.60 1.10 0.60"}"#,
        r#"@bench-end	{"command":"cargo xtask bench queue","at":"2026-11-25T00:50:00Z","loadavg":"2.00 1.50 0.80","status":"ok"}"#,
        r#"@bench-run-end	{"at":"2026-11-25T00:50:01Z","loadavg":"2.00 1.50 0.80","status":"failed"}"#,
    ]
    .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(table: &str, columns: &[&str], cells: &[&str]) -> Row {
        let own = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect();
        Row {
            table: table.to_owned(),
            columns: own(columns),
            cells: own(cells),
        }
    }

    #[test]
    fn reads_benchmarks_rows_and_outcomes_from_a_log() {
        let run = parse_log(&sample_log()).expect("parses");
        assert_eq!(
            run.start.as_ref().map(|v| text(v, "commit")),
            Some("08f6f21")
        );
        let commands: Vec<&str> = run.benches.iter().map(|b| b.command.as_str()).collect();
        assert_eq!(
            commands,
            [
                "cargo xtask bench session",
                "cargo xtask bench turn",
                "cargo xtask bench queue"
            ]
        );
        assert_eq!(run.benches[0].rows.len(), 3);
        assert_eq!(run.failed(), ["cargo xtask bench turn"]);
        assert_eq!(
            run.benches[1].status(),
            "failed: exit status: 101",
            "the status as recorded"
        );
    }

    #[test]
    fn groups_rows_by_table_in_the_order_first_seen() {
        let rows = [
            row("a", &["x", "y"], &["1", "2"]),
            row("b", &["z"], &["3"]),
            row("a", &["x", "y"], &["4", "5"]),
            row("c", &["w"], &["6"]),
            row("b", &["z"], &["7"]),
        ];
        let t = tables(&rows).expect("grouped");
        let ids: Vec<&str> = t.iter().map(|t| t.id).collect();
        assert_eq!(ids, ["a", "b", "c"]);
        let firsts: Vec<Vec<&str>> = t
            .iter()
            .map(|t| t.rows.iter().map(|r| r[0].as_str()).collect())
            .collect();
        assert_eq!(firsts, [vec!["1", "4"], vec!["3", "7"], vec!["6"]]);
    }

    #[test]
    fn refuses_rows_of_one_table_with_other_columns() {
        let rows = [
            row("pg", &["clients", "events/s"], &["16", "900"]),
            row("pg", &["clients", "tps"], &["16", "1000"]),
        ];
        let err = tables(&rows).expect_err("mismatched columns").to_string();
        assert!(err.contains("table `pg`"), "{err}");
        assert!(err.contains(r#"["clients", "tps"]"#), "{err}");
        assert!(err.contains(r#"["clients", "events/s"]"#), "{err}");

        // Found when the section is rendered from a log.
        let log = [
            r#"@bench-start	{"command":"cargo xtask bench x","at":"2026-11-25T00:00:00Z"}"#,
            r#"@bench-row	{"table":"pg","columns":["a"],"cells":["1"]}"#,
            r#"@bench-row	{"table":"pg","columns":["b"],"cells":["2"]}"#,
            r#"@bench-end	{"command":"cargo xtask bench x","status":"ok"}"#,
        ]
        .join("\n");
        let err = format!(
            "{:#}",
            render(&parse_log(&log).expect("parses")).expect_err("refused")
        );
        assert!(
            err.contains("in `cargo xtask bench x`: table `pg`"),
            "{err}"
        );
    }

    #[test]
    fn refuses_malformed_rows_with_the_line() {
        let open = r#"@bench-start	{"command":"cargo xtask bench x"}"#;
        let cases = [
            (
                r#"@bench-row	{"table":"t","columns":["a","b"],"cells":["1"]}"#,
                "line 2: table `t`: 2 columns but 1 cells",
            ),
            (
                r#"@bench-row	{"table":"t","columns":["a"],"cells":[1]}"#,
                "line 2: a result row's `cells` must be an array of strings",
            ),
            (
                r#"@bench-row	{"columns":[],"cells":[]}"#,
                "line 2: a result row has no `table`",
            ),
            ("@bench-row\tnot json", "line 2: a result row is not JSON"),
        ];
        for (line, want) in cases {
            let err = parse_log(&format!("{open}\n{line}\n"))
                .expect_err(line)
                .to_string();
            assert_eq!(err, want);
        }
        let err = parse_log(r#"@bench-row	{"table":"t","columns":[],"cells":[]}"#)
            .expect_err("no benchmark")
            .to_string();
        assert!(err.contains("outside any benchmark"), "{err}");
    }

    #[test]
    fn renders_a_table_per_id_under_its_command() {
        let section = render(&parse_log(&sample_log()).expect("parses")).expect("renders");
        let want = "\
<!-- bench-all:begin -->
## Current figures (`cargo xtask bench all`)

This section is written by `cargo xtask bench all` from the tables the benchmarks print; edit the benchmarks, not this text. Each table comes from one process run, and a ratio is taken side by side within it.

Run started 2026-11-25 00:40:00 UTC at commit `08f6f21`, load average 0.10 0.20 0.30 at the start; ended 2026-11-25 00:50:01 UTC, load average 2.00 1.50 0.80 at the end.

**Failed in this run** (their rows are left out):

- `cargo xtask bench turn`: failed: exit status: 101

### `cargo xtask bench session`

Started 2026-11-25 00:41:00 UTC at commit `08f6f21`, load average 0.50 0.40 0.30 at the start, 1.50 1.00 0.50 at the end.

#### session core

| path | ns/event |
|---|---:|
| state operations | 52.0 |
| decide \\| audit | 60.5 |

#### session replay

| measure | ours | theirs | ratio |
|---|---:|---:|---:|
| whole traces | 80.1 | 4000.2 | 49.9x |

### `cargo xtask bench turn`

Started 2026-11-25 00:45:01 UTC at commit `08f6f21`, load average 1.50 1.00 0.50 at the start, 1.60 1.10 0.60 at the end.

Failed (failed: exit status: 101); no figures.

### `cargo xtask bench queue`

Started 2026-11-25 00:46:01 UTC at commit `08f6f21`, load average 1.60 1.10 0.60 at the start, 2.00 1.50 0.80 at the end.

No tables: this benchmark prints no result rows; see its output.

<!-- bench-all:end -->";
        assert_eq!(section, want);
    }

    #[test]
    fn says_when_the_tables_come_from_single_runs() {
        let log = [
            r#"@bench-start	{"command":"cargo xtask bench session core","at":"2026-11-25T00:41:00Z","commit":"08f6f21-dirty","loadavg":"0.5 0.4 0.3"}"#,
            r#"@bench-row	{"table":"t","columns":["a"],"cells":["1"]}"#,
        ]
        .join("\n");
        let run = parse_log(&log).expect("parses");
        assert_eq!(
            run.failed(),
            ["cargo xtask bench session core"],
            "no end line"
        );
        let section = render(&run).expect("renders");
        assert!(
            section.contains("single benchmark runs put together"),
            "{section}"
        );
        assert!(section.contains("the run was cut short"), "{section}");
    }

    const DOC: &str = "# Performance\r\n\nIntro  \nwith trailing spaces.\n\n## Task queue\n\n| a |\n|---|\n\n## Other\ntext without a final newline";

    #[test]
    fn inserts_the_section_after_the_intro_when_there_are_no_markers() {
        let section = format!("{BEGIN}\nnew\n{END}");
        let out = rewrite(DOC, &section).expect("inserted");
        let at = DOC.find("## Task queue").expect("heading");
        assert_eq!(
            out,
            format!("{}{section}\n\n{}", &DOC[..at], &DOC[at..]),
            "in before the first heading, nothing else changed"
        );
        // A document with no heading gets it at the end.
        assert_eq!(
            rewrite("intro", &section).expect("appended"),
            format!("intro\n{section}\n\n")
        );
    }

    #[test]
    fn leaves_every_byte_outside_the_markers_as_it_was() {
        let before = "# Performance\r\n\nIntro  \n\n";
        let after = "\n\n## Task queue\n\n|x|\n  trailing  \ttext";
        let doc = format!("{before}{BEGIN}\nold figures\n\nmore\n{END}{after}");
        let section = format!("{BEGIN}\nnew figures\n{END}");
        let out = rewrite(&doc, &section).expect("rewritten");
        assert_eq!(out, format!("{before}{section}{after}"));
        assert!(out.starts_with(before) && out.ends_with(after));
    }

    #[test]
    fn rewriting_twice_is_rewriting_once() {
        let section = render(&parse_log(&sample_log()).expect("parses")).expect("renders");
        for doc in [DOC.to_owned(), format!("{BEGIN}\n{END}\n")] {
            let once = rewrite(&doc, &section).expect("once");
            let twice = rewrite(&once, &section).expect("twice");
            assert_eq!(once, twice);
            assert_eq!(marker_lines(&once, BEGIN).len(), 1);
        }
    }

    #[test]
    fn refuses_markers_out_of_place() {
        let s = format!("{BEGIN}\nx\n{END}");
        for (doc, want) in [
            (format!("{BEGIN}\n"), "found 1 and 0"),
            (format!("{END}\n"), "found 0 and 1"),
            (
                format!("{END}\n{BEGIN}\n"),
                "found 1 and 1 in the wrong order",
            ),
            (format!("{BEGIN}\n{BEGIN}\n{END}\n"), "found 2 and 1"),
        ] {
            let err = rewrite(&doc, &s).expect_err(&doc).to_string();
            assert!(err.contains(want), "{err}");
            assert!(err.contains(BEGIN), "{err}");
        }
        // A marker inside a line of prose is not a marker.
        let prose = format!("the `{BEGIN}` line\n");
        assert!(rewrite(&prose, &s).is_ok());
    }

    #[test]
    fn the_performance_doc_has_one_pair_of_markers() {
        let doc = std::fs::read_to_string(run::root().join(super::DOC)).expect("the doc");
        assert_eq!(marker_lines(&doc, BEGIN).len(), 1, "one begin marker");
        assert_eq!(marker_lines(&doc, END).len(), 1, "one end marker");
        assert!(marker_lines(&doc, BEGIN)[0] < marker_lines(&doc, END)[0]);
    }

    #[test]
    fn prints_the_command_as_typed() {
        assert_eq!(xtask_command("session", &[]), "cargo xtask bench session");
        assert_eq!(
            xtask_command("session", &["core".to_owned(), "--smoke".to_owned()]),
            "cargo xtask bench session core --smoke"
        );
        let line = start_line("cargo xtask bench queue");
        let run = parse_log(&format!(
            "{line}\n{}",
            end_line("cargo xtask bench queue", "ok")
        ))
        .expect("our own lines parse");
        assert_eq!(run.benches.len(), 1);
        assert!(run.failed().is_empty());
    }
}
