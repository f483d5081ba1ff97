//! `ApiJson`: a JSON body extractor whose rejections are problem+json.

use axum::body::{Body, Bytes};
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use parlance_core::storable;

use super::ApiError;

/// Like `axum::Json`, but a bad body answers with an [`ApiError`]: 413 over
/// the size limit, 415 without a JSON content type, 400 for malformed JSON,
/// 422 for JSON of the wrong shape (the detail names the field), and 422
/// `invalid-request` with `field` for a value no adapter can store (text
/// holding NUL, an integer outside `i64`; see
/// [`parlance_core::storable`]), whether or not the route reads that field.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiJson<T>(pub T);

impl<T, S> FromRequest<S> for ApiJson<T>
where
    axum::Json<T>: FromRequest<S, Rejection = JsonRejection>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let (parts, body) = req.into_parts();
        let bytes = Bytes::from_request(Request::from_parts(parts.clone(), body), state)
            .await
            .map_err(|rejection| {
                if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::new(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "payload-too-large",
                        rejection.body_text(),
                    )
                } else {
                    ApiError::bad_request(rejection.body_text())
                }
            })?;
        let req = Request::from_parts(parts, Body::from(bytes.clone()));
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => {
                // The body parsed as `T`, so it is valid JSON.
                let raw: serde_json::Value = serde_json::from_slice(&bytes)
                    .map_err(|e| ApiError::bad_request(e.to_string()))?;
                storable::check_json(&raw)?;
                Ok(ApiJson(v))
            }
            Err(rejection) => Err(match rejection {
                JsonRejection::JsonDataError(e) => ApiError::unprocessable(e.body_text()),
                JsonRejection::JsonSyntaxError(e) => ApiError::bad_request(e.body_text()),
                JsonRejection::MissingJsonContentType(_) => ApiError::unsupported_media_type(
                    "expected a body with content type application/json",
                ),
                other if other.status() == StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "payload-too-large",
                    other.body_text(),
                ),
                other => ApiError::bad_request(other.body_text()),
            }),
        }
    }
}

impl<T: serde::Serialize> IntoResponse for ApiJson<T> {
    fn into_response(self) -> Response {
        axum::Json(self.0).into_response()
    }
}
