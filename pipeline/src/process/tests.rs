//! Tests of the pipeline: in-place reading vs prost, the accumulator, split traces.

use prost::Message;
use rand::{Rng, SeedableRng};
use toolspan_gen::{Fleet, FleetConfig};

use super::*;

/// The in-place protobuf reader and prost's types give the same batch and stats, or the
/// same error.
fn assert_same(p: &Pipeline, bytes: &[u8]) {
    let fast = p.process_bytes(bytes, Encoding::Protobuf);
    let slow = otlp::decode_protobuf(bytes).and_then(|r| p.process(&r));
    match (fast, slow) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a.batch, b.batch);
            assert_eq!(format!("{:?}", a.stats), format!("{:?}", b.stats));
        }
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
        (a, b) => panic!(
            "fast {:?} vs prost {:?}",
            a.map(|o| o.stats),
            b.map(|o| o.stats)
        ),
    }
}

#[test]
fn an_accumulator_gives_the_rows_of_the_requests_one_by_one() {
    let p = Pipeline::builtin();
    let mut fleet = Fleet::new(FleetConfig {
        seed: 3,
        payloads: true,
        failure_scale: 3.0,
    });
    let mut acc = Accumulator::new();
    let mut one_by_one = Vec::new();
    let mut spans = 0;
    for i in 0..6u64 {
        let bytes = fleet
            .request(3, 1_764_410_400_000_000_000 + i * 1_000_000_000, 1_000_000)
            .encode_to_vec();
        let single = p
            .process_bytes(&bytes, Encoding::Protobuf)
            .expect("process");
        let stats = acc.add_bytes(&p, &bytes, Encoding::Protobuf).expect("add");
        assert_eq!(format!("{stats:?}"), format!("{:?}", single.stats));
        spans += single.batch.num_rows();
        one_by_one.push(single.batch);
        // Garbage appends nothing.
        assert!(acc
            .add_bytes(&p, b"\xff\xff garbage", Encoding::Protobuf)
            .is_err());
    }
    assert_eq!(acc.rows(), spans);
    let batch = acc.take().expect("finish").expect("rows");
    let expected = arrow::compute::concat_batches(&toolspan_schema::spans_schema(), &one_by_one)
        .expect("concat");
    assert_eq!(batch, expected);
    assert_eq!(acc.rows(), 0);
    assert!(acc.take().expect("empty").is_none());
}

/// Every row of `batches` by span id: the classification columns, as text.
pub(super) fn classified(
    batches: &[RecordBatch],
) -> std::collections::BTreeMap<String, Vec<String>> {
    use arrow::util::display::array_value_to_string;
    use toolspan_schema::columns::col;
    let mut out = std::collections::BTreeMap::new();
    for b in batches {
        let c = |n: &str| b.column_by_name(n).expect("column").clone();
        let cols = [
            col::TOOL,
            col::STAGE,
            col::CALL_ID,
            col::ATTEMPT,
            col::STATUS,
            col::ERROR_TYPE,
        ]
        .map(c);
        let ids = c(col::SPAN_ID);
        for r in 0..b.num_rows() {
            let id = array_value_to_string(&ids, r).expect("id");
            let vals = cols
                .iter()
                .map(|a| array_value_to_string(a, r).expect("value"))
                .collect();
            out.insert(id, vals);
        }
    }
    out
}

/// The fleet's request split into one request per span, in end-time order (children
/// before parents, as exporters send them) or start-time order (parents first).
pub(super) fn one_span_per_request(
    req: &ExportTraceServiceRequest,
    children_first: bool,
) -> Vec<ExportTraceServiceRequest> {
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};
    // Depth in the trace tree breaks ties of equal times (a stage that starts with its
    // attempt, a call that ends with its last stage).
    let parents: HashMap<Vec<u8>, Vec<u8>> = req
        .resource_spans
        .iter()
        .flat_map(|rs| &rs.scope_spans)
        .flat_map(|ss| &ss.spans)
        .map(|s| (s.span_id.clone(), s.parent_span_id.clone()))
        .collect();
    let depth = |id: &[u8]| -> u64 {
        let (mut d, mut cur) = (0u64, id.to_vec());
        while let Some(p) = parents.get(&cur).filter(|p| !p.is_empty() && d < 256) {
            d += 1;
            cur = p.clone();
        }
        d
    };
    let mut pieces = Vec::new();
    for rs in &req.resource_spans {
        for ss in &rs.scope_spans {
            for s in &ss.spans {
                let d = depth(&s.span_id);
                let key = if children_first {
                    (s.end_time_unix_nano, u64::MAX - d)
                } else {
                    (d, s.start_time_unix_nano)
                };
                let one = ExportTraceServiceRequest {
                    resource_spans: vec![ResourceSpans {
                        resource: rs.resource.clone(),
                        scope_spans: vec![ScopeSpans {
                            scope: ss.scope.clone(),
                            spans: vec![s.clone()],
                            schema_url: ss.schema_url.clone(),
                        }],
                        schema_url: rs.schema_url.clone(),
                    }],
                };
                pieces.push((key, one));
            }
        }
    }
    pieces.sort_by_key(|(k, _)| *k);
    pieces.into_iter().map(|(_, r)| r).collect()
}

/// Split traces: with the trace memory, a call or attempt exported after its
/// failed stages and attempts takes the same error type and attempt count as in a whole
/// trace, and a span exported after its parent inherits the same tool, call id and
/// attempt. Without the memory both differ (the test would fail).
#[test]
fn a_trace_split_into_one_span_per_request_classifies_as_a_whole() {
    let mut fleet = Fleet::new(FleetConfig {
        seed: 11,
        payloads: false,
        failure_scale: 4.0,
    });
    let req = fleet.request(60, 1_764_410_400_000_000_000, 1_000_000_000);
    let whole = classified(&[Pipeline::builtin().process(&req).expect("whole").batch]);
    let stage = |v: &Vec<String>| v[1].clone();

    for (children_first, memory) in [(true, true), (false, true), (true, false)] {
        let p = if memory {
            Pipeline::builtin()
        } else {
            Pipeline::builtin().with_memory(MemoryConfig::off())
        };
        let batches: Vec<RecordBatch> = one_span_per_request(&req, children_first)
            .iter()
            .map(|r| p.process(r).expect("piece").batch)
            .collect();
        let split = classified(&batches);
        assert_eq!(split.len(), whole.len());
        let mut differ = 0;
        for (id, w) in &whole {
            let s = &split[id];
            let same = if children_first {
                // Calls and attempts: their status, error type and attempt count.
                !matches!(stage(w).as_str(), "call" | "attempt") || (w[3..] == s[3..])
            } else {
                // Everything inherited: tool, call id, attempt (a call's attempt column
                // counts its attempts, which come after it in this order).
                w[0] == s[0] && w[2] == s[2] && (stage(w) == "call" || w[3] == s[3])
            };
            if !same {
                differ += 1;
                assert!(!memory, "span {id}: whole {w:?}, split {s:?}");
            }
        }
        if !memory {
            assert!(
                differ > 0,
                "without memory the split must differ (else the test proves nothing)"
            );
        }
    }
}

#[test]
fn in_place_reading_matches_prost_on_fleet_traffic() {
    let p = Pipeline::builtin();
    for seed in 0..4 {
        let mut fleet = Fleet::new(FleetConfig {
            seed,
            payloads: seed % 2 == 0,
            failure_scale: 3.0,
        });
        let req = fleet.request(40, 1_764_410_400_000_000_000, 1_000_000_000);
        let bytes = req.encode_to_vec();
        assert!(
            view::Decoded::decode(&bytes).is_ok(),
            "fleet traffic is read in place"
        );
        assert_same(&p, &bytes);
    }
}

#[test]
fn in_place_reading_matches_prost_on_every_value_kind() {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, ArrayValue, KeyValue, KeyValueList};
    use opentelemetry_proto::tonic::trace::v1::{
        span::Event, ResourceSpans, ScopeSpans, Span, Status,
    };
    let v = |v: Value| Some(AnyValue { value: Some(v) });
    let kv = |k: &str, value: Option<AnyValue>| KeyValue {
        key: k.into(),
        value,
        ..Default::default()
    };
    let list = |depth: usize| {
        let mut x = v(Value::StringValue("password=hunter2 at /srv/app.py".into()));
        for i in 0..depth {
            x = if i % 2 == 0 {
                v(Value::ArrayValue(ArrayValue {
                    values: vec![x.unwrap_or_default(), AnyValue { value: None }],
                }))
            } else {
                v(Value::KvlistValue(KeyValueList {
                    values: vec![kv("k", x), kv("none", None)],
                }))
            };
        }
        x
    };
    let attrs = vec![
        kv(
            "gen_ai.operation.name",
            v(Value::StringValue("execute_tool".into())),
        ),
        kv("gen_ai.tool.name", v(Value::StringValue("run_sql".into()))),
        kv("toolspan.attempt", v(Value::DoubleValue(2.0))),
        kv("toolspan.error.retryable", v(Value::IntValue(1))),
        kv("b", v(Value::BoolValue(true))),
        kv("d", v(Value::DoubleValue(f64::NAN))),
        kv("bytes", v(Value::BytesValue(vec![0xde, 0xad]))),
        kv("strindex", v(Value::StringValueStrindex(4))),
        kv("empty", Some(AnyValue { value: None })),
        kv("absent", None),
        kv("gen_ai.tool.call.result", list(3)),
        kv("deep", list(12)),
        kv("deeper", list(40)),
    ];
    let span = Span {
        trace_id: vec![1; 16],
        span_id: vec![2; 8],
        name: "tool".into(),
        start_time_unix_nano: 1_764_410_400_000_000_000,
        end_time_unix_nano: 1_764_410_400_100_000_000,
        attributes: attrs,
        events: vec![Event {
            name: "exception".into(),
            attributes: vec![kv(
                "exception.message",
                v(Value::StringValue("token=abc".into())),
            )],
            ..Default::default()
        }],
        status: Some(Status {
            code: 2,
            message: "Bearer abcdefghijklmnop".into(),
        }),
        ..Default::default()
    };
    let req = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: None,
            scope_spans: vec![ScopeSpans {
                spans: vec![span],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let p = Pipeline::builtin();
    assert_same(&p, &req.encode_to_vec());
    // Without the 40-deep value the in-place reader takes it, with it prost does.
    let mut shallow = req.clone();
    shallow.resource_spans[0].scope_spans[0].spans[0]
        .attributes
        .pop();
    assert!(view::Decoded::decode(&shallow.encode_to_vec()).is_ok());
    assert!(view::Decoded::decode(&req.encode_to_vec()).is_err());
    assert_same(&p, &shallow.encode_to_vec());
}

#[test]
fn in_place_reading_matches_prost_on_mutated_bytes() {
    let p = Pipeline::builtin();
    let mut fleet = Fleet::new(FleetConfig {
        seed: 3,
        payloads: true,
        failure_scale: 3.0,
    });
    let good = fleet
        .request(3, 1_764_410_400_000_000_000, 1_000_000_000)
        .encode_to_vec();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for _ in 0..3000 {
        let mut b = good.clone();
        for _ in 0..rng.random_range(1..4) {
            let i = rng.random_range(0..b.len());
            match rng.random_range(0..4) {
                0 => b[i] = rng.random(),
                1 => b[i] ^= 1 << rng.random_range(0..8),
                2 => b.truncate(i),
                _ => b.insert(i, rng.random()),
            }
            if b.is_empty() {
                break;
            }
        }
        assert_same(&p, &b);
    }
}

/// A stage span finds its call by (trace id, span id): another trace of the same request that
/// repeats the call's span id (ids are only unique within a trace) does not take its place.
#[test]
fn a_parent_is_found_in_its_own_trace_when_another_trace_repeats_its_span_id() {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
    let kv = |k: &str, s: &str| KeyValue {
        key: k.into(),
        value: Some(AnyValue {
            value: Some(Value::StringValue(s.into())),
        }),
        ..Default::default()
    };
    let t0 = 1_764_410_400_000_000_000u64;
    let span = |trace: u8, id: u8, parent: Option<u8>, attrs: Vec<KeyValue>| Span {
        trace_id: vec![trace; 16],
        span_id: vec![id; 8],
        parent_span_id: parent.map(|p| vec![p; 8]).unwrap_or_default(),
        name: "s".into(),
        start_time_unix_nano: t0,
        end_time_unix_nano: t0 + 1_000_000,
        attributes: attrs,
        ..Default::default()
    };
    let call = span(
        1,
        7,
        None,
        vec![
            kv("gen_ai.operation.name", "execute_tool"),
            kv("gen_ai.tool.name", "search_docs"),
        ],
    );
    let parse = span(1, 8, Some(7), vec![kv("toolspan.stage", "parse")]);
    // Trace 2's span with the call's span id, after the call in the request.
    let other = span(2, 7, None, vec![kv("gen_ai.agent.name", "other")]);
    let req = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            scope_spans: vec![ScopeSpans {
                spans: vec![call, parse, other],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let out = Pipeline::builtin()
        .process_bytes(&req.encode_to_vec(), Encoding::Protobuf)
        .expect("process");
    let rows = classified(&[out.batch]);
    let parse_row = &rows[&"08".repeat(8)];
    assert_eq!(
        parse_row[0], "search_docs",
        "the parse stage's tool: {rows:?}"
    );
}

mod merge;
mod shapes;
mod silent;
