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

/// The interpreter the environment is made with: `$PARLANCE_PYTHON` when
/// set, else the newest CPython 3.12 or later found (on `PATH` as
/// `python3.13` or `python3.12`, or among pyenv's installed versions), else
/// `python3`.
///
/// Newer first because CPython before 3.12.1 has an AST recursion-depth
/// defect (python/cpython#106905): `ast.parse`, which Hypothesis calls to
/// describe strategies, fails now and then with `SystemError: AST
/// constructor recursion depth mismatch` while schemathesis runs workers,
/// and schemathesis reports that as an error of the run.
pub(crate) fn interpreter() -> Option<PathBuf> {
    let usable = |p: &Path| {
        Cmd::new(p)
            .args([
                "-c",
                "import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 9))",
            ])
            .succeeds_quietly()
    };
    if let Some(p) = std::env::var_os("PARLANCE_PYTHON") {
        return Some(PathBuf::from(p));
    }
    let mut candidates: Vec<PathBuf> = vec!["python3.13".into(), "python3.12".into()];
    let pyenv = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".pyenv")));
    if let Some(versions) = pyenv.map(|r| r.join("versions")) {
        let mut found: Vec<(Vec<u32>, PathBuf)> = std::fs::read_dir(versions)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let version: Vec<u32> = name
                    .split('.')
                    .map(str::parse)
                    .collect::<Result<_, _>>()
                    .ok()?;
                (version.len() == 3 && version[0] == 3 && version[1] >= 12)
                    .then(|| (version, e.path().join("bin").join("python3")))
            })
            .collect();
        found.sort();
        candidates.extend(found.into_iter().rev().map(|(_, p)| p));
    }
    candidates.push("python3".into());
    candidates.into_iter().find(|p| usable(p))
}

/// Creates the environment when missing and installs the requirements and
/// the client when the stamp (a SHA-256 of both manifests) differs.
pub(crate) fn ensure() -> Result<Venv> {
    let base = root().join("target").join("py");
    let dir = base.join("venv");
    let stamp = base.join("installed.sha256");
    let want = manifests_digest()?;
    let python = dir.join("bin").join("python");
    let Some(interpreter) = interpreter() else {
        bail!(
            "python3 with the venv module is needed for the API tests and the Python client \
             (Debian: apt-get install python3-venv)"
        );
    };
    let version = version_of(&interpreter)?;
    // An environment made with another interpreter is made again.
    if python.is_file() && version_of(&python).ok().as_deref() != Some(version.as_str()) {
        std::fs::remove_dir_all(&dir).context("remove the old venv")?;
    }
    if !python.is_file() {
        std::fs::create_dir_all(&base)?;
        // Nothing is installed in a new environment, whatever the stamp says.
        let _ = std::fs::remove_file(&stamp);
        Cmd::new(&interpreter)
            .args(["-m", "venv"])
            .arg(&dir)
            .run()?;
    }
    println!("xtask: Python {version} ({})", interpreter.display());
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

/// The version of an interpreter (`3.13.0`).
fn version_of(python: &Path) -> Result<String> {
    let out = std::process::Command::new(python)
        .args(["-c", "import platform; print(platform.python_version())"])
        .output()
        .with_context(|| format!("run {}", python.display()))?;
    if !out.status.success() {
        bail!("{} does not run", python.display());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
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
