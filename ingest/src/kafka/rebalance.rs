//! The consumer's librdkafka context: logs and lag statistics, and the rebalance callback that
//! resumes each assigned partition from the offset the table records (see the protocol in the
//! parent module). Rebalances are queued as [`Event`]s for the worker loop.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use crate::IngestMetrics;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::statistics::Statistics;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use toolspan_store::SpanTable;

use super::table::{recorded_blocking, resume_at};

/// A rebalance seen inside librdkafka's callback, handled by the loop after `poll` returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Event {
    /// Partitions assigned, with the version the table records for each.
    Assigned(Vec<(i32, Option<i64>)>),
    /// Partitions revoked.
    Revoked(Vec<i32>),
}

/// The consumer's context: what the rebalance callback needs to resume from the table.
pub(super) struct Ctx {
    pub(super) topic: String,
    pub(super) table: SpanTable,
    /// Where a partition the table has no offset for starts.
    pub(super) unrecorded: Offset,
    pub(super) handle: tokio::runtime::Handle,
    pub(super) metrics: Arc<IngestMetrics>,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) events: Mutex<Vec<Event>>,
}

impl ClientContext for Ctx {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, msg: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", facility = fac, "{msg}")
            }
            RDKafkaLogLevel::Warning => {
                tracing::warn!(target: "librdkafka", facility = fac, "{msg}")
            }
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", facility = fac, "{msg}")
            }
            RDKafkaLogLevel::Debug => {
                tracing::debug!(target: "librdkafka", facility = fac, "{msg}")
            }
        }
    }

    fn stats(&self, stats: Statistics) {
        if let Some(t) = stats.topics.get(&self.topic) {
            for (p, part) in &t.partitions {
                if *p >= 0 && part.consumer_lag >= 0 {
                    self.metrics.set_lag(&self.topic, *p, part.consumer_lag);
                }
            }
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(target: "librdkafka", error = %error, reason, "kafka client error");
    }
}

impl ConsumerContext for Ctx {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let parts: Vec<(String, i32)> = tpl
                    .elements()
                    .iter()
                    .map(|e| (e.topic().to_string(), e.partition()))
                    .collect();
                let mut assigned = Vec::new();
                let mut with_offsets = TopicPartitionList::new();
                for (topic, p) in parts {
                    let recorded = self.recorded_blocking(&topic, p);
                    let start = resume_at(recorded, self.unrecorded);
                    if let Err(e) = with_offsets.add_partition_offset(&topic, p, start) {
                        tracing::error!(error = %e, partition = p, "cannot set the start offset");
                    }
                    assigned.push((p, recorded));
                }
                tracing::info!(partitions = ?assigned, "partitions assigned; resuming from the offsets recorded in the table");
                if let Err(e) = consumer.assign(&with_offsets) {
                    tracing::error!(error = %e, "assigning partitions failed");
                }
                self.push(Event::Assigned(assigned));
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                let parts: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
                tracing::info!(partitions = ?parts, "partitions revoked");
                self.push(Event::Revoked(parts));
                if let Err(e) = consumer.unassign() {
                    tracing::warn!(error = %e, "unassigning partitions failed");
                }
            }
            other => {
                let code: RDKafkaErrorCode = other.into();
                tracing::warn!(error = %code, "rebalance error; dropping the assignment");
                let parts: Vec<i32> = consumer
                    .assignment()
                    .map(|a| a.elements().iter().map(|e| e.partition()).collect())
                    .unwrap_or_default();
                self.push(Event::Revoked(parts));
                let _ = consumer.unassign();
            }
        }
    }
}

impl Ctx {
    fn push(&self, e: Event) {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(e);
    }

    /// The rebalances queued since the last call.
    pub(super) fn take_events(&self) -> Vec<Event> {
        std::mem::take(&mut *self.events.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The version the table records for a partition (see [`recorded_blocking`]).
    fn recorded_blocking(&self, topic: &str, partition: i32) -> Option<i64> {
        recorded_blocking(&self.table, &self.handle, &self.stop, topic, partition)
    }
}
