//! Kafka ingest (`toolspan ingest`): consume the topic the OpenTelemetry Collector's kafka
//! exporter writes and land every span in the `spans` table exactly once (each flush is one Delta commit carrying its offsets).
//!
//! The protocol, per worker:
//! - **Assignment.** Inside librdkafka's rebalance callback, before the partitions are assigned,
//!   the worker reads each partition's transaction version (`<topic>-<partition>`, the last
//!   offset committed) from the table and assigns the partition at the next offset: it resumes
//!   from the table, never from Kafka's committed offsets (those are advisory, for lag). The
//!   worker then *fences* the partition at that version (see [`toolspan_store::Writer::fence`]).
//! - **Flush.** Each flush is one Delta commit holding the buffered rows and, for each
//!   partition, the last offset they cover; it lands only if the table still records the
//!   version the worker resumed from. A zombie worker whose partition moved on is refused
//!   ([`toolspan_store::StoreErrorKind::Fenced`]) and drops its buffer.
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
//! The metrics job's rollup writer ([`crate::metrics_job::run_rollup_worker`]) is the same
//! worker with another output and table: each decoded message is handed to an observer (the
//! Prometheus tool metrics) and folded into per-minute rollup rows
//! ([`toolspan_schema::rollup::aggregate`]), which are committed to
//! `failure_rates_1m` with the same offsets-as-transactions protocol, so the rollup counts
//! each span exactly once too. It does not dead-letter (ingest does); it skips and counts.
//!
//! The code follows that split: `worker` holds the protocol once, generic over the output
//! (`spans`: ingest, and the metrics job's rollup output, both behind the `output` trait: what a
//! message becomes, what a flush commits, what a poison message does), over the consumer
//! (`consumer`: librdkafka's, its rebalance callback in `rebalance`) and over the table
//! (`table`: the [`SpanTable`]). The unit tests (`tests`) drive the worker with a scripted
//! consumer, an in-memory table and a recording dead-letter sink, without a broker.
//!
//! Eager rebalancing only (librdkafka's default `range,roundrobin`): a `cooperative-sticky`
//! assignment strategy is refused at startup, since an incremental revocation would have to
//! rewind partitions this worker keeps.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::IngestMetrics;
use arrow::array::RecordBatch;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::Offset;
use toolspan_pipeline::{Encoding, Pipeline};
use toolspan_store::{SpanTable, WriterConfig};

mod client;
mod consumer;
mod dead_letter;
pub(crate) mod output;
mod rebalance;
mod spans;
mod table;
#[cfg(test)]
mod tests;
pub(crate) mod worker;

use client::{client_config, ensure_topic, is_consumer_only};
use dead_letter::DeadLetterProducer;
use output::Output;
use rebalance::Ctx;
use spans::SpansOutput;
use worker::{Shared, Worker};

use crate::sampling::SamplingConfig;
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

    /// The pipeline's name for the encoding.
    pub(crate) fn encoding(self) -> Encoding {
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
    /// Defaults for a topic: group `toolspan-ingest`, `otlp_proto`, flushes as
    /// [`WriterConfig::KAFKA`].
    pub fn new(brokers: &str, topic: &str) -> KafkaIngestConfig {
        KafkaIngestConfig {
            brokers: brokers.to_string(),
            topic: topic.to_string(),
            group: "toolspan-ingest".into(),
            format: MessageFormat::OtlpProto,
            dlq_topic: format!("{topic}.dlq"),
            client_options: Vec::new(),
            writer: WriterConfig::KAFKA,
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

/// The Delta transaction app id of a topic-partition.
pub fn app_id(topic: &str, partition: i32) -> String {
    format!("{topic}-{partition}")
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
    let producer_options: Vec<(String, String)> = config
        .client_options
        .iter()
        .filter(|(k, _)| !is_consumer_only(k))
        .cloned()
        .collect();
    let producer = DeadLetterProducer::new(&client_config(
        &base,
        &producer_options,
        &[("enable.idempotence", "true")],
    ))
    .map_err(|e| IngestError::Config(format!("cannot create the dead-letter producer: {e}")))?;
    ensure_topic(&base, &config.client_options, &config.dlq_topic, &handle);
    let empty = RecordBatch::new_empty(table.kind().schema());
    let output = SpansOutput::new(
        producer,
        &config.topic,
        &config.dlq_topic,
        config.sampling.clone(),
        empty,
    );
    run(
        config,
        table,
        output,
        Offset::Beginning,
        Shared {
            pipeline,
            metrics,
            handle,
            stop,
        },
    )
}

pub(crate) fn check_strategy(config: &KafkaIngestConfig) -> Result<(), IngestError> {
    if let Some((_, v)) = config
        .client_options
        .iter()
        .find(|(k, _)| k == "partition.assignment.strategy")
    {
        if v.contains("cooperative") {
            return Err(IngestError::Config(format!(
                "partition.assignment.strategy={v} is not supported: toolspan ingest needs eager rebalancing (range or roundrobin)"
            )));
        }
    }
    Ok(())
}

/// Creates the consumer (resuming from `table`, see [`Ctx`]) and runs a [`Worker`] writing
/// through `output` until `stop` is set; then leaves the group.
pub(crate) fn run<O: Output>(
    config: KafkaIngestConfig,
    table: SpanTable,
    output: O,
    unrecorded: Offset,
    shared: Shared,
) -> Result<IngestSummary, IngestError> {
    let mut base = ClientConfig::new();
    base.set("bootstrap.servers", &config.brokers);
    let ctx = Ctx {
        topic: config.topic.clone(),
        table: table.clone(),
        unrecorded,
        handle: shared.handle.clone(),
        metrics: shared.metrics.clone(),
        stop: shared.stop.clone(),
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
            // Prefetch: librdkafka's default, 64 MiB in the one queue of a subscribed
            // consumer whatever its partitions. 16 MiB bounded nothing more (it is one queue,
            // not one per partition) and cost a third of the rate (bench/ingest: 0.50-0.56 of
            // a plain consumer's rate against 0.77-0.85, peak RSS 365 against 361-396 MiB).
        ],
    )
    .create_with_context(ctx)
    .map_err(|e| IngestError::Config(format!("cannot create the kafka consumer: {e}")))?;
    consumer
        .subscribe(&[config.topic.as_str()])
        .map_err(|e| IngestError::Config(format!("cannot subscribe to {}: {e}", config.topic)))?;
    tracing::info!(brokers = %config.brokers, topic = %config.topic, group = %config.group, table = table.kind().name(), worker = O::NAME, "kafka worker started");

    let mut w = Worker::new(config, table, output, unrecorded, shared);
    w.run(&consumer)?;
    consumer.unsubscribe();
    Ok(w.summary().clone())
}

/// Reads a message's headers as UTF-8 pairs (for tests and tools reading the dead letters).
pub fn headers_of<M: Message>(m: &M) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Some(h) = m.headers() {
        for i in 0..h.count() {
            let hd = h.get(i);
            out.push((
                hd.key.to_string(),
                hd.value
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .unwrap_or_default(),
            ));
        }
    }
    out
}
