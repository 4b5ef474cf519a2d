//! The write side shared by every source: a task that owns a [`Writer`], flushes on size or
//! age, and acknowledges each submitted batch only once the commit holding it succeeded.
//!
//! While the store cannot be written, the task keeps its buffer, retries with back-off and
//! stops taking new batches once its queue is full, so callers see `Overloaded` (HTTP 429) or
//! `StoreUnavailable` (503) and retry; nothing acknowledged is ever lost.
//!
//! Every flush is fenced like a Kafka commit: it carries a Delta application transaction of
//! the sink's own app id (new at every start, [`toolspan_store::writer::own_app_id`]) with a
//! flush sequence number, and lands only if the table still records the sequence this sink
//! last committed. A flush whose answer was lost (the commit landed, a later step failed or
//! the connection dropped) is recognised by the sequence the table records, acknowledged and
//! never applied twice.
//!
//! Rows the table refuses for a reason retrying cannot fix (see
//! [`toolspan_store::StoreErrorKind::Rejected`]) must not hold back anything else: the buffer's
//! batches are then committed one by one, and a batch that fails alone is written to the
//! quarantine table next to `spans` ([`toolspan_store::TableKind::Quarantine`]) and
//! acknowledged from there.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::IngestMetrics;
use arrow::record_batch::RecordBatch;
use tokio::sync::{mpsc, oneshot};
use tokio::time::MissedTickBehavior;
use toolspan_schema::Repeats;
use toolspan_store::{
    Backoff, SpanTable, StoreError, StoreErrorKind, TableKind, Writer, WriterConfig,
};

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
            writer: WriterConfig::RECEIVER,
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
    /// Batches written to the quarantine table.
    pub quarantined: AtomicU64,
    /// Flushes whose commit had landed although it was reported failed (recognised by the
    /// flush's transaction version, acknowledged without a second commit).
    pub recovered_commits: AtomicU64,
}

type Item = (RecordBatch, oneshot::Sender<Result<u64, IngestError>>);

/// A cheap, cloneable handle for submitting batches.
#[derive(Clone)]
pub struct SinkHandle {
    tx: mpsc::Sender<Item>,
    stats: Arc<SinkStats>,
}

impl SinkHandle {
    /// Starts the sink task on the current runtime; with `metrics`, it records flush latency,
    /// commits and store health there (`toolspan_ingest_flush_seconds` and friends).
    pub fn start(
        table: SpanTable,
        config: SinkConfig,
        metrics: Option<Arc<IngestMetrics>>,
    ) -> (SinkHandle, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(config.queue.max(1));
        let stats = Arc::new(SinkStats::default());
        let quarantine = toolspan_store::table::quarantine_location(&table);
        let task = tokio::spawn(run(
            Sink::new(Writer::new(table, config.writer), quarantine),
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
                    Err(IngestError::StoreUnavailable)
                } else {
                    Err(IngestError::Overloaded)
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

type Ack = oneshot::Sender<Result<u64, IngestError>>;

/// The write side's state: the writer and the batches in its buffer with their callers, the
/// fencing sequence, and the batches set aside while a refused buffer is split.
struct Sink {
    writer: Writer<SpanTable>,
    /// The batches in the writer's buffer, with the callers waiting for their commit.
    items: Vec<(RecordBatch, Ack)>,
    /// Batches taken out of a refused buffer, committed one at a time.
    backlog: VecDeque<(RecordBatch, Ack)>,
    app_id: String,
    /// The sequence number the next new flush carries.
    next_seq: i64,
    quarantine_location: String,
    quarantine: Option<SpanTable>,
}

/// How a flush ended.
enum Flushed {
    /// Committed, or found committed (`recovered`), at this table version.
    Committed {
        version: u64,
        rows: usize,
        recovered: bool,
    },
    /// Failed; the buffer is kept for a retry.
    Failed(StoreError),
}

impl Sink {
    fn new(mut writer: Writer<SpanTable>, quarantine_location: String) -> Sink {
        let app_id = toolspan_store::writer::own_app_id("toolspan-serve");
        // A fresh app id: the table records nothing for it yet.
        writer.fence(app_id.clone(), None);
        tracing::debug!(app_id = %app_id, "sink transaction id");
        Sink {
            writer,
            items: Vec::new(),
            backlog: VecDeque::new(),
            app_id,
            next_seq: 1,
            quarantine_location,
            quarantine: None,
        }
    }

    fn push(&mut self, batch: RecordBatch, ack: Ack) {
        self.writer.push(batch.clone(), None);
        self.items.push((batch, ack));
    }

    /// The sequence the buffer's flush carries (assigned once; retries reuse it).
    fn pending_seq(&mut self) -> i64 {
        if let Some(seq) = self.writer.pending_transactions().get(&self.app_id) {
            return *seq;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.writer.push(
            RecordBatch::new_empty(self.schema()),
            Some((self.app_id.clone(), seq)),
        );
        seq
    }

    fn schema(&self) -> arrow::datatypes::SchemaRef {
        self.writer.committer().kind().schema()
    }

    /// Flushes the buffer as one fenced commit and answers its callers when it landed.
    async fn flush(&mut self) -> Flushed {
        let seq = self.pending_seq();
        let rows = self.writer.buffered_rows();
        match self.writer.flush().await {
            Ok(info) => {
                let version = info.map(|i| i.version).unwrap_or(0);
                self.answer(version);
                Flushed::Committed {
                    version,
                    rows,
                    recovered: false,
                }
            }
            Err(e) => match self.landed(seq).await {
                Some(version) => Flushed::Committed {
                    version,
                    rows,
                    recovered: true,
                },
                None => Flushed::Failed(e),
            },
        }
    }

    /// Whether the failed flush of sequence `seq` landed after all: the table records `seq`
    /// (or later) for this sink's app id. Then its callers are answered and the buffer is
    /// cleared; `None` while the table cannot be read or does not record it.
    async fn landed(&mut self, seq: i64) -> Option<u64> {
        let table = self.writer.committer().clone();
        let recorded = table.transaction_version(&self.app_id).await.ok()??;
        if recorded < seq {
            return None;
        }
        tracing::warn!(
            app_id = %self.app_id,
            seq,
            rows = self.writer.buffered_rows(),
            "the flush reported failed had been committed; acknowledged without committing again"
        );
        self.writer.discard();
        self.writer.fence(self.app_id.clone(), Some(recorded));
        let version = table.latest_version().await.unwrap_or(0);
        self.answer(version);
        Some(version)
    }

    fn answer(&mut self, version: u64) {
        for (_, ack) in self.items.drain(..) {
            let _ = ack.send(Ok(version));
        }
    }

    /// After a refusal retrying cannot fix: a buffer of several batches is split (each is
    /// committed alone, from the backlog); a single batch goes to the quarantine table.
    async fn set_aside(&mut self, e: &StoreError, stats: &SinkStats) -> Result<(), StoreError> {
        self.writer.discard();
        // The discarded flush did not land (the table does not record its sequence); the
        // fence stays at the last committed one.
        if self.items.len() > 1 {
            tracing::warn!(
                code = %e.code(),
                reference = e.reference(),
                detail = e.detail_text(),
                batches = self.items.len(),
                "table refused a flush; committing its batches one by one"
            );
            let items: Vec<_> = self.items.drain(..).collect();
            for item in items.into_iter().rev() {
                self.backlog.push_front(item);
            }
            return Ok(());
        }
        let Some((batch, ack)) = self.items.pop() else {
            return Ok(());
        };
        match self.quarantine_batch(&batch).await {
            Ok(version) => {
                tracing::warn!(
                    code = %e.code(),
                    reference = e.reference(),
                    detail = e.detail_text(),
                    rows = batch.num_rows(),
                    table = toolspan_store::QUARANTINE_TABLE_NAME,
                    "spans table refused a batch; stored in the quarantine table"
                );
                stats.quarantined.fetch_add(1, Ordering::Relaxed);
                let _ = ack.send(Ok(version));
                Ok(())
            }
            Err(q) if refused(&q) => {
                // Not even the quarantine can take it, for good: its caller gets the error and
                // everything else goes on.
                tracing::error!(
                    code = %q.code(),
                    reference = q.reference(),
                    detail = q.detail_text(),
                    spans_reference = e.reference(),
                    spans_detail = e.detail_text(),
                    rows = batch.num_rows(),
                    "batch refused by both the spans and the quarantine table"
                );
                let _ = ack.send(Err(IngestError::from(q.logged())));
                Ok(())
            }
            Err(q) => {
                // The quarantine cannot be written now: keep the batch for the next attempt.
                self.backlog.push_front((batch, ack));
                Err(q)
            }
        }
    }

    /// Commits `batch` to the quarantine table, fenced by this sink's app id like the spans
    /// commits (its own sequence there), so a lost answer is not written twice either.
    async fn quarantine_batch(&mut self, batch: &RecordBatch) -> Result<u64, StoreError> {
        if self.quarantine.is_none() {
            let table = SpanTable::open_or_create_kind(
                &self.quarantine_location,
                TableKind::Quarantine,
                Default::default(),
            )
            .await?;
            self.quarantine = Some(table);
        }
        let Some(table) = self.quarantine.clone() else {
            return Err(StoreError::new(
                StoreErrorKind::Internal {
                    op: "opening the quarantine table",
                },
                "no quarantine table",
            ));
        };
        let recorded = table.transaction_version(&self.app_id).await?;
        let seq = recorded.unwrap_or(0) + 1;
        let txn = [(self.app_id.clone(), seq)];
        let fence = [(self.app_id.clone(), recorded)];
        match table.commit_fenced(vec![batch.clone()], &txn, &fence).await {
            Ok(info) => Ok(info.version),
            Err(e) => match table.transaction_version(&self.app_id).await {
                Ok(Some(v)) if v >= seq => table.latest_version().await.or(Ok(0)),
                _ => Err(e),
            },
        }
    }

    /// Moves the next backlog batch into the (empty) buffer.
    fn take_backlog(&mut self) -> bool {
        match self.backlog.pop_front() {
            Some((batch, ack)) => {
                self.push(batch, ack);
                true
            }
            None => false,
        }
    }
}

/// What makes two failed commits "the same failure" for [`Repeats`]: code and message.
fn repeat_key(e: &StoreError) -> String {
    format!("{}: {e}", e.code())
}

/// Whether a failed flush is refused for good (splitting or quarantining helps) rather than
/// failing for now (retrying helps).
fn refused(e: &StoreError) -> bool {
    matches!(
        e.kind(),
        StoreErrorKind::Rejected { .. } | StoreErrorKind::BatchSchema { .. }
    )
}

async fn run(
    mut sink: Sink,
    mut rx: mpsc::Receiver<Item>,
    stats: Arc<SinkStats>,
    metrics: Option<Arc<IngestMetrics>>,
) {
    let max_age = sink.writer.config().max_age;
    let mut tick = tokio::time::interval(max_age.max(Duration::from_millis(10)) / 2);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
    // This loop is where a failed commit is handled, so it is where the error is logged: once
    // per retry at most, and the same failure at most once per half minute.
    let mut repeats = Repeats::new(Duration::from_secs(30));
    let mut open = true;
    loop {
        // While the store fails, or a refused buffer is being split, stop taking batches: the
        // queue fills and callers back off.
        let failing = stats.store_failing.load(Ordering::Relaxed);
        let splitting = !sink.backlog.is_empty();
        if splitting && sink.writer.is_empty() {
            sink.take_backlog();
        } else if !splitting {
            tokio::select! {
                item = rx.recv(), if open && !failing => match item {
                    Some((batch, ack)) => {
                        sink.push(batch, ack);
                        if !sink.writer.should_flush() {
                            continue;
                        }
                    }
                    None => open = false,
                },
                _ = tick.tick() => {
                    if !sink.writer.should_flush() && open {
                        continue;
                    }
                }
            }
        }
        if sink.writer.is_empty() && sink.backlog.is_empty() {
            if !open {
                break;
            }
            continue;
        }
        let started = std::time::Instant::now();
        let flushed = sink.flush().await;
        if let Some(m) = &metrics {
            match &flushed {
                Flushed::Committed { .. } => {
                    m.flush_seconds.observe(started.elapsed().as_secs_f64());
                    m.commits.inc();
                    m.store_failing.set(0);
                }
                Flushed::Failed(e) if refused(e) => {
                    m.commit_failures.inc();
                }
                Flushed::Failed(_) => {
                    m.commit_failures.inc();
                    m.store_failing.set(1);
                }
            }
        }
        match flushed {
            Flushed::Committed {
                version,
                rows,
                recovered,
            } => {
                stats
                    .rows_committed
                    .fetch_add(rows as u64, Ordering::Relaxed);
                stats.commits.fetch_add(1, Ordering::Relaxed);
                if recovered {
                    stats.recovered_commits.fetch_add(1, Ordering::Relaxed);
                }
                stats.version.store(version, Ordering::Relaxed);
                if stats.store_failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(version, "store writable again; buffered spans committed");
                }
                repeats.reset();
                backoff.reset();
            }
            Flushed::Failed(e) if refused(&e) => {
                stats.commit_failures.fetch_add(1, Ordering::Relaxed);
                if let Err(q) = sink.set_aside(&e, &stats).await {
                    stats.store_failing.store(true, Ordering::Relaxed);
                    if let Some(left_out) = repeats.admit(&repeat_key(&q)) {
                        tracing::warn!(
                            code = %q.code(),
                            reference = q.reference(),
                            detail = q.detail_text(),
                            retry_in_ms = backoff.peek().as_millis() as u64,
                            left_out,
                            "quarantine table cannot be written; retrying"
                        );
                    }
                    tokio::time::sleep(backoff.next_delay()).await;
                }
            }
            Flushed::Failed(e) => {
                stats.commit_failures.fetch_add(1, Ordering::Relaxed);
                stats.store_failing.store(true, Ordering::Relaxed);
                if let Some(left_out) = repeats.admit(&repeat_key(&e)) {
                    tracing::warn!(
                        code = %e.code(),
                        reference = e.reference(),
                        detail = e.detail_text(),
                        rows = sink.writer.buffered_rows(),
                        retry_in_ms = backoff.peek().as_millis() as u64,
                        left_out,
                        "commit failed; keeping the buffer and retrying"
                    );
                }
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
        if !open && sink.writer.is_empty() && sink.backlog.is_empty() {
            break;
        }
    }
}

#[cfg(test)]
mod tests;
