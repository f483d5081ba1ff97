//! The session snapshot decoder the typed one replaced: a walk over a
//! `serde_json::Value` with the path built by hand. Tests only: they check
//! that both decoders give the same state, or the same error, on every input.

use serde_json::{Map, Value};

use super::snapshot::{DecodeError, Path, SNAPSHOT_VERSION};
use super::state::{
    AssistState, DEFAULT_COOLDOWN_PERIOD_S, DEFAULT_INTERACTION_TIMEOUT_S, ProactiveState,
    ReactiveState, SessionId, SessionState, TextSlot, ThinkingState,
};
use crate::ProductId;

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

/// Decodes a snapshot document, validating every field.
///
/// # Errors
///
/// A [`DecodeError`] naming the first malformed field: a `_v` other than
/// the integer 2 (or none), an unknown `current_state`, a missing
/// timestamp, a value of the wrong type, an invalid id, a negative or
/// non-finite number of seconds, or an active cooldown without a start.
pub(crate) fn from_snapshot_walk(v: &Value) -> Result<SessionState, DecodeError> {
    let root = Path::root();
    let obj = root.object(v)?;

    let version = root.required(obj, "_v")?;
    if version.as_u64() != Some(SNAPSHOT_VERSION) {
        return Err(DecodeError::Version {
            found: version.to_string(),
        });
    }

    let p = root.key("product_id");
    let product_id =
        ProductId::parse(p.string(root.required(obj, "product_id")?)?).map_err(|e| p.invalid(e))?;
    let p = root.key("session_id");
    let session_id =
        SessionId::parse(p.string(root.required(obj, "session_id")?)?).map_err(|e| p.invalid(e))?;
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
        user_clicked_option: or_default(pr, &pp, "user_clicked_option", false, |p, v| p.bool(v))?,
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
