//! `toolspan metrics --rollup-table` against a real broker: the per-minute rollup is
//! written exactly once through SIGKILLs, and the `failure_rates` view reads it.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::kafka_support::{manifest_ids, produce, wait_rows, Broker, MetricsJob, Worker};
use crate::support::sql_json;

static S: std::sync::LazyLock<crate::kafka_support::Settings> =
    std::sync::LazyLock::new(crate::kafka_support::settings);

const RATES: &str =
    "SELECT CAST(minute AS VARCHAR) AS minute, tool, stage, error_type, calls, failures \
     FROM failure_rates ORDER BY minute, tool, stage, error_type";

/// Weighted spans the `failure_rates` view counts (each (minute, tool, stage) once).
fn counted(data_dir: &Path) -> f64 {
    let rows = sql_json(
        data_dir,
        "SELECT coalesce(sum(c), 0) AS n FROM (SELECT max(calls) AS c FROM failure_rates GROUP BY minute, tool, stage)",
    );
    rows.first().and_then(|r| r["n"].as_f64()).unwrap_or(0.0)
}

#[test]
fn metrics_job_rollup_counts_every_span_once_through_sigkills_and_failure_rates_reads_it() {
    let broker = Broker::start();
    let dir = tempfile::tempdir().expect("dir");
    let manifest = dir.path().join("ids");
    let p = produce(
        &broker,
        &S.topic,
        200_000,
        &["--partitions", &S.partitions],
        Some(&manifest),
    );
    let ids = manifest_ids(&manifest);
    let data = dir.path().join("data");
    let rollup = data.join("failure_rates_1m");
    // The same spans in `spans` (ingest) and, through the metrics job, in the rollup.
    let ingest = Worker::start(&broker, &S.topic, &S.group, &data, &[]);
    let mut job = MetricsJob::start(&broker, &S.topic, &rollup, &[]);
    // SIGKILL the metrics job three times while it works through the topic, restarting it at
    // once (each start in a consumer group of its own: see `MetricsJob::start_at`); it resumes
    // from the offsets its rollup table records.
    for (i, after_ms) in [1500u64, 2500, 2000].into_iter().enumerate() {
        std::thread::sleep(Duration::from_millis(after_ms));
        job.kill();
        eprintln!(
            "metrics job killed ({}), log tail:\n{}",
            i + 1,
            job.log_tail()
        );
        job = MetricsJob::start(&broker, &S.topic, &rollup, &[]);
    }
    assert_eq!(
        wait_rows(&data, ids.len() as i64, Duration::from_secs(600)),
        ids.len() as i64,
        "ingest landed every span"
    );
    assert_eq!(p.spans, ids.len() as u64);

    // A data directory holding only `spans`: there `failure_rates` is computed from the spans.
    let spans_only = dir.path().join("spans-only");
    std::fs::create_dir_all(&spans_only).expect("dir");
    std::os::unix::fs::symlink(data.join("spans"), spans_only.join("spans")).expect("symlink");
    let truth = counted(&spans_only);
    assert!(truth > 0.0);
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut seen = counted(&data);
    while seen < truth && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        seen = counted(&data);
    }
    // Give a double count (a replay after a kill) the time to show, then compare everything.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        counted(&data),
        truth,
        "the rollup counts every span exactly once:\n{}",
        job.log_tail()
    );
    let from_rollup = sql_json(&data, RATES);
    let from_spans = sql_json(&spans_only, RATES);
    assert!(
        from_rollup
            .iter()
            .any(|r| r["failures"].as_f64().unwrap_or(0.0) > 0.0),
        "failures are counted"
    );
    assert_eq!(from_rollup.len(), from_spans.len(), "rows of failure_rates");
    assert!(
        from_rollup == from_spans,
        "failure_rates over the rollup equals failure_rates over spans"
    );

    // The view really reads the rollup: spans that only ingest sees (the metrics job stopped)
    // change the spans-based rates but not the rollup-based ones.
    job.kill();
    let more = produce(
        &broker,
        &S.topic,
        2_000,
        &["--partitions", &S.partitions, "--seed", "99"],
        None,
    );
    let total = ids.len() as i64 + more.spans as i64;
    assert_eq!(wait_rows(&data, total, Duration::from_secs(120)), total);
    assert!(
        counted(&spans_only) > truth,
        "new spans show in the spans-based view"
    );
    assert_eq!(
        counted(&data),
        truth,
        "the rollup-based view did not see them (metrics job stopped)"
    );
    drop(ingest);
}
