use super::*;
use opentelemetry_proto::tonic::common::v1::{ArrayValue, KeyValueList};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{
    span, ResourceSpans, ScopeSpans, Span as PSpan, Status as PStatus,
};
use prost::Message;

fn sv(s: &str) -> Option<AnyValue> {
    Some(AnyValue {
        value: Some(Value::StringValue(s.into())),
    })
}

fn sample() -> ExportTraceServiceRequest {
    let nested = AnyValue {
        value: Some(Value::KvlistValue(KeyValueList {
            values: vec![
                KeyValue {
                    key: "a".into(),
                    value: sv("x"),
                    ..Default::default()
                },
                KeyValue {
                    key: "b".into(),
                    value: Some(AnyValue {
                        value: Some(Value::ArrayValue(ArrayValue {
                            values: vec![
                                AnyValue {
                                    value: Some(Value::IntValue(-3)),
                                },
                                AnyValue { value: None },
                            ],
                        })),
                    }),
                    ..Default::default()
                },
            ],
        })),
    };
    let span = PSpan {
        trace_id: vec![1; 16],
        span_id: vec![2; 8],
        parent_span_id: vec![3; 8],
        name: "call tool".into(),
        kind: 3,
        start_time_unix_nano: 7,
        end_time_unix_nano: 9,
        attributes: vec![
            KeyValue {
                key: "k".into(),
                value: sv("v"),
                ..Default::default()
            },
            KeyValue {
                key: "n".into(),
                value: Some(nested),
                ..Default::default()
            },
            KeyValue {
                key: "d".into(),
                value: Some(AnyValue {
                    value: Some(Value::DoubleValue(1.5)),
                }),
                ..Default::default()
            },
            KeyValue {
                key: "none".into(),
                value: None,
                ..Default::default()
            },
        ],
        events: vec![span::Event {
            time_unix_nano: 8,
            name: "exception".into(),
            attributes: vec![KeyValue {
                key: "exception.message".into(),
                value: sv("boom"),
                ..Default::default()
            }],
            dropped_attributes_count: 0,
        }],
        status: Some(PStatus {
            code: 2,
            message: "bad".into(),
        }),
        ..Default::default()
    };
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![KeyValue {
                    key: "service.name".into(),
                    value: sv("svc"),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans: vec![span.clone(), span],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

#[test]
fn wire_view_reads_every_field() {
    let req = sample();
    let bytes = req.encode_to_vec();
    let wire = Decoded::decode(&bytes).unwrap();
    let events = wire.events();
    let spans = wire.spans(&events);
    assert_eq!(spans.len(), 2);
    assert_eq!(spans[0].name, "call tool");
    assert_eq!(spans[0].attributes.len(), 4);
    assert_eq!(spans[1].events[0].attributes[0].key, "exception.message");
    assert_eq!(spans[0].status.unwrap().message, "bad");
    let Some(Val::Kvlist(list)) = spans[0].attributes[1].value else {
        panic!("kvlist")
    };
    let mut keys = Vec::new();
    list.for_each(|kv| keys.push(kv.key));
    assert_eq!(keys, ["a", "b"]);
}

#[test]
fn odd_payloads_are_left_to_prost() {
    let good = sample().encode_to_vec();
    for cut in 1..good.len() {
        // Whatever the fast reader accepts, prost accepts too.
        if Decoded::decode(&good[..cut]).is_ok() {
            assert!(
                ExportTraceServiceRequest::decode(&good[..cut]).is_ok(),
                "cut {cut}"
            );
        }
    }
    // A repeated singular message (prost merges it).
    let mut twice = good.clone();
    let rs = ResourceSpans {
        resource: Some(Resource::default()),
        ..Default::default()
    }
    .encode_to_vec();
    let mut extra = rs.clone();
    extra.extend_from_slice(&rs);
    let mut msg = vec![0x0a];
    prost::encoding::encode_varint(extra.len() as u64, &mut msg);
    msg.extend_from_slice(&extra);
    twice.extend_from_slice(&msg);
    assert_eq!(Decoded::decode(&twice).err(), Some(Fallback));
    assert!(ExportTraceServiceRequest::decode(&twice[..]).is_ok());
}
