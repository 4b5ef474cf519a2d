//! [`Writer`]: buffers batches and transaction versions, and flushes them as one commit.
//!
//! Kafka ingest and the embedded OTLP receiver use the same writer; only the source differs.
//! The protocol: `push` what was decoded (with the source position as a transaction version),
//! ask `should_flush` on every message and on a ticker, `flush` when it says so. A failed
//! flush keeps the buffer exactly as it was, so retrying commits the same rows with the same
//! transaction versions; a successful flush empties it.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;

use crate::error::StoreError;
use crate::table::{CommitInfo, SpanTable};

/// A new application id for a writer that owns no source position (the embedded receiver):
/// `<prefix>-<random>`, different at every call. Its flushes carry it with a sequence number,
/// so a flush whose answer was lost can be recognised in the table and not committed twice.
/// Nothing needs it after the process ends: a restarted receiver holds nothing it had
/// committed, and what it had not committed was not acknowledged.
pub fn own_app_id(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// Something that commits batches and transaction versions atomically. [`SpanTable`] is the
/// real one; tests use failing or recording committers.
pub trait Committer: Send + Sync {
    /// Commits all `batches` and `txns` in one atomic step, or nothing; refuses when the
    /// table does not record exactly the version of each of `fences` (see
    /// [`SpanTable::commit_fenced`]).
    fn commit(
        &self,
        batches: Vec<RecordBatch>,
        txns: &[(String, i64)],
        fences: &[(String, Option<i64>)],
    ) -> impl Future<Output = Result<CommitInfo, StoreError>> + Send;
}

impl Committer for SpanTable {
    fn commit(
        &self,
        batches: Vec<RecordBatch>,
        txns: &[(String, i64)],
        fences: &[(String, Option<i64>)],
    ) -> impl Future<Output = Result<CommitInfo, StoreError>> + Send {
        SpanTable::commit_fenced(self, batches, txns, fences)
    }
}

/// When a [`Writer`] should flush: whichever limit is reached first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriterConfig {
    /// Flush at this many buffered rows.
    pub max_rows: usize,
    /// Flush at this many buffered bytes (Arrow memory size of the batches).
    pub max_bytes: usize,
    /// Flush when the oldest buffered item is this old.
    pub max_age: Duration,
}

/// The writers toolspan runs, and when each flushes: the one place these figures live (the
/// commands' flags default to them).
impl WriterConfig {
    /// The OTLP/HTTP receiver's (`toolspan serve`): a commit at least every 500 ms, so a
    /// failure sent now is in SQL about a second later; 200,000 rows or 128 MiB.
    pub const RECEIVER: WriterConfig = WriterConfig {
        max_rows: 200_000,
        max_bytes: 128 << 20,
        max_age: Duration::from_millis(500),
    };

    /// A Kafka worker's (`toolspan ingest`): 200,000 rows, 48 MiB or 1 s, each commit
    /// carrying the consumed offsets. The 1 s keeps a failure produced now queryable within
    /// about 2 s; the worker's maintenance (every 60 s) merges the small files this makes.
    /// With the pause on store failures the byte limit bounds the worker's memory (a flush
    /// needs about three times it while it sorts and encodes).
    pub const KAFKA: WriterConfig = WriterConfig {
        max_rows: 200_000,
        max_bytes: 48 << 20,
        max_age: Duration::from_secs(1),
    };

    /// The metrics job's rollup writer (`toolspan metrics --rollup-table`): a million rows
    /// or 64 MiB, and at least every 10 s (`--rollup-flush-ms`, how fresh `failure_rates` is).
    pub const ROLLUP: WriterConfig = WriterConfig {
        max_rows: 1_000_000,
        max_bytes: 64 << 20,
        max_age: Duration::from_secs(10),
    };
}

impl Default for WriterConfig {
    /// [`WriterConfig::KAFKA`].
    fn default() -> Self {
        WriterConfig::KAFKA
    }
}

/// Buffers span batches and transaction versions for one commit.
pub struct Writer<C: Committer = SpanTable> {
    committer: C,
    config: WriterConfig,
    batches: Vec<RecordBatch>,
    txns: BTreeMap<String, i64>,
    /// The version each fenced app id must still have in the table (see [`Writer::fence`]).
    fences: BTreeMap<String, Option<i64>>,
    rows: usize,
    bytes: usize,
    oldest: Option<Instant>,
}

impl<C: Committer> Writer<C> {
    /// A writer committing through `committer` (usually a [`SpanTable`]).
    pub fn new(committer: C, config: WriterConfig) -> Writer<C> {
        Writer {
            committer,
            config,
            batches: Vec::new(),
            txns: BTreeMap::new(),
            fences: BTreeMap::new(),
            rows: 0,
            bytes: 0,
            oldest: None,
        }
    }

    /// Buffers a batch and, when given, the transaction version that covers it (a later
    /// version for the same app id replaces an earlier one). An empty batch with a
    /// transaction still advances the version at the next flush.
    pub fn push(&mut self, batch: RecordBatch, txn: Option<(String, i64)>) {
        if batch.num_rows() == 0 && txn.is_none() {
            return;
        }
        if self.oldest.is_none() {
            self.oldest = Some(Instant::now());
        }
        if batch.num_rows() > 0 {
            self.rows += batch.num_rows();
            self.bytes += batch.get_array_memory_size();
            self.batches.push(batch);
        }
        if let Some((app_id, version)) = txn {
            self.txns.insert(app_id, version);
        }
    }

    /// Whether the buffer reached a size limit or its oldest item the age limit.
    pub fn should_flush(&self) -> bool {
        if self.is_empty() {
            return false;
        }
        self.rows >= self.config.max_rows
            || self.bytes >= self.config.max_bytes
            || self
                .oldest
                .is_some_and(|t| t.elapsed() >= self.config.max_age)
    }

    /// Commits everything buffered as one commit. `Ok(None)` when there was nothing to
    /// commit. On error the buffer is kept intact, so calling `flush` again retries the same
    /// rows and transaction versions.
    pub async fn flush(&mut self) -> Result<Option<CommitInfo>, StoreError> {
        if self.is_empty() {
            return Ok(None);
        }
        let txns: Vec<(String, i64)> = self.txns.iter().map(|(a, v)| (a.clone(), *v)).collect();
        let fences: Vec<(String, Option<i64>)> = self
            .txns
            .keys()
            .filter_map(|a| self.fences.get(a).map(|f| (a.clone(), *f)))
            .collect();
        // Cloning record batches only clones Arc pointers to their buffers.
        // On an error the buffer is kept for a retry; the caller, which decides about retrying,
        // logs it.
        let info = self
            .committer
            .commit(self.batches.clone(), &txns, &fences)
            .await?;
        for (a, v) in &txns {
            if let Some(f) = self.fences.get_mut(a) {
                *f = Some(*v);
            }
        }
        self.clear();
        Ok(Some(info))
    }

    /// Fences `app_id` at `recorded`, the version the table recorded when this writer took the
    /// source over (a Kafka partition assignment): every later flush carrying that app id
    /// commits only if the table still records what this writer last saw, and each successful
    /// flush moves the fence to the version it committed.
    pub fn fence(&mut self, app_id: String, recorded: Option<i64>) {
        self.fences.insert(app_id, recorded);
    }

    /// Removes the fence of `app_id` (partition revoked).
    pub fn unfence(&mut self, app_id: &str) {
        self.fences.remove(app_id);
    }

    /// The fences, by app id.
    pub fn fences(&self) -> &BTreeMap<String, Option<i64>> {
        &self.fences
    }

    /// Transforms the buffered batches in place (tail sampling at flush time). `f` must be
    /// idempotent: a failed flush keeps its result and the next flush applies `f` again.
    pub fn map_batches(&mut self, f: impl FnOnce(Vec<RecordBatch>) -> Vec<RecordBatch>) {
        let batches = std::mem::take(&mut self.batches);
        self.batches = f(batches);
        self.rows = self.batches.iter().map(|b| b.num_rows()).sum();
        self.bytes = self.batches.iter().map(|b| b.get_array_memory_size()).sum();
    }

    /// Rows buffered.
    pub fn buffered_rows(&self) -> usize {
        self.rows
    }

    /// The transaction versions the next flush will record, by app id.
    pub fn pending_transactions(&self) -> &BTreeMap<String, i64> {
        &self.txns
    }

    /// Whether nothing (no rows, no transaction versions) is buffered.
    pub fn is_empty(&self) -> bool {
        self.batches.is_empty() && self.txns.is_empty()
    }

    /// How long the oldest buffered item has waited, if any.
    pub fn age(&self) -> Option<Duration> {
        self.oldest.map(|t| t.elapsed())
    }

    /// The age limit in force.
    pub fn max_age(&self) -> Duration {
        self.config.max_age
    }

    /// Changes the age limit (a Kafka worker waits longer while it catches up on a backlog).
    pub fn set_max_age(&mut self, max_age: Duration) {
        self.config.max_age = max_age;
    }

    /// Drops everything buffered without committing (partitions revoked: the new owner will
    /// re-read from the versions recorded in the table).
    pub fn discard(&mut self) {
        if !self.is_empty() {
            tracing::info!(
                rows = self.rows,
                txns = self.txns.len(),
                "discarding buffered spans"
            );
        }
        self.clear();
    }

    /// The committer, e.g. to read transaction versions from the table.
    pub fn committer(&self) -> &C {
        &self.committer
    }

    /// The flush limits.
    pub fn config(&self) -> &WriterConfig {
        &self.config
    }

    fn clear(&mut self) {
        self.batches.clear();
        self.txns.clear();
        self.rows = 0;
        self.bytes = 0;
        self.oldest = None;
    }
}
