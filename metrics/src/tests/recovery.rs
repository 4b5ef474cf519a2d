//! Failure streaks across turns: recovery and hammering by version.

use super::*;

/// The failed call just added gets `args` as its arguments.
fn with_args(run: &mut Run, args: &str) {
    let call = run.spans.last_mut().expect("a call span");
    call.attributes.push(kv("gen_ai.tool.call.arguments", args));
}

#[test]
fn failure_streaks_count_recovery_across_turns_and_hammering_by_version() {
    let m = ToolMetrics::new(MetricsConfig {
        recovery_window: std::time::Duration::from_millis(50),
        ..MetricsConfig::default()
    });
    // Fails, then the model calls again with other arguments and it works: recovered in 2.
    let mut a = Run::new(11);
    a.call("search", &[SEND_NO_CODE], false);
    with_args(&mut a, r#"{"q":"x"}"#);
    a.call("search", &[None], false);
    with_args(&mut a, r#"{"q":"y"}"#);
    // The same failing arguments three times and no success: hammering, unrecovered.
    let mut b = Run::new(12);
    for _ in 0..3 {
        b.call("fetch", &[PARSE_INTERNAL], true);
        with_args(&mut b, r#"{"url":"u"}"#);
    }
    feed(&m, &request("shop", Some("2.0"), a.spans));
    feed(&m, &request("shop", Some("3.0"), b.spans));
    let labels = |tool: &'static str, version: &'static str| {
        vec![
            ("tool", tool),
            ("service", "shop"),
            ("service_version", version),
        ]
    };
    let streaks = |s: &HashMap<String, f64>, tool, version, outcome| {
        let mut l = labels(tool, version);
        l.push(("outcome", outcome));
        get(s, "toolspan_failure_streaks_total", &l)
    };
    let s = samples(&m);
    assert_eq!(streaks(&s, "search", "2.0", "recovered"), 1.0);
    assert_eq!(streaks(&s, "search", "2.0", "unrecovered"), 0.0);
    let mut bucket = labels("search", "2.0");
    bucket.push(("le", "2"));
    assert_eq!(get(&s, "toolspan_calls_to_recovery_bucket", &bucket), 1.0);
    assert_eq!(
        get(
            &s,
            "toolspan_calls_to_recovery_sum",
            &labels("search", "2.0")
        ),
        2.0
    );
    assert_eq!(
        streaks(&s, "fetch", "3.0", "unrecovered"),
        0.0,
        "still within its window"
    );
    std::thread::sleep(std::time::Duration::from_millis(80));
    let s = samples(&m);
    assert_eq!(streaks(&s, "fetch", "3.0", "unrecovered"), 1.0);
    assert_eq!(
        get(
            &s,
            "toolspan_hammering_streaks_total",
            &labels("fetch", "3.0")
        ),
        1.0
    );
    assert_eq!(
        get(
            &s,
            "toolspan_hammering_streaks_total",
            &labels("search", "2.0")
        ),
        0.0
    );
}
