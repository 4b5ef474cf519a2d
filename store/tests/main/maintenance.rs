//! Compaction of crowded partitions (the open day's): fewer files, the same rows, and
//! partitions below the threshold left alone.

use crate::common::{calls, calls_some_failed, count_rows, failures_first, file_rows, location};
use toolspan_store::SpanTable;

#[tokio::test]
async fn crowded_partitions_are_merged_and_the_rest_left_alone() {
    let dir = tempfile::tempdir().expect("dir");
    let loc = location(&dir);
    let table = SpanTable::open_or_create(&loc).await.expect("create");
    // 12 flushes of `search` (2 days each: 24 files in 2 partitions of 12), 3 of `db`.
    for i in 0..12u8 {
        table
            .commit(vec![calls(i + 1, "search", 13)], &[])
            .await
            .expect("commit");
    }
    for i in 0..3u8 {
        table
            .commit(vec![calls(i + 50, "db", 13)], &[])
            .await
            .expect("commit");
    }
    assert_eq!(table.file_count().await.expect("files"), 30);
    let rows = count_rows(&loc).await;

    // Nothing holds 13 small files: nothing to do.
    let none = table.compact_crowded(13, 32 << 20).await.expect("compact");
    assert_eq!(none.files_removed, 0);
    // `search`'s two partitions hold 12 each: merged; `db`'s 3-file partitions stay.
    let report = table.compact_crowded(10, 32 << 20).await.expect("compact");
    assert_eq!(
        (report.files_removed, report.files_added),
        (24, 2),
        "{report:?}"
    );
    assert_eq!(table.file_count().await.expect("files"), 2 + 6);
    assert_eq!(count_rows(&loc).await, rows, "same rows");
    // A merged file is below the target but alone in its partition: left alone next time.
    assert_eq!(
        table
            .compact_crowded(2, 32 << 20)
            .await
            .expect("again")
            .files_removed,
        6
    );
    assert_eq!(table.file_count().await.expect("files"), 2 + 2);
}

/// Two processes compacting the same partitions at once (two ingest workers' maintenance
/// rounds): one merge lands, the other is refused, and no row is counted twice. delta-rs's
/// own optimize lets both land (its conflict checker ignores removes with `dataChange =
/// false`), which duplicated every merged row; see bench/RESULTS.md "Notes".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_concurrent_compactions_never_duplicate_rows() {
    let dir = tempfile::tempdir().expect("dir");
    let loc = location(&dir);
    let table = SpanTable::open_or_create(&loc).await.expect("create");
    for i in 0..8u8 {
        table
            .commit(vec![calls(i + 1, "search", 13)], &[])
            .await
            .expect("commit");
    }
    let mut rows = count_rows(&loc).await;
    for round in 0..3 {
        // Two handles, as two processes have: each reads the table before either commits.
        let a = SpanTable::open_or_create(&loc).await.expect("open a");
        let b = SpanTable::open_or_create(&loc).await.expect("open b");
        a.latest().await.expect("a");
        b.latest().await.expect("b");
        let (ra, rb) = tokio::join!(
            tokio::spawn(async move { a.compact_crowded(2, 32 << 20).await }),
            tokio::spawn(async move { b.compact_crowded(2, 32 << 20).await }),
        );
        let merged = [ra.expect("task a"), rb.expect("task b")]
            .iter()
            .filter(|r| r.as_ref().is_ok_and(|r| r.files_removed > 0))
            .count();
        assert!(merged >= 1, "round {round}: one merge lands");
        assert_eq!(count_rows(&loc).await, rows, "round {round}: same rows");
        // New small files for the next round.
        table
            .commit(vec![calls(round + 100, "search", 13)], &[])
            .await
            .expect("commit");
        table
            .commit(vec![calls(round + 110, "search", 13)], &[])
            .await
            .expect("commit");
        rows += 26;
    }
}

/// Flushed and merged files keep their failed spans first, each part in time order (what lets
/// a search for failures skip the pages of successes); merging keeps every row.
#[tokio::test]
async fn flushed_and_merged_files_hold_their_failures_first() {
    let dir = tempfile::tempdir().expect("dir");
    let loc = location(&dir);
    let table = SpanTable::open_or_create(&loc).await.expect("create");
    for i in 0..4u8 {
        table
            .commit(vec![calls_some_failed(i + 1, "search", 12)], &[])
            .await
            .expect("commit");
    }
    let flushed = file_rows(&loc);
    assert_eq!(flushed.len(), 4, "one file a flush");
    for rows in &flushed {
        assert_eq!(rows.iter().filter(|r| r.0 == "error").count(), 4);
        assert!(rows[0].0 == "error" && failures_first(rows), "{rows:?}");
    }

    let report = table.compact_crowded(2, 32 << 20).await.expect("compact");
    assert_eq!((report.files_removed, report.files_added), (4, 1));
    table
        .vacuum(std::time::Duration::ZERO)
        .await
        .expect("vacuum");
    let merged = file_rows(&loc);
    assert_eq!(merged.len(), 1, "{merged:?}");
    let rows = &merged[0];
    assert_eq!(rows.len(), 48, "every row kept");
    assert_eq!(rows.iter().filter(|r| r.0 == "error").count(), 16);
    assert!(rows[0].0 == "error", "{rows:?}");
    let failed = rows.iter().take_while(|r| r.0 == "error").count();
    assert_eq!(failed, 16, "all failures ahead of the successes: {rows:?}");
}
