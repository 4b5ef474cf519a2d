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
