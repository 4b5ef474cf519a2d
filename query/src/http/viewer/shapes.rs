//! The answer shapes section of the tool page: the shapes of the tool's answers (from the
//! `answer_shapes` view) and, for a shape that is a *change*, the fields added, removed or
//! retyped since the shape before it, beside the PARSE failures of the calls that got it.

use maud::{html, Markup};
use toolspan_schema::shape;

use super::page::{self, query};
use crate::error::QueryError;
use crate::http::rows::Cols;
use crate::http::search::literal;
use crate::service::QueryService;

/// Shapes shown at most (the most recent first).
const MAX_SHAPES: usize = 20;

/// One shape of the tool's answers, over every service and version.
#[derive(Debug, Clone)]
pub struct ShapeRow {
    id: String,
    doc: String,
    first_ns: i64,
    last_ns: i64,
    calls: i64,
    parse_failures: i64,
    change: bool,
    previous: Option<(String, String)>,
}

/// The shapes of `tool`'s answers seen since `since_rfc3339`.
pub async fn load(
    service: &QueryService,
    tool: &str,
    since_rfc3339: &str,
) -> Result<Vec<ShapeRow>, QueryError> {
    let sql = format!(
        "SELECT shape, max(shape_doc) AS doc, \
         CAST(min(first_seen) AS BIGINT) * 1000 AS first_ns, \
         CAST(max(last_seen) AS BIGINT) * 1000 AS last_ns, \
         CAST(sum(calls) AS BIGINT) AS calls, \
         CAST(sum(parse_failures) AS BIGINT) AS parse_failures, \
         bool_or(change) AS change, max(previous_shape) AS previous, \
         max(previous_shape_doc) AS previous_doc \
         FROM answer_shapes WHERE tool = {} AND last_seen >= {} \
         GROUP BY shape ORDER BY first_ns DESC LIMIT {MAX_SHAPES}",
        literal(tool),
        literal(since_rfc3339),
    );
    let result = service.query(&sql).await?;
    let mut rows = Vec::new();
    for b in &result.batches {
        let c = Cols::new(b);
        let (id, doc, first, last, calls, parse, change, prev, prev_doc) = (
            c.text("shape")?,
            c.text("doc")?,
            c.int("first_ns")?,
            c.int("last_ns")?,
            c.int("calls")?,
            c.int("parse_failures")?,
            c.boolean("change")?,
            c.text("previous")?,
            c.text("previous_doc")?,
        );
        for i in 0..b.num_rows() {
            rows.push(ShapeRow {
                id: id.str(i).unwrap_or("").to_string(),
                doc: doc.str(i).unwrap_or("").to_string(),
                first_ns: first.i64(i).unwrap_or(0),
                last_ns: last.i64(i).unwrap_or(0),
                calls: calls.i64(i).unwrap_or(0),
                parse_failures: parse.i64(i).unwrap_or(0),
                change: change.bool(i).unwrap_or(false),
                previous: prev
                    .str(i)
                    .zip(prev_doc.str(i))
                    .map(|(a, b)| (a.to_string(), b.to_string())),
            });
        }
    }
    Ok(rows)
}

/// The section: a table of shapes, then each change with its diff and its PARSE failures.
pub fn section(tool: &str, rows: &[ShapeRow]) -> Markup {
    let since = |ns: i64| {
        chrono::DateTime::<chrono::Utc>::from_timestamp(
            ns.div_euclid(1_000_000_000),
            u32::try_from(ns.rem_euclid(1_000_000_000)).unwrap_or(0),
        )
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
    };
    let parse_failures_href = |ns: i64| {
        format!(
            "/{}",
            query(&[
                ("tool", tool),
                ("error_type", "PARSE"),
                ("since", &since(ns))
            ])
        )
    };
    html! {
        section.shapes {
            h2 { "Answer shapes" }
            @if rows.is_empty() {
                p.muted { "No recorded answer of this tool in this range." }
            } @else {
                table.shapes {
                    thead { tr { th { "shape" } th { "first seen" } th { "last seen" } th.num { "calls" } th.num { "PARSE failures" } th { "" } } }
                    tbody { @for r in rows {
                        tr data-shape=(r.id) data-change=(r.change) {
                            td { code.mono title=(r.doc) { (r.id) } }
                            td { (page::time(r.first_ns)) }
                            td { (page::time(r.last_ns)) }
                            td.num { (r.calls) }
                            td.num { (r.parse_failures) }
                            td { @if r.change { strong.changed { "changed" } } }
                        }
                    } }
                }
                @for r in rows.iter().filter(|r| r.change) {
                    @if let Some((prev, prev_doc)) = &r.previous {
                        div.shape-change data-shape=(r.id) {
                            h3 {
                                "The answer changed shape: " code.mono { (prev) } " → " code.mono { (r.id) }
                                " at " (page::time(r.first_ns))
                            }
                            ul.diff { @for c in shape::diff(prev_doc, &r.doc) {
                                li data-kind=(c.kind()) {
                                    (c.kind()) " " code { (c.path) }
                                    @match (&c.before, &c.after) {
                                        (Some(b), Some(a)) => { " (" (b) " → " (a) ")" }
                                        (None, Some(a)) => { " (" (a) ")" }
                                        (Some(b), None) => { " (was " (b) ")" }
                                        (None, None) => {}
                                    }
                                }
                            } }
                            p.followed {
                                (r.parse_failures) " of the " (r.calls) " calls that got this shape failed with PARSE. "
                                a href=(parse_failures_href(r.first_ns)) { "PARSE failures since →" }
                            }
                        }
                    }
                }
            }
        }
    }
}
