//! [`Output`]: the half of a worker that differs between its two jobs. The worker
//! ([`super::worker`]) owns the protocol (assignment, fencing, flush and retry, rewind); an
//! output decides what a message becomes, what a flush commits and what a poison message does.
//!
//! - [`super::spans::SpansOutput`]: `toolspan ingest`, spans into `spans`, poison messages to
//!   the dead-letter topic;
//! - [`crate::metrics_job::rollup::RollupOutput`]: the metrics job, per-minute rollup rows into
//!   `failure_rates_1m`, poison messages skipped.
//!
//! Whatever an output buffers, it hands the writer each message's offset (with rows or an
//! empty batch), in offset order per partition: the offsets are what the commit records.
//!
//! Both outputs pass messages through the pipeline's trace assembly
//! ([`toolspan_pipeline::Assembler`], one group per partition): a message whose spans miss a
//! relative waits for it (bounded), and messages are released in offset order per partition,
//! so a recorded offset never passes a message still waiting; a waiting message is dropped
//! with the buffer on revocation or fencing and re-read by the next owner.

use std::time::Instant;

use crate::IngestMetrics;
use arrow::array::RecordBatch;
use toolspan_pipeline::{
    Accumulator, Assembler, Encoding, Offered, Pipeline, PipelineError, Stats,
};
use toolspan_schema::Code;
use toolspan_store::{CommitInfo, Committer, Writer};

use super::IngestSummary;

/// A message the worker accepted (its partition is assigned and it was not read before).
pub(crate) struct Polled<'a> {
    /// The source partition.
    pub partition: i32,
    /// The message's offset.
    pub offset: i64,
    /// The partition's transaction app id (see [`super::app_id`]).
    pub app: String,
    /// The message key, if any.
    pub key: Option<&'a [u8]>,
    /// The payload (empty when the message has none).
    pub payload: &'a [u8],
}

/// Why an output cannot let a flush commit yet: the flush fails and is retried.
pub(crate) struct Refused {
    /// What failed, for the log.
    pub what: String,
    /// The stable code to log.
    pub code: Code,
}

/// What a worker writes (see the module docs).
pub(crate) trait Output {
    /// What the worker is, for its log lines ("kafka ingest").
    const NAME: &'static str;

    /// What a message becomes: decodes it with `pipeline` and buffers its rows with its offset
    /// (in `writer`, or held back for [`Output::stage`]). On a decoding error nothing is
    /// buffered and the worker calls [`Output::poison`].
    fn message<C: Committer>(
        &mut self,
        writer: &mut Writer<C>,
        pipeline: &Pipeline,
        encoding: Encoding,
        m: &Polled<'_>,
    ) -> Result<Stats, PipelineError>;

    /// What a poison message (one that cannot be decoded) does. It must hand `writer` the
    /// message's offset, so that the partition moves on once the next flush commits. Called
    /// after [`Output::stage`], so the rows before it are in the writer first.
    fn poison<C: Committer>(
        &mut self,
        writer: &mut Writer<C>,
        pipeline: &Pipeline,
        m: &Polled<'_>,
        error: PipelineError,
    );

    /// Releases messages whose assembly wait ran out.
    fn expire<C: Committer>(&mut self, writer: &mut Writer<C>, pipeline: &Pipeline, now: Instant);

    /// Whether rows held back should move to the writer now (`idle`: the last poll returned
    /// nothing).
    fn stage_due(&self, _idle: bool) -> bool {
        false
    }

    /// Moves rows held back into the writer with their offsets. On error they are dropped
    /// uncommitted, and the worker re-reads from the table's offsets.
    fn stage<C: Committer>(&mut self, _writer: &mut Writer<C>) -> Result<(), PipelineError> {
        Ok(())
    }

    /// Items (dead letters) the next flush must settle besides the writer's buffer.
    fn pending(&self) -> usize {
        0
    }

    /// What a flush commits: everything that must happen before the commit (dead letters
    /// acknowledged, rows merged or sampled). On error the flush fails and is retried later
    /// with nothing committed; `writer` must then still hold every offset.
    fn prepare<C: Committer>(
        &mut self,
        writer: &mut Writer<C>,
        metrics: &IngestMetrics,
        summary: &mut IngestSummary,
    ) -> Result<(), Refused>;

    /// The spans a successful flush committed (`info` is `None` when nothing was committed).
    fn committed(&mut self, info: Option<&CommitInfo>) -> u64;

    /// Drops everything not committed (revocation, fencing) besides the writer's buffer, which
    /// holds `buffered_rows`. Returns the spans dropped.
    fn discard(&mut self, buffered_rows: u64) -> u64;

    /// Periodic housekeeping, at each progress report.
    fn tick(&self) {}

    /// Isolation on or off. While on, the worker commits each release of messages on its own,
    /// and the output keeps what [`Output::reject`] needs of every message until its offset
    /// is committed.
    fn isolate(&mut self, _on: bool) {}

    /// While isolating, the store refused the buffer for good: the messages it covered (up to
    /// `txns`, the last offset per app id) are set aside with `code` and `why`, and their
    /// offsets handed back to `writer` (emptied by the worker), so that the next flush moves
    /// the partitions past them. Returns how many messages were set aside. By default nothing
    /// is kept: the offsets alone go back, and the messages are skipped as poison is.
    fn reject<C: Committer>(
        &mut self,
        writer: &mut Writer<C>,
        txns: &[(String, i64)],
        _code: Code,
        _why: &str,
    ) -> usize {
        let empty = RecordBatch::new_empty(std::sync::Arc::new(arrow::datatypes::Schema::empty()));
        push_released(writer, None, txns.iter().cloned(), &empty);
        0
    }

    /// A flush committed `txns` (the last offset per app id): what was kept for them can go.
    fn forget(&mut self, _txns: &[(String, i64)]) {}
}

/// A partition as an assembly group.
fn group(partition: i32) -> u64 {
    u64::from(partition as u32)
}

/// A message's place in the assembly: its partition's transaction app id and its offset.
pub(crate) type Txn = (String, i64);

/// An output's trace assembly (one group per partition), made on first use: how both outputs
/// offer a message, record a poison message's offset and release what waited too long.
#[derive(Default)]
pub(crate) struct Assembly(Option<Assembler<Txn>>);

impl Assembly {
    fn get(&mut self, pipeline: &Pipeline) -> &mut Assembler<Txn> {
        self.0
            .get_or_insert_with(|| Assembler::for_pipeline(pipeline))
    }

    /// Decodes `m` into `acc` (or keeps it waiting for relatives of its spans) and releases
    /// the messages that no longer wait, in offset order per partition.
    pub(crate) fn offer(
        &mut self,
        pipeline: &Pipeline,
        encoding: Encoding,
        m: &Polled<'_>,
        acc: &mut Accumulator,
    ) -> Result<Offered<Txn>, PipelineError> {
        self.get(pipeline).offer(
            pipeline,
            m.payload,
            encoding,
            group(m.partition),
            (m.app.clone(), m.offset),
            Instant::now(),
            acc,
        )
    }

    /// Records the offset of a message without rows (a poison message) in order: after the
    /// messages before it that still wait.
    pub(crate) fn marker(
        &mut self,
        pipeline: &Pipeline,
        m: &Polled<'_>,
        acc: &mut Accumulator,
    ) -> Offered<Txn> {
        self.get(pipeline).offer_marker(
            pipeline,
            group(m.partition),
            (m.app.clone(), m.offset),
            Instant::now(),
            acc,
        )
    }

    /// Releases the messages whose wait ran out; `None` when nothing waits.
    pub(crate) fn expire(
        &mut self,
        pipeline: &Pipeline,
        now: Instant,
        acc: &mut Accumulator,
    ) -> Option<Offered<Txn>> {
        match &mut self.0 {
            Some(a) if !a.is_empty() => Some(a.expire(pipeline, now, acc)),
            _ => None,
        }
    }

    /// Drops every waiting message (revocation, fencing): the next owner re-reads them.
    pub(crate) fn drop_all(&mut self) {
        if let Some(a) = &mut self.0 {
            a.drop_all();
        }
    }
}

/// Hands `writer` released rows and the offsets they cover: the first offset rides with the
/// rows, the others with empty batches (an offset must reach the writer even without rows).
pub(crate) fn push_released<C: Committer>(
    writer: &mut Writer<C>,
    batch: Option<RecordBatch>,
    txns: impl IntoIterator<Item = (String, i64)>,
    empty: &RecordBatch,
) {
    let mut txns = txns.into_iter();
    let first = txns.next();
    match batch {
        Some(b) => writer.push(b, first),
        None => {
            if let Some(t) = first {
                writer.push(empty.clone(), Some(t));
            }
        }
    }
    for t in txns {
        writer.push(empty.clone(), Some(t));
    }
}
