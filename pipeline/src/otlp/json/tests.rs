use super::*;

#[test]
fn accepts_strings_numbers_enum_names_and_unknown_fields() {
    let body = br#"{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"svc"}}]},
      "scopeSpans":[{"scope":{"name":"s"},"spans":[
        {"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174","name":"a","kind":"SPAN_KIND_CLIENT",
         "startTimeUnixNano":"1544712660000000000","endTimeUnixNano":1544712661000000000,
         "attributes":[{"key":"n","value":{"intValue":"42"}},{"key":"m","value":{"intValue":7}},{"key":"d","value":{"doubleValue":"NaN"}}],
         "status":{"code":2,"message":"boom"},"somethingNew":{"x":1}},
        {"trace_id":"W47/95gDgQPSabYzgT/GDA==","span_id":"7uGbfsPBsXQ=","name":"b","kind":3,"status":{"code":"STATUS_CODE_ERROR"}}
      ]}]}]}"#;
    let req = decode_json(body).unwrap();
    let spans = &req.resource_spans[0].scope_spans[0].spans;
    assert_eq!(spans.len(), 2);
    assert_eq!(spans[0].kind, 3);
    assert_eq!(spans[0].start_time_unix_nano, 1_544_712_660_000_000_000);
    assert_eq!(spans[0].end_time_unix_nano, 1_544_712_661_000_000_000);
    assert_eq!(spans[0].status.as_ref().unwrap().code, 2);
    assert_eq!(
        spans[1].trace_id, spans[0].trace_id,
        "base64 ids decode to the same bytes as hex"
    );
    assert_eq!(spans[1].status.as_ref().unwrap().code, 2);
    use pc::any_value::Value;
    assert_eq!(
        spans[0].attributes[0].value.as_ref().unwrap().value,
        Some(Value::IntValue(42))
    );
    assert_eq!(
        spans[0].attributes[1].value.as_ref().unwrap().value,
        Some(Value::IntValue(7))
    );
}

#[test]
fn wrong_types_are_errors_with_a_code() {
    for body in [
        &br#"{"resourceSpans":"x"}"#[..],
        br#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"startTimeUnixNano":"abc"}]}]}]}"#,
        b"\xff\xfe",
        b"",
    ] {
        let err = decode_json(body).unwrap_err();
        assert_eq!(err.code().as_str(), "otlp_json");
    }
}

/// A body with `value` where the field at `field` (a JSON fragment ending in the key) is.
fn attribute_body(value: &str) -> String {
    format!(
        r#"{{"resourceSpans":[{{"scopeSpans":[{{"spans":[{{"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174","name":"a",
        "attributes":[{{"key":"n","value":{{"intValue":"1"}}}},{{"key":"password","value":{value}}}]}}]}}]}}]}}"#
    )
}

#[test]
fn errors_name_the_field_never_the_value() {
    let token = "ghp_1234567890abcdefghijklmnopqrstuvwxyzAB";
    for (body, secret, path, problem) in [
        (
            attribute_body(&format!(r#"{{"boolValue":"{token}"}}"#)),
            token,
            "resourceSpans[0].scopeSpans[0].spans[0].attributes[1].value.boolValue",
            "got a string, expected a boolean",
        ),
        (
            attribute_body(r#"{"stringValue":4111111111111111}"#),
            "4111111111111111",
            "resourceSpans[0].scopeSpans[0].spans[0].attributes[1].value.stringValue",
            "got an integer, expected a string",
        ),
        (
            attribute_body(r#"{"intValue":"hunter2-Sup3rS3cret"}"#),
            "hunter2-Sup3rS3cret",
            "resourceSpans[0].scopeSpans[0].spans[0].attributes[1].value.intValue",
            NOT_INTEGER_STRING,
        ),
        (
            attribute_body(r#"{"arrayValue":"password=hunter2-Sup3rS3cret"}"#),
            "hunter2-Sup3rS3cret",
            "resourceSpans[0].scopeSpans[0].spans[0].attributes[1].value.arrayValue",
            "got a string, expected an object",
        ),
        (
            attribute_body(r#"{"bytesValue":31415926535897932}"#),
            "31415926535897932",
            "resourceSpans[0].scopeSpans[0].spans[0].attributes[1].value.bytesValue",
            "got an integer, expected a string",
        ),
        (
            r#"{"resourceSpans":"AKIAIOSFODNN7EXAMPLE"}"#.to_string(),
            "AKIAIOSFODNN7EXAMPLE",
            "resourceSpans",
            "got a string, expected an array",
        ),
        (
            r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"name":"x","status":{"message":"m","code":{"name":"secret-code-Zq81"}}}]}]}]}"#.to_string(),
            "Zq81",
            "resourceSpans[0].scopeSpans[0].spans[0].status.code",
            "expected an integer or an enum value name",
        ),
        (
            "{\n \"resourceSpans\": [\n  {\"scopeSpans\": [{\"spans\": [{\"startTimeUnixNano\": \"tok9f8e7d6c5b4a3f2e1d\"}]}]}\n ]\n}".to_string(),
            "tok9f8e7d6c5b4a3f2e1d",
            "resourceSpans[0].scopeSpans[0].spans[0].startTimeUnixNano",
            NOT_UNSIGNED_STRING,
        ),
        (
            // A key the mapping does not have is input too: shown as `?`.
            r#"{"resourceSpans":[{"hunter2-Sup3rS3cret":1,"scopeSpans":[{"spans":[{"traceId":["hunter2-Sup3rS3cret"]}]}]}]}"#.to_string(),
            "hunter2-Sup3rS3cret",
            "resourceSpans[0].scopeSpans[0].spans[0].traceId",
            "got an array, expected a string",
        ),
    ] {
        let err = decode_json(body.as_bytes()).unwrap_err();
        assert_eq!(err.code().as_str(), "otlp_json");
        for shown in [err.to_string(), format!("{err:?}")] {
            assert!(!shown.contains(secret), "{secret:?} echoed in {shown:?}");
            assert!(shown.contains(&format!("{path}: {problem} (line ")), "{shown:?} lacks {path}: {problem}");
        }
    }
}

#[test]
fn paths_show_only_field_names() {
    let body = br#"{"resourceSpans":[{"sk-proj-abcdefghijklmnopqrstuvwxyz0123456789":[1,{"x":"y"}], "resource":{"attributes":[{"key":"k","value":{"boolValue":1}}]}}]}"#;
    let err = decode_json(body).unwrap_err().to_string();
    assert!(err.contains("resourceSpans[0].resource.attributes[0].value.boolValue: got an integer, expected a boolean"), "{err}");
    let e =
        serde_json::from_slice::<serde_json::Value>(br#"{"a":{"sk-proj-abc":[1,2,"#).unwrap_err();
    assert_eq!(e.classify(), serde_json::error::Category::Eof);
    let path = path_at(br#"{"a":{"sk-proj-abc":[1,2,"#, 1, 25);
    assert_eq!(path, "?.?[2]");
    assert!(FIELDS
        .split(' ')
        .all(|f| !f.is_empty() && f.bytes().all(|c| c.is_ascii_alphabetic() || c == b'_')));
    assert_eq!(path_at(b"{}", 0, 0), "body");
    assert_eq!(path_at(b"", 1, 0), "body");
    let deep = "[".repeat(1000);
    let p = path_at(deep.as_bytes(), 1, 1000);
    assert!(
        p.starts_with('…') && p.chars().count() <= PATH_LIMIT + 2,
        "{p}"
    );
}

#[test]
fn syntax_errors_keep_their_fixed_wording() {
    for body in [
        &br#"{"resourceSpans":[{"scopeSpans":"hunter2"#[..],
        br#"{"resourceSpans": hunter2}"#,
        b"{\"a\":\"hunter2\x01\"}",
    ] {
        let err = decode_json(body).unwrap_err().to_string();
        assert!(!err.contains("hunter2"), "{err}");
        assert!(err.contains(" at line 1 column "), "{err}");
    }
}
