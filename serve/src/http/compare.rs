//! `GET /api/v1/compare`: one tool's calls by two versions side by side ([`toolspan_query::compare`]).

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use chrono::Utc;

use super::error::ApiError;
use super::search::parse_time;
use super::AppState;
use toolspan_query::compare::{compare, CompareRequest, Comparison};

/// The query parameters.
#[derive(Debug, Default, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompareParams {
    /// The tool (required).
    pub tool: Option<String>,
    /// `service.version` before the change (required).
    pub before: Option<String>,
    /// `service.version` after the change (required).
    pub after: Option<String>,
    /// Only calls made by this `service.name`.
    pub service: Option<String>,
    /// Lower time bound: relative (`15m`, `1h`, `7d`) or absolute (RFC 3339, `YYYY-MM-DD`).
    pub since: Option<String>,
    /// Upper time bound, same forms as `since`.
    pub until: Option<String>,
}

/// Runs a comparison.
pub async fn get_compare(
    State(state): State<Arc<AppState>>,
    params: Result<Query<CompareParams>, QueryRejection>,
) -> Result<axum::Json<Comparison>, ApiError> {
    let Query(p) = params.map_err(|e| {
        ApiError::new(
            toolspan_schema::Code::InvalidArgument,
            "invalid compare parameters: the parameters are tool, before, after (required), \
             service, since and until",
            e,
        )
    })?;
    let required = |name: &str, v: Option<String>| {
        v.ok_or_else(|| ApiError::invalid_argument(format!("`{name}` is required")))
    };
    let now = Utc::now();
    let req = CompareRequest {
        tool: required("tool", p.tool)?,
        before: required("before", p.before)?,
        after: required("after", p.after)?,
        service: p.service,
        since: p
            .since
            .as_deref()
            .map(|v| parse_time("since", v, now))
            .transpose()?,
        until: p
            .until
            .as_deref()
            .map(|v| parse_time("until", v, now))
            .transpose()?,
    };
    Ok(axum::Json(compare(state.service.as_ref(), &req).await?))
}
