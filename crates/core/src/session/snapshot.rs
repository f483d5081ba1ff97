//! The session snapshot, `_v: 2`, and a decoder that validates every field.
//!
//! Key names are the reference SDK's (`current_state`, `last_interaction_at`,
//! `thinking.cooldown_started_at`, `proactive.last_message_at`, ...) plus
//! `product_id`. Timestamps are wall-clock Unix epoch seconds, so a snapshot
//! is valid in any process on any host; `cooldown_started_at` is `null` when
//! no cooldown was started. Keys the seed gives a default may be absent; a
//! missing timestamp is an error, never "now". Decoding any input never
//! panics: a malformed one gives a [`DecodeError`] naming the field.

use std::fmt;

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

    fn invalid(&self, problem: impl fmt::Display) -> DecodeError {
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

    fn bool(&self, v: &Value) -> Result<bool, DecodeError> {
        v.as_bool().ok_or_else(|| self.wrong_type("a boolean", v))
    }

    fn number(&self, v: &Value) -> Result<f64, DecodeError> {
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

    fn timestamp(&self, v: &Value) -> Result<Timestamp, DecodeError> {
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

/// Reads `obj[key]` with `read`, or `default` when the key is absent.
fn or_default<'v, T>(
    obj: &'v Map<String, Value>,
    parent: &Path<'_>,
    key: &str,
    default: T,
    read: impl FnOnce(&Path<'_>, &'v Value) -> Result<T, DecodeError>,
) -> Result<T, DecodeError> {
    match obj.get(key) {
        None => Ok(default),
        Some(v) => read(&parent.key(key), v),
    }
}

/// Like [`or_default`], with `null` meaning `None`.
fn nullable<'v, T>(
    obj: &'v Map<String, Value>,
    parent: &Path<'_>,
    key: &str,
    read: impl FnOnce(&Path<'_>, &'v Value) -> Result<T, DecodeError>,
) -> Result<Option<T>, DecodeError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => read(&parent.key(key), v).map(Some),
    }
}

fn ts(t: Timestamp) -> Value {
    Value::from(t.as_epoch_seconds())
}

fn opt_ts(t: Option<Timestamp>) -> Value {
    t.map_or(Value::Null, ts)
}

fn opt_str(s: Option<&str>) -> Value {
    s.map_or(Value::Null, |s| Value::String(s.to_owned()))
}

fn opt_num(x: Option<f64>) -> Value {
    x.map_or(Value::Null, Value::from)
}

impl SessionState {
    /// The snapshot document (`_v: 2`).
    pub fn to_snapshot(&self) -> Value {
        let mut thinking = Map::new();
        thinking.insert(
            "cooldown_active".into(),
            self.thinking.cooldown_active.into(),
        );
        thinking.insert(
            "cooldown_started_at".into(),
            opt_ts(self.thinking.cooldown_started_at),
        );
        thinking.insert(
            "active_cooldown_period_s".into(),
            opt_num(self.thinking.active_cooldown_period_s),
        );
        let mut proactive = Map::new();
        proactive.insert(
            "user_clicked_option".into(),
            self.proactive.user_clicked_option.into(),
        );
        proactive.insert(
            "time_since_last_interaction_s".into(),
            self.proactive.time_since_last_interaction_s.into(),
        );
        proactive.insert("last_message_at".into(), ts(self.proactive.last_message_at));
        let mut reactive = Map::new();
        reactive.insert(
            "time_since_last_interaction_s".into(),
            self.reactive.time_since_last_interaction_s.into(),
        );
        reactive.insert("last_message_at".into(), ts(self.reactive.last_message_at));

        let mut m = Map::new();
        m.insert("_v".into(), SNAPSHOT_VERSION.into());
        m.insert("product_id".into(), self.product_id.as_str().into());
        m.insert("session_id".into(), self.session_id.as_str().into());
        m.insert("metadata".into(), Value::Object(self.metadata.clone()));
        m.insert("current_state".into(), self.current_state.as_str().into());
        m.insert("last_interaction_at".into(), ts(self.last_interaction_at));
        m.insert(
            "interaction_timeout_s".into(),
            self.interaction_timeout_s.into(),
        );
        m.insert("cooldown_period_s".into(), self.cooldown_period_s.into());
        m.insert(
            "visual_guidance_active".into(),
            self.visual_guidance_active.into(),
        );
        m.insert("active_tour_id".into(), opt_str(self.active_tour_id()));
        m.insert(
            "conversation_linked".into(),
            self.conversation_linked.into(),
        );
        m.insert("conversation_id".into(), opt_str(self.conversation_id()));
        m.insert("thinking".into(), Value::Object(thinking));
        m.insert("proactive".into(), Value::Object(proactive));
        m.insert("reactive".into(), Value::Object(reactive));
        Value::Object(m)
    }

    /// Decodes snapshot bytes (JSON text).
    ///
    /// # Errors
    ///
    /// [`DecodeError::Syntax`] for text that is not JSON, else as
    /// [`SessionState::from_snapshot`].
    pub fn from_snapshot_slice(bytes: &[u8]) -> Result<Self, DecodeError> {
        let v: Value = serde_json::from_slice(bytes).map_err(|e| DecodeError::Syntax {
            message: e.to_string(),
        })?;
        Self::from_snapshot(&v)
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
        let root = Path::root();
        let obj = root.object(v)?;

        let version = root.required(obj, "_v")?;
        if version.as_u64() != Some(SNAPSHOT_VERSION) {
            return Err(DecodeError::Version {
                found: version.to_string(),
            });
        }

        let p = root.key("product_id");
        let product_id = ProductId::parse(p.string(root.required(obj, "product_id")?)?)
            .map_err(|e| p.invalid(e))?;
        let p = root.key("session_id");
        let session_id = SessionId::parse(p.string(root.required(obj, "session_id")?)?)
            .map_err(|e| p.invalid(e))?;
        let metadata = or_default(obj, &root, "metadata", Map::new(), |p, v| {
            p.object(v).cloned()
        })?;

        let state_v = root.required(obj, "current_state")?;
        let state_s = root.key("current_state").string(state_v)?;
        let current_state =
            AssistState::from_wire(state_s).ok_or_else(|| DecodeError::UnknownState {
                found: state_v.to_string(),
            })?;

        let last_interaction_at = root
            .key("last_interaction_at")
            .timestamp(root.required(obj, "last_interaction_at")?)?;
        let interaction_timeout_s = or_default(
            obj,
            &root,
            "interaction_timeout_s",
            DEFAULT_INTERACTION_TIMEOUT_S,
            |p, v| p.seconds(v),
        )?;
        let cooldown_period_s = or_default(
            obj,
            &root,
            "cooldown_period_s",
            DEFAULT_COOLDOWN_PERIOD_S,
            |p, v| p.seconds(v),
        )?;
        let visual_guidance_active =
            or_default(obj, &root, "visual_guidance_active", false, |p, v| {
                p.bool(v)
            })?;
        let active_tour_id = nullable(obj, &root, "active_tour_id", |p, v| {
            p.string(v).map(str::to_owned)
        })?;
        let conversation_linked =
            or_default(obj, &root, "conversation_linked", false, |p, v| p.bool(v))?;
        let conversation_id = nullable(obj, &root, "conversation_id", |p, v| {
            p.string(v).map(str::to_owned)
        })?;

        let empty = Map::new();
        let tp = root.key("thinking");
        let t = or_default(obj, &root, "thinking", &empty, |p, v| p.object(v))?;
        let thinking = ThinkingState {
            cooldown_active: or_default(t, &tp, "cooldown_active", false, |p, v| p.bool(v))?,
            cooldown_started_at: nullable(t, &tp, "cooldown_started_at", |p, v| p.timestamp(v))?,
            active_cooldown_period_s: nullable(t, &tp, "active_cooldown_period_s", |p, v| {
                p.seconds(v)
            })?,
        };
        if thinking.cooldown_active && thinking.cooldown_started_at.is_none() {
            return Err(tp
                .key("cooldown_started_at")
                .invalid("required while cooldown_active is true"));
        }

        let pp = root.key("proactive");
        let pr = or_default(obj, &root, "proactive", &empty, |p, v| p.object(v))?;
        let proactive = ProactiveState {
            user_clicked_option: or_default(pr, &pp, "user_clicked_option", false, |p, v| {
                p.bool(v)
            })?,
            time_since_last_interaction_s: or_default(
                pr,
                &pp,
                "time_since_last_interaction_s",
                0.0,
                |p, v| p.number(v),
            )?,
            last_message_at: pp
                .key("last_message_at")
                .timestamp(pp.required(pr, "last_message_at")?)?,
        };

        let rp = root.key("reactive");
        let re = or_default(obj, &root, "reactive", &empty, |p, v| p.object(v))?;
        let reactive = ReactiveState {
            time_since_last_interaction_s: or_default(
                re,
                &rp,
                "time_since_last_interaction_s",
                0.0,
                |p, v| p.number(v),
            )?,
            last_message_at: rp
                .key("last_message_at")
                .timestamp(rp.required(re, "last_message_at")?)?,
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
