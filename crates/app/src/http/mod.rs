//! What every route shares: problem+json errors, the JSON extractor, body
//! limits, the fallbacks and the health probes. It names no feature; the
//! crate root assembles the routers.

mod error;
pub(crate) mod health;
mod json;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};

pub use error::ApiError;
pub use json::ApiJson;

/// The most items (events, actions, features, todos) one request may carry;
/// more answer 422 `limit-exceeded` and change nothing.
pub const MAX_ITEMS_PER_REQUEST: usize = 1_000;

/// 422 `limit-exceeded` (naming the field and the limit) when the list
/// `field` holds more than [`MAX_ITEMS_PER_REQUEST`] items.
///
/// # Errors
///
/// The 422 itself.
pub fn check_items(field: &'static str, len: usize) -> Result<(), ApiError> {
    if len > MAX_ITEMS_PER_REQUEST {
        return Err(ApiError::limit_exceeded(format!(
            "{field} holds {len} items; at most {MAX_ITEMS_PER_REQUEST} per request"
        ))
        .with("field", field)
        .with("max", MAX_ITEMS_PER_REQUEST));
    }
    Ok(())
}

/// Refuses a declared body over the limit before any handler runs; bodies
/// without a length are cut off by the extractors at the same limit.
pub(crate) async fn reject_large_bodies(
    State(limit): State<usize>,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(len) if len > limit as u64 => Err(ApiError::payload_too_large(limit)),
        _ => Ok(next.run(req).await),
    }
}

/// Turns a 4xx answered by an extractor's own rejection (a query string or
/// path segment that does not parse) into problem+json, like every other
/// error answer.
pub(crate) async fn problem_json(req: Request, next: Next) -> Response {
    let res = next.run(req).await;
    let status = res.status();
    let is_problem = res
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/problem+json"));
    if !status.is_client_error() || is_problem {
        return res;
    }
    let detail = match axum::body::to_bytes(res.into_body(), 4096).await {
        Ok(b) if !b.is_empty() => String::from_utf8_lossy(&b).into_owned(),
        _ => status
            .canonical_reason()
            .unwrap_or("bad request")
            .to_owned(),
    };
    let kind = match status.as_u16() {
        400 => "bad-request",
        404 => "not-found",
        405 => "method-not-allowed",
        413 => "payload-too-large",
        415 => "unsupported-media-type",
        422 => "invalid-request",
        _ => "client-error",
    };
    ApiError::new(status, kind, detail).into_response()
}

pub(crate) async fn not_found() -> ApiError {
    ApiError::not_found("no such route")
}

pub(crate) async fn method_not_allowed() -> ApiError {
    ApiError::new(
        axum::http::StatusCode::METHOD_NOT_ALLOWED,
        "method-not-allowed",
        "the route does not take this method",
    )
}
