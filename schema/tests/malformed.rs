//! Malformed input never panics: an error with a stable code, or a partial result with
//! rejected-span counts.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue, ArrayValue, KeyValue, KeyValueList};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use proptest::prelude::*;
use prost::Message;
use toolspan_schema::{Encoding, Pipeline};

fn span(trace: Vec<u8>, id: Vec<u8>, parent: Vec<u8>) -> Span {
    Span {
        trace_id: trace,
        span_id: id,
        parent_span_id: parent,
        name: "s".into(),
        start_time_unix_nano: 1_764_410_400_000_000_000,
        end_time_unix_nano: 1_764_410_400_100_000_000,
        status: Some(Status { code: 2, message: "x".into() }),
        ..Default::default()
    }
}

fn request(spans: Vec<Span>) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource { attributes: vec![], ..Default::default() }),
            scope_spans: vec![ScopeSpans { spans, ..Default::default() }],
            ..Default::default()
        }],
    }
}

#[test]
fn truncated_and_garbage_protobuf_get_a_stable_code() {
    let p = Pipeline::builtin();
    let good = request(vec![span(vec![1; 16], vec![2; 8], vec![])]).encode_to_vec();
    for cut in 1..good.len() {
        match p.process_bytes(&good[..cut], Encoding::Protobuf) {
            Ok(r) => assert!(r.batch.num_rows() <= 1),
            Err(e) => assert_eq!(e.code().as_str(), "otlp_decode"),
        }
    }
    let err = p.process_bytes(b"\xff\xff\xff\xff garbage", Encoding::Protobuf).unwrap_err();
    assert_eq!(err.code().as_str(), "otlp_decode");
    // A string field with invalid UTF-8.
    let mut bad = good.clone();
    if let Some(pos) = bad.windows(1).position(|w| w == b"s") {
        bad[pos] = 0xff;
    }
    match p.process_bytes(&bad, Encoding::Protobuf) {
        Ok(r) => assert!(r.batch.num_rows() <= 1),
        Err(e) => assert_eq!(e.code().as_str(), "otlp_decode"),
    }
}

#[test]
fn short_empty_or_zero_ids_are_rejected_with_counts() {
    let p = Pipeline::builtin();
    let req = request(vec![
        span(vec![1; 16], vec![2; 8], vec![]),
        span(vec![], vec![3; 8], vec![]),
        span(vec![1; 15], vec![3; 8], vec![]),
        span(vec![0; 16], vec![3; 8], vec![]),
        span(vec![1; 16], vec![3; 4], vec![]),
        span(vec![1; 16], vec![0; 8], vec![]),
        span(vec![1; 16], vec![4; 8], vec![9; 3]),
    ]);
    let out = p.process(&req).unwrap();
    assert_eq!(out.batch.num_rows(), 1);
    assert_eq!(out.stats.rejected.bad_trace_id, 3);
    assert_eq!(out.stats.rejected.bad_span_id, 2);
    assert_eq!(out.stats.rejected.bad_parent_id, 1);
    assert!(out.stats.rejected.message().contains("trace id"));
}

#[test]
fn wrong_field_types_in_json_get_a_stable_code() {
    let p = Pipeline::builtin();
    for body in [
        &br#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":5}]}]}]}"#[..],
        br#"{"resourceSpans":[{"scopeSpans":[{"spans":"nope"}]}]}"#,
        br#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"attributes":[{"key":"a","value":{"intValue":"1.5x"}}]}]}]}]}"#,
        br#"[1,2,3]"#,
        b"{\"resourceSpans\":[{\"scopeSpans\":[{\"spans\":[{\"name\":\"\xff\xfe\"}]}]}]}",
    ] {
        let err = p.process_bytes(body, Encoding::Json).unwrap_err();
        assert_eq!(err.code().as_str(), "otlp_json");
    }
}

fn nested(depth: usize) -> AnyValue {
    let mut v = AnyValue { value: Some(Value::StringValue("leaf".into())) };
    for i in 0..depth {
        v = if i % 2 == 0 {
            AnyValue { value: Some(Value::ArrayValue(ArrayValue { values: vec![v] })) }
        } else {
            AnyValue {
                value: Some(Value::KvlistValue(KeyValueList {
                    values: vec![KeyValue { key: "k".into(), value: Some(v), ..Default::default() }],
                })),
            }
        };
    }
    v
}

#[test]
fn deep_nesting_is_bounded_or_refused() {
    let p = Pipeline::builtin();
    // Within prost's recursion limit: decoded, rendered with a depth cap.
    let mut s = span(vec![1; 16], vec![2; 8], vec![]);
    s.attributes.push(KeyValue { key: "deep".into(), value: Some(nested(40)), ..Default::default() });
    let out = p.process_bytes(&request(vec![s]).encode_to_vec(), Encoding::Protobuf).unwrap();
    assert_eq!(out.batch.num_rows(), 1);
    let attrs = crate::common::all_strings(&out.batch).into_iter().find(|s| s.contains("deep")).unwrap();
    assert!(attrs.contains("nested too deep"));
    serde_json::from_str::<serde_json::Value>(&attrs).expect("attributes stay valid JSON");
    // Past it: an error with a code, not a stack overflow.
    let mut s = span(vec![1; 16], vec![2; 8], vec![]);
    s.attributes.push(KeyValue { key: "deeper".into(), value: Some(nested(5000)), ..Default::default() });
    let bytes = request(vec![s]).encode_to_vec();
    let err = p.process_bytes(&bytes, Encoding::Protobuf).unwrap_err();
    assert_eq!(err.code().as_str(), "otlp_decode");
    let deep_json = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let err = p.process_bytes(deep_json.as_bytes(), Encoding::Json).unwrap_err();
    assert_eq!(err.code().as_str(), "otlp_json");
}

#[test]
fn a_million_attributes_are_bounded() {
    let p = Pipeline::builtin();
    let mut s = span(vec![1; 16], vec![2; 8], vec![]);
    s.attributes = (0..1_000_000)
        .map(|i| KeyValue {
            key: format!("k{i}"),
            value: Some(AnyValue { value: Some(Value::IntValue(i)) }),
            ..Default::default()
        })
        .collect();
    let out = p.process(&request(vec![s])).unwrap();
    assert_eq!(out.batch.num_rows(), 1);
    let attrs = crate::common::all_strings(&out.batch).into_iter().find(|s| s.contains("k0")).unwrap();
    assert!(attrs.len() < 40 * 1024, "attributes text is bounded, got {}", attrs.len());
    let v: serde_json::Value = serde_json::from_str(&attrs).unwrap();
    assert!(v["toolspan.dropped_attributes"].as_u64().unwrap() > 900_000);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, .. ProptestConfig::default() })]

    /// Arbitrary bytes never panic either decoder.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let p = Pipeline::builtin();
        let _ = p.process_bytes(&bytes, Encoding::Protobuf);
        let _ = p.process_bytes(&bytes, Encoding::Json);
    }

    /// Mutations of a valid request never panic, and what decodes keeps its invariants.
    #[test]
    fn mutated_requests_never_panic(flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8)) {
        let p = Pipeline::builtin();
        let mut s = span(vec![1; 16], vec![2; 8], vec![3; 8]);
        s.attributes.push(KeyValue { key: "gen_ai.tool.name".into(), value: Some(AnyValue { value: Some(Value::StringValue("search_docs".into())) }), ..Default::default() });
        let mut bytes = request(vec![s, span(vec![1; 16], vec![3; 8], vec![])]).encode_to_vec();
        for (pos, b) in flips {
            let n = bytes.len();
            bytes[pos % n] = b;
        }
        if let Ok(out) = p.process_bytes(&bytes, Encoding::Protobuf) {
            prop_assert_eq!(out.batch.num_rows() as u64, out.stats.spans);
        }
    }
}
