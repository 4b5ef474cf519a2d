//! Results and memory: a result larger than the memory limit streams within it in every HTTP
//! format, a client that does not read stops its query, all running queries share one memory
//! pool, and regular expressions too large to compile against a column are the caller's error.

use std::time::{Duration, Instant};

use axum::body::{Body, HttpBody};
use axum::http::{header, Request, StatusCode};
use serde_json::{json, Value};
use tower::ServiceExt;

use toolspan_query::service::QueryService;
use toolspan_query::EngineOptions;

use crate::common::table_with;
use crate::http::{fleet_table, get, service_over, sql, sql_with};

/// One million rows: 8 MB as Arrow, ~18 MB as JSON, twice the memory limit below.
const MILLION: &str = "SELECT value FROM generate_series(1, 1000000)";

/// Bytes reserved in the memory pool all queries of `service` share.
fn reserved(service: &QueryService) -> usize {
    service
        .engine()
        .context()
        .runtime_env()
        .memory_pool
        .reserved()
}

fn limited(bytes: usize) -> EngineOptions {
    EngineOptions {
        memory_limit: Some(bytes),
        ..EngineOptions::default()
    }
}

#[tokio::test]
async fn a_result_larger_than_the_memory_limit_streams_within_it_in_every_format() {
    let (_dir, table) = table_with(&[]).await;
    let service = service_over(table, limited(4 << 20), 4).await;
    let app = toolspan_serve::http::router(service.clone(), None);

    let reply = sql(&app, MILLION).await;
    assert_eq!(
        reply.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&reply.body[..reply.body.len().min(500)])
    );
    let v = reply.json();
    // The documented shape: columns, rows, row_count.
    assert_eq!(v["columns"], json!([{"name": "value", "type": "bigint"}]));
    assert_eq!(v["row_count"], 1_000_000);
    let rows = v["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 1_000_000);
    assert_eq!(rows[0], json!({"value": 1}));
    assert_eq!(rows[999_999], json!({"value": 1_000_000}));

    let csv = sql_with(&app, MILLION, "text/csv").await;
    assert_eq!(csv.status, StatusCode::OK);
    let text = String::from_utf8(csv.body).expect("utf-8");
    assert!(text.starts_with("value\n1\n2\n"), "{}", &text[..20]);
    assert_eq!(text.lines().count(), 1_000_001);

    let arrow = sql_with(&app, MILLION, "application/vnd.apache.arrow.stream").await;
    assert_eq!(arrow.status, StatusCode::OK);
    let reader = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(arrow.body), None)
        .expect("an Arrow IPC stream");
    let n: usize = reader.map(|b| b.expect("batch").num_rows()).sum();
    assert_eq!(n, 1_000_000);

    // Every reservation was given back.
    assert_eq!(reserved(&service), 0);
}

#[tokio::test]
async fn a_client_that_does_not_read_stops_its_query_and_holds_little_memory() {
    let (_dir, table) = table_with(&[]).await;
    let service = service_over(table, limited(64 << 20), 4).await;
    let app = toolspan_serve::http::router(service.clone(), None);
    let req = Request::post("/api/v1/sql")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(
            json!({"sql": "SELECT value FROM generate_series(1, 2000000)"}).to_string(),
        ))
        .expect("request");
    let resp = app.oneshot(req).await.expect("router answers");
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let first = std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx))
        .await
        .expect("a first chunk")
        .expect("no error");
    assert!(first.is_data());
    // Not read any further: the query waits for its reader instead of running to the end.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(service.running(), 1, "the query ran on without its reader");
    let held = reserved(&service);
    assert!(held <= 2 << 20, "{held} bytes held for an unread result");
    // The reader goes away: the query stops and gives its slot and its memory back.
    drop(body);
    let deadline = Instant::now() + Duration::from_secs(10);
    while service.running() > 0 || reserved(&service) > 0 {
        assert!(
            Instant::now() < deadline,
            "the abandoned query kept running"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn concurrent_results_share_one_memory_pool() {
    let (_dir, table) = table_with(&[]).await;
    // Each result is 4 MB: one fits in 10 MiB, four held at once do not.
    let service = service_over(table, limited(10 << 20), 4).await;
    let q = "SELECT value FROM generate_series(1, 500000)";
    let results = futures::future::join_all((0..4).map(|_| service.query(q))).await;
    let failed: Vec<String> = results
        .iter()
        .filter_map(|r| r.as_ref().err())
        .map(|e| e.code().as_str().to_string())
        .collect();
    assert!(
        !failed.is_empty(),
        "four 4 MB results held at once under a 10 MiB limit all succeeded"
    );
    assert!(
        failed.iter().all(|c| c == "resources_exhausted"),
        "{failed:?}"
    );
    let held = reserved(&service);
    assert!(held > 0 && held <= 10 << 20, "{held} bytes held");
    drop(results);
    assert_eq!(reserved(&service), 0);
}

const HUGE_REGEX: &str = "(((a{100}){100}){100}){100}";

#[tokio::test]
async fn over_large_regexes_against_a_column_are_the_callers_error() {
    let (_dir, table) = fleet_table().await;
    let service = service_over(table, EngineOptions::default(), 4).await;
    let app = toolspan_serve::http::router(service, None);
    for q in [
        format!("SELECT count(*) FROM spans WHERE name ~ '{HUGE_REGEX}'"),
        format!("SELECT count(*) FROM spans WHERE regexp_like(name, '{HUGE_REGEX}')"),
        format!("SELECT max(regexp_replace(name, '{HUGE_REGEX}', 'x')) FROM spans"),
        format!("SELECT count(*) FROM spans WHERE name SIMILAR TO '{HUGE_REGEX}'"),
        "SELECT count(*) FROM spans WHERE name ~ '(unclosed'".to_string(),
    ] {
        let r = sql(&app, &q).await;
        assert_eq!(
            (r.status, r.code().as_str()),
            (StatusCode::BAD_REQUEST, "invalid_query"),
            "{q}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let v = r.json();
        let message = v["error"]["message"].as_str().expect("message");
        assert!(message.contains("regular expression"), "{q}: {message}");
    }
    let q = format!("{{ name =~ \"{HUGE_REGEX}\" }}");
    let r = get(
        &app,
        &format!(
            "/api/search?q={}",
            url::form_urlencoded::byte_serialize(q.as_bytes()).collect::<String>()
        ),
    )
    .await;
    assert_eq!(
        r.status,
        StatusCode::BAD_REQUEST,
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    assert_eq!(r.json()["error"]["code"], "invalid_query");
}

#[tokio::test]
async fn traceql_with_too_many_spansets_says_so() {
    let (_dir, table) = table_with(&[]).await;
    let service = service_over(table, EngineOptions::default(), 4).await;
    let app = toolspan_serve::http::router(service, None);
    let q = vec!["{ status = error }"; 50].join(" && ");
    let r = get(
        &app,
        &format!(
            "/api/search?q={}",
            url::form_urlencoded::byte_serialize(q.as_bytes()).collect::<String>()
        ),
    )
    .await;
    assert_eq!(
        r.status,
        StatusCode::BAD_REQUEST,
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    let v: Value = r.json();
    assert_eq!(v["error"]["code"], "invalid_argument", "{v}");
    let message = v["error"]["message"].as_str().expect("message");
    assert!(message.contains("spansets"), "{message}");
    assert!(!message.contains("SQL"), "{message}");
}
