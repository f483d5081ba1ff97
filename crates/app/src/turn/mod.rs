//! The turn runtime's executor: runs a [`Graph`] of async stages over a
//! typed turn state, times each stage into the state's diagnostics, and
//! commits the turn's checkpoint delta through the one executor
//! ([`Executor::run_with`]): the thread is loaded, the turn planned on it
//! (the graph run), and its [`TurnCommand::CommitTurn`] decided and
//! committed; a commit lost to another turn on the thread runs the turn
//! again on the new checkpoint, with the executor's retry policy.
//!
//! A stage may stop the turn to wait for a person
//! ([`StageError::Interrupt`]): what the turn gained before that step is
//! committed with the thread's pending interrupt, and
//! [`TurnRunner::resume`] later runs the step again (the stopping stage
//! through [`Stage::resume`], with the answer) and the rest of the graph.
//! A turn may report what it does as it runs ([`TurnEvent`], to a
//! [`TurnEvents`] sink).
//!
//! The pure parts (state, reducers, graph, ranking, the thread machine)
//! live in `parlance_core::turn`; storage is behind `MachineStore<Checkpoint>`
//! and the `MemoryStore` port. [`retrieve_hybrid`] is the seam between the
//! memory store and whatever embedding provider the app has.

pub mod echo;
mod events;
mod retrieval;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use async_trait::async_trait;
use parlance_core::Machine as _;
use parlance_core::turn::{
    Checkpoint, CheckpointDelta, Graph, GraphError, GraphRun, LoadWindow, PendingInterrupt,
    ThreadKey, TurnCommand, TurnError, TurnKey, TurnView, begin_turn, finish_turn,
};
use parlance_ports::{Clock, MachineStore, PortError, Stored};
use serde::Serialize;
use serde_json::Value;

pub use events::{TurnEvent, TurnEvents, complete, streaming, token};
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
    /// Not a failure: the stage stops the turn to wait for a person's
    /// answer to `payload`. The step's deltas are dropped, what the turn
    /// gained before it is committed with the interrupt pending, and the
    /// step runs again when the thread is resumed ([`Stage::resume`]).
    #[error("the stage waits for an answer")]
    Interrupt {
        /// What the stage asks (JSON the person's client shows).
        payload: Value,
    },
    /// The stage was resumed but does not take answers.
    #[error("the stage cannot be resumed")]
    NoResume,
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

    /// Runs the stage again in a resumed turn, given what it asked when it
    /// stopped the turn (`asked`, its interrupt's payload) and the person's
    /// answer (`value`). It may stop the turn again. By default a stage
    /// takes no answers ([`StageError::NoResume`]).
    async fn resume(
        &self,
        state: &S,
        ctx: &C,
        asked: &Value,
        value: &Value,
    ) -> Result<S::Delta, StageError> {
        let _ = (state, ctx, asked, value);
        Err(StageError::NoResume)
    }
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
/// [`CRISIS_LOG_DELTA`](parlance_ports::CRISIS_LOG_DELTA) or the memory
/// entries of [`FORGET_MEMORY_DELTA`](parlance_ports::FORGET_MEMORY_DELTA),
/// which commit with the turn or not at all. It runs for every commit of a
/// turn: its first ([`OutboxCommit::Turn`], for an interrupted turn from
/// the state before the interrupted step) and each resume
/// ([`OutboxCommit::Resume`]).
pub type Outbox<S, C> =
    Arc<dyn Fn(&S, &C, OutboxCommit) -> Result<CheckpointDelta, StageError> + Send + Sync>;

/// Which commit of a turn an [`Outbox`] writes for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutboxCommit {
    /// The turn's first commit (whole, or up to an interrupt).
    Turn,
    /// The commit of a resume of an interrupted turn.
    Resume,
}

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

/// What a committed turn reports besides its output.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TurnReport<O> {
    /// The output view (of the state before the interrupted step, when a
    /// stage stopped the turn: [`TurnView::interrupted`]).
    pub output: O,
    /// What the stage that stopped the turn asks, when one did; the thread
    /// then waits to be resumed ([`TurnRunner::resume`]).
    pub interrupt: Option<Value>,
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
    interrupt: Option<Value>,
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

/// What a turn starts from: a new message, or an answer to its thread's
/// pending interrupt.
enum Start<I, L> {
    New { input: I, loaded: L },
    Resume { value: Value },
}

/// The stage an attempt resumes, with what it asked and the answer.
struct Resuming {
    stage: &'static str,
    asked: Value,
    value: Value,
}

/// An attempt ready to run: its base version, its state, where its run
/// stands, and the stage it resumes.
struct Ready<'g, S> {
    base: u64,
    state: S,
    run: GraphRun<'g, S>,
    resuming: Option<Resuming>,
}

/// Where a stage stopped the turn.
struct Stop {
    stage: &'static str,
    step: parlance_core::turn::Step,
    payload: Value,
}

/// The machine's refusal of `probe` on `stored`, as the executor reports a
/// refusal (the thread refuses it with `reason` if deciding does not).
fn refusal(
    stored: &Stored<Checkpoint>,
    probe: &TurnCommand,
    reason: &'static str,
    now: parlance_core::Timestamp,
) -> ServiceError<Checkpoint> {
    let error = match stored.state.clone().decide(&(), probe, now) {
        Err(e) => e,
        Ok(_) => TurnError::NotAllowed(
            parlance_core::NotAllowed::new(
                parlance_core::Command::name(probe),
                parlance_core::turn::OPEN,
            )
            .because(reason),
        ),
    };
    ServiceError::refused(error, Some(stored.clone()))
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
    S::Input: Clone + Send + Sync,
    S::Loaded: Clone + Send + Sync,
    S::Output: Send + Serialize,
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
        f: impl Fn(&S, &C, OutboxCommit) -> Result<CheckpointDelta, StageError> + Send + Sync + 'static,
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
    /// planned after it passed is not committed. A stage that stops the
    /// turn ([`StageError::Interrupt`]) leaves it committed up to the step
    /// it stopped in, its report carrying the interrupt.
    ///
    /// # Errors
    ///
    /// [`TurnRunError::Stage`] when a stage fails; `MissingStage`, `Graph`
    /// or `Turn` for a graph or state that cannot run; `Service` when the
    /// thread cannot be loaded or committed (contended, a port failure), or
    /// refuses the turn: while an earlier turn waits on an interrupt, the
    /// thread's refusal (reason
    /// [`INTERRUPT_PENDING`](parlance_core::turn::INTERRUPT_PENDING)),
    /// before any stage runs; `Deadline` when the request's budget ran out
    /// before the commit.
    pub async fn run(
        &self,
        ctx: &C,
        key: &ThreadKey,
        input: S::Input,
        loaded: S::Loaded,
    ) -> Result<TurnReport<S::Output>, TurnRunError> {
        self.run_reporting(ctx, key, input, loaded, None).await
    }

    /// [`TurnRunner::run`], reporting to `events` as the turn runs: each
    /// stage's start and finish, model tokens (from stages that call
    /// [`complete`]), then once committed the interrupt (if any) and the
    /// output. On an error nothing more is sent: the caller reports it.
    ///
    /// # Errors
    ///
    /// As [`TurnRunner::run`].
    pub async fn run_reporting(
        &self,
        ctx: &C,
        key: &ThreadKey,
        input: S::Input,
        loaded: S::Loaded,
        events: Option<&TurnEvents>,
    ) -> Result<TurnReport<S::Output>, TurnRunError> {
        self.execute(ctx, key, Start::New { input, loaded }, events)
            .await
    }

    /// Resumes the turn `key`'s thread waits on with the person's answer
    /// `value`: the state rebuilt (reducer fields from the checkpoint, the
    /// rest as the turn left them), the step it stopped in run again (the
    /// stopping stage through [`Stage::resume`], the step's others as
    /// usual), then the rest of the graph, committed as the thread's
    /// [`TurnCommand::ResumeTurn`] on the version it was loaded at. Of two
    /// racing resumes one commits; the other, decided again on the thread
    /// as it now is, is refused.
    ///
    /// # Errors
    ///
    /// As [`TurnRunner::run`]; `Service` with the thread's refusal (reason
    /// [`NO_INTERRUPT`](parlance_core::turn::NO_INTERRUPT)) when no turn
    /// waits, or `NotFound` for a thread that does not exist; `Graph` when
    /// the stored step is not one of this graph's.
    pub async fn resume(
        &self,
        ctx: &C,
        key: &ThreadKey,
        value: Value,
    ) -> Result<TurnReport<S::Output>, TurnRunError> {
        self.resume_reporting(ctx, key, value, None).await
    }

    /// [`TurnRunner::resume`], reporting to `events` as
    /// [`TurnRunner::run_reporting`] does.
    ///
    /// # Errors
    ///
    /// As [`TurnRunner::resume`].
    pub async fn resume_reporting(
        &self,
        ctx: &C,
        key: &ThreadKey,
        value: Value,
        events: Option<&TurnEvents>,
    ) -> Result<TurnReport<S::Output>, TurnRunError> {
        self.execute(ctx, key, Start::Resume { value }, events)
            .await
    }

    async fn execute(
        &self,
        ctx: &C,
        key: &ThreadKey,
        start: Start<S::Input, S::Loaded>,
        events: Option<&TurnEvents>,
    ) -> Result<TurnReport<S::Output>, TurnRunError> {
        for s in self.graph.stages() {
            if !self.stages.contains_key(s) {
                return Err(TurnRunError::MissingStage(s));
            }
        }
        let key = TurnKey::new(key.clone(), self.window.clone());
        let fresh = matches!(start, Start::New { .. });
        // Filled by each attempt's plan; by reference, so the plan's future
        // stays `Send`.
        let planned: Mutex<Option<Planned<S::Output>>> = Mutex::new(None);
        let fault: Mutex<Option<TurnRunError>> = Mutex::new(None);
        let executor = Executor::new(self.store.as_ref(), self.clock.as_ref());
        let mut attempt = 0u32;
        let result = executor
            .run_with(&key, &(), |stored| {
                attempt += 1;
                let attempt = attempt;
                let started = Instant::now();
                let prepared = self.prepare(stored, &start);
                let (planned, fault) = (&planned, &fault);
                async move {
                    let ready = prepared?;
                    let planned_in_time = match ready {
                        Ok(ready) => self
                            .plan(ctx, ready, started, attempt, events, fresh)
                            .await
                            .and_then(|p| {
                                let late = crate::budget::current()
                                    .is_some_and(|d| d.expired(Instant::now()));
                                if late {
                                    Err(TurnRunError::Deadline)
                                } else {
                                    Ok(p)
                                }
                            }),
                        Err(e) => Err(e),
                    };
                    match planned_in_time {
                        Ok((command, plan)) => {
                            *lock(planned) = Some(plan);
                            Ok(Some(command))
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
            interrupt,
            bytes_written,
            timings,
            total_millis,
        } = lock(&planned).take().expect("a committed turn was planned");
        if let Some(events) = events {
            if let Some(payload) = &interrupt {
                events.send(TurnEvent::Interrupt {
                    payload: payload.clone(),
                });
            }
            events.send(TurnEvent::Output {
                output: serde_json::to_value(&output).unwrap_or(Value::Null),
            });
        }
        Ok(TurnReport {
            output,
            interrupt,
            version: executed.version.0,
            attempts: executed.attempts,
            bytes_written,
            timings,
            total_millis,
        })
    }

    /// The state and run of one attempt on the loaded thread: a new turn
    /// begun on it, or the interrupted one rebuilt at the step it stopped
    /// in. A thread that does not take it is refused here, before any stage
    /// runs (the outer error); a state or stored step that cannot be rebuilt
    /// is a fault (the inner one).
    #[allow(clippy::type_complexity)]
    fn prepare(
        &self,
        stored: Option<&Stored<Checkpoint>>,
        start: &Start<S::Input, S::Loaded>,
    ) -> Result<Result<Ready<'_, S>, TurnRunError>, ServiceError<Checkpoint>> {
        match start {
            Start::New { input, loaded } => {
                let empty = Checkpoint::default();
                let (base, checkpoint) = match stored {
                    Some(s) => {
                        if s.state.is_interrupted() {
                            let probe =
                                TurnCommand::commit(s.version.0, CheckpointDelta::default());
                            return Err(refusal(
                                s,
                                &probe,
                                parlance_core::turn::INTERRUPT_PENDING,
                                self.clock.now(),
                            ));
                        }
                        (s.version.0, &s.state)
                    }
                    None => (0, &empty),
                };
                Ok(begin_turn::<S>(checkpoint, input.clone(), loaded.clone())
                    .map(|state| Ready {
                        base,
                        state,
                        run: self.graph.start(),
                        resuming: None,
                    })
                    .map_err(TurnRunError::from))
            }
            Start::Resume { value } => {
                let stored = stored.ok_or(ServiceError::NotFound)?;
                let Some(pending) = stored.state.pending_interrupt() else {
                    let probe =
                        TurnCommand::resume(stored.version.0, CheckpointDelta::default(), None);
                    return Err(refusal(
                        stored,
                        &probe,
                        parlance_core::turn::NO_INTERRUPT,
                        self.clock.now(),
                    ));
                };
                Ok(self.rebuild(stored, pending, value))
            }
        }
    }

    /// The interrupted turn of `stored`, ready to run its step again.
    fn rebuild(
        &self,
        stored: &Stored<Checkpoint>,
        pending: PendingInterrupt,
        value: &Value,
    ) -> Result<Ready<'_, S>, TurnRunError> {
        let run = self
            .graph
            .resume_at(pending.step, &pending.stages, pending.join.as_deref())?;
        let stage = run
            .current()
            .and_then(|step| step.stages.iter().copied().find(|s| *s == pending.stage))
            .ok_or_else(|| GraphError::NotInGraph {
                stage: pending.stage.clone(),
            })?;
        let state = S::resume_from(&stored.state, &pending.suspended)?;
        Ok(Ready {
            base: stored.version.0,
            state,
            run,
            resuming: Some(Resuming {
                stage,
                asked: pending.payload,
                value: value.clone(),
            }),
        })
    }

    /// Plans one attempt on the ready state: the graph's steps, the turn's
    /// total time, then the output and the command that commits it (the
    /// whole turn, the turn up to an interrupt, or a resume).
    async fn plan(
        &self,
        ctx: &C,
        ready: Ready<'_, S>,
        started: Instant,
        attempt: u32,
        events: Option<&TurnEvents>,
        fresh: bool,
    ) -> Result<(TurnCommand, Planned<S::Output>), TurnRunError> {
        let Ready {
            base,
            mut state,
            run,
            resuming,
        } = ready;
        let (timings, stop) = self
            .run_graph(ctx, &mut state, run, resuming.as_ref(), attempt, events)
            .await?;
        let commit = if fresh {
            OutboxCommit::Turn
        } else {
            OutboxCommit::Resume
        };
        let carried = match &self.outbox {
            Some(outbox) => outbox(&state, ctx, commit).map_err(|source| TurnRunError::Stage {
                stage: OUTBOX,
                source,
            })?,
            None => CheckpointDelta::default(),
        };
        let (command, output, interrupt, written, total_millis) = match stop {
            None => {
                let total_millis = started.elapsed().as_secs_f64() * 1000.0;
                state.record_stage_time("turn_total", total_millis);
                let (output, delta) = finish_turn(state)?;
                let delta = delta.then(&carried);
                if fresh {
                    let written = delta.encoded_len();
                    (
                        TurnCommand::commit(base, delta),
                        output,
                        None,
                        written,
                        total_millis,
                    )
                } else {
                    let written = delta.clone().with_interrupt(None).encoded_len();
                    (
                        TurnCommand::resume(base, delta, None),
                        output,
                        None,
                        written,
                        total_millis,
                    )
                }
            }
            Some(Stop {
                stage,
                step,
                payload,
            }) => {
                let suspended = state.suspend()?;
                let total_millis = started.elapsed().as_secs_f64() * 1000.0;
                state.record_stage_time("turn_total", total_millis);
                let delta = state.checkpoint_delta()?.then(&carried);
                let output = state.interrupted(&payload);
                let pending = PendingInterrupt {
                    stage: stage.to_owned(),
                    step: step.number,
                    stages: step.stages.iter().map(|s| (*s).to_owned()).collect(),
                    join: step.join().map(str::to_owned),
                    payload: payload.clone(),
                    suspended,
                };
                let written = delta.clone().with_interrupt(Some(&pending)).encoded_len();
                let command = if fresh {
                    TurnCommand::interrupt(base, delta, pending)
                } else {
                    TurnCommand::resume(base, delta, Some(pending))
                };
                (command, output, Some(payload), written, total_millis)
            }
        };
        let plan = Planned {
            output,
            interrupt,
            bytes_written: written,
            timings,
            total_millis,
        };
        Ok((command, plan))
    }

    /// Walks the graph from where `run` stands: each step's stages run
    /// concurrently, their deltas merge in the step's (declaration) order,
    /// their times go into the state's diagnostics. The first step runs
    /// `resuming`'s stage through [`Stage::resume`]. A stage that stops the
    /// turn ends the walk before its step's deltas are applied (a failing
    /// stage of the same step wins over it).
    async fn run_graph(
        &self,
        ctx: &C,
        state: &mut S,
        mut run: GraphRun<'_, S>,
        resuming: Option<&Resuming>,
        attempt: u32,
        events: Option<&TurnEvents>,
    ) -> Result<(Vec<StageTiming>, Option<Stop>), TurnRunError> {
        let mut timings = Vec::new();
        let mut resuming = resuming;
        while let Some(step) = run.current().cloned() {
            let shared: &S = state;
            let here = resuming.take();
            let number = step.number;
            let results = futures::future::join_all(step.stages.iter().map(|name| async move {
                let name: &'static str = name;
                let stage = self
                    .stages
                    .get(name)
                    .ok_or(TurnRunError::MissingStage(name))?;
                if let Some(events) = events {
                    events.send(TurnEvent::StageStarted {
                        attempt,
                        step: number,
                        stage: name,
                    });
                }
                let t = Instant::now();
                let running = match here {
                    Some(r) if r.stage == name => stage.resume(shared, ctx, &r.asked, &r.value),
                    _ => stage.run(shared, ctx),
                };
                let out = match events {
                    Some(events) => {
                        let scope = events::StageScope {
                            events: events.clone(),
                            attempt,
                            stage: name,
                        };
                        events::STAGE.scope(scope, running).await
                    }
                    None => running.await,
                };
                let millis = t.elapsed().as_secs_f64() * 1000.0;
                if let Some(events) = events {
                    events.send(TurnEvent::StageFinished {
                        attempt,
                        step: number,
                        stage: name,
                        millis,
                    });
                }
                Ok::<_, TurnRunError>((name, out, millis))
            }))
            .await;
            let mut writes = Vec::with_capacity(results.len());
            let mut step_times = Vec::with_capacity(results.len());
            let mut stop = None;
            for r in results {
                let (name, out, millis) = r?;
                match out {
                    Ok(delta) => {
                        writes.push((name, delta));
                        step_times.push((name, millis));
                    }
                    Err(StageError::Interrupt { payload }) => {
                        stop.get_or_insert(Stop {
                            stage: name,
                            step: step.clone(),
                            payload,
                        });
                    }
                    Err(source) => {
                        return Err(TurnRunError::Stage {
                            stage: name,
                            source,
                        });
                    }
                }
            }
            if stop.is_some() {
                return Ok((timings, stop));
            }
            state.apply(writes)?;
            for (stage, millis) in step_times {
                state.record_stage_time(stage, millis);
                timings.push(StageTiming {
                    step: number,
                    stage,
                    millis,
                });
            }
            run.advance(state)?;
        }
        Ok((timings, None))
    }
}
