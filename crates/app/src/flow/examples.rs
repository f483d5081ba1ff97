//! The example flows of `examples/flows/`, compiled into the binary for
//! `parlance demo` (the service loads flows from `--flows` instead).

use std::collections::BTreeMap;

use super::catalog::{FlowCatalog, load_flow};
use super::invoker::Invokers;

macro_rules! example {
    ($dir:literal, [$($t:literal),* $(,)?]) => {
        (
            include_str!(concat!("../../../../examples/flows/", $dir, "/flow.yaml")),
            &[$(($t, include_str!(concat!("../../../../examples/flows/", $dir, "/templates/", $t)))),*]
                as &[(&str, &str)],
        )
    };
}

/// The Q&A and extraction example flows.
///
/// # Errors
///
/// When an example does not validate (a test keeps them valid).
pub fn example_catalog() -> anyhow::Result<FlowCatalog> {
    let mut catalog = FlowCatalog::new();
    for (text, templates) in [
        example!("qa", ["ask.j2", "answer.j2", "followup.j2", "goodbye.j2"]),
        example!(
            "extraction",
            [
                "intake.j2",
                "normalize.j2",
                "contact.j2",
                "topics.j2",
                "topic.j2",
                "missing.j2",
                "confirm.j2",
                "done.j2",
            ]
        ),
    ] {
        let templates: BTreeMap<String, String> = templates
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let flow = load_flow(text, templates, &Invokers::is_builtin)
            .map_err(|p| anyhow::anyhow!("example flow is invalid: {}", p.join("; ")))?;
        catalog.insert(flow);
    }
    Ok(catalog)
}
