//! The turn runtime's pure core: typed turn state with per-field lifecycles
//! and reducers, turn boundaries, stage graphs and working-memory entries.
//!
//! A turn state is declared with [`turn_state!`](crate::turn_state), which
//! generates the state struct, its input and loaded views, the delta type
//! stages return, and the listable [`Schema`]. Every leaf field has one
//! [`Lifecycle`]:
//!
//! - `input`: set by the caller at turn start;
//! - `loaded`: re-fetched from the memory store every turn, never persisted;
//! - `reducer`: persisted through the checkpointer and folded by its
//!   [`Reducer`] (`append`, `merge` or last-value);
//! - `turn_scoped`: reset at turn start, never persisted.
//!
//! Stages read `&State` and return a delta. The deltas of one step are folded
//! in the order given (the graph's declaration order): `append` concatenates,
//! `merge` merges key-wise with later writers winning per key, and a
//! last-value field written by two stages of one step is an error naming the
//! field and both stages. [`begin_turn`] and [`finish_turn`] are the turn
//! boundaries; the [`CheckpointDelta`] a turn produces holds only what its
//! reducer fields gained, so persisting it costs the same however long the
//! thread is.
//!
//! A thread's [`Checkpoint`] is a [`Machine`](crate::Machine) keyed by
//! [`TurnKey`] (the thread and its load window): its one command,
//! [`TurnCommand::CommitTurn`], commits a turn's delta on the version the
//! turn began on, and its decision asks the store to write that delta only.

mod checkpoint;
mod graph;
mod macros;
mod memory;
mod schema;
pub mod seed;
mod thread;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::NotAllowed;

pub use checkpoint::{
    Checkpoint, CheckpointDelta, CheckpointMeta, CheckpointRef, CheckpointSource,
    DEFAULT_SNAPSHOT_EVERY, INTERRUPT_KEY, LoadWindow, OwnerId, PendingInterrupt, ThreadId,
    ThreadKey, fold_objects, keeps_snapshot,
};
pub use graph::{END, Graph, GraphBuilder, GraphError, GraphRun, Next, RouteFn, Step};
pub use memory::{
    EpisodicEntry, MemoryEntry, MemoryFilter, MemoryHit, MemoryId, MemoryKind, MemoryRecord,
    ProceduralProfile, QueryEmbedding, RETRIEVE_CANDIDATES, RRF_K, RetrievalPath, Retrieved,
    SemanticEntry, WorkingMemoryEntry, cosine_similarity, format_working_memory_entries,
    format_working_memory_entry, rank_by_tokens, rank_by_vector, reciprocal_rank_fusion,
    retrieve_from, tokenize,
};
pub use schema::{FieldSpec, Lifecycle, Reducer, Schema};
pub use thread::{
    INTERRUPT_PENDING, NO_INTERRUPT, OPEN, RESERVED_KEY, STALE_TURN, TABLE, TurnCommand,
    TurnEffect, TurnKey,
};

/// The stage name under which [`begin_turn`] applies the opening delta.
pub const OPENING_STAGE: &str = "begin_turn";

/// Why a turn operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TurnError {
    /// Two stages of one step wrote the same last-value field.
    #[error("field {field} was written by both {first} and {second} in one step")]
    ConflictingWrites {
        /// The field (its schema name).
        field: &'static str,
        /// The earlier writer, in merge order.
        first: &'static str,
        /// The later writer.
        second: &'static str,
    },
    /// A checkpointed value does not decode into the field's type.
    #[error("checkpointed field {field} does not decode: {message}")]
    Decode {
        /// The field.
        field: &'static str,
        /// The decoder's complaint.
        message: String,
    },
    /// A field's value does not encode as JSON.
    #[error("field {field} does not encode: {message}")]
    Encode {
        /// The field.
        field: &'static str,
        /// The encoder's complaint.
        message: String,
    },
    /// The thread does not take this command as it is (a turn that began on
    /// another version of it: reason [`STALE_TURN`]).
    #[error(transparent)]
    NotAllowed(#[from] NotAllowed),
    /// The thread has committed as many turns as its version can count.
    #[error("thread has reached its limit of {limit} turns")]
    TurnLimit {
        /// The most turns a thread holds.
        limit: u64,
    },
}

/// Bookkeeping the runtime keeps inside every state: where each list stood
/// when the turn began and which persisted fields the turn wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TurnBook {
    /// The checkpoint version the turn started from.
    pub base_version: u64,
    append_base: BTreeMap<&'static str, usize>,
    dirty: BTreeSet<&'static str>,
}

impl TurnBook {
    /// A book for a turn starting at `base_version`.
    pub fn new(base_version: u64) -> Self {
        Self {
            base_version,
            ..Self::default()
        }
    }

    /// True when the turn has written the persisted field `field`.
    pub fn is_dirty(&self, field: &str) -> bool {
        self.dirty.contains(field)
    }
}

/// Key-wise merge for `merge` reducer fields: sibling keys are kept, and for
/// each key the later value wins.
pub trait Merge {
    /// Merges `later` into `self`.
    fn merge(&mut self, later: Self);
}

impl Merge for serde_json::Map<String, serde_json::Value> {
    fn merge(&mut self, later: Self) {
        for (k, v) in later {
            self.insert(k, v);
        }
    }
}

impl<K: Ord, V> Merge for BTreeMap<K, V> {
    fn merge(&mut self, later: Self) {
        self.extend(later);
    }
}

/// Implements [`Merge`] for a struct of `Option` fields: a `Some` in the
/// later value replaces the field, a `None` keeps it.
#[macro_export]
macro_rules! merge_by_some {
    ($ty:ty { $($field:ident),* $(,)? }) => {
        impl $crate::turn::Merge for $ty {
            fn merge(&mut self, later: Self) {
                $(
                    if later.$field.is_some() {
                        self.$field = later.$field;
                    }
                )*
            }
        }
    };
}

/// What [`turn_state!`](crate::turn_state) generates for a state type.
pub trait TurnState: Sized {
    /// The caller-set fields.
    type Input;
    /// The fields re-fetched from the memory store every turn.
    type Loaded;
    /// What a stage returns: one slot per non-input field.
    type Delta: Default;

    /// Every field with its lifecycle, reducer and writers.
    fn schema() -> &'static Schema;

    /// The state at turn start: reducer fields from the checkpoint,
    /// turn-scoped fields at their defaults, input and loaded fields as given.
    fn restore(
        checkpoint: &Checkpoint,
        input: Self::Input,
        loaded: Self::Loaded,
    ) -> Result<Self, TurnError>;

    /// Folds one step's deltas, in the order given. Nothing is applied when
    /// two writers of one step collide on a last-value field.
    fn apply(&mut self, writes: Vec<(&'static str, Self::Delta)>) -> Result<(), TurnError>;

    /// What the reducer fields gained since the turn began.
    fn checkpoint_delta(&self) -> Result<CheckpointDelta, TurnError>;

    /// The runtime's bookkeeping.
    fn book(&self) -> &TurnBook;

    /// The fields that are not persisted (input, loaded and turn-scoped),
    /// as a JSON object keyed by schema name: what an interrupted turn
    /// keeps in its [`PendingInterrupt::suspended`] to go on from later.
    fn suspend(&self) -> Result<serde_json::Value, TurnError>;

    /// The state of an interrupted turn, to resume it: reducer fields from
    /// `checkpoint` (the one that holds the interrupt, so the resumed turn's
    /// delta holds only what it gains after it), every other field from
    /// `suspended` ([`TurnState::suspend`]); a field `suspended` lacks is
    /// at its default.
    fn resume_from(
        checkpoint: &Checkpoint,
        suspended: &serde_json::Value,
    ) -> Result<Self, TurnError>;

    /// What a checkpoint load needs: the last entries of each `window`
    /// field's source, every other list whole.
    fn load_window() -> LoadWindow;
}

/// The delta slot of a `window` field: it is written through its source.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ViewOnly;

/// What a state type adds by hand: the opening delta, the output view and
/// where stage timings go.
pub trait TurnView: TurnState {
    /// The public output of a turn.
    type Output;

    /// What turn start writes after restoring (for instance the user turn
    /// appended to the history). Applied as the stage [`OPENING_STAGE`].
    fn opening(&self) -> Self::Delta {
        Self::Delta::default()
    }

    /// The output view of a finished turn.
    fn output(&self) -> Self::Output;

    /// The output view of a turn a stage stopped to wait for a person,
    /// asking `payload`: by default the state's output as it stood before
    /// the interrupted step.
    fn interrupted(&self, payload: &serde_json::Value) -> Self::Output {
        let _ = payload;
        self.output()
    }

    /// Records a stage's wall time (milliseconds) in the state's diagnostics.
    fn record_stage_time(&mut self, stage: &'static str, millis: f64) {
        let _ = (stage, millis);
    }
}

/// Starts a turn: reducer fields restored from `checkpoint`, turn-scoped
/// fields reset, `input` and `loaded` set, then the opening delta applied.
///
/// A whole turn, from a state declared with
/// [`turn_state!`](crate::turn_state) to the commit of its delta on the
/// thread:
///
/// ```
/// use parlance_core::turn::{
///     Checkpoint, ThreadKey, TurnCommand, TurnKey, TurnState, TurnView, begin_turn, finish_turn,
/// };
/// use parlance_core::{Machine, Timestamp, turn_state};
///
/// turn_state! {
///     /// A chat turn.
///     pub struct Chat {
///         input ChatInput {
///             /// The user's message.
///             message: String, by ["caller"];
///         }
///         loaded ChatLoaded {}
///         reducer {
///             /// Every line so far.
///             history: Vec<String> => append, by ["begin_turn", "reply"];
///         }
///         turn_scoped {
///             /// This turn's reply.
///             reply: String => last, by ["reply"];
///         }
///         delta ChatDelta;
///     }
/// }
///
/// impl TurnView for Chat {
///     type Output = String;
///
///     // Turn start appends the user's line to the history.
///     fn opening(&self) -> ChatDelta {
///         ChatDelta { history: vec![format!("user: {}", self.message)], ..ChatDelta::default() }
///     }
///
///     fn output(&self) -> String {
///         self.reply.clone()
///     }
/// }
///
/// // A new thread: version 0, nothing stored yet.
/// let input = ChatInput { message: "hello".to_owned() };
/// let mut chat: Chat = begin_turn(&Checkpoint::default(), input, ChatLoaded {})?;
///
/// // A stage reads the state and returns a delta; the runtime folds it.
/// let reply = ChatDelta {
///     history: vec!["agent: hi!".to_owned()],
///     reply: Some("hi!".to_owned()),
/// };
/// chat.apply(vec![("reply", reply)])?;
/// let (output, delta) = finish_turn(chat)?;
/// assert_eq!(output, "hi!");
/// assert_eq!(delta.appends["history"].len(), 2); // only what the turn gained
///
/// // Committing the delta on the version the turn began on creates the thread.
/// let key = TurnKey::new(
///     ThreadKey {
///         product_id: "acme".parse()?,
///         owner: "u-42".parse()?,
///         thread: "t-1".parse()?,
///     },
///     Chat::load_window(),
/// );
/// let now = Timestamp::from_secs(1_767_225_600).expect("a date in range");
/// let commit = TurnCommand::commit(0, delta);
/// let (thread, _) = Checkpoint::create(&key, &(), &commit, now)?.expect("a first turn creates");
/// assert_eq!(thread.version, 1);
/// assert_eq!(thread.lists["history"], ["user: hello", "agent: hi!"]);
///
/// // A turn computed on a version that is gone is refused: run it again.
/// let mut thread = thread;
/// let stale = thread.decide(&(), &commit, now).unwrap_err();
/// assert!(stale.to_string().contains("stale_turn"));
/// assert_eq!(thread.version, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
///
/// [`TurnError::Decode`] when a checkpointed value does not decode into its
/// field.
pub fn begin_turn<S: TurnView>(
    checkpoint: &Checkpoint,
    input: S::Input,
    loaded: S::Loaded,
) -> Result<S, TurnError> {
    let mut state = S::restore(checkpoint, input, loaded)?;
    let opening = state.opening();
    state.apply(vec![(OPENING_STAGE, opening)])?;
    Ok(state)
}

/// Ends a turn: the output view, and the checkpoint delta holding only what
/// the reducer fields gained this turn.
pub fn finish_turn<S: TurnView>(state: S) -> Result<(S::Output, CheckpointDelta), TurnError> {
    let delta = state.checkpoint_delta()?;
    Ok((state.output(), delta))
}

// Helpers the macro expands to. Public for the macro, hidden from docs.

#[doc(hidden)]
pub fn __restore_list<E: DeserializeOwned>(
    checkpoint: &Checkpoint,
    field: &'static str,
    book: &mut TurnBook,
) -> Result<Vec<E>, TurnError> {
    let list = match checkpoint.lists.get(field) {
        Some(values) => values
            .iter()
            .map(|v| {
                serde_json::from_value(v.clone()).map_err(|e| TurnError::Decode {
                    field,
                    message: e.to_string(),
                })
            })
            .collect::<Result<Vec<E>, _>>()?,
        None => Vec::new(),
    };
    book.append_base.insert(field, list.len());
    Ok(list)
}

#[doc(hidden)]
pub fn __restore_object<T: DeserializeOwned + Default>(
    checkpoint: &Checkpoint,
    field: &'static str,
) -> Result<T, TurnError> {
    match checkpoint.objects.get(field) {
        Some(v) => serde_json::from_value(v.clone()).map_err(|e| TurnError::Decode {
            field,
            message: e.to_string(),
        }),
        None => Ok(T::default()),
    }
}

#[doc(hidden)]
pub fn __persist_list<E: Serialize>(
    list: &[E],
    field: &'static str,
    book: &TurnBook,
    delta: &mut CheckpointDelta,
) -> Result<(), TurnError> {
    let base = book
        .append_base
        .get(field)
        .copied()
        .unwrap_or(0)
        .min(list.len());
    let gained = &list[base..];
    if gained.is_empty() {
        return Ok(());
    }
    let values = gained
        .iter()
        .map(|e| {
            serde_json::to_value(e).map_err(|err| TurnError::Encode {
                field,
                message: err.to_string(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    delta.appends.insert(field.to_owned(), values);
    Ok(())
}

#[doc(hidden)]
pub fn __persist_object<T: Serialize>(
    value: &T,
    field: &'static str,
    book: &TurnBook,
    delta: &mut CheckpointDelta,
) -> Result<(), TurnError> {
    if !book.dirty.contains(field) {
        return Ok(());
    }
    let v = serde_json::to_value(value).map_err(|err| TurnError::Encode {
        field,
        message: err.to_string(),
    })?;
    delta.objects.insert(field.to_owned(), v);
    Ok(())
}

#[doc(hidden)]
pub fn __restore_window<E: DeserializeOwned>(
    checkpoint: &Checkpoint,
    source: &'static str,
    last: usize,
) -> Result<Vec<E>, TurnError> {
    let all = checkpoint.lists.get(source).map_or(&[][..], Vec::as_slice);
    all[all.len().saturating_sub(last)..]
        .iter()
        .map(|v| {
            serde_json::from_value(v.clone()).map_err(|e| TurnError::Decode {
                field: source,
                message: e.to_string(),
            })
        })
        .collect()
}

#[doc(hidden)]
pub fn __sync_window<E: Clone>(target: &mut Vec<E>, written: &[E], last: usize) {
    target.extend(written.iter().cloned());
    if target.len() > last {
        target.drain(..target.len() - last);
    }
}

#[doc(hidden)]
pub fn __widen_window(window: &mut LoadWindow, source: &'static str, last: usize) {
    let entry = window.tails.entry(source.to_owned()).or_insert(last);
    *entry = (*entry).max(last);
}

#[doc(hidden)]
pub type __Suspended = serde_json::Map<String, serde_json::Value>;

#[doc(hidden)]
pub type __SuspendedValue = serde_json::Value;

#[doc(hidden)]
pub fn __suspend_field<T: Serialize>(
    into: &mut __Suspended,
    field: &'static str,
    value: &T,
) -> Result<(), TurnError> {
    let v = serde_json::to_value(value).map_err(|err| TurnError::Encode {
        field,
        message: err.to_string(),
    })?;
    into.insert(field.to_owned(), v);
    Ok(())
}

#[doc(hidden)]
pub fn __unsuspend_field<T: DeserializeOwned + Default>(
    suspended: &serde_json::Value,
    field: &'static str,
) -> Result<T, TurnError> {
    match suspended.get(field) {
        Some(v) => serde_json::from_value(v.clone()).map_err(|e| TurnError::Decode {
            field,
            message: e.to_string(),
        }),
        None => Ok(T::default()),
    }
}

#[doc(hidden)]
pub fn __mark_dirty(book: &mut TurnBook, field: &'static str) {
    book.dirty.insert(field);
}

#[doc(hidden)]
pub fn __check_last<D>(
    writes: &[(&'static str, D)],
    field: &'static str,
    written: impl Fn(&D) -> bool,
) -> Result<(), TurnError> {
    let mut first: Option<&'static str> = None;
    for (stage, d) in writes {
        if written(d) {
            if let Some(first) = first {
                return Err(TurnError::ConflictingWrites {
                    field,
                    first,
                    second: stage,
                });
            }
            first = Some(stage);
        }
    }
    Ok(())
}

#[doc(hidden)]
pub fn __apply_append<E>(target: &mut Vec<E>, write: Vec<E>) -> bool {
    let wrote = !write.is_empty();
    target.extend(write);
    wrote
}

#[doc(hidden)]
pub fn __apply_merge<T: Merge>(target: &mut T, write: Option<T>) -> bool {
    match write {
        Some(w) => {
            target.merge(w);
            true
        }
        None => false,
    }
}

#[doc(hidden)]
pub fn __apply_last<T>(target: &mut T, write: Option<T>) -> bool {
    match write {
        Some(w) => {
            *target = w;
            true
        }
        None => false,
    }
}
