//! The rules file: parsing, validation and matching.

use std::borrow::Cow;
use std::collections::BTreeMap;

use regex::Regex;
use serde::Deserialize;

use super::{ErrorType, Stage};
use crate::error::PipelineError;
use crate::otlp::SPAN_KINDS as KINDS;

const BUILTIN: &str = include_str!("../../../rules/default.toml");

/// What a rule may ask of a span. The pipeline implements it over a decoded OTLP span.
pub trait SpanView {
    /// The attribute's value rendered as text, if present.
    fn attribute(&self, key: &str) -> Option<Cow<'_, str>>;
    /// The OTLP span kind as lower-case text (`client`, `server`, `internal`, ...).
    fn kind(&self) -> &'static str;
    /// The span name.
    fn name(&self) -> &str;
    /// The stage of the parent span, when the parent is known.
    fn parent_stage(&self) -> Option<Stage>;
    /// Exception types from exception events, and a non-standard `error.type`.
    fn exception_types(&self) -> Vec<&str>;
    /// Status and exception messages.
    fn messages(&self) -> Vec<&str>;
    /// The HTTP response status, if any.
    fn http_status(&self) -> Option<i64>;
    /// The tool call's arguments as recorded (a JSON text, usually), if any.
    fn arguments(&self) -> Option<&str> {
        None
    }
    /// The error envelope's code (`toolspan.error.code`, or the result body's), if any.
    fn error_code(&self) -> Option<&str> {
        None
    }
    /// The error envelope's class (`toolspan.error.class`, or the result body's), if any.
    fn error_class(&self) -> Option<&str> {
        None
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RulesFile {
    #[serde(default)]
    stage: Vec<StageRuleDef>,
    #[serde(default)]
    error: Vec<ErrorRuleDef>,
    #[serde(default)]
    result: Vec<ResultRuleDef>,
    #[serde(default)]
    taxonomy: Vec<TaxonomyDef>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TaxonomyDef {
    id: String,
    scope: Option<String>,
    sdk: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StageRuleDef {
    id: String,
    when_kind: Option<String>,
    #[serde(default)]
    any_attribute: Vec<String>,
    #[serde(default)]
    all_attributes: Vec<String>,
    #[serde(default)]
    any_status_attribute: Vec<String>,
    #[serde(default)]
    attributes: BTreeMap<String, String>,
    #[serde(default)]
    parent_stage: Vec<String>,
    name: Option<String>,
    tool_attribute: Option<String>,
    tool_from_name: Option<String>,
    set: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ErrorRuleDef {
    id: String,
    #[serde(default)]
    stage: Vec<String>,
    exception_type: Option<String>,
    message: Option<String>,
    http_status: Option<[i64; 2]>,
    error_code: Option<String>,
    error_class: Option<String>,
    field_in_arguments: Option<bool>,
    #[serde(default)]
    attributes: BTreeMap<String, String>,
    set: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResultRuleDef {
    id: String,
    attribute: Option<String>,
    pointer: Option<String>,
    value: Option<toml::Value>,
    message_pointer: Option<String>,
    set: Option<String>,
}

/// A compiled stage rule.
#[derive(Debug)]
pub struct StageRule {
    /// The rule's id, for logs and docs.
    pub id: String,
    when_kind: Option<String>,
    any_attribute: Vec<String>,
    all_attributes: Vec<String>,
    any_status_attribute: Vec<String>,
    attributes: Vec<(String, Regex)>,
    parent_stage: Vec<Stage>,
    name: Option<Regex>,
    /// Take the tool name from this attribute.
    pub tool_attribute: Option<String>,
    /// Without that attribute, the tool name is the first group of this regex over the span
    /// name (whole name).
    tool_from_name: Option<Regex>,
    /// The stage the rule sets.
    pub set: Stage,
}

impl StageRule {
    /// The tool name the span's name gives, by the rule's `tool_from_name`.
    pub fn tool_in_name<'a>(&self, name: &'a str) -> Option<&'a str> {
        let group = self.tool_from_name.as_ref()?.captures(name)?.get(1)?;
        Some(group.as_str()).filter(|s| !s.is_empty())
    }
}

/// A compiled error rule.
#[derive(Debug)]
pub struct ErrorRule {
    /// The rule's id.
    pub id: String,
    stage: Vec<Stage>,
    exception_type: Option<Regex>,
    message: Option<Regex>,
    http_status: Option<[i64; 2]>,
    error_code: Option<Regex>,
    error_class: Option<Regex>,
    /// `Some(true)`: a validation error of one of the call's arguments; `Some(false)`: of
    /// something the arguments do not have (the answer).
    field_in_arguments: Option<bool>,
    attributes: Vec<(String, Regex)>,
    /// The error type the rule sets.
    pub set: ErrorType,
}

/// Where a result rule looks for the value that means failure.
#[derive(Debug)]
pub enum ResultPlace {
    /// A span attribute (its value rendered as text).
    Attribute(String),
    /// A JSON pointer (RFC 6901) into the tool's result body.
    Pointer(String),
}

/// A compiled result rule: a value that, on a tool span whose status is not ERROR, means the
/// call failed.
#[derive(Debug)]
pub struct ResultRule {
    /// The rule's id.
    pub id: String,
    /// Where the value is.
    pub place: ResultPlace,
    /// The value that means failure; `None`: any value but `null`, `false`, `0`, `""`, `[]`
    /// and `{}`.
    pub value: Option<serde_json::Value>,
    /// A JSON pointer to the error's text in the result body.
    pub message_pointer: Option<String>,
    /// The error type the failure gets; `None`: derived as for any failed call.
    pub set: Option<ErrorType>,
}

impl ResultRule {
    /// Whether `found` (the value at the rule's place) means failure.
    pub fn means_failure(&self, found: &serde_json::Value) -> bool {
        use serde_json::Value as V;
        match &self.value {
            Some(want) => found == want,
            None => match found {
                V::Null | V::Bool(false) => false,
                V::Number(n) => n.as_f64() != Some(0.0),
                V::String(s) => !s.is_empty(),
                V::Array(a) => !a.is_empty(),
                V::Object(o) => !o.is_empty(),
                V::Bool(true) => true,
            },
        }
    }

    /// Whether an attribute's text means failure (the wanted value rendered as text).
    pub fn text_means_failure(&self, found: &str) -> bool {
        use serde_json::Value as V;
        match &self.value {
            Some(V::String(s)) => found == s,
            Some(other) => {
                let want = other.to_string();
                found == want
            }
            None => !found.is_empty() && found != "false" && found != "0",
        }
    }
}

/// The compiled rules: user rules first, then the built-in ones.
#[derive(Debug)]
pub struct Rules {
    stage: Vec<StageRule>,
    error: Vec<ErrorRule>,
    result: Vec<ResultRule>,
    /// Instrumentation whose upper-case `error.type` means toolspan's taxonomy: (scope name,
    /// `telemetry.sdk.name`) patterns, each optional.
    taxonomy: Vec<(Option<Regex>, Option<Regex>)>,
    /// Whether any stage rule needs the parent's stage (decides a second pass).
    pub needs_parent: bool,
}

fn anchored(id: &str, re: &str) -> Result<Regex, PipelineError> {
    Regex::new(&format!("^(?:{re})$"))
        .map_err(|e| PipelineError::Config(format!("rule {id}: invalid regex: {e}")))
}

fn searched(id: &str, re: &str) -> Result<Regex, PipelineError> {
    Regex::new(re).map_err(|e| PipelineError::Config(format!("rule {id}: invalid regex: {e}")))
}

fn stage_of(id: &str, s: &str) -> Result<Stage, PipelineError> {
    Stage::parse(s).ok_or_else(|| {
        PipelineError::Config(format!(
            "rule {id}: unknown stage {s:?}; allowed: agent, llm, call, attempt, prepare, send, execute, parse, other"
        ))
    })
}

impl Rules {
    /// The built-in rules only.
    pub fn builtin() -> Rules {
        // The built-in file is compiled in and covered by tests, so it always parses.
        Rules::parse(BUILTIN).expect("built-in rules parse")
    }

    /// A user rules file's text, tried before the built-in rules.
    pub fn with_user_rules(text: &str) -> Result<Rules, PipelineError> {
        let mut user = Rules::parse(text)?;
        let builtin = Rules::builtin();
        user.stage.extend(builtin.stage);
        user.error.extend(builtin.error);
        user.result.extend(builtin.result);
        user.taxonomy.extend(builtin.taxonomy);
        user.needs_parent |= builtin.needs_parent;
        Ok(user)
    }

    /// Parses one rules file.
    pub fn parse(text: &str) -> Result<Rules, PipelineError> {
        let file: RulesFile = toml::from_str(text)
            .map_err(|e| PipelineError::Config(format!("rules file: {}", e.message())))?;
        let mut stage = Vec::new();
        for d in file.stage {
            let id = d.id;
            if let Some(k) = &d.when_kind {
                if !KINDS.contains(&k.as_str()) {
                    return Err(PipelineError::Config(format!(
                        "rule {id}: unknown span kind {k:?}; allowed: {}",
                        KINDS.join(", ")
                    )));
                }
            }
            let attributes = d
                .attributes
                .iter()
                .map(|(k, v)| Ok((k.clone(), anchored(&id, v)?)))
                .collect::<Result<Vec<_>, PipelineError>>()?;
            let parent_stage = d
                .parent_stage
                .iter()
                .map(|s| stage_of(&id, s))
                .collect::<Result<Vec<_>, _>>()?;
            let name = d.name.as_deref().map(|n| anchored(&id, n)).transpose()?;
            let tool_from_name = d
                .tool_from_name
                .as_deref()
                .map(|n| anchored(&id, n))
                .transpose()?;
            if tool_from_name
                .as_ref()
                .is_some_and(|re| re.captures_len() < 2)
            {
                return Err(PipelineError::Config(format!(
                    "rule {id}: tool_from_name needs a group, the tool's name: e.g. \"(.+)\\\\.__call__\""
                )));
            }
            let set = stage_of(&id, &d.set)?;
            stage.push(StageRule {
                id,
                when_kind: d.when_kind,
                any_attribute: d.any_attribute,
                all_attributes: d.all_attributes,
                any_status_attribute: d.any_status_attribute,
                attributes,
                parent_stage,
                name,
                tool_attribute: d.tool_attribute,
                tool_from_name,
                set,
            });
        }
        let mut error = Vec::new();
        for d in file.error {
            let id = d.id;
            let stages = d
                .stage
                .iter()
                .map(|s| stage_of(&id, s))
                .collect::<Result<Vec<_>, _>>()?;
            let set = ErrorType::parse(&d.set).ok_or_else(|| {
                PipelineError::Config(format!(
                    "rule {id}: unknown error type {:?}; allowed: PREPARE, NETWORK, TOOL_ERROR, PARSE, RETRY_EXHAUSTED",
                    d.set
                ))
            })?;
            error.push(ErrorRule {
                exception_type: d
                    .exception_type
                    .as_deref()
                    .map(|r| searched(&id, r))
                    .transpose()?,
                message: d.message.as_deref().map(|r| searched(&id, r)).transpose()?,
                http_status: d.http_status,
                error_code: d
                    .error_code
                    .as_deref()
                    .map(|r| searched(&id, r))
                    .transpose()?,
                error_class: d
                    .error_class
                    .as_deref()
                    .map(|r| searched(&id, r))
                    .transpose()?,
                field_in_arguments: d.field_in_arguments,
                attributes: d
                    .attributes
                    .iter()
                    .map(|(k, v)| Ok((k.clone(), anchored(&id, v)?)))
                    .collect::<Result<Vec<_>, PipelineError>>()?,
                stage: stages,
                id,
                set,
            });
        }
        let mut result = Vec::new();
        for d in file.result {
            result.push(result_rule(d)?);
        }
        let mut taxonomy = Vec::new();
        for d in file.taxonomy {
            if d.scope.is_none() && d.sdk.is_none() {
                return Err(PipelineError::Config(format!(
                    "rule {}: a taxonomy declaration names a `scope` (the instrumentation scope's name) or an `sdk` (the resource's telemetry.sdk.name), as regexes",
                    d.id
                )));
            }
            let scope = d.scope.as_deref().map(|r| anchored(&d.id, r)).transpose()?;
            let sdk = d.sdk.as_deref().map(|r| anchored(&d.id, r)).transpose()?;
            taxonomy.push((scope, sdk));
        }
        let needs_parent = stage.iter().any(|r| !r.parent_stage.is_empty());
        Ok(Rules {
            stage,
            error,
            result,
            taxonomy,
            needs_parent,
        })
    }

    /// The first stage rule that matches. `with_parent` says whether the parent's stage is
    /// known yet; rules that need it are skipped until it is.
    pub fn match_stage(&self, span: &dyn SpanView, with_parent: bool) -> Option<&StageRule> {
        self.stage.iter().find(|r| {
            if !r.parent_stage.is_empty() {
                if !with_parent {
                    return false;
                }
                match span.parent_stage() {
                    Some(p) if r.parent_stage.contains(&p) => {}
                    _ => return false,
                }
            }
            if let Some(k) = &r.when_kind {
                if span.kind() != k {
                    return false;
                }
            }
            if !r.any_attribute.is_empty()
                && !r.any_attribute.iter().any(|k| span.attribute(k).is_some())
            {
                return false;
            }
            if !r.all_attributes.iter().all(|k| span.attribute(k).is_some()) {
                return false;
            }
            if !r.any_status_attribute.is_empty()
                && !r
                    .any_status_attribute
                    .iter()
                    .any(|k| span.attribute(k).is_some())
            {
                return false;
            }
            if !r
                .attributes
                .iter()
                .all(|(k, re)| span.attribute(k).is_some_and(|v| re.is_match(&v)))
            {
                return false;
            }
            if let Some(n) = &r.name {
                if !n.is_match(span.name()) {
                    return false;
                }
            }
            true
        })
    }

    /// Whether the instrumentation of a span (its scope's name, its resource's
    /// `telemetry.sdk.name`) is declared to write toolspan's taxonomy in `error.type`.
    pub fn declares_taxonomy(&self, scope: &str, sdk: Option<&str>) -> bool {
        self.taxonomy.iter().any(|(sc, sd)| {
            sc.as_ref().is_none_or(|re| re.is_match(scope))
                && sd
                    .as_ref()
                    .is_none_or(|re| sdk.is_some_and(|s| re.is_match(s)))
        })
    }

    /// The result rules, user rules first.
    pub fn result_rules(&self) -> &[ResultRule] {
        &self.result
    }

    /// The first error rule that matches a failed span of `stage`.
    pub fn match_error(&self, span: &dyn SpanView, stage: Stage) -> Option<&ErrorRule> {
        let types = span.exception_types();
        let messages = span.messages();
        let http = span.http_status();
        self.error.iter().find(|r| {
            if !r.stage.is_empty() && !r.stage.contains(&stage) {
                return false;
            }
            if r.exception_type.is_none()
                && r.message.is_none()
                && r.http_status.is_none()
                && r.error_code.is_none()
                && r.error_class.is_none()
                && r.field_in_arguments.is_none()
                && r.attributes.is_empty()
            {
                return true;
            }
            if !r
                .attributes
                .iter()
                .all(|(k, re)| span.attribute(k).is_some_and(|v| re.is_match(&v)))
            {
                return false;
            }
            if let Some(want) = r.field_in_arguments {
                if !messages
                    .iter()
                    .any(|m| validation_target(m, span.arguments()) == Some(want))
                {
                    return false;
                }
            }
            if let Some(re) = &r.error_code {
                if !span.error_code().is_some_and(|c| re.is_match(c)) {
                    return false;
                }
            }
            if let Some(re) = &r.error_class {
                if !span.error_class().is_some_and(|c| re.is_match(c)) {
                    return false;
                }
            }
            if let Some(re) = &r.exception_type {
                if !types.iter().any(|t| re.is_match(t)) {
                    return false;
                }
            }
            if let Some(re) = &r.message {
                if !messages.iter().any(|m| re.is_match(m)) {
                    return false;
                }
            }
            if let Some([lo, hi]) = r.http_status {
                if !http.is_some_and(|h| h >= lo && h <= hi) {
                    return false;
                }
            }
            true
        })
    }
}

/// What a validation error in pydantic's words ("N validation error(s) for Model", then the
/// failing field's location on a line of its own) validated, judged against the call's recorded
/// arguments, whatever the model is called: `Some(true)` the arguments — the failing field is
/// one of the argument names the call was made with, or, for a missing field, every key of the
/// rejected `input_value={...}` is one — `Some(false)` something
/// else — the failing field is no argument, and, for a missing field, the rejected input has a
/// key that is no argument (an answer's `{'results': …}`) — and `None` when it cannot tell: no
/// arguments recorded, no pydantic header, or a missing field of an empty input.
pub fn validation_target(message: &str, arguments: Option<&str>) -> Option<bool> {
    static HEADER: std::sync::LazyLock<Regex> = std::sync::LazyLock::new(|| {
        // Constant pattern, covered by the tests below.
        Regex::new(r"\b\d+ validation errors? for [^\s\\]+(?:\r?\n|\\n)\s*([A-Za-z_][A-Za-z0-9_]*)")
            .expect("valid regex")
    });
    let args = arguments.and_then(argument_names)?;
    let field = HEADER.captures(message).and_then(|c| c.get(1))?;
    if args.iter().any(|a| a == field.as_str()) {
        return Some(true);
    }
    // The first error's detail, "[type=…, input_value=…, input_type=…]": a field that was
    // given and is no argument is something else's; a missing one is whose input lacks it
    // ("Field required [type=missing, input_value={'limit': 3}, input_type=dict]").
    let after = &message[field.end()..];
    let detail = &after[after.find("[type=")?..];
    // The error types pydantic has only for a function's arguments (`validate_call`).
    if ARGUMENT_ERROR_TYPES
        .iter()
        .any(|t| detail[6..].starts_with(t))
    {
        return Some(true);
    }
    if !detail.starts_with("[type=missing,") {
        return Some(false);
    }
    let rest = &detail[detail.find("input_value=")? + "input_value=".len()..];
    if !rest.starts_with('{') {
        return None;
    }
    let end = rest.find(", input_type=").unwrap_or(rest.len());
    let keys: Vec<&str> = KEYS
        .captures_iter(&rest[..end])
        .filter_map(|c| c.get(1).map(|m| m.as_str()))
        .collect();
    if keys.is_empty() {
        return None;
    }
    Some(keys.iter().all(|k| args.iter().any(|a| a == k)))
}

/// pydantic's error types that only a function's arguments get (`validate_call`).
const ARGUMENT_ERROR_TYPES: [&str; 4] = [
    "missing_argument",
    "unexpected_keyword_argument",
    "unexpected_positional_argument",
    "multiple_argument_values",
];

/// Quoted keys of a dict or object rendered as text (`{'limit': 3}`, `{"limit": 3}`).
static KEYS: std::sync::LazyLock<Regex> = std::sync::LazyLock::new(|| {
    // Constant pattern, covered by the tests below.
    Regex::new(r#"['"]([A-Za-z_][A-Za-z0-9_]*)['"]\s*:"#).expect("valid regex")
});

/// The argument names of a call's recorded arguments: the keys of a JSON object, or of the
/// object it wraps under `kwargs`, `arguments`, `args` or `input` (as some instrumentations
/// record them, or a dict rendered as text under `input_str`). Bounded like result bodies.
fn argument_names(text: &str) -> Option<Vec<String>> {
    if text.len() > 64 * 1024 || !text.trim_start().starts_with('{') {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let obj = v.as_object()?;
    let mut names: Vec<String> = obj.keys().cloned().collect();
    for wrapper in ["kwargs", "arguments", "args", "input", "input_str"] {
        match obj.get(wrapper) {
            Some(serde_json::Value::Object(inner)) => names.extend(inner.keys().cloned()),
            // LangChain's `input_str`: the arguments as Python renders a dict.
            Some(serde_json::Value::String(text)) if text.len() <= 64 * 1024 => names.extend(
                KEYS.captures_iter(text)
                    .filter_map(|c| c.get(1).map(|m| m.as_str().to_string())),
            ),
            _ => {}
        }
    }
    Some(names)
}

fn is_pointer(p: &str) -> bool {
    p.is_empty() || p.starts_with('/')
}

fn result_rule(d: ResultRuleDef) -> Result<ResultRule, PipelineError> {
    let id = d.id;
    let place = match (d.attribute, d.pointer) {
        (Some(a), None) if !a.is_empty() => ResultPlace::Attribute(a),
        (None, Some(p)) if is_pointer(&p) => ResultPlace::Pointer(p),
        (None, Some(p)) => {
            return Err(PipelineError::Config(format!(
                "rule {id}: pointer {p:?} is not a JSON pointer; it starts with '/', e.g. \"/outcome/status\""
            )))
        }
        _ => {
            return Err(PipelineError::Config(format!(
                "rule {id}: a result rule has exactly one of `attribute` (a span attribute key) or `pointer` (a JSON pointer into the result body)"
            )))
        }
    };
    if let Some(p) = &d.message_pointer {
        if !is_pointer(p) {
            return Err(PipelineError::Config(format!(
                "rule {id}: message_pointer {p:?} is not a JSON pointer; it starts with '/'"
            )));
        }
    }
    let value = d
        .value
        .map(|v| {
            serde_json::to_value(&v).map_err(|e| {
                PipelineError::Config(format!("rule {id}: value is not a JSON value: {e}"))
            })
        })
        .transpose()?;
    let set = d
        .set
        .map(|s| {
            ErrorType::parse(&s).ok_or_else(|| {
                PipelineError::Config(format!(
                    "rule {id}: unknown error type {s:?}; allowed: PREPARE, NETWORK, TOOL_ERROR, PARSE, RETRY_EXHAUSTED"
                ))
            })
        })
        .transpose()?;
    Ok(ResultRule {
        id,
        place,
        value,
        message_pointer: d.message_pointer,
        set,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake {
        attrs: Vec<(&'static str, &'static str)>,
        kind: &'static str,
        parent: Option<Stage>,
        exc: Vec<&'static str>,
        http: Option<i64>,
        name: &'static str,
    }

    impl SpanView for Fake {
        fn attribute(&self, key: &str) -> Option<Cow<'_, str>> {
            self.attrs
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| Cow::Borrowed(*v))
        }
        fn kind(&self) -> &'static str {
            self.kind
        }
        fn name(&self) -> &str {
            self.name
        }
        fn parent_stage(&self) -> Option<Stage> {
            self.parent
        }
        fn exception_types(&self) -> Vec<&str> {
            self.exc.clone()
        }
        fn messages(&self) -> Vec<&str> {
            Vec::new()
        }
        fn http_status(&self) -> Option<i64> {
            self.http
        }
    }

    fn fake() -> Fake {
        Fake {
            attrs: vec![],
            kind: "internal",
            parent: None,
            exc: vec![],
            http: None,
            name: "span",
        }
    }

    #[test]
    fn builtin_rules_classify_foreign_shapes() {
        let rules = Rules::builtin();
        let oi = Fake {
            attrs: vec![
                ("openinference.span.kind", "TOOL"),
                ("tool.name", "run_sql"),
            ],
            ..fake()
        };
        let r = rules.match_stage(&oi, false).unwrap();
        assert_eq!(r.set, Stage::Call);
        assert_eq!(r.tool_attribute.as_deref(), Some("tool.name"));

        let http = Fake {
            attrs: vec![
                ("http.request.method", "POST"),
                ("url.full", "https://search.internal/q"),
                ("http.response.status_code", "500"),
            ],
            kind: "client",
            parent: Some(Stage::Call),
            ..fake()
        };
        assert!(
            rules.match_stage(&http, false).is_none(),
            "needs the parent first"
        );
        assert_eq!(rules.match_stage(&http, true).unwrap().set, Stage::Execute);
        // A gateway's 503 means the tool was not reached: the send stage (NETWORK).
        let gateway = Fake {
            attrs: vec![
                ("http.request.method", "POST"),
                ("url.full", "https://search.internal/q"),
                ("http.response.status_code", "503"),
            ],
            kind: "client",
            parent: Some(Stage::Call),
            ..fake()
        };
        assert_eq!(rules.match_stage(&gateway, true).unwrap().set, Stage::Send);
        let unanswered = Fake {
            attrs: vec![("url.full", "https://x")],
            kind: "client",
            parent: Some(Stage::Attempt),
            ..fake()
        };
        assert_eq!(
            rules.match_stage(&unanswered, true).unwrap().set,
            Stage::Send
        );
        let orphan = Fake {
            attrs: vec![("url.full", "https://x")],
            kind: "client",
            parent: Some(Stage::Agent),
            ..fake()
        };
        assert!(rules.match_stage(&orphan, true).is_none());

        let conn = Fake {
            exc: vec!["requests.exceptions.ConnectionError"],
            ..fake()
        };
        assert_eq!(
            rules.match_error(&conn, Stage::Call).unwrap().set,
            ErrorType::Network
        );
        let json = Fake {
            exc: vec!["json.decoder.JSONDecodeError"],
            ..fake()
        };
        assert_eq!(
            rules.match_error(&json, Stage::Call).unwrap().set,
            ErrorType::Parse
        );
        let http500 = Fake {
            http: Some(500),
            ..fake()
        };
        assert_eq!(
            rules.match_error(&http500, Stage::Call).unwrap().set,
            ErrorType::ToolError
        );
        assert!(rules.match_error(&fake(), Stage::Call).is_none());
    }

    #[test]
    fn a_validation_error_is_about_the_arguments_when_its_field_is_one() {
        let args = Some(r#"{"query": "install", "limit": "many"}"#);
        for (message, arguments, expected) in [
            // The model's name says nothing: the failing field is an argument.
            ("1 validation error for SearchInput\nlimit\n  Input should be a valid integer [type=int_parsing, input_value='many', input_type=str]", args, true),
            ("2 validation errors for search_docs\\nquery\\n  Input should be a valid string", args, true),
            // A required argument left out: the rejected input is the arguments.
            ("1 validation error for SearchInput\nquery\n  Field required [type=missing, input_value={'limit': 3}, input_type=dict]", Some(r#"{"limit": 3}"#), true),
            // The answer's model: its field is no argument, nor is its input the arguments.
            ("1 validation error for SearchAnswer\nhits\n  Field required [type=missing, input_value={'results': [{'title': 'x'}]}, input_type=dict]", args, false),
            // LangChain's input_str: the arguments as a Python dict.
            ("1 validation error for SearchInput\nlimit\n  Input should be a valid integer", Some(r#"{"input_str": "{'query': 42, 'limit': 'many'}", "tags": []}"#), true),
            // No arguments recorded, or no validation error: nothing to tell.
            ("1 validation error for SearchInput\nlimit\n  bad", None, false),
            ("limit must be positive", args, false),
        ] {
            assert_eq!(
                validation_target(message, arguments) == Some(true),
                expected,
                "{message}"
            );
        }
    }

    #[test]
    fn a_validation_error_is_about_the_answer_when_the_arguments_lack_its_field() {
        let args = Some(r#"{"query": "install", "limit": 3}"#);
        for (message, arguments, expected) in [
            // A field the arguments do not have, given and invalid: the answer's.
            ("1 validation error for search_docs_result\nhits\n  Input should be a valid list [type=list_type, input_value='x', input_type=str]", args, Some(false)),
            // Missing from an input with keys that are no arguments: the answer's.
            ("1 validation error for search_docs_result\nhits\n  Field required [type=missing, input_value={'results': []}, input_type=dict]", args, Some(false)),
            // validate_call's own error types are the arguments', whatever the field.
            ("1 validation error for search_docs\nquery\n  Missing required argument [type=missing_argument, input_value=ArgsKwargs((), {'limit': 3}), input_type=ArgsKwargs]", Some(r#"{"limit": 3}"#), Some(true)),
            ("1 validation error for search_docs\nlimt\n  Unexpected keyword argument [type=unexpected_keyword_argument, input_value=3, input_type=int]", Some(r#"{"query": "x"}"#), Some(true)),
            // Missing from an empty input, or no detail: cannot tell.
            ("1 validation error for Anything\nhits\n  Field required [type=missing, input_value={}, input_type=dict]", args, None),
            ("1 validation error for Anything\nhits\n  Field required", args, None),
            ("1 validation error for Anything\nhits\n  Field required [type=missing, input_value={}, input_type=dict]", None, None),
        ] {
            assert_eq!(validation_target(message, arguments), expected, "{message}");
        }
    }

    #[test]
    fn a_stage_rule_takes_the_tool_from_the_span_name() {
        let rules = Rules::builtin();
        let dspy = Fake {
            attrs: vec![("openinference.span.kind", "TOOL")],
            name: "lookup_order.__call__",
            ..fake()
        };
        let rule = rules.match_stage(&dspy, false).unwrap();
        assert_eq!(rule.set, Stage::Call);
        assert_eq!(rule.tool_in_name(dspy.name()), Some("lookup_order"));
        assert_eq!(rule.tool_in_name("lookup_order"), Some("lookup_order"));
        let err = Rules::parse(
            "[[stage]]\nid = \"x\"\nname = \"t\"\ntool_from_name = \"t\"\nset = \"call\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("rule x: tool_from_name needs a group"),
            "{err}"
        );
    }

    #[test]
    fn result_rules_compare_values_and_attribute_text() {
        let rules = Rules::parse(
            r#"
[[result]]
id = "p"
pointer = "/outcome"
value = "failed"
[[result]]
id = "any"
pointer = "/failure"
[[result]]
id = "a"
attribute = "acme.failed"
value = true
"#,
        )
        .unwrap();
        let [p, any, a] = rules.result_rules() else {
            panic!("three rules")
        };
        assert!(p.means_failure(&serde_json::json!("failed")));
        assert!(!p.means_failure(&serde_json::json!("done")));
        for (v, failed) in [
            (serde_json::json!(null), false),
            (serde_json::json!(false), false),
            (serde_json::json!(0), false),
            (serde_json::json!(""), false),
            (serde_json::json!({}), false),
            (serde_json::json!({"why": "x"}), true),
            (serde_json::json!("boom"), true),
        ] {
            assert_eq!(any.means_failure(&v), failed, "{v}");
        }
        assert!(a.text_means_failure("true"));
        assert!(!a.text_means_failure("false"));
        // Built-in: gen_ai.tool.status = error.
        let builtin = Rules::builtin();
        let status = builtin
            .result_rules()
            .iter()
            .find(|r| matches!(&r.place, ResultPlace::Attribute(k) if k == "gen_ai.tool.status"))
            .expect("built-in rule");
        assert!(status.text_means_failure("error") && !status.text_means_failure("ok"));
    }

    #[test]
    fn user_rules_come_first_and_bad_rules_say_why() {
        let user = r#"
[[stage]]
id = "my-tool"
name = "mcp\\..*"
set = "call"
[[error]]
id = "quota"
message = "quota"
set = "TOOL_ERROR"
"#;
        let rules = Rules::with_user_rules(user).unwrap();
        struct N;
        impl SpanView for N {
            fn attribute(&self, _: &str) -> Option<Cow<'_, str>> {
                None
            }
            fn kind(&self) -> &'static str {
                "internal"
            }
            fn name(&self) -> &str {
                "mcp.call"
            }
            fn parent_stage(&self) -> Option<Stage> {
                None
            }
            fn exception_types(&self) -> Vec<&str> {
                vec![]
            }
            fn messages(&self) -> Vec<&str> {
                vec![]
            }
            fn http_status(&self) -> Option<i64> {
                None
            }
        }
        assert_eq!(rules.match_stage(&N, false).unwrap().id, "my-tool");

        let err = Rules::parse("[[stage]]\nid='x'\nset='bogus'").unwrap_err();
        assert!(err.to_string().contains("allowed: agent"), "{err}");
        let err = Rules::parse("[[stage]]\nid='x'\nset='call'\nfoo=1").unwrap_err();
        assert!(err.to_string().contains("unknown field"), "{err}");
        let err = Rules::parse("[[error]]\nid='x'\nset='BOOM'").unwrap_err();
        assert!(err.to_string().contains("RETRY_EXHAUSTED"), "{err}");
        let err = Rules::parse("[[error]]\nid='x'\nmessage='('\nset='PARSE'").unwrap_err();
        assert_eq!(err.code().as_str(), "invalid_config");
    }
}
