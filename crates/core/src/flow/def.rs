//! Flow definitions: states, transitions, model fields; the Rust builder and
//! the YAML/JSON flow file format.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::dialogue::Persistence;
use super::engine::{HookPoint, HookScope};

/// What a state does once entered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema), schema(as = FlowStateKind))]
pub enum StateKind {
    /// Render the template, then wait for the user.
    User,
    /// Run a task DAG, then continue on its own.
    Invoker,
}

impl StateKind {
    /// `user` or `invoker`.
    pub fn as_str(self) -> &'static str {
        match self {
            StateKind::User => "user",
            StateKind::Invoker => "invoker",
        }
    }
}

/// A composite template reference.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum TemplateRef {
    /// One template: one task.
    Name(String),
    /// A chain: each step gets the previous result.
    Chain(Vec<TemplateRef>),
    /// Parallel branches combined into a JSON object, in key order.
    Map(Vec<(String, TemplateRef)>),
    /// One task per element of the list `over` evaluates to.
    MapOver {
        /// The template run per element.
        map: String,
        /// An expression over the render data giving the list.
        over: String,
    },
}

impl TemplateRef {
    /// Every template name referred to, in order.
    pub fn names(&self) -> Vec<&str> {
        let mut out = Vec::new();
        self.collect(&mut out);
        out
    }

    fn collect<'a>(&'a self, out: &mut Vec<&'a str>) {
        match self {
            TemplateRef::Name(n) => out.push(n),
            TemplateRef::Chain(steps) => steps.iter().for_each(|s| s.collect(out)),
            TemplateRef::Map(branches) => branches.iter().for_each(|(_, t)| t.collect(out)),
            TemplateRef::MapOver { map, .. } => out.push(map),
        }
    }

    /// Reads a template reference from its file form: a string, a list, a
    /// mapping, or `{map, over}`.
    pub fn from_value(v: &Value) -> Result<TemplateRef, String> {
        match v {
            Value::String(s) => Ok(TemplateRef::Name(s.clone())),
            Value::Array(items) => Ok(TemplateRef::Chain(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| {
                        TemplateRef::from_value(item).map_err(|e| format!("[{i}]: {e}"))
                    })
                    .collect::<Result<_, _>>()?,
            )),
            Value::Object(map) => {
                if map.len() == 2 && map.contains_key("map") && map.contains_key("over") {
                    let (Some(m), Some(o)) = (map["map"].as_str(), map["over"].as_str()) else {
                        return Err("`map` and `over` must be strings".into());
                    };
                    return Ok(TemplateRef::MapOver {
                        map: m.to_owned(),
                        over: o.to_owned(),
                    });
                }
                Ok(TemplateRef::Map(
                    map.iter()
                        .map(|(k, t)| {
                            TemplateRef::from_value(t)
                                .map(|t| (k.clone(), t))
                                .map_err(|e| format!("{k}: {e}"))
                        })
                        .collect::<Result<_, _>>()?,
                ))
            }
            other => Err(format!(
                "a template must be a string, a list or a mapping, not {other}"
            )),
        }
    }
}

/// One state.
#[derive(Debug, Clone, PartialEq)]
pub struct StateDef {
    /// Unique id.
    pub id: String,
    /// User or invoker.
    pub kind: StateKind,
    /// Its template (a plain name for user states).
    pub template: Option<TemplateRef>,
    /// Which invoker runs its tasks (invoker states; `template` by default).
    pub invoker: String,
    /// A label shown in progress while it runs (defaults to the id).
    pub label: Option<String>,
    /// The state's value, as the reference's `State(value=...)`: a JSON
    /// string or integer, unique in the flow; what the model's `state` and
    /// the templates' `state` and `state_id` show. `None` is the id.
    pub value: Option<Value>,
}

/// A condition: a minijinja expression, or a Rust closure (builder only).
#[derive(Clone)]
pub enum Condition {
    /// An expression over the render data.
    Expr(String),
    /// A Rust predicate over the render data.
    Fn(Arc<dyn Fn(&Value) -> bool + Send + Sync>),
}

impl fmt::Debug for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Condition::Expr(e) => write!(f, "Expr({e:?})"),
            Condition::Fn(_) => f.write_str("Fn(..)"),
        }
    }
}

/// One transition.
#[derive(Debug, Clone)]
pub struct TransitionDef {
    /// The event that fires it.
    pub event: String,
    /// Source state.
    pub from: String,
    /// Target state.
    pub to: String,
    /// All must hold.
    pub cond: Vec<Condition>,
    /// None may hold.
    pub unless: Vec<Condition>,
    /// Named validators, run first; an error aborts the event.
    pub validators: Vec<String>,
    /// Dialogue persistence for this transition only.
    pub persistence: Option<Persistence>,
    /// Model fields set from expressions, evaluated against the same data.
    pub assign: Vec<(String, String)>,
    /// A self-transition without exit/enter.
    pub internal: bool,
}

impl TransitionDef {
    /// A transition with no conditions, validators or actions.
    pub fn new(event: &str, from: &str, to: &str) -> Self {
        Self {
            event: event.to_owned(),
            from: from.to_owned(),
            to: to.to_owned(),
            cond: Vec::new(),
            unless: Vec::new(),
            validators: Vec::new(),
            persistence: None,
            assign: Vec::new(),
            internal: false,
        }
    }
}

/// One model field and its default.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelField {
    /// Name (a render-data key).
    pub name: String,
    /// Value of a new session.
    pub default: Value,
}

/// What one action of a declared hook does.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HookActionKind {
    /// Sets model fields from expressions over the render data. The
    /// expressions of one action see the same data; later actions see what
    /// earlier ones set.
    Assign(Vec<(String, String)>),
    /// Refuses the event with this message: nothing is saved.
    Fail(String),
}

/// One action of a hook declared as data, run when `when` holds (always,
/// without one) and `unless` does not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookAction {
    /// What it does.
    pub kind: HookActionKind,
    /// An expression that must hold for the action to run.
    pub when: Option<String>,
    /// An expression that must not hold for the action to run.
    pub unless: Option<String>,
}

/// A hook declared as data (in a flow file): a list of actions run at a
/// hook point for a scope, in the same order as hooks added in Rust.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookDecl {
    /// Where it runs.
    pub point: HookPoint,
    /// Which transitions or states it applies to.
    pub scope: HookScope,
    /// Where it is declared (`states[1].on_enter`), named by load problems
    /// and by the error a `fail` action answers with.
    pub location: String,
    /// Its actions, in order.
    pub actions: Vec<HookAction>,
}

/// What a declared validator checks.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ValidatorRule {
    /// The text matches this regular expression (anchored only as written).
    Regex(String),
    /// The text has at least `min` and at most `max` characters.
    Length {
        /// Fewest characters.
        min: Option<usize>,
        /// Most characters.
        max: Option<usize>,
    },
    /// The input, parsed as JSON, is valid under this JSON Schema.
    JsonSchema(Value),
    /// The text is one of these.
    OneOf(Vec<String>),
}

/// A validator declared as data (in a flow file's `validators`), usable by
/// name in a transition's `validators` like the built-in ones.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidatorDef {
    /// Its name.
    pub name: String,
    /// What it checks.
    pub rule: ValidatorRule,
    /// The refusal's message (a default naming the rule otherwise).
    pub message: Option<String>,
    /// A member of the input parsed as JSON to check instead of the whole
    /// input: keys separated by dots, a number indexing a list
    /// (`contact.emails.0`).
    pub field: Option<String>,
}

/// A flow as declared, before validation.
#[derive(Debug, Clone, Default)]
pub struct FlowDef {
    /// The flow's key in URLs.
    pub name: String,
    /// A human description.
    pub description: String,
    /// The initial state (a user state).
    pub initial: Option<String>,
    /// States in declaration order.
    pub states: Vec<StateDef>,
    /// Transitions in declaration order.
    pub transitions: Vec<TransitionDef>,
    /// The flow's own model fields.
    pub model: Vec<ModelField>,
    /// Template sources by name.
    pub templates: BTreeMap<String, String>,
    /// Hooks declared as data, in declaration order.
    pub hooks: Vec<HookDecl>,
    /// Validators declared as data.
    pub validators: Vec<ValidatorDef>,
}

/// The YAML/JSON file form of a flow (templates come from its folder).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct FlowFile {
    name: String,
    #[serde(default)]
    description: String,
    initial: Option<String>,
    states: Vec<StateFile>,
    #[serde(default)]
    transitions: Vec<TransitionFile>,
    #[serde(default)]
    model: serde_json::Map<String, Value>,
    #[serde(default)]
    before_transition: Vec<Value>,
    #[serde(default)]
    after_transition: Vec<Value>,
    #[serde(default)]
    validators: serde_json::Map<String, Value>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct StateFile {
    id: String,
    kind: StateKind,
    template: Option<Value>,
    invoker: Option<String>,
    label: Option<String>,
    value: Option<Value>,
    #[serde(default)]
    on_enter: Vec<Value>,
    #[serde(default)]
    on_exit: Vec<Value>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct TransitionFile {
    event: String,
    from: String,
    to: String,
    cond: Option<String>,
    unless: Option<String>,
    #[serde(default)]
    validators: Vec<String>,
    persistence: Option<Vec<String>>,
    #[serde(default)]
    assign: serde_json::Map<String, Value>,
    #[serde(default)]
    internal: bool,
    #[serde(default)]
    before: Vec<Value>,
    #[serde(default)]
    after: Vec<Value>,
}

/// One action of a declared hook in its file form.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ActionFile {
    assign: Option<serde_json::Map<String, Value>>,
    fail: Option<String>,
    when: Option<String>,
    unless: Option<String>,
}

/// A declared validator in its file form: one rule, an optional message
/// and field.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ValidatorFile {
    regex: Option<String>,
    length: Option<LengthFile>,
    json_schema: Option<Value>,
    one_of: Option<Vec<String>>,
    message: Option<String>,
    field: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct LengthFile {
    min: Option<usize>,
    max: Option<usize>,
}

/// The expression an `assign` value stands for: a string is an expression,
/// a number, boolean or null its literal.
fn expr_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Null => Some("none".to_owned()),
        Value::Array(_) | Value::Object(_) => None,
    }
}

/// The `field: expression` pairs of an `assign` declared at `location`, in
/// declaration order; a value that is no expression is a problem.
fn assign_pairs(
    fields: serde_json::Map<String, Value>,
    location: &str,
    problems: &mut Vec<FlowProblem>,
) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    for (field, v) in fields {
        match expr_text(&v) {
            Some(expr) => pairs.push((field, expr)),
            None => problems.push(problem(
                format!("{location}.{field}"),
                "an expression must be a string, a number, a boolean or null",
            )),
        }
    }
    pairs
}

/// Reads a hook's list of actions declared at `location`; `None` when the
/// list is empty. Shape errors are pushed as problems.
fn hook_decl(
    point: HookPoint,
    scope: HookScope,
    location: String,
    items: Vec<Value>,
    problems: &mut Vec<FlowProblem>,
) -> Option<HookDecl> {
    let mut actions = Vec::new();
    for (j, item) in items.into_iter().enumerate() {
        let loc = format!("{location}[{j}]");
        let a: ActionFile = match serde_json::from_value(item) {
            Ok(a) => a,
            Err(e) => {
                problems.push(problem(loc, format!("bad action: {e}")));
                continue;
            }
        };
        let kind = match (a.assign, a.fail) {
            (Some(fields), None) => {
                HookActionKind::Assign(assign_pairs(fields, &format!("{loc}.assign"), problems))
            }
            (None, Some(message)) => HookActionKind::Fail(message),
            _ => {
                problems.push(problem(
                    loc,
                    "an action is either `assign: {field: expression}` or `fail: message`",
                ));
                continue;
            }
        };
        actions.push(HookAction {
            kind,
            when: a.when,
            unless: a.unless,
        });
    }
    (!actions.is_empty()).then_some(HookDecl {
        point,
        scope,
        location,
        actions,
    })
}

/// Reads a declared validator; shape errors are problems at
/// `validators.<name>`.
fn validator_def(name: String, v: Value) -> Result<ValidatorDef, FlowProblem> {
    let loc = format!("validators.{name}");
    let f: ValidatorFile =
        serde_json::from_value(v).map_err(|e| problem(&loc, format!("bad validator: {e}")))?;
    let mut rules = Vec::new();
    if let Some(r) = f.regex {
        rules.push(ValidatorRule::Regex(r));
    }
    if let Some(l) = f.length {
        rules.push(ValidatorRule::Length {
            min: l.min,
            max: l.max,
        });
    }
    if let Some(schema) = f.json_schema {
        rules.push(ValidatorRule::JsonSchema(schema));
    }
    if let Some(allowed) = f.one_of {
        rules.push(ValidatorRule::OneOf(allowed));
    }
    if rules.len() != 1 {
        return Err(problem(
            loc,
            "a validator has exactly one of `regex`, `length`, `json_schema`, `one_of`",
        ));
    }
    Ok(ValidatorDef {
        name,
        rule: rules.remove(0),
        message: f.message,
        field: f.field,
    })
}

/// One problem found in a flow, with where it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FlowProblem {
    /// Where: `states[2].template`, `transitions[0].cond`, `file`, ...
    pub location: String,
    /// What is wrong, lowercase.
    pub message: String,
}

impl fmt::Display for FlowProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.location, self.message)
    }
}

fn problem(location: impl Into<String>, message: impl Into<String>) -> FlowProblem {
    FlowProblem {
        location: location.into(),
        message: message.into(),
    }
}

impl FlowDef {
    /// Reads a flow file (YAML, of which JSON is a subset) with its template
    /// sources. Shape errors are reported as problems with their location.
    pub fn from_file_text(
        text: &str,
        templates: BTreeMap<String, String>,
    ) -> Result<FlowDef, Vec<FlowProblem>> {
        let raw: Value = serde_norway::from_str(text)
            .map_err(|e| vec![problem("file", format!("not valid yaml or json: {e}"))])?;
        let file: FlowFile = serde_json::from_value(raw)
            .map_err(|e| vec![problem("file", format!("bad flow file: {e}"))])?;
        let mut problems = Vec::new();
        let mut def = FlowDef {
            name: file.name,
            description: file.description,
            initial: file.initial,
            templates,
            model: file
                .model
                .into_iter()
                .map(|(name, default)| ModelField { name, default })
                .collect(),
            ..FlowDef::default()
        };
        for (i, s) in file.states.into_iter().enumerate() {
            let template = match s.template.as_ref().map(TemplateRef::from_value) {
                None => None,
                Some(Ok(t)) => Some(t),
                Some(Err(e)) => {
                    problems.push(problem(format!("states[{i}].template"), e));
                    None
                }
            };
            for (point, key, items) in [
                (HookPoint::Exit, "on_exit", s.on_exit),
                (HookPoint::Enter, "on_enter", s.on_enter),
            ] {
                def.hooks.extend(hook_decl(
                    point,
                    HookScope::State(s.id.clone()),
                    format!("states[{i}].{key}"),
                    items,
                    &mut problems,
                ));
            }
            def.states.push(StateDef {
                id: s.id,
                kind: s.kind,
                template,
                invoker: s.invoker.unwrap_or_else(|| "template".to_owned()),
                label: s.label,
                value: s.value,
            });
        }
        for (i, t) in file.transitions.into_iter().enumerate() {
            let persistence = match t.persistence {
                None => None,
                Some(names) => {
                    let mut flags = Persistence::NONE;
                    for n in names {
                        match Persistence::from_name(&n) {
                            Some(f) => flags = flags | f,
                            None => problems.push(problem(
                                format!("transitions[{i}].persistence"),
                                format!("unknown persistence flag `{n}`"),
                            )),
                        }
                    }
                    Some(flags)
                }
            };
            for (point, key, items) in [
                (HookPoint::Before, "before", t.before),
                (HookPoint::After, "after", t.after),
            ] {
                def.hooks.extend(hook_decl(
                    point,
                    HookScope::Transition(i),
                    format!("transitions[{i}].{key}"),
                    items,
                    &mut problems,
                ));
            }
            def.transitions.push(TransitionDef {
                event: t.event,
                from: t.from,
                to: t.to,
                cond: t.cond.into_iter().map(Condition::Expr).collect(),
                unless: t.unless.into_iter().map(Condition::Expr).collect(),
                validators: t.validators,
                persistence,
                assign: assign_pairs(t.assign, &format!("transitions[{i}].assign"), &mut problems),
                internal: t.internal,
            });
        }
        for (point, key, items) in [
            (
                HookPoint::Before,
                "before_transition",
                file.before_transition,
            ),
            (HookPoint::After, "after_transition", file.after_transition),
        ] {
            def.hooks.extend(hook_decl(
                point,
                HookScope::Any,
                key.to_owned(),
                items,
                &mut problems,
            ));
        }
        for (name, v) in file.validators {
            match validator_def(name, v) {
                Ok(v) => def.validators.push(v),
                Err(p) => problems.push(p),
            }
        }
        if problems.is_empty() {
            Ok(def)
        } else {
            Err(problems)
        }
    }
}
