//! The one typed reader of span rows in Arrow batches of the `spans` schema: the metrics job,
//! tail sampling and the rollup read spans through it, beside the columns it reads (a
//! front end reading a query's result uses `toolspan_query::rows`, which also accepts the
//! types a statement may give a column).

use crate::columns::col;
use crate::vocab::Status;
use arrow::array::{
    Array, AsArray, BooleanArray, Float64Array, Int32Array, Int64Array, StringArray,
};
use arrow::datatypes::{Float64Type, Int32Type, Int64Type};
use arrow::record_batch::RecordBatch;

/// The columns of one batch.
pub struct SpanRows<'a> {
    trace_id: &'a StringArray,
    span_id: &'a StringArray,
    parent_span_id: &'a StringArray,
    service: &'a StringArray,
    service_version: &'a StringArray,
    tool: &'a StringArray,
    stage: &'a StringArray,
    call_id: &'a StringArray,
    attempt: &'a Int32Array,
    duration_ms: &'a Float64Array,
    status: &'a StringArray,
    error_type: &'a StringArray,
    error_code: &'a StringArray,
    leaked_internals: &'a BooleanArray,
    start_ns: &'a Int64Array,
    sample_weight: &'a Float64Array,
    input_sha256: &'a StringArray,
    /// Absent in a batch from before the shape columns.
    output_shape: Option<&'a StringArray>,
    len: usize,
}

/// One span (its stage: [`SpanRows::stage`]).
#[allow(missing_docs)]
pub struct SpanRow<'a> {
    pub trace_id: &'a str,
    pub span_id: &'a str,
    pub parent_span_id: Option<&'a str>,
    pub service: &'a str,
    pub service_version: Option<&'a str>,
    pub tool: &'a str,
    pub call_id: Option<&'a str>,
    pub attempt: Option<i32>,
    pub duration_ms: f64,
    pub failed: bool,
    pub error_type: Option<&'a str>,
    pub error_code: Option<&'a str>,
    pub leaked_internals: bool,
    pub input_sha256: Option<&'a str>,
}

impl<'a> SpanRows<'a> {
    /// The columns, or the name of the first one missing or of another type than
    /// `toolspan_schema::spans_schema` gives it.
    pub fn new(batch: &'a RecordBatch) -> Result<SpanRows<'a>, &'static str> {
        let s = |name: &'static str| {
            batch
                .column_by_name(name)
                .and_then(|c| c.as_string_opt::<i32>())
                .ok_or(name)
        };
        Ok(SpanRows {
            trace_id: s(col::TRACE_ID)?,
            span_id: s(col::SPAN_ID)?,
            parent_span_id: s(col::PARENT_SPAN_ID)?,
            service: s(col::SERVICE)?,
            service_version: s(col::SERVICE_VERSION)?,
            tool: s(col::TOOL)?,
            stage: s(col::STAGE)?,
            call_id: s(col::CALL_ID)?,
            attempt: batch
                .column_by_name(col::ATTEMPT)
                .and_then(|c| c.as_primitive_opt::<Int32Type>())
                .ok_or(col::ATTEMPT)?,
            duration_ms: batch
                .column_by_name(col::DURATION_MS)
                .and_then(|c| c.as_primitive_opt::<Float64Type>())
                .ok_or(col::DURATION_MS)?,
            status: s(col::STATUS)?,
            error_type: s(col::ERROR_TYPE)?,
            error_code: s(col::ERROR_CODE)?,
            leaked_internals: batch
                .column_by_name(col::LEAKED_INTERNALS)
                .and_then(|c| c.as_boolean_opt())
                .ok_or(col::LEAKED_INTERNALS)?,
            start_ns: batch
                .column_by_name(col::START_TIME_UNIX_NANO)
                .and_then(|c| c.as_primitive_opt::<Int64Type>())
                .ok_or(col::START_TIME_UNIX_NANO)?,
            sample_weight: batch
                .column_by_name(col::SAMPLE_WEIGHT)
                .and_then(|c| c.as_primitive_opt::<Float64Type>())
                .ok_or(col::SAMPLE_WEIGHT)?,
            input_sha256: s(col::INPUT_SHA256)?,
            output_shape: s(col::OUTPUT_SHAPE).ok(),
            len: batch.num_rows(),
        })
    }

    /// Spans in the batch.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the batch has no span.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The tool of span `i` (read before the rest, to skip `_none` spans cheaply).
    pub fn tool(&self, i: usize) -> &'a str {
        str_at(self.tool, i).unwrap_or("")
    }

    /// The stage of span `i`.
    pub fn stage(&self, i: usize) -> &'a str {
        str_at(self.stage, i).unwrap_or("")
    }

    /// The start time of span `i`, in nanoseconds since the epoch.
    pub fn start_ns(&self, i: usize) -> i64 {
        self.start_ns.value(i)
    }

    /// Whether span `i` failed ([`Status::is_failed`]).
    pub fn failed(&self, i: usize) -> bool {
        str_at(self.status, i).is_some_and(Status::is_failed)
    }

    /// The service of span `i` (`""` when absent).
    pub fn service(&self, i: usize) -> &'a str {
        str_at(self.service, i).unwrap_or("")
    }

    /// The service version of span `i`.
    pub fn service_version(&self, i: usize) -> Option<&'a str> {
        str_at(self.service_version, i)
    }

    /// The error type of span `i`.
    pub fn error_type(&self, i: usize) -> Option<&'a str> {
        str_at(self.error_type, i)
    }

    /// The sampling weight of span `i` (1 when it was not sampled).
    pub fn sample_weight(&self, i: usize) -> f64 {
        if self.sample_weight.is_null(i) {
            1.0
        } else {
            self.sample_weight.value(i)
        }
    }

    /// Whether the batch has the `output_shape` column.
    pub fn has_shapes(&self) -> bool {
        self.output_shape.is_some()
    }

    /// The shape of span `i`'s output, when it has one.
    pub fn output_shape(&self, i: usize) -> Option<&'a str> {
        self.output_shape.and_then(|a| str_at(a, i))
    }

    /// The trace id of span `i`.
    pub fn trace_id(&self, i: usize) -> &'a str {
        str_at(self.trace_id, i).unwrap_or("")
    }

    /// Span `i`.
    pub fn row(&self, i: usize) -> SpanRow<'a> {
        SpanRow {
            trace_id: str_at(self.trace_id, i).unwrap_or(""),
            span_id: str_at(self.span_id, i).unwrap_or(""),
            parent_span_id: str_at(self.parent_span_id, i),
            service: str_at(self.service, i).unwrap_or(""),
            service_version: str_at(self.service_version, i),
            tool: self.tool(i),
            call_id: str_at(self.call_id, i),
            attempt: (!self.attempt.is_null(i)).then(|| self.attempt.value(i)),
            duration_ms: if self.duration_ms.is_null(i) {
                0.0
            } else {
                self.duration_ms.value(i)
            },
            failed: self.failed(i),
            error_type: str_at(self.error_type, i),
            error_code: str_at(self.error_code, i),
            leaked_internals: !self.leaked_internals.is_null(i) && self.leaked_internals.value(i),
            input_sha256: str_at(self.input_sha256, i),
        }
    }
}

fn str_at(a: &StringArray, i: usize) -> Option<&str> {
    (!a.is_null(i)).then(|| a.value(i))
}
