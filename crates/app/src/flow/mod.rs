//! Flows as a service: the catalog loaded from `--flows`, invokers, the DAG
//! runner seam, the service and the reference-compatible HTTP routes.

pub mod catalog;
pub mod executor;
pub mod invoker;
mod routes;
pub mod service;

pub use catalog::FlowCatalog;
pub use executor::{DagJob, DagRunner, DagSink, InProcessRunner, RunnerOptions};
pub use invoker::{Invoker, Invokers, LlmInvoker, TemplateInvoker};
pub use routes::routes;
pub use service::{AiProgress, AiResponse, FlowDeps, FlowService, FlowServiceError};
