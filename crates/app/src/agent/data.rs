//! The operator's agent data, loaded by `serve` from `--resource-directory`
//! and `--knowledge-base`: with neither, the directory and knowledge base are
//! empty, so the crisis reply gives only the universal advice and factual
//! questions get no answer.

use std::path::Path;

use anyhow::Context as _;
use parlance_core::agent::directory::{KnowledgeBase, ResourceDirectory};

/// The example resource directory shipped under `examples/agent/`.
pub const EXAMPLE_DIRECTORY: &str =
    include_str!("../../../../examples/agent/resource-directory.example.json");

/// The example knowledge base shipped under `examples/agent/`.
pub const EXAMPLE_KNOWLEDGE: &str =
    include_str!("../../../../examples/agent/knowledge-base.example.json");

/// The crisis resource directory and the knowledge base.
#[derive(Debug, Clone, Default)]
pub struct AgentData {
    /// Verified crisis resources by region.
    pub directory: ResourceDirectory,
    /// Vetted answers to factual questions.
    pub knowledge: KnowledgeBase,
}

impl AgentData {
    /// Reads and checks the files given (either may be absent).
    ///
    /// # Errors
    ///
    /// When a file cannot be read or is not a valid directory or knowledge base.
    pub fn load(directory: Option<&Path>, knowledge: Option<&Path>) -> anyhow::Result<Self> {
        let mut data = Self::default();
        if let Some(path) = directory {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("read resource directory {}", path.display()))?;
            data.directory = ResourceDirectory::from_json(&text)
                .with_context(|| format!("load resource directory {}", path.display()))?;
        }
        if let Some(path) = knowledge {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("read knowledge base {}", path.display()))?;
            data.knowledge = KnowledgeBase::from_json(&text)
                .with_context(|| format!("load knowledge base {}", path.display()))?;
        }
        Ok(data)
    }

    /// The example files shipped with the repository (for the demo and tests).
    ///
    /// # Errors
    ///
    /// When an example file is invalid.
    pub fn examples() -> anyhow::Result<Self> {
        Ok(Self {
            directory: ResourceDirectory::from_json(EXAMPLE_DIRECTORY)?,
            knowledge: KnowledgeBase::from_json(EXAMPLE_KNOWLEDGE)?,
        })
    }
}
