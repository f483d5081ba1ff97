//! Pure state machines of Parlance: the domain layer.
//!
//! Layer: bottom. Every other crate may depend on this one; it depends only on
//! serde, serde_json, thiserror, uuid (the type, never its generators) and
//! pure-computation crates. It never awaits, never reads a clock, never does
//! I/O and never draws random numbers: time arrives as a [`Timestamp`]
//! argument, and each operation returns an [`Outcome`] listing the transitions
//! that happened and the effects the caller must carry out.

#![forbid(unsafe_code)]

pub mod adoption;
pub mod agent;
pub mod conversation;
pub mod flow;
pub mod id;
pub mod machine;
pub mod outcome;
pub mod queue;
pub mod session;
pub mod storable;
pub mod structured;
pub mod table;
pub mod time;
pub mod turn;

pub use id::{IdError, ProductId};
pub use machine::Transition;
pub use machine::{
    Command, Decision, EntityKey, EntityKind, ErrorClass, Machine, MachineError, NotAllowed, Task,
};
pub use outcome::{Outcome, StateChange};
pub use structured::{
    StructuredError, Violation, extract_json, extract_valid, find_json_values, parse_structured,
    validate,
};
pub use table::{Edge, TransitionTable};
pub use time::{Timestamp, TimestampError};
