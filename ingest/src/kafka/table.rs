//! The table side of the protocol as the worker sees it: a [`Committer`] that also reads the
//! offset it records per partition. [`SpanTable`] is the real one; the unit tests use an
//! in-memory table that applies the same fence check.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdkafka::Offset;
use toolspan_store::{Committer, SpanTable, StoreError};

use super::app_id;

/// A table the worker commits to with offsets as transactions, and resumes from.
pub(super) trait OffsetTable: Committer + 'static {
    /// The version (the last offset committed) the table records for `app_id`, `None` when it
    /// has never seen it.
    fn recorded(
        &self,
        app_id: &str,
    ) -> impl Future<Output = Result<Option<i64>, StoreError>> + Send;
}

impl OffsetTable for SpanTable {
    fn recorded(
        &self,
        app_id: &str,
    ) -> impl Future<Output = Result<Option<i64>, StoreError>> + Send {
        self.transaction_version(app_id)
    }
}

/// Where a partition resumes: after the offset the table records, or at `unrecorded` (the
/// topic's beginning for ingest, its end for the rollup writer) when it records none.
pub(super) fn resume_at(recorded: Option<i64>, unrecorded: Offset) -> Offset {
    match recorded {
        Some(v) => Offset::Offset(v + 1),
        None => unrecorded,
    }
}

/// The version the table records for a partition; retried with back-off while the store
/// cannot be read (the caller waits: assigning at a guessed offset could lose or duplicate
/// data). Gives up with `None` only once `stop` is set, when nothing will be consumed.
pub(super) fn recorded_blocking<T: OffsetTable>(
    table: &T,
    handle: &tokio::runtime::Handle,
    stop: &AtomicBool,
    topic: &str,
    partition: i32,
) -> Option<i64> {
    let app = app_id(topic, partition);
    let mut backoff =
        toolspan_store::Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
    loop {
        match handle.block_on(table.recorded(&app)) {
            Ok(v) => return v,
            Err(e) => {
                tracing::warn!(code = %e.code(), reference = e.reference(), detail = e.detail_text(), partition, "cannot read the partition's offset from the table; retrying");
                if stop.load(Ordering::Relaxed) {
                    // Shutting down: nothing will be consumed; any start offset is moot.
                    return None;
                }
                std::thread::sleep(backoff.next_delay());
            }
        }
    }
}
