//! Running commands, printing each one first.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, bail};

/// The workspace root: the parent of this crate's manifest directory.
pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Whether this runs on CI: `CI` set to any non-empty value. There a
/// missing piece (a database, a toolchain) fails rather than skips.
pub(crate) fn on_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty())
}

/// A command that prints itself before it runs.
pub(crate) struct Cmd {
    inner: Command,
    shown: String,
}

impl Cmd {
    pub(crate) fn new(program: impl AsRef<OsStr>) -> Self {
        let mut inner = Command::new(program.as_ref());
        inner.current_dir(root());
        Self {
            shown: program.as_ref().to_string_lossy().into_owned(),
            inner,
        }
    }

    pub(crate) fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.shown.push(' ');
        self.shown.push_str(&arg.as_ref().to_string_lossy());
        self.inner.arg(arg);
        self
    }

    /// An argument shown as `shown` (a URL that may hold a password).
    pub(crate) fn arg_shown_as(mut self, arg: impl AsRef<OsStr>, shown: &str) -> Self {
        self.shown.push(' ');
        self.shown.push_str(shown);
        self.inner.arg(arg);
        self
    }

    pub(crate) fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        for a in args {
            self = self.arg(a);
        }
        self
    }

    pub(crate) fn env(mut self, key: &str, value: impl AsRef<OsStr>) -> Self {
        self.inner.env(key, value);
        self
    }

    pub(crate) fn env_remove(mut self, key: &str) -> Self {
        self.inner.env_remove(key);
        self
    }

    /// The command and the line it is shown as, to run it another way.
    pub(crate) fn into_parts(self) -> (Command, String) {
        (self.inner, self.shown)
    }

    /// Runs to completion, failing on a non-zero exit.
    pub(crate) fn run(mut self) -> Result<()> {
        println!("$ {}", self.shown);
        let status = self
            .inner
            .status()
            .with_context(|| format!("could not start `{}`", self.shown))?;
        if !status.success() {
            bail!("`{}` failed: {status}", self.shown);
        }
        Ok(())
    }

    /// Runs and returns stdout, failing on a non-zero exit.
    pub(crate) fn output(mut self) -> Result<String> {
        println!("$ {}", self.shown);
        let out = self
            .inner
            .stderr(Stdio::inherit())
            .output()
            .with_context(|| format!("could not start `{}`", self.shown))?;
        if !out.status.success() {
            bail!("`{}` failed: {}", self.shown, out.status);
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// True when the command starts and exits 0; prints nothing.
    pub(crate) fn succeeds_quietly(mut self) -> bool {
        self.inner
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

/// `cargo` (the one running xtask) with arguments.
pub(crate) fn cargo<I, S>(args: I) -> Cmd
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let program = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    Cmd::new(program).args(args)
}
