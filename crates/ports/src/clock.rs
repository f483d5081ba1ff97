//! Time and id sources. Synchronous: reading either never blocks.
//!
//! The system sources are for production; [`ManualClock`] and
//! [`SequentialIds`] are for tests and scripted demos.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parlance_core::Timestamp;
use uuid::Uuid;

/// Where the application reads the current time. Tests use a manual clock.
pub trait Clock: Send + Sync + 'static {
    /// The current wall-clock time.
    fn now(&self) -> Timestamp;
}

/// Where the application gets fresh ids. Tests use sequential ids.
pub trait IdGen: Send + Sync + 'static {
    /// A new unique id (time-ordered in production).
    fn new_uuid(&self) -> Uuid;
}

/// The system's wall clock.
///
/// ```
/// use parlance_ports::{Clock, SystemClock};
///
/// let before = SystemClock.now();
/// assert!(SystemClock.now() >= before);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)] // the one place that reads the wall clock
    fn now(&self) -> Timestamp {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let micros = i64::try_from(since.as_micros()).unwrap_or(i64::MAX);
        Timestamp::from_micros(micros).unwrap_or(Timestamp::UNIX_EPOCH)
    }
}

/// UUID v7 ids: unique and ordered by creation time.
///
/// ```
/// use parlance_ports::{IdGen, UuidV7Ids};
///
/// let id = UuidV7Ids.new_uuid();
/// assert_eq!(id.get_version_num(), 7);
/// assert_ne!(id, UuidV7Ids.new_uuid());
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct UuidV7Ids;

impl IdGen for UuidV7Ids {
    #[allow(clippy::disallowed_methods)] // the one place that generates ids
    fn new_uuid(&self) -> Uuid {
        Uuid::now_v7()
    }
}

/// A clock that only moves when told to. Starts at 2026-01-01T00:00:00Z.
///
/// Hand it to whatever reads the time as an `Arc<dyn Clock>` and keep a
/// handle to move it: deadlines, timeouts and back-offs are then tested
/// without sleeping.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// use parlance_ports::{Clock, ManualClock};
///
/// let clock = Arc::new(ManualClock::new());
/// let shared: Arc<dyn Clock> = clock.clone();
/// assert_eq!(shared.now(), ManualClock::START);
///
/// clock.advance(Duration::from_secs(30));
/// clock.advance_secs(0.5);
/// assert_eq!(shared.now().seconds_since(ManualClock::START), 30.5);
///
/// clock.set(ManualClock::START); // it may go back, as a skewed clock does
/// assert_eq!(shared.now(), ManualClock::START);
/// ```
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<Timestamp>,
}

impl ManualClock {
    /// 2026-01-01T00:00:00Z, the default start.
    pub const START: Timestamp = match Timestamp::from_secs(1_767_225_600) {
        Some(t) => t,
        None => Timestamp::UNIX_EPOCH,
    };

    /// A clock at [`ManualClock::START`].
    pub fn new() -> Self {
        Self::at(Self::START)
    }

    /// A clock at `now`.
    pub fn at(now: Timestamp) -> Self {
        Self {
            now: Mutex::new(now),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().unwrap_or_else(|e| e.into_inner());
        *now = *now + by;
    }

    /// Moves the clock forward by fractional seconds.
    pub fn advance_secs(&self, secs: f64) {
        let mut now = self.now.lock().unwrap_or_else(|e| e.into_inner());
        *now = now.plus_seconds(secs);
    }

    /// Sets the clock (it may go backwards: tests of clock skew need that).
    pub fn set(&self, to: Timestamp) {
        *self.now.lock().unwrap_or_else(|e| e.into_inner()) = to;
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.now.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Ids `00000000-0000-0000-0000-000000000001`, `...02`, ... in order.
///
/// ```
/// use parlance_ports::{IdGen, SequentialIds};
///
/// let ids = SequentialIds::new();
/// assert_eq!(ids.new_uuid().to_string(), "00000000-0000-0000-0000-000000000001");
/// assert_eq!(ids.new_uuid().as_u128(), 2);
/// ```
#[derive(Debug, Default)]
pub struct SequentialIds {
    next: AtomicU64,
}

impl SequentialIds {
    /// Starts at 1.
    pub fn new() -> Self {
        Self::default()
    }
}

impl IdGen for SequentialIds {
    fn new_uuid(&self) -> Uuid {
        let n = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        Uuid::from_u128(u128::from(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = ManualClock::new();
        assert_eq!(c.now(), ManualClock::START);
        c.advance(Duration::from_millis(1500));
        assert_eq!(c.now().seconds_since(ManualClock::START), 1.5);
        c.advance_secs(0.5);
        assert_eq!(c.now().seconds_since(ManualClock::START), 2.0);
    }

    #[test]
    fn sequential_ids_count_up() {
        let ids = SequentialIds::new();
        assert_eq!(ids.new_uuid(), Uuid::from_u128(1));
        assert_eq!(ids.new_uuid(), Uuid::from_u128(2));
    }

    #[test]
    fn system_sources_move_forward() {
        let a = SystemClock.now();
        assert!(a > Timestamp::from_secs(1_700_000_000).unwrap());
        let (x, y) = (UuidV7Ids.new_uuid(), UuidV7Ids.new_uuid());
        assert_ne!(x, y);
        assert_eq!(x.get_version_num(), 7);
    }
}
