//! Stage graphs as data: stages joined by edges, conditional routes and
//! fan-outs, with a step limit. Executing the stages is the app's job; this
//! module only says which stages run next, given the state.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The pseudo-stage that ends a turn.
pub const END: &str = "__end__";

/// A conditional route: reads the state, names the next stage (or [`END`]).
pub type RouteFn<S> = fn(&S) -> &'static str;

/// What follows a stage.
pub enum Next<S> {
    /// Always this stage (or [`END`]).
    To(&'static str),
    /// Whichever of `targets` the route names.
    Route {
        /// The decision.
        route: RouteFn<S>,
        /// Every stage (or [`END`]) it may name.
        targets: Vec<&'static str>,
    },
    /// These stages, concurrently, as one step; then `join`.
    Fanout {
        /// The stages of the step, in merge order.
        stages: Vec<&'static str>,
        /// What follows the step.
        join: &'static str,
    },
}

impl<S> Clone for Next<S> {
    fn clone(&self) -> Self {
        match self {
            Next::To(s) => Next::To(s),
            Next::Route { route, targets } => Next::Route {
                route: *route,
                targets: targets.clone(),
            },
            Next::Fanout { stages, join } => Next::Fanout {
                stages: stages.clone(),
                join,
            },
        }
    }
}

impl<S> std::fmt::Debug for Next<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Next::To(s) => write!(f, "To({s})"),
            Next::Route { targets, .. } => write!(f, "Route({targets:?})"),
            Next::Fanout { stages, join } => write!(f, "Fanout({stages:?} -> {join})"),
        }
    }
}

/// Why a graph is malformed or a run cannot go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GraphError {
    /// An edge names a stage the graph does not declare.
    #[error("stage {from} leads to undeclared stage {to}")]
    UnknownStage {
        /// The stage the edge leaves.
        from: &'static str,
        /// The missing stage.
        to: &'static str,
    },
    /// A declared stage has no outgoing edge.
    #[error("stage {stage} has no outgoing edge")]
    NoEdge {
        /// The stage.
        stage: &'static str,
    },
    /// A stage was declared twice.
    #[error("stage {stage} is declared twice")]
    Duplicate {
        /// The stage.
        stage: &'static str,
    },
    /// A route named a stage outside its declared targets.
    #[error("route after {from} chose {to}, which is not among its targets")]
    UndeclaredRoute {
        /// The stage the route follows.
        from: &'static str,
        /// What it chose.
        to: &'static str,
    },
    /// A stored step (an interrupted turn's) names a stage this graph no
    /// longer has, or a step it cannot take.
    #[error("the stored step names {stage}, which this graph does not have")]
    NotInGraph {
        /// The stage as stored.
        stage: String,
    },
    /// The turn took more steps than allowed.
    #[error("turn exceeded its limit of {limit} steps")]
    StepLimit {
        /// The limit.
        limit: usize,
    },
}

/// A validated stage graph over state `S`.
///
/// A turn walks it step by step: the caller runs the current step's stages,
/// applies their deltas, and advances with the new state, which routes
/// read:
///
/// ```
/// use parlance_core::turn::{END, Graph};
///
/// struct State {
///     urgent: bool,
/// }
///
/// let graph: Graph<State> = Graph::builder("support")
///     .stage("classify")
///     .stage("escalate")
///     .stage("answer")
///     .stage("recall")
///     .stage("reply")
///     .route(
///         "classify",
///         |s: &State| if s.urgent { "escalate" } else { "answer" },
///         &["escalate", "answer"],
///     )
///     .edge("escalate", END)
///     .fanout("answer", &["recall", "reply"], "escalate")
///     .build()?;
///
/// let state = State { urgent: false };
/// let mut run = graph.start();
/// let mut steps = Vec::new();
/// while let Some(step) = run.current() {
///     steps.push(step.stages.clone()); // run these stages, apply their deltas
///     run.advance(&state)?;
/// }
/// assert_eq!(
///     steps,
///     [vec!["classify"], vec!["answer"], vec!["recall", "reply"], vec!["escalate"]]
/// );
///
/// // An edge to a stage that does not exist is refused when building.
/// assert!(Graph::<State>::builder("bad").stage("a").edge("a", "b").build().is_err());
/// # Ok::<(), parlance_core::turn::GraphError>(())
/// ```
pub struct Graph<S> {
    name: &'static str,
    stages: Vec<&'static str>,
    entry: &'static str,
    edges: BTreeMap<&'static str, Next<S>>,
    step_limit: usize,
}

impl<S> std::fmt::Debug for Graph<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph")
            .field("name", &self.name)
            .field("stages", &self.stages)
            .field("entry", &self.entry)
            .field("edges", &self.edges)
            .field("step_limit", &self.step_limit)
            .finish()
    }
}

/// Builds a [`Graph`].
pub struct GraphBuilder<S> {
    name: &'static str,
    stages: Vec<&'static str>,
    edges: Vec<(&'static str, Next<S>)>,
    step_limit: usize,
}

impl<S> GraphBuilder<S> {
    /// Adds a stage; stages merge their deltas in declaration order.
    pub fn stage(mut self, name: &'static str) -> Self {
        self.stages.push(name);
        self
    }

    /// `from` is always followed by `to` (a stage or [`END`]).
    pub fn edge(mut self, from: &'static str, to: &'static str) -> Self {
        self.edges.push((from, Next::To(to)));
        self
    }

    /// `from` is followed by whatever `route` names among `targets`.
    pub fn route(
        mut self,
        from: &'static str,
        route: RouteFn<S>,
        targets: &[&'static str],
    ) -> Self {
        self.edges.push((
            from,
            Next::Route {
                route,
                targets: targets.to_vec(),
            },
        ));
        self
    }

    /// `from` is followed by `stages` run concurrently as one step, then `join`.
    pub fn fanout(
        mut self,
        from: &'static str,
        stages: &[&'static str],
        join: &'static str,
    ) -> Self {
        self.edges.push((
            from,
            Next::Fanout {
                stages: stages.to_vec(),
                join,
            },
        ));
        self
    }

    /// The most steps one turn may take (default 25).
    pub fn step_limit(mut self, limit: usize) -> Self {
        self.step_limit = limit;
        self
    }

    /// Validates and builds; the first declared stage is the entry.
    pub fn build(self) -> Result<Graph<S>, GraphError> {
        let mut edges = BTreeMap::new();
        for (i, s) in self.stages.iter().enumerate() {
            if self.stages[..i].contains(s) || *s == END {
                return Err(GraphError::Duplicate { stage: s });
            }
        }
        let known = |from: &'static str, to: &'static str| {
            if to == END || self.stages.contains(&to) {
                Ok(())
            } else {
                Err(GraphError::UnknownStage { from, to })
            }
        };
        for (from, next) in self.edges {
            if !self.stages.contains(&from) {
                return Err(GraphError::UnknownStage {
                    from: END,
                    to: from,
                });
            }
            match &next {
                Next::To(to) => known(from, to)?,
                Next::Route { targets, .. } => {
                    for t in targets {
                        known(from, t)?;
                    }
                }
                Next::Fanout { stages, join } => {
                    for t in stages {
                        if *t == END {
                            return Err(GraphError::UnknownStage { from, to: t });
                        }
                        known(from, t)?;
                    }
                    known(from, join)?;
                }
            }
            if edges.insert(from, next).is_some() {
                return Err(GraphError::Duplicate { stage: from });
            }
        }
        // Every stage needs an edge, except fan-out members, whose step is
        // followed by the fan-out's join.
        let fanned: Vec<&'static str> = edges
            .values()
            .flat_map(|n| match n {
                Next::Fanout { stages, .. } => stages.clone(),
                _ => Vec::new(),
            })
            .collect();
        for s in &self.stages {
            if !edges.contains_key(s) && !fanned.contains(s) {
                return Err(GraphError::NoEdge { stage: s });
            }
        }
        let entry = *self
            .stages
            .first()
            .ok_or(GraphError::NoEdge { stage: END })?;
        Ok(Graph {
            name: self.name,
            stages: self.stages,
            entry,
            edges,
            step_limit: self.step_limit,
        })
    }
}

/// One step of a run: the stages to execute now (concurrently), in merge
/// order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// 1 for the first step.
    pub number: usize,
    /// The stages, in merge order.
    pub stages: Vec<&'static str>,
    join: Option<&'static str>,
}

impl Step {
    /// The stage that follows this step when it is a fan-out.
    pub fn join(&self) -> Option<&'static str> {
        self.join
    }
}

impl<S> Graph<S> {
    /// A builder for a graph named `name`.
    pub fn builder(name: &'static str) -> GraphBuilder<S> {
        GraphBuilder {
            name,
            stages: Vec::new(),
            edges: Vec::new(),
            step_limit: 25,
        }
    }

    /// The graph's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The declared stages, in declaration (merge) order.
    pub fn stages(&self) -> &[&'static str] {
        &self.stages
    }

    /// The most steps one turn may take.
    pub fn step_limit(&self) -> usize {
        self.step_limit
    }

    /// The run of one turn, positioned before its first step.
    pub fn start(&self) -> GraphRun<'_, S> {
        GraphRun {
            graph: self,
            next: Some(Step {
                number: 1,
                stages: vec![self.entry],
                join: None,
            }),
        }
    }

    /// The run of an interrupted turn, positioned before the step it stopped
    /// in: step `number`, of the stored `stages` (in merge order) and
    /// `join`, mapped back to this graph's stages.
    ///
    /// # Errors
    ///
    /// [`GraphError::NotInGraph`] when a stored name is not a stage of this
    /// graph, when the step is empty or numbered 0, or when a step of
    /// several stages is not one of the graph's fan-outs.
    pub fn resume_at(
        &self,
        number: usize,
        stages: &[String],
        join: Option<&str>,
    ) -> Result<GraphRun<'_, S>, GraphError> {
        let find = |name: &str| {
            self.stages
                .iter()
                .copied()
                .find(|s| *s == name)
                .ok_or_else(|| GraphError::NotInGraph {
                    stage: name.to_owned(),
                })
        };
        let mapped = stages
            .iter()
            .map(|s| find(s))
            .collect::<Result<Vec<_>, _>>()?;
        let join = join
            .map(|j| if j == END { Ok(END) } else { find(j) })
            .transpose()?;
        let empty = || GraphError::NotInGraph {
            stage: String::new(),
        };
        if number == 0 || mapped.is_empty() {
            return Err(empty());
        }
        if mapped.len() > 1 || join.is_some() {
            // Only a fan-out of this graph runs several stages as one step.
            let fanned = self.edges.values().any(|n| match n {
                Next::Fanout { stages, join: j } => *stages == mapped && Some(*j) == join,
                _ => false,
            });
            if !fanned {
                return Err(GraphError::NotInGraph {
                    stage: stages.join(", "),
                });
            }
        }
        Ok(GraphRun {
            graph: self,
            next: Some(Step {
                number,
                stages: mapped,
                join,
            }),
        })
    }

    /// What follows `step`, given the state after its deltas were applied:
    /// the next step, or `None` at [`END`]. Pure: the same state gives the
    /// same answer.
    pub fn after(&self, step: &Step, state: &S) -> Result<Option<Step>, GraphError> {
        let target = match (step.join, step.stages.as_slice()) {
            (Some(join), _) => Next::To(join),
            (None, [only]) => self
                .edges
                .get(only)
                .cloned()
                .ok_or(GraphError::NoEdge { stage: only })?,
            (None, _) => return Err(GraphError::NoEdge { stage: END }),
        };
        let from = step.stages.first().copied().unwrap_or(END);
        let (stages, join) = match target {
            Next::To(to) => (vec![to], None),
            Next::Route { route, targets } => {
                let to = route(state);
                if !targets.contains(&to) {
                    return Err(GraphError::UndeclaredRoute { from, to });
                }
                (vec![to], None)
            }
            Next::Fanout { stages, join } => (stages, Some(join)),
        };
        if stages == [END] {
            return Ok(None);
        }
        if step.number >= self.step_limit {
            return Err(GraphError::StepLimit {
                limit: self.step_limit,
            });
        }
        Ok(Some(Step {
            number: step.number + 1,
            stages,
            join,
        }))
    }

    /// A Mermaid flowchart of the graph: plain edges solid, route targets
    /// dotted, fan-outs to their stages and from each to the join.
    pub fn to_mermaid(&self) -> String {
        let id = |s: &str| {
            if s == END {
                "END".to_owned()
            } else {
                s.to_owned()
            }
        };
        let mut out = String::from("flowchart TD\n");
        let _ = writeln!(out, "    START([start]) --> {}", id(self.entry));
        for s in &self.stages {
            match self.edges.get(s) {
                Some(Next::To(to)) => {
                    let _ = writeln!(out, "    {} --> {}", id(s), id(to));
                }
                Some(Next::Route { targets, .. }) => {
                    for t in targets {
                        let _ = writeln!(out, "    {} -.-> {}", id(s), id(t));
                    }
                }
                Some(Next::Fanout { stages, join }) => {
                    for t in stages {
                        let _ = writeln!(out, "    {} --> {}", id(s), id(t));
                        let _ = writeln!(out, "    {} --> {}", id(t), id(join));
                    }
                }
                None => {}
            }
        }
        out
    }
}

/// A turn's walk through a graph: ask for the next step, run its stages,
/// apply their deltas, then report the state back.
pub struct GraphRun<'g, S> {
    graph: &'g Graph<S>,
    next: Option<Step>,
}

impl<S> std::fmt::Debug for GraphRun<'_, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphRun")
            .field("next", &self.next)
            .finish()
    }
}

impl<S> GraphRun<'_, S> {
    /// The step to run now, or `None` when the turn reached [`END`].
    pub fn current(&self) -> Option<&Step> {
        self.next.as_ref()
    }

    /// Moves past the current step, given the state after its deltas.
    pub fn advance(&mut self, state: &S) -> Result<(), GraphError> {
        if let Some(step) = self.next.take() {
            self.next = self.graph.after(&step, state)?;
        }
        Ok(())
    }
}
