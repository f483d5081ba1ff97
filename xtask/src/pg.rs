//! Finding, or starting, a PostgreSQL server for the tests.
//!
//! In order: `DATABASE_URL`; the server at `127.0.0.1:5432` (user
//! `postgres`, database `test`); a throwaway cluster under `target/` made
//! with `initdb` and `pg_ctl` (run as an unprivileged user when we are root)
//! and stopped afterwards. Without any of them, `CI` (any non-empty value) is an error and
//! anything else skips the PostgreSQL tests.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};

use crate::run::{Cmd, root};

const LOCAL_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// A database for the tests; stops the cluster it started when dropped.
pub(crate) struct Db {
    url: String,
    cluster: Option<Cluster>,
}

impl Db {
    pub(crate) fn url(&self) -> &str {
        &self.url
    }
}

struct Cluster {
    pg_ctl: PathBuf,
    data: PathBuf,
    run_as: Option<String>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let stop = as_user(&self.run_as, &self.pg_ctl)
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "fast", "-w", "stop"]);
        if let Err(e) = stop.run() {
            eprintln!("xtask: could not stop the throwaway PostgreSQL cluster: {e:#}");
        }
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        drop(self.cluster.take());
    }
}

pub(crate) fn provide() -> Result<Option<Db>> {
    if let Some(url) = std::env::var("DATABASE_URL").ok().filter(|u| !u.is_empty()) {
        println!("xtask: PostgreSQL from DATABASE_URL");
        return Ok(Some(Db { url, cluster: None }));
    }
    if answers(SocketAddr::from(([127, 0, 0, 1], 5432))) {
        println!("xtask: PostgreSQL at {LOCAL_URL}");
        return Ok(Some(Db {
            url: LOCAL_URL.to_owned(),
            cluster: None,
        }));
    }
    if let Some(bin) = find_bin_dir() {
        return start_cluster(&bin).map(Some);
    }
    if crate::run::on_ci() {
        bail!(
            "CI is set and no PostgreSQL is available: set DATABASE_URL=postgres://user@host:port/db, \
             run a server at 127.0.0.1:5432 (user postgres, trust auth, database test), \
             or install PostgreSQL's initdb and pg_ctl so a throwaway cluster can be started"
        );
    }
    Ok(None)
}

fn answers(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok()
}

/// The directory holding `initdb` and `pg_ctl`: on `PATH`, or Debian's
/// `/usr/lib/postgresql/<version>/bin` (newest first).
fn find_bin_dir() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .find(|d| d.join("initdb").is_file() && d.join("pg_ctl").is_file())
    });
    on_path.or_else(|| {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .filter(|d| d.join("initdb").is_file())
            .collect();
        dirs.sort();
        dirs.pop()
    })
}

fn start_cluster(bin: &Path) -> Result<Db> {
    let base = root().join("target").join("xtask-pg");
    let data = base.join("data");
    if base.exists() {
        std::fs::remove_dir_all(&base).context("remove an old throwaway cluster")?;
    }
    std::fs::create_dir_all(&base)?;
    let run_as = unprivileged_user()?;
    if let Some(user) = &run_as {
        Cmd::new("chown").args(["-R", user]).arg(&base).run()?;
    }
    let port = free_port()?;
    println!("xtask: starting a throwaway PostgreSQL cluster on port {port}");
    as_user(&run_as, bin.join("initdb"))
        .arg("-D")
        .arg(&data)
        .args(["-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"])
        .run()?;
    let cluster = Cluster {
        pg_ctl: bin.join("pg_ctl"),
        data: data.clone(),
        run_as: run_as.clone(),
    };
    let opts = format!(
        "-p {port} -c listen_addresses=127.0.0.1 -k {} -c fsync=off -c max_connections=200",
        base.display()
    );
    as_user(&run_as, &cluster.pg_ctl)
        .arg("-D")
        .arg(&data)
        .args(["-l"])
        .arg(base.join("log"))
        .args(["-o", &opts, "-w", "start"])
        .run()?;
    Ok(Db {
        url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
        cluster: Some(cluster),
    })
}

/// PostgreSQL refuses to run as root: pick `postgres`, else `nobody`.
fn unprivileged_user() -> Result<Option<String>> {
    let uid = Cmd::new("id").arg("-u").output()?;
    if uid.trim() != "0" {
        return Ok(None);
    }
    for user in ["postgres", "nobody"] {
        if Cmd::new("id").arg(user).succeeds_quietly() {
            return Ok(Some(user.to_owned()));
        }
    }
    bail!("running as root and neither the `postgres` nor the `nobody` user exists")
}

fn as_user(user: &Option<String>, program: impl AsRef<Path>) -> Cmd {
    match user {
        Some(u) => Cmd::new("runuser")
            .args(["-u", u, "--"])
            .arg(program.as_ref()),
        None => Cmd::new(program.as_ref()),
    }
}

fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("find a free port")?;
    Ok(l.local_addr()?.port())
}

/// A database of its own on the server `db` names, made with `psql` and
/// dropped when this is dropped, so a run never touches the shared one.
pub(crate) struct Scratch {
    admin_url: String,
    name: String,
    url: String,
}

impl Scratch {
    pub(crate) fn create(db: &Db, label: &str) -> Result<Self> {
        let name = format!("parlance_{label}_{}", std::process::id());
        let (base, query) = match db.url.split_once('?') {
            Some((b, q)) => (b, format!("?{q}")),
            None => (db.url.as_str(), String::new()),
        };
        let Some((server, _)) = base.rsplit_once('/') else {
            bail!("DATABASE_URL has no database name");
        };
        let scratch = Self {
            admin_url: db.url.clone(),
            url: format!("{server}/{name}{query}"),
            name,
        };
        scratch.psql(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            scratch.name
        ))?;
        scratch.psql(&format!("CREATE DATABASE {}", scratch.name))?;
        Ok(scratch)
    }

    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    fn psql(&self, sql: &str) -> Result<()> {
        Cmd::new("psql")
            .args(["--quiet", "--no-psqlrc", "-v", "ON_ERROR_STOP=1", "-d"])
            .arg_shown_as(&self.admin_url, "$DATABASE_URL")
            .args(["-c", sql])
            .run()
            .context("psql is needed to make a database of its own for the run")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Err(e) = self.psql(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        )) {
            eprintln!("xtask: could not drop database {}: {e:#}", self.name);
        }
    }
}
