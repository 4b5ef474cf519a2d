//! The derived views (`calls`, `recoveries`, `failure_rates`, `answer_shapes`), defined in SQL
//! over `spans`.
//!
//! Their column names and types are part of the SQL interface: dashboards and alert rules
//! query them. `failure_rates` reads the metrics job's per-minute rollup when the engine has
//! one ([`FAILURE_RATES_FROM_ROLLUP_SQL`]) and is computed from `spans` otherwise
//! ([`FAILURE_RATES_SQL`]); both definitions have the same columns and, over the same spans,
//! the same rows.

use std::sync::LazyLock;

use datafusion::prelude::SessionContext;

mod answer_shapes;

pub use answer_shapes::{
    answer_shapes_query, answers_recorded_query, ANSWER_SHAPES_SQL, CHANGE_MIN_CALLS_BEFORE,
    CHANGE_MIN_SHARE,
};

/// `calls`: one row per logical tool call (a `stage = 'call'` span) with what its attempts
/// add. Attempts belong to a call when they are of its tool and are its children, or share its
/// trace and `call_id` (instrumentation that does not parent attempts to the call). An attempt
/// is of its call's tool (it inherits the tool, and a framework's earlier runs of a call are
/// runs of that tool), so a query about one tool's calls can read that tool's attempts only.
///
/// - `attempts`: the most of the call's own attempt count, the highest attempt number seen
///   and the number of attempt rows (`attempt_stats`, over all attempts);
/// - `recovered_after_retry`: the call did not fail and at least one of its attempts did
///   (`failed_calls`: the calls with a failed attempt, found by joining only the failed
///   attempts — about one in six);
/// - `leaked_internals`: the call or any of its attempts leaked internals to the model
///   (`leaked_calls`: the calls with such an attempt, found by joining only those attempts);
/// - `unmapped`: the call failed and no named case caught it (error code `internal_error` or
///   none: [`toolspan_schema::vocab::is_unmapped`]), the one definition `recoveries`,
///   `compare` and the metrics share.
///
/// The three per-call summaries are separate joins so that a query pays only for the columns it
/// uses: each is unique per call, so DataFusion drops a left join whose columns a query does
/// not read (a count of recovered calls never joins all attempts, a count of leaking calls
/// joins only the attempts that leaked), and `f.failed_attempts IS
/// NOT NULL` lets a filter on `recovered_after_retry` turn its join into a semi join. The flag
/// tests the count, not a join key: DataFusion 55 rewrites a null test of the outer join's
/// key inside an `OR` onto the other side's key and then filters below the join (wrong rows
/// for `recovered_after_retry OR …`; query/tests/main/scan.rs).
pub static CALLS_SQL: LazyLock<String> =
    LazyLock::new(|| format!("CREATE VIEW calls AS {}", calls_query(&|_| None, None)));

/// [`CALLS_TEMPLATE`] in the vocabulary's spellings, with the failed attempts in a join of
/// their own ([`CALLS_SEPARATE_JOINS`]).
static CALLS_SPELLED: LazyLock<String> =
    LazyLock::new(|| spelled(&joins(CALLS_TEMPLATE, CALLS_SEPARATE_JOINS)));

/// [`CALLS_TEMPLATE`] in the vocabulary's spellings, with the failed attempts counted in the
/// join of every attempt ([`CALLS_ONE_JOIN`]).
static CALLS_ONE_JOIN_SPELLED: LazyLock<String> =
    LazyLock::new(|| spelled(&joins(CALLS_TEMPLATE, CALLS_ONE_JOIN)));

/// How the `calls` template's attempt joins are written: the text of its placeholders.
struct CallsJoins {
    /// `{stats_columns}`: columns of `attempt_stats` after its counts, or nothing.
    stats_columns: &'static str,
    /// `{ctes}`: more CTEs after `attempt_stats`, or nothing.
    ctes: &'static str,
    /// `{from}`: the final FROM clause.
    from: &'static str,
    /// The count of failed attempts the recovered flag tests (NULL: none failed).
    failed_attempts: &'static str,
    /// Whether an attempt of the call leaked internals (NULL: none did).
    attempt_leaked: &'static str,
}

/// Which attempts `a` belong to call `c`: of its tool and trace, and its children or sharing
/// its `call_id` (the rule every join of a call's attempts uses).
const ATTEMPT_OF_CALL: &str = "a.trace_id = c.trace_id
     AND a.tool = c.tool
     AND (a.parent_span_id = c.span_id OR (a.call_id IS NOT NULL AND a.call_id = c.call_id))";

/// A call's `attempts`, the one definition: the greatest of its own attempt number (1 when
/// it has none), its attempts' greatest number and how many attempt spans it has; `call` is
/// the call span's alias, `max_attempt` and `attempt_rows` what its attempts say (NULL: none).
fn attempts_sql(call: &str, max_attempt: &str, attempt_rows: &str) -> String {
    format!(
        "CAST(greatest(coalesce({call}.attempt, 1), coalesce({max_attempt}, 0), \
         coalesce({attempt_rows}, 0)) AS INT)"
    )
}

/// A call's `recovered_after_retry`, the one definition: the call did not fail (`failed`: whether
/// it did) and an attempt of it did (`failed_attempts`: their count, NULL when none did).
fn recovered_sql(failed: &str, failed_attempts: &str) -> String {
    format!("(NOT {failed} AND {failed_attempts} IS NOT NULL)")
}

/// A call's `leaked_internals`, the one definition: the call or one of its attempts leaked
/// internals to the model (`attempt_leaked`: NULL when no attempt did).
fn leaked_sql(call: &str, attempt_leaked: &str) -> String {
    format!("({call}.leaked_internals OR coalesce({attempt_leaked}, false))")
}

/// The `calls` template with its join placeholders filled in.
fn joins(template: &str, j: CallsJoins) -> String {
    template
        .replace(
            "{attempts}",
            &attempts_sql("c", "s.max_attempt", "s.attempt_rows"),
        )
        .replace(
            "{recovered}",
            &recovered_sql("{failed:c}", j.failed_attempts),
        )
        .replace("{leaked}", &leaked_sql("c", j.attempt_leaked))
        .replace("{stats_columns}", j.stats_columns)
        .replace("{ctes}", j.ctes)
        .replace("{from}", j.from)
        .replace("{attempt_of_call}", ATTEMPT_OF_CALL)
}

/// The view's joins: `failed_calls` joins the failed attempts only and `leaked_calls` the
/// attempts that leaked internals only, so that a query reading `recovered_after_retry` or
/// `leaked_internals` and no attempt counts never joins every attempt.
const CALLS_SEPARATE_JOINS: CallsJoins = CallsJoins {
    stats_columns: "",
    ctes: r#",
failed_calls AS (
    SELECT c.trace_id, c.span_id, count(*) AS failed_attempts
    FROM (SELECT trace_id, span_id, call_id, tool FROM spans WHERE stage = 'call'{call}) c
    JOIN (SELECT trace_id, tool, parent_span_id, call_id
          FROM spans WHERE stage = 'attempt' AND {failed}{attempt}) a
      ON {attempt_of_call}
    GROUP BY c.trace_id, c.span_id
),
leaked_calls AS (
    SELECT c.trace_id, c.span_id, true AS leaked
    FROM (SELECT trace_id, span_id, call_id, tool FROM spans WHERE stage = 'call'{call}) c
    JOIN (SELECT trace_id, tool, parent_span_id, call_id
          FROM spans WHERE stage = 'attempt' AND leaked_internals{attempt}) a
      ON {attempt_of_call}
    GROUP BY c.trace_id, c.span_id
)"#,
    from: "failed_calls f
RIGHT JOIN spans c ON f.trace_id = c.trace_id AND f.span_id = c.span_id
LEFT JOIN leaked_calls l ON l.trace_id = c.trace_id AND l.span_id = c.span_id
LEFT JOIN attempt_stats s ON s.trace_id = c.trace_id AND s.span_id = c.span_id",
    failed_attempts: "f.failed_attempts",
    attempt_leaked: "l.leaked",
};

/// One join of every attempt, which also counts the failed ones (a count of zero is no
/// failed attempt, as a missing `failed_calls` row is in the view) and the leaks.
const CALLS_ONE_JOIN: CallsJoins = CallsJoins {
    stats_columns: ",
           bool_or(a.leaked_internals) AS leaked,
           sum(CASE WHEN {failed:a} THEN 1 ELSE 0 END) AS failed_attempts",
    ctes: "",
    from: "spans c
LEFT JOIN attempt_stats s ON s.trace_id = c.trace_id AND s.span_id = c.span_id",
    failed_attempts: "nullif(s.failed_attempts, 0)",
    attempt_leaked: "s.leaked",
};

/// A view's text with the vocabulary's SQL spellings put in: `{failed}` is
/// [`toolspan_schema::vocab::failed_sql`] over `status` (the one definition of a failed span),
/// `{failed:X}` over `X.status`, and `{tool_stages}` the stages of a tool call's life
/// ([`toolspan_schema::Stage::TOOL`]) as a SQL list.
fn spelled(template: &str) -> String {
    use toolspan_schema::vocab::failed_sql;
    let mut out = template.replace("{failed}", &format!("({})", failed_sql("status")));
    for alias in ["a", "c", "k", "s"] {
        out = out.replace(
            &format!("{{failed:{alias}}}"),
            &format!("({})", failed_sql(&format!("{alias}.status"))),
        );
    }
    out.replace(
        "{tool_stages}",
        &toolspan_schema::Stage::TOOL_NAMES
            .map(|s| format!("'{s}'"))
            .join(", "),
    )
}

/// The `calls` view's query for some calls only: `call` gives the condition on the call
/// spans for a column prefix (`"c."` or `""`), `attempt` a condition on the attempt spans that
/// keeps every attempt of those calls (e.g. their trace ids, their tool, their days). The same rows as the view's for
/// those calls, without summarizing every call's attempts first: a page of the newest failed
/// calls reads its fifty calls' attempts, not the table's.
pub fn calls_query(call: &dyn Fn(&str) -> Option<String>, attempt: Option<&str>) -> String {
    calls_sql(&CALLS_SPELLED, call, attempt)
}

/// [`calls_query`] for a statement that reads what all attempts add (`attempts`) and
/// `recovered_after_retry` or `leaked_internals`: the same rows, with the failed and leaking
/// attempts counted in the one join of every attempt instead of joins of their own. The view
/// keeps separate joins so that a query reading only one column pays for its join only
/// (DataFusion drops the join whose columns are not read); a statement that reads several
/// pays for one join here.
pub fn calls_query_one_join(
    call: &dyn Fn(&str) -> Option<String>,
    attempt: Option<&str>,
) -> String {
    calls_sql(&CALLS_ONE_JOIN_SPELLED, call, attempt)
}

/// The totals of some calls, selected as for [`calls_query`]: one row of `calls`, `failed`,
/// `retried` (`attempts > 1`), `recovered` (`recovered_after_retry`), `exhausted` (`error_type`
/// `RETRY_EXHAUSTED`) and `leaked` (`leaked_internals`), the sums over the `calls` view's rows
/// of those calls. Counted as the call spans alone (each as if it had no attempts) plus what
/// their attempts change for the calls that have some, with the view's definitions of
/// `attempts`, `recovered_after_retry` and `leaked_internals`: the attempts are summarized for
/// the calls they join, and the summaries are never joined back to every call (the view's
/// rows need that; totals do not). A call span stored twice counts twice, as in the view; what
/// its attempts change counts once.
pub fn call_totals_query(call: &dyn Fn(&str) -> Option<String>, attempt: Option<&str>) -> String {
    calls_sql(&CALL_TOTALS_SPELLED, call, attempt)
}

/// [`CALL_TOTALS_TEMPLATE`] with the calls' measures and the vocabulary's spellings put in.
static CALL_TOTALS_SPELLED: LazyLock<String> = LazyLock::new(|| {
    // A measure of calls `s` as if they had no attempts (`failed`: whether the call failed).
    let alone = |m: &str, failed: &str| {
        m.replace("{attempts}", &attempts_sql("s", "NULL", "NULL"))
            .replace("{recovered}", &recovered_sql(failed, "NULL"))
            .replace("{leaked}", &leaked_sql("s", "NULL"))
    };
    // ... and with their attempts' summary (`per_call`).
    let with_attempts = |m: &str| {
        m.replace(
            "{attempts}",
            &attempts_sql("s", "s.max_attempt", "s.attempt_rows"),
        )
        .replace(
            "{recovered}",
            &recovered_sql("s.failed", "nullif(s.failed_attempts, 0)"),
        )
        .replace("{leaked}", &leaked_sql("s", "s.leaked"))
    };
    let counted = |m: &str| format!("CASE WHEN {m} THEN 1 ELSE 0 END");
    let measures = [
        ("retried", "{attempts} > 1"),
        ("recovered", "{recovered}"),
        ("leaked", "{leaked}"),
    ];
    let alone_sums: Vec<String> = measures
        .iter()
        .map(|(name, m)| format!("sum({}) AS {name}", counted(&alone(m, "{failed:s}"))))
        .collect();
    // What attempts change: the measure with them, less the measure alone.
    let changes: Vec<String> = measures
        .iter()
        .map(|(name, m)| {
            format!(
                "sum({} - {}) AS {name}",
                counted(&with_attempts(m)),
                counted(&alone(m, "s.failed"))
            )
        })
        .collect();
    spelled(
        &CALL_TOTALS_TEMPLATE
            .replace("{alone_sums}", &alone_sums.join(",\n           "))
            .replace("{changes}", &changes.join(",\n           "))
            .replace("{attempt_of_call}", ATTEMPT_OF_CALL),
    )
});

const CALL_TOTALS_TEMPLATE: &str = r#"
WITH per_call AS (
    -- the call's own columns the measures read, one value per call (a boolean of its status:
    -- a string aggregated per call costs a fifth of the statement)
    SELECT max(c.attempt) AS attempt,
           bool_or(c.failed) AS failed,
           bool_or(c.leaked_internals) AS leaked_internals,
           count(a.span_id) AS attempt_rows,
           max(a.attempt) AS max_attempt,
           bool_or(a.leaked_internals) AS leaked,
           sum(CASE WHEN {failed:a} THEN 1 ELSE 0 END) AS failed_attempts
    FROM (SELECT trace_id, span_id, call_id, tool, attempt, {failed} AS failed, leaked_internals
          FROM spans WHERE stage = 'call'{call}) c
    JOIN (SELECT trace_id, tool, span_id, parent_span_id, call_id, attempt, leaked_internals,
                 status
          FROM spans WHERE stage = 'attempt'{attempt}) a
      ON {attempt_of_call}
    GROUP BY c.trace_id, c.span_id
),
alone AS (
    SELECT count(*) AS calls,
           sum(CASE WHEN {failed:s} THEN 1 ELSE 0 END) AS failed,
           sum(CASE WHEN s.error_type = 'RETRY_EXHAUSTED' THEN 1 ELSE 0 END) AS exhausted,
           {alone_sums}
    FROM spans s
    WHERE s.stage = 'call'{call}
),
changed AS (
    SELECT {changes}
    FROM per_call s
)
SELECT n.calls,
       coalesce(n.failed, 0) AS failed,
       coalesce(n.retried, 0) + coalesce(d.retried, 0) AS retried,
       coalesce(n.recovered, 0) + coalesce(d.recovered, 0) AS recovered,
       coalesce(n.exhausted, 0) AS exhausted,
       coalesce(n.leaked, 0) + coalesce(d.leaked, 0) AS leaked
FROM alone n
CROSS JOIN changed d
"#;

fn calls_sql(
    template: &str,
    call: &dyn Fn(&str) -> Option<String>,
    attempt: Option<&str>,
) -> String {
    let and = |c: Option<String>| c.map(|c| format!(" AND ({c})")).unwrap_or_default();
    template
        .replace(
            "{unmapped}",
            &toolspan_schema::vocab::unmapped_sql("c.error_code"),
        )
        .replace("{call}", &and(call("")))
        .replace("{call_c}", &and(call("c.")))
        .replace("{attempt}", &and(attempt.map(str::to_string)))
}

/// The condition on attempt spans that keeps every attempt of calls started from day `since`
/// (up to day `until`): an attempt starts within its call, so on the call's day or later, and
/// a day of slack either side covers clocks that disagree across midnight.
pub fn attempts_of_days(since: chrono::NaiveDate, until: Option<chrono::NaiveDate>) -> String {
    let day = |d: Option<chrono::NaiveDate>| d.map(|d| d.format("%Y-%m-%d").to_string());
    let mut w = match day(since.pred_opt()) {
        Some(d) => format!("date >= '{d}'"),
        None => "TRUE".to_string(),
    };
    if let Some(u) = day(until.and_then(|u| u.succ_opt())) {
        w.push_str(&format!(" AND date <= '{u}'"));
    }
    w
}

/// How much earlier than its call an attempt may be timed: an attempt starts within its call,
/// but the two may be timed by clocks that disagree (an hour is far more than any clock that
/// keeps time, and far less than a day of spans).
pub const ATTEMPT_CLOCK_SLACK: chrono::TimeDelta = chrono::TimeDelta::hours(1);

/// The condition on attempt spans that keeps every attempt of calls that started at or after
/// `start`: their days ([`attempts_of_days`]) and their time, [`ATTEMPT_CLOCK_SLACK`] before
/// it. The time bound lets the reader skip the pages of older spans (files are ordered by
/// start time), where the day alone reads the whole day.
pub fn attempts_of_calls_from(start: chrono::DateTime<chrono::Utc>) -> String {
    let from = start - ATTEMPT_CLOCK_SLACK;
    format!(
        "{} AND start_time >= '{}'",
        attempts_of_days(from.date_naive(), None),
        from.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
    )
}

/// The condition on attempt spans that keeps every attempt of `tool`'s calls (an attempt is of
/// its call's tool), of calls started from `since` ([`attempts_of_calls_from`]) up to day
/// `until` when given.
pub fn attempts_of_tool(
    tool: &str,
    since: Option<chrono::DateTime<chrono::Utc>>,
    until: Option<chrono::NaiveDate>,
) -> String {
    let mut w = format!("tool = {}", crate::sql::literal(tool));
    if let Some(since) = since {
        w.push_str(&format!(" AND {}", attempts_of_calls_from(since)));
    }
    if let Some(u) = until.and_then(|u| u.succ_opt()) {
        w.push_str(&format!(" AND date <= '{}'", u.format("%Y-%m-%d")));
    }
    w
}

const CALLS_TEMPLATE: &str = r#"
WITH attempt_stats AS (
    SELECT c.trace_id,
           c.span_id,
           count(a.span_id) AS attempt_rows,
           max(a.attempt) AS max_attempt{stats_columns}
    FROM (SELECT trace_id, span_id, call_id, tool FROM spans WHERE stage = 'call'{call}) c
    JOIN (SELECT trace_id, tool, span_id, parent_span_id, call_id, attempt, leaked_internals,
                 status
          FROM spans WHERE stage = 'attempt'{attempt}) a
      ON {attempt_of_call}
    GROUP BY c.trace_id, c.span_id
){ctes}
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
       {attempts} AS attempts,
       c.status,
       c.error_type,
       c.error_code,
       c.error_class,
       c.reference,
       {recovered} AS recovered_after_retry,
       {leaked} AS leaked_internals,
       ({failed:c} AND {unmapped}) AS unmapped,
       c.input_sha256,
       c.output_bytes,
       c.tenant,
       c.date
FROM {from}
WHERE c.stage = 'call'{call_c}
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
///
/// How it is computed: one pass over every call in (run, tool, start time, span id) order
/// numbers the streaks (`streak`, the successes before the call: equal within a (run, tool)
/// for the failures of one streak and the call that ends it) and marks the call that opens
/// each (`opens_streak`: the first of its run and tool, or the first after a success), whose
/// columns the streak takes; identical retries are counted per streak and `input_sha256`,
/// then summed, over the calls of streaks only (most calls are successes after a success,
/// which open no streak and end none). The numbering is one ordered window per tool and
/// bucket of runs (by the last two characters of the run's id), not one window per run:
/// DataFusion's window operator pays per partition, and runs are many and short (about 2.5×
/// faster over 10M spans than windows partitioned by run and tool, with the same rows); the
/// buckets let the cores share one tool's calls, where a window per tool sorts and numbers
/// them on one core.
pub static RECOVERIES_SQL: LazyLock<String> = LazyLock::new(|| spelled(RECOVERIES_TEMPLATE));

const RECOVERIES_TEMPLATE: &str = r#"
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
           {failed:k} AS failed
    FROM calls k
    LEFT JOIN conversations v ON v.trace_id = k.trace_id
),
ordered AS (
    SELECT r.*,
           coalesce(sum(CASE WHEN r.failed THEN 0 ELSE 1 END) OVER before_this, 0) AS streak,
           coalesce(lag(r.run_id) OVER in_order <> r.run_id
                    OR NOT lag(r.failed) OVER in_order, true) AS opens_streak,
           max(CASE WHEN r.failed THEN NULL ELSE r.start_time END) OVER (PARTITION BY r.run_id)
               AS last_success
    -- runs in buckets by their id's last two characters: the window's partitions, which
    -- the cores share; every call of a run is in one bucket
    FROM (SELECT *, ascii(right(run_id, 1)) * 256 + ascii(right(run_id, 2)) AS run_bucket
          FROM runs) r
    WINDOW in_order AS (PARTITION BY r.tool, r.run_bucket
                        ORDER BY r.run_id, r.start_time, r.span_id),
           before_this AS (PARTITION BY r.tool, r.run_bucket
                           ORDER BY r.run_id, r.start_time, r.span_id
                           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
),
by_arguments AS (
    SELECT run_id,
           tool,
           streak,
           input_sha256 IS NOT NULL AND count(*) > 1 AS repeated,
           count(*) AS calls,
           max(CASE WHEN opens_streak THEN trace_id END) AS trace_id,
           max(CASE WHEN opens_streak THEN span_id END) AS span_id,
           max(CASE WHEN opens_streak THEN call_id END) AS call_id,
           max(CASE WHEN opens_streak THEN service END) AS service,
           max(CASE WHEN opens_streak THEN service_version END) AS service_version,
           max(CASE WHEN opens_streak THEN agent END) AS agent,
           max(CASE WHEN opens_streak THEN error_type END) AS error_type,
           max(CASE WHEN opens_streak THEN error_code END) AS error_code,
           bool_or(CASE WHEN opens_streak THEN unmapped END) AS unmapped,
           max(CASE WHEN opens_streak THEN tenant END) AS tenant,
           max(CASE WHEN opens_streak THEN date END) AS date,
           min(start_time) AS failed_at,
           min(end_time) AS first_failure_end,
           sum(CASE WHEN failed THEN 1 ELSE 0 END) AS failures,
           max(CASE WHEN failed THEN 0 ELSE 1 END) AS recovered_calls,
           max(CASE WHEN failed THEN NULL ELSE end_time END) AS recovered_at,
           max(CASE WHEN failed THEN NULL ELSE span_id END) AS recovered_by_span_id,
           bool_or(failed AND leaked_internals) AS leaked_internals,
           max(last_success) AS last_success
    FROM ordered
    -- only the calls of streaks: the failures, and the success right after a failure of the
    -- run (it ends the streak); any other success makes a group without failures, which
    -- `grouped` drops
    WHERE failed OR NOT opens_streak
    GROUP BY run_id, tool, streak, input_sha256
),
grouped AS (
    SELECT run_id,
           tool,
           streak,
           max(trace_id) AS trace_id,
           max(span_id) AS span_id,
           max(call_id) AS call_id,
           max(service) AS service,
           max(service_version) AS service_version,
           max(agent) AS agent,
           max(error_type) AS error_type,
           max(error_code) AS error_code,
           bool_or(unmapped) AS unmapped,
           max(tenant) AS tenant,
           max(date) AS date,
           min(failed_at) AS failed_at,
           min(first_failure_end) AS first_failure_end,
           sum(failures) AS failures,
           max(recovered_calls) AS recovered_calls,
           max(recovered_at) AS recovered_at,
           max(recovered_by_span_id) AS recovered_by_span_id,
           sum(CASE WHEN repeated THEN calls - 1 ELSE 0 END) AS identical_retries,
           bool_or(leaked_internals) AS leaked_internals,
           max(last_success) AS last_success
    FROM by_arguments
    GROUP BY run_id, tool, streak
    HAVING sum(failures) > 0
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
pub const ROLLUP_TABLE: &str = toolspan_schema::rollup::TABLE_NAME;

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
pub static FAILURE_RATES_SQL: LazyLock<String> = LazyLock::new(|| spelled(FAILURE_RATES_TEMPLATE));

const FAILURE_RATES_TEMPLATE: &str = r#"
CREATE VIEW failure_rates AS
WITH grouped AS (
    SELECT date_trunc('minute', start_time) AS minute,
           tool,
           stage,
           CASE WHEN {failed} THEN error_type END AS error_type,
           sum(sample_weight) AS weight,
           sum(CASE WHEN {failed} THEN sample_weight ELSE 0.0 END) AS failed_weight
    FROM spans
    WHERE stage IN ({tool_stages})
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
        FAILURE_RATES_SQL.as_str()
    };
    let failure_rates = format!("{head}{FAILURE_RATES_TAIL}");
    for sql in [
        CALLS_SQL.as_str(),
        RECOVERIES_SQL.as_str(),
        failure_rates.as_str(),
        ANSWER_SHAPES_SQL.as_str(),
    ] {
        ctx.sql(sql).await?.collect().await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The views spell a failed span and the tool stages as the vocabulary does: no status
    /// value or stage list typed into a view's text, and no placeholder left in a view.
    #[test]
    fn views_use_the_vocabularys_spellings() {
        for template in [
            CALLS_TEMPLATE,
            RECOVERIES_TEMPLATE,
            FAILURE_RATES_TEMPLATE,
            answer_shapes::ANSWER_SHAPES_TEMPLATE,
        ] {
            assert!(!template.contains("'error'"), "{template}");
            assert!(!template.contains("'prepare'"), "{template}");
        }
        for sql in [
            CALLS_SQL.as_str(),
            RECOVERIES_SQL.as_str(),
            FAILURE_RATES_SQL.as_str(),
            ANSWER_SHAPES_SQL.as_str(),
        ] {
            for token in [
                "{failed",
                "{tool_stages}",
                "{call",
                "{attempt}",
                "{unmapped}",
            ] {
                assert!(!sql.contains(token), "{token} left in {sql}");
            }
        }
        assert!(CALLS_SQL.contains("(c.status = 'error')"));
        assert!(FAILURE_RATES_SQL
            .contains("stage IN ('call', 'attempt', 'prepare', 'send', 'execute', 'parse')"));
    }
}
