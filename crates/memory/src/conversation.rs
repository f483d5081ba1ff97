//! Conversation instances in memory, with the same guarantees as PostgreSQL.
//!
//! Instances are [`Records`]; a commit holds their gate while it checks the
//! version, decides a creation again with whether the contact is held now,
//! decides the promotion of the contact's oldest `QUEUED` instance when the
//! decision frees the contact, checks and enqueues the tasks of both, and
//! writes both instances, their transcript lines, the listings (by product,
//! by contact, by state), the deadline index and their audit entries. A
//! commit that fails writes nothing.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use parlance_core::conversation::{
    ContactId, ConversationCommand, ConversationContext, ConversationEffect, ConversationKey,
    ConversationState, Instance, InstanceId, Message,
};
use parlance_core::queue::DagLimits;
use parlance_core::{Decision, Machine, ProductId, Timestamp};
use parlance_ports::{
    Commit, Committed, ConversationPage, ConversationStore, ListCursor, ListFilter, ListOrder,
    MAX_LIST, MachineStore, PortError, PortResult, Stored, TaskQueue, Version,
};

use crate::MemoryAuditLog;
use crate::records::{Gate, Records, Write, record_key};

/// What is kept beside the instances, changed only under the records' gate
/// (claims and delivery keys aside).
#[derive(Default)]
struct Side {
    /// The creation number of the last instance created: numbers only grow,
    /// and are the listings' cursors.
    created: u64,
    /// Each product's instances with their creation numbers, oldest first.
    by_product: HashMap<ProductId, Vec<(u64, InstanceId)>>,
    /// Each contact's instances with their creation numbers, oldest first.
    by_contact: HashMap<(ProductId, ContactId), Vec<(u64, InstanceId)>>,
    /// Each product's instances in each state, by creation number.
    by_state: HashMap<(ProductId, ConversationState), BTreeMap<u64, InstanceId>>,
    /// Each instance's creation number and the state `by_state` holds it in.
    listed: HashMap<ConversationKey, (u64, ConversationState)>,
    transcripts: HashMap<ConversationKey, Vec<Message>>,
    /// Armed heartbeats: the deadline index.
    due: BTreeSet<(Timestamp, ConversationKey)>,
    /// Each armed heartbeat's entry in `due`.
    deadlines: HashMap<ConversationKey, Timestamp>,
    /// Claimed heartbeats, hidden from other claimers until then.
    claimed: HashMap<ConversationKey, Timestamp>,
    deliveries: HashSet<(ConversationKey, u32)>,
}

/// Conversation instances held in memory.
pub struct MemoryConversationStore {
    records: Records<Instance>,
    side: Mutex<Side>,
}

impl std::fmt::Debug for MemoryConversationStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryConversationStore")
            .field("records", &self.records)
            .finish_non_exhaustive()
    }
}

/// An instance written by a commit, with the decision that made it.
struct Written {
    key: ConversationKey,
    state: Instance,
    version: Version,
    decision: Decision<Instance>,
}

impl MemoryConversationStore {
    /// A store writing its transitions to `audit` and the tasks they ask for
    /// to `queue`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    ///
    /// use parlance_core::conversation::{
    ///     ContactId, ConversationCommand, ConversationContext, ConversationKey, ConversationState,
    ///     Instance, NewInstance,
    /// };
    /// use parlance_core::{Machine, ProductId};
    /// use parlance_memory::{MemoryAuditLog, MemoryConversationStore, MemoryTaskQueue};
    /// use parlance_ports::{Clock, Commit, ConversationStore, ListFilter, MachineStore, ManualClock, QueueConfig};
    ///
    /// let clock = Arc::new(ManualClock::new());
    /// let queue = Arc::new(MemoryTaskQueue::new(clock.clone(), QueueConfig::default()));
    /// let store = MemoryConversationStore::new(Arc::new(MemoryAuditLog::new()), queue);
    /// let acme = ProductId::parse("acme")?;
    /// let contact = ContactId::parse("+15550100")?;
    ///
    /// // Two conversations with one contact, each decided as if the contact were
    /// // free: the store decides the second again under the contact's lock.
    /// for id in ["0196b2a0-0000-7000-8000-000000000001", "0196b2a0-0000-7000-8000-000000000002"] {
    ///     let key = ConversationKey { product_id: acme.clone(), instance_id: id.parse()? };
    ///     let command = ConversationCommand::Create(NewInstance {
    ///         product_id: acme.clone(),
    ///         instance_id: key.instance_id,
    ///         contact_id: contact.clone(),
    ///         channel: "whatsapp".to_owned(),
    ///         objective: "book a demo".to_owned(),
    ///         todos: vec![],
    ///         heartbeat_interval_s: 3600,
    ///         max_follow_ups: 2,
    ///         metadata: serde_json::Map::new(),
    ///     });
    ///     let free = ConversationContext { contact_held: false };
    ///     let (state, decision) =
    ///         Instance::create(&key, &free, &command, clock.now())?.expect("`Create` creates");
    ///     store
    ///         .commit(Commit {
    ///             key: &key,
    ///             expected: None,
    ///             command: &command,
    ///             state: &state,
    ///             decision: &decision,
    ///             now: clock.now(),
    ///         })
    ///         .await?;
    /// }
    ///
    /// let all = store.list(&acme, &ListFilter::default()).await?;
    /// let states: Vec<ConversationState> = all.items.iter().map(|s| s.state.state).collect();
    /// assert_eq!(states, [ConversationState::Created, ConversationState::Queued]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(audit: Arc<MemoryAuditLog>, queue: Arc<dyn TaskQueue>) -> Self {
        Self {
            records: Records::new(audit, Some(queue), DagLimits::default()),
            side: Mutex::new(Side::default()),
        }
    }

    fn side(&self) -> MutexGuard<'_, Side> {
        self.side.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether an instance of the contact other than `except` holds it.
    fn contact_held(
        &self,
        gate: &Gate<'_, Instance>,
        product: &ProductId,
        contact: &ContactId,
        except: Option<InstanceId>,
    ) -> bool {
        let side = self.side();
        let Some(ids) = side.by_contact.get(&(product.clone(), contact.clone())) else {
            return false;
        };
        let map = gate.lock();
        ids.iter()
            .filter(|(_, id)| Some(*id) != except)
            .any(|(_, id)| {
                map.get(&record_key(&key(product, *id)))
                    .is_some_and(|s| s.state.holds_contact())
            })
    }

    /// The promotion `main` asks for: the contact's oldest `QUEUED`
    /// instance decided `promote` on, when nothing holds the contact once
    /// `main` is written. `main` is seen as written, so an instance resumed
    /// into `QUEUED` may promote itself.
    fn promotion(
        &self,
        gate: &Gate<'_, Instance>,
        main: &Written,
        now: Timestamp,
    ) -> Option<Written> {
        let asks = main
            .decision
            .effects
            .contains(&ConversationEffect::PromoteNextQueued);
        let (product, contact) = (&main.state.product_id, &main.state.contact_id);
        if !asks
            || main.state.holds_contact()
            || self.contact_held(gate, product, contact, Some(main.key.instance_id))
        {
            return None;
        }
        let (mut next, version) = {
            let side = self.side();
            let map = gate.lock();
            side.by_contact
                .get(&(product.clone(), contact.clone()))?
                .iter()
                .find_map(|(_, id)| {
                    if *id == main.key.instance_id {
                        (main.state.state == ConversationState::Queued)
                            .then(|| (main.state.clone(), main.version))
                    } else {
                        map.get(&record_key(&key(product, *id)))
                            .filter(|s| s.state.state == ConversationState::Queued)
                            .map(|s| (s.state.clone(), s.version))
                    }
                })?
        };
        let free = ConversationContext {
            contact_held: false,
        };
        let decision = next
            .decide(&free, &ConversationCommand::Promote, now)
            .ok()?;
        Some(Written {
            key: next.key(),
            state: next,
            version: version.next(),
            decision,
        })
    }

    /// Writes the listings (a new instance's creation number, and every
    /// instance's state), transcript lines and deadline index of `written`,
    /// in order, and ends their claims.
    fn write_side(&self, written: &[Written]) {
        let mut side = self.side();
        for w in written {
            let product = w.key.product_id.clone();
            let (n, before) = match side.listed.get(&w.key) {
                Some(&(n, state)) => (n, Some(state)),
                None => {
                    side.created += 1;
                    let entry = (side.created, w.key.instance_id);
                    side.by_product
                        .entry(product.clone())
                        .or_default()
                        .push(entry);
                    side.by_contact
                        .entry((product.clone(), w.state.contact_id.clone()))
                        .or_default()
                        .push(entry);
                    (side.created, None)
                }
            };
            let now = w.state.state;
            if before != Some(now) {
                if let Some(old) = before
                    && let Some(held) = side.by_state.get_mut(&(product.clone(), old))
                {
                    held.remove(&n);
                }
                side.by_state
                    .entry((product, now))
                    .or_default()
                    .insert(n, w.key.instance_id);
                side.listed.insert(w.key.clone(), (n, now));
            }
            if let Some(old) = side.deadlines.remove(&w.key) {
                side.due.remove(&(old, w.key.clone()));
            }
            if let Some(at) = w.decision.next_deadline {
                side.due.insert((at, w.key.clone()));
                side.deadlines.insert(w.key.clone(), at);
            }
            side.claimed.remove(&w.key);
            let lines = w.decision.effects.iter().filter_map(|e| match e {
                ConversationEffect::Append(m) => Some(m.clone()),
                _ => None,
            });
            side.transcripts
                .entry(w.key.clone())
                .or_default()
                .extend(lines);
        }
    }
}

impl MemoryConversationStore {
    /// A page of a whole product's instances in some states: a page of
    /// each state, read in order from `by_state`, merged, so its cost is
    /// the page's however many instances each state holds.
    fn list_by_state(
        &self,
        side: &Side,
        product: &ProductId,
        filter: &ListFilter,
        limit: usize,
    ) -> ConversationPage {
        let newest = filter.order == ListOrder::NewestFirst;
        let mut states = filter.states.clone();
        states.sort_unstable();
        states.dedup();
        let mut picked: Vec<(u64, InstanceId)> = Vec::new();
        for state in states {
            let Some(held) = side.by_state.get(&(product.clone(), state)) else {
                continue;
            };
            let page: Box<dyn Iterator<Item = (&u64, &InstanceId)>> = match (newest, filter.after) {
                (false, Some(c)) => Box::new(held.range(c.0.saturating_add(1)..)),
                (false, None) => Box::new(held.iter()),
                (true, Some(c)) => Box::new(held.range(..c.0).rev()),
                (true, None) => Box::new(held.iter().rev()),
            };
            picked.extend(page.take(limit + 1).map(|(n, id)| (*n, *id)));
        }
        if newest {
            picked.sort_unstable_by_key(|p| std::cmp::Reverse(p.0));
        } else {
            picked.sort_unstable_by_key(|p| p.0);
        }
        let more = picked.len() > limit;
        picked.truncate(limit);
        let map = self.records.lock();
        let items: Vec<Stored<Instance>> = picked
            .iter()
            .filter_map(|(_, id)| map.get(&record_key(&key(product, *id))).cloned())
            .collect();
        let next = more
            .then(|| picked.last().map(|(n, _)| ListCursor(*n)))
            .flatten();
        ConversationPage { items, next }
    }
}

fn key(product: &ProductId, instance_id: InstanceId) -> ConversationKey {
    ConversationKey {
        product_id: product.clone(),
        instance_id,
    }
}

#[async_trait]
impl MachineStore<Instance> for MemoryConversationStore {
    async fn load(&self, key: &ConversationKey) -> PortResult<Option<Stored<Instance>>> {
        Ok(self.records.load(key).await)
    }

    async fn commit(&self, c: Commit<'_, Instance>) -> PortResult<Committed<Instance>> {
        let gate = self.records.gate().await;
        let current = gate.check(&c)?;
        let (state, decision) = match c.expected {
            // One holder per contact: the creation is decided again with
            // whether the contact is held now.
            None => {
                let held = self.contact_held(&gate, &c.key.product_id, &c.state.contact_id, None);
                redecide_creation(&c, held)?
            }
            Some(_) => (c.state.clone(), c.decision.clone()),
        };
        let main = Written {
            key: c.key.clone(),
            version: current
                .as_ref()
                .map_or(Version::FIRST, |s| s.version.next()),
            state,
            decision,
        };
        let promoted = self.promotion(&gate, &main, c.now);
        let tasks = || {
            main.decision
                .tasks
                .iter()
                .chain(promoted.iter().flat_map(|p| &p.decision.tasks))
        };
        gate.check_tasks(tasks())?;
        // Checked above, so in memory this cannot fail.
        gate.enqueue(tasks()).await?;
        let written: Vec<Written> = std::iter::once(main).chain(promoted).collect();
        self.write_side(&written);
        gate.write(
            written
                .iter()
                .map(|w| Write {
                    key: &w.key,
                    stored: Stored {
                        state: w.state.clone(),
                        version: w.version,
                    },
                    decision: &w.decision,
                })
                .collect(),
            c.now,
        );
        drop(gate);
        let mut written = written.into_iter();
        let main = written.next().expect("the committed instance is written");
        let mut done = Committed::at(main.version);
        if main.state != *c.state {
            done.written = Some((main.state, main.decision));
        }
        done.also = written
            .map(|w| {
                (
                    Stored {
                        state: w.state,
                        version: w.version,
                    },
                    w.decision,
                )
            })
            .collect();
        Ok(done)
    }
}

/// The creation in `c` decided again with `contact_held`.
fn redecide_creation(
    c: &Commit<'_, Instance>,
    contact_held: bool,
) -> PortResult<(Instance, Decision<Instance>)> {
    let ctx = ConversationContext { contact_held };
    match Instance::create(c.key, &ctx, c.command, c.now) {
        Ok(Some(created)) => Ok(created),
        Ok(None) => Err(PortError::invalid(format!(
            "{} does not create a conversation",
            parlance_core::Command::name(c.command)
        ))),
        Err(e) => Err(
            PortError::invalid("the creation is refused under the contact's lock").with_source(e),
        ),
    }
}

#[async_trait]
impl ConversationStore for MemoryConversationStore {
    async fn list(&self, product: &ProductId, filter: &ListFilter) -> PortResult<ConversationPage> {
        let limit = filter.limit.unwrap_or(MAX_LIST).min(MAX_LIST);
        let _settled = self.records.settled().await;
        let side = self.side();
        if filter.contact_id.is_none() && !filter.states.is_empty() {
            return Ok(self.list_by_state(&side, product, filter, limit));
        }
        let entries = match &filter.contact_id {
            Some(contact) => side.by_contact.get(&(product.clone(), contact.clone())),
            None => side.by_product.get(product),
        }
        .map_or(&[][..], Vec::as_slice);
        // Creation numbers ascend along `entries`.
        let after = filter.after.map(|c| c.0);
        let listed: Box<dyn Iterator<Item = &(u64, InstanceId)>> = match filter.order {
            ListOrder::OldestFirst => {
                let from = after.map_or(0, |a| entries.partition_point(|(n, _)| *n <= a));
                Box::new(entries[from..].iter())
            }
            ListOrder::NewestFirst => {
                let to = after.map_or(entries.len(), |a| entries.partition_point(|(n, _)| *n < a));
                Box::new(entries[..to].iter().rev())
            }
        };
        let map = self.records.lock();
        let mut items = Vec::new();
        let mut last = None;
        let mut next = None;
        for (n, id) in listed {
            let Some(stored) = map.get(&record_key(&key(product, *id))) else {
                continue;
            };
            if !filter.states.is_empty() && !filter.states.contains(&stored.state.state) {
                continue;
            }
            if items.len() == limit {
                next = last.map(ListCursor);
                break;
            }
            items.push(stored.clone());
            last = Some(*n);
        }
        Ok(ConversationPage { items, next })
    }

    async fn transcript(&self, key: &ConversationKey) -> PortResult<Vec<Message>> {
        let _settled = self.records.settled().await;
        self.side()
            .transcripts
            .get(key)
            .cloned()
            .ok_or_else(|| PortError::not_found(format!("no conversation {}", key.instance_id)))
    }

    async fn claim_due(
        &self,
        now: Timestamp,
        limit: usize,
        lease: Duration,
    ) -> PortResult<Vec<ConversationKey>> {
        let mut side = self.side();
        let Side { due, claimed, .. } = &mut *side;
        let mut taken = Vec::new();
        for (_, key) in due.iter().take_while(|(at, _)| *at <= now) {
            if taken.len() >= limit {
                break;
            }
            if claimed.get(key).is_some_and(|until| *until > now) {
                continue;
            }
            claimed.insert(key.clone(), now + lease);
            taken.push(key.clone());
        }
        Ok(taken)
    }

    async fn oldest_due(&self, now: Timestamp) -> PortResult<Option<Timestamp>> {
        let side = self.side();
        Ok(side
            .due
            .iter()
            .take_while(|(at, _)| *at <= now)
            .find(|(_, key)| side.claimed.get(key).is_none_or(|until| *until <= now))
            .map(|(at, _)| *at))
    }

    async fn record_delivery(
        &self,
        key: &ConversationKey,
        outbound_seq: u32,
        _now: Timestamp,
    ) -> PortResult<bool> {
        Ok(self.side().deliveries.insert((key.clone(), outbound_seq)))
    }
}
