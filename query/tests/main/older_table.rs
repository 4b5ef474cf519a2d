//! A table made by a toolspan from before the `status_from_result` column (and the shape
//! columns after it): opening it adds the columns (nullable, at the end), its old rows read
//! NULL there, new rows are written beside them, compaction merges old and new files, and SQL
//! reads all of it.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::Schema;
use deltalake::kernel::engine::arrow_conversion::TryIntoKernel as _;
use deltalake::kernel::StructType;
use deltalake::protocol::SaveMode;
use toolspan_query::{Engine, EngineOptions};
use toolspan_schema::columns::{col, PARTITION_COLUMNS};
use toolspan_store::SpanTable;

use crate::common::{batch, json_rows, retry_traces};

/// The rows by `status_from_result`.
async fn read(engine: &Engine) -> Vec<serde_json::Value> {
    let sql = "SELECT status_from_result, count(*) AS n FROM spans \
               GROUP BY status_from_result ORDER BY status_from_result NULLS FIRST";
    json_rows(
        &engine
            .sql(sql)
            .await
            .unwrap_or_else(|e| panic!("{}", e.envelope())),
    )
}

/// `b` without `status_from_result` and the columns added after it: a batch as the earlier
/// schema had it.
fn without_last_column(b: &RecordBatch) -> RecordBatch {
    let n = b
        .schema()
        .index_of(col::STATUS_FROM_RESULT)
        .expect("the column");
    let schema = Schema::new(b.schema().fields()[..n].to_vec());
    RecordBatch::try_new(Arc::new(schema), b.columns()[..n].to_vec()).expect("batch")
}

#[tokio::test]
async fn a_table_from_before_the_status_from_result_column_opens_and_reads() {
    let dir = tempfile::tempdir().expect("dir");
    let location = dir.path().join("spans");
    std::fs::create_dir_all(&location).expect("dir");
    let url = deltalake::ensure_table_uri(location.to_str().expect("utf-8")).expect("url");
    let new_batch = batch(&retry_traces());
    let names: Vec<String> = new_batch
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().to_string())
        .collect();
    assert_eq!(
        names[names.len() - 5..],
        [
            col::STATUS_FROM_RESULT,
            col::INPUT_SHAPE,
            col::OUTPUT_SHAPE,
            col::INPUT_SHAPE_DOC,
            col::OUTPUT_SHAPE_DOC
        ],
        "the columns added since the first release, in order"
    );
    let old_batch = without_last_column(&new_batch);
    let old_schema: StructType = old_batch
        .schema()
        .as_ref()
        .try_into_kernel()
        .expect("kernel schema");

    // The earlier version's table, with rows.
    let old = deltalake::DeltaTable::try_from_url(url)
        .await
        .expect("handle")
        .create()
        .with_table_name("spans")
        .with_columns(old_schema.fields().cloned())
        .with_partition_columns(PARTITION_COLUMNS)
        .await
        .expect("older table");
    old.write(vec![old_batch.clone()])
        .with_save_mode(SaveMode::Append)
        .with_partition_columns(PARTITION_COLUMNS)
        .await
        .expect("older rows");

    // Today's toolspan opens it (the column is added) and writes to it.
    let table = SpanTable::open_or_create(location.to_str().expect("utf-8"))
        .await
        .expect("an older table opens");
    table
        .commit(vec![new_batch.clone()], &[])
        .await
        .expect("new rows land beside the old ones");
    // A second open finds nothing to add.
    let again = SpanTable::open_or_create(location.to_str().expect("utf-8"))
        .await
        .expect("reopen");
    let engine = Engine::with_table(
        again.clone(),
        EngineOptions {
            refresh_interval: std::time::Duration::ZERO,
            ..EngineOptions::default()
        },
    )
    .await
    .expect("engine");
    let n = new_batch.num_rows() as i64;
    let expected = vec![
        serde_json::json!({"status_from_result": null, "n": n}),
        serde_json::json!({"status_from_result": false, "n": n}),
    ];
    assert_eq!(
        read(&engine).await,
        expected,
        "old files read NULL, new rows false"
    );

    // Old and new files merge; the merged files read the same.
    let version = again.latest_version().await.expect("version");
    let report = again
        .compact_crowded(2, 1 << 30)
        .await
        .expect("compaction merges old and new files");
    assert!(report.files_removed >= 2, "{report:?}");
    assert!(again.latest_version().await.expect("version") > version);
    assert_eq!(read(&engine).await, expected, "after compaction");
}
