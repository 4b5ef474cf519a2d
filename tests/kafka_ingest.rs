//! `toolspan ingest` against a real Kafka-compatible broker (tansu): exactly-once with two
//! workers, with SIGKILLs, dead letters, tail sampling, a full disk and compaction.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::kafka_support::{
    assert_exactly, manifest_ids, produce, table_rows, wait_rows, Broker, Worker, QUICK_EXPIRY,
};
use crate::support::{sql_count, sql_json, sql_raw};

static S: std::sync::LazyLock<crate::kafka_support::Settings> =
    std::sync::LazyLock::new(crate::kafka_support::settings);

/// Spans in the acceptance runs (one million).
const MILLION: u64 = 1_000_000;

fn topic4(
    broker: &Broker,
    topic: &str,
    spans: u64,
    dir: &std::path::Path,
) -> (crate::kafka_support::Produced, Vec<String>) {
    let manifest = dir.join(format!("{topic}.ids"));
    let p = produce(
        broker,
        topic,
        spans,
        &["--partitions", &S.partitions],
        Some(&manifest),
    );
    let ids = manifest_ids(&manifest);
    assert_eq!(ids.len() as u64, p.spans);
    (p, ids)
}

#[test]
fn two_workers_land_exactly_the_produced_million_spans() {
    let _heavy = crate::support::heavy_run();
    let broker = Broker::start();
    let dir = tempfile::tempdir().expect("dir");
    let (p, ids) = topic4(&broker, &S.topic, MILLION, dir.path());
    assert!(p.spans >= MILLION);
    let data = dir.path().join("data");
    // Both workers run maintenance every minute and together (they start together), so their
    // merges of the same crowded partitions race during the run: one may land, never both
    // (the CI run that found delta-rs letting two optimizes land counted 32,702 rows twice).
    // Every 15 s was too much extra work for a loaded 2-core CI machine.
    let maintenance = ["--maintenance-every-s", "60"];
    let a = Worker::start(&broker, &S.topic, &S.group, &data, &maintenance);
    let b = Worker::start(&broker, &S.topic, &S.group, &data, &maintenance);
    let mut n = wait_rows(&data, ids.len() as i64, Duration::from_secs(900));
    if n == ids.len() as i64 {
        // At least one maintenance round of both workers after the last commit (a fast
        // machine may land everything before the first round).
        let deadline = Instant::now() + Duration::from_secs(150);
        std::thread::sleep(Duration::from_secs(5));
        while commits_of(&data.join("spans"), "OPTIMIZE") == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_secs(2));
        }
        std::thread::sleep(Duration::from_secs(5));
        n = table_rows(&data);
    }
    let merges = commits_of(&data.join("spans"), "OPTIMIZE");
    eprintln!("{merges} merge commits during the run");
    assert!(
        merges >= 1,
        "the workers' maintenance merged files during the run"
    );
    // Both workers took part (each consumed messages).
    let took_part = [&a, &b]
        .iter()
        .filter(|w| metric(&w.metrics(), "toolspan_ingest_messages_total") > 0.0)
        .count();
    drop((a, b));
    assert_eq!(n, ids.len() as i64, "rows after ingest");
    assert_exactly(&data, &ids);
    assert_eq!(took_part, 2, "both workers consumed");
}

/// Commits of the table whose operation is `operation` (read from the Delta log's JSON).
fn commits_of(table: &std::path::Path, operation: &str) -> usize {
    let needle = format!("\"operation\":\"{operation}\"");
    std::fs::read_dir(table.join("_delta_log"))
        .expect("delta log")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter(|e| std::fs::read_to_string(e.path()).is_ok_and(|t| t.contains(&needle)))
        .count()
}

#[test]
fn sigkill_twenty_times_during_the_run_still_lands_exactly_the_produced_set() {
    let _heavy = crate::support::heavy_run();
    let broker = Broker::start();
    let dir = tempfile::tempdir().expect("dir");
    let (_, ids) = topic4(&broker, &S.topic, MILLION, dir.path());
    let data = dir.path().join("data");
    let extra = [&["--flush-rows", "20000"][..], &QUICK_EXPIRY].concat();
    let mut workers = [
        Worker::start(&broker, &S.topic, &S.group, &data, &extra),
        Worker::start(&broker, &S.topic, &S.group, &data, &extra),
    ];
    // Kill a random worker at a random moment, 20 times, restarting it each time. A cheap
    // xorshift keeps the schedule reproducible from the printed seed.
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(7)
        | 1;
    eprintln!("kill schedule seed {seed}");
    let mut x = seed;
    let mut kills = 0;
    // Kills that found rows still to commit: the run was going on when they struck.
    let mut kills_while_ingesting = 0;
    while kills < 20 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        std::thread::sleep(Duration::from_millis(300 + x % 2000));
        let i = (x >> 20) as usize % 2;
        workers[i].kill();
        kills += 1;
        let killed_at = Instant::now();
        if table_rows(&data) < ids.len() as i64 {
            kills_while_ingesting += 1;
        }
        // Restart once the broker has expired the dead member (session timeout 3 s). tansu
        // 0.6 assigns a SIGKILLed member's partitions to nobody when it expires that member
        // while a replacement has already joined (minimal reproduction in bench/RESULTS.md
        // "Notes"); a supervisor's restart delay sidesteps it. No correctness depends on it.
        std::thread::sleep(Duration::from_millis(3500).saturating_sub(killed_at.elapsed()));
        workers[i] = Worker::start(&broker, &S.topic, &S.group, &data, &extra);
    }
    let rows_at_last_kill = table_rows(&data);
    eprintln!(
        "{kills} kills, {kills_while_ingesting} with rows still to commit; {rows_at_last_kill} of {} rows committed at the last kill",
        ids.len()
    );
    let n = wait_rows(&data, ids.len() as i64, Duration::from_secs(900));
    // Let any straggling commit land before checking for duplicates.
    std::thread::sleep(Duration::from_secs(3));
    drop(workers);
    assert_eq!(n, ids.len() as i64);
    // The schedule is random and the run's length depends on the machine: on a fast one the
    // last kills can come after everything is committed. Most must hit the running ingest.
    assert!(
        kills_while_ingesting >= 10,
        "only {kills_while_ingesting} of {kills} kills happened while rows were still to commit"
    );
    assert_exactly(&data, &ids);
}

#[test]
fn garbage_messages_go_to_the_dead_letter_topic_with_headers_and_the_rest_lands() {
    let broker = Broker::start();
    let dir = tempfile::tempdir().expect("dir");
    let manifest = dir.path().join("ids");
    let p = produce(
        &broker,
        &S.topic,
        100_000,
        &["--partitions", &S.partitions, "--garbage-share", "0.01"],
        Some(&manifest),
    );
    let ids = manifest_ids(&manifest);
    assert!(p.garbage >= 50, "about 1% garbage: {p:?}");
    let data = dir.path().join("data");
    let w = Worker::start(&broker, &S.topic, &S.group, &data, &[]);
    assert_eq!(
        wait_rows(&data, ids.len() as i64, Duration::from_secs(600)),
        ids.len() as i64
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut dead = 0.0;
    while Instant::now() < deadline {
        dead = metric_sum(&w.metrics(), "toolspan_ingest_dead_letters_total{");
        if dead >= p.garbage as f64 {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(dead, p.garbage as f64, "dead letters counted in /metrics");
    drop(w);
    assert_exactly(&data, &ids);

    // Read the dead-letter topic back with a plain consumer: every garbage message, once, with
    // its headers.
    let letters = crate::kafka_support::read_topic_headers(
        &broker,
        &S.dlq_topic,
        p.garbage as usize,
        Duration::from_secs(60),
    );
    assert_eq!(
        letters.len() as u64,
        p.garbage,
        "every garbage message in the DLQ"
    );
    let mut positions = BTreeSet::new();
    for h in &letters {
        let get = |k: &str| {
            h.iter()
                .find(|(hk, _)| hk == k)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        assert_eq!(get("toolspan.source.topic"), S.topic.as_str());
        assert_eq!(get("toolspan.error.code"), "otlp_decode", "{h:?}");
        assert!(!get("toolspan.error.message").is_empty());
        let pos = (
            get("toolspan.source.partition")
                .parse::<i32>()
                .expect("partition"),
            get("toolspan.source.offset")
                .parse::<i64>()
                .expect("offset"),
        );
        assert!(positions.insert(pos), "dead letter {pos:?} twice");
    }
}

#[test]
fn tail_sampling_keeps_failed_traces_the_configured_share_of_the_rest_and_unbiased_rates() {
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
    let full = dir.path().join("full");
    let sampled = dir.path().join("sampled");
    // The same topic, twice: a group without sampling is the truth to compare with.
    let a = Worker::start(&broker, &S.topic, "truth", &full, &[]);
    let b = Worker::start(
        &broker,
        &S.topic,
        "sampled",
        &sampled,
        &["--sample-rate", "0.3", "--flush-ms", "3000"],
    );
    assert_eq!(
        wait_rows(&full, p.spans as i64, Duration::from_secs(600)),
        p.spans as i64
    );
    // The sampled table stops growing once the group caught up.
    let mut last = -1;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        std::thread::sleep(Duration::from_secs(5));
        let n = table_rows(&sampled);
        if (n == last && n > 0) || Instant::now() > deadline {
            break;
        }
        last = n;
    }
    drop((a, b));
    let failed_sql =
        "SELECT DISTINCT trace_id FROM spans WHERE status = 'error' OR error_type IS NOT NULL";
    let failed_full = ids_of(&full, failed_sql);
    let failed_kept = ids_of(&sampled, failed_sql);
    assert!(
        failed_full.len() > 100,
        "the fleet produced failures: {}",
        failed_full.len()
    );
    assert_eq!(failed_kept, failed_full, "every failed trace kept");
    // Failed traces are whole.
    let spans_of_failed = |d: &std::path::Path| {
        sql_count(
            d,
            &format!("SELECT count(*) FROM spans WHERE trace_id IN ({failed_sql})"),
        )
    };
    assert_eq!(spans_of_failed(&sampled), spans_of_failed(&full));
    let ok_sql =
        format!("SELECT count(DISTINCT trace_id) FROM spans WHERE trace_id NOT IN ({failed_sql})");
    let ok_full = sql_count(&full, &ok_sql) as f64;
    let ok_kept = sql_count(&sampled, &ok_sql) as f64;
    let share = ok_kept / ok_full;
    eprintln!(
        "kept {ok_kept} of {ok_full} successful traces: {:.2}%",
        share * 100.0
    );
    assert!(
        (share - 0.3).abs() <= 0.02,
        "kept share {share} not within 2 points of 0.30"
    );
    // Unbiased rates from the weights: failure rate of call spans per tool.
    let rate_sql_full = "SELECT tool, avg(CASE WHEN status = 'error' THEN 1.0 ELSE 0.0 END) AS r FROM spans WHERE stage = 'call' GROUP BY tool ORDER BY tool";
    let rate_sql_weighted = "SELECT tool, sum(CASE WHEN status = 'error' THEN sample_weight ELSE 0.0 END) / sum(sample_weight) AS r FROM spans WHERE stage = 'call' GROUP BY tool ORDER BY tool";
    let naive_sql = "SELECT tool, avg(CASE WHEN status = 'error' THEN 1.0 ELSE 0.0 END) AS r FROM spans WHERE stage = 'call' GROUP BY tool ORDER BY tool";
    let truth = sql_json(&full, rate_sql_full);
    let weighted = sql_json(&sampled, rate_sql_weighted);
    let naive = sql_json(&sampled, naive_sql);
    assert_eq!(truth.len(), weighted.len());
    for ((t, w), n) in truth.iter().zip(&weighted).zip(&naive) {
        let (tr, wr, nr) = (
            t["r"].as_f64().unwrap_or(-1.0),
            w["r"].as_f64().unwrap_or(-1.0),
            n["r"].as_f64().unwrap_or(-1.0),
        );
        eprintln!(
            "{}: true {tr:.4}, weighted {wr:.4}, unweighted {nr:.4}",
            t["tool"]
        );
        assert!(
            (wr - tr).abs() <= 0.01 + tr * 0.1,
            "weighted rate {wr} vs true {tr} for {}",
            t["tool"]
        );
        if tr > 0.01 {
            assert!(
                nr > tr * 1.2,
                "sampling really biased the raw rate ({nr} vs {tr}), so the weights did the work"
            );
        }
    }
}

#[test]
fn a_full_disk_stops_commits_and_after_space_is_freed_ingest_finishes_exactly() {
    let broker = Broker::start();
    let dir = tempfile::tempdir().expect("dir");
    let mnt = dir.path().join("small");
    std::fs::create_dir_all(&mnt).expect("mount point");
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=3m", "tmpfs"])
        .arg(&mnt)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "mounting a tmpfs needs root (CI runs as root)");
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.0)
                .status();
        }
    }
    let _guard = Unmount(mnt.clone());
    let manifest = dir.path().join("ids");
    let p = produce(
        &broker,
        &S.topic,
        150_000,
        &["--partitions", &S.partitions, "--payloads"],
        Some(&manifest),
    );
    let ids = manifest_ids(&manifest);
    let data = mnt.join("data");
    let w = Worker::start(
        &broker,
        &S.topic,
        &S.group,
        &data,
        &["--flush-rows", "10000"],
    );
    // The store fills up: the worker reports it and stops committing.
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let m = w.metrics();
        if metric(&m, "toolspan_ingest_store_failing") == 1.0
            && metric(&m, "toolspan_ingest_commit_failures_total") >= 2.0
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the worker never reported the full store; metrics:\n{m}\nlog:\n{}",
            w.log_tail()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let stuck = table_rows_or_zero(&data);
    assert!(stuck < p.spans as i64, "not everything fit: {stuck}");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        table_rows_or_zero(&data),
        stuck,
        "nothing is committed while the disk is full"
    );
    // Free space: grow the filesystem.
    let grown = std::process::Command::new("mount")
        .args(["-o", "remount,size=512m"])
        .arg(&mnt)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(grown, "remount");
    assert_eq!(
        wait_rows(&data, ids.len() as i64, Duration::from_secs(600)),
        ids.len() as i64
    );
    assert_eq!(
        metric(&w.metrics(), "toolspan_ingest_store_failing"),
        0.0,
        "recovered"
    );
    drop(w);
    assert_exactly(&data, &ids);
}

#[test]
fn a_broker_outage_mid_run_is_survived_without_loss_or_duplicates() {
    let mut broker = Broker::start();
    let dir = tempfile::tempdir().expect("dir");
    let (_, ids) = topic4(&broker, &S.topic, 200_000, dir.path());
    let data = dir.path().join("data");
    let w = Worker::start(
        &broker,
        &S.topic,
        &S.group,
        &data,
        &["--flush-rows", "10000"],
    );
    // Kill the broker once ingest is under way, keep it down for 5 s, bring it back.
    let deadline = Instant::now() + Duration::from_secs(300);
    while table_rows(&data) == 0 {
        assert!(
            Instant::now() < deadline,
            "ingest never started:\n{}",
            w.log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    broker.kill();
    let at_outage = table_rows(&data);
    std::thread::sleep(Duration::from_secs(5));
    broker.restart();
    assert!(
        at_outage < ids.len() as i64,
        "the outage happened during the run"
    );
    let n = wait_rows(&data, ids.len() as i64, Duration::from_secs(600));
    assert_eq!(n, ids.len() as i64, "worker log:\n{}", w.log_tail());
    drop(w);
    assert_exactly(&data, &ids);
}

#[test]
fn compaction_during_ingest_keeps_the_content_and_reduces_the_file_count() {
    let broker = Broker::start();
    let dir = tempfile::tempdir().expect("dir");
    let manifest = dir.path().join("ids");
    // Two days ago: closed partitions that compaction may merge while ingest appends.
    produce(
        &broker,
        &S.topic,
        150_000,
        &["--partitions", &S.partitions, "--hours-ago", "48"],
        Some(&manifest),
    );
    let ids = manifest_ids(&manifest);
    let plain = dir.path().join("plain");
    let compacted = dir.path().join("compacted");
    let small_flushes = ["--flush-rows", "5000", "--flush-ms", "300"];
    let a = Worker::start(&broker, &S.topic, "plain", &plain, &small_flushes);
    let mut with = small_flushes.to_vec();
    with.extend(["--maintenance-every-s", "2", "--vacuum-retention-mins", "0"]);
    let b = Worker::start(&broker, &S.topic, "compacted", &compacted, &with);
    assert_eq!(
        wait_rows(&plain, ids.len() as i64, Duration::from_secs(600)),
        ids.len() as i64
    );
    assert_eq!(
        wait_rows(&compacted, ids.len() as i64, Duration::from_secs(600)),
        ids.len() as i64
    );
    let files = |d: &std::path::Path| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("rt");
        rt.block_on(async {
            let t = toolspan_store::SpanTable::open_or_create(&d.join("spans").to_string_lossy())
                .await
                .expect("open");
            t.file_count().await.expect("files")
        })
    };
    // Maintenance rounds run every 2 s: wait until one has run after the last append and
    // vacuumed what it replaced (on a loaded machine one round can take longer than 2 s).
    let deadline = Instant::now() + Duration::from_secs(120);
    std::thread::sleep(Duration::from_secs(6));
    while walk_count(&compacted.join("spans"), "parquet") != files(&compacted)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_secs(1));
    }
    drop((a, b));
    let (fp, fc) = (files(&plain), files(&compacted));
    eprintln!("files: {fp} without compaction, {fc} with");
    assert!(fc < fp, "compaction reduced the file count ({fc} vs {fp})");
    assert_exactly(&compacted, &ids);
    // Same content, column by column.
    let dump = "SELECT * FROM spans ORDER BY span_id";
    let x = sql_raw(&plain, "csv", dump);
    let y = sql_raw(&compacted, "csv", dump);
    assert!(x.status.success() && y.status.success());
    assert!(
        x.stdout == y.stdout,
        "the compacted table has the same rows as the plain one"
    );
    // Vacuum removed the replaced files from disk.
    let parquet_on_disk = walk_count(&compacted.join("spans"), "parquet");
    assert_eq!(
        parquet_on_disk, fc,
        "only referenced files remain after vacuum"
    );
}

fn walk_count(dir: &std::path::Path, ext: &str) -> usize {
    let mut n = 0;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                n += walk_count(&p, ext);
            } else if p.extension().is_some_and(|x| x == ext) {
                n += 1;
            }
        }
    }
    n
}

fn table_rows_or_zero(data: &std::path::Path) -> i64 {
    table_rows(data)
}

fn ids_of(data: &std::path::Path, sql: &str) -> BTreeSet<String> {
    let out = sql_raw(data, "csv", sql);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(1)
        .map(str::to_string)
        .collect()
}

/// An unlabelled series' value in a text exposition (0 when absent).
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(name)
                .and_then(|r| r.strip_prefix(' '))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0.0)
}

/// The sum of every series whose line starts with `prefix`.
fn metric_sum(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}
