//! OTLP/JSON encoding of a request (the collector's `otlp_json`): ids as lowercase hex, 64-bit
//! integers as strings, enums as integers, lowerCamelCase keys.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use serde_json::{json, Map, Value as J};

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn any(v: &AnyValue) -> J {
    match &v.value {
        Some(Value::StringValue(s)) => json!({"stringValue": s}),
        Some(Value::BoolValue(b)) => json!({"boolValue": b}),
        Some(Value::IntValue(i)) => json!({"intValue": i.to_string()}),
        Some(Value::DoubleValue(d)) => json!({"doubleValue": d}),
        Some(Value::ArrayValue(a)) => {
            json!({"arrayValue": {"values": a.values.iter().map(any).collect::<Vec<_>>()}})
        }
        Some(Value::KvlistValue(l)) => json!({"kvlistValue": {"values": attrs(&l.values)}}),
        Some(Value::BytesValue(b)) => json!({"bytesValue": hex(b)}),
        Some(Value::StringValueStrindex(_)) | None => json!({}),
    }
}

fn attrs(kvs: &[KeyValue]) -> Vec<J> {
    kvs.iter()
        .map(|kv| json!({"key": kv.key, "value": kv.value.as_ref().map(any).unwrap_or(json!({}))}))
        .collect()
}

/// The request as OTLP/JSON bytes.
pub fn encode_json(req: &ExportTraceServiceRequest) -> Vec<u8> {
    let mut rss = Vec::new();
    for rs in &req.resource_spans {
        let mut sss = Vec::new();
        for ss in &rs.scope_spans {
            let spans: Vec<J> = ss
                .spans
                .iter()
                .map(|s| {
                    let mut m = Map::new();
                    m.insert("traceId".into(), json!(hex(&s.trace_id)));
                    m.insert("spanId".into(), json!(hex(&s.span_id)));
                    if !s.parent_span_id.is_empty() {
                        m.insert("parentSpanId".into(), json!(hex(&s.parent_span_id)));
                    }
                    m.insert("name".into(), json!(s.name));
                    m.insert("kind".into(), json!(s.kind));
                    m.insert("startTimeUnixNano".into(), json!(s.start_time_unix_nano.to_string()));
                    m.insert("endTimeUnixNano".into(), json!(s.end_time_unix_nano.to_string()));
                    m.insert("attributes".into(), J::Array(attrs(&s.attributes)));
                    let events: Vec<J> = s
                        .events
                        .iter()
                        .map(|e| json!({"timeUnixNano": e.time_unix_nano.to_string(), "name": e.name, "attributes": attrs(&e.attributes)}))
                        .collect();
                    m.insert("events".into(), J::Array(events));
                    if let Some(st) = &s.status {
                        m.insert("status".into(), json!({"code": st.code, "message": st.message}));
                    }
                    J::Object(m)
                })
                .collect();
            let scope = ss
                .scope
                .as_ref()
                .map(|sc| json!({"name": sc.name, "version": sc.version}))
                .unwrap_or(json!({}));
            sss.push(json!({"scope": scope, "spans": spans}));
        }
        let resource = rs
            .resource
            .as_ref()
            .map(|r| json!({"attributes": attrs(&r.attributes)}))
            .unwrap_or(json!({}));
        rss.push(json!({"resource": resource, "scopeSpans": sss}));
    }
    serde_json::to_vec(&json!({"resourceSpans": rss})).unwrap_or_default()
}
