//! `GET /api/v1/search`: structured search over `spans`. The parameters become one SQL
//! statement, built only from validated enum values, escaped string literals and timestamps
//! toolspan formats itself; the response carries the rows and that statement.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::json;
use toolspan_schema::{ErrorType, Stage};

use super::error::ApiError;
use super::sql::{columns, json_rows};
use super::AppState;
use toolspan_query::sql::shorten;
pub use toolspan_query::sql::{literal, parse_time};

/// Span statuses.
pub const STATUSES: [&str; 3] = ["ok", "error", "unset"];
/// Rows returned when `limit` is absent.
pub const DEFAULT_LIMIT: usize = 100;
/// The largest `limit`.
pub const MAX_LIMIT: usize = 10_000;
/// The longest free-text value accepted for one parameter.
const MAX_VALUE_CHARS: usize = 256;

/// The columns a search returns, in order.
pub const COLUMNS: &str = "start_time, trace_id, span_id, parent_span_id, tool, stage, name, \
status, error_type, error_code, error_class, error_message, reference, attempt, duration_ms, \
service, service_version, agent, http_status";

/// The query parameters of a search. List parameters take comma-separated values.
#[derive(Debug, Default, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchParams {
    /// Tool names.
    pub tool: Option<String>,
    /// Stages ([`Stage`] names).
    pub stage: Option<String>,
    /// Error types ([`ErrorType`] names).
    pub error_type: Option<String>,
    /// Error codes.
    pub error_code: Option<String>,
    /// `service.name` values.
    pub service: Option<String>,
    /// Statuses, from [`STATUSES`].
    pub status: Option<String>,
    /// Lower time bound: relative (`15m`, `1h`, `7d`) or absolute (RFC 3339, `YYYY-MM-DD`).
    pub since: Option<String>,
    /// Upper time bound, same forms as `since`.
    pub until: Option<String>,
    /// Text the span's name, error message or output contains (case-insensitive).
    pub text: Option<String>,
    /// Most rows to return (default 100, at most 10,000), newest first.
    pub limit: Option<String>,
}

/// Runs a search.
pub async fn get_search(
    State(state): State<Arc<AppState>>,
    params: Result<Query<SearchParams>, QueryRejection>,
) -> Result<axum::Json<serde_json::Value>, ApiError> {
    let Query(params) = params.map_err(|e| {
        ApiError::new(
            toolspan_schema::Code::InvalidArgument,
            "invalid search parameters: the parameters are tool, stage, error_type, error_code, \
             service, status, since, until, text and limit",
            e,
        )
    })?;
    let sql = build_sql(&params, Utc::now())?;
    let result = state.service.query(&sql).await?;
    Ok(axum::Json(json!({
        "sql": sql,
        "columns": columns(&result.schema),
        "rows": json_rows(&result)?,
        "row_count": result.num_rows(),
    })))
}

/// Builds the statement for `params`, resolving relative times against `now`.
pub fn build_sql(params: &SearchParams, now: DateTime<Utc>) -> Result<String, ApiError> {
    let mut filters: Vec<String> = Vec::new();
    if let Some(v) = &params.tool {
        filters.push(in_list("tool", &free_values("tool", v)?));
    }
    if let Some(v) = &params.stage {
        let all: Vec<&str> = Stage::ALL.iter().map(|s| s.as_str()).collect();
        let parse = |s: &str| Stage::parse(s).map(Stage::as_str);
        filters.push(in_list("stage", &enum_values("stage", v, parse, &all)?));
    }
    if let Some(v) = &params.error_type {
        filters.push(in_list(
            "error_type",
            &enum_values(
                "error_type",
                v,
                |s| ErrorType::parse(s).map(ErrorType::as_str),
                &ErrorType::ALL.map(ErrorType::as_str),
            )?,
        ));
    }
    if let Some(v) = &params.error_code {
        filters.push(in_list("error_code", &free_values("error_code", v)?));
    }
    if let Some(v) = &params.service {
        filters.push(in_list("service", &free_values("service", v)?));
    }
    if let Some(v) = &params.status {
        filters.push(in_list(
            "status",
            &enum_values(
                "status",
                v,
                |s| STATUSES.into_iter().find(|a| a.eq_ignore_ascii_case(s)),
                &STATUSES,
            )?,
        ));
    }
    let since = params
        .since
        .as_deref()
        .map(|v| parse_time("since", v, now))
        .transpose()?;
    let until = params
        .until
        .as_deref()
        .map(|v| parse_time("until", v, now))
        .transpose()?;
    if let (Some(s), Some(u)) = (since, until) {
        if s >= u {
            return Err(ApiError::invalid_argument(format!(
                "`since` ({}) must be before `until` ({})",
                rfc3339(s),
                rfc3339(u)
            )));
        }
    }
    // The date predicates let the table skip whole partitions; start_time is the exact bound.
    if let Some(s) = since {
        filters.push(format!("date >= '{}'", s.format("%Y-%m-%d")));
        filters.push(format!("start_time >= '{}'", rfc3339(s)));
    }
    if let Some(u) = until {
        filters.push(format!("date <= '{}'", u.format("%Y-%m-%d")));
        filters.push(format!("start_time < '{}'", rfc3339(u)));
    }
    if let Some(t) = &params.text {
        let t = free_value("text", t)?.to_lowercase();
        if !t.is_empty() {
            filters.push(format!(
                "strpos(lower(concat_ws(' ', name, error_message, output)), {}) > 0",
                literal(&t)
            ));
        }
    }
    let limit = match params.limit.as_deref() {
        None | Some("") => DEFAULT_LIMIT,
        Some(v) => match v.parse::<usize>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => n,
            _ => {
                return Err(ApiError::invalid_argument(format!(
                    "`limit` must be a whole number from 1 to {MAX_LIMIT}, got {:?}",
                    shorten(v)
                )))
            }
        },
    };
    let mut sql = format!("SELECT {COLUMNS}\nFROM spans");
    if !filters.is_empty() {
        sql.push_str("\nWHERE ");
        sql.push_str(&filters.join("\n  AND "));
    }
    sql.push_str(&format!("\nORDER BY start_time DESC\nLIMIT {limit}"));
    Ok(sql)
}

fn in_list(column: &str, values: &[String]) -> String {
    if values.len() == 1 {
        format!("{column} = {}", literal(&values[0]))
    } else {
        let items: Vec<String> = values.iter().map(|v| literal(v)).collect();
        format!("{column} IN ({})", items.join(", "))
    }
}

fn free_value<'a>(name: &str, v: &'a str) -> Result<&'a str, ApiError> {
    if v.chars().count() > MAX_VALUE_CHARS {
        return Err(ApiError::invalid_argument(format!(
            "`{name}` is longer than {MAX_VALUE_CHARS} characters"
        )));
    }
    if v.chars().any(char::is_control) {
        return Err(ApiError::invalid_argument(format!(
            "`{name}` contains control characters"
        )));
    }
    Ok(v.trim())
}

fn free_values(name: &str, v: &str) -> Result<Vec<String>, ApiError> {
    let values: Vec<String> = free_value(name, v)?
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    if values.is_empty() {
        return Err(ApiError::invalid_argument(format!(
            "`{name}` is empty: give one value or several separated by commas"
        )));
    }
    Ok(values)
}

/// The column values of a comma-separated list of enum names (`Stage`, `ErrorType`, …):
/// `parse` recognises one (case-insensitively), `allowed` names them all for the message.
fn enum_values(
    name: &str,
    v: &str,
    parse: impl Fn(&str) -> Option<&'static str>,
    allowed: &[&str],
) -> Result<Vec<String>, ApiError> {
    let mut out = Vec::new();
    for raw in free_values(name, v)? {
        match parse(&raw) {
            Some(a) => out.push(a.to_string()),
            None => {
                return Err(ApiError::invalid_argument(format!(
                    "unknown {name} {:?}: use one or more of {}",
                    shorten(&raw),
                    allowed.join(", ")
                )))
            }
        }
    }
    Ok(out)
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Nanos, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2025-06-01T12:00:00Z")
            .expect("valid time")
            .with_timezone(&Utc)
    }

    #[test]
    fn builds_filters_from_parameters() {
        let p = SearchParams {
            tool: Some("search_docs".into()),
            error_type: Some("parse".into()),
            since: Some("1h".into()),
            limit: Some("5".into()),
            ..SearchParams::default()
        };
        let sql = build_sql(&p, now()).expect("sql");
        assert!(sql.contains("tool = 'search_docs'"), "{sql}");
        assert!(sql.contains("error_type = 'PARSE'"), "{sql}");
        assert!(
            sql.contains("start_time >= '2025-06-01T11:00:00.000000000Z'"),
            "{sql}"
        );
        assert!(sql.contains("date >= '2025-06-01'"), "{sql}");
        assert!(sql.ends_with("LIMIT 5"), "{sql}");
    }

    #[test]
    fn values_cannot_escape_their_literals() {
        let p = SearchParams {
            tool: Some("x' OR '1'='1".into()),
            text: Some("it's \\' -- done".into()),
            ..SearchParams::default()
        };
        let sql = build_sql(&p, now()).expect("sql");
        assert!(sql.contains("tool = 'x'' OR ''1''=''1'"), "{sql}");
        assert!(sql.contains("'it''s \\'' -- done'"), "{sql}");
    }

    #[test]
    fn enums_and_limits_are_validated() {
        for p in [
            SearchParams {
                stage: Some("sned".into()),
                ..Default::default()
            },
            SearchParams {
                error_type: Some("PARSE,BOGUS".into()),
                ..Default::default()
            },
            SearchParams {
                status: Some("failed".into()),
                ..Default::default()
            },
            SearchParams {
                limit: Some("0".into()),
                ..Default::default()
            },
            SearchParams {
                limit: Some("100001".into()),
                ..Default::default()
            },
            SearchParams {
                since: Some("yesterday".into()),
                ..Default::default()
            },
            SearchParams {
                since: Some("1h".into()),
                until: Some("2h".into()),
                ..Default::default()
            },
        ] {
            let e = build_sql(&p, now()).expect_err("invalid");
            assert_eq!(e.code(), toolspan_schema::Code::InvalidArgument, "{p:?}");
        }
        let sql = build_sql(
            &SearchParams {
                stage: Some("send, EXECUTE".into()),
                ..Default::default()
            },
            now(),
        )
        .expect("sql");
        assert!(sql.contains("stage IN ('send', 'execute')"), "{sql}");
    }
}
