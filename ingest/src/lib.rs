//! Span sources feeding the one decode → classify → redact → write path.
//!
//! - [`sink`]: the write side every source shares, a task owning a
//!   [`toolspan_store::Writer`] that acknowledges each submitted batch only after the Delta
//!   commit holding it;
//! - [`otlp_http`]: the OTLP/HTTP receiver (`POST /v1/traces`) of embedded mode;
//! - [`kafka`]: the Kafka worker (`toolspan ingest`), exactly-once into the table;
//! - [`sampling`]: tail-based sampling at flush time;
//! - [`maintenance`]: compaction and retention while ingest runs.

pub mod error;
pub mod kafka;
pub mod maintenance;
pub mod sampling;
pub mod tap;
pub mod otlp_http;
pub mod sink;

pub use error::IngestError;
pub use otlp_http::{router, BatchObserver, ReceiverConfig, ReceiverState};
pub use sink::{SinkConfig, SinkHandle, SinkStats};
