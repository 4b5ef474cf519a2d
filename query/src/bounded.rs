//! Scalar functions whose output can be far larger than their input, held to the memory limit.
//!
//! DataFusion's memory pool accounts for what operators buffer (hash tables, sorts, the
//! collected result), not for what a scalar function allocates while it evaluates one batch:
//! `repeat('x', 2000000000)` allocated 2 GB per row outside the pool and reached 13.7 GB of
//! RSS under a 1 GiB limit. A function is dangerous when its output size is a product of its
//! arguments rather than a sum of its inputs: `repeat`, `lpad`/`rpad` (a target length),
//! `replace`/`regexp_replace` (every match can grow), `array_repeat`, `array_resize`,
//! `range`/`generate_series` (a list per row). Each of these is re-registered here behind
//! [`Bounded`], which computes an upper bound of the output's size from the arguments before
//! the function runs and reserves it in the query memory pool for the duration of the call:
//! when the pool cannot hold it, the query fails with `resources_exhausted` before anything
//! is allocated. Functions whose output is bounded by the size of their inputs (`concat`,
//! `upper`, `substr`, …) need no bound: their inputs already fit.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, FieldRef, Int64Type, IntervalMonthDayNanoType};
use datafusion::common::{Result, ScalarValue};
use datafusion::error::DataFusionError;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool};
use datafusion::execution::FunctionRegistry;
use datafusion::logical_expr::simplify::{ExprSimplifyResult, SimplifyContext};
use datafusion::logical_expr::{
    ColumnarValue, Documentation, Expr, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature,
};
use datafusion::prelude::SessionContext;

/// How a function's output size follows from its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Growth {
    /// `repeat(s, n)`: `len(s) * n`.
    Repeat,
    /// `lpad(s, n [, fill])`, `rpad`: `n` characters of up to 4 bytes.
    Pad,
    /// `replace(s, from, to)`: every occurrence of `from` (between every character when empty)
    /// becomes `to`.
    Replace,
    /// `regexp_replace(s, pattern, replacement [, flags])`: a match at every position, each
    /// replaced by `replacement` with group references (at most the whole text each).
    RegexpReplace,
    /// `array_repeat(v, n)`: `n` copies of `v`.
    ArrayRepeat,
    /// `array_resize(a, n [, v])`: `n` elements.
    ArrayResize,
    /// `range(start, stop [, step])`, `generate_series`: `(stop - start) / step` elements.
    Range,
}

/// The functions held to the memory limit, by the name DataFusion registers them under.
const BOUNDED: &[(&str, Growth)] = &[
    ("repeat", Growth::Repeat),
    ("lpad", Growth::Pad),
    ("rpad", Growth::Pad),
    ("replace", Growth::Replace),
    ("regexp_replace", Growth::RegexpReplace),
    ("array_repeat", Growth::ArrayRepeat),
    ("array_resize", Growth::ArrayResize),
    ("range", Growth::Range),
    ("generate_series", Growth::Range),
];

/// Re-registers the functions of [`BOUNDED`] in `ctx` behind [`Bounded`], reserving in `pool`.
pub(crate) fn install(ctx: &SessionContext, pool: &Arc<dyn MemoryPool>) -> Result<()> {
    for (name, growth) in BOUNDED {
        let Ok(inner) = ctx.udf(name) else {
            // Not part of this build's function set: nothing to bound.
            continue;
        };
        ctx.register_udf(ScalarUDF::new_from_impl(Bounded {
            inner,
            growth: *growth,
            pool: pool.clone(),
        }));
    }
    Ok(())
}

/// A scalar function whose output is reserved in the memory pool before it is computed.
#[derive(Debug)]
pub struct Bounded {
    inner: Arc<ScalarUDF>,
    growth: Growth,
    pool: Arc<dyn MemoryPool>,
}

impl PartialEq for Bounded {
    fn eq(&self, other: &Self) -> bool {
        self.inner == other.inner && self.growth == other.growth
    }
}

impl Eq for Bounded {}

impl Hash for Bounded {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.inner.name().hash(state);
        self.growth.hash(state);
    }
}

impl ScalarUDFImpl for Bounded {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        self.inner.return_type(arg_types)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        self.inner.return_field_from_args(args)
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        self.inner.coerce_types(arg_types)
    }

    fn simplify(&self, args: Vec<Expr>, info: &SimplifyContext) -> Result<ExprSimplifyResult> {
        self.inner.simplify(args, info)
    }

    fn short_circuits(&self) -> bool {
        self.inner.short_circuits()
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.inner.documentation()
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let bytes = output_bound(self.growth, &args.args, args.number_rows);
        let reservation =
            MemoryConsumer::new(format!("{}()", self.inner.name())).register(&self.pool);
        if bytes > 0 {
            let want = usize::try_from(bytes).unwrap_or(usize::MAX);
            reservation.try_grow(want).map_err(|_| {
                DataFusionError::ResourcesExhausted(format!(
                    "{}() would produce up to {bytes} bytes for one batch, more than the query \
                     memory pool has free",
                    self.inner.name()
                ))
            })?;
        }
        // The reservation lives until the function has returned: its output then belongs to
        // the operator that asked for it.
        let out = self.inner.invoke_with_args(args);
        drop(reservation);
        out
    }
}

/// One argument, row by row: a scalar stands for every row.
enum Arg<'a> {
    Scalar(&'a ScalarValue),
    Array(&'a ArrayRef),
}

impl Arg<'_> {
    fn of(v: &ColumnarValue) -> Arg<'_> {
        match v {
            ColumnarValue::Scalar(s) => Arg::Scalar(s),
            ColumnarValue::Array(a) => Arg::Array(a),
        }
    }
}

/// Byte length of each row of a string (or binary) argument; `None` for other types.
fn byte_lengths(arg: &Arg<'_>, rows: usize) -> Option<Vec<u64>> {
    match arg {
        Arg::Scalar(s) => {
            let len = match s {
                ScalarValue::Utf8(v) | ScalarValue::LargeUtf8(v) | ScalarValue::Utf8View(v) => {
                    v.as_ref().map_or(0, |s| s.len())
                }
                ScalarValue::Binary(v)
                | ScalarValue::LargeBinary(v)
                | ScalarValue::BinaryView(v) => v.as_ref().map_or(0, |b| b.len()),
                _ => return None,
            };
            Some(vec![len as u64; rows])
        }
        Arg::Array(a) => {
            let lens: Vec<u64> = match a.data_type() {
                DataType::Utf8 => a.as_string::<i32>().iter().map(len_of).collect(),
                DataType::LargeUtf8 => a.as_string::<i64>().iter().map(len_of).collect(),
                DataType::Utf8View => a.as_string_view().iter().map(len_of).collect(),
                DataType::Binary => a.as_binary::<i32>().iter().map(blen_of).collect(),
                DataType::LargeBinary => a.as_binary::<i64>().iter().map(blen_of).collect(),
                DataType::BinaryView => a.as_binary_view().iter().map(blen_of).collect(),
                _ => return None,
            };
            Some(lens)
        }
    }
}

fn len_of(s: Option<&str>) -> u64 {
    s.map_or(0, |s| s.len() as u64)
}

fn blen_of(b: Option<&[u8]>) -> u64 {
    b.map_or(0, |b| b.len() as u64)
}

/// Each row of an integer argument (nulls and other types: `None`).
fn integers(arg: &Arg<'_>, rows: usize) -> Option<Vec<Option<i64>>> {
    match arg {
        Arg::Scalar(s) => {
            if !s.data_type().is_integer() {
                return None;
            }
            let v = match s.cast_to(&DataType::Int64).ok()? {
                ScalarValue::Int64(v) => v,
                _ => None,
            };
            Some(vec![v; rows])
        }
        Arg::Array(a) => {
            if !a.data_type().is_integer() {
                return None;
            }
            let c = cast(a, &DataType::Int64).ok()?;
            Some(c.as_primitive::<Int64Type>().iter().collect())
        }
    }
}

/// The size of one value of an argument, for the array functions' element size.
fn element_bytes(arg: &Arg<'_>, rows: usize) -> u64 {
    let bytes = match arg {
        Arg::Scalar(s) => s.size() as u64,
        Arg::Array(a) => (a.get_array_memory_size() / rows.max(1)) as u64,
    };
    bytes.max(8)
}

/// An upper bound of the bytes `growth` produces from `args` over `rows` rows (0: no
/// estimate, the inputs bound it).
fn output_bound(growth: Growth, args: &[ColumnarValue], rows: usize) -> u64 {
    let args: Vec<Arg<'_>> = args.iter().map(Arg::of).collect();
    // All-scalar arguments produce one scalar, whatever the batch size.
    let rows = if args.iter().all(|a| matches!(a, Arg::Scalar(_))) {
        1
    } else {
        rows
    };
    let count = |i: usize| -> Option<Vec<u64>> {
        integers(args.get(i)?, rows).map(|v| {
            v.into_iter()
                .map(|n| n.unwrap_or(0).max(0) as u64)
                .collect()
        })
    };
    let lens = |i: usize| -> Option<Vec<u64>> { byte_lengths(args.get(i)?, rows) };
    let total = |per_row: &mut dyn Iterator<Item = u64>| -> u64 {
        per_row.fold(0u64, |acc, b| acc.saturating_add(b))
    };
    match growth {
        Growth::Repeat => match (lens(0), count(1)) {
            (Some(s), Some(n)) => total(&mut s.iter().zip(&n).map(|(s, n)| s.saturating_mul(*n))),
            _ => 0,
        },
        Growth::Pad => match count(1) {
            Some(n) => total(&mut n.iter().map(|n| n.saturating_mul(4))),
            None => 0,
        },
        Growth::Replace => match (lens(0), lens(1), lens(2)) {
            (Some(s), Some(from), Some(to)) => total(&mut (0..s.len()).map(|i| {
                let hits = s[i].checked_div(from[i]).unwrap_or(s[i] + 1);
                s[i].saturating_add(hits.saturating_mul(to[i]))
            })),
            _ => 0,
        },
        Growth::RegexpReplace => match (lens(0), lens(2)) {
            (Some(s), Some(r)) => total(
                &mut s
                    .iter()
                    .zip(&r)
                    .map(|(s, r)| s.saturating_add((s + 1).saturating_mul(r.saturating_mul(2)))),
            ),
            _ => 0,
        },
        Growth::ArrayRepeat => match (args.first(), count(1)) {
            (Some(v), Some(n)) => {
                let each = element_bytes(v, rows);
                total(&mut n.iter().map(|n| n.saturating_mul(each)))
            }
            _ => 0,
        },
        Growth::ArrayResize => match count(1) {
            Some(n) => total(&mut n.iter().map(|n| n.saturating_mul(16))),
            None => 0,
        },
        Growth::Range => range_elements(&args, rows).saturating_mul(8),
    }
}

/// Elements `range`/`generate_series` produce over all rows: integers exactly, dates and
/// timestamps stepped by an interval approximately (a month counted as 28 days, so never
/// underestimated).
fn range_elements(args: &[Arg<'_>], rows: usize) -> u64 {
    let (start, stop, step) = match args.len() {
        1 => (None, 0usize, None),
        2 => (Some(0usize), 1, None),
        _ => (Some(0usize), 1, Some(2usize)),
    };
    let as_i64 = |i: usize| -> Option<Vec<Option<i64>>> {
        let a = args.get(i)?;
        if let Some(v) = integers(a, rows) {
            return Some(v);
        }
        // Dates as days, timestamps in their own unit: cast to Int64 keeps the raw value.
        let dt = match a {
            Arg::Scalar(s) => s.data_type(),
            Arg::Array(a) => a.data_type().clone(),
        };
        let scale: i64 = match dt {
            DataType::Date32 => 86_400_000_000_000,
            DataType::Date64 => 1_000_000,
            DataType::Timestamp(u, _) => match u {
                datafusion::arrow::datatypes::TimeUnit::Second => 1_000_000_000,
                datafusion::arrow::datatypes::TimeUnit::Millisecond => 1_000_000,
                datafusion::arrow::datatypes::TimeUnit::Microsecond => 1_000,
                datafusion::arrow::datatypes::TimeUnit::Nanosecond => 1,
            },
            _ => return None,
        };
        let raw = match a {
            Arg::Scalar(s) => {
                let v = match s.cast_to(&DataType::Int64).ok()? {
                    ScalarValue::Int64(v) => v,
                    _ => None,
                };
                vec![v; rows]
            }
            Arg::Array(a) => {
                let c = cast(a, &DataType::Int64).ok()?;
                c.as_primitive::<Int64Type>().iter().collect()
            }
        };
        Some(
            raw.into_iter()
                .map(|v| v.map(|v| v.saturating_mul(scale)))
                .collect(),
        )
    };
    let step_of = |i: usize| -> Option<Vec<Option<i64>>> {
        let a = args.get(i)?;
        if let Some(v) = integers(a, rows) {
            return Some(v);
        }
        let nanos = |m: i32, d: i32, n: i64| -> i64 {
            (i64::from(m) * 28 + i64::from(d))
                .saturating_mul(86_400_000_000_000)
                .saturating_add(n)
        };
        match a {
            Arg::Scalar(ScalarValue::IntervalMonthDayNano(v)) => {
                Some(vec![
                    v.map(|v| nanos(v.months, v.days, v.nanoseconds));
                    rows
                ])
            }
            Arg::Array(a) if matches!(a.data_type(), DataType::Interval(_)) => {
                let c = cast(
                    a,
                    &DataType::Interval(datafusion::arrow::datatypes::IntervalUnit::MonthDayNano),
                )
                .ok()?;
                Some(
                    c.as_primitive::<IntervalMonthDayNanoType>()
                        .iter()
                        .map(|v| v.map(|v| nanos(v.months, v.days, v.nanoseconds)))
                        .collect(),
                )
            }
            _ => None,
        }
    };
    let Some(stops) = as_i64(stop) else {
        return 0;
    };
    let starts = match start {
        Some(i) => match as_i64(i) {
            Some(v) => v,
            None => return 0,
        },
        None => vec![Some(0); rows],
    };
    let steps = match step {
        Some(i) => match step_of(i) {
            Some(v) => v,
            None => return 0,
        },
        // Dates default to a step of one day, integers to one.
        None => vec![Some(1); rows],
    };
    let mut n = 0u64;
    for i in 0..rows {
        let (Some(a), Some(b), Some(s)) = (starts[i], stops[i], steps[i]) else {
            continue;
        };
        let span = (i128::from(b) - i128::from(a)).unsigned_abs();
        let step = i128::from(s).unsigned_abs().max(1);
        let elements = u64::try_from(span / step + 1).unwrap_or(u64::MAX);
        n = n.saturating_add(elements);
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> ColumnarValue {
        ColumnarValue::Scalar(ScalarValue::Utf8(Some(v.into())))
    }

    fn i(v: i64) -> ColumnarValue {
        ColumnarValue::Scalar(ScalarValue::Int64(Some(v)))
    }

    #[test]
    fn bounds_follow_the_arguments() {
        assert_eq!(
            output_bound(Growth::Repeat, &[s("ab"), i(1_000_000_000)], 8192),
            2_000_000_000
        );
        assert_eq!(output_bound(Growth::Pad, &[s("a"), i(10)], 1), 40);
        assert_eq!(
            output_bound(Growth::Replace, &[s("aaaa"), s("a"), s("xyz")], 1),
            4 + 12
        );
        assert_eq!(
            output_bound(Growth::Replace, &[s("ab"), s(""), s("xy")], 1),
            2 + 6
        );
        assert_eq!(
            output_bound(Growth::Range, &[i(0), i(1_000_000)], 1),
            8_000_008
        );
        let column =
            ColumnarValue::Array(Arc::new(datafusion::arrow::array::StringArray::from(vec![
                "abc", "de",
            ])));
        assert_eq!(output_bound(Growth::Repeat, &[column, i(10)], 2), 50);
    }
}
