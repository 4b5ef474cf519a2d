//! Reading OTLP attribute values and rendering them as JSON text.

use std::borrow::Cow;
use std::fmt::Write as _;

use crate::otlp::view::{Kv, Val};
use crate::redact::{sensitive_key, RedactionCounts, Redactor, SecretKind};

/// Longest string value kept inside `attributes`/`events` JSON.
pub const VALUE_LIMIT: usize = 2048;
/// Longest `attributes` JSON text per span.
pub const ATTRIBUTES_LIMIT: usize = 32 * 1024;
/// Longest `events` JSON text per span.
pub const EVENTS_LIMIT: usize = 32 * 1024;
/// Deepest nesting of array/kvlist values rendered.
pub const DEPTH_LIMIT: usize = 8;

/// The value as a string slice when it is a string.
pub fn as_str(v: Option<Val<'_>>) -> Option<&str> {
    match v? {
        Val::Str(s) => Some(s),
        _ => None,
    }
}

/// The value as an integer (ints, whole doubles and numeric strings).
pub fn as_i64(v: Option<Val<'_>>) -> Option<i64> {
    match v? {
        Val::Int(i) => Some(i),
        Val::Double(d) if d.fract() == 0.0 && d.abs() < 9.0e18 => Some(d as i64),
        Val::Str(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// The value as a boolean (bools and "true"/"false").
pub fn as_bool(v: Option<Val<'_>>) -> Option<bool> {
    match v? {
        Val::Bool(b) => Some(b),
        Val::Str(s) if s.eq_ignore_ascii_case("true") => Some(true),
        Val::Str(s) if s.eq_ignore_ascii_case("false") => Some(false),
        Val::Int(i) => Some(i != 0),
        _ => None,
    }
}

/// The value as text, for rule matching: strings borrowed, everything else rendered (bytes as
/// hex, arrays and key-value lists as redacted JSON).
pub fn as_text(v: Option<Val<'_>>) -> Option<Cow<'_, str>> {
    match v? {
        Val::Str(s) => Some(Cow::Borrowed(s)),
        Val::Bool(b) => Some(Cow::Owned(b.to_string())),
        Val::Int(i) => Some(Cow::Owned(i.to_string())),
        Val::Double(d) => Some(Cow::Owned(d.to_string())),
        Val::Bytes(b) => Some(Cow::Owned(hex::encode(b))),
        Val::Strindex => None,
        other @ (Val::Array(_) | Val::Kvlist(_)) => {
            let mut out = String::new();
            // Rendered for rule matching only; redacting it too costs nothing that matters.
            static REDACTOR: std::sync::LazyLock<Redactor> =
                std::sync::LazyLock::new(Redactor::builtin);
            write_value(
                &mut out,
                other,
                0,
                &REDACTOR,
                &mut RedactionCounts::default(),
            );
            Some(Cow::Owned(out))
        }
    }
}

/// A payload value (`gen_ai.tool.call.arguments`, `input.value`, ...) as the text the payload
/// columns redact, hash and cut: strings borrowed; bytes as the hex of their redacted bytes
/// ([`Redactor::redact_bytes`]); arrays and key-value lists as JSON with their values redacted
/// ([`write_value`]); `None` for a string-table index. Redactions made here are counted in
/// `counts`; redacting the returned text again finds nothing more to count in them.
pub fn payload_text<'a>(
    v: Val<'a>,
    redactor: &Redactor,
    counts: &mut RedactionCounts,
) -> Option<Cow<'a, str>> {
    match v {
        Val::Str(s) => Some(Cow::Borrowed(s)),
        Val::Bytes(b) => Some(Cow::Owned(hex::encode(redactor.redact_bytes(b, counts)))),
        Val::Strindex => None,
        Val::Bool(_) | Val::Int(_) | Val::Double(_) => as_text(Some(v)),
        Val::Array(_) | Val::Kvlist(_) => {
            let mut out = String::new();
            write_value(&mut out, v, 0, redactor, counts);
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
///
/// Bytes are written as the hex of their redacted bytes ([`Redactor::redact_bytes`]), at most
/// `VALUE_LIMIT / 2` of them: hex keeps one representation for every bytes value, and a
/// secret inside one is replaced before it is encoded, so the hex never decodes to it.
pub fn write_value(
    out: &mut String,
    v: Val<'_>,
    depth: usize,
    redactor: &Redactor,
    counts: &mut RedactionCounts,
) {
    write_value_as(out, v, depth, redactor, counts, None);
}

/// [`write_value`]; with `keyed`, the value sits under a key that names a secret of that kind
/// (at any depth above it), and every string, bytes and number in it becomes a placeholder.
fn write_value_as(
    out: &mut String,
    v: Val<'_>,
    depth: usize,
    redactor: &Redactor,
    counts: &mut RedactionCounts,
    keyed: Option<SecretKind>,
) {
    if let Some(kind) = keyed {
        // Numbers can be PINs and one-time codes; a boolean or an empty value holds nothing.
        if matches!(v, Val::Int(_) | Val::Double(_)) || matches!(v, Val::Bytes(b) if !b.is_empty())
        {
            counts.add(kind, 1);
            write_json_str(out, kind.placeholder());
            return;
        }
    }
    match v {
        Val::Str(s) => match keyed {
            Some(kind) => write_text(
                out,
                &redactor.redact_keyed(kind, s, counts),
                redactor,
                counts,
            ),
            None => write_text(out, s, redactor, counts),
        },
        Val::Bool(b) => out.push_str(if b { "true" } else { "false" }),
        Val::Int(i) => {
            let _ = write!(out, "{i}");
        }
        Val::Double(d) if d.is_finite() => {
            let _ = write!(out, "{d}");
        }
        Val::Double(_) => out.push_str("null"),
        Val::Bytes(b) => {
            let red = redactor.redact_bytes(b, counts);
            out.push('"');
            out.push_str(&hex::encode(cut_bytes(&red, VALUE_LIMIT / 2)));
            out.push('"');
        }
        Val::Strindex => out.push_str("null"),
        Val::Array(a) => {
            if depth >= DEPTH_LIMIT {
                out.push_str("\"[nested too deep]\"");
                return;
            }
            out.push('[');
            let mut i = 0;
            a.for_each(|item| {
                if out.len() > ATTRIBUTES_LIMIT {
                    out.push_str("\"…\"");
                    return false;
                }
                if i > 0 {
                    out.push(',');
                }
                i += 1;
                match item {
                    Some(v) => write_value_as(out, v, depth + 1, redactor, counts, keyed),
                    None => out.push_str("null"),
                }
                true
            });
            out.push(']');
        }
        Val::Kvlist(kv) => {
            if depth >= DEPTH_LIMIT {
                out.push_str("\"[nested too deep]\"");
                return;
            }
            let mut pairs = Vec::new();
            kv.for_each(|p| pairs.push(p));
            write_object_as(
                out,
                pairs.into_iter(),
                depth + 1,
                redactor,
                counts,
                ATTRIBUTES_LIMIT,
                keyed,
            );
        }
    }
}

fn cut_bytes(b: &[u8], n: usize) -> &[u8] {
    &b[..b.len().min(n)]
}

/// Appends `{"key": value, ...}` for the given pairs, stopping (with a count of what was left
/// out) once the text passes `limit` bytes. The value of a key that names a secret
/// ([`sensitive_key`]) is redacted whole, nested values included.
pub fn write_object<'a>(
    out: &mut String,
    pairs: impl Iterator<Item = Kv<'a>>,
    depth: usize,
    redactor: &Redactor,
    counts: &mut RedactionCounts,
    limit: usize,
) {
    write_object_as(out, pairs, depth, redactor, counts, limit, None);
}

/// [`write_object`] inside a value whose key named a secret (`keyed`), or at the top.
fn write_object_as<'a>(
    out: &mut String,
    pairs: impl Iterator<Item = Kv<'a>>,
    depth: usize,
    redactor: &Redactor,
    counts: &mut RedactionCounts,
    limit: usize,
    keyed: Option<SecretKind>,
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
        write_text(out, kv.key, redactor, counts);
        out.push(':');
        match kv.value {
            Some(v) => write_value_as(
                out,
                v,
                depth,
                redactor,
                counts,
                keyed.or_else(|| sensitive_key(kv.key)),
            ),
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
