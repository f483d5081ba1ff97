//! Flows: state machines of user and invoker states with a data model,
//! declared in Rust or in YAML/JSON files.
//!
//! [`Flow`] is a validated flow. A session with its dialogue is a
//! [`FlowRecord`], the flow [`Machine`](crate::Machine): every change is a
//! [`FlowCommand`] decided with a [`FlowContext`] (the flow and the DAG
//! runner's options), which either refuses with a typed [`FlowError`] and
//! changes nothing, or moves the session and reports the transition, the
//! task-queue DAG to enqueue and the dialogue and progress to write with it.
//! Templates and expressions are minijinja, rendered from in-memory sources.

pub mod dag;
pub mod def;
pub mod dialogue;
pub mod engine;
mod limits;
pub mod machine;
pub mod pyjson;
pub mod queue;
pub mod user;
mod validators;

pub use dag::{DagPlan, PlanTask, TaskKind};
pub use def::{
    Condition, FlowDef, FlowProblem, HookAction, HookActionKind, HookDecl, ModelField, StateDef,
    StateKind, TemplateRef, TransitionDef, ValidatorDef, ValidatorRule,
};
pub use dialogue::{Actor, DialogueElement, DialogueFormat, Persistence, format_dialogue};
pub use engine::{
    Flow, FlowBuilder, FlowError, FlowSession, HookContext, HookFn, HookPoint, HookScope,
    MAX_DIALOGUE, MAX_EVAL_BYTES, MAX_RENDER_BYTES, MAX_SEQUENCE_ITEMS, MAX_VALUE_BYTES,
    ON_COMPLETE, ON_ERROR, RESERVED_EVENTS, Running, TEMPLATE_FUEL, TaskError, ValidatorContext,
    ValidatorFn, reason,
};
pub use machine::{
    ClientEvent, FlowCommand, FlowContext, FlowEffect, FlowKey, FlowRecord, FlowSessionId,
    ProgressUpdate, cause,
};
pub use queue::{ContextRef, DagJob, RunnerOptions};
pub use user::{CustomProperties, Email, PersonName, User, UserError};

#[cfg(test)]
mod declared_tests;
#[cfg(test)]
mod tests;
