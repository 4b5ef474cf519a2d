//! What the Delta log's per-file statistics say to DataFusion's pruning: the statistics a scan
//! reads for ordering and skipping files.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int64Array, UInt64Array};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int64Type, TimeUnit};
use datafusion::common::pruning::PruningStatistics;
use datafusion::common::stats::Precision;
use datafusion::common::{Column, ScalarValue};

use super::TableFiles;

/// What [`TableFiles::most_selective_first`] reads of a file's statistics in the log.
#[derive(serde::Deserialize)]
pub(super) struct FileStats {
    #[serde(rename = "numRecords")]
    pub(super) num_records: u64,
    #[serde(rename = "nullCount", default)]
    pub(super) null_count: HashMap<String, serde_json::Value>,
}

/// The Delta log's per-file statistics, with timestamp maxima widened to what they may hide:
/// Delta keeps timestamp statistics to the millisecond (delta-rs truncates when it writes
/// them), so a file whose maximum reads `…57.753` may hold a row at `…57.753999`. Minima are
/// truncated downwards, which is already safe.
///
/// Null and row counts come from [`TableFiles::null_counts`] (delta-rs 1.1 answers neither for
/// these tables), so that `error_code IS NOT NULL` skips files without error codes (the
/// `agent` and `llm` stages) and is not evaluated on files without nulls.
pub(super) struct LogStatistics<'a, S> {
    pub(super) log: S,
    pub(super) files: &'a TableFiles,
}

impl<S: PruningStatistics> PruningStatistics for LogStatistics<'_, S> {
    fn min_values(&self, column: &Column) -> Option<ArrayRef> {
        self.log.min_values(column)
    }

    fn max_values(&self, column: &Column) -> Option<ArrayRef> {
        let max = self.log.max_values(column)?;
        let slack = match max.data_type() {
            DataType::Timestamp(TimeUnit::Microsecond, _) => 999,
            DataType::Timestamp(TimeUnit::Nanosecond, _) => 999_999,
            _ => return Some(max),
        };
        let units = cast(&max, &DataType::Int64).ok()?;
        let widened: Int64Array = units
            .as_primitive::<Int64Type>()
            .unary(|v| v.saturating_add(slack));
        cast(&widened, max.data_type()).ok()
    }

    fn num_containers(&self) -> usize {
        self.log.num_containers()
    }

    fn null_counts(&self, column: &Column) -> Option<ArrayRef> {
        if self
            .files
            .partition_fields
            .iter()
            .any(|f| f.name() == &column.name)
        {
            return None;
        }
        let counts = self.files.null_counts(&column.name);
        let nulls: UInt64Array = counts.iter().map(|c| c.map(|(nulls, _)| nulls)).collect();
        Some(Arc::new(nulls))
    }

    fn row_counts(&self) -> Option<ArrayRef> {
        let rows: UInt64Array = self
            .files
            .files
            .iter()
            .map(|f| match f.statistics.as_ref().map(|s| s.num_rows) {
                Some(Precision::Exact(rows)) => Some(rows as u64),
                _ => None,
            })
            .collect();
        Some(Arc::new(rows))
    }

    fn contained(&self, column: &Column, values: &HashSet<ScalarValue>) -> Option<BooleanArray> {
        self.log.contained(column, values)
    }
}
