//! Property suite for the storable-value policy
//! ([`parlance_core::storable`]): every command the policy accepts, with
//! arbitrary text (Unicode, control characters, non-characters) and
//! arbitrary integers, is committed by the adapter and loads back exactly as
//! it was decided, on every adapter; a command the policy refuses (text
//! holding NUL, an integer outside `i64`) never reaches the store, as the
//! HTTP boundary refuses it.
//!
//! Adapters run it with `parlance_testkit::storable_suite!(adoption =
//! factory, conversation = factory)`; each case runs [`CASES`] generated
//! scenarios, each on a record of its own.

use parlance_core::adoption::{AdoptionCommand, AdoptionEvent, JourneyState, WorkflowStatus};
use parlance_core::conversation::{ContactId, ConversationCommand, NewInstance};
use parlance_core::storable;
use parlance_core::{Machine, ProductId, Timestamp};
use parlance_ports::{Commit, Stored};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::{Map, Value};

use crate::store::StoreFixture;

/// Scenarios per machine and adapter: enough to meet NUL, huge integers and
/// odd Unicode every run, few enough to keep PostgreSQL runs short.
pub const CASES: u32 = 32;

/// Runs the suite's cases against the factories' subjects.
///
/// See how [the in-memory adapters](https://github.com/parlance-rs/parlance/blob/main/crates/memory/tests/it/main.rs) and [the PostgreSQL adapters](https://github.com/parlance-rs/parlance/blob/main/crates/postgres/tests/it/main.rs) run it.
///
/// ```
/// # use std::sync::Arc;
/// # use parlance_memory::{MemoryAdoptionStore, MemoryAuditLog, MemoryConversationStore};
/// # use parlance_memory::MemoryTaskQueue;
/// # use parlance_ports::{QueueConfig, SystemClock, TaskQueue};
/// use parlance_testkit::{adoption, conversation};
///
/// # fn queue() -> Arc<dyn TaskQueue> {
/// #     Arc::new(MemoryTaskQueue::new(Arc::new(SystemClock), QueueConfig::default()))
/// # }
/// /// The in-memory adoption store, with its audit log and queue.
/// async fn adoption_subject() -> Option<adoption::Subject> {
///     let (audit, queue) = (Arc::new(MemoryAuditLog::new()), queue());
///     let store = Arc::new(MemoryAdoptionStore::new(audit.clone(), queue.clone()));
///     Some(adoption::Subject { records: store.clone(), store, audit, queue })
/// }
///
/// /// The in-memory conversation store, with its audit log and queue.
/// async fn conversation_subject() -> Option<conversation::Subject> {
///     let (audit, queue) = (Arc::new(MemoryAuditLog::new()), queue());
///     let store = Arc::new(MemoryConversationStore::new(audit.clone(), queue.clone()));
///     Some(conversation::Subject { store: store.clone(), index: store, audit, queue })
/// }
///
/// // In the adapter's `tests/it/main.rs`, one `#[tokio::test]` per machine:
/// mod storable {
///     parlance_testkit::storable_suite!(
///         adoption = super::adoption_subject(),
///         conversation = super::conversation_subject(),
///     );
/// }
///
/// // What those tests run: `CASES` scenarios per machine.
/// #[tokio::main]
/// async fn main() {
///     let adoption = adoption_subject().await.expect("in memory");
///     parlance_testkit::storable::adoption(adoption).await;
///     let conversation = conversation_subject().await.expect("in memory");
///     parlance_testkit::storable::conversation(conversation).await;
/// }
/// ```
#[macro_export]
macro_rules! storable_suite {
    (adoption = $adoption:expr, conversation = $conversation:expr $(,)?) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn accepted_adoption_commands_are_stored_and_read_back_unchanged() {
            let Some(subject) = ($adoption).await else {
                return;
            };
            $crate::storable::adoption(subject).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn accepted_conversation_commands_are_stored_and_read_back_unchanged() {
            let Some(subject) = ($conversation).await else {
                return;
            };
            $crate::storable::conversation(subject).await;
        }
    };
}

/// Text of every kind: printable Unicode, control characters, the edges of
/// the code space, and NUL (which the policy refuses).
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "\\PC{0,16}",
        2 => "[a \u{1}\u{1f}\u{7f}\u{e9}\u{200b}\u{fffe}\u{ffff}\u{1F600}\u{10FFFF}\\\\\"']{0,8}",
        1 => "[a\u{0}\u{e9}]{1,6}",
    ]
}

/// Integers on both sides of `i64::MAX`.
fn integer() -> impl Strategy<Value = u64> {
    prop_oneof![
        2 => 0..1_000u64,
        1 => Just(i64::MAX as u64),
        1 => Just(i64::MAX as u64 + 1),
        1 => Just(u64::MAX),
        1 => any::<u64>(),
    ]
}

/// A JSON object of arbitrary text and integers (signed ones included).
fn metadata() -> impl Strategy<Value = Map<String, Value>> {
    let value = prop_oneof![
        text().prop_map(Value::from),
        integer().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
    ];
    prop::collection::vec((text(), value), 0..4).prop_map(|kv| kv.into_iter().collect())
}

fn adoption_event() -> impl Strategy<Value = AdoptionEvent> {
    prop_oneof![
        (
            text(),
            integer(),
            prop::sample::select(vec![0.0, 1.5, 1_767_225_600.25])
        )
            .prop_map(|(session_id, session_number, started_at)| {
                AdoptionEvent::RecordSession {
                    session_id,
                    session_number,
                    started_at,
                }
            }),
        prop::collection::vec(text(), 0..3)
            .prop_map(|features| AdoptionEvent::RecordDiscoveredFeatures { features }),
        text().prop_map(|session_id| AdoptionEvent::SetCurrentSession { session_id }),
        metadata().prop_map(|metadata| AdoptionEvent::SetMetadata { metadata }),
        (text(), text(), text()).prop_map(|(workflow_id, evidence, source)| {
            AdoptionEvent::UpsertWorkflowProgress {
                workflow_id,
                status: WorkflowStatus::InProgress,
                confidence: 0.5,
                evidence,
                source: Some(source),
            }
        }),
        Just(AdoptionEvent::SetJourneyState {
            state: JourneyState::Onboarded
        }),
    ]
}

fn adoption_commands() -> impl Strategy<Value = Vec<AdoptionCommand>> {
    let command = (
        prop::collection::vec(adoption_event(), 1..4),
        prop::option::of(metadata()),
    )
        .prop_map(|(events, metadata)| AdoptionCommand::Events { events, metadata });
    prop::collection::vec(command, 1..5)
}

fn conversation_commands(
    key: parlance_core::conversation::ConversationKey,
) -> impl Strategy<Value = Vec<ConversationCommand>> {
    let create = (text(), metadata()).prop_map(move |(objective, metadata)| {
        ConversationCommand::Create(NewInstance {
            product_id: key.product_id.clone(),
            instance_id: key.instance_id,
            contact_id: ContactId::parse(format!("contact-{}", key.instance_id))
                .expect("valid contact"),
            channel: "loopback".to_owned(),
            objective,
            todos: vec![],
            heartbeat_interval_s: 100,
            max_follow_ups: 2,
            metadata,
        })
    });
    let step = prop_oneof![
        Just(ConversationCommand::BeginAgentTurn),
        // Delays up to ten years: a deadline near the end of the timestamp
        // range does not survive the record's seconds-as-float encoding to
        // the microsecond (the integer policy is covered by the metadata).
        (text(), prop::option::of(0..315_360_000_u64)).prop_map(|(text, next_heartbeat_s)| {
            ConversationCommand::AgentSend {
                text,
                next_heartbeat_s,
            }
        }),
        text().prop_map(|text| ConversationCommand::ContactReply { text }),
        prop::option::of(text())
            .prop_map(|outcome| ConversationCommand::EndConversation { outcome }),
    ];
    (
        prop::collection::vec(create, 1..3),
        prop::collection::vec(step, 1..8),
    )
        .prop_map(|(mut first, rest)| {
            first.extend(rest);
            first
        })
}

fn now() -> Timestamp {
    Timestamp::from_secs(1_767_225_600).expect("in range")
}

/// How many commands of a run the policy refused, and how many the machine
/// accepted and the store committed.
#[derive(Debug, Default)]
struct Tally {
    refused_by_policy: usize,
    committed: usize,
}

/// Decides `commands` in order on the record at `key` (creating it with the
/// first the machine accepts), commits each accepted decision, and requires
/// the record to load back exactly as decided after each commit. Commands
/// the policy refuses are left out, as the HTTP boundary leaves them out;
/// commands the machine refuses change nothing.
async fn run_commands<F: StoreFixture>(
    f: &F,
    key: &<F::M as Machine>::Key,
    commands: &[<F::M as Machine>::Command],
    tally: &mut Tally,
) {
    let store = f.store();
    let mut current: Option<Stored<F::M>> = None;
    for command in commands {
        let json = serde_json::to_value(command).expect("commands serialise");
        if storable::check_json(&json).is_err() {
            tally.refused_by_policy += 1;
            continue;
        }
        let (state, decision, expected) = match &current {
            None => match F::M::create(key, f.context(), command, now()) {
                Ok(Some((state, decision))) => (state, decision, None),
                _ => continue,
            },
            Some(stored) => {
                let mut state = stored.state.clone();
                match state.decide(f.context(), command, now()) {
                    Ok(decision) if decision.changed => (state, decision, Some(stored.version)),
                    _ => continue,
                }
            }
        };
        let done = store
            .commit(Commit {
                key,
                expected,
                command,
                state: &state,
                decision: &decision,
                now: now(),
            })
            .await
            .unwrap_or_else(|e| panic!("an accepted command is not stored: {e}; {command:?}"));
        tally.committed += 1;
        let loaded = store
            .load(key)
            .await
            .unwrap_or_else(|e| panic!("a stored record does not load: {e}; after {command:?}"))
            .expect("the committed record exists");
        assert_eq!(loaded.version, done.version);
        assert_eq!(
            loaded.state, state,
            "the record reads back differently after {command:?}"
        );
        current = Some(Stored {
            state,
            version: done.version,
        });
    }
}

fn runner() -> TestRunner {
    TestRunner::new_with_rng(
        Config {
            cases: CASES,
            ..Config::default()
        },
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    )
}

fn check_tally(tally: &Tally) {
    assert!(
        tally.refused_by_policy > 0 && tally.committed > 0,
        "the generated commands must meet both sides of the policy: {tally:?}"
    );
}

/// The adoption record: field events with arbitrary session ids and
/// numbers, features, metadata and evidence.
pub async fn adoption(f: crate::adoption::Subject) {
    let mut runner = runner();
    let mut tally = Tally::default();
    let product = ProductId::parse("storable").expect("valid");
    for case in 0..CASES {
        let commands = adoption_commands()
            .new_tree(&mut runner)
            .expect("generate")
            .current();
        let key = f.key(&product, 10_000 + case);
        run_commands(&f, &key, &commands, &mut tally).await;
    }
    check_tally(&tally);
}

/// The conversation instance: objective, metadata, agent messages, contact
/// replies and outcomes of arbitrary text, follow-up delays of any size.
pub async fn conversation(f: crate::conversation::Subject) {
    let mut runner = runner();
    let mut tally = Tally::default();
    let product = ProductId::parse("storable").expect("valid");
    for case in 0..CASES {
        let key = f.key(&product, 10_000 + case);
        let commands = conversation_commands(key.clone())
            .new_tree(&mut runner)
            .expect("generate")
            .current();
        run_commands(&f, &key, &commands, &mut tally).await;
    }
    check_tally(&tally);
}
