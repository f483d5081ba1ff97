//! PostgreSQL going away mid-load: a throwaway cluster (`initdb` and
//! `pg_ctl` in a temporary directory, on a free port, run as `postgres` when
//! we are root) serves one `parlance serve --no-worker` and one
//! `parlance worker`, loaded by the clients of [`crate::load`] with session
//! events, conversation replies and flow events while heartbeats come due.
//!
//! Mid-load the cluster is stopped (`pg_ctl stop -m fast`): `/readyz` must
//! answer 503 `unready` while it is down. Then it is started again: without
//! being restarted themselves, the services must answer `/readyz` 200 and
//! acknowledge requests again. Later `pg_ctl restart` takes it down and up
//! in one go, and the services must recover from that too. Afterwards the
//! same checks as the fault test run: nothing acknowledged is lost, every
//! DAG completed exactly once, no heartbeat fired twice, the audit log has
//! no gaps. While the database goes away a 503 may hide a commit whose
//! answer was lost, so the clients count a 503 as unknown (never as
//! acknowledged).
//!
//! Without `initdb` and `pg_ctl` (on `PATH` or in
//! `/usr/lib/postgresql/<version>/bin`) the test says so on stderr and
//! passes, unless `CI` (any non-empty value) or [`REQUIRE_ENV`] is set: then it fails.
//! `PARLANCE_FAULT_SECS` sets the length of each load phase (default 2);
//! the conversations with heartbeats get that many follow-ups (at least 2),
//! so the first ones keep firing through the stop.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use parlance_postgres::testing::{REQUIRE_ENV, record_skip, skips_forbidden};
use serde_json::Value;
use sqlx::postgres::PgPoolOptions;

use crate::load::{
    Checked, Ledger, Load, abandoned, arm_heartbeats, check_all, create_conversations, drained,
    free_port, open_sessions, ready, session_versions, spawn_server, spawn_worker,
};
use crate::support::wait_until;

/// Conversations with heartbeats armed in each batch.
const ARMED: usize = 4;

static CLUSTERS: AtomicU32 = AtomicU32::new(0);

fn phase() -> Duration {
    Duration::from_secs(
        std::env::var("PARLANCE_FAULT_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2),
    )
}

/// The directory holding `initdb` and `pg_ctl`: on `PATH`, or Debian's
/// `/usr/lib/postgresql/<version>/bin` (newest first).
fn bin_dir() -> Option<PathBuf> {
    let has_both = |d: &Path| d.join("initdb").is_file() && d.join("pg_ctl").is_file();
    let on_path = std::env::var_os("PATH")
        .and_then(|path| std::env::split_paths(&path).find(|d| has_both(d)));
    on_path.or_else(|| {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .filter(|d| has_both(d))
            .collect();
        dirs.sort();
        dirs.pop()
    })
}

fn run(cmd: &mut Command) -> Output {
    let shown = format!("{cmd:?}");
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {shown}: {e}"));
    assert!(
        out.status.success(),
        "{shown}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// PostgreSQL refuses to run as root: then its commands run as `postgres`
/// (or `nobody`) through `runuser`.
fn unprivileged_user() -> Option<String> {
    let uid = run(Command::new("id").arg("-u"));
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return None;
    }
    let user = ["postgres", "nobody"]
        .into_iter()
        .find(|u| {
            Command::new("id")
                .arg(u)
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .expect("running as root and neither the `postgres` nor the `nobody` user exists");
    Some(user.to_owned())
}

/// A cluster of our own, stopped and deleted when dropped.
struct Cluster {
    bin: PathBuf,
    base: PathBuf,
    port: u16,
    run_as: Option<String>,
}

impl Cluster {
    /// Makes and starts a cluster; `None` (after a note on stderr) when the
    /// PostgreSQL programs are missing and nothing requires them.
    fn start() -> Option<Self> {
        let Some(bin) = bin_dir() else {
            assert!(
                !skips_forbidden(),
                "CI or {REQUIRE_ENV} is set, but PostgreSQL's initdb and pg_ctl were found \
                 neither on PATH nor in /usr/lib/postgresql/<version>/bin: install the \
                 PostgreSQL server programs so the restart test can run its own cluster"
            );
            // Written to the real stderr, past the test harness's capture.
            let _ = writeln!(
                std::io::stderr(),
                "note: the PostgreSQL restart test is skipped: initdb and pg_ctl not found"
            );
            record_skip("initdb and pg_ctl not found");
            return None;
        };
        let base = std::env::temp_dir().join(format!(
            "parlance-pg-restart-{}-{}",
            std::process::id(),
            CLUSTERS.fetch_add(1, Ordering::Relaxed)
        ));
        if base.exists() {
            std::fs::remove_dir_all(&base).unwrap();
        }
        std::fs::create_dir_all(&base).unwrap();
        let run_as = unprivileged_user();
        if let Some(user) = &run_as {
            run(Command::new("chown").arg(user).arg(&base));
        }
        let cluster = Self {
            bin,
            base,
            port: free_port(),
            run_as,
        };
        let mut initdb = cluster.command("initdb");
        initdb.arg("-D").arg(cluster.data()).args([
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
        ]);
        run(&mut initdb);
        cluster.ctl(&["start"]);
        Some(cluster)
    }

    fn data(&self) -> PathBuf {
        self.base.join("data")
    }

    fn command(&self, program: &str) -> Command {
        let program = self.bin.join(program);
        match &self.run_as {
            Some(user) => {
                let mut cmd = Command::new("runuser");
                cmd.args(["-u", user, "--"]).arg(program);
                cmd
            }
            None => Command::new(program),
        }
    }

    /// `pg_ctl <action>`, waiting for it to finish; `start` and `restart`
    /// take the server options. Its output, and the server's when
    /// `restart` starts it (that action takes no log file), go to
    /// `ctl.log`: a server holding a pipe of ours open would keep us
    /// waiting for the pipe to close.
    fn ctl(&self, action: &[&str]) {
        let mut cmd = self.command("pg_ctl");
        cmd.arg("-D").arg(self.data()).arg("-w");
        if action.first() == Some(&"start") {
            cmd.arg("-l").arg(self.base.join("log"));
        }
        if matches!(action.first(), Some(&"start" | &"restart")) {
            let options = format!(
                "-p {} -c listen_addresses=127.0.0.1 -k {} -c fsync=off -c max_connections=100",
                self.port,
                self.base.display()
            );
            cmd.args(["-o", &options]);
        }
        cmd.args(action);
        let log = self.base.join("ctl.log");
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        cmd.stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        let shown = format!("{cmd:?}");
        let status = cmd
            .status()
            .unwrap_or_else(|e| panic!("cannot run {shown}: {e}"));
        assert!(
            status.success(),
            "{shown}: {status}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let mut stop = self.command("pg_ctl");
        stop.arg("-D")
            .arg(self.data())
            .args(["-m", "immediate", "-w", "stop"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let _ = stop.status();
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

/// `/readyz`: its status code and body, `None` when nothing answered.
async fn readyz(client: &reqwest::Client, port: u16) -> Option<(u16, Value)> {
    let r = client
        .get(format!("http://127.0.0.1:{port}/readyz"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .ok()?;
    let status = r.status().as_u16();
    Some((status, r.json().await.unwrap_or(Value::Null)))
}

/// Waits until `/readyz` reports the database unready, and returns that
/// answer. Called once the database is stopped: a 200 is a lie.
async fn unready(client: &reqwest::Client, port: u16) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match readyz(client, port).await {
            Some((503, body)) => return body,
            Some((200, body)) => panic!("ready while the database is stopped: {body}"),
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for the server to report unready"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Waits until the clients have had `n` more requests acknowledged than
/// `since`.
async fn acknowledged_again(load: &Load, since: usize, n: usize) {
    wait_until(
        "requests to be acknowledged again",
        Duration::from_secs(60),
        || async { load.acked() >= since + n },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_services_ride_out_a_postgres_restart_and_lose_nothing_acknowledged() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let started = Instant::now();
    let url = cluster.url();
    let port = free_port();
    let mut server = spawn_server(&url, port);
    let mut worker = spawn_worker(&url);
    let client = reqwest::Client::new();
    ready(&client, port).await;
    let base = open_sessions(&client, port).await;
    let ids = create_conversations(&client, port).await;
    // Heartbeats keep firing until after the stop.
    let follow_ups = u32::try_from(phase().as_secs().max(2)).unwrap();
    let mut armed = arm_heartbeats(&client, port, 1, ARMED, follow_ups).await;
    let load = Load {
        ports: vec![port],
        conversations: Arc::new(ids),
        ledger: Arc::new(Mutex::new(Ledger::default())),
        refused_is_unknown: true,
        stop: Arc::default(),
    };
    let loading = tokio::spawn({
        let load = load.clone();
        async move {
            load.run(Instant::now() + Duration::from_secs(3600), 0)
                .await
        }
    });

    // Down: the server says it is unready, for as long as it is.
    tokio::time::sleep(phase()).await;
    assert!(load.acked() > 0, "the load runs");
    cluster.ctl(&["-m", "fast", "stop"]);
    let down = unready(&client, port).await;
    assert_eq!(down["status"], "unready", "{down}");
    assert_eq!(down["database"], "postgres", "{down}");

    // Up again: ready, and acknowledging, without a restart of our own.
    cluster.ctl(&["start"]);
    ready(&client, port).await;
    acknowledged_again(&load, load.acked(), 100).await;
    tokio::time::sleep(phase()).await;

    // `pg_ctl restart` in one go: the services recover from that too.
    cluster.ctl(&["-m", "fast", "restart"]);
    ready(&client, port).await;
    acknowledged_again(&load, load.acked(), 100).await;
    tokio::time::sleep(phase()).await;
    load.stop.store(true, Ordering::Relaxed);
    loading.await.unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect(&url)
        .await
        .unwrap();
    let at_stop = session_versions(&pool).await;
    for (name, child) in [("serve", &mut server), ("worker", &mut worker)] {
        assert!(
            child.running(),
            "parlance {name} exited instead of riding out the restarts"
        );
    }

    // Heartbeats armed after the restarts fire too; everything settles.
    let loaded = Instant::now();
    armed.extend(arm_heartbeats(&client, port, 2, ARMED, follow_ups).await);
    let guard = Duration::from_secs(120 + 2 * u64::from(follow_ups));
    abandoned(&pool, &armed, guard).await;
    drained(&pool, Duration::from_secs(180)).await;
    let settled = loaded.elapsed();
    server.kill();
    worker.kill();

    let ledger = std::mem::take(&mut *load.ledger.lock().unwrap());
    let Checked {
        acked_events,
        messages,
        fired,
        dags,
        audited,
        unknown,
    } = check_all(
        &pool,
        &ledger,
        (&base, &at_stop),
        (&armed, follow_ups),
        true,
    )
    .await;
    let line = format!(
        "pg_restart: {:.0} s; {acked_events} session events, {} replies and {} flow events \
         acknowledged, {unknown} unknown (503 or no answer while the database was away), \
         {messages} messages stored; {} flow inputs ran {} DAGs ({} nodes, each once; progress \
         exact on {} chains, short on {}, {} chains re-ran a node); {fired} heartbeats fired once \
         each on {} conversations; {audited} audit entries, no gap, {} acknowledged transitions \
         among them; settled {:.1} s after the load; readyz while down: {down}",
        started.elapsed().as_secs_f64(),
        ledger.acked_replies.len(),
        ledger.flow_events,
        dags.inputs,
        dags.runs,
        dags.nodes,
        dags.exact_chains,
        dags.short_chains,
        dags.retried_chains,
        armed.len(),
        ledger.transitions.values().map(Vec::len).sum::<usize>(),
        settled.as_secs_f64(),
    );
    std::fs::write(
        std::env::temp_dir().join("parlance-pg-restart-summary.txt"),
        line,
    )
    .unwrap();
}
