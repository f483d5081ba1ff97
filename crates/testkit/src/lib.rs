//! Contract suites every Parlance adapter runs, a manual clock and sequential ids.
//!
#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(feature = "adoption")]
pub mod adoption;
pub mod api_keys;
pub mod audit;
#[cfg(feature = "conversation")]
pub mod channel;
#[cfg(feature = "turn")]
pub mod checkpoint;
#[cfg(feature = "conversation")]
pub mod conversation;
#[cfg(feature = "turn")]
pub mod crisis_log;
pub mod embedding;
#[cfg(feature = "flow")]
pub mod flow;
pub mod llm;
#[cfg(feature = "turn")]
pub mod memory_store;
pub mod queue;
#[cfg(feature = "session")]
pub mod session;
#[cfg(all(feature = "adoption", feature = "conversation"))]
pub mod storable;
pub mod store;

pub use parlance_ports::{ManualClock, SequentialIds};

/// Expands to one `#[tokio::test]` per case of a suite.
///
/// `$factory` is an async expression producing `Option<Subject>`; `None`
/// means the backend is not available here and the case is skipped (the
/// factory says so). Each case is `async fn case(subject: Subject)` in
/// `$suite`.
///
/// Every suite macro of this crate is built on it; a suite of your own is a
/// module of public async cases taking the subject:
///
/// ```
/// /// Anything that reads the time.
/// mod clock_suite {
///     use std::sync::Arc;
///
///     use parlance_ports::Clock;
///
///     /// The subject of this suite.
///     pub type Subject = Arc<dyn Clock>;
///
///     /// Time never runs backwards.
///     pub async fn time_does_not_go_back(clock: Subject) {
///         let before = clock.now();
///         assert!(clock.now() >= before);
///     }
/// }
///
/// // One `#[tokio::test]` per case, in the implementation's tests:
/// mod system_clock {
///     parlance_testkit::contract_tests! {
///         factory = async {
///             Some(std::sync::Arc::new(parlance_ports::SystemClock) as super::clock_suite::Subject)
///         };
///         suite = super::clock_suite;
///         cases = [time_does_not_go_back]
///     }
/// }
///
/// #[tokio::main]
/// async fn main() {
///     let clock = std::sync::Arc::new(parlance_testkit::ManualClock::new());
///     clock_suite::time_does_not_go_back(clock).await;
/// }
/// ```
#[macro_export]
macro_rules! contract_tests {
    (factory = $factory:expr; suite = $suite:path; cases = [$($case:ident),* $(,)?]) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let Some(subject) = ($factory).await else { return };
                {
                    use $suite as suite;
                    suite::$case(subject).await;
                }
            }
        )*
    };
}
