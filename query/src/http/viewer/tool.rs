//! `GET /tools/{tool}?since=&until=`: how one tool fails. Failure rate per stage over time
//! (24 buckets over the range), the top error codes, how many calls recovered after a retry
//! and how many exhausted their retries, and the calls whose result leaked internals to the
//! model.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use chrono::{DateTime, SecondsFormat, Utc};
use maud::{html, Markup};

use super::page::{self, duration, ok, query, reference_href, tool_href, trace_href, PageResult};
use crate::http::error::ApiError;
use crate::http::rows::Cols;
use crate::http::search::{literal, parse_time};
use crate::http::AppState;

/// Buckets of the rate chart.
pub const BUCKETS: i64 = 24;
/// Stages charted.
pub const STAGES: [&str; 6] = ["call", "attempt", "prepare", "send", "execute", "parse"];

/// The tool page's parameters.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolParams {
    /// Start of the range (default 24h).
    pub since: Option<String>,
    /// End of the range (default now).
    pub until: Option<String>,
}

fn ts(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// `GET /tools/{tool}`
pub async fn page(
    State(state): State<Arc<AppState>>,
    Path(tool): Path<String>,
    params: Result<Query<ToolParams>, QueryRejection>,
) -> PageResult {
    let params = params.map_err(|e| {
        ApiError::new(
            toolspan_schema::Code::InvalidArgument,
            "invalid parameters: the tool page takes since and until",
            e,
        )
    })?;
    if tool.is_empty() || tool.chars().count() > 256 || tool.chars().any(char::is_control) {
        return Err(ApiError::invalid_argument("a tool name is 1 to 256 characters").into());
    }
    let Query(p) = params;
    let now = Utc::now();
    let since = parse_time(
        "since",
        p.since
            .as_deref()
            .filter(|s| !s.is_empty())
            .unwrap_or("24h"),
        now,
    )?;
    let until = match p.until.as_deref().filter(|s| !s.is_empty()) {
        Some(u) => parse_time("until", u, now)?,
        None => now,
    };
    if until <= since {
        return Err(ApiError::invalid_argument("`since` must be before `until`").into());
    }
    let bucket_secs = ((until - since).num_seconds() / BUCKETS).max(1);
    let t = literal(&tool);
    let range = |p: &str| {
        format!(
            "{p}tool = {t} AND {p}date >= '{}' AND {p}date <= '{}' AND {p}start_time >= '{}' AND {p}start_time < '{}'",
            since.format("%Y-%m-%d"),
            until.format("%Y-%m-%d"),
            ts(since),
            ts(until)
        )
    };
    // Buckets in whole seconds since the epoch, whatever the column's time unit.
    let rates_sql = format!(
        "SELECT CAST(to_unixtime(start_time) AS BIGINT) / {bucket_secs} * {bucket_secs} AS bucket_s, \
         stage, sum(sample_weight) AS n, sum(CASE WHEN status = 'error' THEN sample_weight ELSE 0 END) AS failed \
         FROM spans WHERE {} AND stage IN ({}) GROUP BY 1, 2 ORDER BY 1",
        range(""),
        STAGES.map(|s| format!("'{s}'")).join(", ")
    );
    let codes_sql = format!(
        "SELECT coalesce(error_code, '(none)') AS code, error_type, count(*) AS n FROM calls c \
         WHERE {} AND status = 'error' GROUP BY 1, 2 ORDER BY n DESC LIMIT 10",
        range("c.")
    );
    let retry_sql = format!(
        "SELECT count(*) AS calls, \
         sum(CASE WHEN status = 'error' THEN 1 ELSE 0 END) AS failed, \
         sum(CASE WHEN attempts > 1 THEN 1 ELSE 0 END) AS retried, \
         sum(CASE WHEN recovered_after_retry THEN 1 ELSE 0 END) AS recovered, \
         sum(CASE WHEN error_type = 'RETRY_EXHAUSTED' THEN 1 ELSE 0 END) AS exhausted, \
         sum(CASE WHEN leaked_internals THEN 1 ELSE 0 END) AS leaked \
         FROM calls c WHERE {}",
        range("c.")
    );
    let leaks_sql = format!(
        "SELECT trace_id, span_id, CAST(start_time AS BIGINT) AS start_us, error_code, reference, \
         duration_ms FROM spans WHERE {} AND stage = 'call' AND leaked_internals \
         ORDER BY start_time DESC LIMIT 10",
        range("")
    );
    let (rates, codes, retry, leaks) = tokio::join!(
        state.service.query(&rates_sql),
        state.service.query(&codes_sql),
        state.service.query(&retry_sql),
        state.service.query(&leaks_sql),
    );
    let (rates, codes, retry, leaks) = (rates?, codes?, retry?, leaks?);

    // stage -> bucket -> (n, failed)
    let mut series: BTreeMap<String, BTreeMap<i64, (f64, f64)>> = BTreeMap::new();
    for b in &rates.batches {
        let c = Cols::new(b);
        let (bucket, stage, n, failed) = (
            c.int("bucket_s")?,
            c.text("stage")?,
            c.float("n")?,
            c.float("failed")?,
        );
        for i in 0..b.num_rows() {
            series
                .entry(stage.str(i).unwrap_or("").to_string())
                .or_default()
                .insert(
                    bucket.i64(i).unwrap_or(0),
                    (n.f64(i).unwrap_or(0.0), failed.f64(i).unwrap_or(0.0)),
                );
        }
    }
    let mut code_rows = Vec::new();
    for b in &codes.batches {
        let c = Cols::new(b);
        let (code, et, n) = (c.text("code")?, c.text("error_type")?, c.int("n")?);
        for i in 0..b.num_rows() {
            code_rows.push((
                code.str(i).unwrap_or("").to_string(),
                et.str(i).unwrap_or("").to_string(),
                n.i64(i).unwrap_or(0),
            ));
        }
    }
    let mut totals = [0i64; 6];
    if let Some(b) = retry.batches.iter().find(|b| b.num_rows() > 0) {
        let c = Cols::new(b);
        for (k, name) in [
            "calls",
            "failed",
            "retried",
            "recovered",
            "exhausted",
            "leaked",
        ]
        .iter()
        .enumerate()
        {
            totals[k] = c.int(name)?.i64(0).unwrap_or(0);
        }
    }
    let mut leak_rows = Vec::new();
    for b in &leaks.batches {
        let c = Cols::new(b);
        let (t, s, st, code, r, d) = (
            c.text("trace_id")?,
            c.text("span_id")?,
            c.int("start_us")?,
            c.text("error_code")?,
            c.text("reference")?,
            c.float("duration_ms")?,
        );
        for i in 0..b.num_rows() {
            leak_rows.push((
                t.str(i).unwrap_or("").to_string(),
                s.str(i).unwrap_or("").to_string(),
                st.i64(i).unwrap_or(0),
                code.str(i).map(str::to_string),
                r.str(i).map(str::to_string),
                d.f64(i).unwrap_or(0.0),
            ));
        }
    }
    let start_bucket = since.timestamp().div_euclid(bucket_secs) * bucket_secs;
    let buckets: Vec<i64> = (0..=BUCKETS)
        .map(|k| start_bucket + k * bucket_secs)
        .collect();
    let search = format!(
        "/{}",
        query(&[
            ("tool", &tool),
            ("since", p.since.as_deref().unwrap_or("")),
            ("until", p.until.as_deref().unwrap_or(""))
        ])
    );
    let body: Markup = html! {
        h1 { "Tool " span.mono { (tool) } }
        p { a href=(search) { "failed calls of this tool →" } }
        section.retries {
            h2 { "Calls" }
            dl.kv {
                dt { "calls" } dd { (totals[0]) }
                dt { "failed" } dd { (totals[1]) @if totals[0] > 0 { span.muted { " (" (format!("{:.1}", 100.0 * totals[1] as f64 / totals[0] as f64)) " %)" } } }
                dt { "retried" } dd { (totals[2]) }
                dt { "recovered after retry" } dd.recovered { (totals[3]) }
                dt { "retries exhausted" } dd { (totals[4]) }
                dt { "leaked internals to the model" } dd.leaked { (totals[5]) }
            }
        }
        section.rates {
            h2 { "Failure rate per stage" }
            p.muted { "Share of spans that failed, per " (duration(bucket_secs as f64 * 1000.0)) "." }
            table {
                thead { tr { th { "stage" } th { "rate over time" } th.num { "spans" } th.num { "failed" } th.num { "rate" } } }
                tbody {
                    @for stage in STAGES {
                        @if let Some(s) = series.get(stage) {
                            @let n: f64 = s.values().map(|v| v.0).sum();
                            @let failed: f64 = s.values().map(|v| v.1).sum();
                            tr {
                                td { (stage) }
                                td { (spark(stage, s, &buckets)) }
                                td.num { (format!("{n:.0}")) }
                                td.num { (format!("{failed:.0}")) }
                                td.num { (format!("{:.1} %", if n > 0.0 { 100.0 * failed / n } else { 0.0 })) }
                            }
                        }
                    }
                }
            }
        }
        section.codes {
            h2 { "Top error codes" }
            @if code_rows.is_empty() { p.muted { "No failed calls in this range." } } @else {
                table {
                    thead { tr { th { "code" } th { "error type" } th.num { "calls" } } }
                    tbody { @for (code, et, n) in &code_rows {
                        tr {
                            td { a href=(format!("/{}", query(&[("tool", &tool), ("error_code", if code == "(none)" { "" } else { code })]))) { code { (code) } } }
                            td { (et) } td.num { (n) }
                        }
                    } }
                }
            }
        }
        section.leaks {
            h2 { "Leaks of internals" }
            @if leak_rows.is_empty() { p.muted { "No call of this tool returned stack frames, paths or SQL to the model in this range." } } @else {
                table {
                    thead { tr { th { "time" } th { "code" } th { "reference" } th.num { "duration" } th {} } }
                    tbody { @for (t, s, st, code, r, d) in &leak_rows {
                        tr {
                            td { (page::time(st.saturating_mul(1000))) }
                            td { @if let Some(c) = code { code { (c) } } }
                            td { @if let Some(r) = r { a.mono href=(reference_href(r)) { (r) } } }
                            td.num { (duration(*d)) }
                            td { a href=(trace_href(t, Some(s))) { "trace →" } }
                        }
                    } }
                }
            }
        }
        p.muted { a href=(tool_href(&tool)) { "last 24 hours" } }
    };
    ok(&format!("tool {tool}"), body)
}

/// A sparkline of the failure rate over the buckets (0 to 100 % bottom to top), as SVG
/// attributes only (the policy admits no inline style). The figures drawn are on the element
/// too: `data-buckets` (each bucket's start, seconds since the epoch) and `data-rates`.
fn spark(stage: &str, s: &BTreeMap<i64, (f64, f64)>, buckets: &[i64]) -> Markup {
    let w = 240.0;
    let h = 36.0;
    let step = w / (buckets.len().max(2) - 1) as f64;
    let rates: Vec<f64> = buckets
        .iter()
        .map(|b| {
            s.get(b)
                .map_or(0.0, |(n, f)| if *n > 0.0 { f / n } else { 0.0 })
        })
        .collect();
    let points: Vec<String> = rates
        .iter()
        .enumerate()
        .map(|(k, rate)| format!("{:.1},{:.1}", k as f64 * step, h - 2.0 - rate * (h - 4.0)))
        .collect();
    let starts: Vec<String> = buckets.iter().map(i64::to_string).collect();
    let figures: Vec<String> = rates.iter().map(|r| format!("{r:.6}")).collect();
    html! {
        svg.spark viewBox="0 0 240 36" preserveAspectRatio="none" role="img"
            data-stage=(stage) data-buckets=(starts.join(" ")) data-rates=(figures.join(" ")) {
            title { "failure rate of " (stage) " spans over the range" }
            polyline points=(points.join(" ")) {}
        }
    }
}
