//! Span sources feeding the one decode → classify → redact → write path. Their listeners (the
//! OTLP/HTTP receiver, the probes) are in `toolspan-serve`.
//!
//! - [`sink`]: the write side every source shares, a task owning a
//!   [`toolspan_store::Writer`] that acknowledges each submitted batch only after the Delta
//!   commit holding it;
//! - [`kafka`]: the Kafka worker (`toolspan ingest`, and the metrics job's rollup writer),
//!   exactly-once into the table;
//! - [`tap`]: the metrics job's Kafka source when it keeps no rollup;
//! - [`observer`]: what sees every batch a source took in (the tool metrics);
//! - [`sampling`]: tail-based sampling at flush time;
//! - [`self_metrics`]: the worker's own metrics (lag, dead letters, flushes, store health);

pub mod error;
pub mod kafka;
pub mod observer;
pub mod sampling;
pub mod self_metrics;
pub mod sink;
pub mod tap;

pub use error::IngestError;
pub use observer::BatchObserver;
pub use self_metrics::IngestMetrics;
pub use sink::{SinkConfig, SinkHandle, SinkStats};
