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
