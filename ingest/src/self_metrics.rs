//! Kafka ingest self-metrics (`dashboards/METRICS.md`, "Ingest self-metrics"): consumer lag,
//! dead letters, flushes, commits, sampling decisions and store health of one `toolspan
//! ingest` worker. In embedded mode only the flush histogram and the store gauge apply; the
//! Kafka-only series are not registered there.

use std::sync::Arc;

use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use toolspan_pipeline::redact::SecretKind;
use toolspan_pipeline::Pipeline;
use toolspan_schema::Code;

type Labels = Vec<(&'static str, String)>;

/// Stable codes a dead letter may carry (created at 0 at startup).
pub const DEAD_LETTER_CODES: [Code; 3] = [Code::OtlpDecode, Code::OtlpJson, Code::OtlpLimit];

/// Flush latency buckets, seconds (METRICS.md).
const FLUSH_BUCKETS: [f64; 11] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// The ingest worker's metrics.
pub struct IngestMetrics {
    registry: Registry,
    /// `toolspan_ingest_flush_seconds`.
    pub flush_seconds: Histogram,
    /// `toolspan_ingest_commits_total`.
    pub commits: Counter,
    /// `toolspan_ingest_commit_failures_total`.
    pub commit_failures: Counter,
    /// `toolspan_ingest_store_failing` (1 while the store cannot be written).
    pub store_failing: Gauge,
    kafka: Option<KafkaFamilies>,
    trace_memory: TraceMemoryFamilies,
}

/// The pipeline's trace memory, read when scraped.
struct TraceMemoryFamilies {
    pipeline: std::sync::OnceLock<Arc<Pipeline>>,
    entries: Gauge,
    bytes: Gauge,
    evicted: Counter,
    evicted_seen: std::sync::atomic::AtomicU64,
    assembly_units: Gauge,
    assembly_bytes: Gauge,
    assembly_held: Counter,
    assembly_expired: Counter,
    assembly_evicted: Counter,
    /// The assembly counters as last read (held, expired, evicted).
    assembly_seen: std::sync::Mutex<(u64, u64, u64)>,
}

struct KafkaFamilies {
    lag: Family<Labels, Gauge>,
    dead_letters: Family<Labels, Counter>,
    spans: Counter,
    messages: Counter,
    rejected_spans: Counter,
    redactions: Family<Labels, Counter>,
    sampling: Family<Labels, Counter>,
    discarded: Counter,
}

impl IngestMetrics {
    /// Metrics of embedded mode: flushes, commits and store health only (the tool metrics
    /// registry already has `toolspan_ingest_spans_total` and `toolspan_redactions_total`).
    pub fn embedded() -> Arc<IngestMetrics> {
        Arc::new(IngestMetrics::build(None))
    }

    /// Metrics of a Kafka worker consuming `topic`, with the series that start at zero.
    pub fn kafka(topic: &str) -> Arc<IngestMetrics> {
        Arc::new(IngestMetrics::build(Some(topic)))
    }

    fn build(topic: Option<&str>) -> IngestMetrics {
        let mut registry = Registry::default();
        let flush_seconds = Histogram::new(FLUSH_BUCKETS);
        registry.register(
            "toolspan_ingest_flush_seconds",
            "One flush: from the start of the Parquet write to the Delta commit (data and offsets) returning",
            flush_seconds.clone(),
        );
        let commits = Counter::default();
        registry.register(
            "toolspan_ingest_commits",
            "Delta commits made by this worker",
            commits.clone(),
        );
        let commit_failures = Counter::default();
        registry.register(
            "toolspan_ingest_commit_failures",
            "Flushes that failed (store unavailable, conflicts) and were retried",
            commit_failures.clone(),
        );
        let store_failing = Gauge::default();
        registry.register(
            "toolspan_ingest_store_failing",
            "1 while the spans table cannot be written (consumption paused), else 0",
            store_failing.clone(),
        );
        let trace_memory = TraceMemoryFamilies {
            pipeline: std::sync::OnceLock::new(),
            entries: Gauge::default(),
            bytes: Gauge::default(),
            evicted: Counter::default(),
            evicted_seen: Default::default(),
            assembly_units: Gauge::default(),
            assembly_bytes: Gauge::default(),
            assembly_held: Counter::default(),
            assembly_expired: Counter::default(),
            assembly_evicted: Counter::default(),
            assembly_seen: Default::default(),
        };
        registry.register(
            "toolspan_trace_memory_entries",
            "Recent spans (and what their children told them) remembered to classify traces that arrive in pieces",
            trace_memory.entries.clone(),
        );
        registry.register(
            "toolspan_trace_memory_bytes",
            "Approximate bytes held by the trace memory (capped by --trace-memory-mb)",
            trace_memory.bytes.clone(),
        );
        registry.register(
            "toolspan_trace_memory_evicted",
            "Remembered spans forgotten before --trace-memory-secs because the memory was full",
            trace_memory.evicted.clone(),
        );
        registry.register(
            "toolspan_trace_assembly_waiting_units",
            "Requests or Kafka messages waiting for a relative of their spans (a parent, a failing child)",
            trace_memory.assembly_units.clone(),
        );
        registry.register(
            "toolspan_trace_assembly_waiting_bytes",
            "Payload bytes waiting in trace assembly (capped by --assembly-max-mb)",
            trace_memory.assembly_bytes.clone(),
        );
        registry.register(
            "toolspan_trace_assembly_held",
            "Requests or messages that waited for a relative of their spans",
            trace_memory.assembly_held.clone(),
        );
        registry.register(
            "toolspan_trace_assembly_expired",
            "Requests or messages stored as they were after --assembly-wait-secs (a relative never came)",
            trace_memory.assembly_expired.clone(),
        );
        registry.register(
            "toolspan_trace_assembly_evicted",
            "Requests or messages stored early because trace assembly was full (--assembly-max-mb)",
            trace_memory.assembly_evicted.clone(),
        );
        let kafka = topic.map(|topic| {
            let lag = Family::<Labels, Gauge>::default();
            registry.register(
                "toolspan_ingest_consumer_lag",
                "Messages between the partition's high watermark and this worker's position",
                lag.clone(),
            );
            let dead_letters = Family::<Labels, Counter>::default();
            registry.register(
                "toolspan_ingest_dead_letters",
                "Messages sent to <topic>.dlq, by stable error code",
                dead_letters.clone(),
            );
            for code in DEAD_LETTER_CODES {
                drop(dead_letters.get_or_create(&vec![("topic", topic.to_string()), ("code", code.as_str().to_string())]));
            }
            let spans = Counter::default();
            registry.register(
                "toolspan_ingest_spans",
                "Spans committed to the spans table (after tail sampling)",
                spans.clone(),
            );
            let messages = Counter::default();
            registry.register("toolspan_ingest_messages", "Kafka messages consumed", messages.clone());
            let rejected_spans = Counter::default();
            registry.register(
                "toolspan_ingest_rejected_spans",
                "Spans dropped inside decodable messages (invalid ids), as OTLP partial success counts them",
                rejected_spans.clone(),
            );
            let redactions = Family::<Labels, Counter>::default();
            registry.register(
                "toolspan_redactions",
                "Secrets replaced by [REDACTED:kind] in stored spans",
                redactions.clone(),
            );
            for kind in SecretKind::ALL {
                drop(redactions.get_or_create(&vec![("kind", kind.as_str().to_string())]));
            }
            let sampling = Family::<Labels, Counter>::default();
            registry.register(
                "toolspan_ingest_sampling_decisions",
                "Tail-sampling decisions per trace and flush: kept_failed, kept_sampled, dropped",
                sampling.clone(),
            );
            let discarded = Counter::default();
            registry.register(
                "toolspan_ingest_discarded_spans",
                "Buffered spans dropped uncommitted on a partition revocation or fencing (re-read by the new owner)",
                discarded.clone(),
            );
            KafkaFamilies { lag, dead_letters, spans, messages, rejected_spans, redactions, sampling, discarded }
        });
        IngestMetrics {
            registry,
            flush_seconds,
            commits,
            commit_failures,
            store_failing,
            kafka,
            trace_memory,
        }
    }

    /// Sets the lag of a partition.
    pub fn set_lag(&self, topic: &str, partition: i32, lag: i64) {
        if let Some(k) = &self.kafka {
            k.lag
                .get_or_create(&part_labels(topic, partition))
                .set(lag.max(0));
        }
    }

    /// Removes the lag series of a revoked partition.
    pub fn remove_lag(&self, topic: &str, partition: i32) {
        if let Some(k) = &self.kafka {
            k.lag.remove(&part_labels(topic, partition));
        }
    }

    /// Counts a dead letter.
    pub fn dead_letter(&self, topic: &str, code: Code) {
        if let Some(k) = &self.kafka {
            k.dead_letters
                .get_or_create(&vec![
                    ("topic", topic.to_string()),
                    ("code", code.as_str().to_string()),
                ])
                .inc();
        }
    }

    /// Counts committed spans and their redactions.
    pub fn committed(&self, spans: u64, redactions: &toolspan_pipeline::redact::RedactionCounts) {
        if let Some(k) = &self.kafka {
            k.spans.inc_by(spans);
            for kind in SecretKind::ALL {
                let n = redactions.get(kind);
                if n > 0 {
                    k.redactions
                        .get_or_create(&vec![("kind", kind.as_str().to_string())])
                        .inc_by(n);
                }
            }
        }
    }

    /// Counts a consumed message and the spans it had to reject.
    pub fn message(&self, rejected_spans: u64) {
        if let Some(k) = &self.kafka {
            k.messages.inc();
            k.rejected_spans.inc_by(rejected_spans);
        }
    }

    /// Counts sampling decisions (traces).
    pub fn sampled(&self, kept_failed: u64, kept_sampled: u64, dropped: u64) {
        if let Some(k) = &self.kafka {
            for (d, n) in [
                ("kept_failed", kept_failed),
                ("kept_sampled", kept_sampled),
                ("dropped", dropped),
            ] {
                if n > 0 {
                    k.sampling
                        .get_or_create(&vec![("decision", d.to_string())])
                        .inc_by(n);
                }
            }
        }
    }

    /// Counts spans dropped from the buffer uncommitted.
    pub fn discarded(&self, spans: u64) {
        if let Some(k) = &self.kafka {
            k.discarded.inc_by(spans);
        }
    }

    /// Reports `pipeline`'s trace memory (`toolspan_trace_memory_*`) from now on.
    pub fn watch_trace_memory(&self, pipeline: Arc<Pipeline>) {
        let _ = self.trace_memory.pipeline.set(pipeline);
    }

    /// The Prometheus text exposition of these metrics alone.
    pub fn encode(&self) -> String {
        if let Some(p) = self.trace_memory.pipeline.get() {
            let s = p.memory_stats();
            let tm = &self.trace_memory;
            tm.entries.set(s.entries as i64);
            tm.bytes.set(s.bytes as i64);
            let before = tm
                .evicted_seen
                .swap(s.evicted, std::sync::atomic::Ordering::Relaxed);
            tm.evicted.inc_by(s.evicted.saturating_sub(before));
            let a = p.assembly_stats();
            tm.assembly_units.set(a.units as i64);
            tm.assembly_bytes.set(a.bytes as i64);
            let mut seen = tm.assembly_seen.lock().unwrap_or_else(|e| e.into_inner());
            tm.assembly_held.inc_by(a.held.saturating_sub(seen.0));
            tm.assembly_expired.inc_by(a.expired.saturating_sub(seen.1));
            tm.assembly_evicted.inc_by(a.evicted.saturating_sub(seen.2));
            *seen = (a.held, a.expired, a.evicted);
        }
        let mut out = String::new();
        if let Err(e) = prometheus_text::encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "metrics encoding failed");
        }
        out
    }
}

fn part_labels(topic: &str, partition: i32) -> Labels {
    vec![
        ("topic", topic.to_string()),
        ("partition", partition.to_string()),
    ]
}

impl toolspan_metrics::Exposition for IngestMetrics {
    fn exposition(&self) -> String {
        self.encode()
    }
}
