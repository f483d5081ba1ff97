//! Flows as a service: the catalog loaded from `--flows`, invokers (by
//! name, and per template folder from `meta.yaml`), the
//! runs of DAGs on the task queue and their task handlers, the service
//! (every change a `FlowCommand` through the executor) and the
//! reference-compatible HTTP routes.

mod catalog;
mod examples;
mod executor;
mod http_invoker;
mod invoker;
mod meta;
mod routes;
mod service;
mod tasks;
mod waiters;

pub use catalog::{FlowCatalog, read_templates};
pub use examples::example_catalog;
pub use executor::{DagRunner, QueueRunner};
pub use invoker::{InvokeError, Invoker, Invokers, LlmInvoker, TemplateInvoker, chat_messages};
pub use meta::TemplateInvokers;
pub use routes::routes;
pub use service::{
    AiProgress, AiResponse, FlowDeps, FlowService, MAX_USER_SESSIONS, POLL_WAIT, TaskState,
};
pub use tasks::register as register_handlers;

/// What the flow routes and task handlers share: the one flow service.
pub type Flows = std::sync::Arc<FlowService>;
