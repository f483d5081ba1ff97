//! `ApiError`: every failure a handler returns, as `application/problem+json`.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use parlance_ports::{ErrorKind, PortError};
use serde_json::{Map, Value, json};

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
    extra: Map<String, Value>,
}

impl ApiError {
    /// An error with `status`, problem `kind` and `detail`.
    pub fn new(status: StatusCode, kind: &'static str, detail: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            detail: detail.into(),
            extra: Map::new(),
        }
    }

    /// Adds a member to the problem body (e.g. the current state on a 409).
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.extra.insert(key.to_owned(), value.into());
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

    /// 503: a dependency is down or the request lost too many races.
    pub fn unavailable(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", detail)
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

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
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
        body.extend(self.extra);
        let mut res = (self.status, Json(Value::Object(body))).into_response();
        res.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        res
    }
}
