//! A JSON value whose objects keep their key order.
//!
//! The adoption snapshot stores maps (`workflow_progress`, `steps`) whose
//! insertion order is meaningful: the derived id lists follow it.
//! `serde_json::Value` sorts object keys, so snapshots are decoded from this
//! type instead, which keeps document order when parsed from text.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};

/// A JSON value with ordered objects.
#[derive(Debug, Clone, PartialEq)]
pub enum OrderedValue {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A number, as serde_json holds it.
    Number(serde_json::Number),
    /// A string.
    String(String),
    /// An array.
    Array(Vec<OrderedValue>),
    /// An object, keys in document order (a repeated key keeps its last value
    /// at its first position).
    Object(Vec<(String, OrderedValue)>),
}

impl OrderedValue {
    /// The value under `key` when this is an object.
    pub fn get(&self, key: &str) -> Option<&OrderedValue> {
        match self {
            OrderedValue::Object(pairs) => pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The JSON type name, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            OrderedValue::Null => "null",
            OrderedValue::Bool(_) => "a boolean",
            OrderedValue::Number(_) => "a number",
            OrderedValue::String(_) => "a string",
            OrderedValue::Array(_) => "an array",
            OrderedValue::Object(_) => "an object",
        }
    }

    /// Parses JSON text, keeping object key order.
    pub fn parse(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }
}

impl From<&serde_json::Value> for OrderedValue {
    fn from(v: &serde_json::Value) -> Self {
        match v {
            serde_json::Value::Null => OrderedValue::Null,
            serde_json::Value::Bool(b) => OrderedValue::Bool(*b),
            serde_json::Value::Number(n) => OrderedValue::Number(n.clone()),
            serde_json::Value::String(s) => OrderedValue::String(s.clone()),
            serde_json::Value::Array(a) => OrderedValue::Array(a.iter().map(Into::into).collect()),
            serde_json::Value::Object(m) => {
                OrderedValue::Object(m.iter().map(|(k, v)| (k.clone(), v.into())).collect())
            }
        }
    }
}

impl From<&OrderedValue> for serde_json::Value {
    fn from(v: &OrderedValue) -> Self {
        match v {
            OrderedValue::Null => serde_json::Value::Null,
            OrderedValue::Bool(b) => serde_json::Value::Bool(*b),
            OrderedValue::Number(n) => serde_json::Value::Number(n.clone()),
            OrderedValue::String(s) => serde_json::Value::String(s.clone()),
            OrderedValue::Array(a) => serde_json::Value::Array(a.iter().map(Into::into).collect()),
            OrderedValue::Object(pairs) => serde_json::Value::Object(
                pairs.iter().map(|(k, v)| (k.clone(), v.into())).collect(),
            ),
        }
    }
}

impl Serialize for OrderedValue {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            OrderedValue::Null => s.serialize_unit(),
            OrderedValue::Bool(b) => s.serialize_bool(*b),
            OrderedValue::Number(n) => n.serialize(s),
            OrderedValue::String(v) => s.serialize_str(v),
            OrderedValue::Array(a) => {
                let mut seq = s.serialize_seq(Some(a.len()))?;
                for v in a {
                    seq.serialize_element(v)?;
                }
                seq.end()
            }
            OrderedValue::Object(pairs) => {
                let mut map = s.serialize_map(Some(pairs.len()))?;
                for (k, v) in pairs {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for OrderedValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(OrderedVisitor)
    }
}

struct OrderedVisitor;

impl<'de> Visitor<'de> for OrderedVisitor {
    type Value = OrderedValue;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E>(self) -> Result<OrderedValue, E> {
        Ok(OrderedValue::Null)
    }

    fn visit_none<E>(self) -> Result<OrderedValue, E> {
        Ok(OrderedValue::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<OrderedValue, D::Error> {
        OrderedValue::deserialize(d)
    }

    fn visit_bool<E>(self, v: bool) -> Result<OrderedValue, E> {
        Ok(OrderedValue::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<OrderedValue, E> {
        Ok(OrderedValue::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<OrderedValue, E> {
        Ok(OrderedValue::Number(v.into()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<OrderedValue, E> {
        serde_json::Number::from_f64(v)
            .map(OrderedValue::Number)
            .ok_or_else(|| E::custom("non-finite number"))
    }

    fn visit_str<E>(self, v: &str) -> Result<OrderedValue, E> {
        Ok(OrderedValue::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<OrderedValue, E> {
        Ok(OrderedValue::String(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<OrderedValue, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element()? {
            out.push(v);
        }
        Ok(OrderedValue::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<OrderedValue, A::Error> {
        let mut out: Vec<(String, OrderedValue)> = Vec::new();
        while let Some((k, v)) = map.next_entry::<String, OrderedValue>()? {
            match out.iter_mut().find(|(key, _)| *key == k) {
                Some(slot) => slot.1 = v,
                None => out.push((k, v)),
            }
        }
        Ok(OrderedValue::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_document_order() {
        let v = OrderedValue::parse(r#"{"b": 1, "a": [true, null, "x"], "b": 2}"#).unwrap();
        let OrderedValue::Object(pairs) = &v else {
            panic!("object expected")
        };
        let keys: Vec<_> = pairs.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["b", "a"]);
        assert_eq!(v.get("b"), Some(&OrderedValue::Number(2.into())));
        assert_eq!(
            serde_json::to_string(&v).unwrap(),
            r#"{"b":2,"a":[true,null,"x"]}"#
        );
    }
}
