//! The failure model: what a failing stage of each tool returns (its envelope, message,
//! exception and HTTP status), the stack traces leaking tools hand to the model, and the
//! envelope attributes a mapped failure puts on its spans.
//!
//! A failure tells one story with the rest of its trace: a rejected argument is one the call
//! really sent ([`invalid_arguments`]), and a stage that timed out lasted as long as its
//! message says ([`Failure::takes_ms`]).

use opentelemetry_proto::tonic::common::v1::KeyValue;

use crate::otlp::{b, i, s};

/// One failure: the envelope the tool returns and what the span records.
pub(super) struct Failure {
    pub(super) code: &'static str,
    pub(super) class: &'static str,
    pub(super) retryable: bool,
    pub(super) message: String,
    pub(super) exception: &'static str,
    pub(super) http: Option<i64>,
    pub(super) retry_after_ms: Option<i64>,
    /// A timeout: the failing stage lasts this long, as its message says.
    pub(super) takes_ms: Option<u64>,
}

/// The prepare failures that reject the model's arguments (the others are the tool's own).
const ARGUMENT_CODES: [&str; 3] = ["invalid_status", "invalid_arguments", "missing_argument"];

/// The arguments a rejected call sent, such that they fail as `f` says; `None` when `f` does
/// not reject the arguments.
pub(super) fn invalid_arguments(tool: usize, f: &Failure, ticket: u32) -> Option<String> {
    if !ARGUMENT_CODES.contains(&f.code) {
        return None;
    }
    Some(match tool {
        0 => "{\"limit\":5}".to_string(),
        1 => format!("{{\"ticket_id\":\"T-{ticket}\",\"status\":\"done\"}}"),
        2 => "{\"timeout_s\":10}".to_string(),
        _ => "{\"sql\":\"SELECT id, status FROM tickets\",\"limit\":5000}".to_string(),
    })
}

/// The argument a tool cannot do without, named by its missing-argument failure.
fn required_argument(tool: usize) -> &'static str {
    if tool == 2 {
        "url"
    } else {
        "query"
    }
}

pub(super) fn failure(stage: usize, tool: usize, r: f64) -> Failure {
    let f = |code, class, retryable, message: &str, exception, http: Option<i64>| Failure {
        code,
        class,
        retryable,
        message: message.to_string(),
        exception,
        http,
        retry_after_ms: None,
        takes_ms: None,
    };
    match stage {
        0 => match tool {
            1 => f(
                "invalid_status",
                "invalid_request",
                false,
                "argument 'status' must be one of open, pending, closed; got 'done'",
                "ValueError",
                None,
            ),
            3 => f(
                "invalid_arguments",
                "invalid_request",
                false,
                "argument 'limit' must be an integer between 1 and 1000; got 5000",
                "TypeError",
                None,
            ),
            _ if r < 0.5 => f(
                "missing_argument",
                "invalid_request",
                false,
                &format!("required argument '{}' is missing", required_argument(tool)),
                "KeyError",
                None,
            ),
            _ => f(
                "internal_error",
                "internal",
                false,
                "argument template failed to render",
                "TemplateError",
                None,
            ),
        },
        1 => {
            if r < 0.5 {
                let mut x = f(
                    "connection_timeout",
                    "transient",
                    true,
                    "connect timeout after 1000 ms",
                    "ConnectTimeout",
                    None,
                );
                x.takes_ms = Some(1000);
                x
            } else if r < 0.8 {
                f(
                    "connection_refused",
                    "transient",
                    true,
                    "connection refused",
                    "ConnectionRefusedError",
                    None,
                )
            } else {
                f(
                    "dns_failure",
                    "transient",
                    true,
                    "name or service not known",
                    "socket.gaierror",
                    None,
                )
            }
        }
        2 => {
            if r < 0.3 {
                f(
                    "upstream_500",
                    "transient",
                    true,
                    "upstream returned 500 Internal Server Error",
                    "HTTPError",
                    Some(500),
                )
            } else if r < 0.5 {
                let mut x = f(
                    "rate_limited",
                    "transient",
                    true,
                    "rate limited by upstream",
                    "HTTPError",
                    Some(429),
                );
                x.retry_after_ms = Some(1000);
                x
            } else if r < 0.65 {
                let mut x = f(
                    "timeout",
                    "transient",
                    true,
                    "tool did not answer within 5 s",
                    "TimeoutError",
                    Some(504),
                );
                x.takes_ms = Some(5000);
                x
            } else if r < 0.8 {
                f(
                    "not_found",
                    "not_found",
                    false,
                    "the requested record does not exist",
                    "NotFound",
                    Some(404),
                )
            } else if r < 0.9 {
                f(
                    "conflict",
                    "conflict",
                    false,
                    "the record was changed by someone else",
                    "Conflict",
                    Some(409),
                )
            } else {
                f(
                    "",
                    "internal",
                    false,
                    "unexpected error",
                    "RuntimeError",
                    Some(500),
                )
            }
        }
        _ => {
            if r < 0.7 {
                f(
                    "invalid_json",
                    "invalid_request",
                    false,
                    "expecting value: line 1 column 1 (char 0)",
                    "JSONDecodeError",
                    None,
                )
            } else {
                f(
                    "schema_mismatch",
                    "invalid_request",
                    false,
                    "field 'results' missing from the answer",
                    "ValidationError",
                    None,
                )
            }
        }
    }
}

/// The field of a docs answer's hits that `search_docs`'s parse stage reads (the docs
/// service renames it to [`RENAMED_FIELD`] when told to).
pub(super) const DOCS_FIELD: &str = "url";
/// What the docs service calls [`DOCS_FIELD`] after the rename.
pub(super) const RENAMED_FIELD: &str = "link";

/// The docs service's raw answer to `search_docs`, as its send stage records it: hits with a
/// title and [`DOCS_FIELD`], or [`RENAMED_FIELD`] after the rename.
pub(super) fn docs_answer(renamed: bool) -> String {
    let field = if renamed { RENAMED_FIELD } else { DOCS_FIELD };
    format!(
        "{{\"hits\":[{{\"title\":\"Rotating API keys\",\"{field}\":\"https://docs.example.com/keys\"}},{{\"title\":\"Key lifecycle\",\"{field}\":\"https://docs.example.com/lifecycle\"}}]}}"
    )
}

/// The parse failure of a docs answer without [`DOCS_FIELD`]: the envelope the example tools
/// package's `bad_answer` gives (`PARSE`, `bad_answer`, not retryable: the same answer comes
/// back).
pub(super) fn bad_answer() -> Failure {
    Failure {
        code: "bad_answer",
        class: "internal",
        retryable: false,
        message: format!(
            "the docs service answered without '{DOCS_FIELD}' in a hit; try again later"
        ),
        exception: "ToolError",
        http: None,
        retry_after_ms: None,
        takes_ms: None,
    }
}

pub(super) const LEAKS: [&str; 3] = [
    "Traceback (most recent call last):\n  File \"/srv/tools/run_sql/handler.py\", line 88, in run\n    cur.execute(sql)\npsycopg2.errors.UndefinedTable: relation \"tickets_v2\" does not exist\nLINE 1: SELECT id, status FROM tickets_v2 WHERE id = 42",
    "java.lang.IllegalStateException: ticket locked\n\tat com.acme.tickets.TicketService.update(TicketService.java:214)\n\tat com.acme.tickets.Api.handle(Api.java:77)",
    "Error: socket hang up\n    at connResetException (node:internal/errors:720:14)\n    at TLSSocket.socketOnEnd (/srv/proxy/node_modules/undici/lib/client.js:1234:23)",
];

pub(super) fn envelope_attrs(attrs: &mut Vec<KeyValue>, f: &Failure, reference: &str) {
    if !f.code.is_empty() {
        attrs.push(s("toolspan.error.code", f.code));
    }
    attrs.push(s("toolspan.error.class", f.class));
    attrs.push(b("toolspan.error.retryable", f.retryable));
    if let Some(ms) = f.retry_after_ms {
        attrs.push(i("toolspan.error.retry_after_ms", ms));
    }
    attrs.push(s("toolspan.error.reference", reference));
}
