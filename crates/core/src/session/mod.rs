//! The session assistance machine: thinking, proactive, reactive.
//!
//! One live session's mode with its interaction timeout, cooldown, tour
//! overrides and conversation routing ([`SessionState`]), the per-product
//! [`TourCatalog`], the transition table ([`TRANSITIONS`]) and the `_v: 2`
//! snapshot with its validating decoder ([`DecodeError`]). The session is a
//! [`Machine`](crate::Machine): keyed by [`SessionKey`], changed by a
//! [`SessionCommand`] (a tick, the sweeper's tick, or a [`SessionEvent`]),
//! each decision reporting a [`SessionReport`].
//!
//! Rules: `tick` is the only exit from the active states, when the time since
//! the last interaction is strictly greater than the timeout; a cooldown ends
//! once its elapsed time is greater than or equal to its period; proactive
//! offers start only from `thinking` without a running cooldown; the user
//! opening the chat is always allowed from `thinking` and clears the cooldown.

mod machine;
mod snapshot;
#[cfg(test)]
mod snapshot_walk;
mod state;
mod table;
mod tours;

#[cfg(test)]
mod tests;

pub use machine::{SessionCommand, SessionEvent, SessionKey, SessionReport};
pub use snapshot::{DecodeError, SNAPSHOT_REQUIRED_KEYS, SNAPSHOT_VERSION};
pub use state::{
    AssistState, ConversationEvent, CooldownChange, DEFAULT_COOLDOWN_PERIOD_S,
    DEFAULT_INTERACTION_TIMEOUT_S, DeliveryRoute, ProactiveState, ReactiveState, SessionError,
    SessionId, SessionOutcome, SessionState, ThinkingState,
};
pub use table::TRANSITIONS;
pub use tours::{
    CATALOG_DEFAULT_COOLDOWN_PERIOD_S, CATALOG_DEFAULT_INTERACTION_TIMEOUT_S, TourCatalog,
    TourDefinition, TourRegistry,
};
