//! The rollup table (`failure_rates_1m`): created with its own schema and partitioning, kept
//! apart from `spans`, committed with transaction versions, compacted on its open day.

use std::collections::HashMap;

use toolspan_schema::rollup::{aggregate, rollup_schema};
use toolspan_schema::Code;
use toolspan_store::{SpanTable, StoreErrorKind, TableKind};

use crate::common::{calls, location};

#[tokio::test]
async fn rollup_table_commits_merges_and_compacts_without_changing_sums() {
    let dir = tempfile::tempdir().expect("dir");
    let loc = location(&dir);
    let table = SpanTable::open_or_create_kind(&loc, TableKind::FailureRates, HashMap::new())
        .await
        .expect("create");
    assert_eq!(table.kind(), TableKind::FailureRates);
    // Spans batches are not rollup rows: refused, nothing committed.
    let err = table
        .commit(vec![calls(1, "search", 3)], &[])
        .await
        .expect_err("spans rows");
    assert!(
        matches!(err.kind(), StoreErrorKind::BatchSchema { .. }),
        "{err}"
    );

    // Three flushes, each one file per day touched, with offsets.
    for (i, tool) in ["search", "db", "search"].into_iter().enumerate() {
        let rows = aggregate(&[calls(i as u8 + 1, tool, 4)]).expect("aggregate");
        assert_eq!(rows.schema(), rollup_schema());
        table
            .commit(vec![rows], &[("otlp_spans-0".into(), i as i64)])
            .await
            .expect("commit");
    }
    assert_eq!(
        table
            .transaction_version("otlp_spans-0")
            .await
            .expect("txn"),
        Some(2)
    );
    let before = table.file_count().await.expect("files");
    let sums = || async {
        let delta = table.latest().await.expect("latest");
        let ctx = deltalake::datafusion::prelude::SessionContext::new();
        delta
            .update_datafusion_session(&ctx.state())
            .expect("session");
        ctx.register_table("r", delta.table_provider().await.expect("provider"))
            .expect("register");
        let df = ctx
            .sql("SELECT tool, CAST(sum(spans) AS BIGINT) AS n FROM r GROUP BY tool ORDER BY tool")
            .await
            .expect("sql");
        let batches = df.collect().await.expect("collect");
        arrow::util::pretty::pretty_format_batches(&batches)
            .expect("format")
            .to_string()
    };
    let sums_before = sums().await;
    assert!(
        sums_before.contains("| db     | 4 |") && sums_before.contains("| search | 8 |"),
        "{sums_before}"
    );

    // Compaction of every day up to tomorrow (the metrics job's setting) merges them.
    let report = table
        .compact("2999-01-01", 16 << 20)
        .await
        .expect("compact");
    assert!(report.files_removed >= 2, "{report:?}");
    assert!(table.file_count().await.expect("files") < before);
    assert_eq!(sums().await, sums_before, "compaction keeps the sums");

    // The same location cannot be opened as `spans`.
    let err = SpanTable::open_or_create(&loc)
        .await
        .expect_err("not spans");
    assert_eq!(err.code(), Code::InvalidConfig);
}
