//! Per-span facts read from one pass over a span's attributes and events.

use std::borrow::Cow;

use super::{ErrorType, SpanView, Stage};
use crate::otlp::view::{Span, Val};
use crate::process::values::{as_bool, as_i64, as_str, as_text};

/// Every span attribute the pipeline reads, by meaning. [`key`] is the one table of the keys
/// (the read in [`Facts::read`] and the mapped check [`is_mapped_key`] both go through it, so
/// a key added here is both read and, if it becomes a column, left out of `attributes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    Stage,
    Attempt,
    Attempts,
    Operation,
    Tool,
    OpenInferenceTool,
    CallId,
    Agent,
    Model,
    OpenInferenceModel,
    InputTokens,
    OutputTokens,
    /// OpenLLMetry (Traceloop) before the GenAI conventions' names.
    LegacyInputTokens,
    LegacyOutputTokens,
    ErrorType,
    ErrorCode,
    ErrorClass,
    Retryable,
    RetryAfterMs,
    Reference,
    Arguments,
    /// A payload under another convention's name, taken when the GenAI one is absent.
    FallbackInput,
    Result,
    FallbackOutput,
    HttpStatus,
    RunAttempts,
}

/// A tool call's id (OpenTelemetry's GenAI conventions).
const CALL_ID: &str = "gen_ai.tool.call.id";
/// How many times a framework ran a tool call before (`tool.run_attempts`).
const RUN_ATTEMPTS: &str = "tool.run_attempts";

/// The meaning of an attribute key, if the pipeline reads it.
fn key(k: &str) -> Option<Key> {
    Some(match k {
        "toolspan.stage" => Key::Stage,
        "toolspan.attempt" => Key::Attempt,
        "toolspan.attempts" => Key::Attempts,
        "gen_ai.operation.name" => Key::Operation,
        "gen_ai.tool.name" => Key::Tool,
        "tool.name" => Key::OpenInferenceTool,
        CALL_ID => Key::CallId,
        "gen_ai.agent.name" => Key::Agent,
        "gen_ai.request.model" => Key::Model,
        "llm.model_name" => Key::OpenInferenceModel,
        "gen_ai.usage.input_tokens" | "llm.token_count.prompt" => Key::InputTokens,
        "gen_ai.usage.output_tokens" | "llm.token_count.completion" => Key::OutputTokens,
        "gen_ai.usage.prompt_tokens" => Key::LegacyInputTokens,
        "gen_ai.usage.completion_tokens" => Key::LegacyOutputTokens,
        "error.type" => Key::ErrorType,
        "toolspan.error.code" => Key::ErrorCode,
        "toolspan.error.class" => Key::ErrorClass,
        "toolspan.error.retryable" => Key::Retryable,
        "toolspan.error.retry_after_ms" => Key::RetryAfterMs,
        "toolspan.error.reference" => Key::Reference,
        "gen_ai.tool.call.arguments" => Key::Arguments,
        "gen_ai.tool.call.result" => Key::Result,
        // OpenInference's values; OpenLLMetry's decorated tasks and tools (their arguments
        // and return value); Haystack's tool spans (`haystack.agent.step.tool`: the call's
        // arguments and its result, or `{"error": "…"}` when the tool failed).
        "input.value" | "traceloop.entity.input" | "haystack.agent.step.tool.input" => {
            Key::FallbackInput
        }
        "output.value" | "traceloop.entity.output" | "haystack.agent.step.tool.output" => {
            Key::FallbackOutput
        }
        "http.response.status_code" | "http.status_code" => Key::HttpStatus,
        RUN_ATTEMPTS => Key::RunAttempts,
        _ => return None,
    })
}

impl Key {
    /// Whether the value becomes a column. The rest (the operation, a foreign `error.type`,
    /// a framework's run count) stays in the `attributes` JSON too.
    fn is_column(self) -> bool {
        !matches!(self, Key::Operation | Key::ErrorType | Key::RunAttempts)
    }
}

/// Whether `span` counts a framework's runs of its tool call (`tool.run_attempts`) and names
/// no call id (`gen_ai.tool.call.id`, even empty): its facts then get a [`Facts::rerun_id`].
pub(crate) fn counts_runs(span: &Span<'_>) -> bool {
    let (mut runs, mut call_id) = (false, false);
    for kv in span.attributes {
        runs |= kv.key == RUN_ATTEMPTS;
        call_id |= kv.key == CALL_ID;
    }
    runs && !call_id
}

/// Attribute keys that become columns; they are left out of the `attributes` JSON.
pub fn is_mapped_key(k: &str) -> bool {
    key(k).is_some_and(Key::is_column)
}

/// What the pipeline knows about one span.
pub struct Facts<'a> {
    pub span: &'a Span<'a>,
    pub resource: usize,
    pub span_id: u64,
    pub parent_id: Option<u64>,
    pub stage: Option<Stage>,
    pub tool: Option<&'a str>,
    pub call_id: Option<&'a str>,
    pub attempt: Option<i64>,
    pub agent: Option<&'a str>,
    pub model: Option<&'a str>,
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
    pub explicit_error: Option<ErrorType>,
    pub foreign_error_type: Option<&'a str>,
    pub error_code: Option<&'a str>,
    pub error_class: Option<&'a str>,
    pub retryable: Option<bool>,
    pub retry_after_ms: Option<i64>,
    pub reference: Option<&'a str>,
    /// The payload values, rendered and redacted when the row is built.
    pub input: Option<Val<'a>>,
    pub output: Option<Val<'a>>,
    pub http_status: Option<i64>,
    pub exception_type: Option<&'a str>,
    pub exception_message: Option<&'a str>,
    pub failed: bool,
    pub error_type: Option<ErrorType>,
    /// The parent's stage, filled in before parent-dependent rules run.
    pub parent_stage: Option<Stage>,
    /// The attempts a call declares it made (`toolspan.attempts`), so that its row is right
    /// even when its attempts arrive after it.
    pub declared_attempts: Option<i64>,
    /// Whether the stage came from the span's own attributes (not from a rule or a default).
    pub own_stage: bool,
    /// An `error.type` in the taxonomy's names on a span without toolspan's conventions: a
    /// signal (the fallback when nothing else decides), not an explicit type.
    pub weak_error: Option<ErrorType>,
    /// The result says the call failed (a recognised form of the body, or a result rule).
    pub result_failure: Option<Box<ResultFailure<'a>>>,
    /// The span's status was inferred: a tool call whose status is not ERROR and whose result
    /// says it failed, or whose other instrumentation's span of the same call failed (set by
    /// classification).
    pub status_from_result: bool,
    /// The span carries toolspan's own conventions (a `toolspan.*` attribute).
    pub toolspan_conventions: bool,
    /// How many times the framework ran this tool call before (`tool.run_attempts`, as
    /// OpenInference's CrewAI instrumentation records a framework's own reruns).
    pub run_attempts: Option<i64>,
    /// The call id a chain of such runs takes when none names one: this span's id, in hex.
    pub rerun_id: Option<&'a str>,
}

/// A result that says its call failed.
#[derive(Debug)]
pub struct ResultFailure<'a> {
    /// The error's text, when the result has one.
    pub message: Option<Cow<'a, str>>,
    /// The error type a result rule sets.
    pub set: Option<ErrorType>,
}

/// A payload attribute's value, unless it has no text (a string-table index).
fn payload(v: Option<Val<'_>>) -> Option<Val<'_>> {
    v.filter(|v| !matches!(v, Val::Strindex))
}

fn non_empty(s: Option<&str>) -> Option<&str> {
    s.filter(|v| !v.is_empty())
}

impl<'a> Facts<'a> {
    /// Reads the span's attributes and events once.
    pub fn read(
        span: &'a Span<'a>,
        resource: usize,
        span_id: u64,
        parent_id: Option<u64>,
    ) -> Facts<'a> {
        let mut f = Facts {
            span,
            resource,
            span_id,
            parent_id,
            stage: None,
            tool: None,
            call_id: None,
            attempt: None,
            agent: None,
            model: None,
            input_tokens: None,
            output_tokens: None,
            explicit_error: None,
            foreign_error_type: None,
            error_code: None,
            error_class: None,
            retryable: None,
            retry_after_ms: None,
            reference: None,
            input: None,
            output: None,
            http_status: None,
            exception_type: None,
            exception_message: None,
            failed: span.status.as_ref().is_some_and(|s| s.code == 2),
            error_type: None,
            parent_stage: None,
            declared_attempts: None,
            own_stage: false,
            weak_error: None,
            result_failure: None,
            status_from_result: false,
            toolspan_conventions: false,
            run_attempts: None,
            rerun_id: None,
        };
        let mut taxonomy_error: Option<ErrorType> = None;
        let mut toolspan_conventions = false;
        let mut op: Option<&str> = None;
        let mut explicit_stage: Option<Stage> = None;
        let mut oi_tool: Option<&str> = None;
        for kv in span.attributes {
            let v = kv.value;
            toolspan_conventions |= kv.key.starts_with("toolspan.");
            let Some(k) = key(kv.key) else {
                continue;
            };
            match k {
                Key::Stage => explicit_stage = as_str(v).and_then(Stage::parse),
                Key::Attempt => f.attempt = as_i64(v),
                Key::Attempts => f.declared_attempts = as_i64(v).filter(|&n| n > 0),
                Key::Operation => op = as_str(v),
                Key::Tool => f.tool = non_empty(as_str(v)),
                Key::OpenInferenceTool => oi_tool = non_empty(as_str(v)),
                Key::CallId => f.call_id = non_empty(as_str(v)),
                Key::Agent => f.agent = non_empty(as_str(v)),
                Key::Model => f.model = non_empty(as_str(v)),
                Key::OpenInferenceModel => f.model = f.model.or(non_empty(as_str(v))),
                Key::InputTokens => f.input_tokens = as_i64(v),
                Key::OutputTokens => f.output_tokens = as_i64(v),
                Key::LegacyInputTokens => f.input_tokens = f.input_tokens.or(as_i64(v)),
                Key::LegacyOutputTokens => f.output_tokens = f.output_tokens.or(as_i64(v)),
                Key::ErrorType => {
                    if let Some(s) = as_str(v) {
                        match ErrorType::parse_exact(s) {
                            Some(e) => taxonomy_error = Some(e),
                            None => f.foreign_error_type = Some(s),
                        }
                    }
                }
                Key::ErrorCode => f.error_code = non_empty(as_str(v)),
                Key::ErrorClass => f.error_class = non_empty(as_str(v)),
                Key::Retryable => f.retryable = as_bool(v),
                Key::RetryAfterMs => f.retry_after_ms = as_i64(v),
                Key::Reference => f.reference = non_empty(as_str(v)),
                Key::Arguments => f.input = payload(v),
                Key::FallbackInput => f.input = f.input.or(payload(v)),
                Key::Result => f.output = payload(v),
                Key::FallbackOutput => f.output = f.output.or(payload(v)),
                Key::HttpStatus => f.http_status = as_i64(v),
                Key::RunAttempts => f.run_attempts = as_i64(v),
            }
        }
        f.tool = f.tool.or(oi_tool);
        f.toolspan_conventions = toolspan_conventions;
        // The five upper-case names mean toolspan's taxonomy only where the instrumentation
        // follows toolspan's conventions; elsewhere (a framework that writes `TOOL_ERROR` for
        // any error) the value is one signal among others.
        if toolspan_conventions {
            f.explicit_error = taxonomy_error;
        } else {
            f.weak_error = taxonomy_error;
        }
        if let Some(Val::Str(result)) = f.output {
            if let Some(body) = super::body::read(result) {
                let e = body.envelope;
                f.error_code = f.error_code.or(e.code);
                f.error_class = f.error_class.or(e.class);
                f.retryable = f.retryable.or(e.retryable);
                f.retry_after_ms = f.retry_after_ms.or(e.retry_after_ms);
                f.reference = f.reference.or(e.reference);
                f.result_failure = body.failure.map(|b| {
                    Box::new(ResultFailure {
                        message: b.message,
                        set: None,
                    })
                });
            }
        }
        for ev in span.events {
            // OpenTelemetry's `exception` event, and the GenAI conventions' named ones
            // (`gen_ai.execute_tool.exception`): the same `exception.*` attributes.
            if ev.name == "exception" || ev.name.ends_with(".exception") {
                for kv in ev.attributes {
                    match kv.key {
                        "exception.type" => {
                            f.exception_type = f.exception_type.or(as_str(kv.value))
                        }
                        "exception.message" => {
                            f.exception_message = f.exception_message.or(as_str(kv.value))
                        }
                        _ => {}
                    }
                }
            }
        }
        // Conventions in order of authority: toolspan's own keys, then GenAI, then OpenInference
        // (through the rules, which also carry the foreign shapes).
        f.stage = explicit_stage.or_else(|| {
            if f.attempt.is_some() {
                return Some(Stage::Attempt);
            }
            match op? {
                "execute_tool" => Some(Stage::Call),
                "chat" | "text_completion" | "generate_content" | "embeddings" => Some(Stage::Llm),
                "invoke_agent" | "create_agent" => Some(Stage::Agent),
                _ => None,
            }
        });
        f.own_stage = f.stage.is_some();
        f
    }

    /// The text the row's `error_message` holds: the status message, the exception's, or,
    /// for a status inferred from the result, the result's error text.
    pub fn error_text(&self) -> Option<&str> {
        self.status_message()
            .or(self.exception_message)
            .or_else(|| {
                self.result_failure
                    .as_ref()
                    .filter(|_| self.status_from_result)
                    .and_then(|r| r.message.as_deref())
            })
    }

    /// The status message, if any.
    pub fn status_message(&self) -> Option<&'a str> {
        self.span
            .status
            .as_ref()
            .map(|s| s.message)
            .filter(|m| !m.is_empty())
    }
}

impl SpanView for Facts<'_> {
    fn attribute(&self, key: &str) -> Option<Cow<'_, str>> {
        self.span
            .attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| as_text(kv.value))
    }

    fn kind(&self) -> &'static str {
        crate::otlp::span_kind_name(self.span.kind)
    }

    fn name(&self) -> &str {
        self.span.name
    }

    fn parent_stage(&self) -> Option<Stage> {
        self.parent_stage
    }

    fn exception_types(&self) -> Vec<&str> {
        self.exception_type
            .into_iter()
            .chain(self.foreign_error_type)
            .collect()
    }

    fn messages(&self) -> Vec<&str> {
        let result = self
            .result_failure
            .as_ref()
            .filter(|_| self.status_from_result)
            .and_then(|r| r.message.as_deref());
        self.status_message()
            .into_iter()
            .chain(self.exception_message)
            .chain(result)
            .collect()
    }

    fn http_status(&self) -> Option<i64> {
        self.http_status
    }

    fn arguments(&self) -> Option<&str> {
        match self.input {
            Some(Val::Str(s)) => Some(s),
            _ => None,
        }
    }

    fn error_code(&self) -> Option<&str> {
        self.error_code
    }

    fn error_class(&self) -> Option<&str> {
        self.error_class
    }
}
