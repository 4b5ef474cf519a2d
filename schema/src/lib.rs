//! toolspan's leaf crate: the `spans` table's columns and the one path from OTLP bytes to
//! classified, redacted Arrow record batches.
//!
//! - [`otlp`] decodes OTLP protobuf and OTLP/JSON;
//! - [`classify`] holds the stage and error-type vocabulary and the rules file;
//! - [`redact`] removes secrets, [`leak`] spots internals leaked to the model;
//! - [`pipeline`] ties them together into a [`arrow::record_batch::RecordBatch`];
//! - [`columns`] is the table's schema, [`parquet_props`] its Parquet settings;
//! - [`error`] holds the stable error codes every crate maps onto.

pub mod classify;
pub mod columns;
pub mod envelope;
pub mod error;
pub mod leak;
pub mod otlp;
pub mod parquet_props;
pub mod pipeline;
pub mod redact;
mod trigger;

pub use classify::{ErrorType, Stage};
pub use columns::spans_schema;
pub use envelope::{Envelope, EnvelopeError};
pub use error::{Code, ErrorClass, SchemaError};
pub use otlp::Encoding;
pub use pipeline::{Accumulator, Pipeline, Processed, Stats};
