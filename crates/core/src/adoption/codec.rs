//! The reading and writing machinery of the adoption snapshots.
//!
//! Decoding reads a document in one pass into per-object field sets (each
//! known key keeps its value as a [`Raw`]: the JSON type and, for scalars,
//! the value; lists of strings and maps of entries keep what they hold),
//! then checks the fields in a fixed order, so the first error reported does
//! not depend on the key order of the document. The visitors accept any
//! JSON, so a parse fails only on text that is not JSON, and they read every
//! value they skip as fully as a value tree would (numbers converted,
//! nesting counted): text is refused exactly when the tree would refuse it,
//! with the same message. A repeated key keeps its last value at its first
//! position, as the ordered value does.
//!
//! Encoding writes the fixed keys as bytes and every value with serde_json.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::Serialize;
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use super::snapshot::DecodeError;

// ---- paths ---------------------------------------------------------------

/// A field's position, built on the stack and rendered only on error, as
/// `$`, `$.a.b`, `$.a[2].c`.
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

impl<'a> Path<'a> {
    pub(crate) const ROOT: Path<'static> = Path {
        parent: None,
        seg: Seg::Root,
    };

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

    pub(crate) fn render(&self) -> String {
        let mut segs = Vec::new();
        let mut p = Some(self);
        while let Some(cur) = p {
            segs.push(cur.seg);
            p = cur.parent;
        }
        let mut out = String::from("$");
        for seg in segs.into_iter().rev() {
            match seg {
                Seg::Root => {}
                Seg::Key(k) => {
                    out.push('.');
                    out.push_str(k);
                }
                Seg::Index(i) => {
                    out.push('[');
                    out.push_str(&i.to_string());
                    out.push(']');
                }
            }
        }
        out
    }

    pub(crate) fn err(&self, problem: impl Into<String>) -> DecodeError {
        DecodeError {
            path: self.render(),
            problem: problem.into(),
        }
    }

    pub(crate) fn wrong(&self, expected: &str, found: &'static str) -> DecodeError {
        self.err(format!("expected {expected}, found {found}"))
    }
}

// ---- values ----------------------------------------------------------------

/// A JSON value as the checks need it.
#[derive(Debug)]
pub(crate) enum Raw<'de> {
    Null,
    Bool(bool),
    Number(Number),
    String(Cow<'de, str>),
    Array { empty: bool },
    Object { empty: bool },
}

impl Raw<'_> {
    /// The JSON type name, for error messages.
    pub(crate) fn type_name(&self) -> &'static str {
        match self {
            Raw::Null => "null",
            Raw::Bool(_) => "a boolean",
            Raw::Number(_) => "a number",
            Raw::String(_) => "a string",
            Raw::Array { .. } => "an array",
            Raw::Object { .. } => "an object",
        }
    }

    /// What the reference reads as absent where an object is expected:
    /// `null`, `false`, `0`, `""`, `[]`, `{}`.
    pub(crate) fn is_falsy(&self) -> bool {
        match self {
            Raw::Null => true,
            Raw::Bool(b) => !*b,
            Raw::Number(n) => n.as_f64() == Some(0.0),
            Raw::String(s) => s.is_empty(),
            Raw::Array { empty } | Raw::Object { empty } => *empty,
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
    fn visit_i64<E>(self, n: i64) -> Result<Raw<'de>, E> {
        Ok(Raw::Number(n.into()))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Raw<'de>, E> {
        Ok(Raw::Number(n.into()))
    }
    fn visit_f64<E: serde::de::Error>(self, x: f64) -> Result<Raw<'de>, E> {
        // As the ordered value: JSON text holds no other numbers.
        Number::from_f64(x)
            .map(Raw::Number)
            .ok_or_else(|| E::custom("non-finite number"))
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
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Raw<'de>, A::Error> {
        Ok(Raw::Array {
            empty: skip_seq(seq)? == 0,
        })
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Raw<'de>, A::Error> {
        Ok(Raw::Object {
            empty: skip_map(map)? == 0,
        })
    }
}

impl<'de> Deserialize<'de> for Raw<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(RawVisitor)
    }
}

/// Any JSON value, read and dropped. Unlike `IgnoredAny`, which serde_json
/// skips without converting numbers or counting nesting, this reads the
/// value as a value tree would, so it fails on the same text.
struct Skip;

struct SkipVisitor;

impl<'de> Visitor<'de> for SkipVisitor {
    type Value = Skip;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_f64<E: serde::de::Error>(self, x: f64) -> Result<Skip, E> {
        if x.is_finite() {
            Ok(Skip)
        } else {
            Err(E::custom("non-finite number"))
        }
    }
    fn visit_str<E>(self, _: &str) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_unit<E>(self) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Skip, A::Error> {
        skip_seq(seq).map(|_| Skip)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Skip, A::Error> {
        skip_map(map).map(|_| Skip)
    }
}

impl<'de> Deserialize<'de> for Skip {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(SkipVisitor)
    }
}

/// Reads and drops every element; their number.
fn skip_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<usize, A::Error> {
    let mut n = 0;
    while seq.next_element::<Skip>()?.is_some() {
        n += 1;
    }
    Ok(n)
}

/// Reads and drops every entry; their number.
fn skip_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<usize, A::Error> {
    let mut n = 0;
    while map.next_entry::<Skip, Skip>()?.is_some() {
        n += 1;
    }
    Ok(n)
}

/// A value that is not an object where one is expected: its type name and
/// whether it reads as absent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    pub(crate) name: &'static str,
    pub(crate) falsy: bool,
}

impl From<Raw<'_>> for Shape {
    fn from(r: Raw<'_>) -> Self {
        Shape {
            name: r.type_name(),
            falsy: r.is_falsy(),
        }
    }
}

/// Implements the scalar and sequence methods of a visitor whose value is
/// `$out` built from the [`Shape`] of anything but an object.
macro_rules! other_shapes {
    ($out:ty, $make:expr) => {
        fn visit_bool<E>(self, b: bool) -> Result<$out, E> {
            Ok($make(Shape::from(Raw::Bool(b))))
        }
        fn visit_i64<E>(self, n: i64) -> Result<$out, E> {
            Ok($make(Shape::from(Raw::Number(n.into()))))
        }
        fn visit_u64<E>(self, n: u64) -> Result<$out, E> {
            Ok($make(Shape::from(Raw::Number(n.into()))))
        }
        fn visit_f64<E: serde::de::Error>(self, x: f64) -> Result<$out, E> {
            let n = Number::from_f64(x).ok_or_else(|| E::custom("non-finite number"))?;
            Ok($make(Shape::from(Raw::Number(n))))
        }
        fn visit_str<E>(self, s: &str) -> Result<$out, E> {
            Ok($make(Shape {
                name: "a string",
                falsy: s.is_empty(),
            }))
        }
        fn visit_unit<E>(self) -> Result<$out, E> {
            Ok($make(Shape::from(Raw::Null)))
        }
    };
}

/// The fields of one object of the document, read key by key.
pub(crate) trait Fields<'de>: Default {
    /// Reads the value under `key`; an unknown key's value is skipped.
    fn read<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error>;
}

/// An object's key, borrowed from the input where it has no escapes.
pub(crate) struct Key<'de>(pub(crate) Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(KeyVisitor)
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
    fn visit_string<E>(self, key: String) -> Result<Key<'de>, E> {
        Ok(Key(Cow::Owned(key)))
    }
}

/// A value where an object is expected: the object's fields (and whether it
/// had no entry), or the shape found instead.
#[derive(Debug)]
pub(crate) enum Obj<T> {
    Fields { fields: T, empty: bool },
    Other(Shape),
}

impl<T> Obj<T> {
    /// The fields of an object, `None` for any other value.
    pub(crate) fn fields(self) -> Option<T> {
        match self {
            Obj::Fields { fields, .. } => Some(fields),
            Obj::Other(_) => None,
        }
    }

    /// The falsy reading of the reference: `None` for an absent or falsy
    /// value, the fields of any other object, an error for anything else.
    pub(crate) fn truthy(this: Option<Self>, path: &Path<'_>) -> Result<Option<T>, DecodeError> {
        match this {
            None | Some(Obj::Fields { empty: true, .. }) => Ok(None),
            Some(Obj::Other(s)) if s.falsy => Ok(None),
            Some(Obj::Fields { fields, .. }) => Ok(Some(fields)),
            Some(Obj::Other(s)) => Err(path.wrong("an object", s.name)),
        }
    }
}

struct ObjVisitor<T>(PhantomData<T>);

impl<'de, T: Fields<'de>> Visitor<'de> for ObjVisitor<T> {
    type Value = Obj<T>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Obj<T>, A::Error> {
        let mut fields = T::default();
        let mut empty = true;
        while let Some(Key(key)) = map.next_key()? {
            empty = false;
            fields.read(&key, &mut map)?;
        }
        Ok(Obj::Fields { fields, empty })
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Obj<T>, A::Error> {
        let empty = skip_seq(seq)? == 0;
        Ok(Obj::Other(Shape {
            name: "an array",
            falsy: empty,
        }))
    }
    other_shapes!(Obj<T>, Obj::Other);
}

impl<'de, T: Fields<'de>> Deserialize<'de> for Obj<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ObjVisitor(PhantomData))
    }
}

/// Declares a [`Fields`] struct: each field an `Option` of what its key
/// holds.
macro_rules! fields {
    ($name:ident { $($field:ident : $ty:ty = $key:literal),* $(,)? }) => {
        #[derive(Debug, Default)]
        pub(crate) struct $name<'de> {
            $(pub(crate) $field: Option<$ty>,)*
            _borrows: std::marker::PhantomData<&'de str>,
        }

        impl<'de> $crate::adoption::codec::Fields<'de> for $name<'de> {
            fn read<A: serde::de::MapAccess<'de>>(
                &mut self,
                key: &str,
                map: &mut A,
            ) -> Result<(), A::Error> {
                match key {
                    $($key => self.$field = Some(map.next_value()?),)*
                    _ => map.next_value::<$crate::adoption::codec::Ignored>().map(|_| ())?,
                }
                Ok(())
            }
        }
    };
}
pub(crate) use fields;

/// An unknown key's value, read fully and dropped (see [`Skip`]).
pub(crate) struct Ignored;

impl<'de> Deserialize<'de> for Ignored {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Skip::deserialize(d).map(|_| Ignored)
    }
}

/// A map of entries whose values should be objects, in document order: a
/// repeated key keeps its last value at its first position; a value that is
/// not an object is `None` (it holds its key's position). `None` for a
/// value that is not an object.
#[derive(Debug)]
pub(crate) struct Entries<'de, T>(pub(crate) Option<Vec<(Cow<'de, str>, Option<T>)>>);

struct EntriesVisitor<T>(PhantomData<T>);

impl<'de, T: Fields<'de>> Visitor<'de> for EntriesVisitor<T> {
    type Value = Entries<'de, T>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out: Vec<(Cow<'de, str>, Option<T>)> = Vec::new();
        while let Some(Key(key)) = map.next_key()? {
            let value = map.next_value::<Obj<T>>()?.fields();
            match out.iter_mut().find(|(k, _)| *k == key) {
                Some(slot) => slot.1 = value,
                None => out.push((key, value)),
            }
        }
        Ok(Entries(Some(out)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        skip_seq(seq)?;
        Ok(Entries(None))
    }
    other_shapes!(Entries<'de, T>, |_| Entries(None));
}

impl<'de, T: Fields<'de>> Deserialize<'de> for Entries<'de, T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(EntriesVisitor(PhantomData))
    }
}

/// A list whose items should be objects: each item's fields, `None` for an
/// item that is not an object. `None` for a value that is not a list.
#[derive(Debug)]
pub(crate) struct Items<T>(pub(crate) Option<Vec<Option<T>>>);

struct ItemsVisitor<T>(PhantomData<T>);

impl<'de, T: Fields<'de>> Visitor<'de> for ItemsVisitor<T> {
    type Value = Items<T>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(item) = seq.next_element::<Obj<T>>()? {
            out.push(item.fields());
        }
        Ok(Items(Some(out)))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        skip_map(map)?;
        Ok(Items(None))
    }
    other_shapes!(Items<T>, |_| Items(None));
}

impl<'de, T: Fields<'de>> Deserialize<'de> for Items<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ItemsVisitor(PhantomData))
    }
}

/// A value where a list of strings is expected.
#[derive(Debug)]
pub(crate) enum StrList {
    /// A list: its strings, and the first item that is not one (its index
    /// and type), after which no more strings are kept.
    List {
        items: Vec<String>,
        bad: Option<(usize, &'static str)>,
    },
    /// Anything else.
    Other(Raw<'static>),
}

struct StrListVisitor;

impl<'de> Visitor<'de> for StrListVisitor {
    type Value = StrList;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<StrList, A::Error> {
        let mut items = Vec::new();
        let mut bad = None;
        let mut i = 0;
        while let Some(item) = seq.next_element::<Raw<'de>>()? {
            match item {
                Raw::String(s) if bad.is_none() => items.push(s.into_owned()),
                Raw::String(_) => {}
                other => {
                    bad.get_or_insert((i, other.type_name()));
                }
            }
            i += 1;
        }
        Ok(StrList::List { items, bad })
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<StrList, A::Error> {
        Ok(StrList::Other(Raw::Object {
            empty: skip_map(map)? == 0,
        }))
    }
    fn visit_bool<E>(self, b: bool) -> Result<StrList, E> {
        Ok(StrList::Other(Raw::Bool(b)))
    }
    fn visit_i64<E>(self, n: i64) -> Result<StrList, E> {
        Ok(StrList::Other(Raw::Number(n.into())))
    }
    fn visit_u64<E>(self, n: u64) -> Result<StrList, E> {
        Ok(StrList::Other(Raw::Number(n.into())))
    }
    fn visit_f64<E: serde::de::Error>(self, x: f64) -> Result<StrList, E> {
        let n = Number::from_f64(x).ok_or_else(|| E::custom("non-finite number"))?;
        Ok(StrList::Other(Raw::Number(n)))
    }
    fn visit_str<E>(self, s: &str) -> Result<StrList, E> {
        Ok(StrList::Other(Raw::String(Cow::Owned(s.to_owned()))))
    }
    fn visit_unit<E>(self) -> Result<StrList, E> {
        Ok(StrList::Other(Raw::Null))
    }
}

impl<'de> Deserialize<'de> for StrList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrListVisitor)
    }
}

/// `metadata`: the object, or `None` for any other value.
#[derive(Debug)]
pub(crate) struct Meta(pub(crate) Option<Map<String, Value>>);

struct MetaVisitor;

impl<'de> Visitor<'de> for MetaVisitor {
    type Value = Meta;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Meta, A::Error> {
        let mut out = Map::new();
        while let Some((k, v)) = map.next_entry::<String, Value>()? {
            // A repeated key keeps its first position and its last value.
            out.insert(k, v);
        }
        Ok(Meta(Some(out)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Meta, A::Error> {
        skip_seq(seq)?;
        Ok(Meta(None))
    }
    other_shapes!(Meta, |_| Meta(None));
}

impl<'de> Deserialize<'de> for Meta {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(MetaVisitor)
    }
}

// ---- checks ----------------------------------------------------------------

/// Text, `""` when missing or null.
pub(crate) fn text(v: Option<Raw<'_>>, path: &Path<'_>) -> Result<String, DecodeError> {
    match v {
        None | Some(Raw::Null) => Ok(String::new()),
        Some(Raw::String(x)) => Ok(x.into_owned()),
        Some(other) => Err(path.wrong("a string", other.type_name())),
    }
}

/// An enum field: a known wire string, else the default.
pub(crate) fn enum_field<T: Default>(v: Option<&Raw<'_>>, coerce: fn(&str) -> T) -> T {
    match v {
        Some(Raw::String(x)) => coerce(x),
        _ => T::default(),
    }
}

/// A list of strings, empty when missing or null.
pub(crate) fn str_list(v: Option<StrList>, path: &Path<'_>) -> Result<Vec<String>, DecodeError> {
    match v {
        None | Some(StrList::Other(Raw::Null)) => Ok(Vec::new()),
        Some(StrList::List { items, bad: None }) => Ok(items),
        Some(StrList::List {
            bad: Some((i, found)),
            ..
        }) => Err(path.index(i).wrong("a string", found)),
        Some(StrList::Other(other)) => Err(path.wrong("an array of strings", other.type_name())),
    }
}

pub(crate) fn boolean(v: Option<&Raw<'_>>, path: &Path<'_>) -> Result<bool, DecodeError> {
    match v {
        None | Some(Raw::Null) => Ok(false),
        Some(Raw::Bool(b)) => Ok(*b),
        Some(other) => Err(path.wrong("a boolean", other.type_name())),
    }
}

/// A non-negative count: integral numbers only; negatives read as 0 (as in
/// the reference); beyond 2^63 rejected as an overflow.
pub(crate) fn count(v: Option<&Raw<'_>>, path: &Path<'_>) -> Result<u64, DecodeError> {
    const LIMIT: u64 = i64::MAX as u64;
    match v {
        None | Some(Raw::Null) => Ok(0),
        Some(Raw::Number(n)) => {
            if let Some(u) = n.as_u64() {
                if u > LIMIT {
                    return Err(path.err(format!("count {u} overflows")));
                }
                return Ok(u);
            }
            if n.as_i64().is_some() {
                // A negative integer.
                return Ok(0);
            }
            let x = n.as_f64().unwrap_or(f64::NAN);
            if x.fract() != 0.0 || !x.is_finite() {
                return Err(path.err(format!("expected an integer count, found {x}")));
            }
            if x < 0.0 {
                return Ok(0);
            }
            if x >= LIMIT as f64 {
                return Err(path.err(format!("count {x} overflows")));
            }
            Ok(x as u64)
        }
        Some(other) => Err(path.wrong("an integer count", other.type_name())),
    }
}

/// A number clamped into `[0, 1]`, `default` when missing or null.
pub(crate) fn unit(v: Option<&Raw<'_>>, path: &Path<'_>, default: f64) -> Result<f64, DecodeError> {
    match v {
        None | Some(Raw::Null) => Ok(default),
        Some(Raw::Number(n)) => Ok(n.as_f64().unwrap_or(0.0).clamp(0.0, 1.0)),
        Some(other) => Err(path.wrong("a number", other.type_name())),
    }
}

/// A timestamp, `None` when missing or null.
pub(crate) fn opt_ts(
    v: Option<&Raw<'_>>,
    path: &Path<'_>,
) -> Result<Option<crate::Timestamp>, DecodeError> {
    match v {
        None | Some(Raw::Null) => Ok(None),
        Some(Raw::Number(n)) => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            crate::Timestamp::from_epoch_seconds(x)
                .map(Some)
                .map_err(|e| path.err(e.to_string()))
        }
        Some(other) => Err(path.wrong("epoch seconds", other.type_name())),
    }
}

/// A timestamp, `now` when missing or null.
pub(crate) fn ts_or(
    v: Option<&Raw<'_>>,
    path: &Path<'_>,
    now: crate::Timestamp,
) -> Result<crate::Timestamp, DecodeError> {
    Ok(opt_ts(v, path)?.unwrap_or(now))
}

// ---- writing ---------------------------------------------------------------

/// Appends `v` as serde_json writes it.
pub(crate) fn value<T: Serialize + ?Sized>(out: &mut Vec<u8>, v: &T) {
    // Writing into a Vec cannot fail, nor can any value written here (every
    // map key is text).
    let _ = serde_json::to_writer(out, v);
}

/// Appends a timestamp as epoch seconds.
pub(crate) fn ts(out: &mut Vec<u8>, t: crate::Timestamp) {
    value(out, &t.as_epoch_seconds());
}

/// Appends an optional timestamp (`null` when absent).
pub(crate) fn opt_ts_out(out: &mut Vec<u8>, t: Option<crate::Timestamp>) {
    match t {
        Some(t) => ts(out, t),
        None => out.extend_from_slice(b"null"),
    }
}

/// Appends a list of strings.
pub(crate) fn strs(out: &mut Vec<u8>, xs: &[String]) {
    value(out, xs);
}
