//! The session machine's transition table, as data.

use crate::table::{Edge, TransitionTable};

/// States, allowed transitions and the operation causing each. `tick` is
/// the only way out of the active states; `proactive_assistance` and
/// `reactive_assistance` never connect directly.
pub const TRANSITIONS: TransitionTable = TransitionTable {
    machine: "session",
    states: &["thinking", "proactive_assistance", "reactive_assistance"],
    terminal: &[],
    edges: &[
        Edge {
            from: "thinking",
            to: "proactive_assistance",
            cause: "transition_to_proactive",
        },
        Edge {
            from: "thinking",
            to: "reactive_assistance",
            cause: "transition_to_reactive",
        },
        Edge {
            from: "proactive_assistance",
            to: "thinking",
            cause: "tick",
        },
        Edge {
            from: "reactive_assistance",
            to: "thinking",
            cause: "tick",
        },
    ],
};
