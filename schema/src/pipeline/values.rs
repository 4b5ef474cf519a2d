//! Reading OTLP attribute values and rendering them as JSON text.

use std::borrow::Cow;
use std::fmt::Write as _;

use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};

use crate::redact::{RedactionCounts, Redactor};

/// Longest string value kept inside `attributes`/`events` JSON.
pub const VALUE_LIMIT: usize = 2048;
/// Longest `attributes` JSON text per span.
pub const ATTRIBUTES_LIMIT: usize = 32 * 1024;
/// Longest `events` JSON text per span.
pub const EVENTS_LIMIT: usize = 32 * 1024;
/// Deepest nesting of array/kvlist values rendered.
pub const DEPTH_LIMIT: usize = 8;

/// The value as a string slice when it is a string.
pub fn as_str(v: &Option<AnyValue>) -> Option<&str> {
    match v.as_ref()?.value.as_ref()? {
        Value::StringValue(s) => Some(s.as_str()),
        _ => None,
    }
}

/// The value as an integer (ints, whole doubles and numeric strings).
pub fn as_i64(v: &Option<AnyValue>) -> Option<i64> {
    match v.as_ref()?.value.as_ref()? {
        Value::IntValue(i) => Some(*i),
        Value::DoubleValue(d) if d.fract() == 0.0 && d.abs() < 9.0e18 => Some(*d as i64),
        Value::StringValue(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// The value as a boolean (bools and "true"/"false").
pub fn as_bool(v: &Option<AnyValue>) -> Option<bool> {
    match v.as_ref()?.value.as_ref()? {
        Value::BoolValue(b) => Some(*b),
        Value::StringValue(s) if s.eq_ignore_ascii_case("true") => Some(true),
        Value::StringValue(s) if s.eq_ignore_ascii_case("false") => Some(false),
        Value::IntValue(i) => Some(*i != 0),
        _ => None,
    }
}

/// The value as text: strings borrowed, everything else rendered.
pub fn as_text(v: &Option<AnyValue>) -> Option<Cow<'_, str>> {
    match v.as_ref()?.value.as_ref()? {
        Value::StringValue(s) => Some(Cow::Borrowed(s.as_str())),
        Value::BoolValue(b) => Some(Cow::Owned(b.to_string())),
        Value::IntValue(i) => Some(Cow::Owned(i.to_string())),
        Value::DoubleValue(d) => Some(Cow::Owned(d.to_string())),
        Value::BytesValue(b) => Some(Cow::Owned(hex::encode(b))),
        Value::StringValueStrindex(_) => None,
        other @ (Value::ArrayValue(_) | Value::KvlistValue(_)) => {
            let mut out = String::new();
            // Rendered for rule matching only; redacting it too costs nothing that matters.
            static REDACTOR: std::sync::LazyLock<Redactor> = std::sync::LazyLock::new(Redactor::builtin);
            write_value(&mut out, other, 0, &REDACTOR, &mut RedactionCounts::default());
            Some(Cow::Owned(out))
        }
    }
}

/// Cuts `s` to at most `limit` bytes on a character boundary.
pub fn cut(s: &str, limit: usize) -> &str {
    if s.len() <= limit {
        return s;
    }
    let mut end = limit;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Appends `s` as a JSON string literal.
pub fn write_json_str(out: &mut String, s: &str) {
    out.push('"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let esc: Option<&str> = match b {
            b'"' => Some("\\\""),
            b'\\' => Some("\\\\"),
            b'\n' => Some("\\n"),
            b'\r' => Some("\\r"),
            b'\t' => Some("\\t"),
            0..=0x1f => None,
            _ => continue,
        };
        out.push_str(&s[start..i]);
        match esc {
            Some(e) => out.push_str(e),
            None => {
                let _ = write!(out, "\\u{:04x}", b);
            }
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

/// Appends a redacted, bounded string value.
pub fn write_text(out: &mut String, s: &str, redactor: &Redactor, counts: &mut RedactionCounts) {
    let red = redactor.redact(s, counts);
    let kept = cut(&red, VALUE_LIMIT);
    if kept.len() < red.len() {
        let mut t = String::with_capacity(kept.len() + 32);
        t.push_str(kept);
        let _ = write!(t, "…[{} bytes]", red.len());
        write_json_str(out, &t);
    } else {
        write_json_str(out, kept);
    }
}

/// Appends a value as JSON, redacting strings and bounding depth.
pub fn write_value(out: &mut String, v: &Value, depth: usize, redactor: &Redactor, counts: &mut RedactionCounts) {
    match v {
        Value::StringValue(s) => write_text(out, s, redactor, counts),
        Value::BoolValue(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::IntValue(i) => {
            let _ = write!(out, "{i}");
        }
        Value::DoubleValue(d) if d.is_finite() => {
            let _ = write!(out, "{d}");
        }
        Value::DoubleValue(_) => out.push_str("null"),
        Value::BytesValue(b) => {
            out.push('"');
            out.push_str(&hex::encode(cut_bytes(b, VALUE_LIMIT / 2)));
            out.push('"');
        }
        Value::StringValueStrindex(_) => out.push_str("null"),
        Value::ArrayValue(a) => {
            if depth >= DEPTH_LIMIT {
                out.push_str("\"[nested too deep]\"");
                return;
            }
            out.push('[');
            for (i, item) in a.values.iter().enumerate() {
                if out.len() > ATTRIBUTES_LIMIT {
                    out.push_str("\"…\"");
                    break;
                }
                if i > 0 {
                    out.push(',');
                }
                match &item.value {
                    Some(v) => write_value(out, v, depth + 1, redactor, counts),
                    None => out.push_str("null"),
                }
            }
            out.push(']');
        }
        Value::KvlistValue(kv) => {
            if depth >= DEPTH_LIMIT {
                out.push_str("\"[nested too deep]\"");
                return;
            }
            write_object(out, kv.values.iter(), depth + 1, redactor, counts, ATTRIBUTES_LIMIT);
        }
    }
}

fn cut_bytes(b: &[u8], n: usize) -> &[u8] {
    &b[..b.len().min(n)]
}

/// Appends `{"key": value, ...}` for the given pairs, stopping (with a count of what was left
/// out) once the text passes `limit` bytes.
pub fn write_object<'a>(
    out: &mut String,
    pairs: impl Iterator<Item = &'a KeyValue>,
    depth: usize,
    redactor: &Redactor,
    counts: &mut RedactionCounts,
    limit: usize,
) {
    let start = out.len();
    out.push('{');
    let mut first = true;
    let mut dropped = 0u64;
    for kv in pairs {
        if out.len() - start > limit {
            dropped += 1;
            continue;
        }
        if !first {
            out.push(',');
        }
        first = false;
        write_text(out, &kv.key, redactor, counts);
        out.push(':');
        match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
            Some(v) => write_value(out, v, depth, redactor, counts),
            None => out.push_str("null"),
        }
    }
    if dropped > 0 {
        if !first {
            out.push(',');
        }
        let _ = write!(out, "\"toolspan.dropped_attributes\":{dropped}");
    }
    out.push('}');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_escaping_is_valid() {
        let mut out = String::new();
        write_json_str(&mut out, "a\"b\\c\nd\u{1}é");
        let back: String = serde_json::from_str(&out).unwrap();
        assert_eq!(back, "a\"b\\c\nd\u{1}é");
    }

    #[test]
    fn cut_respects_char_boundaries() {
        assert_eq!(cut("ééé", 3), "é");
        assert_eq!(cut("abc", 10), "abc");
    }
}
