//! Tool calls whose span status is not ERROR but whose result says they failed.

use arrow::array::{Array, AsArray};
use serde_json::json;
use toolspan_schema::columns::col;

use super::super::*;

/// One OTLP/JSON request: an agent root and, under it, `spans` given as (span id, name,
/// attributes as JSON key/value pairs, status code).
fn request(spans: &[(&str, &str, serde_json::Value, u8)]) -> Vec<u8> {
    let attr = |k: &str, v: &serde_json::Value| match v {
        serde_json::Value::Bool(b) => json!({"key": k, "value": {"boolValue": b}}),
        serde_json::Value::Number(n) => json!({"key": k, "value": {"intValue": n.to_string()}}),
        other => json!({"key": k, "value": {"stringValue": other.as_str().unwrap_or_default()}}),
    };
    let mut out = vec![json!({
        "traceId": "5b8efff798038103d269b633813fc60c", "spanId": "a000000000000001",
        "name": "invoke_agent quiet", "kind": 1,
        "startTimeUnixNano": "1764410400000000000", "endTimeUnixNano": "1764410409000000000",
        "attributes": [attr("gen_ai.operation.name", &json!("invoke_agent")),
                       attr("gen_ai.agent.name", &json!("quiet"))],
        "status": {"code": 1}
    })];
    for (i, (id, name, attrs, code)) in spans.iter().enumerate() {
        let start = 1_764_410_400_000_000_000u64 + (i as u64 + 1) * 100_000_000;
        out.push(json!({
            "traceId": "5b8efff798038103d269b633813fc60c", "spanId": id,
            "parentSpanId": "a000000000000001", "name": name, "kind": 1,
            "startTimeUnixNano": start.to_string(),
            "endTimeUnixNano": (start + 50_000_000).to_string(),
            "attributes": attrs.as_object().unwrap().iter().map(|(k, v)| attr(k, v)).collect::<Vec<_>>(),
            "status": {"code": code}
        }));
    }
    serde_json::to_vec(&json!({"resourceSpans": [{"resource": {"attributes": []},
        "scopeSpans": [{"scope": {"name": "test"}, "spans": out}]}]}))
    .unwrap()
}

fn tool(result: &str) -> serde_json::Value {
    json!({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search_docs",
           "gen_ai.tool.call.result": result})
}

/// Per span id: (status, error type, status_from_result, error_message).
fn rows(
    p: &Pipeline,
    body: &[u8],
) -> std::collections::BTreeMap<String, (String, String, bool, String)> {
    let out = p.process_bytes(body, Encoding::Json).expect("process");
    let b = &out.batch;
    let s = |n: &str| b.column_by_name(n).unwrap().as_string::<i32>().clone();
    let (ids, status, et, msg) = (
        s(col::SPAN_ID),
        s(col::STATUS),
        s(col::ERROR_TYPE),
        s(col::ERROR_MESSAGE),
    );
    let inferred = b
        .column_by_name(col::STATUS_FROM_RESULT)
        .unwrap()
        .as_boolean()
        .clone();
    (0..b.num_rows())
        .map(|r| {
            let opt = |a: &arrow::array::StringArray| {
                if a.is_null(r) {
                    String::new()
                } else {
                    a.value(r).to_string()
                }
            };
            (
                ids.value(r).to_string(),
                (
                    status.value(r).to_string(),
                    opt(&et),
                    inferred.value(r),
                    opt(&msg),
                ),
            )
        })
        .collect()
}

#[test]
fn a_tool_call_whose_result_says_it_failed_is_stored_failed() {
    let p = Pipeline::builtin();
    let body = request(&[
        (
            "b000000000000001",
            "execute_tool search_docs",
            tool(
                r#"{"error": {"code": "invalid_status", "class": "invalid_request", "message": "status must be open"}}"#,
            ),
            1,
        ),
        (
            "b000000000000002",
            "execute_tool search_docs",
            tool(
                r#"{"content": [{"type": "text", "text": "Connection refused"}], "isError": true}"#,
            ),
            0,
        ),
        (
            "b000000000000003",
            "execute_tool search_docs",
            tool(r#"{"results": [{"title": "error codes"}]}"#),
            1,
        ),
        (
            "b000000000000004",
            "execute_tool search_docs",
            tool(r#"{"hits": [], "error": null, "isError": false}"#),
            1,
        ),
        // Already failed: its status is its own, not inferred.
        (
            "b000000000000005",
            "execute_tool search_docs",
            tool(r#"{"error": "boom"}"#),
            2,
        ),
        // Not a tool call: a model's answer that mentions an error object is not a failure.
        (
            "b000000000000006",
            "chat gpt",
            json!({"gen_ai.operation.name": "chat", "output.value": r#"{"error": "x"}"#}),
            1,
        ),
    ]);
    let got = rows(&p, &body);
    let row = |id: &str| got[id].clone();
    assert_eq!(
        row("b000000000000001"),
        (
            "error".into(),
            "PREPARE".into(),
            true,
            "status must be open".into()
        )
    );
    assert_eq!(
        row("b000000000000002"),
        (
            "error".into(),
            "NETWORK".into(),
            true,
            "Connection refused".into()
        )
    );
    assert_eq!(
        row("b000000000000003"),
        ("ok".into(), "".into(), false, "".into())
    );
    assert_eq!(
        row("b000000000000004"),
        ("ok".into(), "".into(), false, "".into())
    );
    assert_eq!(row("b000000000000005").0, "error");
    assert!(
        !row("b000000000000005").2,
        "a span's own ERROR is not inferred"
    );
    assert_eq!(
        row("b000000000000006"),
        ("ok".into(), "".into(), false, "".into())
    );
    let stats = p.process_bytes(&body, Encoding::Json).unwrap().stats;
    assert_eq!(stats.errors, 3, "the inferred failures count as errors");
}

#[test]
fn user_rules_add_result_forms() {
    let rules = r#"
[[result]]
id = "acme-outcome"
pointer = "/outcome/state"
value = "failed"
message_pointer = "/outcome/reason"

[[result]]
id = "acme-flag"
attribute = "acme.tool.failed"
value = true
set = "NETWORK"
"#;
    let body = request(&[
        (
            "c000000000000001",
            "execute_tool search_docs",
            tool(r#"{"outcome": {"state": "failed", "reason": "the upstream request timed out"}}"#),
            1,
        ),
        (
            "c000000000000002",
            "execute_tool search_docs",
            tool(r#"{"outcome": {"state": "done"}}"#),
            1,
        ),
        (
            "c000000000000003",
            "execute_tool search_docs",
            json!({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search_docs", "acme.tool.failed": true}),
            1,
        ),
    ]);
    let with = rows(&Pipeline::new(Some(rules), &[]).expect("rules"), &body);
    assert_eq!(
        with["c000000000000001"],
        (
            "error".into(),
            "TOOL_ERROR".into(),
            true,
            "the upstream request timed out".into()
        )
    );
    assert_eq!(with["c000000000000002"].0, "ok");
    assert_eq!(
        with["c000000000000003"],
        ("error".into(), "NETWORK".into(), true, "".into())
    );
    let without = rows(&Pipeline::builtin(), &body);
    assert!(
        without.values().all(|r| r.0 == "ok"),
        "the built-in rules know none of these: {without:?}"
    );

    for (bad, says) in [
        (
            "[[result]]\nid='x'\nset='PARSE'",
            "exactly one of `attribute`",
        ),
        (
            "[[result]]\nid='x'\npointer='outcome'",
            "is not a JSON pointer",
        ),
        (
            "[[result]]\nid='x'\nattribute='a'\nset='BOOM'",
            "allowed: PREPARE",
        ),
    ] {
        let err = Pipeline::new(Some(bad), &[]).err().expect("refused");
        assert!(err.to_string().contains(says), "{bad}: {err}");
    }
}
