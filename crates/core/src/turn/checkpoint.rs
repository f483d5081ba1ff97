//! Checkpoints: what a thread's reducer fields hold, and what a turn adds.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{ProductId, Timestamp};

/// Characters allowed in owner and thread ids: printable, no `/`.
fn id_char(c: char) -> bool {
    c != '/'
}

crate::id::string_id!(
    /// Whose memory and threads these are: the user id, or the session id
    /// when there is no user.
    OwnerId,
    "owner id",
    max = 128,
    chars = id_char,
    pattern = "^[^/\\u0000-\\u001F\\u007F-\\u009F]+$"
);

crate::id::string_id!(
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

/// The object key under which a thread keeps its pending interrupt
/// ([`PendingInterrupt`]); `null` once it is resumed. Object keys starting
/// with `__` are the runtime's, never a field's.
pub const INTERRUPT_KEY: &str = "__interrupt";

/// How often a thread's history keeps a full copy of its objects: every
/// this many checkpoints, unless a store is configured otherwise. Reading
/// the state at a checkpoint folds at most this many patches.
pub const DEFAULT_SNAPSHOT_EVERY: u64 = 32;

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
    /// The interrupt this thread waits on, if any: a turn stopped by a
    /// stage, to be resumed with a person's answer.
    pub fn pending_interrupt(&self) -> Option<PendingInterrupt> {
        self.objects
            .get(INTERRUPT_KEY)
            .filter(|v| !v.is_null())
            .and_then(|v| serde_json::from_value(v.clone()).ok())
    }

    /// True when a turn of this thread waits to be resumed.
    pub fn is_interrupted(&self) -> bool {
        self.objects
            .get(INTERRUPT_KEY)
            .is_some_and(|v| !v.is_null())
    }

    /// The objects that are the state's fields: the runtime's own keys
    /// (`__` first, such as [`INTERRUPT_KEY`]) left out.
    pub fn field_objects(&self) -> impl Iterator<Item = (&String, &Value)> {
        self.objects.iter().filter(|(k, _)| !k.starts_with("__"))
    }

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
    /// This delta leaving `interrupt` pending on the thread (or clearing a
    /// pending one with `None`).
    pub fn with_interrupt(mut self, interrupt: Option<&PendingInterrupt>) -> Self {
        let value = interrupt.map_or(Value::Null, |i| {
            serde_json::to_value(i).unwrap_or(Value::Null)
        });
        self.objects.insert(INTERRUPT_KEY.to_owned(), value);
        self
    }

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

/// A turn stopped by one of its stages to wait for a person: what the stage
/// asks, and what the turn needs to go on from that stage when resumed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingInterrupt {
    /// The stage that stopped the turn; it runs again, given the answer.
    pub stage: String,
    /// The step the turn stopped in (1 first); its stages run again.
    pub step: usize,
    /// Every stage of that step, in merge order.
    pub stages: Vec<String>,
    /// The stage that follows a fan-out step, if the step is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub join: Option<String>,
    /// What the stage asks, for the person who answers.
    pub payload: Value,
    /// The turn's fields that are not persisted (input, loaded and
    /// turn-scoped), as they stood when it stopped.
    pub suspended: Value,
}

/// Where a checkpoint came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CheckpointSource {
    /// A turn committed (whole, or up to an interrupt).
    Turn,
    /// An interrupted turn resumed and committed.
    Resume,
    /// An operator's patch of the state.
    Update,
    /// The first checkpoint of a thread forked from another's.
    Fork,
}

impl CheckpointSource {
    /// The wire name: `turn`, `resume`, `update` or `fork`.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckpointSource::Turn => "turn",
            CheckpointSource::Resume => "resume",
            CheckpointSource::Update => "update",
            CheckpointSource::Fork => "fork",
        }
    }

    /// The source named `name`, if it is one.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "turn" => CheckpointSource::Turn,
            "resume" => CheckpointSource::Resume,
            "update" => CheckpointSource::Update,
            "fork" => CheckpointSource::Fork,
            _ => return None,
        })
    }
}

/// A checkpoint that another follows: a thread and one of its versions.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CheckpointRef {
    /// The thread's owner.
    pub owner: OwnerId,
    /// The thread.
    pub thread: ThreadId,
    /// The checkpoint's number (the thread's version when it was written).
    pub version: u64,
}

/// One entry of a thread's history: a checkpoint, without its state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMeta {
    /// Its number: the thread's version once it was written (1 first).
    pub version: u64,
    /// The checkpoint it follows: the thread's previous one, or for the
    /// first checkpoint of a fork, the one it was forked from.
    pub parent: Option<CheckpointRef>,
    /// When it was written.
    pub at: Timestamp,
    /// What wrote it.
    pub source: CheckpointSource,
    /// True when it left a turn waiting on an interrupt.
    pub interrupted: bool,
}

impl CheckpointMeta {
    /// The parent of checkpoint `version` of `thread`: the previous
    /// checkpoint, else `forked_from` for the first one of a fork.
    pub fn parent_of(
        thread: &ThreadKey,
        version: u64,
        forked_from: Option<CheckpointRef>,
    ) -> Option<CheckpointRef> {
        if version > 1 {
            Some(CheckpointRef {
                owner: thread.owner.clone(),
                thread: thread.thread.clone(),
                version: version - 1,
            })
        } else {
            forked_from
        }
    }
}

/// A thread's objects at a checkpoint, from the nearest full copy at or
/// before it and the patches written after that copy, oldest first: each
/// patch's keys replace the copy's.
pub fn fold_objects<'a>(
    snapshot: BTreeMap<String, Value>,
    patches: impl IntoIterator<Item = &'a BTreeMap<String, Value>>,
) -> BTreeMap<String, Value> {
    patches.into_iter().fold(snapshot, |mut objects, patch| {
        for (k, v) in patch {
            objects.insert(k.clone(), v.clone());
        }
        objects
    })
}

/// True when checkpoint `version` keeps a full copy of the objects, a store
/// taking one every `every` checkpoints (the first checkpoint of a thread
/// always keeps one, as does a fork's).
pub fn keeps_snapshot(version: u64, every: u64) -> bool {
    version <= 1 || every <= 1 || version.is_multiple_of(every)
}
