//! The error every storage and queue port returns, classified for the caller.

use std::error::Error as StdError;
use std::fmt;

/// What the caller can do about a failed port call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A compare-and-swap lost, or a uniqueness rule was hit: reload and retry.
    Conflict,
    /// The record does not exist (for this product).
    NotFound,
    /// The backend is unreachable or overloaded: retry later.
    Unavailable,
    /// The request itself is wrong (bad data, a limit exceeded): do not retry.
    Invalid,
    /// Anything else: a bug or an unexpected backend answer.
    Other,
}

impl ErrorKind {
    /// The lowercase name used in messages and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Conflict => "conflict",
            ErrorKind::NotFound => "not found",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Invalid => "invalid",
            ErrorKind::Other => "other",
        }
    }
}

/// A classified port failure with a message and, optionally, its cause.
///
/// `Display` shows the kind and the message; the cause is reachable through
/// [`StdError::source`] and never repeated in the message.
///
/// An adapter classifies what went wrong; the caller acts on the kind:
///
/// ```
/// use std::error::Error as _;
///
/// use parlance_ports::{ErrorKind, PortError};
///
/// let cause = std::io::Error::other("connection reset");
/// let err = PortError::unavailable("database unreachable").with_source(cause);
/// assert_eq!(err.to_string(), "unavailable: database unreachable");
/// assert_eq!(err.source().map(ToString::to_string).as_deref(), Some("connection reset"));
///
/// let what_to_do = match err.kind {
///     ErrorKind::Conflict => "reload and decide again",
///     ErrorKind::Unavailable => "retry later",
///     ErrorKind::NotFound | ErrorKind::Invalid => "answer the caller",
///     _ => "log it",
/// };
/// assert_eq!(what_to_do, "retry later");
/// assert!(PortError::conflict("version 3 is gone").is_conflict());
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct PortError {
    /// The classification.
    pub kind: ErrorKind,
    /// What went wrong, lowercase, no trailing period.
    pub message: String,
    /// The underlying error, if any.
    pub source: Option<Box<dyn StdError + Send + Sync + 'static>>,
}

/// Shorthand for port results.
pub type PortResult<T> = Result<T, PortError>;

impl PortError {
    /// A new error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// Attaches the underlying cause.
    pub fn with_source(mut self, source: impl StdError + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// A lost compare-and-swap or uniqueness violation.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Conflict, message)
    }

    /// A missing record.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    /// An unreachable backend.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, message)
    }

    /// A request that can never succeed as given.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Invalid, message)
    }

    /// Anything else.
    pub fn other(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Other, message)
    }

    /// True for [`ErrorKind::Conflict`].
    pub fn is_conflict(&self) -> bool {
        self.kind == ErrorKind::Conflict
    }

    /// True for [`ErrorKind::NotFound`].
    pub fn is_not_found(&self) -> bool {
        self.kind == ErrorKind::NotFound
    }
}

impl From<parlance_core::queue::InvalidTask> for PortError {
    fn from(e: parlance_core::queue::InvalidTask) -> Self {
        PortError::invalid(e.0)
    }
}

impl fmt::Display for PortError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.as_str(), self.message)
    }
}

impl StdError for PortError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_does_not_repeat_the_source() {
        let io = std::io::Error::other("socket closed");
        let e = PortError::unavailable("database unreachable").with_source(io);
        assert_eq!(e.to_string(), "unavailable: database unreachable");
        assert_eq!(e.source().unwrap().to_string(), "socket closed");
        assert!(!e.is_conflict());
    }
}
