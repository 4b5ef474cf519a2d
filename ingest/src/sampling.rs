//! Tail-based sampling at flush time (optional, off by default).
//!
//! A worker decides per trace, over everything it buffered for one flush:
//! - a trace with a failed span (status `error` or an `error_type`) in the buffer, or one that
//!   failed in an earlier flush of this worker (a bounded memory of failed trace ids), is kept
//!   whole with `sample_weight = 1`;
//! - any other trace is kept when a hash of its trace id falls below the keep rate, with
//!   `sample_weight = 1 / rate`, else dropped.
//!
//! The decision for a successful trace depends on the trace id alone, so it is the same in
//! every worker, in every flush and after a crash and replay: a kept trace keeps its late spans
//! and a replay rewrites exactly the same rows (exactly-once still holds for what is kept).
//! Weighted sums are unbiased: `sum(sample_weight * failed) / sum(sample_weight)` estimates the
//! failure rate of the unsampled stream.
//!
//! Decision wait: the flush interval (`--flush-ms`). A trace whose failure arrives in a later
//! flush than some of its successful spans keeps its failed spans and everything after, but the
//! successful spans flushed before were already decided (dropped unless hash-kept). Topics not
//! keyed by trace id spread a trace over partitions and workers: each worker decides on the spans
//! it sees, so a failed trace may lose successful spans that another worker saw; the hash keeps
//! successful traces consistent across workers.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use toolspan_schema::span_rows::SpanRows;

use arrow::array::{Array, ArrayRef, BooleanArray, Float64Array, RecordBatch, StringArray};
use arrow::compute::filter_record_batch;
use toolspan_schema::columns::col;

/// Sampling settings.
#[derive(Debug, Clone)]
pub struct SamplingConfig {
    /// Share of successful traces kept, in (0, 1].
    pub keep_rate: f64,
    /// Failed trace ids remembered across flushes (their late spans are kept).
    pub remember_failed: usize,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        SamplingConfig {
            keep_rate: 0.1,
            remember_failed: 1_000_000,
        }
    }
}

/// Traces decided by one [`Sampler::apply`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Decisions {
    /// Traces kept because they failed.
    pub kept_failed: u64,
    /// Successful traces kept by the hash.
    pub kept_sampled: u64,
    /// Successful traces dropped.
    pub dropped: u64,
    /// Spans dropped.
    pub dropped_spans: u64,
}

/// The tail sampler of one worker.
pub struct Sampler {
    config: SamplingConfig,
    threshold: u64,
    failed: HashSet<String>,
    order: VecDeque<String>,
}

impl Sampler {
    /// A sampler keeping `config.keep_rate` of successful traces (clamped to (0, 1]).
    pub fn new(config: SamplingConfig) -> Sampler {
        let rate = if config.keep_rate.is_finite() {
            config.keep_rate.clamp(1e-6, 1.0)
        } else {
            1.0
        };
        let threshold = if rate >= 1.0 {
            u64::MAX
        } else {
            (rate * u64::MAX as f64) as u64
        };
        Sampler {
            config: SamplingConfig {
                keep_rate: rate,
                ..config
            },
            threshold,
            failed: HashSet::new(),
            order: VecDeque::new(),
        }
    }

    /// Whether a successful trace with this id is kept.
    pub fn keeps(&self, trace_id: &str) -> bool {
        self.threshold == u64::MAX || mix(trace_id.as_bytes()) < self.threshold
    }

    /// Filters `batches` and sets their `sample_weight`. Idempotent: applying it again to its
    /// own output changes nothing (a failed flush retries with the same rows and weights).
    pub fn apply(&mut self, batches: Vec<RecordBatch>) -> (Vec<RecordBatch>, Decisions) {
        // Pass 1: which traces failed, in this buffer or before.
        let mut failed_now: HashSet<String> = HashSet::new();
        for b in &batches {
            let Ok(rows) = SpanRows::new(b) else {
                continue;
            };
            for i in 0..rows.len() {
                if rows.failed(i) {
                    failed_now.insert(rows.trace_id(i).to_string());
                }
            }
        }
        for t in &failed_now {
            self.remember(t);
        }
        // Pass 2: keep rows, set weights.
        let mut decided: std::collections::HashMap<String, u8> = std::collections::HashMap::new();
        let mut out = Vec::with_capacity(batches.len());
        let mut d = Decisions::default();
        let success_weight = 1.0 / self.config.keep_rate;
        for b in batches {
            let Some(trace) = strings(&b, col::TRACE_ID) else {
                out.push(b);
                continue;
            };
            let mut keep = Vec::with_capacity(b.num_rows());
            let mut weights = Vec::with_capacity(b.num_rows());
            for i in 0..b.num_rows() {
                let t = trace.value(i);
                let kind = match decided.get(t) {
                    Some(k) => *k,
                    None => {
                        let k = if failed_now.contains(t) || self.failed.contains(t) {
                            d.kept_failed += 1;
                            0
                        } else if self.keeps(t) {
                            d.kept_sampled += 1;
                            1
                        } else {
                            d.dropped += 1;
                            2
                        };
                        decided.insert(t.to_string(), k);
                        k
                    }
                };
                keep.push(kind != 2);
                weights.push(if kind == 1 { success_weight } else { 1.0 });
                if kind == 2 {
                    d.dropped_spans += 1;
                }
            }
            match reweigh(&b, weights)
                .and_then(|w| filter_record_batch(&w, &BooleanArray::from(keep)).ok())
            {
                Some(f) if f.num_rows() > 0 => out.push(f),
                Some(_) => {}
                None => out.push(b),
            }
        }
        (out, d)
    }

    fn remember(&mut self, trace: &str) {
        if self.config.remember_failed == 0 || self.failed.contains(trace) {
            return;
        }
        self.failed.insert(trace.to_string());
        self.order.push_back(trace.to_string());
        while self.order.len() > self.config.remember_failed {
            if let Some(old) = self.order.pop_front() {
                self.failed.remove(&old);
            }
        }
    }
}

fn strings<'a>(b: &'a RecordBatch, name: &str) -> Option<&'a StringArray> {
    b.column_by_name(name)?
        .as_any()
        .downcast_ref::<StringArray>()
}

fn reweigh(b: &RecordBatch, weights: Vec<f64>) -> Option<RecordBatch> {
    let idx = b.schema().index_of(col::SAMPLE_WEIGHT).ok()?;
    let mut cols: Vec<ArrayRef> = b.columns().to_vec();
    cols[idx] = Arc::new(Float64Array::from(weights));
    RecordBatch::try_new(b.schema(), cols).ok()
}

/// FNV-1a over the bytes, finished with splitmix64: stable across processes, versions and
/// machines (std's hasher promises none of that), and uniform even for non-random ids.
fn mix(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolspan_pipeline::Pipeline;

    fn batch(traces: usize) -> RecordBatch {
        let mut fleet = toolspan_gen::Fleet::new(toolspan_gen::FleetConfig::default());
        let req = fleet.request(traces, 1_700_000_000_000_000_000, 60_000_000_000);
        Pipeline::builtin().process(&req).expect("process").batch
    }

    fn traces_where(b: &RecordBatch, failed: bool) -> HashSet<String> {
        let t = strings(b, col::TRACE_ID).expect("trace");
        let s = strings(b, col::STATUS).expect("status");
        let mut f = HashSet::new();
        for i in 0..b.num_rows() {
            if toolspan_schema::Status::is_failed(s.value(i)) {
                f.insert(t.value(i).to_string());
            }
        }
        if failed {
            f
        } else {
            let all: HashSet<String> = (0..b.num_rows()).map(|i| t.value(i).to_string()).collect();
            all.difference(&f).cloned().collect()
        }
    }

    #[test]
    fn keeps_every_failed_trace_whole_and_about_the_rate_of_the_others_and_is_idempotent() {
        let input = batch(4000);
        let failed = traces_where(&input, true);
        let ok = traces_where(&input, false);
        assert!(
            failed.len() > 100 && ok.len() > 1000,
            "{} failed, {} ok",
            failed.len(),
            ok.len()
        );
        let mut s = Sampler::new(SamplingConfig {
            keep_rate: 0.25,
            remember_failed: 10,
        });
        let (out, d) = s.apply(vec![input.clone()]);
        let kept: HashSet<String> = out
            .iter()
            .flat_map(|b| {
                let t = strings(b, col::TRACE_ID).expect("t");
                (0..b.num_rows())
                    .map(|i| t.value(i).to_string())
                    .collect::<Vec<_>>()
            })
            .collect();
        assert!(failed.is_subset(&kept), "every failed trace kept");
        // Failed traces keep all their spans.
        let spans_of = |b: &RecordBatch, set: &HashSet<String>| {
            let t = strings(b, col::TRACE_ID).expect("t");
            (0..b.num_rows())
                .filter(|&i| set.contains(t.value(i)))
                .count()
        };
        assert_eq!(
            out.iter().map(|b| spans_of(b, &failed)).sum::<usize>(),
            spans_of(&input, &failed)
        );
        let share = d.kept_sampled as f64 / ok.len() as f64;
        assert!((share - 0.25).abs() < 0.04, "kept share {share}");
        assert_eq!(d.kept_failed as usize, failed.len());
        // Weights: 1 for failed traces, 4 for sampled ones.
        for b in &out {
            let w = b
                .column_by_name(col::SAMPLE_WEIGHT)
                .expect("w")
                .as_any()
                .downcast_ref::<Float64Array>()
                .expect("f64")
                .clone();
            let t = strings(b, col::TRACE_ID).expect("t");
            for i in 0..b.num_rows() {
                let expect = if failed.contains(t.value(i)) {
                    1.0
                } else {
                    4.0
                };
                assert_eq!(w.value(i), expect);
            }
        }
        // Idempotent, as a retried flush needs.
        let (again, _) = s.apply(out.clone());
        assert_eq!(again, out);
        // Deterministic across samplers (workers, restarts).
        let mut other = Sampler::new(SamplingConfig {
            keep_rate: 0.25,
            remember_failed: 10,
        });
        assert_eq!(other.apply(vec![input]).0, out);
    }

    #[test]
    fn rate_one_keeps_everything_with_weight_one() {
        let input = batch(200);
        let mut s = Sampler::new(SamplingConfig {
            keep_rate: 1.0,
            remember_failed: 10,
        });
        let (out, d) = s.apply(vec![input.clone()]);
        assert_eq!(
            out.iter().map(|b| b.num_rows()).sum::<usize>(),
            input.num_rows()
        );
        assert_eq!(d.dropped, 0);
    }
}
