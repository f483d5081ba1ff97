//! The conversation instance lifecycle: one conversation between an agent and
//! one contact, from creation to a terminal state.
//!
//! An [`Instance`] is a plain value and a [`Machine`](crate::Machine): every
//! change goes through [`Machine::decide`](crate::Machine::decide) with a
//! [`ConversationCommand`] and `now`, and returns either a
//! [`ConversationError`] (instance unchanged) or a
//! [`Decision`](crate::Decision): the transitions made (one audit entry
//! each, a late reply and the creation included), the tasks to commit with
//! the state (agent turns and follow-ups, one pending per instance; one
//! delivery per outbound message) and the [`ConversationEffect`]s:
//! transcript lines the store writes with the state, the promotion of the
//! contact's next queued instance, operators to notify. The heartbeat timer
//! is a field ([`Instance::next_deadline`]) armed and cleared by the same
//! command that changes the state, so a store writes both in one statement.

mod command;
mod instance;
mod state;
#[cfg(test)]
mod tests;

pub use command::{
    ConversationCommand, ConversationContext, ConversationEffect, ConversationError,
    ConversationKey, DELIVER_KIND, FOLLOW_UP_KIND, HANDED_BACK, TURN_KIND,
};
pub use instance::{
    DEFAULT_HEARTBEAT_S, DEFAULT_MAX_FOLLOW_UPS, Instance, Message, NewInstance, Role, Todo,
};
pub use state::{CREATION, ConversationState, TABLE};

crate::id::string_id!(
    /// A contact: the person a conversation is with (a phone number, a chat
    /// handle), unique within a product.
    ContactId,
    "contact id",
    max = 256,
    chars = |c: char| !c.is_whitespace() || c == ' ',
    pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F\\u00A0\\u1680\\u2000-\\u200A\\u2028\\u2029\\u202F\\u205F\\u3000]+$"
);

crate::id::uuid_id!(
    /// A conversation instance.
    InstanceId
);
