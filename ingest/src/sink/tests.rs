//! The sink against a real table in a temporary directory: a batch the table refuses for good
//! goes to the quarantine table and holds back nothing else.

use std::time::Duration;

use arrow::record_batch::RecordBatch;
use toolspan_pipeline::{Encoding, Pipeline};
use toolspan_store::{SpanTable, TableKind, WriterConfig};

use super::{SinkConfig, SinkHandle};

/// One finished tool call span of `tool` per id in `ids` (root spans: nothing waits).
fn spans(tool: &str, ids: std::ops::Range<u32>) -> RecordBatch {
    let spans: Vec<serde_json::Value> = ids
        .map(|i| {
            serde_json::json!({
                "traceId": format!("{:032x}", 0xabc0_0000u64 + u64::from(i)),
                "spanId": format!("{:016x}", 0x100u64 + u64::from(i)),
                "name": "execute_tool",
                "startTimeUnixNano": "1764410400000000000",
                "endTimeUnixNano": "1764410400500000000",
                "attributes": [
                    {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
                    {"key": "gen_ai.tool.name", "value": {"stringValue": tool}},
                ],
            })
        })
        .collect();
    let body = serde_json::json!({"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "t"}}]},
        "scopeSpans": [{"spans": spans}],
    }]});
    Pipeline::builtin()
        .process_bytes(body.to_string().as_bytes(), Encoding::Json)
        .expect("a valid request")
        .batch
}

async fn rows(table: &SpanTable) -> usize {
    let t = table.latest().await.expect("the table reads");
    t.snapshot()
        .expect("a snapshot")
        .log_data()
        .iter()
        .map(|f| f.num_records().unwrap_or(0))
        .sum()
}

/// A new `spans` table in a temporary directory (kept while the directory lives).
async fn fresh_table() -> (tempfile::TempDir, SpanTable) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let location = dir.path().join("spans").to_string_lossy().into_owned();
    let table = SpanTable::open_or_create(&location)
        .await
        .expect("the table");
    (dir, table)
}

fn config() -> SinkConfig {
    SinkConfig {
        writer: WriterConfig {
            max_rows: 1_000_000,
            max_bytes: 1 << 30,
            max_age: Duration::from_millis(200),
        },
        queue: 16,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_the_table_refuses_is_quarantined_and_the_rest_is_committed() {
    // A table so deep in the file system that a data file under a 110-byte tool directory
    // passes the path limit (4,096 bytes) while the log, short tool names and the quarantine
    // table (no partition directories) fit: the store refuses one batch for good, as it did
    // for any over-long partition value.
    let root = tempfile::tempdir().expect("a temporary directory");
    let mut dir = root.path().to_path_buf();
    while dir.as_os_str().len() < 3_940 {
        let room = 3_940 - dir.as_os_str().len();
        dir.push("d".repeat(room.clamp(1, 200)));
    }
    std::fs::create_dir_all(&dir).expect("a deep directory");
    let location = dir.join("spans").to_string_lossy().into_owned();
    let table = SpanTable::open_or_create(&location)
        .await
        .expect("the table");
    let (sink, task) = SinkHandle::start(table.clone(), config(), None);

    // Both in one buffer, so that the refusal of one would hold back the other.
    let refused = sink.submit(spans(&"t".repeat(110), 0..2)).expect("queued");
    let fine = sink.submit(spans("search_docs", 2..5)).expect("queued");
    let wait = Duration::from_secs(30);
    let fine = tokio::time::timeout(wait, fine).await.expect("answered");
    assert!(matches!(fine, Ok(Ok(_))), "{fine:?}");
    let refused = tokio::time::timeout(wait, refused).await.expect("answered");
    assert!(
        matches!(refused, Ok(Ok(_))),
        "quarantined and acknowledged: {refused:?}"
    );
    // The sink goes on.
    let later = tokio::time::timeout(wait, sink.write(spans("search_docs", 5..6)))
        .await
        .expect("answered");
    assert!(later.is_ok(), "{later:?}");
    assert_eq!(rows(&table).await, 4, "the accepted spans are in the table");
    assert_eq!(
        sink.stats()
            .quarantined
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert!(!sink
        .stats()
        .store_failing
        .load(std::sync::atomic::Ordering::Relaxed));
    let quarantine = SpanTable::open_or_create_kind(
        &format!("{location}_quarantine"),
        TableKind::Quarantine,
        Default::default(),
    )
    .await
    .expect("the quarantine table");
    assert_eq!(
        rows(&quarantine).await,
        2,
        "the refused spans are in the quarantine"
    );
    drop(sink);
    tokio::time::timeout(wait, task)
        .await
        .expect("the sink stops")
        .expect("no panic");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_no_table_can_hold_is_refused_to_its_caller_alone() {
    let (_dir, table) = fresh_table().await;
    let (sink, _task) = SinkHandle::start(table.clone(), config(), None);
    let good = spans("search_docs", 0..3);
    // The wrong columns: every table refuses it.
    let wrong = good.project(&[0, 1, 2]).expect("a projection");
    let wrong = sink.submit(wrong).expect("queued");
    let good = sink.submit(good).expect("queued");
    let wait = Duration::from_secs(30);
    let good = tokio::time::timeout(wait, good).await.expect("answered");
    assert!(matches!(good, Ok(Ok(_))), "{good:?}");
    let wrong = tokio::time::timeout(wait, wrong).await.expect("answered");
    assert!(matches!(wrong, Ok(Err(_))), "{wrong:?}");
    assert_eq!(rows(&table).await, 3);
}

/// A flush whose commit landed although its answer was lost (a full disk while the new table
/// state was read, a dropped connection to the object store) is recognised by the transaction
/// version the table records, acknowledged, and not committed a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_that_landed_although_it_was_reported_failed_is_not_committed_twice() {
    let (_dir, table) = fresh_table().await;
    let quarantine = toolspan_store::table::quarantine_location(&table);
    let mut sink = super::Sink::new(
        toolspan_store::Writer::new(table.clone(), config().writer),
        quarantine,
    );
    let batch = spans("search_docs", 0..3);
    let (ack, answer) = tokio::sync::oneshot::channel();
    sink.push(batch.clone(), ack);
    // The flush's commit lands as the sink would make it (its rows, its app id and sequence)...
    let seq = sink.pending_seq();
    table
        .commit(vec![batch], &[(sink.app_id.clone(), seq)])
        .await
        .expect("the commit lands");
    // ...but the sink never heard: it flushes again.
    match sink.flush().await {
        super::Flushed::Committed { recovered, .. } => {
            assert!(recovered, "found committed, not committed again")
        }
        super::Flushed::Failed(e) => panic!("the retry failed: {e}"),
    }
    assert!(
        matches!(answer.await, Ok(Ok(_))),
        "the caller is acknowledged"
    );
    assert_eq!(rows(&table).await, 3, "the spans are stored once");
    // The sink goes on with the next sequence.
    let (ack, answer) = tokio::sync::oneshot::channel();
    sink.push(spans("search_docs", 3..4), ack);
    assert!(matches!(
        sink.flush().await,
        super::Flushed::Committed {
            recovered: false,
            ..
        }
    ));
    assert!(matches!(answer.await, Ok(Ok(_))));
    assert_eq!(rows(&table).await, 4);
}
