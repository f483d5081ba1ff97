//! The operator console's pages with 10,000 conversations stored:
//! `cargo xtask bench console [memory] [pg] [--smoke]`.
//!
//! For each backend (the embedded default, then PostgreSQL) it starts
//! `parlance serve` (this release build) with the example flows, stores
//! 10,000 conversations through the API in a mix of states (2,000 waiting
//! for a reply, 300 needing a person, 500 paused, 500 queued behind
//! another one of their contact, 6,700 cancelled), each first sent its
//! opening message by the agent, waits for the agent's work to end, and
//! makes one session, adoption user, flow session and agent thread. Then
//! `xtask/browser/console_bench.py` loads each console page in Debian's
//! Chromium through Playwright: five loads to warm, then 30 measured, each
//! the time from the navigation's start to the page's data in the document
//! (the console's `rendered` performance mark); sign-in is also timed from
//! submitting the key to the inbox's data. It prints the median and the 95th
//! percentile of each page as `@bench-row` lines (`common::report_row`) for
//! `cargo xtask bench all`, and the mix it stored.
//!
//! `cargo xtask bench console` provides what the browser side needs:
//! `PARLANCE_BENCH_PYTHON` (a Python with Playwright, xtask's venv) and
//! `PARLANCE_CHROMIUM`. `--smoke` stores 200 conversations and loads each
//! page three times, to check the benchmark itself runs.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a benchmark reports on stdout

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use futures::StreamExt as _;
use serde_json::{Value, json};
use sqlx::{Connection as _, Executor as _};

use crate::common::{report_row, url_for};

/// The key the started servers accept (product `default`).
const KEY: &str = "pk_bench_console";
/// Requests in flight while storing the conversations.
const CLIENTS: usize = 16;
/// The database the PostgreSQL part stores its conversations in.
const DB: &str = "parlance_bench_console";

struct Args {
    memory: bool,
    pg: bool,
    smoke: bool,
}

fn args() -> Result<Args> {
    let mut a = Args {
        memory: false,
        pg: false,
        smoke: false,
    };
    // `cargo bench` passes `--bench`; it means nothing here.
    for arg in std::env::args().skip(1).filter(|a| a != "--bench") {
        match arg.as_str() {
            "memory" => a.memory = true,
            "pg" => a.pg = true,
            "--smoke" => a.smoke = true,
            other => bail!("unknown argument `{other}`: memory, pg, --smoke"),
        }
    }
    if !a.memory && !a.pg {
        a.memory = true;
        a.pg = true;
    }
    Ok(a)
}

/// How many conversations of each kind to store.
#[derive(Clone, Copy)]
struct Mix {
    /// Conversations with a contact of their own (the rest are queued
    /// behind the first `queued` of them).
    distinct: usize,
    queued: usize,
    human: usize,
    replied: usize,
    paused: usize,
}

impl Mix {
    fn of(total: usize) -> Self {
        let queued = total / 20;
        Self {
            distinct: total - queued,
            queued,
            human: total * 3 / 100,
            replied: total * 15 / 100,
            paused: total / 20,
        }
    }

    /// What is done to the conversation of contact `i` once it waits for a
    /// reply: the first `queued` keep waiting (their contacts get a queued
    /// conversation), then come replies asking for a person, ordinary
    /// replies and pauses; the rest are cancelled.
    fn step(&self, i: usize) -> Step {
        let human = self.queued;
        let replied = human + self.human;
        let paused = replied + self.replied;
        let cancelled = paused + self.paused;
        match i {
            i if i < human => Step::Wait,
            i if i < replied => Step::AskForPerson,
            i if i < paused => Step::Reply,
            i if i < cancelled => Step::Pause,
            _ => Step::Cancel,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Step {
    Wait,
    AskForPerson,
    Reply,
    Pause,
    Cancel,
}

/// A `parlance serve`, killed when dropped.
struct Server {
    child: Child,
    url: String,
    http: reqwest::Client,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

impl Server {
    async fn start(database_url: Option<&str>) -> Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_parlance"));
        cmd.current_dir(root())
            .args(["serve", "--bind", &format!("127.0.0.1:{port}")])
            .args(["--flows", "examples/flows"])
            .env("PARLANCE_API_KEY", KEY)
            .env("RUST_LOG", "warn")
            .env_remove("DATABASE_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        if let Some(url) = database_url {
            cmd.env("DATABASE_URL", url);
        }
        let child = cmd.spawn().context("start parlance serve")?;
        let server = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()?,
        };
        let started = Instant::now();
        loop {
            let ready = server
                .http
                .get(format!("{}/readyz", server.url))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ready {
                return Ok(server);
            }
            ensure!(
                started.elapsed() < Duration::from_secs(60),
                "parlance serve was not ready within 60 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A call with the key; the JSON answer, which must be a success.
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value> {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.url))
            .bearer_auth(KEY);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req
            .send()
            .await
            .with_context(|| format!("{method} {path}"))?;
        let status = res.status();
        let value: Value = res.json().await.unwrap_or(Value::Null);
        ensure!(status.is_success(), "{method} {path}: {status} {value}");
        Ok(value)
    }

    async fn post(&self, path: &str, body: Value) -> Result<Value> {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }

    async fn get(&self, path: &str) -> Result<Value> {
        self.call(reqwest::Method::GET, path, None).await
    }

    /// How many conversations are in `states`, page by page.
    async fn count(&self, states: &str) -> Result<usize> {
        let mut n = 0;
        let mut after = String::new();
        loop {
            let page = self
                .get(&format!("{BASE}?state={states}&limit=1000{after}"))
                .await?;
            n += page["items"].as_array().map_or(0, Vec::len);
            match page["next_cursor"].as_str() {
                Some(next) => after = format!("&after={next}"),
                None => return Ok(n),
            }
        }
    }

    /// Waits until no conversation is waiting for, or in, an agent turn.
    async fn settle(&self) -> Result<()> {
        let started = Instant::now();
        loop {
            let busy = self
                .get(&format!(
                    "{BASE}?state=CREATED,WAITING_FOR_AGENT,ACTIVE&limit=1"
                ))
                .await?;
            if busy["items"].as_array().is_some_and(Vec::is_empty) {
                return Ok(());
            }
            ensure!(
                started.elapsed() < Duration::from_secs(1800),
                "the agent's work did not end within 30 minutes"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

const BASE: &str = "/v1/products/default/conversations";

fn contact(i: usize) -> String {
    format!("+1{i:010}")
}

/// Runs `f` on each of `items`, [`CLIENTS`] at a time.
async fn each<T, F, Fut>(items: Vec<T>, f: F) -> Result<Vec<Value>>
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = Result<Value>>,
{
    futures::stream::iter(items.into_iter().map(f))
        .buffered(CLIENTS)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

/// Stores the mix; the id of the newest conversation that needs a person.
async fn seed(server: &Server, mix: Mix) -> Result<String> {
    let started = Instant::now();
    let created = each((0..mix.distinct).collect(), |i| {
        let body = json!({"contact_id": contact(i), "objective": format!("Book a demo ({i})")});
        async move { server.post(BASE, body).await }
    })
    .await?;
    let ids: Vec<String> = created
        .iter()
        .map(|c| c["conversation"]["instance_id"].as_str().map(str::to_owned))
        .collect::<Option<_>>()
        .context("a created conversation without an id")?;
    server.settle().await?;
    println!(
        "console: {} conversations created and sent their first message in {:.0?}",
        ids.len(),
        started.elapsed()
    );
    let started = Instant::now();
    let steps: Vec<(usize, Step)> = (0..mix.distinct).map(|i| (i, mix.step(i))).collect();
    each(steps, |(i, step)| {
        let id = &ids[i];
        async move {
            match step {
                Step::Wait => Ok(Value::Null),
                Step::AskForPerson => {
                    let text = json!({"text": "Could I talk to a person, please?"});
                    server.post(&format!("{BASE}/{id}/replies"), text).await
                }
                Step::Reply => {
                    let text = json!({"text": "Tuesday morning works for me."});
                    server.post(&format!("{BASE}/{id}/replies"), text).await
                }
                Step::Pause => server.post(&format!("{BASE}/{id}/pause"), json!({})).await,
                Step::Cancel => server.post(&format!("{BASE}/{id}/cancel"), json!({})).await,
            }
        }
    })
    .await?;
    server.settle().await?;
    each((0..mix.queued).collect(), |i| {
        let body = json!({"contact_id": contact(i), "objective": format!("Follow up ({i})")});
        async move { server.post(BASE, body).await }
    })
    .await?;
    println!(
        "console: replies, pauses, cancellations and queued conversations in {:.0?}",
        started.elapsed()
    );
    let human = (0..mix.distinct)
        .rev()
        .find(|i| mix.step(*i) == Step::AskForPerson)
        .context("no conversation asks for a person")?;
    Ok(ids[human].clone())
}

/// The state groups of the inbox and how many conversations each holds.
const GROUPS: [(&str, &str); 5] = [
    ("needs a person", "NEEDS_HUMAN_INTERVENTION"),
    (
        "active",
        "CREATED,ACTIVE,WAITING_FOR_REPLY,WAITING_FOR_AGENT,HEARTBEAT_SCHEDULED",
    ),
    ("queued", "QUEUED"),
    ("paused", "PAUSED"),
    ("finished", "COMPLETED,ABANDONED,FAILED"),
];

/// One record for each read-only page; the pages to load, by name.
async fn pages(server: &Server, conversation: &str) -> Result<Vec<(String, String)>> {
    let p = "/v1/products/default";
    server
        .post(
            &format!("{p}/sessions/ses-bench/events"),
            json!({"type": "proactive_trigger", "trigger_id": "t-1"}),
        )
        .await?;
    let events = json!({"events": [{"kind": "set_mastery", "rating": 7, "level": "proficient", "description": "bench"}]});
    server
        .post(&format!("{p}/users/user-bench/adoption/events"), events)
        .await?;
    let flow = server.post("/v1/ai/qa/start_session", json!({})).await?;
    let flow = flow["session_id"].as_str().context("no flow session id")?;
    for message in ["hello", "what can you do?"] {
        let turn =
            json!({"message": message, "user_id": "owner-bench", "session_id": "thread-bench"});
        server.post(&format!("{p}/agent/turns"), turn).await?;
    }
    Ok([
        ("sign-in", "/console".to_owned()),
        ("sign-in submit", "/console".to_owned()),
        ("inbox", "/console".to_owned()),
        (
            "conversation",
            format!("/console/conversations/{conversation}"),
        ),
        ("session", "/console/sessions/ses-bench".to_owned()),
        ("adoption", "/console/adoption/user-bench".to_owned()),
        ("flow session", format!("/console/flow-sessions/qa/{flow}")),
        (
            "agent thread",
            "/console/threads/thread-bench?owner=owner-bench".to_owned(),
        ),
        ("flows", "/console/flows".to_owned()),
    ]
    .into_iter()
    .map(|(name, path)| (name.to_owned(), path))
    .collect())
}

/// The browser's loads of each page, in ms.
fn browse(
    server: &Server,
    pages: &[(String, String)],
    smoke: bool,
) -> Result<Vec<(String, Vec<f64>)>> {
    let python = std::env::var("PARLANCE_BENCH_PYTHON").context(
        "PARLANCE_BENCH_PYTHON is not set: run this benchmark with `cargo xtask bench console`, \
         which provides a Python with Playwright and Chromium",
    )?;
    let chromium =
        std::env::var("PARLANCE_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".to_owned());
    let (warm, loads) = if smoke { ("1", "3") } else { ("5", "30") };
    let out = Command::new(python)
        .current_dir(root())
        .arg("xtask/browser/console_bench.py")
        .env("PARLANCE_URL", &server.url)
        .env("PARLANCE_API_KEY", KEY)
        .env("PARLANCE_PRODUCT", "default")
        .env("PARLANCE_BENCH_PAGES", serde_json::to_string(pages)?)
        .env("PARLANCE_BENCH_WARM", warm)
        .env("PARLANCE_BENCH_LOADS", loads)
        .env("PARLANCE_CHROMIUM", chromium)
        .stderr(Stdio::inherit())
        .output()
        .context("run xtask/browser/console_bench.py")?;
    ensure!(
        out.status.success(),
        "xtask/browser/console_bench.py failed: {}",
        out.status
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text
        .lines()
        .last()
        .context("the browser side printed nothing")?;
    let result: Value = serde_json::from_str(last).context("the browser side's result")?;
    result["pages"]
        .as_array()
        .context("no pages in the result")?
        .iter()
        .map(|p| {
            let name = p["name"].as_str().context("a page without a name")?;
            let ms = p["ms"]
                .as_array()
                .context("a page without times")?
                .iter()
                .filter_map(Value::as_f64)
                .collect();
            Ok((name.to_owned(), ms))
        })
        .collect()
}

/// The value at quantile `q` (nearest rank) of `samples`.
fn quantile(samples: &[f64], q: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

async fn run(backend: &str, database_url: Option<&str>, smoke: bool) -> Result<()> {
    let total = if smoke { 200 } else { 10_000 };
    let mix = Mix::of(total);
    let server = Server::start(database_url).await?;
    println!("console: {backend}: storing {total} conversations");
    let conversation = seed(&server, mix).await?;
    let mut counts = Vec::new();
    for (name, states) in GROUPS {
        counts.push((name, server.count(states).await?));
    }
    let stored: usize = counts.iter().map(|(_, n)| n).sum();
    let expected = [
        mix.human,
        mix.queued + mix.replied,
        mix.queued,
        mix.paused,
        mix.distinct - mix.queued - mix.human - mix.replied - mix.paused,
    ];
    ensure!(
        counts.iter().map(|(_, n)| *n).eq(expected),
        "the stored mix is {counts:?}, not {expected:?}"
    );
    let mut columns = vec!["backend"];
    let mut cells = vec![backend.to_owned()];
    for (name, n) in &counts {
        columns.push(*name);
        cells.push(n.to_string());
    }
    columns.push("stored");
    cells.push(stored.to_string());
    report_row("console: conversations stored", &columns, &cells);
    let pages = pages(&server, &conversation).await?;
    let started = Instant::now();
    let loads = browse(&server, &pages, smoke)?;
    println!(
        "console: {backend}: {} pages loaded in {:.0?}",
        loads.len(),
        started.elapsed()
    );
    println!(
        "{backend:<10} {:<16} {:>10} {:>10} {:>6}",
        "page", "median ms", "p95 ms", "loads"
    );
    for (page, ms) in &loads {
        ensure!(!ms.is_empty(), "{page}: no loads measured");
        let (median, p95) = (quantile(ms, 0.5), quantile(ms, 0.95));
        println!(
            "{backend:<10} {page:<16} {median:>10.1} {p95:>10.1} {:>6}",
            ms.len()
        );
        report_row(
            "console: page loads with the conversations stored",
            &["backend", "page", "median ms", "p95 ms", "loads"],
            &[
                backend.to_owned(),
                page.clone(),
                format!("{median:.1}"),
                format!("{p95:.1}"),
                ms.len().to_string(),
            ],
        );
    }
    Ok(())
}

/// A fresh database for the PostgreSQL part; its URL.
async fn fresh_database() -> Result<String> {
    let url = std::env::var("DATABASE_URL").context("the pg part needs DATABASE_URL")?;
    let mut admin = sqlx::PgConnection::connect(&url).await?;
    admin
        .execute(format!("DROP DATABASE IF EXISTS {DB} WITH (FORCE)").as_str())
        .await?;
    admin
        .execute(format!("CREATE DATABASE {DB}").as_str())
        .await?;
    Ok(url_for(DB))
}

async fn drop_database() {
    if let Ok(url) = std::env::var("DATABASE_URL")
        && let Ok(mut admin) = sqlx::PgConnection::connect(&url).await
    {
        let _ = admin
            .execute(format!("DROP DATABASE IF EXISTS {DB} WITH (FORCE)").as_str())
            .await;
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = args()?;
    if args.memory {
        run("memory", None, args.smoke).await?;
    }
    if args.pg {
        let url = fresh_database().await?;
        let result = run("postgres", Some(&url), args.smoke).await;
        drop_database().await;
        result?;
    }
    Ok(())
}
