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
