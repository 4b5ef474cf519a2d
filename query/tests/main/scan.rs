//! The spans scan (query/src/scan.rs) and the partition-key aggregation (query/src/optimize.rs)
//! against plain answers: every count under time filters at file boundaries, and grouped
//! results with and without the split, on a table of several commits (several files per
//! partition, spread over time).

use toolspan_gen::{Fleet, FleetConfig};
use toolspan_query::Engine;

use crate::common::{engine_over, json_rows, request, retried_call, rows, scalar, STACK_TRACE};

const START_NS: u64 = 1_764_000_000_000_000_000;
const COMMITS: u64 = 6;
const COMMIT_SPAN_NS: u64 = 600_000_000_000;

/// Six commits of fleet traffic, ten minutes apart, each spread over its ten minutes.
async fn engine() -> (tempfile::TempDir, Engine) {
    let mut fleet = Fleet::new(FleetConfig {
        seed: 11,
        payloads: false,
        failure_scale: 3.0,
    });
    let reqs: Vec<_> = (0..COMMITS)
        .map(|i| fleet.request(30, START_NS + i * COMMIT_SPAN_NS, COMMIT_SPAN_NS))
        .collect();
    engine_over(&reqs).await
}

fn ts(us: i64) -> String {
    chrono::DateTime::from_timestamp_micros(us)
        .expect("time in range")
        .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// The text of `EXPLAIN {sql}` (`sql` may start with `ANALYZE`).
async fn explain(engine: &Engine, sql: &str) -> String {
    let plan = engine
        .context()
        .sql(&format!("EXPLAIN {sql}"))
        .await
        .expect("explain")
        .collect()
        .await
        .expect("plan");
    arrow::util::pretty::pretty_format_batches(&plan)
        .expect("format")
        .to_string()
}

/// The rows of `sql` as JSON objects.
async fn column_i64(engine: &Engine, sql: &str) -> Vec<i64> {
    rows(engine, sql)
        .await
        .iter()
        .map(|r| {
            r.as_object()
                .and_then(|o| o.values().next())
                .and_then(|v| v.as_i64())
                .expect("integer")
        })
        .collect()
}

#[tokio::test]
async fn time_filters_count_exactly_at_file_boundaries() {
    let (_dir, engine) = engine().await;
    let mut times = column_i64(
        &engine,
        "SELECT arrow_cast(start_time, 'Int64') AS us FROM spans",
    )
    .await;
    times.sort_unstable();
    let (first, last) = (times[0], times[times.len() - 1]);
    // Before everything, on the first and last rows, inside a commit, between commits, after.
    let middle = times[times.len() / 2];
    let between = ((START_NS + 3 * COMMIT_SPAN_NS) / 1_000) as i64;
    for at in [first - 1, first, first + 1, middle, between, last, last + 1] {
        let want_ge = times.iter().filter(|&&t| t >= at).count();
        let want_lt = times.len() - want_ge;
        let ge = scalar(
            &engine,
            &format!(
                "SELECT count(*) FROM spans WHERE start_time >= '{}'",
                ts(at)
            ),
        )
        .await;
        let lt = scalar(
            &engine,
            &format!("SELECT count(*) FROM spans WHERE start_time < '{}'", ts(at)),
        )
        .await;
        assert_eq!(
            (ge, lt),
            (want_ge.to_string(), want_lt.to_string()),
            "boundary {}",
            ts(at)
        );
        // Combined with a partition filter and a row filter.
        let want: i64 = column_i64(
            &engine,
            &format!(
                "SELECT count(*) AS n FROM (SELECT start_time FROM spans WHERE tool = 'search_docs' AND status = 'error') t \
                 WHERE arrow_cast(start_time, 'Int64') >= {at}"
            ),
        )
        .await[0];
        let got = scalar(
            &engine,
            &format!(
                "SELECT count(*) FROM spans WHERE tool = 'search_docs' AND status = 'error' AND start_time >= '{}'",
                ts(at)
            ),
        )
        .await;
        assert_eq!(
            got,
            want.to_string(),
            "boundary {} with tool and status",
            ts(at)
        );
    }
    // A limit under a filter returns only matching rows.
    let rows = column_i64(
        &engine,
        &format!("SELECT arrow_cast(start_time, 'Int64') AS us FROM spans WHERE start_time >= '{}' LIMIT 7", ts(middle)),
    )
    .await;
    assert_eq!(rows.len(), 7);
    assert!(rows.iter().all(|&t| t >= middle), "{rows:?}");
    // A filter with a subquery (left to DataFusion above the scan) still applies.
    let n = scalar(
        &engine,
        "SELECT count(*) FROM spans WHERE trace_id IN (SELECT trace_id FROM spans WHERE status = 'error' AND stage = 'call')",
    )
    .await;
    let want = scalar(
        &engine,
        "SELECT count(*) FROM spans s JOIN (SELECT DISTINCT trace_id FROM spans WHERE status = 'error' AND stage = 'call') e \
         ON s.trace_id = e.trace_id",
    )
    .await;
    assert_eq!(n, want);
    assert_ne!(n, "0");
}

#[tokio::test]
async fn grouping_on_partition_columns_matches_plain_grouping() {
    let (_dir, engine) = engine().await;
    let files = scalar(&engine, "SELECT count(*) FROM spans").await;
    assert_ne!(files, "0");
    // Each pair: grouped on the partition columns themselves (split by partition values)
    // and on expressions of them (DataFusion's plain hash aggregation). Same rows expected.
    let cases = [
        (
            "SELECT tool, stage, count(*) AS n, sum(CASE WHEN status = 'error' THEN 1 ELSE 0 END) AS failed, \
             round(avg(duration_ms), 6) AS d, max(error_code) AS code FROM spans GROUP BY tool, stage ORDER BY tool, stage",
            "SELECT concat(tool, '') AS tool, concat(stage, '') AS stage, count(*) AS n, \
             sum(CASE WHEN status = 'error' THEN 1 ELSE 0 END) AS failed, round(avg(duration_ms), 6) AS d, \
             max(error_code) AS code FROM spans GROUP BY concat(tool, ''), concat(stage, '') ORDER BY tool, stage",
        ),
        (
            "SELECT tool, error_code, count(*) AS n FROM spans WHERE status = 'error' \
             GROUP BY tool, error_code ORDER BY tool, error_code",
            "SELECT concat(tool, '') AS tool, error_code, count(*) AS n FROM spans WHERE status = 'error' \
             GROUP BY concat(tool, ''), error_code ORDER BY tool, error_code",
        ),
        (
            "SELECT stage, date, count(DISTINCT trace_id) AS traces FROM spans WHERE start_time >= '2025-11-24T16:25:00Z' \
             GROUP BY stage, date ORDER BY stage, date",
            "SELECT concat(stage, '') AS stage, date, count(DISTINCT trace_id) AS traces FROM spans \
             WHERE start_time >= '2025-11-24T16:25:00Z' GROUP BY concat(stage, ''), date ORDER BY stage, date",
        ),
        // Files where no row passes the filter: no group may appear for them.
        (
            "SELECT tool, stage, count(*) AS n FROM spans WHERE error_type = 'PARSE' GROUP BY tool, stage ORDER BY tool, stage",
            "SELECT concat(tool, '') AS tool, concat(stage, '') AS stage, count(*) AS n FROM spans \
             WHERE error_type = 'PARSE' GROUP BY concat(tool, ''), concat(stage, '') ORDER BY tool, stage",
        ),
        (
            "SELECT DISTINCT stage FROM spans WHERE status = 'error' ORDER BY stage",
            "SELECT DISTINCT concat(stage, '') AS stage FROM spans WHERE status = 'error' ORDER BY stage",
        ),
    ];
    for (split, plain) in cases {
        let a = json_rows(
            &engine
                .sql(split)
                .await
                .unwrap_or_else(|e| panic!("{split}: {}", e.envelope())),
        );
        let b = json_rows(
            &engine
                .sql(plain)
                .await
                .unwrap_or_else(|e| panic!("{plain}: {}", e.envelope())),
        );
        assert!(!a.is_empty(), "{split}");
        assert_eq!(a, b, "{split}");
    }
    // The first query really is split: partial aggregations without group columns.
    let text = explain(&engine, cases[0].0).await;
    assert!(
        text.contains("AggregateExec: mode=Partial, gby=[]"),
        "{text}"
    );
}

#[tokio::test]
async fn string_filters_select_what_the_same_test_selects_as_an_expression() {
    let (_dir, engine) = engine().await;
    // A filter runs inside the scan on the strings as read (Utf8View); the same test as a
    // value of the select list runs on the table's Utf8 strings. Both must agree, row for row.
    let predicates = [
        "status = 'error'",
        "status <> 'ok' AND error_code IS NOT NULL",
        "error_type IN ('PARSE', 'NETWORK')",
        "error_message LIKE '%time%'",
        "error_message ILIKE '%TIME%'",
        "error_code ~ '^[a-z]+_'",
        "lower(error_type) = 'tool_error'",
        "concat(status, '/', error_type) = 'error/PARSE'",
        "substr(trace_id, 1, 1) = 'a'",
        "trace_id > 'c' AND trace_id < 'd'",
        "length(span_id) = 16 AND status = 'unset'",
        "coalesce(error_code, 'none') = 'none'",
        "error_code IS NOT NULL",
        "error_code IS NULL AND stage = 'parse'",
        "tool = 'search_docs' AND starts_with(error_code, 'invalid')",
    ];
    for p in predicates {
        let filtered = scalar(&engine, &format!("SELECT count(*) FROM spans WHERE {p}")).await;
        let computed = scalar(
            &engine,
            &format!("SELECT sum(CASE WHEN {p} THEN 1 ELSE 0 END) FROM spans"),
        )
        .await;
        assert_eq!(filtered, computed, "{p}");
        assert_ne!(filtered, "0", "{p} selects rows in the test table");
    }
    // Filtered rows come back with the table's types and values.
    let rows = json_rows(
        &engine
            .sql(
                "SELECT arrow_typeof(error_code) AS t, error_code, status FROM spans \
                 WHERE status = 'error' AND error_code IS NOT NULL LIMIT 3",
            )
            .await
            .expect("typed rows"),
    );
    assert_eq!(rows.len(), 3);
    for row in rows {
        assert_eq!(row["t"], "Utf8", "{row}");
        assert_eq!(row["status"], "error", "{row}");
        assert!(
            row["error_code"].as_str().is_some_and(|c| !c.is_empty()),
            "{row}"
        );
    }
}

#[tokio::test]
async fn calls_filtered_on_recovery_match_an_independent_count() {
    let (_dir, engine) = engine().await;
    // A filter on `recovered_after_retry` lets DataFusion turn the view's outer join into a
    // semi join over calls with failed attempts; the rows must be the same as spelled out.
    let filtered = scalar(
        &engine,
        "SELECT count(*) FROM calls WHERE recovered_after_retry",
    )
    .await;
    let spelled = scalar(
        &engine,
        "SELECT count(*) FROM spans c WHERE c.stage = 'call' AND c.status <> 'error' AND EXISTS \
         (SELECT 1 FROM spans a WHERE a.stage = 'attempt' AND a.status = 'error' AND a.trace_id = c.trace_id \
          AND (a.parent_span_id = c.span_id OR (a.call_id IS NOT NULL AND a.call_id = c.call_id)))",
    )
    .await;
    assert_eq!(filtered, spelled);
    assert_ne!(
        filtered, "0",
        "the fleet's traffic has calls that recovered"
    );
    let computed = scalar(
        &engine,
        "SELECT sum(CASE WHEN recovered_after_retry THEN 1 ELSE 0 END) FROM calls",
    )
    .await;
    assert_eq!(filtered, computed);
    // Never NULL: a call without attempts did not recover.
    let unknown = scalar(
        &engine,
        "SELECT count(*) FROM calls WHERE recovered_after_retry IS NULL",
    )
    .await;
    assert_eq!(unknown, "0");
    let calls = scalar(&engine, "SELECT count(*) FROM spans WHERE stage = 'call'").await;
    let all = scalar(&engine, "SELECT count(*) FROM calls").await;
    assert_eq!(all, calls);
    // A filter that keeps calls without failed attempts (an OR) keeps the outer join, and
    // every row it returns satisfies it. (With the flag written as a test of the failed
    // calls' join key, DataFusion 55 replaced that key by the call's own, pushed the filter
    // below the join and returned calls that neither recovered nor exhausted their retries.)
    let either = "recovered_after_retry OR error_type = 'RETRY_EXHAUSTED'";
    for limit in ["LIMIT 40", ""] {
        let rows = json_rows(
            &engine
                .sql(&format!("SELECT recovered_after_retry, error_type, attempts FROM calls WHERE {either} {limit}"))
                .await
                .expect("rows"),
        );
        assert!(!rows.is_empty());
        for row in &rows {
            assert!(
                row["recovered_after_retry"] == true || row["error_type"] == "RETRY_EXHAUSTED",
                "{limit}: {row}"
            );
        }
    }
    assert_eq!(
        scalar(
            &engine,
            &format!("SELECT count(*) FROM calls WHERE {either}")
        )
        .await,
        scalar(
            &engine,
            &format!("SELECT sum(CASE WHEN {either} THEN 1 ELSE 0 END) FROM calls")
        )
        .await
    );
}

#[tokio::test]
async fn the_calls_query_in_one_join_has_the_views_rows() {
    use toolspan_query::views::{attempts_of_tool, calls_query_one_join};
    let (_dir, engine) = engine().await;
    let order = "ORDER BY trace_id, span_id";
    let view = rows(&engine, &format!("SELECT * FROM calls {order}")).await;
    let one = rows(
        &engine,
        &format!(
            "SELECT * FROM ({}) c {order}",
            calls_query_one_join(&|_| None, None)
        ),
    )
    .await;
    assert_eq!(view.len(), one.len());
    assert!(view == one, "every column of every call is the view's");
    // The traffic has what the one join counts: retried calls, recovered ones and others.
    let count = |key: &str| view.iter().filter(|r| r[key] == true).count();
    assert!(count("recovered_after_retry") > 0);
    assert!(view.iter().any(|r| r["attempts"].as_i64() > Some(1)));
    assert!(count("recovered_after_retry") < view.len());
    // One tool's calls with that tool's attempts, as the tool page asks.
    let tool = "search_docs";
    let view_tool = rows(
        &engine,
        &format!("SELECT * FROM calls WHERE tool = '{tool}' {order}"),
    )
    .await;
    let one_tool = rows(
        &engine,
        &format!(
            "SELECT * FROM ({}) c {order}",
            calls_query_one_join(
                &|p| Some(format!("{p}tool = '{tool}'")),
                Some(&attempts_of_tool(tool, None, None))
            )
        ),
    )
    .await;
    assert!(!view_tool.is_empty());
    assert!(view_tool == one_tool, "{tool}'s calls are the view's");
}

#[tokio::test]
async fn the_call_totals_are_the_sums_over_the_views_rows() {
    use toolspan_query::views::{attempts_of_tool, call_totals_query};
    // Fleet traffic with the tools' results, so that calls leak internals too.
    let mut fleet = Fleet::new(FleetConfig {
        seed: 12,
        payloads: true,
        failure_scale: 3.0,
    });
    let mut reqs: Vec<_> = (0..COMMITS)
        .map(|i| fleet.request(30, START_NS + i * COMMIT_SPAN_NS, COMMIT_SPAN_NS))
        .collect();
    // Its attempts never leak where their call does not, and its calls arrive with their
    // attempts (which number the call): a call whose attempt leaked, and a retried call
    // whose attempts arrive in a later request, the call with no attempt number.
    reqs.push(request(vec![retried_call(0x5c, "call_leak", STACK_TRACE)]));
    let later = retried_call(
        0x5d,
        "call_later",
        r#"{"error": {"code": "upstream_failed"}}"#,
    );
    let (call, attempts) = later.split_after(1);
    reqs.push(request(vec![call]));
    reqs.push(request(vec![attempts]));
    let (_dir, engine) = engine_over(&reqs).await;
    let sums = |scope: &str| {
        format!(
            "SELECT count(*) AS calls, \
             coalesce(sum(CASE WHEN status = 'error' THEN 1 ELSE 0 END), 0) AS failed, \
             coalesce(sum(CASE WHEN attempts > 1 THEN 1 ELSE 0 END), 0) AS retried, \
             coalesce(sum(CASE WHEN recovered_after_retry THEN 1 ELSE 0 END), 0) AS recovered, \
             coalesce(sum(CASE WHEN error_type = 'RETRY_EXHAUSTED' THEN 1 ELSE 0 END), 0) \
                 AS exhausted, \
             coalesce(sum(CASE WHEN leaked_internals THEN 1 ELSE 0 END), 0) AS leaked \
             FROM calls WHERE {scope}"
        )
    };
    // Every call.
    let view = rows(&engine, &sums("TRUE")).await;
    let totals = rows(&engine, &call_totals_query(&|_| None, None)).await;
    assert_eq!(totals, view);
    // The traffic has what attempts change: calls retried with no attempt number of their
    // own, recovered ones and calls whose attempt leaked while their own span did not.
    let t = &view[0];
    for key in ["retried", "recovered", "leaked", "exhausted"] {
        assert!(t[key].as_i64() > Some(0), "{key}: {t}");
    }
    assert!(t["recovered"].as_i64() < t["calls"].as_i64());
    let changed = rows(
        &engine,
        "SELECT coalesce(sum(CASE WHEN k.attempts > 1 AND coalesce(c.attempt, 1) <= 1 \
         THEN 1 ELSE 0 END), 0) AS retried_by_attempts, \
         coalesce(sum(CASE WHEN k.leaked_internals AND NOT c.leaked_internals \
         THEN 1 ELSE 0 END), 0) AS leaked_by_attempts \
         FROM calls k JOIN spans c ON c.trace_id = k.trace_id AND c.span_id = k.span_id",
    )
    .await;
    for key in ["retried_by_attempts", "leaked_by_attempts"] {
        assert!(changed[0][key].as_i64() > Some(0), "{key}: {}", changed[0]);
    }
    // One tool's calls with that tool's attempts, as the tool page asks; and a tool with no
    // calls at all.
    for tool in ["search_docs", "get_invoice", "no_such_tool"] {
        let view = rows(&engine, &sums(&format!("tool = '{tool}'"))).await;
        let totals = rows(
            &engine,
            &call_totals_query(
                &|p| Some(format!("{p}tool = '{tool}'")),
                Some(&attempts_of_tool(tool, None, None)),
            ),
        )
        .await;
        assert_eq!(totals, view, "{tool}");
    }
}

#[tokio::test]
async fn counting_recovered_calls_reads_only_failed_attempts() {
    let (_dir, engine) = engine().await;
    let plan = |sql: &'static str| explain(&engine, sql);
    let attempt_scans = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.contains("DataSourceExec") && l.contains("stage=attempt"))
            .map(|l| {
                l.split(" predicate=")
                    .nth(1)
                    .unwrap_or("")
                    .split(", pruning_predicate")
                    .next()
                    .unwrap_or("")
                    .to_string()
            })
            .collect()
    };
    // The attempt counts and leak flags (a join of every attempt) are not read: only the
    // failed attempts are scanned, once.
    let recovered = plan("SELECT count(*) FROM calls WHERE recovered_after_retry").await;
    let scans = attempt_scans(&recovered);
    assert_eq!(scans.len(), 1, "{recovered}");
    assert!(
        scans[0].contains("status@") && scans[0].contains("= error"),
        "{recovered}"
    );
    // Its hash tables hold the small sides: the failed attempts, then the calls they belong
    // to, never all calls (DataFusion's own estimates, without distinct counts, took a semi
    // join's whole preserved side and built on the calls).
    let analyzed = plan("ANALYZE SELECT count(*) FROM calls WHERE recovered_after_retry").await;
    let builds: Vec<f64> = analyzed
        .split("build_input_rows=")
        .skip(1)
        .map(|rest| {
            let figure: String = rest.chars().take_while(|c| *c != ',').collect();
            let (number, unit) = figure.split_once(' ').unwrap_or((figure.as_str(), ""));
            let scale = match unit {
                "K" => 1e3,
                "M" => 1e6,
                _ => 1.0,
            };
            number.parse::<f64>().expect("row figure") * scale
        })
        .collect();
    let failed: f64 = scalar(
        &engine,
        "SELECT count(*) FROM spans WHERE stage = 'attempt' AND status = 'error'",
    )
    .await
    .parse()
    .expect("count");
    let failed_calls: f64 = scalar(
        &engine,
        "SELECT count(*) FROM spans c WHERE c.stage = 'call' AND EXISTS \
         (SELECT 1 FROM spans a WHERE a.stage = 'attempt' AND a.status = 'error' AND a.trace_id = c.trace_id \
          AND (a.parent_span_id = c.span_id OR (a.call_id IS NOT NULL AND a.call_id = c.call_id)))",
    )
    .await
    .parse()
    .expect("count");
    let mut builds = builds;
    builds.sort_by(f64::total_cmp);
    assert_eq!(builds, vec![failed_calls, failed], "{analyzed}");
    // A query that reads the attempt counts joins every attempt.
    let attempts = plan("SELECT sum(attempts) FROM calls").await;
    let scans = attempt_scans(&attempts);
    assert_eq!(scans, vec![String::new()], "{attempts}");
}

#[tokio::test]
async fn files_without_a_value_are_not_read_for_a_not_null_test() {
    let (_dir, engine) = engine().await;
    let files_opened = |sql: String| {
        let engine = &engine;
        async move {
            let text = explain(engine, &format!("ANALYZE {sql}")).await;
            text.split("files_opened=")
                .skip(1)
                .map(|rest| {
                    rest.split(|c: char| !c.is_ascii_digit())
                        .next()
                        .unwrap_or("0")
                        .parse::<u64>()
                        .unwrap_or(0)
                })
                .sum::<u64>()
        }
    };
    // Agent and LLM spans never carry an error code; the log's null counts show it, so a
    // search for error codes opens no more files than one that excludes those stages by name.
    let agent_llm = scalar(
        &engine,
        "SELECT count(*) FROM spans WHERE stage IN ('agent', 'llm')",
    )
    .await;
    assert_ne!(agent_llm, "0", "the test table has agent and llm spans");
    let q = "SELECT count(*) FROM spans WHERE error_code IS NOT NULL";
    let by_counts = files_opened(q.to_string()).await;
    let by_name = files_opened(format!("{q} AND stage NOT IN ('agent', 'llm')")).await;
    assert!(by_counts > 0);
    assert_eq!(by_counts, by_name);
    assert_eq!(
        scalar(&engine, q).await,
        scalar(
            &engine,
            "SELECT sum(CASE WHEN error_code IS NOT NULL THEN 1 ELSE 0 END) FROM spans"
        )
        .await
    );
}

#[tokio::test]
async fn null_tests_the_log_shows_selective_run_first() {
    let (_dir, engine) = engine().await;
    let scan_predicate = |sql: &'static str| {
        let engine = &engine;
        async move {
            let text = explain(engine, sql).await;
            // The scan's filter, where more than one remains (files whose statistics decide
            // one of the tests are read with the others only).
            text.split(" predicate=")
                .skip(1)
                .map(|p| {
                    p.split(", pruning_predicate")
                        .next()
                        .unwrap_or_default()
                        .to_string()
                })
                .max_by_key(|p| p.matches(" AND ").count())
                .unwrap_or_else(|| panic!("no scan predicate: {text}"))
        }
    };
    // Most spans have no error code: that test first, `status` decoded only for the rest.
    let p = scan_predicate(
        "SELECT count(*) FROM spans WHERE status = 'error' AND error_code IS NOT NULL",
    )
    .await;
    let (code, status) = (p.find("error_code@"), p.find("status@"));
    assert!(code.is_some() && status.is_some() && code < status, "{p}");
    // Most spans name their agent: that test selects little away and keeps its place where
    // it is evaluated (files whose null counts show no missing agent are read without it).
    assert_eq!(
        scalar(&engine, "SELECT count(agent) * 2 > count(*) FROM spans").await,
        "true"
    );
    let p =
        scan_predicate("SELECT count(*) FROM spans WHERE status = 'error' AND agent IS NOT NULL")
            .await;
    let (status, agent) = (p.find("status@"), p.find("agent@"));
    assert!(
        status.is_some() && (agent.is_none() || status < agent),
        "{p}"
    );
    assert_eq!(
        scalar(&engine, "SELECT count(*) FROM spans WHERE status = 'error' AND agent IS NOT NULL").await,
        scalar(&engine, "SELECT sum(CASE WHEN status = 'error' AND agent IS NOT NULL THEN 1 ELSE 0 END) FROM spans").await
    );
}
