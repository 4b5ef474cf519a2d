//! toolspan's store: the Delta Lake `spans` table (DESIGN §4–5).
//!
//! - [`SpanTable`] opens or creates the table at a local directory or URI and makes the one
//!   kind of write toolspan does: an atomic append commit that also records application
//!   transaction versions (Kafka offsets), so data and offsets land together or not at all;
//! - [`Writer`] buffers batches and versions and flushes them through a [`Committer`] on
//!   size or age; Kafka ingest and the embedded OTLP receiver share it;
//! - [`error`] maps every failure onto toolspan's stable codes.

#![warn(missing_docs)]

pub mod error;
pub mod maintenance;
pub mod table;
pub mod writer;

pub use error::{StoreError, StoreErrorKind};
pub use maintenance::{CompactReport, ExpireReport};
pub use table::{CommitInfo, SpanTable, TABLE_NAME};
pub use writer::{Committer, Writer, WriterConfig};
