//! The one error type of the adoption machine.

use crate::machine::{ErrorClass, MachineError, NotAllowed};
use crate::time::TimestampError;

use super::model::one_line;
use super::snapshot::DecodeError;

/// Why the adoption machine refused a command (the state is unchanged).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum AdoptionError {
    /// The state does not allow the command: the explore-first gate closed
    /// before a welcome could be recorded (the reason is the gate's code).
    #[error(transparent)]
    NotAllowed(#[from] NotAllowed),
    /// NaN or an infinity where a number is clamped into a range.
    #[error("{field} is not a finite number")]
    NotFinite {
        /// Which argument.
        field: &'static str,
    },
    /// A duration or count that must be a finite number, not negative.
    #[error("{field} must be a finite number, not negative")]
    Negative {
        /// Which argument.
        field: &'static str,
    },
    /// An id that must not be blank.
    #[error("{field} must not be blank")]
    Blank {
        /// Which argument.
        field: &'static str,
    },
    /// A step was reported for a workflow that has no progress yet.
    #[error("no progress for workflow {workflow_id}")]
    NoWorkflowProgress {
        /// The workflow.
        workflow_id: String,
    },
    /// A tour's workflow is not in the user's onboarding plan.
    #[error(
        "workflow {} is not in this user's onboarding plan",
        one_line(workflow_id)
    )]
    NotInPlan {
        /// The workflow.
        workflow_id: String,
    },
    /// A number that is not a representable instant.
    #[error("{field}: {reason}")]
    BadTimestamp {
        /// Which argument.
        field: &'static str,
        /// What is wrong with it.
        reason: TimestampError,
    },
    /// An instant that lies after the time of the decision.
    #[error("{field} must not be after now")]
    InTheFuture {
        /// Which argument.
        field: &'static str,
    },
    /// A replacement snapshot does not decode.
    #[error("snapshot rejected: {0}")]
    Snapshot(DecodeError),
    /// A replacement snapshot names another user than the record's.
    #[error("state.user_id does not match the path")]
    OtherUser,
    /// One event of a batch was refused, so none was applied.
    #[error("events[{index}]: {error}")]
    Event {
        /// The event's position in the batch, from 0.
        index: usize,
        /// Why it was refused.
        error: Box<AdoptionError>,
    },
}

impl MachineError for AdoptionError {
    fn class(&self) -> ErrorClass {
        match self {
            AdoptionError::NotAllowed(_) => ErrorClass::NotAllowed,
            AdoptionError::Event { error, .. } => error.class(),
            AdoptionError::NotFinite { .. }
            | AdoptionError::Negative { .. }
            | AdoptionError::Blank { .. }
            | AdoptionError::NoWorkflowProgress { .. }
            | AdoptionError::NotInPlan { .. }
            | AdoptionError::BadTimestamp { .. }
            | AdoptionError::InTheFuture { .. }
            | AdoptionError::Snapshot(_)
            | AdoptionError::OtherUser => ErrorClass::Invalid,
        }
    }

    fn not_allowed(&self) -> Option<&NotAllowed> {
        match self {
            AdoptionError::NotAllowed(n) => Some(n),
            AdoptionError::Event { error, .. } => error.not_allowed(),
            _ => None,
        }
    }

    /// The request field an answer names: the argument of a blank, negative
    /// or future value, the snapshot path of a rejected snapshot.
    fn field(&self) -> Option<&str> {
        match self {
            AdoptionError::Negative { field }
            | AdoptionError::Blank { field }
            | AdoptionError::InTheFuture { field } => Some(field),
            AdoptionError::NotInPlan { .. } => Some("workflow_id"),
            AdoptionError::Snapshot(e) => Some(&e.path),
            AdoptionError::OtherUser => Some("$.user_id"),
            AdoptionError::Event { error, .. } => error.field(),
            AdoptionError::NotAllowed(_)
            | AdoptionError::NotFinite { .. }
            | AdoptionError::NoWorkflowProgress { .. }
            | AdoptionError::BadTimestamp { .. } => None,
        }
    }
}
