//! The `http` invoker: posts the rendered template to a configured URL and
//! returns the response body.
//!
//! The body is the rendered text as is, sent with the folder's
//! `content_type` (`text/plain; charset=utf-8` unless configured); with a
//! JSON content type (`application/json`, `*/*+json`) the render must parse
//! as JSON or the task fails at once. A 2xx answer's body (UTF-8) is the
//! result. 408, 429, 5xx, connection failures and timeouts fail the attempt
//! so the queue retries it; any other status (a 4xx, a redirect, which is
//! never followed) fails the task at once, since sending the same request
//! again cannot help. Error messages name the status, never the URL or the
//! body, since they reach the session's error list.

use std::time::Duration;

use async_trait::async_trait;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use reqwest::{Method, StatusCode, Url};

use super::invoker::{InvokeError, Invoker};

/// Where and how an `http` invoker sends.
#[derive(Debug, Clone)]
pub(super) struct HttpTarget {
    /// The endpoint.
    pub(super) url: Url,
    /// `POST`, `PUT` or `PATCH`.
    pub(super) method: Method,
    /// Sent with every request; values read from the environment are
    /// marked sensitive.
    pub(super) headers: HeaderMap,
    /// The body's content type.
    pub(super) content_type: HeaderValue,
    /// Limit on one call, connection included.
    pub(super) timeout: Duration,
}

/// Posts rendered text; one connection pool per configuration.
#[derive(Debug)]
pub(super) struct HttpInvoker {
    client: reqwest::Client,
    target: HttpTarget,
    json_body: bool,
}

impl HttpInvoker {
    /// The invoker for `target`, its client built once.
    pub(super) fn new(target: HttpTarget) -> Result<Self, String> {
        let client = reqwest::Client::builder()
            .timeout(target.timeout)
            .connect_timeout(target.timeout.min(Duration::from_secs(10)))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("cannot build the http client: {e}"))?;
        let json_body = is_json(&target.content_type);
        Ok(Self {
            client,
            target,
            json_body,
        })
    }
}

/// Whether `content_type` is JSON (`application/json`, `*/*+json`).
fn is_json(content_type: &HeaderValue) -> bool {
    let essence = content_type
        .to_str()
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json" || essence.ends_with("+json")
}

/// Whether a non-2xx `status` is worth another attempt.
fn retryable(status: StatusCode) -> bool {
    status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
}

/// A reqwest error without its URL (it may carry a token in its query),
/// with its causes.
fn describe(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    msg
}

#[async_trait]
impl Invoker for HttpInvoker {
    async fn invoke(&self, rendered: &str) -> Result<String, String> {
        self.call(rendered).await.map_err(|e| e.message)
    }

    async fn call(&self, rendered: &str) -> Result<String, InvokeError> {
        if self.json_body
            && let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(rendered)
        {
            return Err(InvokeError::permanent(format!(
                "the rendered body is not JSON: {e}"
            )));
        }
        let res = self
            .client
            .request(self.target.method.clone(), self.target.url.clone())
            .headers(self.target.headers.clone())
            .header(CONTENT_TYPE, self.target.content_type.clone())
            .body(rendered.to_owned())
            .send()
            .await
            .map_err(|e| {
                let timed_out = e.is_timeout();
                let what = describe(e);
                InvokeError::retryable(if timed_out {
                    format!("http endpoint timed out: {what}")
                } else {
                    format!("http endpoint unreachable: {what}")
                })
            })?;
        let status = res.status();
        if !status.is_success() {
            let message = format!("http endpoint answered {status}");
            return Err(if retryable(status) {
                InvokeError::retryable(message)
            } else {
                InvokeError::permanent(message)
            });
        }
        let bytes = res.bytes().await.map_err(|e| {
            InvokeError::retryable(format!("http endpoint's answer broke off: {}", describe(e)))
        })?;
        String::from_utf8(bytes.to_vec()).map_err(|_| {
            InvokeError::permanent("http endpoint answered with a body that is not UTF-8")
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use axum::Router;
    use axum::http::HeaderMap as AxumHeaders;
    use axum::routing::post;

    use super::*;

    /// A server answering each POST with the next status of `script` (the
    /// last one repeats), recording the bodies and content types.
    async fn server(script: Vec<u16>) -> (Url, Arc<Mutex<Vec<(String, String)>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let app = Router::new().route(
            "/hook",
            post(move |headers: AxumHeaders, body: String| {
                let record = record.clone();
                let script = script.clone();
                async move {
                    let mut seen = record.lock().unwrap();
                    let ctype = headers
                        .get("content-type")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned();
                    seen.push((ctype, body.clone()));
                    let status = script[(seen.len() - 1).min(script.len() - 1)];
                    (
                        axum::http::StatusCode::from_u16(status).unwrap(),
                        format!("got {body}"),
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (format!("http://{addr}/hook").parse().unwrap(), seen)
    }

    fn target(url: Url, content_type: &'static str) -> HttpTarget {
        HttpTarget {
            url,
            method: Method::POST,
            headers: HeaderMap::new(),
            content_type: HeaderValue::from_static(content_type),
            timeout: Duration::from_secs(5),
        }
    }

    #[tokio::test]
    async fn posts_the_render_and_returns_the_body() {
        let (url, seen) = server(vec![200]).await;
        let invoker = HttpInvoker::new(target(url, "text/plain; charset=utf-8")).unwrap();
        assert_eq!(invoker.call("hello").await.unwrap(), "got hello");
        assert_eq!(
            *seen.lock().unwrap(),
            [("text/plain; charset=utf-8".to_owned(), "hello".to_owned())]
        );
    }

    #[tokio::test]
    async fn server_errors_are_retried_other_refusals_are_final() {
        for (status, retry) in [(500, true), (503, true), (429, true), (408, true)] {
            let (url, _) = server(vec![status]).await;
            let e = HttpInvoker::new(target(url, "text/plain"))
                .unwrap()
                .call("x")
                .await
                .unwrap_err();
            assert_eq!(e.retryable, retry, "{status}: {e}");
            assert!(e.message.contains(&status.to_string()), "{e}");
            assert!(!e.message.contains("127.0.0.1"), "{e}");
        }
        for status in [400, 401, 404, 422, 302] {
            let (url, _) = server(vec![status]).await;
            let e = HttpInvoker::new(target(url, "text/plain"))
                .unwrap()
                .call("x")
                .await
                .unwrap_err();
            assert!(!e.retryable, "{status}: {e}");
        }
    }

    #[tokio::test]
    async fn an_unreachable_endpoint_is_retried_without_naming_it() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url: Url = format!(
            "http://{}/hook?token=s3cret",
            listener.local_addr().unwrap()
        )
        .parse()
        .unwrap();
        drop(listener);
        let e = HttpInvoker::new(target(url, "text/plain"))
            .unwrap()
            .call("x")
            .await
            .unwrap_err();
        assert!(e.retryable, "{e}");
        assert!(e.message.starts_with("http endpoint unreachable"), "{e}");
        assert!(!e.message.contains("s3cret"), "{e}");
    }

    #[tokio::test]
    async fn a_json_content_type_needs_a_json_render() {
        let (url, seen) = server(vec![200]).await;
        let invoker = HttpInvoker::new(target(url, "application/json")).unwrap();
        let e = invoker.call("not json").await.unwrap_err();
        assert!(!e.retryable);
        assert!(seen.lock().unwrap().is_empty(), "nothing was sent");
        assert_eq!(invoker.call("{\"a\": 1}").await.unwrap(), "got {\"a\": 1}");
        assert!(is_json(&HeaderValue::from_static(
            "application/vnd.api+json; charset=utf-8"
        )));
        assert!(!is_json(&HeaderValue::from_static("text/plain")));
    }
}
