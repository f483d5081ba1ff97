//! Conversions between [`Timestamp`] and PostgreSQL `timestamptz`.

use parlance_core::Timestamp;
use time::OffsetDateTime;

/// A timestamp as sqlx binds `timestamptz` (exact to the microsecond).
pub(crate) fn to_pg(t: Timestamp) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(t.as_micros()) * 1_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

/// A `timestamptz` read back; PostgreSQL's range exceeds ours, so clamp
/// nothing and fall back to the epoch only for values no machine writes.
pub(crate) fn from_pg(t: OffsetDateTime) -> Timestamp {
    let micros = t.unix_timestamp_nanos() / 1_000;
    i64::try_from(micros)
        .ok()
        .and_then(Timestamp::from_micros)
        .unwrap_or(Timestamp::UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_microseconds() {
        let t = Timestamp::from_micros(1_767_225_600_123_457).unwrap();
        assert_eq!(from_pg(to_pg(t)), t);
        let early = Timestamp::from_micros(-62_135_596_800_000_000).unwrap();
        assert_eq!(from_pg(to_pg(early)), early);
    }
}
