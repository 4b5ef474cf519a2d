//! The query service's own metrics (`GET /metrics`, dashboards/METRICS.md "Query service
//! self-metrics"): a server of its own over the demo table, with a token, so that the counts
//! are exactly what this test did.

use std::sync::Mutex;

use serde_json::{json, Value};

use super::psql::{psql_bin, psql_c};
use super::{demo, QueryServer, PASSWORD, USER};
use crate::kafka_ingest::metric as value;
use crate::support::start_query;

const TOKEN: &str = "metrics-test-token-3f9a";

/// The exposition; `/metrics` needs no token.
async fn scrape(base: &str) -> String {
    let r = reqwest::get(format!("{base}/metrics"))
        .await
        .expect("GET /metrics");
    assert_eq!(r.status().as_u16(), 200, "/metrics without a token");
    let ct = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    assert!(ct.starts_with("text/plain"), "content type {ct}");
    r.text().await.expect("body")
}

async fn post_sql(base: &str, token: Option<&str>, sql: &str) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .post(format!("{base}/api/v1/sql"))
        .header("content-type", "application/json")
        .body(json!({ "sql": sql }).to_string());
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.expect("POST");
    let status = r.status().as_u16();
    let text = r.text().await.expect("body");
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[tokio::test]
async fn metrics_count_each_statement_once_by_outcome_over_http_and_postgres() {
    let (child, http, pg) = start_query(&demo().dir, USER, PASSWORD, &["--token", TOKEN]);
    let server = QueryServer {
        child: Mutex::new(child),
        http,
        pg,
    };
    let base = server.base();
    // start_query's readiness probe opened and closed one Postgres connection; the server
    // counts it when its accept loop gets to it, which on a busy machine can be after this
    // first scrape. Wait until it is counted, so the deltas below are this test's own.
    let mut before = scrape(&base).await;
    for _ in 0..100 {
        if value(&before, "toolspan_query_pg_connections_total") >= 1.0
            && value(&before, "toolspan_query_pg_connections_open") == 0.0
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        before = scrape(&base).await;
    }
    assert_eq!(
        value(&before, "toolspan_query_pg_connections_total"),
        1.0,
        "the readiness probe, and nothing else, before this test's clients:\n{before}"
    );
    for outcome in [
        "ok",
        "sql_syntax",
        "query_timeout",
        "overloaded",
        "store_unavailable",
    ] {
        let series = format!("toolspan_query_statements_total{{outcome=\"{outcome}\"}}");
        assert!(
            before.lines().any(|l| l.starts_with(&series)),
            "{series} exists from startup:\n{before}"
        );
    }

    // Over HTTP: one statement with 5 rows, one that does not parse, one without the token.
    let (status, body) = post_sql(&base, Some(TOKEN), "SELECT span_id FROM spans LIMIT 5").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["rows"].as_array().map(Vec::len), Some(5));
    let (status, body) = post_sql(&base, Some(TOKEN), "SELEC span_id FROM spans").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("sql_syntax")),
        "{body}"
    );
    let (status, _) = post_sql(&base, None, "SELECT 1").await;
    assert_eq!(status, 401);
    // Over the Postgres protocol: one statement with one row, and a login refused.
    let out = psql_c(&server, "SELECT count(*) FROM spans");
    assert_eq!(out.rows().len(), 1, "{}", out.stdout());
    let wrong = std::process::Command::new(psql_bin())
        .args(["-X", "-h", "127.0.0.1", "-p", &server.pg.to_string()])
        .args(["-U", USER, "-d", "toolspan", "-c", "SELECT 1"])
        .env("PGPASSWORD", "not-the-password")
        .env("PGSSLMODE", "disable")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("psql");
    assert!(!wrong.status.success(), "a wrong password is refused");
    // A path no route serves.
    let r = reqwest::get(format!("{base}/no/such/page"))
        .await
        .expect("GET");
    assert_eq!(r.status().as_u16(), 404);

    // Both clients have exited; the server notices their connections close.
    let mut after = scrape(&base).await;
    for _ in 0..50 {
        if value(&after, "toolspan_query_pg_connections_open") == 0.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        after = scrape(&base).await;
    }
    let delta = |series: &str| value(&after, series) - value(&before, series);
    assert_eq!(delta("toolspan_query_pg_connections_total"), 2.0, "{after}");
    assert_eq!(delta("toolspan_query_pg_auth_failures_total"), 1.0);
    assert_eq!(value(&after, "toolspan_query_pg_connections_open"), 0.0);
    assert_eq!(
        delta("toolspan_query_statements_total{outcome=\"ok\"}"),
        2.0,
        "{after}"
    );
    assert_eq!(
        delta("toolspan_query_statements_total{outcome=\"sql_syntax\"}"),
        1.0
    );
    assert_eq!(delta("toolspan_query_statement_seconds_count"), 3.0);
    assert_eq!(delta("toolspan_query_rows_total"), 6.0);
    let sql_route = |status: u16| {
        format!("toolspan_query_http_requests_total{{route=\"/api/v1/sql\",status=\"{status}\"}}")
    };
    assert_eq!(delta(&sql_route(200)), 1.0, "{after}");
    assert_eq!(delta(&sql_route(400)), 1.0);
    assert_eq!(delta(&sql_route(401)), 1.0);
    assert_eq!(
        delta("toolspan_query_http_requests_total{route=\"unmatched\",status=\"404\"}"),
        1.0
    );
    assert_eq!(
        delta("toolspan_query_http_request_seconds_count{route=\"/api/v1/sql\"}"),
        3.0
    );
    // The gauges agree with readiness, which reads the same service.
    let ready = reqwest::get(format!("{base}/readyz"))
        .await
        .expect("GET /readyz")
        .text()
        .await
        .expect("body");
    let ready: Value = serde_json::from_str(&ready).expect("JSON");
    let version = ready["table_version"].as_f64().expect("table_version");
    assert!(version >= 1.0, "{ready}");
    assert_eq!(value(&after, "toolspan_query_table_version"), version);
    assert_eq!(
        value(&after, "toolspan_query_slots"),
        ready["query_slots"].as_f64().expect("query_slots")
    );
    // Counts only: neither the token, the Postgres password nor a value of the table.
    for secret in [TOKEN, PASSWORD] {
        assert!(!after.contains(secret), "/metrics shows a secret");
    }
    assert!(!after.contains("SELEC"), "/metrics shows statement text");
}
