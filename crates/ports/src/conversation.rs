//! What conversation storage keeps beside the instances themselves.
//!
//! Instances are stored through the one storage protocol,
//! [`MachineStore<Instance>`](crate::MachineStore): `load`, and `commit`,
//! which writes the instance, its transcript lines (the decision's
//! [`ConversationEffect::Append`](parlance_core::conversation::ConversationEffect)
//! effects), its audit entries, its tasks and the heartbeat deadline in one
//! transaction. Two invariants of the machine span instances, so a
//! conversation store keeps them in `commit` under the contact's lock:
//!
//! - **One holder per contact.** A creation (`expected: None`) is decided
//!   again under the lock with whether the contact is held now
//!   ([`Machine::create`](parlance_core::Machine::create) with the same
//!   command and a fresh [`ConversationContext`]); the store writes that
//!   decision and reports it in [`Committed::written`](crate::Committed).
//! - **Promotion.** A decision with the `PromoteNextQueued` effect makes the
//!   store, in the same transaction, take the contact's oldest `QUEUED`
//!   instance when nothing holds the contact any more and decide
//!   [`ConversationCommand::Promote`] on it, writing it with its audit
//!   entries and tasks; it is reported in
//!   [`Committed::also`](crate::Committed).
//!
//! [`ConversationStore`] holds the rest: listings, transcripts, the claim of
//! due heartbeats and the delivery keys.
//!
//! [`ConversationContext`]: parlance_core::conversation::ConversationContext
//! [`ConversationCommand::Promote`]: parlance_core::conversation::ConversationCommand::Promote

use std::time::Duration;

use async_trait::async_trait;
use parlance_core::conversation::{
    ContactId, ConversationKey, ConversationState, Instance, Message,
};
pub use parlance_core::conversation::{DELIVER_KIND, FOLLOW_UP_KIND, TURN_KIND};
use parlance_core::{ProductId, Timestamp};

use crate::{PortResult, Stored};

/// Which instances to list, in which order, and from where.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListFilter {
    /// Only this contact's.
    pub contact_id: Option<ContactId>,
    /// Only in one of these states; any state when empty.
    pub states: Vec<ConversationState>,
    /// Oldest or newest first, by creation.
    pub order: ListOrder,
    /// Only those after this position in `order`: the
    /// [`next`](ConversationPage::next) of the page before.
    pub after: Option<ListCursor>,
    /// At most this many (the adapter caps it at [`MAX_LIST`]).
    pub limit: Option<usize>,
}

/// The most instances one listing answers, and its default.
pub const MAX_LIST: usize = 1000;

/// The order of a listing: by creation, the oldest or the newest first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum ListOrder {
    /// The order the instances were created in.
    #[default]
    OldestFirst,
    /// The reverse.
    NewestFirst,
}

/// A position in a product's instances in the order they were created: a
/// listing goes on after it. Stores make it from a number they keep per
/// instance that only grows; callers pass it back as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ListCursor(pub u64);

/// One page of a listing.
#[derive(Debug, Clone, PartialEq)]
pub struct ConversationPage {
    /// The instances, in the order asked for, with their versions.
    pub items: Vec<Stored<Instance>>,
    /// Where the next page starts, when more instances matched than this
    /// page holds; `None` on the last page.
    pub next: Option<ListCursor>,
}

/// Conversation storage besides `load` and `commit`, scoped by product.
///
/// Invariants every adapter keeps, with its
/// [`MachineStore<Instance>`](crate::MachineStore): at most one instance per
/// `(product_id, contact_id)` holds its contact; a terminal transition and
/// the promotion of the contact's oldest `QUEUED` instance commit together;
/// the transcript is append-only and written with the commit that decided
/// its lines; the heartbeat deadline is written with the state that arms or
/// clears it, and a commit ends any claim on it.
///
/// Implemented by [`MemoryConversationStore`](https://docs.rs/parlance-memory/latest/parlance_memory/struct.MemoryConversationStore.html) and [`PgConversationStore`](https://docs.rs/parlance-postgres/latest/parlance_postgres/struct.PgConversationStore.html), whose
/// constructors' examples call it.
#[async_trait]
pub trait ConversationStore: Send + Sync + 'static {
    /// A page of the instances matching `filter`, in its order, at most
    /// its limit (capped at [`MAX_LIST`]), with where the next page starts.
    async fn list(&self, product: &ProductId, filter: &ListFilter) -> PortResult<ConversationPage>;

    /// The instance's transcript, oldest first; `NotFound` for an unknown
    /// instance.
    async fn transcript(&self, key: &ConversationKey) -> PortResult<Vec<Message>>;

    /// Instances whose heartbeat is due at `now`, at most `limit`, oldest
    /// deadline first; each is hidden from other claimers for `lease` (or
    /// until its next commit), so concurrent sweepers never take the same
    /// one.
    async fn claim_due(
        &self,
        now: Timestamp,
        limit: usize,
        lease: Duration,
    ) -> PortResult<Vec<ConversationKey>>;

    /// The earliest heartbeat due at or before `now` of an instance no
    /// claim holds: the oldest one [`ConversationStore::claim_due`] would
    /// take, `None` when nothing is due. A read, for the sweeper's lag.
    async fn oldest_due(&self, now: Timestamp) -> PortResult<Option<Timestamp>>;

    /// Records the idempotency key of an outbound message once the channel
    /// took it: `true` the first time, `false` when it was already recorded
    /// (an earlier attempt of the same delivery got that far).
    async fn record_delivery(
        &self,
        key: &ConversationKey,
        outbound_seq: u32,
        now: Timestamp,
    ) -> PortResult<bool>;
}
