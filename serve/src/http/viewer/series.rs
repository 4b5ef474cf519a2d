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
use toolspan_query::rows::Cols;
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

/// The statement of call latency percentiles per bucket.
pub fn latency_sql(b: &Buckets, scope: &str) -> String {
    format!(
        "SELECT {} AS bucket, count(*) AS n, {} FROM spans WHERE {scope} AND stage = 'call' GROUP BY 1",
        b.bucket_sql(""),
        percentiles_sql()
    )
}

/// `p50`, `p95`, `p99` of `duration_ms` as select items.
pub fn percentiles_sql() -> String {
    [("p50", "0.5"), ("p95", "0.95"), ("p99", "0.99")]
        .map(|(name, q)| {
            format!("approx_percentile_cont({q}) WITHIN GROUP (ORDER BY duration_ms) AS {name}")
        })
        .join(", ")
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
    for batch in &latency.batches {
        let c = Cols::new(batch);
        let (k, n, p50, p95, p99) = (
            c.int("bucket")?,
            c.int("n")?,
            c.float("p50")?,
            c.float("p95")?,
            c.float("p99")?,
        );
        for i in 0..batch.num_rows() {
            let Some(k) = k.i64(i).filter(|k| (0..b.count).contains(k)) else {
                continue;
            };
            out.latency.insert(
                k,
                Latency {
                    calls: n.i64(i).unwrap_or(0),
                    p50: p50.f64(i).unwrap_or(0.0),
                    p95: p95.f64(i).unwrap_or(0.0),
                    p99: p99.f64(i).unwrap_or(0.0),
                },
            );
        }
    }
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
}
