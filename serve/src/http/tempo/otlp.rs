//! Stored spans back as OTLP: one `ResourceSpans` per distinct resource, each span with its
//! stored attributes, the attributes toolspan moved into columns under their original keys,
//! and toolspan's classification (`toolspan.stage`, `error.type`, …) as attributes; the same
//! as protobuf (what Grafana decodes) and OTLP/JSON.

use std::collections::HashMap;

use opentelemetry_proto::tonic::common::v1::{
    any_value, AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{self as tv1, span, ResourceSpans, ScopeSpans};
use serde_json::{json, Map, Value};

use toolspan_query::rows::Span;

/// Tempo's `TraceByIDResponse` (`/api/v2/traces/{id}`): the trace in field 1.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TraceByIdResponse {
    /// The trace (Tempo's `Trace`: the OTLP `ResourceSpans` in field 1, as `TracesData`).
    #[prost(message, optional, tag = "1")]
    pub trace: Option<tv1::TracesData>,
}

/// The scope every span is reported under (the original scope is not stored).
pub const SCOPE: &str = "toolspan";

fn kv(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

fn s(v: &str) -> any_value::Value {
    any_value::Value::StringValue(v.to_string())
}

/// A JSON value (as stored in `attributes`) as an OTLP value.
pub fn any(v: &Value) -> Option<any_value::Value> {
    Some(match v {
        Value::Null => return None,
        Value::Bool(b) => any_value::Value::BoolValue(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => any_value::Value::IntValue(i),
            None => any_value::Value::DoubleValue(n.as_f64().unwrap_or(0.0)),
        },
        Value::String(t) => any_value::Value::StringValue(t.clone()),
        Value::Array(a) => any_value::Value::ArrayValue(ArrayValue {
            values: a.iter().map(|x| AnyValue { value: any(x) }).collect(),
        }),
        Value::Object(m) => any_value::Value::KvlistValue(KeyValueList {
            values: m
                .iter()
                .filter_map(|(k, x)| any(x).map(|x| kv(k, x)))
                .collect(),
        }),
    })
}

/// The key-value pairs of a stored JSON object text (anything else gives none).
pub fn object_kvs(text: Option<&str>) -> Vec<KeyValue> {
    let Some(Ok(Value::Object(m))) = text.map(serde_json::from_str::<Value>) else {
        return Vec::new();
    };
    m.iter()
        .filter_map(|(k, v)| any(v).map(|v| kv(k, v)))
        .collect()
}

/// The OTLP span kind number of a stored kind name.
pub fn kind_number(kind: Option<&str>) -> i32 {
    match kind.unwrap_or("") {
        "internal" => 1,
        "server" => 2,
        "client" => 3,
        "producer" => 4,
        "consumer" => 5,
        _ => 0,
    }
}

/// The attributes toolspan keeps in columns, under their original keys, and its
/// classification.
pub fn column_attributes(sp: &Span) -> Vec<KeyValue> {
    use any_value::Value as V;
    let mut out = Vec::new();
    let mut text = |k: &str, v: &Option<String>| {
        if let Some(v) = v {
            out.push(kv(k, s(v)));
        }
    };
    text("gen_ai.tool.call.id", &sp.call_id);
    text("gen_ai.agent.name", &sp.agent);
    text("gen_ai.request.model", &sp.model);
    text("toolspan.error.code", &sp.error_code);
    text("toolspan.error.class", &sp.error_class);
    text("toolspan.error.reference", &sp.reference);
    text("gen_ai.tool.call.arguments", &sp.input);
    text("gen_ai.tool.call.result", &sp.output);
    text("error.type", &sp.error_type);
    if let Some(t) = sp.tool_name() {
        out.push(kv("gen_ai.tool.name", s(t)));
    }
    out.push(kv("toolspan.stage", s(&sp.stage)));
    let mut int = |k: &str, v: Option<i64>| {
        if let Some(v) = v {
            out.push(kv(k, V::IntValue(v)));
        }
    };
    if sp.stage == "call" {
        int("toolspan.attempts", sp.attempt);
    } else {
        int("toolspan.attempt", sp.attempt);
    }
    int("toolspan.error.retry_after_ms", sp.retry_after_ms);
    int("http.response.status_code", sp.http_status);
    int("gen_ai.usage.input_tokens", sp.input_tokens);
    int("gen_ai.usage.output_tokens", sp.output_tokens);
    int("toolspan.input.bytes", sp.input_bytes);
    int("toolspan.output.bytes", sp.output_bytes);
    if sp.redactions > 0 {
        int("toolspan.redactions", Some(sp.redactions));
    }
    if let Some(r) = sp.retryable {
        out.push(kv("toolspan.error.retryable", V::BoolValue(r)));
    }
    if sp.leaked_internals {
        out.push(kv("toolspan.leaked_internals", V::BoolValue(true)));
    }
    let mut text = |k: &str, v: &Option<String>| {
        if let Some(v) = v {
            out.push(kv(k, s(v)));
        }
    };
    text("toolspan.input.sha256", &sp.input_sha256);
    text("toolspan.output.sha256", &sp.output_sha256);
    out
}

fn hex_bytes(h: &str) -> Vec<u8> {
    hex_decode(h).unwrap_or_default()
}

fn hex_decode(h: &str) -> Option<Vec<u8>> {
    if !h.len().is_multiple_of(2) {
        return None;
    }
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(h.get(i..i + 2)?, 16).ok())
        .collect()
}

/// One stored span as an OTLP span.
pub fn span(sp: &Span) -> tv1::Span {
    let mut attributes = object_kvs(sp.attributes.as_deref());
    attributes.extend(column_attributes(sp));
    let events = match sp.events.as_deref().map(serde_json::from_str::<Value>) {
        Some(Ok(Value::Array(evs))) => evs
            .iter()
            .map(|e| span::Event {
                name: e["name"].as_str().unwrap_or_default().to_string(),
                time_unix_nano: e["time_unix_nano"].as_u64().unwrap_or(0),
                attributes: match &e["attributes"] {
                    Value::Object(m) => m
                        .iter()
                        .filter_map(|(k, v)| any(v).map(|v| kv(k, v)))
                        .collect(),
                    _ => Vec::new(),
                },
                dropped_attributes_count: 0,
            })
            .collect(),
        _ => Vec::new(),
    };
    let code = match sp.status.as_str() {
        "ok" => tv1::status::StatusCode::Ok,
        "error" => tv1::status::StatusCode::Error,
        _ => tv1::status::StatusCode::Unset,
    };
    tv1::Span {
        trace_id: hex_bytes(&sp.trace_id),
        span_id: hex_bytes(&sp.span_id),
        parent_span_id: sp
            .parent_span_id
            .as_deref()
            .map(hex_bytes)
            .unwrap_or_default(),
        name: sp.name.clone(),
        kind: kind_number(sp.kind.as_deref()),
        start_time_unix_nano: u64::try_from(sp.start_unix_nano).unwrap_or(0),
        end_time_unix_nano: u64::try_from(sp.end_unix_nano()).unwrap_or(0),
        attributes,
        events,
        status: Some(tv1::Status {
            message: if sp.failed() {
                sp.error_message.clone().unwrap_or_default()
            } else {
                String::new()
            },
            code: code as i32,
        }),
        ..Default::default()
    }
}

/// The resource of a span: its stored resource attributes, with `service.name` and
/// `service.version` from their columns when the stored ones lack them.
fn resource(sp: &Span) -> Resource {
    let mut attributes = object_kvs(sp.resource_attributes.as_deref());
    for (key, value) in [
        ("service.name", &sp.service),
        ("service.version", &sp.service_version),
    ] {
        if let Some(v) = value {
            if !attributes.iter().any(|a| a.key == key) {
                attributes.push(kv(key, s(v)));
            }
        }
    }
    Resource {
        attributes,
        ..Default::default()
    }
}

/// What tells resources apart: service, version and the other resource attributes.
type ResourceKey<'a> = (Option<&'a str>, Option<&'a str>, Option<&'a str>);

/// The spans as OTLP `ResourceSpans`, grouped by resource in order of first appearance.
pub fn resource_spans(spans: &[Span]) -> Vec<ResourceSpans> {
    let mut index: HashMap<ResourceKey<'_>, usize> = HashMap::new();
    let mut out: Vec<ResourceSpans> = Vec::new();
    for sp in spans {
        let key = (
            sp.service.as_deref(),
            sp.service_version.as_deref(),
            sp.resource_attributes.as_deref(),
        );
        let i = *index.entry(key).or_insert_with(|| {
            out.push(ResourceSpans {
                resource: Some(resource(sp)),
                scope_spans: vec![ScopeSpans {
                    scope: Some(InstrumentationScope {
                        name: SCOPE.into(),
                        ..Default::default()
                    }),
                    spans: Vec::new(),
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            });
            out.len() - 1
        });
        out[i].scope_spans[0].spans.push(span(sp));
    }
    out
}

/// An OTLP value as OTLP/JSON (64-bit integers as strings, bytes as base64 is not needed:
/// toolspan stores bytes as hex text).
pub fn any_json(v: &AnyValue) -> Value {
    use any_value::Value as V;
    match &v.value {
        None => json!({}),
        Some(V::StringValue(t)) => json!({ "stringValue": t }),
        Some(V::BoolValue(b)) => json!({ "boolValue": b }),
        Some(V::IntValue(i)) => json!({ "intValue": i.to_string() }),
        Some(V::DoubleValue(d)) => json!({ "doubleValue": d }),
        Some(V::ArrayValue(a)) => {
            json!({ "arrayValue": { "values": a.values.iter().map(any_json).collect::<Vec<_>>() } })
        }
        Some(V::KvlistValue(l)) => json!({ "kvlistValue": { "values": kvs_json(&l.values) } }),
        Some(V::BytesValue(b)) => json!({ "stringValue": hex(b) }),
        Some(other) => json!({ "stringValue": format!("{other:?}") }),
    }
}

/// Key-value pairs as OTLP/JSON.
pub fn kvs_json(kvs: &[KeyValue]) -> Vec<Value> {
    kvs.iter()
        .map(|k| {
            json!({
                "key": k.key,
                "value": k.value.as_ref().map_or(json!({}), any_json),
            })
        })
        .collect()
}

fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        s.push_str(&format!("{x:02x}"));
    }
    s
}

/// `ResourceSpans` as OTLP/JSON (ids as lowercase hex, as the OTLP/JSON encoding has them).
pub fn resource_spans_json(rs: &[ResourceSpans]) -> Vec<Value> {
    rs.iter()
        .map(|r| {
            let spans: Vec<Value> = r.scope_spans[0]
                .spans
                .iter()
                .map(|sp| {
                    let mut m = Map::new();
                    m.insert("traceId".into(), json!(hex(&sp.trace_id)));
                    m.insert("spanId".into(), json!(hex(&sp.span_id)));
                    if !sp.parent_span_id.is_empty() {
                        m.insert("parentSpanId".into(), json!(hex(&sp.parent_span_id)));
                    }
                    m.insert("name".into(), json!(sp.name));
                    m.insert("kind".into(), json!(sp.kind));
                    m.insert(
                        "startTimeUnixNano".into(),
                        json!(sp.start_time_unix_nano.to_string()),
                    );
                    m.insert(
                        "endTimeUnixNano".into(),
                        json!(sp.end_time_unix_nano.to_string()),
                    );
                    m.insert("attributes".into(), json!(kvs_json(&sp.attributes)));
                    m.insert(
                        "events".into(),
                        json!(sp
                            .events
                            .iter()
                            .map(|e| json!({
                                "timeUnixNano": e.time_unix_nano.to_string(),
                                "name": e.name,
                                "attributes": kvs_json(&e.attributes),
                            }))
                            .collect::<Vec<_>>()),
                    );
                    let status = sp.status.clone().unwrap_or_default();
                    let mut st = Map::new();
                    if status.code != 0 {
                        st.insert("code".into(), json!(status.code));
                    }
                    if !status.message.is_empty() {
                        st.insert("message".into(), json!(status.message));
                    }
                    m.insert("status".into(), Value::Object(st));
                    Value::Object(m)
                })
                .collect();
            json!({
                "resource": {
                    "attributes": kvs_json(&r.resource.clone().unwrap_or_default().attributes),
                },
                "scopeSpans": [{
                    "scope": { "name": SCOPE },
                    "spans": spans,
                }],
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn sample() -> Span {
        Span {
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
            span_id: "00f067aa0ba902b7".into(),
            parent_span_id: Some("00f067aa0ba902b6".into()),
            name: "parse".into(),
            kind: Some("client".into()),
            service: Some("agent-a".into()),
            tool: Some("search_docs".into()),
            stage: "parse".into(),
            attempt: Some(2),
            start_unix_nano: 1_700_000_000_000_000_000,
            duration_ms: 1.5,
            status: "error".into(),
            error_type: Some("PARSE".into()),
            error_message: Some("bad json".into()),
            attributes: Some(r#"{"db.rows":3,"ok":true,"list":["a",1]}"#.into()),
            resource_attributes: Some(r#"{"host.name":"h1"}"#.into()),
            events: Some(r#"[{"name":"exception","time_unix_nano":5,"attributes":{"exception.type":"ValueError"}}]"#.into()),
            ..Span::default()
        }
    }

    #[test]
    fn spans_keep_attributes_and_gain_the_classification() {
        let rs = resource_spans(&[sample()]);
        let sp = &rs[0].scope_spans[0].spans[0];
        assert_eq!(
            sp.span_id,
            vec![0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]
        );
        assert_eq!(sp.kind, 3);
        assert_eq!(sp.end_time_unix_nano - sp.start_time_unix_nano, 1_500_000);
        let keys: Vec<&str> = sp.attributes.iter().map(|a| a.key.as_str()).collect();
        for k in [
            "db.rows",
            "ok",
            "list",
            "gen_ai.tool.name",
            "toolspan.stage",
            "error.type",
            "toolspan.attempt",
        ] {
            assert!(keys.contains(&k), "{k} in {keys:?}");
        }
        assert_eq!(sp.status.as_ref().map(|s| s.code), Some(2));
        assert_eq!(sp.events[0].name, "exception");
        let res_keys: Vec<&str> = rs[0]
            .resource
            .as_ref()
            .expect("resource")
            .attributes
            .iter()
            .map(|a| a.key.as_str())
            .collect();
        assert_eq!(res_keys, ["host.name", "service.name"]);
        // The v2 answer decodes as Tempo's TraceByIDResponse.
        let body = TraceByIdResponse {
            trace: Some(tv1::TracesData {
                resource_spans: rs.clone(),
            }),
        }
        .encode_to_vec();
        let back = TraceByIdResponse::decode(body.as_slice()).expect("decodes");
        assert_eq!(back.trace.expect("trace").resource_spans, rs);
        let j = resource_spans_json(&rs);
        assert_eq!(
            j[0]["scopeSpans"][0]["spans"][0]["spanId"],
            "00f067aa0ba902b7"
        );
        assert_eq!(j[0]["scopeSpans"][0]["spans"][0]["status"]["code"], 2);
    }
}
