//! `GET /api/v1/calls/{id}/replay[?version=N]`: what a replay of one call needs
//! ([`toolspan_query::replay`]), the document `python -m toolspan replay` fetches.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};

use super::error::ApiError;
use super::AppState;
use toolspan_query::replay::ReplayDocument;

/// The query parameters.
#[derive(Debug, Default, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayParams {
    /// The table version to read (the latest when absent).
    pub version: Option<u64>,
}

/// The replay document of the call `id` names (error reference, call id or
/// `TRACEID:SPANID`).
pub async fn get_replay(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    params: Result<Query<ReplayParams>, QueryRejection>,
) -> Result<axum::Json<ReplayDocument>, ApiError> {
    let Query(p) = params.map_err(|e| {
        ApiError::new(
            toolspan_schema::Code::InvalidArgument,
            "invalid replay parameters: the one parameter is version, a table version (a whole \
             number)",
            e,
        )
    })?;
    let doc = state
        .service
        .run_in_slot("replay document", move |engine| async move {
            toolspan_query::replay::document(&engine, &id, p.version).await
        })
        .await??;
    Ok(axum::Json(doc))
}
