//! Fixtures: span batches made by the real pipeline from hand-built OTLP requests, and a
//! row count read back through DataFusion.

use arrow::array::{Array, Int64Array, RecordBatch};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use toolspan_store::SpanTable;

fn s(key: &str, v: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(v.into())),
        }),
        ..Default::default()
    }
}

/// `n` tool-call spans of `tool` in trace `seed`, starting in reverse time order (so sorting
/// by start time is observable), spread over two days.
pub fn calls(seed: u8, tool: &str, n: u64) -> RecordBatch {
    let base: u64 = 1_748_779_200_000_000_000; // 2025-06-01T12:00:00Z
    let spans = (0..n)
        .map(|k| Span {
            trace_id: vec![seed; 16],
            span_id: (k + 1).to_be_bytes().to_vec(),
            name: format!("execute_tool {tool}"),
            start_time_unix_nano: base + (n - k) * 3_600_000_000_000,
            end_time_unix_nano: base + (n - k) * 3_600_000_000_000 + 1_000_000,
            attributes: vec![
                s("gen_ai.operation.name", "execute_tool"),
                s("gen_ai.tool.name", tool),
                s("gen_ai.tool.call.id", &format!("c{seed}_{k}")),
            ],
            ..Default::default()
        })
        .collect();
    let req = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            scope_spans: vec![ScopeSpans {
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    toolspan_pipeline::Pipeline::builtin()
        .process(&req)
        .expect("pipeline")
        .batch
}

/// A fresh location (the directory does not exist yet: open_or_create makes it).
pub fn location(dir: &tempfile::TempDir) -> String {
    dir.path()
        .join("nested")
        .join("spans")
        .to_str()
        .expect("utf-8 path")
        .to_string()
}

/// Rows in the table at `location`, read through a freshly opened handle.
pub async fn count_rows(location: &str) -> i64 {
    let table = SpanTable::open_or_create(location).await.expect("open");
    let delta = table.latest().await.expect("latest");
    let ctx = deltalake::datafusion::prelude::SessionContext::new();
    delta
        .update_datafusion_session(&ctx.state())
        .expect("register store");
    ctx.register_table("spans", delta.table_provider().await.expect("provider"))
        .expect("register");
    let batches = ctx
        .sql("SELECT count(*) FROM spans")
        .await
        .expect("sql")
        .collect()
        .await
        .expect("collect");
    let col = batches[0].column(0);
    let counts = col
        .as_any()
        .downcast_ref::<Int64Array>()
        .expect("count is i64");
    assert_eq!(counts.len(), 1);
    counts.value(0)
}
