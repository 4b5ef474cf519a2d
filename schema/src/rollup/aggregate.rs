//! Rollup rows: what a span adds to `failure_rates_1m`, and how increments of one key merge.
//!
//! One row per (minute, tool, stage, error type, service, service version) *increment*: rows
//! are partial sums, several rows may share a key (one per flush that saw that minute, late
//! spans included), and readers add them up. `spans` counts the spans of the group (weighted
//! by `sample_weight`, so a rollup built from a sampled table stays unbiased), `failures` those
//! that failed; `error_type` is NULL for spans that did not fail. Only the stages of a tool
//! call are rolled up (`call`, `attempt`, `prepare`, `send`, `execute`, `parse`).
//!
//! [`aggregate`] builds rollup rows from `spans` batches, and also merges rollup batches (so
//! applying it twice changes nothing but the number of rows).

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, Date32Array, Float64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use arrow::error::ArrowError;

use super::{col, rollup_schema};
use crate::span_rows::SpanRows;
use crate::Stage;

const MINUTE_US: i64 = 60_000_000;
const DAY_US: i64 = 86_400_000_000;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    minute: i64,
    tool: String,
    stage: String,
    error_type: Option<String>,
    service: String,
    service_version: Option<String>,
}

/// Rollup rows for `batches`, which may be `spans` batches, rollup batches or both (rollup
/// rows are merged by key). Rows come out ordered by key. Batches of any other schema are an
/// error.
pub fn aggregate(batches: &[RecordBatch]) -> Result<RecordBatch, ArrowError> {
    let mut groups: BTreeMap<Key, (f64, f64)> = BTreeMap::new();
    let rollup = rollup_schema();
    for b in batches {
        if b.schema().fields() == rollup.fields() {
            add_rollup(b, &mut groups)?;
        } else {
            add_spans(b, &mut groups)?;
        }
    }
    build(groups)
}

fn strings<'a>(b: &'a RecordBatch, name: &str) -> Result<&'a StringArray, ArrowError> {
    b.column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<StringArray>())
        .ok_or_else(|| {
            ArrowError::SchemaError(format!("rollup input lacks the string column {name}"))
        })
}

fn floats<'a>(b: &'a RecordBatch, name: &str) -> Result<&'a Float64Array, ArrowError> {
    b.column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<Float64Array>())
        .ok_or_else(|| {
            ArrowError::SchemaError(format!("rollup input lacks the float column {name}"))
        })
}

fn times<'a>(b: &'a RecordBatch, name: &str) -> Result<&'a TimestampMicrosecondArray, ArrowError> {
    b.column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<TimestampMicrosecondArray>())
        .ok_or_else(|| {
            ArrowError::SchemaError(format!("rollup input lacks the timestamp column {name}"))
        })
}

fn opt(a: &StringArray, i: usize) -> Option<String> {
    a.is_valid(i).then(|| a.value(i).to_string())
}

fn add_spans(b: &RecordBatch, groups: &mut BTreeMap<Key, (f64, f64)>) -> Result<(), ArrowError> {
    let rows = SpanRows::new(b).map_err(|name| {
        ArrowError::SchemaError(format!("rollup input lacks the span column {name}"))
    })?;
    for i in 0..rows.len() {
        let st = rows.stage(i);
        if !Stage::parse(st).is_some_and(Stage::is_tool_stage) {
            continue;
        }
        let failed = rows.failed(i);
        let w = rows.sample_weight(i);
        // `start_time` is `start_time_unix_nano` in microseconds.
        let start_us = rows.start_ns(i).div_euclid(1_000);
        let key = Key {
            minute: start_us.div_euclid(MINUTE_US) * MINUTE_US,
            tool: rows.tool(i).to_string(),
            stage: st.to_string(),
            error_type: if failed {
                rows.error_type(i).map(str::to_string)
            } else {
                None
            },
            service: rows.service(i).to_string(),
            service_version: rows.service_version(i).map(str::to_string),
        };
        let g = groups.entry(key).or_insert((0.0, 0.0));
        g.0 += w;
        if failed {
            g.1 += w;
        }
    }
    Ok(())
}

fn add_rollup(b: &RecordBatch, groups: &mut BTreeMap<Key, (f64, f64)>) -> Result<(), ArrowError> {
    let minute = times(b, col::MINUTE)?;
    let tool = strings(b, col::TOOL)?;
    let stage = strings(b, col::STAGE)?;
    let error_type = strings(b, col::ERROR_TYPE)?;
    let service = strings(b, col::SERVICE)?;
    let version = strings(b, col::SERVICE_VERSION)?;
    let spans = floats(b, col::SPANS)?;
    let failures = floats(b, col::FAILURES)?;
    for i in 0..b.num_rows() {
        let key = Key {
            minute: minute.value(i),
            tool: tool.value(i).to_string(),
            stage: stage.value(i).to_string(),
            error_type: opt(error_type, i),
            service: service.value(i).to_string(),
            service_version: opt(version, i),
        };
        let g = groups.entry(key).or_insert((0.0, 0.0));
        g.0 += spans.value(i);
        g.1 += failures.value(i);
    }
    Ok(())
}

fn build(groups: BTreeMap<Key, (f64, f64)>) -> Result<RecordBatch, ArrowError> {
    let n = groups.len();
    let mut minute = Vec::with_capacity(n);
    let mut tool = Vec::with_capacity(n);
    let mut stage = Vec::with_capacity(n);
    let mut error_type = Vec::with_capacity(n);
    let mut service = Vec::with_capacity(n);
    let mut version = Vec::with_capacity(n);
    let mut spans = Vec::with_capacity(n);
    let mut failures = Vec::with_capacity(n);
    let mut date = Vec::with_capacity(n);
    for (k, (s, f)) in groups {
        minute.push(k.minute);
        date.push(k.minute.div_euclid(DAY_US) as i32);
        tool.push(k.tool);
        stage.push(k.stage);
        error_type.push(k.error_type);
        service.push(k.service);
        version.push(k.service_version);
        spans.push(s);
        failures.push(f);
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(TimestampMicrosecondArray::from(minute).with_timezone("UTC")),
        Arc::new(StringArray::from(tool)),
        Arc::new(StringArray::from(stage)),
        Arc::new(StringArray::from(error_type)),
        Arc::new(StringArray::from(service)),
        Arc::new(StringArray::from(version)),
        Arc::new(Float64Array::from(spans)),
        Arc::new(Float64Array::from(failures)),
        Arc::new(Date32Array::from(date)),
    ];
    RecordBatch::try_new(rollup_schema(), columns)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::columns::col as span_col;
    use crate::spans_schema;
    use arrow::datatypes::{DataType, Field, Schema};

    /// (start µs, tool, stage, status, error_type, weight).
    type Row<'a> = (i64, &'a str, &'a str, &'a str, Option<&'a str>, f64);

    /// A spans batch with the given rows and
    /// defaults elsewhere.
    fn spans(rows: &[Row<'_>]) -> RecordBatch {
        let schema = spans_schema();
        let n = rows.len();
        let cols: Vec<ArrayRef> = schema
            .fields()
            .iter()
            .map(|f| -> ArrayRef {
                let name = f.name().as_str();
                match name {
                    span_col::START_TIME_UNIX_NANO => Arc::new(arrow::array::Int64Array::from(
                        rows.iter().map(|r| r.0 * 1_000).collect::<Vec<_>>(),
                    )),
                    span_col::START_TIME | span_col::END_TIME => Arc::new(
                        TimestampMicrosecondArray::from(
                            rows.iter().map(|r| r.0).collect::<Vec<_>>(),
                        )
                        .with_timezone("UTC"),
                    ),
                    span_col::TOOL => Arc::new(StringArray::from(
                        rows.iter().map(|r| r.1).collect::<Vec<_>>(),
                    )),
                    span_col::STAGE => Arc::new(StringArray::from(
                        rows.iter().map(|r| r.2).collect::<Vec<_>>(),
                    )),
                    span_col::STATUS => Arc::new(StringArray::from(
                        rows.iter().map(|r| r.3).collect::<Vec<_>>(),
                    )),
                    span_col::ERROR_TYPE => Arc::new(StringArray::from(
                        rows.iter().map(|r| r.4).collect::<Vec<_>>(),
                    )),
                    span_col::SAMPLE_WEIGHT => Arc::new(Float64Array::from(
                        rows.iter().map(|r| r.5).collect::<Vec<_>>(),
                    )),
                    span_col::SERVICE => Arc::new(StringArray::from(vec!["agent"; n])),
                    span_col::SERVICE_VERSION => Arc::new(StringArray::from(vec![Some("1.0"); n])),
                    _ => arrow::array::new_null_array(f.data_type(), n),
                }
            })
            .collect();
        // Non-nullable columns the test does not use hold nulls; aggregate does not read them.
        let loose = Schema::new(
            schema
                .fields()
                .iter()
                .map(|f| f.as_ref().clone().with_nullable(true))
                .collect::<Vec<_>>(),
        );
        RecordBatch::try_new(Arc::new(loose), cols).unwrap()
    }

    fn rows(b: &RecordBatch) -> Vec<(i64, String, String, Option<String>, f64, f64)> {
        let m = times(b, col::MINUTE).unwrap();
        let t = strings(b, col::TOOL).unwrap();
        let s = strings(b, col::STAGE).unwrap();
        let e = strings(b, col::ERROR_TYPE).unwrap();
        let n = floats(b, col::SPANS).unwrap();
        let f = floats(b, col::FAILURES).unwrap();
        (0..b.num_rows())
            .map(|i| {
                (
                    m.value(i),
                    t.value(i).into(),
                    s.value(i).into(),
                    opt(e, i),
                    n.value(i),
                    f.value(i),
                )
            })
            .collect()
    }

    #[test]
    fn groups_by_minute_and_error_type_with_weights() {
        let t0 = 1_764_000_000_000_000; // a whole minute
        let b = spans(&[
            (t0 + 1, "search", "parse", "ok", None, 1.0),
            (
                t0 + 59_999_999,
                "search",
                "parse",
                "error",
                Some("PARSE"),
                1.0,
            ),
            (t0 + 2, "search", "parse", "error", Some("PARSE"), 1.0),
            (t0 + 3, "search", "parse", "ok", Some("PARSE"), 4.0), // type on a success: ignored
            (t0 + MINUTE_US, "search", "parse", "ok", None, 2.5),
            (t0 + 4, "search", "agent", "error", Some("PARSE"), 1.0), // not a tool stage
            (t0 + 5, "db", "call", "error", None, 1.0),
        ]);
        let out = aggregate(&[b]).unwrap();
        assert_eq!(out.schema(), rollup_schema());
        assert_eq!(
            rows(&out),
            vec![
                (t0, "db".into(), "call".into(), None, 1.0, 1.0),
                (t0, "search".into(), "parse".into(), None, 5.0, 0.0),
                (
                    t0,
                    "search".into(),
                    "parse".into(),
                    Some("PARSE".into()),
                    2.0,
                    2.0
                ),
                (
                    t0 + MINUTE_US,
                    "search".into(),
                    "parse".into(),
                    None,
                    2.5,
                    0.0
                ),
            ]
        );
        let dates = out
            .column_by_name(col::DATE)
            .unwrap()
            .as_any()
            .downcast_ref::<Date32Array>()
            .unwrap();
        assert_eq!(dates.value(0) as i64, t0 / DAY_US);
    }

    #[test]
    fn merging_rollups_adds_them_up_and_is_idempotent() {
        let t0 = 1_764_000_000_000_000;
        let a = aggregate(&[spans(&[(t0, "s", "call", "error", Some("NETWORK"), 1.0)])]).unwrap();
        let b = aggregate(&[spans(&[
            (t0 + 10, "s", "call", "error", Some("NETWORK"), 1.0),
            (t0 + 20, "s", "call", "ok", None, 1.0),
        ])])
        .unwrap();
        let merged = aggregate(&[a.clone(), b.clone()]).unwrap();
        let direct = aggregate(&[spans(&[
            (t0, "s", "call", "error", Some("NETWORK"), 1.0),
            (t0 + 10, "s", "call", "error", Some("NETWORK"), 1.0),
            (t0 + 20, "s", "call", "ok", None, 1.0),
        ])])
        .unwrap();
        assert_eq!(rows(&merged), rows(&direct));
        assert_eq!(
            rows(&aggregate(std::slice::from_ref(&merged)).unwrap()),
            rows(&merged)
        );
    }

    #[test]
    fn other_schemas_are_refused() {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int32, false)]));
        let b = RecordBatch::try_new(
            schema,
            vec![Arc::new(arrow::array::Int32Array::from(vec![1]))],
        )
        .unwrap();
        assert!(aggregate(&[b]).is_err());
    }
}
