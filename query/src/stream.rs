//! [`ResultStream`]: a running query's result, batch by batch, as the engine produces it.
//!
//! A result is never collected before it is sent: the query runs in a task of the query
//! runtime that hands each batch over a channel holding one batch; the front end encodes it
//! (JSON, CSV, Arrow IPC, Postgres rows) and writes it before it asks for the next. A client
//! that stops reading therefore stops the query: the socket's buffers fill, the front end
//! stops asking, the channel stays full and the engine is not polled any more.
//!
//! Every batch in flight (the one in the channel and the one being encoded) is reserved in
//! the engine's memory pool, the one pool all running queries share, and so is what the front
//! end encodes from it: a batch that does not fit in what the pool has free fails the query
//! with `resources_exhausted` instead of being allocated outside the limit. Batches larger
//! than [`MAX_BATCH_BYTES`] are sliced first, so one batch never holds more than that.
//!
//! The query's time limit covers the whole stream, reading included: at its deadline the task
//! drops what it still holds (the batch waiting in the channel too) and gives back its slot,
//! and the stream ends with `query_timeout`, even for a client that never reads again.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool, MemoryReservation};
use futures::{Stream, StreamExt};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::engine::Engine;
use crate::error::{QueryError, QueryErrorKind};
use crate::metrics::QueryMetrics;

/// The most memory one batch of a streamed result holds; larger batches are sliced.
pub const MAX_BATCH_BYTES: usize = 512 << 10;

/// What the query task hands over.
enum Msg {
    /// One batch, with its reservation in the pool.
    Batch(RecordBatch, MemoryReservation),
    /// The result is complete.
    Done,
}

type Item = Result<Msg, QueryError>;
type Receiver = Arc<Mutex<mpsc::Receiver<Item>>>;

fn lock(rx: &Receiver) -> MutexGuard<'_, mpsc::Receiver<Item>> {
    // A poisoned lock only means a panic while holding the receiver: still usable.
    rx.lock().unwrap_or_else(|p| p.into_inner())
}

/// The time a query may run and how it reports running out of it.
#[derive(Debug, Clone)]
pub(crate) struct Deadline {
    /// When the engine stops the query.
    pub at: Instant,
    /// The limit as configured, for the message.
    pub limit: Duration,
    /// The statement, shortened, for the log.
    pub sql: String,
}

impl Deadline {
    pub(crate) fn error(&self) -> QueryError {
        QueryError::new(
            QueryErrorKind::Timeout {
                seconds: self.limit.as_secs().max(1),
            },
            format_args!("query cancelled after {:?}: {}", self.limit, self.sql),
        )
    }
}

/// A query's result as it is produced (see the module documentation).
pub struct ResultStream {
    schema: SchemaRef,
    rx: Receiver,
    task: tokio::task::JoinHandle<()>,
    deadline: Deadline,
    /// The caller gives up a moment after the engine's deadline: work that never yields
    /// cannot be stopped by the engine's own timer.
    give_up: Pin<Box<tokio::time::Sleep>>,
    /// The reservation of the batch handed out last, held until the next one is asked for.
    held: Option<MemoryReservation>,
    pool: Arc<dyn MemoryPool>,
    rows: usize,
    ended: bool,
    started: std::time::Instant,
    metrics: Arc<QueryMetrics>,
}

impl std::fmt::Debug for ResultStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResultStream")
            .field("schema", &self.schema)
            .field("rows", &self.rows)
            .field("ended", &self.ended)
            .finish()
    }
}

impl Drop for ResultStream {
    fn drop(&mut self) {
        // A caller that goes away (a closed connection) stops the query.
        self.task.abort();
    }
}

/// Starts `sql` in a task on `runtime`, holding `slot` until the task ends, and waits until
/// the result's schema is known (planning and starting the plan, or the error they end in).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn start<S: Send + 'static>(
    runtime: &tokio::runtime::Runtime,
    engine: Arc<Engine>,
    sql: String,
    deadline: Deadline,
    grace: Duration,
    slot: S,
    metrics: Arc<QueryMetrics>,
    started: std::time::Instant,
) -> Result<ResultStream, QueryError> {
    let (schema_tx, schema_rx) = oneshot::channel();
    let (tx, rx) = mpsc::channel(1);
    let rx: Receiver = Arc::new(Mutex::new(rx));
    let pool = engine.memory_pool();
    let task = runtime.spawn(produce(
        engine,
        sql,
        deadline.clone(),
        slot,
        schema_tx,
        tx,
        rx.clone(),
    ));
    let give_up_at = deadline.at + grace;
    let mut stream = ResultStream {
        schema: Arc::new(datafusion::arrow::datatypes::Schema::empty()),
        rx,
        task,
        deadline,
        give_up: Box::pin(tokio::time::sleep_until(give_up_at)),
        held: None,
        pool,
        rows: 0,
        ended: false,
        started,
        metrics,
    };
    let first = tokio::select! {
        s = schema_rx => Some(s),
        () = &mut stream.give_up => None,
    };
    let schema = match first {
        Some(Ok(Ok(schema))) => schema,
        Some(Ok(Err(e))) => return Err(stream.fail(e)),
        Some(Err(_)) => {
            let e = QueryError::new(
                QueryErrorKind::Internal,
                "query task ended before its result started",
            );
            return Err(stream.fail(e));
        }
        None => {
            let e = abandoned(&stream.deadline, grace);
            return Err(stream.fail(e));
        }
    };
    stream.schema = schema;
    Ok(stream)
}

fn abandoned(deadline: &Deadline, grace: Duration) -> QueryError {
    QueryError::new(
        QueryErrorKind::Timeout {
            seconds: deadline.limit.as_secs().max(1),
        },
        format_args!(
            "query abandoned after {:?} without yielding (planning or one function call ran \
             past the limit): {}",
            deadline.limit + grace,
            deadline.sql
        ),
    )
}

/// The query task: plans and starts the statement, then hands over its batches one at a
/// time until the result is complete, the receiver is gone or the deadline has passed.
async fn produce<S>(
    engine: Arc<Engine>,
    sql: String,
    deadline: Deadline,
    slot: S,
    schema_tx: oneshot::Sender<Result<SchemaRef, QueryError>>,
    tx: mpsc::Sender<Item>,
    rx: Receiver,
) {
    let _slot = slot;
    let (schema, mut batches) =
        match tokio::time::timeout_at(deadline.at, engine.stream(&sql)).await {
            Ok(Ok(started)) => started,
            Ok(Err(e)) => {
                let _ = schema_tx.send(Err(e));
                return;
            }
            Err(_) => {
                let _ = schema_tx.send(Err(deadline.error()));
                return;
            }
        };
    if schema_tx.send(Ok(schema)).is_err() {
        return;
    }
    let pool = engine.memory_pool();
    let reservation = MemoryConsumer::new("query result").register(&pool);
    let run = async {
        while let Some(batch) = batches.next().await {
            let batch = batch.map_err(|e| QueryError::from_datafusion(&e))?;
            for part in slices(&batch) {
                let bytes = batch_bytes(&part);
                reservation.try_grow(bytes).map_err(|_| {
                    QueryError::new(
                        QueryErrorKind::ResourcesExhausted,
                        format_args!(
                            "a result batch of {bytes} bytes does not fit in the memory pool \
                             ({} bytes held by all queries): {}",
                            pool.reserved(),
                            deadline.sql
                        ),
                    )
                })?;
                let held = reservation.split(bytes);
                if tx.send(Ok(Msg::Batch(part, held))).await.is_err() {
                    // The caller has gone: nothing more to produce.
                    return Ok(false);
                }
            }
        }
        Ok(true)
    };
    match tokio::time::timeout_at(deadline.at, run).await {
        Ok(Ok(true)) => {
            let _ = tx.send(Ok(Msg::Done)).await;
        }
        Ok(Ok(false)) => {}
        Ok(Err(e)) => {
            let _ = tx.send(Err(e)).await;
        }
        Err(_) => {
            // The deadline passed, most likely while the client was not reading: drop the
            // batch it has not taken (its memory goes back to the pool) and end the stream;
            // the receiver reports the timeout when it is polled again.
            let mut rx = lock(&rx);
            rx.close();
            while rx.try_recv().is_ok() {}
        }
    }
}

/// `batch` in slices of at most [`MAX_BATCH_BYTES`] each (one row at least).
fn slices(batch: &RecordBatch) -> Vec<RecordBatch> {
    let bytes = batch_bytes(batch);
    let rows = batch.num_rows();
    if bytes <= MAX_BATCH_BYTES || rows <= 1 {
        return vec![batch.clone()];
    }
    let per_row = bytes.div_ceil(rows).max(1);
    let step = (MAX_BATCH_BYTES / per_row).max(1);
    (0..rows)
        .step_by(step)
        .map(|start| batch.slice(start, step.min(rows - start)))
        .collect()
}

/// The memory a batch holds (only the sliced part of shared buffers).
pub(crate) fn batch_bytes(batch: &RecordBatch) -> usize {
    batch
        .columns()
        .iter()
        .map(|c| {
            c.to_data()
                .get_slice_memory_size()
                .unwrap_or_else(|_| c.get_array_memory_size())
        })
        .sum()
}

impl ResultStream {
    /// The result's columns.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Rows handed out so far.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// An empty reservation in the query memory pool, for what a front end encodes from the
    /// batches (its output counts against the limit as the batches do).
    pub fn reservation(&self) -> MemoryReservation {
        MemoryConsumer::new("query result encoding").register(&self.pool)
    }

    /// The next batch; `None` once the result is complete. After an error the stream ends.
    pub async fn next_batch(&mut self) -> Option<Result<RecordBatch, QueryError>> {
        self.next().await
    }

    /// Collects the rest of the result (for results known to be small).
    pub async fn collect_batches(mut self) -> Result<Vec<RecordBatch>, QueryError> {
        let mut out = Vec::new();
        while let Some(b) = self.next_batch().await {
            out.push(b?);
        }
        Ok(out)
    }

    /// Counts the statement once, when the stream ends.
    fn finish(&mut self) {
        if !self.ended {
            self.metrics
                .statement(self.started.elapsed(), Ok(self.rows));
        }
        self.ended = true;
    }

    /// Counts the statement's error once, stops the task and passes the error on.
    fn fail(&mut self, e: QueryError) -> QueryError {
        if !self.ended {
            self.metrics.statement(self.started.elapsed(), Err(&e));
        }
        self.ended = true;
        self.task.abort();
        e
    }
}

impl Stream for ResultStream {
    type Item = Result<RecordBatch, QueryError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.ended {
            return Poll::Ready(None);
        }
        // The batch handed out last has been encoded and written: its memory is free.
        this.held = None;
        let polled = lock(&this.rx).poll_recv(cx);
        match polled {
            Poll::Ready(Some(Ok(Msg::Batch(batch, held)))) => {
                this.rows += batch.num_rows();
                this.held = Some(held);
                Poll::Ready(Some(Ok(batch)))
            }
            Poll::Ready(Some(Ok(Msg::Done))) => {
                this.finish();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(this.fail(e)))),
            Poll::Ready(None) => {
                // Closed without an end: the task was stopped at its deadline (or failed).
                let e = if Instant::now() >= this.deadline.at {
                    this.deadline.error()
                } else {
                    QueryError::new(
                        QueryErrorKind::Internal,
                        "query task ended without finishing its result",
                    )
                };
                Poll::Ready(Some(Err(this.fail(e))))
            }
            Poll::Pending => match this.give_up.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    let grace = this.give_up.deadline() - this.deadline.at;
                    let e = abandoned(&this.deadline, grace);
                    Poll::Ready(Some(Err(this.fail(e))))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    #[test]
    fn large_batches_are_sliced_below_the_bound() {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        let n = 200_000;
        let batch = RecordBatch::try_new(
            schema,
            vec![Arc::new(Int64Array::from_iter_values(0..n as i64))],
        )
        .expect("one column of the schema's type");
        let parts = slices(&batch);
        assert!(parts.len() > 1);
        assert_eq!(parts.iter().map(RecordBatch::num_rows).sum::<usize>(), n);
        assert!(parts.iter().all(|p| batch_bytes(p) <= MAX_BATCH_BYTES));
    }
}
