//! toolspan's store: the Delta Lake `spans` table and its commit protocol.
//!
//! - [`SpanTable`] opens or creates the table at a local directory or URI and makes the one
//!   kind of write toolspan does: an atomic append commit that also records application
//!   transaction versions (Kafka offsets), so data and offsets land together or not at all;
//! - [`Writer`] buffers batches and versions and flushes them through a [`Committer`] on
//!   size or age; Kafka ingest and the embedded OTLP receiver share it;
//! - [`layout`] names partition directories (any value fits, bounded) and writes data files;
//! - [`storage`] is where tables live: local directories and S3-compatible object stores;
//! - the metrics job's per-minute `failure_rates_1m` table ([`TableKind::FailureRates`],
//!   defined with its rows in `toolspan_schema::rollup`) is written the same way;
//! - [`Backoff`] is how long a failed write waits before it is tried again (every writer);
//! - [`error`] maps every failure onto toolspan's stable codes.

#![warn(missing_docs)]

pub mod backoff;
pub mod error;
pub mod layout;
pub mod maintenance;
pub mod storage;
pub mod table;
pub mod writer;

pub use backoff::Backoff;
pub use error::{StoreError, StoreErrorKind};
pub use maintenance::{CompactReport, ExpireReport};
pub use table::{CommitInfo, SpanTable, TableKind, QUARANTINE_TABLE_NAME, TABLE_NAME};
pub use writer::{Committer, Writer, WriterConfig};
