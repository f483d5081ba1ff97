//! JSON text laid out exactly as Python's `json.dumps(obj)` with default
//! arguments writes it.
//!
//! The reference writes every JSON text a flow hands on (a map's combined
//! branches, a map-over-list's results) with `json.dumps`, and those texts
//! reach templates and prompts (`actor_input`, the dialogue,
//! `chat_history`), so their bytes matter: separators `", "` and `": "`,
//! `ensure_ascii` (everything outside printable ASCII escaped as lowercase
//! `\uXXXX`, astral characters as surrogate pairs), and floats as Python's
//! `repr` writes them (`1.0`, `1e+16`, `1.5e-07`). No crate writes Python's
//! layout, so this is a [`serde_json::ser::Formatter`] of our own; keys come
//! in the map's order (insertion order: the workspace's serde_json keeps it).
//!
//! Integers that fit neither `i64` nor `u64` are read by serde_json as
//! floats, so they come out as floats (`1e+20`), where Python keeps them as
//! integers; and the non-standard literals `NaN` and `Infinity` that
//! Python's `json.loads` accepts are not JSON to serde_json.

use std::io;

use serde::Serialize;
use serde_json::Value;
use serde_json::ser::{Formatter, Serializer};

/// `value` as `json.dumps(value)` writes it.
pub fn dumps(value: &Value) -> String {
    let mut out = Vec::new();
    let mut ser = Serializer::with_formatter(&mut out, PyFormatter);
    if value.serialize(&mut ser).is_err() {
        // Unreachable: a `Value` always serializes and a `Vec` never fails
        // to grow; keep a valid JSON text all the same.
        return value.to_string();
    }
    // Every byte written is printable ASCII.
    String::from_utf8_lossy(&out).into_owned()
}

/// The layout of `json.dumps` with default arguments.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PyFormatter;

impl Formatter for PyFormatter {
    fn write_f64<W: ?Sized + io::Write>(&mut self, writer: &mut W, value: f64) -> io::Result<()> {
        writer.write_all(float_repr(value).as_bytes())
    }

    fn write_f32<W: ?Sized + io::Write>(&mut self, writer: &mut W, value: f32) -> io::Result<()> {
        self.write_f64(writer, f64::from(value))
    }

    /// The characters serde_json does not escape itself: everything but
    /// control characters, `"` and `\`. Those outside printable ASCII (DEL
    /// and all of non-ASCII) are escaped as `ensure_ascii` does.
    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let mut plain = 0;
        for (i, c) in fragment.char_indices() {
            if (' '..='~').contains(&c) {
                continue;
            }
            writer.write_all(&fragment.as_bytes()[plain..i])?;
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                write!(writer, "\\u{unit:04x}")?;
            }
            plain = i + c.len_utf8();
        }
        writer.write_all(&fragment.as_bytes()[plain..])
    }

    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        writer.write_all(b": ")
    }
}

/// A finite float as Python's `repr` writes it: the shortest digits that
/// read back to the same float, positional for decimal exponents from -4
/// to 15 (always with a fractional part), scientific otherwise with a sign
/// and at least two exponent digits.
fn float_repr(value: f64) -> String {
    if !value.is_finite() {
        // serde_json writes non-finite floats as `null` before they get here.
        return "null".to_owned();
    }
    // Rust's `{:e}` writes the shortest round-trip digits, as `d.ddde-7`.
    let sci = format!("{:e}", value.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let mut out = String::with_capacity(digits.len() + 8);
    if value.is_sign_negative() {
        out.push('-');
    }
    if !(-4..16).contains(&exp) {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let sign = if exp < 0 { '-' } else { '+' };
        out.push_str(&format!("e{sign}{:02}", exp.unsigned_abs()));
    } else if exp < 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-exp - 1) as usize));
        out.push_str(&digits);
    } else {
        let int_len = exp as usize + 1;
        if digits.len() <= int_len {
            out.push_str(&digits);
            out.extend(std::iter::repeat_n('0', int_len - digits.len()));
            out.push_str(".0");
        } else {
            out.push_str(&digits[..int_len]);
            out.push('.');
            out.push_str(&digits[int_len..]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    /// Each expected text is what `python3 -c 'import json;
    /// print(json.dumps(<the same value>))'` printed (Python 3.11).
    #[test]
    fn dumps_writes_what_python_writes() {
        let cases: Vec<(Value, &str)> = vec![
            (json!(null), "null"),
            (json!(true), "true"),
            (json!([]), "[]"),
            (json!({}), "{}"),
            (json!([1, "a", null, false]), r#"[1, "a", null, false]"#),
            (
                json!({"b": 1, "a": {"y": [1, 2], "x": {}}}),
                r#"{"b": 1, "a": {"y": [1, 2], "x": {}}}"#,
            ),
            (json!(-42), "-42"),
            (json!(18446744073709551615u64), "18446744073709551615"),
            (json!(-9223372036854775808i64), "-9223372036854775808"),
            (json!(1.0), "1.0"),
            (json!(-0.0), "-0.0"),
            (json!(0.0), "0.0"),
            (json!(0.1), "0.1"),
            (json!(1.5), "1.5"),
            (json!(123.456), "123.456"),
            (json!(1e16), "1e+16"),
            (json!(1e15), "1000000000000000.0"),
            (json!(1234567890123456.0), "1234567890123456.0"),
            (json!(12345678901234567.0), "1.2345678901234568e+16"),
            (json!(1.5e-7), "1.5e-07"),
            (json!(1e-5), "1e-05"),
            (json!(0.0001), "0.0001"),
            (json!(0.00012345), "0.00012345"),
            (json!(1e100), "1e+100"),
            (json!(-2.5e-300), "-2.5e-300"),
            (json!(5e-324), "5e-324"),
            (json!(1.7976931348623157e308), "1.7976931348623157e+308"),
            (json!(0.30000000000000004), "0.30000000000000004"),
            (json!(100.0), "100.0"),
            (json!("plain"), r#""plain""#),
            (json!("q\"b\\s/\n\r\t\u{8}\u{c}"), r#""q\"b\\s/\n\r\t\b\f""#),
            (json!("\u{0}\u{1f}\u{7f}"), r#""\u0000\u001f\u007f""#),
            (json!("caf\u{e9} \u{20ac}"), r#""caf\u00e9 \u20ac""#),
            (json!("\u{1F600}"), r#""\ud83d\ude00""#),
            (json!("\u{2028}\u{feff}"), r#""\u2028\ufeff""#),
            (json!({"\u{e9}": "\u{e9}"}), r#"{"\u00e9": "\u00e9"}"#),
            (json!({"k": [1.0, 2, "x"]}), r#"{"k": [1.0, 2, "x"]}"#),
        ];
        for (value, expected) in cases {
            assert_eq!(dumps(&value), expected, "{value:?}");
        }
    }

    #[test]
    fn dumps_keeps_the_insertion_order_of_keys() {
        let v: Value = serde_json::from_str(r#"{"z": 1, "a": {"m": 2, "b": 3}}"#).unwrap();
        assert_eq!(dumps(&v), r#"{"z": 1, "a": {"m": 2, "b": 3}}"#);
    }

    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            any::<String>().prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::vec((any::<String>(), inner), 0..6)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn dumps_reads_back_to_the_same_value(v in any_json()) {
            let text = dumps(&v);
            prop_assert!(text.bytes().all(|b| (b' '..=b'~').contains(&b)), "{text}");
            let back: Value = serde_json::from_str(&text).unwrap();
            prop_assert_eq!(back, v);
        }

        #[test]
        fn floats_read_back_exactly(f in any::<f64>().prop_filter("finite", |f| f.is_finite())) {
            let text = float_repr(f);
            prop_assert_eq!(text.parse::<f64>().unwrap().to_bits(), f.to_bits());
            prop_assert!(text.contains(['.', 'e']), "{}", text);
        }
    }
}
