//! The metrics job's Kafka source (`toolspan metrics`): its own consumer group on the spans
//! topic, so the store's tail sampling never biases the rates. Every message goes through the
//! same decode → assemble → classify → redact path as ingest (a message whose spans miss a
//! relative waits for it, as in `toolspan ingest` and the rollup writer, so a trace split over
//! messages is counted as it is stored) and is handed to an observer (the tool metrics
//! registry). Nothing is written: Kafka's auto-commit keeps the group's position, and
//! a new group starts at the end of the topic (rates from now on), unless `-X
//! auto.offset.reset=earliest` says otherwise.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use toolspan_pipeline::{Accumulator, Assembler, Offered, Pipeline};

use crate::kafka::MessageFormat;
use crate::observer::BatchObserver;
use crate::IngestError;

/// What the tap saw.
#[derive(Debug, Default, Clone)]
pub struct TapSummary {
    /// Messages read.
    pub messages: u64,
    /// Spans observed.
    pub spans: u64,
    /// Messages that could not be decoded (ingest dead-letters them; the tap skips them).
    pub undecodable: u64,
}

/// Settings of the tap.
#[derive(Debug, Clone)]
pub struct TapConfig {
    /// `bootstrap.servers`.
    pub brokers: String,
    /// The spans topic.
    pub topic: String,
    /// Consumer group (default `toolspan-metrics`).
    pub group: String,
    /// Message encoding.
    pub format: MessageFormat,
    /// librdkafka settings passed through, applied last.
    pub client_options: Vec<(String, String)>,
}

/// Runs the tap until `stop` is set. Blocking: call it from a dedicated thread.
pub fn run_tap(
    config: TapConfig,
    pipeline: Arc<Pipeline>,
    observer: Arc<dyn BatchObserver>,
    stop: Arc<AtomicBool>,
) -> Result<TapSummary, IngestError> {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &config.brokers)
        .set("group.id", &config.group)
        .set("enable.auto.commit", "true")
        .set("auto.offset.reset", "latest")
        .set("enable.partition.eof", "false");
    for (k, v) in &config.client_options {
        c.set(k, v);
    }
    c.set_log_level(RDKafkaLogLevel::Warning);
    let consumer: BaseConsumer = c
        .create()
        .map_err(|e| IngestError::Config(format!("cannot create the kafka consumer: {e}")))?;
    consumer
        .subscribe(&[config.topic.as_str()])
        .map_err(|e| IngestError::Config(format!("cannot subscribe to {}: {e}", config.topic)))?;
    tracing::info!(brokers = %config.brokers, topic = %config.topic, group = %config.group, "metrics tap started");
    let encoding = config.format.encoding();
    let mut s = TapSummary::default();
    // Tagged by offset; grouped by partition (released in offset order per partition).
    let mut assembler: Assembler<i64> = Assembler::for_pipeline(&pipeline);
    let observe = |out: Offered<i64>, acc: &mut Accumulator, s: &mut TapSummary| {
        if out.released.is_empty() {
            return;
        }
        match acc.take() {
            Ok(Some(batch)) => {
                s.spans += batch.num_rows() as u64;
                observer.observe(&batch, &out.stats);
            }
            Ok(None) => {}
            // Cannot happen for the pipeline's rows; never stall on it.
            Err(e) => tracing::error!(error = %e, "cannot build released rows; skipping them"),
        }
    };
    while !stop.load(Ordering::Relaxed) {
        let mut acc = Accumulator::new();
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Ok(m)) => {
                s.messages += 1;
                let group = u64::from(m.partition() as u32);
                match assembler.offer(
                    &pipeline,
                    m.payload().unwrap_or(&[]),
                    encoding,
                    group,
                    m.offset(),
                    Instant::now(),
                    &mut acc,
                ) {
                    Ok(out) => observe(out, &mut acc, &mut s),
                    Err(e) => {
                        s.undecodable += 1;
                        tracing::debug!(
                            code = e.code().as_str(),
                            partition = m.partition(),
                            offset = m.offset(),
                            "undecodable message skipped"
                        );
                    }
                }
            }
            Some(Err(e)) => tracing::warn!(error = %e, "kafka consume error (the client retries)"),
        }
        if !assembler.is_empty() {
            let out = assembler.expire(&pipeline, Instant::now(), &mut acc);
            observe(out, &mut acc, &mut s);
        }
    }
    // What still waits is counted as it is (ingest stores it so at the end of its wait).
    if !assembler.is_empty() {
        let mut acc = Accumulator::new();
        let end = Instant::now() + pipeline.assembly().wait + Duration::from_secs(1);
        let out = assembler.expire(&pipeline, end, &mut acc);
        observe(out, &mut acc, &mut s);
    }
    consumer.unsubscribe();
    Ok(s)
}
