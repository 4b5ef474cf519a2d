//! The rules file: parsing, validation and matching.

use std::borrow::Cow;
use std::collections::BTreeMap;

use regex::Regex;
use serde::Deserialize;

use super::{ErrorType, Stage};
use crate::error::PipelineError;
use crate::otlp::SPAN_KINDS as KINDS;

const BUILTIN: &str = include_str!("../../rules/default.toml");

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
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RulesFile {
    #[serde(default)]
    stage: Vec<StageRuleDef>,
    #[serde(default)]
    error: Vec<ErrorRuleDef>,
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
    set: String,
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
    /// The stage the rule sets.
    pub set: Stage,
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
    /// The error type the rule sets.
    pub set: ErrorType,
}

/// The compiled rules: user rules first, then the built-in ones.
#[derive(Debug)]
pub struct Rules {
    stage: Vec<StageRule>,
    error: Vec<ErrorRule>,
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
                stage: stages,
                id,
                set,
            });
        }
        let needs_parent = stage.iter().any(|r| !r.parent_stage.is_empty());
        Ok(Rules {
            stage,
            error,
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

    /// The first error rule that matches a failed span of `stage`.
    pub fn match_error(&self, span: &dyn SpanView, stage: Stage) -> Option<&ErrorRule> {
        let types = span.exception_types();
        let messages = span.messages();
        let http = span.http_status();
        self.error.iter().find(|r| {
            if !r.stage.is_empty() && !r.stage.contains(&stage) {
                return false;
            }
            if r.exception_type.is_none() && r.message.is_none() && r.http_status.is_none() {
                return true;
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

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake {
        attrs: Vec<(&'static str, &'static str)>,
        kind: &'static str,
        parent: Option<Stage>,
        exc: Vec<&'static str>,
        http: Option<i64>,
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
            "span"
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
