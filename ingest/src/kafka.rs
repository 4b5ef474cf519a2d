//! Kafka ingest (`toolspan ingest`): consume the topic the OpenTelemetry Collector's kafka
//! exporter writes and land every span in the `spans` table exactly once (DESIGN §5).
//!
//! The protocol, per worker:
//! - **Assignment.** Inside librdkafka's rebalance callback, before the partitions are assigned,
//!   the worker reads each partition's transaction version (`<topic>-<partition>`, the last
//!   offset committed) from the table and assigns the partition at the next offset: it resumes
//!   from the table, never from Kafka's committed offsets (those are advisory, for lag). The
//!   worker then *fences* the partition at that version (see [`Writer::fence`]).
//! - **Flush.** Each flush is one Delta commit holding the buffered rows and, for each
//!   partition, the last offset they cover; it lands only if the table still records the
//!   version the worker resumed from. A zombie worker whose partition moved on is refused
//!   ([`StoreErrorKind::Fenced`]) and drops its buffer.
//! - **Revocation** drops the unflushed buffer; the next owner re-reads from the table.
//! - **Poison messages** go to `<topic>.dlq` with headers naming the source topic, partition,
//!   offset, a stable error code and message; their offsets are committed with the next flush,
//!   after the dead letters are acknowledged by the broker, so the partition keeps moving and
//!   nothing is skipped silently.
//! - **Store failures** pause every assigned partition (bounded memory), retry the same flush
//!   with exponential back-off and resume without loss; the process keeps polling so it stays
//!   in the group.
//!
//! The consumer runs on a dedicated thread (librdkafka's callbacks are synchronous); table
//! reads and commits run on the tokio runtime through a handle.
//!
//! The metrics job's rollup writer ([`run_rollup_worker`]) is the same worker with another
//! table: each decoded message is handed to an observer (the Prometheus tool metrics) and
//! folded into per-minute rollup rows ([`toolspan_store::rollup`]), which are committed to
//! `failure_rates_1m` with the same offsets-as-transactions protocol, so the rollup counts
//! each span exactly once too. It does not dead-letter (ingest does); it skips and counts.
//!
//! Eager rebalancing only (librdkafka's default `range,roundrobin`): a `cooperative-sticky`
//! assignment strategy is refused at startup, since an incremental revocation would have to
//! rewind partitions this worker keeps.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use toolspan_metrics::IngestMetrics;
use toolspan_schema::redact::RedactionCounts;
use toolspan_schema::{Accumulator, Code, Encoding, Pipeline};
use toolspan_store::{rollup, SpanTable, StoreErrorKind, TableKind, Writer, WriterConfig};

mod client;
mod dead_letter;
mod rebalance;

use client::{client_config, ensure_topic, is_consumer_only};
use dead_letter::{DeadLetter, DeadLetterProducer};
use rebalance::{Ctx, Event};

use crate::otlp_http::BatchObserver;
use crate::sampling::{Sampler, SamplingConfig};
use crate::IngestError;

/// How messages are encoded: the collector kafka exporter's `encoding` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageFormat {
    /// `otlp_proto`: an `ExportTraceServiceRequest` in protobuf (the collector's default).
    OtlpProto,
    /// `otlp_json`: the same request as OTLP/JSON.
    OtlpJson,
}

impl MessageFormat {
    /// Parses `otlp_proto` / `otlp_json`.
    pub fn parse(s: &str) -> Option<MessageFormat> {
        match s {
            "otlp_proto" => Some(MessageFormat::OtlpProto),
            "otlp_json" => Some(MessageFormat::OtlpJson),
            _ => None,
        }
    }

    fn encoding(self) -> Encoding {
        match self {
            MessageFormat::OtlpProto => Encoding::Protobuf,
            MessageFormat::OtlpJson => Encoding::Json,
        }
    }
}

/// Settings of one ingest worker.
#[derive(Debug, Clone)]
pub struct KafkaIngestConfig {
    /// `bootstrap.servers`.
    pub brokers: String,
    /// The topic to consume.
    pub topic: String,
    /// The consumer group.
    pub group: String,
    /// Message encoding.
    pub format: MessageFormat,
    /// The dead-letter topic (default `<topic>.dlq`).
    pub dlq_topic: String,
    /// librdkafka settings passed through (`-X key=value`), applied last.
    pub client_options: Vec<(String, String)>,
    /// When to flush (each flush is one commit).
    pub writer: WriterConfig,
    /// Tail sampling, off when `None`.
    pub sampling: Option<SamplingConfig>,
    /// Longest back-off between retries of a failing flush.
    pub max_backoff: Duration,
}

impl KafkaIngestConfig {
    /// Defaults for a topic: group `toolspan-ingest`, `otlp_proto`, flush at 200k rows, 48 MiB
    /// or 5 s.
    pub fn new(brokers: &str, topic: &str) -> KafkaIngestConfig {
        KafkaIngestConfig {
            brokers: brokers.to_string(),
            topic: topic.to_string(),
            group: "toolspan-ingest".into(),
            format: MessageFormat::OtlpProto,
            dlq_topic: format!("{topic}.dlq"),
            client_options: Vec::new(),
            writer: WriterConfig { max_rows: 200_000, max_bytes: 48 << 20, max_age: Duration::from_secs(5) },
            sampling: None,
            max_backoff: Duration::from_secs(30),
        }
    }
}

/// What a worker did, for the summary at exit.
#[derive(Debug, Default, Clone)]
pub struct IngestSummary {
    /// Messages consumed.
    pub messages: u64,
    /// Spans committed.
    pub spans: u64,
    /// Delta commits.
    pub commits: u64,
    /// Messages dead-lettered (acknowledged by the broker and committed past).
    pub dead_letters: u64,
    /// Flush attempts that failed and were retried.
    pub commit_failures: u64,
    /// Spans dropped uncommitted on revocation or fencing (re-read by the owner).
    pub discarded_spans: u64,
    /// Spans dropped by tail sampling.
    pub sampled_out_spans: u64,
}

/// Rows decoded into one batch before it goes to the writer.
const ACC_ROWS: usize = 8192;
/// Longest time decoded rows wait in the accumulator (also moved whenever a poll is idle).
const ACC_AGE: Duration = Duration::from_millis(200);

/// The Delta transaction app id of a topic-partition.
pub fn app_id(topic: &str, partition: i32) -> String {
    format!("{topic}-{partition}")
}

/// What a worker writes.
enum Role {
    /// Spans into `spans`, poison messages to the dead-letter topic.
    Ingest { producer: DeadLetterProducer },
    /// Per-minute rollup rows into `failure_rates_1m`; every decoded batch is observed first.
    Rollup { observer: Arc<dyn BatchObserver>, buffered_spans: u64 },
}

/// Runs one ingest worker until `stop` is set, then flushes and leaves the group.
/// Blocking: call it from a dedicated thread (it uses `handle` for the table).
pub fn run_worker(
    config: KafkaIngestConfig,
    table: SpanTable,
    pipeline: Arc<Pipeline>,
    metrics: Arc<IngestMetrics>,
    handle: tokio::runtime::Handle,
    stop: Arc<AtomicBool>,
) -> Result<IngestSummary, IngestError> {
    check_strategy(&config)?;
    let mut base = ClientConfig::new();
    base.set("bootstrap.servers", &config.brokers);
    let producer_options: Vec<(String, String)> =
        config.client_options.iter().filter(|(k, _)| !is_consumer_only(k)).cloned().collect();
    let producer = DeadLetterProducer::new(&client_config(&base, &producer_options, &[("enable.idempotence", "true")]))
        .map_err(|e| IngestError::Config(format!("cannot create the dead-letter producer: {e}")))?;
    ensure_topic(&base, &config.client_options, &config.dlq_topic, &handle);
    run(config, table, Role::Ingest { producer }, Offset::Beginning, pipeline, metrics, handle, stop)
}

/// Runs the metrics job's rollup writer until `stop` is set (see the module docs): every
/// decoded batch goes to `observer`, and per-minute rollup rows are committed to `table` (a
/// [`TableKind::FailureRates`] table) exactly once. A partition the table has no offset for
/// starts at the end of the topic (rates from now on), or at its beginning with `-X
/// auto.offset.reset=earliest`. `config.dlq_topic` and `config.sampling` are not used.
pub fn run_rollup_worker(
    config: KafkaIngestConfig,
    table: SpanTable,
    pipeline: Arc<Pipeline>,
    metrics: Arc<IngestMetrics>,
    observer: Arc<dyn BatchObserver>,
    handle: tokio::runtime::Handle,
    stop: Arc<AtomicBool>,
) -> Result<IngestSummary, IngestError> {
    check_strategy(&config)?;
    if table.kind() != TableKind::FailureRates {
        return Err(IngestError::Config("the rollup worker writes a failure_rates_1m table".into()));
    }
    let earliest = config
        .client_options
        .iter()
        .rev()
        .find(|(k, _)| k == "auto.offset.reset")
        .is_some_and(|(_, v)| matches!(v.as_str(), "earliest" | "smallest" | "beginning"));
    let unrecorded = if earliest { Offset::Beginning } else { Offset::End };
    let config = KafkaIngestConfig { sampling: None, ..config };
    run(config, table, Role::Rollup { observer, buffered_spans: 0 }, unrecorded, pipeline, metrics, handle, stop)
}

fn check_strategy(config: &KafkaIngestConfig) -> Result<(), IngestError> {
    if let Some((_, v)) = config.client_options.iter().find(|(k, _)| k == "partition.assignment.strategy") {
        if v.contains("cooperative") {
            return Err(IngestError::Config(format!(
                "partition.assignment.strategy={v} is not supported: toolspan ingest needs eager rebalancing (range or roundrobin)"
            )));
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn run(
    config: KafkaIngestConfig,
    table: SpanTable,
    role: Role,
    unrecorded: Offset,
    pipeline: Arc<Pipeline>,
    metrics: Arc<IngestMetrics>,
    handle: tokio::runtime::Handle,
    stop: Arc<AtomicBool>,
) -> Result<IngestSummary, IngestError> {
    let mut base = ClientConfig::new();
    base.set("bootstrap.servers", &config.brokers);
    let what = match role {
        Role::Ingest { .. } => "kafka ingest",
        Role::Rollup { .. } => "rollup writer",
    };
    let ctx = Ctx {
        topic: config.topic.clone(),
        table: table.clone(),
        unrecorded,
        handle: handle.clone(),
        metrics: metrics.clone(),
        stop: stop.clone(),
        events: Mutex::new(Vec::new()),
    };
    let consumer: BaseConsumer<Ctx> = client_config(
        &base,
        &config.client_options,
        &[
            ("group.id", config.group.as_str()),
            ("enable.auto.commit", "false"),
            ("enable.auto.offset.store", "false"),
            ("auto.offset.reset", "earliest"),
            ("enable.partition.eof", "false"),
            ("statistics.interval.ms", "5000"),
            // librdkafka prefetches up to 64 MiB per partition by default; 16 MiB keeps a
            // worker with 4 partitions under 1 GiB (bench/ingest) at the same throughput.
            ("queued.max.messages.kbytes", "16384"),
        ],
    )
    .create_with_context(ctx)
    .map_err(|e| IngestError::Config(format!("cannot create the kafka consumer: {e}")))?;
    consumer
        .subscribe(&[config.topic.as_str()])
        .map_err(|e| IngestError::Config(format!("cannot subscribe to {}: {e}", config.topic)))?;
    tracing::info!(brokers = %config.brokers, topic = %config.topic, group = %config.group, table = table.kind().name(), "{what} started");

    let empty = RecordBatch::new_empty(table.kind().schema());
    let mut w = Worker {
        writer: Writer::new(table, config.writer.clone()),
        acc: Accumulator::new(),
        acc_txns: BTreeMap::new(),
        acc_since: None,
        sampler: config.sampling.clone().map(Sampler::new),
        pending_dlq: Vec::new(),
        redactions: RedactionCounts::default(),
        next: BTreeMap::new(),
        summary: IngestSummary::default(),
        failing: None,
        empty,
        rewind_pending: false,
        config,
        pipeline,
        metrics,
        handle,
        role,
    };
    let mut last_report = Instant::now();
    let mut last_spans = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let polled = consumer.poll(Duration::from_millis(100));
        // Rebalance events first: a message returned by the same poll belongs to the new
        // assignment.
        for ev in consumer.context().take_events() {
            w.on_event(&consumer, ev);
        }
        let polled_none = polled.is_none();
        match polled {
            None => {}
            Some(Ok(m)) => w.on_message(&m),
            Some(Err(e)) => w.on_kafka_error(e)?,
        }
        if w.acc_since.is_some_and(|t| polled_none || t.elapsed() >= ACC_AGE) {
            w.move_accumulated();
        }
        if w.due() {
            w.flush(&consumer);
        }
        if last_report.elapsed() >= Duration::from_secs(10) {
            if let Role::Ingest { producer } = &w.role {
                // The dead-letter producer is polled only here and while it delivers.
                producer.serve_events();
            }
            let secs = last_report.elapsed().as_secs_f64();
            tracing::info!(
                spans = w.summary.spans,
                spans_per_s = ((w.summary.spans - last_spans) as f64 / secs).round(),
                messages = w.summary.messages,
                dead_letters = w.summary.dead_letters,
                buffered = w.writer.buffered_rows(),
                store_failing = w.failing.is_some(),
                "{what} progress"
            );
            last_report = Instant::now();
            last_spans = w.summary.spans;
        }
    }
    // Shutdown: a last flush (a few tries), then leave the group.
    w.move_accumulated();
    for _ in 0..3 {
        if w.writer.is_empty() && w.pending_dlq.is_empty() {
            break;
        }
        w.failing = None;
        w.flush(&consumer);
    }
    if !w.writer.is_empty() {
        tracing::warn!(rows = w.writer.buffered_rows(), "exiting with an unflushed buffer; the next owner re-reads it from Kafka");
    }
    consumer.unsubscribe();
    Ok(w.summary)
}

struct Failing {
    backoff: Duration,
    next_try: Instant,
    paused: bool,
}

struct Worker {
    config: KafkaIngestConfig,
    pipeline: Arc<Pipeline>,
    metrics: Arc<IngestMetrics>,
    handle: tokio::runtime::Handle,
    role: Role,
    writer: Writer<SpanTable>,
    /// Ingest: messages decoded into shared Arrow builders, moved to the writer as one batch
    /// every ACC_ROWS rows or ACC_AGE (far fewer, larger buffers than a batch per message).
    acc: Accumulator,
    /// The last offset per app id whose rows are in `acc`.
    acc_txns: BTreeMap<String, i64>,
    acc_since: Option<Instant>,
    sampler: Option<Sampler>,
    pending_dlq: Vec<DeadLetter>,
    redactions: RedactionCounts,
    /// Per assigned partition, the next offset to accept (messages below were already read).
    next: BTreeMap<i32, i64>,
    summary: IngestSummary,
    failing: Option<Failing>,
    empty: RecordBatch,
    /// Set when accumulated rows could not be built: the next flush drops the buffer and
    /// rewinds every partition to the table's offsets.
    rewind_pending: bool,
}

impl Worker {
    fn on_event(&mut self, consumer: &BaseConsumer<Ctx>, ev: Event) {
        match ev {
            Event::Revoked(parts) => {
                self.drop_buffer("partitions revoked");
                for p in parts {
                    self.writer.unfence(&app_id(&self.config.topic, p));
                    self.next.remove(&p);
                    self.metrics.remove_lag(&self.config.topic, p);
                }
                if self.next.is_empty() {
                    self.failing = None;
                }
            }
            Event::Assigned(parts) => {
                for (p, recorded) in parts {
                    self.writer.fence(app_id(&self.config.topic, p), recorded);
                    self.next.insert(p, recorded.map(|v| v + 1).unwrap_or(0));
                }
                if let Some(f) = &mut self.failing {
                    // New partitions start unpaused; keep them paused while the store fails.
                    f.paused = false;
                    pause(consumer, f);
                }
            }
        }
    }

    fn on_message(&mut self, m: &rdkafka::message::BorrowedMessage<'_>) {
        let p = m.partition();
        let offset = m.offset();
        let Some(next) = self.next.get_mut(&p) else {
            return; // not ours (any more)
        };
        if offset < *next {
            return; // already buffered or committed
        }
        *next = offset + 1;
        self.summary.messages += 1;
        let app = app_id(&self.config.topic, p);
        let payload = m.payload().unwrap_or(&[]);
        let encoding = self.config.format.encoding();
        // Decoded once: ingest into the accumulator, the rollup writer per message.
        let decoded = match self.role {
            Role::Ingest { .. } => self.acc.add_bytes(&self.pipeline, payload, encoding).map(|stats| {
                self.acc_txns.insert(app.clone(), offset);
                self.acc_since.get_or_insert_with(Instant::now);
                stats
            }),
            Role::Rollup { .. } => self.pipeline.process_bytes(payload, encoding).map(|done| {
                self.roll_up(&done, app.clone(), offset);
                done.stats
            }),
        };
        match decoded {
            Ok(stats) => {
                self.metrics.message(stats.rejected.total());
                self.redactions.merge(&stats.redactions);
                if self.acc.rows() >= ACC_ROWS {
                    self.move_accumulated();
                }
            }
            Err(e) if matches!(self.role, Role::Rollup { .. }) => {
                tracing::debug!(partition = p, offset, code = e.code().as_str(), "undecodable message skipped (ingest dead-letters it)");
                self.metrics.message(0);
                self.writer.push(self.empty.clone(), Some((app, offset)));
            }
            Err(e) => {
                // The rows before it go to the writer first, so that the partition's recorded
                // offset only moves forward.
                self.move_accumulated();
                let code = e.code();
                let mut message = e.to_string();
                message.truncate(1024);
                tracing::warn!(partition = p, offset, code = code.as_str(), "undecodable message; sending it to {}", self.config.dlq_topic);
                self.metrics.message(0);
                self.pending_dlq.push(DeadLetter {
                    partition: p,
                    offset,
                    key: m.key().map(<[u8]>::to_vec),
                    payload: payload.to_vec(),
                    code,
                    message,
                });
                self.writer.push(self.empty.clone(), Some((app, offset)));
            }
        }
    }

    fn on_kafka_error(&mut self, e: KafkaError) -> Result<(), IngestError> {
        match e.rdkafka_error_code() {
            Some(RDKafkaErrorCode::UnknownTopicOrPartition) | Some(RDKafkaErrorCode::UnknownTopic) => {
                tracing::warn!(topic = %self.config.topic, "the topic does not exist (yet); waiting for it");
                std::thread::sleep(Duration::from_secs(1));
                Ok(())
            }
            Some(RDKafkaErrorCode::Fatal) => Err(IngestError::Kafka(format!("fatal kafka client error: {e}"))),
            _ => {
                tracing::warn!(error = %e, "kafka consume error (the client retries)");
                Ok(())
            }
        }
    }

    fn due(&self) -> bool {
        match &self.failing {
            Some(f) => Instant::now() >= f.next_try,
            None => self.rewind_pending || self.writer.should_flush() || (!self.pending_dlq.is_empty() && self.writer.age().is_some_and(|a| a >= self.config.writer.max_age)),
        }
    }

    /// Rollup writer: observes a decoded message and buffers its rollup rows with its offset.
    fn roll_up(&mut self, done: &toolspan_schema::Processed, app: String, offset: i64) {
        let Role::Rollup { observer, buffered_spans } = &mut self.role else { return };
        observer.observe(&done.batch, &done.stats);
        *buffered_spans += done.batch.num_rows() as u64;
        match rollup::aggregate(std::slice::from_ref(&done.batch)) {
            Ok(rows) => self.writer.push(rows, Some((app, offset))),
            Err(e) => {
                // Cannot happen for the pipeline's batches; never stall on it.
                tracing::error!(error = %e, app, offset, "cannot roll up a batch; skipping it");
                self.writer.push(self.empty.clone(), Some((app, offset)));
            }
        }
    }

    /// Moves the accumulated rows and their offsets into the writer.
    fn move_accumulated(&mut self) {
        self.acc_since = None;
        match self.acc.take() {
            Ok(batch) => {
                let mut txns = std::mem::take(&mut self.acc_txns).into_iter();
                let first = txns.next();
                if let Some(b) = batch {
                    self.writer.push(b, first);
                } else if let Some(t) = first {
                    self.writer.push(self.empty.clone(), Some(t));
                }
                for t in txns {
                    self.writer.push(self.empty.clone(), Some(t));
                }
            }
            Err(e) => {
                // Building Arrow arrays from validated rows does not fail; if it ever does,
                // drop those rows uncommitted and re-read them (never skip them silently).
                tracing::error!(error = %e, "cannot build the accumulated batch; re-reading from the last committed offsets");
                self.acc_txns.clear();
                self.rewind_pending = true;
            }
        }
    }

    fn drop_buffer(&mut self, why: &str) {
        let _ = self.acc.take();
        self.acc_txns.clear();
        self.acc_since = None;
        let rows = self.writer.buffered_rows() as u64;
        if rows > 0 || !self.pending_dlq.is_empty() {
            tracing::info!(rows, dead_letters = self.pending_dlq.len(), "{why}: dropping the unflushed buffer (the owner re-reads it)");
        }
        let spans = match &mut self.role {
            Role::Ingest { .. } => rows,
            Role::Rollup { buffered_spans, .. } => std::mem::take(buffered_spans),
        };
        self.summary.discarded_spans += spans;
        self.metrics.discarded(spans);
        self.writer.discard();
        self.pending_dlq.clear();
        self.redactions = RedactionCounts::default();
    }

    /// Sends pending dead letters and waits for the broker's acknowledgements; keeps the ones
    /// that failed.
    fn deliver_dead_letters(&mut self) -> Result<(), String> {
        let Role::Ingest { producer } = &self.role else {
            return Ok(());
        };
        if self.pending_dlq.is_empty() {
            return Ok(());
        }
        let letters = std::mem::take(&mut self.pending_dlq);
        let out = producer.deliver(&self.config.topic, &self.config.dlq_topic, letters);
        for d in &out.sent {
            self.metrics.dead_letter(&self.config.topic, d.code);
            self.summary.dead_letters += 1;
        }
        self.pending_dlq = out.failed;
        match out.first_error {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    fn flush(&mut self, consumer: &BaseConsumer<Ctx>) {
        if self.rewind_pending {
            self.rewind_pending = false;
            self.drop_buffer("batch build failure");
            self.rewind(consumer);
            return;
        }
        self.move_accumulated();
        if self.writer.is_empty() && self.pending_dlq.is_empty() {
            self.recovered(consumer);
            return;
        }
        if let Err(e) = self.deliver_dead_letters() {
            self.failed(consumer, &format!("dead-letter delivery to {} failed: {e}", self.config.dlq_topic), Code::Overloaded.as_str(), "-");
            return;
        }
        if matches!(self.role, Role::Rollup { .. }) && self.writer.buffered_rows() > 0 {
            // One file per flush: the message-sized rollups merged (idempotent if retried).
            self.writer.map_batches(|b| match rollup::aggregate(&b) {
                Ok(merged) => vec![merged],
                Err(_) => b,
            });
        }
        if let Some(s) = &mut self.sampler {
            let mut decisions = None;
            self.writer.map_batches(|b| {
                let (out, d) = s.apply(b);
                decisions = Some(d);
                out
            });
            if let Some(d) = decisions {
                self.metrics.sampled(d.kept_failed, d.kept_sampled, d.dropped);
                self.summary.sampled_out_spans += d.dropped_spans;
            }
        }
        let txns: Vec<(String, i64)> = self.writer.pending_transactions().iter().map(|(a, v)| (a.clone(), *v)).collect();
        let started = Instant::now();
        let res = self.handle.block_on(self.writer.flush());
        match res {
            Ok(info) => {
                self.metrics.flush_seconds.observe(started.elapsed().as_secs_f64());
                let spans = match &mut self.role {
                    Role::Ingest { .. } => info.as_ref().map(|i| i.rows as u64).unwrap_or(0),
                    Role::Rollup { buffered_spans, .. } => std::mem::take(buffered_spans),
                };
                if let Some(info) = info {
                    self.metrics.commits.inc();
                    self.metrics.committed(spans, &self.redactions);
                    self.summary.commits += 1;
                    self.summary.spans += spans;
                    tracing::debug!(version = info.version, rows = info.rows, files = info.files, "flushed");
                }
                self.redactions = RedactionCounts::default();
                self.commit_advisory(consumer, &txns);
                self.recovered(consumer);
            }
            Err(e) if matches!(e.kind(), StoreErrorKind::Fenced { .. }) => {
                tracing::warn!(reference = e.reference(), "another worker committed this worker's partitions; re-reading them from the table");
                self.drop_buffer("fenced");
                self.rewind(consumer);
            }
            Err(e) => {
                self.summary.commit_failures += 1;
                self.metrics.commit_failures.inc();
                self.failed(consumer, &e.to_string(), e.code().as_str(), e.reference());
            }
        }
    }

    /// Kafka's committed offsets are advisory (lag monitoring); failures are only logged.
    fn commit_advisory(&self, consumer: &BaseConsumer<Ctx>, txns: &[(String, i64)]) {
        let prefix = format!("{}-", self.config.topic);
        let mut tpl = TopicPartitionList::new();
        for (app, v) in txns {
            if let Some(p) = app.strip_prefix(&prefix).and_then(|p| p.parse::<i32>().ok()) {
                let _ = tpl.add_partition_offset(&self.config.topic, p, Offset::Offset(v + 1));
            }
        }
        if tpl.count() > 0 {
            if let Err(e) = consumer.commit(&tpl, CommitMode::Async) {
                tracing::debug!(error = %e, "advisory offset commit failed");
            }
        }
    }

    fn failed(&mut self, consumer: &BaseConsumer<Ctx>, what: &str, code: &str, reference: &str) {
        let f = self.failing.get_or_insert(Failing { backoff: Duration::from_millis(250), next_try: Instant::now(), paused: false });
        tracing::warn!(code, reference, rows = self.writer.buffered_rows(), retry_in_ms = f.backoff.as_millis() as u64, "flush failed: {what}; consumption paused, nothing committed, retrying");
        f.next_try = Instant::now() + f.backoff;
        f.backoff = (f.backoff * 2).min(self.config.max_backoff);
        pause(consumer, f);
        self.metrics.store_failing.set(1);
    }

    fn recovered(&mut self, consumer: &BaseConsumer<Ctx>) {
        if let Some(f) = self.failing.take() {
            if f.paused {
                if let Ok(a) = consumer.assignment() {
                    if let Err(e) = consumer.resume(&a) {
                        tracing::warn!(error = %e, "resuming partitions failed");
                    }
                }
            }
            self.metrics.store_failing.set(0);
            tracing::info!("store writable again; buffered spans committed, consumption resumed");
        }
    }

    /// After fencing: reassign every partition at the offset the table records.
    fn rewind(&mut self, consumer: &BaseConsumer<Ctx>) {
        let Ok(assignment) = consumer.assignment() else { return };
        let mut tpl = TopicPartitionList::new();
        let parts: Vec<i32> = assignment.elements().iter().map(|e| e.partition()).collect();
        for p in parts {
            let recorded = consumer.context().recorded_blocking(&self.config.topic, p);
            self.writer.fence(app_id(&self.config.topic, p), recorded);
            self.next.insert(p, recorded.map(|v| v + 1).unwrap_or(0));
            let start = recorded.map(|v| Offset::Offset(v + 1)).unwrap_or(consumer.context().unrecorded);
            let _ = tpl.add_partition_offset(&self.config.topic, p, start);
        }
        if let Err(e) = consumer.assign(&tpl) {
            tracing::error!(error = %e, "re-assigning partitions after fencing failed");
        }
        self.failing = None;
        self.metrics.store_failing.set(0);
    }
}

fn pause(consumer: &BaseConsumer<Ctx>, f: &mut Failing) {
    if f.paused {
        return;
    }
    if let Ok(a) = consumer.assignment() {
        if a.count() > 0 {
            match consumer.pause(&a) {
                Ok(()) => f.paused = true,
                Err(e) => tracing::warn!(error = %e, "pausing partitions failed"),
            }
        }
    }
}

/// Reads a message's headers as UTF-8 pairs (for tests and tools reading the dead letters).
pub fn headers_of<M: Message>(m: &M) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Some(h) = m.headers() {
        for i in 0..h.count() {
            let hd = h.get(i);
            out.push((hd.key.to_string(), hd.value.map(|v| String::from_utf8_lossy(v).into_owned()).unwrap_or_default()));
        }
    }
    out
}
