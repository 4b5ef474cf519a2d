//! OTLP/JSON decoding (the OTLP specification's JSON mapping of the protobuf messages).
//!
//! Accepted, as the specification and real senders require: lowerCamelCase and original
//! snake_case field names; trace and span ids as hex (base64 too, as protobuf's generic JSON
//! mapping writes them); 64-bit integers as strings or numbers; enums as integers or names;
//! unknown fields ignored.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1 as pc;
use opentelemetry_proto::tonic::resource::v1 as pr;
use opentelemetry_proto::tonic::trace::v1 as pt;
use serde::de::{self, Deserializer};
use serde::Deserialize;

use crate::error::SchemaError;

#[derive(Deserialize, Default)]
#[serde(default)]
struct Request {
    #[serde(rename = "resourceSpans", alias = "resource_spans")]
    resource_spans: Vec<ResourceSpans>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ResourceSpans {
    resource: Option<Resource>,
    #[serde(rename = "scopeSpans", alias = "scope_spans", alias = "instrumentationLibrarySpans")]
    scope_spans: Vec<ScopeSpans>,
    #[serde(rename = "schemaUrl", alias = "schema_url")]
    schema_url: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Resource {
    attributes: Vec<KeyValue>,
    #[serde(rename = "droppedAttributesCount", alias = "dropped_attributes_count", deserialize_with = "u32_any")]
    dropped_attributes_count: u32,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ScopeSpans {
    #[serde(alias = "instrumentationLibrary")]
    scope: Option<Scope>,
    spans: Vec<Span>,
    #[serde(rename = "schemaUrl", alias = "schema_url")]
    schema_url: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Scope {
    name: String,
    version: String,
    attributes: Vec<KeyValue>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Span {
    #[serde(rename = "traceId", alias = "trace_id", deserialize_with = "id_bytes")]
    trace_id: Vec<u8>,
    #[serde(rename = "spanId", alias = "span_id", deserialize_with = "id_bytes")]
    span_id: Vec<u8>,
    #[serde(rename = "traceState", alias = "trace_state")]
    trace_state: String,
    #[serde(rename = "parentSpanId", alias = "parent_span_id", deserialize_with = "id_bytes")]
    parent_span_id: Vec<u8>,
    #[serde(deserialize_with = "u32_any")]
    flags: u32,
    name: String,
    #[serde(deserialize_with = "span_kind")]
    kind: i32,
    #[serde(rename = "startTimeUnixNano", alias = "start_time_unix_nano", deserialize_with = "u64_any")]
    start_time_unix_nano: u64,
    #[serde(rename = "endTimeUnixNano", alias = "end_time_unix_nano", deserialize_with = "u64_any")]
    end_time_unix_nano: u64,
    attributes: Vec<KeyValue>,
    #[serde(rename = "droppedAttributesCount", alias = "dropped_attributes_count", deserialize_with = "u32_any")]
    dropped_attributes_count: u32,
    events: Vec<Event>,
    #[serde(rename = "droppedEventsCount", alias = "dropped_events_count", deserialize_with = "u32_any")]
    dropped_events_count: u32,
    #[serde(rename = "droppedLinksCount", alias = "dropped_links_count", deserialize_with = "u32_any")]
    dropped_links_count: u32,
    status: Option<Status>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Event {
    #[serde(rename = "timeUnixNano", alias = "time_unix_nano", deserialize_with = "u64_any")]
    time_unix_nano: u64,
    name: String,
    attributes: Vec<KeyValue>,
    #[serde(rename = "droppedAttributesCount", alias = "dropped_attributes_count", deserialize_with = "u32_any")]
    dropped_attributes_count: u32,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Status {
    message: String,
    #[serde(deserialize_with = "status_code")]
    code: i32,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct KeyValue {
    key: String,
    value: Option<AnyValue>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct AnyValue {
    #[serde(rename = "stringValue", alias = "string_value")]
    string_value: Option<String>,
    #[serde(rename = "boolValue", alias = "bool_value")]
    bool_value: Option<bool>,
    #[serde(rename = "intValue", alias = "int_value", deserialize_with = "opt_i64_any")]
    int_value: Option<i64>,
    #[serde(rename = "doubleValue", alias = "double_value", deserialize_with = "opt_f64_any")]
    double_value: Option<f64>,
    #[serde(rename = "arrayValue", alias = "array_value")]
    array_value: Option<ArrayValue>,
    #[serde(rename = "kvlistValue", alias = "kvlist_value")]
    kvlist_value: Option<KvList>,
    #[serde(rename = "bytesValue", alias = "bytes_value")]
    bytes_value: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ArrayValue {
    values: Vec<AnyValue>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct KvList {
    values: Vec<KeyValue>,
}

/// A JSON number or a string holding one.
#[derive(Deserialize)]
#[serde(untagged)]
enum NumOrStr {
    U(u64),
    I(i64),
    F(f64),
    S(String),
}

fn u64_any<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    match Option::<NumOrStr>::deserialize(d)? {
        None => Ok(0),
        Some(NumOrStr::U(v)) => Ok(v),
        Some(NumOrStr::I(v)) => u64::try_from(v).map_err(|_| de::Error::custom("negative timestamp")),
        Some(NumOrStr::F(v)) if v >= 0.0 && v.fract() == 0.0 => Ok(v as u64),
        Some(NumOrStr::F(_)) => Err(de::Error::custom("timestamp is not a whole number")),
        Some(NumOrStr::S(s)) if s.is_empty() => Ok(0),
        Some(NumOrStr::S(s)) => s.trim().parse().map_err(|_| de::Error::custom("timestamp string is not an unsigned integer")),
    }
}

fn u32_any<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let v = u64_any(d)?;
    u32::try_from(v).map_err(|_| de::Error::custom("count out of range"))
}

fn opt_i64_any<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    match Option::<NumOrStr>::deserialize(d)? {
        None => Ok(None),
        Some(NumOrStr::U(v)) => i64::try_from(v).map(Some).map_err(|_| de::Error::custom("intValue out of range")),
        Some(NumOrStr::I(v)) => Ok(Some(v)),
        Some(NumOrStr::F(v)) if v.fract() == 0.0 && v.abs() < 9.2e18 => Ok(Some(v as i64)),
        Some(NumOrStr::F(_)) => Err(de::Error::custom("intValue is not an integer")),
        Some(NumOrStr::S(s)) => s.trim().parse().map(Some).map_err(|_| de::Error::custom("intValue string is not an integer")),
    }
}

fn opt_f64_any<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    match Option::<NumOrStr>::deserialize(d)? {
        None => Ok(None),
        Some(NumOrStr::U(v)) => Ok(Some(v as f64)),
        Some(NumOrStr::I(v)) => Ok(Some(v as f64)),
        Some(NumOrStr::F(v)) => Ok(Some(v)),
        Some(NumOrStr::S(s)) => match s.as_str() {
            "NaN" => Ok(Some(f64::NAN)),
            "Infinity" => Ok(Some(f64::INFINITY)),
            "-Infinity" => Ok(Some(f64::NEG_INFINITY)),
            t => t.parse().map(Some).map_err(|_| de::Error::custom("doubleValue string is not a number")),
        },
    }
}

/// An enum as its integer or as its proto name (`SPAN_KIND_CLIENT`).
#[derive(Deserialize)]
#[serde(untagged)]
enum EnumRepr {
    I(i64),
    S(String),
}

fn span_kind<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
    Ok(match Option::<EnumRepr>::deserialize(d)? {
        None => 0,
        Some(EnumRepr::I(v)) => i32::try_from(v).unwrap_or(0),
        Some(EnumRepr::S(s)) => match s.as_str() {
            "SPAN_KIND_INTERNAL" => 1,
            "SPAN_KIND_SERVER" => 2,
            "SPAN_KIND_CLIENT" => 3,
            "SPAN_KIND_PRODUCER" => 4,
            "SPAN_KIND_CONSUMER" => 5,
            _ => 0,
        },
    })
}

fn status_code<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
    Ok(match Option::<EnumRepr>::deserialize(d)? {
        None => 0,
        Some(EnumRepr::I(v)) => i32::try_from(v).unwrap_or(0),
        Some(EnumRepr::S(s)) => match s.as_str() {
            "STATUS_CODE_OK" => 1,
            "STATUS_CODE_ERROR" => 2,
            _ => 0,
        },
    })
}

/// Ids: hex per the OTLP/JSON specification; base64 as protobuf's generic JSON mapping writes
/// them. Anything else is kept as an empty id, and the span is then rejected with a count.
fn id_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    let s = Option::<String>::deserialize(d)?.unwrap_or_default();
    if s.is_empty() {
        return Ok(Vec::new());
    }
    if s.len() % 2 == 0 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
        if let Ok(v) = hex::decode(&s) {
            return Ok(v);
        }
    }
    Ok(base64_decode(&s).unwrap_or_default())
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let mut buf = 0u32;
    let mut bits = 0u32;
    for b in s.bytes() {
        let v = match b {
            b'A'..=b'Z' => b - b'A',
            b'a'..=b'z' => b - b'a' + 26,
            b'0'..=b'9' => b - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            b'=' => break,
            _ => return None,
        };
        buf = (buf << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buf >> bits) as u8);
        }
    }
    Some(out)
}

impl From<KeyValue> for pc::KeyValue {
    fn from(kv: KeyValue) -> Self {
        pc::KeyValue { key: kv.key, value: kv.value.map(Into::into), ..Default::default() }
    }
}

impl From<AnyValue> for pc::AnyValue {
    fn from(v: AnyValue) -> Self {
        use pc::any_value::Value;
        let value = if let Some(s) = v.string_value {
            Some(Value::StringValue(s))
        } else if let Some(b) = v.bool_value {
            Some(Value::BoolValue(b))
        } else if let Some(i) = v.int_value {
            Some(Value::IntValue(i))
        } else if let Some(f) = v.double_value {
            Some(Value::DoubleValue(f))
        } else if let Some(a) = v.array_value {
            Some(Value::ArrayValue(pc::ArrayValue { values: a.values.into_iter().map(Into::into).collect() }))
        } else if let Some(kv) = v.kvlist_value {
            Some(Value::KvlistValue(pc::KeyValueList { values: kv.values.into_iter().map(Into::into).collect() }))
        } else {
            v.bytes_value.map(|b| Value::BytesValue(base64_decode(&b).unwrap_or_default()))
        };
        pc::AnyValue { value }
    }
}

fn attrs(v: Vec<KeyValue>) -> Vec<pc::KeyValue> {
    v.into_iter().map(Into::into).collect()
}

impl From<Span> for pt::Span {
    fn from(s: Span) -> Self {
        pt::Span {
            trace_id: s.trace_id,
            span_id: s.span_id,
            trace_state: s.trace_state,
            parent_span_id: s.parent_span_id,
            flags: s.flags,
            name: s.name,
            kind: s.kind,
            start_time_unix_nano: s.start_time_unix_nano,
            end_time_unix_nano: s.end_time_unix_nano,
            attributes: attrs(s.attributes),
            dropped_attributes_count: s.dropped_attributes_count,
            events: s
                .events
                .into_iter()
                .map(|e| pt::span::Event {
                    time_unix_nano: e.time_unix_nano,
                    name: e.name,
                    attributes: attrs(e.attributes),
                    dropped_attributes_count: e.dropped_attributes_count,
                })
                .collect(),
            dropped_events_count: s.dropped_events_count,
            links: Vec::new(),
            dropped_links_count: s.dropped_links_count,
            status: s.status.map(|st| pt::Status { message: st.message, code: st.code }),
        }
    }
}

/// Decodes OTLP/JSON into the protobuf types.
pub(crate) fn decode_json(bytes: &[u8]) -> Result<ExportTraceServiceRequest, SchemaError> {
    let req: Request = serde_json::from_slice(bytes).map_err(|e| {
        // serde_json's message is position plus a description of the expected token; it
        // holds no input text beyond the field name, so it is safe to return.
        SchemaError::OtlpJson(e.to_string())
    })?;
    Ok(ExportTraceServiceRequest {
        resource_spans: req
            .resource_spans
            .into_iter()
            .map(|rs| pt::ResourceSpans {
                resource: rs.resource.map(|r| pr::Resource {
                    attributes: attrs(r.attributes),
                    dropped_attributes_count: r.dropped_attributes_count,
                    ..Default::default()
                }),
                scope_spans: rs
                    .scope_spans
                    .into_iter()
                    .map(|ss| pt::ScopeSpans {
                        scope: ss.scope.map(|sc| pc::InstrumentationScope {
                            name: sc.name,
                            version: sc.version,
                            attributes: attrs(sc.attributes),
                            dropped_attributes_count: 0,
                        }),
                        spans: ss.spans.into_iter().map(Into::into).collect(),
                        schema_url: ss.schema_url,
                    })
                    .collect(),
                schema_url: rs.schema_url,
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_strings_numbers_enum_names_and_unknown_fields() {
        let body = br#"{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"svc"}}]},
          "scopeSpans":[{"scope":{"name":"s"},"spans":[
            {"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174","name":"a","kind":"SPAN_KIND_CLIENT",
             "startTimeUnixNano":"1544712660000000000","endTimeUnixNano":1544712661000000000,
             "attributes":[{"key":"n","value":{"intValue":"42"}},{"key":"m","value":{"intValue":7}},{"key":"d","value":{"doubleValue":"NaN"}}],
             "status":{"code":2,"message":"boom"},"somethingNew":{"x":1}},
            {"trace_id":"W47/95gDgQPSabYzgT/GDA==","span_id":"7uGbfsPBsXQ=","name":"b","kind":3,"status":{"code":"STATUS_CODE_ERROR"}}
          ]}]}]}"#;
        let req = decode_json(body).unwrap();
        let spans = &req.resource_spans[0].scope_spans[0].spans;
        assert_eq!(spans.len(), 2);
        assert_eq!(spans[0].kind, 3);
        assert_eq!(spans[0].start_time_unix_nano, 1_544_712_660_000_000_000);
        assert_eq!(spans[0].end_time_unix_nano, 1_544_712_661_000_000_000);
        assert_eq!(spans[0].status.as_ref().unwrap().code, 2);
        assert_eq!(spans[1].trace_id, spans[0].trace_id, "base64 ids decode to the same bytes as hex");
        assert_eq!(spans[1].status.as_ref().unwrap().code, 2);
        use pc::any_value::Value;
        assert_eq!(spans[0].attributes[0].value.as_ref().unwrap().value, Some(Value::IntValue(42)));
        assert_eq!(spans[0].attributes[1].value.as_ref().unwrap().value, Some(Value::IntValue(7)));
    }

    #[test]
    fn wrong_types_are_errors_with_a_code() {
        for body in [&br#"{"resourceSpans":"x"}"#[..], br#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"startTimeUnixNano":"abc"}]}]}]}"#, b"\xff\xfe", b""] {
            let err = decode_json(body).unwrap_err();
            assert_eq!(err.code().as_str(), "otlp_json");
        }
    }
}
