//! Tour catalogs: per-tour interaction timeouts and cooldowns.
//!
//! A product's catalog maps tours to their own `interaction_timeout_s` and
//! `cooldown_period_s`, with catalog-level defaults. A running tour is found
//! by its provider flow id (`user_tour_id`), the id `set_visual_guidance`
//! receives. A timeout of `None` means the session's own setting.

use serde::Serialize;
use serde_json::{Map, Value};

use crate::session::snapshot::{DecodeError, Path};

/// The catalog default interaction timeout, in seconds.
pub const CATALOG_DEFAULT_INTERACTION_TIMEOUT_S: f64 = 20.0;
/// The catalog default cooldown period, in seconds (the session default is 60).
pub const CATALOG_DEFAULT_COOLDOWN_PERIOD_S: f64 = 120.0;

/// One tour and its overrides.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TourDefinition {
    /// The chip id offering the tour.
    pub id: String,
    /// Timeout while this tour runs; `None` means the session's.
    pub interaction_timeout_s: Option<f64>,
    /// Cooldown after this tour times out; `None` means the session's.
    pub cooldown_period_s: Option<f64>,
    /// The tour provider's flow id: what `active_tour_id` holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_tour_id: Option<String>,
    /// A display name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_tour_name: Option<String>,
}

/// A product's tours: the session machine's context.
///
/// ```
/// use parlance_core::session::{SessionEvent, SessionId, SessionState, TourCatalog};
/// use parlance_core::{Machine, ProductId, Timestamp};
/// use serde_json::json;
///
/// let tours = TourCatalog::from_value(&json!({
///     "tours": [{"id": "chip-billing", "user_tour_id": "flow-1", "interaction_timeout_s": 90}],
/// }))?;
/// assert_eq!(tours.get_by_user_tour_id("flow-1").map(|t| t.id.as_str()), Some("chip-billing"));
///
/// let t0 = Timestamp::from_secs(1_767_225_600).expect("a date in range");
/// let mut session = SessionState::new(ProductId::parse("acme")?, SessionId::parse("s-1")?, t0);
/// session.decide(&tours, &SessionEvent::OpenChat.into(), t0)?;
/// let guided = SessionEvent::VisualGuidance { active: true, tour_id: Some("flow-1".to_owned()) };
/// session.decide(&tours, &guided.into(), t0)?;
/// // While the tour runs, its own timeout applies.
/// assert_eq!(session.next_deadline(&tours), Some(t0.plus_seconds(90.0)));
///
/// let err = TourCatalog::from_value(&json!({"tours": 3})).unwrap_err();
/// assert_eq!(err.path(), Some("tours"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(
    feature = "openapi",
    derive(utoipa::ToSchema),
    schema(description = "A product's tours.")
)]
pub struct TourCatalog {
    /// Timeout for tours that do not set their own (`None`: the session's).
    pub default_interaction_timeout_s: Option<f64>,
    /// Cooldown for tours that do not set their own (`None`: the session's).
    pub default_cooldown_period_s: Option<f64>,
    /// The tours, in order; the first match wins a lookup.
    #[cfg_attr(feature = "openapi", schema(required = false))]
    pub tours: Vec<TourDefinition>,
}

impl Default for TourCatalog {
    fn default() -> Self {
        Self::empty()
    }
}

impl TourCatalog {
    /// No tours, the catalog defaults.
    pub const fn empty() -> Self {
        Self {
            default_interaction_timeout_s: Some(CATALOG_DEFAULT_INTERACTION_TIMEOUT_S),
            default_cooldown_period_s: Some(CATALOG_DEFAULT_COOLDOWN_PERIOD_S),
            tours: Vec::new(),
        }
    }

    /// A shared empty catalog, for sessions of products without tours.
    pub fn none() -> &'static TourCatalog {
        static EMPTY: TourCatalog = TourCatalog::empty();
        &EMPTY
    }

    /// The first tour offered by chip `id`.
    pub fn get(&self, id: &str) -> Option<&TourDefinition> {
        self.tours.iter().find(|t| t.id == id)
    }

    /// The first tour with provider flow id `flow_id`; none for an empty id.
    pub fn get_by_user_tour_id(&self, flow_id: &str) -> Option<&TourDefinition> {
        if flow_id.is_empty() {
            return None;
        }
        self.tours
            .iter()
            .find(|t| t.user_tour_id.as_deref() == Some(flow_id))
    }

    /// Decodes a catalog document: `default_interaction_timeout_s`,
    /// `default_cooldown_period_s` (absent: 20 and 120; `null`: the
    /// session's), and `tours`, a list of objects. A tour's timeouts default
    /// to the catalog's when the key is absent; an explicit `null` keeps
    /// `null`. Entries that are not objects, or have no `id`, are skipped;
    /// unknown keys are ignored; duplicates are kept (lookups take the first).
    ///
    /// # Errors
    ///
    /// A [`DecodeError`] naming the field when the document is not an
    /// object, `tours` is not a list, or a value has the wrong type or is a
    /// negative or non-finite number of seconds.
    pub fn from_value(v: &Value) -> Result<Self, DecodeError> {
        let root = Path::root();
        let obj = root.object(v)?;
        Self::from_object(obj, &root)
    }

    fn from_object(obj: &Map<String, Value>, root: &Path<'_>) -> Result<Self, DecodeError> {
        let default_interaction_timeout_s = opt_seconds_or(
            obj,
            root,
            "default_interaction_timeout_s",
            Some(CATALOG_DEFAULT_INTERACTION_TIMEOUT_S),
        )?;
        let default_cooldown_period_s = opt_seconds_or(
            obj,
            root,
            "default_cooldown_period_s",
            Some(CATALOG_DEFAULT_COOLDOWN_PERIOD_S),
        )?;
        let mut tours = Vec::new();
        if let Some(list) = obj.get("tours") {
            let p = root.key("tours");
            let Value::Array(items) = list else {
                return Err(p.wrong_type("a list", list));
            };
            for (i, item) in items.iter().enumerate() {
                let Value::Object(t) = item else { continue };
                if !t.contains_key("id") {
                    continue;
                }
                let p = p.index(i);
                tours.push(TourDefinition {
                    id: p.key("id").string(&t["id"])?.to_owned(),
                    interaction_timeout_s: opt_seconds_or(
                        t,
                        &p,
                        "interaction_timeout_s",
                        default_interaction_timeout_s,
                    )?,
                    cooldown_period_s: opt_seconds_or(
                        t,
                        &p,
                        "cooldown_period_s",
                        default_cooldown_period_s,
                    )?,
                    user_tour_id: opt_string(t, &p, "user_tour_id")?,
                    user_tour_name: opt_string(t, &p, "user_tour_name")?,
                });
            }
        }
        Ok(Self {
            default_interaction_timeout_s,
            default_cooldown_period_s,
            tours,
        })
    }

    /// The catalog as a document [`TourCatalog::from_value`] reads back.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// A catalog labelled with the product it belongs to: the registry document
/// of the reference SDK (`product_id` first, then the catalog's keys).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TourRegistry {
    /// The product label as written in the document (may be empty).
    pub product_id: String,
    /// The catalog.
    #[serde(flatten)]
    pub catalog: TourCatalog,
}

impl TourRegistry {
    /// Decodes a registry document: a catalog with a required `product_id`.
    ///
    /// # Errors
    ///
    /// As [`TourCatalog::from_value`], and when `product_id` is missing or
    /// not a string.
    pub fn from_value(v: &Value) -> Result<Self, DecodeError> {
        let root = Path::root();
        let obj = root.object(v)?;
        let catalog = TourCatalog::from_object(obj, &root)?;
        let product_id = root.required(obj, "product_id")?;
        let product_id = root.key("product_id").string(product_id)?.to_owned();
        Ok(Self {
            product_id,
            catalog,
        })
    }
}

fn opt_seconds_or(
    obj: &Map<String, Value>,
    parent: &Path<'_>,
    key: &'static str,
    default: Option<f64>,
) -> Result<Option<f64>, DecodeError> {
    match obj.get(key) {
        None => Ok(default),
        Some(Value::Null) => Ok(None),
        Some(v) => parent.key(key).seconds(v).map(Some),
    }
}

fn opt_string(
    obj: &Map<String, Value>,
    parent: &Path<'_>,
    key: &'static str,
) -> Result<Option<String>, DecodeError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => parent.key(key).string(v).map(|s| Some(s.to_owned())),
    }
}
