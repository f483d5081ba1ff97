//! The storable-value policy on what a route reads from the URL: every path
//! parameter and every query value is checked before any handler runs.

use axum::extract::rejection::RawPathParamsRejection;
use axum::extract::{Query, RawPathParams, Request};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use parlance_core::storable::{self, Unstorable};

use super::ApiError;

/// 422 `invalid-request` naming the field that cannot be stored.
impl From<Unstorable> for ApiError {
    fn from(e: Unstorable) -> Self {
        let field = e.field.clone();
        ApiError::unprocessable(e.to_string()).with("field", field)
    }
}

/// The first path parameter or query value (or query name) that is not
/// storable text, named by the route's parameter (`session_id`) or the
/// query's name. Values that do not decode are left to the route's own
/// extractors, which refuse them.
pub(crate) fn check_request(
    params: Option<&RawPathParams>,
    req: &Request,
) -> Result<(), Unstorable> {
    for (name, value) in params.into_iter().flat_map(RawPathParams::iter) {
        storable::check_text(name, value)?;
    }
    if let Some(Query(pairs)) = req
        .uri()
        .query()
        .and_then(|_| Query::<Vec<(String, String)>>::try_from_uri(req.uri()).ok())
    {
        for (name, value) in &pairs {
            let field = name.escape_debug().to_string();
            storable::check_text(&field, name)?;
            storable::check_text(&field, value)?;
        }
    }
    Ok(())
}

/// Middleware (a route layer, so the path parameters are known): answers
/// 422 when a path parameter or a query value cannot be stored.
pub(crate) async fn check_params(
    params: Result<RawPathParams, RawPathParamsRejection>,
    req: Request,
    next: Next,
) -> Response {
    match check_request(params.as_ref().ok(), &req) {
        Ok(()) => next.run(req).await,
        Err(e) => ApiError::from(e).into_response(),
    }
}
