//! The reference support agent on the turn runtime: the seed's stages over
//! [`SupportState`](parlance_core::turn::seed::SupportState), its HTTP
//! routes (turns and memory in `routes`; history, forks, updates, deletion
//! and erasure in `threads`), the operator's data (resource directory,
//! knowledge base) and its demo scene. Pure decisions live in `parlance_core::agent`.

mod data;
mod routes;
mod service;
mod stages;
#[cfg(test)]
mod tests;
mod threads;

use std::sync::Arc;
use std::time::Duration;

use parlance_ports::{Checkpointer, CrisisLog, MemoryStore};

pub use data::{AgentData, EXAMPLE_DIRECTORY, EXAMPLE_KNOWLEDGE};
pub use routes::routes;
pub(crate) use stages::graph;

use crate::state::Shared;

/// What the agent's routes and turns share.
#[derive(Clone)]
pub struct Agent {
    /// Time, ids, the model and the embedder.
    pub shared: Shared,
    /// The threads: one checkpoint per thread, committed once per turn,
    /// with their history.
    pub threads: Arc<dyn Checkpointer>,
    /// Long-term memory per owner.
    pub memory_store: Arc<dyn MemoryStore>,
    /// Every crisis-gate assessment (written by the threads' commits; read
    /// here).
    pub crisis_log: Arc<dyn CrisisLog>,
    /// The resource directory and knowledge base.
    pub agent_data: Arc<AgentData>,
    /// How long the crisis gate waits for the model before its keyword
    /// classifier decides.
    pub crisis_budget: Duration,
    /// Whether erasing an owner's memory also deletes the owner's crisis
    /// log (`agent.erase_crisis_log`); by default the log is kept.
    pub erase_crisis_log: bool,
}
