//! Time series for the charts of the search and tool pages: calls, failures and failure rate
//! per stage, and call latency (p50, p95, p99), in buckets fitted to the page's range.
//!
//! Buckets are a whole number of minutes (or of days, for long ranges) counted from the Unix
//! epoch, so a bucket is a union of the minutes of the `failure_rates` view and its figures
//! are that view's, added up. Every time here is counted in one unit per quantity, named in
//! the variable: the bucket of a span is computed in SQL from `start_time_unix_nano`
//! (nanoseconds) with the origin and width converted to nanoseconds once, never from a
//! timestamp cast whose unit depends on the column type.

use std::collections::BTreeMap;
use toolspan_schema::vocab::FAILED_SQL;

use chrono::{DateTime, SecondsFormat, Utc};

use toolspan_query::error::QueryError;
use toolspan_query::rows::{Col, Cols};
use toolspan_query::service::QueryService;

/// At most this many buckets on a chart.
pub const MAX_BUCKETS: i64 = 60;
/// Bucket widths offered, in seconds (the smallest that keeps the chart within
/// [`MAX_BUCKETS`] is taken; past a week, whole days).
const WIDTHS_S: [i64; 14] = [
    60, 120, 300, 600, 900, 1_800, 3_600, 7_200, 10_800, 21_600, 43_200, 86_400, 172_800, 604_800,
];
/// The stages charted, in the order a call goes through them.
pub const STAGES: [&str; 6] = toolspan_schema::vocab::Stage::TOOL_NAMES;

/// The buckets of a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buckets {
    /// Start of the range.
    pub since: DateTime<Utc>,
    /// End of the range (exclusive).
    pub until: DateTime<Utc>,
    /// Width of a bucket, seconds.
    pub width_s: i64,
    /// Start of bucket 0, seconds since the epoch (a multiple of `width_s`, at or before
    /// `since`).
    pub origin_s: i64,
    /// Number of buckets.
    pub count: i64,
}

impl Buckets {
    /// The buckets of `[since, until)`.
    pub fn new(since: DateTime<Utc>, until: DateTime<Utc>) -> Buckets {
        let (s, u) = (
            since.timestamp(),
            until.timestamp().max(since.timestamp() + 1),
        );
        let fits = |w: i64| {
            let origin = s.div_euclid(w) * w;
            (u - origin + w - 1) / w <= MAX_BUCKETS
        };
        let width_s = WIDTHS_S.into_iter().find(|w| fits(*w)).unwrap_or_else(|| {
            let days = ((u - s) / MAX_BUCKETS / 86_400 + 1).max(1);
            let mut w = days * 86_400;
            while !fits(w) {
                w += 86_400;
            }
            w
        });
        let origin_s = s.div_euclid(width_s) * width_s;
        Buckets {
            since,
            until,
            width_s,
            origin_s,
            count: ((u - origin_s + width_s - 1) / width_s).max(1),
        }
    }

    /// The SQL expression of a span's bucket number (from `start_time_unix_nano`, in
    /// nanoseconds: origin and width are converted to nanoseconds here).
    pub fn bucket_sql(&self, prefix: &str) -> String {
        let origin_ns = i128::from(self.origin_s) * 1_000_000_000;
        let width_ns = i128::from(self.width_s) * 1_000_000_000;
        format!(
            "CAST((CAST({prefix}start_time_unix_nano AS BIGINT) - ({origin_ns})) / {width_ns} AS BIGINT)"
        )
    }

    /// Start of bucket `k`, seconds since the epoch.
    pub fn start_s(&self, k: i64) -> i64 {
        self.origin_s + k * self.width_s
    }

    /// Start of bucket `k` as a time.
    pub fn start(&self, k: i64) -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp(self.start_s(k), 0).unwrap_or_default()
    }

    /// Start of bucket `k`, RFC 3339.
    pub fn label(&self, k: i64) -> String {
        self.start(k).to_rfc3339_opts(SecondsFormat::Secs, true)
    }
}

/// Spans and failed spans (weighted by `sample_weight`) of one stage in one bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Counts {
    /// Spans.
    pub spans: f64,
    /// Of which failed.
    pub failed: f64,
}

impl Counts {
    /// The failure rate, when there were spans.
    pub fn rate(&self) -> Option<f64> {
        (self.spans > 0.0).then(|| self.failed / self.spans)
    }
}

/// Call latency in one bucket, milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Latency {
    /// Calls.
    pub calls: i64,
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
}

/// Everything the charts of a page draw.
#[derive(Debug, Clone, Default)]
pub struct Series {
    /// stage → bucket → counts.
    pub stages: BTreeMap<String, BTreeMap<i64, Counts>>,
    /// bucket → latency of calls.
    pub latency: BTreeMap<i64, Latency>,
}

/// The statement of spans and failures per bucket and stage for spans matching `scope` (a
/// condition on `spans` without alias, the range included).
///
/// Spans and failures are counted by two branches of one statement (one snapshot of the
/// table), not by a `CASE` on the status: the spans' branch reads no status at all, and the
/// failures' branch filters on it, which lets the reader skip every page of successes (files
/// keep their failed spans first). Together they read a fraction of what decoding every
/// row's status costs.
pub fn counts_sql(b: &Buckets, scope: &str) -> String {
    let (bucket, stages) = (
        b.bucket_sql(""),
        STAGES.map(|s| format!("'{s}'")).join(", "),
    );
    format!(
        "SELECT bucket, stage, sum(n) AS n, sum(failed) AS failed FROM (\
         SELECT {bucket} AS bucket, stage, sum(sample_weight) AS n, 0.0 AS failed \
         FROM spans WHERE {scope} AND stage IN ({stages}) GROUP BY 1, 2 \
         UNION ALL \
         SELECT {bucket} AS bucket, stage, 0.0 AS n, sum(sample_weight) AS failed \
         FROM spans WHERE {scope} AND {FAILED_SQL} AND stage IN ({stages}) GROUP BY 1, 2\
         ) GROUP BY 1, 2"
    )
}

/// The statement of call latency per bucket: a histogram of `duration_ms` per bucket
/// ([`HISTOGRAM_SQL`]), which [`Histogram`] turns into percentiles.
pub fn latency_sql(b: &Buckets, scope: &str) -> String {
    format!(
        "SELECT {} AS bucket, {HISTOGRAM_SQL} FROM spans WHERE {scope} AND stage = 'call' GROUP BY 1, 2",
        b.bucket_sql("")
    )
}

/// Select items of a latency histogram (32 bins per factor e of duration, so a bin spans
/// about 3 % of its value), the second of them the bin to group by (after the
/// statement's own keys): `lbin` (the logarithmic bin of `duration_ms`, NULL for a span
/// without one), `lbin_rows` (every row of the group), `lbin_lo` and `lbin_hi` (the least and
/// greatest duration in it). Read back with [`Histogram::add_rows`].
///
/// Percentiles come from this rather than from `approx_percentile_cont`: counting rows into
/// integer bins is a fraction of the cost of three t-digests per group, one grouping serves
/// every percentile and every coarser grouping (a tool's versions and their total), and with
/// the least and greatest value of each bin the result is exact whenever each bin holds one
/// distinct value, as on small tables.
pub const HISTOGRAM_SQL: &str =
    "CAST(floor(ln(greatest(duration_ms, 0.0) + 0.001) * 32.0) AS INT) AS lbin, \
     count(*) AS lbin_rows, min(duration_ms) AS lbin_lo, max(duration_ms) AS lbin_hi";

/// Durations counted in logarithmic bins, each with its least and greatest value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Histogram {
    /// bin → (values, least, greatest).
    bins: BTreeMap<i64, (u64, f64, f64)>,
    /// Rows counted, with or without a duration.
    rows: u64,
}

impl Histogram {
    /// Adds a bin's figures (merging with what the bin holds); `bin` None counts rows without a
    /// duration.
    pub fn add(&mut self, bin: Option<i64>, rows: u64, lo: f64, hi: f64) {
        self.rows += rows;
        let Some(bin) = bin else { return };
        let e = self.bins.entry(bin).or_insert((0, lo, hi));
        if e.0 > 0 {
            e.1 = e.1.min(lo);
            e.2 = e.2.max(hi);
        }
        e.0 += rows;
    }

    /// Adds row `i` of a batch with [`HISTOGRAM_SQL`]'s columns.
    pub fn add_rows(&mut self, c: &HistogramCols, i: usize) {
        self.add(
            c.bin.i64(i),
            c.rows.i64(i).unwrap_or(0).max(0) as u64,
            c.lo.f64(i).unwrap_or(0.0),
            c.hi.f64(i).unwrap_or(0.0),
        );
    }

    /// Adds every bin of `other`.
    pub fn merge(&mut self, other: &Histogram) {
        self.rows += other.rows;
        for (bin, (n, lo, hi)) in &other.bins {
            self.rows -= n;
            self.add(Some(*bin), *n, *lo, *hi);
        }
    }

    /// Rows counted (with or without a duration).
    pub fn rows(&self) -> i64 {
        self.rows as i64
    }

    /// The duration at rank `r` (0-based, of the values with a duration): within its bin, the
    /// values are taken as spread evenly from the least to the greatest.
    fn at_rank(&self, r: u64) -> f64 {
        let mut before = 0;
        let mut last = 0.0;
        for (n, lo, hi) in self.bins.values() {
            if r < before + n {
                let k = (r - before) as f64;
                return match n {
                    1 => *lo,
                    _ => lo + (hi - lo) * k / (*n - 1) as f64,
                };
            }
            before += n;
            last = *hi;
        }
        last
    }

    /// The `q` quantile (0 to 1) of the durations, interpolated between the two nearest ranks
    /// as `percentile_cont` does; None without durations.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let n: u64 = self.bins.values().map(|b| b.0).sum();
        if n == 0 {
            return None;
        }
        let pos = q.clamp(0.0, 1.0) * (n - 1) as f64;
        let r0 = pos.floor() as u64;
        let (v0, frac) = (self.at_rank(r0), pos - r0 as f64);
        Some(match frac > 0.0 && r0 + 1 < n {
            true => v0 + (self.at_rank(r0 + 1) - v0) * frac,
            false => v0,
        })
    }

    /// p50, p95 and p99 (zeros without durations).
    pub fn latency(&self) -> Latency {
        let q = |q: f64| self.quantile(q).unwrap_or(0.0);
        Latency {
            calls: self.rows(),
            p50: q(0.5),
            p95: q(0.95),
            p99: q(0.99),
        }
    }
}

/// The columns of [`HISTOGRAM_SQL`] in a batch.
pub struct HistogramCols {
    bin: Col,
    rows: Col,
    lo: Col,
    hi: Col,
}

impl HistogramCols {
    /// The histogram columns of `c`.
    pub fn new(c: &Cols<'_>) -> Result<HistogramCols, QueryError> {
        Ok(HistogramCols {
            bin: c.int("lbin")?,
            rows: c.int("lbin_rows")?,
            lo: c.float("lbin_lo")?,
            hi: c.float("lbin_hi")?,
        })
    }
}

/// Loads the series of `scope` over `b`.
pub async fn load(service: &QueryService, b: &Buckets, scope: &str) -> Result<Series, QueryError> {
    let (counts_sql, latency_sql) = (counts_sql(b, scope), latency_sql(b, scope));
    let (counts, latency) = tokio::join!(service.query(&counts_sql), service.query(&latency_sql));
    let (counts, latency) = (counts?, latency?);
    let mut out = Series::default();
    for batch in &counts.batches {
        let c = Cols::new(batch);
        let (k, stage, n, failed) = (
            c.int("bucket")?,
            c.text("stage")?,
            c.float("n")?,
            c.float("failed")?,
        );
        for i in 0..batch.num_rows() {
            let Some(k) = k.i64(i).filter(|k| (0..b.count).contains(k)) else {
                continue;
            };
            out.stages
                .entry(stage.str(i).unwrap_or("").to_string())
                .or_default()
                .insert(
                    k,
                    Counts {
                        spans: n.f64(i).unwrap_or(0.0),
                        failed: failed.f64(i).unwrap_or(0.0),
                    },
                );
        }
    }
    let mut by_bucket: BTreeMap<i64, Histogram> = BTreeMap::new();
    for batch in &latency.batches {
        let c = Cols::new(batch);
        let (k, h) = (c.int("bucket")?, HistogramCols::new(&c)?);
        for i in 0..batch.num_rows() {
            if let Some(k) = k.i64(i).filter(|k| (0..b.count).contains(k)) {
                by_bucket.entry(k).or_default().add_rows(&h, i);
            }
        }
    }
    out.latency = by_bucket
        .into_iter()
        .map(|(k, h)| (k, h.latency()))
        .collect();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s)
            .expect("time")
            .with_timezone(&Utc)
    }

    #[test]
    fn buckets_are_whole_minutes_from_the_epoch_and_fit_the_range() {
        let b = Buckets::new(t("2025-06-01T11:00:30Z"), t("2025-06-01T12:00:30Z"));
        assert_eq!(b.width_s, 120, "an hour in 2-minute buckets");
        assert_eq!(b.origin_s % 60, 0);
        assert_eq!(b.start(0), t("2025-06-01T11:00:00Z"));
        assert!(b.count <= MAX_BUCKETS && b.start_s(b.count) >= b.until.timestamp());
        let day = Buckets::new(t("2025-06-01T00:00:00Z"), t("2025-06-02T00:00:00Z"));
        assert_eq!((day.width_s, day.count), (1_800, 48));
        let short = Buckets::new(t("2025-06-01T12:00:00Z"), t("2025-06-01T12:05:00Z"));
        assert_eq!((short.width_s, short.count), (60, 5));
        let long = Buckets::new(t("2000-01-01T00:00:00Z"), t("2025-01-01T00:00:00Z"));
        assert!(long.count <= MAX_BUCKETS && long.width_s % 86_400 == 0);
    }

    #[test]
    fn a_span_falls_in_the_bucket_of_its_start_in_nanoseconds() {
        let b = Buckets::new(t("2025-06-01T11:00:00Z"), t("2025-06-01T12:00:00Z"));
        let sql = b.bucket_sql("");
        // 11:07:59.999999999 is in the bucket starting 11:07 (an hour is 60 one-minute buckets).
        let start_ns = t("2025-06-01T11:07:59Z").timestamp() as i128 * 1_000_000_000 + 999_999_999;
        let origin_ns = b.origin_s as i128 * 1_000_000_000;
        assert!(
            sql.contains(&format!("- ({origin_ns})) / 60000000000")),
            "{sql}"
        );
        let k = (start_ns - origin_ns) / (b.width_s as i128 * 1_000_000_000);
        assert_eq!(b.start(k as i64), t("2025-06-01T11:07:00Z"));
    }

    /// `percentile_cont` of sorted values: linear between the two nearest ranks.
    fn exact(sorted: &[f64], q: f64) -> f64 {
        let pos = q * (sorted.len() - 1) as f64;
        let (r0, frac) = (pos.floor() as usize, pos - pos.floor());
        match sorted.get(r0 + 1) {
            Some(next) if frac > 0.0 => sorted[r0] + (next - sorted[r0]) * frac,
            _ => sorted[r0],
        }
    }

    /// The bin `HISTOGRAM_SQL` gives a duration.
    fn bin(ms: f64) -> i64 {
        ((ms.max(0.0) + 0.001).ln() * 32.0).floor() as i64
    }

    fn histogram(values: &[f64]) -> Histogram {
        let mut h = Histogram::default();
        for v in values {
            h.add(Some(bin(*v)), 1, *v, *v);
        }
        h
    }

    #[test]
    fn percentiles_of_a_few_calls_are_exact() {
        let values = [120.0, 80.0, 2_000.0, 95.0, 101.0];
        let h = histogram(&values);
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        for q in [0.0, 0.25, 0.5, 0.95, 0.99, 1.0] {
            assert_eq!(h.quantile(q), Some(exact(&sorted, q)), "q {q}");
        }
        let l = h.latency();
        assert_eq!((l.calls, l.p50), (5, 101.0));
        assert!((l.p99 - (120.0 + 0.96 * 1_880.0)).abs() < 1e-9, "{l:?}");
        assert_eq!(Histogram::default().quantile(0.5), None);
    }

    #[test]
    fn percentiles_of_many_calls_are_within_a_bin() {
        // 100,000 durations from 1 ms to about 22 s, spread log-uniformly, in random order.
        let mut values: Vec<f64> = (0..100_000u64)
            .map(|i| (((i * 7_919) % 100_000) as f64 / 10_000.0).exp())
            .collect();
        let mut h = Histogram::default();
        let mut bins: BTreeMap<i64, (u64, f64, f64)> = BTreeMap::new();
        for v in &values {
            let e = bins.entry(bin(*v)).or_insert((0, *v, *v));
            *e = (e.0 + 1, e.1.min(*v), e.2.max(*v));
        }
        // Grouped in two halves, as two versions of a tool would be, then merged.
        let (mut a, mut b) = (Histogram::default(), Histogram::default());
        for (k, (n, lo, hi)) in bins {
            let half = n / 2;
            a.add(Some(k), half, lo, hi);
            b.add(Some(k), n - half, lo, hi);
        }
        b.add(None, 3, 0.0, 0.0);
        h.merge(&a);
        h.merge(&b);
        assert_eq!(
            h.rows(),
            100_003,
            "rows without a duration are counted, not ranked"
        );
        values.sort_by(f64::total_cmp);
        for q in [0.5, 0.95, 0.99] {
            let (got, want) = (h.quantile(q).expect("values"), exact(&values, q));
            assert!(
                (got - want).abs() / want < 0.035,
                "q {q}: {got} against {want}"
            );
        }
    }
}
