//! Small constructors for OTLP protobuf values.

use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue, KeyValue};

pub fn s(key: &str, v: impl Into<String>) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(Value::StringValue(v.into())),
        }),
        ..Default::default()
    }
}

pub fn i(key: &str, v: i64) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(Value::IntValue(v)),
        }),
        ..Default::default()
    }
}

pub fn b(key: &str, v: bool) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(Value::BoolValue(v)),
        }),
        ..Default::default()
    }
}
