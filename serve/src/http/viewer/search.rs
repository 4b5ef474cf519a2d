//! `GET /`: failed calls (the `calls` view), newest first, filtered by tool, failing stage,
//! error type, error code, service, version and time range, 50 a page; above them the counts
//! per failing stage and per error type over the same range, each a filter link.

use std::sync::Arc;
use toolspan_schema::vocab::{failed_sql, FAILED_SQL};

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use chrono::{DateTime, SecondsFormat, Utc};
use maud::{html, Markup};
use toolspan_schema::{ErrorType, Stage};

use super::chart;
use super::filters::{self, DurationBound};
use super::page::{self, query, reference_href, status_badge, tool_href, PageResult};
use super::series::{self, Buckets};
use crate::http::error::ApiError;
use crate::http::search::{literal, parse_time};
use crate::http::AppState;
use toolspan_query::rows::Cols;

/// Calls per page.
pub const PAGE_SIZE: usize = 50;
/// The deepest page offered (keeps `OFFSET` bounded).
pub const MAX_PAGE: usize = 200;
/// The range searched when `since` is absent.
pub const DEFAULT_SINCE: &str = "24h";

/// The search page's parameters (all optional).
#[derive(Debug, Default, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Tool name.
    pub tool: Option<String>,
    /// Stage whose failure the call contains.
    pub stage: Option<String>,
    /// Error type of the call.
    pub error_type: Option<String>,
    /// Error code of the call.
    pub error_code: Option<String>,
    /// `service.name`.
    pub service: Option<String>,
    /// `service.version`.
    pub version: Option<String>,
    /// Start of the range (15m, 1h, 7d or a time).
    pub since: Option<String>,
    /// End of the range.
    pub until: Option<String>,
    /// `failed` (default) or `all`.
    pub status: Option<String>,
    /// Page number, from 0.
    pub page: Option<String>,
    /// Text in an error message, code, reference or trace id of the call's spans.
    pub q: Option<String>,
    /// Attribute filters, `key=value` separated by spaces.
    pub attr: Option<String>,
    /// Bounds on the call's duration: `> 1 s`, `>= 250 ms, < 5 s`.
    pub duration: Option<String>,
    /// Reload the page every this many seconds (10, 30 or 60).
    pub refresh: Option<String>,
}

/// Reload intervals offered, seconds.
pub const REFRESH_SECS: [&str; 3] = ["10", "30", "60"];

fn text_param(name: &str, v: &Option<String>) -> Result<Option<String>, ApiError> {
    let Some(v) = v.as_deref().map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    if v.chars().count() > 256 || v.chars().any(char::is_control) {
        return Err(ApiError::invalid_argument(format!(
            "`{name}` must be at most 256 characters without control characters"
        )));
    }
    Ok(Some(v.to_string()))
}

/// The validated filters.
#[derive(Debug, Clone)]
pub struct Filters {
    tool: Option<String>,
    stage: Option<&'static str>,
    error_type: Option<&'static str>,
    error_code: Option<String>,
    service: Option<String>,
    version: Option<String>,
    since: DateTime<Utc>,
    until: Option<DateTime<Utc>>,
    all: bool,
    page: usize,
    q: Option<String>,
    attrs: Vec<(String, String)>,
    durations: Vec<DurationBound>,
    refresh: Option<&'static str>,
    raw: Params,
}

impl Filters {
    /// Validates `p` against `now`.
    pub fn new(p: Params, now: DateTime<Utc>) -> Result<Filters, ApiError> {
        let stage = match text_param("stage", &p.stage)? {
            None => None,
            Some(s) => Some(
                Stage::parse(&s)
                    .map(Stage::as_str)
                    .filter(|s| Stage::WORK_NAMES.contains(s))
                    .ok_or_else(|| {
                        ApiError::invalid_argument(format!(
                            "`stage` is one of {}",
                            Stage::WORK_NAMES.join(", ")
                        ))
                    })?,
            ),
        };
        let error_type = match text_param("error_type", &p.error_type)? {
            None => None,
            Some(s) => Some(ErrorType::parse(&s).map(ErrorType::as_str).ok_or_else(|| {
                ApiError::invalid_argument(format!(
                    "`error_type` is one of {}",
                    ErrorType::ALL.map(ErrorType::as_str).join(", ")
                ))
            })?),
        };
        let since = parse_time(
            "since",
            p.since
                .as_deref()
                .filter(|s| !s.trim().is_empty())
                .unwrap_or(DEFAULT_SINCE),
            now,
        )?;
        let until = match p.until.as_deref().filter(|s| !s.trim().is_empty()) {
            Some(u) => Some(parse_time("until", u, now)?),
            None => None,
        };
        if until.is_some_and(|u| u <= since) {
            return Err(ApiError::invalid_argument("`since` must be before `until`"));
        }
        let all = match p.status.as_deref().unwrap_or("failed") {
            "" | "failed" => false,
            "all" => true,
            _ => return Err(ApiError::invalid_argument("`status` is failed or all")),
        };
        let page = match p.page.as_deref().filter(|s| !s.is_empty()) {
            None => 0,
            Some(n) => n
                .parse::<usize>()
                .ok()
                .filter(|n| *n <= MAX_PAGE)
                .ok_or_else(|| {
                    ApiError::invalid_argument(format!("`page` is a number from 0 to {MAX_PAGE}"))
                })?,
        };
        let attrs = match text_param("attr", &p.attr)? {
            Some(a) => filters::attributes(&a)?,
            None => Vec::new(),
        };
        let durations = match text_param("duration", &p.duration)? {
            Some(d) => filters::durations(&d)?,
            None => Vec::new(),
        };
        let refresh = match p
            .refresh
            .as_deref()
            .map(str::trim)
            .filter(|r| !r.is_empty())
        {
            None => None,
            Some(r) => Some(REFRESH_SECS.into_iter().find(|s| *s == r).ok_or_else(|| {
                ApiError::invalid_argument(format!(
                    "`refresh` is one of {} (seconds)",
                    REFRESH_SECS.join(", ")
                ))
            })?),
        };
        Ok(Filters {
            q: text_param("q", &p.q)?,
            attrs,
            durations,
            refresh,
            tool: text_param("tool", &p.tool)?,
            stage,
            error_type,
            error_code: text_param("error_code", &p.error_code)?,
            service: text_param("service", &p.service)?,
            version: text_param("version", &p.version)?,
            since,
            until,
            all,
            page,
            raw: p,
        })
    }

    fn time_sql(&self, t: &str) -> String {
        let mut w = vec![
            format!("{t}date >= '{}'", self.since.format("%Y-%m-%d")),
            format!("{t}start_time >= '{}'", rfc3339(self.since)),
        ];
        if let Some(u) = self.until {
            w.push(format!("{t}date <= '{}'", u.format("%Y-%m-%d")));
            w.push(format!("{t}start_time < '{}'", rfc3339(u)));
        }
        w.join(" AND ")
    }

    /// Conditions on the call spans (`spans` with alias `c`) for everything but the stage and
    /// error type, which the facets count over. Every one is on the call's own columns, so
    /// the page and its counts read `spans`, not the `calls` view (which would summarize the
    /// attempts of every call in the table first).
    fn base_sql(&self) -> Vec<String> {
        let mut w = vec!["c.stage = 'call'".to_string(), self.time_sql("c.")];
        if !self.all {
            w.push(failed_sql("c.status"));
        }
        for (col, v) in [
            ("c.tool", &self.tool),
            ("c.error_code", &self.error_code),
            ("c.service", &self.service),
            ("c.service_version", &self.version),
        ] {
            if let Some(v) = v {
                w.push(format!("{col} = {}", literal(v)));
            }
        }
        if !self.durations.is_empty() {
            w.push(filters::durations_sql("c.duration_ms", &self.durations));
        }
        // Text and attributes match any span of the call: its key is the trace and the call
        // id (the call's own span id when it has none).
        let call_key = |cond: String| {
            format!(
                "concat(c.trace_id, '/', coalesce(c.call_id, c.span_id)) IN \
                 (SELECT concat(trace_id, '/', coalesce(call_id, span_id)) FROM spans WHERE {} AND {cond})",
                self.time_sql("")
            )
        };
        if let Some(q) = &self.q {
            let cond = match toolspan_query::trace::normalize_trace_id(q) {
                Some(id) => format!("trace_id = '{id}'"),
                None => filters::text_sql(q),
            };
            w.push(call_key(cond));
        }
        for (k, v) in &self.attrs {
            w.push(call_key(filters::attribute_sql(k, v)));
        }
        w
    }

    /// The condition on `spans` of the charts: the range, tool, service and version (the
    /// failure filters are what the charts show).
    pub fn chart_scope(&self) -> String {
        let mut w = vec![self.time_sql("")];
        for (col, v) in [
            ("tool", &self.tool),
            ("service", &self.service),
            ("service_version", &self.version),
        ] {
            if let Some(v) = v {
                w.push(format!("{col} = {}", literal(v)));
            }
        }
        w.join(" AND ")
    }

    /// The charts' buckets.
    pub fn buckets(&self, now: DateTime<Utc>) -> Buckets {
        Buckets::new(self.since, self.until.unwrap_or(now))
    }

    /// The failed stage spans of the range (for the stage filter and its counts).
    fn failed_stages_sql(&self) -> String {
        let mut w = vec![
            self.time_sql(""),
            FAILED_SQL.into(),
            format!(
                "stage IN ({})",
                Stage::WORK_NAMES.map(|s| format!("'{s}'")).join(", ")
            ),
        ];
        if let Some(t) = &self.tool {
            w.push(format!("tool = {}", literal(t)));
        }
        format!(
            "SELECT DISTINCT trace_id, call_id, stage FROM spans WHERE {}",
            w.join(" AND ")
        )
    }

    /// With a stage filter, the join that keeps the calls that failed at that stage (each call
    /// once: the failed stages are distinct per call); without one, nothing.
    fn stage_filter_join(&self) -> String {
        match self.stage {
            Some(s) => format!(
                "JOIN ({}) f ON f.trace_id = c.trace_id AND f.call_id = c.call_id AND f.stage = '{s}' ",
                self.failed_stages_sql()
            ),
            None => String::new(),
        }
    }

    /// The statement of one page of calls: their keys ([`PageKey`]), newest first,
    /// read from the call spans alone (every filter is on the call's own columns); what
    /// their attempts add comes after, for these calls only ([`page_rows_sql`]).
    pub fn calls_sql(&self) -> String {
        let mut w = self.base_sql();
        if let Some(t) = self.error_type {
            w.push(format!("c.error_type = '{t}'"));
        }
        let join = self.stage_filter_join();
        format!(
            "SELECT c.trace_id, c.span_id, CAST(c.start_time_unix_nano AS BIGINT) AS start_ns \
             FROM spans c {join}\
             WHERE {} ORDER BY c.start_time DESC, c.span_id LIMIT {} OFFSET {}",
            w.join(" AND "),
            PAGE_SIZE + 1,
            self.page * PAGE_SIZE
        )
    }

    /// Calls per error type (the stage filter applied, the error type filter not).
    pub fn error_type_counts_sql(&self) -> String {
        let mut w = self.base_sql();
        w.push("c.error_type IS NOT NULL".into());
        let join = self.stage_filter_join();
        format!(
            "SELECT c.error_type, count(*) AS n FROM spans c {join}WHERE {} GROUP BY 1 ORDER BY n DESC",
            w.join(" AND ")
        )
    }

    /// Calls per failing stage (the error type filter applied, the stage filter not). The
    /// failed stages are distinct per (trace, call, stage), so a call matches at most one row
    /// per stage and `count(*)` counts calls (no `count(DISTINCT …)`, which costs more).
    pub fn stage_counts_sql(&self) -> String {
        let mut w = self.base_sql();
        if let Some(t) = self.error_type {
            w.push(format!("c.error_type = '{t}'"));
        }
        format!(
            "SELECT f.stage, count(*) AS n FROM spans c JOIN ({}) f \
             ON f.trace_id = c.trace_id AND f.call_id = c.call_id WHERE {} GROUP BY 1 ORDER BY n DESC",
            self.failed_stages_sql(),
            w.join(" AND ")
        )
    }

    /// This search's link with `key` set to `value` (empty: removed) and the page reset.
    fn with(&self, key: &str, value: &str) -> String {
        let r = &self.raw;
        let mut pairs: Vec<(&str, &str)> = vec![
            ("tool", r.tool.as_deref().unwrap_or("")),
            ("stage", r.stage.as_deref().unwrap_or("")),
            ("error_type", r.error_type.as_deref().unwrap_or("")),
            ("error_code", r.error_code.as_deref().unwrap_or("")),
            ("service", r.service.as_deref().unwrap_or("")),
            ("version", r.version.as_deref().unwrap_or("")),
            ("since", r.since.as_deref().unwrap_or("")),
            ("until", r.until.as_deref().unwrap_or("")),
            ("status", r.status.as_deref().unwrap_or("")),
            ("q", r.q.as_deref().unwrap_or("")),
            ("attr", r.attr.as_deref().unwrap_or("")),
            ("duration", r.duration.as_deref().unwrap_or("")),
            ("refresh", r.refresh.as_deref().unwrap_or("")),
            ("page", ""),
        ];
        for p in pairs.iter_mut() {
            if p.0 == key {
                p.1 = value;
            }
        }
        format!("/{}", query(&pairs))
    }
}

/// One call of a page, as [`Filters::calls_sql`] finds it.
#[derive(Debug, Clone)]
pub struct PageKey {
    /// Its trace.
    pub trace_id: String,
    /// Its span.
    pub span_id: String,
    /// Its start, nanoseconds since the epoch.
    pub start_ns: i64,
}

impl PageKey {
    /// The keys in the rows of [`Filters::calls_sql`].
    pub fn read(result: &toolspan_query::engine::QueryResult) -> Result<Vec<PageKey>, ApiError> {
        let mut keys = Vec::new();
        for b in &result.batches {
            let c = Cols::new(b);
            let (trace, span, start) =
                (c.text("trace_id")?, c.text("span_id")?, c.int("start_ns")?);
            for i in 0..b.num_rows() {
                keys.push(PageKey {
                    trace_id: trace.str(i).unwrap_or("").to_string(),
                    span_id: span.str(i).unwrap_or("").to_string(),
                    start_ns: start.i64(i).unwrap_or(0),
                });
            }
        }
        Ok(keys)
    }
}

/// The rows of a page's calls, newest first: the `calls` view's columns for these calls only.
/// The calls are read by trace and span id within the microseconds their starts span, their
/// attempts by trace id from the first start on ([`toolspan_query::views::attempts_of_calls_from`]):
/// the times let the reader skip every page of older spans. None without keys.
pub fn page_rows_sql(keys: &[PageKey]) -> Option<String> {
    let list = |pick: fn(&PageKey) -> &String| {
        let mut v: Vec<String> = keys.iter().map(|k| literal(pick(k))).collect();
        v.sort();
        v.dedup();
        v.join(", ")
    };
    let (traces, spans) = (list(|k| &k.trace_id), list(|k| &k.span_id));
    // `start_time` is `start_time_unix_nano` in whole microseconds.
    let starts = keys
        .iter()
        .filter_map(|k| DateTime::<Utc>::from_timestamp_micros(k.start_ns.div_euclid(1_000)));
    let (first, last) = (starts.clone().min()?, starts.max()?);
    let range =
        |p: &str| super::tool::range_sql(p, first, last + chrono::TimeDelta::microseconds(1));
    let attempts = format!(
        "trace_id IN ({traces}) AND {}",
        toolspan_query::views::attempts_of_calls_from(first)
    );
    // The rows show the attempt counts and the recovered flag both: one join of the attempts.
    let calls = toolspan_query::views::calls_query_one_join(
        &|p| {
            Some(format!(
                "{} AND {p}trace_id IN ({traces}) AND {p}span_id IN ({spans})",
                range(p)
            ))
        },
        Some(&attempts),
    );
    Some(format!(
        "SELECT c.trace_id, c.span_id, c.tool, c.service, c.service_version, c.start_time, \
         CAST(c.start_time AS BIGINT) AS start_us, c.duration_ms, c.attempts, c.status, \
         c.error_type, c.error_code, c.reference, c.recovered_after_retry, c.leaked_internals \
         FROM ({calls}) c ORDER BY c.start_time DESC, c.span_id"
    ))
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

struct CallRow {
    trace_id: String,
    span_id: String,
    tool: String,
    service: String,
    version: String,
    start_us: i64,
    duration_ms: f64,
    attempts: i64,
    status: String,
    error_type: Option<String>,
    error_code: Option<String>,
    reference: Option<String>,
    recovered: bool,
    leaked: bool,
}

fn counts(result: &toolspan_query::engine::QueryResult) -> Result<Vec<(String, i64)>, ApiError> {
    let mut out = Vec::new();
    for b in &result.batches {
        let c = Cols::new(b);
        let (k, n) = (c.text(b.schema().field(0).name())?, c.int("n")?);
        for i in 0..b.num_rows() {
            if let Some(k) = k.str(i) {
                out.push((k.to_string(), n.i64(i).unwrap_or(0)));
            }
        }
    }
    Ok(out)
}

/// `GET /`
pub async fn page(
    State(state): State<Arc<AppState>>,
    p: Result<Query<Params>, QueryRejection>,
) -> PageResult {
    let Query(p) = p.map_err(|e| {
        ApiError::new(
            toolspan_schema::Code::InvalidArgument,
            "invalid search parameters: the parameters are tool, stage, error_type, error_code, \
             service, version, since, until, status, q, attr, duration, refresh and page",
            e,
        )
    })?;
    let now = Utc::now();
    let f = Filters::new(p, now)?;
    let (calls_sql, type_sql, stage_sql) = (
        f.calls_sql(),
        f.error_type_counts_sql(),
        f.stage_counts_sql(),
    );
    let (buckets, scope) = (f.buckets(now), f.chart_scope());
    // The page's rows need its keys first; that chain runs beside the counts and charts.
    let rows = async {
        let keys = PageKey::read(&state.service.query(&calls_sql).await?)?;
        match page_rows_sql(&keys) {
            Some(sql) => Ok::<_, ApiError>(Some(state.service.query(&sql).await?)),
            None => Ok(None),
        }
    };
    let (calls, by_type, by_stage, charts) = tokio::join!(
        rows,
        state.service.query(&type_sql),
        state.service.query(&stage_sql),
        series::load(&state.service, &buckets, &scope),
    );
    let (calls, charts) = (calls?, charts?);
    let (by_type, by_stage) = (counts(&by_type?)?, counts(&by_stage?)?);
    let mut rows = Vec::new();
    for b in calls.iter().flat_map(|c| &c.batches) {
        let c = Cols::new(b);
        let t = |n: &str| c.text(n);
        let (trace, span, tool, service, version) = (
            t("trace_id")?,
            t("span_id")?,
            t("tool")?,
            t("service")?,
            t("service_version")?,
        );
        let (start, dur, attempts, status) = (
            c.int("start_us")?,
            c.float("duration_ms")?,
            c.int("attempts")?,
            t("status")?,
        );
        let (etype, ecode, reference, rec, leak) = (
            t("error_type")?,
            t("error_code")?,
            t("reference")?,
            c.boolean("recovered_after_retry")?,
            c.boolean("leaked_internals")?,
        );
        let s = |col: &toolspan_query::rows::Col, i: usize| col.str(i).unwrap_or("").to_string();
        for i in 0..b.num_rows() {
            rows.push(CallRow {
                trace_id: s(&trace, i),
                span_id: s(&span, i),
                tool: s(&tool, i),
                service: s(&service, i),
                version: s(&version, i),
                start_us: start.i64(i).unwrap_or(0),
                duration_ms: dur.f64(i).unwrap_or(0.0),
                attempts: attempts.i64(i).unwrap_or(1),
                status: s(&status, i),
                error_type: etype.str(i).map(str::to_string),
                error_code: ecode.str(i).map(str::to_string),
                reference: reference.str(i).map(str::to_string),
                recovered: rec.bool(i).unwrap_or(false),
                leaked: leak.bool(i).unwrap_or(false),
            });
        }
    }
    let more = rows.len() > PAGE_SIZE;
    rows.truncate(PAGE_SIZE);
    let main = html! {
        (render(&f, &rows, more, &by_type, &by_stage))
        h2 { "Over time" }
        p.muted { "Every call and stage span in the range"
            @if f.tool.is_some() || f.service.is_some() || f.version.is_some() { " of the tool, service and version chosen" }
            "; the failure filters above pick rows, not these figures." }
        (chart::all(&buckets, &charts))
    };
    let head = match f.refresh {
        Some(secs) => html! { meta http-equiv="refresh" content=(secs); },
        None => html! {},
    };
    Ok(page::Page {
        status: axum::http::StatusCode::OK,
        body: page::layout_with("failed calls", head, main),
    })
}

fn select(name: &str, label: &str, current: &str, options: &[&str]) -> Markup {
    html! {
        label {
            (label)
            select name=(name) {
                option value="" selected[current.is_empty()] { "any" }
                @for o in options {
                    option value=(o) selected[current.eq_ignore_ascii_case(o)] { (o) }
                }
            }
        }
    }
}

fn text_input(name: &str, label: &str, current: &str, hint: &str) -> Markup {
    html! {
        label { (label) input type="text" name=(name) value=(current) placeholder=(hint) maxlength="256"; }
    }
}

fn render(
    f: &Filters,
    rows: &[CallRow],
    more: bool,
    by_type: &[(String, i64)],
    by_stage: &[(String, i64)],
) -> Markup {
    let r = &f.raw;
    let v = |o: &Option<String>| o.clone().unwrap_or_default();
    let types = ErrorType::ALL.map(ErrorType::as_str);
    html! {
        h1 { @if f.all { "Calls" } @else { "Failed calls" } }
        form.filters method="get" action="/" {
            (text_input("tool", "tool", &v(&r.tool), "search_docs"))
            (select("stage", "failed stage", &v(&r.stage), &Stage::WORK_NAMES))
            (select("error_type", "error type", &v(&r.error_type), &types))
            (text_input("error_code", "error code", &v(&r.error_code), "invalid_status"))
            (text_input("service", "service", &v(&r.service), ""))
            (text_input("version", "version", &v(&r.version), ""))
            (text_input("since", "since", &v(&r.since), DEFAULT_SINCE))
            (text_input("until", "until", &v(&r.until), "now"))
            (select("status", "calls", r.status.as_deref().unwrap_or("failed"), &["failed", "all"]))
            label.wide { "text" input type="search" name="q" value=(v(&r.q)) placeholder="message, code, reference or trace id" maxlength="256"; }
            (text_input("attr", "attributes", &v(&r.attr), "key=value key2=\"a b\""))
            (text_input("duration", "duration", &v(&r.duration), "> 1 s"))
            (select("refresh", "reload every (s)", &v(&r.refresh), &REFRESH_SECS))
            button type="submit" { "search" }
        }
        div.facets {
            div {
                h3 { "failed stage" }
                ul.stage-counts {
                    @for (stage, n) in by_stage {
                        li { a class=[(f.stage == Some(stage.as_str())).then_some("on")] href=(f.with("stage", if f.stage == Some(stage.as_str()) { "" } else { stage })) {
                            (stage) " " span.num { (n) }
                        } }
                    }
                    @if by_stage.is_empty() { li.muted { "none" } }
                }
            }
            div {
                h3 { "error type" }
                ul.type-counts {
                    @for (t, n) in by_type {
                        li { a class=[(f.error_type == Some(t.as_str())).then_some("on")] href=(f.with("error_type", if f.error_type == Some(t.as_str()) { "" } else { t })) {
                            (t) " " span.num { (n) }
                        } }
                    }
                    @if by_type.is_empty() { li.muted { "none" } }
                }
            }
        }
        @if rows.is_empty() {
            p.muted.empty { "No calls match these filters in this range." }
        } @else {
            table.calls {
                thead { tr {
                    th { "time" } th { "tool" } th { "service" } th { "status" } th { "code" }
                    th.num { "attempts" } th.num { "duration" } th { "reference" } th { "" }
                } }
                tbody {
                    @for c in rows {
                        tr class=[toolspan_schema::Status::is_failed(&c.status).then_some("failed")] {
                            td { (page::time(c.start_us.saturating_mul(1000))) }
                            td { a href=(tool_href(&c.tool)) { (c.tool) } }
                            td { (c.service) @if !c.version.is_empty() { span.muted { " " (c.version) } } }
                            td {
                                (status_badge(&c.status, c.error_type.as_deref()))
                                @if c.recovered { " " (page::badge("warn", "recovered after retry")) }
                                @if c.leaked { " " (page::badge("leak", "leaks internals")) }
                            }
                            td { @if let Some(code) = &c.error_code { code { (code) } } }
                            td.num { (c.attempts) }
                            td.num { (page::duration(c.duration_ms)) }
                            td { @if let Some(r) = &c.reference { a.mono href=(reference_href(r)) { (r) } } }
                            td { a.open href=(format!("/traces/{}?span={}#{}", page::segment(&c.trace_id), page::segment(&c.span_id), super::failed::ANCHOR)) { "trace →" } }
                        }
                    }
                }
            }
        }
        div.pager {
            @if f.page > 0 { a href=(f.with("page", &(f.page - 1).to_string())) { "← newer" } }
            @if more && f.page < MAX_PAGE { a href=(f.with("page", &(f.page + 1).to_string())) { "older →" } }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2025-06-01T12:00:00Z")
            .expect("time")
            .with_timezone(&Utc)
    }

    #[test]
    fn filters_become_escaped_conditions() {
        let f = Filters::new(
            Params {
                tool: Some("search_docs' OR 1=1 --".into()),
                stage: Some("PARSE".into()),
                error_type: Some("parse".into()),
                page: Some("2".into()),
                ..Params::default()
            },
            now(),
        )
        .expect("valid");
        let sql = f.calls_sql();
        assert!(sql.contains("c.tool = 'search_docs'' OR 1=1 --'"), "{sql}");
        assert!(sql.contains("f.stage = 'parse'"), "{sql}");
        assert!(sql.contains("c.error_type = 'PARSE'"), "{sql}");
        assert!(
            sql.contains("c.start_time >= '2025-05-31T12:00:00.000000Z'"),
            "{sql}"
        );
        assert!(sql.ends_with("LIMIT 51 OFFSET 100"), "{sql}");
        assert!(!f.stage_counts_sql().contains("f.stage = 'parse'"));
        assert_eq!(
            f.with("stage", ""),
            "/?tool=search_docs%27+OR+1%3D1+--&error_type=parse"
        );
    }

    #[test]
    fn bad_filters_are_refused() {
        for p in [
            Params {
                stage: Some("call".into()),
                ..Params::default()
            },
            Params {
                error_type: Some("BOGUS".into()),
                ..Params::default()
            },
            Params {
                since: Some("yesterday".into()),
                ..Params::default()
            },
            Params {
                page: Some("100000".into()),
                ..Params::default()
            },
            Params {
                status: Some("x".into()),
                ..Params::default()
            },
        ] {
            assert!(Filters::new(p, now()).is_err());
        }
    }
}
