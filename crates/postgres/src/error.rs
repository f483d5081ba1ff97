//! Classification of sqlx errors into port errors.

use parlance_ports::{ErrorKind, PortError};

/// SQLSTATE codes we act on.
mod sqlstate {
    pub(super) const UNIQUE_VIOLATION: &str = "23505";
    pub(super) const EXCLUSION_VIOLATION: &str = "23P01";
    pub(super) const SERIALIZATION_FAILURE: &str = "40001";
    pub(super) const DEADLOCK_DETECTED: &str = "40P01";
    pub(super) const CHECK_VIOLATION: &str = "23514";
    pub(super) const NOT_NULL_VIOLATION: &str = "23502";
    /// Class 22, data exceptions: a value the database cannot take (a
    /// character outside the encoding, 22021; a `\u0000` in `jsonb`, 22P05;
    /// a number out of range, 22003; a string too long, 22001; text that
    /// does not parse, 22P02; ...).
    pub(super) const DATA_EXCEPTION_CLASS: &str = "22";
    /// Class 08: connection exceptions; 57P0x: shutdown and crash recovery.
    pub(super) const CONNECTION_CLASS: &str = "08";
    pub(super) const ADMIN_SHUTDOWN: &str = "57P01";
    pub(super) const CRASH_SHUTDOWN: &str = "57P02";
    pub(super) const CANNOT_CONNECT_NOW: &str = "57P03";
    pub(super) const TOO_MANY_CONNECTIONS: &str = "53300";
}

/// The classification of a sqlx error. A value the database refuses (class
/// 22, a check or not-null violation) is [`ErrorKind::Invalid`], never
/// `Other`; a value read back that does not fit its Rust type (a decode
/// error) is `Other`, a corrupt record.
///
/// ```
/// use parlance_ports::ErrorKind;
/// use parlance_postgres::error::kind_of;
///
/// assert_eq!(kind_of(&sqlx::Error::PoolTimedOut), ErrorKind::Unavailable);
/// assert_eq!(kind_of(&sqlx::Error::RowNotFound), ErrorKind::NotFound);
/// ```
pub fn kind_of(err: &sqlx::Error) -> ErrorKind {
    use sqlstate::*;
    match err {
        sqlx::Error::RowNotFound => ErrorKind::NotFound,
        sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::WorkerCrashed => ErrorKind::Unavailable,
        sqlx::Error::Database(db) => match db.code().as_deref() {
            Some(
                UNIQUE_VIOLATION | EXCLUSION_VIOLATION | SERIALIZATION_FAILURE | DEADLOCK_DETECTED,
            ) => ErrorKind::Conflict,
            Some(CHECK_VIOLATION | NOT_NULL_VIOLATION) => ErrorKind::Invalid,
            Some(code) if code.starts_with(DATA_EXCEPTION_CLASS) => ErrorKind::Invalid,
            Some(ADMIN_SHUTDOWN | CRASH_SHUTDOWN | CANNOT_CONNECT_NOW | TOO_MANY_CONNECTIONS) => {
                ErrorKind::Unavailable
            }
            Some(code) if code.starts_with(CONNECTION_CLASS) => ErrorKind::Unavailable,
            _ => ErrorKind::Other,
        },
        _ => ErrorKind::Other,
    }
}

/// A stored integer as the Rust type it was written from. A value that
/// does not fit (a negative count read as `u64`, ...) is a decode error
/// naming the column: a corrupt record, never a panic or a silent clamp.
#[cfg(feature = "turn")]
pub(crate) fn stored_int<T>(column: &'static str, v: i64) -> Result<T, sqlx::Error>
where
    T: TryFrom<i64>,
{
    T::try_from(v).map_err(|_| sqlx::Error::ColumnDecode {
        index: column.to_owned(),
        source: format!("stored value {v} is out of range for its type").into(),
    })
}

/// Wraps a sqlx error into a classified port error; `what` says which
/// operation failed (lowercase, e.g. `"append audit entries"`).
///
/// ```
/// use parlance_postgres::error::port_error;
///
/// let err = port_error("load invoice", sqlx::Error::PoolClosed);
/// assert_eq!(err.to_string(), "unavailable: postgres: load invoice");
/// assert!(std::error::Error::source(&err).is_some());
/// ```
pub fn port_error(what: &str, err: sqlx::Error) -> PortError {
    let kind = kind_of(&err);
    PortError::new(kind, format!("postgres: {what}")).with_source(err)
}

/// `map_err` helper: `.map_err(pg_err("load session"))`.
pub(crate) fn pg_err(what: &'static str) -> impl Fn(sqlx::Error) -> PortError + Copy {
    move |e| port_error(what, e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_integer_that_does_not_fit_is_a_decode_error() {
        assert_eq!(stored_int::<u64>("turn", 7).unwrap(), 7);
        let e = stored_int::<u64>("turn", -1).unwrap_err();
        assert!(matches!(e, sqlx::Error::ColumnDecode { ref index, .. } if index == "turn"));
        assert_eq!(kind_of(&e), ErrorKind::Other);
        assert!(stored_int::<u32>("n", i64::from(u32::MAX) + 1).is_err());
    }

    #[test]
    fn pool_errors_are_unavailable() {
        assert_eq!(kind_of(&sqlx::Error::PoolTimedOut), ErrorKind::Unavailable);
        assert_eq!(kind_of(&sqlx::Error::RowNotFound), ErrorKind::NotFound);
        let e = port_error("load session", sqlx::Error::PoolClosed);
        assert_eq!(e.to_string(), "unavailable: postgres: load session");
    }
}
