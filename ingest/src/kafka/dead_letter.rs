//! The dead-letter producer: poison messages go to `<topic>.dlq` with headers naming where
//! they came from and why they were refused.
//!
//! A plain [`BaseProducer`] polled by the worker, not rdkafka's `FutureProducer`: the latter
//! keeps a thread polling librdkafka every 100 ms for the life of the worker, which cost ~6 %
//! of an ingest worker's CPU (bench/ingest, perf) while sending nothing. Here delivery reports
//! are served only while letters are in flight, and the queue is drained at every flush.

use std::sync::Mutex;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::util::Timeout;
use rdkafka::ClientContext;
use toolspan_schema::Code;

/// A message bound for the dead-letter topic, kept until the broker acknowledged it.
#[derive(Debug, Clone)]
pub(super) struct DeadLetter {
    /// The source partition.
    pub partition: i32,
    /// The source offset.
    pub offset: i64,
    /// The source message's key, kept as is.
    pub key: Option<Vec<u8>>,
    /// The source message's payload, kept as is.
    pub payload: Vec<u8>,
    /// Why it was refused (a stable code).
    pub code: Code,
    /// Why it was refused, at most 1 KiB.
    pub message: String,
}

/// Records each delivery report by the letter's index in the batch being delivered.
#[derive(Default)]
struct Reports(Mutex<Vec<(usize, Result<(), String>)>>);

impl ClientContext for Reports {}

impl ProducerContext for Reports {
    type DeliveryOpaque = Box<usize>;

    fn delivery(&self, result: &DeliveryResult<'_>, index: Box<usize>) {
        let outcome = match result {
            Ok(_) => Ok(()),
            Err((e, _)) => Err(e.to_string()),
        };
        let mut reports = self.0.lock().unwrap_or_else(|p| p.into_inner());
        reports.push((*index, outcome));
    }
}

/// Sends dead letters and waits for the broker's acknowledgements.
pub(super) struct DeadLetterProducer {
    producer: BaseProducer<Reports>,
}

/// What one delivery round did.
pub(super) struct Delivered {
    /// Letters the broker acknowledged.
    pub sent: Vec<DeadLetter>,
    /// Letters to retry at the next flush.
    pub failed: Vec<DeadLetter>,
    /// The first failure's reason.
    pub first_error: Option<String>,
}

/// Where dead letters go: [`DeadLetterProducer`] in production, a recorder in the unit tests.
pub(super) trait DeadLetterSink {
    /// Serves queued client events (errors, logs) without blocking; called periodically so
    /// the queue does not grow while no letter is sent.
    fn serve_events(&self);

    /// Sends `letters` to `dlq_topic` and waits until each is acknowledged or failed.
    fn deliver(&self, source_topic: &str, dlq_topic: &str, letters: Vec<DeadLetter>) -> Delivered;
}

impl DeadLetterProducer {
    /// A producer with `config` (idempotent, see the worker).
    pub fn new(config: &ClientConfig) -> Result<DeadLetterProducer, KafkaError> {
        Ok(DeadLetterProducer {
            producer: config.create_with_context(Reports::default())?,
        })
    }
}

impl DeadLetterSink for DeadLetterProducer {
    fn serve_events(&self) {
        self.producer.poll(Duration::ZERO);
    }

    /// Sends `letters` to `dlq_topic` and waits until librdkafka reports on each (at most
    /// `message.timeout.ms`, as librdkafka bounds every message's delivery).
    fn deliver(&self, source_topic: &str, dlq_topic: &str, letters: Vec<DeadLetter>) -> Delivered {
        let mut outcomes: Vec<Option<Result<(), String>>> = vec![None; letters.len()];
        for (i, d) in letters.iter().enumerate() {
            let headers = OwnedHeaders::new()
                .insert(Header {
                    key: "toolspan.source.topic",
                    value: Some(source_topic),
                })
                .insert(Header {
                    key: "toolspan.source.partition",
                    value: Some(d.partition.to_string().as_str()),
                })
                .insert(Header {
                    key: "toolspan.source.offset",
                    value: Some(d.offset.to_string().as_str()),
                })
                .insert(Header {
                    key: "toolspan.error.code",
                    value: Some(d.code.as_str()),
                })
                .insert(Header {
                    key: "toolspan.error.message",
                    value: Some(d.message.as_str()),
                });
            let mut rec =
                BaseRecord::<[u8], [u8], Box<usize>>::with_opaque_to(dlq_topic, Box::new(i))
                    .payload(&d.payload[..])
                    .headers(headers);
            if let Some(k) = &d.key {
                rec = rec.key(&k[..]);
            }
            if let Err((e, _)) = self.producer.send(rec) {
                outcomes[i] = Some(Err(e.to_string()));
            }
        }
        // Serves delivery reports until every sent letter has one.
        if let Err(e) = self.producer.flush(Timeout::Never) {
            tracing::warn!(error = %e, "dead-letter flush ended early");
        }
        let reports = std::mem::take(
            &mut *self
                .producer
                .context()
                .0
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        for (i, outcome) in reports {
            if let Some(slot) = outcomes.get_mut(i) {
                slot.get_or_insert(outcome);
            }
        }
        let mut out = Delivered {
            sent: Vec::new(),
            failed: Vec::new(),
            first_error: None,
        };
        for (d, outcome) in letters.into_iter().zip(outcomes) {
            match outcome.unwrap_or_else(|| Err("no delivery report".to_string())) {
                Ok(()) => out.sent.push(d),
                Err(e) => {
                    out.first_error.get_or_insert(e);
                    out.failed.push(d);
                }
            }
        }
        out
    }
}
