//! `GET /healthz` (the process answers) and `GET /readyz` (the table can be read).

use std::sync::Arc;

use axum::extract::State;
use serde_json::{json, Value};

use super::error::ApiError;
use super::AppState;

/// Liveness: always ok while the process serves requests.
pub async fn healthz() -> axum::Json<Value> {
    axum::Json(json!({"status": "ok"}))
}

/// Readiness: the Delta log can be read now; reports the table version queries see.
pub async fn readyz(State(state): State<Arc<AppState>>) -> Result<axum::Json<Value>, ApiError> {
    let version = state.service.engine().refresh().await?;
    Ok(axum::Json(json!({
        "status": "ready",
        "table_version": version,
        "queries_running": state.service.running(),
        "query_slots": state.service.limit(),
    })))
}
