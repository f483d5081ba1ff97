//! The layers every answer passes, outermost first: the request id, the
//! request span with its access line, and CORS when it is configured. The
//! per-key rate limit under `/v1` is set up here too ([`Edge`]), and lives
//! in `rate_limit`.
//!
//! A request keeps the `x-request-id` it came with when that is usable
//! ([`usable_request_id`]); otherwise it gets a fresh UUID. Either way the
//! id is sent back on the answer, errors and 404s included, and is a field
//! of the `request` span that every log line of the request is written in.
//! The span also holds the method, the matched route template (none for a
//! path no route matches) and, once the key is checked, the product; the
//! access line (`served`, at `info`) adds the status and the latency. No
//! header and no body is ever logged.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::MatchedPath;
use axum::http::{HeaderName, HeaderValue, Method, Request, Response, header};
use tower::util::{MapRequestLayer, MapResponseLayer};
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::request_id::{
    MakeRequestUuid, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tower_http::trace::TraceLayer;
use tracing::Span;

use super::rate_limit::{KeyLimiter, RateLimit};

/// The request id header, read from requests and set on every answer.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Longest `x-request-id` kept from a request, in bytes.
pub const MAX_REQUEST_ID_BYTES: usize = 128;

/// Whether a request id sent by a client is kept: 1 to
/// [`MAX_REQUEST_ID_BYTES`] bytes of ASCII letters, digits and `-_.:+/=`
/// (UUIDs, ULIDs, hex and base64 ids fit). Anything else is replaced, so an
/// id is always one plain token in a log line.
pub fn usable_request_id(id: &[u8]) -> bool {
    (1..=MAX_REQUEST_ID_BYTES).contains(&id.len())
        && id
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:+/=".contains(b))
}

/// Removes the request's `x-request-id` unless it is exactly one usable
/// value, so that the next layer generates one.
fn drop_unusable_request_id(mut req: Request<Body>) -> Request<Body> {
    let ids = req.headers().get_all(&REQUEST_ID);
    let mut values = ids.iter();
    let keep = matches!(
        (values.next(), values.next()),
        (Some(id), None) if usable_request_id(id.as_bytes())
    );
    if !keep {
        req.headers_mut().remove(&REQUEST_ID);
    }
    req
}

/// The span every log line of a request is written in.
fn request_span(req: &Request<Body>) -> Span {
    let id = req
        .extensions()
        .get::<RequestId>()
        .and_then(|id| id.header_value().to_str().ok())
        .unwrap_or("-");
    // These layers run after routing, so the matched route is known.
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(MatchedPath::as_str);
    tracing::info_span!(
        "request",
        request_id = %id,
        method = %req.method(),
        route = route.map(tracing::field::display),
        product = tracing::field::Empty,
    )
}

/// Records the product on the request span once the key is checked. Only
/// middleware without spans of its own runs between the request span and
/// the key check, so the current span is the request's.
pub(crate) fn record_product(product: &parlance_core::ProductId) {
    Span::current().record("product", tracing::field::display(product.as_str()));
}

/// The access line: one per request, when its answer's head is ready.
fn access_line(res: &Response<Body>, latency: Duration, _span: &Span) {
    let latency_ms = latency.as_micros() as f64 / 1000.0;
    tracing::info!(status = res.status().as_u16(), latency_ms, "served");
}

/// Which browser origins may call the API, with which methods and headers
/// (from the `[cors]` settings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorsPolicy {
    /// The allowed origins; `None` allows any.
    pub origins: Option<Vec<HeaderValue>>,
    /// Methods a page may use.
    pub methods: Vec<Method>,
    /// Request headers a page may send.
    pub headers: Vec<HeaderName>,
    /// How long a browser may cache a preflight answer.
    pub max_age: Duration,
}

impl CorsPolicy {
    fn layer(&self) -> CorsLayer {
        let origins = match &self.origins {
            None => AllowOrigin::any(),
            Some(list) => AllowOrigin::list(list.iter().cloned()),
        };
        CorsLayer::new()
            .allow_origin(origins)
            .allow_methods(self.methods.clone())
            .allow_headers(self.headers.clone())
            .expose_headers([REQUEST_ID, header::RETRY_AFTER])
            .max_age(self.max_age)
    }
}

/// Checks an allowed origin as browsers send it: `http` or `https`, a
/// host, an optional port, and nothing after (no path, no trailing slash).
///
/// # Errors
///
/// What is wrong with it.
pub fn parse_origin(origin: &str) -> Result<HeaderValue, &'static str> {
    let rest = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"))
        .ok_or("an origin starts with http:// or https://")?;
    if rest.is_empty() || rest.contains(['/', '?', '#', '@', ' ']) || rest.ends_with(':') {
        return Err("an origin is scheme://host[:port] with no path");
    }
    HeaderValue::from_str(origin).map_err(|_| "an origin is plain ASCII")
}

/// A preflight from an origin that is not allowed is still answered by
/// the CORS layer (no route takes `OPTIONS`), without
/// `access-control-allow-origin`; this also takes off the methods and
/// headers it lists, so such an answer carries no allowance at all.
/// tower-http's `CorsLayer` has no setting for it.
fn strip_allowances_without_origin(mut res: Response<Body>) -> Response<Body> {
    let headers = res.headers_mut();
    if !headers.contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN) {
        for name in [
            header::ACCESS_CONTROL_ALLOW_METHODS,
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            header::ACCESS_CONTROL_MAX_AGE,
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
        ] {
            headers.remove(name);
        }
    }
    res
}

/// What the router does around its routes: CORS and the per-key rate limit,
/// both off by default. Request ids and the access log are always on.
#[derive(Clone, Default)]
pub struct Edge {
    cors: Option<CorsPolicy>,
    limiter: Option<Arc<KeyLimiter>>,
}

impl std::fmt::Debug for Edge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Edge")
            .field("cors", &self.cors)
            .field("rate_limit", &self.limiter.as_ref().map(|l| l.limit()))
            .finish()
    }
}

impl Edge {
    /// Answers CORS requests by `policy` (off when `None`).
    #[must_use]
    pub fn with_cors(mut self, policy: Option<CorsPolicy>) -> Self {
        self.cors = policy;
        self
    }

    /// Limits each key's requests under `/v1` (off when `None`). The limiter
    /// is made here, so every router built from one state shares it.
    #[must_use]
    pub fn with_rate_limit(mut self, limit: Option<RateLimit>) -> Self {
        self.limiter = limit.map(|l| Arc::new(KeyLimiter::new(l)));
        self
    }

    /// Adds the rate limit to `v1`'s routes; the key check must be layered
    /// around it (it limits the key the check found).
    pub(crate) fn limit_keys(&self, v1: Router) -> Router {
        match &self.limiter {
            Some(limiter) => v1.layer(axum::middleware::from_fn_with_state(
                limiter.clone(),
                super::rate_limit::limit,
            )),
            None => v1,
        }
    }

    /// Wraps every route of `app` (add routes before calling this) in
    /// CORS, the request span and access line, and the request id.
    pub(crate) fn wrap(&self, app: Router) -> Router {
        let app = match &self.cors {
            Some(policy) => app
                .layer(policy.layer())
                .layer(MapResponseLayer::new(strip_allowances_without_origin)),
            None => app,
        };
        app.layer(
            TraceLayer::new_for_http()
                .make_span_with(request_span)
                .on_request(())
                .on_response(access_line)
                // A 5xx is logged once where it is handled; its access line
                // has the status.
                .on_failure(()),
        )
        .layer(PropagateRequestIdLayer::new(REQUEST_ID))
        .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
        .layer(MapRequestLayer::new(drop_unusable_request_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_plain_tokens_of_bounded_length() {
        for ok in [
            "0b6f8a4e-5a8f-4c56-9d55-3f2b1c0e9a77",
            "01HZX3J5K7",
            "a",
            "trace.1:span_2+x/y=",
        ] {
            assert!(usable_request_id(ok.as_bytes()), "{ok}");
        }
        let long = "x".repeat(MAX_REQUEST_ID_BYTES + 1);
        for bad in [
            "",
            "two words",
            "a\"b",
            "new\nline",
            "é",
            "a;b",
            long.as_str(),
        ] {
            assert!(!usable_request_id(bad.as_bytes()), "{bad:?}");
        }
        assert!(usable_request_id(
            "x".repeat(MAX_REQUEST_ID_BYTES).as_bytes()
        ));
    }

    #[test]
    fn origins_are_scheme_host_and_port_only() {
        for ok in [
            "https://app.example.com",
            "http://localhost:3000",
            "http://127.0.0.1:8080",
        ] {
            assert!(parse_origin(ok).is_ok(), "{ok}");
        }
        for bad in [
            "app.example.com",
            "https://app.example.com/",
            "https://app.example.com/path",
            "ftp://x",
            "https://",
            "http://host:",
        ] {
            assert!(parse_origin(bad).is_err(), "{bad}");
        }
    }
}
