//! Span sources feeding the one decode → classify → redact → write path. Their listeners (the
//! OTLP/HTTP receiver, the probes) are in `toolspan-serve`.
//!
//! - [`sink`]: the write side every source shares, a task owning a
//!   [`toolspan_store::Writer`] that acknowledges each submitted batch only after the Delta
//!   commit holding it;
//! - [`kafka`]: the Kafka worker (`toolspan ingest`, and under the metrics job's rollup
//!   writer), exactly-once into the table;
//! - [`metrics_job`]: the metrics job's sources, its Kafka tap and its rollup writer;
//! - [`observer`]: what sees every batch a source took in (the tool metrics);
//! - [`sampling`]: tail-based sampling at flush time;
//! - [`self_metrics`]: the worker's own metrics (lag, dead letters, flushes, store health);

pub mod error;
pub mod kafka;
pub mod metrics_job;
pub mod observer;
pub mod sampling;
pub mod self_metrics;
pub mod sink;

pub use error::IngestError;
pub use observer::BatchObserver;
pub use self_metrics::IngestMetrics;
pub use sink::{SinkConfig, SinkHandle, SinkStats};
