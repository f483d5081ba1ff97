//! Transition tables as data, and their Mermaid rendering.
//!
//! Each machine lists its states and allowed transitions in a
//! [`TransitionTable`]. Tests check the code against the table, and the docs
//! render it as a diagram, so the two cannot drift.

use std::fmt::Write as _;

/// One allowed transition and the command that causes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Edge {
    /// Source state (wire value).
    pub from: &'static str,
    /// Target state (wire value).
    pub to: &'static str,
    /// The command or event that causes it.
    pub cause: &'static str,
}

/// A machine's states and allowed transitions.
///
/// Each machine publishes its table as a constant; a table answers whether
/// a transition is allowed and renders itself as a Mermaid diagram:
///
/// ```
/// use parlance_core::{Edge, TransitionTable};
///
/// const DOOR: TransitionTable = TransitionTable {
///     machine: "door",
///     states: &["closed", "open", "removed"],
///     terminal: &["removed"],
///     edges: &[
///         Edge { from: "closed", to: "open", cause: "open" },
///         Edge { from: "open", to: "closed", cause: "close" },
///         Edge { from: "closed", to: "removed", cause: "remove" },
///     ],
/// };
///
/// assert!(DOOR.allows("closed", "open", "open"));
/// assert!(!DOOR.allows("open", "closed", "open"));
/// assert!(DOOR.connects("closed", "removed"));
///
/// let diagram = DOOR.to_mermaid();
/// assert!(diagram.starts_with("stateDiagram-v2\n    [*] --> closed\n"));
/// assert!(diagram.contains("closed --> open: open"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransitionTable {
    /// The machine's name, as used in docs.
    pub machine: &'static str,
    /// Every state (wire values), initial first.
    pub states: &'static [&'static str],
    /// States no transition leaves.
    pub terminal: &'static [&'static str],
    /// Every allowed transition.
    pub edges: &'static [Edge],
}

impl TransitionTable {
    /// True when `from -> to` caused by `cause` is in the table.
    pub fn allows(&self, from: &str, to: &str, cause: &str) -> bool {
        self.edges
            .iter()
            .any(|e| e.from == from && e.to == to && e.cause == cause)
    }

    /// True when some edge goes from `from` to `to`, whatever its cause.
    pub fn connects(&self, from: &str, to: &str) -> bool {
        self.edges.iter().any(|e| e.from == from && e.to == to)
    }

    /// A Mermaid `stateDiagram-v2` of the table: the initial state first
    /// (or the edges from `[*]`, when the table names how states are created),
    /// terminal states to `[*]`, one line per edge with its cause, edges that
    /// share endpoints merged into one label.
    pub fn to_mermaid(&self) -> String {
        let mut out = String::from("stateDiagram-v2\n");
        // Tables that name their creation edges (from `[*]`) label them;
        // the others start at their first state.
        if !self.edges.iter().any(|e| e.from == "[*]")
            && let Some(first) = self.states.first()
        {
            let _ = writeln!(out, "    [*] --> {}", mermaid_id(first));
        }
        let mut seen: Vec<(&str, &str, Vec<&str>)> = Vec::new();
        for e in self.edges {
            match seen.iter_mut().find(|(f, t, _)| *f == e.from && *t == e.to) {
                Some((_, _, causes)) => {
                    if !causes.contains(&e.cause) {
                        causes.push(e.cause);
                    }
                }
                None => seen.push((e.from, e.to, vec![e.cause])),
            }
        }
        for (from, to, causes) in seen {
            let _ = writeln!(
                out,
                "    {} --> {}: {}",
                mermaid_id(from),
                mermaid_id(to),
                causes.join(", ")
            );
        }
        for t in self.terminal {
            let _ = writeln!(out, "    {} --> [*]", mermaid_id(t));
        }
        out
    }
}

/// Mermaid state ids may not contain spaces or dashes; `[*]` (the start)
/// stays as it is.
fn mermaid_id(state: &str) -> String {
    if state == "[*]" {
        return state.to_owned();
    }
    state
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: TransitionTable = TransitionTable {
        machine: "door",
        states: &["closed", "open", "broken-down"],
        terminal: &["broken-down"],
        edges: &[
            Edge {
                from: "closed",
                to: "open",
                cause: "push",
            },
            Edge {
                from: "closed",
                to: "open",
                cause: "pull",
            },
            Edge {
                from: "open",
                to: "closed",
                cause: "close",
            },
            Edge {
                from: "open",
                to: "broken-down",
                cause: "kick",
            },
        ],
    };

    #[test]
    fn renders_mermaid() {
        assert_eq!(
            TABLE.to_mermaid(),
            "stateDiagram-v2\n    [*] --> closed\n    closed --> open: push, pull\n    \
             open --> closed: close\n    open --> broken_down: kick\n    broken_down --> [*]\n"
        );
    }

    #[test]
    fn answers_membership() {
        assert!(TABLE.allows("closed", "open", "pull"));
        assert!(!TABLE.allows("open", "closed", "pull"));
        assert!(TABLE.connects("open", "broken-down"));
        assert!(!TABLE.connects("broken-down", "open"));
    }
}
