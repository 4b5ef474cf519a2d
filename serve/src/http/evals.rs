//! `GET /api/v1/evals/export?tool=…`: a tool's failures as an evals file ([`toolspan_query::evals`]),
//! the bytes `toolspan evals export` writes; and the viewer's download of the same file,
//! `GET /tools/{tool}/evals.jsonl` (the "Export as eval cases" buttons).

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use toolspan_schema::Code;

use super::error::ApiError;
use super::AppState;
use toolspan_query::evals::{export, ExportRequest, DEFAULT_PER_FINGERPRINT};

/// The query parameters of the API route.
#[derive(Debug, Default, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportParams {
    /// The tool (required).
    pub tool: Option<String>,
    /// Only failures of this error type.
    pub error_type: Option<String>,
    /// Only failures with this error code.
    pub code: Option<String>,
    /// Only calls that started at or after (a duration before the newest call of the tool, a
    /// time or a day).
    pub since: Option<String>,
    /// Cases per fingerprint (default 3).
    pub per_fingerprint: Option<usize>,
    /// The table version to read (the latest when absent).
    pub version: Option<u64>,
}

/// The query parameters of the viewer's download (the tool is in the path).
#[derive(Debug, Default, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DownloadParams {
    /// Only failures of this error type.
    pub error_type: Option<String>,
    /// Only failures with this error code.
    pub code: Option<String>,
    /// Only calls that started at or after.
    pub since: Option<String>,
    /// Cases per fingerprint.
    pub per_fingerprint: Option<usize>,
    /// The table version to read.
    pub version: Option<u64>,
}

const PARAMS: &str = "the parameters are tool (required), error_type, code, since, \
per_fingerprint and version";

/// `GET /api/v1/evals/export`.
pub async fn get_export(
    State(state): State<Arc<AppState>>,
    params: Result<Query<ExportParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(p) = params.map_err(|e| {
        ApiError::new(
            Code::InvalidArgument,
            format!("invalid evals export parameters: {PARAMS}"),
            e,
        )
    })?;
    let Some(tool) = p.tool.filter(|t| !t.is_empty()) else {
        return Err(ApiError::invalid_argument(format!(
            "`tool` is required: {PARAMS}"
        )));
    };
    respond(
        &state,
        ExportRequest {
            tool,
            error_type: p.error_type.filter(|v| !v.is_empty()),
            code: p.code.filter(|v| !v.is_empty()),
            since: p.since.filter(|v| !v.is_empty()),
            per_fingerprint: p.per_fingerprint.unwrap_or(DEFAULT_PER_FINGERPRINT),
            version: p.version,
        },
    )
    .await
}

/// `GET /tools/{tool}/evals.jsonl`: the same file, downloaded from the viewer.
pub async fn download(
    State(state): State<Arc<AppState>>,
    Path(tool): Path<String>,
    params: Result<Query<DownloadParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(p) = params.map_err(|e| {
        ApiError::new(
            Code::InvalidArgument,
            "invalid evals download parameters: they are error_type, code, since, \
             per_fingerprint and version",
            e,
        )
    })?;
    respond(
        &state,
        ExportRequest {
            tool,
            error_type: p.error_type.filter(|v| !v.is_empty()),
            code: p.code.filter(|v| !v.is_empty()),
            since: p.since.filter(|v| !v.is_empty()),
            per_fingerprint: p.per_fingerprint.unwrap_or(DEFAULT_PER_FINGERPRINT),
            version: p.version,
        },
    )
    .await
}

/// The file name a download is saved as: the tool's name with anything but letters, digits,
/// `-`, `_` and `.` replaced.
pub fn file_name(tool: &str) -> String {
    let safe: String = tool
        .chars()
        .take(100)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{safe}.evals.jsonl")
}

async fn respond(state: &AppState, req: ExportRequest) -> Result<Response, ApiError> {
    let name = file_name(&req.tool);
    let file = state
        .service
        .run_in_slot("evals export", move |engine| async move {
            export(&engine, &req).await
        })
        .await??;
    let mut response = file.text.into_response();
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson; charset=utf-8"),
    );
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{name}\"")) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    if let Ok(v) = HeaderValue::from_str(&file.version.to_string()) {
        h.insert("x-toolspan-table-version", v);
    }
    Ok(response)
}

/// The viewer's download of `tool`'s failures (of one error type and code, when given).
pub fn href(tool: &str, error_type: Option<&str>, code: Option<&str>) -> String {
    use super::viewer::page::{query, segment};
    format!(
        "/tools/{}/evals.jsonl{}",
        segment(tool),
        query(&[
            ("error_type", error_type.unwrap_or("")),
            ("code", code.unwrap_or(""))
        ])
    )
}
