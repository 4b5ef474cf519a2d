//! Tag and tag-value autocompletion for Grafana's TraceQL editor: the attributes toolspan
//! keeps in columns are always offered; other attribute names and values come from a sample
//! of the spans in the range.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use serde_json::{json, Value};

use super::traceql::{self, Field, Kind, COLUMN_ATTRIBUTES};
use super::{params, Range, RangeParams};
use crate::http::error::ApiError;
use crate::http::AppState;
use toolspan_query::rows;
use toolspan_query::sql::literal;

/// Spans read to find attribute names and values outside the columns.
pub const SAMPLE_SPANS: usize = 2000;
/// Values returned for one tag at most.
pub const MAX_VALUES: usize = 1000;

/// Intrinsic fields the TraceQL subset compares.
pub const INTRINSICS: [&str; 4] = ["duration", "kind", "name", "status"];

fn span_keys() -> BTreeSet<String> {
    COLUMN_ATTRIBUTES
        .iter()
        .filter(|(k, _, _)| {
            *k != "service.name" && *k != "tool.name" && *k != "toolspan.error.type"
        })
        .map(|(k, _, _)| (*k).to_string())
        .collect()
}

/// Keys of the JSON objects in `column` over a sample of the range.
async fn sampled_keys(
    state: &AppState,
    column: &str,
    range: &Range,
) -> Result<BTreeSet<String>, ApiError> {
    let sql = format!(
        "SELECT {column} FROM spans WHERE {} AND {column} <> '{{}}' LIMIT {SAMPLE_SPANS}",
        range.sql()
    );
    let texts = rows::first_texts(&state.service.query(&sql).await?)?;
    let mut keys = BTreeSet::new();
    for t in texts {
        if let Ok(Value::Object(m)) = serde_json::from_str::<Value>(&t) {
            keys.extend(m.keys().cloned());
        }
    }
    Ok(keys)
}

async fn scopes(
    state: &AppState,
    range: &Range,
) -> Result<(BTreeSet<String>, BTreeSet<String>), ApiError> {
    let mut span = span_keys();
    span.extend(sampled_keys(state, "attributes", range).await?);
    let mut resource: BTreeSet<String> = ["service.name".to_string(), "service.version".into()]
        .into_iter()
        .collect();
    resource.extend(sampled_keys(state, "resource_attributes", range).await?);
    Ok((span, resource))
}

/// `GET /api/v2/search/tags`: `{"scopes": [{"name", "tags"}]}` for `span`, `resource` and
/// `intrinsic` (or the one `scope=` names).
pub async fn tags_v2(
    State(state): State<Arc<AppState>>,
    p: Result<Query<RangeParams>, QueryRejection>,
) -> Result<axum::Json<Value>, ApiError> {
    let p = params(p)?;
    let range = Range::from_params(p.start.as_deref(), p.end.as_deref())?;
    let scope = p.scope.as_deref().unwrap_or("").to_ascii_lowercase();
    if !matches!(
        scope.as_str(),
        "" | "all" | "none" | "span" | "resource" | "intrinsic"
    ) {
        return Err(ApiError::invalid_argument(
            "`scope` is span, resource, intrinsic or all",
        ));
    }
    let (span, resource) = scopes(&state, &range).await?;
    let mut out = Vec::new();
    let all = matches!(scope.as_str(), "" | "all" | "none");
    if all || scope == "span" {
        out.push(json!({ "name": "span", "tags": span }));
    }
    if all || scope == "resource" {
        out.push(json!({ "name": "resource", "tags": resource }));
    }
    if all || scope == "intrinsic" {
        out.push(json!({ "name": "intrinsic", "tags": INTRINSICS }));
    }
    Ok(axum::Json(json!({ "scopes": out })))
}

/// `GET /api/search/tags`: `{"tagNames": […]}`, span and resource attribute names together.
pub async fn tags_v1(
    State(state): State<Arc<AppState>>,
    p: Result<Query<RangeParams>, QueryRejection>,
) -> Result<axum::Json<Value>, ApiError> {
    let p = params(p)?;
    let range = Range::from_params(p.start.as_deref(), p.end.as_deref())?;
    let (mut span, resource) = scopes(&state, &range).await?;
    span.extend(resource);
    Ok(axum::Json(json!({ "tagNames": span })))
}

/// A typed value as Tempo's v2 answer has it.
struct Typed {
    kind: &'static str,
    value: String,
}

/// Distinct values of a column in the range.
async fn column_values(
    state: &AppState,
    column: &str,
    range: &Range,
) -> Result<Vec<String>, ApiError> {
    let sql = format!(
        "SELECT DISTINCT CAST({column} AS VARCHAR) AS v FROM spans WHERE {} AND {column} IS NOT NULL \
         ORDER BY v LIMIT {}",
        range.sql(),
        MAX_VALUES + 1
    );
    let mut values = rows::first_texts(&state.service.query(&sql).await?)?;
    values.retain(|v| column != "tool" || v != toolspan_schema::columns::NO_TOOL);
    values.truncate(MAX_VALUES);
    Ok(values)
}

/// Values of `key` inside the JSON objects of `column`, over a sample of the range.
async fn sampled_values(
    state: &AppState,
    column: &str,
    key: &str,
    range: &Range,
) -> Result<Vec<Typed>, ApiError> {
    let mut needle = String::new();
    needle.push('"');
    needle.push_str(&key.replace('\\', "\\\\").replace('"', "\\\""));
    needle.push_str("\":");
    let sql = format!(
        "SELECT {column} FROM spans WHERE {} AND strpos({column}, {}) > 0 LIMIT {SAMPLE_SPANS}",
        range.sql(),
        literal(&needle)
    );
    let texts = rows::first_texts(&state.service.query(&sql).await?)?;
    let mut seen: BTreeSet<(String, &'static str)> = BTreeSet::new();
    for t in texts {
        if let Ok(Value::Object(m)) = serde_json::from_str::<Value>(&t) {
            let typed = match m.get(key) {
                Some(Value::String(s)) => Some((s.clone(), "string")),
                Some(Value::Bool(b)) => Some((b.to_string(), "bool")),
                Some(Value::Number(n)) if n.is_i64() => Some((n.to_string(), "int")),
                Some(Value::Number(n)) => Some((n.to_string(), "float")),
                _ => None,
            };
            if let Some(t) = typed {
                seen.insert(t);
            }
        }
        if seen.len() >= MAX_VALUES {
            break;
        }
    }
    Ok(seen
        .into_iter()
        .map(|(value, kind)| Typed { kind, value })
        .collect())
}

async fn values_of(state: &AppState, field: &Field, range: &Range) -> Result<Vec<Typed>, ApiError> {
    let typed = |values: Vec<String>, kind: &'static str| {
        values
            .into_iter()
            .map(|value| Typed { kind, value })
            .collect::<Vec<_>>()
    };
    let keywords = |words: &[&str]| {
        words
            .iter()
            .map(|w| Typed {
                kind: "keyword",
                value: (*w).to_string(),
            })
            .collect::<Vec<_>>()
    };
    Ok(match field {
        Field::Status => keywords(&["error", "ok", "unset"]),
        Field::Kind => keywords(&[
            "client",
            "consumer",
            "internal",
            "producer",
            "server",
            "unspecified",
        ]),
        Field::Duration => Vec::new(),
        Field::Name => typed(column_values(state, "name", range).await?, "string"),
        Field::Resource(k) if k == "service.name" => {
            typed(column_values(state, "service", range).await?, "string")
        }
        Field::Resource(k) if k == "service.version" => typed(
            column_values(state, "service_version", range).await?,
            "string",
        ),
        Field::Resource(k) => sampled_values(state, "resource_attributes", k, range).await?,
        Field::Span(k) => match COLUMN_ATTRIBUTES.iter().find(|(key, _, _)| key == k) {
            Some((_, column, kind)) => typed(
                column_values(state, column, range).await?,
                match kind {
                    Kind::Text => "string",
                    Kind::Number => "int",
                    Kind::Bool => "bool",
                },
            ),
            None => sampled_values(state, "attributes", k, range).await?,
        },
    })
}

fn parse_tag(tag: &str) -> Result<Field, ApiError> {
    if tag.is_empty() || tag.len() > 256 || tag.chars().any(char::is_control) {
        return Err(ApiError::invalid_argument(
            "a tag is an attribute name of at most 256 characters",
        ));
    }
    traceql::field(tag, 0).map_err(|e| ApiError::invalid_argument(e.to_string()))
}

/// `GET /api/v2/search/tag/{tag}/values` (`span.gen_ai.tool.name`, `resource.service.name`,
/// `status`, …): `{"tagValues": [{"type", "value"}]}`.
pub async fn values_v2(
    State(state): State<Arc<AppState>>,
    Path(tag): Path<String>,
    p: Result<Query<RangeParams>, QueryRejection>,
) -> Result<axum::Json<Value>, ApiError> {
    let p = params(p)?;
    let range = Range::from_params(p.start.as_deref(), p.end.as_deref())?;
    let field = parse_tag(&tag)?;
    let values = values_of(&state, &field, &range).await?;
    Ok(axum::Json(json!({
        "tagValues": values
            .into_iter()
            .map(|t| json!({ "type": t.kind, "value": t.value }))
            .collect::<Vec<_>>(),
    })))
}

/// `GET /api/search/tag/{tag}/values` (an unscoped name: `service.name`,
/// `gen_ai.tool.name`, …): `{"tagValues": ["…"]}`.
pub async fn values_v1(
    State(state): State<Arc<AppState>>,
    Path(tag): Path<String>,
    p: Result<Query<RangeParams>, QueryRejection>,
) -> Result<axum::Json<Value>, ApiError> {
    let p = params(p)?;
    let range = Range::from_params(p.start.as_deref(), p.end.as_deref())?;
    let field = match tag.as_str() {
        "service.name" | "service.version" => Field::Resource(tag.clone()),
        "status" | "name" | "kind" | "duration" => parse_tag(&tag)?,
        _ => match parse_tag(&format!(".{tag}"))? {
            Field::Span(k) => Field::Span(k),
            other => other,
        },
    };
    let values = values_of(&state, &field, &range).await?;
    Ok(axum::Json(json!({
        "tagValues": values.into_iter().map(|t| t.value).collect::<Vec<_>>(),
    })))
}
