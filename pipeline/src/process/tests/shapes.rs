//! The shape columns: taken from the full payload, whatever the stored text keeps of it.

use arrow::array::{Array, AsArray};
use serde_json::json;
use toolspan_schema::columns::{col, PAYLOAD_LIMIT};
use toolspan_schema::shape;

use super::super::*;

/// One OTLP/JSON request holding one tool call span with these arguments and result.
fn call(arguments: &str, result: Option<&str>) -> Vec<u8> {
    let mut attrs = vec![
        json!({"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}}),
        json!({"key": "gen_ai.tool.name", "value": {"stringValue": "search_docs"}}),
        json!({"key": "gen_ai.tool.call.arguments", "value": {"stringValue": arguments}}),
    ];
    if let Some(r) = result {
        attrs.push(json!({"key": "gen_ai.tool.call.result", "value": {"stringValue": r}}));
    }
    serde_json::to_vec(&json!({"resourceSpans": [{"resource": {"attributes": []},
        "scopeSpans": [{"scope": {"name": "test"}, "spans": [{
            "traceId": "5b8efff798038103d269b633813fc60c", "spanId": "a000000000000002",
            "name": "execute_tool search_docs", "kind": 1,
            "startTimeUnixNano": "1764410400000000000", "endTimeUnixNano": "1764410401000000000",
            "attributes": attrs, "status": {"code": 1}}]}]}]}))
    .expect("json")
}

/// (output text, output_shape, output_shape_doc, input_shape, input_shape_doc) of the one row.
fn row(body: &[u8]) -> [Option<String>; 5] {
    let out = Pipeline::builtin()
        .process_bytes(body, Encoding::Json)
        .expect("process");
    let b = &out.batch;
    assert_eq!(b.num_rows(), 1);
    [
        col::OUTPUT,
        col::OUTPUT_SHAPE,
        col::OUTPUT_SHAPE_DOC,
        col::INPUT_SHAPE,
        col::INPUT_SHAPE_DOC,
    ]
    .map(|c| {
        let a = b.column_by_name(c).expect("column").as_string::<i32>();
        (!a.is_null(0)).then(|| a.value(0).to_string())
    })
}

#[test]
fn a_truncated_payload_still_has_the_shape_of_its_full_body() {
    // 200 hits, then a field after them: far past the 4 KiB the row keeps.
    let hits: Vec<_> = (0..200)
        .map(|i| json!({"title": format!("page {i}"), "url": format!("https://docs.example.com/{i}")}))
        .collect();
    let full = json!({"hits": hits, "total": 200}).to_string();
    assert!(full.len() > 2 * PAYLOAD_LIMIT);
    let [text, id, doc, in_id, in_doc] = row(&call(r#"{"query":"keys","limit":5}"#, Some(&full)));
    let text = text.expect("output kept");
    assert!(
        text.len() <= PAYLOAD_LIMIT && !text.contains("total"),
        "cut"
    );
    let doc = doc.expect("a shape");
    assert_eq!(
        doc, r#"{"hits":[{"title":"string","url":"string"}],"total":"number"}"#,
        "the field after the cut is in the shape"
    );
    assert_eq!(id.as_deref(), Some(shape::id(&doc).as_str()));
    assert_eq!(
        in_doc.as_deref(),
        Some(r#"{"limit":"number","query":"string"}"#)
    );
    assert_eq!(
        in_id,
        Some(shape::id(in_doc.as_deref().unwrap_or_default()))
    );
    // The cut text alone is not JSON: had the shape been taken from it, it would be `text`.
    assert_eq!(shape::of_text(&text), "text");
}

#[test]
fn a_renamed_field_is_another_shape_and_a_missing_payload_none() {
    let url = row(&call("{}", Some(r#"{"hits":[{"title":"a","url":"u"}]}"#)));
    let link = row(&call("{}", Some(r#"{"hits":[{"link":"u","title":"b"}]}"#)));
    assert_ne!(url[1], link[1]);
    assert_eq!(url[3], link[3], "the same arguments' shape");
    let none = row(&call("{}", None));
    assert_eq!((none[1].clone(), none[2].clone()), (None, None));
}

#[test]
fn a_payload_that_is_not_json_has_its_kind_as_its_shape() {
    for (result, kind) in [
        ("<!doctype html><html><body>hi</body></html>", "html"),
        ("Traceback (most recent call last):\n  File x", "text"),
        ("", "empty"),
    ] {
        let [_, id, doc, ..] = row(&call("{}", Some(result)));
        assert_eq!((id.as_deref(), doc.as_deref()), (Some(kind), Some(kind)));
    }
}
