//! The replay document of one call, built from the stored spans of its trace: what the call
//! was (tool, service, outcome, failing stage, attempts), its arguments and whether they are
//! exact, its recorded result and envelope, the recorded backend answers of its attempts, and
//! the model turn before it. Pure: no I/O, so unit tests drive it with spans made by hand.

use std::collections::HashMap;

use chrono::{DateTime, SecondsFormat};
use serde::Serialize;
use serde_json::Value;
use toolspan_schema::Stage;

use crate::rows::Span;

/// What ingest writes in place of a secret: `[REDACTED:kind]`.
pub const REDACTION_MARKER: &str = "[REDACTED:";

/// A stored span with whether each payload's stored text is the whole payload (its digest
/// equals the stored digest of the full payload; `None`: no digest to compare with).
#[derive(Debug, Clone, Default)]
pub struct Stored {
    /// The span.
    pub span: Span,
    /// `input` is the whole payload.
    pub input_whole: Option<bool>,
    /// `output` is the whole payload.
    pub output_whole: Option<bool>,
}

/// The original call, as the replay judges against it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CallInfo {
    /// Its trace.
    pub trace_id: String,
    /// Its span.
    pub span_id: String,
    /// `gen_ai.tool.call.id`.
    pub call_id: Option<String>,
    /// The error reference the model was given.
    pub reference: Option<String>,
    /// The tool.
    pub tool: String,
    /// `service.name`.
    pub service: Option<String>,
    /// `service.version`.
    pub service_version: Option<String>,
    /// RFC 3339, UTC, microseconds.
    pub start_time: String,
    /// `ok` or `error`.
    pub status: String,
    /// The call's error type.
    pub error_type: Option<String>,
    /// The envelope's code.
    pub error_code: Option<String>,
    /// The envelope's class.
    pub error_class: Option<String>,
    /// The tool stage that failed last (the last attempt's), when one did.
    pub stage: Option<String>,
    /// Attempts made.
    pub attempts: i64,
    /// The result (or an attempt's) leaked internals to the model.
    pub leaked_internals: bool,
}

/// Why stored arguments are not exactly what the model sent.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Inexact {
    /// JSON paths (`$.api_key`, `$.items[0].token`) of values redacted at ingest.
    pub redacted: Vec<String>,
    /// The stored text is shorter than the payload.
    pub truncated: bool,
    /// In words.
    pub reason: String,
}

/// One attempt's recorded backend answer: the send stage's result, else the parse stage's
/// input; `body` null when the attempt recorded none.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Recorded {
    /// 1-based.
    pub attempt: i64,
    /// `send` or `parse`: where the answer was recorded.
    pub stage: String,
    /// That stage's status, `ok` or `error`.
    pub status: String,
    /// The send stage's HTTP status, when recorded.
    pub http_status: Option<i64>,
    /// The answer.
    pub body: Option<String>,
    /// The body is the whole answer: nothing redacted or cut.
    pub exact: bool,
}

/// The model call before the tool call, in its trace.
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct Context {
    /// Its model.
    pub model: Option<String>,
    /// Its stored input (redacted, first 4 KiB).
    pub model_input: Option<String>,
    /// Its stored output.
    pub model_output: Option<String>,
}

/// What a replay needs of one call (a replay document's fields, and an eval case's).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Replayable {
    /// The original call.
    pub call: CallInfo,
    /// The arguments parsed (null when not recorded, cut short or not JSON).
    pub arguments: Option<Value>,
    /// The arguments as stored.
    pub arguments_text: Option<String>,
    /// Whether the stored arguments are exactly what the model sent.
    pub exact: bool,
    /// Why not, when not.
    pub inexact: Option<Inexact>,
    /// The result the model got, as stored.
    pub result: Option<String>,
    /// The error envelope in the result (`{"error": {...}}`'s object), when there is one.
    pub envelope: Option<Value>,
    /// The attempts' recorded backend answers, by attempt.
    pub recorded_responses: Vec<Recorded>,
}

/// A step of a JSON path.
#[derive(Debug, Clone, PartialEq)]
enum Step {
    Key(String),
    Index(usize),
}

/// A path as the SDK writes and reads it: `$`, `$.a.b`, `$.items[0]`, `$["odd key"]`.
fn format_path(path: &[Step]) -> String {
    let mut out = String::from("$");
    for step in path {
        match step {
            Step::Index(i) => out.push_str(&format!("[{i}]")),
            Step::Key(k) if is_ident(k) => {
                out.push('.');
                out.push_str(k);
            }
            Step::Key(k) => {
                out.push('[');
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(']');
            }
        }
    }
    out
}

fn is_ident(k: &str) -> bool {
    let mut chars = k.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// The paths of string values that carry a redaction marker, in document order (iterative:
/// arguments nest as deep as the model made them).
pub fn redacted_paths(v: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack: Vec<(&Value, Vec<Step>)> = vec![(v, Vec::new())];
    while let Some((v, path)) = stack.pop() {
        match v {
            Value::String(s) if s.contains(REDACTION_MARKER) => out.push(format_path(&path)),
            Value::Object(m) => {
                for (k, v) in m.iter().rev() {
                    let mut p = path.clone();
                    p.push(Step::Key(k.clone()));
                    stack.push((v, p));
                }
            }
            Value::Array(a) => {
                for (i, v) in a.iter().enumerate().rev() {
                    let mut p = path.clone();
                    p.push(Step::Index(i));
                    stack.push((v, p));
                }
            }
            _ => {}
        }
    }
    out
}

/// Whether stored arguments are exact, and if not why: not recorded, cut short (the stored
/// text is not the whole payload its digest was taken of), or with redacted values.
pub fn exactness(
    text: Option<&str>,
    whole: Option<bool>,
) -> (Option<Value>, bool, Option<Inexact>) {
    let Some(text) = text else {
        let why = Inexact {
            redacted: Vec::new(),
            truncated: false,
            reason: "the call's arguments were not recorded (the application records them with \
                     capture_payloads=True)"
                .into(),
        };
        return (None, false, Some(why));
    };
    if whole != Some(true) {
        let reason = if whole.is_none() {
            "no digest of the full arguments was stored to check the stored text against"
        } else {
            "the arguments were longer than the stored text (payloads keep their first 4 KiB)"
        };
        let why = Inexact {
            redacted: Vec::new(),
            truncated: whole == Some(false),
            reason: reason.into(),
        };
        return (None, false, Some(why));
    }
    let parsed: Option<Value> = serde_json::from_str(text).ok();
    let redacted = match &parsed {
        Some(v) => redacted_paths(v),
        None if text.contains(REDACTION_MARKER) => vec!["$".to_string()],
        None => Vec::new(),
    };
    if redacted.is_empty() {
        return (parsed, true, None);
    }
    let why = Inexact {
        reason: format!(
            "{} in the arguments {} redacted at ingest",
            if redacted.len() == 1 {
                "a secret"
            } else {
                "secrets"
            },
            if redacted.len() == 1 { "was" } else { "were" }
        ),
        redacted,
        truncated: false,
    };
    (parsed, false, Some(why))
}

/// Whether a stored payload is the whole of it and holds no redaction.
fn payload_exact(text: Option<&str>, whole: Option<bool>) -> bool {
    whole == Some(true) && text.is_some_and(|t| !t.contains(REDACTION_MARKER))
}

/// `ok` or `error` (a status left unset by the instrumentation did not fail).
fn status_word(s: &Span) -> String {
    if s.failed() { "error" } else { "ok" }.to_string()
}

/// RFC 3339 in UTC with microseconds (the table's timestamp precision).
pub fn rfc3339_micros(unix_nano: i64) -> String {
    DateTime::from_timestamp_nanos(unix_nano).to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// The error envelope in a result: the object under `error`, when the result is JSON of that
/// form.
pub fn envelope_of(result: Option<&str>) -> Option<Value> {
    let v: Value = serde_json::from_str(result?).ok()?;
    match v.get("error") {
        Some(e @ Value::Object(_)) => Some(e.clone()),
        _ => None,
    }
}

/// The spans of one trace, indexed for the walk from a call to its attempts and stages.
pub struct Trace<'a> {
    spans: &'a [Stored],
    children: HashMap<&'a str, Vec<usize>>,
}

impl<'a> Trace<'a> {
    /// Indexes `spans` (all of one trace).
    pub fn new(spans: &'a [Stored]) -> Trace<'a> {
        let mut children: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, s) in spans.iter().enumerate() {
            if let Some(p) = s.span.parent_span_id.as_deref() {
                children.entry(p).or_default().push(i);
            }
        }
        Trace { spans, children }
    }

    /// The span with id `span_id`.
    pub fn find(&self, span_id: &str) -> Option<&'a Stored> {
        self.spans.iter().find(|s| s.span.span_id == span_id)
    }

    /// The call a span belongs to: itself when it is a call, else the nearest call among its
    /// ancestors, else the call of the same `call_id`.
    pub fn call_of(&self, span_id: &str) -> Option<&'a Stored> {
        let by_id: HashMap<&str, &Stored> = self
            .spans
            .iter()
            .map(|s| (s.span.span_id.as_str(), s))
            .collect();
        let start = by_id.get(span_id).copied()?;
        let mut cur = Some(start);
        let mut steps = 0;
        while let Some(s) = cur {
            if s.span.stage == "call" {
                return Some(s);
            }
            steps += 1;
            if steps > self.spans.len() {
                break; // a cycle in a malformed trace
            }
            cur = s
                .span
                .parent_span_id
                .as_deref()
                .and_then(|p| by_id.get(p).copied());
        }
        let cid = start.span.call_id.as_deref()?;
        self.spans
            .iter()
            .find(|s| s.span.stage == "call" && s.span.call_id.as_deref() == Some(cid))
    }

    fn kids(&self, span_id: &str) -> impl Iterator<Item = &'a Stored> + '_ {
        self.children
            .get(span_id)
            .into_iter()
            .flatten()
            .map(|i| &self.spans[*i])
    }

    /// The call's attempts in order: its `attempt` children, or the attempts of its
    /// `call_id` in the trace.
    pub fn attempts(&self, call: &Span) -> Vec<&'a Stored> {
        let mut a: Vec<&Stored> = self
            .kids(&call.span_id)
            .filter(|s| s.span.stage == "attempt")
            .collect();
        if a.is_empty() {
            if let Some(cid) = call.call_id.as_deref() {
                a = self
                    .spans
                    .iter()
                    .filter(|s| s.span.stage == "attempt" && s.span.call_id.as_deref() == Some(cid))
                    .collect();
            }
        }
        a.sort_by_key(|s| (s.span.attempt.unwrap_or(0), s.span.start_unix_nano));
        a
    }

    /// The tool-stage spans of one attempt (or of the call, when it has no attempt spans),
    /// in start order.
    fn stages_under(&self, parent: &Span) -> Vec<&'a Stored> {
        let mut v: Vec<&Stored> = self
            .kids(&parent.span_id)
            .filter(|s| Stage::WORK_NAMES.contains(&s.span.stage.as_str()))
            .collect();
        v.sort_by_key(|s| s.span.start_unix_nano);
        v
    }

    /// The tool stage that failed last under the call (its last failing attempt's): by the
    /// span tree, else by `call_id` in the trace.
    pub fn failed_stage(&self, call: &Span) -> Option<&'a Stored> {
        let mut candidates: Vec<&Stored> = self.stages_under(call);
        for a in self.attempts(call) {
            candidates.extend(self.stages_under(&a.span));
        }
        if let Some(cid) = call.call_id.as_deref() {
            candidates.extend(self.spans.iter().filter(|s| {
                Stage::WORK_NAMES.contains(&s.span.stage.as_str())
                    && s.span.call_id.as_deref() == Some(cid)
            }));
        }
        candidates
            .into_iter()
            .filter(|s| s.span.failed())
            .max_by(|a, b| {
                (a.span.start_unix_nano, &a.span.span_id)
                    .cmp(&(b.span.start_unix_nano, &b.span.span_id))
            })
    }

    /// What the call's attempts recorded of their backend's answers.
    pub fn recorded(&self, call: &Span) -> Vec<Recorded> {
        let attempts = self.attempts(call);
        let holders: Vec<(i64, &Span)> = if attempts.is_empty() {
            vec![(1, call)]
        } else {
            attempts
                .iter()
                .enumerate()
                .map(|(i, a)| (a.span.attempt.unwrap_or(i as i64 + 1), &a.span))
                .collect()
        };
        let mut out = Vec::new();
        for (n, holder) in holders {
            let stages = self.stages_under(holder);
            let send = stages.iter().find(|s| s.span.stage == "send");
            let parse = stages.iter().find(|s| s.span.stage == "parse");
            let http_status = send.and_then(|s| s.span.http_status);
            if let Some(s) = send.filter(|s| s.span.output.is_some()) {
                out.push(Recorded {
                    attempt: n,
                    stage: "send".into(),
                    status: status_word(&s.span),
                    http_status,
                    body: s.span.output.clone(),
                    exact: payload_exact(s.span.output.as_deref(), s.output_whole),
                });
            } else if let Some(p) = parse.filter(|s| s.span.input.is_some()) {
                out.push(Recorded {
                    attempt: n,
                    stage: "parse".into(),
                    status: status_word(&p.span),
                    http_status,
                    body: p.span.input.clone(),
                    exact: payload_exact(p.span.input.as_deref(), p.input_whole),
                });
            } else if let Some(s) = send {
                out.push(Recorded {
                    attempt: n,
                    stage: "send".into(),
                    status: status_word(&s.span),
                    http_status,
                    body: None,
                    exact: true,
                });
            }
        }
        out
    }

    /// The last model call that started before the call did.
    pub fn context(&self, call: &Span) -> Context {
        self.spans
            .iter()
            .filter(|s| s.span.stage == "llm" && s.span.start_unix_nano < call.start_unix_nano)
            .max_by(|a, b| {
                (a.span.start_unix_nano, &a.span.span_id)
                    .cmp(&(b.span.start_unix_nano, &b.span.span_id))
            })
            .map(|s| Context {
                model: s.span.model.clone(),
                model_input: s.span.input.clone(),
                model_output: s.span.output.clone(),
            })
            .unwrap_or_default()
    }

    /// The replay fields of `call` (a span of this trace with stage `call`).
    pub fn replayable(&self, call: &Stored) -> Replayable {
        let c = &call.span;
        let attempts = self.attempts(c);
        let n = c
            .attempt
            .unwrap_or(1)
            .max(
                attempts
                    .iter()
                    .filter_map(|a| a.span.attempt)
                    .max()
                    .unwrap_or(0),
            )
            .max(attempts.len() as i64);
        let leaked = c.leaked_internals || attempts.iter().any(|a| a.span.leaked_internals);
        let stage = if c.failed() {
            self.failed_stage(c).map(|s| s.span.stage.clone())
        } else {
            None
        };
        let (arguments, exact, inexact) = exactness(c.input.as_deref(), call.input_whole);
        Replayable {
            call: CallInfo {
                trace_id: c.trace_id.clone(),
                span_id: c.span_id.clone(),
                call_id: c.call_id.clone(),
                reference: c.reference.clone(),
                tool: c.tool.clone().unwrap_or_default(),
                service: c.service.clone(),
                service_version: c.service_version.clone(),
                start_time: rfc3339_micros(c.start_unix_nano),
                status: status_word(c),
                error_type: c.error_type.clone(),
                error_code: c.error_code.clone(),
                error_class: c.error_class.clone(),
                stage,
                attempts: n,
                leaked_internals: leaked,
            },
            arguments,
            arguments_text: c.input.clone(),
            exact,
            inexact,
            result: c.output.clone(),
            envelope: envelope_of(c.output.as_deref()),
            recorded_responses: self.recorded(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(id: &str, parent: Option<&str>, stage: &str, start: i64) -> Stored {
        Stored {
            span: Span {
                trace_id: "t".repeat(32),
                span_id: id.into(),
                parent_span_id: parent.map(Into::into),
                stage: stage.into(),
                tool: Some("search_docs".into()),
                start_unix_nano: start,
                status: "unset".into(),
                ..Default::default()
            },
            input_whole: None,
            output_whole: None,
        }
    }

    #[test]
    fn exact_arguments_are_whole_and_unredacted() {
        let (args, exact, why) = exactness(Some(r#"{"query": "reset"}"#), Some(true));
        assert!(exact && why.is_none());
        assert_eq!(args, Some(serde_json::json!({"query": "reset"})));

        let text = r#"{"query":"x","auth":{"key":"[REDACTED:credential]"},"items":[{"odd key":"Bearer [REDACTED:jwt]"}]}"#;
        let (_, exact, why) = exactness(Some(text), Some(true));
        let why = why.expect("inexact");
        assert!(!exact && !why.truncated);
        assert_eq!(why.redacted, ["$.auth.key", "$.items[0][\"odd key\"]"]);

        let (args, exact, why) = exactness(Some(r#"{"query": "res"#), Some(false));
        assert!(!exact && args.is_none() && why.expect("cut").truncated);

        let (_, exact, why) = exactness(None, None);
        assert!(!exact && why.expect("absent").reason.contains("not recorded"));
    }

    #[test]
    fn a_call_knows_its_failed_stage_attempts_and_recorded_answers() {
        let mut call = span("c", Some("llm-parent"), "call", 100);
        call.span.status = "error".into();
        call.span.error_type = Some("PARSE".into());
        call.span.input = Some(r#"{"query":"q"}"#.into());
        call.input_whole = Some(true);
        call.span.attempt = Some(2);
        let mut llm = span("m", None, "llm", 10);
        llm.span.input = Some("user: find docs".into());
        let a1 = span("a1", Some("c"), "attempt", 110);
        let mut s1 = span("s1", Some("a1"), "send", 111);
        s1.span.output = Some(r#"{"hits":[]}"#.into());
        s1.output_whole = Some(true);
        s1.span.http_status = Some(200);
        let mut p1 = span("p1", Some("a1"), "parse", 112);
        p1.span.status = "error".into();
        let a2 = span("a2", Some("c"), "attempt", 120);
        let mut s2 = span("s2", Some("a2"), "send", 121);
        s2.span.status = "error".into();
        let mut p2 = span("p2", Some("a2"), "parse", 122);
        p2.span.input = Some("[REDACTED:jwt]".into());
        p2.input_whole = Some(true);
        let spans = vec![llm, call, a1, s1, p1, a2, s2, p2];
        let t = Trace::new(&spans);
        let r = t.replayable(&spans[1]);
        assert_eq!(
            r.call.stage.as_deref(),
            Some("send"),
            "the last failed stage"
        );
        assert_eq!(r.call.attempts, 2);
        assert!(r.exact);
        assert_eq!(r.recorded_responses.len(), 2);
        assert_eq!(
            r.recorded_responses[0].body.as_deref(),
            Some(r#"{"hits":[]}"#)
        );
        assert_eq!(r.recorded_responses[0].http_status, Some(200));
        assert!(r.recorded_responses[0].exact);
        assert_eq!(
            r.recorded_responses[1].stage, "parse",
            "what the parse stage read"
        );
        assert!(
            !r.recorded_responses[1].exact,
            "a redacted answer is not exact"
        );
        assert_eq!(
            t.context(&spans[1].span).model_input.as_deref(),
            Some("user: find docs")
        );
        assert_eq!(t.call_of("p2").map(|s| s.span.span_id.as_str()), Some("c"));
    }
}
