//! The session snapshot, `_v: 2`, and a decoder that validates every field.
//!
//! Key names are the reference SDK's (`current_state`, `last_interaction_at`,
//! `thinking.cooldown_started_at`, `proactive.last_message_at`, ...) plus
//! `product_id`. Timestamps are wall-clock Unix epoch seconds, so a snapshot
//! is valid in any process on any host; `cooldown_started_at` is `null` when
//! no cooldown was started. Keys the seed gives a default may be absent; a
//! missing timestamp is an error, never "now". Decoding any input never
//! panics: a malformed one gives a [`DecodeError`] naming the field.
//!
//! Both directions are typed: the snapshot is written by serde straight from
//! the state, and read in one pass from the text (or a value) into the
//! fields it needs, with no `serde_json::Value` in between (see "decoding"
//! below).

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::session::state::{
    AssistState, DEFAULT_COOLDOWN_PERIOD_S, DEFAULT_INTERACTION_TIMEOUT_S, ProactiveState,
    ReactiveState, SessionId, SessionState, TextSlot, ThinkingState,
};
use crate::{ProductId, Timestamp};

/// The snapshot version this build writes and reads.
pub const SNAPSHOT_VERSION: u64 = 2;

/// The keys a snapshot must hold, as paths (`proactive.last_message_at` is
/// `last_message_at` inside `proactive`; an absent `proactive` lacks it). A
/// snapshot missing any of them is refused with [`DecodeError::Missing`]
/// naming it; every other key has a default. None of these has a default
/// we could stand behind:
///
/// - `_v`: a snapshot of unknown version is never read as this one;
/// - `product_id`, `session_id`: the session's identity (the reference
///   loads a missing id as `""`, which its constructor forbids);
/// - `current_state`: a default of `thinking` would silently end an active
///   session and start no cooldown (the reference does that);
/// - `last_interaction_at`, `proactive.last_message_at`,
///   `reactive.last_message_at`: a default of "now" would extend timeouts
///   instead of flagging a corrupt record (the reference's weakness 2).
///
/// `thinking.cooldown_started_at` is not listed: it may be absent or `null`
/// (no cooldown), and is required only while `thinking.cooldown_active` is
/// true.
pub const SNAPSHOT_REQUIRED_KEYS: &[&str] = &[
    "_v",
    "product_id",
    "session_id",
    "current_state",
    "last_interaction_at",
    "proactive.last_message_at",
    "reactive.last_message_at",
];

/// Why a document could not be decoded. `path` names the field, e.g.
/// `thinking.cooldown_started_at` or `tours[2].id` (`$` is the document).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The bytes are not JSON.
    #[error("not valid JSON: {message}")]
    Syntax {
        /// The parser's complaint.
        message: String,
    },
    /// A required field is absent.
    #[error("{path}: missing")]
    Missing {
        /// The field.
        path: String,
    },
    /// A field holds the wrong JSON type.
    #[error("{path}: expected {expected}, found {found}")]
    WrongType {
        /// The field.
        path: String,
        /// What it must be.
        expected: &'static str,
        /// What it is.
        found: &'static str,
    },
    /// A field has the right type but an unacceptable value.
    #[error("{path}: {problem}")]
    Invalid {
        /// The field.
        path: String,
        /// What is wrong with it.
        problem: String,
    },
    /// `_v` is not the version this build reads.
    #[error("_v: unsupported snapshot version {found}, expected {SNAPSHOT_VERSION}")]
    Version {
        /// The `_v` found, as JSON text.
        found: String,
    },
    /// `current_state` is not one of the three wire values.
    #[error("current_state: unknown state {found}")]
    UnknownState {
        /// The value found, as JSON text.
        found: String,
    },
}

impl DecodeError {
    /// The offending field's path, when there is one.
    pub fn path(&self) -> Option<&str> {
        match self {
            DecodeError::Syntax { .. } => None,
            DecodeError::Missing { path }
            | DecodeError::WrongType { path, .. }
            | DecodeError::Invalid { path, .. } => Some(path),
            DecodeError::Version { .. } => Some("_v"),
            DecodeError::UnknownState { .. } => Some("current_state"),
        }
    }
}

/// A field's position, built on the stack and rendered only on error.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Path<'a> {
    parent: Option<&'a Path<'a>>,
    seg: Seg<'a>,
}

#[derive(Debug, Clone, Copy)]
enum Seg<'a> {
    Root,
    Key(&'a str),
    Index(usize),
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

impl<'a> Path<'a> {
    pub(crate) const fn root() -> Path<'static> {
        Path {
            parent: None,
            seg: Seg::Root,
        }
    }

    pub(crate) fn key(&'a self, key: &'a str) -> Path<'a> {
        Path {
            parent: Some(self),
            seg: Seg::Key(key),
        }
    }

    pub(crate) fn index(&'a self, i: usize) -> Path<'a> {
        Path {
            parent: Some(self),
            seg: Seg::Index(i),
        }
    }

    fn render(&self) -> String {
        let mut segs = Vec::new();
        let mut p = Some(self);
        while let Some(cur) = p {
            segs.push(cur.seg);
            p = cur.parent;
        }
        let mut out = String::new();
        for seg in segs.into_iter().rev() {
            match seg {
                Seg::Root => {}
                Seg::Key(k) => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(k);
                }
                Seg::Index(i) => out.push_str(&format!("[{i}]")),
            }
        }
        if out.is_empty() { "$".to_owned() } else { out }
    }

    pub(crate) fn wrong_type(&self, expected: &'static str, found: &Value) -> DecodeError {
        DecodeError::WrongType {
            path: self.render(),
            expected,
            found: type_name(found),
        }
    }

    pub(crate) fn invalid(&self, problem: impl fmt::Display) -> DecodeError {
        DecodeError::Invalid {
            path: self.render(),
            problem: problem.to_string(),
        }
    }

    pub(crate) fn object<'v>(&self, v: &'v Value) -> Result<&'v Map<String, Value>, DecodeError> {
        v.as_object().ok_or_else(|| self.wrong_type("an object", v))
    }

    pub(crate) fn string<'v>(&self, v: &'v Value) -> Result<&'v str, DecodeError> {
        v.as_str().ok_or_else(|| self.wrong_type("a string", v))
    }

    #[cfg(test)]
    pub(crate) fn bool(&self, v: &Value) -> Result<bool, DecodeError> {
        v.as_bool().ok_or_else(|| self.wrong_type("a boolean", v))
    }

    pub(crate) fn number(&self, v: &Value) -> Result<f64, DecodeError> {
        match v {
            Value::Number(n) => n
                .as_f64()
                .filter(|x| x.is_finite())
                .ok_or_else(|| self.invalid("not a finite number")),
            other => Err(self.wrong_type("a number", other)),
        }
    }

    /// A finite, non-negative number of seconds.
    pub(crate) fn seconds(&self, v: &Value) -> Result<f64, DecodeError> {
        let x = self.number(v)?;
        if x >= 0.0 {
            Ok(x)
        } else {
            Err(self.invalid(format_args!("{x} seconds is negative")))
        }
    }

    #[cfg(test)]
    pub(crate) fn timestamp(&self, v: &Value) -> Result<Timestamp, DecodeError> {
        let secs = self.number(v)?;
        Timestamp::from_epoch_seconds(secs).map_err(|e| self.invalid(e))
    }

    /// `obj[key]`, or [`DecodeError::Missing`] naming `self.key`.
    pub(crate) fn required<'v>(
        &self,
        obj: &'v Map<String, Value>,
        key: &str,
    ) -> Result<&'v Value, DecodeError> {
        obj.get(key).ok_or_else(|| DecodeError::Missing {
            path: self.key(key).render(),
        })
    }
}

// ---- encoding ------------------------------------------------------------

/// The snapshot document, borrowed from the state and written by serde in
/// this field order (the document's key order).
#[derive(Serialize)]
struct SnapshotOut<'a> {
    #[serde(rename = "_v")]
    v: u64,
    product_id: &'a str,
    session_id: &'a str,
    metadata: &'a Map<String, Value>,
    current_state: &'static str,
    last_interaction_at: f64,
    interaction_timeout_s: f64,
    cooldown_period_s: f64,
    visual_guidance_active: bool,
    active_tour_id: Option<&'a str>,
    conversation_linked: bool,
    conversation_id: Option<&'a str>,
    thinking: ThinkingOut,
    proactive: ProactiveOut,
    reactive: ReactiveOut,
}

#[derive(Serialize)]
struct ThinkingOut {
    cooldown_active: bool,
    cooldown_started_at: Option<f64>,
    active_cooldown_period_s: Option<f64>,
}

#[derive(Serialize)]
struct ProactiveOut {
    user_clicked_option: bool,
    time_since_last_interaction_s: f64,
    last_message_at: f64,
}

#[derive(Serialize)]
struct ReactiveOut {
    time_since_last_interaction_s: f64,
    last_message_at: f64,
}

impl SessionState {
    fn snapshot_out(&self) -> SnapshotOut<'_> {
        let secs = Timestamp::as_epoch_seconds;
        SnapshotOut {
            v: SNAPSHOT_VERSION,
            product_id: self.product_id.as_str(),
            session_id: self.session_id.as_str(),
            metadata: &self.metadata,
            current_state: self.current_state.as_str(),
            last_interaction_at: secs(self.last_interaction_at),
            interaction_timeout_s: self.interaction_timeout_s,
            cooldown_period_s: self.cooldown_period_s,
            visual_guidance_active: self.visual_guidance_active,
            active_tour_id: self.active_tour_id(),
            conversation_linked: self.conversation_linked,
            conversation_id: self.conversation_id(),
            thinking: ThinkingOut {
                cooldown_active: self.thinking.cooldown_active,
                cooldown_started_at: self.thinking.cooldown_started_at.map(secs),
                active_cooldown_period_s: self.thinking.active_cooldown_period_s,
            },
            proactive: ProactiveOut {
                user_clicked_option: self.proactive.user_clicked_option,
                time_since_last_interaction_s: self.proactive.time_since_last_interaction_s,
                last_message_at: secs(self.proactive.last_message_at),
            },
            reactive: ReactiveOut {
                time_since_last_interaction_s: self.reactive.time_since_last_interaction_s,
                last_message_at: secs(self.reactive.last_message_at),
            },
        }
    }

    /// The snapshot document (`_v: 2`). A number that is not finite is
    /// written as `null` (JSON has no such numbers; decoding refuses it).
    pub fn to_snapshot(&self) -> Value {
        // Serializing these types into a value cannot fail: every map key
        // is text.
        serde_json::to_value(self.snapshot_out()).unwrap_or_default()
    }

    /// The snapshot as JSON text, written straight from the state: the same
    /// document as [`SessionState::to_snapshot`], key for key, without the
    /// intermediate value.
    pub fn to_snapshot_string(&self) -> String {
        let mut out = Vec::with_capacity(512);
        self.write_snapshot(&mut out);
        // serde_json writes UTF-8 only.
        String::from_utf8(out).unwrap_or_default()
    }

    /// Appends the snapshot as JSON text (see
    /// [`SessionState::to_snapshot_string`]) to `out`.
    pub fn write_snapshot(&self, out: &mut Vec<u8>) {
        // Written by hand rather than by serde's derive, which escapes every
        // key on every write (most of the encoding time): the keys are fixed
        // ASCII text that needs no escaping, so they go out as bytes, while
        // every value is written by serde_json itself. The result is the
        // derive's text byte for byte (a test holds this against
        // `to_snapshot`).
        let s = self.snapshot_out();
        let th = &s.thinking;
        let pr = &s.proactive;
        let re = &s.reactive;
        out.extend_from_slice(b"{\"_v\":");
        value(out, &s.v);
        out.extend_from_slice(b",\"product_id\":");
        value(out, s.product_id);
        out.extend_from_slice(b",\"session_id\":");
        value(out, s.session_id);
        out.extend_from_slice(b",\"metadata\":");
        value(out, s.metadata);
        out.extend_from_slice(b",\"current_state\":");
        value(out, s.current_state);
        out.extend_from_slice(b",\"last_interaction_at\":");
        value(out, &s.last_interaction_at);
        out.extend_from_slice(b",\"interaction_timeout_s\":");
        value(out, &s.interaction_timeout_s);
        out.extend_from_slice(b",\"cooldown_period_s\":");
        value(out, &s.cooldown_period_s);
        out.extend_from_slice(b",\"visual_guidance_active\":");
        value(out, &s.visual_guidance_active);
        out.extend_from_slice(b",\"active_tour_id\":");
        value(out, &s.active_tour_id);
        out.extend_from_slice(b",\"conversation_linked\":");
        value(out, &s.conversation_linked);
        out.extend_from_slice(b",\"conversation_id\":");
        value(out, &s.conversation_id);
        out.extend_from_slice(b",\"thinking\":{\"cooldown_active\":");
        value(out, &th.cooldown_active);
        out.extend_from_slice(b",\"cooldown_started_at\":");
        value(out, &th.cooldown_started_at);
        out.extend_from_slice(b",\"active_cooldown_period_s\":");
        value(out, &th.active_cooldown_period_s);
        out.extend_from_slice(b"},\"proactive\":{\"user_clicked_option\":");
        value(out, &pr.user_clicked_option);
        out.extend_from_slice(b",\"time_since_last_interaction_s\":");
        value(out, &pr.time_since_last_interaction_s);
        out.extend_from_slice(b",\"last_message_at\":");
        value(out, &pr.last_message_at);
        out.extend_from_slice(b"},\"reactive\":{\"time_since_last_interaction_s\":");
        value(out, &re.time_since_last_interaction_s);
        out.extend_from_slice(b",\"last_message_at\":");
        value(out, &re.last_message_at);
        out.extend_from_slice(b"}}");
    }

    /// Decodes snapshot bytes (JSON text) straight into the state, with no
    /// intermediate value.
    ///
    /// # Errors
    ///
    /// [`DecodeError::Syntax`] for text that is not JSON, else as
    /// [`SessionState::from_snapshot`]: the same field, the same message.
    pub fn from_snapshot_slice(bytes: &[u8]) -> Result<Self, DecodeError> {
        let doc: Doc<'_> = serde_json::from_slice(bytes).map_err(|e| DecodeError::Syntax {
            message: e.to_string(),
        })?;
        doc.decode()
    }

    /// Decodes a snapshot document, validating every field.
    ///
    /// # Errors
    ///
    /// A [`DecodeError`] naming the first malformed field: a `_v` other than
    /// the integer 2 (or none), an unknown `current_state`, a missing
    /// timestamp, a value of the wrong type, an invalid id, a negative or
    /// non-finite number of seconds, or an active cooldown without a start.
    pub fn from_snapshot(v: &Value) -> Result<Self, DecodeError> {
        // Reading a value never fails: every visitor below accepts any JSON.
        let doc = Doc::deserialize(v).map_err(|e| DecodeError::Syntax {
            message: e.to_string(),
        })?;
        doc.decode()
    }
}

/// Appends `v` as serde_json writes it.
fn value<T: Serialize + ?Sized>(out: &mut Vec<u8>, v: &T) {
    // Writing into a Vec cannot fail, nor can a value of the snapshot (every
    // map key is text).
    let _ = serde_json::to_writer(out, v);
}

// ---- decoding --------------------------------------------------------------
//
// The document is read in one pass into `Doc`: each known key keeps the JSON
// value found there as a `Raw` (its type and, for scalars, the value), each
// unknown key is skipped, a repeated key keeps its last value (as a JSON
// object does). The visitors accept any JSON, so a parse fails only on text
// that is not JSON; every field is then checked in a fixed order, giving the
// same first error, path and message whatever the key order. serde's derive
// is not used for the reading because it refuses repeated keys and names
// its own errors ("missing field"), which would change what callers see.

/// A JSON value as the decoder needs it: its type, and the scalar.
#[derive(Debug)]
enum Raw<'de> {
    Null,
    Bool(bool),
    Number(f64),
    String(Cow<'de, str>),
    List,
    Object,
}

impl Raw<'_> {
    fn type_name(&self) -> &'static str {
        match self {
            Raw::Null => "null",
            Raw::Bool(_) => "a boolean",
            Raw::Number(_) => "a number",
            Raw::String(_) => "a string",
            Raw::List => "a list",
            Raw::Object => "an object",
        }
    }
}

struct RawVisitor;

impl<'de> Visitor<'de> for RawVisitor {
    type Value = Raw<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, b: bool) -> Result<Raw<'de>, E> {
        Ok(Raw::Bool(b))
    }
    // As `serde_json::Number::as_f64`: integers convert to the nearest f64.
    #[allow(clippy::cast_precision_loss)]
    fn visit_i64<E>(self, n: i64) -> Result<Raw<'de>, E> {
        Ok(Raw::Number(n as f64))
    }
    #[allow(clippy::cast_precision_loss)]
    fn visit_u64<E>(self, n: u64) -> Result<Raw<'de>, E> {
        Ok(Raw::Number(n as f64))
    }
    fn visit_f64<E>(self, x: f64) -> Result<Raw<'de>, E> {
        Ok(Raw::Number(x))
    }
    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Raw<'de>, E> {
        Ok(Raw::String(Cow::Borrowed(s)))
    }
    fn visit_str<E>(self, s: &str) -> Result<Raw<'de>, E> {
        Ok(Raw::String(Cow::Owned(s.to_owned())))
    }
    fn visit_string<E>(self, s: String) -> Result<Raw<'de>, E> {
        Ok(Raw::String(Cow::Owned(s)))
    }
    fn visit_unit<E>(self) -> Result<Raw<'de>, E> {
        Ok(Raw::Null)
    }
    fn visit_none<E>(self) -> Result<Raw<'de>, E> {
        Ok(Raw::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Raw<'de>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Raw::List)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Raw<'de>, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Raw::Object)
    }
}

impl<'de> Deserialize<'de> for Raw<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(RawVisitor)
    }
}

/// The fields of one object of the document, read key by key.
trait Fields<'de>: Default {
    /// Reads the value under `key`; an unknown key's value is skipped.
    fn read<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error>;
}

/// An object's key, borrowed from the input where it has no escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_identifier(KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = Key<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_borrowed_str<E>(self, key: &'de str) -> Result<Key<'de>, E> {
        Ok(Key(Cow::Borrowed(key)))
    }
    fn visit_str<E>(self, key: &str) -> Result<Key<'de>, E> {
        Ok(Key(Cow::Owned(key.to_owned())))
    }
}

/// A value where an object is expected: the object's fields, or the type
/// found instead.
#[derive(Debug)]
enum Obj<T> {
    Fields(T),
    Other(&'static str),
}

impl<T> Obj<T> {
    fn get(self, path: &str) -> Result<T, DecodeError> {
        match self {
            Obj::Fields(t) => Ok(t),
            Obj::Other(found) => Err(DecodeError::WrongType {
                path: path.to_owned(),
                expected: "an object",
                found,
            }),
        }
    }
}

struct ObjVisitor<T>(std::marker::PhantomData<T>);

impl<'de, T: Fields<'de>> Visitor<'de> for ObjVisitor<T> {
    type Value = Obj<T>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Obj<T>, A::Error> {
        let mut fields = T::default();
        while let Some(Key(key)) = map.next_key()? {
            fields.read(&key, &mut map)?;
        }
        Ok(Obj::Fields(fields))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Obj<T>, E> {
        Ok(Obj::Other("a boolean"))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Obj<T>, E> {
        Ok(Obj::Other("a number"))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Obj<T>, E> {
        Ok(Obj::Other("a number"))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Obj<T>, E> {
        Ok(Obj::Other("a number"))
    }
    fn visit_str<E>(self, _: &str) -> Result<Obj<T>, E> {
        Ok(Obj::Other("a string"))
    }
    fn visit_unit<E>(self) -> Result<Obj<T>, E> {
        Ok(Obj::Other("null"))
    }
    fn visit_none<E>(self) -> Result<Obj<T>, E> {
        Ok(Obj::Other("null"))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Obj<T>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Obj::Other("a list"))
    }
}

impl<'de, T: Fields<'de>> Deserialize<'de> for Obj<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ObjVisitor(std::marker::PhantomData))
    }
}

/// Declares a `Fields` struct: each field an `Option` of what its key holds.
macro_rules! fields {
    ($name:ident { $($field:ident : $ty:ty = $key:literal),* $(,)? }) => {
        #[derive(Debug, Default)]
        struct $name<'de> {
            $($field: Option<$ty>,)*
            _borrows: std::marker::PhantomData<&'de str>,
        }

        impl<'de> Fields<'de> for $name<'de> {
            fn read<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
                match key {
                    $($key => self.$field = Some(map.next_value()?),)*
                    _ => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(())
            }
        }
    };
}

fields!(Root {
    version: Value = "_v",
    product_id: Raw<'de> = "product_id",
    session_id: Raw<'de> = "session_id",
    metadata: Value = "metadata",
    current_state: Raw<'de> = "current_state",
    last_interaction_at: Raw<'de> = "last_interaction_at",
    interaction_timeout_s: Raw<'de> = "interaction_timeout_s",
    cooldown_period_s: Raw<'de> = "cooldown_period_s",
    visual_guidance_active: Raw<'de> = "visual_guidance_active",
    active_tour_id: Raw<'de> = "active_tour_id",
    conversation_linked: Raw<'de> = "conversation_linked",
    conversation_id: Raw<'de> = "conversation_id",
    thinking: Obj<ThinkingIn<'de>> = "thinking",
    proactive: Obj<ProactiveIn<'de>> = "proactive",
    reactive: Obj<ReactiveIn<'de>> = "reactive",
});

fields!(ThinkingIn {
    cooldown_active: Raw<'de> = "cooldown_active",
    cooldown_started_at: Raw<'de> = "cooldown_started_at",
    active_cooldown_period_s: Raw<'de> = "active_cooldown_period_s",
});

fields!(ProactiveIn {
    user_clicked_option: Raw<'de> = "user_clicked_option",
    time_since_last_interaction_s: Raw<'de> = "time_since_last_interaction_s",
    last_message_at: Raw<'de> = "last_message_at",
});

fields!(ReactiveIn {
    time_since_last_interaction_s: Raw<'de> = "time_since_last_interaction_s",
    last_message_at: Raw<'de> = "last_message_at",
});

/// The whole document, as read.
type Doc<'de> = Obj<Root<'de>>;

fn wrong(path: &str, expected: &'static str, found: &Raw<'_>) -> DecodeError {
    DecodeError::WrongType {
        path: path.to_owned(),
        expected,
        found: found.type_name(),
    }
}

fn invalid(path: &str, problem: impl fmt::Display) -> DecodeError {
    DecodeError::Invalid {
        path: path.to_owned(),
        problem: problem.to_string(),
    }
}

fn missing(path: &str) -> DecodeError {
    DecodeError::Missing {
        path: path.to_owned(),
    }
}

fn string<'a>(path: &str, v: &'a Raw<'_>) -> Result<&'a str, DecodeError> {
    match v {
        Raw::String(s) => Ok(s),
        other => Err(wrong(path, "a string", other)),
    }
}

fn boolean(path: &str, v: Option<Raw<'_>>, default: bool) -> Result<bool, DecodeError> {
    match v {
        None => Ok(default),
        Some(Raw::Bool(b)) => Ok(b),
        Some(other) => Err(wrong(path, "a boolean", &other)),
    }
}

fn number(path: &str, v: &Raw<'_>) -> Result<f64, DecodeError> {
    match v {
        Raw::Number(x) if x.is_finite() => Ok(*x),
        Raw::Number(_) => Err(invalid(path, "not a finite number")),
        other => Err(wrong(path, "a number", other)),
    }
}

/// A finite, non-negative number of seconds.
fn seconds(path: &str, v: &Raw<'_>) -> Result<f64, DecodeError> {
    let x = number(path, v)?;
    if x >= 0.0 {
        Ok(x)
    } else {
        Err(invalid(path, format_args!("{x} seconds is negative")))
    }
}

fn timestamp(path: &str, v: &Raw<'_>) -> Result<Timestamp, DecodeError> {
    Timestamp::from_epoch_seconds(number(path, v)?).map_err(|e| invalid(path, e))
}

/// `read(v)`, or `None` when the key is absent or `null`.
fn nullable<T>(
    v: Option<&Raw<'_>>,
    read: impl FnOnce(&Raw<'_>) -> Result<T, DecodeError>,
) -> Result<Option<T>, DecodeError> {
    match v {
        None | Some(Raw::Null) => Ok(None),
        Some(v) => read(v).map(Some),
    }
}

fn owned(s: Cow<'_, str>) -> String {
    s.into_owned()
}

fn opt_string(path: &str, v: Option<Raw<'_>>) -> Result<Option<String>, DecodeError> {
    match v {
        None | Some(Raw::Null) => Ok(None),
        Some(Raw::String(s)) => Ok(Some(owned(s))),
        Some(other) => Err(wrong(path, "a string", &other)),
    }
}

impl Doc<'_> {
    /// Checks the fields read, in a fixed order: the first error found is
    /// the one reported.
    fn decode(self) -> Result<SessionState, DecodeError> {
        let r = self.get("$")?;

        let version = r.version.ok_or_else(|| missing("_v"))?;
        if version.as_u64() != Some(SNAPSHOT_VERSION) {
            return Err(DecodeError::Version {
                found: version.to_string(),
            });
        }

        let v = r.product_id.ok_or_else(|| missing("product_id"))?;
        let product_id =
            ProductId::parse(string("product_id", &v)?).map_err(|e| invalid("product_id", e))?;
        let v = r.session_id.ok_or_else(|| missing("session_id"))?;
        let session_id =
            SessionId::parse(string("session_id", &v)?).map_err(|e| invalid("session_id", e))?;
        let metadata = match r.metadata {
            None => Map::new(),
            Some(Value::Object(m)) => m,
            Some(other) => {
                return Err(DecodeError::WrongType {
                    path: "metadata".to_owned(),
                    expected: "an object",
                    found: type_name(&other),
                });
            }
        };

        let v = r.current_state.ok_or_else(|| missing("current_state"))?;
        let state = string("current_state", &v)?;
        let current_state =
            AssistState::from_wire(state).ok_or_else(|| DecodeError::UnknownState {
                found: Value::from(state).to_string(),
            })?;

        let v = r
            .last_interaction_at
            .ok_or_else(|| missing("last_interaction_at"))?;
        let last_interaction_at = timestamp("last_interaction_at", &v)?;
        let interaction_timeout_s = match &r.interaction_timeout_s {
            None => DEFAULT_INTERACTION_TIMEOUT_S,
            Some(v) => seconds("interaction_timeout_s", v)?,
        };
        let cooldown_period_s = match &r.cooldown_period_s {
            None => DEFAULT_COOLDOWN_PERIOD_S,
            Some(v) => seconds("cooldown_period_s", v)?,
        };
        let visual_guidance_active =
            boolean("visual_guidance_active", r.visual_guidance_active, false)?;
        let active_tour_id = opt_string("active_tour_id", r.active_tour_id)?;
        let conversation_linked = boolean("conversation_linked", r.conversation_linked, false)?;
        let conversation_id = opt_string("conversation_id", r.conversation_id)?;

        let t = match r.thinking {
            None => ThinkingIn::default(),
            Some(t) => t.get("thinking")?,
        };
        let thinking = ThinkingState {
            cooldown_active: boolean("thinking.cooldown_active", t.cooldown_active, false)?,
            cooldown_started_at: nullable(t.cooldown_started_at.as_ref(), |v| {
                timestamp("thinking.cooldown_started_at", v)
            })?,
            active_cooldown_period_s: nullable(t.active_cooldown_period_s.as_ref(), |v| {
                seconds("thinking.active_cooldown_period_s", v)
            })?,
        };
        if thinking.cooldown_active && thinking.cooldown_started_at.is_none() {
            return Err(invalid(
                "thinking.cooldown_started_at",
                "required while cooldown_active is true",
            ));
        }

        let p = match r.proactive {
            None => ProactiveIn::default(),
            Some(p) => p.get("proactive")?,
        };
        let proactive = ProactiveState {
            user_clicked_option: boolean(
                "proactive.user_clicked_option",
                p.user_clicked_option,
                false,
            )?,
            time_since_last_interaction_s: match &p.time_since_last_interaction_s {
                None => 0.0,
                Some(v) => number("proactive.time_since_last_interaction_s", v)?,
            },
            last_message_at: timestamp(
                "proactive.last_message_at",
                &p.last_message_at
                    .ok_or_else(|| missing("proactive.last_message_at"))?,
            )?,
        };

        let re = match r.reactive {
            None => ReactiveIn::default(),
            Some(re) => re.get("reactive")?,
        };
        let reactive = ReactiveState {
            time_since_last_interaction_s: match &re.time_since_last_interaction_s {
                None => 0.0,
                Some(v) => number("reactive.time_since_last_interaction_s", v)?,
            },
            last_message_at: timestamp(
                "reactive.last_message_at",
                &re.last_message_at
                    .ok_or_else(|| missing("reactive.last_message_at"))?,
            )?,
        };

        Ok(SessionState {
            product_id,
            session_id,
            metadata,
            current_state,
            last_interaction_at,
            interaction_timeout_s,
            cooldown_period_s,
            visual_guidance_active,
            active_tour_id: TextSlot::from_option(active_tour_id),
            conversation_linked,
            conversation_id,
            thinking,
            proactive,
            reactive,
        })
    }
}
