//! What a tool's result body says about the call: its error envelope, and whether it failed.
//!
//! A tool that answers the model with an envelope (`{"error": {"code": …, "class": …,
//! "retryable": …, "retry_after_ms": …, "reference": …}}`, as toolspan's Python SDK does) or
//! with a `ToolResult` (`{"status": "invalid_args", …}`) says what went wrong in the result it
//! returns, whether or not its instrumentation also set `toolspan.error.*`. The span's own
//! attributes win; the body fills only what they left empty.
//!
//! The same body may be the only place a failure is recorded: some instrumentation sets the
//! tool span's status OK and the error only in the result. The top-level forms that mean
//! failure ([`read`], listed in docs/classification.md): `"error"` holding an object, a
//! non-empty string or `true`; `"isError": true` (MCP's `CallToolResult`) or `"is_error": true`
//! (Anthropic's `tool_result`); `"status"` of `"error"` or of a failing `ToolResult`
//! (`invalid_args`, `tool_error`, `timeout`). `"error": null`, `false` or `""`, `"isError":
//! false` and the word "error" inside a value are not failures; nested objects are not read.
//!
//! Only bodies that can hold one of these are parsed: a JSON object of at most [`MAX_BODY`]
//! bytes that mentions one of the keys. Codes, classes and references are borrowed from the
//! request (a value with JSON escapes is skipped: they have none); an error's text may have
//! escapes and is copied then.

use std::borrow::Cow;

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

/// A body that says the call failed.
#[derive(Debug, PartialEq)]
pub struct BodyFailure<'a> {
    /// The error's text, when the body has one (the envelope's or the result's `message`, an
    /// `"error"` string, the first text of an error result's `content`).
    pub message: Option<Cow<'a, str>>,
}

/// What a body says.
#[derive(Debug, Default, PartialEq)]
pub struct BodyRead<'a> {
    pub envelope: BodyEnvelope<'a>,
    pub failure: Option<BodyFailure<'a>>,
}

#[derive(Deserialize)]
struct Body<'a> {
    #[serde(borrow, default)]
    error: Option<ErrorField<'a>>,
    #[serde(borrow, default)]
    status: Option<Either<&'a str>>,
    #[serde(borrow, default)]
    message: Option<Either<Cow<'a, str>>>,
    #[serde(default, rename = "isError")]
    is_error_camel: Option<Either<bool>>,
    #[serde(default)]
    is_error: Option<Either<bool>>,
    /// LangChain's `message_to_dict` (`{"type": "tool", "data": {…}}`, as OpenInference records
    /// a tool's `ToolMessage`) and its serialisation (`{"lc": 1, "kwargs": {…}}`).
    #[serde(borrow, default)]
    data: Option<Either<Message<'a>>>,
    #[serde(borrow, default)]
    kwargs: Option<Either<Message<'a>>>,
    /// OpenLLMetry's wrapper around the serialisation: `{"output": {"lc": 1, "kwargs": {…}}}`.
    #[serde(borrow, default)]
    output: Option<Either<Wrapped<'a>>>,
}

/// A LangChain `ToolMessage`'s fields that say how the call ended.
#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow, default)]
    status: Option<Either<&'a str>>,
}

#[derive(Deserialize)]
struct Wrapped<'a> {
    #[serde(borrow, default)]
    kwargs: Option<Either<Message<'a>>>,
}

impl Body<'_> {
    /// Whether the body is a LangChain `ToolMessage` with `status: "error"`.
    fn tool_message_failed(&self) -> bool {
        let failed = |m: &Option<Either<Message<'_>>>| {
            matches!(
                m,
                Some(Either::Expected(Message {
                    status: Some(Either::Expected("error"))
                }))
            )
        };
        failed(&self.data)
            || failed(&self.kwargs)
            || matches!(&self.output, Some(Either::Expected(w)) if failed(&w.kwargs))
    }
}

/// The `content` of a LangChain `ToolMessage` under its wrapper, read like [`ErrorContent`].
#[derive(Deserialize)]
struct WrappedContent<'a> {
    #[serde(borrow, default)]
    data: Option<ErrorContent<'a>>,
    #[serde(borrow, default)]
    kwargs: Option<ErrorContent<'a>>,
    #[serde(borrow, default)]
    output: Option<WrappedKwargs<'a>>,
}

#[derive(Deserialize)]
struct WrappedKwargs<'a> {
    #[serde(borrow, default)]
    kwargs: Option<ErrorContent<'a>>,
}

/// An error result's `content`, read only once the body is known to say it failed: a text,
/// or a list of parts (MCP's `[{"type": "text", "text": …}]`).
#[derive(Deserialize)]
struct ErrorContent<'a> {
    #[serde(borrow, default)]
    content: Option<ContentField<'a>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ContentField<'a> {
    Text(#[serde(borrow)] Cow<'a, str>),
    Parts(#[serde(borrow)] Vec<Part<'a>>),
    Other(IgnoredAny),
}

#[derive(Deserialize)]
struct Part<'a> {
    #[serde(borrow, default)]
    text: Option<Either<Cow<'a, str>>>,
}

/// A field whose value may not have the expected shape (`"error": "not found"`, `"status":
/// 200`): the other shape is ignored instead of failing the whole body.
#[derive(Deserialize)]
#[serde(untagged)]
enum Either<T> {
    Expected(T),
    Other(IgnoredAny),
}

/// The `"error"` field: an envelope object, a text, a flag, or something else.
#[derive(Deserialize)]
#[serde(untagged)]
enum ErrorField<'a> {
    Envelope(#[serde(borrow)] Envelope<'a>),
    Text(#[serde(borrow)] Cow<'a, str>),
    Flag(bool),
    Other(IgnoredAny),
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    code: Option<Either<&'a str>>,
    #[serde(borrow, default, rename = "class")]
    class: Option<Either<&'a str>>,
    #[serde(borrow, default)]
    message: Option<Either<Cow<'a, str>>>,
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

fn non_empty_text(s: Option<Cow<'_, str>>) -> Option<Cow<'_, str>> {
    s.filter(|s| !s.trim().is_empty())
}

/// Whether `body` may hold an envelope or a failure: a JSON object within [`MAX_BODY`] that
/// mentions one of the keys read.
fn candidate(body: &str) -> bool {
    if body.len() > MAX_BODY || !body.trim_start().starts_with('{') {
        return false;
    }
    let bytes = body.as_bytes();
    [
        &b"\"error\""[..],
        b"\"status\"",
        b"\"isError\"",
        b"\"is_error\"",
    ]
    .iter()
    .any(|k| memchr::memmem::find(bytes, k).is_some())
}

/// What `body` says, if anything: its envelope fields and whether it says the call failed.
pub fn read(body: &str) -> Option<BodyRead<'_>> {
    if !candidate(body) {
        return None;
    }
    let parsed: Body<'_> = serde_json::from_str(body).ok()?;
    let tool_message_failed = parsed.tool_message_failed();
    let status = take(parsed.status);
    let tool_result_status =
        status.filter(|s| matches!(*s, "invalid_args" | "tool_error" | "timeout"));
    let top_message = non_empty_text(take(parsed.message));
    let mut out = BodyRead::default();
    let mut failure: Option<(&'static str, Option<Cow<'_, str>>)> = None;
    match parsed.error {
        Some(ErrorField::Envelope(e)) => {
            out.envelope = BodyEnvelope {
                code: non_empty(take(e.code)),
                class: non_empty(take(e.class)),
                retryable: take(e.retryable),
                retry_after_ms: take(e.retry_after_ms),
                reference: non_empty(take(e.reference)),
            };
            failure = Some(("error", non_empty_text(take(e.message))));
        }
        Some(ErrorField::Text(t)) if !t.trim().is_empty() => failure = Some(("error", Some(t))),
        Some(ErrorField::Flag(true)) => failure = Some(("error", None)),
        _ => {}
    }
    // A ToolResult's status names the failure when its envelope has no code; its arguments
    // failing validation is an invalid request whatever else it says.
    if let Some(status) = tool_result_status {
        out.envelope.code = out.envelope.code.or(Some(status));
        if status == "invalid_args" {
            out.envelope.class = out.envelope.class.or(Some("invalid_request"));
        }
    }
    if failure.is_none() {
        let flagged = if take(parsed.is_error_camel) == Some(true) {
            Some("isError")
        } else if take(parsed.is_error) == Some(true) {
            Some("is_error")
        } else {
            None
        };
        if let Some(form) = flagged {
            failure = Some((form, content_text(body)));
        } else if tool_result_status.is_some() || status == Some("error") {
            failure = Some(("status", None));
        } else if tool_message_failed {
            failure = Some(("status", wrapped_content_text(body)));
        }
    }
    out.failure = failure.map(|(form, message)| BodyFailure {
        message: message.or(top_message).or_else(|| match form {
            "error" | "status" => content_text(body),
            _ => None,
        }),
    });
    (out != BodyRead::default()).then_some(out)
}

/// The text of a failed LangChain `ToolMessage` under its wrapper.
fn wrapped_content_text(body: &str) -> Option<Cow<'_, str>> {
    let parsed: WrappedContent<'_> = serde_json::from_str(body).ok()?;
    let inner = parsed
        .data
        .or(parsed.kwargs)
        .or(parsed.output.and_then(|o| o.kwargs))?;
    content_of(inner)
}

fn content_of(parsed: ErrorContent<'_>) -> Option<Cow<'_, str>> {
    match parsed.content? {
        ContentField::Text(t) => non_empty_text(Some(t)),
        ContentField::Parts(parts) => parts.into_iter().find_map(|p| non_empty_text(take(p.text))),
        ContentField::Other(_) => None,
    }
}

/// `body` as a JSON document, for result rules' pointers: only an object or an array within
/// [`MAX_BODY`] (a larger body is a payload, not a verdict).
pub fn value(body: &str) -> Option<serde_json::Value> {
    let t = body.trim_start();
    if body.len() > MAX_BODY || !(t.starts_with('{') || t.starts_with('[')) {
        return None;
    }
    serde_json::from_str(body).ok()
}

/// The first text of an error result's `content` (a second, rare parse: only bodies that say
/// they failed and have no other text are read again).
fn content_text(body: &str) -> Option<Cow<'_, str>> {
    content_of(serde_json::from_str(body).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(body: &str) -> Option<BodyEnvelope<'_>> {
        read(body)
            .map(|r| r.envelope)
            .filter(|e| *e != BodyEnvelope::default())
    }

    /// Whether `body` says the call failed, and the error's text.
    fn failure(body: &str) -> Option<Option<String>> {
        read(body)
            .and_then(|r| r.failure)
            .map(|f| f.message.map(|m| m.into_owned()))
    }

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
    fn every_recognised_form_says_the_call_failed() {
        let cases = [
            (
                r#"{"error": {"code": "invalid_status", "class": "invalid_request", "message": "status must be \"open\""}}"#,
                ("error", Some("status must be \"open\"")),
            ),
            (
                r#"{"error": "connection refused by search.internal"}"#,
                ("error", Some("connection refused by search.internal")),
            ),
            (r#"{"error": true, "detail": "x"}"#, ("error", None)),
            (
                r#"{"content": [{"type": "text", "text": "Error executing tool search_docs: 1 validation error for search_docsArguments"}], "isError": true}"#,
                (
                    "isError",
                    Some("Error executing tool search_docs: 1 validation error for search_docsArguments"),
                ),
            ),
            (
                r#"{"type": "tool_result", "tool_use_id": "t1", "content": "upstream timed out", "is_error": true}"#,
                ("is_error", Some("upstream timed out")),
            ),
            (
                r#"{"status": "error", "message": "the index is rebuilding"}"#,
                ("status", Some("the index is rebuilding")),
            ),
            (
                r#"{"status": "invalid_args", "message": "limit must be positive"}"#,
                ("status", Some("limit must be positive")),
            ),
            (r#"{"status": "timeout"}"#, ("status", None)),
            (
                r#"{"type": "tool", "data": {"content": "Expecting value: line 1 column 1 (char 0)", "type": "tool", "status": "error", "tool_call_id": "c1"}}"#,
                ("status", Some("Expecting value: line 1 column 1 (char 0)")),
            ),
            (
                r#"{"output": {"lc": 1, "type": "constructor", "id": ["langchain", "schema", "messages", "ToolMessage"], "kwargs": {"content": "boom", "status": "error"}}}"#,
                ("status", Some("boom")),
            ),
        ];
        for (body, (_form, message)) in cases {
            assert_eq!(failure(body), Some(message.map(String::from)), "{body}");
        }
    }

    #[test]
    fn successes_that_mention_errors_stay_successes() {
        for body in [
            r#"{"results": [{"title": "error codes"}]}"#,
            r#"{"results": [{"error": "stale", "status": "error"}]}"#,
            r#"{"error": null, "hits": ["a"]}"#,
            r#"{"error": false}"#,
            r#"{"error": ""}"#,
            r#"{"isError": false, "content": [{"type": "text", "text": "error codes: E1, E2"}]}"#,
            r#"{"is_error": false, "content": "ok"}"#,
            r#"{"status": "ok", "error": null}"#,
            r#"{"status": "success"}"#,
            r#"{"status": 500}"#,
            r#"{"message": "error"}"#,
            r#"{"type": "tool", "data": {"content": ["Install guide"], "type": "tool", "status": "success"}}"#,
            r#"{"output": {"lc": 1, "kwargs": {"content": ["x"], "status": "success"}}}"#,
            "error: nothing",
            r#""error""#,
        ] {
            assert_eq!(failure(body), None, "{body}");
        }
    }

    #[test]
    fn large_or_escaped_values_are_skipped_not_misread() {
        let big = format!(
            r#"{{"error": {{"code": "x"}}, "pad": "{}"}}"#,
            "a".repeat(MAX_BODY)
        );
        assert_eq!(read(&big), None);
        let escaped =
            envelope(r#"{"error": {"code": "bad\u0020code", "class": "internal"}}"#).unwrap();
        assert_eq!(escaped.code, None);
        assert_eq!(escaped.class, Some("internal"));
    }
}
