//! Label and series caps: tools and services past their caps, version eviction, a family
//! past its series cap.

use super::*;

#[test]
fn tools_and_services_past_their_caps_become_other() {
    let m = ToolMetrics::new(MetricsConfig {
        max_tools: 2,
        max_services: 1,
        ..MetricsConfig::default()
    });
    let mut run = Run::new(4);
    for tool in ["a", "b", "c", "d"] {
        run.call(tool, &[None], false);
    }
    feed(&m, &request("shop", Some("1"), run.spans));
    let mut run = Run::new(5);
    run.call("a", &[None], false);
    feed(&m, &request("warehouse", Some("1"), run.spans));
    let s = samples(&m);
    let calls = |tool, service| {
        get(
            &s,
            "toolspan_tool_spans_total",
            &[
                ("tool", tool),
                ("stage", "call"),
                ("service", service),
                ("service_version", "1"),
            ],
        )
    };
    assert_eq!(calls("a", "shop"), 1.0);
    assert_eq!(calls("b", "shop"), 1.0);
    assert_eq!(calls(OTHER, "shop"), 2.0, "c and d");
    assert_eq!(calls("a", OTHER), 1.0, "the second service");
    let tools: std::collections::HashSet<&str> = s
        .keys()
        .filter_map(|k| k.split("tool=\"").nth(1))
        .filter_map(|r| r.split('"').next())
        .collect();
    assert_eq!(tools, ["a", "b", OTHER].into_iter().collect());
    // 2 tools x 6 spans each, 1 service x 6 spans.
    assert_eq!(
        get(
            &s,
            "toolspan_metrics_label_overflow_total",
            &[("label", "tool")]
        ),
        12.0
    );
    assert_eq!(
        get(
            &s,
            "toolspan_metrics_label_overflow_total",
            &[("label", "service")]
        ),
        6.0
    );
}

#[test]
fn a_new_version_evicts_the_least_recently_seen_one() {
    let m = ToolMetrics::new(MetricsConfig {
        max_versions_per_service: 2,
        ..MetricsConfig::default()
    });
    let send = |m: &ToolMetrics, version: &str, trace: u64| {
        let mut run = Run::new(trace);
        run.call("fetch", &[Some(("parse", Some("bad_json")))], false);
        feed(m, &request("shop", Some(version), run.spans));
    };
    send(&m, "1.0", 10);
    send(&m, "1.1", 11);
    send(&m, "1.0", 12); // 1.1 is now the least recently seen
    send(&m, "2.0", 13);
    let s = samples(&m);
    let versions: std::collections::HashSet<&str> = s
        .keys()
        .filter(|k| {
            k.starts_with("toolspan_tool_spans_total{")
                || k.starts_with("toolspan_tool_failures_total{")
        })
        .filter_map(|k| k.split("service_version=\"").nth(1))
        .filter_map(|r| r.split('"').next())
        .collect();
    assert_eq!(
        versions,
        ["1.0", "2.0"].into_iter().collect(),
        "every series of 1.1 is gone, 2.0 has its own"
    );
    let l = [
        ("tool", "fetch"),
        ("stage", "parse"),
        ("error_type", "PARSE"),
        ("service", "shop"),
        ("service_version", "1.0"),
    ];
    assert_eq!(
        get(&s, "toolspan_tool_failures_total", &l),
        2.0,
        "the kept version keeps its counts"
    );
    assert_eq!(
        get(
            &s,
            "toolspan_metrics_label_overflow_total",
            &[("label", "service_version")]
        ),
        1.0
    );
    // Per-tool families without a version label keep counting across the eviction.
    assert_eq!(
        get(
            &s,
            "toolspan_call_attempts_count",
            &[("tool", "fetch"), ("outcome", "failed")]
        ),
        4.0
    );
}

#[test]
fn a_family_past_the_series_cap_folds_new_combinations() {
    let max = 5;
    let m = ToolMetrics::new(MetricsConfig {
        max_series: max,
        ..MetricsConfig::default()
    });
    let mut run = Run::new(6);
    for tool in ["a", "b", "c"] {
        run.call(tool, &[None], false);
    }
    let p = feed(&m, &request("shop", Some("1"), run.spans));
    let s = samples(&m);
    let spans: Vec<(&String, &f64)> = s
        .iter()
        .filter(|(k, _)| k.starts_with("toolspan_tool_spans_total{"))
        .collect();
    let folded: Vec<_> = spans
        .iter()
        .filter(|(k, _)| k.contains("tool=\"__other__\""))
        .collect();
    assert_eq!(spans.len() - folded.len(), max, "{spans:#?}");
    assert!(folded
        .iter()
        .all(|(k, _)| k.contains("service=\"__other__\"")
            && k.contains("service_version=\"__other__\"")));
    assert!(
        folded.len() <= 6,
        "folded series keep only their stage: {folded:#?}"
    );
    assert_eq!(
        sum(&s, "toolspan_tool_spans_total", |_| true),
        (p.batch.num_rows() - 2) as f64,
        "nothing is lost"
    );
    assert!(
        get(
            &s,
            "toolspan_metrics_label_overflow_total",
            &[("label", "series")]
        ) > 0.0
    );
}
