//! The table on S3-compatible object storage (moto's server behind a TCP proxy,
//! `crate::s3_support`): many writers on one table with no shared disk, commits by conditional
//! writes, an object store that goes away mid-run, two Kafka workers with SIGKILLs. (Readers on S3: `query_service::object_store`.)

use std::collections::HashMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

use toolspan_gen::{Fleet, FleetConfig};
use toolspan_pipeline::Pipeline;
use toolspan_store::SpanTable;

use crate::kafka_ingest::metric;
use crate::kafka_support::{
    assert_same_set, manifest_ids, produce, Broker, MetricsJob, Worker, QUICK_EXPIRY,
};
use crate::s3_support::{assert_no_credentials, S3Server, BUCKET};
use crate::support::Server;

static S: std::sync::LazyLock<crate::kafka_support::Settings> =
    std::sync::LazyLock::new(crate::kafka_support::settings);

/// Asserts the table at `data` holds exactly `expected` span ids: no loss, no duplicates.
fn assert_exactly(s3: &S3Server, data: &str, expected: &[String]) {
    assert_same_set(
        s3.count(data, "SELECT count(*) FROM spans"),
        s3.count(data, "SELECT count(DISTINCT span_id) FROM spans"),
        &s3.span_ids(data),
        expected,
    );
}

/// Two receivers on two "machines" (processes with nothing but the S3 table in common)
/// commit every 20 ms to the same table while traffic arrives at both: the table holds exactly
/// what both acknowledged.
#[test]
fn two_receivers_on_one_s3_table_land_exactly_what_both_acknowledged() {
    let s3 = S3Server::start();
    let dir = tempfile::tempdir().expect("dir");
    let data = s3.uri("shared");
    let env = s3.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let path = std::path::Path::new(&data);
    let a = Server::start_with_env(path, &["--flush-ms", "20"], &env);
    let b = Server::start_with_env(path, &["--flush-ms", "20"], &env);
    let (pa, pb) = (a.port, b.port);
    let send = |port: u16, seed: &str, manifest: std::path::PathBuf| {
        let mut cmd = s3.toolspan();
        // Requests go one at a time, each answered after its commit: every request is a
        // commit of its writer, and the two writers' commits interleave.
        cmd.args(["produce", "--log", "warn", "--spans", "600", "--seed", seed])
            .args(["--endpoint", &format!("http://127.0.0.1:{port}/v1/traces")])
            .arg("--manifest")
            .arg(manifest)
            .stderr(Stdio::null());
        cmd
    };
    let (ma, mb) = (dir.path().join("a.ids"), dir.path().join("b.ids"));
    let mut ca = send(pa, "11", ma.clone()).spawn().expect("produce a");
    let mut cb = send(pb, "22", mb.clone()).spawn().expect("produce b");
    assert!(ca.wait().expect("produce a").success(), "produce into a");
    assert!(cb.wait().expect("produce b").success(), "produce into b");
    // SIGTERM: each commits what it holds before it exits.
    drop((a, b));
    let mut ids = manifest_ids(&ma);
    ids.extend(manifest_ids(&mb));
    ids.sort_unstable();
    assert_exactly(&s3, &data, &ids);
}

/// Two writers (two table handles with nothing in common but the bucket) commit at the same
/// moment, round after round, so that both try to create the same log version. Each commit is
/// a conditional put of `_delta_log/<version>.json`: the loser gets 412, re-reads the log and
/// commits as the next version. With a plain put (unsafe renames) the loser would overwrite
/// the winner's commit and its rows would vanish, which the counts below would catch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_racing_for_one_version_are_decided_by_conditional_writes_and_none_is_lost() {
    let s3 = S3Server::start();
    let uri = format!("{}/spans", s3.uri("race"));
    // The same settings as the environment, passed as storage options this time.
    let options: HashMap<String, String> = s3
        .env()
        .into_iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .collect();
    let a = SpanTable::open_or_create_with_options(&uri, options.clone())
        .await
        .expect("writer a");
    let b = SpanTable::open_or_create_with_options(&uri, options)
        .await
        .expect("writer b");
    let start = a.latest_version().await.expect("version");
    let pipeline = Pipeline::builtin();
    let mut fleet = Fleet::new(FleetConfig::default());
    let mut rows = 0;
    let mut versions = std::collections::BTreeSet::new();
    // Whether two commits collide on a version depends on timing: two or three commits in
    // forty do on an idle machine, fewer on a loaded one (none once, with the whole suite
    // running). So rounds go on, twelve at a time, until the server has refused at least one
    // racing commit, up to MAX_ROUNDS: 96 commits, below the first checkpoint (version 99),
    // which the LIST count below assumes.
    const BLOCK: u64 = 12;
    const MAX_ROUNDS: u64 = 48;
    let commit_put = format!("PUT /{BUCKET}/race/spans/_delta_log/");
    let refused = |log: &str| {
        log.lines()
            .filter(|l| l.contains(&commit_put) && l.contains("\" 412"))
            .count()
    };
    let mut rounds = 0;
    while rounds < MAX_ROUNDS && (rounds == 0 || refused(&s3.request_log()) == 0) {
        for _ in 0..BLOCK {
            let at = 1_764_410_400_000_000_000 + rounds * 1_000_000_000;
            let mut batch = || {
                let out = pipeline
                    .process(&fleet.request(2, at, 1_000_000))
                    .expect("fleet traffic");
                rows += out.batch.num_rows();
                out.batch
            };
            let (ba, bb) = (batch(), batch());
            let (x, y) = tokio::join!(a.commit(vec![ba], &[]), b.commit(vec![bb], &[]));
            versions.insert(x.expect("a's commit").version);
            versions.insert(y.expect("b's commit").version);
            rounds += 1;
        }
    }
    // Each commit reports the version it created: they are exactly the versions after the
    // start, one each (read from the commits, not from a listing of the log).
    assert_eq!(
        versions.into_iter().collect::<Vec<u64>>(),
        (start + 1..=start + 2 * rounds).collect::<Vec<u64>>(),
        "every commit is a version of its own"
    );
    let data = s3.uri("race");
    let s3 = std::sync::Arc::new(s3);
    let server = s3.clone();
    let stored = tokio::task::spawn_blocking(move || {
        (
            server.count(&data, "SELECT count(*) FROM spans"),
            server.count(&data, "SELECT count(DISTINCT span_id) FROM spans"),
            server.request_log(),
        )
    })
    .await
    .expect("count");
    assert_eq!(
        (stored.0, stored.1),
        (rows as i64, rows as i64),
        "no commit lost"
    );
    let refused = refused(&stored.2);
    eprintln!(
        "{refused} of {} racing commits refused with 412 and retried",
        2 * rounds
    );
    assert!(
        refused >= 1,
        "the writers never raced for a version; the test proves nothing"
    );
    // A LIST of the whole log (no start-after) per commit would grow with the log's age;
    // toolspan asks delta-rs for its log cleanup (the one caller) only at checkpoints, and the
    // commits here (at most 96) write none. What remains: the table's creation and each of the two
    // `toolspan sql` runs look for the table with one LIST that stops at the first page.
    let whole_log = "?list-type=2&prefix=race/spans/_delta_log/ HTTP";
    let whole_log_lists = stored.2.lines().filter(|l| l.contains(whole_log)).count();
    assert!(
        whole_log_lists <= 3,
        "{whole_log_lists} LISTs of the whole _delta_log for {} commits",
        2 * rounds
    );
}

/// Kafka ingest and the metrics job's rollup on S3 while the object store is unreachable for
/// 30 s (connections refused, as from a stopped server): the worker pauses consumption and
/// says so (log and `toolspan_ingest_store_failing`), then finishes with exactly the produced
/// spans; the rollup next to the table counts every span once, and `toolspan sql` finds it.
#[test]
fn an_object_store_outage_pauses_kafka_ingest_which_then_lands_exactly_the_produced_set() {
    let s3 = S3Server::start();
    let broker = Broker::start();
    let dir = tempfile::tempdir().expect("dir");
    let manifest = dir.path().join("ids");
    let topic = "s3_outage";
    produce(
        &broker,
        topic,
        100_000,
        &["--partitions", &S.partitions],
        Some(&manifest),
    );
    let ids = manifest_ids(&manifest);
    let data = s3.uri("outage");
    let table = format!("{data}/spans");
    let w = Worker::start_at(
        &broker,
        topic,
        "s3-outage",
        &table,
        &s3.env(),
        &["--flush-rows", "10000"],
    );
    let job = MetricsJob::start_at(
        &broker,
        topic,
        &format!("{data}/failure_rates_1m"),
        &s3.env(),
        &[],
    );
    // Some commits land first.
    let started = Instant::now();
    while s3.count(&data, "SELECT count(*) FROM spans") == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "nothing committed to S3:\n{}",
            w.log_tail()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let before = s3.count(&data, "SELECT count(*) FROM spans");
    assert!(
        before < ids.len() as i64,
        "the outage must strike mid-run; {before} of {} already committed",
        ids.len()
    );

    assert_eq!(w.probe("/readyz"), (200, r#"{"status":"ready"}"#.into()));
    s3.proxy.stop();
    let down = Instant::now();
    let mut reported = false;
    let mut not_ready = None;
    while down.elapsed() < Duration::from_secs(30) {
        if metric(&w.metrics(), "toolspan_ingest_store_failing") == 1.0 {
            reported = true;
        }
        let (status, body) = w.probe("/readyz");
        if status == 503 {
            not_ready = Some(body);
        }
        // Alive throughout: an orchestrator must not restart a worker that waits for its store.
        assert_eq!(w.probe("/healthz").0, 200, "{}", w.log_tail());
        assert_eq!(job.probe("/healthz").0, 200);
        std::thread::sleep(Duration::from_millis(500));
    }
    // Not ready while the table cannot be written, with the envelope of an unavailable store.
    let body = not_ready.unwrap_or_else(|| panic!("/readyz never said 503:\n{}", w.log_tail()));
    let v: serde_json::Value = serde_json::from_str(&body).expect("an envelope");
    assert_eq!(v["error"]["code"], "store_unavailable", "{v}");
    assert_eq!(v["error"]["retryable"], true, "{v}");
    let log = std::fs::read_to_string(&w.log).unwrap_or_default();
    assert!(
        reported,
        "toolspan_ingest_store_failing never went to 1 during the outage:\n{}",
        w.log_tail()
    );
    assert!(
        log.contains("flush failed; consumption paused") && log.contains("store_unavailable"),
        "the log says ingest paused, with the code of an unavailable store:\n{}",
        w.log_tail()
    );
    s3.proxy.resume();

    let n = s3.wait_rows(&data, ids.len() as i64, Duration::from_secs(600));
    assert_eq!(
        n,
        ids.len() as i64,
        "rows after the outage:\n{}",
        w.log_tail()
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(&w.metrics(), "toolspan_ingest_store_failing") != 0.0 {
        assert!(Instant::now() < deadline, "store_failing stayed 1");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(w.probe("/readyz").0, 200, "ready again after the outage");
    let metrics = w.metrics();
    let log = std::fs::read_to_string(&w.log).unwrap_or_default();
    drop(w);
    assert_exactly(&s3, &data, &ids);

    // The rollup (found next to `spans` by `toolspan sql --data-dir`) counts the stage spans
    // exactly once, outage or not.
    let truth = s3.count(
        &data,
        "SELECT CAST(sum(sample_weight) AS BIGINT) FROM spans \
         WHERE stage IN ('call', 'attempt', 'prepare', 'send', 'execute', 'parse')",
    );
    assert!(truth > 0);
    let counted = "SELECT CAST(coalesce(sum(c), 0) AS BIGINT) FROM \
                   (SELECT max(calls) AS c FROM failure_rates GROUP BY minute, tool, stage)";
    let deadline = Instant::now() + Duration::from_secs(300);
    while s3.count(&data, counted) < truth && Instant::now() < deadline {
        std::thread::sleep(Duration::from_secs(2));
    }
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        s3.count(&data, counted),
        truth,
        "the rollup on S3 counts every span once:\n{}",
        job.log_tail()
    );
    drop(job);
    assert_no_credentials("the worker's log", &log);
    assert_no_credentials("the worker's /metrics", &metrics);
}

/// Two Kafka ingest workers, each in a working directory of its own with only the S3 table in
/// common, one million spans, ten SIGKILLs, both running maintenance: exactly the produced
/// span ids, no duplicates.
#[test]
fn two_workers_on_s3_with_sigkills_land_exactly_the_produced_million_spans() {
    let _heavy = crate::support::heavy_run();
    let s3 = S3Server::start();
    let broker = Broker::start();
    let dir = tempfile::tempdir().expect("dir");
    let manifest = dir.path().join("ids");
    let topic = "s3_million";
    let p = produce(
        &broker,
        topic,
        1_000_000,
        &["--partitions", &S.partitions],
        Some(&manifest),
    );
    let ids = manifest_ids(&manifest);
    assert_eq!(ids.len() as u64, p.spans);
    let data = s3.uri("million");
    let table = format!("{data}/spans");
    let env = s3.env();
    // Flushes of up to 100,000 rows every 5 s (the default interval): moto answers a few dozen
    // requests a second, so the run keeps its file count (and request count) moderate.
    let extra = [
        "--flush-ms",
        "5000",
        "--flush-rows",
        "100000",
        "--maintenance-every-s",
        "60",
        "--compact-min-files",
        "4",
        QUICK_EXPIRY[0],
        QUICK_EXPIRY[1],
        QUICK_EXPIRY[2],
        QUICK_EXPIRY[3],
    ];
    let start = || Worker::start_at(&broker, topic, "s3-million", &table, &env, &extra);
    let mut workers = [start(), start()];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut kills_while_ingesting = 0;
    for _ in 0..10 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        std::thread::sleep(Duration::from_millis(2000 + x % 4000));
        let i = (x >> 20) as usize % 2;
        workers[i].kill();
        let killed_at = Instant::now();
        if s3.count(&data, "SELECT count(*) FROM spans") < ids.len() as i64 {
            kills_while_ingesting += 1;
        }
        // As in the local test: a restart after the broker expired the dead member.
        std::thread::sleep(Duration::from_millis(3500).saturating_sub(killed_at.elapsed()));
        workers[i] = start();
    }
    let n = s3.wait_rows(&data, ids.len() as i64, Duration::from_secs(1200));
    // Maintenance on S3: at least one merge of small files by the workers (a round comes every
    // minute; a fast machine may have committed everything before the first).
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut merges = optimize_commits(&s3, &table);
    while merges == 0 && n == ids.len() as i64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_secs(10));
        merges = optimize_commits(&s3, &table);
    }
    eprintln!("{merges} merge commits on S3");
    std::thread::sleep(Duration::from_secs(3));
    let logs: Vec<String> = workers
        .iter()
        .map(|w| std::fs::read_to_string(&w.log).unwrap_or_default())
        .collect();
    drop(workers);
    assert_eq!(n, ids.len() as i64, "rows on S3");
    assert!(merges >= 1, "the workers' maintenance merged files on S3");
    assert!(
        kills_while_ingesting >= 5,
        "only {kills_while_ingesting} of 10 kills struck while rows were still to commit"
    );
    assert_exactly(&s3, &data, &ids);
    for l in &logs {
        assert_no_credentials("a worker's log", l);
    }
}

/// Merge commits (`OPTIMIZE`) in the history of the table at `table`, read with the Python
/// `deltalake` package.
fn optimize_commits(s3: &S3Server, table: &str) -> usize {
    let code = format!(
        r#"
import os
from deltalake import DeltaTable
opts = {{k: os.environ[k] for k in ("AWS_ENDPOINT_URL", "AWS_ALLOW_HTTP", "AWS_REGION",
                                    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}}
print(sum(1 for h in DeltaTable("{table}", storage_options=opts).history()
          if h.get("operation") == "OPTIMIZE"))
"#
    );
    crate::s3_support::python_with(s3, &code)
        .trim()
        .parse()
        .unwrap_or(0)
}
