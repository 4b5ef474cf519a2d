//! Parquet settings for span files, shared by the store and the benchmarks.
//!
//! Chosen for size and for the searches users run: zstd; dictionary encoding (most string
//! columns repeat: service, stage, status, codes); page statistics so time and status
//! predicates prune pages; bloom filters on the columns looked up by exact value
//! (`trace_id`, `reference`, `call_id`) so `WHERE trace_id = '…'` skips row groups.

use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use parquet::schema::types::ColumnPath;

use crate::columns::col;

/// Rows per row group: large enough for good compression, small enough that a trace lookup
/// reads little.
pub const ROW_GROUP_ROWS: usize = 128 * 1024;

/// Writer properties for span files.
pub fn writer_properties() -> WriterProperties {
    let mut b = WriterProperties::builder()
        .set_writer_version(WriterVersion::PARQUET_2_0)
        // Level 3 is zstd's default; it is within a few percent of higher levels on span
        // data at a fraction of the CPU.
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3).unwrap_or_default()))
        .set_dictionary_enabled(true)
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS));
    for c in [col::TRACE_ID, col::REFERENCE, col::CALL_ID] {
        b = b
            .set_column_bloom_filter_enabled(ColumnPath::from(c), true)
            .set_column_bloom_filter_fpp(ColumnPath::from(c), 0.01);
    }
    // Ids are random: dictionaries only cost time and bytes there.
    for c in [col::SPAN_ID, col::PARENT_SPAN_ID, col::INPUT_SHA256, col::OUTPUT_SHA256, col::START_TIME_UNIX_NANO] {
        b = b.set_column_dictionary_enabled(ColumnPath::from(c), false);
    }
    b.build()
}
