//! The result of a machine operation: what happened and what the shell must do.
//!
//! Machines never perform effects. An operation returns `Ok(Outcome)` listing
//! the transitions it made (for the audit log) and the effects the caller must
//! carry out through ports (deliver a message, arm a timer, enqueue a task), or
//! a typed error with the machine unchanged.

use serde::Serialize;

/// One typed state change with its cause, as an operation reports it
/// (the audit log records it as a [`crate::machine::Transition`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StateChange<S> {
    /// The state before.
    pub from: S,
    /// The state after.
    pub to: S,
    /// The command or event that caused it, as a stable snake_case name.
    pub cause: &'static str,
}

/// What an operation did: transitions made and effects requested, in order.
///
/// A machine's lower-level operations return one; the caller records the
/// transitions and carries out the effects:
///
/// ```
/// use parlance_core::{Outcome, StateChange};
///
/// #[derive(Debug, Clone, Copy, PartialEq)]
/// enum Light { Off, On }
///
/// let mut outcome: Outcome<Light, &str> = Outcome::none();
/// assert!(outcome.is_empty());
///
/// outcome
///     .transition(Light::Off, Light::Off, "noop") // no change: not recorded
///     .transition(Light::Off, Light::On, "switch")
///     .effect("notify");
///
/// assert_eq!(
///     outcome.transitions,
///     [StateChange { from: Light::Off, to: Light::On, cause: "switch" }]
/// );
/// assert_eq!(outcome.effects, ["notify"]);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome<S, E> {
    /// State changes, oldest first. Empty when the state did not change.
    pub transitions: Vec<StateChange<S>>,
    /// Effects for the shell to execute, in order.
    pub effects: Vec<E>,
}

impl<S, E> Default for Outcome<S, E> {
    fn default() -> Self {
        Self {
            transitions: Vec::new(),
            effects: Vec::new(),
        }
    }
}

impl<S: PartialEq, E> Outcome<S, E> {
    /// An outcome with nothing in it.
    pub fn none() -> Self {
        Self::default()
    }

    /// Records a transition (a no-op when `from == to`).
    pub fn transition(&mut self, from: S, to: S, cause: &'static str) -> &mut Self {
        if from != to {
            self.transitions.push(StateChange { from, to, cause });
        }
        self
    }

    /// Requests an effect.
    pub fn effect(&mut self, effect: E) -> &mut Self {
        self.effects.push(effect);
        self
    }

    /// Appends another outcome's transitions and effects after this one's.
    pub fn extend(&mut self, other: Outcome<S, E>) -> &mut Self {
        self.transitions.extend(other.transitions);
        self.effects.extend(other.effects);
        self
    }

    /// True when nothing happened and nothing is to be done.
    pub fn is_empty(&self) -> bool {
        self.transitions.is_empty() && self.effects.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_transitions_are_not_recorded() {
        let mut o: Outcome<u8, &str> = Outcome::none();
        o.transition(1, 1, "noop")
            .transition(1, 2, "go")
            .effect("send");
        assert_eq!(
            o.transitions,
            vec![StateChange {
                from: 1,
                to: 2,
                cause: "go"
            }]
        );
        assert_eq!(o.effects, vec!["send"]);
        assert!(!o.is_empty());
    }
}
