//! Every error code the query interface returns, and that envelopes leak nothing internal.

use toolspan_query::{Engine, QueryError};
use toolspan_schema::Code;

use crate::common::engine_with_retries;

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

#[tokio::test]
async fn syntax_errors_say_where() {
    let (_dir, _table, engine) = engine_with_retries().await;
    let e = fails(&engine, "SELECT tool FROM spans WHERE tool = ").await;
    assert_eq!(e.code(), Code::SqlSyntax);
    assert!(
        e.message().contains("expected an expression, found EOF"),
        "{}",
        e.message()
    );
    let e = fails(&engine, "SELEC tool FROM spans").await;
    assert_eq!(e.code(), Code::SqlSyntax);
    assert!(
        e.message()
            .starts_with("SQL syntax error at line 1, column 1: expected"),
        "{}",
        e.message()
    );
    assert!(!e.retryable());
    assert_eq!(e.envelope()["error"]["class"], "invalid_request");
}

#[tokio::test]
async fn unknown_columns_list_the_columns_that_exist() {
    let (_dir, _table, engine) = engine_with_retries().await;
    let e = fails(&engine, "SELECT nope FROM spans").await;
    assert_eq!(e.code(), Code::UnknownColumn);
    let m = e.message();
    assert!(
        m.contains("`nope`") && m.contains("error_type") && m.contains("start_time"),
        "{m}"
    );

    let e = fails(
        &engine,
        "SELECT count(*) FROM calls WHERE recoverd_after_retry",
    )
    .await;
    assert_eq!(e.code(), Code::UnknownColumn);
    assert!(
        e.message().contains("did you mean `recovered_after_retry`"),
        "{}",
        e.message()
    );
}

#[tokio::test]
async fn unknown_tables_list_the_tables() {
    let (_dir, _table, engine) = engine_with_retries().await;
    let e = fails(&engine, "SELECT * FROM span").await;
    assert_eq!(e.code(), Code::UnknownTable);
    assert!(
        e.message().contains("`span`") && e.message().contains("spans, calls, failure_rates"),
        "{}",
        e.message()
    );
    // CTE names are not tables.
    let ok = engine
        .sql("WITH s AS (SELECT tool FROM spans) SELECT count(*) FROM s")
        .await;
    assert!(ok.is_ok(), "{:?}", ok.err().map(|e| e.envelope()));
}

#[tokio::test]
async fn writes_and_session_changes_are_forbidden() {
    let (dir, _table, engine) = engine_with_retries().await;
    let target = dir.path().join("copied.csv");
    let external = dir.path().join("external");
    std::fs::create_dir_all(&external).expect("dir");
    let statements = [
        "DROP TABLE spans".to_string(),
        "DROP VIEW calls".to_string(),
        "INSERT INTO spans SELECT * FROM spans".to_string(),
        "INSERT INTO spans (tool) VALUES ('x')".to_string(),
        "DELETE FROM spans".to_string(),
        "UPDATE spans SET tool = 'x'".to_string(),
        format!("COPY (SELECT * FROM spans) TO '{}'", target.display()),
        format!("COPY spans TO '{}' STORED AS CSV", target.display()),
        format!(
            "CREATE EXTERNAL TABLE leak STORED AS CSV LOCATION '{}'",
            external.display()
        ),
        "CREATE TABLE t AS SELECT * FROM spans".to_string(),
        "CREATE VIEW v AS SELECT 1".to_string(),
        "SELECT * INTO t2 FROM spans".to_string(),
        "SET datafusion.execution.batch_size = 1".to_string(),
        "EXPLAIN SELECT * FROM spans".to_string(),
        "SHOW TABLES".to_string(),
    ];
    for sql in &statements {
        let e = fails(&engine, sql).await;
        assert_eq!(
            e.code(),
            Code::ForbiddenStatement,
            "{sql}: {}",
            e.envelope()
        );
        assert!(e.message().contains("read-only"), "{sql}: {}", e.message());
        assert_eq!(e.envelope()["error"]["class"], "permission");
    }
    assert!(!target.exists(), "COPY wrote a file");
    assert_eq!(std::fs::read_dir(&external).expect("dir").count(), 0);
    // The tables are still there and unchanged.
    assert_eq!(
        crate::common::scalar(&engine, "SELECT count(*) FROM calls").await,
        "2"
    );
    assert!(engine.sql("SELECT * FROM t2").await.is_err());
}

#[tokio::test]
async fn several_statements_are_refused() {
    let (_dir, _table, engine) = engine_with_retries().await;
    let e = fails(&engine, "SELECT 1; DROP TABLE spans").await;
    assert_eq!(e.code(), Code::InvalidQuery);
    assert!(e.message().contains("one statement"), "{}", e.message());
}

#[tokio::test]
async fn invalid_queries_are_explained_without_internals() {
    let (_dir, _table, engine) = engine_with_retries().await;
    let e = fails(&engine, "SELECT tool, count(*) FROM spans").await;
    assert_eq!(e.code(), Code::InvalidQuery);
    assert!(e.message().contains("GROUP BY"), "{}", e.message());
    let e = fails(&engine, "SELECT lenn(tool) FROM spans").await;
    assert_eq!(e.code(), Code::InvalidQuery);
    assert!(e.message().contains("`lenn`"), "{}", e.message());
    let e = fails(
        &engine,
        "SELECT count(*) FROM spans WHERE regexp_like(tool, '(')",
    )
    .await;
    assert_eq!(e.code(), Code::InvalidQuery);
    assert!(
        e.message().contains("regular expression"),
        "{}",
        e.message()
    );
    let e = fails(
        &engine,
        "SELECT * FROM spans s JOIN calls c ON s.trace_id = c.trace_id WHERE tool = 'x'",
    )
    .await;
    assert_eq!(e.code(), Code::InvalidQuery);
    assert!(
        e.message().contains("`tool` is ambiguous"),
        "{}",
        e.message()
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
