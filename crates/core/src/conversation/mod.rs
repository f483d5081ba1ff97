//! The conversation instance lifecycle: one conversation between an agent and
//! one contact, from creation to a terminal state.
//!
//! An [`Instance`] is a plain value. Each command takes `now` and returns
//! either a [`ConversationError`] (instance unchanged) or an [`Outcome`] with
//! the transitions made and the [`Effect`]s the shell must carry out:
//! messages to append to the transcript and deliver, agent tasks to enqueue,
//! queued instances to promote, operators to notify. The heartbeat timer is a
//! field ([`Instance::next_deadline`]) armed and cleared by the same command
//! that changes the state, so a store writes both in one statement.

mod instance;
mod state;
#[cfg(test)]
mod tests;

pub use instance::{
    ConversationError, DEFAULT_HEARTBEAT_S, DEFAULT_MAX_FOLLOW_UPS, Effect, Instance, Message,
    NewInstance, Role, Todo,
};
pub use state::{CREATION, ConversationState, TABLE};

/// What a command returns on success.
pub type Outcome = crate::Outcome<ConversationState, Effect>;

crate::string_id!(
    /// A contact: the person a conversation is with (a phone number, a chat
    /// handle), unique within a product.
    ContactId,
    "contact id",
    max = 256,
    chars = |c: char| !c.is_whitespace() || c == ' '
);

crate::uuid_id!(
    /// A conversation instance.
    InstanceId
);
