//! User adoption state over HTTP: the record, activity and events, the
//! explore-first gate, the prompt block, onboarding plans and tour catalogs.
//!
//! Handlers parse the request, then run the pure core through
//! `service::update` (load -> apply -> compare-and-swap save, retried on a
//! lost race). The LLM runners (judge, tour match, welcome) plug into the
//! same cycle: build the prompt input, call the model, parse the answer with
//! the core's never-failing parsers, apply it inside `update`.

mod routes;
pub(crate) mod service;

pub use routes::routes;
