//! The storage protocol's contract suite on [`Records`], through a toy
//! machine: a counter whose every step is a transition and asks for a task.

use std::borrow::Cow;
use std::sync::Arc;

use async_trait::async_trait;
use parlance_core::queue::{DagLimits, TaskSpec};
use parlance_core::{
    Command, Decision, EntityKey, EntityKind, ErrorClass, Machine, MachineError, NotAllowed,
    ProductId, Timestamp, Transition,
};
use parlance_memory::{MemoryAuditLog, MemoryTaskQueue, Records};
use parlance_ports::{
    AuditLog, Commit, Committed, MachineStore, PortResult, QueueConfig, Stored, SystemClock,
    TaskQueue,
};
use parlance_testkit::store::StoreFixture;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq)]
struct CounterKey(ProductId, u32);

impl EntityKey for CounterKey {
    fn product_id(&self) -> &ProductId {
        &self.0
    }
    fn entity_id(&self) -> Cow<'_, str> {
        Cow::Owned(self.1.to_string())
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
enum Step {
    Start,
    Up,
}

impl Command for Step {
    fn name(&self) -> &'static str {
        match self {
            Step::Start => "start",
            Step::Up => "up",
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error(transparent)]
struct Refused(NotAllowed);

impl MachineError for Refused {
    fn class(&self) -> ErrorClass {
        ErrorClass::NotAllowed
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Counter {
    product: ProductId,
    n: u32,
}

impl Machine for Counter {
    type Key = CounterKey;
    type Command = Step;
    type Context = ();
    type Effect = ();
    type Error = Refused;
    const KIND: EntityKind = EntityKind::Session;

    fn decide(&mut self, _: &(), cmd: &Step, _: Timestamp) -> Result<Decision<Self>, Refused> {
        if matches!(cmd, Step::Start) {
            return Err(Refused(NotAllowed::new("start", self.n.to_string())));
        }
        let mut d = Decision::changed();
        d.transition(Transition::new(
            self.n.to_string(),
            (self.n + 1).to_string(),
            "up",
        ));
        d.task(TaskSpec::new(
            self.product.clone(),
            "count",
            serde_json::json!({"n": self.n}),
        ));
        self.n += 1;
        Ok(d)
    }

    fn create(
        key: &CounterKey,
        _: &(),
        cmd: &Step,
        _: Timestamp,
    ) -> Result<Option<(Self, Decision<Self>)>, Refused> {
        Ok(matches!(cmd, Step::Start).then(|| {
            let mut d = Decision::changed();
            d.transition(Transition::created("0", "start"));
            (
                Counter {
                    product: key.0.clone(),
                    n: 0,
                },
                d,
            )
        }))
    }

    fn next_deadline(&self, _: &()) -> Option<Timestamp> {
        None
    }

    fn state_name(&self) -> Cow<'static, str> {
        Cow::Owned(self.n.to_string())
    }
}

struct CounterStore(Records<Counter>);

#[async_trait]
impl MachineStore<Counter> for CounterStore {
    async fn load(&self, key: &CounterKey) -> PortResult<Option<Stored<Counter>>> {
        Ok(self.0.load(key).await)
    }

    async fn commit(&self, c: Commit<'_, Counter>) -> PortResult<Committed<Counter>> {
        let v = self
            .0
            .commit(&c, c.state.clone(), |_| Ok(()), |_, _, ()| {})
            .await?;
        Ok(Committed::at(v))
    }
}

struct Fixture {
    store: Arc<CounterStore>,
    audit: Arc<MemoryAuditLog>,
    queue: Arc<MemoryTaskQueue>,
}

impl StoreFixture for Fixture {
    type M = Counter;

    fn store(&self) -> Arc<dyn MachineStore<Counter>> {
        self.store.clone()
    }
    fn audit(&self) -> Arc<dyn AuditLog> {
        self.audit.clone()
    }
    fn queue(&self) -> Arc<dyn TaskQueue> {
        self.queue.clone()
    }
    fn context(&self) -> &() {
        &()
    }
    fn key(&self, product: &ProductId, n: u32) -> CounterKey {
        CounterKey(product.clone(), n)
    }
    fn create(&self, _: &CounterKey) -> Step {
        Step::Start
    }
    fn change(&self, _: &Counter) -> Step {
        Step::Up
    }
}

parlance_testkit::machine_store_suite!(async {
    let audit = Arc::new(MemoryAuditLog::new());
    let queue = Arc::new(MemoryTaskQueue::new(
        Arc::new(SystemClock),
        QueueConfig::default(),
    ));
    Some(Fixture {
        store: Arc::new(CounterStore(Records::new(
            audit.clone(),
            Some(queue.clone()),
            DagLimits::default(),
        ))),
        audit,
        queue,
    })
});
