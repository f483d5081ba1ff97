//! What every route shares: problem+json errors, the JSON extractor, body
//! and head limits, the fallbacks, the health probes, request ids, the
//! access log, CORS and per-key rate limits (`edge`), entity tags on reads
//! (`etag`), the paging of audit trails (`audit`), and the serving loop
//! with its connection limits (`serve`). It names no feature; the crate root
//! assembles the routers.

pub(crate) mod audit;
mod budget;
mod edge;
mod error;
pub(crate) mod etag;
pub(crate) mod health;
mod json;
pub(crate) mod openapi;
mod params;
mod rate_limit;
pub mod serve;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};

pub(crate) use budget::{enforce as enforce_budget, exhausted_now};
pub(crate) use edge::record_product;
pub use edge::{
    CorsPolicy, Edge, MAX_REQUEST_ID_BYTES, REQUEST_ID, parse_origin, usable_request_id,
};
pub use error::ApiError;
pub use json::ApiJson;
pub(crate) use params::check_params;
pub use rate_limit::{KeyId, RateLimit};
pub use serve::{ServeOptions, serve};

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

/// Longest request target (path and query) answered, in bytes; longer ones
/// answer 414 `uri-too-long`.
pub const MAX_URI_BYTES: usize = 8 * 1024;

/// Most bytes of header lines (names, values and separators) in one request;
/// more answer 431 `headers-too-large`.
pub const MAX_HEADER_BYTES: usize = 32 * 1024;

/// Most header lines in one request; more answer 431 `headers-too-large`.
pub const MAX_HEADERS: usize = 100;

/// Refuses a request whose target or headers are over the limits above,
/// before routing, as problem+json. Heads too large for hyper to buffer
/// ([`serve::MAX_HEAD_BYTES`]) never get here: hyper answers them itself.
pub(crate) async fn reject_large_heads(req: Request, next: Next) -> Result<Response, ApiError> {
    let target = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if target > MAX_URI_BYTES {
        return Err(ApiError::new(
            StatusCode::URI_TOO_LONG,
            "uri-too-long",
            format!("the request target is {target} bytes; at most {MAX_URI_BYTES}"),
        )
        .with("max", MAX_URI_BYTES));
    }
    let headers = req.headers();
    let bytes: usize = headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    if headers.len() > MAX_HEADERS || bytes > MAX_HEADER_BYTES {
        return Err(ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers-too-large",
            format!(
                "the request has {} header lines in {bytes} bytes; at most {MAX_HEADERS} lines \
                 in {MAX_HEADER_BYTES} bytes",
                headers.len()
            ),
        ));
    }
    Ok(next.run(req).await)
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
        408 => "request-timeout",
        413 => "payload-too-large",
        414 => "uri-too-long",
        415 => "unsupported-media-type",
        422 => "invalid-request",
        429 => "rate-limited",
        431 => "headers-too-large",
        _ => "client-error",
    };
    ApiError::new(status, kind, detail).into_response()
}

pub(crate) async fn not_found() -> ApiError {
    ApiError::not_found("no such route")
}

pub(crate) async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method-not-allowed",
        "the route does not take this method",
    )
}
