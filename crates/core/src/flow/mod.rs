//! Flows: state machines of user and invoker states with a data model,
//! declared in Rust or in YAML/JSON files.
//!
//! [`Flow`] is a validated flow. Its operations ([`Flow::start`],
//! [`Flow::fire`], [`Flow::complete`], [`Flow::fail`], [`Flow::retry`],
//! [`Flow::cancel`]) are pure: they take the session, its dialogue and `now`,
//! and return the new session, the dialogue elements to append and the task
//! DAG plan to enqueue, or a typed [`FlowError`] with nothing changed.
//! Templates and expressions are minijinja, rendered from in-memory sources.

pub mod dag;
pub mod def;
pub mod dialogue;
pub mod engine;

pub use dag::{DagPlan, PlanTask, TaskKind};
pub use def::{
    Condition, FlowDef, FlowProblem, ModelField, StateDef, StateKind, TemplateRef, TransitionDef,
};
pub use dialogue::{Actor, DialogueElement, DialogueFormat, Persistence, format_dialogue};
pub use engine::{
    Fired, Flow, FlowBuilder, FlowError, FlowSession, HookContext, HookFn, HookPoint, HookScope,
    MAX_DIALOGUE, MAX_RENDER_BYTES, ON_COMPLETE, ON_ERROR, RESERVED_EVENTS, Running, TEMPLATE_FUEL,
    TaskError, ValidatorContext, ValidatorFn,
};

#[cfg(test)]
mod tests;
