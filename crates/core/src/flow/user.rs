//! The user a flow session is started for: the reference's `User`, kept
//! with the session and shown to its templates as `user_info`.
//!
//! Every member is checked when it is read, so a stored session holds only
//! values that passed: an email of the reference's pattern, printable
//! names, and a bounded map of custom properties.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::LazyLock;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Why a member of a [`User`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UserError {
    /// The email does not have the reference's shape.
    #[error("`{0}` is not an email address")]
    Email(String),
    /// A member is longer than its limit.
    #[error("{what} is {len} bytes long, at most {max} are allowed")]
    TooLong {
        /// Which member.
        what: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// A name holds a character that is not printable.
    #[error("{what} contains {found:?}, which is not printable")]
    NotPrintable {
        /// Which member.
        what: &'static str,
        /// The first offending character.
        found: char,
    },
    /// Too many custom properties.
    #[error("{len} custom properties, at most {max} are allowed")]
    TooManyProperties {
        /// How many were given.
        len: usize,
        /// The limit.
        max: usize,
    },
}

/// The email pattern of the reference (`genie_flow.model.user.is_email`).
const EMAIL_PATTERN: &str = r"^[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}$";

static EMAIL: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(EMAIL_PATTERN).expect("the email pattern compiles"));

/// An email address of the reference's shape: `local@domain.tld`, ASCII
/// letters, digits and `._%+-` before the `@`, letters, digits, `.` and
/// `-` after it, and a top-level domain of two letters or more; at most
/// [`Email::MAX_LEN`] bytes. Compared as written (no case folding), as the
/// reference's index does.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Email(String);

impl Email {
    /// The longest accepted address, in bytes (RFC 5321's path limit).
    pub const MAX_LEN: usize = 254;

    /// The accepted shape, as a regular expression over the whole address.
    pub const PATTERN: &'static str = EMAIL_PATTERN;

    /// Validates and wraps `value`.
    ///
    /// # Errors
    ///
    /// [`UserError::TooLong`] or [`UserError::Email`].
    pub fn parse(value: impl Into<String>) -> Result<Self, UserError> {
        let value = value.into();
        if value.len() > Self::MAX_LEN {
            return Err(UserError::TooLong {
                what: "email",
                len: value.len(),
                max: Self::MAX_LEN,
            });
        }
        if !EMAIL.is_match(&value) {
            return Err(UserError::Email(value));
        }
        Ok(Self(value))
    }

    /// The address as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Email {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Email({:?})", self.0)
    }
}

impl fmt::Display for Email {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for Email {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Email {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::parse(String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for Email {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .description(Some(
                "An email address of the shape `local@domain.tld`, compared as written.",
            ))
            .max_length(Some(Self::MAX_LEN))
            .pattern(Some(EMAIL_PATTERN))
            .examples([serde_json::json!("ada@example.com")])
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for Email {}

/// A person's first or last name: printable text (no control character
/// and no white space but the plain space, as Python's `isprintable`), at
/// most [`PersonName::MAX_LEN`] bytes.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PersonName(String);

impl PersonName {
    /// The longest accepted name, in bytes.
    pub const MAX_LEN: usize = 256;

    /// Validates and wraps `value`; `what` names the member in errors.
    ///
    /// # Errors
    ///
    /// [`UserError::TooLong`] or [`UserError::NotPrintable`].
    pub fn parse(what: &'static str, value: impl Into<String>) -> Result<Self, UserError> {
        let value = value.into();
        if value.len() > Self::MAX_LEN {
            return Err(UserError::TooLong {
                what,
                len: value.len(),
                max: Self::MAX_LEN,
            });
        }
        if let Some(found) = value
            .chars()
            .find(|&c| c.is_control() || (c.is_whitespace() && c != ' '))
        {
            return Err(UserError::NotPrintable { what, found });
        }
        Ok(Self(value))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for PersonName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PersonName({:?})", self.0)
    }
}

impl Serialize for PersonName {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for PersonName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::parse("a name", String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for PersonName {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .description(Some(
                "Printable text: no control characters and no white space but the space.",
            ))
            .max_length(Some(Self::MAX_LEN))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for PersonName {}

/// The most custom properties a [`User`] may carry.
pub const MAX_CUSTOM_PROPERTIES: usize = 64;

/// The longest custom property name, in bytes.
pub const MAX_PROPERTY_NAME: usize = 256;

/// The longest custom property value, in bytes.
pub const MAX_PROPERTY_VALUE: usize = 4096;

/// Custom properties of a user: at most [`MAX_CUSTOM_PROPERTIES`] names of
/// at most [`MAX_PROPERTY_NAME`] bytes, each with a text value of at most
/// [`MAX_PROPERTY_VALUE`] bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct CustomProperties(BTreeMap<String, String>);

impl CustomProperties {
    /// Validates and wraps `map`.
    ///
    /// # Errors
    ///
    /// [`UserError::TooManyProperties`] or [`UserError::TooLong`].
    pub fn new(map: BTreeMap<String, String>) -> Result<Self, UserError> {
        if map.len() > MAX_CUSTOM_PROPERTIES {
            return Err(UserError::TooManyProperties {
                len: map.len(),
                max: MAX_CUSTOM_PROPERTIES,
            });
        }
        for (k, v) in &map {
            for (what, len, max) in [
                ("a custom property name", k.len(), MAX_PROPERTY_NAME),
                ("a custom property value", v.len(), MAX_PROPERTY_VALUE),
            ] {
                if len > max {
                    return Err(UserError::TooLong { what, len, max });
                }
            }
        }
        Ok(Self(map))
    }

    /// The properties by name.
    pub fn as_map(&self) -> &BTreeMap<String, String> {
        &self.0
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<'de> Deserialize<'de> for CustomProperties {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // `null` reads as none, as the reference's optional map.
        let map = Option::<BTreeMap<String, String>>::deserialize(d)?.unwrap_or_default();
        Self::new(map).map_err(serde::de::Error::custom)
    }
}

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for CustomProperties {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, Type};
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some(
                "Text values by name: at most 64 names of at most 256 bytes, values of at \
                 most 4096 bytes.",
            ))
            .additional_properties(Some(AdditionalProperties::RefOr(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .max_length(Some(MAX_PROPERTY_VALUE))
                    .into(),
            )))
            .max_properties(Some(MAX_CUSTOM_PROPERTIES))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for CustomProperties {}

/// The user a session is started for (the reference's `User`). Kept with
/// the session; templates see it as `user_info`, with `name` (first and
/// last name) added as the reference computes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema), schema(as = FlowUser))]
pub struct User {
    /// The user's email: `user_sessions` finds sessions by it.
    pub email: Email,
    /// The first name.
    pub firstname: PersonName,
    /// The last name.
    pub lastname: PersonName,
    /// Anything else the caller wants templates to see.
    #[serde(default)]
    pub custom_properties: CustomProperties,
}

impl User {
    /// `firstname lastname`, as the reference's computed `name`.
    pub fn name(&self) -> String {
        format!("{} {}", self.firstname.as_str(), self.lastname.as_str())
    }

    /// The user as templates see it: its members plus `name`.
    pub fn render_value(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or(serde_json::Value::Null);
        if let serde_json::Value::Object(m) = &mut v {
            m.insert("name".into(), serde_json::Value::String(self.name()));
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn emails_of_the_reference_shape_are_accepted_and_others_refused() {
        for ok in ["ada@example.com", "a.b+c%d_e-f@sub.example.co", "X@Y.ZZ"] {
            assert!(Email::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "ada",
            "ada@example",
            "ada@example.c",
            "@example.com",
            "ada @example.com",
            "ada@exa mple.com",
            "ada@example.com\n",
            "ädä@example.com",
        ] {
            assert!(Email::parse(bad).is_err(), "{bad:?}");
        }
        let long = format!("{}@example.com", "a".repeat(250));
        assert!(matches!(
            Email::parse(long),
            Err(UserError::TooLong { what: "email", .. })
        ));
    }

    #[test]
    fn names_must_be_printable() {
        assert!(PersonName::parse("firstname", "Ada Marie-Lovelace").is_ok());
        assert!(PersonName::parse("firstname", "").is_ok());
        for bad in ["Ada\n", "A\tda", "A\u{7}", "A\u{2028}"] {
            assert!(
                matches!(
                    PersonName::parse("firstname", bad),
                    Err(UserError::NotPrintable { .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_user_reads_from_the_reference_shape_and_round_trips() {
        let u: User = serde_json::from_value(json!({
            "email": "ada@example.com", "firstname": "Ada", "lastname": "Lovelace",
            "custom_properties": {"team": "engines"}
        }))
        .unwrap();
        assert_eq!(u.name(), "Ada Lovelace");
        let back: User = serde_json::from_value(serde_json::to_value(&u).unwrap()).unwrap();
        assert_eq!(back, u);
        let bare: User = serde_json::from_value(json!({
            "email": "ada@example.com", "firstname": "Ada", "lastname": "L",
            "custom_properties": null
        }))
        .unwrap();
        assert!(bare.custom_properties.is_empty());
        assert_eq!(
            u.render_value()["name"],
            json!("Ada Lovelace"),
            "templates see the computed name"
        );
    }

    #[test]
    fn a_user_without_a_valid_email_or_with_too_many_properties_is_refused() {
        let e =
            serde_json::from_value::<User>(json!({"firstname": "A", "lastname": "B"})).unwrap_err();
        assert!(e.to_string().contains("email"), "{e}");
        let e = serde_json::from_value::<User>(
            json!({"email": "nope", "firstname": "A", "lastname": "B"}),
        )
        .unwrap_err();
        assert!(e.to_string().contains("not an email address"), "{e}");
        let many: BTreeMap<String, String> = (0..=MAX_CUSTOM_PROPERTIES)
            .map(|i| (format!("k{i}"), "v".into()))
            .collect();
        let e = serde_json::from_value::<User>(json!({
            "email": "a@b.cc", "firstname": "A", "lastname": "B", "custom_properties": many
        }))
        .unwrap_err();
        assert!(e.to_string().contains("custom properties"), "{e}");
    }
}
