//! The worker: the exactly-once protocol of the parent module, independent of what it writes
//! ([`Output`]), of the consumer ([`PartitionConsumer`]) and of the table ([`OffsetTable`]).
//!
//! One [`Worker::step`] is one poll: the rebalances it saw first (a message returned by the
//! same poll belongs to the new assignment), then the message, then a flush when one is due.
//! The order the protocol depends on:
//! - a message below the partition's next offset was read before and is ignored;
//! - a poison message's offset reaches the writer after the rows before it, so the recorded
//!   offset only moves forward, and whatever the output must settle first (dead letters) is
//!   settled before the commit that records it;
//! - a flush refused because the table moved on ([`StoreErrorKind::Fenced`]), and a
//!   revocation, drop the buffer; after fencing every assigned partition is re-read from the
//!   offset the table records;
//! - a flush the store refuses for good ([`StoreErrorKind::Rejected`]: rows retrying cannot
//!   fix) drops the buffer and re-reads it from the table's offsets *isolating*: each release
//!   of messages is committed on its own until every partition is past where it stood, and a
//!   release the store refuses again goes to the dead-letter topic (its offsets committed
//!   after the letters are acknowledged), so one bad message holds back nothing else;
//! - any other failed flush keeps the buffer, pauses consumption and is retried with
//!   exponential back-off.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::IngestMetrics;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::Offset;
use toolspan_pipeline::redact::RedactionCounts;
use toolspan_pipeline::Pipeline;
use toolspan_schema::Repeats;
use toolspan_store::{StoreErrorKind, Writer};

use super::consumer::PartitionConsumer;
use super::output::{Output, Polled};
use super::rebalance::Event;
use super::table::{recorded_blocking, resume_at, OffsetTable};
use super::{app_id, IngestSummary, KafkaIngestConfig};
use crate::IngestError;

/// How long one poll waits for a message.
const POLL: Duration = Duration::from_millis(100);
/// A message read this long after it was produced means the worker is behind, catching up on
/// a backlog (after a restart, a pause, a burst).
const BEHIND: Duration = Duration::from_secs(10);
/// While behind, a flush waits at least this long unless a size limit is reached first. A
/// commit every second costs ~15 % more CPU per span than one every five (bench/RESULTS.md,
/// "bench/ingest"); while catching up, fewer commits end the backlog sooner, which is what
/// makes its rows visible sooner. Caught up, the configured interval applies again.
const CATCH_UP_AGE: Duration = Duration::from_secs(5);
/// How often the worker logs its progress.
const REPORT_EVERY: Duration = Duration::from_secs(10);

/// What a worker shares with the rest of the process.
pub(crate) struct Shared {
    /// Decode, classify, redact.
    pub pipeline: Arc<Pipeline>,
    /// The worker's counters.
    pub metrics: Arc<IngestMetrics>,
    /// The runtime table reads and commits run on.
    pub handle: tokio::runtime::Handle,
    /// Set to stop the worker.
    pub stop: Arc<AtomicBool>,
}

/// A flush that keeps failing: when to try again, and whether consumption is paused.
struct Failing {
    backoff: toolspan_store::Backoff,
    next_try: Instant,
    paused: bool,
}

/// One worker: the protocol around an [`Output`] (see the module docs).
pub(super) struct Worker<T: OffsetTable, O: Output> {
    config: KafkaIngestConfig,
    /// Where a partition the table has no offset for starts.
    unrecorded: Offset,
    shared: Shared,
    output: O,
    writer: Writer<T>,
    redactions: RedactionCounts,
    /// Per assigned partition, the next offset to accept (messages below were already read).
    next: BTreeMap<i32, i64>,
    summary: IngestSummary,
    failing: Option<Failing>,
    /// How often a flush failing the same way is logged (this loop logs the store's errors).
    repeats: Repeats,
    /// Set when partitions were revoked while paused: librdkafka keeps a partition's pause
    /// across re-assignment, so the next assignment resumes them.
    resume_on_assign: bool,
    /// Set when held-back rows could not be built: the next flush drops the buffer and
    /// rewinds every partition to the table's offsets.
    rewind_pending: bool,
    /// Set after a flush the store refused for good: per partition, the last offset read
    /// then. Until the table records each, every release is committed on its own.
    isolating: Option<BTreeMap<i32, i64>>,
    last_report: Instant,
    last_spans: u64,
}

impl<T: OffsetTable, O: Output> Worker<T, O> {
    /// A worker committing to `table` through `output`, flushing as `config.writer` says.
    pub(super) fn new(
        config: KafkaIngestConfig,
        table: T,
        output: O,
        unrecorded: Offset,
        shared: Shared,
    ) -> Self {
        Worker {
            writer: Writer::new(table, config.writer.clone()),
            config,
            unrecorded,
            shared,
            output,
            redactions: RedactionCounts::default(),
            next: BTreeMap::new(),
            summary: IngestSummary::default(),
            failing: None,
            repeats: Repeats::new(Duration::from_secs(30)),
            resume_on_assign: false,
            rewind_pending: false,
            isolating: None,
            last_report: Instant::now(),
            last_spans: 0,
        }
    }

    /// What the worker did so far.
    pub(super) fn summary(&self) -> &IngestSummary {
        &self.summary
    }

    /// How old buffered rows may get before they are flushed, as things stand.
    #[cfg(test)]
    pub(super) fn flush_interval(&self) -> Duration {
        self.writer.max_age()
    }

    /// Polls until `stop` is set, then flushes what it can ([`Worker::shutdown`]). Returns
    /// early only on a fatal client error.
    pub(super) fn run<C: PartitionConsumer>(&mut self, consumer: &C) -> Result<(), IngestError> {
        while !self.shared.stop.load(Ordering::Relaxed) {
            self.step(consumer)?;
        }
        self.shutdown(consumer);
        Ok(())
    }

    /// One poll and what follows it (see the module docs).
    pub(super) fn step<C: PartitionConsumer>(&mut self, consumer: &C) -> Result<(), IngestError> {
        let polled = consumer.poll(POLL);
        // Rebalance events first: a message returned by the same poll belongs to the new
        // assignment.
        for ev in consumer.take_events() {
            self.on_event(consumer, ev);
        }
        let idle = polled.is_none();
        match polled {
            None => {}
            Some(Ok(m)) => self.on_message(&m),
            Some(Err(e)) => self.on_kafka_error(e)?,
        }
        self.output
            .expire(&mut self.writer, &self.shared.pipeline, Instant::now());
        if self.isolating.is_some() || self.output.stage_due(idle) {
            self.stage();
        }
        if self.due() {
            self.flush(consumer);
        }
        if self.last_report.elapsed() >= REPORT_EVERY {
            self.report();
        }
        Ok(())
    }

    /// The last flush (a few tries) before leaving the group.
    pub(super) fn shutdown<C: PartitionConsumer>(&mut self, consumer: &C) {
        self.stage();
        for _ in 0..3 {
            if self.writer.is_empty() && self.output.pending() == 0 {
                break;
            }
            self.failing = None;
            self.flush(consumer);
        }
        if !self.writer.is_empty() {
            tracing::warn!(
                rows = self.writer.buffered_rows(),
                "exiting with an unflushed buffer; the next owner re-reads it from Kafka"
            );
        }
    }

    fn report(&mut self) {
        self.output.tick();
        let secs = self.last_report.elapsed().as_secs_f64();
        tracing::info!(
            spans = self.summary.spans,
            spans_per_s = ((self.summary.spans - self.last_spans) as f64 / secs).round(),
            messages = self.summary.messages,
            dead_letters = self.summary.dead_letters,
            buffered = self.writer.buffered_rows(),
            store_failing = self.failing.is_some(),
            "{} progress",
            O::NAME
        );
        self.last_report = Instant::now();
        self.last_spans = self.summary.spans;
    }

    fn on_event<C: PartitionConsumer>(&mut self, consumer: &C, ev: Event) {
        match ev {
            Event::Revoked(parts) => {
                self.drop_buffer("partitions revoked");
                let topic = &self.config.topic;
                for p in parts {
                    self.writer.unfence(&app_id(topic, p));
                    self.next.remove(&p);
                    self.shared.metrics.remove_lag(topic, p);
                }
                if self.next.is_empty() {
                    // Nothing left to retry; the revoked partitions are no longer assigned,
                    // so they can only be resumed once assigned again.
                    if self.failing.take().is_some_and(|f| f.paused) {
                        self.resume_on_assign = true;
                    }
                    self.shared.metrics.store_failing.set(0);
                }
            }
            Event::Assigned(parts) => {
                let topic = &self.config.topic;
                for (p, recorded) in parts {
                    self.writer.fence(app_id(topic, p), recorded);
                    self.next.insert(p, recorded.map(|v| v + 1).unwrap_or(0));
                }
                if let Some(f) = &mut self.failing {
                    // Newly assigned partitions may start unpaused; keep every partition
                    // paused while the store fails.
                    f.paused = false;
                    pause(consumer, f);
                } else if std::mem::take(&mut self.resume_on_assign) {
                    let parts: Vec<i32> = self.next.keys().copied().collect();
                    resume(consumer, &parts);
                }
            }
        }
    }

    fn on_message<M: Message>(&mut self, m: &M) {
        let partition = m.partition();
        let offset = m.offset();
        let Some(next) = self.next.get_mut(&partition) else {
            return; // not ours (any more)
        };
        if offset < *next {
            return; // already buffered or committed
        }
        *next = offset + 1;
        self.summary.messages += 1;
        self.note_lag(m.timestamp().to_millis());
        let polled = Polled {
            partition,
            offset,
            app: app_id(&self.config.topic, partition),
            key: m.key(),
            payload: m.payload().unwrap_or(&[]),
        };
        let encoding = self.config.format.encoding();
        match self
            .output
            .message(&mut self.writer, &self.shared.pipeline, encoding, &polled)
        {
            Ok(stats) => {
                self.shared.metrics.message(stats.rejected.total());
                self.redactions.merge(&stats.redactions);
            }
            Err(e) => {
                // The rows before it go to the writer first, so that the partition's recorded
                // offset only moves forward.
                self.stage();
                self.shared.metrics.message(0);
                self.output
                    .poison(&mut self.writer, &self.shared.pipeline, &polled, e);
            }
        }
    }

    fn on_kafka_error(&mut self, e: KafkaError) -> Result<(), IngestError> {
        match e.rdkafka_error_code() {
            Some(RDKafkaErrorCode::UnknownTopicOrPartition)
            | Some(RDKafkaErrorCode::UnknownTopic) => {
                tracing::warn!(topic = %self.config.topic, "the topic does not exist (yet); waiting for it");
                std::thread::sleep(Duration::from_secs(1));
                Ok(())
            }
            Some(RDKafkaErrorCode::Fatal) => {
                Err(IngestError::Kafka(format!("fatal kafka client error: {e}")))
            }
            _ => {
                tracing::warn!(error = %e, "kafka consume error (the client retries)");
                Ok(())
            }
        }
    }

    fn due(&self) -> bool {
        match &self.failing {
            Some(f) => Instant::now() >= f.next_try,
            None => {
                self.rewind_pending
                    || self.writer.should_flush()
                    || (self.isolating.is_some() && !self.writer.is_empty())
                    || (self.output.pending() > 0
                        && self
                            .writer
                            .age()
                            .is_some_and(|a| a >= self.writer.max_age()))
            }
        }
    }

    /// Sets the flush interval from how long ago the message just read was produced (its
    /// timestamp, milliseconds since the epoch, when it has one): the configured one when the
    /// worker keeps up, at least [`CATCH_UP_AGE`] when it is [`BEHIND`].
    fn note_lag(&mut self, produced_ms: Option<i64>) {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let behind = produced_ms
            .is_some_and(|t| t > 0 && now_ms.saturating_sub(t) > BEHIND.as_millis() as i64);
        let configured = self.config.writer.max_age;
        self.writer.set_max_age(if behind {
            configured.max(CATCH_UP_AGE)
        } else {
            configured
        });
    }

    /// Moves the output's held-back rows and their offsets into the writer.
    fn stage(&mut self) {
        if let Err(e) = self.output.stage(&mut self.writer) {
            tracing::error!(error = %e, "cannot build the accumulated batch; re-reading from the last committed offsets");
            self.rewind_pending = true;
        }
    }

    fn drop_buffer(&mut self, why: &str) {
        let rows = self.writer.buffered_rows() as u64;
        let dead_letters = self.output.pending();
        if rows > 0 || dead_letters > 0 {
            tracing::info!(
                why,
                rows,
                dead_letters,
                "dropping the unflushed buffer; its owner re-reads it"
            );
        }
        let spans = self.output.discard(rows);
        self.summary.discarded_spans += spans;
        self.shared.metrics.discarded(spans);
        self.writer.discard();
        self.redactions = RedactionCounts::default();
    }

    /// Flushes now: one commit of the buffer with its offsets (see the module docs).
    pub(super) fn flush<C: PartitionConsumer>(&mut self, consumer: &C) {
        if self.rewind_pending {
            self.rewind_pending = false;
            self.drop_buffer("batch build failure");
            self.rewind(consumer);
            return;
        }
        self.stage();
        if self.writer.is_empty() && self.output.pending() == 0 {
            self.recovered(consumer);
            return;
        }
        if let Err(r) =
            self.output
                .prepare(&mut self.writer, &self.shared.metrics, &mut self.summary)
        {
            self.failed(consumer, &r.what, r.code.as_str(), "-", "");
            return;
        }
        let txns: Vec<(String, i64)> = self
            .writer
            .pending_transactions()
            .iter()
            .map(|(a, v)| (a.clone(), *v))
            .collect();
        let started = Instant::now();
        let res = self.shared.handle.block_on(self.writer.flush());
        let metrics = &self.shared.metrics;
        match res {
            Ok(info) => {
                metrics
                    .flush_seconds
                    .observe(started.elapsed().as_secs_f64());
                let spans = self.output.committed(info.as_ref());
                if let Some(info) = info {
                    metrics.commits.inc();
                    metrics.committed(spans, &self.redactions);
                    self.summary.commits += 1;
                    self.summary.spans += spans;
                    tracing::debug!(
                        version = info.version,
                        rows = info.rows,
                        files = info.files,
                        "flushed"
                    );
                }
                self.redactions = RedactionCounts::default();
                self.commit_advisory(consumer, &txns);
                self.output.forget(&txns);
                self.isolation_done();
                self.recovered(consumer);
            }
            Err(e) if matches!(e.kind(), StoreErrorKind::Rejected { .. }) => {
                self.summary.commit_failures += 1;
                metrics.commit_failures.inc();
                self.refused(consumer, &e, &txns);
            }
            Err(e) if matches!(e.kind(), StoreErrorKind::Fenced { .. }) => {
                tracing::warn!(
                    reference = e.reference(),
                    detail = e.detail_text(),
                    "table records later offsets than this buffer starts from; re-reading them from the table"
                );
                self.drop_buffer("fenced");
                self.rewind(consumer);
            }
            Err(e) => {
                self.summary.commit_failures += 1;
                metrics.commit_failures.inc();
                self.failed(
                    consumer,
                    &e.to_string(),
                    e.code().as_str(),
                    e.reference(),
                    e.detail_text(),
                );
            }
        }
    }

    /// The store refused the buffer for good. The first time, the buffer is dropped and read
    /// again isolating (see the module docs); while isolating, the release in the buffer is
    /// set aside for the dead-letter topic and its offsets go back to the writer.
    fn refused<C: PartitionConsumer>(
        &mut self,
        consumer: &C,
        e: &toolspan_store::StoreError,
        txns: &[(String, i64)],
    ) {
        if self.isolating.is_none() {
            let marks: BTreeMap<i32, i64> = self.next.iter().map(|(p, n)| (*p, n - 1)).collect();
            tracing::warn!(
                code = e.code().as_str(),
                reference = e.reference(),
                detail = e.detail_text(),
                rows = self.writer.buffered_rows(),
                "store refused a flush for good; committing its messages one release at a time so only the refused ones are dead-lettered"
            );
            self.drop_buffer("refused by the store");
            self.isolating = Some(marks);
            self.output.isolate(true);
            self.rewind(consumer);
            return;
        }
        self.writer.discard();
        self.redactions = RedactionCounts::default();
        let n = self
            .output
            .reject(&mut self.writer, txns, e.code(), &e.to_string());
        tracing::warn!(
            messages = n,
            code = e.code().as_str(),
            reference = e.reference(),
            detail = e.detail_text(),
            "store refused messages for good; set aside for the dead-letter topic"
        );
    }

    /// Ends isolation once the table records, for every partition still assigned, the offset
    /// it had read when the store refused a flush.
    fn isolation_done(&mut self) {
        let Some(marks) = &self.isolating else {
            return;
        };
        let topic = &self.config.topic;
        let fences = self.writer.fences();
        let done = marks.iter().all(|(p, mark)| {
            !self.next.contains_key(p)
                || *mark < 0
                || fences
                    .get(&app_id(topic, *p))
                    .is_some_and(|v| v.is_some_and(|v| v >= *mark))
        });
        if done {
            tracing::info!("past the messages the store refused; flushing as configured again");
            self.isolating = None;
            self.output.isolate(false);
        }
    }

    /// Kafka's committed offsets are advisory (lag monitoring); failures are only logged.
    fn commit_advisory<C: PartitionConsumer>(&self, consumer: &C, txns: &[(String, i64)]) {
        let prefix = format!("{}-", self.config.topic);
        let next: Vec<(i32, i64)> = txns
            .iter()
            .filter_map(|(app, v)| Some((app.strip_prefix(&prefix)?.parse::<i32>().ok()?, v + 1)))
            .collect();
        if !next.is_empty() {
            if let Err(e) = consumer.commit_advisory(&next) {
                tracing::debug!(error = %e, "advisory offset commit failed");
            }
        }
    }

    fn failed<C: PartitionConsumer>(
        &mut self,
        consumer: &C,
        what: &str,
        code: &str,
        reference: &str,
        detail: &str,
    ) {
        let f = self.failing.get_or_insert(Failing {
            backoff: toolspan_store::Backoff::new(
                Duration::from_millis(250),
                self.config.max_backoff,
            ),
            next_try: Instant::now(),
            paused: false,
        });
        if let Some(left_out) = self.repeats.admit(&format!("{code}: {what}")) {
            tracing::warn!(
                what,
                code,
                reference,
                detail,
                rows = self.writer.buffered_rows(),
                retry_in_ms = f.backoff.peek().as_millis() as u64,
                left_out,
                "flush failed; consumption paused, nothing committed, retrying"
            );
        }
        f.next_try = Instant::now() + f.backoff.next_delay();
        pause(consumer, f);
        self.shared.metrics.store_failing.set(1);
    }

    fn recovered<C: PartitionConsumer>(&mut self, consumer: &C) {
        self.repeats.reset();
        if let Some(f) = self.failing.take() {
            if f.paused {
                if let Ok(a) = consumer.assignment() {
                    resume(consumer, &a);
                }
            }
            self.shared.metrics.store_failing.set(0);
            tracing::info!("store writable again; buffered spans committed, consumption resumed");
        }
    }

    /// After fencing: reassign every partition at the offset the table records.
    fn rewind<C: PartitionConsumer>(&mut self, consumer: &C) {
        let Ok(assignment) = consumer.assignment() else {
            return;
        };
        let topic = &self.config.topic;
        let mut starts = Vec::with_capacity(assignment.len());
        for p in assignment {
            let s = &self.shared;
            let recorded = recorded_blocking(self.writer.committer(), &s.handle, &s.stop, topic, p);
            self.writer.fence(app_id(topic, p), recorded);
            self.next.insert(p, recorded.map(|v| v + 1).unwrap_or(0));
            starts.push((p, resume_at(recorded, self.unrecorded)));
        }
        if let Err(e) = consumer.assign(&starts) {
            tracing::error!(error = %e, "re-assigning partitions after fencing failed");
        }
        // A re-assigned partition keeps its pause (librdkafka): a fence found by a retry
        // while the store was failing must resume them, or the worker never reads again.
        if self.failing.take().is_some_and(|f| f.paused) {
            let parts: Vec<i32> = starts.iter().map(|(p, _)| *p).collect();
            resume(consumer, &parts);
        }
        self.shared.metrics.store_failing.set(0);
    }
}

/// Fetches `partitions` again (a failure is logged: the next rebalance or retry resumes them).
fn resume<C: PartitionConsumer>(consumer: &C, partitions: &[i32]) {
    if let Err(e) = consumer.resume(partitions) {
        tracing::warn!(error = %e, "resuming partitions failed");
    }
}

/// Pauses every assigned partition while the store fails (once).
fn pause<C: PartitionConsumer>(consumer: &C, f: &mut Failing) {
    if f.paused {
        return;
    }
    if let Ok(a) = consumer.assignment() {
        if !a.is_empty() {
            match consumer.pause(&a) {
                Ok(()) => f.paused = true,
                Err(e) => tracing::warn!(error = %e, "pausing partitions failed"),
            }
        }
    }
}
