//! What a flow event leaves in the task queue does not grow with the
//! dialogue: the payloads of the DAG an event enqueues name the render data
//! instead of copying it, and a finished DAG keeps no payload at all.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parlance_app::Components;
use parlance_app::flow::{FlowCatalog, Invoker};
use parlance_app::worker::WorkerConfig;
use parlance_core::ProductId;
use parlance_core::flow::{ClientEvent, FlowBuilder, FlowKey, TemplateRef};
use parlance_postgres::testing::test_pool;

use crate::support::keys;

const EVENTS: usize = 20;
const INPUT_BYTES: usize = 20_000;

/// Answers the length of what it was sent: a model's answer, of a size that
/// does not depend on the prompt's.
struct Measure;

#[async_trait]
impl Invoker for Measure {
    async fn invoke(&self, rendered: &str) -> Result<String, String> {
        Ok(format!("{:012}", rendered.len()))
    }
}

/// `ask` --user_input--> `think` (a chain: a prompt with the whole history,
/// then a map over two items) --advance--> `answer` --user_input--> `think`.
fn components(mut c: Components) -> Components {
    let mut flows = FlowCatalog::new();
    flows.insert(
        FlowBuilder::new("long")
            .template("ask.j2", "Ask.")
            .template("prompt.j2", "{{ chat_history }}\n{{ actor_input }}")
            .template(
                "each.j2",
                "{{ map_value }} {{ previous_result }} {{ actor_input }}",
            )
            .template("answer.j2", "{{ actor_input }}")
            .user_state("ask", "ask.j2")
            .invoker_state(
                "think",
                TemplateRef::Chain(vec![
                    TemplateRef::Name("prompt.j2".into()),
                    TemplateRef::MapOver {
                        map: "each.j2".into(),
                        over: "[1, 2]".into(),
                    },
                ]),
                "measure",
            )
            .user_state("answer", "answer.j2")
            .on("user_input", "ask", "think")
            .on("advance", "think", "answer")
            .on("user_input", "answer", "think")
            .build()
            .expect("a valid flow"),
    );
    c.flows = flows;
    let mut invokers: BTreeMap<String, Arc<dyn Invoker>> = BTreeMap::new();
    invokers.insert("measure".into(), Arc::new(Measure));
    c.invokers = invokers;
    c
}

/// Fires `EVENTS` events with large inputs, each run to its answer; returns
/// the payload bytes the queue held once each event had enqueued its DAG.
async fn payload_bytes_per_event(c: Components) -> Vec<u64> {
    let state = components(c).build();
    let worker = state.worker(WorkerConfig::default());
    let svc = state.flows.clone();
    let queue = state.shared.queue.clone();
    let product = ProductId::parse("acme").unwrap();
    let flow = svc.catalog().get("long").unwrap();
    let sid = svc.start_session(&product, &flow).await.unwrap().session_id;
    let key = FlowKey::new(product.clone(), sid.parse().unwrap());
    let mut sizes = Vec::new();
    for n in 0..EVENTS {
        // Varied text, so compression in the store cannot hide a copy.
        let input: String = (0..INPUT_BYTES)
            .map(|i| char::from(b'a' + u8::try_from((i * 7 + n * 13) % 26).unwrap()))
            .collect();
        let before = queue.footprint(&product).await.unwrap().payload_bytes;
        let asked = svc
            .event(&key, &flow, ClientEvent::parse("user_input"), &input)
            .await
            .unwrap();
        assert_eq!(asked.next_actions, ["poll"]);
        let after = queue.footprint(&product).await.unwrap().payload_bytes;
        sizes.push(after - before);
        let mut answered = None;
        for _ in 0..200 {
            worker.step().await.unwrap();
            let polled = svc.poll(&key, &flow).await.unwrap();
            if polled.next_actions != ["poll"] {
                answered = Some(polled);
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let answered = answered.expect("the event's DAG finished");
        assert_eq!(answered.error, None);
        let held = queue.footprint(&product).await.unwrap();
        assert_eq!(held.payload_bytes, 0, "a finished DAG keeps no payload");
    }
    sizes
}

fn assert_constant(sizes: &[u64]) {
    let (first, last) = (sizes[0], sizes[EVENTS - 1]);
    assert!(
        first < INPUT_BYTES as u64,
        "an event's payloads hold no copy of its input: {sizes:?}"
    );
    assert!(
        last <= first + 64,
        "the payloads of event {EVENTS} are those of event 1: {sizes:?}"
    );
}

#[tokio::test]
async fn queue_payloads_per_event_do_not_grow_with_the_dialogue() {
    assert_constant(&payload_bytes_per_event(Components::memory(keys())).await);
}

#[tokio::test]
async fn queue_payloads_per_event_do_not_grow_with_the_dialogue_on_postgres() {
    let Some(pool) = test_pool().await else {
        return;
    };
    assert_constant(&payload_bytes_per_event(Components::postgres(pool, keys())).await);
}
