//! The per-minute rollup table `failure_rates_1m` that the metrics job writes and the
//! `failure_rates` view reads: its name, columns, Arrow schema and partitioning. One row per
//! (minute, tool, stage, error type, service, service version) increment; readers add rows
//! of one key up ([`aggregate`] builds them from spans and merges them).

mod aggregate;

pub use aggregate::aggregate;

use std::sync::{Arc, LazyLock};

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};

/// The Delta table name of the rollup.
pub const TABLE_NAME: &str = "failure_rates_1m";

/// The rollup's partition column.
pub const PARTITION_COLUMNS: [&str; 1] = [col::DATE];

/// Column names of the rollup.
pub mod col {
    /// Start of the minute (UTC) the spans started in.
    pub const MINUTE: &str = "minute";
    /// Tool name.
    pub const TOOL: &str = "tool";
    /// Stage.
    pub const STAGE: &str = "stage";
    /// Error type of failed spans, NULL for spans that did not fail.
    pub const ERROR_TYPE: &str = "error_type";
    /// `service.name`.
    pub const SERVICE: &str = "service";
    /// `service.version`.
    pub const SERVICE_VERSION: &str = "service_version";
    /// Spans of the group (weighted).
    pub const SPANS: &str = "spans";
    /// Failed spans of the group (weighted).
    pub const FAILURES: &str = "failures";
    /// UTC day of `minute` (partition).
    pub const DATE: &str = "date";
}

static SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    let ts = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
    Arc::new(Schema::new(vec![
        Field::new(col::MINUTE, ts, false),
        Field::new(col::TOOL, DataType::Utf8, false),
        Field::new(col::STAGE, DataType::Utf8, false),
        Field::new(col::ERROR_TYPE, DataType::Utf8, true),
        Field::new(col::SERVICE, DataType::Utf8, false),
        Field::new(col::SERVICE_VERSION, DataType::Utf8, true),
        Field::new(col::SPANS, DataType::Float64, false),
        Field::new(col::FAILURES, DataType::Float64, false),
        Field::new(col::DATE, DataType::Date32, false),
    ]))
});

/// The Arrow schema of `failure_rates_1m`.
pub fn rollup_schema() -> SchemaRef {
    SCHEMA.clone()
}
