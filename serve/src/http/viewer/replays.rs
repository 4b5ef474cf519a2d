//! Replays on the trace page. A replay (`python -m toolspan replay`, `toolspan.replay()`, an
//! eval run) is a traced call of its own whose call span carries `toolspan.replay.of` =
//! `<trace id>:<span id>` of the call it re-ran. The page of a replay says which call it
//! re-ran, with a link; the page of a trace whose calls were replayed lists the replays, with
//! their outcome and a link to each.

use maud::{html, Markup};
use serde_json::Value;

use super::page::{self, status_badge, trace_href};
use toolspan_query::error::QueryError;
use toolspan_query::rows::{Cols, Span};
use toolspan_query::sql::literal;
use toolspan_query::QueryService;

/// The attribute a replay's call span carries: the original call as `<trace id>:<span id>`.
pub const REPLAY_OF: &str = "toolspan.replay.of";
/// Replays listed on one trace page at most.
const MAX_LISTED: usize = 50;

/// The original call a replay's call span names: (trace id, span id), both lower-case hex.
pub fn replay_of(span: &Span) -> Option<(String, String)> {
    let attrs: Value = serde_json::from_str(span.attributes.as_deref()?).ok()?;
    let of = attrs.get(REPLAY_OF)?.as_str()?;
    let (tid, sid) = of.split_once(':')?;
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex(tid, 32) && hex(sid, 16)).then(|| (tid.to_ascii_lowercase(), sid.to_ascii_lowercase()))
}

/// "Replay of …" for each call of this trace that is a replay.
pub fn banner(spans: &[Span]) -> Markup {
    let replays: Vec<(&Span, (String, String))> = spans
        .iter()
        .filter(|s| s.stage == "call")
        .filter_map(|s| replay_of(s).map(|of| (s, of)))
        .collect();
    html! {
        @for (s, (tid, sid)) in &replays {
            p.replay-of {
                "This call of " code { (s.tool_name().unwrap_or("?")) } " is a replay of "
                a href=(trace_href(tid, Some(sid))) { "the call it re-ran" }
                " (trace " span.mono { (tid) } ")."
            }
        }
    }
}

/// One replay of a call of this trace.
struct Replay {
    trace_id: String,
    span_id: String,
    of_span: String,
    tool: String,
    status: String,
    error_type: Option<String>,
    error_code: Option<String>,
    start_ns: i64,
}

/// The replays of this trace's calls, newest last. Only the calls' tools and the days from
/// the trace's start on are read (the table is partitioned by tool and date).
pub async fn replays_of(
    service: &QueryService,
    trace_id: &str,
    spans: &[Span],
) -> Result<Markup, QueryError> {
    let mut tools: Vec<&str> = spans
        .iter()
        .filter(|s| s.stage == "call")
        .filter_map(|s| s.tool.as_deref())
        .collect();
    tools.sort_unstable();
    tools.dedup();
    let Some(start) = spans.iter().map(|s| s.start_unix_nano).min() else {
        return Ok(html! {});
    };
    if tools.is_empty() {
        return Ok(html! {});
    }
    let day = chrono::DateTime::from_timestamp_nanos(start)
        .format("%Y-%m-%d")
        .to_string();
    let tool_list = tools
        .iter()
        .map(|t| literal(t))
        .collect::<Vec<_>>()
        .join(", ");
    let sql = format!(
        "SELECT trace_id, span_id, tool, status, error_type, error_code, \
         start_time_unix_nano AS start_ns, json_get_str(attributes, {of}) AS of FROM spans \
         WHERE stage = 'call' AND tool IN ({tool_list}) AND date >= {day} \
         AND attributes LIKE {text} AND json_get_str(attributes, {of}) LIKE {prefix} \
         ORDER BY start_time_unix_nano, span_id LIMIT {limit}",
        of = literal(REPLAY_OF),
        day = literal(&day),
        prefix = literal(&format!("{trace_id}:%")),
        // The attributes are stored as compact JSON: a plain text match rules out nearly
        // every row before any of them is parsed (the trace id is hex, no LIKE wildcard).
        text = literal(&format!("%\"{REPLAY_OF}\":\"{trace_id}:%")),
        limit = MAX_LISTED + 1,
    );
    let result = service.query(&sql).await?;
    let mut replays = Vec::new();
    for b in &result.batches {
        let c = Cols::new(b);
        let (tid, sid, tool, status) = (
            c.text("trace_id")?,
            c.text("span_id")?,
            c.text("tool")?,
            c.text("status")?,
        );
        let (etype, code, of) = (c.text("error_type")?, c.text("error_code")?, c.text("of")?);
        let start_ns = c.int("start_ns")?;
        for i in 0..b.num_rows() {
            let of_span = of
                .str(i)
                .and_then(|o| o.split_once(':'))
                .map(|(_, s)| s.to_string())
                .unwrap_or_default();
            replays.push(Replay {
                trace_id: tid.str(i).unwrap_or_default().to_string(),
                span_id: sid.str(i).unwrap_or_default().to_string(),
                of_span,
                tool: tool.str(i).unwrap_or_default().to_string(),
                status: status.str(i).unwrap_or_default().to_string(),
                error_type: etype.str(i).map(str::to_string),
                error_code: code.str(i).map(str::to_string),
                start_ns: start_ns.i64(i).unwrap_or(0),
            });
        }
    }
    if replays.is_empty() {
        return Ok(html! {});
    }
    let more = replays.len() > MAX_LISTED;
    replays.truncate(MAX_LISTED);
    Ok(html! {
        section.replays {
            h2 { "Replays of this trace's calls" }
            table {
                thead { tr { th { "when" } th { "tool" } th { "call replayed" } th { "outcome" } th { "replay" } } }
                tbody {
                    @for r in &replays {
                        tr {
                            td { (page::time(r.start_ns)) }
                            td { code { (r.tool) } }
                            td { a href=(trace_href(trace_id, Some(&r.of_span))) { span.mono { (r.of_span) } } }
                            td {
                                (status_badge(&r.status, r.error_type.as_deref()))
                                @if let Some(c) = &r.error_code { " " code { (c) } }
                            }
                            td { a href=(trace_href(&r.trace_id, Some(&r.span_id))) { "open" } }
                        }
                    }
                }
            }
            @if more { p.muted { "Only the first " (MAX_LISTED) " replays are listed." } }
        }
    })
}
