//! `spans`, `calls` and `failure_rates` over the retry fixture.

use serde_json::json;

use crate::common::{engine_with_retries, json_rows, scalar};

#[tokio::test]
async fn spans_filter_by_tool_and_error_type() {
    let (_dir, _table, engine) = engine_with_retries().await;
    // The failing send stage and the attempt it failed both carry NETWORK.
    let n = scalar(
        &engine,
        "SELECT count(*) FROM spans WHERE tool = 'search_docs' AND error_type = 'NETWORK'",
    )
    .await;
    assert_eq!(n, "2");
    let stages = json_rows(
        &engine
            .sql("SELECT stage, count(*) AS n FROM spans WHERE tool = 'fetch_page' GROUP BY stage ORDER BY stage")
            .await
            .expect("query"),
    );
    assert_eq!(
        stages,
        vec![
            json!({"stage": "attempt", "n": 3}),
            json!({"stage": "call", "n": 1}),
            json!({"stage": "execute", "n": 3})
        ]
    );
    // Ids are lowercase hex strings.
    let n = scalar(
        &engine,
        "SELECT count(*) FROM spans WHERE trace_id = '4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b'",
    )
    .await;
    assert_eq!(n, "15");
    // Time predicates prune by file statistics and still count exactly.
    let n = scalar(
        &engine,
        "SELECT count(*) FROM spans WHERE start_time > TIMESTAMP '2025-06-01T12:00:00.500Z'",
    )
    .await;
    assert_eq!(n, "7");
    let n = scalar(&engine, "SELECT count(*) FROM spans WHERE tool = 'fetch_page' AND start_time > TIMESTAMP '2025-06-01T12:00:00.700Z'").await;
    assert_eq!(n, "4");
}

#[tokio::test]
async fn calls_show_retries_and_exhaustion() {
    let (_dir, _table, engine) = engine_with_retries().await;
    let rows = json_rows(
        &engine
            .sql(
                "SELECT call_id, tool, agent, service, attempts, status, error_type, error_code, error_class, \
                 reference, recovered_after_retry, leaked_internals FROM calls ORDER BY call_id",
            )
            .await
            .expect("query"),
    );
    assert_eq!(
        rows,
        vec![
            json!({"call_id": "call_1", "tool": "search_docs", "agent": "planner", "service": "agent-svc",
                   "attempts": 2, "status": "ok", "error_type": null, "error_code": null, "error_class": null,
                   "reference": null, "recovered_after_retry": true, "leaked_internals": false}),
            json!({"call_id": "call_2", "tool": "fetch_page", "agent": "planner", "service": "agent-svc",
                   "attempts": 3, "status": "error", "error_type": "RETRY_EXHAUSTED", "error_code": "upstream_failed",
                   "error_class": "transient", "reference": "err_7c1f9a", "recovered_after_retry": false,
                   "leaked_internals": false}),
        ]
    );
}

#[tokio::test]
async fn calls_have_the_documented_columns() {
    let (_dir, _table, engine) = engine_with_retries().await;
    let schema = engine
        .schema_of("SELECT * FROM calls")
        .await
        .expect("schema");
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(
        names,
        [
            "trace_id",
            "span_id",
            "call_id",
            "tool",
            "service",
            "service_version",
            "agent",
            "start_time",
            "end_time",
            "duration_ms",
            "attempts",
            "status",
            "error_type",
            "error_code",
            "error_class",
            "reference",
            "recovered_after_retry",
            "leaked_internals",
            "tenant",
            "date",
        ]
    );
    let row = json_rows(
        &engine
            .sql("SELECT start_time, duration_ms, date FROM calls WHERE call_id = 'call_1'")
            .await
            .expect("query"),
    );
    assert_eq!(
        row,
        vec![
            json!({"start_time": "2025-06-01T12:00:00.010Z", "duration_ms": 500.0, "date": "2025-06-01"})
        ]
    );
}

#[tokio::test]
async fn failure_rates_per_minute_tool_stage_and_error_type() {
    let (_dir, _table, engine) = engine_with_retries().await;
    let schema = engine
        .schema_of("SELECT * FROM failure_rates")
        .await
        .expect("schema");
    let cols: Vec<String> = schema
        .fields()
        .iter()
        .map(|f| format!("{}:{}", f.name(), f.data_type()))
        .collect();
    assert_eq!(
        cols,
        [
            "minute:Timestamp(µs, \"UTC\")",
            "tool:Utf8",
            "stage:Utf8",
            "error_type:Utf8",
            "calls:Float64",
            "failures:Float64",
            "rate:Float64",
        ]
    );
    let rows = json_rows(
        &engine
            .sql(
                "SELECT minute, tool, stage, error_type, calls, failures, rate FROM failure_rates \
                 ORDER BY tool, stage, error_type",
            )
            .await
            .expect("query"),
    );
    let m = "2025-06-01T12:00:00Z";
    assert_eq!(
        rows,
        vec![
            json!({"minute": m, "tool": "fetch_page", "stage": "attempt", "error_type": "TOOL_ERROR", "calls": 3.0, "failures": 3.0, "rate": 1.0}),
            json!({"minute": m, "tool": "fetch_page", "stage": "call", "error_type": "RETRY_EXHAUSTED", "calls": 1.0, "failures": 1.0, "rate": 1.0}),
            json!({"minute": m, "tool": "fetch_page", "stage": "execute", "error_type": "TOOL_ERROR", "calls": 3.0, "failures": 3.0, "rate": 1.0}),
            json!({"minute": m, "tool": "search_docs", "stage": "attempt", "error_type": "NETWORK", "calls": 2.0, "failures": 1.0, "rate": 0.5}),
            json!({"minute": m, "tool": "search_docs", "stage": "call", "error_type": null, "calls": 1.0, "failures": 0.0, "rate": 0.0}),
            json!({"minute": m, "tool": "search_docs", "stage": "execute", "error_type": null, "calls": 1.0, "failures": 0.0, "rate": 0.0}),
            json!({"minute": m, "tool": "search_docs", "stage": "parse", "error_type": null, "calls": 1.0, "failures": 0.0, "rate": 0.0}),
            json!({"minute": m, "tool": "search_docs", "stage": "send", "error_type": "NETWORK", "calls": 2.0, "failures": 1.0, "rate": 0.5}),
        ]
    );
}
