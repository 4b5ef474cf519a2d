//! The one path from OTLP bytes to classified, redacted Arrow record batches of the `spans`
//! table (whose contract is `toolspan-schema`):
//!
//! - [`otlp`] decodes OTLP protobuf and OTLP/JSON;
//! - [`redact`] removes secrets, [`leak`] spots internals leaked to the model;
//! - [`process`] ties them together into a [`arrow::record_batch::RecordBatch`], classifying
//!   every span on the way ([`process::classify`]: the passes and the rules file they apply);
//! - [`error`] is the pipeline's error type.

pub mod error;
pub mod leak;
pub mod otlp;
pub mod process;
pub mod redact;
mod trigger;

pub use error::PipelineError;
pub use otlp::Encoding;
pub use process::assemble::{AssembleConfig, Assembler, AssemblyStats, Offered, Prepared};
pub use process::memory::{MemoryConfig, MemoryStats};
pub use process::{Accumulator, Pipeline, Processed, Stats};
