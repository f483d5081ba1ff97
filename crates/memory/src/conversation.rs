//! Conversation instances in memory, with the same guarantees as PostgreSQL:
//! one gate makes every creation and command, its transcript, audit,
//! promotion and tasks atomic. A command is decided on a copy, its tasks are
//! enqueued, and only then is the decision saved, so a failed enqueue leaves
//! the instance as it was.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use parlance_core::conversation::{
    ConversationError, ConversationState, Effect, Instance, InstanceId, Message, NewInstance,
    Outcome,
};
use parlance_core::{ProductId, Timestamp};
use parlance_ports::conversation::{Command, audit_entries, creation_entry, effect_tasks};
use parlance_ports::{Applied, ConversationStore, ListFilter, PortError, PortResult, TaskQueue};

use crate::MemoryAuditLog;

type Key = (ProductId, InstanceId);

struct Stored {
    instance: Instance,
    transcript: Vec<Message>,
    claimed_until: Option<Timestamp>,
}

#[derive(Default)]
struct Inner {
    instances: HashMap<Key, Stored>,
    /// Creation order, for listing and promotion (oldest first).
    order: Vec<Key>,
    /// Armed heartbeats: the deadline index.
    due: BTreeSet<(Timestamp, Key)>,
    deliveries: BTreeSet<(ProductId, InstanceId, u32)>,
}

/// Conversation instances held in memory.
pub struct MemoryConversationStore {
    inner: Mutex<Inner>,
    /// Held across a decision, its enqueue and its save.
    gate: tokio::sync::Mutex<()>,
    audit: Arc<MemoryAuditLog>,
    queue: Arc<dyn TaskQueue>,
}

impl MemoryConversationStore {
    /// A store writing its transitions to `audit` and the tasks they ask for
    /// to `queue`.
    pub fn new(audit: Arc<MemoryAuditLog>, queue: Arc<dyn TaskQueue>) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            gate: tokio::sync::Mutex::new(()),
            audit,
            queue,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Inner {
    fn contact_is_held(&self, product: &ProductId, instance: &Instance) -> bool {
        self.instances.values().any(|s| {
            s.instance.product_id == *product
                && s.instance.contact_id == instance.contact_id
                && s.instance.instance_id != instance.instance_id
                && s.instance.holds_contact()
        })
    }

    /// Replaces the stored instance, keeping the deadline index in step.
    fn save(&mut self, key: &Key, mut instance: Instance) -> Instance {
        let stored = self
            .instances
            .get_mut(key)
            .expect("caller checked it exists");
        if let Some(old) = stored.instance.heartbeat_due_at {
            self.due.remove(&(old, key.clone()));
        }
        if let Some(new) = instance.heartbeat_due_at {
            self.due.insert((new, key.clone()));
        }
        instance.version = stored.instance.version + 1;
        stored.instance = instance.clone();
        stored.claimed_until = None;
        instance
    }

    fn append(&mut self, key: &Key, outcome: &Outcome) {
        let stored = self
            .instances
            .get_mut(key)
            .expect("caller checked it exists");
        for e in &outcome.effects {
            if let Effect::Append(m) = e {
                stored.transcript.push(m.clone());
            }
        }
    }

    /// The promotion of the oldest `QUEUED` instance of `holder`'s contact
    /// when the contact is free once `holder` is saved, decided on a copy.
    fn plan_promotion(
        &self,
        holder: &Instance,
        now: Timestamp,
    ) -> Option<(Key, Instance, Outcome)> {
        if self.contact_is_held(&holder.product_id, holder) || holder.holds_contact() {
            return None;
        }
        // The holder as decided, the others as stored: a resumed queued
        // instance may promote itself.
        let current = |k: &Key| {
            if k.1 == holder.instance_id && k.0 == holder.product_id {
                holder
            } else {
                &self.instances[k].instance
            }
        };
        let key = self.order.iter().find(|k| {
            let s = current(k);
            s.product_id == holder.product_id
                && s.contact_id == holder.contact_id
                && s.state == ConversationState::Queued
        })?;
        let mut next = current(key).clone();
        let outcome = next.promote(now).ok()?;
        Some((key.clone(), next, outcome))
    }
}

#[async_trait]
impl ConversationStore for MemoryConversationStore {
    async fn create(
        &self,
        new: NewInstance,
        now: Timestamp,
    ) -> PortResult<Result<(Instance, Outcome), ConversationError>> {
        let _gate = self.gate.lock().await;
        let key = (new.product_id.clone(), new.instance_id);
        let (mut instance, outcome) = {
            let inner = self.lock();
            if inner.instances.contains_key(&key) {
                return Err(PortError::conflict(format!(
                    "conversation {} already exists",
                    new.instance_id
                )));
            }
            let held = inner.instances.values().any(|s| {
                s.instance.product_id == new.product_id
                    && s.instance.contact_id == new.contact_id
                    && s.instance.holds_contact()
            });
            match Instance::create(new, held, now) {
                Ok(created) => created,
                Err(e) => return Ok(Err(e)),
            }
        };
        instance.version = 1;
        let tasks = effect_tasks(&instance, &outcome);
        if !tasks.is_empty() {
            self.queue.enqueue(&tasks).await?;
        }
        let mut inner = self.lock();
        inner.instances.insert(
            key.clone(),
            Stored {
                instance: instance.clone(),
                transcript: Vec::new(),
                claimed_until: None,
            },
        );
        inner.order.push(key);
        self.audit.push(&[creation_entry(&instance)]);
        Ok(Ok((instance, outcome)))
    }

    async fn get(&self, product: &ProductId, id: InstanceId) -> PortResult<Option<Instance>> {
        Ok(self
            .lock()
            .instances
            .get(&(product.clone(), id))
            .map(|s| s.instance.clone()))
    }

    async fn list(&self, product: &ProductId, filter: &ListFilter) -> PortResult<Vec<Instance>> {
        let inner = self.lock();
        let limit = filter.limit.unwrap_or(1000).min(1000);
        Ok(inner
            .order
            .iter()
            .map(|k| &inner.instances[k].instance)
            .filter(|i| i.product_id == *product)
            .filter(|i| {
                filter
                    .contact_id
                    .as_ref()
                    .is_none_or(|c| i.contact_id == *c)
            })
            .filter(|i| filter.state.is_none_or(|s| i.state == s))
            .take(limit)
            .cloned()
            .collect())
    }

    async fn transcript(&self, product: &ProductId, id: InstanceId) -> PortResult<Vec<Message>> {
        self.lock()
            .instances
            .get(&(product.clone(), id))
            .map(|s| s.transcript.clone())
            .ok_or_else(|| PortError::not_found(format!("no conversation {id}")))
    }

    async fn apply(
        &self,
        product: &ProductId,
        id: InstanceId,
        now: Timestamp,
        command: Command,
    ) -> PortResult<Result<Applied, ConversationError>> {
        let _gate = self.gate.lock().await;
        let key = (product.clone(), id);
        let (instance, outcome, promoted) = {
            let inner = self.lock();
            let Some(stored) = inner.instances.get(&key) else {
                return Err(PortError::not_found(format!("no conversation {id}")));
            };
            let mut instance = stored.instance.clone();
            let outcome = match command(&mut instance) {
                Ok(o) => o,
                Err(e) => return Ok(Err(e)),
            };
            let promoted = if outcome.effects.contains(&Effect::PromoteNextQueued) {
                inner.plan_promotion(&instance, now)
            } else {
                None
            };
            (instance, outcome, promoted)
        };
        let mut tasks = effect_tasks(&instance, &outcome);
        if let Some((_, p, o)) = &promoted {
            tasks.extend(effect_tasks(p, o));
        }
        if !tasks.is_empty() {
            self.queue.enqueue(&tasks).await?;
        }
        let mut inner = self.lock();
        let instance = inner.save(&key, instance);
        inner.append(&key, &outcome);
        let mut audit = audit_entries(&instance, &outcome, now);
        let promoted = promoted.map(|(k, p, o)| {
            let saved = inner.save(&k, p);
            audit.extend(audit_entries(&saved, &o, now));
            (saved, o)
        });
        self.audit.push(&audit);
        Ok(Ok(Applied {
            instance,
            outcome,
            promoted,
        }))
    }

    async fn claim_due(
        &self,
        now: Timestamp,
        limit: usize,
        lease: Duration,
    ) -> PortResult<Vec<Instance>> {
        let mut inner = self.lock();
        let due: Vec<Key> = inner
            .due
            .iter()
            .take_while(|(at, _)| *at <= now)
            .map(|(_, k)| k.clone())
            .collect();
        let mut claimed = Vec::new();
        for key in due {
            if claimed.len() >= limit {
                break;
            }
            let stored = inner
                .instances
                .get_mut(&key)
                .expect("indexed instances exist");
            if stored.claimed_until.is_some_and(|until| until > now) {
                continue;
            }
            stored.claimed_until = Some(now + lease);
            claimed.push(stored.instance.clone());
        }
        Ok(claimed)
    }

    async fn record_delivery(
        &self,
        product: &ProductId,
        id: InstanceId,
        outbound_seq: u32,
        _now: Timestamp,
    ) -> PortResult<bool> {
        Ok(self
            .lock()
            .deliveries
            .insert((product.clone(), id, outbound_seq)))
    }
}
