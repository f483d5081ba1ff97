//! Flows loaded from a directory: one sub-directory per flow, holding
//! `flow.yaml` (or `flow.yml`, `flow.json`) and a `templates/` folder whose
//! sub-folders may configure their invokers in a `meta.yaml`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use parlance_core::flow::{Flow, FlowDef, FlowError, StateKind};

use super::invoker::Invoker;
use super::meta::{self, META_FILE, TemplateInvokers};

/// The flows a service runs, by name, with the invokers their template
/// folders configure.
#[derive(Debug, Default, Clone)]
pub struct FlowCatalog {
    flows: BTreeMap<String, Arc<Flow>>,
    folder_invokers: BTreeMap<String, TemplateInvokers>,
}

impl FlowCatalog {
    /// No flows.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a flow (built in Rust or loaded), replacing one of that name;
    /// its templates run on their states' invokers.
    pub fn insert(&mut self, flow: Flow) {
        self.folder_invokers.remove(flow.name());
        self.flows.insert(flow.name().to_owned(), Arc::new(flow));
    }

    /// Adds a flow whose template folders configure `invokers`.
    pub fn insert_with_invokers(&mut self, flow: Flow, invokers: TemplateInvokers) {
        let name = flow.name().to_owned();
        self.insert(flow);
        if !invokers.is_empty() {
            self.folder_invokers.insert(name, invokers);
        }
    }

    /// A flow by name.
    pub fn get(&self, name: &str) -> Option<Arc<Flow>> {
        self.flows.get(name).cloned()
    }

    /// The invoker `template` of `flow` runs on when its folder configures
    /// one; `None` means the state's own invoker.
    pub fn template_invoker(&self, flow: &str, template: &str) -> Option<Arc<dyn Invoker>> {
        self.folder_invokers.get(flow)?.for_template(template)
    }

    /// The invokers `flow`'s template folders configure, if any.
    pub fn template_invokers(&self, flow: &str) -> Option<&TemplateInvokers> {
        self.folder_invokers.get(flow)
    }

    /// Every flow, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Flow>> {
        self.flows.values()
    }

    /// Loads every flow under `dir`, checking that each invoker state names
    /// an invoker `known` accepts and building the invokers of its
    /// template folders (keys from the process environment). Every problem
    /// of every flow is reported.
    ///
    /// # Errors
    ///
    /// When the directory cannot be read or any flow or `meta.yaml` is
    /// invalid.
    pub fn load_dir(dir: &Path, known: &dyn Fn(&str) -> bool) -> anyhow::Result<Self> {
        Self::load_dir_with(dir, known, &|name| std::env::var(name).ok())
    }

    /// Like [`load_dir`](Self::load_dir), with `env` looking up the
    /// variables `meta.yaml` files name.
    ///
    /// # Errors
    ///
    /// As [`load_dir`](Self::load_dir).
    pub fn load_dir_with(
        dir: &Path,
        known: &dyn Fn(&str) -> bool,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Self> {
        let mut catalog = Self::new();
        let mut problems = Vec::new();
        let mut entries: Vec<_> = fs::read_dir(dir)
            .with_context(|| format!("read flows directory {}", dir.display()))?
            .collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let path = entry.path();
            if !entry.file_type()?.is_dir() {
                continue;
            }
            let Some(file) = ["flow.yaml", "flow.yml", "flow.json"]
                .iter()
                .map(|f| path.join(f))
                .find(|p| p.is_file())
            else {
                continue;
            };
            let text =
                fs::read_to_string(&file).with_context(|| format!("read {}", file.display()))?;
            let templates_dir = path.join("templates");
            let (templates, metas): (BTreeMap<_, _>, BTreeMap<_, _>) =
                read_templates(&templates_dir)?
                    .into_iter()
                    .partition(|(name, _)| !is_meta(name));
            let metas: BTreeMap<String, String> = metas
                .into_iter()
                .map(|(name, text)| (meta::folder_of(&name).to_owned(), text))
                .collect();
            let folders: BTreeSet<String> = templates
                .keys()
                .map(|name| meta::folder_of(name).to_owned())
                .collect();
            let invokers = match meta::resolve(&metas, &folders, env) {
                Ok(invokers) => Some(invokers),
                Err(list) => {
                    problems.extend(list.into_iter().map(|p| {
                        format!(
                            "{}: {}: {}",
                            templates_dir.join(&p.file).display(),
                            p.location,
                            p.message
                        )
                    }));
                    None
                }
            };
            match load_flow(&text, templates, known) {
                Ok(flow) => {
                    if catalog.flows.contains_key(flow.name()) {
                        problems.push(format!(
                            "{}: name: duplicate flow name `{}`",
                            file.display(),
                            flow.name()
                        ));
                    }
                    catalog.insert_with_invokers(flow, invokers.unwrap_or_default());
                }
                Err(list) => {
                    problems.extend(list.into_iter().map(|p| format!("{}: {p}", file.display())))
                }
            }
        }
        if !problems.is_empty() {
            bail!("invalid flows:\n  {}", problems.join("\n  "));
        }
        Ok(catalog)
    }
}

/// Whether a file under `templates/` is a folder's `meta.yaml` (read as
/// configuration, never as a template).
fn is_meta(name: &str) -> bool {
    name.rsplit('/').next() == Some(META_FILE)
}

/// Validates one flow file, invokers included; every problem as a
/// `location: message` line.
pub(super) fn load_flow(
    text: &str,
    templates: BTreeMap<String, String>,
    known: &dyn Fn(&str) -> bool,
) -> Result<Flow, Vec<String>> {
    let def = FlowDef::from_file_text(text, templates)
        .map_err(|p| p.iter().map(ToString::to_string).collect::<Vec<_>>())?;
    let mut problems: Vec<String> = def
        .states
        .iter()
        .enumerate()
        .filter(|(_, s)| s.kind == StateKind::Invoker && !known(&s.invoker))
        .map(|(i, s)| format!("states[{i}].invoker: unknown invoker `{}`", s.invoker))
        .collect();
    match Flow::from_def(def) {
        Ok(flow) if problems.is_empty() => Ok(flow),
        Ok(_) => Err(problems),
        Err(FlowError::Invalid(p)) => {
            problems.extend(p.iter().map(ToString::to_string));
            Err(problems)
        }
        Err(other) => {
            problems.push(other.to_string());
            Err(problems)
        }
    }
}

/// Reads every regular file under `root` (recursively) into memory, named by
/// its path relative to `root` with `/` separators. Symbolic links are
/// skipped, so nothing outside the folder is ever read; templates render
/// from memory afterwards.
///
/// # Errors
///
/// When a file cannot be read or is not UTF-8.
pub fn read_templates(root: &Path) -> anyhow::Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    if !root.is_dir() {
        return Ok(out);
    }
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).with_context(|| format!("read {}", dir.display()))? {
            let entry = entry?;
            let kind = entry.file_type()?;
            let path = entry.path();
            if kind.is_symlink() {
                continue;
            }
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file() {
                let rel = path
                    .strip_prefix(root)?
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join("/");
                let text = fs::read_to_string(&path)
                    .with_context(|| format!("read template {}", path.display()))?;
                out.insert(rel, text);
            }
        }
    }
    Ok(out)
}
