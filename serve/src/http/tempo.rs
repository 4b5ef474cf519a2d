//! A Tempo-compatible HTTP API (Tempo's own paths, on the query service), so that Grafana's
//! built-in Tempo data source, pointed at `toolspan query`, shows toolspan's traces in its
//! trace view and searches them.
//! Only what that data source calls, answered as it decodes it:
//!
//! | route | answer |
//! |---|---|
//! | `GET /api/echo` | `echo` (the data source's health check) |
//! | `GET /api/status/buildinfo` | the Tempo version whose API this is |
//! | `GET /api/v2/traces/{id}` | Tempo's `TraceByIDResponse`: protobuf for `Accept: application/protobuf`, else `{"trace": {"resourceSpans": […]}}` |
//! | `GET /api/traces/{id}` | Tempo's `Trace`: protobuf (OTLP `TracesData`), else `{"batches": […]}` |
//! | `GET /api/search?q=&start=&end=&limit=&spss=` | traces matching a TraceQL subset ([`traceql`]) in Tempo's search answer |
//! | `GET /api/v2/search/tags`, `GET /api/search/tags` | attribute names by scope / flat |
//! | `GET /api/v2/search/tag/{tag}/values`, `GET /api/search/tag/{tag}/values` | values of one attribute |
//!
//! Errors are toolspan's envelope; an unknown trace id is 404, a malformed one 400. With a
//! token configured, every route requires `Authorization: Bearer <token>` (Grafana's data
//! source sends it as a custom HTTP header).

pub mod otlp;
pub mod search;
pub mod tags;
pub mod traceql;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use prost::Message;
use serde_json::json;

use super::error::ApiError;
use super::AppState;
use toolspan_query::rows;

/// The Tempo version whose HTTP API this answers as (Grafana reads it from buildinfo).
pub const TEMPO_VERSION: &str = "2.6.0";

/// The media type Grafana asks trace answers in.
pub const PROTOBUF: &str = "application/protobuf";

/// The routes, to be merged under the token check.
pub fn routes() -> super::Routes {
    super::Routes::new()
        .get("/api/echo", echo)
        .get("/api/status/buildinfo", buildinfo)
        .get("/api/v2/traces/{trace_id}", trace_v2)
        .get("/api/traces/{trace_id}", trace_v1)
        .get("/api/search", search::get_search)
        .get("/api/v2/search/tags", tags::tags_v2)
        .get("/api/search/tags", tags::tags_v1)
        .get("/api/v2/search/tag/{tag}/values", tags::values_v2)
        .get("/api/search/tag/{tag}/values", tags::values_v1)
}

async fn echo() -> &'static str {
    "echo"
}

async fn buildinfo() -> axum::Json<serde_json::Value> {
    axum::Json(json!({
        "version": TEMPO_VERSION,
        "revision": concat!("toolspan-", env!("CARGO_PKG_VERSION")),
        "branch": "toolspan",
        "buildUser": "",
        "buildDate": "",
        "goVersion": "",
    }))
}

/// A trace id as Tempo takes it: 1 to 32 hexadecimal characters, left-padded with zeros.
pub fn trace_id(raw: &str) -> Result<String, ApiError> {
    if raw.is_empty() || raw.len() > 32 || !raw.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ApiError::invalid_argument(
            "a trace id is 1 to 32 hexadecimal characters, e.g. 4bf92f3577b34da6a3ce929d0e0e4736",
        ));
    }
    Ok(format!("{:0>32}", raw.to_ascii_lowercase()))
}

fn wants_protobuf(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| {
            a.split(',').any(|p| {
                let m = p.split(';').next().unwrap_or("").trim();
                m.eq_ignore_ascii_case(PROTOBUF) || m.eq_ignore_ascii_case("application/x-protobuf")
            })
        })
}

async fn load(state: &AppState, raw: &str) -> Result<Vec<rows::Span>, ApiError> {
    let id = trace_id(raw)?;
    let (spans, _cut) = rows::load_trace(&state.service, &id).await?;
    if spans.is_empty() {
        return Err(ApiError::not_found(format!(
            "no span has trace id {id}: it may not be ingested yet, or it was sampled out"
        )));
    }
    Ok(spans)
}

fn protobuf(body: Vec<u8>) -> Response {
    let mut r = Response::new(Body::from(body));
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROTOBUF));
    r
}

/// `GET /api/v2/traces/{id}`: Tempo's `TraceByIDResponse`. The time range Grafana adds is
/// not needed: a trace id lookup is fast over the whole table, and a trace that straddles the
/// range comes back whole.
async fn trace_v2(
    State(state): State<Arc<AppState>>,
    Path(raw): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let spans = load(&state, &raw).await?;
    let rs = otlp::resource_spans(&spans);
    if wants_protobuf(&headers) {
        let body = otlp::TraceByIdResponse {
            trace: Some(opentelemetry_proto::tonic::trace::v1::TracesData { resource_spans: rs }),
        };
        return Ok(protobuf(body.encode_to_vec()));
    }
    Ok(axum::Json(json!({
        "trace": { "resourceSpans": otlp::resource_spans_json(&rs) },
    }))
    .into_response())
}

/// `GET /api/traces/{id}`: Tempo's `Trace` (the same bytes as OTLP `TracesData`).
async fn trace_v1(
    State(state): State<Arc<AppState>>,
    Path(raw): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let spans = load(&state, &raw).await?;
    let rs = otlp::resource_spans(&spans);
    if wants_protobuf(&headers) {
        let body = opentelemetry_proto::tonic::trace::v1::TracesData { resource_spans: rs };
        return Ok(protobuf(body.encode_to_vec()));
    }
    Ok(axum::Json(json!({ "batches": otlp::resource_spans_json(&rs) })).into_response())
}

/// The time range of a search or tag lookup: `start` and `end` in Unix seconds, by default
/// the last 24 hours.
#[derive(Debug, Clone, Copy)]
pub struct Range {
    /// Inclusive start.
    pub start: DateTime<Utc>,
    /// Exclusive end.
    pub end: DateTime<Utc>,
}

/// The window searched when the request names none.
pub const DEFAULT_WINDOW_SECS: i64 = 24 * 3600;

/// The latest time a range may name: the end of year 9999 (Unix seconds). Times are
/// checked against `0..=MAX_UNIX_SECS` before any arithmetic, so none can overflow.
pub const MAX_UNIX_SECS: i64 = 253_402_300_799;

impl Range {
    /// From `start`/`end` parameters (Unix seconds, from 0 to the end of year 9999).
    pub fn from_params(start: Option<&str>, end: Option<&str>) -> Result<Range, ApiError> {
        let secs = |name: &str, v: Option<&str>| -> Result<Option<DateTime<Utc>>, ApiError> {
            match v.map(str::trim).filter(|v| !v.is_empty()) {
                None => Ok(None),
                Some(v) => v
                    .parse::<i64>()
                    .ok()
                    .filter(|s| (0..=MAX_UNIX_SECS).contains(s))
                    .and_then(|s| DateTime::from_timestamp(s, 0))
                    .map(Some)
                    .ok_or_else(|| {
                        ApiError::invalid_argument(format!(
                            "`{name}` is a time in Unix seconds from 0 to {MAX_UNIX_SECS} \
                             (the end of year 9999), e.g. 1700000000"
                        ))
                    }),
            }
        };
        let end = secs("end", end)?.unwrap_or_else(Utc::now);
        let start = match secs("start", start)? {
            Some(s) => s,
            None => end
                .checked_sub_signed(chrono::TimeDelta::seconds(DEFAULT_WINDOW_SECS))
                .unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
                .max(DateTime::<Utc>::UNIX_EPOCH),
        };
        if start > end {
            return Err(ApiError::invalid_argument(
                "`start` must not be after `end`",
            ));
        }
        Ok(Range { start, end })
    }

    /// SQL conditions selecting spans that start in the range (the `date` bounds let the scan
    /// skip whole partitions). `end` is inclusive to the second Tempo names.
    pub fn sql(&self) -> String {
        // A span starting before `end + 1 s` starts on `end`'s day at the latest; the bound
        // stays within year 9999, which SQL dates can spell.
        let latest = DateTime::from_timestamp(MAX_UNIX_SECS, 0).unwrap_or(self.end);
        let end = self
            .end
            .checked_add_signed(chrono::TimeDelta::seconds(1))
            .unwrap_or(self.end)
            .min(latest);
        format!(
            "date >= '{}' AND date <= '{}' AND start_time >= '{}' AND start_time < '{}'",
            self.start.format("%Y-%m-%d"),
            self.end.format("%Y-%m-%d"),
            self.start
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            end.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        )
    }
}

/// Query parameters shared by the tag routes.
#[derive(Debug, Default, serde::Deserialize)]
pub struct RangeParams {
    /// Unix seconds.
    pub start: Option<String>,
    /// Unix seconds.
    pub end: Option<String>,
    /// `span`, `resource`, `intrinsic` or absent (all).
    pub scope: Option<String>,
    /// A TraceQL query narrowing the values (accepted, not used).
    pub q: Option<String>,
    /// Most values (accepted; toolspan caps at its own limit).
    pub limit: Option<String>,
    /// Accepted, not used.
    #[serde(rename = "maxStaleValues")]
    pub max_stale_values: Option<String>,
}

/// Rejects a query string the extractor could not read.
pub fn params<T>(
    p: Result<Query<T>, axum::extract::rejection::QueryRejection>,
) -> Result<T, ApiError> {
    p.map(|Query(p)| p).map_err(|e| {
        ApiError::new(
            toolspan_schema::Code::InvalidArgument,
            "invalid query parameters: see docs/query.md for this route's parameters",
            e,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::Range;

    #[test]
    fn times_past_the_representable_range_are_refused_not_overflowed() {
        for (start, end) in [
            (None, Some("8210266876799")),
            (Some("0"), Some("8210266876799")),
            (None, Some("-8334601228800")),
            (Some("-8334601228800"), Some("0")),
            (None, Some("253402300800")),
        ] {
            assert!(
                Range::from_params(start, end).is_err(),
                "{start:?}..{end:?}"
            );
        }
        let r = Range::from_params(Some("0"), Some("253402300799")).expect("in range");
        assert!(r.sql().contains("9999-12-31"), "{}", r.sql());
        let r = Range::from_params(None, Some("10")).expect("in range");
        assert!(r.sql().contains("1970-01-01"), "{}", r.sql());
    }
}
