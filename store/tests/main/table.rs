//! `SpanTable`: create, commit, read back, transaction versions, schema checks.

use std::sync::Arc;

use arrow::array::{Array, RecordBatch, StringArray, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Field, Schema};
use toolspan_schema::Code;
use toolspan_store::{SpanTable, StoreErrorKind};

use crate::common::{calls, count_rows, location};

#[tokio::test]
async fn commit_lands_partitioned_and_reads_back_after_a_fresh_open() {
    let dir = tempfile::tempdir().expect("dir");
    let loc = location(&dir);
    let table = SpanTable::open_or_create(&loc).await.expect("create");
    let info = table
        .commit(
            vec![calls(1, "search_docs", 5), calls(2, "fetch_page", 3)],
            &[],
        )
        .await
        .expect("commit");
    assert_eq!(info.rows, 8);
    assert_eq!(info.files, 2, "one file per (tool, stage, date) partition");
    assert_eq!(info.version, 1, "version 0 is the table's creation");
    assert_eq!(count_rows(&loc).await, 8);

    let part = std::path::Path::new(&loc).join("tool=search_docs/stage=call/date=2025-06-01");
    let files: Vec<_> = std::fs::read_dir(&part)
        .expect("partition directory")
        .flatten()
        .collect();
    assert_eq!(files.len(), 1);
    // Rows inside the file are ordered by start_time (the input was in reverse order).
    let file = std::fs::File::open(files[0].path()).expect("parquet file");
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .expect("parquet")
        .build()
        .expect("reader");
    let mut starts = Vec::new();
    for b in reader {
        let b = b.expect("batch");
        let col = b.column_by_name("start_time").expect("start_time column");
        let ts = col
            .as_any()
            .downcast_ref::<TimestampMicrosecondArray>()
            .expect("µs timestamps");
        starts.extend(ts.values().iter().copied());
    }
    assert_eq!(starts.len(), 5);
    assert!(starts.windows(2).all(|w| w[0] <= w[1]), "{starts:?}");

    // Opening again verifies the schema and sees the same data.
    let again = SpanTable::open_or_create(&loc).await.expect("reopen");
    assert_eq!(again.latest_version().await.expect("version"), 1);
}

#[tokio::test]
async fn transaction_versions_persist_and_stale_ones_are_refused() {
    let dir = tempfile::tempdir().expect("dir");
    let loc = location(&dir);
    let table = SpanTable::open_or_create(&loc).await.expect("create");
    let txns = [
        ("otlp_spans-0".to_string(), 40),
        ("otlp_spans-1".to_string(), 7),
        ("otlp_spans-0".to_string(), 41),
    ];
    table
        .commit(vec![calls(1, "search_docs", 2)], &txns)
        .await
        .expect("commit");

    let fresh = SpanTable::open_or_create(&loc).await.expect("reopen");
    assert_eq!(
        fresh
            .transaction_version("otlp_spans-0")
            .await
            .expect("txn"),
        Some(41),
        "the later entry wins"
    );
    assert_eq!(
        fresh
            .transaction_version("otlp_spans-1")
            .await
            .expect("txn"),
        Some(7)
    );
    assert_eq!(
        fresh
            .transaction_version("otlp_spans-9")
            .await
            .expect("txn"),
        None
    );

    // Replaying offsets the table already has would duplicate rows: refused, nothing written.
    let err = fresh
        .commit(
            vec![calls(1, "search_docs", 2)],
            &[("otlp_spans-0".to_string(), 41)],
        )
        .await
        .expect_err("stale");
    assert!(
        matches!(
            err.kind(),
            StoreErrorKind::StaleTransaction {
                recorded: 41,
                attempted: 41,
                ..
            }
        ),
        "{err}"
    );
    assert!(!err.retryable());
    assert_eq!(count_rows(&loc).await, 2);

    // A commit with no rows still advances the version (all messages dead-lettered).
    let info = fresh
        .commit(Vec::new(), &[("otlp_spans-0".to_string(), 50)])
        .await
        .expect("txn-only commit");
    assert_eq!((info.rows, info.files, info.version), (0, 0, 2));
    assert_eq!(
        table
            .transaction_version("otlp_spans-0")
            .await
            .expect("txn"),
        Some(50)
    );
    assert_eq!(count_rows(&loc).await, 2);

    // Nothing at all commits nothing.
    let info = fresh.commit(Vec::new(), &[]).await.expect("no-op");
    assert_eq!((info.rows, info.version), (0, 2));
}

#[tokio::test]
async fn a_foreign_table_is_refused() {
    use deltalake::kernel::{DataType as DeltaType, StructField};
    let dir = tempfile::tempdir().expect("dir");
    let loc = location(&dir);
    let url = deltalake::ensure_table_uri(&loc).expect("url");
    let other = deltalake::DeltaTable::try_from_url(url)
        .await
        .expect("table handle");
    other
        .create()
        .with_columns(vec![StructField::new("x", DeltaType::STRING, true)])
        .await
        .expect("foreign table");
    let err = SpanTable::open_or_create(&loc)
        .await
        .expect_err("not a spans table");
    assert_eq!(err.code(), Code::InvalidConfig);
    let msg = err.to_string();
    assert!(
        msg.contains("missing column trace_id") && msg.contains("unexpected column x"),
        "{msg}"
    );
    assert!(!msg.contains(&loc), "message names the path: {msg}");
}

#[tokio::test]
async fn batches_of_another_shape_are_refused() {
    let dir = tempfile::tempdir().expect("dir");
    let loc = location(&dir);
    let table = SpanTable::open_or_create(&loc).await.expect("create");
    let schema = Arc::new(Schema::new(vec![Field::new("tool", DataType::Utf8, false)]));
    let batch =
        RecordBatch::try_new(schema, vec![Arc::new(StringArray::from(vec!["x"]))]).expect("batch");
    let err = table
        .commit(vec![batch], &[])
        .await
        .expect_err("wrong shape");
    assert!(
        matches!(err.kind(), StoreErrorKind::BatchSchema { .. }),
        "{err}"
    );
    assert_eq!(err.code(), Code::Internal);
    assert_eq!(table.latest_version().await.expect("version"), 0);
}

#[tokio::test]
async fn unusable_locations_are_named_without_detail() {
    let err = SpanTable::open_or_create("").await.expect_err("empty");
    assert!(matches!(err.kind(), StoreErrorKind::InvalidLocation { .. }));
    let err = SpanTable::open_or_create("gopher://example/spans")
        .await
        .expect_err("scheme");
    assert_eq!(err.code(), Code::InvalidConfig);
    assert!(err.to_string().contains("`gopher`"), "{err}");
}

/// toolspan asks delta-rs for its expired-log cleanup only on the commit that writes a
/// checkpoint (on object storage the cleanup LISTs the whole log; the S3 racing-commits test
/// counts those LISTs). The log must still shrink: with a checkpoint every 5 versions and no
/// retention, the entries older than each new checkpoint go when it is written, and the rows
/// stay readable.
#[tokio::test]
async fn expired_log_entries_are_cleaned_when_a_checkpoint_is_written() {
    let dir = tempfile::tempdir().expect("dir");
    let loc = location(&dir);
    let table = SpanTable::open_or_create(&loc).await.expect("create");
    let url = url::Url::from_directory_path(&loc).expect("url");
    let delta = deltalake::open_table(url)
        .await
        .expect("open with delta-rs");
    delta
        .set_tbl_properties()
        .with_properties(
            [
                ("delta.checkpointInterval", "5"),
                ("delta.logRetentionDuration", "interval 0 seconds"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        )
        .await
        .expect("table properties"); // version 1
    let commits = |dir: &std::path::Path| -> Vec<u64> {
        let mut v: Vec<u64> = std::fs::read_dir(dir.join("_delta_log"))
            .expect("log")
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                name.strip_suffix(".json")?.parse().ok()
            })
            .collect();
        v.sort_unstable();
        v
    };
    let log = std::path::Path::new(&loc);
    for k in 0..7u8 {
        table
            .commit(vec![calls(k + 1, "search_docs", 2)], &[])
            .await
            .expect("commit"); // versions 2..=8
    }
    // Version 4 wrote a checkpoint and removed 0..=3; 5..=8 wrote none and removed nothing.
    assert_eq!(commits(log), vec![4, 5, 6, 7, 8]);
    table
        .commit(vec![calls(9, "search_docs", 2)], &[])
        .await
        .expect("commit"); // version 9: the next checkpoint
    assert_eq!(
        commits(log),
        vec![9],
        "the log is cleaned at the checkpoint"
    );
    assert_eq!(count_rows(&loc).await, 16);
}
