//! What one batch and the fleet's traffic count: spans, failures, attempts, unmapped
//! failures, leaks, and series that exist before their first event.

use super::*;

#[test]
fn counts_spans_failures_attempts_unmapped_and_leaks_of_one_request() {
    let m = ToolMetrics::new(MetricsConfig::default());
    let mut run = Run::new(1);
    for _ in 0..3 {
        run.call("search", &[None], false);
    }
    run.call("fetch", &[SEND_TIMEOUT, None], false); // recovered after a retry
    run.call("fetch", &[SEND_NO_CODE, SEND_NO_CODE], false); // retries exhausted, no code
    run.call("fetch", &[PARSE_INTERNAL], true); // failed at parse, leaked a stack trace
    let p = feed(&m, &request("shop", Some("1.0"), run.spans));
    let s = samples(&m);
    let l = |tool, stage| {
        [
            ("tool", tool),
            ("stage", stage),
            ("service", "shop"),
            ("service_version", "1.0"),
        ]
    };
    let spans = |tool, stage| get(&s, "toolspan_tool_spans_total", &l(tool, stage));

    for stage in ["call", "attempt", "prepare", "send", "execute", "parse"] {
        assert_eq!(spans("search", stage), 3.0, "search {stage}");
    }
    assert_eq!(
        [
            spans("fetch", "call"),
            spans("fetch", "attempt"),
            spans("fetch", "prepare"),
            spans("fetch", "send"),
            spans("fetch", "execute"),
            spans("fetch", "parse")
        ],
        [3.0, 5.0, 5.0, 5.0, 2.0, 2.0]
    );
    assert_eq!(
        sum(&s, "toolspan_tool_spans_total", |_| true),
        p.batch.num_rows() as f64 - 2.0,
        "agent and llm spans are not counted"
    );

    let fail = |tool, stage, et| {
        let [a, b, c, d] = l(tool, stage);
        get(
            &s,
            "toolspan_tool_failures_total",
            &[a, b, ("error_type", et), c, d],
        )
    };
    assert_eq!(fail("fetch", "send", "NETWORK"), 3.0);
    assert_eq!(fail("fetch", "parse", "PARSE"), 1.0);
    assert_eq!(
        fail("fetch", "call", "RETRY_EXHAUSTED"),
        1.0,
        "a call's error type is its final one"
    );
    assert_eq!(fail("fetch", "call", "PARSE"), 1.0);
    assert_eq!(fail("fetch", "attempt", "NETWORK"), 3.0);
    assert_eq!(
        fail("search", "send", "NETWORK"),
        0.0,
        "zero series of a healthy stage"
    );

    let unmapped = |tool: &str, stage: &str| {
        let (t, st) = (format!("tool=\"{tool}\""), format!("stage=\"{stage}\""));
        assert!(
            s.keys()
                .any(|k| k.starts_with("toolspan_unmapped_failures_total{")
                    && k.contains(&t)
                    && k.contains(&st)
                    && k.contains("service_version=")),
            "unmapped failures of {tool} {stage} are exported by service version"
        );
        sum(&s, "toolspan_unmapped_failures_total", |k| {
            k.contains(&t) && k.contains(&st)
        })
    };
    assert_eq!(
        unmapped("fetch", "call"),
        2.0,
        "no code and internal_error; timeout is mapped"
    );
    assert_eq!(unmapped("fetch", "attempt"), 3.0);
    assert_eq!(unmapped("search", "call"), 0.0);
    assert!(
        !s.keys()
            .any(|k| k.starts_with("toolspan_unmapped_failures_total{")
                && k.contains("stage=\"send\"")),
        "only call and attempt"
    );

    let count = |tool, outcome| {
        get(
            &s,
            "toolspan_call_attempts_count",
            &[("tool", tool), ("outcome", outcome)],
        )
    };
    assert_eq!(count("search", "ok"), 3.0);
    assert_eq!(count("fetch", "recovered"), 1.0);
    assert_eq!(count("fetch", "failed"), 2.0);
    assert_eq!(
        get(
            &s,
            "toolspan_call_attempts_sum",
            &[("tool", "fetch"), ("outcome", "failed")]
        ),
        3.0,
        "2 + 1 attempts"
    );
    assert_eq!(
        get(
            &s,
            "toolspan_call_attempts_bucket",
            &[("tool", "fetch"), ("outcome", "failed"), ("le", "1")]
        ),
        1.0
    );
    assert_eq!(
        get(&s, "toolspan_calls_recovered_total", &[("tool", "fetch")]),
        1.0
    );
    assert_eq!(
        get(&s, "toolspan_calls_recovered_total", &[("tool", "search")]),
        0.0
    );
    assert_eq!(
        get(
            &s,
            "toolspan_leaked_internals_total",
            &[("tool", "fetch"), ("service", "shop")]
        ),
        1.0,
        "the attempt's leak counts for its call, once"
    );
    assert_eq!(
        get(
            &s,
            "toolspan_leaked_internals_total",
            &[("tool", "search"), ("service", "shop")]
        ),
        0.0
    );

    let d = |suffix: &str, extra: &[(&str, &str)]| {
        let mut labels = vec![("tool", "search"), ("stage", "send")];
        labels.extend_from_slice(extra);
        get(
            &s,
            &format!("toolspan_stage_duration_seconds_{suffix}"),
            &labels,
        )
    };
    assert_eq!(d("count", &[]), 3.0);
    assert!((d("sum", &[]) - 0.03).abs() < 1e-9, "3 spans of 10 ms");
    assert_eq!(d("bucket", &[("le", "0.005")]), 0.0);
    assert_eq!(d("bucket", &[("le", "0.01")]), 3.0);
    assert_eq!(
        get(&s, "toolspan_ingest_spans_total", &[]),
        p.batch.num_rows() as f64
    );
}

#[test]
fn attempts_seen_in_an_earlier_batch_join_their_call() {
    let m = ToolMetrics::new(MetricsConfig::default());
    let mut run = Run::new(2);
    run.call("fetch", &[Some(("send", Some("timeout"))), None], true);
    // Split the trace: everything but the call span first, the call span in a later request.
    let call = run.spans.pop().expect("the call span is last");
    feed(&m, &request("shop", None, run.spans));
    let s = samples(&m);
    assert!(
        !s.keys()
            .any(|k| k.starts_with("toolspan_call_attempts_count{")),
        "no call observed yet"
    );
    feed(&m, &request("shop", None, vec![call]));
    let s = samples(&m);
    assert_eq!(
        get(
            &s,
            "toolspan_call_attempts_count",
            &[("tool", "fetch"), ("outcome", "recovered")]
        ),
        1.0
    );
    assert_eq!(
        get(
            &s,
            "toolspan_call_attempts_sum",
            &[("tool", "fetch"), ("outcome", "recovered")]
        ),
        2.0
    );
    assert_eq!(
        get(&s, "toolspan_calls_recovered_total", &[("tool", "fetch")]),
        1.0
    );
    assert_eq!(
        get(
            &s,
            "toolspan_leaked_internals_total",
            &[("tool", "fetch"), ("service", "shop")]
        ),
        1.0
    );
    let l = [
        ("tool", "fetch"),
        ("stage", "call"),
        ("service", "shop"),
        ("service_version", "unknown"),
    ];
    assert_eq!(
        get(&s, "toolspan_tool_spans_total", &l),
        1.0,
        "service.version absent: unknown"
    );
}

#[test]
fn series_that_start_at_zero_exist_before_any_event() {
    let m = ToolMetrics::new(MetricsConfig::default());
    let s = samples(&m);
    for kind in SecretKind::ALL {
        assert_eq!(
            get(&s, "toolspan_redactions_total", &[("kind", kind.as_str())]),
            0.0
        );
    }
    assert_eq!(get(&s, "toolspan_ingest_spans_total", &[]), 0.0);
    for label in ["tool", "service", "service_version", "series", "shape"] {
        assert_eq!(
            get(
                &s,
                "toolspan_metrics_label_overflow_total",
                &[("label", label)]
            ),
            0.0
        );
    }
    let text = m.encode();
    assert!(
        !text.contains("toolspan_ingest_consumer_lag")
            && !text.contains("toolspan_ingest_dead_letters"),
        "no Kafka-only series in embedded mode"
    );

    // The first healthy span of each stage creates the failure series its stage implies.
    let mut run = Run::new(3);
    run.call("search", &[None], false);
    feed(&m, &request("shop", Some("2.0"), run.spans));
    let s = samples(&m);
    for (stage, et) in [
        ("prepare", "PREPARE"),
        ("send", "NETWORK"),
        ("execute", "TOOL_ERROR"),
        ("parse", "PARSE"),
    ] {
        let l = [
            ("tool", "search"),
            ("stage", stage),
            ("error_type", et),
            ("service", "shop"),
            ("service_version", "2.0"),
        ];
        assert_eq!(get(&s, "toolspan_tool_failures_total", &l), 0.0);
    }
    for stage in ["call", "attempt"] {
        assert_eq!(
            get(
                &s,
                "toolspan_unmapped_failures_total",
                &[
                    ("tool", "search"),
                    ("stage", stage),
                    ("service", "shop"),
                    ("service_version", "2.0")
                ]
            ),
            0.0
        );
    }
    for outcome in ["recovered", "unrecovered"] {
        assert_eq!(
            get(
                &s,
                "toolspan_failure_streaks_total",
                &[
                    ("tool", "search"),
                    ("service", "shop"),
                    ("service_version", "2.0"),
                    ("outcome", outcome)
                ]
            ),
            0.0
        );
    }
    assert_eq!(
        get(&s, "toolspan_calls_recovered_total", &[("tool", "search")]),
        0.0
    );
    assert_eq!(
        get(
            &s,
            "toolspan_leaked_internals_total",
            &[("tool", "search"), ("service", "shop")]
        ),
        0.0
    );
}

#[test]
fn fleet_traffic_encodes_a_valid_exposition_with_consistent_totals() {
    let m = ToolMetrics::new(MetricsConfig::default());
    let mut fleet = toolspan_gen::Fleet::new(toolspan_gen::FleetConfig {
        failure_scale: 3.0,
        ..Default::default()
    });
    let mut rows = 0usize;
    let mut tool_rows = 0usize;
    let mut redactions = 0u64;
    let mut leaked_calls = 0usize;
    for k in 0..5u64 {
        let req = fleet.request(
            40,
            1_764_410_400_000_000_000 + k * 60_000_000_000,
            60_000_000_000,
        );
        let p = feed(&m, &req);
        rows += p.batch.num_rows();
        redactions += p.stats.redactions.total();
        let r = SpanRows::new(&p.batch).expect("pipeline batches have the columns");
        tool_rows += (0..r.len())
            .filter(|&i| r.tool(i) != NO_TOOL && tool_stage(r.stage(i)).is_some())
            .count();
        // Calls and their attempts arrive in one request here, so `calls.leaked_internals` is
        // the call's own flag or one of its attempts'.
        let mut leaked = std::collections::HashSet::new();
        for i in 0..r.len() {
            let row = r.row(i);
            if row.leaked_internals && matches!(r.stage(i), "call" | "attempt") {
                leaked.insert(row.call_id.unwrap_or(row.span_id).to_string());
            }
        }
        leaked_calls += leaked.len();
    }
    let text = m.encode();
    let parsed = parse(&text);
    assert!(parsed.len() > 100, "a busy exposition:\n{text}");
    for family in [
        "toolspan_tool_spans_total",
        "toolspan_tool_failures_total",
        "toolspan_call_attempts",
        "toolspan_calls_recovered_total",
        "toolspan_unmapped_failures_total",
        "toolspan_failure_streaks_total",
        "toolspan_calls_to_recovery",
        "toolspan_hammering_streaks_total",
        "toolspan_leaked_internals_total",
        "toolspan_stage_duration_seconds",
        "toolspan_metrics_label_overflow_total",
        "toolspan_ingest_spans_total",
        "toolspan_redactions_total",
    ] {
        assert!(
            text.contains(&format!("# TYPE {family} ")),
            "{family} declared"
        );
    }
    let s = samples(&m);
    assert_eq!(get(&s, "toolspan_ingest_spans_total", &[]), rows as f64);
    assert_eq!(
        sum(&s, "toolspan_tool_spans_total", |_| true),
        tool_rows as f64
    );
    assert_eq!(
        sum(&s, "toolspan_redactions_total", |_| true),
        redactions as f64
    );
    assert!(redactions > 0, "the fleet plants secrets");
    assert_eq!(
        sum(&s, "toolspan_leaked_internals_total", |_| true),
        leaked_calls as f64
    );
    assert!(leaked_calls > 0, "the fleet leaks stack traces");
    assert!(sum(&s, "toolspan_calls_recovered_total", |_| true) > 0.0);
    assert_eq!(
        sum(&s, "toolspan_calls_recovered_total", |_| true),
        sum(&s, "toolspan_call_attempts_count", |k| k
            .contains("outcome=\"recovered\"")),
        "recovered calls are the recovered histogram's count"
    );
    assert_eq!(
        sum(&s, "toolspan_call_attempts_count", |_| true),
        sum(&s, "toolspan_tool_spans_total", |k| k
            .contains("stage=\"call\"")),
        "one attempts observation per logical call"
    );
    assert!(!s.keys().any(|k| k.contains("tool=\"_none\"")
        || k.contains("stage=\"agent\"")
        || k.contains("stage=\"llm\"")));
    assert!(
        !text.contains("trace_id") && !text.contains("call_id"),
        "no unbounded label"
    );
}
