//! `spans`, `calls` and `failure_rates` over the retry fixture; `recoveries` over agent runs
//! that recover, or not, across turns.

use serde_json::json;

use crate::common::{
    engine_over, engine_with_retries, json_rows, request, retried_call, rows, scalar, STACK_TRACE,
};

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

/// A call leaked internals to the model when one of its attempts did, though its own answer
/// did not (a framework ran it again and the second answer was clean): the view says so, as
/// does the query that counts every attempt in one join, and a call whose failed attempt
/// answered with an envelope did not leak.
#[tokio::test]
async fn a_call_leaks_when_one_of_its_attempts_did() {
    // A get_invoice call whose first attempt failed answering with a stack trace, and one
    // whose first attempt failed answering with an error envelope.
    let leaking = retried_call(0x5c, "call_leak", STACK_TRACE);
    let enveloped = retried_call(
        0x5d,
        "call_clean",
        r#"{"error": {"code": "upstream_failed", "class": "transient", "retryable": true, "reference": "err_1"}}"#,
    );
    let (_dir, engine) = engine_over(&[request(vec![leaking, enveloped])]).await;
    // The leak is on the attempt's span only.
    assert_eq!(
        rows(
            &engine,
            "SELECT stage, attempt FROM spans WHERE leaked_internals"
        )
        .await,
        vec![json!({"stage": "attempt", "attempt": 1})]
    );
    let expected = vec![
        json!({"call_id": "call_clean", "attempts": 2, "leaked_internals": false}),
        json!({"call_id": "call_leak", "attempts": 2, "leaked_internals": true}),
    ];
    let view = rows(
        &engine,
        "SELECT call_id, attempts, leaked_internals FROM calls ORDER BY call_id",
    )
    .await;
    assert_eq!(view, expected);
    // Reading the flag alone (the view's own join of the leaking attempts only).
    assert_eq!(
        rows(&engine, "SELECT call_id FROM calls WHERE leaked_internals").await,
        vec![json!({"call_id": "call_leak"})]
    );
    let one_join = rows(
        &engine,
        &format!(
            "SELECT call_id, attempts, leaked_internals FROM ({}) c ORDER BY call_id",
            toolspan_query::views::calls_query_one_join(&|_| None, None)
        ),
    )
    .await;
    assert_eq!(one_join, expected);
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
            "unmapped",
            "input_sha256",
            "output_bytes",
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

/// Agent runs in which the model recovers, or does not, across turns.
fn recovery_runs() -> opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest {
    use crate::common::{i, request, s, Trace};
    let call = |tool: &str, id: &str, args: &str| {
        vec![
            s("gen_ai.operation.name", "execute_tool"),
            s("gen_ai.tool.name", tool),
            s("gen_ai.tool.call.id", id),
            s("gen_ai.tool.call.arguments", args),
            i("toolspan.attempts", 1),
        ]
    };
    let agent = |conversation: Option<&str>| {
        let mut a = vec![
            s("gen_ai.operation.name", "invoke_agent"),
            s("gen_ai.agent.name", "planner"),
        ];
        if let Some(c) = conversation {
            a.push(s("gen_ai.conversation.id", c));
        }
        a
    };
    // Fails once, then succeeds with corrected arguments: recovered in 2 calls.
    let mut a = Trace::new(0x61);
    a.span(1, None, "agent", 0, 3_000, false, agent(None))
        .span(
            2,
            Some(1),
            "update_ticket",
            100,
            50,
            true,
            call("update_ticket", "a1", r#"{"status":"done"}"#),
        )
        .span(
            3,
            Some(1),
            "update_ticket",
            900,
            60,
            false,
            call("update_ticket", "a2", r#"{"status":"closed"}"#),
        );
    // The same failing arguments three times, then another tool works: hammering, not
    // recovered on this tool, recovered by another.
    let mut b = Trace::new(0x62);
    b.span(1, None, "agent", 0, 5_000, false, agent(None))
        .span(
            2,
            Some(1),
            "search_docs",
            100,
            10,
            true,
            call("search_docs", "b1", r#"{"q":"x"}"#),
        )
        .span(
            3,
            Some(1),
            "search_docs",
            500,
            10,
            true,
            call("search_docs", "b2", r#"{"q":"x"}"#),
        )
        .span(
            4,
            Some(1),
            "search_docs",
            900,
            10,
            true,
            call("search_docs", "b3", r#"{"q":"x"}"#),
        )
        .span(
            5,
            Some(1),
            "fetch_page",
            1_300,
            10,
            false,
            call("fetch_page", "b4", r#"{"url":"u"}"#),
        );
    // One conversation over two traces: the failure in the first is recovered in the second.
    let mut c = Trace::new(0x63);
    c.span(1, None, "agent", 0, 1_000, false, agent(Some("conv-7")))
        .span(
            2,
            Some(1),
            "run_sql",
            100,
            20,
            true,
            call("run_sql", "c1", r#"{"sql":"SELEC 1"}"#),
        );
    let mut d = Trace::new(0x64);
    d.span(
        1,
        None,
        "agent",
        60_000,
        1_000,
        false,
        agent(Some("conv-7")),
    )
    .span(
        2,
        Some(1),
        "run_sql",
        60_100,
        20,
        false,
        call("run_sql", "d1", r#"{"sql":"SELECT 1"}"#),
    );
    // A run that ends after its failure: not recovered.
    let mut e = Trace::new(0x65);
    e.span(1, None, "agent", 0, 1_000, true, agent(None)).span(
        2,
        Some(1),
        "run_sql",
        100,
        20,
        true,
        call("run_sql", "e1", r#"{"sql":"DROP"}"#),
    );
    // Two streaks of one tool in one run, another tool's failure between them: the streaks
    // end at each success, identical arguments count within a streak only, and each streak
    // is named by its first failure.
    let mut g = Trace::new(0x67);
    g.span(1, None, "agent", 0, 1_000, false, agent(None));
    for (id, start, failed, tool, call_id, args) in [
        (2, 100, true, "lookup_order", "g1", r#"{"id":1}"#),
        (3, 200, true, "fetch_page", "g2", r#"{"url":"u"}"#),
        (4, 300, true, "lookup_order", "g3", r#"{"id":1}"#),
        (5, 400, false, "lookup_order", "g4", r#"{"id":1}"#),
        (6, 500, true, "lookup_order", "g5", r#"{"id":1}"#),
        (7, 600, false, "lookup_order", "g6", r#"{"id":2}"#),
    ] {
        g.span(
            id,
            Some(1),
            tool,
            start,
            10,
            failed,
            call(tool, call_id, args),
        );
    }
    // Successes only: no row.
    let mut f = Trace::new(0x66);
    f.span(1, None, "agent", 0, 1_000, false, agent(None)).span(
        2,
        Some(1),
        "run_sql",
        100,
        20,
        false,
        call("run_sql", "f1", r#"{"sql":"SELECT 2"}"#),
    );
    request(vec![a, b, c, d, e, f, g])
}

#[tokio::test]
async fn recoveries_follow_the_model_across_turns() {
    let (_dir, engine) = engine_over(&[recovery_runs()]).await;
    let rows = rows(
        &engine,
        "SELECT call_id, tool, run_id, failures, recovered, calls_to_recovery, time_to_recovery_ms, \
         identical_retries, hammering, recovered_by_any_tool, unmapped FROM recoveries ORDER BY call_id",
    )
    .await;
    assert_eq!(
        rows,
        vec![
            json!({"call_id": "a1", "tool": "update_ticket", "run_id": "61616161616161616161616161616161",
                   "failures": 1, "recovered": true, "calls_to_recovery": 2, "time_to_recovery_ms": 810.0,
                   "identical_retries": 0, "hammering": false, "recovered_by_any_tool": true, "unmapped": true}),
            json!({"call_id": "b1", "tool": "search_docs", "run_id": "62626262626262626262626262626262",
                   "failures": 3, "recovered": false, "calls_to_recovery": null, "time_to_recovery_ms": null,
                   "identical_retries": 2, "hammering": true, "recovered_by_any_tool": true, "unmapped": true}),
            json!({"call_id": "c1", "tool": "run_sql", "run_id": "conv-7",
                   "failures": 1, "recovered": true, "calls_to_recovery": 2, "time_to_recovery_ms": 60000.0,
                   "identical_retries": 0, "hammering": false, "recovered_by_any_tool": true, "unmapped": true}),
            json!({"call_id": "e1", "tool": "run_sql", "run_id": "65656565656565656565656565656565",
                   "failures": 1, "recovered": false, "calls_to_recovery": null, "time_to_recovery_ms": null,
                   "identical_retries": 0, "hammering": false, "recovered_by_any_tool": false, "unmapped": true}),
            json!({"call_id": "g1", "tool": "lookup_order", "run_id": "67676767676767676767676767676767",
                   "failures": 2, "recovered": true, "calls_to_recovery": 3, "time_to_recovery_ms": 300.0,
                   "identical_retries": 2, "hammering": true, "recovered_by_any_tool": true, "unmapped": true}),
            json!({"call_id": "g2", "tool": "fetch_page", "run_id": "67676767676767676767676767676767",
                   "failures": 1, "recovered": false, "calls_to_recovery": null, "time_to_recovery_ms": null,
                   "identical_retries": 0, "hammering": false, "recovered_by_any_tool": true, "unmapped": true}),
            json!({"call_id": "g5", "tool": "lookup_order", "run_id": "67676767676767676767676767676767",
                   "failures": 1, "recovered": true, "calls_to_recovery": 2, "time_to_recovery_ms": 100.0,
                   "identical_retries": 0, "hammering": false, "recovered_by_any_tool": true, "unmapped": true}),
        ]
    );
}
