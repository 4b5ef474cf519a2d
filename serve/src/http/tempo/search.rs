//! `GET /api/search`: traces matching a TraceQL subset, newest first, in Tempo's answer
//! (`traces[]` with `traceID`, `rootServiceName`, `rootTraceName`, `startTimeUnixNano`,
//! `durationMs`, `spanSets[]` of matched spans with the attributes the query compared).
//!
//! Two statements: the traces (grouped by trace id, each spanset's conditions as a
//! `bool_or`, the spanset logic in `HAVING`, newest `limit`), then the spans of those traces
//! with a flag per spanset, from which the answer is built.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use serde_json::{json, Value};

use super::traceql::{self, Field, Query as TraceQl};
use super::{params, Range};
use crate::http::error::ApiError;
use crate::http::AppState;
use toolspan_query::rows::{self, Cols, Span};

/// Traces returned when `limit` is absent (Tempo's default).
pub const DEFAULT_LIMIT: usize = 20;
/// The largest `limit`.
pub const MAX_LIMIT: usize = 1000;
/// Matched spans shown per trace when `spss` is absent (Tempo's default).
pub const DEFAULT_SPSS: usize = 3;
/// The largest `spss`.
pub const MAX_SPSS: usize = 1000;

/// The parameters of a search.
#[derive(Debug, Default, serde::Deserialize)]
pub struct SearchParams {
    /// TraceQL.
    pub q: Option<String>,
    /// Unix seconds.
    pub start: Option<String>,
    /// Unix seconds.
    pub end: Option<String>,
    /// Most traces.
    pub limit: Option<String>,
    /// Spans per spanset.
    pub spss: Option<String>,
    /// Tempo's pre-TraceQL tag search: not supported.
    pub tags: Option<String>,
}

fn bounded(name: &str, v: Option<&str>, default: usize, max: usize) -> Result<usize, ApiError> {
    match v.map(str::trim).filter(|v| !v.is_empty()) {
        None => Ok(default),
        Some(v) => match v.parse::<usize>() {
            Ok(n) if (1..=max).contains(&n) => Ok(n),
            _ => Err(ApiError::invalid_argument(format!(
                "`{name}` must be a whole number from 1 to {max}"
            ))),
        },
    }
}

/// The answer to one search.
pub async fn get_search(
    State(state): State<Arc<AppState>>,
    p: Result<Query<SearchParams>, QueryRejection>,
) -> Result<axum::Json<Value>, ApiError> {
    let p = params(p)?;
    if p.tags.is_some() && p.q.is_none() {
        return Err(ApiError::invalid_argument(format!(
            "tag search (`tags=`) is not supported: send TraceQL in `q=`. {}",
            traceql::SUPPORTED
        )));
    }
    let range = Range::from_params(p.start.as_deref(), p.end.as_deref())?;
    let limit = bounded("limit", p.limit.as_deref(), DEFAULT_LIMIT, MAX_LIMIT)?;
    let spss = bounded("spss", p.spss.as_deref(), DEFAULT_SPSS, MAX_SPSS)?;
    let query = traceql::parse(p.q.as_deref().unwrap_or("")).map_err(unsupported)?;
    let conditions: Vec<String> = query
        .spansets()
        .into_iter()
        .map(traceql::expr_sql)
        .collect::<Result<_, _>>()
        .map_err(unsupported)?;
    let (trace_sql, spans_sql) = statements(&query, &conditions, &range, limit);
    let traces = state.service.query(&trace_sql).await?;
    let ids = rows::first_texts(&traces)?;
    if ids.is_empty() {
        return Ok(axum::Json(answer(Vec::new(), 0)));
    }
    let result = state.service.query(&spans_sql(&ids)).await?;
    let mut spans: Vec<Span> = Vec::new();
    let mut matched: Vec<bool> = Vec::new();
    for batch in &result.batches {
        rows::spans_in(batch, &mut spans)?;
        let m = Cols::new(batch).boolean("matched")?;
        matched.extend((0..batch.num_rows()).map(|i| m.bool(i).unwrap_or(false)));
    }
    let fields = query.fields();
    let mut by_trace: HashMap<&str, Vec<(usize, bool)>> = HashMap::new();
    for (i, s) in spans.iter().enumerate() {
        by_trace
            .entry(s.trace_id.as_str())
            .or_default()
            .push((i, matched[i]));
    }
    let traces: Vec<Value> = ids
        .iter()
        .filter_map(|id| {
            let members = by_trace.get(id.as_str())?;
            Some(trace_json(id, members, &spans, &fields, spss))
        })
        .collect();
    let n = traces.len();
    Ok(axum::Json(answer(traces, n)))
}

fn unsupported(e: traceql::ParseError) -> ApiError {
    ApiError::invalid_argument(format!("unsupported TraceQL: {e}. {}", traceql::SUPPORTED))
}

fn answer(traces: Vec<Value>, inspected: usize) -> Value {
    json!({
        "traces": traces,
        "metrics": {
            "inspectedTraces": inspected,
            "inspectedBytes": "0",
            "completedJobs": 1,
            "totalJobs": 1,
        },
    })
}

/// The statement finding the traces, and the one reading their spans (given their ids).
fn statements(
    query: &TraceQl,
    conditions: &[String],
    range: &Range,
    limit: usize,
) -> (String, impl Fn(&[String]) -> String) {
    let any = conditions
        .iter()
        .map(|c| format!("({c})"))
        .collect::<Vec<_>>()
        .join(" OR ");
    let flags: Vec<String> = conditions
        .iter()
        .enumerate()
        .map(|(i, c)| format!("bool_or({c}) AS m{i}"))
        .collect();
    let having = having(query, &mut 0);
    let trace_sql = format!(
        "SELECT trace_id, max(start_time_unix_nano) AS latest, {flags} FROM spans \
         WHERE {range} AND ({any}) GROUP BY trace_id HAVING {having} \
         ORDER BY latest DESC, trace_id LIMIT {limit}",
        flags = flags.join(", "),
        range = range.sql(),
    );
    let matched = any.clone();
    let spans_sql = move |ids: &[String]| {
        // Ids come from the table and are checked to be hex before they enter the statement.
        let list: Vec<String> = ids
            .iter()
            .filter(|id| id.bytes().all(|b| b.is_ascii_hexdigit()))
            .map(|id| format!("'{id}'"))
            .collect();
        format!(
            "SELECT {cols}, ({matched}) AS matched FROM spans WHERE trace_id IN ({list}) \
             ORDER BY start_time_unix_nano, span_id LIMIT {max}",
            cols = rows::SPAN_COLUMNS,
            list = list.join(", "),
            max = rows::MAX_TRACE_SPANS * 4,
        )
    };
    (trace_sql, spans_sql)
}

/// The spanset logic over the per-trace flags `m0`, `m1`, … (in spanset order).
fn having(q: &TraceQl, next: &mut usize) -> String {
    match q {
        TraceQl::Spanset(_) => {
            let s = format!("m{next}");
            *next += 1;
            s
        }
        TraceQl::And(a, b) => format!("({} AND {})", having(a, next), having(b, next)),
        TraceQl::Or(a, b) => format!("({} OR {})", having(a, next), having(b, next)),
    }
}

/// The value a matched span reports for a field the query compared.
fn field_value(sp: &Span, f: &Field) -> Option<Value> {
    use traceql::COLUMN_ATTRIBUTES;
    let text = |v: &Option<String>| v.as_ref().map(|s| json!({ "stringValue": s }));
    match f {
        Field::Status => Some(json!({ "stringValue": sp.status })),
        Field::Kind => text(&sp.kind),
        Field::Duration | Field::Name => None,
        Field::Resource(k) if k == "service.name" => None,
        Field::Resource(k) if k == "service.version" => text(&sp.service_version),
        Field::Resource(k) => json_attr(sp.resource_attributes.as_deref(), k),
        Field::Span(k) => match COLUMN_ATTRIBUTES.iter().find(|(key, _, _)| key == k) {
            Some((_, column, _)) => column_value(sp, column),
            None => json_attr(sp.attributes.as_deref(), k),
        },
    }
}

fn column_value(sp: &Span, column: &str) -> Option<Value> {
    let text = |v: &Option<String>| v.as_ref().map(|s| json!({ "stringValue": s }));
    let int = |v: Option<i64>| v.map(|i| json!({ "intValue": i.to_string() }));
    match column {
        "tool" => sp.tool_name().map(|t| json!({ "stringValue": t })),
        "stage" => Some(json!({ "stringValue": sp.stage })),
        "error_type" => text(&sp.error_type),
        "error_code" => text(&sp.error_code),
        "error_class" => text(&sp.error_class),
        "reference" => text(&sp.reference),
        "call_id" => text(&sp.call_id),
        "agent" => text(&sp.agent),
        "model" => text(&sp.model),
        "service" => text(&sp.service),
        "attempt" => int(sp.attempt),
        "retry_after_ms" => int(sp.retry_after_ms),
        "http_status" => int(sp.http_status),
        "retryable" => sp.retryable.map(|b| json!({ "boolValue": b })),
        "leaked_internals" => Some(json!({ "boolValue": sp.leaked_internals })),
        _ => None,
    }
}

fn json_attr(text: Option<&str>, key: &str) -> Option<Value> {
    let v: Value = serde_json::from_str(text?).ok()?;
    let a = super::otlp::any(v.get(key)?)?;
    Some(super::otlp::any_json(
        &opentelemetry_proto::tonic::common::v1::AnyValue { value: Some(a) },
    ))
}

fn trace_json(
    id: &str,
    members: &[(usize, bool)],
    spans: &[Span],
    fields: &[Field],
    spss: usize,
) -> Value {
    let all = || members.iter().map(|(i, _)| &spans[*i]);
    let root = all()
        .find(|s| s.parent_span_id.is_none())
        .or_else(|| all().next());
    let start = all().map(|s| s.start_unix_nano).min().unwrap_or(0);
    let end = all().map(Span::end_unix_nano).max().unwrap_or(start);
    let mut service_stats: HashMap<String, (u64, u64)> = HashMap::new();
    for s in all() {
        let e = service_stats
            .entry(s.service.clone().unwrap_or_default())
            .or_default();
        e.0 += 1;
        if s.failed() {
            e.1 += 1;
        }
    }
    let matched: Vec<&Span> = members
        .iter()
        .filter(|(_, m)| *m)
        .map(|(i, _)| &spans[*i])
        .collect();
    let shown: Vec<Value> = matched
        .iter()
        .take(spss)
        .map(|s| {
            let mut attributes = vec![json!({
                "key": "service.name",
                "value": { "stringValue": s.service.clone().unwrap_or_default() },
            })];
            for f in fields {
                if let Some(v) = field_value(s, f) {
                    attributes.push(json!({ "key": f.label(), "value": v }));
                }
            }
            json!({
                "spanID": s.span_id,
                "name": s.name,
                "startTimeUnixNano": s.start_unix_nano.to_string(),
                "durationNanos": ((s.duration_ms * 1e6).round() as i64).to_string(),
                "attributes": attributes,
            })
        })
        .collect();
    let spanset = json!({ "spans": shown, "matched": matched.len() });
    json!({
        "traceID": id,
        "rootServiceName": root.and_then(|r| r.service.clone()).unwrap_or_else(|| "<root span not yet received>".into()),
        "rootTraceName": root.map(|r| r.name.clone()).unwrap_or_default(),
        "startTimeUnixNano": start.to_string(),
        "durationMs": (end - start) / 1_000_000,
        "spanSet": spanset,
        "spanSets": [spanset],
        "serviceStats": service_stats
            .into_iter()
            .map(|(k, (n, e))| (k, json!({ "spanCount": n, "errorCount": e })))
            .collect::<serde_json::Map<String, Value>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_carry_the_spanset_logic() {
        let q = traceql::parse(r#"{ span.gen_ai.tool.name = "a" } && { status = error }"#)
            .expect("parses");
        let c: Vec<String> = q
            .spansets()
            .into_iter()
            .map(|e| traceql::expr_sql(e).expect("sql"))
            .collect();
        let range = Range::from_params(Some("1700000000"), Some("1700003600")).expect("range");
        let (t, s) = statements(&q, &c, &range, 20);
        assert!(t.contains("HAVING (m0 AND m1)"), "{t}");
        assert!(t.contains("bool_or(tool = 'a') AS m0"), "{t}");
        assert!(t.contains("start_time >= '2023-11-14T22:13:20Z'"), "{t}");
        assert!(t.ends_with("LIMIT 20"), "{t}");
        let s = s(&["ab".into(), "x'; DROP".into()]);
        assert!(s.contains("trace_id IN ('ab')"), "{s}");
    }
}
