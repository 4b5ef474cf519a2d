//! OTLP/JSON decoding (the OTLP specification's JSON mapping of the protobuf messages).
//!
//! Accepted, as the specification and real senders require: lowerCamelCase and original
//! snake_case field names; trace and span ids as hex (base64 too, as protobuf's generic JSON
//! mapping writes them); 64-bit integers as strings or numbers; enums as integers or names;
//! unknown fields ignored.
//!
//! Errors name where and what, never the value: serde_json's messages quote the offending
//! value (`invalid type: string "hunter2", expected a boolean`), and a wrong-typed field may
//! hold a secret, so [`describe_error`] rewrites them into the field's path, the kind of value
//! found and the kind expected (`resourceSpans[0].scopeSpans[0].spans[0].attributes[0].value.
//! boolValue: got a string, expected a boolean (line 1, column 130)`).

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1 as pc;
use opentelemetry_proto::tonic::resource::v1 as pr;
use opentelemetry_proto::tonic::trace::v1 as pt;
use serde::de::{self, Deserializer};
use serde::Deserialize;

use crate::error::PipelineError;

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
    #[serde(
        rename = "scopeSpans",
        alias = "scope_spans",
        alias = "instrumentationLibrarySpans"
    )]
    scope_spans: Vec<ScopeSpans>,
    #[serde(rename = "schemaUrl", alias = "schema_url")]
    schema_url: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Resource {
    attributes: Vec<KeyValue>,
    #[serde(
        rename = "droppedAttributesCount",
        alias = "dropped_attributes_count",
        deserialize_with = "u32_any"
    )]
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
    #[serde(
        rename = "parentSpanId",
        alias = "parent_span_id",
        deserialize_with = "id_bytes"
    )]
    parent_span_id: Vec<u8>,
    #[serde(deserialize_with = "u32_any")]
    flags: u32,
    name: String,
    #[serde(deserialize_with = "span_kind")]
    kind: i32,
    #[serde(
        rename = "startTimeUnixNano",
        alias = "start_time_unix_nano",
        deserialize_with = "u64_any"
    )]
    start_time_unix_nano: u64,
    #[serde(
        rename = "endTimeUnixNano",
        alias = "end_time_unix_nano",
        deserialize_with = "u64_any"
    )]
    end_time_unix_nano: u64,
    attributes: Vec<KeyValue>,
    #[serde(
        rename = "droppedAttributesCount",
        alias = "dropped_attributes_count",
        deserialize_with = "u32_any"
    )]
    dropped_attributes_count: u32,
    events: Vec<Event>,
    #[serde(
        rename = "droppedEventsCount",
        alias = "dropped_events_count",
        deserialize_with = "u32_any"
    )]
    dropped_events_count: u32,
    #[serde(
        rename = "droppedLinksCount",
        alias = "dropped_links_count",
        deserialize_with = "u32_any"
    )]
    dropped_links_count: u32,
    status: Option<Status>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Event {
    #[serde(
        rename = "timeUnixNano",
        alias = "time_unix_nano",
        deserialize_with = "u64_any"
    )]
    time_unix_nano: u64,
    name: String,
    attributes: Vec<KeyValue>,
    #[serde(
        rename = "droppedAttributesCount",
        alias = "dropped_attributes_count",
        deserialize_with = "u32_any"
    )]
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
    #[serde(
        rename = "intValue",
        alias = "int_value",
        deserialize_with = "opt_i64_any"
    )]
    int_value: Option<i64>,
    #[serde(
        rename = "doubleValue",
        alias = "double_value",
        deserialize_with = "opt_f64_any"
    )]
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

// Messages of the field deserializers below. They describe the problem without the value; the
// path in front of them names the field.
const NEGATIVE: &str = "negative number where an unsigned integer is expected";
const NOT_WHOLE: &str = "number is not a whole number";
const NOT_UNSIGNED_STRING: &str = "string does not hold an unsigned integer";
const OUT_OF_RANGE: &str = "number out of range";
const NOT_INTEGER_STRING: &str = "string does not hold an integer";
const NOT_NUMBER_STRING: &str = "string does not hold a number";

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
        Some(NumOrStr::I(v)) => u64::try_from(v).map_err(|_| de::Error::custom(NEGATIVE)),
        Some(NumOrStr::F(v)) if v >= 0.0 && v.fract() == 0.0 => Ok(v as u64),
        Some(NumOrStr::F(_)) => Err(de::Error::custom(NOT_WHOLE)),
        Some(NumOrStr::S(s)) if s.is_empty() => Ok(0),
        Some(NumOrStr::S(s)) => s
            .trim()
            .parse()
            .map_err(|_| de::Error::custom(NOT_UNSIGNED_STRING)),
    }
}

fn u32_any<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let v = u64_any(d)?;
    u32::try_from(v).map_err(|_| de::Error::custom(OUT_OF_RANGE))
}

fn opt_i64_any<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    match Option::<NumOrStr>::deserialize(d)? {
        None => Ok(None),
        Some(NumOrStr::U(v)) => i64::try_from(v)
            .map(Some)
            .map_err(|_| de::Error::custom(OUT_OF_RANGE)),
        Some(NumOrStr::I(v)) => Ok(Some(v)),
        Some(NumOrStr::F(v)) if v.fract() == 0.0 && v.abs() < 9.2e18 => Ok(Some(v as i64)),
        Some(NumOrStr::F(_)) => Err(de::Error::custom(NOT_WHOLE)),
        Some(NumOrStr::S(s)) => s
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| de::Error::custom(NOT_INTEGER_STRING)),
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
            t => t
                .parse()
                .map(Some)
                .map_err(|_| de::Error::custom(NOT_NUMBER_STRING)),
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
        pc::KeyValue {
            key: kv.key,
            value: kv.value.map(Into::into),
            ..Default::default()
        }
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
            Some(Value::ArrayValue(pc::ArrayValue {
                values: a.values.into_iter().map(Into::into).collect(),
            }))
        } else if let Some(kv) = v.kvlist_value {
            Some(Value::KvlistValue(pc::KeyValueList {
                values: kv.values.into_iter().map(Into::into).collect(),
            }))
        } else {
            v.bytes_value
                .map(|b| Value::BytesValue(base64_decode(&b).unwrap_or_default()))
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
            status: s.status.map(|st| pt::Status {
                message: st.message,
                code: st.code,
            }),
        }
    }
}

/// Decodes OTLP/JSON into the protobuf types.
pub(crate) fn decode_json(bytes: &[u8]) -> Result<ExportTraceServiceRequest, PipelineError> {
    let req: Request = serde_json::from_slice(bytes)
        .map_err(|e| PipelineError::OtlpJson(describe_error(bytes, &e)))?;
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

// ---------------------------------------------------------------------------------------------
// Error messages without values

/// Every field name of the OTLP/JSON trace mapping (separated by spaces), the only object keys a
/// path may show: a key the sender made up is shown as `?`, since it too is input.
const FIELDS: &str = "resourceSpans resource_spans resource scopeSpans scope_spans \
    instrumentationLibrarySpans scope instrumentationLibrary spans schemaUrl schema_url \
    attributes droppedAttributesCount dropped_attributes_count name version traceId trace_id \
    spanId span_id traceState trace_state parentSpanId parent_span_id flags kind \
    startTimeUnixNano start_time_unix_nano endTimeUnixNano end_time_unix_nano events \
    droppedEventsCount dropped_events_count links droppedLinksCount dropped_links_count status \
    timeUnixNano time_unix_nano message code key value stringValue string_value boolValue \
    bool_value intValue int_value doubleValue double_value arrayValue array_value kvlistValue \
    kvlist_value bytesValue bytes_value values";

/// `name` as a field name of the mapping, if it is one.
fn field(name: &[u8]) -> Option<&'static str> {
    FIELDS.split(' ').find(|f| f.as_bytes() == name)
}

/// Longest path shown; a deeper one keeps its end.
const PATH_LIMIT: usize = 200;

/// The message for a body serde_json rejected: the path of the field, what was wrong and what
/// is allowed, and the position; never input text.
///
/// Syntax errors keep serde_json's wording, which is fixed text. For data errors (a value of
/// the wrong type or form) only the parts of serde_json's message that come from toolspan's own
/// types are kept: the kind of value found (its first words), the kind expected (the text after
/// the last `, expected `, which follows the quoted value) and this module's own messages.
pub(crate) fn describe_error(bytes: &[u8], e: &serde_json::Error) -> String {
    use serde_json::error::Category;
    match e.classify() {
        Category::Syntax | Category::Eof => e.to_string(),
        Category::Io => "the body could not be read".to_string(),
        Category::Data => {
            let text = e.to_string();
            // serde_json appends ` at line L column C` after the message.
            let msg = match text.rsplit_once(" at line ") {
                Some((m, _)) if e.line() > 0 => m,
                _ => text.as_str(),
            };
            let path = path_at(bytes, e.line(), e.column());
            let problem = data_problem(msg);
            if e.line() > 0 {
                format!(
                    "{path}: {problem} (line {}, column {})",
                    e.line(),
                    e.column()
                )
            } else {
                format!("{path}: {problem}")
            }
        }
    }
}

/// What was wrong, from a serde_json data error message, without the value it may quote.
fn data_problem(msg: &str) -> String {
    const OWN: &[&str] = &[
        NEGATIVE,
        NOT_WHOLE,
        NOT_UNSIGNED_STRING,
        OUT_OF_RANGE,
        NOT_INTEGER_STRING,
        NOT_NUMBER_STRING,
    ];
    if let Some(own) = OWN.iter().find(|m| **m == msg) {
        return (*own).to_string();
    }
    let expected = msg
        .rsplit_once(", expected ")
        .and_then(|(_, x)| expected_kind(x));
    let wrong = |what: String| match &expected {
        Some(x) => format!("{what}, expected {x}"),
        None => what,
    };
    if let Some(rest) = msg.strip_prefix("invalid type: ") {
        return wrong(format!("got {}", found_kind(rest)));
    }
    if let Some(rest) = msg.strip_prefix("invalid value: ") {
        return wrong(format!("unexpected {}", found_kind(rest)));
    }
    if msg.starts_with("invalid length ") {
        return wrong("wrong number of elements".to_string());
    }
    if msg.starts_with("data did not match any variant of untagged enum NumOrStr") {
        return "expected a number or a string holding one".to_string();
    }
    if msg.starts_with("data did not match any variant of untagged enum EnumRepr") {
        return "expected an integer or an enum value name".to_string();
    }
    for (prefix, what) in [
        ("missing field `", "missing field"),
        ("duplicate field `", "duplicate field"),
    ] {
        if let Some(rest) = msg.strip_prefix(prefix) {
            let name = rest.split('`').next().unwrap_or("");
            return match field(name.as_bytes()) {
                Some(f) => format!("{what} `{f}`"),
                None => what.to_string(),
            };
        }
    }
    "value of the wrong type or form".to_string()
}

/// The kind of value serde's `Unexpected` names at the start of `rest`, in JSON's words.
fn found_kind(rest: &str) -> &'static str {
    const KINDS: &[(&str, &str)] = &[
        ("string", "a string"),
        ("integer", "an integer"),
        ("floating point", "a floating-point number"),
        ("boolean", "a boolean"),
        ("null", "null"),
        ("unit value", "null"),
        ("sequence", "an array"),
        ("map", "an object"),
        ("character", "a character"),
        ("byte array", "a byte array"),
    ];
    KINDS
        .iter()
        .find(|(k, _)| rest.starts_with(k))
        .map_or("a value of another type", |(_, v)| v)
}

/// The expected kind after `, expected `: a type description from toolspan's own types, put in
/// JSON's words; anything that does not look like one is left out.
fn expected_kind(x: &str) -> Option<String> {
    if x.starts_with("struct ") || x == "a map" {
        return Some("an object".to_string());
    }
    let x = match x {
        "a sequence" => "an array",
        "u64" | "u32" | "i64" | "i32" => "an integer",
        "f64" => "a number",
        "option" => "a value or null",
        other => other,
    };
    let plain = !x.is_empty()
        && x.len() <= 48
        && x.bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b' ' || c == b'-');
    plain.then(|| x.to_string())
}

/// One level of nesting on the way to the error.
enum Frame {
    /// In an object; `key` is the last key read (a known field name or `?`), `want_key` says
    /// whether the next string is a key.
    Object {
        key: Option<&'static str>,
        want_key: bool,
    },
    /// In an array, at element `index`.
    Array { index: usize },
}

/// The path to the value that ends at `line`/`column` (serde_json's position of a data error:
/// just after the value, or after the object or array holding it), like
/// `resourceSpans[0].scopeSpans[0].spans[2].name`; `body` at the top. Only field names of the
/// mapping are shown.
fn path_at(bytes: &[u8], line: usize, column: usize) -> String {
    if line == 0 {
        return "body".to_string();
    }
    let line_start = if line == 1 {
        Some(0)
    } else {
        memchr::memchr_iter(b'\n', bytes)
            .nth(line - 2)
            .map(|i| i + 1)
    };
    let end = line_start.map_or(bytes.len(), |s| (s + column).min(bytes.len()));
    let mut stack: Vec<Frame> = Vec::new();
    let mut i = 0;
    while i < end {
        match bytes[i] {
            b'{' => stack.push(Frame::Object {
                key: None,
                want_key: true,
            }),
            b'[' => stack.push(Frame::Array { index: 0 }),
            b'}' | b']' => {
                // An error raised inside an object or array without a position of its own (this
                // module's messages, untagged enums) gets the position after its closing
                // bracket: the value that failed is then the last one of the closed level.
                let closed = stack.pop();
                if i + 1 == end {
                    stack.extend(closed);
                }
            }
            b',' => match stack.last_mut() {
                Some(Frame::Object { key, want_key }) => {
                    *key = None;
                    *want_key = true;
                }
                Some(Frame::Array { index }) => *index += 1,
                None => {}
            },
            b'"' => {
                let start = i + 1;
                i = start;
                while i < end && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                if let Some(Frame::Object {
                    key,
                    want_key: want @ true,
                }) = stack.last_mut()
                {
                    let name = &bytes[start..i.min(end)];
                    *key = Some(field(name).unwrap_or("?"));
                    *want = false;
                }
            }
            _ => {}
        }
        i += 1;
    }
    let mut path = String::new();
    for frame in &stack {
        match frame {
            Frame::Object { key: Some(k), .. } => {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(k);
            }
            Frame::Object { key: None, .. } => {}
            Frame::Array { index } => {
                use std::fmt::Write as _;
                let _ = write!(path, "[{index}]");
            }
        }
    }
    if path.is_empty() {
        return "body".to_string();
    }
    match path.char_indices().rev().nth(PATH_LIMIT) {
        Some((i, _)) => format!("…{}", &path[i..]),
        None => path,
    }
}

#[cfg(test)]
mod tests;
