//! Tool calls whose span status is OK but whose result says they failed are failures here too.

use super::*;

#[test]
fn a_call_whose_result_says_it_failed_counts_as_a_failure() {
    let m = ToolMetrics::new(MetricsConfig::default());
    let mut run = Run::new(7);
    for (tool, result) in [
        (
            "search",
            r#"{"content": [{"type": "text", "text": "Connection refused"}], "isError": true}"#,
        ),
        ("search", r#"{"results": [{"title": "error codes"}]}"#),
        ("search", r#"{"hits": [], "error": null}"#),
    ] {
        let id = run.id();
        let call_id = format!("call_{}", run.next);
        let attrs = vec![
            kv("gen_ai.operation.name", "execute_tool"),
            kv("gen_ai.tool.name", tool),
            kv("gen_ai.tool.call.id", &call_id),
            kv("gen_ai.tool.call.result", result),
        ];
        let root = run.root.clone();
        let s = run.span(root, id, &format!("execute_tool {tool}"), attrs, false);
        run.spans.push(s);
    }
    let p = feed(&m, &request("shop", Some("1.0"), run.spans));
    assert_eq!(p.stats.errors, 1);
    let s = samples(&m);
    let labels = [
        ("tool", "search"),
        ("stage", "call"),
        ("service", "shop"),
        ("service_version", "1.0"),
    ];
    assert_eq!(get(&s, "toolspan_tool_spans_total", &labels), 3.0);
    let [a, b, c, d] = labels;
    assert_eq!(
        get(
            &s,
            "toolspan_tool_failures_total",
            &[a, b, ("error_type", "NETWORK"), c, d]
        ),
        1.0,
        "the failure the result reported, with the type its text implies"
    );
    assert_eq!(
        sum(&s, "toolspan_tool_failures_total", |_| true),
        1.0,
        "the successes that mention errors are no failures"
    );
    let count = |outcome| {
        get(
            &s,
            "toolspan_call_attempts_count",
            &[("tool", "search"), ("outcome", outcome)],
        )
    };
    assert_eq!((count("ok"), count("failed")), (2.0, 1.0));
}

/// Every form of a failure recorded only in the result (the table of recognised forms in
/// `docs/classification.md`), each as the only call of a tool of its own: each is one failure
/// of that tool with the error type its content implies, and the successes that merely
/// mention errors are none.
#[test]
fn every_recognised_result_form_is_a_failure_of_its_type() {
    let m = ToolMetrics::new(MetricsConfig::default());
    let mut run = Run::new(8);
    let genai = |tool: &str, result: &str| {
        vec![
            kv("gen_ai.operation.name", "execute_tool"),
            kv("gen_ai.tool.name", tool),
            kv("gen_ai.tool.call.result", result),
        ]
    };
    // (tool, the span's attributes, the error type a failure gets, or None for a success)
    let forms: Vec<(&str, Vec<KeyValue>, Option<&str>)> = vec![
        (
            "envelope",
            genai(
                "envelope",
                r#"{"error": {"code": "invalid_status", "class": "invalid_request", "retryable": false, "message": "status must be open"}}"#,
            ),
            Some("PREPARE"),
        ),
        (
            "error_text",
            genai(
                "error_text",
                r#"{"error": "connection refused by tickets.internal:443"}"#,
            ),
            Some("NETWORK"),
        ),
        (
            "mcp_is_error",
            genai(
                "mcp_is_error",
                r#"{"content": [{"type": "text", "text": "1 validation error for search_docsArguments\nlimit\n  Input should be a valid integer [type=int_parsing, input_value='many', input_type=str]"}], "isError": true}"#,
            ),
            Some("PREPARE"),
        ),
        (
            "anthropic_is_error",
            genai(
                "anthropic_is_error",
                r#"{"type": "tool_result", "tool_use_id": "toolu_01", "content": "the upstream request timed out after 30 s", "is_error": true}"#,
            ),
            Some("TOOL_ERROR"),
        ),
        (
            "status_error",
            genai(
                "status_error",
                r#"{"status": "error", "message": "Connection refused"}"#,
            ),
            Some("NETWORK"),
        ),
        (
            "tool_result_status",
            genai(
                "tool_result_status",
                r#"{"status": "tool_error", "error": {"code": "invalid_response", "class": "internal", "message": "the tool's answer did not have the expected shape"}}"#,
            ),
            Some("PARSE"),
        ),
        (
            "genai_tool_status",
            {
                let mut a = genai("genai_tool_status", "quota exceeded for project acme");
                a.push(kv("gen_ai.tool.status", "error"));
                a
            },
            Some("TOOL_ERROR"),
        ),
        (
            "langchain_message",
            vec![
                kv("openinference.span.kind", "TOOL"),
                kv("tool.name", "langchain_message"),
                kv("input.value", r#"{"query": "install guide"}"#),
                kv(
                    "output.value",
                    r#"{"type": "tool", "data": {"content": "Expecting value: line 1 column 1 (char 0)", "type": "tool", "name": "langchain_message", "tool_call_id": "call_7", "status": "error"}}"#,
                ),
            ],
            Some("PARSE"),
        ),
        (
            "traceloop_output",
            vec![
                kv("traceloop.span.kind", "tool"),
                kv("traceloop.entity.name", "traceloop_output"),
                kv(
                    "traceloop.entity.output",
                    r#"{"error": {"code": "dns_failure", "class": "transient", "message": "docs.example.invalid could not be resolved"}}"#,
                ),
            ],
            Some("NETWORK"),
        ),
        (
            "quiet",
            genai(
                "quiet",
                r#"{"results": [{"title": "error codes", "url": "https://docs/errors"}]}"#,
            ),
            None,
        ),
        (
            "quiet",
            genai("quiet", r#"{"hits": ["Install guide"], "error": null}"#),
            None,
        ),
        (
            "quiet",
            genai(
                "quiet",
                r#"{"content": [{"type": "text", "text": "error codes: E1, E2"}], "isError": false}"#,
            ),
            None,
        ),
        (
            "quiet",
            genai(
                "quiet",
                r#"{"status": "ok", "ticket": {"status": "error_review"}}"#,
            ),
            None,
        ),
    ];
    let expected_failures = forms.iter().filter(|f| f.2.is_some()).count();
    for (tool, attrs, _) in &forms {
        let id = run.id();
        let root = run.root.clone();
        let s = run.span(
            root,
            id,
            &format!("execute_tool {tool}"),
            attrs.clone(),
            false,
        );
        run.spans.push(s);
    }
    let p = feed(&m, &request("shop", Some("1.0"), run.spans));
    assert_eq!(p.stats.errors, expected_failures as u64);
    let s = samples(&m);
    for (tool, _, error_type) in &forms {
        let Some(error_type) = error_type else {
            continue;
        };
        assert_eq!(
            get(
                &s,
                "toolspan_tool_failures_total",
                &[
                    ("tool", tool),
                    ("stage", "call"),
                    ("error_type", error_type),
                    ("service", "shop"),
                    ("service_version", "1.0"),
                ]
            ),
            1.0,
            "{tool}: one failure of type {error_type}"
        );
    }
    assert_eq!(
        sum(&s, "toolspan_tool_failures_total", |_| true),
        expected_failures as f64,
        "one failure per form and none for the results that only mention errors"
    );
    assert_eq!(
        sum(&s, "toolspan_tool_failures_total", |k| k
            .contains("tool=\"quiet\"")),
        0.0
    );
    assert_eq!(
        get(
            &s,
            "toolspan_tool_spans_total",
            &[
                ("tool", "quiet"),
                ("stage", "call"),
                ("service", "shop"),
                ("service_version", "1.0"),
            ]
        ),
        4.0
    );
}
