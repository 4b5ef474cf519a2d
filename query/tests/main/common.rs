//! Fixtures: hand-built OTLP requests, turned into span batches by the real pipeline and
//! committed to a fresh table.

// Compiled into two test crates (this one and the HTTP API's, `serve/tests/main`); each uses
// the part it needs.
#![allow(dead_code)]

use arrow::array::RecordBatch;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{status, ResourceSpans, ScopeSpans, Span, Status};
use toolspan_query::{Engine, EngineOptions};
use toolspan_store::SpanTable;

/// 2025-06-01T12:00:00Z in nanoseconds.
pub const BASE_NS: u64 = 1_748_779_200_000_000_000;
const MS: u64 = 1_000_000;

fn kv(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

/// A string attribute.
pub fn s(key: &str, v: &str) -> KeyValue {
    kv(key, any_value::Value::StringValue(v.into()))
}

/// An integer attribute.
pub fn i(key: &str, v: i64) -> KeyValue {
    kv(key, any_value::Value::IntValue(v))
}

/// Builds the spans of one trace.
pub struct Trace {
    trace_id: Vec<u8>,
    spans: Vec<Span>,
}

impl Trace {
    /// A trace whose id is 16 bytes of `seed`.
    pub fn new(seed: u8) -> Trace {
        Trace {
            trace_id: vec![seed; 16],
            spans: Vec::new(),
        }
    }

    /// A trace whose id is `trace_id`.
    pub fn with_id(trace_id: [u8; 16]) -> Trace {
        Trace {
            trace_id: trace_id.to_vec(),
            spans: Vec::new(),
        }
    }

    /// Adds a span `id` under `parent`, starting `start_ms` after [`BASE_NS`] and lasting
    /// `dur_ms`; `failed` sets status ERROR.
    #[allow(clippy::too_many_arguments)]
    pub fn span(
        &mut self,
        id: u64,
        parent: Option<u64>,
        name: &str,
        start_ms: u64,
        dur_ms: u64,
        failed: bool,
        attributes: Vec<KeyValue>,
    ) -> &mut Trace {
        let code = if failed {
            status::StatusCode::Error
        } else {
            status::StatusCode::Ok
        };
        self.spans.push(Span {
            trace_id: self.trace_id.clone(),
            span_id: id.to_be_bytes().to_vec(),
            parent_span_id: parent.map(|p| p.to_be_bytes().to_vec()).unwrap_or_default(),
            name: name.into(),
            kind: 1,
            start_time_unix_nano: BASE_NS + start_ms * MS,
            end_time_unix_nano: BASE_NS + (start_ms + dur_ms) * MS,
            attributes,
            status: Some(Status {
                code: code as i32,
                message: if failed {
                    "failed".into()
                } else {
                    String::new()
                },
            }),
            ..Default::default()
        });
        self
    }

    /// The trace in two pieces: its first `n` spans, and the rest (as an exporter that sends
    /// them in two requests).
    pub fn split_after(mut self, n: usize) -> (Trace, Trace) {
        let rest = self.spans.split_off(n.min(self.spans.len()));
        let second = Trace {
            trace_id: self.trace_id.clone(),
            spans: rest,
        };
        (self, second)
    }
}

/// One request carrying the traces, from service `agent-svc`.
pub fn request(traces: Vec<Trace>) -> ExportTraceServiceRequest {
    let spans = traces.into_iter().flat_map(|t| t.spans).collect();
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    s("service.name", "agent-svc"),
                    s("service.version", "1.2.3"),
                ],
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

/// A `search_docs` call (`call_1`) whose first attempt fails at send and second succeeds, and
/// a `fetch_page` call (`call_2`) whose three attempts all fail at execute.
pub fn retry_traces() -> ExportTraceServiceRequest {
    let mut t = Trace::new(0x4b);
    t.span(
        1,
        None,
        "agent run",
        0,
        2_000,
        false,
        vec![
            s("gen_ai.operation.name", "invoke_agent"),
            s("gen_ai.agent.name", "planner"),
        ],
    );
    let call = |tool: &str, id: &str| {
        vec![
            s("gen_ai.operation.name", "execute_tool"),
            s("gen_ai.tool.name", tool),
            s("gen_ai.tool.call.id", id),
        ]
    };
    // call_1: attempt 1 fails sending, attempt 2 goes through every stage.
    t.span(
        10,
        Some(1),
        "execute_tool search_docs",
        10,
        500,
        false,
        call("search_docs", "call_1"),
    );
    t.span(
        11,
        Some(10),
        "attempt 1",
        11,
        100,
        true,
        vec![i("toolspan.attempt", 1)],
    );
    t.span(
        12,
        Some(11),
        "send",
        12,
        90,
        true,
        vec![s("toolspan.stage", "send")],
    );
    t.span(
        13,
        Some(10),
        "attempt 2",
        200,
        300,
        false,
        vec![i("toolspan.attempt", 2)],
    );
    t.span(
        14,
        Some(13),
        "send",
        201,
        100,
        false,
        vec![s("toolspan.stage", "send")],
    );
    t.span(
        15,
        Some(13),
        "execute",
        302,
        100,
        false,
        vec![s("toolspan.stage", "execute")],
    );
    t.span(
        16,
        Some(13),
        "parse",
        403,
        50,
        false,
        vec![s("toolspan.stage", "parse")],
    );
    // call_2: three attempts, each failing in execute.
    let mut c2 = call("fetch_page", "call_2");
    c2.push(s("toolspan.error.code", "upstream_failed"));
    c2.push(s("toolspan.error.class", "transient"));
    c2.push(s("toolspan.error.reference", "err_7c1f9a"));
    t.span(20, Some(1), "execute_tool fetch_page", 600, 1_300, true, c2);
    for n in 0..3u64 {
        let a = 21 + n * 2;
        t.span(
            a,
            Some(20),
            "attempt",
            601 + n * 400,
            390,
            true,
            vec![i("toolspan.attempt", n as i64 + 1)],
        );
        t.span(
            a + 1,
            Some(a),
            "execute",
            602 + n * 400,
            380,
            true,
            vec![s("toolspan.stage", "execute")],
        );
    }
    request(vec![t])
}

/// A `get_invoice` call `id` in trace `seed` whose first attempt failed answering
/// `first_answer` and whose second answered cleanly (the attempts name their tool, so that
/// they are of the call's tool when they arrive without it).
pub fn retried_call(seed: u8, id: &str, first_answer: &str) -> Trace {
    let attempt = |n: i64, result: &str| {
        vec![
            s("gen_ai.tool.name", "get_invoice"),
            i("toolspan.attempt", n),
            s("gen_ai.tool.call.result", result),
        ]
    };
    let call = vec![
        s("gen_ai.operation.name", "execute_tool"),
        s("gen_ai.tool.name", "get_invoice"),
        s("gen_ai.tool.call.id", id),
    ];
    let mut t = Trace::new(seed);
    t.span(1, None, "execute_tool get_invoice", 0, 500, false, call)
        .span(
            2,
            Some(1),
            "attempt 1",
            1,
            100,
            true,
            attempt(1, first_answer),
        )
        .span(
            3,
            Some(1),
            "attempt 2",
            200,
            100,
            false,
            attempt(2, r#"{"invoice": {"id": "inv_1", "total": 12}}"#),
        );
    t
}

/// A Python stack trace, as a tool that hands its exception to the model answers.
pub const STACK_TRACE: &str = "Traceback (most recent call last):\n  File \"/srv/billing/invoices.py\", line 88, in fetch\n    row = cursor.fetchone()[0]\nTypeError: 'NoneType' object is not subscriptable";

/// One successful `search_docs` call in its own trace (for freshness tests).
pub fn one_ok_call(seed: u8) -> ExportTraceServiceRequest {
    let mut t = Trace::new(seed);
    t.span(
        100,
        None,
        "execute_tool search_docs",
        5_000,
        40,
        false,
        vec![
            s("gen_ai.operation.name", "execute_tool"),
            s("gen_ai.tool.name", "search_docs"),
            s("gen_ai.tool.call.id", &format!("call_{seed}")),
        ],
    );
    request(vec![t])
}

/// The request as the pipeline turns it into a span batch.
pub fn batch(req: &ExportTraceServiceRequest) -> RecordBatch {
    toolspan_pipeline::Pipeline::builtin()
        .process(req)
        .expect("pipeline accepts the fixture")
        .batch
}

/// A fresh table in a temporary directory with `reqs` committed one commit each.
pub async fn table_with(reqs: &[ExportTraceServiceRequest]) -> (tempfile::TempDir, SpanTable) {
    let dir = tempfile::tempdir().expect("temp dir");
    let location = dir.path().join("spans");
    let table = SpanTable::open_or_create(location.to_str().expect("utf-8 temp path"))
        .await
        .expect("table");
    for r in reqs {
        table.commit(vec![batch(r)], &[]).await.expect("commit");
    }
    (dir, table)
}

/// An engine with the default options over a fresh table of `reqs` (one commit each).
pub async fn engine_over(reqs: &[ExportTraceServiceRequest]) -> (tempfile::TempDir, Engine) {
    let (dir, table) = table_with(reqs).await;
    let engine = Engine::with_table(table, EngineOptions::default())
        .await
        .expect("engine");
    (dir, engine)
}

/// The rows of `sql` as JSON objects (nulls explicit); a statement that fails fails the test
/// with its envelope.
pub async fn rows(engine: &Engine, sql: &str) -> Vec<serde_json::Value> {
    json_rows(
        &engine
            .sql(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {}", e.envelope())),
    )
}

/// An engine over the retry fixture that checks for new commits on every scan.
pub async fn engine_with_retries() -> (tempfile::TempDir, SpanTable, Engine) {
    let (dir, table) = table_with(&[retry_traces()]).await;
    let options = EngineOptions {
        refresh_interval: std::time::Duration::ZERO,
        ..EngineOptions::default()
    };
    let engine = Engine::with_table(table.clone(), options)
        .await
        .expect("engine");
    (dir, table, engine)
}

/// The single value of a one-row, one-column result, rendered as text.
pub async fn scalar(engine: &Engine, sql: &str) -> String {
    let batches = engine
        .sql(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {}", e.envelope()));
    let rows: Vec<serde_json::Value> = json_rows(&batches);
    assert_eq!(rows.len(), 1, "{sql}: {rows:?}");
    let obj = rows[0].as_object().expect("row object");
    assert_eq!(obj.len(), 1, "{sql}: {obj:?}");
    match obj.values().next().expect("one column") {
        serde_json::Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

/// Rows as JSON objects (nulls explicit).
pub fn json_rows(batches: &[RecordBatch]) -> Vec<serde_json::Value> {
    let text = toolspan_query::render(batches, toolspan_query::Format::Json).expect("render json");
    match serde_json::from_str(&text).expect("valid json") {
        serde_json::Value::Array(rows) => rows,
        v => panic!("not an array: {v}"),
    }
}

/// The SQL corpus, `query/tests/sql`, of the checkout the tests run in: cargo sets
/// CARGO_MANIFEST_DIR (`query/` or `serve/`, siblings) when it runs them; the compile-time
/// value is the fallback for a binary run directly. (`tests/query_service.rs` finds the same
/// directory from the root crate.)
pub fn corpus_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")))
        .join("../query/tests/sql")
}
