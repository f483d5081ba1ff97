//! Test support shared by every Parlance adapter: contract suites, a manual
//! clock and sequential ids.
//!
//! Layer: depends on `parlance-core` and `parlance-ports` (and tokio, to drive
//! concurrency in the suites); a dev-dependency of the adapters and the app,
//! never a normal dependency of anything. Each port has one suite module here;
//! every adapter runs it through that module's macro, so the in-memory and
//! PostgreSQL adapters are held to the same behaviour, concurrency included.

#![forbid(unsafe_code)]

pub mod adoption;
pub mod api_keys;
pub mod audit;
pub mod channel;
pub mod checkpoint;
pub mod conversation;
pub mod crisis_log;
pub mod embedding;
pub mod flow;
pub mod llm;
pub mod memory_store;
pub mod queue;
pub mod session;
pub mod storable;
pub mod store;

pub use parlance_ports::{ManualClock, SequentialIds};

/// Expands to one `#[tokio::test]` per case of a suite.
///
/// `$factory` is an async expression producing `Option<Subject>`; `None`
/// means the backend is not available here and the case is skipped (the
/// factory says so). Each case is `async fn case(subject: Subject)` in
/// `$suite`.
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
