//! Span sources feeding the one decode → classify → redact → write path.
//!
//! - [`sink`]: the write side every source shares, a task owning a
//!   [`toolspan_store::Writer`] that acknowledges each submitted batch only after the Delta
//!   commit holding it;
//! - [`otlp_http`]: the OTLP/HTTP receiver (`POST /v1/traces`) of embedded mode.

pub mod error;
pub mod otlp_http;
pub mod sink;

pub use error::IngestError;
pub use otlp_http::{router, BatchObserver, ReceiverConfig, ReceiverState};
pub use sink::{SinkConfig, SinkHandle, SinkStats};
