//! The metrics of METRICS.md from batches that went through the real pipeline
//! (`Pipeline::builtin().process`) on hand-built OTLP requests and the synthetic fleet.

use std::collections::HashMap;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use toolspan_pipeline::redact::SecretKind;
use toolspan_pipeline::Pipeline;

use super::*;

const LEAK: &str = "java.lang.IllegalStateException: ticket locked\n\tat com.acme.tickets.TicketService.update(TicketService.java:214)\n\tat com.acme.tickets.Api.handle(Api.java:77)";

fn kv(key: &str, v: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(Value::StringValue(v.into())),
        }),
        ..Default::default()
    }
}

fn ki(key: &str, v: i64) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(Value::IntValue(v)),
        }),
        ..Default::default()
    }
}

/// How one attempt ends: `None` succeeds, `Some((stage, code))` fails at `stage` with the
/// error envelope's `code` (absent when `None`).
type AttemptEnd = Option<(&'static str, Option<&'static str>)>;

/// One agent run's spans, built the way DESIGN §2 says agents emit them.
struct Run {
    trace: Vec<u8>,
    root: Vec<u8>,
    next: u64,
    t: u64,
    spans: Vec<Span>,
}

impl Run {
    fn new(trace: u64) -> Run {
        let mut id = vec![0u8; 16];
        id[8..].copy_from_slice(&trace.to_be_bytes());
        id[0] = 0x4b;
        let mut run = Run {
            trace: id,
            root: Vec::new(),
            next: trace << 16,
            t: 1_764_410_400_000_000_000,
            spans: Vec::new(),
        };
        run.root = run.id();
        let root = run.span(
            Vec::new(),
            run.root.clone(),
            "invoke_agent bot",
            vec![kv("gen_ai.operation.name", "invoke_agent")],
            false,
        );
        let llm = run.id();
        let llm = run.span(
            run.root.clone(),
            llm,
            "chat gpt",
            vec![kv("gen_ai.operation.name", "chat")],
            false,
        );
        run.spans.extend([root, llm]);
        run
    }

    fn id(&mut self) -> Vec<u8> {
        self.next += 1;
        self.next.to_be_bytes().to_vec()
    }

    fn span(
        &mut self,
        parent: Vec<u8>,
        id: Vec<u8>,
        name: &str,
        attributes: Vec<KeyValue>,
        failed: bool,
    ) -> Span {
        self.t += 10_000_000; // 10 ms each
        Span {
            trace_id: self.trace.clone(),
            span_id: id,
            parent_span_id: parent,
            name: name.into(),
            start_time_unix_nano: self.t - 10_000_000,
            end_time_unix_nano: self.t,
            attributes,
            status: Some(Status {
                code: if failed { 2 } else { 1 },
                message: String::new(),
            }),
            ..Default::default()
        }
    }

    /// A logical call of `tool` with one attempt per entry of `attempts`; the call fails when
    /// its last attempt does. `leak` puts a stack trace in the failed attempts' results.
    fn call(&mut self, tool: &str, attempts: &[AttemptEnd], leak: bool) -> &mut Run {
        let call = self.id();
        let call_id = format!("call_{}", self.next);
        for (k, end) in attempts.iter().enumerate() {
            let attempt = self.id();
            for stage in ["prepare", "send", "execute", "parse"] {
                let fails = matches!(end, Some((s, _)) if *s == stage);
                let id = self.id();
                let attrs = vec![
                    kv("toolspan.stage", stage),
                    kv("gen_ai.tool.name", tool),
                    kv("gen_ai.tool.call.id", &call_id),
                ];
                let s = self.span(
                    attempt.clone(),
                    id,
                    &format!("{stage} {tool}"),
                    attrs,
                    fails,
                );
                self.spans.push(s);
                if fails {
                    break;
                }
            }
            let mut attrs = vec![
                ki("toolspan.attempt", k as i64 + 1),
                kv("gen_ai.tool.name", tool),
                kv("gen_ai.tool.call.id", &call_id),
            ];
            if let Some((_, code)) = end {
                attrs.extend(code.map(|c| kv("toolspan.error.code", c)));
                if leak {
                    attrs.push(kv("gen_ai.tool.call.result", LEAK));
                }
            }
            let s = self.span(
                call.clone(),
                attempt,
                &format!("attempt {tool}"),
                attrs,
                end.is_some(),
            );
            self.spans.push(s);
        }
        let last = attempts.last().copied().flatten();
        let mut attrs = vec![
            kv("gen_ai.operation.name", "execute_tool"),
            kv("gen_ai.tool.name", tool),
            kv("gen_ai.tool.call.id", &call_id),
        ];
        if let Some((_, Some(code))) = last {
            attrs.push(kv("toolspan.error.code", code));
        }
        let s = self.span(
            self.root.clone(),
            call,
            &format!("execute_tool {tool}"),
            attrs,
            last.is_some(),
        );
        self.spans.push(s);
        self
    }
}

fn request(service: &str, version: Option<&str>, spans: Vec<Span>) -> ExportTraceServiceRequest {
    let mut attributes = vec![kv("service.name", service)];
    attributes.extend(version.map(|v| kv("service.version", v)));
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes,
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

fn feed(m: &ToolMetrics, req: &ExportTraceServiceRequest) -> toolspan_pipeline::Processed {
    let p = Pipeline::builtin()
        .process(req)
        .expect("the pipeline takes the request");
    m.observe(&p.batch, &p.stats);
    p
}

/// One sample: name, labels in exposition order, value.
type Sample = (String, Vec<(String, String)>, f64);

/// The samples of an exposition, checking every line's shape on the way: `# HELP name text`,
/// `# TYPE name type` (before its samples), or `name{k="v",...} value` of a declared family.
fn parse(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    let mut declared: Vec<(String, String)> = Vec::new();
    let is_name = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
            && !s.starts_with(|c: char| c.is_ascii_digit())
    };
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or("");
            assert!(is_name(name), "HELP names a metric: {line:?}");
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let parts: Vec<&str> = rest.split(' ').collect();
            assert!(parts.len() == 2 && is_name(parts[0]), "TYPE line: {line:?}");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&parts[1]),
                "TYPE line: {line:?}"
            );
            declared.push((parts[0].to_string(), parts[1].to_string()));
            continue;
        }
        assert!(
            !line.starts_with('#'),
            "only HELP and TYPE comments: {line:?}"
        );
        let name_end = line
            .find(['{', ' '])
            .unwrap_or_else(|| panic!("sample without value: {line:?}"));
        let name = &line[..name_end];
        assert!(is_name(name), "sample name: {line:?}");
        let (family, kind) = declared
            .last()
            .unwrap_or_else(|| panic!("sample before any TYPE: {line:?}"));
        let ok_name = match kind.as_str() {
            "histogram" => [
                format!("{family}_bucket"),
                format!("{family}_sum"),
                format!("{family}_count"),
            ]
            .contains(&name.to_string()),
            _ => name == family,
        };
        assert!(ok_name, "sample {name} under TYPE {family} {kind}");
        let mut rest = &line[name_end..];
        let mut labels = Vec::new();
        if let Some(r) = rest.strip_prefix('{') {
            let mut r = r;
            loop {
                if let Some(after) = r.strip_prefix('}') {
                    rest = after;
                    break;
                }
                let eq = r
                    .find("=\"")
                    .unwrap_or_else(|| panic!("label without =\": {line:?}"));
                let key = &r[..eq];
                assert!(is_name(key), "label name {key:?}: {line:?}");
                let mut value = String::new();
                let mut chars = r[eq + 2..].char_indices();
                let end = loop {
                    match chars.next() {
                        Some((_, '\\')) => match chars.next() {
                            Some((_, 'n')) => value.push('\n'),
                            Some((_, c)) => value.push(c),
                            None => panic!("dangling escape: {line:?}"),
                        },
                        Some((i, '"')) => break eq + 2 + i + 1,
                        Some((_, c)) => value.push(c),
                        None => panic!("unterminated label value: {line:?}"),
                    }
                };
                labels.push((key.to_string(), value));
                r = &r[end..];
                r = r.strip_prefix(',').unwrap_or(r);
            }
        }
        let value = rest
            .strip_prefix(' ')
            .unwrap_or_else(|| panic!("one space before the value: {line:?}"));
        let v: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("value {v:?}: {line:?}")),
        };
        out.push((name.to_string(), labels, v));
    }
    out
}

/// Samples keyed `name{k="v",...}` with labels sorted, for lookups.
fn samples(m: &ToolMetrics) -> HashMap<String, f64> {
    parse(&m.encode())
        .into_iter()
        .map(|(name, mut labels, v)| {
            labels.sort();
            let l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
            (format!("{name}{{{}}}", l.join(",")), v)
        })
        .collect()
}

fn key(name: &str, labels: &[(&str, &str)]) -> String {
    let mut l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    l.sort();
    format!("{name}{{{}}}", l.join(","))
}

/// The value of a series, failing when it is not exported.
fn get(s: &HashMap<String, f64>, name: &str, labels: &[(&str, &str)]) -> f64 {
    let k = key(name, labels);
    *s.get(&k).unwrap_or_else(|| {
        let mut near: Vec<&String> = s.keys().filter(|x| x.starts_with(name)).collect();
        near.sort();
        panic!("{k} is not exported; {name} series: {near:#?}")
    })
}

fn sum(s: &HashMap<String, f64>, name: &str, pred: impl Fn(&str) -> bool) -> f64 {
    s.iter()
        .filter(|(k, _)| k.starts_with(&format!("{name}{{")) && pred(k))
        .map(|(_, v)| v)
        .sum()
}

const SEND_TIMEOUT: AttemptEnd = Some(("send", Some("timeout")));
const SEND_NO_CODE: AttemptEnd = Some(("send", None));
const PARSE_INTERNAL: AttemptEnd = Some(("parse", Some("internal_error")));

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
    for label in ["tool", "service", "service_version", "series"] {
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
        let r = Rows::new(&p.batch).expect("pipeline batches have the columns");
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
