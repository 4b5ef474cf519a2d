//! The error envelope in a tool's result body.
//!
//! A tool that answers the model with an envelope (`{"error": {"code": …, "class": …,
//! "retryable": …, "retry_after_ms": …, "reference": …}}`, as toolspan's Python SDK does) or
//! with a `ToolResult` (`{"status": "invalid_args", …}`) says what went wrong in the result it
//! returns, whether or not its instrumentation also set `toolspan.error.*`. The span's own
//! attributes win; the body fills only what they left empty.
//!
//! Only bodies that can hold an envelope are parsed: a JSON object of at most
//! [`MAX_BODY`] bytes that mentions `"error"` or `"status"`. Values are borrowed from the
//! request; a value with JSON escapes is skipped (codes, classes and references have none).

use serde::de::IgnoredAny;
use serde::Deserialize;

/// Larger bodies are not parsed for an envelope (an envelope is a few hundred bytes; a large
/// body is a payload).
pub const MAX_BODY: usize = 64 * 1024;

/// The envelope fields found in a body.
#[derive(Debug, Default, PartialEq)]
pub struct BodyEnvelope<'a> {
    pub code: Option<&'a str>,
    pub class: Option<&'a str>,
    pub retryable: Option<bool>,
    pub retry_after_ms: Option<i64>,
    pub reference: Option<&'a str>,
}

#[derive(Deserialize)]
struct Body<'a> {
    #[serde(borrow, default)]
    error: Option<Either<Envelope<'a>>>,
    #[serde(borrow, default)]
    status: Option<Either<&'a str>>,
}

/// A field whose value may not have the expected shape (`"error": "not found"`, `"status":
/// 200`): the other shape is ignored instead of failing the whole body.
#[derive(Deserialize)]
#[serde(untagged)]
enum Either<T> {
    Expected(T),
    Other(IgnoredAny),
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    code: Option<Either<&'a str>>,
    #[serde(borrow, default, rename = "class")]
    class: Option<Either<&'a str>>,
    #[serde(default)]
    retryable: Option<Either<bool>>,
    #[serde(default)]
    retry_after_ms: Option<Either<i64>>,
    #[serde(borrow, default)]
    reference: Option<Either<&'a str>>,
}

fn take<T>(v: Option<Either<T>>) -> Option<T> {
    match v {
        Some(Either::Expected(t)) => Some(t),
        _ => None,
    }
}

fn non_empty(s: Option<&str>) -> Option<&str> {
    s.filter(|s| !s.is_empty())
}

/// The envelope in `body`, if it holds one.
pub fn envelope(body: &str) -> Option<BodyEnvelope<'_>> {
    let trimmed = body.trim_start();
    if body.len() > MAX_BODY || !trimmed.starts_with('{') {
        return None;
    }
    let bytes = body.as_bytes();
    if memchr::memmem::find(bytes, b"\"error\"").is_none()
        && memchr::memmem::find(bytes, b"\"status\"").is_none()
    {
        return None;
    }
    let parsed: Body<'_> = serde_json::from_str(body).ok()?;
    let status =
        take(parsed.status).filter(|s| matches!(*s, "invalid_args" | "tool_error" | "timeout"));
    let mut out = match take(parsed.error) {
        Some(e) => BodyEnvelope {
            code: non_empty(take(e.code)),
            class: non_empty(take(e.class)),
            retryable: take(e.retryable),
            retry_after_ms: take(e.retry_after_ms),
            reference: non_empty(take(e.reference)),
        },
        None => BodyEnvelope::default(),
    };
    // A ToolResult's status names the failure when its envelope has no code; its arguments
    // failing validation is an invalid request whatever else it says.
    if let Some(status) = status {
        out.code = out.code.or(Some(status));
        if status == "invalid_args" {
            out.class = out.class.or(Some("invalid_request"));
        }
    }
    (out != BodyEnvelope::default()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_envelope_in_the_body_fills_the_fields() {
        let e = envelope(
            r#"{"error": {"code": "invalid_status", "class": "invalid_request", "message": "status must be \"open\"",
                "retryable": false, "retry_after_ms": null, "reference": "err_7c1f9a", "field": "status",
                "received": "opn", "permitted": ["open", "closed"]}}"#,
        )
        .unwrap();
        assert_eq!(e.code, Some("invalid_status"));
        assert_eq!(e.class, Some("invalid_request"));
        assert_eq!(e.retryable, Some(false));
        assert_eq!(e.retry_after_ms, None);
        assert_eq!(e.reference, Some("err_7c1f9a"));
    }

    #[test]
    fn a_tool_result_status_names_the_failure() {
        let e =
            envelope(r#"{"status": "invalid_args", "message": "limit must be positive"}"#).unwrap();
        assert_eq!(e.code, Some("invalid_args"));
        assert_eq!(e.class, Some("invalid_request"));
        let e = envelope(
            r#"{"status": "timeout", "error": {"code": "upstream_timeout", "class": "transient", "retryable": true, "retry_after_ms": 500}}"#,
        )
        .unwrap();
        assert_eq!(e.code, Some("upstream_timeout"));
        assert_eq!(e.retry_after_ms, Some(500));
        assert_eq!(e.retryable, Some(true));
    }

    #[test]
    fn bodies_without_an_envelope_give_nothing() {
        for body in [
            r#"{"results": [{"title": "Rotating API keys"}]}"#,
            r#"{"status": 200, "content_type": "text/html", "text": "<h1>Guide</h1>"}"#,
            r#"{"ok": true, "ticket": {"status": "pending", "updated": true}}"#,
            r#"{"status": "ok", "value": 3}"#,
            r#"{"error": "not found"}"#,
            r#"{"error": null}"#,
            r#"{"error": {"code": 17}}"#,
            r#"["error", "status"]"#,
            r#"{"error": {"code": "trunc"#,
            "Traceback (most recent call last):\n  File \"/app/tool.py\"",
            "",
        ] {
            assert_eq!(envelope(body), None, "{body}");
        }
    }

    #[test]
    fn large_or_escaped_values_are_skipped_not_misread() {
        let big = format!(
            r#"{{"error": {{"code": "x"}}, "pad": "{}"}}"#,
            "a".repeat(MAX_BODY)
        );
        assert_eq!(envelope(&big), None);
        let escaped =
            envelope(r#"{"error": {"code": "bad\u0020code", "class": "internal"}}"#).unwrap();
        assert_eq!(escaped.code, None);
        assert_eq!(escaped.class, Some("internal"));
    }
}
