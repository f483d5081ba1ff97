//! Tidy checks, run as tests: the layering holds, every Rust file starts
//! with a `//!` doc line, no unreviewed snapshot is left behind, and the
//! service registers routes only through the API document.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use serde_json::Value;

/// Crates each layer must never reach through normal dependencies.
const FORBIDDEN: &[(&str, &[&str])] = &[
    (
        "parlance-core",
        &[
            "tokio",
            "sqlx",
            "async-trait",
            "axum",
            "rand",
            "reqwest",
            "hyper",
        ],
    ),
    (
        "parlance-ports",
        &["sqlx", "tokio", "axum", "reqwest", "hyper"],
    ),
];

/// Every (crate, forbidden dependency, path) found in `cargo metadata` output.
pub(crate) fn layering_violations(metadata: &Value) -> Vec<String> {
    let packages: HashMap<&str, &str> = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| Some((p["id"].as_str()?, p["name"].as_str()?)))
        .collect();
    // id -> ids of its normal (non-dev, non-build) dependencies.
    let graph: HashMap<&str, Vec<&str>> = metadata["resolve"]["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| {
            let deps = n["deps"]
                .as_array()?
                .iter()
                .filter(|d| {
                    d["dep_kinds"]
                        .as_array()
                        .is_some_and(|ks| ks.iter().any(|k| k["kind"].is_null()))
                })
                .filter_map(|d| d["pkg"].as_str())
                .collect();
            Some((n["id"].as_str()?, deps))
        })
        .collect();
    let mut violations = Vec::new();
    for (krate, forbidden) in FORBIDDEN {
        let Some(start) = packages
            .iter()
            .find(|(_, n)| *n == krate)
            .map(|(id, _)| *id)
        else {
            continue;
        };
        // Depth-first search remembering the path to each reached crate.
        let mut stack = vec![(start, vec![*krate])];
        let mut seen = BTreeSet::new();
        while let Some((id, path)) = stack.pop() {
            if !seen.insert(id) {
                continue;
            }
            for dep in graph.get(id).into_iter().flatten() {
                let name = packages.get(dep).copied().unwrap_or("?");
                let mut next = path.clone();
                next.push(name);
                if forbidden.contains(&name) {
                    violations.push(format!("{krate} reaches {name}: {}", next.join(" -> ")));
                }
                stack.push((dep, next));
            }
        }
    }
    violations.sort();
    violations.dedup();
    violations
}

/// Rust files under `dir` whose first line is not a `//!` doc comment.
fn files_without_module_doc(dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if path.is_dir() {
            if name != "target" && name != ".git" {
                files_without_module_doc(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if !text.starts_with("//!") {
                out.push(path.display().to_string());
            }
        }
    }
}

/// Snapshot files insta leaves when a snapshot changed unreviewed.
fn stray_snapshots(dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "target" && name != ".git" {
                stray_snapshots(&path, out);
            }
        } else if name.ends_with(".snap.new") || name.ends_with(".pending-snap") {
            out.push(path.display().to_string());
        }
    }
}

/// Route registrations that bypass `utoipa_axum::routes!` (and so the API
/// document) in the app's sources under `dir`: `(file, line)` of every
/// `.route(`, `.route_service(` or `.nest_service(` call given a path,
/// outside `tests` modules and the files in `exempt`.
fn undocumented_routes(dir: &Path, exempt: &[&str], out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            undocumented_routes(&path, exempt, out);
            continue;
        }
        let shown = path.display().to_string();
        if path.extension().is_none_or(|e| e != "rs") || exempt.iter().any(|e| shown.ends_with(e)) {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        // Unit tests sit at the end of a file, after `#[cfg(test)]`.
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let lines: Vec<&str> = code.lines().collect();
        for (n, line) in lines.iter().enumerate() {
            // A call whose first argument is a path (`"/..."`), on the same
            // line or the next one; a turn graph's `.route("stage", ...)`
            // names a stage, not a path.
            let next = lines.get(n + 1).map_or("", |l| l.trim_start());
            let registers = [".route(", ".route_service(", ".nest_service("]
                .iter()
                .any(|call| match line.split_once(call) {
                    Some((_, rest)) if rest.trim().is_empty() => next.starts_with("\"/"),
                    Some((_, rest)) => rest.trim_start().starts_with("\"/"),
                    None => false,
                });
            if registers {
                out.push(format!("{shown}:{}: {}", n + 1, line.trim()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::{cargo, root};
    use serde_json::json;

    #[test]
    fn layering_holds_in_this_workspace() {
        let out = cargo(["metadata", "--format-version", "1", "--locked"])
            .output()
            .expect("cargo metadata");
        let metadata: Value = serde_json::from_str(&out).expect("metadata is JSON");
        let violations = layering_violations(&metadata);
        assert!(
            violations.is_empty(),
            "layering broken:\n{}",
            violations.join("\n")
        );
    }

    fn node(id: &str, deps: &[(&str, Option<&str>)]) -> Value {
        json!({
            "id": id,
            "deps": deps.iter().map(|(pkg, kind)| json!({
                "pkg": pkg,
                "dep_kinds": [{"kind": kind}],
            })).collect::<Vec<_>>(),
        })
    }

    #[test]
    fn tokio_in_core_is_caught_even_through_another_crate() {
        let metadata = json!({
            "packages": [
                {"id": "core-id", "name": "parlance-core"},
                {"id": "serde-id", "name": "serde"},
                {"id": "helper-id", "name": "some-helper"},
                {"id": "tokio-id", "name": "tokio"},
                {"id": "proptest-id", "name": "proptest"},
                {"id": "rand-id", "name": "rand"},
            ],
            "resolve": {"nodes": [
                node("core-id", &[("serde-id", None), ("helper-id", None), ("proptest-id", Some("dev"))]),
                node("helper-id", &[("tokio-id", None)]),
                node("proptest-id", &[("rand-id", None)]),
                node("serde-id", &[]),
                node("tokio-id", &[]),
                node("rand-id", &[]),
            ]},
        });
        assert_eq!(
            layering_violations(&metadata),
            ["parlance-core reaches tokio: parlance-core -> some-helper -> tokio"],
            "a dev-dependency (proptest -> rand) is allowed; a normal path to tokio is not"
        );
    }

    #[test]
    fn sqlx_in_ports_is_caught() {
        let metadata = json!({
            "packages": [
                {"id": "ports-id", "name": "parlance-ports"},
                {"id": "sqlx-id", "name": "sqlx"},
            ],
            "resolve": {"nodes": [
                node("ports-id", &[("sqlx-id", None)]),
                node("sqlx-id", &[]),
            ]},
        });
        assert_eq!(
            layering_violations(&metadata),
            ["parlance-ports reaches sqlx: parlance-ports -> sqlx"]
        );
    }

    #[test]
    fn every_rust_file_starts_with_a_module_doc() {
        let mut missing = Vec::new();
        for dir in ["crates", "xtask", "fuzz"] {
            files_without_module_doc(&root().join(dir), &mut missing);
        }
        assert!(
            missing.is_empty(),
            "no `//!` first line:\n{}",
            missing.join("\n")
        );
    }

    #[test]
    fn no_unreviewed_snapshots() {
        let mut stray = Vec::new();
        stray_snapshots(&root(), &mut stray);
        assert!(
            stray.is_empty(),
            "review or delete these (cargo insta review):\n{}",
            stray.join("\n")
        );
    }

    #[test]
    fn every_route_of_the_service_is_in_the_api_document() {
        let mut found = Vec::new();
        // The operator console's pages and assets are not API operations;
        // the API document test names them in its own list of exceptions.
        undocumented_routes(
            &root().join("crates/app/src"),
            &["console/mod.rs"],
            &mut found,
        );
        assert!(
            found.is_empty(),
            "register these with `utoipa_axum::routes!` and a `#[utoipa::path]`, so the API \
             document lists them:\n{}",
            found.join("\n")
        );
    }
}
