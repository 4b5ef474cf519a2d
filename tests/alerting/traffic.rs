//! Agent runs as agents emit them, for the alert tests: call, attempts, then prepare, send,
//! execute and parse, for a healthy tool and a flaky one.

use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use prost::Message;

use super::{FLAKY, HEALTHY};

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

pub(super) fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos() as u64
}

/// Builds agent runs as agents emit them: call → attempts → prepare/send/execute/parse.
pub(super) struct Traffic {
    pub(super) next: u64,
}

impl Traffic {
    fn id(&mut self) -> Vec<u8> {
        self.next += 1;
        self.next.to_be_bytes().to_vec()
    }

    fn span(
        trace: &[u8],
        id: Vec<u8>,
        parent: Vec<u8>,
        name: String,
        t: u64,
        attributes: Vec<KeyValue>,
        failed: bool,
    ) -> Span {
        Span {
            trace_id: trace.to_vec(),
            span_id: id,
            parent_span_id: parent,
            name,
            start_time_unix_nano: t,
            end_time_unix_nano: t + 5_000_000,
            attributes,
            status: Some(Status {
                code: if failed { 2 } else { 1 },
                message: if failed {
                    "connection reset".into()
                } else {
                    String::new()
                },
            }),
            ..Default::default()
        }
    }

    /// One agent run with one call of `tool`; `fail_first_send` makes its first attempt fail at
    /// `send` (NETWORK) and a second attempt succeed.
    fn run(&mut self, tool: &str, fail_first_send: bool, spans: &mut Vec<Span>) {
        let mut trace = vec![0x5a; 16];
        trace[8..].copy_from_slice(&self.next.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_be_bytes());
        let t = now_ns();
        let root = self.id();
        let call = self.id();
        let call_id = format!("call_{}", self.next);
        let attempts = if fail_first_send { 2 } else { 1 };
        for n in 1..=attempts {
            let attempt = self.id();
            let failing = fail_first_send && n == 1;
            for stage in ["prepare", "send", "execute", "parse"] {
                let fails = failing && stage == "send";
                let mut attrs = vec![
                    kv("toolspan.stage", stage),
                    kv("gen_ai.tool.name", tool),
                    kv("gen_ai.tool.call.id", &call_id),
                ];
                if fails {
                    attrs.push(kv("toolspan.error.code", "upstream_unreachable"));
                }
                spans.push(Self::span(
                    &trace,
                    self.id(),
                    attempt.clone(),
                    format!("{stage} {tool}"),
                    t,
                    attrs,
                    fails,
                ));
                if fails {
                    break;
                }
            }
            let mut attrs = vec![
                ki("toolspan.attempt", n),
                kv("gen_ai.tool.name", tool),
                kv("gen_ai.tool.call.id", &call_id),
            ];
            if failing {
                attrs.push(kv("toolspan.error.code", "upstream_unreachable"));
            }
            spans.push(Self::span(
                &trace,
                attempt,
                call.clone(),
                format!("attempt {n} {tool}"),
                t,
                attrs,
                failing,
            ));
        }
        let attrs = vec![
            kv("gen_ai.operation.name", "execute_tool"),
            kv("gen_ai.tool.name", tool),
            kv("gen_ai.tool.call.id", &call_id),
        ];
        spans.push(Self::span(
            &trace,
            call,
            root.clone(),
            format!("execute_tool {tool}"),
            t,
            attrs,
            false,
        ));
        spans.push(Self::span(
            &trace,
            root,
            Vec::new(),
            "invoke_agent checkout-agent".into(),
            t,
            vec![kv("gen_ai.operation.name", "invoke_agent")],
            false,
        ));
    }

    /// `per_tool` healthy runs and `per_tool` flaky runs in one request.
    pub(super) fn request(&mut self, per_tool: usize) -> Vec<u8> {
        let mut spans = Vec::new();
        for _ in 0..per_tool {
            self.run(HEALTHY, false, &mut spans);
            self.run(FLAKY, true, &mut spans);
        }
        Self::encode(spans)
    }

    /// `n` healthy runs only (warming up a consumer without injecting failures).
    pub(super) fn healthy_only(&mut self, n: usize) -> Vec<u8> {
        let mut spans = Vec::new();
        for _ in 0..n {
            self.run(HEALTHY, false, &mut spans);
        }
        Self::encode(spans)
    }

    fn encode(spans: Vec<Span>) -> Vec<u8> {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![
                        kv("service.name", "checkout"),
                        kv("service.version", "1.0.0"),
                    ],
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
        .encode_to_vec()
    }
}
