//! The reference support agent on the turn runtime: the seed's stages over
//! [`SupportState`](parlance_core::turn::seed::SupportState), its HTTP
//! routes, the operator's data (resource directory, knowledge base) and its
//! demo scene. Pure decisions live in `parlance_core::agent`.

mod data;
pub mod demo;
mod routes;
pub mod service;
pub mod stages;
#[cfg(test)]
mod tests;

pub use data::{AgentData, EXAMPLE_DIRECTORY, EXAMPLE_KNOWLEDGE};
pub use routes::routes;
