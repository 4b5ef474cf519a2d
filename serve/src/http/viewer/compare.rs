//! `GET /compare?tool=&service=&before=&after=&since=&until=`: did a change help? One tool's
//! calls by two versions side by side, with the figures and verdicts of `toolspan compare`
//! (the same function, [`toolspan_query::compare::compare`], computes them). Without both versions the
//! page is a form whose choices are the versions that called the tool.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use chrono::Utc;
use maud::{html, Markup};

use super::page::{layout, query, tool_href, Page, PageResult};
use super::tool::version_key;
use crate::http::error::ApiError;
use crate::http::search::{literal, parse_time};
use crate::http::AppState;
use toolspan_query::compare::{compare, CompareRequest, Comparison, Metric, Side};
use toolspan_query::rows::Cols;

/// The compare page's parameters (all optional: missing ones make the page a form).
#[derive(Debug, Default, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompareParams {
    /// The tool.
    pub tool: Option<String>,
    /// Only calls made by this `service.name`.
    pub service: Option<String>,
    /// `service.version` before the change.
    pub before: Option<String>,
    /// `service.version` after the change.
    pub after: Option<String>,
    /// Start of the range (none: every call in the table).
    pub since: Option<String>,
    /// End of the range.
    pub until: Option<String>,
}

/// The compare page of `tool` in `service`, `before` → `after`, over a range as typed.
pub fn compare_href(
    tool: &str,
    service: &str,
    before: &str,
    after: &str,
    since: &str,
    until: &str,
) -> String {
    format!(
        "/compare{}",
        query(&[
            ("tool", tool),
            ("service", service),
            ("before", before),
            ("after", after),
            ("since", since),
            ("until", until),
        ])
    )
}

fn nonempty(v: &Option<String>) -> Option<&str> {
    v.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

/// What a metric is, in words.
fn label(m: &Metric) -> String {
    let k = m.key.as_deref().unwrap_or("");
    match m.metric {
        "failure_rate" => "calls that failed".into(),
        "stage_failure_rate" => format!("{k} stage spans that failed"),
        "error_code_rate" => format!("calls that failed with {k}"),
        "unmapped_failure_share" => "failures without an error code (unmapped)".into(),
        "leaked_result_share" => "results that leaked internals to the model".into(),
        "leaked_tokens_per_call" => "leaked tokens per call (estimated)".into(),
        "recovery_rate" => "failure streaks the model recovered from".into(),
        "calls_to_recovery_median" => "calls to recovery, median".into(),
        "calls_to_recovery_p90" => "calls to recovery, p90".into(),
        "hammering_share" => "streaks with the same failing arguments sent 3+ times".into(),
        other => other.into(),
    }
}

/// One side as `toolspan compare` prints it.
fn side(s: &Side, pct: bool) -> String {
    match (s.value, s.count) {
        (None, _) => "–".into(),
        (Some(v), Some(x)) if pct => format!("{:.1}% ({x}/{})", v * 100.0, s.of),
        (Some(v), _) => format!("{v:.2} (n={})", s.of),
    }
}

fn metric_row(m: &Metric) -> Markup {
    let pct = m.before.count.is_some();
    let (scale, unit) = if pct { (100.0, " pt") } else { (1.0, "") };
    let name = match &m.key {
        Some(k) => format!("{}[{k}]", m.metric),
        None => m.metric.to_string(),
    };
    let p = m.p_adjusted.map(|p| {
        if p < 0.001 {
            "<0.001".to_string()
        } else {
            format!("{p:.3}")
        }
    });
    let verdict_class = format!("verdict v-{}", m.verdict.replace(' ', "-"));
    html! {
        tr data-metric=(m.metric) data-key=[m.key.as_deref()] data-verdict=(m.verdict) {
            td { (label(m)) div.muted.mono { (name) } }
            td.num.before { (side(&m.before, pct)) }
            td.num.after { (side(&m.after, pct)) }
            td.num { @if let Some(d) = m.difference { (format!("{:+.1}{unit}", d * scale)) } @else { "–" } }
            td.num { @if let Some([l, h]) = m.ci95 { (format!("[{:+.1}, {:+.1}]", l * scale, h * scale)) } @else { "–" } }
            td.num { (p.unwrap_or_else(|| "–".into())) }
            td { span class=(verdict_class) { (m.verdict) } span.muted { " (" (m.better) " is better)" } }
        }
    }
}

fn report(c: &Comparison) -> Markup {
    let names = |verdict: &str| -> Vec<String> {
        c.metrics
            .iter()
            .filter(|m| m.verdict == verdict)
            .map(label)
            .collect()
    };
    let (better, worse) = (names("better"), names("worse"));
    html! {
        section.comparison {
            h2 {
                "Tool " span.mono { (c.tool) } @if let Some(s) = &c.service { " in " (s) } ": "
                span.mono { (c.before) } " → " span.mono { (c.after) }
            }
            p.summary {
                span { (c.before) " (before): " (c.calls[0]) " calls, " (c.failure_streaks[0]) " failure streaks" }
                span { (c.after) " (after): " (c.calls[1]) " calls, " (c.failure_streaks[1]) " failure streaks" }
                span { @match (&c.since, &c.until) {
                    (None, None) => { "every call in the table" }
                    (s, u) => { (s.as_deref().unwrap_or("the first call")) " to " (u.as_deref().unwrap_or("now")) }
                } }
            }
            div.headline {
                p.better { strong { (c.after) " is better on: " } @if better.is_empty() { "nothing significant" } @else { (better.join("; ")) } }
                p.worse { strong { (c.after) " is worse on: " } @if worse.is_empty() { "nothing significant" } @else { (worse.join("; ")) } }
            }
            table.metrics {
                thead { tr {
                    th { "metric" } th.num { (c.before) } th.num { (c.after) } th.num { "difference" }
                    th.num { "95% interval" } th.num { "p (Holm)" } th { "verdict" }
                } }
                tbody { @for m in &c.metrics { (metric_row(m)) } }
            }
            p.muted { (c.method) ". The same report as " code { "toolspan compare" } "." }
        }
    }
}

fn select(name: &str, label: &str, current: &str, options: &[String]) -> Markup {
    html! {
        label {
            (label)
            select name=(name) {
                option value="" selected[current.is_empty()] { "choose" }
                @for o in options { option value=(o) selected[o.as_str() == current] { (o) } }
            }
        }
    }
}

/// `GET /compare`
pub async fn page(
    State(state): State<Arc<AppState>>,
    p: Result<Query<CompareParams>, QueryRejection>,
) -> PageResult {
    let Query(p) = p.map_err(|e| {
        ApiError::new(
            toolspan_schema::Code::InvalidArgument,
            "invalid compare parameters: the parameters are tool, service, before, after, since \
             and until",
            e,
        )
    })?;
    for (name, v) in [
        ("tool", &p.tool),
        ("service", &p.service),
        ("before", &p.before),
        ("after", &p.after),
    ] {
        if let Some(v) = nonempty(v) {
            if v.chars().count() > 256 || v.chars().any(char::is_control) {
                return Err(ApiError::invalid_argument(format!(
                    "`{name}` must be at most 256 characters without control characters"
                ))
                .into());
            }
        }
    }
    let now = Utc::now();
    let since = nonempty(&p.since)
        .map(|v| parse_time("since", v, now))
        .transpose()?;
    let until = nonempty(&p.until)
        .map(|v| parse_time("until", v, now))
        .transpose()?;
    let tool = nonempty(&p.tool).unwrap_or("");
    let (before, after) = (nonempty(&p.before), nonempty(&p.after));
    let req = match (tool.is_empty(), before, after) {
        (false, Some(b), Some(a)) => Some(CompareRequest {
            tool: tool.to_string(),
            before: b.to_string(),
            after: a.to_string(),
            service: nonempty(&p.service).map(str::to_string),
            since,
            until,
        }),
        _ => None,
    };
    // The versions that called the tool (the form's choices) and the comparison, at once.
    let choices = async {
        if tool.is_empty() {
            return Ok(None);
        }
        let mut w = vec![format!("tool = {}", literal(tool))];
        if let Some(s) = nonempty(&p.service) {
            w.push(format!("service = {}", literal(s)));
        }
        let sql = format!(
            "SELECT DISTINCT coalesce(service, '') AS service, coalesce(service_version, '') AS version \
             FROM spans WHERE stage = 'call' AND {} LIMIT 200",
            w.join(" AND ")
        );
        state.service.query(&sql).await.map(Some)
    };
    let comparison = async {
        match &req {
            Some(req) => Some(compare(state.service.as_ref(), req).await),
            None => None,
        }
    };
    let (choices, comparison) = tokio::join!(choices, comparison);
    let (mut services, mut versions) = (Vec::new(), Vec::new());
    if let Some(result) = choices? {
        for b in &result.batches {
            let c = Cols::new(b);
            let (s, v) = (c.text("service")?, c.text("version")?);
            for i in 0..b.num_rows() {
                let (s, v) = (s.str(i).unwrap_or(""), v.str(i).unwrap_or(""));
                if !s.is_empty() && !services.iter().any(|x: &String| x == s) {
                    services.push(s.to_string());
                }
                if !v.is_empty() && !versions.iter().any(|x: &String| x == v) {
                    versions.push(v.to_string());
                }
            }
        }
        services.sort();
        versions.sort_by_key(|v| version_key(v));
    }
    let mut status = StatusCode::OK;
    let outcome: Markup = match comparison {
        Some(Ok(c)) => report(&c),
        Some(Err(e)) => {
            let e = ApiError::from(e);
            e.log();
            status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST);
            let env = e.envelope();
            html! {
                section.error-page {
                    p.message { (env["error"]["message"].as_str().unwrap_or("")) }
                    p.muted { "code " code { (env["error"]["code"].as_str().unwrap_or("")) }
                        " · reference " code { (env["error"]["reference"].as_str().unwrap_or("")) } }
                }
            }
        }
        None => {
            html! { p.muted { "Choose a tool and two versions of the service that calls it." } }
        }
    };
    let v = |o: &Option<String>| o.clone().unwrap_or_default();
    let main = html! {
        h1 { "Compare two versions" }
        @if !tool.is_empty() { p { a href=(tool_href(tool)) { "tool " (tool) " →" } } }
        form.filters method="get" action="/compare" {
            label { "tool" input type="text" name="tool" value=(tool) placeholder="update_ticket" maxlength="256"; }
            @if services.is_empty() {
                label { "service" input type="text" name="service" value=(v(&p.service)) maxlength="256"; }
            } @else {
                (select("service", "service", nonempty(&p.service).unwrap_or(""), &services))
            }
            @if versions.is_empty() {
                label { "before" input type="text" name="before" value=(v(&p.before)) placeholder="1.4.2" maxlength="256"; }
                label { "after" input type="text" name="after" value=(v(&p.after)) placeholder="1.5.0" maxlength="256"; }
            } @else {
                (select("before", "before", before.unwrap_or(""), &versions))
                (select("after", "after", after.unwrap_or(""), &versions))
            }
            label { "since" input type="text" name="since" value=(v(&p.since)) placeholder="all" maxlength="64"; }
            label { "until" input type="text" name="until" value=(v(&p.until)) placeholder="now" maxlength="64"; }
            button type="submit" { "compare" }
        }
        (outcome)
    };
    Ok(Page {
        status,
        body: layout("compare", main),
    })
}
