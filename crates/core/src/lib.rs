//! Pure state machines of Parlance: no I/O, no async, no clock reads, no randomness.
//!
#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(feature = "adoption")]
pub mod adoption;
#[cfg(feature = "turn")]
pub mod agent;
#[cfg(feature = "conversation")]
pub mod conversation;
#[cfg(feature = "flow")]
pub mod flow;
pub mod id;
pub mod machine;
pub mod outcome;
pub mod queue;
#[cfg(feature = "session")]
pub mod session;
pub mod storable;
pub mod structured;
pub mod table;
pub mod time;
#[cfg(feature = "turn")]
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
