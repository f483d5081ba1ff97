//! Entity tags: a strong `ETag` on every JSON answer of an API read, and
//! 304 Not Modified with no body when the request's `If-None-Match` names
//! it, so a client asking again and again (the operator console polls)
//! gets a body only when something changed.

use axum::extract::Request;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, ETAG, IF_NONE_MATCH};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use sha2::{Digest as _, Sha256};

use super::ApiError;

/// What an API read's answer says about caching: a private cache (the
/// browser's) may keep it, and must ask again before using it.
pub(crate) const READ_CACHE_CONTROL: &str = "private, no-cache";

/// The strong tag of `body`: the first 128 bits of its SHA-256, in hex,
/// quoted.
pub(crate) fn tag_of(body: &[u8]) -> HeaderValue {
    let digest = Sha256::digest(body);
    HeaderValue::from_str(&format!("\"{}\"", hex::encode(&digest[..16])))
        .unwrap_or_else(|_| HeaderValue::from_static("\"\""))
}

/// Whether the `If-None-Match` headers of a request name `tag` (or are
/// `*`): then a `GET` is answered 304. Tags are compared weakly, as RFC
/// 9110 says for `If-None-Match`: `W/"x"` names `"x"`.
pub(crate) fn none_match(headers: &HeaderMap, tag: &HeaderValue) -> bool {
    let tag = tag.as_bytes();
    headers
        .get_all(IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .any(|t| t == "*" || t.strip_prefix("W/").unwrap_or(t).as_bytes() == tag)
}

/// Middleware on the API's routes: a `GET` answered 200 with a JSON body
/// gets the body's tag and [`READ_CACHE_CONTROL`], or, when the request's
/// `If-None-Match` names that tag, 304 with the tag and no body. Every other
/// answer (commands, errors, server-sent events) passes as it is.
pub(crate) async fn tag_reads(req: Request, next: Next) -> Response {
    if req.method() != Method::GET {
        return next.run(req).await;
    }
    let mut conditions = HeaderMap::new();
    for value in req.headers().get_all(IF_NONE_MATCH) {
        conditions.append(IF_NONE_MATCH, value.clone());
    }
    let res = next.run(req).await;
    let json = res
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if res.status() != StatusCode::OK || !json || res.headers().contains_key(ETAG) {
        return res;
    }
    let (mut parts, body) = res.into_parts();
    // The body is the JSON a handler serialized: already in memory.
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(bytes) => bytes,
        Err(e) => return ApiError::internal(&e).into_response(),
    };
    let tag = tag_of(&bytes);
    parts
        .headers
        .insert(CACHE_CONTROL, HeaderValue::from_static(READ_CACHE_CONTROL));
    parts.headers.insert(ETAG, tag.clone());
    if none_match(&conditions, &tag) {
        parts.status = StatusCode::NOT_MODIFIED;
        parts.headers.remove(CONTENT_TYPE);
        parts.headers.remove(axum::http::header::CONTENT_LENGTH);
        return Response::from_parts(parts, axum::body::Body::empty());
    }
    Response::from_parts(parts, axum::body::Body::from(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(values: &[&'static str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(IF_NONE_MATCH, HeaderValue::from_static(v));
        }
        headers
    }

    #[test]
    fn a_tag_is_quoted_hex_and_differs_with_the_body() {
        let a = tag_of(b"{\"a\":1}");
        let b = tag_of(b"{\"a\":2}");
        assert_ne!(a, b);
        assert_eq!(a, tag_of(b"{\"a\":1}"));
        let text = a.to_str().unwrap();
        assert_eq!(text.len(), 34);
        assert!(text.starts_with('"') && text.ends_with('"'));
    }

    #[test]
    fn if_none_match_names_a_tag_in_a_list_weakly_or_with_a_star() {
        let tag = tag_of(b"x");
        let quoted = tag.to_str().unwrap().to_owned();
        let weak: &'static str = Box::leak(format!("W/{quoted}").into_boxed_str());
        let listed: &'static str = Box::leak(format!("\"a\", {quoted}").into_boxed_str());
        let exact: &'static str = Box::leak(quoted.into_boxed_str());
        for matching in [
            vec![exact],
            vec![weak],
            vec![listed],
            vec!["\"b\"", exact],
            vec!["*"],
        ] {
            assert!(none_match(&with(&matching), &tag), "{matching:?}");
        }
        for other in [vec![], vec!["\"a\""], vec!["x"], vec!["W/\"a\", \"b\""]] {
            assert!(!none_match(&with(&other), &tag), "{other:?}");
        }
    }
}
