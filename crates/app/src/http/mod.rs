//! The HTTP API: one router, problem+json errors, bearer auth on `/v1`.

mod error;
mod health;
mod json;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse as _, Response};
use axum::routing::get;
use tower_http::trace::TraceLayer;

pub use error::ApiError;
pub use json::ApiJson;

use crate::auth::require_key;
use crate::state::AppState;

/// The most items (events, actions, features, todos) one request may carry;
/// more answer 422 `too-many-items` and change nothing.
pub const MAX_ITEMS_PER_REQUEST: usize = 1_000;

/// 422 `too-many-items` when the list `field` holds more than
/// [`MAX_ITEMS_PER_REQUEST`] items.
///
/// # Errors
///
/// The 422 itself.
pub fn check_items(field: &'static str, len: usize) -> Result<(), ApiError> {
    if len > MAX_ITEMS_PER_REQUEST {
        return Err(ApiError::new(
            axum::http::StatusCode::UNPROCESSABLE_ENTITY,
            "too-many-items",
            format!("{field} holds {len} items; at most {MAX_ITEMS_PER_REQUEST} per request"),
        )
        .with("field", field)
        .with("max", MAX_ITEMS_PER_REQUEST));
    }
    Ok(())
}

/// Routes under `/v1`, before authentication is layered on. Each machine adds
/// its routes here.
fn v1_routes() -> Router<AppState> {
    Router::new()
        .merge(crate::adoption::routes())
        .merge(crate::agent::routes())
        .merge(crate::conversation::routes())
        .merge(crate::flow::routes())
        .merge(crate::session::routes())
}

/// The whole service: health probes open, everything under `/v1` behind a key.
pub fn router(state: AppState) -> Router {
    let v1 = v1_routes()
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), require_key));
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .nest("/v1", v1)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn(problem_json))
        .layer(DefaultBodyLimit::max(state.body_limit))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            reject_large_bodies,
        ))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}

/// Refuses a declared body over the limit before any handler runs; bodies
/// without a length are cut off by the extractors at the same limit.
async fn reject_large_bodies(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(len) if len > state.body_limit as u64 => {
            Err(ApiError::payload_too_large(state.body_limit))
        }
        _ => Ok(next.run(req).await),
    }
}

/// Turns a 4xx answered by an extractor's own rejection (a query string or
/// path segment that does not parse) into problem+json, like every other
/// error answer.
async fn problem_json(req: Request, next: Next) -> Response {
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

async fn not_found() -> ApiError {
    ApiError::not_found("no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        axum::http::StatusCode::METHOD_NOT_ALLOWED,
        "method-not-allowed",
        "the route does not take this method",
    )
}
