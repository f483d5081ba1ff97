//! A soak run: mixed load on every machine against two `parlance serve`
//! and two `parlance worker` processes on one PostgreSQL database, with
//! slow clients (connections that never finish their headers) and
//! oversized or unstorable inputs mixed in.
//!
//! Every few seconds it records requests, answers by status, and each
//! process' resident memory and open sockets (`samples.csv`, plotted as
//! `soak.svg`). It fails when a process' memory or sockets keep growing
//! over the run, or when anything acknowledged is missing at the end:
//! a session event (versions), a conversation reply (transcript) or a flow
//! input (dialogue).
//!
//! Run with `cargo xtask soak --minutes N` (release, `DATABASE_URL` set).

#![allow(clippy::print_stdout, clippy::print_stderr, missing_docs)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use axum::Router;
use axum::body::Bytes;
use axum::routing::post;
use parlance_postgres::testing::test_pool;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const KEY: &str = "pk_soak";
const PRODUCT: &str = "default";
/// Clients running the mixed load, each on its own connection.
const CLIENTS: usize = 12;
/// Slow connections opened per second, each sending half a request line
/// and then nothing; the server must close them.
const SLOW_PER_SEC: usize = 20;
/// The most slow connections held open at once by this driver.
const SLOW_MAX: usize = 4_000;
const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// The body limit the serves run with; oversized requests are above it.
const BODY_LIMIT: usize = 256 * 1024;

struct Args {
    minutes: f64,
    out: PathBuf,
}

fn args() -> Result<Args> {
    let mut minutes = 2.0;
    let mut out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/soak");
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--minutes" => minutes = it.next().context("--minutes N")?.parse()?,
            "--out" => out = it.next().context("--out DIR")?.into(),
            // `cargo bench` passes `--bench`.
            _ => {}
        }
    }
    ensure!(minutes > 0.0, "--minutes must be positive");
    Ok(Args { minutes, out })
}

/// An OpenAI-compatible model that answers every chat at once: a tool call
/// when tools are offered, a short JSON-friendly text otherwise.
async fn fake_model() -> SocketAddr {
    let app = Router::new().route(
        "/v1/chat/completions",
        post(|body: Bytes| async move {
            let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let message = if request.get("tools").is_some() {
                json!({"role": "assistant", "content": null, "tool_calls": [{
                    "id": "call-1", "type": "function",
                    "function": {"name": "send_message", "arguments": "{\"text\":\"noted\"}"}
                }]})
            } else if request.get("response_format").is_some() {
                json!({"role": "assistant", "content": "{\"needs_crisis_response\": false, \"risk_level\": \"none\", \"reason\": \"soak\"}"})
            } else {
                json!({"role": "assistant", "content": "an answer"})
            };
            axum::Json(json!({
                "id": "chatcmpl-soak", "object": "chat.completion", "model": "soak",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
            }))
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// A `parlance` process, killed when dropped.
struct Process {
    name: String,
    child: Child,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn parlance(
    name: &str,
    args: &[&str],
    url: &str,
    model: SocketAddr,
    log: &Path,
) -> Result<Process> {
    let flows = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/flows");
    let child = Command::new(env!("CARGO_BIN_EXE_parlance"))
        .args(args)
        .arg("--llm-base-url")
        .arg(format!("http://{model}/v1"))
        .args(["--llm-model", "soak", "--llm-api-key-env", "SOAK_MODEL_KEY"])
        .arg("--flows")
        .arg(flows)
        .env("SOAK_MODEL_KEY", "sk-soak")
        .env("DATABASE_URL", url)
        .env("PARLANCE_API_KEY", KEY)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?)
        .spawn()
        .with_context(|| format!("start {name}"))?;
    Ok(Process {
        name: name.to_owned(),
        child,
    })
}

/// Answers by status (0: no answer), and what was acknowledged.
#[derive(Default)]
struct Tally {
    requests: AtomicU64,
    by_status: Mutex<BTreeMap<u16, u64>>,
    /// Session id -> acknowledged versions.
    session_versions: Mutex<BTreeMap<String, Vec<i64>>>,
    /// Conversation id -> acknowledged reply texts.
    replies: Mutex<BTreeMap<String, Vec<String>>>,
    /// Flow session id -> acknowledged user inputs.
    flow_inputs: Mutex<BTreeMap<String, Vec<String>>>,
}

impl Tally {
    fn count(&self, status: u16) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        *self.by_status.lock().unwrap().entry(status).or_default() += 1;
    }
}

#[derive(Clone)]
struct Client {
    http: reqwest::Client,
    roots: Arc<Vec<String>>,
    tally: Arc<Tally>,
}

impl Client {
    /// One call to serve `n % 2`; the status and JSON body (`None` when
    /// no answer came).
    async fn call(
        &self,
        n: usize,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Option<(u16, Value)> {
        let url = format!("{}{path}", self.roots[n % self.roots.len()]);
        let mut req = self.http.request(method, url).bearer_auth(KEY);
        if let Some(b) = body {
            req = req.json(&b);
        }
        match req.send().await {
            Ok(res) => {
                let status = res.status().as_u16();
                self.tally.count(status);
                let value = res.json().await.unwrap_or(Value::Null);
                Some((status, value))
            }
            Err(_) => {
                self.tally.count(0);
                None
            }
        }
    }

    /// Sends `body` as is (not JSON-encoded by the client), counting its status.
    async fn raw(&self, n: usize, path: &str, body: Vec<u8>) {
        let url = format!("{}{path}", self.roots[n % self.roots.len()]);
        let res = self
            .http
            .post(url)
            .bearer_auth(KEY)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await;
        self.tally.count(res.map_or(0, |r| r.status().as_u16()));
    }
}

/// A copy of what a tally holds, so no lock is held across the checks.
fn snapshot<T: Clone>(m: &Mutex<T>) -> T {
    m.lock().unwrap().clone()
}

fn text(len: usize, seed: usize) -> String {
    let word = format!("w{seed} ");
    word.repeat(len / word.len() + 1)[..len].to_owned()
}

/// One client's loop: every machine in turn, until `stop`.
async fn client_loop(c: Client, id: usize, stop: Arc<AtomicBool>) {
    let session = format!("soak-{id}");
    let mut conversation: Option<(String, usize)> = None;
    let mut flow: Option<String> = None;
    let mut round = 0usize;
    while !stop.load(Ordering::Relaxed) {
        round += 1;
        let n = id + round;
        // Session: an event, acknowledged versions kept.
        let event = if round % 7 == 1 {
            "open_chat"
        } else {
            "user_message"
        };
        let path = format!("/products/{PRODUCT}/sessions/{session}/events");
        let answer = c
            .call(
                n,
                reqwest::Method::POST,
                &path,
                Some(json!({"type": event})),
            )
            .await;
        if let Some((200 | 201, v)) = answer
            && let Some(version) = v["version"].as_i64()
        {
            c.tally
                .session_versions
                .lock()
                .unwrap()
                .entry(session.clone())
                .or_default()
                .push(version);
        }
        // Adoption: a mastery event and a read.
        let user = format!("/products/{PRODUCT}/users/soak-{id}/adoption");
        let mastery = json!({"events": [{"kind": "set_mastery", "rating": (round % 100) as i64, "level": "proficient", "description": "soak"}]});
        c.call(
            n,
            reqwest::Method::POST,
            &format!("{user}/events"),
            Some(mastery),
        )
        .await;
        c.call(n + 1, reqwest::Method::GET, &user, None).await;
        // Conversation: a new one every 40 replies, replies kept.
        if conversation.as_ref().is_none_or(|(_, k)| *k >= 40) {
            let body = json!({"contact_id": format!("soak-{id}-{round}"), "objective": "soak", "todos": []});
            conversation = match c
                .call(
                    n,
                    reqwest::Method::POST,
                    &format!("/products/{PRODUCT}/conversations"),
                    Some(body),
                )
                .await
            {
                Some((201, v)) => v["conversation"]["instance_id"]
                    .as_str()
                    .map(|s| (s.to_owned(), 0)),
                _ => None,
            };
        }
        if let Some((cid, k)) = conversation.as_mut() {
            *k += 1;
            let reply = format!("reply {id}/{round}");
            let path = format!("/products/{PRODUCT}/conversations/{cid}/replies");
            if let Some((200 | 201, _)) = c
                .call(
                    n,
                    reqwest::Method::POST,
                    &path,
                    Some(json!({"text": reply})),
                )
                .await
            {
                c.tally
                    .replies
                    .lock()
                    .unwrap()
                    .entry(cid.clone())
                    .or_default()
                    .push(reply);
            }
        }
        // Agent: a turn every third round (three model calls).
        if round.is_multiple_of(3) {
            let body = json!({"message": format!("hello {round}"), "user_id": format!("soak-{id}"), "session_id": format!("soak-{id}"), "channel": "WEB"});
            c.call(
                n,
                reqwest::Method::POST,
                &format!("/products/{PRODUCT}/agent/turns"),
                Some(body),
            )
            .await;
        }
        // Flow: the Q&A example, a 10 KB question every fifth input, polled
        // until the model's answer has been handed back.
        flow_step(&c, n, &mut flow, round, id).await;
        // Hostile input now and then: a body over the limit, a NUL.
        if round.is_multiple_of(10) {
            let big = format!("{{\"type\": \"{}\"}}", "x".repeat(BODY_LIMIT + 1));
            c.raw(
                n,
                &format!("/products/{PRODUCT}/sessions/{session}/events"),
                big.into_bytes(),
            )
            .await;
            let path = format!("/products/{PRODUCT}/conversations/none/replies");
            c.call(
                n,
                reqwest::Method::POST,
                &path,
                Some(json!({"text": "a\u{0}b"})),
            )
            .await;
        }
    }
}

async fn flow_step(c: &Client, n: usize, flow: &mut Option<String>, round: usize, id: usize) {
    if flow.is_none() || round.is_multiple_of(50) {
        *flow = match c
            .call(n, reqwest::Method::POST, "/ai/qa/start_session", None)
            .await
        {
            Some((200, v)) => v["session_id"].as_str().map(str::to_owned),
            _ => None,
        };
    }
    let Some(sid) = flow.clone() else { return };
    let input = if round.is_multiple_of(5) {
        text(10 * 1024, round)
    } else {
        format!("question {id}/{round}")
    };
    let event = json!({"session_id": sid, "event": "user_input", "event_input": input});
    if let Some((200, _)) = c
        .call(n, reqwest::Method::POST, "/ai/qa/event", Some(event))
        .await
    {
        c.tally
            .flow_inputs
            .lock()
            .unwrap()
            .entry(sid.clone())
            .or_default()
            .push(input);
    }
    // Whether taken or not (an answer still running), poll until done.
    for _ in 0..200 {
        let poll = json!({"session_id": sid, "event": "poll", "event_input": ""});
        match c
            .call(n, reqwest::Method::POST, "/ai/qa/event", Some(poll))
            .await
        {
            Some((200, v))
                if v["next_actions"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|x| x == "user_input")) =>
            {
                return;
            }
            Some((200, _)) => tokio::time::sleep(Duration::from_millis(20)).await,
            _ => return,
        }
    }
}

/// Opens slow connections at a steady rate; each sends half a request and
/// waits for the server to close it.
async fn slow_clients(roots: Arc<Vec<SocketAddr>>, stop: Arc<AtomicBool>, held: Arc<AtomicU64>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1) / SLOW_PER_SEC as u32);
    let mut n = 0usize;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        if held.load(Ordering::Relaxed) as usize >= SLOW_MAX {
            continue;
        }
        n += 1;
        let addr = roots[n % roots.len()];
        let held = held.clone();
        tokio::spawn(async move {
            let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
                return;
            };
            held.fetch_add(1, Ordering::Relaxed);
            let _ = s
                .write_all(
                    b"POST /v1/products/default/sessions/slow/events HTTP/1.1\r\nHost: x\r\n",
                )
                .await;
            let mut buf = [0u8; 256];
            // Until the server closes it (or an answer arrives and then EOF).
            while let Ok(k) = s.read(&mut buf).await {
                if k == 0 {
                    break;
                }
            }
            held.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// A process' resident memory (KiB) and open sockets, from /proc.
fn observe(pid: u32) -> (u64, u64) {
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0);
    let sockets = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| {
                    std::fs::read_link(e.path())
                        .is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
                })
                .count() as u64
        })
        .unwrap_or(0);
    (rss, sockets)
}

struct Sample {
    secs: f64,
    requests: u64,
    slow_held: u64,
    /// Per process: (RSS KiB, sockets).
    procs: Vec<(u64, u64)>,
}

/// Whether the series keeps growing: the mean of the last third above the
/// mean of the middle third by more than `factor` and `slack`.
fn grows(values: &[f64], factor: f64, slack: f64) -> Option<(f64, f64)> {
    let third = values.len() / 3;
    if third == 0 {
        return None;
    }
    let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64;
    let middle = mean(&values[third..2 * third]);
    let last = mean(&values[2 * third..]);
    (last > middle * factor + slack).then_some((middle, last))
}

fn plot(samples: &[Sample], names: &[String], out: &Path) -> Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(out, (1000, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(350);
    let end = samples.last().map_or(1.0, |s| s.secs / 60.0);
    let colors = [RED, BLUE, GREEN, MAGENTA];
    let panel = |area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
                 title: &str,
                 pick: &dyn Fn(&(u64, u64)) -> f64,
                 unit: &str|
     -> Result<()> {
        let max = samples
            .iter()
            .flat_map(|s| s.procs.iter().map(pick))
            .fold(1.0_f64, f64::max);
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..end, 0.0..max * 1.1)?;
        chart
            .configure_mesh()
            .x_desc("minutes")
            .y_desc(unit)
            .draw()?;
        for (i, name) in names.iter().enumerate() {
            let color = colors[i % colors.len()];
            chart
                .draw_series(LineSeries::new(
                    samples.iter().map(|s| (s.secs / 60.0, pick(&s.procs[i]))),
                    color,
                ))?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE)
            .border_style(BLACK)
            .draw()?;
        Ok(())
    };
    panel(
        &top,
        "resident memory per process",
        &|p| p.0 as f64 / 1024.0,
        "MiB",
    )?;
    panel(
        &bottom,
        "open sockets per process",
        &|p| p.1 as f64,
        "sockets",
    )?;
    root.present()?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = args()?;
    std::fs::create_dir_all(&args.out)?;
    let Some(pool) = test_pool().await else {
        bail!("the soak run needs PostgreSQL: set DATABASE_URL");
    };
    let url = {
        let base = std::env::var("DATABASE_URL")?;
        let db = pool
            .connect_options()
            .get_database()
            .unwrap_or("test")
            .to_owned();
        let (head, _) = base.split_once('?').unwrap_or((&base, ""));
        let (server, _) = head
            .rsplit_once('/')
            .context("DATABASE_URL has no database")?;
        format!("{server}/{db}")
    };
    let model = fake_model().await;
    let ports = [free_port(), free_port()];
    let mut procs = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let bind = format!("127.0.0.1:{port}");
        let limit = BODY_LIMIT.to_string();
        let serve = [
            "serve",
            "--no-worker",
            "--bind",
            &bind,
            "--body-limit",
            &limit,
        ];
        procs.push(parlance(
            &format!("serve-{}", i + 1),
            &serve,
            &url,
            model,
            &args.out.join(format!("serve-{}.log", i + 1)),
        )?);
    }
    for i in 0..2 {
        procs.push(parlance(
            &format!("worker-{}", i + 1),
            &["worker"],
            &url,
            model,
            &args.out.join(format!("worker-{}.log", i + 1)),
        )?);
    }
    let roots: Vec<String> = ports
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}/v1"))
        .collect();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()?;
    for root in &roots {
        let health = root.trim_end_matches("/v1").to_owned() + "/healthz";
        let started = Instant::now();
        while http.get(&health).send().await.is_err() {
            ensure!(
                started.elapsed() < Duration::from_secs(60),
                "{health} never answered"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let names: Vec<String> = procs.iter().map(|p| p.name.clone()).collect();
    let pids: Vec<u32> = procs.iter().map(|p| p.child.id()).collect();
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let held = Arc::new(AtomicU64::new(0));
    println!(
        "soak: {} minutes, {CLIENTS} clients, {SLOW_PER_SEC} slow connections/s, output in {}",
        args.minutes,
        args.out.display()
    );
    let mut clients = Vec::new();
    for id in 0..CLIENTS {
        let c = Client {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()?,
            roots: Arc::new(roots.clone()),
            tally: tally.clone(),
        };
        clients.push(tokio::spawn(client_loop(c, id, stop.clone())));
    }
    let addrs: Vec<SocketAddr> = ports
        .iter()
        .map(|p| SocketAddr::from(([127, 0, 0, 1], *p)))
        .collect();
    let slow = tokio::spawn(slow_clients(Arc::new(addrs), stop.clone(), held.clone()));

    let started = Instant::now();
    let duration = Duration::from_secs_f64(args.minutes * 60.0);
    let mut samples = Vec::new();
    let mut csv = std::fs::File::create(args.out.join("samples.csv"))?;
    writeln!(csv, "secs,requests,slow_held,process,rss_kib,sockets")?;
    while started.elapsed() < duration {
        tokio::time::sleep(SAMPLE_EVERY).await;
        for (p, pid) in procs.iter_mut().zip(&pids) {
            if let Ok(Some(status)) = p.child.try_wait() {
                bail!("{} (pid {pid}) exited during the run: {status}", p.name);
            }
        }
        let sample = Sample {
            secs: started.elapsed().as_secs_f64(),
            requests: tally.requests.load(Ordering::Relaxed),
            slow_held: held.load(Ordering::Relaxed),
            procs: pids.iter().map(|pid| observe(*pid)).collect(),
        };
        for (name, (rss, sockets)) in names.iter().zip(&sample.procs) {
            writeln!(
                csv,
                "{:.0},{},{},{name},{rss},{sockets}",
                sample.secs, sample.requests, sample.slow_held
            )?;
        }
        println!(
            "soak: {:>5.0}s {:>8} requests, {:>4} slow held, rss MiB {:?}, sockets {:?}",
            sample.secs,
            sample.requests,
            sample.slow_held,
            sample.procs.iter().map(|p| p.0 / 1024).collect::<Vec<_>>(),
            sample.procs.iter().map(|p| p.1).collect::<Vec<_>>()
        );
        samples.push(sample);
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await?;
    }
    slow.abort();
    plot(&samples, &names, &args.out.join("soak.svg"))?;

    // Everything acknowledged is there.
    let check = Client {
        http,
        roots: Arc::new(roots.clone()),
        tally: Arc::new(Tally::default()),
    };
    let mut lost = Vec::new();
    for (session, versions) in snapshot(&tally.session_versions) {
        let distinct: BTreeSet<i64> = versions.iter().copied().collect();
        if distinct.len() != versions.len() {
            lost.push(format!(
                "session {session}: two acknowledged events share a version"
            ));
        }
        let path = format!("/products/{PRODUCT}/sessions/{session}");
        let now = check
            .call(0, reqwest::Method::GET, &path, None)
            .await
            .map(|(_, v)| v["version"].as_i64().unwrap_or(0));
        if now < distinct.last().copied() {
            lost.push(format!(
                "session {session}: at version {now:?}, below acknowledged {:?}",
                distinct.last()
            ));
        }
    }
    for (cid, replies) in snapshot(&tally.replies) {
        let path = format!("/products/{PRODUCT}/conversations/{cid}");
        let view = check
            .call(0, reqwest::Method::GET, &path, None)
            .await
            .map(|(_, v)| v)
            .unwrap_or(Value::Null);
        let have: BTreeSet<&str> = view["transcript"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m["text"].as_str())
            .collect();
        lost.extend(
            replies
                .iter()
                .filter(|r| !have.contains(r.as_str()))
                .map(|r| format!("conversation {cid}: reply {r:?} missing")),
        );
    }
    for (sid, inputs) in snapshot(&tally.flow_inputs) {
        let body = check
            .call(
                0,
                reqwest::Method::GET,
                &format!("/ai/qa/model/{sid}"),
                None,
            )
            .await
            .map(|(_, v)| v)
            .unwrap_or(Value::Null);
        let model: Value = body["response"]
            .as_str()
            .and_then(|s| serde_json::from_str(s).ok())
            .unwrap_or(Value::Null);
        let have: BTreeSet<&str> = model["dialogue"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|l| l["actor"] == "user")
            .filter_map(|l| l["actor_text"].as_str())
            .collect();
        lost.extend(
            inputs
                .iter()
                .filter(|i| !have.contains(i.as_str()))
                .map(|i| format!("flow session {sid}: input of {} bytes missing", i.len())),
        );
    }

    let by_status = tally.by_status.lock().unwrap().clone();
    let total = tally.requests.load(Ordering::Relaxed);
    println!(
        "soak: {total} requests in {:.1} minutes; answers by status (0: none): {by_status:?}",
        started.elapsed().as_secs_f64() / 60.0
    );
    let mut failures = lost;
    for (i, name) in names.iter().enumerate() {
        let rss: Vec<f64> = samples.iter().map(|s| s.procs[i].0 as f64).collect();
        let sockets: Vec<f64> = samples.iter().map(|s| s.procs[i].1 as f64).collect();
        let peak = rss.iter().copied().fold(0.0, f64::max) / 1024.0;
        let peak_sockets = sockets.iter().copied().fold(0.0, f64::max);
        println!("soak: {name}: peak {peak:.0} MiB, peak {peak_sockets:.0} sockets");
        if let Some((middle, last)) = grows(&rss, 1.25, 32.0 * 1024.0) {
            failures.push(format!(
                "{name}: memory keeps growing ({:.0} -> {:.0} MiB)",
                middle / 1024.0,
                last / 1024.0
            ));
        }
        if let Some((middle, last)) = grows(&sockets, 1.5, 64.0) {
            failures.push(format!(
                "{name}: open sockets keep growing ({middle:.0} -> {last:.0})"
            ));
        }
    }
    let server_errors: u64 = by_status
        .iter()
        .filter(|(s, _)| **s >= 500)
        .map(|(_, n)| n)
        .sum();
    println!(
        "soak: 5xx answers: {server_errors}; unanswered: {}",
        by_status.get(&0).copied().unwrap_or(0)
    );
    if failures.is_empty() {
        println!("soak: passed");
        Ok(())
    } else {
        for f in failures.iter().take(50) {
            eprintln!("soak: {f}");
        }
        bail!("soak failed: {} problems", failures.len())
    }
}
