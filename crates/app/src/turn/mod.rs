//! The turn runtime's executor: runs a [`Graph`] of async stages over a
//! typed turn state, times each stage into the state's diagnostics, and
//! commits the turn's checkpoint delta through the one executor
//! ([`Executor::run_with`]): the thread is loaded, the turn planned on it
//! (the graph run), and its [`TurnCommand::CommitTurn`] decided and
//! committed; a commit lost to another turn on the thread runs the turn
//! again on the new checkpoint, with the executor's retry policy.
//!
//! The pure parts (state, reducers, graph, ranking, the thread machine)
//! live in `parlance_core::turn`; storage is behind `MachineStore<Checkpoint>`
//! and the `MemoryStore` port. [`retrieve_hybrid`] is the seam between the
//! memory store and whatever embedding provider the app has.

pub mod echo;
mod retrieval;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use async_trait::async_trait;
use parlance_core::turn::{
    Checkpoint, CheckpointDelta, Graph, GraphError, LoadWindow, ThreadKey, TurnCommand, TurnError,
    TurnKey, TurnView, begin_turn, finish_turn,
};
use parlance_ports::{Clock, MachineStore, PortError};
use serde::Serialize;

pub use retrieval::{QueryEmbedder, RetrievalReport, retrieve_hybrid};

use crate::execute::{Executor, ServiceError};

/// A runtime dependency a stage calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dependency {
    /// The long-term memory store.
    MemoryStore,
    /// Where crisis assessments are logged.
    CrisisLog,
    /// A language model.
    Model,
    /// The embedding provider.
    Embedder,
}

impl fmt::Display for Dependency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Dependency::MemoryStore => "memory store",
            Dependency::CrisisLog => "crisis log",
            Dependency::Model => "model",
            Dependency::Embedder => "embedder",
        })
    }
}

/// Why a stage failed.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// A dependency the stage needs failed.
    #[error("the {dependency} failed")]
    Port {
        /// Which one.
        dependency: Dependency,
        /// Its error.
        source: PortError,
    },
    /// The state holds a combination of values the stage cannot act on.
    #[error("{field}: {problem}")]
    State {
        /// The field (its schema name).
        field: &'static str,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// A field's value does not decode into what the stage expects.
    #[error("{field} does not decode")]
    Decode {
        /// The field (its schema name).
        field: &'static str,
        /// The decoder's error.
        source: serde_json::Error,
    },
}

impl StageError {
    /// A failure of `dependency`, for `map_err`.
    pub fn port(dependency: Dependency) -> impl Fn(PortError) -> StageError + Copy {
        move |source| StageError::Port { dependency, source }
    }
}

/// One stage of a graph: reads the state (and the runtime context `C`) and
/// returns a delta. Stages never mutate the state.
#[async_trait]
pub trait Stage<S, C>: Send + Sync
where
    S: TurnView + Sync,
    S::Delta: Send,
    C: Sync + ?Sized,
{
    /// Runs the stage.
    async fn run(&self, state: &S, ctx: &C) -> Result<S::Delta, StageError>;
}

/// A stage from a plain function of the state (no I/O).
pub struct PureStage<F>(pub F);

#[async_trait]
impl<S, C, F> Stage<S, C> for PureStage<F>
where
    S: TurnView + Sync,
    S::Delta: Send,
    C: Sync + ?Sized,
    F: Fn(&S) -> S::Delta + Send + Sync,
{
    async fn run(&self, state: &S, _ctx: &C) -> Result<S::Delta, StageError> {
        Ok((self.0)(state))
    }
}

/// Why a turn did not complete. Nothing was committed.
#[derive(Debug, thiserror::Error)]
pub enum TurnRunError {
    /// The graph names a stage no implementation was given for.
    #[error("stage {0} has no implementation")]
    MissingStage(&'static str),
    /// A stage failed: the turn could not be planned, and may succeed when
    /// run again.
    #[error("stage {stage} failed")]
    Stage {
        /// The stage.
        stage: &'static str,
        /// Why.
        source: StageError,
    },
    /// Merging deltas or encoding the checkpoint failed.
    #[error(transparent)]
    Turn(#[from] TurnError),
    /// The graph could not go on (step limit, undeclared route).
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// Loading or committing the thread failed: a port failed, every
    /// attempt lost its commit to another turn, or the thread refused it.
    #[error(transparent)]
    Service(#[from] ServiceError<Checkpoint>),
    /// The request's time budget ran out before the turn could commit.
    #[error("the turn's time budget ran out before its commit")]
    Deadline,
}

/// What a turn's commit writes besides its reducer fields, from the turn's
/// final state: more delta lists for the thread store, such as the
/// crisis-log entries of
/// [`CRISIS_LOG_DELTA`](parlance_ports::CRISIS_LOG_DELTA), which commit
/// with the turn or not at all.
pub type Outbox<S, C> = Arc<dyn Fn(&S, &C) -> Result<CheckpointDelta, StageError> + Send + Sync>;

/// The name a failing [`Outbox`] is reported under.
pub const OUTBOX: &str = "outbox";

/// One stage's wall time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StageTiming {
    /// The step it ran in (1 first).
    pub step: usize,
    /// The stage.
    pub stage: &'static str,
    /// Wall time in milliseconds.
    pub millis: f64,
}

/// What a completed turn reports besides its output.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TurnReport<O> {
    /// The output view.
    pub output: O,
    /// The thread's version after the commit.
    pub version: u64,
    /// How many times the turn ran (1 unless a commit conflicted).
    pub attempts: u32,
    /// The bytes of the turn's delta as JSON
    /// ([`CheckpointDelta::encoded_len`](parlance_core::turn::CheckpointDelta::encoded_len)):
    /// the list entries and objects the commit wrote, and nothing of what
    /// the thread already held.
    pub bytes_written: usize,
    /// Every stage's wall time, in execution order (last attempt).
    pub timings: Vec<StageTiming>,
    /// The turn's wall time in milliseconds, from the loaded checkpoint to
    /// the delta (last attempt).
    pub total_millis: f64,
}

/// What the last planned attempt of a turn produced besides its command.
struct Planned<O> {
    output: O,
    bytes_written: usize,
    timings: Vec<StageTiming>,
    total_millis: f64,
}

/// Stands in for a fault the runner keeps aside (a broken graph or state):
/// it only stops the executor, and never leaves [`TurnRunner::run`].
#[derive(Debug, thiserror::Error)]
#[error("the turn stopped on a fault of its graph or state")]
struct Stopped;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs turns of one graph against one thread store.
pub struct TurnRunner<S: TurnView, C: ?Sized> {
    graph: Graph<S>,
    stages: HashMap<&'static str, Arc<dyn Stage<S, C>>>,
    store: Arc<dyn MachineStore<Checkpoint>>,
    clock: Arc<dyn Clock>,
    window: LoadWindow,
    outbox: Option<Outbox<S, C>>,
}

impl<S, C> TurnRunner<S, C>
where
    S: TurnView + Send + Sync,
    S::Delta: Send,
    S::Input: Clone + Send,
    S::Loaded: Clone + Send,
    S::Output: Send,
    C: Sync + ?Sized,
{
    /// A runner for `graph` on the threads in `store`, deciding commits at
    /// `clock`'s time; add an implementation per stage with
    /// [`TurnRunner::stage`].
    pub fn new(
        graph: Graph<S>,
        store: Arc<dyn MachineStore<Checkpoint>>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            graph,
            stages: HashMap::new(),
            store,
            clock,
            window: S::load_window(),
            outbox: None,
        }
    }

    /// What each turn's commit writes besides its reducer fields
    /// ([`Outbox`]), computed from the turn's final state on every attempt.
    pub fn outbox(
        mut self,
        f: impl Fn(&S, &C) -> Result<CheckpointDelta, StageError> + Send + Sync + 'static,
    ) -> Self {
        self.outbox = Some(Arc::new(f));
        self
    }

    /// The implementation of stage `name`.
    pub fn stage(mut self, name: &'static str, stage: impl Stage<S, C> + 'static) -> Self {
        self.stages.insert(name, Arc::new(stage));
        self
    }

    /// Which lists to load only in part (default: what the state's `window`
    /// fields need, see `TurnState::load_window`).
    pub fn window(mut self, window: LoadWindow) -> Self {
        self.window = window;
        self
    }

    /// The graph.
    pub fn graph(&self) -> &Graph<S> {
        &self.graph
    }

    /// Runs one turn on `key`'s thread through the executor: load, begin,
    /// the graph's steps, finish, commit. A lost commit re-runs the whole
    /// turn on the new checkpoint (stages may therefore run more than once).
    /// Under a request's deadline ([`crate::budget::current`]), a turn
    /// planned after it passed is not committed.
    ///
    /// # Errors
    ///
    /// [`TurnRunError::Stage`] when a stage fails; `MissingStage`, `Graph`
    /// or `Turn` for a graph or state that cannot run; `Service` when the
    /// thread cannot be loaded or committed (contended, a port failure);
    /// `Deadline` when the request's budget ran out before the commit.
    pub async fn run(
        &self,
        ctx: &C,
        key: &ThreadKey,
        input: S::Input,
        loaded: S::Loaded,
    ) -> Result<TurnReport<S::Output>, TurnRunError> {
        for s in self.graph.stages() {
            if !self.stages.contains_key(s) {
                return Err(TurnRunError::MissingStage(s));
            }
        }
        let key = TurnKey::new(key.clone(), self.window.clone());
        // Filled by each attempt's plan; by reference, so the plan's future
        // stays `Send`.
        let planned: Mutex<Option<Planned<S::Output>>> = Mutex::new(None);
        let fault: Mutex<Option<TurnRunError>> = Mutex::new(None);
        let executor = Executor::new(self.store.as_ref(), self.clock.as_ref());
        let result = executor
            .run_with(&key, &(), |stored| {
                let started = Instant::now();
                let (base, begun) = match stored {
                    Some(s) => (
                        s.version.0,
                        begin_turn::<S>(&s.state, input.clone(), loaded.clone()),
                    ),
                    None => (
                        0,
                        begin_turn::<S>(&Checkpoint::default(), input.clone(), loaded.clone()),
                    ),
                };
                let (planned, fault) = (&planned, &fault);
                async move {
                    let planned_in_time = self.plan(ctx, begun, started).await.and_then(|p| {
                        let late =
                            crate::budget::current().is_some_and(|d| d.expired(Instant::now()));
                        if late {
                            Err(TurnRunError::Deadline)
                        } else {
                            Ok(p)
                        }
                    });
                    match planned_in_time {
                        Ok((delta, plan)) => {
                            *lock(planned) = Some(plan);
                            Ok(Some(TurnCommand::commit(base, delta)))
                        }
                        Err(e @ (TurnRunError::Stage { .. } | TurnRunError::Deadline)) => {
                            Err(ServiceError::Planning(Box::new(e)))
                        }
                        Err(e) => {
                            *lock(fault) = Some(e);
                            Err(ServiceError::Planning(Box::new(Stopped)))
                        }
                    }
                }
            })
            .await;
        if let Some(e) = lock(&fault).take() {
            return Err(e);
        }
        let executed = match result {
            Ok(executed) => executed,
            Err(ServiceError::Planning(cause)) => {
                return Err(match cause.downcast::<TurnRunError>() {
                    Ok(stage) => *stage,
                    Err(cause) => ServiceError::Planning(cause).into(),
                });
            }
            Err(e) => return Err(e.into()),
        };
        let Planned {
            output,
            bytes_written,
            timings,
            total_millis,
        } = lock(&planned).take().expect("a committed turn was planned");
        Ok(TurnReport {
            output,
            version: executed.version.0,
            attempts: executed.attempts,
            bytes_written,
            timings,
            total_millis,
        })
    }

    /// Plans one attempt on the begun state: the graph's steps, the turn's
    /// total time, then the output and the delta to commit.
    async fn plan(
        &self,
        ctx: &C,
        begun: Result<S, TurnError>,
        started: Instant,
    ) -> Result<(CheckpointDelta, Planned<S::Output>), TurnRunError> {
        let mut state = begun?;
        let timings = self.run_graph(ctx, &mut state).await?;
        let total_millis = started.elapsed().as_secs_f64() * 1000.0;
        state.record_stage_time("turn_total", total_millis);
        let carried = match &self.outbox {
            Some(outbox) => outbox(&state, ctx).map_err(|source| TurnRunError::Stage {
                stage: OUTBOX,
                source,
            })?,
            None => CheckpointDelta::default(),
        };
        let (output, delta) = finish_turn(state)?;
        let delta = delta.then(&carried);
        let plan = Planned {
            output,
            bytes_written: delta.encoded_len(),
            timings,
            total_millis,
        };
        Ok((delta, plan))
    }

    /// Walks the graph: each step's stages run concurrently, their deltas
    /// merge in the step's (declaration) order, their times go into the
    /// state's diagnostics.
    async fn run_graph(&self, ctx: &C, state: &mut S) -> Result<Vec<StageTiming>, TurnRunError> {
        let mut timings = Vec::new();
        let mut run = self.graph.start();
        while let Some(step) = run.current().cloned() {
            let shared: &S = state;
            let results = futures::future::join_all(step.stages.iter().map(|name| async move {
                let stage = self
                    .stages
                    .get(name)
                    .ok_or(TurnRunError::MissingStage(name))?;
                let t = Instant::now();
                let delta = stage
                    .run(shared, ctx)
                    .await
                    .map_err(|source| TurnRunError::Stage {
                        stage: name,
                        source,
                    })?;
                Ok::<_, TurnRunError>((*name, delta, t.elapsed().as_secs_f64() * 1000.0))
            }))
            .await;
            let mut writes = Vec::with_capacity(results.len());
            let mut step_times = Vec::with_capacity(results.len());
            for r in results {
                let (name, delta, millis) = r?;
                writes.push((name, delta));
                step_times.push((name, millis));
            }
            state.apply(writes)?;
            for (stage, millis) in step_times {
                state.record_stage_time(stage, millis);
                timings.push(StageTiming {
                    step: step.number,
                    stage,
                    millis,
                });
            }
            run.advance(state)?;
        }
        Ok(timings)
    }
}
