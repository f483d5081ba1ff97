//! The operator console: a single page served at `/console`, its script and
//! style sheet embedded in the binary.
//!
//! The pages hold no data and are served without a key. Everything they
//! show comes from the `/v1` API, called from the browser with the key the
//! operator signs in with, so the API's own key checks and product scoping
//! apply. Every answer here carries a strict content security policy: the
//! page loads nothing but its own files and talks to nothing but this
//! service.

use std::sync::LazyLock;

use axum::Router;
use axum::extract::{Path, Request};
use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, ETAG, HeaderName, IF_NONE_MATCH,
    REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS,
};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sha2::{Digest, Sha256};

use crate::http::ApiError;

/// The policy every console answer carries.
pub const CONTENT_SECURITY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; \
     form-action 'none'";

/// One embedded file with its type and entity tag.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
    etag: HeaderValue,
}

impl Asset {
    fn new(name: &'static str, content_type: &'static str, body: &'static [u8]) -> Self {
        let digest = Sha256::digest(body);
        let tag = format!("\"{}\"", hex::encode(&digest[..16]));
        Self {
            name,
            content_type,
            body,
            etag: HeaderValue::from_str(&tag).expect("hex is a valid header value"),
        }
    }

    /// The file, or 304 when the client's copy has the same tag.
    fn answer(&self, headers: &HeaderMap) -> Response {
        let cached = headers
            .get_all(IF_NONE_MATCH)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .any(|t| t == "*" || t.strip_prefix("W/").unwrap_or(t) == self.etag);
        let head = [
            (ETAG, self.etag.clone()),
            (CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ];
        if cached {
            return (StatusCode::NOT_MODIFIED, head).into_response();
        }
        (
            head,
            [(CONTENT_TYPE, HeaderValue::from_static(self.content_type))],
            self.body,
        )
            .into_response()
    }
}

/// The page every console path answers.
static INDEX: LazyLock<Asset> = LazyLock::new(|| {
    Asset::new(
        "index.html",
        "text/html; charset=utf-8",
        include_bytes!("assets/index.html"),
    )
});

/// The files under `/console/assets/`.
static ASSETS: LazyLock<[Asset; 2]> = LazyLock::new(|| {
    [
        Asset::new(
            "console.js",
            "text/javascript; charset=utf-8",
            include_bytes!("assets/console.js"),
        ),
        Asset::new(
            "console.css",
            "text/css; charset=utf-8",
            include_bytes!("assets/console.css"),
        ),
    ]
});

/// The console's routes: the page at `/console` and every path below it
/// (the page routes on the client), the embedded files at
/// `/console/assets/{file}`. None needs a key.
pub fn router() -> Router {
    Router::new()
        .route("/console", get(index))
        .route("/console/", get(index))
        .route("/console/{*path}", get(index))
        .route("/console/assets/{file}", get(asset))
        .layer(middleware::from_fn(secure))
}

async fn index(headers: HeaderMap) -> Response {
    INDEX.answer(&headers)
}

async fn asset(Path(file): Path<String>, headers: HeaderMap) -> Response {
    match ASSETS.iter().find(|a| a.name == file) {
        Some(a) => a.answer(&headers),
        None => ApiError::not_found(format!("no console asset {file}")).into_response(),
    }
}

/// Adds the security headers to every console answer, errors included.
async fn secure(req: Request, next: Next) -> Response {
    let mut res = next.run(req).await;
    let headers = res.headers_mut();
    let set: [(HeaderName, &'static str); 3] = [
        (CONTENT_SECURITY_POLICY, CONTENT_SECURITY),
        (REFERRER_POLICY, "no-referrer"),
        (X_CONTENT_TYPE_OPTIONS, "nosniff"),
    ];
    for (name, value) in set {
        headers.insert(name, HeaderValue::from_static(value));
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_differ_per_file_and_are_quoted() {
        let tags: Vec<_> = ASSETS.iter().map(|a| a.etag.clone()).collect();
        assert_ne!(tags[0], tags[1]);
        assert_ne!(tags[0], INDEX.etag);
        assert!(tags[0].to_str().unwrap().starts_with('"'));
    }

    #[test]
    fn a_matching_tag_answers_not_modified() {
        let a = &ASSETS[0];
        let mut headers = HeaderMap::new();
        headers.insert(IF_NONE_MATCH, HeaderValue::from_static("\"other\""));
        assert_eq!(a.answer(&headers).status(), StatusCode::OK);
        headers.insert(IF_NONE_MATCH, a.etag.clone());
        assert_eq!(a.answer(&headers).status(), StatusCode::NOT_MODIFIED);
    }
}
