//! The columns of the `spans` table, one row per span: names are the SQL interface.

use std::sync::{Arc, LazyLock};

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};

/// Partition columns of the table, in path order.
pub const PARTITION_COLUMNS: [&str; 3] = ["tool", "stage", "date"];

/// The reserved `tool` value of spans that belong to no tool call (agent runs, model calls,
/// unknown spans), so that partition paths stay valid.
pub const NO_TOOL: &str = "_none";

/// Payloads keep this many bytes after redaction (cut on a character boundary).
pub const PAYLOAD_LIMIT: usize = 4096;

/// Error messages keep this many bytes.
pub const MESSAGE_LIMIT: usize = 1024;

/// Column names, so that other crates refer to them without string typos.
pub mod col {
    #![allow(missing_docs)]
    pub const TENANT: &str = "tenant";
    pub const TRACE_ID: &str = "trace_id";
    pub const SPAN_ID: &str = "span_id";
    pub const PARENT_SPAN_ID: &str = "parent_span_id";
    pub const NAME: &str = "name";
    pub const KIND: &str = "kind";
    pub const SERVICE: &str = "service";
    pub const SERVICE_VERSION: &str = "service_version";
    pub const AGENT: &str = "agent";
    pub const TOOL: &str = "tool";
    pub const STAGE: &str = "stage";
    pub const CALL_ID: &str = "call_id";
    pub const ATTEMPT: &str = "attempt";
    pub const START_TIME: &str = "start_time";
    pub const END_TIME: &str = "end_time";
    pub const START_TIME_UNIX_NANO: &str = "start_time_unix_nano";
    pub const DATE: &str = "date";
    pub const DURATION_MS: &str = "duration_ms";
    pub const STATUS: &str = "status";
    pub const ERROR_TYPE: &str = "error_type";
    pub const ERROR_CODE: &str = "error_code";
    pub const ERROR_CLASS: &str = "error_class";
    pub const RETRYABLE: &str = "retryable";
    pub const RETRY_AFTER_MS: &str = "retry_after_ms";
    pub const REFERENCE: &str = "reference";
    pub const ERROR_MESSAGE: &str = "error_message";
    pub const HTTP_STATUS: &str = "http_status";
    pub const MODEL: &str = "model";
    pub const INPUT_TOKENS: &str = "input_tokens";
    pub const OUTPUT_TOKENS: &str = "output_tokens";
    pub const INPUT: &str = "input";
    pub const OUTPUT: &str = "output";
    pub const INPUT_SHA256: &str = "input_sha256";
    pub const OUTPUT_SHA256: &str = "output_sha256";
    pub const INPUT_BYTES: &str = "input_bytes";
    pub const OUTPUT_BYTES: &str = "output_bytes";
    pub const LEAKED_INTERNALS: &str = "leaked_internals";
    pub const REDACTIONS: &str = "redactions";
    pub const SAMPLE_WEIGHT: &str = "sample_weight";
    pub const ATTRIBUTES: &str = "attributes";
    pub const RESOURCE_ATTRIBUTES: &str = "resource_attributes";
    pub const EVENTS: &str = "events";
    pub const STATUS_FROM_RESULT: &str = "status_from_result";
    pub const INPUT_SHAPE: &str = "input_shape";
    pub const OUTPUT_SHAPE: &str = "output_shape";
    pub const INPUT_SHAPE_DOC: &str = "input_shape_doc";
    pub const OUTPUT_SHAPE_DOC: &str = "output_shape_doc";
}

/// Timestamps are stored with microsecond precision, the Delta Lake `timestamp` type that every
/// Delta reader understands; `start_time_unix_nano` keeps the exact nanoseconds of the start,
/// and `duration_ms` (a float, exact to the nanosecond for spans shorter than 104 days) the end.
fn ts() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

static SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    use col::*;
    let s = |n: &str, null: bool| Field::new(n, DataType::Utf8, null);
    Arc::new(Schema::new(vec![
        s(TENANT, false),
        s(TRACE_ID, false),
        s(SPAN_ID, false),
        s(PARENT_SPAN_ID, true),
        s(NAME, false),
        s(KIND, false),
        s(SERVICE, false),
        s(SERVICE_VERSION, true),
        s(AGENT, true),
        s(TOOL, false),
        s(STAGE, false),
        s(CALL_ID, true),
        Field::new(ATTEMPT, DataType::Int32, true),
        Field::new(START_TIME, ts(), false),
        Field::new(END_TIME, ts(), false),
        Field::new(START_TIME_UNIX_NANO, DataType::Int64, false),
        Field::new(DATE, DataType::Date32, false),
        Field::new(DURATION_MS, DataType::Float64, false),
        s(STATUS, false),
        s(ERROR_TYPE, true),
        s(ERROR_CODE, true),
        s(ERROR_CLASS, true),
        Field::new(RETRYABLE, DataType::Boolean, true),
        Field::new(RETRY_AFTER_MS, DataType::Int64, true),
        s(REFERENCE, true),
        s(ERROR_MESSAGE, true),
        Field::new(HTTP_STATUS, DataType::Int32, true),
        s(MODEL, true),
        Field::new(INPUT_TOKENS, DataType::Int64, true),
        Field::new(OUTPUT_TOKENS, DataType::Int64, true),
        s(INPUT, true),
        s(OUTPUT, true),
        s(INPUT_SHA256, true),
        s(OUTPUT_SHA256, true),
        Field::new(INPUT_BYTES, DataType::Int64, true),
        Field::new(OUTPUT_BYTES, DataType::Int64, true),
        Field::new(LEAKED_INTERNALS, DataType::Boolean, false),
        Field::new(REDACTIONS, DataType::Int32, false),
        Field::new(SAMPLE_WEIGHT, DataType::Float64, false),
        s(ATTRIBUTES, false),
        s(RESOURCE_ATTRIBUTES, false),
        s(EVENTS, false),
        // Added after the first release: last and nullable, so that a table created before it
        // gains it by a schema change alone (older rows read NULL).
        Field::new(STATUS_FROM_RESULT, DataType::Boolean, true),
        // The shape of each payload (key paths and JSON types, `crate::shape`) of the full
        // body: its id (16 hex digits, or the kind of a payload that is not JSON) and its
        // canonical form, which repeats per row in Arrow but is one dictionary entry per
        // distinct shape in each Parquet column chunk. Added later: last and nullable.
        s(INPUT_SHAPE, true),
        s(OUTPUT_SHAPE, true),
        s(INPUT_SHAPE_DOC, true),
        s(OUTPUT_SHAPE_DOC, true),
    ]))
});

/// The Arrow schema of the `spans` table.
pub fn spans_schema() -> SchemaRef {
    SCHEMA.clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_has_the_design_columns() {
        let schema = spans_schema();
        for name in [
            "tenant",
            "trace_id",
            "span_id",
            "parent_span_id",
            "name",
            "service",
            "service_version",
            "agent",
            "tool",
            "stage",
            "call_id",
            "attempt",
            "start_time",
            "end_time",
            "duration_ms",
            "status",
            "error_type",
            "error_code",
            "error_class",
            "retryable",
            "retry_after_ms",
            "reference",
            "error_message",
            "http_status",
            "model",
            "input_tokens",
            "output_tokens",
            "input",
            "output",
            "input_sha256",
            "output_sha256",
            "input_bytes",
            "output_bytes",
            "leaked_internals",
            "attributes",
            "resource_attributes",
            "events",
            "date",
            "status_from_result",
            "input_shape",
            "output_shape",
            "input_shape_doc",
            "output_shape_doc",
        ] {
            assert!(
                schema.field_with_name(name).is_ok(),
                "missing column {name}"
            );
        }
    }
}
