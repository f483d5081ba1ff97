//! Validators declared as data in a flow file: a regular expression, a
//! length, a JSON Schema or a list of allowed values, compiled once when the
//! flow is loaded.

use std::borrow::Cow;
use std::sync::Arc;

use serde_json::Value;

use super::def::{ValidatorDef, ValidatorRule};
use super::engine::{ValidatorContext, ValidatorFn};

/// A rule, compiled.
enum Check {
    Regex(regex::Regex, String),
    Length {
        min: Option<usize>,
        max: Option<usize>,
    },
    Schema(Box<jsonschema::Validator>),
    OneOf(Vec<String>),
}

/// The JSON Pointer of a dotted field path (`contact.emails.0` ->
/// `/contact/emails/0`), or why it is not one.
fn pointer(field: &str) -> Result<String, String> {
    if field.split('.').any(str::is_empty) {
        return Err(format!(
            "bad field `{field}`: keys separated by dots, none empty"
        ));
    }
    Ok(field
        .split('.')
        .map(|k| format!("/{}", k.replace('~', "~0").replace('/', "~1")))
        .collect())
}

/// `` at `/path` `` for a place inside a JSON value, nothing for its root.
fn at(path: &impl std::fmt::Display) -> String {
    let path = path.to_string();
    if path.is_empty() {
        path
    } else {
        format!(" at `{path}`")
    }
}

/// Compiles a declared validator, or says what is wrong with it.
pub(super) fn compile(def: &ValidatorDef) -> Result<ValidatorFn, String> {
    let check = match &def.rule {
        ValidatorRule::Regex(pattern) => Check::Regex(
            regex::Regex::new(pattern).map_err(|e| {
                // The parser draws the pattern over several lines; a
                // problem is one.
                let text = e.to_string();
                let words: Vec<&str> = text.split_whitespace().collect();
                format!("bad regex: {}", words.join(" "))
            })?,
            pattern.clone(),
        ),
        ValidatorRule::Length { min, max } => {
            match (min, max) {
                (None, None) => return Err("a length needs `min` or `max`".into()),
                (Some(lo), Some(hi)) if lo > hi => {
                    return Err(format!("`min` ({lo}) is more than `max` ({hi})"));
                }
                _ => {}
            }
            Check::Length {
                min: *min,
                max: *max,
            }
        }
        ValidatorRule::JsonSchema(schema) => Check::Schema(Box::new(
            jsonschema::validator_for(schema)
                .map_err(|e| format!("bad json schema{}: {e}", at(e.instance_path())))?,
        )),
        ValidatorRule::OneOf(allowed) => {
            if allowed.is_empty() {
                return Err("`one_of` lists no value".into());
            }
            Check::OneOf(allowed.clone())
        }
    };
    let pointer = def.field.as_deref().map(pointer).transpose()?;
    let subject = def
        .field
        .as_ref()
        .map_or_else(|| "the input".to_owned(), |f| format!("`{f}`"));
    let message = def.message.clone();
    let needs_json = pointer.is_some() || matches!(check, Check::Schema(_));
    Ok(Arc::new(move |c: &ValidatorContext<'_>| {
        let refuse = |default: String| Err(message.clone().unwrap_or(default));
        let parsed: Option<Value> = if needs_json {
            match serde_json::from_str(c.input) {
                Ok(v) => Some(v),
                Err(e) => return refuse(format!("the input is not json: {e}")),
            }
        } else {
            None
        };
        let value = match (&pointer, &parsed) {
            (Some(p), Some(v)) => match v.pointer(p) {
                Some(member) => Some(member),
                None => return refuse(format!("the input has no {subject}")),
            },
            (_, parsed) => parsed.as_ref(),
        };
        // A member that is not a string is checked by its JSON text.
        let text: Cow<'_, str> = match value {
            None => Cow::Borrowed(c.input),
            Some(Value::String(s)) => Cow::Borrowed(s),
            Some(other) => Cow::Owned(other.to_string()),
        };
        match &check {
            Check::Regex(re, pattern) => {
                if !re.is_match(&text) {
                    return refuse(format!("{subject} does not match `{pattern}`"));
                }
            }
            Check::Length { min, max } => {
                let n = text.chars().count();
                if let Some(min) = min.filter(|m| n < *m) {
                    return refuse(format!(
                        "{subject} is {n} characters long, fewer than {min}"
                    ));
                }
                if let Some(max) = max.filter(|m| n > *m) {
                    return refuse(format!("{subject} is {n} characters long, more than {max}"));
                }
            }
            Check::Schema(schema) => {
                // `needs_json` holds for a schema: the value is the parsed
                // input or its member.
                let instance = value.unwrap_or(&Value::Null);
                if let Some(e) = schema.iter_errors(instance).next() {
                    return refuse(format!(
                        "{subject} does not match the schema{}: {e}",
                        at(e.instance_path())
                    ));
                }
            }
            Check::OneOf(allowed) => {
                if !allowed.iter().any(|a| *a == *text) {
                    let list: Vec<String> = allowed.iter().map(|a| format!("`{a}`")).collect();
                    return refuse(format!("{subject} is not one of {}", list.join(", ")));
                }
            }
        }
        Ok(())
    }))
}
