//! Malformed input never panics: an error with a stable code, or a partial result with
//! rejected-span counts.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{
    any_value::Value, AnyValue, ArrayValue, KeyValue, KeyValueList,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use proptest::prelude::*;
use prost::Message;
use toolspan_pipeline::{Encoding, Pipeline};

fn span(trace: Vec<u8>, id: Vec<u8>, parent: Vec<u8>) -> Span {
    Span {
        trace_id: trace,
        span_id: id,
        parent_span_id: parent,
        name: "s".into(),
        start_time_unix_nano: 1_764_410_400_000_000_000,
        end_time_unix_nano: 1_764_410_400_100_000_000,
        status: Some(Status {
            code: 2,
            message: "x".into(),
        }),
        ..Default::default()
    }
}

fn request(spans: Vec<Span>) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..Default::default()
            }],
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
    let err = p
        .process_bytes(b"\xff\xff\xff\xff garbage", Encoding::Protobuf)
        .unwrap_err();
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

/// A wrong-typed field may hold a secret: the error (its Display, which the receiver returns
/// and logs, and its Debug) names the field and the problem, never the value.
#[test]
fn json_errors_never_echo_the_value() {
    let p = Pipeline::builtin();
    let token = "ghp_1234567890abcdefghijklmnopqrstuvwxyzAB";
    let spans =
        |span: &str| format!(r#"{{"resourceSpans":[{{"scopeSpans":[{{"spans":[{span}]}}]}}]}}"#);
    for (body, secret, field) in [
        (
            spans(&format!(
                r#"{{"attributes":[{{"key":"password","value":{{"boolValue":"{token}"}}}}]}}"#
            )),
            token,
            "boolValue",
        ),
        (
            spans(r#"{"attributes":[{"key":"pin","value":{"stringValue":4111111111111111}}]}"#),
            "4111111111111111",
            "stringValue",
        ),
        (
            spans(r#"{"attributes":[{"key":"k","value":{"intValue":"hunter2-Sup3rS3cret"}}]}"#),
            "hunter2-Sup3rS3cret",
            "intValue",
        ),
        (
            spans(r#"{"attributes":[{"key":"k","value":{"doubleValue":"AKIAIOSFODNN7EXAMPLE"}}]}"#),
            "AKIAIOSFODNN7EXAMPLE",
            "doubleValue",
        ),
        (
            spans(
                r#"{"attributes":[{"key":"k","value":{"kvlistValue":"password=Hunter2-Sup3rS3cret"}}]}"#,
            ),
            "Hunter2-Sup3rS3cret",
            "kvlistValue",
        ),
        (
            spans(r#"{"name":["sk-proj-abcdefghijklmnopqrstuvwxyz0123456789"]}"#),
            "abcdefghijklmnopqrstuvwxyz0123456789",
            "name",
        ),
        (
            spans(r#"{"status":{"message":{"token":"tok9f8e7d6c5b4a3f2e1d"}}}"#),
            "tok9f8e7d6c5b4a3f2e1d",
            "message",
        ),
        (
            spans(r#"{"traceId":1234567890123456789}"#),
            "1234567890123456789",
            "traceId",
        ),
        (
            spans(r#"{"endTimeUnixNano":"secret-end-time-Zq81Xv"}"#),
            "Zq81Xv",
            "endTimeUnixNano",
        ),
        (
            r#"{"resourceSpans":[{"resource":{"attributes":"x-api-key: XAPIKEY0987654321abc"}}]}"#
                .to_string(),
            "XAPIKEY0987654321abc",
            "attributes",
        ),
    ] {
        let err = p
            .process_bytes(body.as_bytes(), Encoding::Json)
            .unwrap_err();
        assert_eq!(err.code().as_str(), "otlp_json");
        for shown in [err.to_string(), format!("{err:?}")] {
            assert!(!shown.contains(secret), "{secret:?} echoed in {shown:?}");
            assert!(shown.contains(field), "{shown:?} does not name {field}");
        }
    }
}

/// A length-delimited protobuf field.
fn ld(field: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 8);
    prost::encoding::encode_key(field, prost::encoding::WireType::LengthDelimited, &mut out);
    prost::encoding::encode_varint(payload.len() as u64, &mut out);
    out.extend_from_slice(payload);
    out
}

fn nested(depth: usize) -> AnyValue {
    let mut v = AnyValue {
        value: Some(Value::StringValue("leaf".into())),
    };
    for i in 0..depth {
        v = if i % 2 == 0 {
            AnyValue {
                value: Some(Value::ArrayValue(ArrayValue { values: vec![v] })),
            }
        } else {
            AnyValue {
                value: Some(Value::KvlistValue(KeyValueList {
                    values: vec![KeyValue {
                        key: "k".into(),
                        value: Some(v),
                        ..Default::default()
                    }],
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
    s.attributes.push(KeyValue {
        key: "deep".into(),
        value: Some(nested(20)),
        ..Default::default()
    });
    let out = p
        .process_bytes(&request(vec![s]).encode_to_vec(), Encoding::Protobuf)
        .unwrap();
    assert_eq!(out.batch.num_rows(), 1);
    let attrs = crate::common::all_strings(&out.batch)
        .into_iter()
        .find(|s| s.contains("deep"))
        .unwrap();
    assert!(attrs.contains("nested too deep"));
    serde_json::from_str::<serde_json::Value>(&attrs).expect("attributes stay valid JSON");
    // Past it: an error with a code, not a stack overflow.
    // Encoded by hand: building (and dropping) a 5,000-deep value in the test would itself
    // overflow the stack.
    let mut value = ld(1, b"leaf");
    for _ in 0..5000 {
        value = ld(5, &ld(1, &value));
    }
    let kv = [ld(1, b"deeper"), ld(2, &value)].concat();
    let mut span_bytes = [ld(1, &[1; 16]), ld(2, &[2; 8]), ld(5, b"s")].concat();
    span_bytes.push(7 << 3 | 1);
    span_bytes.extend_from_slice(&1_764_410_400_000_000_000u64.to_le_bytes());
    span_bytes.extend(ld(9, &kv));
    let bytes = ld(1, &ld(2, &ld(2, &span_bytes)));
    let err = p.process_bytes(&bytes, Encoding::Protobuf).unwrap_err();
    assert_eq!(err.code().as_str(), "otlp_decode");
    let deep_json = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let err = p
        .process_bytes(deep_json.as_bytes(), Encoding::Json)
        .unwrap_err();
    assert_eq!(err.code().as_str(), "otlp_json");
}

#[test]
fn a_million_attributes_are_bounded() {
    let p = Pipeline::builtin();
    let mut s = span(vec![1; 16], vec![2; 8], vec![]);
    s.attributes = (0..1_000_000)
        .map(|i| KeyValue {
            key: format!("k{i}"),
            value: Some(AnyValue {
                value: Some(Value::IntValue(i)),
            }),
            ..Default::default()
        })
        .collect();
    let out = p.process(&request(vec![s])).unwrap();
    assert_eq!(out.batch.num_rows(), 1);
    let attrs = crate::common::all_strings(&out.batch)
        .into_iter()
        .find(|s| s.contains("k0"))
        .unwrap();
    assert!(
        attrs.len() < 40 * 1024,
        "attributes text is bounded, got {}",
        attrs.len()
    );
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

/// A time-boxed mutation fuzzer over real inputs (the Python SDK's golden requests and the
/// fleet's traffic): bit flips, byte changes, truncations, duplications, insertions and
/// splices. Runs `TOOLSPAN_FUZZ_SECONDS` (default 60 under CI, 5 otherwise). Each result is
/// an error with a stable code or a batch whose JSON columns still parse.
#[test]
fn fuzz_mutations_for_a_while() {
    use rand::{Rng, SeedableRng};
    let secs: u64 = std::env::var("TOOLSPAN_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if std::env::var_os("CI").is_some() {
            60
        } else {
            5
        });
    let seed: u64 = std::env::var("TOOLSPAN_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("fuzzing for {secs} s with TOOLSPAN_FUZZ_SEED={seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);

    let inputs = crate::common::generate_golden_inputs();
    let mut seeds: Vec<(Vec<u8>, Encoding)> = Vec::new();
    for entry in std::fs::read_dir(inputs.path()).unwrap() {
        let path = entry.unwrap().path();
        let enc = if path.extension().is_some_and(|e| e == "json") {
            Encoding::Json
        } else {
            Encoding::Protobuf
        };
        seeds.push((std::fs::read(&path).unwrap(), enc));
    }
    let mut fleet = toolspan_gen::Fleet::new(toolspan_gen::FleetConfig::default());
    for k in 0..5 {
        seeds.push((
            fleet
                .request(5, 1_764_410_400_000_000_000 + k, 1_000_000)
                .encode_to_vec(),
            Encoding::Protobuf,
        ));
    }

    let p = Pipeline::builtin();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    let (mut runs, mut ok, mut errs) = (0u64, 0u64, 0u64);
    while std::time::Instant::now() < deadline {
        let (base, enc) = &seeds[rng.random_range(0..seeds.len())];
        let mut b = base.clone();
        for _ in 0..rng.random_range(1..6) {
            if b.is_empty() {
                break;
            }
            let n = b.len();
            match rng.random_range(0..6) {
                0 => b[rng.random_range(0..n)] ^= 1 << rng.random_range(0..8),
                1 => b[rng.random_range(0..n)] = rng.random(),
                2 => b.truncate(rng.random_range(0..n)),
                3 => {
                    let at = rng.random_range(0..n);
                    let len = rng.random_range(0..(n - at).min(64) + 1);
                    let chunk = b[at..at + len].to_vec();
                    let to = rng.random_range(0..=b.len());
                    b.splice(to..to, chunk);
                }
                4 => {
                    let to = rng.random_range(0..=n);
                    let junk: Vec<u8> =
                        (0..rng.random_range(1..16)).map(|_| rng.random()).collect();
                    b.splice(to..to, junk);
                }
                _ => {
                    let (other, _) = &seeds[rng.random_range(0..seeds.len())];
                    if !other.is_empty() {
                        let from = rng.random_range(0..other.len());
                        let to = rng.random_range(0..=b.len());
                        b.truncate(to);
                        b.extend_from_slice(&other[from..]);
                    }
                }
            }
        }
        runs += 1;
        match p.process_bytes(&b, *enc) {
            Ok(out) => {
                ok += 1;
                assert_eq!(out.batch.num_rows() as u64, out.stats.spans);
                if runs % 25 == 0 {
                    for name in ["attributes", "resource_attributes", "events"] {
                        let col = out.batch.column_by_name(name).unwrap();
                        let col = col
                            .as_any()
                            .downcast_ref::<arrow::array::StringArray>()
                            .unwrap();
                        for v in col.iter().flatten() {
                            serde_json::from_str::<serde_json::Value>(v).unwrap_or_else(|e| {
                                panic!("seed {seed}: {name} is not JSON ({e}): {v}")
                            });
                        }
                    }
                }
            }
            Err(e) => {
                errs += 1;
                assert!(
                    matches!(e.code().as_str(), "otlp_decode" | "otlp_json"),
                    "seed {seed}: {e}"
                );
            }
        }
    }
    eprintln!("fuzz: {runs} inputs, {ok} decoded, {errs} refused with a code");
    assert!(runs > 100, "the fuzzer ran");
}
