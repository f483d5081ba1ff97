//! Conversation instances as a service: commands through the executor,
//! effects through the channel and the task queue, and the HTTP routes.

mod agent;
mod routes;
mod service;
mod sweeper;
mod webhook;

use std::sync::Arc;

use parlance_core::conversation::Instance;
use parlance_ports::{Channel, ConversationStore, MachineStore};

pub use agent::{offline_hand_off, register as register_handlers};
pub use routes::routes;
pub use service::{create, run};
pub use sweeper::{spawn as spawn_sweeper, sweep_once};
pub use webhook::{ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, WebhookChannel};

use crate::state::Shared;

/// What the conversation routes, task handlers and sweeper share.
#[derive(Clone)]
pub struct Conversations {
    /// Time, ids, the audit log, the queue, the model.
    pub shared: Shared,
    /// Conversation instances: every command is committed here.
    pub store: Arc<dyn MachineStore<Instance>>,
    /// Listings, transcripts, due heartbeats and delivery keys.
    pub index: Arc<dyn ConversationStore>,
    /// Where outbound messages go.
    pub channel: Arc<dyn Channel>,
}
