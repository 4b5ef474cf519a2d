//! The ingest output (`toolspan ingest`): spans into the `spans` table, poison messages to the
//! dead-letter topic.
//!
//! Messages are decoded into shared Arrow builders ([`Accumulator`]) and moved to the writer
//! as one batch every [`ACC_ROWS`] rows or [`ACC_AGE`]: far fewer, larger buffers than a batch
//! per message. A poison message is queued as a dead letter; the next flush sends the letters
//! and commits only after the broker acknowledged every one of them, so a letter is never lost
//! behind a committed offset. Tail sampling, when on, runs at flush time.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::IngestMetrics;
use arrow::array::RecordBatch;
use toolspan_pipeline::{Accumulator, Encoding, Offered, Pipeline, PipelineError, Stats};
use toolspan_schema::Code;
use toolspan_store::{CommitInfo, Committer, Writer};

use super::dead_letter::{DeadLetter, DeadLetterSink};
use super::output::{push_released, Assembly, Output, Polled, Refused, Txn};
use super::IngestSummary;
use crate::sampling::{Sampler, SamplingConfig};

/// Rows decoded into one batch before it goes to the writer.
const ACC_ROWS: usize = 8192;
/// Longest time decoded rows wait in the accumulator (also moved whenever a poll is idle).
const ACC_AGE: Duration = Duration::from_millis(200);

/// Longest error message a dead letter carries.
const MAX_MESSAGE: usize = 1024;

/// Spans into `spans`; poison messages to `dlq_topic` through `D`.
pub(super) struct SpansOutput<D> {
    dead_letters: D,
    topic: String,
    dlq_topic: String,
    /// Messages waiting for relatives of their spans.
    assembly: Assembly,
    /// Decoded rows not yet in the writer.
    acc: Accumulator,
    /// The last offset per app id whose rows are in `acc`.
    acc_txns: BTreeMap<String, i64>,
    acc_since: Option<Instant>,
    sampler: Option<Sampler>,
    /// Dead letters not yet acknowledged by the broker.
    pending: Vec<DeadLetter>,
    /// An empty batch of the table's schema (an offset without rows).
    empty: RecordBatch,
    /// While isolating ([`Output::isolate`]): the messages offered whose offsets are not
    /// committed yet, for [`Output::reject`].
    kept: Option<Vec<Kept>>,
}

/// A message kept while isolating, as a dead letter would carry it.
struct Kept {
    app: String,
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    payload: Vec<u8>,
}

impl<D: DeadLetterSink> SpansOutput<D> {
    /// An output for `topic` sending dead letters to `dlq_topic`; `empty` has the table's
    /// schema.
    pub(super) fn new(
        dead_letters: D,
        topic: &str,
        dlq_topic: &str,
        sampling: Option<SamplingConfig>,
        empty: RecordBatch,
    ) -> SpansOutput<D> {
        SpansOutput {
            dead_letters,
            topic: topic.to_string(),
            dlq_topic: dlq_topic.to_string(),
            assembly: Assembly::default(),
            acc: Accumulator::new(),
            acc_txns: BTreeMap::new(),
            acc_since: None,
            sampler: sampling.map(Sampler::new),
            pending: Vec::new(),
            empty,
            kept: None,
        }
    }

    /// Notes the offsets of released messages (their rows are in `acc`).
    fn released(&mut self, out: &Offered<Txn>) {
        if out.released.is_empty() {
            return;
        }
        for (app, offset) in &out.released {
            self.acc_txns.insert(app.clone(), *offset);
        }
        self.acc_since.get_or_insert_with(Instant::now);
    }

    /// Sends the pending dead letters and waits for the broker's acknowledgements; keeps the
    /// ones that failed for the next flush.
    fn deliver_dead_letters(
        &mut self,
        metrics: &IngestMetrics,
        summary: &mut IngestSummary,
    ) -> Result<(), String> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let letters = std::mem::take(&mut self.pending);
        let out = self
            .dead_letters
            .deliver(&self.topic, &self.dlq_topic, letters);
        for d in &out.sent {
            metrics.dead_letter(&self.topic, d.code);
            summary.dead_letters += 1;
        }
        self.pending = out.failed;
        match out.first_error {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }
}

/// `message` cut to at most [`MAX_MESSAGE`] bytes on a character boundary.
fn truncated(mut message: String) -> String {
    let mut end = message.len().min(MAX_MESSAGE);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    message.truncate(end);
    message
}

impl<D: DeadLetterSink> Output for SpansOutput<D> {
    const NAME: &'static str = "kafka ingest";

    fn message<C: Committer>(
        &mut self,
        _writer: &mut Writer<C>,
        pipeline: &Pipeline,
        encoding: Encoding,
        m: &Polled<'_>,
    ) -> Result<Stats, PipelineError> {
        let out = self.assembly.offer(pipeline, encoding, m, &mut self.acc)?;
        if let Some(kept) = &mut self.kept {
            kept.push(Kept {
                app: m.app.clone(),
                partition: m.partition,
                offset: m.offset,
                key: m.key.map(<[u8]>::to_vec),
                payload: m.payload.to_vec(),
            });
        }
        self.released(&out);
        Ok(Stats {
            rejected: out.rejected,
            ..out.stats
        })
    }

    fn expire<C: Committer>(&mut self, _writer: &mut Writer<C>, pipeline: &Pipeline, now: Instant) {
        if let Some(out) = self.assembly.expire(pipeline, now, &mut self.acc) {
            self.released(&out);
        }
    }

    fn poison<C: Committer>(
        &mut self,
        _writer: &mut Writer<C>,
        pipeline: &Pipeline,
        m: &Polled<'_>,
        error: PipelineError,
    ) {
        let code = error.code();
        let message = truncated(error.to_string());
        tracing::warn!(partition = m.partition, offset = m.offset, code = code.as_str(), dlq_topic = %self.dlq_topic, "undecodable message; sending it to the dead-letter topic");
        self.pending.push(DeadLetter {
            partition: m.partition,
            offset: m.offset,
            key: m.key.map(<[u8]>::to_vec),
            payload: m.payload.to_vec(),
            code,
            message,
        });
        // Its offset is recorded in order: after the messages before it that still wait.
        let out = self.assembly.marker(pipeline, m, &mut self.acc);
        self.released(&out);
    }

    fn stage_due(&self, idle: bool) -> bool {
        self.acc_since
            .is_some_and(|t| idle || self.acc.rows() >= ACC_ROWS || t.elapsed() >= ACC_AGE)
    }

    fn stage<C: Committer>(&mut self, writer: &mut Writer<C>) -> Result<(), PipelineError> {
        self.acc_since = None;
        match self.acc.take() {
            Ok(batch) => {
                // The batch covers every app id in `acc_txns`.
                let txns = std::mem::take(&mut self.acc_txns);
                push_released(writer, batch, txns, &self.empty);
                Ok(())
            }
            Err(e) => {
                // Building Arrow arrays from validated rows does not fail; if it ever does, the
                // rows are dropped uncommitted and re-read (never skipped silently).
                self.acc_txns.clear();
                Err(e)
            }
        }
    }

    fn pending(&self) -> usize {
        self.pending.len()
    }

    fn prepare<C: Committer>(
        &mut self,
        writer: &mut Writer<C>,
        metrics: &IngestMetrics,
        summary: &mut IngestSummary,
    ) -> Result<(), Refused> {
        // Dead letters first: their offsets are in this commit.
        if let Err(e) = self.deliver_dead_letters(metrics, summary) {
            return Err(Refused {
                what: format!("dead-letter delivery to {} failed: {e}", self.dlq_topic),
                code: Code::Overloaded,
            });
        }
        if let Some(s) = &mut self.sampler {
            let mut decisions = None;
            writer.map_batches(|b| {
                let (out, d) = s.apply(b);
                decisions = Some(d);
                out
            });
            if let Some(d) = decisions {
                metrics.sampled(d.kept_failed, d.kept_sampled, d.dropped);
                summary.sampled_out_spans += d.dropped_spans;
            }
        }
        Ok(())
    }

    fn committed(&mut self, info: Option<&CommitInfo>) -> u64 {
        info.map(|i| i.rows as u64).unwrap_or(0)
    }

    fn discard(&mut self, buffered_rows: u64) -> u64 {
        // Dropping the builders' rows; a build error here changes nothing.
        let _ = self.acc.take();
        self.assembly.drop_all();
        self.acc_txns.clear();
        self.acc_since = None;
        self.pending.clear();
        if let Some(kept) = &mut self.kept {
            kept.clear();
        }
        buffered_rows
    }

    fn isolate(&mut self, on: bool) {
        match (on, &self.kept) {
            (true, None) => self.kept = Some(Vec::new()),
            (false, _) => self.kept = None,
            (true, Some(_)) => {}
        }
    }

    fn reject<C: Committer>(
        &mut self,
        writer: &mut Writer<C>,
        txns: &[(String, i64)],
        code: Code,
        why: &str,
    ) -> usize {
        let covered = |k: &Kept| txns.iter().any(|(a, v)| *a == k.app && k.offset <= *v);
        let mut rejected = 0;
        if let Some(kept) = &mut self.kept {
            let (out, keep): (Vec<Kept>, Vec<Kept>) = kept.drain(..).partition(|k| covered(k));
            *kept = keep;
            for k in out {
                tracing::warn!(partition = k.partition, offset = k.offset, code = code.as_str(), dlq_topic = %self.dlq_topic, "the store refused this message's rows for good; sending it to the dead-letter topic");
                self.pending.push(DeadLetter {
                    partition: k.partition,
                    offset: k.offset,
                    key: k.key,
                    payload: k.payload,
                    code,
                    message: truncated(why.to_string()),
                });
                rejected += 1;
            }
        }
        push_released(writer, None, txns.iter().cloned(), &self.empty);
        rejected
    }

    fn forget(&mut self, txns: &[(String, i64)]) {
        if let Some(kept) = &mut self.kept {
            kept.retain(|k| !txns.iter().any(|(a, v)| *a == k.app && k.offset <= *v));
        }
    }

    fn tick(&self) {
        // The dead-letter producer is polled only here and while it delivers.
        self.dead_letters.serve_events();
    }
}
