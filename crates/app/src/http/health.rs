//! Liveness and readiness probes (no authentication).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Serialize;
use utoipa::ToSchema;

use crate::state::Backend;

/// The liveness answer.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Health {
    /// Always `ok`.
    #[schema(example = "ok")]
    status: &'static str,
}

/// The readiness answer.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Readiness {
    /// `ready` or `unready`.
    #[schema(example = "ready")]
    status: &'static str,
    /// The backend: `memory` or `postgres`.
    #[schema(example = "postgres")]
    database: &'static str,
    /// Why the backend did not answer (only when unready).
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// 200 while the process serves requests.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "service",
    security(()),
    responses((status = 200, description = "The process serves requests.", body = Health)),
)]
pub(crate) async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// 200 when the backend answers, 503 otherwise; names the backend.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "service",
    security(()),
    responses(
        (status = 200, description = "The backend answers.", body = Readiness),
        (status = 503, description = "The backend does not answer.", body = Readiness),
    ),
)]
pub(crate) async fn readyz(State(backend): State<Backend>) -> (StatusCode, Json<Readiness>) {
    let database = backend.name();
    match backend.check().await {
        Ok(()) => (
            StatusCode::OK,
            Json(Readiness {
                status: "ready",
                database,
                error: None,
            }),
        ),
        Err(e) => {
            tracing::warn!(error = %e, "readiness check failed");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(Readiness {
                    status: "unready",
                    database,
                    error: Some(e.to_string()),
                }),
            )
        }
    }
}
