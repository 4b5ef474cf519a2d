//! The `answer_shapes` view: the shapes of each tool's answers per service version, and when
//! a tool's answer changed shape (drift), in SQL over `spans`.

use std::sync::LazyLock;

use super::spelled;

/// A new answer shape is a *change* when the tool had at least this many calls with an answer
/// before it appeared (a tool's first few answers are its baseline, not a drift).
pub const CHANGE_MIN_CALLS_BEFORE: u32 = 10;
/// ... and it carries at least this share of the tool's calls since it appeared.
pub const CHANGE_MIN_SHARE: f64 = 0.2;

/// `answer_shapes`: the shapes of a tool's answers, one row per tenant, tool, service, service
/// version and shape. A call's answer is the raw answer its last `send` or `execute` stage
/// recorded (its `output_shape`; stage spans under the call directly or through an attempt),
/// or else the result of a call that did not fail (a failed call's own result is what the
/// model was told, an envelope or a stack trace, not the tool's answer); other calls are not
/// counted.
///
/// - `shape`, `shape_doc`: the shape's id and canonical form (`output_shape`,
///   `output_shape_doc`); `first_seen`, `last_seen`, `calls`: of this service version's calls
///   with it; `share`: its part of the version's calls of the tool with an answer;
///   `failures`, `failure_rate`, `parse_failures`, `parse_rate`: of those calls (a call that
///   failed; one that failed with `error_type` `PARSE` or a failed parse stage, as when a
///   retry after a network failure then failed to parse: `RETRY_EXHAUSTED`);
/// - over the tool's calls in every service and version: `shape_first_seen` (when the tool
///   first answered with it), `previous_shape` and `previous_shape_doc` (the shape of the
///   tool's answer just before), `calls_before` (the tool's answered calls before it),
///   `share_since` (its part of the tool's answered calls since it appeared), and `change`:
///   the shape is new for the tool after at least [`CHANGE_MIN_CALLS_BEFORE`] answered calls
///   and carries at least [`CHANGE_MIN_SHARE`] of them since. The table is the lookback
///   window: a shape seen before is not new while the table (its retention) still holds it.
pub static ANSWER_SHAPES_SQL: LazyLock<String> =
    LazyLock::new(|| format!("CREATE VIEW answer_shapes AS {}", answer_shapes_query(None)));

/// [`ANSWER_SHAPES_TEMPLATE`] in the vocabulary's spellings.
static ANSWER_SHAPES_SPELLED: LazyLock<String> = LazyLock::new(|| {
    spelled(ANSWER_SHAPES_TEMPLATE)
        .replace("{min_before}", &CHANGE_MIN_CALLS_BEFORE.to_string())
        .replace("{min_share}", &format!("{CHANGE_MIN_SHARE:?}"))
});

/// The `answer_shapes` view's query, for one tool's answers only when `tool` is given: the
/// same rows as the view's for that tool, reading that tool's spans (and those stored without
/// a tool) instead of every tool's. A stage or attempt span is of its call's tool, or of none
/// ([`toolspan_schema::columns::NO_TOOL`]) when it was stored before its call was seen.
pub fn answer_shapes_query(tool: Option<&str>) -> String {
    let (spans, calls) = match tool {
        Some(t) => (
            format!(
                " AND tool IN ({}, {})",
                crate::sql::literal(t),
                crate::sql::literal(toolspan_schema::columns::NO_TOOL)
            ),
            format!(" AND c.tool = {}", crate::sql::literal(t)),
        ),
        None => (String::new(), String::new()),
    };
    ANSWER_SHAPES_SPELLED
        .replace("{tool}", &spans)
        .replace("{tool_c}", &calls)
}

/// A statement that returns a row when the table holds an answer shape of `tool`'s (a span of
/// its calls with a recorded result), and none otherwise: then [`answer_shapes_query`] for
/// the tool has no rows, and need not be run (a deployment whose spans carry no results
/// would pay for reading every call of the tool to find none). It stops at the first such
/// span.
pub fn answers_recorded_query(tool: &str) -> String {
    format!(
        "SELECT 1 AS recorded FROM spans WHERE stage IN ('call', 'send', 'execute') \
         AND output_shape IS NOT NULL AND tool IN ({}, {}) LIMIT 1",
        crate::sql::literal(tool),
        crate::sql::literal(toolspan_schema::columns::NO_TOOL)
    )
}

pub(super) const ANSWER_SHAPES_TEMPLATE: &str = r#"
WITH stage_answers AS (
    SELECT s.trace_id,
           coalesce(a.parent_span_id, s.parent_span_id) AS call_span_id,
           s.span_id,
           s.start_time,
           s.output_shape,
           s.stage = 'parse' AND {failed:s} AS parse_failed
    FROM (SELECT trace_id, span_id, parent_span_id, start_time, stage, status, output_shape
          FROM spans
          WHERE ((stage IN ('send', 'execute') AND output_shape IS NOT NULL)
                 OR (stage = 'parse' AND {failed})){tool}) s
    LEFT JOIN (SELECT trace_id, span_id, parent_span_id FROM spans
               WHERE stage = 'attempt'{tool}) a
      ON a.trace_id = s.trace_id AND a.span_id = s.parent_span_id
),
-- the shape of the call's last stage answer with one, by (start time, span id): the greatest
-- of start time (microseconds, 20 digits), span id (16 hex digits) and shape, as one string
-- (an ordered last_value is several times slower in DataFusion than a max of strings)
last_answers AS (
    SELECT trace_id,
           call_span_id,
           substr(max(CASE WHEN output_shape IS NOT NULL
                           THEN concat(lpad(CAST(CAST(start_time AS BIGINT) AS VARCHAR), 20, '0'),
                                       span_id, output_shape)
                      END), 37) AS shape,
           bool_or(parse_failed) AS parse_failed
    FROM stage_answers
    GROUP BY trace_id, call_span_id
),
answers AS (
    SELECT c.tenant,
           c.tool,
           c.service,
           c.service_version,
           c.start_time,
           c.span_id,
           coalesce(l.shape, c.output_shape) AS shape,
           {failed:c} AS failed,
           ({failed:c}
            AND (coalesce(c.error_type = 'PARSE', false) OR coalesce(l.parse_failed, false)))
               AS parse_failed
    FROM spans c
    LEFT JOIN last_answers l ON l.trace_id = c.trace_id AND l.call_span_id = c.span_id
    WHERE c.stage = 'call'{tool_c}
      AND (l.shape IS NOT NULL OR (NOT {failed:c} AND c.output_shape IS NOT NULL))
),
ordered AS (
    SELECT a.*,
           count(*) OVER (PARTITION BY a.tenant, a.tool ORDER BY a.start_time DESC, a.span_id DESC
                          ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS calls_from_here,
           count(*) OVER (PARTITION BY a.tenant, a.tool) AS tool_calls,
           lag(a.shape) OVER (PARTITION BY a.tenant, a.tool ORDER BY a.start_time, a.span_id)
               AS shape_before
    FROM answers a
),
per_version AS (
    SELECT tenant,
           tool,
           service,
           service_version,
           shape,
           min(start_time) AS first_seen,
           max(start_time) AS last_seen,
           count(*) AS calls,
           sum(CASE WHEN failed THEN 1 ELSE 0 END) AS failures,
           sum(CASE WHEN parse_failed THEN 1 ELSE 0 END) AS parse_failures,
           max(calls_from_here) AS calls_since,
           max(tool_calls) AS tool_calls,
           first_value(span_id ORDER BY start_time, span_id) AS first_span_id,
           first_value(shape_before ORDER BY start_time, span_id) AS shape_before
    FROM ordered
    GROUP BY tenant, tool, service, service_version, shape
),
-- the tool's figures of each shape, over its versions' rows: the versions' answers in one
-- pass (reading `answers` again for them would join the calls with their answers twice)
by_tool AS (
    SELECT p.*,
           min(p.first_seen) OVER shape_of_tool AS shape_first_seen,
           sum(p.calls) OVER shape_of_tool AS with_shape,
           max(p.calls_since) OVER shape_of_tool AS tool_calls_since,
           first_value(p.shape_before) OVER first_of_shape AS previous_shape
    FROM per_version p
    WINDOW shape_of_tool AS (PARTITION BY p.tenant, p.tool, p.shape),
           first_of_shape AS (PARTITION BY p.tenant, p.tool, p.shape
                              ORDER BY p.first_seen, p.first_span_id)
),
-- a shape's document: its id names it (a hash of the document, or the kind itself), so any
-- span with the shape has it; read once, for the shapes and the previous shapes both
docs AS (
    SELECT output_shape AS shape, max(output_shape_doc) AS doc
    FROM spans
    WHERE stage IN ('call', 'send', 'execute') AND output_shape IS NOT NULL{tool}
    GROUP BY output_shape
),
with_docs AS (
    SELECT t.tenant, t.tool, t.service, t.service_version, t.shape, t.first_seen, t.last_seen,
           t.calls, t.failures, t.parse_failures, t.tool_calls, t.shape_first_seen,
           t.with_shape, t.tool_calls_since, t.previous_shape,
           max(CASE WHEN d.shape = t.shape THEN d.doc END) AS shape_doc,
           max(CASE WHEN d.shape = t.previous_shape THEN d.doc END) AS previous_shape_doc
    FROM by_tool t
    LEFT JOIN docs d ON d.shape = t.shape OR d.shape = t.previous_shape
    GROUP BY t.tenant, t.tool, t.service, t.service_version, t.shape, t.first_seen,
             t.last_seen, t.calls, t.failures, t.parse_failures, t.tool_calls,
             t.shape_first_seen, t.with_shape, t.tool_calls_since, t.previous_shape
)
SELECT t.tool,
       t.service,
       t.service_version,
       t.shape,
       t.shape_doc,
       t.first_seen,
       t.last_seen,
       CAST(t.calls AS BIGINT) AS calls,
       CAST(t.calls AS DOUBLE)
           / CAST(sum(t.calls) OVER (PARTITION BY t.tenant, t.tool, t.service, t.service_version)
                  AS DOUBLE) AS share,
       CAST(t.failures AS BIGINT) AS failures,
       CAST(t.failures AS DOUBLE) / CAST(t.calls AS DOUBLE) AS failure_rate,
       CAST(t.parse_failures AS BIGINT) AS parse_failures,
       CAST(t.parse_failures AS DOUBLE) / CAST(t.calls AS DOUBLE) AS parse_rate,
       t.shape_first_seen,
       t.previous_shape,
       t.previous_shape_doc,
       CAST(t.tool_calls - t.tool_calls_since AS BIGINT) AS calls_before,
       CAST(t.with_shape AS DOUBLE) / CAST(t.tool_calls_since AS DOUBLE) AS share_since,
       (t.previous_shape IS NOT NULL
        AND t.tool_calls - t.tool_calls_since >= {min_before}
        AND CAST(t.with_shape AS DOUBLE) / CAST(t.tool_calls_since AS DOUBLE) >= {min_share})
           AS change,
       t.tenant
FROM with_docs t
"#;
