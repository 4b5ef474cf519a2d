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
    calls_with(seed, tool, n, 3_600_000_000_000, |_| false)
}

/// [`calls`] with every third span failed (OpenTelemetry status code 2), all on one day.
pub fn calls_some_failed(seed: u8, tool: &str, n: u64) -> RecordBatch {
    calls_with(seed, tool, n, 60_000_000_000, |k| k % 3 == 0)
}

/// `n` tool-call spans `step_ns` apart in reverse time order; span `k` failed when `failed(k)`.
fn calls_with(
    seed: u8,
    tool: &str,
    n: u64,
    step_ns: u64,
    failed: impl Fn(u64) -> bool,
) -> RecordBatch {
    use opentelemetry_proto::tonic::trace::v1::Status;
    let base: u64 = 1_748_779_200_000_000_000; // 2025-06-01T12:00:00Z
    let spans = (0..n)
        .map(|k| Span {
            trace_id: vec![seed; 16],
            span_id: (k + 1).to_be_bytes().to_vec(),
            name: format!("execute_tool {tool}"),
            start_time_unix_nano: base + (n - k) * step_ns,
            end_time_unix_nano: base + (n - k) * step_ns + 1_000_000,
            attributes: vec![
                s("gen_ai.operation.name", "execute_tool"),
                s("gen_ai.tool.name", tool),
                s("gen_ai.tool.call.id", &format!("c{seed}_{k}")),
            ],
            status: failed(k).then(|| Status {
                code: 2,
                message: "boom".into(),
            }),
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

/// The (status, start time in µs) of every row of every data file under `location`, file by
/// file, in file order.
pub fn file_rows(location: &str) -> Vec<Vec<(String, i64)>> {
    let mut files = Vec::new();
    let mut dirs = vec![std::path::PathBuf::from(location)];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("dir").flatten() {
            let p = e.path();
            if p.is_dir() && !p.ends_with("_delta_log") {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "parquet") {
                files.push(p);
            }
        }
    }
    files
        .into_iter()
        .map(|p| {
            let file = std::fs::File::open(&p).expect("parquet file");
            let reader =
                parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
                    .expect("parquet")
                    .build()
                    .expect("reader");
            let mut rows = Vec::new();
            for b in reader {
                let b = b.expect("batch");
                let status = arrow::compute::cast(
                    b.column_by_name("status").expect("status"),
                    &arrow::datatypes::DataType::Utf8,
                )
                .expect("utf-8");
                let status = status
                    .as_any()
                    .downcast_ref::<arrow::array::StringArray>()
                    .expect("strings");
                let start = b
                    .column_by_name("start_time")
                    .expect("start_time")
                    .as_any()
                    .downcast_ref::<arrow::array::TimestampMicrosecondArray>()
                    .expect("µs");
                for i in 0..b.num_rows() {
                    rows.push((status.value(i).to_string(), start.value(i)));
                }
            }
            rows
        })
        .collect()
}

/// Whether `rows` hold their failed spans first, each part in start-time order.
pub fn failures_first(rows: &[(String, i64)]) -> bool {
    let failed = rows.iter().take_while(|r| r.0 == "error").count();
    let (head, tail) = rows.split_at(failed);
    tail.iter().all(|r| r.0 != "error")
        && head.windows(2).all(|w| w[0].1 <= w[1].1)
        && tail.windows(2).all(|w| w[0].1 <= w[1].1)
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
