//! Typed access to result rows for the pages and the Tempo API: columns are read by name and
//! cast once per batch (the table's strings may be `Utf8View`, its timestamps microseconds),
//! never rendered to JSON and parsed back.

use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Float64Type, Int64Type};

use crate::engine::QueryResult;
use crate::error::{QueryError, QueryErrorKind};
use crate::service::QueryService;

/// Spans one trace lookup reads at most; a larger trace is cut and says so.
pub const MAX_TRACE_SPANS: usize = crate::trace::MAX_SPANS;

/// One column of one batch, cast to a type the readers below understand.
pub struct Col(ArrayRef);

fn internal(detail: impl std::fmt::Display) -> QueryError {
    QueryError::new(QueryErrorKind::Internal, detail)
}

impl Col {
    /// Column `name` of `batch` cast to `to` (an absent column reads as all nulls).
    pub fn of(batch: &RecordBatch, name: &str, to: &DataType) -> Result<Col, QueryError> {
        let Some(array) = batch.column_by_name(name) else {
            return Ok(Col(datafusion::arrow::array::new_null_array(
                to,
                batch.num_rows(),
            )));
        };
        if array.data_type() == to {
            return Ok(Col(array.clone()));
        }
        cast(array, to)
            .map(Col)
            .map_err(|e| internal(format_args!("casting column {name} to {to}: {e}")))
    }

    /// Text at `row` (the column cast to `Utf8`).
    pub fn str(&self, row: usize) -> Option<&str> {
        let a = self.0.as_string_opt::<i32>()?;
        (!a.is_null(row)).then(|| a.value(row))
    }

    /// An integer at `row` (the column cast to `Int64`).
    pub fn i64(&self, row: usize) -> Option<i64> {
        let a = self.0.as_primitive_opt::<Int64Type>()?;
        (!a.is_null(row)).then(|| a.value(row))
    }

    /// A float at `row` (the column cast to `Float64`).
    pub fn f64(&self, row: usize) -> Option<f64> {
        let a = self.0.as_primitive_opt::<Float64Type>()?;
        (!a.is_null(row)).then(|| a.value(row))
    }

    /// A boolean at `row` (the column cast to `Boolean`).
    pub fn bool(&self, row: usize) -> Option<bool> {
        let a = self.0.as_boolean_opt()?;
        (!a.is_null(row)).then(|| a.value(row))
    }
}

/// Readers for every column of a batch by name.
pub struct Cols<'a> {
    batch: &'a RecordBatch,
}

impl<'a> Cols<'a> {
    /// Readers over `batch`.
    pub fn new(batch: &'a RecordBatch) -> Cols<'a> {
        Cols { batch }
    }
    /// A text column.
    pub fn text(&self, name: &str) -> Result<Col, QueryError> {
        Col::of(self.batch, name, &DataType::Utf8)
    }
    /// An integer column.
    pub fn int(&self, name: &str) -> Result<Col, QueryError> {
        Col::of(self.batch, name, &DataType::Int64)
    }
    /// A float column.
    pub fn float(&self, name: &str) -> Result<Col, QueryError> {
        Col::of(self.batch, name, &DataType::Float64)
    }
    /// A boolean column.
    pub fn boolean(&self, name: &str) -> Result<Col, QueryError> {
        Col::of(self.batch, name, &DataType::Boolean)
    }
}

/// Every stored column of one span.
#[derive(Debug, Clone, Default)]
#[allow(missing_docs)]
pub struct Span {
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: Option<String>,
    pub name: String,
    pub kind: Option<String>,
    pub service: Option<String>,
    pub service_version: Option<String>,
    pub agent: Option<String>,
    pub tool: Option<String>,
    pub stage: String,
    pub call_id: Option<String>,
    pub attempt: Option<i64>,
    /// Exact start (`start_time_unix_nano`).
    pub start_unix_nano: i64,
    /// `start_time` and `end_time` as text (RFC 3339 in UTC, as every JSON answer renders
    /// the table's timestamps).
    pub start_time: Option<String>,
    pub end_time: Option<String>,
    pub duration_ms: f64,
    pub status: String,
    pub error_type: Option<String>,
    pub error_code: Option<String>,
    pub error_class: Option<String>,
    pub retryable: Option<bool>,
    pub retry_after_ms: Option<i64>,
    pub reference: Option<String>,
    pub error_message: Option<String>,
    pub http_status: Option<i64>,
    pub model: Option<String>,
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
    pub input: Option<String>,
    pub output: Option<String>,
    pub input_sha256: Option<String>,
    pub output_sha256: Option<String>,
    pub input_bytes: Option<i64>,
    pub output_bytes: Option<i64>,
    pub leaked_internals: bool,
    pub redactions: i64,
    /// JSON object text.
    pub attributes: Option<String>,
    /// JSON object text.
    pub resource_attributes: Option<String>,
    /// JSON array text.
    pub events: Option<String>,
}

impl Span {
    /// Whether the span failed.
    pub fn failed(&self) -> bool {
        toolspan_schema::Status::is_failed(&self.status)
    }

    /// The end, in nanoseconds since the epoch.
    pub fn end_unix_nano(&self) -> i64 {
        self.start_unix_nano
            .saturating_add((self.duration_ms * 1e6).round() as i64)
    }

    /// The tool, unless it is the reserved value of spans outside any tool call.
    pub fn tool_name(&self) -> Option<&str> {
        self.tool
            .as_deref()
            .filter(|t| *t != toolspan_schema::columns::NO_TOOL)
    }
}

/// The columns [`Span`] is read from.
pub const SPAN_COLUMNS: &str = "trace_id, span_id, parent_span_id, name, kind, service, \
service_version, agent, tool, stage, call_id, attempt, start_time_unix_nano, duration_ms, status, \
error_type, error_code, error_class, retryable, retry_after_ms, reference, error_message, \
http_status, model, input_tokens, output_tokens, input, output, input_sha256, output_sha256, \
input_bytes, output_bytes, leaked_internals, redactions, attributes, resource_attributes, events, \
start_time, end_time";

/// The rows of `result` (selected with [`SPAN_COLUMNS`]) as spans.
pub fn spans(result: &QueryResult) -> Result<Vec<Span>, QueryError> {
    let mut out = Vec::with_capacity(result.num_rows());
    for batch in &result.batches {
        spans_in(batch, &mut out)?;
    }
    Ok(out)
}

/// Appends the rows of one batch (selected with [`SPAN_COLUMNS`], other columns ignored).
pub fn spans_in(batch: &RecordBatch, out: &mut Vec<Span>) -> Result<(), QueryError> {
    {
        let c = Cols::new(batch);
        let (trace_id, span_id, parent, name, kind) = (
            c.text("trace_id")?,
            c.text("span_id")?,
            c.text("parent_span_id")?,
            c.text("name")?,
            c.text("kind")?,
        );
        let (service, version, agent, tool, stage, call_id) = (
            c.text("service")?,
            c.text("service_version")?,
            c.text("agent")?,
            c.text("tool")?,
            c.text("stage")?,
            c.text("call_id")?,
        );
        let (attempt, start, duration, status) = (
            c.int("attempt")?,
            c.int("start_time_unix_nano")?,
            c.float("duration_ms")?,
            c.text("status")?,
        );
        let (start_time, end_time) = (c.text("start_time")?, c.text("end_time")?);
        let (etype, ecode, eclass, retryable, retry_after, reference, message) = (
            c.text("error_type")?,
            c.text("error_code")?,
            c.text("error_class")?,
            c.boolean("retryable")?,
            c.int("retry_after_ms")?,
            c.text("reference")?,
            c.text("error_message")?,
        );
        let (http, model, itok, otok) = (
            c.int("http_status")?,
            c.text("model")?,
            c.int("input_tokens")?,
            c.int("output_tokens")?,
        );
        let (input, output, isha, osha, ibytes, obytes) = (
            c.text("input")?,
            c.text("output")?,
            c.text("input_sha256")?,
            c.text("output_sha256")?,
            c.int("input_bytes")?,
            c.int("output_bytes")?,
        );
        let (leaked, redactions, attrs, res, events) = (
            c.boolean("leaked_internals")?,
            c.int("redactions")?,
            c.text("attributes")?,
            c.text("resource_attributes")?,
            c.text("events")?,
        );
        let s = |col: &Col, i: usize| col.str(i).map(str::to_string);
        for i in 0..batch.num_rows() {
            out.push(Span {
                trace_id: s(&trace_id, i).unwrap_or_default(),
                span_id: s(&span_id, i).unwrap_or_default(),
                parent_span_id: s(&parent, i).filter(|p| !p.is_empty()),
                name: s(&name, i).unwrap_or_default(),
                kind: s(&kind, i),
                service: s(&service, i),
                service_version: s(&version, i),
                agent: s(&agent, i),
                tool: s(&tool, i),
                stage: s(&stage, i).unwrap_or_else(|| "other".into()),
                call_id: s(&call_id, i),
                attempt: attempt.i64(i),
                start_unix_nano: start.i64(i).unwrap_or(0),
                start_time: s(&start_time, i),
                end_time: s(&end_time, i),
                duration_ms: duration.f64(i).unwrap_or(0.0),
                status: s(&status, i).unwrap_or_else(|| "unset".into()),
                error_type: s(&etype, i),
                error_code: s(&ecode, i),
                error_class: s(&eclass, i),
                retryable: retryable.bool(i),
                retry_after_ms: retry_after.i64(i),
                reference: s(&reference, i),
                error_message: s(&message, i),
                http_status: http.i64(i),
                model: s(&model, i),
                input_tokens: itok.i64(i),
                output_tokens: otok.i64(i),
                input: s(&input, i),
                output: s(&output, i),
                input_sha256: s(&isha, i),
                output_sha256: s(&osha, i),
                input_bytes: ibytes.i64(i),
                output_bytes: obytes.i64(i),
                leaked_internals: leaked.bool(i).unwrap_or(false),
                redactions: redactions.i64(i).unwrap_or(0),
                attributes: s(&attrs, i),
                resource_attributes: s(&res, i),
                events: s(&events, i),
            });
        }
    }
    Ok(())
}

/// Every span of trace `trace_id` (32 lowercase hex characters, already validated) in start
/// order, at most [`MAX_TRACE_SPANS`]; the flag says whether the trace was cut.
pub async fn load_trace(
    service: &QueryService,
    trace_id: &str,
) -> Result<(Vec<Span>, bool), QueryError> {
    debug_assert!(crate::trace::normalize_trace_id(trace_id).as_deref() == Some(trace_id));
    let sql = format!(
        "SELECT {SPAN_COLUMNS} FROM spans WHERE trace_id = '{trace_id}' \
         ORDER BY start_time_unix_nano, span_id LIMIT {}",
        MAX_TRACE_SPANS + 1
    );
    let result = service.query(&sql).await?;
    let mut spans = spans(&result)?;
    let cut = spans.len() > MAX_TRACE_SPANS;
    spans.truncate(MAX_TRACE_SPANS);
    Ok((spans, cut))
}

/// Calls `f` with each row of `result`, whose columns it reads by name (each column cast
/// once per batch): for results read field by field, such as aggregates, without rendering
/// them as JSON.
pub fn each_row(result: &QueryResult, mut f: impl FnMut(&Row<'_>)) {
    for batch in &result.batches {
        let mut row = Row {
            batch,
            row: 0,
            cast: std::cell::RefCell::new(Vec::new()),
        };
        for i in 0..batch.num_rows() {
            row.row = i;
            f(&row);
        }
    }
}

/// One row of a result (see [`each_row`]). A column that is absent, null or not castable to
/// the type asked for reads as `None`.
pub struct Row<'a> {
    batch: &'a RecordBatch,
    row: usize,
    /// The columns cast so far, by name and type.
    cast: std::cell::RefCell<Vec<(String, DataType, Option<ArrayRef>)>>,
}

impl Row<'_> {
    fn col<T>(
        &self,
        name: &str,
        to: DataType,
        read: impl Fn(&Col, usize) -> Option<T>,
    ) -> Option<T> {
        let mut cast = self.cast.borrow_mut();
        let k = match cast.iter().position(|(n, t, _)| n == name && *t == to) {
            Some(k) => k,
            None => {
                let array = Col::of(self.batch, name, &to).ok().map(|c| c.0);
                cast.push((name.to_string(), to, array));
                cast.len() - 1
            }
        };
        let array = cast[k].2.clone()?;
        read(&Col(array), self.row)
    }

    /// Text.
    pub fn text(&self, name: &str) -> Option<String> {
        self.col(name, DataType::Utf8, |c, i| c.str(i).map(str::to_string))
    }

    /// An integer.
    pub fn int(&self, name: &str) -> Option<i64> {
        self.col(name, DataType::Int64, Col::i64)
    }

    /// A float.
    pub fn float(&self, name: &str) -> Option<f64> {
        self.col(name, DataType::Float64, Col::f64)
    }

    /// A boolean.
    pub fn boolean(&self, name: &str) -> Option<bool> {
        self.col(name, DataType::Boolean, Col::bool)
    }
}

/// The first column of `result` as text values (nulls skipped).
pub fn first_texts(result: &QueryResult) -> Result<Vec<String>, QueryError> {
    let mut out = Vec::new();
    for batch in &result.batches {
        if batch.num_columns() == 0 {
            continue;
        }
        let col = cast(batch.column(0), &DataType::Utf8)
            .map_err(|e| internal(format_args!("casting a column to text: {e}")))?;
        let Some(a) = col.as_string_opt::<i32>() else {
            continue;
        };
        out.extend(a.iter().flatten().map(str::to_string));
    }
    Ok(out)
}
