//! `Writer`: buffering, flush limits, retry after a failed commit, concurrent writers.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use arrow::array::RecordBatch;
use toolspan_schema::Code;
use toolspan_store::{
    CommitInfo, Committer, SpanTable, StoreError, StoreErrorKind, Writer, WriterConfig,
};

use crate::common::{calls, count_rows, location};

/// What one commit call was given: rows and transaction versions.
type Call = (usize, Vec<(String, i64)>);

/// Fails the first `failures` commits, then commits to the table; records what it was given.
struct Flaky {
    table: SpanTable,
    failures: AtomicUsize,
    seen: Mutex<Vec<Call>>,
}

impl Committer for Flaky {
    async fn commit(
        &self,
        batches: Vec<RecordBatch>,
        txns: &[(String, i64)],
        fences: &[(String, Option<i64>)],
    ) -> Result<CommitInfo, StoreError> {
        let rows = batches.iter().map(|b| b.num_rows()).sum();
        self.seen.lock().expect("lock").push((rows, txns.to_vec()));
        if self.failures.load(Ordering::SeqCst) > 0 {
            self.failures.fetch_sub(1, Ordering::SeqCst);
            return Err(StoreError::new(
                StoreErrorKind::Unavailable { op: "testing" },
                "injected failure",
            ));
        }
        self.table.commit_fenced(batches, txns, fences).await
    }
}

fn config() -> WriterConfig {
    WriterConfig {
        max_rows: 1_000,
        max_bytes: 1 << 30,
        max_age: Duration::from_secs(3600),
    }
}

#[tokio::test]
async fn a_failed_flush_keeps_the_buffer_and_the_retry_commits_it_once() {
    let dir = tempfile::tempdir().expect("dir");
    let loc = location(&dir);
    let table = SpanTable::open_or_create(&loc).await.expect("create");
    let flaky = Flaky {
        table: table.clone(),
        failures: AtomicUsize::new(2),
        seen: Mutex::new(Vec::new()),
    };
    let mut w = Writer::new(flaky, config());
    w.push(
        calls(1, "search_docs", 3),
        Some(("otlp_spans-0".into(), 10)),
    );
    w.push(
        calls(2, "search_docs", 4),
        Some(("otlp_spans-0".into(), 12)),
    );
    w.push(calls(3, "fetch_page", 1), Some(("otlp_spans-1".into(), 3)));

    for _ in 0..2 {
        let err = w.flush().await.expect_err("injected failure");
        assert_eq!(err.code(), Code::StoreUnavailable);
        assert!(err.retryable());
        assert_eq!(w.buffered_rows(), 8);
        assert_eq!(w.pending_transactions().get("otlp_spans-0"), Some(&12));
    }
    let info = w
        .flush()
        .await
        .expect("retry")
        .expect("something committed");
    assert_eq!(info.rows, 8);
    assert_eq!(w.buffered_rows(), 0);
    assert!(w.is_empty());
    assert_eq!(w.flush().await.expect("empty flush"), None);

    let seen = w.committer().seen.lock().expect("lock").clone();
    let expected_txns = vec![
        ("otlp_spans-0".to_string(), 12),
        ("otlp_spans-1".to_string(), 3),
    ];
    assert_eq!(
        seen,
        vec![
            (8, expected_txns.clone()),
            (8, expected_txns.clone()),
            (8, expected_txns)
        ]
    );
    assert_eq!(count_rows(&loc).await, 8);
    assert_eq!(
        table
            .transaction_version("otlp_spans-0")
            .await
            .expect("txn"),
        Some(12)
    );
}

#[tokio::test]
async fn a_storage_failure_is_retryable_and_the_retry_lands() {
    let dir = tempfile::tempdir().expect("dir");
    let loc = location(&dir);
    let table = SpanTable::open_or_create(&loc).await.expect("create");
    let mut w = Writer::new(table.clone(), config());
    w.push(calls(1, "search_docs", 3), Some(("otlp_spans-0".into(), 5)));

    // Pull the directory out from under the table (root ignores read-only permissions, so a
    // file in its place is the portable way to make every write fail).
    let moved = format!("{loc}.moved");
    std::fs::rename(&loc, &moved).expect("move table away");
    std::fs::write(&loc, b"not a directory").expect("block the path");
    let err = w.flush().await.expect_err("storage failure");
    assert_eq!(err.code(), Code::StoreUnavailable, "{err}");
    assert!(err.retryable());
    assert!(
        !err.to_string().contains(&loc),
        "message names the path: {err}"
    );
    assert_eq!(w.buffered_rows(), 3);

    std::fs::remove_file(&loc).expect("unblock");
    std::fs::rename(&moved, &loc).expect("move table back");
    let info = w.flush().await.expect("retry").expect("committed");
    assert_eq!(info.rows, 3);
    assert_eq!(count_rows(&loc).await, 3);
    assert_eq!(
        table
            .transaction_version("otlp_spans-0")
            .await
            .expect("txn"),
        Some(5)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_both_land() {
    let dir = tempfile::tempdir().expect("dir");
    let loc = location(&dir);
    let shared = SpanTable::open_or_create(&loc).await.expect("create");
    let separate = SpanTable::open_or_create(&loc)
        .await
        .expect("second handle");
    let mut a = Writer::new(shared.clone(), config());
    let mut b = Writer::new(shared.clone(), config());
    let mut c = Writer::new(separate, config());
    let mut versions = Vec::new();
    for round in 0..4i64 {
        a.push(
            calls(1, "search_docs", 2),
            Some(("otlp_spans-0".into(), round)),
        );
        b.push(
            calls(2, "fetch_page", 3),
            Some(("otlp_spans-1".into(), round)),
        );
        c.push(
            calls(3, "search_docs", 1),
            Some(("otlp_spans-2".into(), round)),
        );
        let (ra, rb, rc) = tokio::join!(a.flush(), b.flush(), c.flush());
        for r in [ra, rb, rc] {
            let info = r.expect("concurrent append commits").expect("committed");
            versions.push(info.version);
        }
    }
    versions.sort_unstable();
    versions.dedup();
    assert_eq!(
        versions.len(),
        12,
        "every commit got its own version: {versions:?}"
    );
    assert_eq!(count_rows(&loc).await, 4 * 6);
    for app in ["otlp_spans-0", "otlp_spans-1", "otlp_spans-2"] {
        assert_eq!(
            shared.transaction_version(app).await.expect("txn"),
            Some(3),
            "{app}"
        );
    }
}

#[tokio::test]
async fn flush_limits_and_discard() {
    let dir = tempfile::tempdir().expect("dir");
    let table = SpanTable::open_or_create(&location(&dir))
        .await
        .expect("create");
    let mut w = Writer::new(
        table.clone(),
        WriterConfig {
            max_rows: 5,
            max_bytes: 1 << 30,
            max_age: Duration::from_secs(3600),
        },
    );
    assert!(!w.should_flush());
    w.push(calls(1, "search_docs", 4), None);
    assert!(!w.should_flush());
    w.push(calls(2, "search_docs", 1), None);
    assert!(w.should_flush(), "row limit");
    w.discard();
    assert!(w.is_empty() && !w.should_flush());
    assert_eq!(w.flush().await.expect("nothing"), None);

    let mut aged = Writer::new(
        table.clone(),
        WriterConfig {
            max_rows: 1_000,
            max_bytes: 1 << 30,
            max_age: Duration::from_millis(20),
        },
    );
    aged.push(calls(1, "search_docs", 1), None);
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert!(aged.should_flush(), "age limit");

    let mut sized = Writer::new(
        table.clone(),
        WriterConfig {
            max_rows: 1_000,
            max_bytes: 1,
            max_age: Duration::from_secs(3600),
        },
    );
    sized.push(calls(1, "search_docs", 1), None);
    assert!(sized.should_flush(), "byte limit");

    // Offsets alone (every message dead-lettered) still flush.
    let empty = calls(1, "search_docs", 0);
    let mut offsets = Writer::new(table.clone(), config());
    offsets.push(empty, Some(("otlp_spans-5".into(), 99)));
    assert!(!offsets.is_empty());
    let info = offsets
        .flush()
        .await
        .expect("flush")
        .expect("txn-only commit");
    assert_eq!(info.rows, 0);
    assert_eq!(
        table
            .transaction_version("otlp_spans-5")
            .await
            .expect("txn"),
        Some(99)
    );
}

/// A zombie worker (one that lost its partition without noticing) must not land its buffer
/// after the new owner committed an overlapping, longer range: "newer than recorded" would let
/// it through and duplicate rows; the fence refuses it.
#[tokio::test]
async fn a_fenced_writer_cannot_commit_after_another_owner_advanced_the_partition() {
    let dir = tempfile::tempdir().expect("dir");
    let loc = location(&dir);
    let table = SpanTable::open_or_create(&loc).await.expect("create");
    let mut zombie = Writer::new(table.clone(), config());
    let mut owner = Writer::new(table.clone(), config());
    zombie.fence("otlp_spans-0".into(), None);
    owner.fence("otlp_spans-0".into(), None);

    // Both read the partition from its start; the new owner reads further and commits first.
    zombie.push(
        calls(1, "search_docs", 2),
        Some(("otlp_spans-0".into(), 10)),
    );
    owner.push(
        calls(1, "search_docs", 2),
        Some(("otlp_spans-0".into(), 10)),
    );
    owner.push(
        calls(2, "search_docs", 2),
        Some(("otlp_spans-0".into(), 20)),
    );
    owner
        .flush()
        .await
        .expect("owner commits")
        .expect("committed");
    assert_eq!(
        owner.fences().get("otlp_spans-0"),
        Some(&Some(20)),
        "fence moved"
    );

    let err = zombie.flush().await.expect_err("zombie fenced");
    assert!(
        matches!(
            err.kind(),
            StoreErrorKind::Fenced {
                recorded: Some(20),
                expected: None,
                ..
            }
        ),
        "{err}"
    );
    assert!(!err.retryable());
    assert_eq!(count_rows(&loc).await, 4, "only the owner's rows");

    // The owner goes on from its own fence.
    owner.push(
        calls(3, "search_docs", 1),
        Some(("otlp_spans-0".into(), 25)),
    );
    owner
        .flush()
        .await
        .expect("owner again")
        .expect("committed");
    assert_eq!(count_rows(&loc).await, 5);
    assert_eq!(
        table
            .transaction_version("otlp_spans-0")
            .await
            .expect("txn"),
        Some(25)
    );
}
