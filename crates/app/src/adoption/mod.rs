//! User adoption state over HTTP: the record, activity and events, the
//! explore-first gate, the prompt block, onboarding plans and tour catalogs.
//!
//! Every change to a record is one [`AdoptionCommand`] decided by the core
//! machine and committed through the executor (load -> decide -> commit,
//! decided again on a lost race), so a journey change and its audit entry
//! are written together or not at all. A replacement snapshot (`PUT`) is
//! the one exception to the retry: it names the version it replaces, and a
//! moved record is the client's conflict. The LLM runners ([`runners`]:
//! judge, tour match, welcome, follow-up, session summary) build the
//! prompt, call the model and parse the answer with the core's
//! never-failing parsers, then send the answer's command. Services return
//! typed errors; the routes alone turn them into answers.
//!
//! [`AdoptionCommand`]: parlance_core::adoption::AdoptionCommand

mod routes;
pub mod runners;
mod schema;
pub(crate) mod service;

use std::sync::Arc;

use parlance_core::adoption::UserAdoptionState;
use parlance_ports::{AdoptionStore, MachineStore};

pub use routes::routes;

use crate::state::Shared;

/// What the adoption routes and runners share.
#[derive(Clone)]
pub struct Adoptions {
    /// Time, ids, the audit log, the model.
    pub shared: Shared,
    /// User adoption records, loaded and committed.
    pub records: Arc<dyn MachineStore<UserAdoptionState>>,
    /// Deleting records; onboarding plans and tour catalogs.
    pub store: Arc<dyn AdoptionStore>,
}
