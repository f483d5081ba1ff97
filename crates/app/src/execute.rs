//! The one way a command reaches a stored machine: load, decide, commit,
//! decided again on the state that won when a compare-and-swap is lost, with
//! bounded, jittered back-off.
//!
//! Commands on one record queue behind each other within the process
//! (`queue`), so a compare-and-swap is lost only to another process.
//!
//! Every machine goes through [`Executor::run`] (a command known up front)
//! or [`Executor::run_with`] (a command planned from the loaded state, when
//! planning needs I/O: a turn's stages). Failures are one typed
//! [`ServiceError`]; only the HTTP routes turn it into an answer.

mod queue;

pub use queue::RecordQueues;

use std::future::Future;
use std::time::Duration;

use parlance_core::{Decision, Machine};
use parlance_ports::{Clock, Commit, MachineStore, PortError, Stored, Version};

/// How often a lost compare-and-swap is decided again, and how long to wait
/// in between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all (the first included).
    pub attempts: u32,
    /// The wait before the second attempt is drawn from `[0, base)`; the
    /// ceiling doubles with every attempt up to `cap`.
    pub base: Duration,
    /// The largest ceiling.
    pub cap: Duration,
}

impl RetryPolicy {
    /// The policy every machine uses: 16 attempts, waits drawn below a
    /// ceiling doubling from 1 ms to 32 ms, so racing writers spread out.
    pub const STANDARD: RetryPolicy = RetryPolicy {
        attempts: 16,
        base: Duration::from_millis(1),
        cap: Duration::from_millis(32),
    };

    /// The wait before attempt `attempt` (1-based; none before the first).
    fn backoff(&self, attempt: u32) -> Duration {
        if attempt <= 1 {
            return Duration::ZERO;
        }
        let ceiling = self
            .base
            .saturating_mul(1 << (attempt - 2).min(16))
            .min(self.cap);
        let ceiling_us = u64::try_from(ceiling.as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        // Jitter only spreads writers out; a failed draw waits half the ceiling.
        let jitter = getrandom::u64().unwrap_or(ceiling_us / 2) % ceiling_us;
        Duration::from_micros(jitter)
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::STANDARD
    }
}

/// Why a command did not land.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError<M: Machine> {
    /// The machine refused the command; nothing changed. `current` is the
    /// record as it is (`None` when it does not exist).
    #[error("{error}")]
    Refused {
        /// The machine's refusal.
        error: M::Error,
        /// The record the command was decided on.
        current: Option<Box<Stored<M>>>,
    },
    /// There is no such record, and this command cannot create one.
    #[error("no such {}", M::KIND)]
    NotFound,
    /// Every attempt lost its compare-and-swap.
    #[error("gave up after {attempts} conflicting commits")]
    Contended {
        /// Attempts made.
        attempts: u32,
    },
    /// Planning the command failed before anything was decided (a model or
    /// a stage); nothing changed.
    #[error("{0}")]
    Planning(Box<dyn std::error::Error + Send + Sync>),
    /// A port failed.
    #[error(transparent)]
    Port(#[from] PortError),
}

impl<M: Machine> ServiceError<M> {
    /// A refusal on the record `current`.
    pub fn refused(error: M::Error, current: Option<Stored<M>>) -> Self {
        ServiceError::Refused {
            error,
            current: current.map(Box::new),
        }
    }
}

/// What a command did, as committed.
#[derive(Debug, Clone)]
pub struct Executed<M: Machine> {
    /// The record after the command.
    pub state: M,
    /// Its version (the loaded one when nothing was committed).
    pub version: Version,
    /// What the command did.
    pub decision: Decision<M>,
    /// Whether anything was written.
    pub committed: bool,
    /// Other records of the machine the commit changed, with their
    /// decisions.
    pub also: Vec<(Stored<M>, Decision<M>)>,
    /// Attempts made (1 unless a compare-and-swap was lost).
    pub attempts: u32,
}

/// The ports an execution needs: the machine's store and the clock.
#[derive(Clone, Copy)]
pub struct Executor<'a, M: Machine> {
    /// Where the machine's records live.
    pub store: &'a dyn MachineStore<M>,
    /// The time every decision is made at.
    pub clock: &'a dyn Clock,
    /// How lost races are retried.
    pub policy: RetryPolicy,
    /// Where commands on one record wait for each other.
    pub queues: &'a RecordQueues,
}

impl<'a, M: Machine> Executor<'a, M> {
    /// An executor with the standard retry policy, queueing commands on
    /// one record with every other executor of this process.
    pub fn new(store: &'a dyn MachineStore<M>, clock: &'a dyn Clock) -> Self {
        Self {
            store,
            clock,
            policy: RetryPolicy::STANDARD,
            queues: RecordQueues::process(),
        }
    }

    /// Loads the record, decides `command` on it (or creates it), and
    /// commits the decision; see [`Executor::run_with`].
    ///
    /// # Errors
    ///
    /// As [`Executor::run_with`].
    pub async fn run(
        &self,
        key: &M::Key,
        ctx: &M::Context,
        command: &M::Command,
    ) -> Result<Executed<M>, ServiceError<M>> {
        self.run_with(key, ctx, |_| async { Ok(Some(command.clone())) })
            .await
    }

    /// Loads the record, asks `plan` for the command to decide on it (or
    /// on nothing, when it does not exist), decides it and commits the
    /// decision with its audit entries and tasks. Other commands of this
    /// process on the same record wait until this one is done. A lost
    /// compare-and-swap (to another process) starts over from the load, so
    /// `plan` may run more than once. `plan`
    /// answering `None` means there is nothing to do: the record is
    /// returned as loaded.
    ///
    /// # Errors
    ///
    /// [`ServiceError::Refused`] when the machine refuses,
    /// [`ServiceError::NotFound`] when there is no record and the command
    /// cannot create one, [`ServiceError::Contended`] when every attempt
    /// lost its race, a planning or port error.
    pub async fn run_with<F, Fut>(
        &self,
        key: &M::Key,
        ctx: &M::Context,
        mut plan: F,
    ) -> Result<Executed<M>, ServiceError<M>>
    where
        F: FnMut(Option<&Stored<M>>) -> Fut,
        Fut: Future<Output = Result<Option<M::Command>, ServiceError<M>>>,
    {
        let attempts = self.policy.attempts.max(1);
        let _turn = self.queues.wait_turn::<M>(key).await;
        for attempt in 1..=attempts {
            if attempt > 1 {
                crate::monitoring::cas_retry(M::KIND.as_str());
                tokio::time::sleep(self.policy.backoff(attempt)).await;
                out_of_time()?;
            }
            let loaded = self.store.load(key).await?;
            let Some(command) = plan(loaded.as_ref()).await? else {
                return match loaded {
                    Some(stored) => Ok(Executed {
                        state: stored.state,
                        version: stored.version,
                        decision: Decision::unchanged(),
                        committed: false,
                        also: Vec::new(),
                        attempts: attempt,
                    }),
                    None => Err(ServiceError::NotFound),
                };
            };
            let now = self.clock.now();
            let (state, decision, expected) = match loaded {
                Some(Stored { mut state, version }) => {
                    // `decide` leaves the state as it was on a refusal, so
                    // the loaded state is decided on in place, not cloned.
                    match state.decide(ctx, &command, now) {
                        Ok(d) => (state, d, Some(version)),
                        Err(error) => {
                            return Err(ServiceError::refused(
                                error,
                                Some(Stored { state, version }),
                            ));
                        }
                    }
                }
                None => match M::create(key, ctx, &command, now) {
                    Ok(Some((state, d))) => (state, d, None),
                    Ok(None) => return Err(ServiceError::NotFound),
                    Err(error) => return Err(ServiceError::refused(error, None)),
                },
            };
            if let (Some(version), false) = (expected, decision.changed) {
                // Deliberately nothing to store.
                return Ok(Executed {
                    state,
                    version,
                    decision,
                    committed: false,
                    also: Vec::new(),
                    attempts: attempt,
                });
            }
            out_of_time()?;
            let commit = Commit {
                key,
                expected,
                command: &command,
                state: &state,
                decision: &decision,
                now,
            };
            match self.store.commit(commit).await {
                Ok(committed) => {
                    let (state, decision) = committed.written.unwrap_or((state, decision));
                    return Ok(Executed {
                        state,
                        version: committed.version,
                        decision,
                        committed: true,
                        also: committed.also,
                        attempts: attempt,
                    });
                }
                Err(e) if e.is_conflict() => {
                    crate::monitoring::cas_conflict(M::KIND.as_str());
                    tracing::debug!(
                        machine = %M::KIND,
                        attempt,
                        "commit lost its compare-and-swap, deciding again"
                    );
                }
                Err(e) => return Err(e.into()),
            }
        }
        crate::monitoring::cas_exhausted(M::KIND.as_str());
        Err(ServiceError::Contended { attempts })
    }
}

/// Refuses to start an attempt or a commit once the request's time budget
/// ([`crate::budget::current`]) has run out: the client has been answered
/// or is about to be, so nothing may land after it.
fn out_of_time<M: Machine>() -> Result<(), ServiceError<M>> {
    let late = crate::budget::current().is_some_and(|d| d.expired(std::time::Instant::now()));
    if late {
        return Err(ServiceError::Planning(
            "the request's time budget ran out before the commit".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn nothing_is_committed_once_the_budget_has_run_out() {
        use crate::budget::{Deadline, Family, scoped};
        use parlance_core::session::{SessionCommand, SessionKey, SessionState, TourCatalog};
        use parlance_memory::{MemoryAuditLog, MemorySessionStore, MemoryTaskQueue};
        use parlance_ports::{QueueConfig, SystemClock};
        use std::sync::Arc;
        use std::time::Instant;

        let clock = Arc::new(SystemClock);
        let queue = Arc::new(MemoryTaskQueue::new(clock.clone(), QueueConfig::default()));
        let store = MemorySessionStore::new(Arc::new(MemoryAuditLog::new()), queue);
        let key = SessionKey::new(
            parlance_core::ProductId::parse("budget").unwrap(),
            "s".parse().unwrap(),
        );
        let executor = Executor::<SessionState>::new(&store, clock.as_ref());
        let catalog = TourCatalog::default();
        let spent = Deadline::new(Family::Commands, Duration::ZERO, Instant::now());
        let late = scoped(spent, executor.run(&key, &catalog, &SessionCommand::Create)).await;
        assert!(matches!(late, Err(ServiceError::Planning(_))), "{late:?}");
        assert!(store.load(&key).await.unwrap().is_none(), "nothing landed");
        let in_time = executor.run(&key, &catalog, &SessionCommand::Create).await;
        assert!(in_time.is_ok_and(|e| e.committed));
    }

    #[test]
    fn backoff_grows_to_its_cap_and_never_waits_first() {
        let p = RetryPolicy::STANDARD;
        assert_eq!(p.backoff(1), Duration::ZERO);
        for attempt in 2..40 {
            let ceiling = p.base.saturating_mul(1 << (attempt - 2).min(16)).min(p.cap);
            assert!(p.backoff(attempt) < ceiling, "attempt {attempt}");
        }
    }
}
