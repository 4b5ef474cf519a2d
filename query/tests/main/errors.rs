//! Every error code the query interface returns, and that envelopes leak nothing internal:
//! the SQL corpus (`query/tests/sql`, shared with the HTTP and Postgres wire tests) through
//! the engine, and the limits that need an engine of their own.

use toolspan_query::{Engine, QueryError};
use toolspan_schema::Code;

use crate::common::{corpus_dir, engine_with_retries};
use crate::sql_corpus::{self, Runner};

async fn fails(engine: &Engine, sql: &str) -> QueryError {
    match engine.sql(sql).await {
        Ok(b) => panic!("{sql} should fail, returned {} batches", b.len()),
        Err(e) => {
            assert_clean(&e);
            e
        }
    }
}

/// The envelope has its five fields and no dependency text, paths or plans.
fn assert_clean(e: &QueryError) {
    let v = e.envelope();
    let err = v["error"].as_object().expect("error object");
    let keys: Vec<&str> = err.keys().map(String::as_str).collect();
    assert_eq!(keys.len(), 5, "{v}");
    for k in ["code", "class", "message", "retryable", "reference"] {
        assert!(err.contains_key(k), "missing {k}: {v}");
    }
    let msg = err["message"].as_str().expect("message");
    for bad in [
        "DataFusion",
        "datafusion",
        "Error during planning",
        "sql parser error",
        "/tmp",
        "file://",
        "Projection:",
        "TableScan",
        "delta",
    ] {
        assert!(!msg.contains(bad), "message leaks {bad:?}: {msg}");
    }
    assert!(
        err["reference"]
            .as_str()
            .is_some_and(|r| r.starts_with("ts_")),
        "{v}"
    );
}

/// The SQL corpus (`query/tests/sql`) through the engine: every case has its code, class and
/// message, is not retryable, and the refused statements write nothing.
#[tokio::test]
async fn the_sql_corpus_through_the_engine() {
    let (dir, _table, engine) = engine_with_retries().await;
    let target = dir.path().join("copied.csv");
    let external = dir.path().join("external");
    std::fs::create_dir_all(&external).expect("dir");
    let cases = sql_corpus::load(
        &corpus_dir(),
        Runner::Engine,
        &[
            ("copy_target", target.to_str().expect("utf-8 temp path")),
            ("external_dir", external.to_str().expect("utf-8 temp path")),
        ],
    );
    for case in &cases {
        let Some(code) = case.code() else {
            let ok = engine.sql(&case.sql).await;
            assert!(
                ok.is_ok(),
                "{}: {:?}",
                case.name(),
                ok.err().map(|e| e.envelope())
            );
            continue;
        };
        let e = fails(&engine, &case.sql).await;
        let envelope = e.envelope();
        assert_eq!(e.code().as_str(), code, "{}: {envelope}", case.name());
        assert_eq!(
            envelope["error"]["class"].as_str(),
            case.class(),
            "{}",
            case.name()
        );
        assert!(!e.retryable(), "{}", case.name());
        case.check_message(&e.message(), &envelope.to_string());
    }
    assert!(!target.exists(), "COPY wrote a file");
    assert_eq!(std::fs::read_dir(&external).expect("dir").count(), 0);
    // The tables are still there and unchanged.
    assert_eq!(
        crate::common::scalar(&engine, "SELECT count(*) FROM calls").await,
        "2"
    );
}

#[tokio::test]
async fn timeouts_and_memory_limits_have_their_codes() {
    use std::time::Duration;
    use toolspan_query::EngineOptions;
    let (_dir, table, _engine) = engine_with_retries().await;
    let slow = Engine::with_table(
        table.clone(),
        EngineOptions {
            query_timeout: Duration::from_millis(1),
            ..EngineOptions::default()
        },
    )
    .await
    .expect("engine");
    // A cross join large enough to outlast a millisecond.
    let e = fails(
        &slow,
        "SELECT count(*) FROM generate_series(1, 20000000) a, generate_series(1, 100) b",
    )
    .await;
    assert_eq!(e.code(), Code::QueryTimeout);
    assert!(e.retryable());

    let small = Engine::with_table(
        table,
        EngineOptions {
            memory_limit: Some(64 << 10),
            ..EngineOptions::default()
        },
    )
    .await
    .expect("engine");
    let e = fails(
        &small,
        "SELECT value, count(*) FROM generate_series(1, 2000000) GROUP BY value ORDER BY value",
    )
    .await;
    assert_eq!(e.code(), Code::ResourcesExhausted, "{}", e.envelope());
}
