//! `GET /traces/{trace_id}?span=`: one trace. First what failed ([`super::failed`]: the
//! failed call, its failing stage and error, what the model received and the arguments it
//! sent), then where failures started (the failed spans none of whose children failed), then
//! the waterfall (agent run → model
//! calls → tool calls → attempts → stages, offsets and durations to scale, failed rows red
//! with their error inline), then each tool call's attempts side by side; beside them the
//! selected span (by default the failed call): its error envelope, arguments and result as stored, exception events with
//! their frames, and every other attribute.
//!
//! A replay's page says which call it re-ran; a trace whose calls were replayed lists the
//! replays with their outcome ([`super::replays`]).
//!
//! `GET /r/{reference}` opens the trace of an error reference with its span selected and the
//! page at "What failed".

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{html, Markup};
use serde_json::Value;

use super::failed;
use super::page::{
    self, badge, bytes, duration, ok, reference_href, segment, status_badge, tool_href, trace_href,
    PageError, PageResult,
};
use crate::http::error::ApiError;
use crate::http::AppState;
use toolspan_query::rows::{self, Cols, Span};

/// Indentation levels drawn (deeper spans are drawn at this depth).
const MAX_INDENT: usize = 12;
/// Characters of an error message shown inline in the waterfall.
const INLINE_MESSAGE: usize = 240;

/// The trace page's parameters.
#[derive(Debug, Default, serde::Deserialize)]
pub struct TraceParams {
    /// The selected span.
    pub span: Option<String>,
}

/// A trace id as typed or linked: 1 to 32 hex characters (left-padded, lowercased).
fn trace_id(raw: &str) -> Result<String, ApiError> {
    crate::http::tempo::trace_id(raw)
}

/// `GET /traces/{trace_id}`
pub async fn page(
    State(state): State<Arc<AppState>>,
    Path(raw): Path<String>,
    params: Result<Query<TraceParams>, QueryRejection>,
) -> PageResult {
    let params = params.ok();
    let id = trace_id(&raw)?;
    let (spans, cut) = rows::load_trace(&state.service, &id).await?;
    if spans.is_empty() {
        return Err(ApiError::not_found(format!(
            "no span has trace id {id}: it may not be ingested yet, or it was sampled out"
        ))
        .into());
    }
    let selected = params.and_then(|Query(p)| p.span);
    // A PARSE failure: whether the answer it failed on had a new shape.
    let mut parse_tools: Vec<String> = spans
        .iter()
        .filter(|s| s.error_type.as_deref() == Some("PARSE"))
        .filter_map(|s| s.tool.clone())
        .collect();
    parse_tools.dedup();
    // The note is an aside: a failed lookup leaves it out rather than the page.
    let note = super::shapes::trace_note(&state.service, &id, &parse_tools)
        .await
        .unwrap_or_else(|e| {
            // Not answered to anyone: logged here, with its detail.
            toolspan_schema::EnvelopeError::envelope(&e).log();
            html! {}
        });
    // The replays of this trace's calls, an aside like the note.
    let replays = super::replays::replays_of(&state.service, &id, &spans)
        .await
        .unwrap_or_else(|e| {
            // Not answered to anyone: logged here, with its detail.
            toolspan_schema::EnvelopeError::envelope(&e).log();
            html! {}
        });
    ok(
        &format!("trace {id}"),
        html! { (render_with(&id, &spans, cut, selected.as_deref(), replays)) (note) },
    )
}

/// The order spans are drawn in: depth-first from the roots, children by start time; each
/// with its depth. Spans whose parent is missing are roots; cycles are cut.
pub fn tree_order(spans: &[Span]) -> Vec<(usize, usize)> {
    let index: HashMap<&str, usize> = spans
        .iter()
        .enumerate()
        .map(|(i, s)| (s.span_id.as_str(), i))
        .collect();
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); spans.len()];
    let mut roots = Vec::new();
    for (i, s) in spans.iter().enumerate() {
        match s
            .parent_span_id
            .as_deref()
            .and_then(|p| index.get(p).copied())
            .filter(|p| *p != i)
        {
            Some(p) => children[p].push(i),
            None => roots.push(i),
        }
    }
    let mut seen = vec![false; spans.len()];
    let mut out = Vec::with_capacity(spans.len());
    let visit = |start: usize, out: &mut Vec<(usize, usize)>, seen: &mut Vec<bool>| {
        let mut stack = vec![(start, 0usize)];
        while let Some((i, d)) = stack.pop() {
            if seen[i] {
                continue;
            }
            seen[i] = true;
            out.push((i, d));
            for c in children[i].iter().rev() {
                stack.push((*c, d + 1));
            }
        }
    };
    for r in roots {
        visit(r, &mut out, &mut seen);
    }
    // Spans only reachable through a cycle: drawn as roots.
    for i in 0..spans.len() {
        if !seen[i] {
            visit(i, &mut out, &mut seen);
        }
    }
    out
}

fn children_of(spans: &[Span]) -> HashMap<&str, Vec<usize>> {
    let mut m: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, s) in spans.iter().enumerate() {
        if let Some(p) = s.parent_span_id.as_deref() {
            m.entry(p).or_default().push(i);
        }
    }
    m
}

fn cut_chars(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n).collect();
        t.push('…');
        t
    }
}

/// The whole trace page body (public for the benchmark).
pub fn render(trace_id: &str, spans: &[Span], cut: bool, selected: Option<&str>) -> Markup {
    render_with(trace_id, spans, cut, selected, html! {})
}

/// [`render`] with `aside` (read from outside the trace: its calls' replays) after what failed.
fn render_with(
    trace_id: &str,
    spans: &[Span],
    cut: bool,
    selected: Option<&str>,
    aside: Markup,
) -> Markup {
    let order = tree_order(spans);
    let kids = children_of(spans);
    let start = spans.iter().map(|s| s.start_unix_nano).min().unwrap_or(0);
    let end = spans.iter().map(Span::end_unix_nano).max().unwrap_or(start);
    let total = ((end - start) as f64).max(1.0);
    let failed_child = |s: &Span| {
        kids.get(s.span_id.as_str())
            .is_some_and(|k| k.iter().any(|c| spans[*c].failed()))
    };
    // Where failures started: failed spans without a failed child, in start order.
    let origins: Vec<&Span> = order
        .iter()
        .map(|(i, _)| &spans[*i])
        .filter(|s| s.failed() && !failed_child(s))
        .collect();
    let by_id: HashMap<&str, &Span> = spans.iter().map(|s| (s.span_id.as_str(), s)).collect();
    let calls: Vec<&Span> = order
        .iter()
        .map(|(i, _)| &spans[*i])
        .filter(|s| s.stage == "call")
        .collect();
    let selected = selected.and_then(|id| by_id.get(id).copied());
    let focus = failed::focus(selected, &origins, &calls, &by_id);
    // Opened on the failed call: what the model sent and received; a link or a reference
    // selects its own span.
    let chosen: &Span = selected
        .or(focus.call)
        .or_else(|| origins.first().copied())
        .unwrap_or(&spans[order[0].0]);
    let errors = spans.iter().filter(|s| s.failed()).count();
    let mut services: Vec<&str> = spans.iter().filter_map(|s| s.service.as_deref()).collect();
    services.sort_unstable();
    services.dedup();
    html! {
        h1 { "Trace " span.mono { (trace_id) } }
        div.summary {
            span { (spans.len()) " spans" }
            span { (errors) " failed" }
            span { (duration((end - start) as f64 / 1e6)) }
            span { "started " (page::time(start)) }
            span { "services: " (services.join(", ")) }
            @if cut { span.errline { "trace cut at " (rows::MAX_TRACE_SPANS) " spans" } }
        }
        (super::replays::banner(spans))
        (failed::panel(&focus))
        (aside)
        div.layout {
            div {
                @if !origins.is_empty() {
                    section.failures {
                        h2 { "Where failures started" }
                        ul {
                            @for s in &origins {
                                li {
                                    (badge("stage", &s.stage)) " "
                                    (status_badge(&s.status, s.error_type.as_deref())) " "
                                    a href=(trace_href(&s.trace_id, Some(&s.span_id))) { (s.name) }
                                    @if let Some(t) = s.tool_name() { " in " a href=(tool_href(t)) { (t) } }
                                    @if let Some(a) = s.attempt { span.muted { " attempt " (a) } }
                                    @if let Some(c) = &s.error_code { " " code { (c) } }
                                    @if let Some(m) = &s.error_message { div.errline { (cut_chars(m, INLINE_MESSAGE)) } }
                                }
                            }
                        }
                    }
                }
                h2 { "Waterfall" }
                table.waterfall {
                    thead { tr { th { "span" } th { "timeline" } th.num { "duration" } } }
                    tbody {
                        @for (i, depth) in &order {
                            @let s = &spans[*i];
                            @let has_kids = kids.contains_key(s.span_id.as_str());
                            @let x = (s.start_unix_nano - start) as f64 / total * 1000.0;
                            @let w = (s.duration_ms * 1e6 / total * 1000.0).max(1.5);
                            tr id=(format!("span-{}", s.span_id)) data-depth=(depth)
                                class=[row_class(s, chosen)] {
                                td.name {
                                    span class=(format!("indent d{}", (*depth).min(MAX_INDENT))) {}
                                    @if has_kids { button.fold type="button" aria-expanded="true" title="fold" { "▾" } }
                                    a href=(trace_href(&s.trace_id, Some(&s.span_id))) { (s.name) } " "
                                    (badge("stage", &s.stage))
                                    @if s.failed() { " " (status_badge(&s.status, s.error_type.as_deref())) }
                                    @if let Some(a) = s.attempt { @if s.stage == "attempt" { span.muted { " #" (a) } } }
                                    @if s.failed() && !failed_child(s) {
                                        @if let Some(m) = &s.error_message { div.errline { (cut_chars(m, INLINE_MESSAGE)) } }
                                    }
                                }
                                td.bar {
                                    svg.bar viewBox="0 0 1000 10" preserveAspectRatio="none" role="img" {
                                        rect class=[s.failed().then_some("err")] x=(format!("{x:.2}")) y="1" width=(format!("{:.2}", w.min(1000.0 - x).max(1.0))) height="8" {}
                                    }
                                }
                                td.num { (duration(s.duration_ms)) }
                            }
                        }
                    }
                }
                @if !calls.is_empty() {
                    h2 { "Tool calls, attempt by attempt" }
                    @for c in &calls {
                        (attempts(c, spans, &kids))
                    }
                }
            }
            (detail(chosen, spans, &kids, &by_id))
        }
    }
}

fn row_class(s: &Span, chosen: &Span) -> Option<&'static str> {
    match (s.failed(), s.span_id == chosen.span_id) {
        (true, true) => Some("failed selected"),
        (false, true) => Some("selected"),
        (true, false) => Some("failed"),
        (false, false) => None,
    }
}

/// The attempts of a call: its `attempt` children in start order (or the call itself when
/// it has none), one column each.
fn attempt_spans<'a>(
    call: &'a Span,
    spans: &'a [Span],
    kids: &HashMap<&str, Vec<usize>>,
) -> Vec<&'a Span> {
    let mut a: Vec<&Span> = kids
        .get(call.span_id.as_str())
        .map(|k| {
            k.iter()
                .map(|i| &spans[*i])
                .filter(|s| s.stage == "attempt")
                .collect()
        })
        .unwrap_or_default();
    if a.is_empty() {
        if let Some(cid) = call.call_id.as_deref() {
            a = spans
                .iter()
                .filter(|s| s.stage == "attempt" && s.call_id.as_deref() == Some(cid))
                .collect();
        }
    }
    a.sort_by_key(|s| (s.attempt.unwrap_or(0), s.start_unix_nano));
    a
}

fn failed_stage<'a>(
    s: &'a Span,
    spans: &'a [Span],
    kids: &HashMap<&str, Vec<usize>>,
) -> Option<&'a Span> {
    kids.get(s.span_id.as_str())?
        .iter()
        .map(|i| &spans[*i])
        .find(|c| c.failed())
}

fn attempts(call: &Span, spans: &[Span], kids: &HashMap<&str, Vec<usize>>) -> Markup {
    let mut cols = attempt_spans(call, spans, kids);
    if cols.is_empty() {
        cols.push(call);
    }
    html! {
        section.call id=(format!("call-{}", call.span_id)) {
            h3 {
                a href=(trace_href(&call.trace_id, Some(&call.span_id))) { (call.name) } " "
                (status_badge(&call.status, call.error_type.as_deref()))
                span.muted { " " (cols.len()) " attempt(s), " (duration(call.duration_ms)) }
                @if call.failed() {
                    @if let Some(t) = call.tool_name() {
                        " "
                        a.export href=(crate::http::evals::href(t, call.error_type.as_deref(), call.error_code.as_deref())) download title="this tool's failures of this error type and code, grouped by fingerprint, as a toolspan.evals/1 file" { "Export as eval cases" }
                    }
                }
            }
            table.attempts {
                tbody {
                    tr { th { "attempt" } @for a in &cols { th { a href=(trace_href(&a.trace_id, Some(&a.span_id))) { "#" (a.attempt.map_or("?".to_string(), |n| n.to_string())) } } } }
                    tr { th { "status" } @for a in &cols { td class=[a.failed().then_some("failed")] { (status_badge(&a.status, a.error_type.as_deref())) } } }
                    tr { th { "failed stage" } @for a in &cols { td { @if let Some(f) = failed_stage(a, spans, kids) { a href=(trace_href(&f.trace_id, Some(&f.span_id))) { (f.stage) } } } } }
                    tr { th { "code" } @for a in &cols { td { @if let Some(c) = &a.error_code { code { (c) } } } } }
                    tr { th { "message" } @for a in &cols { td { @if let Some(m) = &a.error_message { (cut_chars(m, INLINE_MESSAGE)) } } } }
                    tr { th { "HTTP" } @for a in &cols { td { @if let Some(h) = a.http_status.or_else(|| failed_stage(a, spans, kids).and_then(|f| f.http_status)) { (h) } } } }
                    tr { th { "retry after" } @for a in &cols { td { @if let Some(r) = a.retry_after_ms { (r) " ms" } } } }
                    tr { th { "duration" } @for a in &cols { td.num { (duration(a.duration_ms)) } } }
                }
            }
        }
    }
}

/// A payload as stored: its size, whether it was truncated, its hash, the text.
pub(super) fn payload(
    label: &str,
    text: &Option<String>,
    size: Option<i64>,
    sha: &Option<String>,
) -> Markup {
    html! {
        @if text.is_some() || size.is_some() {
            h3 { (label) }
            p.muted {
                @if let Some(n) = size { (bytes(n)) }
                @if let (Some(t), Some(n)) = (text, size) {
                    @if (t.len() as i64) < n { ", stored truncated to the first " (bytes(t.len() as i64)) }
                }
                @if let Some(h) = sha { ", sha256 " span.mono { (cut_chars(h, 16)) } }
            }
            @if let Some(t) = text { pre.payload { (t) } }
        }
    }
}

fn json_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn kv_list(text: Option<&str>) -> Markup {
    let parsed: Option<serde_json::Map<String, Value>> = text
        .and_then(|t| serde_json::from_str::<Value>(t).ok())
        .and_then(|v| match v {
            Value::Object(m) => Some(m),
            _ => None,
        });
    html! {
        @match parsed {
            Some(m) if !m.is_empty() => {
                dl.kv { @for (k, v) in &m { dt.mono { (k) } dd.mono { (json_text(v)) } } }
            }
            _ => { p.muted { "none" } }
        }
    }
}

/// A span's events, exceptions with their frames.
pub(super) fn events(s: &Span) -> Markup {
    let list: Vec<Value> = match s.events.as_deref().map(serde_json::from_str::<Value>) {
        Some(Ok(Value::Array(a))) => a,
        _ => Vec::new(),
    };
    html! {
        @if !list.is_empty() {
            h3 { "Events" }
            @for e in &list {
                @let attrs = e["attributes"].as_object();
                div.event {
                    p {
                        strong { (e["name"].as_str().unwrap_or("")) }
                        @if let Some(t) = e["time_unix_nano"].as_i64() { span.muted { " " (page::time(t)) } }
                        @if let Some(n) = e["count"].as_i64() { span.muted { " (" (n) " more events not stored)" } }
                    }
                    @if let Some(a) = attrs {
                        @if let Some(t) = a.get("exception.type") { p { code { (json_text(t)) } @if let Some(m) = a.get("exception.message") { ": " (json_text(m)) } } }
                        @if let Some(st) = a.get("exception.stacktrace") { pre.frames { (json_text(st)) } }
                        dl.kv {
                            @for (k, v) in a {
                                @if !matches!(k.as_str(), "exception.type" | "exception.message" | "exception.stacktrace") {
                                    dt.mono { (k) } dd.mono { (json_text(v)) }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn detail(
    s: &Span,
    spans: &[Span],
    kids: &HashMap<&str, Vec<usize>>,
    by_id: &HashMap<&str, &Span>,
) -> Markup {
    // The call this span belongs to, for its attempts side by side.
    let mut call = Some(s);
    let mut hops = 0;
    while let Some(c) = call {
        if c.stage == "call" || hops > 64 {
            break;
        }
        call = c
            .parent_span_id
            .as_deref()
            .and_then(|p| by_id.get(p).copied());
        hops += 1;
    }
    let call = call.filter(|c| c.stage == "call");
    html! {
        section.detail id="detail" data-span=(s.span_id) {
            h2 { (s.name) }
            p {
                (badge("stage", &s.stage)) " " (status_badge(&s.status, s.error_type.as_deref()))
                @if s.leaked_internals { " " (badge("leak", "leaks internals to the model")) }
                @if s.redactions > 0 { " " (badge("warn", &format!("{} secret(s) redacted", s.redactions))) }
            }
            dl.kv {
                dt { "span" } dd.mono { (s.span_id) }
                @if let Some(p) = &s.parent_span_id {
                    dt { "parent" } dd.mono { @if by_id.contains_key(p.as_str()) { a href=(trace_href(&s.trace_id, Some(p))) { (p) } } @else { (p) " (not received)" } }
                }
                @if let Some(t) = s.tool_name() { dt { "tool" } dd { a href=(tool_href(t)) { (t) } } }
                @if let Some(c) = &s.call_id { dt { "call id" } dd.mono { (c) } }
                @if let Some(a) = s.attempt { dt { @if s.stage == "call" { "attempts" } @else { "attempt" } } dd { (a) } }
                @if let Some(v) = &s.service { dt { "service" } dd { (v) @if let Some(ver) = &s.service_version { " " span.muted { (ver) } } } }
                @if let Some(a) = &s.agent { dt { "agent" } dd { (a) } }
                @if let Some(m) = &s.model { dt { "model" } dd { (m) } }
                @if let Some(k) = &s.kind { dt { "kind" } dd { (k) } }
                dt { "start" } dd { (page::time(s.start_unix_nano)) }
                dt { "duration" } dd { (duration(s.duration_ms)) }
                @if let Some(h) = s.http_status { dt { "HTTP status" } dd { (h) } }
                @if let (Some(i), Some(o)) = (s.input_tokens, s.output_tokens) { dt { "tokens" } dd { (i) " in, " (o) " out" } }
            }
            @if s.failed() || s.error_type.is_some() {
                h3 { "Error" }
                dl.kv.error {
                    dt { "type" } dd { @if let Some(t) = &s.error_type { (t) } }
                    dt { "code" } dd { @if let Some(c) = &s.error_code { code { (c) } } }
                    dt { "class" } dd { @if let Some(c) = &s.error_class { (c) } }
                    dt { "message" } dd.message { @if let Some(m) = &s.error_message { (m) } }
                    dt { "retryable" } dd { @if let Some(r) = s.retryable { (r) } }
                    dt { "retry after" } dd { @if let Some(r) = s.retry_after_ms { (r) " ms" } }
                    dt { "reference" } dd { @if let Some(r) = &s.reference { a.mono href=(reference_href(r)) { (r) } } }
                }
            }
            (payload("Arguments", &s.input, s.input_bytes, &s.input_sha256))
            (payload("Result", &s.output, s.output_bytes, &s.output_sha256))
            (events(s))
            @if let Some(c) = call { @if c.span_id != s.span_id || s.stage == "call" { (attempts(c, spans, kids)) } }
            h3 { "Attributes" }
            (kv_list(s.attributes.as_deref()))
            h3 { "Resource" }
            (kv_list(s.resource_attributes.as_deref()))
        }
    }
}

/// `GET /r/{reference}`: to the trace of the span carrying the reference, that span
/// selected (of several spans carrying it, the one with an exception event, else the latest).
pub async fn reference(
    State(state): State<Arc<AppState>>,
    Path(reference): Path<String>,
) -> Result<Response, PageError> {
    if !toolspan_query::trace::valid_reference(&reference) {
        return Err(ApiError::invalid_argument(
            "a reference is 1 to 128 letters, digits, '_', '-', '.' or ':', e.g. err_7c1f9a",
        )
        .into());
    }
    // Validated above: no quote can occur in it.
    let sql = format!(
        "SELECT trace_id, span_id, strpos(coalesce(events, ''), '\"exception') > 0 AS exc \
         FROM spans WHERE reference = '{reference}' ORDER BY start_time, span_id LIMIT 100"
    );
    let result = state.service.query(&sql).await?;
    let mut found: Vec<(String, String, bool)> = Vec::new();
    for b in &result.batches {
        let c = Cols::new(b);
        let (t, s, e) = (c.text("trace_id")?, c.text("span_id")?, c.boolean("exc")?);
        for i in 0..b.num_rows() {
            found.push((
                t.str(i).unwrap_or("").into(),
                s.str(i).unwrap_or("").into(),
                e.bool(i).unwrap_or(false),
            ));
        }
    }
    let first_trace = found.first().map(|f| f.0.clone());
    let pick = found
        .iter()
        .filter(|f| Some(&f.0) == first_trace.as_ref())
        .find(|f| f.2)
        .or_else(|| {
            found
                .iter()
                .rev()
                .find(|f| Some(&f.0) == first_trace.as_ref())
        });
    match pick {
        // To the top of the page, where "What failed" shows the span's call.
        Some((t, s, _)) => Ok(Redirect::to(&format!(
            "/traces/{}?span={}#{}",
            segment(t),
            segment(s),
            failed::ANCHOR
        ))
        .into_response()),
        None => Err(ApiError::not_found(format!(
            "no span carries the reference {reference}: check its spelling, or it may not be \
             ingested yet"
        ))
        .into()),
    }
}

/// The lookup box's parameters.
#[derive(Debug, Default, serde::Deserialize)]
pub struct LookupParams {
    /// A reference or a trace id.
    #[serde(rename = "ref")]
    pub reference: Option<String>,
}

/// `GET /r?ref=`: a trace id opens its trace, anything else is looked up as a reference.
pub async fn reference_box(
    params: Result<Query<LookupParams>, QueryRejection>,
) -> Result<Response, PageError> {
    let v = params
        .ok()
        .and_then(|Query(p)| p.reference)
        .map(|r| r.trim().to_string())
        .unwrap_or_default();
    if v.is_empty() {
        return Ok(Redirect::to("/").into_response());
    }
    if v.len() == 32 && v.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok(Redirect::to(&trace_href(&v.to_ascii_lowercase(), None)).into_response());
    }
    if !toolspan_query::trace::valid_reference(&v) {
        return Err(ApiError::invalid_argument(
            "type an error reference (1 to 128 letters, digits, '_', '-', '.' or ':', e.g. \
             err_7c1f9a) or a trace id (32 hexadecimal characters)",
        )
        .into());
    }
    Ok(Redirect::to(&reference_href(&v)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(id: &str, parent: Option<&str>, start: i64, status: &str, stage: &str) -> Span {
        Span {
            trace_id: "ab".repeat(16),
            span_id: id.into(),
            parent_span_id: parent.map(str::to_string),
            name: format!("<b>{id}</b>"),
            stage: stage.into(),
            start_unix_nano: start,
            duration_ms: 1.0,
            status: status.into(),
            error_type: (status == "error").then(|| "PARSE".to_string()),
            error_message: Some("<script>alert('m')</script>".into()),
            ..Span::default()
        }
    }

    #[test]
    fn tree_order_nests_and_survives_cycles() {
        let spans = vec![
            span("a", None, 0, "ok", "agent"),
            span("b", Some("a"), 1, "error", "call"),
            span("c", Some("b"), 2, "error", "attempt"),
            span("d", Some("a"), 3, "ok", "llm"),
            span("x", Some("y"), 4, "ok", "other"),
            span("y", Some("x"), 5, "ok", "other"),
        ];
        let order: Vec<(&str, usize)> = tree_order(&spans)
            .into_iter()
            .map(|(i, d)| (spans[i].span_id.as_str(), d))
            .collect();
        assert_eq!(&order[..4], &[("a", 0), ("b", 1), ("c", 2), ("d", 1)]);
        assert_eq!(order.len(), 6);
    }

    #[test]
    fn pages_escape_span_content() {
        let spans = vec![
            span("a", None, 0, "ok", "agent"),
            span("b", Some("a"), 1, "error", "parse"),
        ];
        let html = render(&"ab".repeat(16), &spans, false, None).into_string();
        assert!(!html.contains("<script>"), "{html}");
        assert!(!html.contains("<b>"), "{html}");
        assert!(html.contains("&lt;script&gt;"));
        assert!(
            html.contains("data-span=\"b\""),
            "the failed span is selected by default"
        );
        // In a call, the call is selected and "What failed" names the stage.
        let spans = vec![
            span("a", None, 0, "ok", "agent"),
            span("b", Some("a"), 1, "error", "call"),
            span("c", Some("b"), 2, "error", "attempt"),
            span("d", Some("c"), 3, "error", "parse"),
        ];
        let html = render(&"ab".repeat(16), &spans, false, None).into_string();
        assert!(
            html.contains("data-span=\"b\""),
            "the call is selected: {html}"
        );
        let panel = &html[html.find("id=\"what-failed\"").expect("the panel")..];
        assert!(
            panel.contains("failed in <span class=\"badge stage\">parse</span>"),
            "{panel}"
        );
        assert!(html.find("id=\"what-failed\"") < html.find("class=\"waterfall\""));
    }
}
