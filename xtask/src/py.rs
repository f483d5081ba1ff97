//! The Python tools: a virtual environment under `target/py/venv` holding
//! the pinned `xtask/py-requirements.txt` and the client in
//! `clients/python`, reinstalled when either changes.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use sha2::{Digest as _, Sha256};

use crate::run::{Cmd, root};

const REQUIREMENTS: &str = "xtask/py-requirements.txt";
const CLIENT: &str = "clients/python";

/// A ready virtual environment.
pub(crate) struct Venv {
    dir: PathBuf,
}

impl Venv {
    /// A program installed in the environment (`python`, `pytest`, ...).
    pub(crate) fn bin(&self, name: &str) -> PathBuf {
        self.dir.join("bin").join(name)
    }
}

/// Whether a `python3` with the `venv` module can be run.
pub(crate) fn available() -> bool {
    Cmd::new("python3")
        .args(["-c", "import venv, ensurepip"])
        .succeeds_quietly()
}

/// Creates the environment when missing and installs the requirements and
/// the client when the stamp (a SHA-256 of both manifests) differs.
pub(crate) fn ensure() -> Result<Venv> {
    let base = root().join("target").join("py");
    let dir = base.join("venv");
    let stamp = base.join("installed.sha256");
    let want = manifests_digest()?;
    let python = dir.join("bin").join("python");
    if !python.is_file() {
        if !available() {
            bail!(
                "python3 with the venv module is needed for the API tests and the Python client \
                 (Debian: apt-get install python3-venv)"
            );
        }
        std::fs::create_dir_all(&base)?;
        Cmd::new("python3").args(["-m", "venv"]).arg(&dir).run()?;
    }
    let have = std::fs::read_to_string(&stamp).unwrap_or_default();
    if have.trim() != want {
        // Every package is pinned in the file, so `--no-deps` installs
        // exactly it; `pip check` then fails on a missing dependency.
        Cmd::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--no-deps", "-r"])
            .arg(root().join(REQUIREMENTS))
            .run()?;
        Cmd::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--no-build-isolation",
                "--editable",
            ])
            .arg(root().join(CLIENT))
            .run()?;
        Cmd::new(&python).args(["-m", "pip", "check"]).run()?;
        std::fs::write(&stamp, format!("{want}\n")).context("write the venv stamp")?;
    }
    Ok(Venv { dir })
}

fn manifests_digest() -> Result<String> {
    let mut h = Sha256::new();
    for file in [
        Path::new(REQUIREMENTS),
        &Path::new(CLIENT).join("pyproject.toml"),
    ] {
        let bytes =
            std::fs::read(root().join(file)).with_context(|| format!("read {}", file.display()))?;
        h.update(file.to_string_lossy().as_bytes());
        h.update([0]);
        h.update(&bytes);
    }
    Ok(hex::encode(h.finalize()))
}
