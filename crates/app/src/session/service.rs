//! Every session command goes through the executor: load, decide (a tick,
//! then the event), commit with the transitions' audit entries, decided
//! again on the state that won when a compare-and-swap is lost. A session
//! never seen is created by its own commit (`SessionCommand::Create`)
//! before its first event is decided on it.

use std::future::ready;

use parlance_core::session::{
    AssistState, SessionCommand, SessionEvent, SessionKey, SessionOutcome, SessionReport,
    SessionState,
};
use parlance_ports::Version;

use super::Sessions;
use crate::execute::ServiceError;

/// What an applied event did.
#[derive(Debug, Clone, PartialEq)]
pub struct EventApplied {
    /// The event type.
    pub event: &'static str,
    /// What the tick before the event did (a timeout, a cooldown ending).
    pub tick: SessionOutcome,
    /// What the event did.
    pub result: SessionOutcome,
    /// The session after both, as stored.
    pub session: SessionState,
    /// Its version.
    pub version: Version,
}

/// Applies `event` to the session at `key`, creating the session first
/// when it was never seen (so the first event lands on version 2). An
/// event that no session could take creates nothing.
///
/// # Errors
///
/// [`ServiceError::Refused`] when the event does not fit the state (the
/// session in it is ticked to now, as a read shows it; nothing was
/// stored) or is invalid, a port error, or [`ServiceError::Contended`].
pub async fn apply_event(
    app: &Sessions,
    key: &SessionKey,
    event: SessionEvent,
) -> Result<EventApplied, ServiceError<SessionState>> {
    event
        .validate()
        .map_err(|error| ServiceError::refused(error, None))?;
    let tours = app.tours.get(&key.product_id).await?;
    let executor = app.executor();
    let kind = event.kind();
    let command = SessionCommand::Event(event);
    let mut created = false;
    let first = executor
        .run_with(key, &tours, |loaded| {
            created = loaded.is_none();
            let next = if created {
                SessionCommand::Create
            } else {
                command.clone()
            };
            ready(Ok(Some(next)))
        })
        .await;
    let executed = match first {
        Ok(_) if created => executor.run(key, &tours, &command).await,
        other => other,
    };
    match executed {
        Ok(done) => {
            let SessionReport { tick, result } = SessionReport::of(&done.decision);
            Ok(EventApplied {
                event: kind,
                tick,
                result,
                session: done.state,
                version: done.version,
            })
        }
        Err(ServiceError::Refused {
            error,
            current: Some(mut current),
        }) => {
            // A refusal comes only when the tick would store nothing, so
            // the ticked session is the stored one with elapsed times
            // brought up to date.
            current.state.tick(app.shared.clock.now(), &tours);
            Err(ServiceError::Refused {
                error,
                current: Some(current),
            })
        }
        Err(e) => Err(e),
    }
}

/// The stored session ticked to now, committed when the tick changed
/// anything (so a timeout is recorded once), or `None` when there is no
/// session (a read never creates one).
///
/// # Errors
///
/// A port error, or [`ServiceError::Contended`].
pub async fn load_ticked(
    app: &Sessions,
    key: &SessionKey,
) -> Result<Option<(SessionState, Version)>, ServiceError<SessionState>> {
    let tours = app.tours.get(&key.product_id).await?;
    match app.executor().run(key, &tours, &SessionCommand::Tick).await {
        Ok(done) => Ok(Some((done.state, done.version))),
        Err(ServiceError::NotFound) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `(allowed, reason)` for a proactive offer, after a tick. A session never
/// seen is a fresh one in thinking: allowed.
///
/// # Errors
///
/// As [`load_ticked`].
pub async fn gate(
    app: &Sessions,
    key: &SessionKey,
) -> Result<(bool, &'static str, Option<AssistState>), ServiceError<SessionState>> {
    Ok(match load_ticked(app, key).await? {
        Some((s, _)) => {
            let (allowed, reason) = s.can_deliver_proactive();
            (allowed, reason, Some(s.current_state()))
        }
        None => (true, "ok", None),
    })
}
