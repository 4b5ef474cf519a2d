//! The trace page's first panel, "What failed": for one failed tool call, the stage where it
//! failed with the error's type, code, message and reference, and beside it what the model
//! received in answer (the result as stored, or the error envelope; whether it leaked
//! internals; what was redacted; size and hash) and the arguments the model sent. It is the
//! page's top (`#what-failed`), so an error reference lands on it.

use std::collections::HashMap;

use maud::{html, Markup};

use super::page::{badge, duration, reference_href, status_badge, tool_href, trace_href};
use super::trace::{events, payload};
use toolspan_query::rows::Span;

/// The anchor of the panel.
pub const ANCHOR: &str = "what-failed";

/// The call `s` belongs to (itself, or its nearest `call` ancestor).
pub fn call_of<'a>(s: &'a Span, by_id: &HashMap<&str, &'a Span>) -> Option<&'a Span> {
    let mut cur = Some(s);
    for _ in 0..=toolspan_query::trace::MAX_DEPTH {
        match cur {
            Some(c) if c.stage == "call" => return Some(c),
            Some(c) => {
                cur = c
                    .parent_span_id
                    .as_deref()
                    .and_then(|p| by_id.get(p).copied())
            }
            None => return None,
        }
    }
    None
}

/// What the panel shows: the call, the span where its failure started, and the other failed
/// calls of the trace.
pub struct Focus<'a> {
    /// The failed call (absent when the failure is outside any tool call).
    pub call: Option<&'a Span>,
    /// Where the failure started (a failed span none of whose children failed).
    pub origin: Option<&'a Span>,
    /// Every other failed call, in start order.
    pub others: Vec<&'a Span>,
}

/// The focus of a trace: the call of the `selected` span when it is in a failed call, else
/// the first failed call; its origin is the selected span when that is an origin, else the
/// call's first origin.
pub fn focus<'a>(
    selected: Option<&'a Span>,
    origins: &[&'a Span],
    calls: &[&'a Span],
    by_id: &HashMap<&str, &'a Span>,
) -> Focus<'a> {
    let failed_calls: Vec<&Span> = calls.iter().copied().filter(|c| c.failed()).collect();
    let call = selected
        .and_then(|s| call_of(s, by_id))
        .filter(|c| c.failed())
        .or_else(|| failed_calls.first().copied())
        .or_else(|| origins.first().and_then(|o| call_of(o, by_id)));
    let in_call = |o: &&Span| match call {
        Some(c) => call_of(o, by_id).is_some_and(|oc| oc.span_id == c.span_id),
        None => true,
    };
    let origin = selected
        .filter(|s| origins.iter().any(|o| o.span_id == s.span_id) && in_call(s))
        .or_else(|| origins.iter().copied().find(in_call));
    let others = failed_calls
        .into_iter()
        .filter(|c| call.is_none_or(|f| f.span_id != c.span_id))
        .collect();
    Focus {
        call,
        origin,
        others,
    }
}

/// The panel; nothing when nothing failed.
pub fn panel(f: &Focus<'_>) -> Markup {
    let (call, origin) = (f.call, f.origin);
    let Some(err) = origin.or(call) else {
        return html! {};
    };
    // The error's fields from where it started, else from the call.
    let pick = |get: fn(&Span) -> Option<String>| get(err).or_else(|| call.and_then(get));
    let (etype, code, class, message, reference) = (
        pick(|s| s.error_type.clone()),
        pick(|s| s.error_code.clone()),
        pick(|s| s.error_class.clone()),
        pick(|s| s.error_message.clone()),
        pick(|s| s.reference.clone()),
    );
    let retryable = err.retryable.or(call.and_then(|c| c.retryable));
    let retry_after = err.retry_after_ms.or(call.and_then(|c| c.retry_after_ms));
    html! {
        section.what-failed id=(ANCHOR) {
            div.failure {
                h2 { "What failed" }
                @if let Some(c) = call {
                    p.call {
                        "Call " a href=(trace_href(&c.trace_id, Some(&c.span_id))) { (c.name) }
                        @if let Some(t) = c.tool_name() { " of " a href=(tool_href(t)) { (t) } }
                        " " (status_badge(&c.status, c.error_type.as_deref()))
                        span.muted { " " (c.attempt.unwrap_or(1)) " attempt(s), " (duration(c.duration_ms)) }
                    }
                }
                @if let Some(o) = origin {
                    p.stage {
                        "failed in " (badge("stage", &o.stage)) " "
                        a href=(trace_href(&o.trace_id, Some(&o.span_id))) { (o.name) }
                        @if let Some(a) = o.attempt { @if o.stage != "call" { span.muted { " attempt " (a) } } }
                    }
                }
                dl.kv.error {
                    dt { "type" } dd.error-type { @if let Some(t) = &etype { (t) } }
                    dt { "code" } dd.code { @if let Some(c) = &code { code { (c) } } @else { span.muted { "none (unmapped)" } } }
                    dt { "class" } dd { @if let Some(c) = &class { (c) } }
                    dt { "message" } dd.message { @if let Some(m) = &message { (m) } }
                    dt { "retryable" } dd { @if let Some(r) = retryable { (r) } }
                    @if let Some(r) = retry_after { dt { "retry after" } dd { (r) " ms" } }
                    dt { "reference" } dd.reference { @if let Some(r) = &reference { a.mono href=(reference_href(r)) { (r) } } }
                }
                @if let Some(o) = origin {
                    @if call.is_none_or(|c| c.span_id != o.span_id) {
                        (payload("What the tool answered at this stage", &o.output, o.output_bytes, &o.output_sha256))
                    }
                    (events(o))
                }
                @if !f.others.is_empty() {
                    p.others {
                        (f.others.len()) " other failed call(s) in this trace: "
                        @for (i, c) in f.others.iter().enumerate() {
                            @if i > 0 { ", " }
                            a href=(format!("/traces/{}?span={}#{ANCHOR}", super::page::segment(&c.trace_id), super::page::segment(&c.span_id))) {
                                (c.tool_name().unwrap_or(&c.name)) @if let Some(t) = &c.error_type { " " (t) }
                            }
                        }
                    }
                }
            }
            @if let Some(c) = call {
                div.received {
                    h2 { "What the model received" }
                    p {
                        @if c.leaked_internals { (badge("leak", "leaked internals to the model")) }
                        @else { (badge("ok", "no internals leaked")) }
                        @if c.redactions > 0 { " " (badge("warn", &format!("{} secret(s) redacted before storing", c.redactions))) }
                    }
                    @if c.output.is_some() || c.output_bytes.is_some() {
                        div.result { (payload("Result", &c.output, c.output_bytes, &c.output_sha256)) }
                    } @else if c.error_code.is_some() || c.error_message.is_some() {
                        h3 { "Error envelope" }
                        dl.kv.envelope {
                            dt { "code" } dd { @if let Some(x) = &c.error_code { code { (x) } } }
                            dt { "class" } dd { @if let Some(x) = &c.error_class { (x) } }
                            dt { "message" } dd { @if let Some(x) = &c.error_message { (x) } }
                            dt { "retryable" } dd { @if let Some(x) = c.retryable { (x) } }
                            dt { "reference" } dd { @if let Some(x) = &c.reference { (x) } }
                        }
                    } @else {
                        p.muted { "No result was recorded for this call." }
                    }
                    div.arguments {
                        @if c.input.is_some() || c.input_bytes.is_some() {
                            (payload("Arguments it sent", &c.input, c.input_bytes, &c.input_sha256))
                        } @else {
                            h3 { "Arguments it sent" } p.muted { "not recorded" }
                        }
                    }
                }
            }
        }
    }
}
