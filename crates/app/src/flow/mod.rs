//! Flows as a service: the catalog loaded from `--flows`, invokers, the DAG
//! runner on the task queue and its task handlers, the service and the
//! reference-compatible HTTP routes.

pub mod catalog;
mod examples;
pub mod executor;
pub mod invoker;
mod routes;
pub mod service;
pub mod tasks;

pub use catalog::FlowCatalog;
pub use examples::example_catalog;
pub use executor::{DagJob, DagRunner, QueueRunner, RunnerOptions};
pub use invoker::{Invoker, Invokers, LlmInvoker, TemplateInvoker};
pub use routes::routes;
pub use service::{AiProgress, AiResponse, FlowDeps, FlowService, FlowServiceError};
