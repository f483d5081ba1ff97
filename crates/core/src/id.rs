//! Typed, validated identifiers.
//!
//! Ids are parsed once at the boundary and trusted inside. String ids that
//! come from callers (products, sessions, users, contacts) are validated
//! newtypes; ids Parlance generates are UUIDs wrapped in their own types.

/// Why a string is not a valid id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdError {
    /// The id is the empty string.
    #[error("{kind} must not be empty")]
    Empty {
        /// Which id.
        kind: &'static str,
    },
    /// The id is longer than its limit.
    #[error("{kind} is {len} bytes long, at most {max} are allowed")]
    TooLong {
        /// Which id.
        kind: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// The id holds a character its kind does not allow.
    #[error("{kind} contains {found:?}, which is not allowed")]
    BadChar {
        /// Which id.
        kind: &'static str,
        /// The first offending character.
        found: char,
    },
}

/// Declares a validated string id: non-empty, at most `$max` bytes, and no
/// control characters (plus `$allowed`, a predicate every char must pass).
/// `$pattern` is the same rule on characters as a regular expression (ECMA
/// and Python syntax), for JSON Schemas; a test checks the two agree.
macro_rules! string_id {
    ($(#[$meta:meta])* $name:ident, $kind:literal, max = $max:expr, chars = $allowed:expr, pattern = $pattern:literal) => {
        $(#[$meta])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(String);

        impl $name {
            /// The longest accepted id, in bytes.
            pub const MAX_LEN: usize = $max;

            /// The characters an id may hold, as a regular expression over
            /// the whole id (the length in bytes is checked apart).
            pub const PATTERN: &'static str = $pattern;

            /// Validates and wraps `value`.
            pub fn parse(value: impl Into<String>) -> Result<Self, $crate::id::IdError> {
                let value = value.into();
                if value.is_empty() {
                    return Err($crate::id::IdError::Empty { kind: $kind });
                }
                if value.len() > Self::MAX_LEN {
                    return Err($crate::id::IdError::TooLong {
                        kind: $kind,
                        len: value.len(),
                        max: Self::MAX_LEN,
                    });
                }
                let allowed: fn(char) -> bool = $allowed;
                if let Some(found) = value.chars().find(|c| c.is_control() || !allowed(*c)) {
                    return Err($crate::id::IdError::BadChar { kind: $kind, found });
                }
                Ok(Self(value))
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The id as an owned string.
            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl ::std::fmt::Debug for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                write!(f, "{}({:?})", stringify!($name), self.0)
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = $crate::id::IdError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::parse(s)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::parse(s).map_err(::serde::de::Error::custom)
            }
        }

        #[cfg(feature = "openapi")]
        impl ::utoipa::PartialSchema for $name {
            fn schema() -> ::utoipa::openapi::RefOr<::utoipa::openapi::schema::Schema> {
                ::utoipa::openapi::ObjectBuilder::new()
                    .schema_type(::utoipa::openapi::schema::Type::String)
                    .description(Some(concat!(
                        "A ",
                        $kind,
                        ": at most ",
                        stringify!($max),
                        " bytes of UTF-8, no control characters."
                    )))
                    .min_length(Some(1))
                    .max_length(Some($max))
                    .pattern(Some($pattern))
                    .into()
            }
        }

        #[cfg(feature = "openapi")]
        impl ::utoipa::ToSchema for $name {}
    };
}

// For the machines' ids: unused when the crate is built with no machine.
#[allow(unused_imports)]
pub(crate) use string_id;

/// Characters allowed in a product id: ASCII letters, digits, `-`, `_`, `.`.
fn product_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

string_id!(
    /// The tenant: every stored record is scoped by its product.
    ///
    /// Parsed once where it enters (ASCII letters, digits, `-`, `_` and
    /// `.`, at most 64 bytes), then trusted:
    ///
    /// ```
    /// use parlance_core::{IdError, ProductId};
    ///
    /// let acme = ProductId::parse("acme-prod")?;
    /// assert_eq!(acme.as_str(), "acme-prod");
    /// assert_eq!(serde_json::to_string(&acme)?, r#""acme-prod""#);
    ///
    /// assert_eq!(ProductId::parse(""), Err(IdError::Empty { kind: "product id" }));
    /// assert!(matches!(
    ///     ProductId::parse("acme/prod"),
    ///     Err(IdError::BadChar { found: '/', .. })
    /// ));
    /// // Decoding validates too.
    /// assert!(serde_json::from_str::<ProductId>(r#""a b""#).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ProductId,
    "product id",
    max = 64,
    chars = product_char,
    pattern = "^[A-Za-z0-9._-]+$"
);

impl ProductId {
    /// The product `serve` creates a key for when none is configured.
    pub fn default_product() -> ProductId {
        ProductId("default".to_owned())
    }
}

/// Declares a generated id: a UUID in its own type.
#[allow(unused_macros)] // unused when the crate is built with no machine
macro_rules! uuid_id {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(::uuid::Uuid);

        impl $name {
            /// Wraps a UUID (generated through the `IdGen` port).
            pub const fn from_uuid(id: ::uuid::Uuid) -> Self {
                Self(id)
            }

            /// The UUID inside.
            pub const fn as_uuid(&self) -> ::uuid::Uuid {
                self.0
            }
        }

        impl ::std::fmt::Debug for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0)
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                ::std::fmt::Display::fmt(&self.0, f)
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = ::uuid::Error;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                s.parse().map(Self)
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                ::serde::Serialize::serialize(&self.0, s)
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                ::uuid::Uuid::deserialize(d).map(Self)
            }
        }

        #[cfg(feature = "openapi")]
        impl ::utoipa::PartialSchema for $name {
            fn schema() -> ::utoipa::openapi::RefOr<::utoipa::openapi::schema::Schema> {
                ::utoipa::openapi::ObjectBuilder::new()
                    .schema_type(::utoipa::openapi::schema::Type::String)
                    .format(Some(::utoipa::openapi::SchemaFormat::KnownFormat(
                        ::utoipa::openapi::KnownFormat::Uuid,
                    )))
                    .into()
            }
        }

        #[cfg(feature = "openapi")]
        impl ::utoipa::ToSchema for $name {}
    };
}

#[allow(unused_imports)]
pub(crate) use uuid_id;

#[cfg(test)]
mod tests {
    use super::*;

    // The macro declares `pub` items; here they live in a private test module.
    #[allow(unreachable_pub)]
    mod ids {
        uuid_id!(
            /// A test id.
            TestId
        );
    }
    use ids::TestId;

    #[test]
    fn product_ids_are_validated() {
        assert!(ProductId::parse("acme-1.prod_x").is_ok());
        assert_eq!(
            ProductId::parse(""),
            Err(IdError::Empty { kind: "product id" })
        );
        assert_eq!(
            ProductId::parse("a/b"),
            Err(IdError::BadChar {
                kind: "product id",
                found: '/'
            })
        );
        assert!(matches!(
            ProductId::parse("x".repeat(65)),
            Err(IdError::TooLong { len: 65, .. })
        ));
        let back: Result<ProductId, _> = serde_json::from_str("\"a b\"");
        assert!(back.is_err());
    }

    #[test]
    fn uuid_ids_round_trip() {
        let id = TestId::from_uuid(uuid::Uuid::from_u128(7));
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, "\"00000000-0000-0000-0000-000000000007\"");
        assert_eq!(serde_json::from_str::<TestId>(&json).unwrap(), id);
        assert_eq!(id.to_string().parse::<TestId>().unwrap(), id);
        assert_eq!(id.as_uuid(), uuid::Uuid::from_u128(7));
    }
}
