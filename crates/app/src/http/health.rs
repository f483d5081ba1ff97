//! Liveness and readiness probes (no authentication).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::state::Backend;

/// 200 while the process serves requests.
pub(crate) async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// 200 when the backend answers, 503 otherwise; names the backend.
pub(crate) async fn readyz(State(backend): State<Backend>) -> (StatusCode, Json<Value>) {
    let database = backend.name();
    match backend.check().await {
        Ok(()) => (
            StatusCode::OK,
            Json(json!({"status": "ready", "database": database})),
        ),
        Err(e) => {
            tracing::warn!(error = %e, "readiness check failed");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({"status": "unready", "database": database, "error": e.to_string()})),
            )
        }
    }
}
