//! `POST /api/v1/sql`: one read-only statement; JSON rows by default, CSV or an Arrow IPC
//! stream by `Accept`.
//!
//! The result streams ([`body`]): the status is decided once the first batches are there (so
//! errors of planning, admission and the start of execution are envelopes with their status),
//! then the rows are written as the engine produces them, within the query memory pool.
//! A result that is complete by then goes out in one piece, with its length.

mod body;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use serde_json::json;
use toolspan_schema::Code;

use super::error::ApiError;
use super::AppState;
use body::Encoder;
use toolspan_query::engine::QueryResult;
use toolspan_query::format::{render_with_schema, Format};

/// The media type of an Arrow IPC stream.
pub const ARROW_STREAM: &str = "application/vnd.apache.arrow.stream";

/// The body of `POST /api/v1/sql`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SqlRequest {
    sql: String,
}

/// What the caller asked for in `Accept`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wanted {
    Json,
    Csv,
    Arrow,
}

fn wanted(headers: &HeaderMap) -> Wanted {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    // The first listed media type we serve wins; anything else gets JSON.
    for part in accept.split(',') {
        let media = part.split(';').next().unwrap_or("").trim();
        match media {
            ARROW_STREAM => return Wanted::Arrow,
            "text/csv" => return Wanted::Csv,
            "application/json" | "*/*" => return Wanted::Json,
            _ => {}
        }
    }
    Wanted::Json
}

/// Runs the statement in the body.
pub async fn post_sql(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(|e| {
        let code = if e.status().as_u16() == 413 {
            Code::PayloadTooLarge
        } else {
            Code::InvalidArgument
        };
        ApiError::new(
            code,
            format!(
                "the request body could not be read: send JSON {{\"sql\": \"SELECT …\"}} of at most {} bytes",
                super::MAX_BODY_BYTES
            ),
            e,
        )
    })?;
    let request: SqlRequest = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            Code::InvalidArgument,
            "the body must be a JSON object {\"sql\": \"SELECT …\"} with the statement as a string",
            e,
        )
    })?;
    if request.sql.trim().is_empty() {
        return Err(ApiError::invalid_argument(
            "`sql` is empty: send one SELECT statement",
        ));
    }
    let mut results = state.service.query_stream(&request.sql).await?;
    let schema = results.schema().clone();
    let (mut encoder, content_type) = match wanted(&headers) {
        Wanted::Json => (Encoder::json(), "application/json"),
        Wanted::Csv => (Encoder::csv(), "text/csv; charset=utf-8"),
        Wanted::Arrow => (Encoder::arrow(&schema)?, ARROW_STREAM),
    };
    // The status is decided once the first two batches are there (a result that ends with
    // them goes out in one piece, with its length); errors until then are envelopes.
    let mut first = encoder.head(&schema)?;
    let mut complete = false;
    for _ in 0..2 {
        match results.next_batch().await {
            Some(Err(e)) => return Err(e.into()),
            Some(Ok(batch)) => first.extend(encoder.batch(&batch)?),
            None => {
                first.extend(encoder.tail(&schema, results.rows())?);
                complete = true;
                break;
            }
        }
    }
    let body = if complete {
        axum::body::Body::from(first)
    } else {
        body::body(results, encoder, first)?
    };
    Ok((
        [(header::CONTENT_TYPE, HeaderValue::from_static(content_type))],
        body,
    )
        .into_response())
}

/// `{"columns": [{"name", "type"}], "rows": [{…}], "row_count": n}`.
pub fn json_body(result: &QueryResult) -> Result<serde_json::Value, ApiError> {
    Ok(json!({
        "columns": columns(&result.schema),
        "rows": json_rows(result)?,
        "row_count": result.num_rows(),
    }))
}

/// The rows as JSON objects (nulls explicit, timestamps RFC 3339).
pub fn json_rows(result: &QueryResult) -> Result<Vec<serde_json::Value>, ApiError> {
    let text = render_with_schema(&result.schema, &result.batches, Format::Json)?;
    match serde_json::from_str(&text) {
        Ok(serde_json::Value::Array(rows)) => Ok(rows),
        Ok(other) => Err(ApiError::new(
            Code::Internal,
            "internal error while rendering the result",
            format_args!("json renderer returned a non-array: {}", other),
        )),
        Err(e) => Err(ApiError::new(
            Code::Internal,
            "internal error while rendering the result",
            e,
        )),
    }
}

/// Column names with their SQL type names (the Postgres names the wire protocol reports).
pub fn columns(schema: &SchemaRef) -> Vec<serde_json::Value> {
    schema
        .fields()
        .iter()
        .map(|f| json!({"name": f.name(), "type": sql_type_name(f.data_type())}))
        .collect()
}

/// A short SQL name for an Arrow type.
pub fn sql_type_name(t: &DataType) -> String {
    match t {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "text".into(),
        DataType::Boolean => "boolean".into(),
        DataType::Int8 | DataType::Int16 | DataType::UInt8 => "smallint".into(),
        DataType::Int32 | DataType::UInt16 => "integer".into(),
        DataType::Int64 | DataType::UInt32 => "bigint".into(),
        DataType::UInt64 | DataType::Decimal128(_, _) | DataType::Decimal256(_, _) => {
            "numeric".into()
        }
        DataType::Float16 | DataType::Float32 => "real".into(),
        DataType::Float64 => "double precision".into(),
        DataType::Timestamp(_, Some(_)) => "timestamp with time zone".into(),
        DataType::Timestamp(_, None) => "timestamp".into(),
        DataType::Date32 | DataType::Date64 => "date".into(),
        DataType::Null => "null".into(),
        DataType::List(f) | DataType::LargeList(f) => {
            format!("{}[]", sql_type_name(f.data_type()))
        }
        other => other.to_string(),
    }
}
