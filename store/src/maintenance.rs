//! Compaction and retention of the `spans` table: standard Delta operations that
//! keep exactly-once and running queries intact.
//!
//! - [`SpanTable::compact`]: bin-packing of the partitions of closed days (`merge`: delta-rs's
//!   `optimize` plan, committed so that two processes cannot both merge the same files); a
//!   `dataChange = false` commit, so concurrent appends (and their transaction versions)
//!   neither conflict with it nor change; the rows are the same, in fewer files.
//! - [`SpanTable::compact_crowded`]: the same for single partitions of any day (today's
//!   included) once they hold many small files, so that queries over the open day do not
//!   open one file per flush; a small target bounds how often a row is rewritten (files that
//!   reached it are left alone).
//! - [`SpanTable::expire`]: deletes the partitions of days before a cutoff (a metadata-only
//!   Delta delete: whole files are removed from the log, nothing is rewritten). It carries
//!   the same application transaction as a merge, so a merge and an expiry racing cannot both
//!   land (the merge would bring expired rows back).
//! - [`SpanTable::vacuum`]: physically deletes files no version younger than the retention
//!   period references. A query that started on an older snapshot keeps reading its files as
//!   long as it is younger than the retention period (one hour by default).

mod merge;
pub mod periodic;

pub use periodic::{MaintenanceConfig, RoundReport};

use std::time::Duration;

use deltalake::datafusion::prelude::{col, lit};
use deltalake::datafusion::scalar::ScalarValue;

use crate::error::StoreError;
use crate::table::SpanTable;

/// What a compaction did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactReport {
    /// Small files removed (replaced).
    pub files_removed: u64,
    /// Compacted files added.
    pub files_added: u64,
    /// Partitions that had files merged.
    pub partitions: u64,
}

/// What an expiry did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExpireReport {
    /// Files removed from the table.
    pub files_removed: u64,
}

impl SpanTable {
    /// Merges the small files of every partition whose `date` is before `before` (an ISO date
    /// `YYYY-MM-DD`, UTC) into files of about `target_bytes`.
    pub async fn compact(
        &self,
        before: &str,
        target_bytes: u64,
    ) -> Result<CompactReport, StoreError> {
        let report = self
            .merge_small_files(
                |values, _| {
                    values
                        .get("date")
                        .and_then(|d| d.as_deref())
                        .is_some_and(|d| d < before)
                },
                target_bytes,
            )
            .await?;
        if report.files_removed > 0 {
            tracing::info!(
                before,
                removed = report.files_removed,
                added = report.files_added,
                partitions = report.partitions,
                "compacted closed partitions"
            );
        }
        Ok(report)
    }

    /// Merges the files smaller than `target_bytes` of every partition that holds at least
    /// `min_files` of them. Unlike [`SpanTable::compact`] it touches the partitions ingest is
    /// appending to, which is safe for the same reason: a merge commit changes no data, and
    /// appends do not read.
    pub async fn compact_crowded(
        &self,
        min_files: usize,
        target_bytes: u64,
    ) -> Result<CompactReport, StoreError> {
        let report = self
            .merge_small_files(|_, small| small >= min_files.max(2), target_bytes)
            .await?;
        if report.files_removed > 0 {
            tracing::info!(
                removed = report.files_removed,
                added = report.files_added,
                partitions = report.partitions,
                "compacted crowded partitions"
            );
        }
        Ok(report)
    }

    /// Removes every row of the days before `before` (`YYYY-MM-DD`, UTC) from the table.
    pub async fn expire(&self, before: &str) -> Result<ExpireReport, StoreError> {
        let days = date_days(before)?;
        let table = self.latest().await?;
        let props = merge::maintenance_commit(&table);
        let (done, metrics) = table
            .delete()
            .with_predicate(col("date").lt(lit(ScalarValue::Date32(Some(days)))))
            .with_commit_properties(props)
            .await
            .map_err(|e| StoreError::from_delta("expiring old partitions", e))?;
        self.remember_public(&done);
        let report = ExpireReport {
            files_removed: metrics.num_removed_files as u64,
        };
        if report.files_removed > 0 {
            tracing::info!(
                before,
                files = report.files_removed,
                "expired partitions past retention"
            );
        }
        Ok(report)
    }

    /// Deletes files that no table version younger than `retention` references. Returns the
    /// number of files deleted.
    pub async fn vacuum(&self, retention: Duration) -> Result<usize, StoreError> {
        let table = self.latest().await?;
        let period = chrono::Duration::from_std(retention).unwrap_or(chrono::Duration::hours(1));
        let props = crate::table::commit_properties(&table);
        let (done, metrics) = table
            .vacuum()
            .with_commit_properties(props)
            .with_retention_period(period)
            .with_enforce_retention_duration(false)
            .await
            .map_err(|e| StoreError::from_delta("vacuuming unreferenced files", e))?;
        self.remember_public(&done);
        if !metrics.files_deleted.is_empty() {
            tracing::info!(
                files = metrics.files_deleted.len(),
                "vacuumed unreferenced files"
            );
        }
        Ok(metrics.files_deleted.len())
    }

    /// Number of data files in the latest version.
    pub async fn file_count(&self) -> Result<usize, StoreError> {
        let table = self.latest().await?;
        let uris = table
            .get_file_uris()
            .map_err(|e| StoreError::from_delta("listing data files", e))?;
        Ok(uris.count())
    }
}

fn date_days(iso: &str) -> Result<i32, StoreError> {
    let d = chrono::NaiveDate::parse_from_str(iso, "%Y-%m-%d")
        .map_err(|e| StoreError::internal("parsing a retention date", e))?;
    let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).unwrap_or_default();
    Ok((d - epoch).num_days() as i32)
}
