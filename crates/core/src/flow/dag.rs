//! Compilation of a composite template into a task DAG plan: pure data that
//! an executor (the task queue) runs.
//!
//! Task counts follow the reference: a name is one task, a chain of `k`
//! steps adds `k - 1` glue tasks, a map adds one combine task, a
//! map-over-list is one task before expansion (plus one per element when it
//! runs), and every DAG ends with one completion task.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::def::TemplateRef;
use super::pyjson;

/// What one task does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TaskKind {
    /// Render `template` with the plan's context (plus the drag-net of task
    /// `input`, if any) and call `invoker` with the text.
    Invoke {
        /// Template name.
        template: String,
        /// Invoker name.
        invoker: String,
        /// The glue task whose value is merged into the render data.
        input: Option<usize>,
    },
    /// Turns the string result of task `from` into the drag-net
    /// `{previous_result, parsed_previous_result}` (see [`glue`]).
    Glue {
        /// The step before.
        from: usize,
    },
    /// Combines the results of `from` (in order) into a JSON object keyed by
    /// `keys` (see [`combine`]).
    Combine {
        /// Branch keys.
        keys: Vec<String>,
        /// Branch result tasks, same order as `keys`.
        from: Vec<usize>,
    },
    /// Evaluates `over` against the render data, then invokes `template`
    /// once per element with `{map_index, map_value}` (see [`map_results`]).
    MapOver {
        /// Template name run per element.
        template: String,
        /// Invoker name.
        invoker: String,
        /// Expression giving the list.
        over: String,
        /// The glue task whose value is merged into the render data.
        input: Option<usize>,
    },
    /// Sends the completion event with the result of task `from`.
    Complete {
        /// The DAG's final result.
        from: usize,
    },
}

/// One task of a plan; tasks are listed in a topological order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanTask {
    /// Index in the plan.
    pub id: usize,
    /// Tasks that must finish first.
    pub deps: Vec<usize>,
    /// What it does.
    pub kind: TaskKind,
}

/// A DAG ready to hand to an executor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DagPlan {
    /// `"<state>-<id>"`, unique per run.
    pub invocation_id: String,
    /// The invoker chain this DAG belongs to (progress accumulates per chain).
    pub chain_id: String,
    /// The invoker state it runs for.
    pub state: String,
    /// What progress shows while it runs.
    pub label: String,
    /// The render data, frozen when the DAG was planned.
    pub context: Value,
    /// Tasks in a topological order; the last is the completion task.
    pub tasks: Vec<PlanTask>,
}

impl DagPlan {
    /// Tasks counted toward progress before any map expands.
    pub fn counted_tasks(&self) -> u64 {
        self.tasks.len() as u64
    }
}

/// Compiles `template` into tasks (without the completion task); returns
/// the task whose result is the template's result.
fn compile_into(
    template: &TemplateRef,
    invoker: &str,
    input: Option<usize>,
    tasks: &mut Vec<PlanTask>,
) -> usize {
    let push = |tasks: &mut Vec<PlanTask>, deps: Vec<usize>, kind: TaskKind| {
        let id = tasks.len();
        tasks.push(PlanTask { id, deps, kind });
        id
    };
    match template {
        TemplateRef::Name(name) => push(
            tasks,
            input.into_iter().collect(),
            TaskKind::Invoke {
                template: name.clone(),
                invoker: invoker.to_owned(),
                input,
            },
        ),
        TemplateRef::MapOver { map, over } => push(
            tasks,
            input.into_iter().collect(),
            TaskKind::MapOver {
                template: map.clone(),
                invoker: invoker.to_owned(),
                over: over.clone(),
                input,
            },
        ),
        TemplateRef::Chain(steps) => {
            let mut current = input;
            let mut last = None;
            for (i, step) in steps.iter().enumerate() {
                if i > 0 {
                    let from = last.unwrap_or_default();
                    current = Some(push(tasks, vec![from], TaskKind::Glue { from }));
                }
                last = Some(compile_into(step, invoker, current, tasks));
            }
            // An empty chain is rejected when the flow is validated.
            last.unwrap_or_else(|| input.unwrap_or_default())
        }
        TemplateRef::Map(branches) => {
            let from: Vec<usize> = branches
                .iter()
                .map(|(_, t)| compile_into(t, invoker, input, tasks))
                .collect();
            push(
                tasks,
                from.clone(),
                TaskKind::Combine {
                    keys: branches.iter().map(|(k, _)| k.clone()).collect(),
                    from,
                },
            )
        }
    }
}

/// Compiles an invoker state's template into a plan ending in the
/// completion task.
pub fn compile(
    template: &TemplateRef,
    invoker: &str,
    invocation_id: String,
    chain_id: String,
    state: String,
    label: String,
    context: Value,
) -> DagPlan {
    let mut tasks = Vec::new();
    let last = compile_into(template, invoker, None, &mut tasks);
    let id = tasks.len();
    tasks.push(PlanTask {
        id,
        deps: vec![last],
        kind: TaskKind::Complete { from: last },
    });
    DagPlan {
        invocation_id,
        chain_id,
        state,
        label,
        context,
        tasks,
    }
}

/// A string parsed as JSON when it is JSON, else kept as a string.
pub(crate) fn parse_or_string(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.to_owned()))
}

/// The drag-net a chain step hands the next one.
pub fn glue(previous: &str) -> Value {
    json!({
        "previous_result": previous,
        "parsed_previous_result": serde_json::from_str::<Value>(previous).ok(),
    })
}

/// A map's branch results combined into a JSON object text, keys in
/// declaration order, written as the reference's `json.dumps` writes it.
pub fn combine(keys: &[String], results: &[String]) -> String {
    let obj: serde_json::Map<String, Value> = keys
        .iter()
        .zip(results)
        .map(|(k, r)| (k.clone(), parse_or_string(r)))
        .collect();
    pyjson::dumps(&Value::Object(obj))
}

/// The drag-net of one map element.
pub fn map_element(index: usize, value: &Value) -> Value {
    json!({"map_index": index, "map_value": value})
}

/// A map-over-list's results, in element order, as a JSON list text written
/// as the reference's `json.dumps` writes it.
pub fn map_results(results: &[String]) -> String {
    pyjson::dumps(&Value::Array(
        results.iter().map(|r| parse_or_string(r)).collect(),
    ))
}

/// The render data of one task: the plan's context with a drag-net object
/// merged over it.
pub fn task_context(context: &Value, drag_net: Option<&Value>) -> Value {
    let mut base = context.clone();
    if let (Value::Object(b), Some(Value::Object(d))) = (&mut base, drag_net) {
        for (k, v) in d {
            b.insert(k.clone(), v.clone());
        }
    }
    base
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(n: &str) -> TemplateRef {
        TemplateRef::Name(n.to_owned())
    }

    fn total(t: &TemplateRef) -> u64 {
        compile(
            t,
            "template",
            "s-1".into(),
            "s-1".into(),
            "s".into(),
            "s".into(),
            json!({}),
        )
        .counted_tasks()
    }

    #[test]
    fn task_counts_match_the_reference() {
        assert_eq!(total(&name("a")), 2);
        assert_eq!(total(&TemplateRef::Chain(vec![name("a"), name("b")])), 4);
        assert_eq!(
            total(&TemplateRef::Map(vec![
                ("x".into(), name("x")),
                ("y".into(), name("y"))
            ])),
            4
        );
        assert_eq!(
            total(&TemplateRef::Chain(vec![
                name("a"),
                TemplateRef::Map(vec![("x".into(), name("x")), ("y".into(), name("y"))])
            ])),
            6
        );
        assert_eq!(
            total(&TemplateRef::MapOver {
                map: "m".into(),
                over: "items".into()
            }),
            2
        );
    }

    #[test]
    fn map_branches_inside_a_chain_share_the_glue() {
        let plan = compile(
            &TemplateRef::Chain(vec![
                name("a"),
                TemplateRef::Map(vec![("x".into(), name("x")), ("y".into(), name("y"))]),
            ]),
            "template",
            "s-1".into(),
            "s-1".into(),
            "s".into(),
            "s".into(),
            json!({}),
        );
        let inputs: Vec<_> = plan
            .tasks
            .iter()
            .filter_map(|t| match &t.kind {
                TaskKind::Invoke {
                    template, input, ..
                } => Some((template.as_str(), *input)),
                _ => None,
            })
            .collect();
        assert_eq!(inputs, [("a", None), ("x", Some(1)), ("y", Some(1))]);
        assert!(plan.tasks.iter().all(|t| t.deps.iter().all(|d| *d < t.id)));
    }

    #[test]
    fn glue_and_combine_parse_json_results() {
        assert_eq!(
            glue("{\"a\":1}"),
            json!({"previous_result": "{\"a\":1}", "parsed_previous_result": {"a": 1}})
        );
        assert_eq!(glue("text")["parsed_previous_result"], Value::Null);
        assert_eq!(
            combine(&["x".into(), "y".into()], &["1".into(), "plain".into()]),
            r#"{"x": 1, "y": "plain"}"#
        );
        assert_eq!(map_results(&["[1]".into(), "b".into()]), r#"[[1], "b"]"#);
    }

    /// Expected texts printed by Python's `json.dumps` on the same parsed
    /// results (`json.loads` where it parses, else the text).
    #[test]
    fn combined_results_are_written_like_json_dumps_in_declaration_order() {
        assert_eq!(
            combine(
                &["z".into(), "a".into(), "m".into()],
                &[
                    r#"{"b": 1.0, "a": "\u00e9", "n": 1e16}"#.into(),
                    "plain".into(),
                    "[2, 0.5]".into()
                ]
            ),
            r#"{"z": {"b": 1.0, "a": "\u00e9", "n": 1e+16}, "a": "plain", "m": [2, 0.5]}"#
        );
        assert_eq!(
            map_results(&[
                "[1]".into(),
                "b".into(),
                r#"{"y":1,"x":2}"#.into(),
                "3.0".into()
            ]),
            r#"[[1], "b", {"y": 1, "x": 2}, 3.0]"#
        );
    }
}
