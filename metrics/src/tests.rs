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

/// One agent run's spans, built the way agents emit them: call, attempts, stages.
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

mod caps;
mod counts;
mod recovery;
mod shapes;
mod silent;
