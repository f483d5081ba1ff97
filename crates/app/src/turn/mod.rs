//! The turn runtime's executor: runs a [`Graph`] of async stages over a
//! typed turn state, times each stage into the state's diagnostics, and
//! commits the turn's checkpoint delta, re-running the turn on the new state
//! when another turn on the same thread committed first.
//!
//! The pure parts (state, reducers, graph, ranking) live in
//! `parlance_core::turn`; storage is behind the `Checkpointer` and
//! `MemoryStore` ports. [`retrieve_hybrid`] is the seam between the memory
//! store and whatever embedding provider the app has.

pub mod echo;
mod retrieval;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use parlance_core::turn::{
    Graph, GraphError, LoadWindow, ThreadKey, TurnError, TurnView, begin_turn, finish_turn,
};
use parlance_ports::{Checkpointer, PortError};
use serde::Serialize;

pub use retrieval::{QueryEmbedder, RetrievalReport, retrieve_hybrid};

/// A stage failed; its message says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct StageError(pub String);

impl StageError {
    /// A stage error with `message`.
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
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

/// Why a turn did not complete.
#[derive(Debug, thiserror::Error)]
pub enum TurnRunError {
    /// The graph names a stage no implementation was given for.
    #[error("stage {0} has no implementation")]
    MissingStage(&'static str),
    /// A stage failed.
    #[error("stage {stage} failed: {source}")]
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
    /// Loading or committing the checkpoint failed.
    #[error("checkpoint: {0}")]
    Port(#[from] PortError),
    /// Every attempt lost its commit to another turn on the thread.
    #[error("turn lost its commit {attempts} times in a row")]
    Contended {
        /// Attempts made.
        attempts: u32,
    },
}

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
    /// Bytes the commit wrote.
    pub bytes_written: usize,
    /// Every stage's wall time, in execution order (last attempt).
    pub timings: Vec<StageTiming>,
    /// The whole turn's wall time in milliseconds (last attempt).
    pub total_millis: f64,
}

/// Runs turns of one graph against one checkpointer.
pub struct TurnRunner<S: TurnView, C: ?Sized> {
    graph: Graph<S>,
    stages: HashMap<&'static str, Arc<dyn Stage<S, C>>>,
    checkpointer: Arc<dyn Checkpointer>,
    window: LoadWindow,
    max_attempts: u32,
}

impl<S, C> TurnRunner<S, C>
where
    S: TurnView + Send + Sync,
    S::Delta: Send,
    S::Input: Clone,
    S::Loaded: Clone,
    C: Sync + ?Sized,
{
    /// A runner for `graph`; add an implementation per stage with
    /// [`TurnRunner::stage`].
    pub fn new(graph: Graph<S>, checkpointer: Arc<dyn Checkpointer>) -> Self {
        Self {
            graph,
            stages: HashMap::new(),
            checkpointer,
            window: S::load_window(),
            max_attempts: 8,
        }
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

    /// How many times a turn runs before a lost commit is given up (default 8).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// The graph.
    pub fn graph(&self) -> &Graph<S> {
        &self.graph
    }

    /// Runs one turn on `key`'s thread: load, begin, the graph's steps,
    /// finish, commit. A lost commit re-runs the whole turn on the new
    /// checkpoint (stages may therefore run more than once).
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
        let mut attempts = 0;
        while attempts < self.max_attempts {
            attempts += 1;
            let started = Instant::now();
            let checkpoint = self.checkpointer.load(key, &self.window).await?;
            let mut state: S = begin_turn(&checkpoint, input.clone(), loaded.clone())?;
            let timings = self.run_graph(ctx, &mut state).await?;
            let total_millis = started.elapsed().as_secs_f64() * 1000.0;
            state.record_stage_time("turn_total", total_millis);
            let (output, delta) = finish_turn(state)?;
            match self
                .checkpointer
                .commit(key, checkpoint.version, &delta)
                .await
            {
                Ok(committed) => {
                    return Ok(TurnReport {
                        output,
                        version: committed.version,
                        attempts,
                        bytes_written: committed.bytes_written,
                        timings,
                        total_millis,
                    });
                }
                Err(e) if e.is_conflict() => {
                    tracing::debug!(thread = %key.thread, attempts, "turn lost its commit, re-running");
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(TurnRunError::Contended { attempts })
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
