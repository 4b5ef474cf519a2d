//! The write side shared by every source: a task that owns a [`Writer`], flushes on size or
//! age, and acknowledges each submitted batch only once the commit holding it succeeded.
//!
//! While the store cannot be written, the task keeps its buffer, retries with back-off and
//! stops taking new batches once its queue is full, so callers see `Overloaded` (HTTP 429) or
//! `StoreUnavailable` (503) and retry; nothing acknowledged is ever lost.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::IngestMetrics;
use arrow::record_batch::RecordBatch;
use tokio::sync::{mpsc, oneshot};
use tokio::time::MissedTickBehavior;
use toolspan_store::{SpanTable, Writer, WriterConfig};

use crate::error::IngestError;

/// Sink settings.
#[derive(Debug, Clone)]
pub struct SinkConfig {
    /// When to flush.
    pub writer: WriterConfig,
    /// Batches that may wait for the writer before callers are told to back off.
    pub queue: usize,
}

impl Default for SinkConfig {
    fn default() -> Self {
        SinkConfig {
            writer: WriterConfig {
                max_rows: 200_000,
                max_bytes: 128 << 20,
                max_age: Duration::from_millis(500),
            },
            queue: 256,
        }
    }
}

/// Counters of what the sink did.
#[derive(Debug, Default)]
pub struct SinkStats {
    /// Rows committed.
    pub rows_committed: AtomicU64,
    /// Commits made.
    pub commits: AtomicU64,
    /// Commit attempts that failed (and were retried).
    pub commit_failures: AtomicU64,
    /// Latest table version.
    pub version: AtomicU64,
    /// True while the store is failing.
    pub store_failing: AtomicBool,
}

type Item = (RecordBatch, oneshot::Sender<Result<u64, IngestError>>);

/// A cheap, cloneable handle for submitting batches.
#[derive(Clone)]
pub struct SinkHandle {
    tx: mpsc::Sender<Item>,
    stats: Arc<SinkStats>,
}

impl SinkHandle {
    /// Starts the sink task on the current runtime.
    pub fn start(
        table: SpanTable,
        config: SinkConfig,
    ) -> (SinkHandle, tokio::task::JoinHandle<()>) {
        SinkHandle::start_with_metrics(table, config, None)
    }

    /// [`SinkHandle::start`] that also records flush latency, commits and store health in
    /// `metrics` (`toolspan_ingest_flush_seconds` and friends).
    pub fn start_with_metrics(
        table: SpanTable,
        config: SinkConfig,
        metrics: Option<Arc<IngestMetrics>>,
    ) -> (SinkHandle, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(config.queue.max(1));
        let stats = Arc::new(SinkStats::default());
        let task = tokio::spawn(run(
            Writer::new(table, config.writer),
            rx,
            stats.clone(),
            metrics,
        ));
        (SinkHandle { tx, stats }, task)
    }

    /// Submits a batch; the returned receiver resolves with the table version once the batch
    /// is committed. Fails at once when the queue is full.
    pub fn submit(
        &self,
        batch: RecordBatch,
    ) -> Result<oneshot::Receiver<Result<u64, IngestError>>, IngestError> {
        let (ack, rx) = oneshot::channel();
        match self.tx.try_send((batch, ack)) {
            Ok(()) => Ok(rx),
            Err(mpsc::error::TrySendError::Full(_)) => {
                if self.stats.store_failing.load(Ordering::Relaxed) {
                    Err(IngestError::StoreUnavailable { retry_after_s: 5 })
                } else {
                    Err(IngestError::Overloaded { retry_after_s: 1 })
                }
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Err(IngestError::Closed),
        }
    }

    /// Submits a batch and waits for its commit.
    pub async fn write(&self, batch: RecordBatch) -> Result<u64, IngestError> {
        let rx = self.submit(batch)?;
        rx.await.map_err(|_| IngestError::Closed)?
    }

    /// The sink's counters.
    pub fn stats(&self) -> &SinkStats {
        &self.stats
    }
}

async fn run(
    mut writer: Writer<SpanTable>,
    mut rx: mpsc::Receiver<Item>,
    stats: Arc<SinkStats>,
    metrics: Option<Arc<IngestMetrics>>,
) {
    let max_age = writer.config().max_age;
    let mut tick = tokio::time::interval(max_age.max(Duration::from_millis(10)) / 2);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut waiting: Vec<oneshot::Sender<Result<u64, IngestError>>> = Vec::new();
    let mut backoff = Duration::from_millis(200);
    let mut open = true;
    loop {
        // While the store fails, stop taking batches: the queue fills and callers back off.
        let failing = stats.store_failing.load(Ordering::Relaxed);
        tokio::select! {
            item = rx.recv(), if open && !failing => match item {
                Some((batch, ack)) => {
                    writer.push(batch, None);
                    waiting.push(ack);
                    if !writer.should_flush() {
                        continue;
                    }
                }
                None => open = false,
            },
            _ = tick.tick() => {
                if !writer.should_flush() && open {
                    continue;
                }
            }
        }
        if writer.is_empty() {
            if !open {
                break;
            }
            continue;
        }
        let started = std::time::Instant::now();
        let flushed = writer.flush().await;
        if let Some(m) = &metrics {
            match &flushed {
                Ok(_) => {
                    m.flush_seconds.observe(started.elapsed().as_secs_f64());
                    m.commits.inc();
                    m.store_failing.set(0);
                }
                Err(_) => {
                    m.commit_failures.inc();
                    m.store_failing.set(1);
                }
            }
        }
        match flushed {
            Ok(info) => {
                let version = info.as_ref().map(|i| i.version).unwrap_or(0);
                if let Some(i) = &info {
                    stats
                        .rows_committed
                        .fetch_add(i.rows as u64, Ordering::Relaxed);
                    stats.commits.fetch_add(1, Ordering::Relaxed);
                    stats.version.store(i.version, Ordering::Relaxed);
                }
                if stats.store_failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(version, "store writable again; buffered spans committed");
                }
                backoff = Duration::from_millis(200);
                for ack in waiting.drain(..) {
                    let _ = ack.send(Ok(version));
                }
            }
            Err(e) => {
                stats.commit_failures.fetch_add(1, Ordering::Relaxed);
                stats.store_failing.store(true, Ordering::Relaxed);
                tracing::warn!(code = %e.code(), reference = e.reference(), rows = writer.buffered_rows(), retry_in_ms = backoff.as_millis() as u64, "commit failed; keeping the buffer and retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        }
        if !open && writer.is_empty() {
            break;
        }
    }
}
