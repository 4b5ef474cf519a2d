//! The derived views (`calls`, `recoveries`, `failure_rates`), defined in SQL over `spans`.
//!
//! Their column names and types are part of the SQL interface: dashboards and alert rules
//! query them. `failure_rates` reads the metrics job's per-minute rollup when the engine has
//! one ([`FAILURE_RATES_FROM_ROLLUP_SQL`]) and is computed from `spans` otherwise
//! ([`FAILURE_RATES_SQL`]); both definitions have the same columns and, over the same spans,
//! the same rows.

use std::sync::LazyLock;

use datafusion::prelude::SessionContext;

/// `calls`: one row per logical tool call (a `stage = 'call'` span) with what its attempts
/// add. Attempts belong to a call when they are its children, or when they share its trace and
/// `call_id` (instrumentation that does not parent attempts to the call).
///
/// - `attempts`: the most of the call's own attempt count, the highest attempt number seen
///   and the number of attempt rows (`attempt_stats`, over all attempts);
/// - `recovered_after_retry`: the call did not fail and at least one of its attempts did
///   (`failed_calls`: the calls with a failed attempt, found by joining only the failed
///   attempts — about one in six);
/// - `leaked_internals`: the call or any of its attempts leaked internals to the model;
/// - `unmapped`: the call failed and no named case caught it (error code `internal_error` or
///   none: [`toolspan_schema::vocab::is_unmapped`]), the one definition `recoveries`,
///   `compare` and the metrics share.
///
/// The two per-call summaries are separate joins so that a query pays only for the columns it
/// uses: each is unique per call, so DataFusion drops a left join whose columns a query does
/// not read (a count of recovered calls never joins all attempts), and `f.failed_attempts IS
/// NOT NULL` lets a filter on `recovered_after_retry` turn its join into a semi join. The flag
/// tests the count, not a join key: DataFusion 55 rewrites a null test of the outer join's
/// key inside an `OR` onto the other side's key and then filters below the join (wrong rows
/// for `recovered_after_retry OR …`; query/tests/main/scan.rs).
pub static CALLS_SQL: LazyLock<String> = LazyLock::new(|| {
    CALLS_TEMPLATE.replace(
        "{unmapped}",
        &toolspan_schema::vocab::unmapped_sql("c.error_code"),
    )
});

const CALLS_TEMPLATE: &str = r#"
CREATE VIEW calls AS
WITH attempt_stats AS (
    SELECT c.trace_id,
           c.span_id,
           count(a.span_id) AS attempt_rows,
           max(a.attempt) AS max_attempt,
           bool_or(a.leaked_internals) AS leaked
    FROM (SELECT trace_id, span_id, call_id FROM spans WHERE stage = 'call') c
    JOIN (SELECT trace_id, span_id, parent_span_id, call_id, attempt, leaked_internals
          FROM spans WHERE stage = 'attempt') a
      ON a.trace_id = c.trace_id
     AND (a.parent_span_id = c.span_id OR (a.call_id IS NOT NULL AND a.call_id = c.call_id))
    GROUP BY c.trace_id, c.span_id
),
failed_calls AS (
    SELECT c.trace_id, c.span_id, count(*) AS failed_attempts
    FROM (SELECT trace_id, span_id, call_id FROM spans WHERE stage = 'call') c
    JOIN (SELECT trace_id, parent_span_id, call_id
          FROM spans WHERE stage = 'attempt' AND status = 'error') a
      ON a.trace_id = c.trace_id
     AND (a.parent_span_id = c.span_id OR (a.call_id IS NOT NULL AND a.call_id = c.call_id))
    GROUP BY c.trace_id, c.span_id
)
SELECT c.trace_id,
       c.span_id,
       c.call_id,
       c.tool,
       c.service,
       c.service_version,
       c.agent,
       c.start_time,
       c.end_time,
       c.duration_ms,
       CAST(greatest(coalesce(c.attempt, 1),
                     coalesce(s.max_attempt, 0),
                     coalesce(s.attempt_rows, 0)) AS INT) AS attempts,
       c.status,
       c.error_type,
       c.error_code,
       c.error_class,
       c.reference,
       (c.status <> 'error' AND f.failed_attempts IS NOT NULL) AS recovered_after_retry,
       (c.leaked_internals OR coalesce(s.leaked, false)) AS leaked_internals,
       (c.status = 'error' AND {unmapped}) AS unmapped,
       c.input_sha256,
       c.output_bytes,
       c.tenant,
       c.date
FROM failed_calls f
RIGHT JOIN spans c ON f.trace_id = c.trace_id AND f.span_id = c.span_id
LEFT JOIN attempt_stats s ON s.trace_id = c.trace_id AND s.span_id = c.span_id
WHERE c.stage = 'call'
"#;

/// `recoveries`: the model's own recovery across turns. One row per **failure streak**: within
/// one agent run, the consecutive failed calls of one tool (in start order) up to the next
/// call of that tool that did not fail. The run is the trace, or every trace that carries the
/// same conversation id (`gen_ai.conversation.id`, or OpenInference's `session.id`) on its
/// agent or call spans.
///
/// - `failures`: failed calls in the streak; `recovered`: a later call of the same tool in the
///   run did not fail; `calls_to_recovery` = `failures + 1` when recovered (fail, then succeed:
///   2); `time_to_recovery_ms`: from the end of the first failed call to the end of the call
///   that recovered; `recovered_by_span_id`: that call;
/// - `recovered_by_any_tool`: some call of any tool in the run succeeded after the first
///   failure started (the agent found another way);
/// - `identical_retries`: calls in the streak (the recovering one included) with the same
///   arguments (`input_sha256`) as an earlier failed call of the streak; `hammering`: two or
///   more of them (the tool called three times or more with the same failing arguments);
/// - the first failure's `trace_id`, `span_id`, `call_id`, `error_type`, `error_code`, and
///   `unmapped` (no named case caught it, as in `calls`), `leaked_internals` (any failure of the streak
///   leaked internals to the model), `service`, `service_version`, `agent`, `failed_at`.
///
/// pydantic-ai's `ModelRetry` goes back to the model, which calls the tool again with a new
/// call id: a new call, so it counts here as the model's recovery does. A framework that runs
/// a call again itself makes attempts of one call (classification merges them).
pub const RECOVERIES_SQL: &str = r#"
CREATE VIEW recoveries AS
WITH conversations AS (
    SELECT trace_id,
           max(regexp_match(attributes,
               '"(?:gen_ai[.]conversation[.]id|session[.]id)":"([^"]+)"')[1]) AS conversation
    FROM spans
    WHERE stage IN ('agent', 'call')
      AND (strpos(attributes, '"gen_ai.conversation.id":') > 0
           OR strpos(attributes, '"session.id":') > 0)
    GROUP BY trace_id
),
runs AS (
    SELECT k.*,
           coalesce(v.conversation, k.trace_id) AS run_id,
           k.status = 'error' AS failed
    FROM calls k
    LEFT JOIN conversations v ON v.trace_id = k.trace_id
),
streaks AS (
    SELECT r.*,
           coalesce(sum(CASE WHEN r.failed THEN 0 ELSE 1 END) OVER (
               PARTITION BY r.run_id, r.tool ORDER BY r.start_time, r.span_id
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS streak,
           max(CASE WHEN r.failed THEN NULL ELSE r.start_time END) OVER (PARTITION BY r.run_id)
               AS last_success
    FROM runs r
),
marked AS (
    SELECT s.*,
           CASE WHEN s.input_sha256 IS NOT NULL
                 AND row_number() OVER (
                     PARTITION BY s.run_id, s.tool, s.streak, s.input_sha256
                     ORDER BY s.start_time, s.span_id) > 1
                THEN 1 ELSE 0 END AS identical
    FROM streaks s
),
grouped AS (
    SELECT run_id,
           tool,
           streak,
           first_value(trace_id ORDER BY start_time, span_id) AS trace_id,
           first_value(span_id ORDER BY start_time, span_id) AS span_id,
           first_value(call_id ORDER BY start_time, span_id) AS call_id,
           first_value(service ORDER BY start_time, span_id) AS service,
           first_value(service_version ORDER BY start_time, span_id) AS service_version,
           first_value(agent ORDER BY start_time, span_id) AS agent,
           first_value(error_type ORDER BY start_time, span_id) AS error_type,
           first_value(error_code ORDER BY start_time, span_id) AS error_code,
           first_value(unmapped ORDER BY start_time, span_id) AS unmapped,
           first_value(tenant ORDER BY start_time, span_id) AS tenant,
           first_value(date ORDER BY start_time, span_id) AS date,
           min(start_time) AS failed_at,
           min(end_time) AS first_failure_end,
           sum(CASE WHEN failed THEN 1 ELSE 0 END) AS failures,
           max(CASE WHEN failed THEN 0 ELSE 1 END) AS recovered_calls,
           max(CASE WHEN failed THEN NULL ELSE end_time END) AS recovered_at,
           max(CASE WHEN failed THEN NULL ELSE span_id END) AS recovered_by_span_id,
           sum(identical) AS identical_retries,
           bool_or(failed AND leaked_internals) AS leaked_internals,
           max(last_success) AS last_success
    FROM marked
    GROUP BY run_id, tool, streak
    HAVING sum(CASE WHEN failed THEN 1 ELSE 0 END) > 0
)
SELECT g.run_id,
       g.trace_id,
       g.span_id,
       g.call_id,
       g.tool,
       g.service,
       g.service_version,
       g.agent,
       g.failed_at,
       g.error_type,
       g.error_code,
       g.unmapped,
       coalesce(g.leaked_internals, false) AS leaked_internals,
       CAST(g.failures AS BIGINT) AS failures,
       g.recovered_calls = 1 AS recovered,
       CASE WHEN g.recovered_calls = 1 THEN CAST(g.failures + 1 AS BIGINT) END AS calls_to_recovery,
       CASE WHEN g.recovered_calls = 1
            -- timestamps are microseconds (the Delta Lake timestamp type)
            THEN CAST(CAST(g.recovered_at AS BIGINT) - CAST(g.first_failure_end AS BIGINT) AS DOUBLE) / 1e3
       END AS time_to_recovery_ms,
       g.recovered_by_span_id,
       coalesce(g.last_success > g.failed_at, false) AS recovered_by_any_tool,
       CAST(g.identical_retries AS BIGINT) AS identical_retries,
       g.identical_retries >= 2 AS hammering,
       g.tenant,
       g.date
FROM grouped g
"#;

/// The table name the rollup (`failure_rates_1m`) is registered under.
pub const ROLLUP_TABLE: &str = toolspan_store::rollup::TABLE_NAME;

/// `failure_rates`: per minute, tool, stage and error type, the weighted number of spans of
/// that (minute, tool, stage) (`calls`), the weighted number that failed with that error type
/// (`failures`) and their ratio (`rate`). Weights are `sample_weight`, so tail-sampled tables
/// stay unbiased.
///
/// A (minute, tool, stage) with failures has one row per error type, each repeating the same
/// `calls`; one without failures has a single row with `error_type` NULL and `failures` 0. So
/// `sum(failures)` over rows is right, and `calls` must be taken once per (minute, tool,
/// stage) (e.g. `max(calls)`).
///
/// Both definitions first build `grouped` (minute, tool, stage, error type of failures or
/// NULL, weight, failed weight), then share [`FAILURE_RATES_TAIL`].
pub const FAILURE_RATES_SQL: &str = r#"
CREATE VIEW failure_rates AS
WITH grouped AS (
    SELECT date_trunc('minute', start_time) AS minute,
           tool,
           stage,
           CASE WHEN status = 'error' THEN error_type END AS error_type,
           sum(sample_weight) AS weight,
           sum(CASE WHEN status = 'error' THEN sample_weight ELSE 0.0 END) AS failed_weight
    FROM spans
    WHERE stage IN ('call', 'attempt', 'prepare', 'send', 'execute', 'parse')
    GROUP BY 1, 2, 3, 4
),"#;

/// `failure_rates` over the rollup: its rows are partial sums per (minute, tool, stage,
/// error type, service, service version), added up per (minute, tool, stage, error type).
pub const FAILURE_RATES_FROM_ROLLUP_SQL: &str = r#"
CREATE VIEW failure_rates AS
WITH grouped AS (
    SELECT minute,
           tool,
           stage,
           error_type,
           sum(spans) AS weight,
           sum(failures) AS failed_weight
    FROM failure_rates_1m
    GROUP BY 1, 2, 3, 4
),"#;

/// The part of `failure_rates` after `grouped`: each error type's row with the (minute, tool,
/// stage) total, and the rate.
pub const FAILURE_RATES_TAIL: &str = r#"
windowed AS (
    SELECT minute,
           tool,
           stage,
           error_type,
           failed_weight,
           sum(weight) OVER (PARTITION BY minute, tool, stage) AS calls,
           count(*) OVER (PARTITION BY minute, tool, stage) AS groups
    FROM grouped
)
SELECT minute,
       tool,
       stage,
       error_type,
       calls,
       failed_weight AS failures,
       CASE WHEN calls > 0 THEN failed_weight / calls ELSE 0.0 END AS rate
FROM windowed
WHERE error_type IS NOT NULL OR groups = 1
"#;

/// Registers the views on a context whose `spans` table (and, with `rollup`, the
/// [`ROLLUP_TABLE`]) is already registered.
pub(crate) async fn register(ctx: &SessionContext, rollup: bool) -> datafusion::error::Result<()> {
    let head = if rollup {
        FAILURE_RATES_FROM_ROLLUP_SQL
    } else {
        FAILURE_RATES_SQL
    };
    let failure_rates = format!("{head}{FAILURE_RATES_TAIL}");
    for sql in [CALLS_SQL.as_str(), RECOVERIES_SQL, failure_rates.as_str()] {
        ctx.sql(sql).await?.collect().await?;
    }
    Ok(())
}
