//! Running `parlance serve` as a user does: the built binary on a free
//! port with a fixed API key, waited for until `/readyz` answers 200, and
//! killed when dropped (so also when a test run fails).

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::run::{cargo, root};

/// The product the fixed key opens: `serve --api-key` keys product `default`.
pub(crate) const PRODUCT: &str = "default";
/// The key every server started here accepts.
pub(crate) const API_KEY: &str = "pk_xtask_api_test";

/// Builds the `parlance` binary (debug) and returns its path.
pub(crate) fn build() -> Result<PathBuf> {
    cargo([
        "build",
        "--package",
        "parlance-app",
        "--bin",
        "parlance",
        "--locked",
    ])
    .run()?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|d| if d.is_relative() { root().join(d) } else { d })
        .unwrap_or_else(|| root().join("target"));
    let bin = target.join("debug").join("parlance");
    if !bin.is_file() {
        bail!("`cargo build` made no {}", bin.display());
    }
    Ok(bin)
}

/// A running `parlance serve`.
pub(crate) struct Server {
    child: Child,
    /// `http://127.0.0.1:<port>`.
    pub(crate) url: String,
    log: PathBuf,
}

impl Server {
    /// Starts `bin serve` in memory, or on `database_url`, with the flows in
    /// `examples/flows`, logging to `target/py/serve-<name>.log`.
    pub(crate) fn start(bin: &PathBuf, name: &str, database_url: Option<&str>) -> Result<Self> {
        let port = free_port()?;
        let log = root()
            .join("target")
            .join("py")
            .join(format!("serve-{name}.log"));
        std::fs::create_dir_all(log.parent().unwrap_or(&root()))?;
        let out = std::fs::File::create(&log)?;
        let mut cmd = Command::new(bin);
        cmd.current_dir(root())
            .args(["serve", "--bind", &format!("127.0.0.1:{port}")])
            .args(["--flows", "examples/flows"])
            .env("PARLANCE_API_KEY", API_KEY)
            .env("NO_COLOR", "1")
            .env_remove("DATABASE_URL")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        if let Some(url) = database_url {
            cmd.env("DATABASE_URL", url);
        }
        println!(
            "$ {} serve --bind 127.0.0.1:{port} --flows examples/flows ({}; log {})",
            bin.display(),
            if database_url.is_some() {
                "PostgreSQL"
            } else {
                "memory"
            },
            log.display()
        );
        let child = cmd
            .spawn()
            .with_context(|| format!("start {}", bin.display()))?;
        let mut server = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            log,
        };
        server.wait_ready(SocketAddr::from(([127, 0, 0, 1], port)))?;
        Ok(server)
    }

    fn wait_ready(&mut self, addr: SocketAddr) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "parlance serve exited ({status}) before it was ready; see {}",
                    self.log.display()
                );
            }
            if readyz(addr) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "parlance serve was not ready within 60 s; see {}",
                    self.log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Err(e) = self.child.kill() {
            eprintln!("xtask: could not stop parlance serve: {e}");
        }
        let _ = self.child.wait();
    }
}

/// Whether `GET /readyz` answers 200. A few lines of HTTP/1.0 by hand keep
/// xtask free of an HTTP client, so it still builds in seconds.
fn readyz(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    if s.write_all(b"GET /readyz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.ends_with(b" 200")
}

fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("find a free port")?;
    Ok(l.local_addr()?.port())
}
