//! The OTLP/HTTP receiver: `POST /v1/traces` with protobuf or JSON bodies, optionally gzip.
//!
//! - body over the limit (20 MiB by default, checked on the wire and after gunzip) → 413;
//! - undecodable → 400; wrong content type → 415; unsupported encoding → 415;
//! - spans with bad ids → 200 with OTLP partial success (`rejected_spans`, `error_message`);
//! - writer backed up → 429, store failing → 503, both with `Retry-After`;
//! - more request bytes in flight than `--max-inflight-bytes` (bodies being read,
//!   decompressed or decoded) → 429 `overloaded` with `Retry-After`, before the body is read.
//!
//! Errors carry toolspan's envelope as JSON (`{"error":{"code","class","message","retryable",
//! "reference"}}`); the reference is logged with the detail. A 200 is sent only after the
//! Delta commit that holds the request's spans.
//!
//! Requests go through the pipeline's trace assembly ([`toolspan_pipeline::Assembler`]): a
//! request whose spans miss a relative (a stage whose call has not come yet, a failed call
//! whose failing stage has not) waits for it, at most `--assembly-wait-secs`; the request
//! that brings the relative releases it, and a ticker releases what waited its time. Such a
//! request is answered 200 as soon as it waits (not after its commit): exporters send one
//! request at a time, and the relative is usually in their *next* request. Until committed,
//! its spans are in memory only (as in the OpenTelemetry Collector's queue); a graceful
//! shutdown commits them.

use std::io::Read;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow::record_batch::RecordBatch;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceResponse,
};
use prost::Message;
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use toolspan_pipeline::{
    Accumulator, Assembler, Encoding, Pipeline, PipelineError, Prepared, Stats,
};
use toolspan_schema::{Code, Envelope, EnvelopeError};

use toolspan_ingest::error::IngestError;
use toolspan_ingest::sink::SinkHandle;
use toolspan_ingest::BatchObserver;

/// Receiver limits.
#[derive(Debug, Clone)]
pub struct ReceiverConfig {
    /// Largest accepted body, compressed or not.
    pub max_body_bytes: usize,
    /// Bytes of request bodies (as received, and once more decompressed) held at once across
    /// all requests, from before a body is read until it has been decoded; a request that
    /// cannot get its share within [`ADMISSION_WAIT`] is answered 429 `overloaded` with
    /// `Retry-After`. At least twice `max_body_bytes` (one gzip body and its output).
    pub max_inflight_bytes: usize,
}

/// Default [`ReceiverConfig::max_inflight_bytes`], raised to twice the body limit when that
/// is more.
pub const MAX_INFLIGHT_BYTES: usize = 64 << 20;

/// How long a request waits for its share of the in-flight bytes before it is refused.
pub const ADMISSION_WAIT: Duration = Duration::from_secs(1);

impl Default for ReceiverConfig {
    fn default() -> Self {
        ReceiverConfig {
            max_body_bytes: 20 << 20,
            max_inflight_bytes: MAX_INFLIGHT_BYTES,
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

/// Told to a waiting request when its spans are committed (or could not be).
/// The flag is set once the request was answered while its spans wait: from then on its rows
/// must not be refused, only retried.
type Waiter = (
    oneshot::Sender<Result<(), IngestError>>,
    Arc<std::sync::atomic::AtomicBool>,
);

/// Shared receiver state.
#[derive(Clone)]
pub struct ReceiverState {
    /// Held by every clone but the release ticker's: when the last one goes, the ticker
    /// commits what still waits and stops.
    alive: Option<Arc<()>>,
    pipeline: Arc<Pipeline>,
    assembler: Arc<Mutex<Assembler<Waiter>>>,
    next_group: Arc<AtomicU64>,
    sink: SinkHandle,
    config: ReceiverConfig,
    /// The in-flight bytes budget ([`ReceiverConfig::max_inflight_bytes`]), one permit a byte.
    inflight: Arc<Semaphore>,
    /// Requests decoded and processed at once: one a core (a decoded request of many tiny
    /// spans takes up to about 40 times its size; this bounds how many are held together).
    decoding: Arc<Semaphore>,
    observers: Vec<Arc<dyn BatchObserver>>,
    /// Counters.
    pub stats: Arc<ReceiverStats>,
}

impl ReceiverState {
    /// State for a router.
    pub fn new(pipeline: Arc<Pipeline>, sink: SinkHandle, config: ReceiverConfig) -> ReceiverState {
        let budget = config
            .max_inflight_bytes
            .max(config.max_body_bytes.saturating_mul(2))
            .min(Semaphore::MAX_PERMITS);
        let config = ReceiverConfig {
            max_inflight_bytes: budget,
            ..config
        };
        ReceiverState {
            inflight: Arc::new(Semaphore::new(budget)),
            decoding: Arc::new(Semaphore::new(
                std::thread::available_parallelism().map_or(1, |n| n.get()),
            )),
            alive: Some(Arc::new(())),
            assembler: Arc::new(Mutex::new(Assembler::for_pipeline(&pipeline))),
            next_group: Arc::default(),
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

/// The receiver's routes: `POST /v1/traces`, `GET /healthz` (the process answers), `GET
/// /readyz` (the table can be written: 503 `store_unavailable` while commits fail, when
/// requests beyond the writer's queue are refused).
pub fn router(state: ReceiverState) -> Router {
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        if let Some(alive) = &state.alive {
            let weak = Arc::downgrade(alive);
            let ticker = ReceiverState {
                alive: None,
                ..state.clone()
            };
            rt.spawn(release_ticker(ticker, weak));
        }
    }
    Router::new()
        .route("/v1/traces", post(export))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

async fn readyz(State(state): State<ReceiverState>) -> Response {
    crate::probes::readiness(
        state.sink.stats().store_failing.load(Ordering::Relaxed),
        "the table cannot be written; requests are queued, then refused, until it can",
    )
}

/// An error answer with toolspan's envelope (`Retry-After` as its code decides).
fn refuse(state: &ReceiverState, code: Code, message: String, detail: Option<String>) -> Response {
    let e = Envelope::new(code, message, detail.as_deref().unwrap_or(""));
    respond(state, &e)
}

fn respond(state: &ReceiverState, e: &Envelope) -> Response {
    state.stats.requests_refused.fetch_add(1, Ordering::Relaxed);
    let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    crate::http::error::response(e, status)
}

fn ingest_refusal(state: &ReceiverState, e: IngestError) -> Response {
    let env = e.envelope();
    respond(state, &env)
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
    // The body's share of the in-flight bytes, taken before it is read: all of it when its
    // length is declared (so a refused body is never read), else frame by frame.
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    let mut held = match reserve(&state, declared.unwrap_or(0)).await {
        Ok(p) => p,
        Err(r) => return r,
    };
    let raw = match read_body(&state, body, limit, declared, &mut held).await {
        Ok(b) => b,
        Err(r) => return r,
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
        let out = match gunzip(&state, &raw, limit, &mut held).await {
            Ok(out) => out,
            Err(r) => return r,
        };
        // The compressed bytes are gone: give their share back.
        let raw_len = raw.len();
        drop(raw);
        drop(held.split(raw_len.min(held.num_permits())));
        out
    } else {
        raw
    };

    // One request a core is decoded and processed at a time (the semaphore is never closed).
    let Ok(decoding) = state.decoding.clone().acquire_owned().await else {
        return refuse(
            &state,
            Code::Internal,
            "internal error while decoding".into(),
            None,
        );
    };
    let (tx, rx) = oneshot::channel();
    let answered = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let st = state.clone();
    let flag = answered.clone();
    let offered = tokio::task::spawn_blocking(move || {
        let mut acc = Accumulator::new();
        // Decoding reads nothing shared: it runs before the lock, in parallel with other
        // requests.
        let mut slot = None;
        let unit = Prepared::decode(&bytes, encoding, &mut slot)?;
        let out = if Prepared::stands_alone(&st.pipeline) {
            // No trace memory: nothing is shared between requests, nothing waits; no lock.
            unit.process(&st.pipeline, (tx, flag.clone()), &mut acc)
        } else {
            // Only the classification and what it releases hold the lock: the request's
            // spans are read before it and its rows built after it.
            let group = st.next_group.fetch_add(1, Ordering::Relaxed);
            Assembler::offer_through(
                &st.assembler,
                &st.pipeline,
                unit,
                group,
                (tx, flag.clone()),
                &mut acc,
                // Marked under the lock, before another request can release it.
                || flag.store(true, Ordering::Relaxed),
            )
        };
        let built = acc.take()?;
        // Decoded: the request's bytes are released with its share of the budget.
        drop(slot);
        drop(bytes);
        drop(held);
        drop(decoding);
        Ok::<_, PipelineError>((out, built))
    })
    .await;
    let (offered, batch) = match offered {
        Ok(Ok(o)) => o,
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
    let rejected_own = offered.rejected;
    dispatch(&state, batch, offered.stats, offered.released);
    if !offered.held {
        match rx.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return ingest_refusal(&state, e),
            Err(_) => return ingest_refusal(&state, IngestError::Closed),
        }
    }
    let rejected = rejected_own.total();
    state
        .stats
        .spans_rejected
        .fetch_add(rejected, Ordering::Relaxed);
    state.stats.requests_ok.fetch_add(1, Ordering::Relaxed);

    let partial = (rejected > 0).then(|| ExportTracePartialSuccess {
        rejected_spans: i64::try_from(rejected).unwrap_or(i64::MAX),
        error_message: rejected_own.message(),
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

/// `n` bytes of the in-flight budget, waited for at most [`ADMISSION_WAIT`]; else the 429
/// answer.
async fn reserve(state: &ReceiverState, n: usize) -> Result<OwnedSemaphorePermit, Response> {
    let budget = state.config.max_inflight_bytes;
    let n = u32::try_from(n.min(budget)).unwrap_or(u32::MAX);
    match tokio::time::timeout(
        ADMISSION_WAIT,
        state.inflight.clone().acquire_many_owned(n),
    )
    .await
    {
        Ok(Ok(permit)) => Ok(permit),
        _ => Err(refuse(
            state,
            Code::Overloaded,
            format!(
                "the receiver already holds {budget} bytes of request bodies (--max-inflight-bytes); \
                 retry after the Retry-After delay"
            ),
            Some(format!("in-flight budget exhausted for {n} bytes")),
        )),
    }
}

/// The whole body, at most `limit` bytes; without a `declared` length (whose share `held`
/// already has), each frame takes its share of the budget into `held` as it arrives.
async fn read_body(
    state: &ReceiverState,
    mut body: Body,
    limit: usize,
    declared: Option<usize>,
    held: &mut OwnedSemaphorePermit,
) -> Result<Bytes, Response> {
    let grow = declared.is_none();
    use axum::body::HttpBody as _;
    let too_large = |state: &ReceiverState| {
        refuse(
            state,
            Code::PayloadTooLarge,
            format!("body exceeds the {limit}-byte limit (or the connection failed mid-body)"),
            None,
        )
    };
    let mut out: Vec<u8> = Vec::with_capacity(declared.unwrap_or(0).min(limit));
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let Ok(frame) = frame else {
            return Err(too_large(state));
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if out.len() + data.len() > limit {
            return Err(too_large(state));
        }
        if grow {
            held.merge(reserve(state, data.len()).await?);
        }
        out.extend_from_slice(&data);
    }
    Ok(Bytes::from(out))
}

/// `raw` decompressed, at most `limit` bytes (a gzip bomb stops there); each MiB of output
/// takes its share of the budget into `held` first.
async fn gunzip(
    state: &ReceiverState,
    raw: &[u8],
    limit: usize,
    held: &mut OwnedSemaphorePermit,
) -> Result<Bytes, Response> {
    const CHUNK: usize = 1 << 20;
    let mut out = Vec::new();
    let mut dec = flate2::read::GzDecoder::new(raw).take(limit as u64 + 1);
    loop {
        held.merge(reserve(state, CHUNK).await?);
        let before = out.len();
        if let Err(e) = (&mut dec).take(CHUNK as u64).read_to_end(&mut out) {
            return Err(refuse(
                state,
                Code::OtlpDecode,
                "body is not valid gzip".into(),
                Some(e.to_string()),
            ));
        }
        if out.len() > limit {
            return Err(refuse(
                state,
                Code::PayloadTooLarge,
                format!("body exceeds the {limit}-byte limit after gzip decompression"),
                None,
            ));
        }
        if out.len() - before < CHUNK {
            // The last chunk: give back what it did not use.
            let unused = CHUNK - (out.len() - before);
            drop(held.split(unused.min(held.num_permits())));
            return Ok(Bytes::from(out));
        }
    }
}

/// Commits the rows of released requests and tells each of them the outcome; counts and
/// observes the rows once committed. When the writer is backed up, the requests still
/// waiting for their answer are refused (the client retries), unless the rows include a
/// request already answered: those are retried here until the writer takes them.
fn dispatch(
    state: &ReceiverState,
    batch: Option<RecordBatch>,
    stats: Stats,
    released: Vec<Waiter>,
) {
    if released.is_empty() {
        return;
    }
    let Some(batch) = batch.filter(|b| b.num_rows() > 0) else {
        for (w, _) in released {
            let _ = w.send(Ok(()));
        }
        return;
    };
    let answered = released.iter().any(|(_, a)| a.load(Ordering::Relaxed));
    let first = match state.sink.submit(batch.clone()) {
        Ok(rx) => Some(rx),
        Err(e) if !answered || matches!(e, IngestError::Closed) => {
            if answered {
                tracing::error!(
                    rows = batch.num_rows(),
                    "the writer has shut down; spans of answered requests are lost"
                );
            }
            for (w, _) in released {
                let _ = w.send(Err(shared_error(&e)));
            }
            return;
        }
        Err(_) => None,
    };
    let state = state.clone();
    tokio::spawn(async move {
        let mut backoff =
            toolspan_store::Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        let rx = match first {
            Some(rx) => rx,
            None => loop {
                tokio::time::sleep(backoff.next_delay()).await;
                match state.sink.submit(batch.clone()) {
                    Ok(rx) => break rx,
                    Err(IngestError::Closed) => {
                        tracing::error!(
                            rows = batch.num_rows(),
                            "the writer has shut down; spans of answered requests are lost"
                        );
                        for (w, _) in released {
                            let _ = w.send(Err(IngestError::Closed));
                        }
                        return;
                    }
                    Err(_) => continue,
                }
            },
        };
        let outcome = match rx.await {
            Ok(Ok(_version)) => Ok(()),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(IngestError::Closed),
        };
        if outcome.is_ok() {
            let s = &state.stats;
            s.spans.fetch_add(stats.spans, Ordering::Relaxed);
            s.span_errors.fetch_add(stats.errors, Ordering::Relaxed);
            s.redactions
                .fetch_add(stats.redactions.total(), Ordering::Relaxed);
            s.leaked_internals
                .fetch_add(stats.leaked_internals, Ordering::Relaxed);
            for o in &state.observers {
                o.observe(&batch, &stats);
            }
        }
        for (w, _) in released {
            let _ = w.send(outcome.as_ref().map(|_| ()).map_err(shared_error));
        }
    });
}

/// The answer every request whose rows were in a failed commit gets: retry later.
fn shared_error(e: &IngestError) -> IngestError {
    match e {
        IngestError::Overloaded => IngestError::Overloaded,
        _ => IngestError::StoreUnavailable,
    }
}

/// Releases requests whose assembly wait ran out, a few times a second; once every other
/// handle on the receiver is gone (shutdown), commits whatever still waits and stops.
async fn release_ticker(state: ReceiverState, alive: std::sync::Weak<()>) {
    let wait = state.pipeline.assembly().wait;
    let period = (wait / 8).clamp(Duration::from_millis(50), Duration::from_millis(500));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let last = alive.strong_count() == 0;
        let st = state.clone();
        let done = tokio::task::spawn_blocking(move || {
            let mut a = st.assembler.lock().unwrap_or_else(|e| e.into_inner());
            if a.is_empty() {
                return None;
            }
            let mut acc = Accumulator::new();
            let out = if last {
                a.release_all(&st.pipeline, &mut acc)
            } else {
                a.expire(&st.pipeline, Instant::now(), &mut acc)
            };
            drop(a);
            Some((out, acc.take()))
        })
        .await;
        match done {
            Ok(Some((out, Ok(batch)))) => dispatch(&state, batch, out.stats, out.released),
            Ok(Some((out, Err(e)))) => {
                tracing::error!(error = %e, "cannot build the rows of released requests");
                for (w, _) in out.released {
                    let _ = w.send(Err(IngestError::Closed));
                }
            }
            Ok(None) | Err(_) => {}
        }
        if last {
            return;
        }
    }
}
