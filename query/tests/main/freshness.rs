//! Commits made after the engine opened are visible to the next query.

use std::time::Duration;

use toolspan_query::{Engine, EngineOptions};

use crate::common::{
    batch, engine_with_retries, one_ok_call, request, s, scalar, table_with, Trace,
};

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

/// An engine over `table` that looks for a new version before every query.
async fn engine_at_every_query(table: &toolspan_store::SpanTable) -> Engine {
    let options = EngineOptions {
        refresh_interval: Duration::ZERO,
        ..EngineOptions::default()
    };
    Engine::with_table(table.clone(), options)
        .await
        .expect("engine")
}

/// The paths the engine's metadata cache holds entries under.
fn cached_paths(engine: &Engine) -> Vec<deltalake::Path> {
    let cache = engine
        .context()
        .runtime_env()
        .cache_manager
        .get_file_metadata_cache();
    cache.list_entries().into_keys().collect()
}

/// The file names whose decoded footers the engine keeps between queries.
fn cached_footers(engine: &Engine) -> std::collections::BTreeSet<String> {
    cached_paths(engine)
        .iter()
        .filter_map(|p| p.filename().map(str::to_string))
        .filter(|f| f != "bloom-filters")
        .collect()
}

#[tokio::test]
async fn footers_of_files_merged_away_leave_the_cache_when_the_engine_moves_on() {
    // Six commits, six small files in the one partition of these calls; a query that reads
    // every file (no statistic answers `LIKE`) caches every footer.
    let reqs: Vec<_> = (1..=6).map(one_ok_call).collect();
    let (_dir, table) = table_with(&reqs).await;
    let engine = engine_at_every_query(&table).await;
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

#[tokio::test]
async fn a_lookup_reads_bloom_filters_once_and_they_leave_with_their_files() {
    // Six commits of two traces each (ids 0x0k… and 0x4k…): six small files whose trace id
    // ranges all hold 0x2f…, so the log's statistics prune none of them for it.
    let reqs: Vec<_> = (1..=6)
        .map(|k| {
            let mut req = one_ok_call(k);
            req.resource_spans
                .extend(one_ok_call(k + 0x40).resource_spans);
            req
        })
        .collect();
    let (_dir, table) = table_with(&reqs).await;
    let engine = engine_at_every_query(&table).await;
    // A trace no file holds: every row group is asked its bloom filter, and none is read.
    let absent = "SELECT count(*) FROM spans WHERE trace_id = '2f2f2f2f2f2f2f2f2f2f2f2f2f2f2f2f'";
    let (rows, first) = rows_and_bytes_read(&engine, absent).await;
    assert_eq!(rows, 0);
    assert!(first > 0, "the first lookup reads the filters");
    let live = live_files(&table).await;
    assert!(live.len() >= 6, "{live:?}");
    assert_eq!(cached_filters(&engine), live);
    // The next lookup reads nothing from the files: footers and filters are in memory.
    let (rows, again) = rows_and_bytes_read(&engine, absent).await;
    assert_eq!(rows, 0);
    assert_eq!(
        again, 0,
        "a second lookup read {again} bytes (first: {first})"
    );

    // A trace that is there is found through the cached filters.
    let one = "SELECT count(*) FROM spans WHERE trace_id = \
               (SELECT min(trace_id) FROM spans WHERE call_id = 'call_3')";
    assert_eq!(scalar(&engine, one).await, "1");

    // Maintenance merges the files; the filters of the merged-away files leave the cache
    // when the engine moves to that version.
    let report = table.compact_crowded(2, 64 << 20).await.expect("compact");
    assert!(report.files_removed >= 6, "{report:?}");
    let (rows, _) = rows_and_bytes_read(&engine, absent).await;
    assert_eq!(rows, 0);
    let after = live_files(&table).await;
    assert_eq!(cached_filters(&engine), after);
    assert_eq!(cached_footers(&engine), after);
}

#[tokio::test]
async fn a_trace_lookup_reads_a_small_part_of_a_large_file() {
    // One commit of 12,000 one-span traces of one tool and stage: one file of 12,000 rows,
    // trace ids rising with start time (as time-prefixed ids do).
    const TRACES: u64 = 12_000;
    let traces: Vec<Trace> = (0..TRACES)
        .map(|i| {
            let mut id = [0u8; 16];
            id[..8].copy_from_slice(&(i + 1).to_be_bytes());
            id[8..].copy_from_slice(&(i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).to_be_bytes());
            let mut t = Trace::with_id(id);
            t.span(
                i + 1,
                None,
                "execute_tool search_docs",
                i,
                1 + i % 97,
                false,
                vec![
                    s("gen_ai.operation.name", "execute_tool"),
                    s("gen_ai.tool.name", "search_docs"),
                    s("gen_ai.tool.call.id", &format!("call_{i:08x}")),
                ],
            );
            t
        })
        .collect();
    let (dir, table) = table_with(&[request(traces)]).await;
    let files = live_files(&table).await;
    assert_eq!(files.len(), 1, "{files:?}");
    let size = parquet_bytes(dir.path());
    let engine = engine_at_every_query(&table).await;
    let wanted = format!(
        "{:016x}{:016x}",
        6_001u64,
        6_000u64.wrapping_mul(0x9e37_79b9_7f4a_7c15)
    );
    let lookup = format!("SELECT * FROM spans WHERE trace_id = '{wanted}'");
    // The first lookup also reads the footer and the page index; the second only what the
    // lookup itself needs: the pages holding the trace's row, in each column.
    let (rows, _, _) = result_rows_and_reads(&engine, &lookup).await;
    assert_eq!(rows, 1);
    let (rows, read, decoded) = result_rows_and_reads(&engine, &lookup).await;
    assert_eq!(rows, 1);
    // The trace's id is compared in one page of 2,048 rows, not in the file's 12,000.
    assert!(
        decoded * 4 <= TRACES as usize,
        "a lookup of one trace compared {decoded} ids of {TRACES}"
    );
    // The bytes read: the pages around the row in each column (the reader merges nearby
    // ranges into one read, so on a file this small that is a contiguous part of it).
    assert!(
        read * 3 <= size * 2,
        "a lookup of one trace read {read} bytes of a {size}-byte file"
    );
}

/// The bytes of the Parquet files under `dir`.
fn parquet_bytes(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .expect("a directory")
        .map(|e| e.expect("an entry").path())
        .map(|p| {
            if p.is_dir() {
                parquet_bytes(&p)
            } else if p.extension().is_some_and(|e| e == "parquet") {
                std::fs::metadata(&p).expect("a file").len() as usize
            } else {
                0
            }
        })
        .sum()
}

/// Runs `sql` through the engine's context; returns the rows it answered, the bytes its scans
/// read from the table's files and the rows their pushed-down filters were evaluated on.
async fn result_rows_and_reads(engine: &Engine, sql: &str) -> (usize, usize, usize) {
    let (batches, plan) = run_with_plan(engine, sql).await;
    let rows = batches.iter().map(|b| b.num_rows()).sum();
    let plan = plan.as_ref();
    let filtered = metric(plan, "pushdown_rows_matched") + metric(plan, "pushdown_rows_pruned");
    (rows, metric(plan, "bytes_scanned"), filtered)
}

/// Runs `sql` through the engine's context; returns its batches and the executed plan (whose
/// operators hold the run's metrics).
async fn run_with_plan(
    engine: &Engine,
    sql: &str,
) -> (
    Vec<datafusion::arrow::array::RecordBatch>,
    std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>,
) {
    let df = engine.context().sql(sql).await.expect("plan");
    let task = std::sync::Arc::new(df.task_ctx());
    let plan = df.create_physical_plan().await.expect("physical plan");
    let batches = datafusion::physical_plan::collect(plan.clone(), task)
        .await
        .expect("run");
    (batches, plan)
}

/// The metric `name` summed over the operators of `plan`.
fn metric(plan: &dyn datafusion::physical_plan::ExecutionPlan, name: &str) -> usize {
    let own = plan
        .metrics()
        .and_then(|m| m.sum_by_name(name))
        .map_or(0, |v| v.as_usize());
    own + plan
        .children()
        .iter()
        .map(|c| metric(c.as_ref(), name))
        .sum::<usize>()
}

/// The file names whose bloom filters the engine keeps between lookups.
fn cached_filters(engine: &Engine) -> std::collections::BTreeSet<String> {
    cached_paths(engine)
        .iter()
        .filter(|p| p.filename() == Some("bloom-filters"))
        .filter_map(|p| p.parts().nth_back(1).map(|f| f.as_ref().to_string()))
        .collect()
}

/// Runs `sql` (a `count(*)`) through the engine's context; returns the count and the bytes its
/// scans read from the table's files.
async fn rows_and_bytes_read(engine: &Engine, sql: &str) -> (i64, usize) {
    use datafusion::arrow::array::{Array, Int64Array};
    let (batches, plan) = run_with_plan(engine, sql).await;
    let count = batches
        .iter()
        .find(|b| b.num_rows() > 0)
        .and_then(|b| {
            b.column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .map(|a| a.value(0))
        })
        .expect("a count");
    (count, metric(plan.as_ref(), "bytes_scanned"))
}
