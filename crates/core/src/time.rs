//! Wall-clock UTC timestamps with microsecond precision.
//!
//! A [`Timestamp`] is what every machine receives as `now`. It serializes as
//! Unix epoch seconds (`f64`), the form every snapshot stores, so a snapshot
//! written by one process is valid in any other process or host.

use std::fmt;
use std::ops::{Add, Sub};
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The largest representable instant: year 9999, end of day (in microseconds).
const MAX_MICROS: i64 = 253_402_300_799_999_999;
/// The smallest representable instant: year 0001, start (in microseconds).
const MIN_MICROS: i64 = -62_135_596_800_000_000;

/// A wall-clock instant (UTC), microseconds since the Unix epoch.
///
/// The caller reads the clock; machines only receive the result as `now`.
/// It serializes as fractional epoch seconds and displays as RFC 3339:
///
/// ```
/// use std::time::Duration;
///
/// use parlance_core::Timestamp;
///
/// let t0 = Timestamp::from_secs(1_767_225_600).expect("a date in range");
/// assert_eq!(t0.to_string(), "2026-01-01T00:00:00.000000Z");
///
/// let later = t0 + Duration::from_millis(1_500);
/// assert_eq!(later.seconds_since(t0), 1.5);
/// assert_eq!(later, Timestamp::from_epoch_seconds(1_767_225_601.5)?);
///
/// // On the wire: epoch seconds.
/// assert_eq!(serde_json::to_string(&later)?, "1767225601.5");
/// let back: Timestamp = serde_json::from_str("1767225601.5")?;
/// assert_eq!(back, later);
///
/// // Outside years 1 to 9999 there is no timestamp.
/// assert!(Timestamp::from_epoch_seconds(f64::NAN).is_err());
/// assert_eq!(Timestamp::from_secs(i64::MAX), None);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(i64);

/// Why a number could not become a [`Timestamp`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TimestampError {
    /// NaN or an infinity.
    #[error("timestamp is not a finite number")]
    NotFinite,
    /// Before year 1 or after year 9999.
    #[error("timestamp {0} is outside the years 1 to 9999")]
    OutOfRange(f64),
}

impl Timestamp {
    /// The Unix epoch, 1970-01-01T00:00:00Z.
    pub const UNIX_EPOCH: Timestamp = Timestamp(0);

    /// From microseconds since the epoch; `None` outside years 1 to 9999.
    pub const fn from_micros(micros: i64) -> Option<Self> {
        if micros < MIN_MICROS || micros > MAX_MICROS {
            None
        } else {
            Some(Timestamp(micros))
        }
    }

    /// From whole seconds since the epoch; `None` outside years 1 to 9999.
    pub const fn from_secs(secs: i64) -> Option<Self> {
        match secs.checked_mul(1_000_000) {
            Some(m) => Self::from_micros(m),
            None => None,
        }
    }

    /// From fractional epoch seconds, rounded to the nearest microsecond.
    pub fn from_epoch_seconds(secs: f64) -> Result<Self, TimestampError> {
        if !secs.is_finite() {
            return Err(TimestampError::NotFinite);
        }
        let micros = (secs * 1_000_000.0).round();
        if micros < MIN_MICROS as f64 || micros > MAX_MICROS as f64 {
            return Err(TimestampError::OutOfRange(secs));
        }
        // In range, so the cast is exact enough and cannot saturate.
        Ok(Timestamp(micros as i64))
    }

    /// Microseconds since the epoch.
    pub const fn as_micros(self) -> i64 {
        self.0
    }

    /// Fractional seconds since the epoch: the snapshot representation.
    pub fn as_epoch_seconds(self) -> f64 {
        // Split to keep microsecond precision for any year in range.
        let secs = self.0.div_euclid(1_000_000);
        let micros = self.0.rem_euclid(1_000_000);
        secs as f64 + micros as f64 / 1_000_000.0
    }

    /// Seconds elapsed from `earlier` to `self` (negative when `earlier` is later).
    pub fn seconds_since(self, earlier: Timestamp) -> f64 {
        (self.0 - earlier.0) as f64 / 1_000_000.0
    }

    /// `self` plus a number of seconds, saturating at the representable range.
    /// Non-finite input leaves the timestamp unchanged.
    pub fn plus_seconds(self, secs: f64) -> Timestamp {
        if !secs.is_finite() {
            return self;
        }
        // `as` saturates for out-of-range floats; clamping happens in integers.
        let delta = (secs * 1_000_000.0).round() as i64;
        Timestamp(self.0.saturating_add(delta).clamp(MIN_MICROS, MAX_MICROS))
    }

    /// The duration from `earlier` to `self`, zero when `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Timestamp) -> Duration {
        Duration::from_micros(self.0.saturating_sub(earlier.0).max(0).unsigned_abs())
    }
}

impl Add<Duration> for Timestamp {
    type Output = Timestamp;

    /// Saturates at the end of year 9999.
    fn add(self, rhs: Duration) -> Timestamp {
        let delta = i64::try_from(rhs.as_micros()).unwrap_or(i64::MAX);
        Timestamp(self.0.saturating_add(delta).min(MAX_MICROS))
    }
}

impl Sub<Duration> for Timestamp {
    type Output = Timestamp;

    /// Saturates at the start of year 1.
    fn sub(self, rhs: Duration) -> Timestamp {
        let delta = i64::try_from(rhs.as_micros()).unwrap_or(i64::MAX);
        Timestamp(self.0.saturating_sub(delta).max(MIN_MICROS))
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Timestamp({})", self)
    }
}

impl fmt::Display for Timestamp {
    /// RFC 3339 in UTC with microseconds, e.g. `2026-11-22T11:21:59.000000Z`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.0.div_euclid(1_000_000);
        let micros = self.0.rem_euclid(1_000_000);
        let days = secs.div_euclid(86_400);
        let sod = secs.rem_euclid(86_400);
        let (y, m, d) = civil_from_days(days);
        write!(
            f,
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{micros:06}Z",
            sod / 3600,
            (sod % 3600) / 60,
            sod % 60
        )
    }
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_f64(self.as_epoch_seconds())
    }
}

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for Timestamp {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::Number)
            .description(Some(
                "An instant, in seconds since the Unix epoch (UTC), with microseconds.",
            ))
            .examples([serde_json::json!(1_767_225_600.25)])
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for Timestamp {}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let secs = f64::deserialize(deserializer)?;
        Timestamp::from_epoch_seconds(secs).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn displays_rfc3339() {
        let t = Timestamp::from_micros(1_795_000_000_123_456).unwrap();
        assert_eq!(t.to_string(), "2026-11-18T11:06:40.123456Z");
        assert_eq!(
            Timestamp::UNIX_EPOCH.to_string(),
            "1970-01-01T00:00:00.000000Z"
        );
        assert_eq!(
            Timestamp::from_micros(-1).unwrap().to_string(),
            "1969-12-31T23:59:59.999999Z"
        );
    }

    #[test]
    fn rejects_non_finite_and_out_of_range() {
        assert_eq!(
            Timestamp::from_epoch_seconds(f64::NAN),
            Err(TimestampError::NotFinite)
        );
        assert_eq!(
            Timestamp::from_epoch_seconds(f64::INFINITY),
            Err(TimestampError::NotFinite)
        );
        assert!(matches!(
            Timestamp::from_epoch_seconds(1e300),
            Err(TimestampError::OutOfRange(_))
        ));
        assert!(serde_json::from_str::<Timestamp>("\"x\"").is_err());
    }

    #[test]
    fn arithmetic_saturates() {
        let max = Timestamp::from_micros(MAX_MICROS).unwrap();
        assert_eq!(max + Duration::from_secs(10), max);
        assert_eq!(max.plus_seconds(1e30), max);
        let t = Timestamp::from_secs(100).unwrap();
        assert_eq!(t.plus_seconds(1.5).as_micros(), 101_500_000);
        assert_eq!(t.seconds_since(Timestamp::from_secs(70).unwrap()), 30.0);
        assert_eq!(
            Timestamp::from_secs(70)
                .unwrap()
                .saturating_duration_since(t),
            Duration::ZERO
        );
    }

    proptest! {
        #[test]
        fn epoch_seconds_round_trip(micros in MIN_MICROS..=MAX_MICROS) {
            let t = Timestamp::from_micros(micros).unwrap();
            let json = serde_json::to_string(&t).unwrap();
            let back: Timestamp = serde_json::from_str(&json).unwrap();
            // f64 has 53 bits: within 2^32 seconds of the epoch (1834 to
            // 2106) an ulp is under half a microsecond, so the round trip is
            // exact; further out it may be off by a few microseconds.
            if micros.abs() < 4_000_000_000_000_000 {
                prop_assert_eq!(back, t);
            } else {
                prop_assert!((back.as_micros() - micros).abs() <= 64);
            }
        }

        #[test]
        fn any_f64_decodes_to_the_nearest_microsecond_or_is_refused(x in proptest::num::f64::ANY) {
            match Timestamp::from_epoch_seconds(x) {
                // Within half a microsecond, up to the rounding of `x` itself.
                Ok(t) => prop_assert!(
                    (t.as_epoch_seconds() - x).abs() <= 0.5e-6 + x.abs() * f64::EPSILON * 4.0,
                    "{x} -> {}", t.as_epoch_seconds()
                ),
                Err(_) => prop_assert!(
                    !x.is_finite()
                        || x * 1e6 > MAX_MICROS as f64 * 0.999
                        || x * 1e6 < MIN_MICROS as f64 * 0.999
                ),
            }
        }
    }
}
