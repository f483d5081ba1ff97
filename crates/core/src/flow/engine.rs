//! The validated flow and its transition engine.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::sync::Arc;

use minijinja::Environment;
use minijinja::value::Serde;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::dag::{self, DagPlan};
use super::def::{
    Condition, FlowDef, FlowProblem, HookActionKind, HookDecl, ModelField, StateDef, StateKind,
    TemplateRef, TransitionDef,
};
use super::dialogue::{Actor, DialogueElement, DialogueFormat, Persistence, format_dialogue};
use super::limits;
use super::machine::{FlowSessionId, cause};
use super::user::User;
use super::validators;
use crate::Timestamp;
use crate::machine::{ErrorClass, MachineError, Name, NotAllowed, Transition};

/// Events the API handles itself; a flow may not declare them.
pub const RESERVED_EVENTS: [&str; 3] = ["poll", "cancel", "retry"];
/// The event a failed DAG fires, when the invoker state declares it.
pub const ON_ERROR: &str = "on_error";
/// The event a finished DAG fires, when the invoker state declares it.
pub const ON_COMPLETE: &str = "on_complete";

/// Where a hook runs in a transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HookPoint {
    /// After validators, conditions and the engine's own bookkeeping.
    Before,
    /// On leaving the source (skipped by internal transitions).
    Exit,
    /// Before the state changes (after `assign` actions).
    On,
    /// On entering the target (skipped by internal transitions).
    Enter,
    /// Last, before the engine records the assistant half.
    After,
}

/// Which transitions a hook applies to.
///
/// Within a hook point, hooks run by scope: every transition's first, then
/// one transition's, then an event's or a state's; in the `after` group the
/// order is reversed but for the transition's, which still comes before
/// the event's (as python-statemachine orders `after=`, `after_<event>`,
/// `after_transition`). Within a scope, hooks declared in the flow
/// definition ([`FlowDef::hooks`]) run before hooks added in Rust, each in
/// the order declared or added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookScope {
    /// Every transition (`before_transition`, `on_enter_state`, ...).
    Any,
    /// The transition declared at this index of [`FlowDef::transitions`]
    /// (the reference's `before=` / `after=` on one transition).
    Transition(usize),
    /// Transitions of this event (`before_<event>`, ...).
    Event(String),
    /// Exit or enter of this state (`on_exit_<state>`, `on_enter_<state>`).
    State(String),
}

/// What a hook sees and may change.
pub struct HookContext<'a> {
    /// Where it runs.
    pub point: HookPoint,
    /// The event.
    pub event: &'a str,
    /// The source state.
    pub source: &'a str,
    /// The target state.
    pub target: &'a str,
    /// The session as it is at this point (its `state` is the source until
    /// the state update, the target after).
    pub session: &'a mut FlowSession,
    /// Dialogue persistence for this transition only; setting it changes the
    /// halves not yet recorded.
    pub persistence: &'a mut Persistence,
}

/// A hook: an error message aborts the transition with nothing saved.
pub type HookFn = Arc<dyn Fn(&mut HookContext<'_>) -> Result<(), String> + Send + Sync>;

/// What a validator sees.
pub struct ValidatorContext<'a> {
    /// The event.
    pub event: &'a str,
    /// The event's input.
    pub input: &'a str,
    /// The session before the transition.
    pub session: &'a FlowSession,
}

/// A validator: an error message aborts the event (later candidates are not
/// tried).
pub type ValidatorFn = Arc<dyn Fn(&ValidatorContext<'_>) -> Result<(), String> + Send + Sync>;

#[derive(Clone)]
struct Hook {
    point: HookPoint,
    scope: HookScope,
    body: HookBody,
}

/// What a hook runs.
#[derive(Clone)]
enum HookBody {
    /// The actions of [`FlowDef::hooks`] at this index.
    Declared(usize),
    /// A Rust closure.
    Rust(HookFn),
}

/// The transition (or session start) hooks run for.
struct HookRun<'a> {
    event: &'a str,
    source: &'a str,
    target: &'a str,
    /// The index of the transition taken (none at session start).
    transition: Option<usize>,
    /// The dialogue as declared hooks' expressions see it.
    dialogue: &'a [DialogueElement],
    now: Timestamp,
}

/// A task failure recorded on the session; the list is cleared by the next
/// successful transition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema), schema(as = FlowTaskError))]
pub struct TaskError {
    /// The DAG run that failed.
    pub invocation_id: String,
    /// Which task (or `complete` when no transition accepted the result).
    pub task: String,
    /// What went wrong.
    pub message: String,
}

/// The DAG a session is waiting for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Running {
    /// The run.
    pub invocation_id: String,
    /// The invoker chain it belongs to.
    pub chain_id: String,
    /// The invoker state it runs for.
    pub state: String,
    /// The executor's handle of the run (the task queue's DAG id), set when
    /// the run is enqueued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dag_id: Option<i64>,
}

/// A flow session's state (the dialogue is kept apart, append-only).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowSession {
    /// The session id.
    pub session_id: FlowSessionId,
    /// The flow's name.
    pub flow: String,
    /// The current state.
    pub state: String,
    /// The flow's own model fields.
    pub model: Map<String, Value>,
    /// `user` when the last transition left a user state, else `assistant`.
    pub actor: Option<Actor>,
    /// The last transition's input: the user's text or the DAG result.
    pub actor_input: String,
    /// Kind of the last transition's source.
    pub source_type: Option<StateKind>,
    /// Kind of the last transition's target.
    pub target_type: Option<StateKind>,
    /// Task failures since the last successful transition.
    pub errors: Vec<TaskError>,
    /// The DAG being waited for, if any.
    pub running: Option<Running>,
    /// Where `cancel` returns to.
    pub last_user_state: String,
    /// The user the session was started for, if one was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_info: Option<User>,
    /// The seed data given at start: set only while the session starts
    /// (the initial state's enter hooks and the greeting see it), then
    /// cleared, so it is never stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed_data: Option<String>,
    /// Started by `start_ephemeral_session`; kept like any other session.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ephemeral: bool,
}

/// The reason codes of [`FlowError::NotAllowed`]: why a command is not
/// allowed in the session's state, beyond "no transition for this event"
/// (which has no reason code).
pub mod reason {
    /// A task graph is running: only `poll` and `cancel` are accepted.
    pub const DAG_RUNNING: &str = "dag_running";
    /// The event is the invoker state's completion event (or `on_error`):
    /// only the engine fires it.
    pub const RESERVED_FOR_ENGINE: &str = "reserved_for_engine";
    /// `retry` is offered only in an invoker state with nothing running.
    pub const RETRY_NOT_OFFERED: &str = "retry_not_offered";
    /// `cancel` with no task graph running.
    pub const NOTHING_RUNNING: &str = "nothing_running";
    /// A completion or failure of a task graph that is not the one the
    /// session waits for (cancelled or superseded): its result is dropped.
    pub const STALE_INVOCATION: &str = "stale_invocation";
    /// `start` on a session that exists.
    pub const SESSION_EXISTS: &str = "session_exists";
}

/// Why an operation was refused; the session is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FlowError {
    /// The flow definition is wrong.
    #[error("invalid flow: {}", join_problems(.0))]
    Invalid(Vec<FlowProblem>),
    /// The command is not allowed in the session's state: no transition for
    /// the event accepts it (no reason code), or a [`reason`] code.
    #[error("{}", not_allowed_message(.0))]
    NotAllowed(NotAllowed),
    /// A validator refused the input.
    #[error("validator `{validator}` refused the input: {message}")]
    Validator {
        /// Which validator.
        validator: String,
        /// Its message.
        message: String,
    },
    /// A hook returned an error.
    #[error("{point:?} hook failed: {message}")]
    Hook {
        /// Where.
        point: HookPoint,
        /// Its message.
        message: String,
    },
    /// A `fail` action of a hook declared in the flow definition refused
    /// the event.
    #[error("hook `{hook}` refused the event: {message}")]
    HookFail {
        /// Where the action is declared (`states[1].on_enter[0]`).
        hook: String,
        /// The action's message.
        message: String,
    },
    /// A template or expression went over a limit: [`TEMPLATE_FUEL`]
    /// instructions, [`MAX_RENDER_BYTES`] of output, or a size limit on
    /// what it builds ([`MAX_VALUE_BYTES`], [`MAX_SEQUENCE_ITEMS`],
    /// [`MAX_EVAL_BYTES`]), refused before the value is built.
    #[error("rendering `{what}` went over its limit of {limit}")]
    RenderLimit {
        /// The template name or expression.
        what: String,
        /// The limit, with its unit.
        limit: String,
    },
    /// The session's dialogue holds [`MAX_DIALOGUE`] elements: it takes no
    /// more user events.
    #[error("the dialogue holds {len} elements, the most a session may hold")]
    DialogueFull {
        /// How many elements it holds.
        len: usize,
    },
    /// An expression (`cond`, `unless`, `assign`, a map's `over`) failed on
    /// the data it was given: the expressions compile when the flow is
    /// loaded, so this is the data's doing.
    #[error("evaluating `{expr}` failed: {message}")]
    Expression {
        /// The expression.
        expr: String,
        /// The evaluator's message.
        message: String,
    },
    /// A template failed on the data it was given (a filter applied to a
    /// value of the wrong type, `|int` on text, a division by zero, a call
    /// of something that is not there, an include of a template named by
    /// the data that the flow does not have): the templates compile and
    /// their filters and tests exist when the flow is loaded, so this is the
    /// data's doing.
    #[error("rendering `{what}` failed on its data: {message}")]
    Template {
        /// The template name.
        what: String,
        /// The renderer's message.
        message: String,
    },
    /// A template the flow was loaded with cannot be rendered at all (it
    /// is not in the flow's environment, or its output is not text): the
    /// engine's fault, never the data's. A template that names a filter or
    /// test the flow does not have does not load.
    #[error("rendering `{what}` failed: {message}")]
    Render {
        /// The template name.
        what: String,
        /// The renderer's message.
        message: String,
    },
    /// The session belongs to another flow than the one it was decided with.
    #[error("the session runs flow `{session}`, not `{flow}`")]
    OtherFlow {
        /// The session's flow.
        session: String,
        /// The flow it was decided with.
        flow: String,
    },
}

impl FlowError {
    /// `command` is not allowed in `state`, for `reason` (a [`reason`] code,
    /// or `None` when no transition accepts the event).
    pub fn not_allowed(
        command: impl Into<Name>,
        state: impl Into<Name>,
        reason: Option<&'static str>,
    ) -> Self {
        let mut n = NotAllowed::new(command, state);
        n.reason = reason;
        FlowError::NotAllowed(n)
    }

    /// The not-allowed refusal's reason code, if this is one.
    pub fn reason(&self) -> Option<&'static str> {
        match self {
            FlowError::NotAllowed(n) => n.reason,
            _ => None,
        }
    }
}

impl MachineError for FlowError {
    fn class(&self) -> ErrorClass {
        match self {
            FlowError::NotAllowed(_) => ErrorClass::NotAllowed,
            FlowError::Validator { .. }
            | FlowError::Hook { .. }
            | FlowError::HookFail { .. }
            | FlowError::Expression { .. }
            | FlowError::Template { .. } => ErrorClass::Invalid,
            FlowError::RenderLimit { .. } | FlowError::DialogueFull { .. } => {
                ErrorClass::LimitExceeded
            }
            FlowError::Invalid(_) | FlowError::Render { .. } | FlowError::OtherFlow { .. } => {
                ErrorClass::Internal
            }
        }
    }

    fn not_allowed(&self) -> Option<&NotAllowed> {
        match self {
            FlowError::NotAllowed(n) => Some(n),
            _ => None,
        }
    }

    fn field(&self) -> Option<&str> {
        match self {
            FlowError::Validator { .. } => Some("event_input"),
            _ => None,
        }
    }
}

/// The message of a not-allowed refusal, by reason.
fn not_allowed_message(n: &NotAllowed) -> String {
    let (command, state) = (&n.command, &n.state);
    match n.reason {
        None => format!("event `{command}` is not allowed in state `{state}`"),
        Some(reason::DAG_RUNNING) => {
            format!("a task graph is running in state `{state}`; poll or cancel")
        }
        Some(reason::RESERVED_FOR_ENGINE) => {
            format!("event `{command}` is fired by the engine when the task graph finishes")
        }
        Some(reason::RETRY_NOT_OFFERED) => format!("nothing to retry in state `{state}`"),
        Some(reason::NOTHING_RUNNING) => {
            format!("no task graph is running in state `{state}`")
        }
        Some(reason::STALE_INVOCATION) => {
            format!("`{command}` names a task graph that is not running in state `{state}`")
        }
        Some(reason::SESSION_EXISTS) => "the session exists already".to_owned(),
        Some(_) => n.to_string(),
    }
}

/// Instructions one render or expression may run (minijinja fuel): a
/// template that loops for ever stops with [`FlowError::RenderLimit`].
pub const TEMPLATE_FUEL: u64 = 2_000_000;

/// Bytes one render may write.
pub const MAX_RENDER_BYTES: usize = 1024 * 1024;

pub use super::limits::{MAX_EVAL_BYTES, MAX_SEQUENCE_ITEMS, MAX_VALUE_BYTES};

/// Dialogue elements one session may hold; beyond, user events are refused
/// with [`FlowError::DialogueFull`].
pub const MAX_DIALOGUE: usize = 10_000;

/// A writer that refuses to grow past [`MAX_RENDER_BYTES`].
struct Capped {
    out: Vec<u8>,
    over: bool,
}

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.out.len() + buf.len() > MAX_RENDER_BYTES {
            self.over = true;
            return Err(std::io::Error::other("render output over its limit"));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The limit error for a render or evaluation of `what` that went over its
/// fuel or a size limit, if it did.
fn limit_error(what: &str, e: &minijinja::Error) -> Option<FlowError> {
    if e.kind() == minijinja::ErrorKind::OutOfFuel {
        return Some(out_of_fuel(what));
    }
    limits::size_limit(e).map(|l| FlowError::RenderLimit {
        what: what.to_owned(),
        limit: l.0.clone(),
    })
}

/// The typed error for a failed render of the template `what`. A loaded
/// flow's templates compile and every filter and test they name exists, so
/// whatever fails while one renders depends on the data it was given (a
/// template included by a name taken from it, a filter applied to a value
/// of the wrong type, a call of something that is not there):
/// [`FlowError::Template`], whatever minijinja's error kind.
fn render_error(what: &str, e: &minijinja::Error) -> FlowError {
    if let Some(limit) = limit_error(what, e) {
        return limit;
    }
    FlowError::Template {
        what: what.to_owned(),
        message: e.to_string(),
    }
}

/// The typed error for a failed evaluation of the expression `expr`.
fn expr_error(expr: &str, e: &minijinja::Error) -> FlowError {
    if let Some(limit) = limit_error(expr, e) {
        return limit;
    }
    FlowError::Expression {
        expr: expr.to_owned(),
        message: e.to_string(),
    }
}

/// Compiles the expression `expr` with its operators guarded, to check it,
/// and checks that every filter and test it names exists.
fn check_expr(env: &Environment<'static>, expr: &str) -> Result<(), minijinja::Error> {
    let guarded = limits::guard_expr(expr)?;
    env.compile_expression(&guarded).map(drop)?;
    match limits::unknown_in_expr(env, expr)?.first() {
        Some(unknown) => Err(minijinja::Error::new(
            minijinja::ErrorKind::InvalidOperation,
            unknown.clone(),
        )),
        None => Ok(()),
    }
}

fn out_of_fuel(what: &str) -> FlowError {
    FlowError::RenderLimit {
        what: what.to_owned(),
        limit: format!("{TEMPLATE_FUEL} instructions"),
    }
}

fn join_problems(p: &[FlowProblem]) -> String {
    p.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Where a client event ends up.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Fired {
    /// The session after the transition.
    pub(crate) session: FlowSession,
    /// Dialogue elements to append, in order.
    pub(crate) appended: Vec<DialogueElement>,
    /// What the API answers: the target template rendered, for user targets.
    pub(crate) response: Option<String>,
    /// The DAG to enqueue in the same commit, for invoker targets.
    pub(crate) dag: Option<DagPlan>,
    /// The flow transition taken (its cause is the event), if one was.
    pub(crate) transition: Option<Transition>,
}

impl Fired {
    /// The session stays in its state (its run ended, no transition taken).
    pub(super) fn stays(session: FlowSession) -> Self {
        Self {
            session,
            appended: Vec::new(),
            response: None,
            dag: None,
            transition: None,
        }
    }
}

/// A validated flow, ready to run.
///
/// Loaded from a YAML (or JSON) flow file with its templates by
/// [`Flow::from_file_text`], or built in Rust with [`FlowBuilder`]. Sessions
/// of it are [`FlowRecord`](super::FlowRecord)s:
///
/// ```
/// use std::collections::BTreeMap;
/// use std::sync::Arc;
///
/// use parlance_core::flow::{
///     Flow, FlowCommand, FlowContext, FlowEffect, FlowError, FlowKey, FlowRecord, FlowSessionId,
///     RunnerOptions,
/// };
/// use parlance_core::{Machine, ProductId, Timestamp};
///
/// let file = r#"
/// name: greet
/// initial: ask
/// model: {name: null}
/// states:
///   - {id: ask, kind: user, template: ask.j2}
///   - {id: hello, kind: user, template: hello.j2}
/// transitions:
///   - {event: user_input, from: ask, to: hello, validators: [non_empty_input],
///      assign: {name: actor_input}}
/// "#;
/// let templates = BTreeMap::from([
///     ("ask.j2".to_owned(), "What is your name?".to_owned()),
///     ("hello.j2".to_owned(), "Hello, {{ name }}!".to_owned()),
/// ]);
/// let flow = Arc::new(Flow::from_file_text(file, templates)?);
/// let ctx = FlowContext::new(flow, RunnerOptions::default());
///
/// let now = Timestamp::from_secs(1_767_225_600).expect("a date in range");
/// let key = FlowKey::new(
///     ProductId::parse("acme")?,
///     FlowSessionId::from_uuid(uuid::Uuid::from_u128(7)), // from the IdGen port
/// );
/// let (mut record, started) = FlowRecord::create(&key, &ctx, &FlowCommand::start(), now)?
///     .expect("`start` creates the session");
/// assert!(started.effects.contains(&FlowEffect::Respond("What is your name?".to_owned())));
///
/// let answer = FlowCommand::Fire {
///     event: "user_input".to_owned(),
///     input: "Ada".to_owned(),
///     fresh_id: "dag-1".to_owned(),
/// };
/// let decision = record.decide(&ctx, &answer, now)?;
/// assert_eq!(record.session().state, "hello");
/// assert_eq!(decision.transitions[0].cause, "user_input");
/// assert!(decision.effects.contains(&FlowEffect::Respond("Hello, Ada!".to_owned())));
///
/// // A record is plain data: it round-trips through serde.
/// let stored = serde_json::to_string(&record)?;
/// assert_eq!(serde_json::from_str::<FlowRecord>(&stored)?, record);
///
/// // Every problem of a file is reported at once, with its location.
/// let broken = "name: broken\ninitial: nowhere\nstates: []\n";
/// match Flow::from_file_text(broken, BTreeMap::new()) {
///     Err(FlowError::Invalid(problems)) => assert!(!problems.is_empty()),
///     other => panic!("expected problems, got {:?}", other.map(|f| f.name().to_owned())),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Flow {
    def: Arc<FlowDef>,
    env: Arc<Environment<'static>>,
    hooks: Vec<Hook>,
    validators: BTreeMap<String, ValidatorFn>,
}

impl fmt::Debug for Flow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Flow")
            .field("name", &self.def.name)
            .finish()
    }
}

fn builtin_validators() -> BTreeMap<String, ValidatorFn> {
    let mut v: BTreeMap<String, ValidatorFn> = BTreeMap::new();
    v.insert(
        "non_empty_input".into(),
        Arc::new(|c: &ValidatorContext<'_>| {
            if c.input.trim().is_empty() {
                Err("the input is empty".into())
            } else {
                Ok(())
            }
        }),
    );
    v.insert(
        "json_input".into(),
        Arc::new(|c: &ValidatorContext<'_>| {
            serde_json::from_str::<Value>(c.input)
                .map(|_| ())
                .map_err(|e| format!("the input is not json: {e}"))
        }),
    );
    v
}

/// Builds a flow in Rust, with hooks and validators as closures.
///
/// ```
/// use parlance_core::flow::{FlowBuilder, TransitionDef};
/// use serde_json::json;
///
/// let mut submit = TransitionDef::new("user_input", "ask", "done");
/// submit.validators.push("has_at".to_owned());
/// submit.assign.push(("email".to_owned(), "actor_input".to_owned()));
///
/// let flow = FlowBuilder::new("signup")
///     .template("ask.j2", "Your email?")
///     .template("done.j2", "Thanks, {{ email }}.")
///     .user_state("ask", "ask.j2") // the first user state is the initial one
///     .user_state("done", "done.j2")
///     .field("email", json!(null))
///     .validator("has_at", |c| {
///         if c.input.contains('@') { Ok(()) } else { Err("not an email".to_owned()) }
///     })
///     .transition(submit)
///     .build()?;
///
/// assert_eq!(flow.name(), "signup");
/// assert_eq!(flow.events_from("ask"), ["user_input"]);
/// assert!(flow.allows(Some("ask"), "done", "user_input"));
/// assert_eq!(flow.render("done.j2", &json!({"email": "a@b.c"}))?, "Thanks, a@b.c.");
///
/// // A transition to a state that does not exist is refused when building.
/// let bad = FlowBuilder::new("bad").template("t", "").user_state("a", "t").on("go", "a", "b");
/// assert!(bad.build().is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Default)]
pub struct FlowBuilder {
    def: FlowDef,
    hooks: Vec<Hook>,
    validators: BTreeMap<String, ValidatorFn>,
}

impl FlowBuilder {
    /// A flow named `name`.
    pub fn new(name: &str) -> Self {
        Self {
            def: FlowDef {
                name: name.to_owned(),
                ..FlowDef::default()
            },
            ..Self::default()
        }
    }

    /// Starts from a definition read from a file.
    pub fn from_def(def: FlowDef) -> Self {
        Self {
            def,
            ..Self::default()
        }
    }

    /// Adds a template source.
    pub fn template(mut self, name: &str, source: &str) -> Self {
        self.def
            .templates
            .insert(name.to_owned(), source.to_owned());
        self
    }

    /// Adds a user state rendering `template`; the first user state added is
    /// initial unless [`initial`](Self::initial) says otherwise.
    pub fn user_state(mut self, id: &str, template: &str) -> Self {
        if self.def.initial.is_none() {
            self.def.initial = Some(id.to_owned());
        }
        self.def.states.push(StateDef {
            id: id.to_owned(),
            kind: StateKind::User,
            template: Some(TemplateRef::Name(template.to_owned())),
            invoker: "template".to_owned(),
            label: None,
            value: None,
        });
        self
    }

    /// Adds an invoker state running `template` through `invoker`.
    pub fn invoker_state(mut self, id: &str, template: TemplateRef, invoker: &str) -> Self {
        self.def.states.push(StateDef {
            id: id.to_owned(),
            kind: StateKind::Invoker,
            template: Some(template),
            invoker: invoker.to_owned(),
            label: None,
            value: None,
        });
        self
    }

    /// Gives the state `id` (added before) a value: a JSON string or
    /// integer, unique in the flow (see [`StateDef::value`]).
    pub fn state_value(mut self, id: &str, value: Value) -> Self {
        if let Some(s) = self.def.states.iter_mut().find(|s| s.id == id) {
            s.value = Some(value);
        }
        self
    }

    /// Sets the initial state.
    pub fn initial(mut self, id: &str) -> Self {
        self.def.initial = Some(id.to_owned());
        self
    }

    /// Adds a transition.
    pub fn transition(mut self, t: TransitionDef) -> Self {
        self.def.transitions.push(t);
        self
    }

    /// Adds a plain transition `from --event--> to`.
    pub fn on(self, event: &str, from: &str, to: &str) -> Self {
        self.transition(TransitionDef::new(event, from, to))
    }

    /// Adds a model field with its default.
    pub fn field(mut self, name: &str, default: Value) -> Self {
        self.def.model.push(ModelField {
            name: name.to_owned(),
            default,
        });
        self
    }

    /// Adds a hook.
    pub fn hook(
        mut self,
        point: HookPoint,
        scope: HookScope,
        f: impl Fn(&mut HookContext<'_>) -> Result<(), String> + Send + Sync + 'static,
    ) -> Self {
        self.hooks.push(Hook {
            point,
            scope,
            body: HookBody::Rust(Arc::new(f)),
        });
        self
    }

    /// Registers a named validator.
    pub fn validator(
        mut self,
        name: &str,
        f: impl Fn(&ValidatorContext<'_>) -> Result<(), String> + Send + Sync + 'static,
    ) -> Self {
        self.validators.insert(name.to_owned(), Arc::new(f));
        self
    }

    /// Validates and compiles the flow, reporting every problem at once.
    pub fn build(self) -> Result<Flow, FlowError> {
        let mut validators = builtin_validators();
        validators.extend(self.validators);
        Flow::compile(self.def, self.hooks, validators)
    }
}

fn json_to_mj(v: &Value) -> minijinja::Value {
    minijinja::Value::from(Serde(v))
}

impl Flow {
    /// Validates a definition with the built-in validators only.
    pub fn from_def(def: FlowDef) -> Result<Flow, FlowError> {
        FlowBuilder::from_def(def).build()
    }

    /// Reads and validates a flow file with its template sources.
    pub fn from_file_text(
        text: &str,
        templates: BTreeMap<String, String>,
    ) -> Result<Flow, FlowError> {
        let def = FlowDef::from_file_text(text, templates).map_err(FlowError::Invalid)?;
        Flow::from_def(def)
    }

    fn compile(
        def: FlowDef,
        hooks: Vec<Hook>,
        mut validators: BTreeMap<String, ValidatorFn>,
    ) -> Result<Flow, FlowError> {
        let mut problems = Vec::new();
        let mut p = |loc: String, msg: String| {
            problems.push(FlowProblem {
                location: loc,
                message: msg,
            })
        };
        let mut env = Environment::new();
        env.set_fuel(Some(TEMPLATE_FUEL));
        limits::install(&mut env);
        for (name, source) in &def.templates {
            let added = limits::guard_template(name, source)
                .and_then(|guarded| env.add_template_owned(name.clone(), guarded));
            if let Err(e) = added {
                p(
                    format!("templates/{name}"),
                    format!("template does not compile: {e}"),
                );
                continue;
            }
            for unknown in limits::unknown_in_template(&env, name, source).unwrap_or_default() {
                p(format!("templates/{name}"), unknown);
            }
        }
        if def.name.is_empty() {
            p("name".into(), "the flow has no name".into());
        }
        let mut ids = BTreeSet::new();
        let mut values: Vec<Value> = Vec::new();
        for (i, s) in def.states.iter().enumerate() {
            let loc = format!("states[{i}]");
            let new_id = ids.insert(s.id.as_str());
            if !new_id {
                p(
                    format!("{loc}.id"),
                    format!("duplicate state id `{}`", s.id),
                );
            }
            // A duplicate id is reported once, not again as its value.
            let value = state_value(s);
            if !(value.is_string() || value.is_i64() || value.is_u64()) {
                p(
                    format!("{loc}.value"),
                    format!("a state value must be a string or an integer, not {value}"),
                );
            } else if new_id && values.contains(&value) {
                p(
                    format!("{loc}.value"),
                    format!("duplicate state value {value} (state `{}`)", s.id),
                );
            }
            values.push(value);
            match &s.template {
                None => p(
                    format!("{loc}.template"),
                    format!("state `{}` has no template", s.id),
                ),
                Some(t) => {
                    if s.kind == StateKind::User && !matches!(t, TemplateRef::Name(_)) {
                        p(
                            format!("{loc}.template"),
                            format!("user state `{}` needs a single template name", s.id),
                        );
                    }
                    check_template(t, &def.templates, &env, &format!("{loc}.template"), &mut p);
                }
            }
        }
        if def.states.is_empty() {
            p("states".into(), "the flow has no states".into());
        }
        match def.initial.as_deref() {
            None => p("initial".into(), "no initial state".into()),
            Some(init) => match def.states.iter().find(|s| s.id == init) {
                None => p("initial".into(), format!("unknown initial state `{init}`")),
                Some(s) if s.kind != StateKind::User => p(
                    "initial".into(),
                    format!("initial state `{init}` must be a user state"),
                ),
                Some(_) => {}
            },
        }
        let fields: BTreeSet<&str> = def.model.iter().map(|f| f.name.as_str()).collect();
        for v in &def.validators {
            let loc = format!("validators.{}", v.name);
            if validators.contains_key(&v.name) {
                p(
                    loc,
                    format!(
                        "validator `{}` is defined already (built in, registered in Rust or declared twice)",
                        v.name
                    ),
                );
                continue;
            }
            match validators::compile(v) {
                Ok(f) => {
                    validators.insert(v.name.clone(), f);
                }
                Err(e) => p(loc, e),
            }
        }
        for h in &hooks {
            if let HookScope::Transition(i) = h.scope
                && i >= def.transitions.len()
            {
                p(
                    "hooks".into(),
                    format!("a {:?} hook names no transition at index {i}", h.point),
                );
            }
        }
        for decl in &def.hooks {
            match &decl.scope {
                HookScope::Transition(i) if *i >= def.transitions.len() => {
                    p(decl.location.clone(), format!("no transition at index {i}"))
                }
                HookScope::State(id) if !ids.contains(id.as_str()) => {
                    p(decl.location.clone(), format!("unknown state `{id}`"))
                }
                _ => {}
            }
            for (j, a) in decl.actions.iter().enumerate() {
                let loc = format!("{}[{j}]", decl.location);
                for (key, e) in [("when", &a.when), ("unless", &a.unless)] {
                    if let Some(e) = e
                        && let Err(err) = check_expr(&env, e)
                    {
                        p(
                            format!("{loc}.{key}"),
                            format!("bad expression `{e}`: {err}"),
                        );
                    }
                }
                if let HookActionKind::Assign(pairs) = &a.kind {
                    for (field, expr) in pairs {
                        if !fields.contains(field.as_str()) {
                            p(
                                format!("{loc}.assign.{field}"),
                                format!("unknown model field `{field}`"),
                            );
                        }
                        if let Err(err) = check_expr(&env, expr) {
                            p(
                                format!("{loc}.assign.{field}"),
                                format!("bad expression `{expr}`: {err}"),
                            );
                        }
                    }
                }
            }
        }
        for (i, t) in def.transitions.iter().enumerate() {
            let loc = format!("transitions[{i}]");
            if RESERVED_EVENTS.contains(&t.event.as_str()) || t.event.is_empty() {
                p(
                    format!("{loc}.event"),
                    format!("event name `{}` is reserved", t.event),
                );
            }
            if !ids.contains(t.from.as_str()) {
                p(format!("{loc}.from"), format!("unknown state `{}`", t.from));
            }
            if !ids.contains(t.to.as_str()) {
                p(format!("{loc}.to"), format!("unknown state `{}`", t.to));
            }
            if t.internal && t.from != t.to {
                p(
                    format!("{loc}.internal"),
                    "an internal transition must be a self-transition".into(),
                );
            }
            for (name, conds) in [("cond", &t.cond), ("unless", &t.unless)] {
                for c in conds {
                    if let Condition::Expr(e) = c
                        && let Err(err) = check_expr(&env, e)
                    {
                        p(
                            format!("{loc}.{name}"),
                            format!("bad expression `{e}`: {err}"),
                        );
                    }
                }
            }
            for v in &t.validators {
                // A declared validator that does not compile is reported
                // where it is declared.
                if !validators.contains_key(v) && !def.validators.iter().any(|d| d.name == *v) {
                    p(
                        format!("{loc}.validators"),
                        format!("unknown validator `{v}`"),
                    );
                }
            }
            for (field, expr) in &t.assign {
                if !fields.contains(field.as_str()) {
                    p(
                        format!("{loc}.assign.{field}"),
                        format!("unknown model field `{field}`"),
                    );
                }
                if let Err(err) = check_expr(&env, expr) {
                    p(
                        format!("{loc}.assign.{field}"),
                        format!("bad expression `{expr}`: {err}"),
                    );
                }
            }
        }
        for (i, s) in def.states.iter().enumerate() {
            if s.kind == StateKind::Invoker
                && !def
                    .transitions
                    .iter()
                    .any(|t| t.from == s.id && t.event != ON_ERROR)
            {
                p(
                    format!("states[{i}]"),
                    format!("invoker state `{}` has no outgoing event", s.id),
                );
            }
        }
        if let Some(init) = def.initial.as_deref() {
            let mut seen = BTreeSet::from([init]);
            let mut queue = VecDeque::from([init]);
            while let Some(s) = queue.pop_front() {
                for t in def.transitions.iter().filter(|t| t.from == s) {
                    if seen.insert(t.to.as_str()) {
                        queue.push_back(t.to.as_str());
                    }
                }
            }
            for (i, s) in def.states.iter().enumerate() {
                if !seen.contains(s.id.as_str()) && ids.contains(init) {
                    p(
                        format!("states[{i}]"),
                        format!("state `{}` is unreachable", s.id),
                    );
                }
            }
        }
        if !problems.is_empty() {
            return Err(FlowError::Invalid(problems));
        }
        // Hooks declared in the definition come before those added in Rust:
        // within a scope, they run first.
        let hooks = def
            .hooks
            .iter()
            .enumerate()
            .map(|(i, d)| Hook {
                point: d.point,
                scope: d.scope.clone(),
                body: HookBody::Declared(i),
            })
            .chain(hooks)
            .collect();
        Ok(Flow {
            def: Arc::new(def),
            env: Arc::new(env),
            hooks,
            validators,
        })
    }

    /// The definition.
    pub fn def(&self) -> &FlowDef {
        &self.def
    }

    /// The flow's name.
    pub fn name(&self) -> &str {
        &self.def.name
    }

    /// A state by id.
    pub fn state(&self, id: &str) -> Option<&StateDef> {
        self.def.states.iter().find(|s| s.id == id)
    }

    fn kind(&self, id: &str) -> StateKind {
        self.state(id).map_or(StateKind::User, |s| s.kind)
    }

    /// The event the engine fires when `state`'s DAG finishes: `on_complete`
    /// if declared, else the first event declared out of it.
    pub fn completion_event(&self, state: &str) -> Option<&str> {
        let out = || self.def.transitions.iter().filter(move |t| t.from == state);
        out()
            .find(|t| t.event == ON_COMPLETE)
            .or_else(|| out().find(|t| t.event != ON_ERROR))
            .map(|t| t.event.as_str())
    }

    fn reserved_for_engine(&self, state: &str, event: &str) -> bool {
        self.kind(state) == StateKind::Invoker
            && (event == ON_ERROR || self.completion_event(state) == Some(event))
    }

    /// Whether a transition `from -> to` caused by `cause` (as a
    /// [`Decision`](crate::Decision) reports it) is in this flow's table: a
    /// declared transition whose event is `cause`, or one of the engine's
    /// own edges (start in the initial state; `retry` in an invoker state;
    /// `cancel` from an invoker state to a user state; `dag_completed` along
    /// the completion event or staying; `dag_failed` along `on_error` or
    /// staying).
    pub fn allows(&self, from: Option<&str>, to: &str, cause: &str) -> bool {
        let Some(from) = from else {
            return cause == cause::START && self.def.initial.as_deref() == Some(to);
        };
        let declared = |event: &str| {
            self.def
                .transitions
                .iter()
                .any(|t| t.from == from && t.to == to && t.event == event)
        };
        if declared(cause) {
            return true;
        }
        let invoker = |id: &str| self.state(id).is_some_and(|s| s.kind == StateKind::Invoker);
        let user = |id: &str| self.state(id).is_some_and(|s| s.kind == StateKind::User);
        match cause {
            cause::RETRY => invoker(from) && from == to,
            cause::CANCEL => invoker(from) && user(to),
            cause::DAG_COMPLETED => {
                invoker(from) && (from == to || self.completion_event(from).is_some_and(declared))
            }
            cause::DAG_FAILED => invoker(from) && (from == to || declared(ON_ERROR)),
            _ => false,
        }
    }

    /// The events out of `state`, unique, in declaration order.
    pub fn events_from(&self, state: &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for t in self.def.transitions.iter().filter(|t| t.from == state) {
            if !out.contains(&t.event) {
                out.push(t.event.clone());
            }
        }
        out
    }

    /// What the client may send now: `poll` while a DAG runs; in an invoker
    /// state with nothing running, `retry` and the events the engine does
    /// not own; else the state's events in declaration order.
    pub fn next_actions(&self, session: &FlowSession) -> Vec<String> {
        if session.running.is_some() {
            return vec!["poll".to_owned()];
        }
        let events = self.events_from(&session.state);
        if self.kind(&session.state) == StateKind::Invoker {
            let mut out = vec!["retry".to_owned()];
            out.extend(
                events
                    .into_iter()
                    .filter(|e| !self.reserved_for_engine(&session.state, e)),
            );
            return out;
        }
        events
    }

    /// The value of the state `id` (its id when it declares none); an id
    /// the flow does not have is its own value.
    pub fn state_value(&self, id: &str) -> Value {
        self.state(id)
            .map_or_else(|| Value::String(id.to_owned()), state_value)
    }

    /// The data every template and expression sees.
    pub fn render_data(
        &self,
        session: &FlowSession,
        dialogue: &[DialogueElement],
        now: Timestamp,
    ) -> Value {
        let mut data = session.model.clone();
        // As in the reference, `state` and `state_id` are the state's
        // value; `state_name` is its id.
        let value = self.state_value(&session.state);
        data.insert("state".into(), value.clone());
        data.insert("state_id".into(), value);
        data.insert("state_name".into(), Value::String(session.state.clone()));
        data.insert(
            "session_id".into(),
            Value::String(session.session_id.to_string()),
        );
        data.insert(
            "actor".into(),
            session
                .actor
                .map_or(Value::Null, |a| Value::String(a.as_str().into())),
        );
        data.insert(
            "actor_input".into(),
            Value::String(session.actor_input.clone()),
        );
        data.insert(
            "parsed_actor_input".into(),
            serde_json::from_str(&session.actor_input).unwrap_or(Value::Null),
        );
        data.insert(
            "user_info".into(),
            session
                .user_info
                .as_ref()
                .map_or(Value::Null, User::render_value),
        );
        // Null once started: the seed is cleared after the start.
        data.insert(
            "seed_data".into(),
            session.seed_data.clone().map_or(Value::Null, Value::String),
        );
        data.insert(
            "parsed_seed_data".into(),
            session
                .seed_data
                .as_deref()
                .and_then(|s| serde_json::from_str(s).ok())
                .unwrap_or(Value::Null),
        );
        data.insert("current_datetime".into(), Value::String(now.to_string()));
        data.insert(
            "chat_history".into(),
            Value::String(format_dialogue(dialogue, DialogueFormat::Yaml)),
        );
        Value::Object(data)
    }

    /// Renders the template `name` with `data`, within [`TEMPLATE_FUEL`]
    /// and [`MAX_RENDER_BYTES`].
    pub fn render(&self, name: &str, data: &Value) -> Result<String, FlowError> {
        // Every template a state names was checked when the flow loaded.
        let template = self.env.get_template(name).map_err(|e| FlowError::Render {
            what: name.to_owned(),
            message: e.to_string(),
        })?;
        let mut out = Capped {
            out: Vec::new(),
            over: false,
        };
        limits::start_budget();
        let rendered = template.render_captured_to(json_to_mj(data), &mut out);
        if out.over {
            return Err(FlowError::RenderLimit {
                what: name.to_owned(),
                limit: format!("{MAX_RENDER_BYTES} bytes of output"),
            });
        }
        rendered.map_err(|e| render_error(name, &e))?;
        String::from_utf8(out.out).map_err(|e| FlowError::Render {
            what: name.to_owned(),
            message: e.to_string(),
        })
    }

    /// Evaluates an expression over `data`.
    ///
    /// # Errors
    ///
    /// [`FlowError::Expression`] when it does not compile or fails on
    /// `data`, [`FlowError::RenderLimit`] when it runs out of fuel.
    pub fn eval(&self, expr: &str, data: &Value) -> Result<Value, FlowError> {
        let v = self.eval_mj(expr, data)?;
        if v.is_undefined() {
            return Ok(Value::Null);
        }
        serde_json::to_value(&v).map_err(|e| FlowError::Expression {
            expr: expr.to_owned(),
            message: e.to_string(),
        })
    }

    fn eval_mj(&self, expr: &str, data: &Value) -> Result<minijinja::Value, FlowError> {
        let err = |e: minijinja::Error| expr_error(expr, &e);
        let guarded = limits::guard_expr(expr).map_err(err)?;
        limits::start_budget();
        self.env
            .compile_expression(&guarded)
            .map_err(err)?
            .eval(json_to_mj(data))
            .map_err(err)
    }

    fn holds(&self, c: &Condition, data: &Value) -> Result<bool, FlowError> {
        match c {
            Condition::Fn(f) => Ok(f(data)),
            Condition::Expr(e) => Ok(self.eval_mj(e, data)?.is_true()),
        }
    }

    /// A new session in the initial state with the greeting rendered and
    /// recorded as `assistant`/`init`, without seed data or user: see
    /// [`Flow::start_with`].
    #[cfg(test)]
    pub(crate) fn start(
        &self,
        session_id: &FlowSessionId,
        now: Timestamp,
    ) -> Result<Fired, FlowError> {
        self.start_with(session_id, None, None, true, now)
    }

    /// A new session in the initial state for `user_info`. Enter hooks of
    /// the initial state run with `seed_data` in the session (and in the
    /// render data, parsed as `parsed_seed_data`), which is cleared after.
    /// With `greet`, the greeting is rendered (still seeing the seed) and
    /// recorded as `assistant`/`init`; without, nothing is rendered or
    /// recorded (an ephemeral start, whose event comes next).
    ///
    /// What [`FlowCommand::Start`](super::FlowCommand::Start) decides.
    ///
    /// # Errors
    ///
    /// A hook or the greeting's template failed.
    pub(crate) fn start_with(
        &self,
        session_id: &FlowSessionId,
        seed_data: Option<&str>,
        user_info: Option<&User>,
        greet: bool,
        now: Timestamp,
    ) -> Result<Fired, FlowError> {
        let initial = self.def.initial.clone().unwrap_or_default();
        let mut session = FlowSession {
            session_id: session_id.clone(),
            flow: self.def.name.clone(),
            state: initial.clone(),
            model: self
                .def
                .model
                .iter()
                .map(|f| (f.name.clone(), f.default.clone()))
                .collect(),
            actor: None,
            actor_input: String::new(),
            source_type: None,
            target_type: None,
            errors: Vec::new(),
            running: None,
            last_user_state: initial.clone(),
            user_info: user_info.cloned(),
            seed_data: seed_data.map(str::to_owned),
            ephemeral: false,
        };
        let mut persistence = Persistence::TARGET_RENDERED;
        let run = HookRun {
            event: "init",
            source: &initial,
            target: &initial,
            transition: None,
            dialogue: &[],
            now,
        };
        self.run_hooks(HookPoint::Enter, &run, &mut session, &mut persistence)?;
        if !greet {
            session.seed_data = None;
            return Ok(Fired::stays(session));
        }
        let template = self.user_template(&initial);
        let rendered = self.render(&template, &self.render_data(&session, &[], now))?;
        session.seed_data = None;
        let appended = vec![DialogueElement {
            actor: Actor::Assistant,
            event: "init".into(),
            actor_text: Some(rendered.clone()),
            timestamp: now,
        }];
        Ok(Fired {
            session,
            appended,
            response: Some(rendered),
            dag: None,
            transition: None,
        })
    }

    fn user_template(&self, state: &str) -> String {
        match self.state(state).and_then(|s| s.template.as_ref()) {
            Some(TemplateRef::Name(n)) => n.clone(),
            _ => String::new(),
        }
    }

    /// A client event. `invocation_id` names the DAG if the target is an
    /// invoker state (the caller supplies ids; the engine draws none).
    ///
    /// What [`FlowCommand::Fire`](super::FlowCommand::Fire) decides.
    ///
    /// # Errors
    ///
    /// [`FlowError::NotAllowed`] when the event is the engine's
    /// ([`reason::RESERVED_FOR_ENGINE`]), a DAG runs
    /// ([`reason::DAG_RUNNING`]) or no transition accepts it (no reason);
    /// [`FlowError::DialogueFull`]; or what a validator, condition, hook or
    /// template refused. The session is unchanged.
    pub(crate) fn fire(
        &self,
        session: &FlowSession,
        dialogue: &[DialogueElement],
        event: &str,
        input: &str,
        invocation_id: &str,
        now: Timestamp,
    ) -> Result<Fired, FlowError> {
        if self.reserved_for_engine(&session.state, event) {
            return Err(FlowError::not_allowed(
                event.to_owned(),
                session.state.clone(),
                Some(reason::RESERVED_FOR_ENGINE),
            ));
        }
        if session.running.is_some() {
            return Err(FlowError::not_allowed(
                event.to_owned(),
                session.state.clone(),
                Some(reason::DAG_RUNNING),
            ));
        }
        if dialogue.len() >= MAX_DIALOGUE {
            return Err(FlowError::DialogueFull {
                len: dialogue.len(),
            });
        }
        self.take(session, dialogue, event, input, invocation_id, None, now)
    }

    /// Applies a finished DAG: fires the state's completion event with the
    /// result. When no transition accepts it (or a hook fails) the session
    /// stays in the invoker state with a typed error and `retry` offered; it
    /// never re-runs the DAG on its own.
    ///
    /// What [`FlowCommand::Complete`](super::FlowCommand::Complete) decides.
    ///
    /// # Errors
    ///
    /// [`FlowError::NotAllowed`] with [`reason::STALE_INVOCATION`] when
    /// `invocation_id` is not the DAG the session waits for.
    pub(crate) fn complete(
        &self,
        session: &FlowSession,
        dialogue: &[DialogueElement],
        invocation_id: &str,
        result: &str,
        next_invocation_id: &str,
        now: Timestamp,
    ) -> Result<Fired, FlowError> {
        let running = Self::check_running(session, invocation_id, "complete")?;
        let mut idle = session.clone();
        idle.running = None;
        let event = self
            .completion_event(&running.state)
            .unwrap_or_default()
            .to_owned();
        match self.take(
            &idle,
            dialogue,
            &event,
            result,
            next_invocation_id,
            Some(&running.chain_id),
            now,
        ) {
            Ok(f) => Ok(f),
            Err(e) => {
                idle.errors.push(TaskError {
                    invocation_id: invocation_id.to_owned(),
                    task: "complete".into(),
                    message: e.to_string(),
                });
                Ok(Fired::stays(idle))
            }
        }
    }

    /// Applies a failed DAG: records the error and follows the state's
    /// `on_error` transition if declared (with the message as input), else
    /// stays in the invoker state with `retry` offered.
    ///
    /// What [`FlowCommand::Fail`](super::FlowCommand::Fail) decides.
    ///
    /// # Errors
    ///
    /// [`FlowError::NotAllowed`] with [`reason::STALE_INVOCATION`] when the
    /// error's invocation is not the DAG the session waits for.
    pub(crate) fn fail(
        &self,
        session: &FlowSession,
        dialogue: &[DialogueElement],
        error: TaskError,
        next_invocation_id: &str,
        now: Timestamp,
    ) -> Result<Fired, FlowError> {
        let running = Self::check_running(session, &error.invocation_id, "fail")?;
        let mut idle = session.clone();
        idle.running = None;
        let has_on_error = self
            .def
            .transitions
            .iter()
            .any(|t| t.from == running.state && t.event == ON_ERROR);
        let taken = if has_on_error {
            self.take(
                &idle,
                dialogue,
                ON_ERROR,
                &error.message,
                next_invocation_id,
                None,
                now,
            )
            .ok()
        } else {
            None
        };
        let mut fired = taken.unwrap_or_else(|| Fired::stays(idle));
        fired.session.errors.push(error);
        Ok(fired)
    }

    /// Stops the running DAG and returns to the last user state (no hooks
    /// run; nothing is recorded in the dialogue).
    ///
    /// What [`FlowCommand::Cancel`](super::FlowCommand::Cancel) decides.
    ///
    /// # Errors
    ///
    /// [`FlowError::NotAllowed`] with [`reason::NOTHING_RUNNING`] when no
    /// DAG runs.
    pub(crate) fn cancel(&self, session: &FlowSession) -> Result<FlowSession, FlowError> {
        if session.running.is_none() {
            return Err(FlowError::not_allowed(
                cause::CANCEL,
                session.state.clone(),
                Some(reason::NOTHING_RUNNING),
            ));
        }
        let mut s = session.clone();
        s.running = None;
        s.state = s.last_user_state.clone();
        Ok(s)
    }

    /// Runs the current invoker state's DAG again (after a failure or a
    /// rejected result), as a new chain.
    ///
    /// What [`FlowCommand::Retry`](super::FlowCommand::Retry) decides.
    ///
    /// # Errors
    ///
    /// [`FlowError::NotAllowed`] with [`reason::DAG_RUNNING`] while a DAG
    /// runs, [`reason::RETRY_NOT_OFFERED`] outside an invoker state.
    pub(crate) fn retry(
        &self,
        session: &FlowSession,
        dialogue: &[DialogueElement],
        invocation_id: &str,
        now: Timestamp,
    ) -> Result<Fired, FlowError> {
        let refuse =
            |reason| FlowError::not_allowed(cause::RETRY, session.state.clone(), Some(reason));
        if session.running.is_some() {
            return Err(refuse(reason::DAG_RUNNING));
        }
        let Some(state) = self
            .state(&session.state)
            .filter(|s| s.kind == StateKind::Invoker)
        else {
            return Err(refuse(reason::RETRY_NOT_OFFERED));
        };
        let mut s = session.clone();
        let plan = self.plan(state, &s, dialogue, invocation_id, None, now);
        s.running = Some(Running {
            invocation_id: plan.invocation_id.clone(),
            chain_id: plan.chain_id.clone(),
            state: s.state.clone(),
            dag_id: None,
        });
        Ok(Fired {
            session: s,
            appended: Vec::new(),
            response: None,
            dag: Some(plan),
            transition: None,
        })
    }

    /// The DAG `session` waits for, if it is `invocation_id`.
    fn check_running<'s>(
        session: &'s FlowSession,
        invocation_id: &str,
        command: &'static str,
    ) -> Result<&'s Running, FlowError> {
        match &session.running {
            Some(r) if r.invocation_id == invocation_id => Ok(r),
            _ => Err(FlowError::not_allowed(
                command,
                session.state.clone(),
                Some(reason::STALE_INVOCATION),
            )),
        }
    }

    fn plan(
        &self,
        state: &StateDef,
        s: &FlowSession,
        dialogue: &[DialogueElement],
        invocation_id: &str,
        chain: Option<&str>,
        now: Timestamp,
    ) -> DagPlan {
        let template = state
            .template
            .clone()
            .unwrap_or(TemplateRef::Chain(Vec::new()));
        let invocation = format!("{}-{invocation_id}", state.id);
        dag::compile(
            &template,
            &state.invoker,
            invocation.clone(),
            chain.map_or(invocation, str::to_owned),
            state.id.clone(),
            state.label.clone().unwrap_or_else(|| state.id.clone()),
            self.render_data(s, dialogue, now),
        )
    }

    /// The default dialogue persistence of a transition (the seed's table by
    /// transition type; `file_upload` records the event only).
    pub(crate) fn default_persistence(
        source: StateKind,
        target: StateKind,
        event: &str,
    ) -> Persistence {
        let source_bits = if event == "file_upload" {
            Persistence::SOURCE_EVENT
        } else {
            Persistence::SOURCE_RAW
        };
        match (source, target) {
            (StateKind::User, StateKind::User) => source_bits | Persistence::TARGET_RENDERED,
            (StateKind::User, StateKind::Invoker) => source_bits,
            (StateKind::Invoker, StateKind::User) => Persistence::TARGET_RENDERED,
            (StateKind::Invoker, StateKind::Invoker) => Persistence::NONE,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn take(
        &self,
        session: &FlowSession,
        dialogue: &[DialogueElement],
        event: &str,
        input: &str,
        invocation_id: &str,
        chain: Option<&str>,
        now: Timestamp,
    ) -> Result<Fired, FlowError> {
        let mut probe = session.clone();
        probe.actor_input = input.to_owned();
        let mut data = None;
        for (index, t) in self
            .def
            .transitions
            .iter()
            .enumerate()
            .filter(|(_, t)| t.from == session.state && t.event == event)
        {
            for v in &t.validators {
                if let Some(f) = self.validators.get(v) {
                    f(&ValidatorContext {
                        event,
                        input,
                        session,
                    })
                    .map_err(|message| FlowError::Validator {
                        validator: v.clone(),
                        message,
                    })?;
                }
            }
            let data = data.get_or_insert_with(|| self.render_data(&probe, dialogue, now));
            let mut ok = true;
            for c in &t.cond {
                if !self.holds(c, data)? {
                    ok = false;
                    break;
                }
            }
            if ok {
                for c in &t.unless {
                    if self.holds(c, data)? {
                        ok = false;
                        break;
                    }
                }
            }
            if ok {
                return self.apply(index, session, dialogue, input, invocation_id, chain, now);
            }
        }
        Err(FlowError::not_allowed(
            event.to_owned(),
            session.state.clone(),
            None,
        ))
    }

    /// Runs the hooks of `point` for `run`, in their documented order (see
    /// [`HookScope`]).
    fn run_hooks(
        &self,
        point: HookPoint,
        run: &HookRun<'_>,
        session: &mut FlowSession,
        persistence: &mut Persistence,
    ) -> Result<(), FlowError> {
        let scope_state = match point {
            HookPoint::Exit => Some(run.source),
            HookPoint::Enter => Some(run.target),
            _ => None,
        };
        // The rank of a hook's scope in this group, if it applies.
        let rank = |h: &Hook| -> Option<u8> {
            if h.point != point {
                return None;
            }
            let (any, transition, specific) = if point == HookPoint::After {
                (2, 0, 1)
            } else {
                (0, 1, 2)
            };
            match &h.scope {
                HookScope::Any => Some(any),
                HookScope::Transition(i) => (run.transition == Some(*i)).then_some(transition),
                HookScope::Event(e) => {
                    (scope_state.is_none() && e == run.event).then_some(specific)
                }
                HookScope::State(s) => (scope_state == Some(s.as_str())).then_some(specific),
            }
        };
        let mut ordered: Vec<(u8, &Hook)> = self
            .hooks
            .iter()
            .filter_map(|h| rank(h).map(|r| (r, h)))
            .collect();
        // Stable: within a rank, declared hooks come first, then Rust ones,
        // each in order.
        ordered.sort_by_key(|(r, _)| *r);
        for (_, h) in ordered {
            match &h.body {
                HookBody::Declared(i) => self.run_declared(&self.def.hooks[*i], run, session)?,
                HookBody::Rust(f) => {
                    let mut ctx = HookContext {
                        point,
                        event: run.event,
                        source: run.source,
                        target: run.target,
                        session,
                        persistence,
                    };
                    f(&mut ctx).map_err(|message| FlowError::Hook { point, message })?;
                }
            }
        }
        Ok(())
    }

    /// Runs the actions of a hook declared as data, each over the render
    /// data as the previous ones left it.
    fn run_declared(
        &self,
        decl: &HookDecl,
        run: &HookRun<'_>,
        session: &mut FlowSession,
    ) -> Result<(), FlowError> {
        let mut data = None;
        for (j, action) in decl.actions.iter().enumerate() {
            let d = data.get_or_insert_with(|| self.render_data(session, run.dialogue, run.now));
            if let Some(when) = &action.when
                && !self.eval_mj(when, d)?.is_true()
            {
                continue;
            }
            if let Some(unless) = &action.unless
                && self.eval_mj(unless, d)?.is_true()
            {
                continue;
            }
            match &action.kind {
                HookActionKind::Assign(pairs) => {
                    let mut values = Vec::with_capacity(pairs.len());
                    for (field, expr) in pairs {
                        values.push((field.clone(), self.eval(expr, d)?));
                    }
                    session.model.extend(values);
                    // Later actions see the fields set: the data is rebuilt
                    // when one needs it.
                    data = None;
                }
                HookActionKind::Fail(message) => {
                    return Err(FlowError::HookFail {
                        hook: format!("{}[{j}]", decl.location),
                        message: message.clone(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Takes the transition declared at `index`: the engine's bookkeeping,
    /// then the hooks and actions in order, then the state update.
    #[allow(clippy::too_many_arguments)]
    fn apply(
        &self,
        index: usize,
        session: &FlowSession,
        dialogue: &[DialogueElement],
        input: &str,
        invocation_id: &str,
        chain: Option<&str>,
        now: Timestamp,
    ) -> Result<Fired, FlowError> {
        let t = &self.def.transitions[index];
        let (source, target) = (t.from.as_str(), t.to.as_str());
        let (sk, tk) = (self.kind(source), self.kind(target));
        let mut s = session.clone();
        // The engine's own bookkeeping comes first, so every hook sees the
        // current transition type, actor and input.
        s.source_type = Some(sk);
        s.target_type = Some(tk);
        s.actor = Some(if sk == StateKind::User {
            Actor::User
        } else {
            Actor::Assistant
        });
        s.actor_input = input.to_owned();
        let mut persistence = t
            .persistence
            .unwrap_or_else(|| Self::default_persistence(sk, tk, &t.event));
        let mut appended = Vec::new();
        if persistence.intersects(Persistence::SOURCE) {
            appended.push(DialogueElement {
                actor: s.actor.unwrap_or(Actor::User),
                event: t.event.clone(),
                actor_text: persistence
                    .contains(Persistence::SOURCE_RAW)
                    .then(|| input.to_owned()),
                timestamp: now,
            });
        }
        // The dialogue hooks, actions and the target see: what was, and the
        // source half just recorded.
        let mut all = dialogue.to_vec();
        all.extend(appended.iter().cloned());
        let run = HookRun {
            event: &t.event,
            source,
            target,
            transition: Some(index),
            dialogue: &all,
            now,
        };
        self.run_hooks(HookPoint::Before, &run, &mut s, &mut persistence)?;
        if !t.internal {
            self.run_hooks(HookPoint::Exit, &run, &mut s, &mut persistence)?;
        }
        if !t.assign.is_empty() {
            let data = self.render_data(&s, &all, now);
            let mut values = Vec::new();
            for (field, expr) in &t.assign {
                values.push((field.clone(), self.eval(expr, &data)?));
            }
            for (field, v) in values {
                s.model.insert(field, v);
            }
        }
        self.run_hooks(HookPoint::On, &run, &mut s, &mut persistence)?;
        s.state = target.to_owned();
        if tk == StateKind::User {
            s.last_user_state = target.to_owned();
        }
        if !t.internal {
            self.run_hooks(HookPoint::Enter, &run, &mut s, &mut persistence)?;
        }
        self.run_hooks(HookPoint::After, &run, &mut s, &mut persistence)?;
        s.errors.clear();
        let mut response = None;
        let mut dag = None;
        s.running = None;
        // `tk` is `Invoker` exactly when the target is a declared invoker state.
        match self
            .state(target)
            .filter(|st| st.kind == StateKind::Invoker)
        {
            None => {
                let rendered = self.render(
                    &self.user_template(target),
                    &self.render_data(&s, &all, now),
                )?;
                if persistence.intersects(Persistence::TARGET) {
                    let mut parts = Vec::new();
                    if persistence.contains(Persistence::TARGET_RAW) {
                        parts.push(input.to_owned());
                    }
                    if persistence.contains(Persistence::TARGET_RENDERED) {
                        parts.push(rendered.clone());
                    }
                    appended.push(DialogueElement {
                        actor: Actor::Assistant,
                        event: t.event.clone(),
                        actor_text: Some(parts.join("\n")),
                        timestamp: now,
                    });
                }
                response = Some(rendered);
            }
            Some(state) => {
                let plan = self.plan(state, &s, &all, invocation_id, chain, now);
                s.running = Some(Running {
                    invocation_id: plan.invocation_id.clone(),
                    chain_id: plan.chain_id.clone(),
                    state: target.to_owned(),
                    dag_id: None,
                });
                dag = Some(plan);
            }
        }
        Ok(Fired {
            session: s,
            appended,
            response,
            dag,
            transition: Some(Transition::new(
                source.to_owned(),
                target.to_owned(),
                t.event.clone(),
            )),
        })
    }

    /// A Mermaid `stateDiagram-v2` of the flow: each state with its kind,
    /// one line per transition (events sharing endpoints merged), states with
    /// no way out to `[*]`.
    pub fn to_mermaid(&self) -> String {
        use std::fmt::Write as _;
        let id = |s: &str| -> String {
            s.chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect()
        };
        let mut out = String::from("stateDiagram-v2\n");
        if let Some(init) = &self.def.initial {
            let _ = writeln!(out, "    [*] --> {}", id(init));
        }
        for s in &self.def.states {
            let _ = writeln!(out, "    {}: {} ({})", id(&s.id), s.id, s.kind.as_str());
        }
        let mut seen: Vec<(&str, &str, Vec<&str>)> = Vec::new();
        for t in &self.def.transitions {
            match seen
                .iter_mut()
                .find(|(f, to, _)| *f == t.from && *to == t.to)
            {
                Some((_, _, evs)) => {
                    if !evs.contains(&t.event.as_str()) {
                        evs.push(&t.event);
                    }
                }
                None => seen.push((&t.from, &t.to, vec![&t.event])),
            }
        }
        for (f, t, evs) in seen {
            let _ = writeln!(out, "    {} --> {}: {}", id(f), id(t), evs.join(", "));
        }
        for s in &self.def.states {
            if !self.def.transitions.iter().any(|t| t.from == s.id) {
                let _ = writeln!(out, "    {} --> [*]", id(&s.id));
            }
        }
        out
    }
}

/// A state's value: the declared one, else its id.
fn state_value(s: &StateDef) -> Value {
    s.value
        .clone()
        .unwrap_or_else(|| Value::String(s.id.clone()))
}

fn check_template(
    t: &TemplateRef,
    templates: &BTreeMap<String, String>,
    env: &Environment<'static>,
    loc: &str,
    p: &mut impl FnMut(String, String),
) {
    match t {
        TemplateRef::Name(n) => {
            if !templates.contains_key(n) {
                p(loc.to_owned(), format!("unknown template `{n}`"));
            }
        }
        TemplateRef::Chain(steps) => {
            if steps.is_empty() {
                p(loc.to_owned(), "an empty chain".into());
            }
            for (i, s) in steps.iter().enumerate() {
                check_template(s, templates, env, &format!("{loc}[{i}]"), p);
            }
        }
        TemplateRef::Map(branches) => {
            if branches.is_empty() {
                p(loc.to_owned(), "an empty map".into());
            }
            for (k, s) in branches {
                check_template(s, templates, env, &format!("{loc}.{k}"), p);
            }
        }
        TemplateRef::MapOver { map, over } => {
            if !templates.contains_key(map) {
                p(format!("{loc}.map"), format!("unknown template `{map}`"));
            }
            if let Err(e) = check_expr(env, over) {
                p(
                    format!("{loc}.over"),
                    format!("bad expression `{over}`: {e}"),
                );
            }
        }
    }
}
