//! `GET /tools/{tool}?since=&until=`: how one tool fails. Its calls, failures, retries,
//! recoveries and latency (p50, p95, p99) over the range; charts of the failure rate per
//! stage, calls and failed calls, and latency over time ([`super::chart`]); the top error
//! codes, each a link to its calls; the versions that called it, each pair a link to the
//! compare page; the shapes of its answers and what changed in them ([`super::shapes`]); and
//! the calls whose result leaked internals to the model.

use std::collections::HashMap;
use std::sync::Arc;
use toolspan_schema::vocab::FAILED_SQL;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use chrono::{DateTime, SecondsFormat, Utc};
use maud::{html, Markup};

use super::compare::compare_href;
use super::page::{self, duration, ok, query, reference_href, trace_href, PageResult};
use super::series::{self, Buckets, Histogram, HistogramCols, STAGES};
use crate::http::error::ApiError;
use crate::http::search::{literal, parse_time};
use crate::http::AppState;
use toolspan_query::rows::Cols;

/// The range shown when `since` is absent.
pub const DEFAULT_SINCE: &str = "24h";

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

/// A validated range: `since` (default [`DEFAULT_SINCE`]) to `until` (default now).
pub fn range(
    since: Option<&str>,
    until: Option<&str>,
    now: DateTime<Utc>,
) -> Result<(DateTime<Utc>, DateTime<Utc>), ApiError> {
    let since = parse_time(
        "since",
        since
            .filter(|s| !s.trim().is_empty())
            .unwrap_or(DEFAULT_SINCE),
        now,
    )?;
    let until = match until.filter(|s| !s.trim().is_empty()) {
        Some(u) => parse_time("until", u, now)?,
        None => now,
    };
    if until <= since {
        return Err(ApiError::invalid_argument("`since` must be before `until`"));
    }
    Ok((since, until))
}

/// The condition on `spans` (columns prefixed with `p`) of a range, partitions first.
pub fn range_sql(p: &str, since: DateTime<Utc>, until: DateTime<Utc>) -> String {
    format!(
        "{p}date >= '{}' AND {p}date <= '{}' AND {p}start_time >= '{}' AND {p}start_time < '{}'",
        since.format("%Y-%m-%d"),
        until.format("%Y-%m-%d"),
        ts(since),
        ts(until)
    )
}

/// A version that called the tool.
struct Version {
    service: String,
    version: String,
    calls: i64,
    failed: i64,
    p50: f64,
    p95: f64,
}

/// A version's sort key: its dot- or dash-separated parts, numbers by value (`1.10.0` after
/// `1.9.2`), other parts as text after numbers.
pub fn version_key(v: &str) -> Vec<(u64, String)> {
    v.split(['.', '-', '+'])
        .map(|part| match part.parse::<u64>() {
            Ok(n) => (n, String::new()),
            Err(_) => (u64::MAX, part.to_string()),
        })
        .collect()
}

/// The statements of a tool page besides its charts ([`series::load`]) and answer shapes
/// ([`super::shapes::load`]); all of them run at once.
pub struct Statements {
    /// The condition on `spans` of the tool's spans in the range (the charts' scope).
    pub scope: String,
    /// The top error codes of its failed calls.
    pub codes: String,
    /// Calls, failed, retried, recovered after retry, retries exhausted, leaked.
    pub totals: String,
    /// A latency histogram per service and version ([`series::HISTOGRAM_SQL`]).
    pub latency: String,
    /// Calls and failed calls per service and version.
    pub versions: String,
    /// The newest calls that leaked internals.
    pub leaks: String,
}

/// The statements of the page of `tool` over `[since, until)`.
pub fn statements(tool: &str, since: DateTime<Utc>, until: DateTime<Utc>) -> Statements {
    let scope = format!(
        "tool = {} AND {}",
        literal(tool),
        range_sql("", since, until)
    );
    let cscope = format!(
        "c.tool = {} AND {}",
        literal(tool),
        range_sql("c.", since, until)
    );
    // Codes are the call's own columns: read from the call spans, not the `calls` view.
    let codes = format!(
        "SELECT coalesce(error_code, '(none)') AS code, error_type, count(*) AS n, \
         max(reference) AS reference FROM spans c WHERE c.stage = 'call' AND {cscope} \
         AND {FAILED_SQL} GROUP BY 1, 2 ORDER BY n DESC, code LIMIT 10"
    );
    // The totals need what attempts add: this tool's calls in the range, with this tool's
    // attempts from (just before) the range's start.
    let totals = toolspan_query::views::call_totals_query(
        &|p| {
            Some(format!(
                "{p}tool = {} AND {}",
                literal(tool),
                range_sql(p, since, until)
            ))
        },
        Some(&toolspan_query::views::attempts_of_tool(
            tool,
            Some(since),
            Some(until.date_naive()),
        )),
    );
    let latency = format!(
        "SELECT coalesce(service, '') AS service, coalesce(service_version, '') AS version, \
         {} FROM spans WHERE {scope} AND stage = 'call' GROUP BY 1, 2, 3",
        series::HISTOGRAM_SQL
    );
    let versions = format!(
        "SELECT coalesce(service, '') AS service, coalesce(service_version, '') AS version, \
         count(*) AS calls, sum(CASE WHEN {FAILED_SQL} THEN 1 ELSE 0 END) AS failed, \
         min(start_time_unix_nano) AS first_seen FROM spans WHERE {scope} AND stage = 'call' \
         GROUP BY 1, 2 ORDER BY 1, first_seen LIMIT 50"
    );
    let leaks = format!(
        "SELECT trace_id, span_id, start_time_unix_nano AS start_ns, error_code, reference, \
         duration_ms FROM spans WHERE {scope} AND stage = 'call' AND leaked_internals \
         ORDER BY start_time DESC LIMIT 10"
    );
    Statements {
        scope,
        codes,
        totals,
        latency,
        versions,
        leaks,
    }
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
    let (since, until) = range(p.since.as_deref(), p.until.as_deref(), Utc::now())?;
    let buckets = Buckets::new(since, until);
    let sql = statements(&tool, since, until);
    let since_text = since.to_rfc3339_opts(SecondsFormat::Micros, true);
    let (charts, codes, totals, latency, versions, leaks, shapes) = tokio::join!(
        series::load(&state.service, &buckets, &sql.scope),
        state.service.query(&sql.codes),
        state.service.query(&sql.totals),
        state.service.query(&sql.latency),
        state.service.query(&sql.versions),
        state.service.query(&sql.leaks),
        super::shapes::load(&state.service, &tool, &since_text),
    );
    let (charts, codes, totals, latency, versions, leaks, shapes) = (
        charts?, codes?, totals?, latency?, versions?, leaks?, shapes?,
    );

    let mut code_rows = Vec::new();
    for b in &codes.batches {
        let c = Cols::new(b);
        let (code, et, n, r) = (
            c.text("code")?,
            c.text("error_type")?,
            c.int("n")?,
            c.text("reference")?,
        );
        for i in 0..b.num_rows() {
            code_rows.push((
                code.str(i).unwrap_or("").to_string(),
                et.str(i).unwrap_or("").to_string(),
                n.i64(i).unwrap_or(0),
                r.str(i).map(str::to_string),
            ));
        }
    }
    let mut t = [0i64; 6];
    if let Some(b) = totals.batches.iter().find(|b| b.num_rows() > 0) {
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
            t[k] = c.int(name)?.i64(0).unwrap_or(0);
        }
    }
    // Latency per service and version, and over all of them.
    let mut by_version: HashMap<(String, String), Histogram> = HashMap::new();
    let mut all = Histogram::default();
    for b in &latency.batches {
        let c = Cols::new(b);
        let (s, v, h) = (
            c.text("service")?,
            c.text("version")?,
            HistogramCols::new(&c)?,
        );
        for i in 0..b.num_rows() {
            let key = (
                s.str(i).unwrap_or("").to_string(),
                v.str(i).unwrap_or("").to_string(),
            );
            by_version.entry(key).or_default().add_rows(&h, i);
        }
    }
    by_version.values().for_each(|h| all.merge(h));
    let lat = all.latency();
    let mut version_rows = Vec::new();
    for b in &versions.batches {
        let c = Cols::new(b);
        let (s, v, n, f) = (
            c.text("service")?,
            c.text("version")?,
            c.int("calls")?,
            c.int("failed")?,
        );
        for i in 0..b.num_rows() {
            let (service, version) = (
                s.str(i).unwrap_or("").to_string(),
                v.str(i).unwrap_or("").to_string(),
            );
            let l = by_version
                .get(&(service.clone(), version.clone()))
                .map(Histogram::latency)
                .unwrap_or_default();
            version_rows.push(Version {
                service,
                version,
                calls: n.i64(i).unwrap_or(0),
                failed: f.i64(i).unwrap_or(0),
                p50: l.p50,
                p95: l.p95,
            });
        }
    }
    version_rows.sort_by(|a, b| {
        (a.service.as_str(), version_key(&a.version))
            .cmp(&(b.service.as_str(), version_key(&b.version)))
    });
    let mut leak_rows = Vec::new();
    for b in &leaks.batches {
        let c = Cols::new(b);
        let (tr, s, st, code, r, d) = (
            c.text("trace_id")?,
            c.text("span_id")?,
            c.int("start_ns")?,
            c.text("error_code")?,
            c.text("reference")?,
            c.float("duration_ms")?,
        );
        for i in 0..b.num_rows() {
            leak_rows.push((
                tr.str(i).unwrap_or("").to_string(),
                s.str(i).unwrap_or("").to_string(),
                st.i64(i).unwrap_or(0),
                code.str(i).map(str::to_string),
                r.str(i).map(str::to_string),
                d.f64(i).unwrap_or(0.0),
            ));
        }
    }
    let (raw_since, raw_until) = (
        p.since.as_deref().unwrap_or(""),
        p.until.as_deref().unwrap_or(""),
    );
    let search = |code: &str| {
        format!(
            "/{}",
            query(&[
                ("tool", &tool),
                ("error_code", code),
                (
                    "since",
                    if raw_since.is_empty() {
                        DEFAULT_SINCE
                    } else {
                        raw_since
                    }
                ),
                ("until", raw_until)
            ])
        )
    };
    let pct = |n: i64, of: i64| {
        if of > 0 {
            format!("{:.1} %", 100.0 * n as f64 / of as f64)
        } else {
            "–".to_string()
        }
    };
    let body: Markup = html! {
        h1 { "Tool " span.mono { (tool) } }
        p.links {
            a href=(search("")) { "failed calls of this tool →" }
            " · "
            a.export href=(crate::http::evals::href(&tool, None, None)) download title="its failures grouped by fingerprint, as a toolspan.evals/1 file for python -m toolspan evals run" { "Export as eval cases" }
        }
        form.filters method="get" action=(page::tool_href(&tool)) {
            label { "since" input type="text" name="since" value=(raw_since) placeholder=(DEFAULT_SINCE) maxlength="64"; }
            label { "until" input type="text" name="until" value=(raw_until) placeholder="now" maxlength="64"; }
            button type="submit" { "show" }
        }
        section.totals {
            dl.kv {
                dt { "calls" } dd.calls { (t[0]) }
                dt { "failed" } dd.failed { (t[1]) span.muted { " (" (pct(t[1], t[0])) ")" } }
                dt { "retried" } dd { (t[2]) }
                dt { "recovered after retry" } dd.recovered { (t[3]) }
                dt { "retries exhausted" } dd { (t[4]) }
                dt { "leaked internals to the model" } dd.leaked { (t[5]) }
                dt { "latency" } dd.latency {
                    @if t[0] > 0 {
                        "p50 " span.p50 { (duration(lat.p50)) } ", p95 " span.p95 { (duration(lat.p95)) } ", p99 " span.p99 { (duration(lat.p99)) }
                    } @else { "–" }
                }
            }
        }
        (super::chart::all(&buckets, &charts))
        section.rates {
            h2 { "Failure rate per stage" }
            table.stage-totals {
                thead { tr { th { "stage" } th.num { "spans" } th.num { "failed" } th.num { "rate" } } }
                tbody {
                    @for stage in STAGES {
                        @if let Some(s) = charts.stages.get(stage) {
                            @let n: f64 = s.values().map(|v| v.spans).sum();
                            @let failed: f64 = s.values().map(|v| v.failed).sum();
                            tr data-stage=(stage) {
                                td { (stage) }
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
                table.codes {
                    thead { tr { th { "code" } th { "error type" } th.num { "calls" } th { "latest reference" } } }
                    tbody { @for (code, et, n, r) in &code_rows {
                        tr {
                            td { a href=(search(if code == "(none)" { "" } else { code })) { code { (code) } } }
                            td { (et) } td.num { (n) }
                            td { @if let Some(r) = r { a.mono href=(reference_href(r)) { (r) } } }
                        }
                    } }
                }
            }
        }
        section.versions {
            h2 { "Versions" }
            @if version_rows.is_empty() { p.muted { "No calls in this range." } } @else {
                table.versions {
                    thead { tr { th { "service" } th { "version" } th.num { "calls" } th.num { "failed" } th.num { "p50" } th.num { "p95" } th { "" } } }
                    tbody { @for (i, v) in version_rows.iter().enumerate() {
                        tr {
                            td { (v.service) } td { (v.version) }
                            td.num { (v.calls) } td.num { (pct(v.failed, v.calls)) }
                            td.num { (duration(v.p50)) } td.num { (duration(v.p95)) }
                            td {
                                @if let Some(prev) = i.checked_sub(1).map(|j| &version_rows[j]).filter(|w| w.service == v.service && !w.version.is_empty() && !v.version.is_empty()) {
                                    a.compare href=(compare_href(&tool, &v.service, &prev.version, &v.version, raw_since, raw_until)) {
                                        "compare " (prev.version) " → " (v.version)
                                    }
                                }
                            }
                        }
                    } }
                }
            }
        }
        (super::shapes::section(&tool, shapes.as_deref()))
        section.leaks {
            h2 { "Leaks of internals" }
            @if leak_rows.is_empty() { p.muted { "No call of this tool returned stack frames, paths or SQL to the model in this range." } } @else {
                table {
                    thead { tr { th { "time" } th { "code" } th { "reference" } th.num { "duration" } th {} } }
                    tbody { @for (tr, s, st, code, r, d) in &leak_rows {
                        tr {
                            td { (page::time(*st)) }
                            td { @if let Some(c) = code { code { (c) } } }
                            td { @if let Some(r) = r { a.mono href=(reference_href(r)) { (r) } } }
                            td.num { (duration(*d)) }
                            td { a href=(trace_href(tr, Some(s))) { "trace →" } }
                        }
                    } }
                }
            }
        }
    };
    ok(&format!("tool {tool}"), body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_sort_by_their_numbers() {
        let mut v = vec!["1.10.0", "1.5.0", "1.4.2", "2.0.0-rc1", "1.9"];
        v.sort_by_key(|v| version_key(v));
        assert_eq!(v, ["1.4.2", "1.5.0", "1.9", "1.10.0", "2.0.0-rc1"]);
    }
}
