//! Parquet settings for span files, shared by the store and the benchmarks.
//!
//! Chosen for size and for the searches users run: zstd; dictionary encoding (most string
//! columns repeat: service, stage, status, codes); page statistics so time and status
//! predicates prune pages; bloom filters on the columns looked up by exact value
//! (`trace_id`, `reference`) so `WHERE trace_id = '…'` skips row groups.

use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use parquet::schema::types::ColumnPath;

use crate::columns::col;

/// Rows per row group: large enough for good compression, small enough that a trace lookup
/// reads little.
pub const ROW_GROUP_ROWS: usize = 128 * 1024;

/// Rows per data page (at most). A lookup of one trace or reference reads, in every column,
/// each page that holds one of its rows: at parquet's default of 20,000 rows a page, a
/// 19-span trace read 21 MB of a 10M-span table, mostly the pages of the unique ids around
/// its rows (bench/query's Q3). At 2,048 it reads half of that, a quarter with trace ids
/// also written without a dictionary, and an eighth with call ids too (below).
pub const PAGE_ROWS: usize = 2048;

/// The columns written with bloom filters (looked up by exact value: a trace, a reference).
pub const BLOOM_FILTER_COLUMNS: [&str; 2] = [col::TRACE_ID, col::REFERENCE];

/// Writer properties for span files.
pub fn writer_properties() -> WriterProperties {
    let mut b = WriterProperties::builder()
        .set_writer_version(WriterVersion::PARQUET_2_0)
        // Level 1: on span data it was both faster and smaller than level 3 (bench/encode:
        // 54.9 vs 58.0 bytes per span), since most columns are already dictionary or delta
        // encoded before zstd sees them.
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(1).unwrap_or_default()))
        .set_dictionary_enabled(true)
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .set_data_page_row_count_limit(PAGE_ROWS)
        // Values that leave (or never use) the dictionary are written PLAIN, zstd doing the
        // rest. The writer-version-2 default, DELTA_BYTE_ARRAY for strings, reserves two
        // 1 MiB bit writers per string column in every open file (~50 MiB per file here,
        // over 1 GiB of heap per ingest flush across the tool x stage files) and saved
        // under 1 byte per span.
        .set_encoding(Encoding::PLAIN);
    for c in BLOOM_FILTER_COLUMNS {
        b = b
            .set_column_bloom_filter_enabled(ColumnPath::from(c), true)
            .set_column_bloom_filter_fpp(ColumnPath::from(c), 0.01)
            // A filter covers one row group, so it never holds more distinct values than
            // the group has rows. parquet sizes each filter for this up front (the default,
            // 1M values, is 2 MiB per column per open file: with two filtered columns and
            // one file per tool and stage, hundreds of MiB per flush) and folds it down to
            // the values it saw when the file is closed.
            .set_column_bloom_filter_max_ndv(ColumnPath::from(c), ROW_GROUP_ROWS as u64);
    }
    // Ids, hashes and times are (nearly) unique: dictionaries only cost time and bytes there.
    // Times are DELTA_BINARY_PACKED (below): small deltas since rows are sorted by start.
    // Trace and call ids repeat a few times in a file, but a dictionary page (up to 1 MiB per
    // row group) is read whole by every lookup of one trace that reaches the row group: with
    // call ids in one, a trace lookup read twice the bytes. Written plain, a call's ids sit
    // near each other (rows are in start order) and zstd takes the repeats: call ids are
    // smaller without their dictionary (bench/encode: 4.9 against 5.8 bytes per span).
    for c in [
        col::TRACE_ID,
        col::CALL_ID,
        col::SPAN_ID,
        col::PARENT_SPAN_ID,
        col::INPUT_SHA256,
        col::OUTPUT_SHA256,
        col::START_TIME,
        col::END_TIME,
        col::START_TIME_UNIX_NANO,
    ] {
        b = b.set_column_dictionary_enabled(ColumnPath::from(c), false);
    }
    for c in [col::START_TIME, col::END_TIME, col::START_TIME_UNIX_NANO] {
        b = b.set_column_encoding(ColumnPath::from(c), Encoding::DELTA_BINARY_PACKED);
    }
    // Long free-text columns, and the payload shapes' ids (hashes, looked up by exact value
    // in few queries): min/max statistics prune nothing there and cost time.
    for c in [
        col::INPUT_SHAPE,
        col::OUTPUT_SHAPE,
        col::ATTRIBUTES,
        col::RESOURCE_ATTRIBUTES,
        col::EVENTS,
        col::INPUT,
        col::OUTPUT,
        col::ERROR_MESSAGE,
        col::INPUT_SHA256,
        col::OUTPUT_SHA256,
        col::INPUT_SHAPE_DOC,
        col::OUTPUT_SHAPE_DOC,
    ] {
        b = b.set_column_statistics_enabled(ColumnPath::from(c), EnabledStatistics::None);
    }
    // Float durations: byte-stream-split puts exponent and mantissa bytes in separate streams,
    // which zstd compresses far better than interleaved doubles.
    b = b
        .set_column_dictionary_enabled(ColumnPath::from(col::DURATION_MS), false)
        .set_column_encoding(
            ColumnPath::from(col::DURATION_MS),
            Encoding::BYTE_STREAM_SPLIT,
        );
    // Low-cardinality vocabulary, flags and small counters: dictionary indices and RLE runs
    // leave zstd almost nothing to gain there, while a zstd codec per column chunk costs
    // context setup in every file (a partition file per tool and stage, each flush).
    for c in [
        col::TENANT,
        col::KIND,
        col::SERVICE,
        col::SERVICE_VERSION,
        col::AGENT,
        col::STATUS,
        col::ERROR_TYPE,
        col::ERROR_CLASS,
        col::RETRYABLE,
        col::LEAKED_INTERNALS,
        col::STATUS_FROM_RESULT,
        col::REDACTIONS,
        col::SAMPLE_WEIGHT,
        col::MODEL,
        col::HTTP_STATUS,
        col::ATTEMPT,
        // Payload shapes: one dictionary entry per distinct shape and RLE indices, null
        // where a span has no payload (most spans).
        col::INPUT_SHAPE,
        col::OUTPUT_SHAPE,
        col::INPUT_SHAPE_DOC,
        col::OUTPUT_SHAPE_DOC,
    ] {
        b = b.set_column_compression(ColumnPath::from(c), Compression::UNCOMPRESSED);
    }
    b.build()
}
