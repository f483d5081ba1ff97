//! The answers and the middleware of request budgets
//! ([`crate::budget`]): 504 `deadline-exceeded` when a request's budget runs
//! out.

use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::ApiError;
use crate::budget::{Budgets, Deadline, Family, current, within};

/// The answer when a request's budget ran out: 504 `deadline-exceeded`
/// with the budget and the family.
pub(super) fn exhausted(deadline: &Deadline) -> ApiError {
    let ms = u64::try_from(deadline.budget.as_millis()).unwrap_or(u64::MAX);
    ApiError::new(
        StatusCode::GATEWAY_TIMEOUT,
        "deadline-exceeded",
        format!(
            "the request did not complete within its budget of {ms} ms and was stopped; retry later"
        ),
    )
    .with("budget_ms", ms)
    .with("family", deadline.family.as_str())
}

/// [`exhausted`] for the request being served (a generic 504
/// `deadline-exceeded` outside one).
pub(crate) fn exhausted_now() -> ApiError {
    match current() {
        Some(d) => exhausted(&d),
        None => ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "deadline-exceeded",
            "the request did not complete within its budget and was stopped; retry later",
        ),
    }
}

/// Middleware: gives the request the budget of its family and answers 504
/// `deadline-exceeded` when it runs out.
pub(crate) async fn enforce(State(budgets): State<Budgets>, req: Request, next: Next) -> Response {
    let family = Family::of(req.method(), req.uri().path());
    let deadline = Deadline::new(family, budgets.of(family), Instant::now());
    match within(deadline, next.run(req)).await {
        Some(res) => res,
        None => {
            tracing::warn!(
                family = family.as_str(),
                budget_ms = u64::try_from(deadline.budget.as_millis()).unwrap_or(u64::MAX),
                "request budget exhausted; stopped"
            );
            exhausted(&deadline).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_request_past_its_budget_gets_a_504_problem() {
        use axum::body::Body;
        use axum::routing::post;
        use tower::ServiceExt as _;

        let budgets = Budgets {
            commands: Duration::from_millis(100),
            ..Budgets::default()
        };
        let app = axum::Router::new()
            .route(
                "/slow",
                post(|| async {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    "done"
                }),
            )
            .route(
                "/seen",
                post(|| async {
                    current()
                        .map(|d| d.budget.as_millis().to_string())
                        .unwrap_or_default()
                }),
            )
            .layer(axum::middleware::from_fn_with_state(budgets, enforce));
        let req = |path: &str| axum::http::Request::post(path).body(Body::empty()).unwrap();
        let started = Instant::now();
        let res = app.clone().oneshot(req("/slow")).await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(res.status(), StatusCode::GATEWAY_TIMEOUT);
        let body = axum::body::to_bytes(res.into_body(), 1 << 16)
            .await
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["type"], "urn:parlance:problem:deadline-exceeded");
        assert_eq!(v["budget_ms"], 100);
        assert_eq!(v["family"], "commands");
        let res = app.oneshot(req("/seen")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let body = axum::body::to_bytes(res.into_body(), 1 << 16)
            .await
            .unwrap();
        assert_eq!(&body[..], b"100", "the handler sees its deadline");
    }
}
