//! Invokers configured per template folder, as `meta.yaml` files under a
//! flow's `templates/`.
//!
//! A folder's `meta.yaml` may hold an `invoker:` mapping (and, for trees
//! ported from elsewhere, a `renderer:` key, which marks a folder without an
//! invoker). A folder's configuration is merged downward from the
//! `templates/` root: each `meta.yaml` on the way sets or overrides fields
//! of the `invoker` block, key by key (and `headers`/`headers_env` entry by
//! entry); one that names a different `type` starts afresh, and a
//! `renderer:` clears what was inherited. A template runs on its folder's
//! invoker; a template in a folder without one runs on its state's
//! `invoker:`.
//!
//! Every `meta.yaml` is validated when the flow loads, each problem with the
//! file and the field (the file that set the field, or for a missing one the
//! deepest file of the block). Environment variables named by
//! `api_key_env` and `headers_env` are read then too: one that is not set
//! is a load problem, so a service never starts with an invoker that could
//! not authenticate. Their values are never logged or shown. Each distinct
//! configuration is built once, with its own HTTP client (connection pool),
//! and shared by every folder that resolves to it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use parlance_openai::{ApiSecret, AuthStyle, OpenAiClient, OpenAiConfig};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, Url};
use serde_json::{Map, Value};

use super::http_invoker::{HttpInvoker, HttpTarget};
use super::invoker::{Invoker, LlmInvoker, TemplateInvoker};
use crate::monitoring::MeteredLlm;

/// The name of a folder's configuration file.
pub(super) const META_FILE: &str = "meta.yaml";

/// The default limit on one call.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// Where `openai` invokers go without a `base_url`.
const OPENAI_URL: &str = "https://api.openai.com/v1";
/// Where `ollama` invokers go without a `base_url`.
const OLLAMA_URL: &str = "http://127.0.0.1:11434/v1";

/// One problem of a `meta.yaml`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct MetaProblem {
    /// The file, relative to `templates/` (`chat/meta.yaml`).
    pub(super) file: String,
    /// The field (`invoker.timeout`), or `file`.
    pub(super) location: String,
    /// What is wrong, lowercase.
    pub(super) message: String,
}

/// The invokers a flow's template folders configure.
#[derive(Clone, Default)]
pub struct TemplateInvokers {
    /// By folder (relative to `templates/`, `""` for the root), for every
    /// folder holding a template whose configuration names an invoker.
    by_folder: BTreeMap<String, Configured>,
}

#[derive(Clone)]
struct Configured {
    kind: &'static str,
    invoker: Arc<dyn Invoker>,
}

impl fmt::Debug for TemplateInvokers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.by_folder.iter().map(|(k, v)| (k, v.kind)))
            .finish()
    }
}

impl TemplateInvokers {
    /// The invoker of `template`'s folder, if it has one.
    pub fn for_template(&self, template: &str) -> Option<Arc<dyn Invoker>> {
        self.by_folder
            .get(folder_of(template))
            .map(|c| c.invoker.clone())
    }

    /// The kind of invoker `template` runs on, if its folder has one
    /// (`openai`, `http`, ...).
    pub fn kind_for(&self, template: &str) -> Option<&'static str> {
        self.by_folder.get(folder_of(template)).map(|c| c.kind)
    }

    /// True when no folder configures an invoker.
    pub fn is_empty(&self) -> bool {
        self.by_folder.is_empty()
    }
}

/// The folder of a file named relative to `templates/` (`""` at the root).
pub(super) fn folder_of(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(dir, _)| dir)
}

/// The folders from the root down to `folder`, both included.
fn chain(folder: &str) -> Vec<&str> {
    let mut out = vec![""];
    if !folder.is_empty() {
        out.extend(
            folder
                .match_indices('/')
                .map(|(i, _)| &folder[..i])
                .chain([folder]),
        );
    }
    out
}

/// A parsed `meta.yaml`.
struct MetaFile {
    /// Its `invoker:` block.
    invoker: Option<Map<String, Value>>,
    /// Whether it says `renderer:` (clears an inherited invoker).
    renderer: bool,
}

fn parse_meta(file: &str, text: &str, problems: &mut Vec<MetaProblem>) -> Option<MetaFile> {
    let mut problem = |location: &str, message: String| {
        problems.push(MetaProblem {
            file: file.to_owned(),
            location: location.to_owned(),
            message,
        });
    };
    let raw: Value = match serde_norway::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            problem("file", format!("not valid yaml: {e}"));
            return None;
        }
    };
    let top = match raw {
        Value::Null => Map::new(),
        Value::Object(m) => m,
        _ => {
            problem("file", "expected a mapping with `invoker:`".into());
            return None;
        }
    };
    let mut meta = MetaFile {
        invoker: None,
        renderer: false,
    };
    let mut ok = true;
    for (key, value) in top {
        match key.as_str() {
            "invoker" => match value {
                Value::Object(m) => meta.invoker = Some(m),
                _ => {
                    problem("invoker", "expected a mapping".into());
                    ok = false;
                }
            },
            "renderer" => meta.renderer = true,
            other => {
                problem(
                    other,
                    format!("unknown key `{other}`; expected `invoker` or `renderer`"),
                );
                ok = false;
            }
        }
    }
    if meta.invoker.is_some() && meta.renderer {
        problem("file", "holds both `invoker` and `renderer`".into());
        ok = false;
    }
    ok.then_some(meta)
}

/// An `invoker` block merged down a folder chain: each field with the file
/// that set it.
#[derive(Debug, Clone, Default)]
struct Merged {
    fields: BTreeMap<String, (Value, String)>,
    /// The deepest file that contributed.
    last: String,
}

impl Merged {
    fn get_type(&self) -> Option<&str> {
        self.fields.get("type").and_then(|(v, _)| v.as_str())
    }

    /// `block` (from `file`) over `self`.
    fn overlay(mut self, block: &Map<String, Value>, file: &str) -> Self {
        let new_type = block.get("type").and_then(Value::as_str);
        if new_type.is_some() && new_type != self.get_type() {
            self = Merged::default();
        }
        for (key, value) in block {
            let merged = match (self.fields.get(key), value) {
                (Some((Value::Object(old), _)), Value::Object(new)) => {
                    let mut both = old.clone();
                    both.extend(new.iter().map(|(k, v)| (k.clone(), v.clone())));
                    Value::Object(both)
                }
                _ => value.clone(),
            };
            self.fields.insert(key.clone(), (merged, file.to_owned()));
        }
        self.last = file.to_owned();
        self
    }

    /// The fields without their files: equal for equal configurations.
    fn identity(&self) -> Map<String, Value> {
        self.fields
            .iter()
            .map(|(k, (v, _))| (k.clone(), v.clone()))
            .collect()
    }
}

/// Reads the `meta.yaml` files of one flow (`metas`: folder -> text) and
/// builds the invoker of every folder in `template_folders` whose merged
/// configuration names one. Every problem of every file is reported.
pub(super) fn resolve(
    metas: &BTreeMap<String, String>,
    template_folders: &BTreeSet<String>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<TemplateInvokers, Vec<MetaProblem>> {
    let file_of = |folder: &str| {
        if folder.is_empty() {
            META_FILE.to_owned()
        } else {
            format!("{folder}/{META_FILE}")
        }
    };
    let mut problems = Vec::new();
    let parsed: BTreeMap<&str, Option<MetaFile>> = metas
        .iter()
        .map(|(folder, text)| {
            (
                folder.as_str(),
                parse_meta(&file_of(folder), text, &mut problems),
            )
        })
        .collect();
    // Every meta.yaml is checked, whether or not a template sits beside it.
    let folders: BTreeSet<&str> = template_folders
        .iter()
        .map(String::as_str)
        .chain(metas.keys().map(String::as_str))
        .collect();
    let mut built: Vec<(Map<String, Value>, Option<Configured>)> = Vec::new();
    let mut out = TemplateInvokers::default();
    'folders: for folder in folders {
        let mut merged: Option<Merged> = None;
        for dir in chain(folder) {
            match parsed.get(dir) {
                None => {}
                // Reported already; what it would have set is unknown.
                Some(None) => continue 'folders,
                Some(Some(meta)) => {
                    if meta.renderer {
                        merged = None;
                    }
                    if let Some(block) = &meta.invoker {
                        merged = Some(merged.unwrap_or_default().overlay(block, &file_of(dir)));
                    }
                }
            }
        }
        let Some(merged) = merged else {
            continue;
        };
        let identity = merged.identity();
        let configured = match built.iter().find(|(id, _)| *id == identity) {
            Some((_, c)) => c.clone(),
            None => {
                let c = build(&merged, env, &mut problems);
                built.push((identity, c.clone()));
                c
            }
        };
        if let Some(c) = configured
            && template_folders.contains(folder)
        {
            out.by_folder.insert(folder.to_owned(), c);
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        problems.sort();
        problems.dedup();
        Err(problems)
    }
}

/// The chat services a chat invoker speaks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Service {
    OpenAi,
    Azure,
    Ollama,
}

/// Field access with problems recorded against the file that set each
/// field.
struct Fields<'a> {
    merged: &'a Merged,
    kind: &'a str,
    used: BTreeSet<&'static str>,
    problems: &'a mut Vec<MetaProblem>,
}

impl Fields<'_> {
    fn problem_at(&mut self, file: &str, field: &str, message: String) {
        self.problems.push(MetaProblem {
            file: file.to_owned(),
            location: format!("invoker.{field}"),
            message,
        });
    }

    /// A problem with `field`, at the file that set it.
    fn bad(&mut self, field: &'static str, message: String) {
        let file = self
            .merged
            .fields
            .get(field)
            .map_or_else(|| self.merged.last.clone(), |(_, f)| f.clone());
        self.problem_at(&file, field, message);
    }

    fn missing(&mut self, field: &'static str, why: &str) {
        let file = self.merged.last.clone();
        self.problem_at(&file, field, format!("missing; {why}"));
    }

    fn value(&mut self, field: &'static str) -> Option<&Value> {
        self.used.insert(field);
        self.merged.fields.get(field).map(|(v, _)| v)
    }

    fn string(&mut self, field: &'static str) -> Option<String> {
        match self.value(field)?.clone() {
            Value::String(s) if !s.trim().is_empty() => Some(s.trim().to_owned()),
            Value::String(_) => {
                self.bad(field, "must not be empty".into());
                None
            }
            other => {
                self.bad(field, format!("expected a string, found {other}"));
                None
            }
        }
    }

    fn required(&mut self, field: &'static str, why: &str) -> Option<String> {
        if self.merged.fields.contains_key(field) {
            self.string(field)
        } else {
            self.used.insert(field);
            self.missing(field, why);
            None
        }
    }

    fn timeout(&mut self) -> Duration {
        let Some(text) = self.string("timeout") else {
            return DEFAULT_TIMEOUT;
        };
        match humantime::parse_duration(&text) {
            Ok(d) if !d.is_zero() => d,
            Ok(_) => {
                self.bad("timeout", "must be longer than zero".into());
                DEFAULT_TIMEOUT
            }
            Err(e) => {
                self.bad(
                    "timeout",
                    format!("bad duration `{text}` ({e}); write e.g. `30s` or `2m`"),
                );
                DEFAULT_TIMEOUT
            }
        }
    }

    fn url(&mut self, field: &'static str, text: &str) -> Option<Url> {
        match Url::parse(text) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && !u.cannot_be_a_base() => Some(u),
            Ok(_) => {
                self.bad(field, format!("`{text}` is not an http(s) url"));
                None
            }
            Err(e) => {
                self.bad(field, format!("`{text}` is not a url: {e}"));
                None
            }
        }
    }

    /// The value of the environment variable named by `field`.
    fn secret(
        &mut self,
        field: &'static str,
        var: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Option<String> {
        match env(var).filter(|v| !v.trim().is_empty()) {
            Some(v) => Some(v.trim().to_owned()),
            None => {
                self.bad(field, format!("environment variable `{var}` is not set"));
                None
            }
        }
    }

    /// A mapping of strings to strings.
    fn string_map(&mut self, field: &'static str) -> Vec<(String, String)> {
        let Some(v) = self.value(field).cloned() else {
            return Vec::new();
        };
        let Value::Object(map) = v else {
            self.bad(field, "expected a mapping of names to strings".into());
            return Vec::new();
        };
        let mut out = Vec::new();
        for (k, v) in map {
            match v {
                Value::String(s) => out.push((k, s)),
                other => self.bad(field, format!("`{k}`: expected a string, found {other}")),
            }
        }
        out
    }

    /// Every field the kind does not know is a problem.
    fn finish(&mut self) {
        let unknown: Vec<String> = self
            .merged
            .fields
            .keys()
            .filter(|k| k.as_str() != "type" && !self.used.contains(k.as_str()))
            .cloned()
            .collect();
        for key in unknown {
            let file = self.merged.fields[&key].1.clone();
            let kind = self.kind.to_owned();
            self.problem_at(&file, &key, format!("unknown field for type `{kind}`"));
        }
    }
}

const KINDS: &str =
    "openai, openai_json, azure_openai, azure_openai_json, ollama, ollama_json, http, template";

/// Checks a merged block and builds its invoker; `None` with problems
/// recorded when it cannot be built.
fn build(
    merged: &Merged,
    env: &dyn Fn(&str) -> Option<String>,
    problems: &mut Vec<MetaProblem>,
) -> Option<Configured> {
    let before = problems.len();
    let mut f = Fields {
        merged,
        kind: "",
        used: BTreeSet::new(),
        problems,
    };
    let kind = f.required("type", &format!("one of {KINDS}"))?;
    let (kind, built): (&'static str, Option<Arc<dyn Invoker>>) = match kind.as_str() {
        "template" => ("template", Some(Arc::new(TemplateInvoker))),
        "http" => ("http", http(&mut f, env)),
        "openai" => ("openai", chat(&mut f, env, Service::OpenAi, false)),
        "openai_json" => ("openai_json", chat(&mut f, env, Service::OpenAi, true)),
        "azure_openai" => ("azure_openai", chat(&mut f, env, Service::Azure, false)),
        "azure_openai_json" => ("azure_openai_json", chat(&mut f, env, Service::Azure, true)),
        "ollama" => ("ollama", chat(&mut f, env, Service::Ollama, false)),
        "ollama_json" => ("ollama_json", chat(&mut f, env, Service::Ollama, true)),
        other => {
            f.bad(
                "type",
                format!("unknown invoker type `{other}`; expected one of {KINDS}"),
            );
            return None;
        }
    };
    f.kind = kind;
    f.finish();
    let ok = f.problems.len() == before;
    let invoker = built.filter(|_| ok)?;
    Some(Configured { kind, invoker })
}

/// A chat invoker (`openai`, `azure_openai`, `ollama`, and their `_json`
/// forms).
fn chat(
    f: &mut Fields<'_>,
    env: &dyn Fn(&str) -> Option<String>,
    service: Service,
    json: bool,
) -> Option<Arc<dyn Invoker>> {
    let model = f.required(
        "model",
        if service == Service::Azure {
            "the deployment name"
        } else {
            "the model name"
        },
    );
    let base_url = match service {
        Service::Azure => {
            let endpoint = f.required(
                "endpoint",
                "the resource url, https://<name>.openai.azure.com",
            );
            let version = f.required("api_version", "e.g. 2024-10-21");
            match (endpoint, version, &model) {
                (Some(e), Some(v), Some(m)) => f.url("endpoint", &e).map(|mut u| {
                    u.path_segments_mut()
                        .map(|mut p| {
                            p.pop_if_empty()
                                .extend(["openai", "deployments", m.as_str()]);
                        })
                        .ok();
                    u.query_pairs_mut().append_pair("api-version", &v);
                    u.to_string()
                }),
                _ => None,
            }
        }
        Service::OpenAi | Service::Ollama => match f.string("base_url") {
            Some(u) => f.url("base_url", &u).map(|_| u),
            None => Some(
                if service == Service::OpenAi {
                    OPENAI_URL
                } else {
                    OLLAMA_URL
                }
                .to_owned(),
            ),
        },
    };
    let key_var = match service {
        Service::Azure => f.required("api_key_env", "the name of the variable holding the key"),
        Service::OpenAi if !f.merged.fields.contains_key("base_url") => f.required(
            "api_key_env",
            "the OpenAI endpoint needs a key: name the variable holding it",
        ),
        _ => f.string("api_key_env"),
    };
    let key = key_var.and_then(|var| f.secret("api_key_env", &var, env));
    let temperature = match f.value("temperature").cloned() {
        None => None,
        Some(v) => match v.as_f64() {
            Some(t) if (0.0..=2.0).contains(&t) => Some(t as f32),
            _ => {
                f.bad(
                    "temperature",
                    format!("expected a number from 0 to 2, found {v}"),
                );
                None
            }
        },
    };
    let max_tokens = match f.value("max_tokens").cloned() {
        None => None,
        Some(v) => match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
            Some(n) if n > 0 => Some(n),
            _ => {
                f.bad(
                    "max_tokens",
                    format!("expected a positive integer, found {v}"),
                );
                None
            }
        },
    };
    let timeout = f.timeout();
    let needs_key = matches!(service, Service::Azure)
        || (service == Service::OpenAi && !f.merged.fields.contains_key("base_url"));
    if needs_key && key.is_none() {
        return None;
    }
    let (model, base_url) = (model?, base_url?);
    // The queue's attempts are the one retry policy of a task: the client
    // makes one attempt per call.
    let mut config = OpenAiConfig::new(base_url, model)
        .with_timeout(timeout)
        .with_retries(0, Duration::from_millis(250), Duration::from_secs(8));
    if service == Service::Azure {
        config.auth = AuthStyle::ApiKeyHeader;
    }
    if let Some(key) = key {
        config = config.with_api_key(ApiSecret::new(key));
    }
    let client = match OpenAiClient::new(config) {
        Ok(c) => c,
        Err(e) => {
            let field = if service == Service::Azure {
                "endpoint"
            } else {
                "base_url"
            };
            f.bad(field, e.to_string());
            return None;
        }
    };
    Some(Arc::new(
        LlmInvoker::new(Arc::new(MeteredLlm::new(Arc::new(client))), json)
            .with_temperature(temperature)
            .with_max_tokens(max_tokens),
    ))
}

/// An `http` invoker.
fn http(f: &mut Fields<'_>, env: &dyn Fn(&str) -> Option<String>) -> Option<Arc<dyn Invoker>> {
    let url = f
        .required("url", "where to send the rendered template")
        .and_then(|u| f.url("url", &u));
    let method = match f.string("method").map(|m| m.to_ascii_uppercase()) {
        None => Some(Method::POST),
        Some(m) if m == "POST" => Some(Method::POST),
        Some(m) if m == "PUT" => Some(Method::PUT),
        Some(m) if m == "PATCH" => Some(Method::PATCH),
        Some(m) => {
            f.bad(
                "method",
                format!("`{m}` does not send a body; expected POST, PUT or PATCH"),
            );
            None
        }
    };
    let content_type = match f.string("content_type") {
        None => Some(HeaderValue::from_static("text/plain; charset=utf-8")),
        Some(ct) => match HeaderValue::from_str(&ct) {
            Ok(v) => Some(v),
            Err(_) => {
                f.bad("content_type", format!("`{ct}` cannot be a header value"));
                None
            }
        },
    };
    let mut headers = HeaderMap::new();
    let literal = f.string_map("headers");
    let from_env = f.string_map("headers_env");
    let mut ok = true;
    let mut entries: Vec<(String, Option<String>, bool)> = literal
        .into_iter()
        .map(|(n, v)| (n, Some(v), false))
        .collect();
    for (name, var) in from_env {
        let value = f.secret("headers_env", &var, env);
        entries.push((name, value, true));
    }
    for (name, value, secret) in entries {
        let field = if secret { "headers_env" } else { "headers" };
        let Ok(header) = HeaderName::from_bytes(name.as_bytes()) else {
            f.bad(field, format!("`{name}` is not a header name"));
            ok = false;
            continue;
        };
        let Some(value) = value else {
            ok = false;
            continue;
        };
        match HeaderValue::from_str(&value) {
            Ok(mut v) => {
                v.set_sensitive(true);
                headers.insert(header, v);
            }
            Err(_) => {
                // Never echo the value: it may be a secret.
                f.bad(
                    field,
                    format!("`{name}`: the value cannot be a header value"),
                );
                ok = false;
            }
        }
    }
    let timeout = f.timeout();
    let (url, method, content_type) = (url?, method?, content_type?);
    if !ok {
        return None;
    }
    match HttpInvoker::new(HttpTarget {
        url,
        method,
        headers,
        content_type,
        timeout,
    }) {
        Ok(i) => Some(Arc::new(i)),
        Err(e) => {
            f.bad("url", e);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metas(files: &[(&str, &str)]) -> BTreeMap<String, String> {
        files
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn folders(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    fn env(name: &str) -> Option<String> {
        (name == "TEST_KEY").then(|| "sk-test-secret".to_owned())
    }

    fn problems(metas_: &[(&str, &str)], folders_: &[&str]) -> Vec<String> {
        resolve(&metas(metas_), &folders(folders_), &env)
            .unwrap_err()
            .iter()
            .map(|p| format!("{}: {}: {}", p.file, p.location, p.message))
            .collect()
    }

    fn merged_at(metas_: &[(&str, &str)], folder: &str) -> Option<Map<String, Value>> {
        let mut problems = Vec::new();
        let mut merged: Option<Merged> = None;
        let m = metas(metas_);
        for dir in chain(folder) {
            if let Some(text) = m.get(dir) {
                let meta = parse_meta(dir, text, &mut problems).unwrap();
                if meta.renderer {
                    merged = None;
                }
                if let Some(block) = &meta.invoker {
                    merged = Some(merged.unwrap_or_default().overlay(block, dir));
                }
            }
        }
        assert_eq!(problems, []);
        merged.map(|m| m.identity())
    }

    #[test]
    fn chains_run_from_the_root_down() {
        assert_eq!(chain(""), [""]);
        assert_eq!(chain("a"), ["", "a"]);
        assert_eq!(chain("a/b/c"), ["", "a", "a/b", "a/b/c"]);
        assert_eq!(folder_of("x.j2"), "");
        assert_eq!(folder_of("a/b/x.j2"), "a/b");
    }

    #[test]
    fn values_merge_downward_key_by_key() {
        let tree = [
            (
                "",
                "invoker:\n  type: ollama\n  model: llama3\n  temperature: 0.7\n",
            ),
            ("chat", "invoker:\n  temperature: 0\n"),
            ("chat/strict", "invoker: {type: ollama, max_tokens: 10}\n"),
            (
                "hook",
                "invoker: {type: http, url: 'http://127.0.0.1:1/'}\n",
            ),
            ("plain", "renderer: {}\n"),
            ("plain/again", "invoker: {timeout: 5s}\n"),
        ];
        let json = |v: Value| v.as_object().unwrap().clone();
        assert_eq!(
            merged_at(&tree, "chat/strict/deeper"),
            Some(json(serde_json::json!({
                "type": "ollama", "model": "llama3", "temperature": 0, "max_tokens": 10
            })))
        );
        assert_eq!(
            merged_at(&tree, "other"),
            Some(json(serde_json::json!({
                "type": "ollama", "model": "llama3", "temperature": 0.7
            })))
        );
        // Another type starts afresh.
        assert_eq!(
            merged_at(&tree, "hook"),
            Some(json(
                serde_json::json!({"type": "http", "url": "http://127.0.0.1:1/"})
            ))
        );
        // `renderer` clears the inherited invoker; a later block has no type.
        assert_eq!(merged_at(&tree, "plain"), None);
        assert_eq!(
            merged_at(&tree, "plain/again"),
            Some(json(serde_json::json!({"timeout": "5s"})))
        );
        let headers = [
            (
                "",
                "invoker: {type: http, url: 'http://h/', headers: {a: '1', b: '2'}}",
            ),
            ("x", "invoker: {headers: {b: '3'}}"),
        ];
        assert_eq!(
            merged_at(&headers, "x").unwrap()["headers"],
            serde_json::json!({"a": "1", "b": "3"})
        );
    }

    #[test]
    fn folders_get_their_merged_invoker_and_share_equal_ones() {
        let tree = metas(&[
            ("chat", "invoker: {type: ollama, model: llama3}\n"),
            ("chat/strict", "invoker: {temperature: 0}\n"),
            (
                "hook",
                "invoker: {type: http, url: 'http://127.0.0.1:9/in'}\n",
            ),
            ("echo", "invoker: {type: template}\n"),
        ]);
        let t = resolve(
            &tree,
            &folders(&["", "chat", "chat/a", "chat/strict", "hook", "echo", "none"]),
            &env,
        )
        .unwrap();
        assert!(t.for_template("root.j2").is_none());
        assert!(t.for_template("none/x.j2").is_none());
        assert_eq!(t.kind_for("chat/x.j2"), Some("ollama"));
        assert_eq!(t.kind_for("chat/strict/x.j2"), Some("ollama"));
        assert_eq!(t.kind_for("hook/x.j2"), Some("http"));
        assert_eq!(t.kind_for("echo/x.j2"), Some("template"));
        // `chat/a` has no meta.yaml: it shares `chat`'s client.
        assert!(Arc::ptr_eq(
            &t.for_template("chat/x.j2").unwrap(),
            &t.for_template("chat/a/x.j2").unwrap()
        ));
        assert!(!Arc::ptr_eq(
            &t.for_template("chat/x.j2").unwrap(),
            &t.for_template("chat/strict/x.j2").unwrap()
        ));
        assert!(
            resolve(&BTreeMap::new(), &folders(&["", "a"]), &env)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn every_problem_names_its_file_and_field() {
        let found = problems(
            &[
                (
                    "",
                    "invoker: {type: openai, model: gpt-4o-mini, api_key_env: NOT_SET_ANYWHERE}\n",
                ),
                (
                    "a",
                    "invoker:\n  timeout: 3 parsecs\n  temperature: hot\n  colour: blue\n",
                ),
                ("b", "invoker: {type: telepathy}\n"),
                ("c", "invoker: {type: http}\n"),
                (
                    "d",
                    "invoker: {type: azure_openai, model: gpt4, endpoint: 'ftp://x'}\n",
                ),
                (
                    "e",
                    "invoker: {type: http, url: 'http://h/', method: GET, headers_env: {Authorization: NOT_SET_ANYWHERE}}\n",
                ),
                ("f", "renderer: {}\ninvoker: {type: template}\n"),
                ("g", "invoker: [1]\npool_size: 3\n"),
                ("h", "- not: a mapping\n"),
                (
                    "i",
                    "invoker: {type: ollama, model: m, base_url: 'not a url', max_tokens: -1}\n",
                ),
                ("j", "invoker: {model: m}\nrenderer:\n"),
                ("k", "invoker: {type: [x: }\n"),
            ],
            &["", "a", "b", "c", "d", "e", "f", "g", "h", "i", "j/deep"],
        );
        let expected = [
            "a/meta.yaml: invoker.colour: unknown field for type `openai`",
            "a/meta.yaml: invoker.temperature: expected a number from 0 to 2, found \"hot\"",
            "b/meta.yaml: invoker.type: unknown invoker type `telepathy`; expected one of openai, openai_json, azure_openai, azure_openai_json, ollama, ollama_json, http, template",
            "c/meta.yaml: invoker.url: missing; where to send the rendered template",
            "d/meta.yaml: invoker.api_key_env: missing; the name of the variable holding the key",
            "d/meta.yaml: invoker.api_version: missing; e.g. 2024-10-21",
            "e/meta.yaml: invoker.headers_env: environment variable `NOT_SET_ANYWHERE` is not set",
            "e/meta.yaml: invoker.method: `GET` does not send a body; expected POST, PUT or PATCH",
            "f/meta.yaml: file: holds both `invoker` and `renderer`",
            "g/meta.yaml: invoker: expected a mapping",
            "g/meta.yaml: pool_size: unknown key `pool_size`; expected `invoker` or `renderer`",
            "h/meta.yaml: file: expected a mapping with `invoker:`",
            "i/meta.yaml: invoker.base_url: `not a url` is not a url: relative URL without a base",
            "i/meta.yaml: invoker.max_tokens: expected a positive integer, found -1",
            "j/meta.yaml: file: holds both `invoker` and `renderer`",
            "meta.yaml: invoker.api_key_env: environment variable `NOT_SET_ANYWHERE` is not set",
        ];
        for e in expected {
            assert!(found.iter().any(|f| f == e), "missing {e:?} in\n{found:#?}");
        }
        for prefix in [
            "a/meta.yaml: invoker.timeout: bad duration `3 parsecs` (",
            "k/meta.yaml: file: not valid yaml: ",
        ] {
            assert!(
                found.iter().any(|f| f.starts_with(prefix)),
                "missing {prefix:?} in\n{found:#?}"
            );
        }
        // The root's unset key is reported once, not once per folder below it.
        assert_eq!(
            found
                .iter()
                .filter(|f| f.starts_with("meta.yaml: invoker.api_key_env"))
                .count(),
            1
        );
        assert!(!found.join("\n").contains("sk-test-secret"));
    }

    #[test]
    fn a_missing_type_and_required_fields_are_reported_at_the_deepest_file() {
        let found = problems(
            &[
                ("a", "invoker: {temperature: 0.1}\n"),
                ("b", "invoker: {type: ollama}\n"),
            ],
            &["a", "b/c"],
        );
        assert_eq!(
            found,
            [
                "a/meta.yaml: invoker.type: missing; one of openai, openai_json, azure_openai, azure_openai_json, ollama, ollama_json, http, template",
                "b/meta.yaml: invoker.model: missing; the model name",
            ]
        );
    }

    #[tokio::test]
    async fn azure_calls_its_deployment_with_the_api_version_and_key_header() {
        use axum::extract::{Path, RawQuery};
        use axum::http::HeaderMap;
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = seen.clone();
        let app = axum::Router::new().route(
            "/openai/deployments/{deployment}/chat/completions",
            axum::routing::post(
                move |Path(deployment): Path<String>,
                      RawQuery(query): RawQuery,
                      headers: HeaderMap,
                      body: String| {
                    let record = record.clone();
                    async move {
                        let header = |n: &str| {
                            headers
                                .get(n)
                                .map(|v| v.to_str().unwrap().to_owned())
                                .unwrap_or_default()
                        };
                        record.lock().unwrap().push((
                            deployment,
                            query.unwrap_or_default(),
                            header("api-key"),
                            header("authorization"),
                            body,
                        ));
                        axum::Json(serde_json::json!({
                            "choices": [{"message": {"role": "assistant", "content": "{}"}}]
                        }))
                    }
                },
            ),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let meta = format!(
            "invoker: {{type: azure_openai_json, model: my-gpt, endpoint: 'http://{addr}/', \
             api_version: '2024-10-21', api_key_env: TEST_KEY}}"
        );
        let t = resolve(&metas(&[("", &meta)]), &folders(&[""]), &env).unwrap();
        let invoker = t.for_template("x.j2").unwrap();
        assert_eq!(invoker.call("answer in JSON").await.unwrap(), "{}");
        let seen = seen.lock().unwrap();
        let (deployment, query, key, authorization, body) = &seen[0];
        assert_eq!(deployment, "my-gpt");
        assert_eq!(query, "api-version=2024-10-21");
        assert_eq!(key, "sk-test-secret");
        assert_eq!(authorization, "");
        let body: Value = serde_json::from_str(body).unwrap();
        assert_eq!(
            body["response_format"],
            serde_json::json!({"type": "json_object"})
        );
        assert_eq!(
            body["messages"],
            serde_json::json!([{"role": "user", "content": "answer in JSON"}])
        );
    }

    #[test]
    fn keys_come_from_the_named_variable_and_openai_itself_needs_one() {
        let found = problems(&[("", "invoker: {type: openai, model: m}\n")], &[""]);
        assert_eq!(
            found,
            [
                "meta.yaml: invoker.api_key_env: missing; the OpenAI endpoint needs a key: name the variable holding it"
            ]
        );
        // A key, or a server of one's own, is enough.
        for meta in [
            "invoker: {type: openai, model: m, api_key_env: TEST_KEY}",
            "invoker: {type: openai_json, model: m, base_url: 'http://127.0.0.1:8000/v1'}",
            "invoker: {type: azure_openai, model: d, endpoint: 'https://acme.openai.azure.com', api_version: '2024-10-21', api_key_env: TEST_KEY, timeout: 30s}",
            "invoker: {type: ollama_json, model: llama3, temperature: 1.5, max_tokens: 100}",
            "invoker: {type: http, url: 'https://h.example/in', method: put, headers: {X-Flow: a}, headers_env: {Authorization: TEST_KEY}, content_type: application/json}",
        ] {
            let t = resolve(&metas(&[("", meta)]), &folders(&[""]), &env)
                .unwrap_or_else(|p| panic!("{meta}: {p:?}"));
            assert!(t.for_template("x.j2").is_some(), "{meta}");
            assert!(!format!("{t:?}").contains("sk-test-secret"));
        }
    }
}
