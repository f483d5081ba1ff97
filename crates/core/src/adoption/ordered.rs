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

/// Reading a value as a document: the snapshot decoders read an ordered
/// value the way they read text, in its order.
impl<'de> Deserializer<'de> for &'de OrderedValue {
    type Error = serde_json::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self {
            OrderedValue::Null => visitor.visit_unit(),
            OrderedValue::Bool(b) => visitor.visit_bool(*b),
            OrderedValue::Number(n) => n.deserialize_any(visitor),
            OrderedValue::String(s) => visitor.visit_borrowed_str(s),
            OrderedValue::Array(items) => visitor.visit_seq(SeqRef(items.iter())),
            OrderedValue::Object(pairs) => visitor.visit_map(MapRef {
                pairs: pairs.iter(),
                value: None,
            }),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map struct enum identifier ignored_any
    }
}

struct SeqRef<'de>(std::slice::Iter<'de, OrderedValue>);

impl<'de> SeqAccess<'de> for SeqRef<'de> {
    type Error = serde_json::Error;

    fn next_element_seed<T: de::DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Self::Error> {
        self.0.next().map(|v| seed.deserialize(v)).transpose()
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

struct MapRef<'de> {
    pairs: std::slice::Iter<'de, (String, OrderedValue)>,
    value: Option<&'de OrderedValue>,
}

impl<'de> MapAccess<'de> for MapRef<'de> {
    type Error = serde_json::Error;

    fn next_key_seed<K: de::DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Self::Error> {
        match self.pairs.next() {
            Some((k, v)) => {
                self.value = Some(v);
                seed.deserialize(de::value::BorrowedStrDeserializer::new(k))
                    .map(Some)
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<V: de::DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, Self::Error> {
        match self.value.take() {
            Some(v) => seed.deserialize(v),
            None => Err(de::Error::custom("value without a key")),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.pairs.len())
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
