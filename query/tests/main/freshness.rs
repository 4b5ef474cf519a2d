//! Commits made after the engine opened are visible to the next query.

use std::time::Duration;

use toolspan_query::{Engine, EngineOptions};

use crate::common::{batch, engine_with_retries, one_ok_call, scalar, table_with};

#[tokio::test]
async fn a_new_commit_is_visible_to_the_next_query() {
    let (_dir, table, engine) = engine_with_retries().await;
    assert_eq!(scalar(&engine, "SELECT count(*) FROM calls").await, "2");
    let v = table
        .commit(vec![batch(&one_ok_call(7))], &[])
        .await
        .expect("commit");
    assert_eq!(scalar(&engine, "SELECT count(*) FROM calls").await, "3");
    assert_eq!(
        scalar(
            &engine,
            "SELECT count(*) FROM spans WHERE call_id = 'call_7'"
        )
        .await,
        "1"
    );
    assert_eq!(engine.version(), v.version);
}

#[tokio::test]
async fn another_process_commit_is_seen_within_the_refresh_interval() {
    let (dir, _table) = table_with(&[one_ok_call(1)]).await;
    let location = dir.path().join("spans");
    let location = location.to_str().expect("utf-8");
    let options = EngineOptions {
        refresh_interval: Duration::from_millis(200),
        ..EngineOptions::default()
    };
    let engine = Engine::open_with(location, options).await.expect("engine");
    assert_eq!(scalar(&engine, "SELECT count(*) FROM spans").await, "1");

    // A writer with its own handle, as the ingest process would have.
    let writer = toolspan_store::SpanTable::open_or_create(location)
        .await
        .expect("table");
    writer
        .commit(vec![batch(&one_ok_call(2))], &[])
        .await
        .expect("commit");
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(scalar(&engine, "SELECT count(*) FROM spans").await, "2");

    writer
        .commit(vec![batch(&one_ok_call(3))], &[])
        .await
        .expect("commit");
    engine.refresh().await.expect("refresh");
    assert_eq!(scalar(&engine, "SELECT count(*) FROM spans").await, "3");
}

#[tokio::test]
async fn an_empty_table_answers_with_no_rows() {
    let (_dir, table) = table_with(&[]).await;
    let engine = Engine::with_table(table, EngineOptions::default())
        .await
        .expect("engine");
    assert_eq!(scalar(&engine, "SELECT count(*) FROM spans").await, "0");
    assert_eq!(
        scalar(&engine, "SELECT count(*) FROM failure_rates").await,
        "0"
    );
    let r = engine.query("SELECT * FROM calls").await.expect("query");
    assert_eq!(r.num_rows(), 0);
    let csv =
        toolspan_query::render_with_schema(&r.schema, &r.batches, toolspan_query::Format::Csv)
            .expect("csv");
    assert!(csv.starts_with("trace_id,span_id,call_id,tool"), "{csv}");
}

/// The file names (not paths) of the table's live data files.
async fn live_files(table: &toolspan_store::SpanTable) -> std::collections::BTreeSet<String> {
    let latest = table.latest().await.expect("latest");
    let uris: Vec<String> = latest.get_file_uris().expect("file uris").collect();
    uris.iter()
        .map(|u| u.rsplit('/').next().unwrap_or(u).to_string())
        .collect()
}

/// The file names whose decoded footers the engine keeps between queries.
fn cached_footers(engine: &Engine) -> std::collections::BTreeSet<String> {
    let cache = engine
        .context()
        .runtime_env()
        .cache_manager
        .get_file_metadata_cache();
    cache
        .list_entries()
        .keys()
        .filter_map(|p| p.filename().map(str::to_string))
        .collect()
}

#[tokio::test]
async fn footers_of_files_merged_away_leave_the_cache_when_the_engine_moves_on() {
    // Six commits, six small files in the one partition of these calls; a query that reads
    // every file (no statistic answers `LIKE`) caches every footer.
    let reqs: Vec<_> = (1..=6).map(one_ok_call).collect();
    let (_dir, table) = table_with(&reqs).await;
    let options = EngineOptions {
        refresh_interval: Duration::ZERO,
        ..EngineOptions::default()
    };
    let engine = Engine::with_table(table.clone(), options)
        .await
        .expect("engine");
    let read_all = "SELECT count(*) FROM spans WHERE call_id LIKE 'call_%'";
    assert_eq!(scalar(&engine, read_all).await, "6");
    let before = live_files(&table).await;
    assert!(before.len() >= 6, "{before:?}");
    assert_eq!(cached_footers(&engine), before);

    // Maintenance merges them; the next query moves to that version, reads the merged file
    // and no longer holds the six footers no version it can read refers to.
    let report = table.compact_crowded(2, 64 << 20).await.expect("compact");
    assert!(report.files_removed >= 6, "{report:?}");
    assert_eq!(scalar(&engine, read_all).await, "6");
    let after = live_files(&table).await;
    assert!(after.len() < before.len(), "{after:?}");
    assert_eq!(cached_footers(&engine), after);
}
