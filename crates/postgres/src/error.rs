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
    pub(super) const STRING_TOO_LONG: &str = "22001";
    pub(super) const INVALID_TEXT: &str = "22P02";
    /// Class 08: connection exceptions; 57P0x: shutdown and crash recovery.
    pub(super) const CONNECTION_CLASS: &str = "08";
    pub(super) const ADMIN_SHUTDOWN: &str = "57P01";
    pub(super) const CRASH_SHUTDOWN: &str = "57P02";
    pub(super) const CANNOT_CONNECT_NOW: &str = "57P03";
    pub(super) const TOO_MANY_CONNECTIONS: &str = "53300";
}

/// The classification of a sqlx error.
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
            Some(CHECK_VIOLATION | NOT_NULL_VIOLATION | STRING_TOO_LONG | INVALID_TEXT) => {
                ErrorKind::Invalid
            }
            Some(ADMIN_SHUTDOWN | CRASH_SHUTDOWN | CANNOT_CONNECT_NOW | TOO_MANY_CONNECTIONS) => {
                ErrorKind::Unavailable
            }
            Some(code) if code.starts_with(CONNECTION_CLASS) => ErrorKind::Unavailable,
            _ => ErrorKind::Other,
        },
        _ => ErrorKind::Other,
    }
}

/// Wraps a sqlx error into a classified port error; `what` says which
/// operation failed (lowercase, e.g. `"append audit entries"`).
pub fn port_error(what: &str, err: sqlx::Error) -> PortError {
    let kind = kind_of(&err);
    PortError::new(kind, format!("postgres: {what}")).with_source(err)
}

/// `map_err` helper: `.map_err(pg_err("load session"))`.
pub fn pg_err(what: &'static str) -> impl Fn(sqlx::Error) -> PortError {
    move |e| port_error(what, e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_errors_are_unavailable() {
        assert_eq!(kind_of(&sqlx::Error::PoolTimedOut), ErrorKind::Unavailable);
        assert_eq!(kind_of(&sqlx::Error::RowNotFound), ErrorKind::NotFound);
        let e = port_error("load session", sqlx::Error::PoolClosed);
        assert_eq!(e.to_string(), "unavailable: postgres: load session");
    }
}
