//! What every adapter can store, checked at the boundary.
//!
//! One policy for text and numbers, the same whatever the adapter, so a
//! value the in-memory store keeps is never one PostgreSQL refuses or cannot
//! read back:
//!
//! - **Text** is storable unless it holds NUL (U+0000). NUL is the one
//!   character PostgreSQL `text` refuses (SQLSTATE 22021) and the one escape
//!   `jsonb` refuses (`\u0000`, SQLSTATE 22P05); every other Unicode scalar
//!   value, non-characters and private use included, is stored and read back
//!   as it was. Rust strings are valid UTF-8, so lone surrogates cannot occur.
//! - **Integers** are storable when they fit in `i64` (PostgreSQL `bigint`,
//!   and the range snapshots read counts back in). Fractions are not
//!   integers and are not limited here.
//!
//! [`check_json`] walks a JSON value and names the first offending field as
//! a path such as `events[3].session_number`.

use std::fmt;

use serde_json::Value;

/// Why a value cannot be stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Problem {
    /// Text holding NUL (U+0000).
    Nul,
    /// An integer outside the `i64` range.
    IntegerOutOfRange,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Problem::Nul => "holds a NUL character (U+0000), which cannot be stored",
            Problem::IntegerOutOfRange => {
                "is an integer outside the storable range (-9223372036854775808 to 9223372036854775807)"
            }
        })
    }
}

/// A value that cannot be stored, and where it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} {problem}")]
pub struct Unstorable {
    /// Where: a JSON path (`events[3].session_number`), or the name of a
    /// path segment or query parameter.
    pub field: String,
    /// What is wrong with it.
    pub problem: Problem,
}

impl Unstorable {
    /// `field` holds `problem`.
    pub fn new(field: impl Into<String>, problem: Problem) -> Self {
        Self {
            field: field.into(),
            problem,
        }
    }
}

/// True when every adapter stores `s` and reads it back unchanged.
pub fn is_storable_text(s: &str) -> bool {
    !s.contains('\0')
}

/// True when `n` fits the adapters' integers (`i64`).
pub fn is_storable_u64(n: u64) -> bool {
    i64::try_from(n).is_ok()
}

/// `Ok` when `s` is storable text; otherwise the problem, naming `field`.
///
/// # Errors
///
/// [`Problem::Nul`] when `s` holds NUL.
pub fn check_text(field: &str, s: &str) -> Result<(), Unstorable> {
    if is_storable_text(s) {
        Ok(())
    } else {
        Err(Unstorable::new(field, Problem::Nul))
    }
}

/// `Ok` when every string (object keys included) and every integer in `v`
/// is storable; otherwise the first offending value in document order,
/// named by its path from the root (`$` for the root itself).
///
/// # Errors
///
/// The first [`Unstorable`] value.
pub fn check_json(v: &Value) -> Result<(), Unstorable> {
    let mut path = String::new();
    walk(v, &mut path)
}

fn walk(v: &Value, path: &mut String) -> Result<(), Unstorable> {
    match v {
        Value::Null | Value::Bool(_) => Ok(()),
        Value::Number(n) => {
            // serde_json reads an integer as i64 when it fits, else as u64
            // (up to u64::MAX), else as a float: only the u64 case is out of
            // range; larger or smaller literals arrive as floats, which are
            // not integers for this policy.
            if n.as_i64().is_none() && n.as_u64().is_some() {
                Err(Unstorable::new(name(path), Problem::IntegerOutOfRange))
            } else {
                Ok(())
            }
        }
        Value::String(s) => check_text(&name(path), s),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                walk(item, path)?;
                path.truncate(len);
            }
            Ok(())
        }
        Value::Object(map) => {
            for (k, item) in map {
                let len = path.len();
                push_key(path, k);
                if !is_storable_text(k) {
                    return Err(Unstorable::new(name(path), Problem::Nul));
                }
                walk(item, path)?;
                path.truncate(len);
            }
            Ok(())
        }
    }
}

fn name(path: &str) -> String {
    if path.is_empty() {
        "$".to_owned()
    } else {
        path.to_owned()
    }
}

/// Appends `.key`, or `["key"]` (escaped) when the key is not a plain name.
fn push_key(path: &mut String, key: &str) {
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if plain {
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(key);
    } else {
        path.push('[');
        path.push_str(&Value::String(key.to_owned()).to_string());
        path.push(']');
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn nul_is_the_only_text_refused() {
        assert!(is_storable_text(""));
        assert!(is_storable_text(
            "caf\u{e9} \u{1F600} \u{FFFF} \u{10FFFF} \u{1}\u{7F}"
        ));
        assert!(!is_storable_text("a\0b"));
        assert_eq!(
            check_text("session_id", "\0"),
            Err(Unstorable::new("session_id", Problem::Nul))
        );
    }

    #[test]
    fn integers_must_fit_i64() {
        assert!(is_storable_u64(i64::MAX as u64));
        assert!(!is_storable_u64(i64::MAX as u64 + 1));
        assert!(check_json(&json!(i64::MAX)).is_ok());
        assert!(check_json(&json!(i64::MIN)).is_ok());
        assert!(check_json(&json!(1.5e300)).is_ok());
        assert_eq!(
            check_json(&json!(u64::MAX)),
            Err(Unstorable::new("$", Problem::IntegerOutOfRange))
        );
    }

    #[test]
    fn the_first_offence_is_named_by_its_path() {
        let v = json!({
            "events": [
                {"kind": "a"}, {"kind": "b"}, {"kind": "c"},
                {"kind": "record_session", "session_number": 9_223_372_036_854_775_808_u64}
            ],
            "z": "\0"
        });
        let e = check_json(&v).unwrap_err();
        assert_eq!(e.field, "events[3].session_number");
        assert_eq!(e.problem, Problem::IntegerOutOfRange);
        assert_eq!(
            e.to_string(),
            "events[3].session_number is an integer outside the storable range \
             (-9223372036854775808 to 9223372036854775807)"
        );
        let e = check_json(&json!({"meta": {"a b": ["x", "y\0"]}})).unwrap_err();
        assert_eq!(e.field, "meta[\"a b\"][1]");
        let e = check_json(&json!({"k\0": 1})).unwrap_err();
        assert_eq!(e.field, "[\"k\\u0000\"]");
        assert_eq!(
            check_json(&json!("\0")),
            Err(Unstorable::new("$", Problem::Nul))
        );
        assert!(check_json(&json!({"ok": ["\u{10FFFF}", -1, 2.5, null, true]})).is_ok());
    }
}
