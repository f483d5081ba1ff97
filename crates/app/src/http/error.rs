//! `ApiError`: every failure a handler returns, as `application/problem+json`.
//!
//! Each meaning has one problem type and one status, whatever the machine:
//! a machine's refusal is mapped by its [`ErrorClass`], a service error by
//! its variant, a port error by its [`ErrorKind`]. `docs/api.md` lists them.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use parlance_core::{ErrorClass, Machine, MachineError};
use parlance_ports::{ErrorKind, PortError};
use serde_json::{Map, Value, json};

use crate::execute::ServiceError;

/// Seconds a client is asked to wait before retrying a 503.
pub(crate) const RETRY_AFTER_SECS: u32 = 1;

/// An error answer (RFC 9457 problem details).
///
/// 4xx answers carry a detail meant for the caller and are not logged as
/// errors; 5xx answers carry a generic detail and their cause is logged once,
/// here.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    /// Short, stable problem kind, e.g. `invalid-transition`.
    kind: &'static str,
    detail: String,
    /// Members beside the standard ones, in the order added (a later one
    /// replaces an earlier one of the same name). A list, not a map, keeps
    /// the error small enough to return by value.
    extra: Vec<(String, Value)>,
    retry_after: Option<u32>,
}

impl ApiError {
    /// An error with `status`, problem `kind` and `detail`.
    pub fn new(status: StatusCode, kind: &'static str, detail: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            detail: detail.into(),
            extra: Vec::new(),
            retry_after: None,
        }
    }

    /// Asks the client to retry after `secs` seconds (`Retry-After`).
    #[must_use]
    pub fn retry_after(mut self, secs: u32) -> Self {
        self.retry_after = Some(secs);
        self
    }

    /// A machine's refusal: 409 `not-allowed` (with the state, the command
    /// and the reason) when the state does not allow the command, 422
    /// `invalid-request` (with the field) for an unusable value, 422
    /// `limit-exceeded` past a size or work limit, 500 for a broken record
    /// or definition.
    pub fn refused<E: MachineError>(error: &E) -> Self {
        let detail = error.to_string();
        match error.class() {
            ErrorClass::NotAllowed => {
                let mut e = Self::new(StatusCode::CONFLICT, "not-allowed", detail);
                if let Some(na) = error.not_allowed() {
                    e = e
                        .with("state", na.state.as_ref())
                        .with("command", na.command.as_ref());
                    if let Some(reason) = na.reason {
                        e = e.with("reason", reason);
                    }
                }
                e
            }
            ErrorClass::Invalid => {
                let e = Self::unprocessable(detail);
                match error.field() {
                    Some(field) => e.with("field", field),
                    None => e,
                }
            }
            ErrorClass::LimitExceeded => Self::limit_exceeded(detail),
            ErrorClass::Internal => Self::internal(error),
            // A class this shell does not know yet: answered as a broken
            // record, logged, never as the caller's doing.
            _ => Self::internal(error),
        }
    }

    /// 422 `limit-exceeded`: a request past a size or work limit.
    pub fn limit_exceeded(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "limit-exceeded", detail)
    }

    /// 503 `contended`: every attempt lost its race to other writers.
    pub fn contended(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "contended", detail)
            .retry_after(RETRY_AFTER_SECS)
    }

    /// Adds a member to the problem body (e.g. the current state on a 409).
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.extra.push((key.to_owned(), value.into()));
        self
    }

    /// 400: the request cannot be read.
    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad-request", detail)
    }

    /// 401: no key or an unknown key.
    pub fn unauthorized(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", detail)
    }

    /// 404: no such record (for this product) or route.
    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not-found", detail)
    }

    /// 409: the command does not fit the current state.
    pub fn conflict(kind: &'static str, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, kind, detail)
    }

    /// 413: the body is over the limit.
    pub fn payload_too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload-too-large",
            format!("request body exceeds {limit} bytes"),
        )
    }

    /// 415: the body is not JSON.
    pub fn unsupported_media_type(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported-media-type",
            detail,
        )
    }

    /// 422: well-formed, but not a valid request.
    pub fn unprocessable(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid-request", detail)
    }

    /// 429 `rate-limited`: the key is over its request rate; it may make
    /// its next request after `wait`, sent as `Retry-After` in whole seconds
    /// (rounded up, at least 1).
    pub fn rate_limited(wait: std::time::Duration) -> Self {
        let secs = u32::try_from(wait.as_secs() + u64::from(wait.subsec_nanos() > 0))
            .unwrap_or(u32::MAX)
            .max(1);
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate-limited",
            format!("this API key is over its request rate; retry in {secs} s"),
        )
        .with("retry_after_secs", secs)
        .retry_after(secs)
    }

    /// 503 `unavailable`: a dependency is down; retry.
    pub fn unavailable(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", detail)
            .retry_after(RETRY_AFTER_SECS)
    }

    /// 500, logging `cause` once; the body says nothing about it.
    pub fn internal(cause: &(dyn std::error::Error + 'static)) -> Self {
        tracing::error!(error = %cause, source = ?cause.source(), "internal error");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error; see the server log",
        )
    }

    /// The status code.
    pub fn status(&self) -> StatusCode {
        self.status
    }
}

impl From<PortError> for ApiError {
    fn from(e: PortError) -> Self {
        match e.kind {
            ErrorKind::Conflict => Self::conflict("conflict", e.message),
            ErrorKind::NotFound => Self::not_found(e.message),
            ErrorKind::Invalid => Self::unprocessable(e.message),
            ErrorKind::Unavailable => {
                tracing::warn!(error = %e, source = ?std::error::Error::source(&e), "backend unavailable");
                Self::unavailable("a backend is unavailable; retry later")
            }
            _ => Self::internal(&e),
        }
    }
}

impl<M: Machine> From<ServiceError<M>> for ApiError {
    fn from(e: ServiceError<M>) -> Self {
        match e {
            ServiceError::Refused { error, .. } => Self::refused(&error),
            ServiceError::NotFound => Self::not_found(format!("no such {}", M::KIND)),
            ServiceError::Contended { attempts } => {
                tracing::warn!(machine = %M::KIND, attempts, "commits kept conflicting");
                Self::contended(format!(
                    "the {} changed too often concurrently; retry",
                    M::KIND
                ))
            }
            ServiceError::Planning(cause) => {
                tracing::warn!(machine = %M::KIND, error = %cause, "a step before the decision failed");
                Self::unavailable(format!("{cause}; nothing was changed, retry later"))
            }
            ServiceError::Port(p) => p.into(),
        }
    }
}

impl ApiError {
    /// The problem document this error answers with (the body of its
    /// response; also what a server-sent `error` event carries).
    pub fn problem(&self) -> Value {
        let mut body = Map::new();
        body.insert(
            "type".into(),
            json!(format!("urn:parlance:problem:{}", self.kind)),
        );
        body.insert(
            "title".into(),
            json!(self.status.canonical_reason().unwrap_or("error")),
        );
        body.insert("status".into(), json!(self.status.as_u16()));
        body.insert("detail".into(), json!(self.detail));
        body.extend(self.extra.iter().cloned());
        Value::Object(body)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut res = (self.status, Json(self.problem())).into_response();
        res.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(secs) = self.retry_after {
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        res
    }
}
