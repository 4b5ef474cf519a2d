//! The body of `POST /api/v1/sql`, written as the result streams ([`ResultStream`]): JSON,
//! CSV or an Arrow IPC stream, one chunk per batch, each encoded straight from the Arrow
//! batch (never rendered, parsed and serialised again). The chunk being written is reserved in
//! the query memory pool until the next one is asked for, as the batch it came from was.

use std::io;

use axum::body::{Body, Bytes};
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::arrow::json::writer::JsonArray;
use datafusion::execution::memory_pool::MemoryReservation;
use toolspan_schema::Code;

use super::columns;
use crate::http::error::ApiError;
use toolspan_query::error::{QueryError, QueryErrorKind};
use toolspan_query::stream::ResultStream;

/// One of the result formats, as its encoder.
pub(super) enum Encoder {
    /// `{"columns": […], "rows": [{…}, …], "row_count": n}`.
    Json(Box<datafusion::arrow::json::Writer<Vec<u8>, JsonArray>>),
    /// CSV with a header row.
    Csv {
        /// Whether the header is still to be written.
        header: bool,
    },
    /// An Arrow IPC stream.
    Arrow(Box<StreamWriter<Vec<u8>>>),
}

fn fail(what: &'static str, e: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        Code::Internal,
        "internal error while encoding the result",
        format_args!("encoding {what}: {e}"),
    )
}

impl Encoder {
    /// The JSON encoder.
    pub(super) fn json() -> Encoder {
        Encoder::Json(Box::new(
            datafusion::arrow::json::WriterBuilder::new()
                .with_explicit_nulls(true)
                .build::<_, JsonArray>(Vec::new()),
        ))
    }

    /// The CSV encoder.
    pub(super) fn csv() -> Encoder {
        Encoder::Csv { header: true }
    }

    /// The Arrow IPC encoder for `schema`.
    pub(super) fn arrow(schema: &SchemaRef) -> Result<Encoder, ApiError> {
        let w = StreamWriter::try_new(Vec::new(), schema).map_err(|e| fail("arrow", e))?;
        Ok(Encoder::Arrow(Box::new(w)))
    }

    /// What comes before the first row.
    pub(super) fn head(&mut self, schema: &SchemaRef) -> Result<Vec<u8>, ApiError> {
        match self {
            Encoder::Json(_) => {
                let columns =
                    serde_json::to_string(&columns(schema)).map_err(|e| fail("json", e))?;
                Ok(format!("{{\"columns\":{columns},\"rows\":").into_bytes())
            }
            Encoder::Csv { .. } => Ok(Vec::new()),
            Encoder::Arrow(w) => Ok(std::mem::take(w.get_mut())),
        }
    }

    /// One batch.
    pub(super) fn batch(&mut self, batch: &RecordBatch) -> Result<Vec<u8>, ApiError> {
        match self {
            Encoder::Json(w) => {
                w.write(batch).map_err(|e| fail("json", e))?;
                Ok(std::mem::take(w.get_mut()))
            }
            Encoder::Csv { header } => {
                let mut out = Vec::new();
                {
                    let mut w = datafusion::arrow::csv::WriterBuilder::new()
                        .with_header(*header)
                        .build(&mut out);
                    w.write(batch).map_err(|e| fail("csv", e))?;
                }
                *header = false;
                Ok(out)
            }
            Encoder::Arrow(w) => {
                w.write(batch).map_err(|e| fail("arrow", e))?;
                Ok(std::mem::take(w.get_mut()))
            }
        }
    }

    /// What comes after the last row, `rows` rows in all.
    pub(super) fn tail(&mut self, schema: &SchemaRef, rows: usize) -> Result<Vec<u8>, ApiError> {
        match self {
            Encoder::Json(w) => {
                w.finish().map_err(|e| fail("json", e))?;
                let mut out = std::mem::take(w.get_mut());
                out.extend_from_slice(format!(",\"row_count\":{rows}}}").as_bytes());
                Ok(out)
            }
            // An empty result still has its header row.
            Encoder::Csv { header: true } => self.batch(&RecordBatch::new_empty(schema.clone())),
            Encoder::Csv { header: false } => Ok(Vec::new()),
            Encoder::Arrow(w) => {
                w.finish().map_err(|e| fail("arrow", e))?;
                Ok(std::mem::take(w.get_mut()))
            }
        }
    }
}

enum Stage {
    Rows,
    Done,
}

struct State {
    results: ResultStream,
    encoder: Encoder,
    /// The chunk handed to the connection last, until the next one is asked for.
    held: MemoryReservation,
    stage: Stage,
}

/// Reserves `chunk` in the pool (a chunk that does not fit fails the query).
fn reserve(held: &MemoryReservation, chunk: &[u8]) -> Result<(), QueryError> {
    held.try_resize(chunk.len()).map_err(|_| {
        QueryError::new(
            QueryErrorKind::ResourcesExhausted,
            format_args!(
                "an encoded result chunk of {} bytes does not fit in the memory pool",
                chunk.len()
            ),
        )
    })
}

/// The response body: `first` (the head and the first batch, already encoded), then the
/// rest of `results` as it streams. A failure after the first chunk cannot change the status
/// any more: the connection is closed before the body is complete, so no client takes a
/// partial result for a whole one (the error is in the log under its reference).
pub(super) fn body(
    results: ResultStream,
    encoder: Encoder,
    first: Vec<u8>,
) -> Result<Body, ApiError> {
    let held = results.reservation();
    reserve(&held, &first)?;
    let state = State {
        results,
        encoder,
        held,
        stage: Stage::Rows,
    };
    let rest = futures::stream::unfold(state, step);
    let first = futures::stream::once(async move { Ok::<_, io::Error>(Bytes::from(first)) });
    Ok(Body::from_stream(futures::StreamExt::chain(first, rest)))
}

/// The error that ends a result stream already under way (the status line is sent); its
/// detail goes to the log here, once.
fn broken(e: &QueryError) -> io::Error {
    toolspan_schema::EnvelopeError::envelope(e).log();
    io::Error::other(format!(
        "result stream failed: {} (reference {})",
        e.code().as_str(),
        e.reference()
    ))
}

async fn step(mut s: State) -> Option<(Result<Bytes, io::Error>, State)> {
    loop {
        s.held.free();
        match s.stage {
            Stage::Done => return None,
            Stage::Rows => {
                let chunk = match s.results.next_batch().await {
                    Some(Ok(batch)) => s.encoder.batch(&batch),
                    Some(Err(e)) => {
                        s.stage = Stage::Done;
                        return Some((Err(broken(&e)), s));
                    }
                    None => {
                        s.stage = Stage::Done;
                        let schema = s.results.schema().clone();
                        s.encoder.tail(&schema, s.results.rows())
                    }
                };
                let chunk = match chunk {
                    Ok(c) => c,
                    Err(e) => {
                        // Logged with its reference when it was made.
                        s.stage = Stage::Done;
                        let e = io::Error::other(format!(
                            "result encoding failed: {}",
                            e.code().as_str()
                        ));
                        return Some((Err(e), s));
                    }
                };
                if chunk.is_empty() {
                    continue;
                }
                if let Err(e) = reserve(&s.held, &chunk) {
                    s.stage = Stage::Done;
                    return Some((Err(broken(&e)), s));
                }
                return Some((Ok(Bytes::from(chunk)), s));
            }
        }
    }
}
