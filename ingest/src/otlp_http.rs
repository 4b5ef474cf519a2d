//! The OTLP/HTTP receiver: `POST /v1/traces` with protobuf or JSON bodies, optionally gzip.
//!
//! - body over the limit (20 MiB by default, checked on the wire and after gunzip) → 413;
//! - undecodable → 400; wrong content type → 415; unsupported encoding → 415;
//! - spans with bad ids → 200 with OTLP partial success (`rejected_spans`, `error_message`);
//! - writer backed up → 429, store failing → 503, both with `Retry-After`.
//!
//! Errors carry toolspan's envelope as JSON (`{"error":{"code","class","message","retryable",
//! "reference"}}`); the reference is logged with the detail. A 200 is sent only after the
//! Delta commit that holds the request's spans.

use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceResponse,
};
use prost::Message;
use toolspan_pipeline::{Encoding, Pipeline};
use toolspan_schema::{Code, Envelope, EnvelopeError};

use crate::error::IngestError;
use crate::sink::SinkHandle;

/// Receiver limits.
#[derive(Debug, Clone)]
pub struct ReceiverConfig {
    /// Largest accepted body, compressed or not.
    pub max_body_bytes: usize,
}

impl Default for ReceiverConfig {
    fn default() -> Self {
        ReceiverConfig {
            max_body_bytes: 20 << 20,
        }
    }
}

/// Counters the receiver keeps.
#[derive(Debug, Default)]
pub struct ReceiverStats {
    /// Requests answered 200.
    pub requests_ok: AtomicU64,
    /// Requests refused.
    pub requests_refused: AtomicU64,
    /// Spans accepted.
    pub spans: AtomicU64,
    /// Spans rejected (partial success).
    pub spans_rejected: AtomicU64,
    /// Spans with status error.
    pub span_errors: AtomicU64,
    /// Secrets redacted.
    pub redactions: AtomicU64,
    /// Tool results that leaked internals.
    pub leaked_internals: AtomicU64,
}

/// The observer trait moved to [`crate::observer`]; re-exported here for existing paths.
pub use crate::observer::BatchObserver;

/// Shared receiver state.
#[derive(Clone)]
pub struct ReceiverState {
    pipeline: Arc<Pipeline>,
    sink: SinkHandle,
    config: ReceiverConfig,
    observers: Vec<Arc<dyn BatchObserver>>,
    /// Counters.
    pub stats: Arc<ReceiverStats>,
}

impl ReceiverState {
    /// State for a router.
    pub fn new(pipeline: Arc<Pipeline>, sink: SinkHandle, config: ReceiverConfig) -> ReceiverState {
        ReceiverState {
            pipeline,
            sink,
            config,
            observers: Vec::new(),
            stats: Arc::default(),
        }
    }

    /// Adds an observer of committed batches.
    pub fn with_observer(mut self, observer: Arc<dyn BatchObserver>) -> ReceiverState {
        self.observers.push(observer);
        self
    }
}

/// The receiver's routes: `POST /v1/traces`, `GET /healthz`.
pub fn router(state: ReceiverState) -> Router {
    Router::new()
        .route("/v1/traces", post(export))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(state)
}

/// An error answer with toolspan's envelope (`Retry-After` as [`Envelope::retry_after_secs`]
/// decides, unless the error carries its own hint).
fn refuse(state: &ReceiverState, code: Code, message: String, detail: Option<String>) -> Response {
    let e = Envelope::new(code, message, detail.as_deref().unwrap_or(""));
    respond(state, &e, e.retry_after_secs())
}

fn respond(state: &ReceiverState, e: &Envelope, retry_after_s: Option<u64>) -> Response {
    state.stats.requests_refused.fetch_add(1, Ordering::Relaxed);
    let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        e.to_json().to_string(),
    )
        .into_response();
    if let Some(s) = retry_after_s {
        if let Ok(v) = HeaderValue::from_str(&s.to_string()) {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
    }
    resp
}

fn ingest_refusal(state: &ReceiverState, e: IngestError) -> Response {
    let hint = e.retry_after_s();
    let env = e.envelope();
    respond(state, &env, hint.or(env.retry_after_secs()))
}

async fn export(State(state): State<ReceiverState>, headers: HeaderMap, body: Body) -> Response {
    let limit = state.config.max_body_bytes;
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let Some(encoding) = Encoding::from_content_type(ct) else {
        return refuse(
            &state,
            Code::UnsupportedMediaType,
            format!("content type {ct:?} is not accepted; send application/x-protobuf or application/json"),
            None,
        );
    };
    if let Some(len) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
    {
        if len > limit {
            return refuse(
                &state,
                Code::PayloadTooLarge,
                format!("body of {len} bytes exceeds the {limit}-byte limit"),
                None,
            );
        }
    }
    let raw: Bytes = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b,
        Err(_) => {
            return refuse(
                &state,
                Code::PayloadTooLarge,
                format!("body exceeds the {limit}-byte limit (or the connection failed mid-body)"),
                None,
            )
        }
    };
    let gzip = match headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
    {
        None | Some("identity") => false,
        Some("gzip") => true,
        Some(other) => {
            return refuse(
                &state,
                Code::UnsupportedMediaType,
                format!("content encoding {other:?} is not accepted; send gzip or none"),
                None,
            )
        }
    };
    let bytes: Bytes = if gzip {
        // Read at most limit+1 bytes of output: a gzip bomb stops here.
        let mut out = Vec::new();
        let mut dec = flate2::read::GzDecoder::new(&raw[..]).take(limit as u64 + 1);
        if let Err(e) = dec.read_to_end(&mut out) {
            return refuse(
                &state,
                Code::OtlpDecode,
                "body is not valid gzip".into(),
                Some(e.to_string()),
            );
        }
        if out.len() > limit {
            return refuse(
                &state,
                Code::PayloadTooLarge,
                format!("body exceeds the {limit}-byte limit after gzip decompression"),
                None,
            );
        }
        Bytes::from(out)
    } else {
        raw
    };

    let pipeline = state.pipeline.clone();
    let processed =
        match tokio::task::spawn_blocking(move || pipeline.process_bytes(&bytes, encoding)).await {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => return refuse(&state, e.code(), e.to_string(), None),
            Err(join) => {
                return refuse(
                    &state,
                    Code::Internal,
                    "internal error while decoding".into(),
                    Some(join.to_string()),
                )
            }
        };
    let stats = &processed.stats;
    let rejected = stats.rejected.total();
    if processed.batch.num_rows() > 0 {
        let tap = (!state.observers.is_empty()).then(|| processed.batch.clone());
        match state.sink.submit(processed.batch) {
            Ok(rx) => match rx.await {
                Ok(Ok(_version)) => {}
                Ok(Err(e)) => return ingest_refusal(&state, e),
                Err(_) => return ingest_refusal(&state, IngestError::Closed),
            },
            Err(e) => return ingest_refusal(&state, e),
        }
        if let Some(batch) = tap {
            for o in &state.observers {
                o.observe(&batch, stats);
            }
        }
    }
    let s = &state.stats;
    s.requests_ok.fetch_add(1, Ordering::Relaxed);
    s.spans.fetch_add(stats.spans, Ordering::Relaxed);
    s.spans_rejected.fetch_add(rejected, Ordering::Relaxed);
    s.span_errors.fetch_add(stats.errors, Ordering::Relaxed);
    s.redactions
        .fetch_add(stats.redactions.total(), Ordering::Relaxed);
    s.leaked_internals
        .fetch_add(stats.leaked_internals, Ordering::Relaxed);

    let partial = (rejected > 0).then(|| ExportTracePartialSuccess {
        rejected_spans: i64::try_from(rejected).unwrap_or(i64::MAX),
        error_message: stats.rejected.message(),
    });
    match encoding {
        Encoding::Protobuf => {
            let body = ExportTraceServiceResponse {
                partial_success: partial,
            }
            .encode_to_vec();
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/x-protobuf")],
                body,
            )
                .into_response()
        }
        Encoding::Json => {
            let body = match partial {
                Some(p) => {
                    serde_json::json!({"partialSuccess": {"rejectedSpans": p.rejected_spans.to_string(), "errorMessage": p.error_message}})
                }
                None => serde_json::json!({}),
            };
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                body.to_string(),
            )
                .into_response()
        }
    }
}
