//! Checkpoints: what a thread's reducer fields hold, and what a turn adds.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ProductId;

/// Characters allowed in owner and thread ids: printable, no `/`.
fn id_char(c: char) -> bool {
    c != '/'
}

crate::string_id!(
    /// Whose memory and threads these are: the user id, or the session id
    /// when there is no user.
    OwnerId,
    "owner id",
    max = 128,
    chars = id_char,
    pattern = "^[^/\\u0000-\\u001F\\u007F-\\u009F]+$"
);

crate::string_id!(
    /// A conversation thread (the session id).
    ThreadId,
    "thread id",
    max = 128,
    chars = id_char,
    pattern = "^[^/\\u0000-\\u001F\\u007F-\\u009F]+$"
);

/// Where a thread's checkpoint lives: product first, then owner and thread.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ThreadKey {
    /// The tenant.
    pub product_id: ProductId,
    /// The owner.
    pub owner: OwnerId,
    /// The thread.
    pub thread: ThreadId,
}

/// A thread's persisted reducer fields at one version: the state of the
/// thread machine (see [`TurnCommand`](super::TurnCommand)).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// How many turns have been committed; 0 for a new thread. A stored
    /// thread's version is its store version.
    pub version: u64,
    /// `append` fields: their entries, oldest first (only the last ones when
    /// the load asked for a window).
    pub lists: BTreeMap<String, Vec<Value>>,
    /// `merge` and last-value reducer fields: their current values.
    pub objects: BTreeMap<String, Value>,
}

impl Checkpoint {
    /// The checkpoint after `delta` is committed: lists extended, objects
    /// replaced, version bumped. A list with no entries is absent, as a
    /// store loads it: appending nothing creates no list.
    pub fn apply(&mut self, delta: &CheckpointDelta) {
        for (field, entries) in &delta.appends {
            if entries.is_empty() {
                continue;
            }
            self.lists
                .entry(field.clone())
                .or_default()
                .extend(entries.iter().cloned());
        }
        for (field, value) in &delta.objects {
            self.objects.insert(field.clone(), value.clone());
        }
        self.version += 1;
    }

    /// This checkpoint with each windowed list cut to its last entries (a
    /// list cut to none is absent, as a store loads it).
    pub fn windowed(mut self, window: &LoadWindow) -> Self {
        for (field, last) in &window.tails {
            if let Some(list) = self.lists.get_mut(field)
                && list.len() > *last
            {
                if *last == 0 {
                    self.lists.remove(field);
                } else {
                    list.drain(..list.len() - *last);
                }
            }
        }
        self
    }
}

/// What one turn adds to a thread: new list entries and replaced objects.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckpointDelta {
    /// New entries per `append` field, in order.
    pub appends: BTreeMap<String, Vec<Value>>,
    /// New values of the `merge` and last-value reducer fields the turn wrote.
    pub objects: BTreeMap<String, Value>,
}

impl CheckpointDelta {
    /// True when the turn changed no reducer field.
    pub fn is_empty(&self) -> bool {
        self.appends.is_empty() && self.objects.is_empty()
    }

    /// This delta followed by `later`, as one: lists concatenated, later
    /// objects winning.
    pub fn then(mut self, later: &CheckpointDelta) -> Self {
        for (field, entries) in &later.appends {
            self.appends
                .entry(field.clone())
                .or_default()
                .extend(entries.iter().cloned());
        }
        for (field, value) in &later.objects {
            self.objects.insert(field.clone(), value.clone());
        }
        self
    }

    /// The bytes this delta carries as JSON: every list entry and object
    /// value, serialized. What an adapter has to write for it.
    pub fn encoded_len(&self) -> usize {
        let len = |v: &Value| serde_json::to_vec(v).map_or(0, |b| b.len());
        self.appends
            .values()
            .flat_map(|entries| entries.iter())
            .map(len)
            .sum::<usize>()
            + self.objects.values().map(len).sum::<usize>()
    }
}

/// Which lists to load only in part: field name to how many of the last
/// entries to return. Lists not named load whole.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadWindow {
    /// Field name to the number of last entries wanted.
    pub tails: BTreeMap<String, usize>,
}

impl LoadWindow {
    /// Every list whole.
    pub fn all() -> Self {
        Self::default()
    }

    /// Adds a window of the last `last` entries of `field`.
    pub fn tail(mut self, field: &str, last: usize) -> Self {
        self.tails.insert(field.to_owned(), last);
        self
    }
}
