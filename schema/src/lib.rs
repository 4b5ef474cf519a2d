//! The `spans` table contract, shared by every toolspan crate: the classification
//! vocabulary, the columns and the error envelope every API returns:
//!
//! - [`columns`] is the table's schema, [`parquet_props`] its Parquet settings;
//! - [`vocab`] holds the stage and error-type vocabulary ([`Stage`], [`ErrorType`]);
//! - [`shape`] is the shape of a payload (key paths and JSON types), for answer drift;
//! - [`error`] holds the stable error codes every crate maps onto, and [`envelope`] the one
//!   error envelope every caller receives.
//!
//! The processing path that fills the table (OTLP decoding, classification, redaction, Arrow
//! building) is `toolspan-pipeline`.

pub mod columns;
pub mod envelope;
pub mod error;
pub mod parquet_props;
pub mod repeats;
pub mod rollup;
pub mod shape;
pub mod span_rows;
pub mod vocab;

pub use columns::spans_schema;
pub use envelope::{Envelope, EnvelopeError};
pub use error::{Code, ErrorClass};
pub use repeats::Repeats;
pub use vocab::{ErrorType, Stage, Status};
