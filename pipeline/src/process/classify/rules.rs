//! The rules file: parsing, validation and matching. What a pydantic validation error
//! validated, which a rule may ask, is judged in `validation.rs`.

use std::borrow::Cow;
use std::collections::BTreeMap;

use regex::Regex;
use serde::Deserialize;

use super::{ErrorType, Stage};
use crate::error::PipelineError;
use crate::otlp::SPAN_KINDS as KINDS;
use validation::validation_target;

mod validation;

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
mod tests;
