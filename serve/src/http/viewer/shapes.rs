//! The answer shapes section of the tool page: the shapes of the tool's answers (from the
//! `answer_shapes` view) and, for a shape that is a *change*, the fields added, removed or
//! retyped since the shape before it, beside the PARSE failures of the calls that got it.

use maud::{html, Markup};
use toolspan_schema::shape;

use super::page::{self, query};
use toolspan_query::error::QueryError;
use toolspan_query::rows::Cols;
use toolspan_query::service::QueryService;
use toolspan_query::sql::literal;

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

/// The statement of the shapes of `tool`'s answers seen since `since_rfc3339`: the
/// `answer_shapes` view's rows for this tool (its query for one tool, which reads this tool's
/// spans only), summed over services and versions.
pub fn sql(tool: &str, since_rfc3339: &str) -> String {
    format!(
        "SELECT shape, max(shape_doc) AS doc, \
         CAST(min(first_seen) AS BIGINT) * 1000 AS first_ns, \
         CAST(max(last_seen) AS BIGINT) * 1000 AS last_ns, \
         CAST(sum(calls) AS BIGINT) AS calls, \
         CAST(sum(parse_failures) AS BIGINT) AS parse_failures, \
         bool_or(change) AS change, max(previous_shape) AS previous, \
         max(previous_shape_doc) AS previous_doc \
         FROM ({}) s WHERE last_seen >= {} \
         GROUP BY shape ORDER BY first_ns DESC LIMIT {MAX_SHAPES}",
        toolspan_query::views::answer_shapes_query(Some(tool)),
        literal(since_rfc3339),
    )
}

/// The shapes of `tool`'s answers seen since `since_rfc3339`, or `None` when the table holds
/// no recorded answer of the tool at all (its spans carry no results).
pub async fn load(
    service: &QueryService,
    tool: &str,
    since_rfc3339: &str,
) -> Result<Option<Vec<ShapeRow>>, QueryError> {
    let recorded = service
        .query(&toolspan_query::views::answers_recorded_query(tool))
        .await?;
    if recorded.batches.iter().all(|b| b.num_rows() == 0) {
        return Ok(None);
    }
    let sql = sql(tool, since_rfc3339);
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
    Ok(Some(rows))
}

/// The section: a table of shapes, then each change with its diff and its PARSE failures
/// (`None`: no answer of the tool is recorded).
pub fn section(tool: &str, rows: Option<&[ShapeRow]>) -> Markup {
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
            @if let Some(rows) = rows.filter(|r| !r.is_empty()) {
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
            } @else if rows.is_some() {
                p.muted { "No recorded answer of this tool in this range." }
            } @else {
                p.muted {
                    "No answer of this tool is recorded: shapes come from the results its spans carry (the "
                    code { "output" } " column), and none of its spans has one."
                }
            }
        }
    }
}

/// Answers a tool gave before a shape appeared, at least, for that shape to count as new (its
/// first answers are its baseline), as in `answer_shapes`.
const NEW_AFTER_ANSWERS: i64 = 10;

/// For a trace with PARSE failures of `tools`: whether the answers those tools got in it (the
/// shapes their `send` or `execute` stages recorded) had a new shape, and if so what changed
/// from the shape the tool answered with before. Empty when nothing is known.
pub async fn trace_note(
    service: &QueryService,
    trace_id: &str,
    tools: &[String],
) -> Result<Markup, QueryError> {
    if tools.is_empty() {
        return Ok(html! {});
    }
    let tool_list = tools
        .iter()
        .map(|t| literal(t))
        .collect::<Vec<_>>()
        .join(", ");
    let answers = service
        .query(&format!(
            "SELECT tool, output_shape AS shape, max(output_shape_doc) AS doc FROM spans \
             WHERE trace_id = {} AND tool IN ({tool_list}) AND stage IN ('send', 'execute') \
             AND output_shape IS NOT NULL GROUP BY 1, 2 ORDER BY 1, 2 LIMIT 5",
            literal(trace_id)
        ))
        .await?;
    let mut notes = Vec::new();
    for b in &answers.batches {
        let c = Cols::new(b);
        let (tool, id, doc) = (c.text("tool")?, c.text("shape")?, c.text("doc")?);
        for i in 0..b.num_rows() {
            let (tool, id, doc) = (
                tool.str(i).unwrap_or(""),
                id.str(i).unwrap_or(""),
                doc.str(i).unwrap_or(""),
            );
            let answered = format!(
                "tool = {} AND stage IN ('send', 'execute') AND output_shape IS NOT NULL",
                literal(tool)
            );
            let first = service
                .query(&format!(
                    "SELECT CAST(min(start_time) AS BIGINT) * 1000 AS first_ns FROM spans \
                     WHERE {answered} AND output_shape = {}",
                    literal(id)
                ))
                .await?;
            let first_ns = first
                .batches
                .iter()
                .find(|b| b.num_rows() > 0)
                .map(|b| Cols::new(b).int("first_ns").map(|c| c.i64(0)))
                .transpose()?
                .flatten()
                .unwrap_or(0);
            let before_first =
                format!("{answered} AND CAST(start_time AS BIGINT) * 1000 < {first_ns}");
            let count = service
                .query(&format!(
                    "SELECT count(*) AS n FROM spans WHERE {before_first}"
                ))
                .await?;
            let n = count
                .batches
                .iter()
                .find(|b| b.num_rows() > 0)
                .map(|b| Cols::new(b).int("n").map(|c| c.i64(0)))
                .transpose()?
                .flatten()
                .unwrap_or(0);
            // The shape the tool answered with last before this one appeared.
            let last = service
                .query(&format!(
                    "SELECT output_shape AS shape, output_shape_doc AS doc FROM spans \
                     WHERE {before_first} ORDER BY start_time DESC LIMIT 1"
                ))
                .await?;
            let mut prev = None;
            if let Some(b) = last.batches.iter().find(|b| b.num_rows() > 0) {
                let c = Cols::new(b);
                let (s, d) = (c.text("shape")?, c.text("doc")?);
                prev = s
                    .str(0)
                    .zip(d.str(0))
                    .map(|(s, d)| (s.to_string(), d.to_string()));
            }
            notes.push((
                tool.to_string(),
                id.to_string(),
                doc.to_string(),
                first_ns,
                n >= NEW_AFTER_ANSWERS,
                prev,
            ));
        }
    }
    Ok(html! {
        @for (tool, id, doc, first_ns, new, prev) in &notes {
            section.answer-shape data-shape=(id) data-new=(new) {
                h2 { "The answer's shape" }
                @if *new {
                    p {
                        "The answer " code { (tool) } " got here has a " strong { "new shape" } " "
                        code.mono title=(doc) { (id) } ", first answered at " (page::time(*first_ns)) "."
                    }
                    @if let Some((prev_id, prev_doc)) = prev {
                        p { "Before, it answered with " code.mono title=(prev_doc) { (prev_id) } ":" }
                        ul.diff { @for c in shape::diff(prev_doc, doc) {
                            li data-kind=(c.kind()) { (c.kind()) " " code { (c.path) } }
                        } }
                    }
                } @else {
                    p {
                        "The answer " code { (tool) } " got here has the shape "
                        code.mono title=(doc) { (id) } " it has answered with since "
                        (page::time(*first_ns)) ": not new."
                    }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_says_whether_no_answer_is_recorded_or_none_in_the_range() {
        let none_recorded = section("ping", None).into_string();
        assert!(
            none_recorded.contains("No answer of this tool is recorded"),
            "{none_recorded}"
        );
        let none_in_range = section("ping", Some(&[])).into_string();
        assert!(
            none_in_range.contains("No recorded answer of this tool in this range."),
            "{none_in_range}"
        );
        assert!(!none_in_range.contains("is recorded:"), "{none_in_range}");
    }
}
