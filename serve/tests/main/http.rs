//! The HTTP API through its router (tower `oneshot`): SQL in three formats, the SQL corpus
//! (`query/tests/sql`: every refused statement and SQL error), search, trace and reference
//! lookups over fleet traffic, errors, the token, the complexity guard and admission control.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{to_bytes, Body};
use axum::http::{header, Request, StatusCode};
use axum::Router;
use serde_json::{json, Value};
use tower::ServiceExt;

use toolspan_gen::{Fleet, FleetConfig};
use toolspan_query::service::QueryService;
use toolspan_query::{Engine, EngineOptions};
use toolspan_store::SpanTable;

use crate::common::{corpus_dir, retry_traces, table_with};
use crate::sql_corpus::{self, Runner};

/// The retry fixture (trace 4b4b…, reference err_7c1f9a) and 150 agent runs of fleet traffic
/// from the last ten minutes, each request through the real pipeline and one commit.
pub(crate) async fn fleet_table() -> (tempfile::TempDir, SpanTable) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos() as u64;
    let mut fleet = Fleet::new(FleetConfig {
        seed: 11,
        ..FleetConfig::default()
    });
    let mut reqs = vec![retry_traces()];
    for k in 0..3u64 {
        reqs.push(fleet.request(
            50,
            now - 600_000_000_000 + k * 120_000_000_000,
            60_000_000_000,
        ));
    }
    table_with(&reqs).await
}

pub(crate) async fn service_over(
    table: SpanTable,
    options: EngineOptions,
    slots: usize,
) -> Arc<QueryService> {
    let engine = Engine::with_table(table, options).await.expect("engine");
    Arc::new(QueryService::new(Arc::new(engine), slots))
}

pub(crate) async fn app_with(token: Option<&str>) -> (tempfile::TempDir, Router) {
    let (dir, table) = fleet_table().await;
    let service = service_over(table, EngineOptions::default(), 4).await;
    (
        dir,
        toolspan_serve::http::router(service, token.map(str::to_string)),
    )
}

pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    content_type: String,
    headers: axum::http::HeaderMap,
    pub(crate) body: Vec<u8>,
}

impl Reply {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    /// The envelope's code, after checking the envelope has exactly its five fields and the
    /// status matches the code.
    pub(crate) fn code(&self) -> String {
        let v = self.json();
        let err = v["error"]
            .as_object()
            .unwrap_or_else(|| panic!("no envelope: {v}"));
        let mut keys: Vec<&str> = err.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            ["class", "code", "message", "reference", "retryable"],
            "{v}"
        );
        let code = err["code"].as_str().expect("code").to_string();
        let msg = err["message"].as_str().expect("message");
        for bad in [
            "DataFusion",
            "datafusion",
            "/tmp",
            "Projection:",
            "delta",
            "panicked",
        ] {
            assert!(!msg.contains(bad), "message leaks {bad:?}: {msg}");
        }
        code
    }
}

async fn send(app: &Router, req: Request<Body>) -> Reply {
    let resp = app.clone().oneshot(req).await.expect("router answers");
    let status = resp.status();
    let headers = resp.headers().clone();
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = to_bytes(resp.into_body(), usize::MAX)
        .await
        .expect("body")
        .to_vec();
    Reply {
        status,
        content_type,
        headers,
        body,
    }
}

pub(crate) async fn get(app: &Router, uri: &str) -> Reply {
    send(app, Request::get(uri).body(Body::empty()).expect("request")).await
}

pub(crate) async fn sql_with(app: &Router, sql: &str, accept: &str) -> Reply {
    let req = Request::post("/api/v1/sql")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, accept)
        .body(Body::from(json!({ "sql": sql }).to_string()))
        .expect("request");
    send(app, req).await
}

pub(crate) async fn sql(app: &Router, sql: &str) -> Reply {
    sql_with(app, sql, "application/json").await
}

pub(crate) fn rows(reply: &Reply) -> Vec<Value> {
    assert_eq!(
        reply.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    reply.json()["rows"].as_array().expect("rows").clone()
}

pub(crate) async fn count(app: &Router, q: &str) -> i64 {
    let r = rows(&sql(app, q).await);
    r[0].as_object()
        .expect("row")
        .values()
        .next()
        .and_then(Value::as_i64)
        .expect("a number")
}

#[tokio::test]
async fn sql_answers_json_csv_and_arrow() {
    let (_dir, app) = app_with(None).await;
    let q =
        "SELECT tool, count(*) AS n FROM spans WHERE stage = 'call' GROUP BY tool ORDER BY tool";
    let reply = sql(&app, q).await;
    assert!(reply.content_type.starts_with("application/json"));
    let v = reply.json();
    assert_eq!(
        v["columns"],
        json!([{"name": "tool", "type": "text"}, {"name": "n", "type": "bigint"}])
    );
    let tools: Vec<&str> = v["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| r["tool"].as_str().expect("tool"))
        .collect();
    assert!(
        tools.contains(&"search_docs") && tools.contains(&"fetch_page"),
        "{tools:?}"
    );
    assert_eq!(v["row_count"], tools.len());

    let csv = sql_with(&app, q, "text/csv").await;
    assert_eq!(csv.status, StatusCode::OK);
    assert!(csv.content_type.starts_with("text/csv"));
    let text = String::from_utf8(csv.body).expect("utf-8");
    assert!(text.starts_with("tool,n\n"), "{text}");
    assert_eq!(text.lines().count(), tools.len() + 1);

    let arrow = sql_with(&app, q, "application/vnd.apache.arrow.stream").await;
    assert_eq!(arrow.status, StatusCode::OK);
    assert_eq!(arrow.content_type, "application/vnd.apache.arrow.stream");
    let reader = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(arrow.body), None)
        .expect("an Arrow IPC stream");
    assert_eq!(reader.schema().field(0).name(), "tool");
    let n: usize = reader.map(|b| b.expect("batch").num_rows()).sum();
    assert_eq!(n, tools.len());

    // An empty result keeps its columns.
    let empty = sql(&app, "SELECT tool FROM spans WHERE false").await.json();
    assert_eq!(empty["rows"], json!([]));
    assert_eq!(empty["columns"][0]["name"], "tool");
}

/// The SQL corpus (`query/tests/sql`) through `POST /api/v1/sql`: every case has its status,
/// envelope, class and message; after each the server keeps answering and nothing changed.
#[tokio::test]
async fn the_sql_corpus_through_http_has_its_statuses_and_writes_nothing() {
    let (dir, app) = app_with(None).await;
    let before = count(&app, "SELECT count(*) FROM spans").await;
    let target = dir.path().join("copied.csv");
    let external = dir.path().join("external");
    std::fs::create_dir_all(&external).expect("dir");
    let cases = sql_corpus::load(
        &corpus_dir(),
        Runner::Http,
        &[
            ("copy_target", target.to_str().expect("utf-8 temp path")),
            ("external_dir", external.to_str().expect("utf-8 temp path")),
        ],
    );
    for case in &cases {
        let r = sql(&app, &case.sql).await;
        let body = String::from_utf8_lossy(&r.body).into_owned();
        assert_eq!(
            r.status.as_u16(),
            case.http_status(),
            "{}: {body}",
            case.name()
        );
        if let Some(code) = case.code() {
            assert_eq!(r.code(), code, "{}", case.name());
            let v = r.json();
            assert_eq!(
                v["error"]["class"].as_str(),
                case.class(),
                "{}",
                case.name()
            );
            assert_eq!(v["error"]["retryable"], false, "{}", case.name());
            case.check_message(v["error"]["message"].as_str().expect("message"), &body);
        }
        // The server keeps answering, and nothing changed.
        assert_eq!(get(&app, "/healthz").await.status, StatusCode::OK);
        assert_eq!(
            count(&app, "SELECT count(*) FROM spans").await,
            before,
            "after {}",
            case.name()
        );
    }
    assert!(!target.exists(), "COPY wrote a file");
    assert_eq!(std::fs::read_dir(&external).expect("dir").count(), 0);
    assert_eq!(
        count(&app, "SELECT count(*) FROM calls WHERE tool = 'fetch_page'").await,
        1
    );
}

#[tokio::test]
async fn errors_are_envelopes_with_their_statuses() {
    // The SQL errors and their statuses are in the corpus (above); these are the API's own.
    let (_dir, app) = app_with(None).await;
    let bad_bodies = [
        "not json",
        "{\"query\": \"SELECT 1\"}",
        "{\"sql\": 5}",
        "{\"sql\": \"  \"}",
    ];
    for body in bad_bodies {
        let req = Request::post("/api/v1/sql")
            .body(Body::from(body))
            .expect("request");
        let r = send(&app, req).await;
        assert_eq!(
            (r.status, r.code().as_str()),
            (StatusCode::BAD_REQUEST, "invalid_argument"),
            "{body}"
        );
    }
    let big = json!({"sql": format!("SELECT '{}'", "x".repeat(2 << 20))}).to_string();
    let r = send(
        &app,
        Request::post("/api/v1/sql")
            .body(Body::from(big))
            .expect("request"),
    )
    .await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large")
    );

    let r = get(&app, "/api/v1/nothing").await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (StatusCode::NOT_FOUND, "not_found")
    );
    // A wrong method is HTTP's 405, with the envelope (it was a 400 before the hardening).
    let r = get(&app, "/api/v1/sql").await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (StatusCode::METHOD_NOT_ALLOWED, "invalid_argument")
    );
}

#[tokio::test]
async fn complexity_guard_refuses_huge_expressions_and_the_server_keeps_answering() {
    let (_dir, app) = app_with(None).await;
    let or_chain = format!(
        "SELECT count(*) FROM spans WHERE {}",
        (0..10_000)
            .map(|i| format!("attempt = {i}"))
            .collect::<Vec<_>>()
            .join(" OR ")
    );
    let sum = format!("SELECT {} AS s", vec!["duration_ms"; 5_000].join(" + "));
    let nested = format!("SELECT {}1{} AS x", "(".repeat(5_000), ")".repeat(5_000));
    for q in [&or_chain, &sum, &nested] {
        let r = sql(&app, q).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        let code = r.code();
        assert!(code == "invalid_query" || code == "sql_syntax", "{code}");
        assert!(
            r.json()["error"]["message"]
                .as_str()
                .expect("message")
                .contains("too complex")
                || code == "sql_syntax"
        );
    }
    // The largest accepted chain plans and runs (no stack overflow on a runtime thread).
    let near_limit = format!(
        "SELECT count(*) AS n FROM spans WHERE {}",
        (0..480)
            .map(|i| format!("attempt = {i}"))
            .collect::<Vec<_>>()
            .join(" OR ")
    );
    assert!(count(&app, &near_limit).await > 0);
    assert_eq!(get(&app, "/healthz").await.status, StatusCode::OK);
}

#[tokio::test]
async fn search_builds_safe_sql_and_returns_it() {
    let (_dir, app) = app_with(None).await;
    let r = get(
        &app,
        "/api/v1/search?stage=call,attempt&status=error&since=1h&limit=500",
    )
    .await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    let v = r.json();
    let sql_text = v["sql"].as_str().expect("sql");
    assert!(
        sql_text.contains("stage IN ('call', 'attempt')") && sql_text.contains("status = 'error'"),
        "{sql_text}"
    );
    let rows = v["rows"].as_array().expect("rows");
    assert!(
        !rows.is_empty(),
        "fleet traffic has failed calls in the last hour"
    );
    for row in rows {
        assert!(["call", "attempt"].contains(&row["stage"].as_str().expect("stage")));
        assert_eq!(row["status"], "error");
    }
    // Newest first (compared as times: the text drops trailing zeros of the fraction, so
    // "…01.123Z" sorts after "…01.123456Z" as a string).
    let times: Vec<chrono::DateTime<chrono::FixedOffset>> = rows
        .iter()
        .map(|r| {
            let t = r["start_time"].as_str().expect("time");
            chrono::DateTime::parse_from_rfc3339(t).unwrap_or_else(|e| panic!("{t}: {e}"))
        })
        .collect();
    assert!(
        times.windows(2).all(|w| w[0] >= w[1]),
        "ordered newest first: {times:?}"
    );

    // The fixture's fetch_page failures are from 2025, outside the last hour, inside a range.
    let old = get(
        &app,
        "/api/v1/search?tool=fetch_page&error_type=tool_error&stage=execute",
    )
    .await;
    assert_eq!(rows_of(&old).len(), 3);
    let ranged = get(&app, "/api/v1/search?tool=fetch_page&since=2025-06-01T12:00:00Z&until=2025-06-01T12:00:01.200Z&stage=attempt").await;
    assert_eq!(rows_of(&ranged).len(), 2, "attempts starting before 1.2 s");
    let recent = get(&app, "/api/v1/search?tool=fetch_page&since=1h").await;
    assert_eq!(rows_of(&recent).len(), 0);
    let text = get(
        &app,
        "/api/v1/search?text=FAILED&tool=search_docs&since=2025-01-01",
    )
    .await;
    assert!(!rows_of(&text).is_empty());
    let limited = get(&app, "/api/v1/search?limit=3").await;
    assert_eq!(rows_of(&limited).len(), 3);
    let by_service = get(&app, "/api/v1/search?service=agent-svc&limit=10000").await;
    assert_eq!(rows_of(&by_service).len(), 15, "the fixture's 15 spans");

    // A quote cannot widen the search.
    let injected = get(&app, "/api/v1/search?tool=x%27%20OR%20%271%27%3D%271").await;
    assert_eq!(rows_of(&injected).len(), 0);
    assert!(injected.json()["sql"]
        .as_str()
        .expect("sql")
        .contains("tool = 'x'' OR ''1''=''1'"));

    for bad in [
        "/api/v1/search?stage=sned",
        "/api/v1/search?error_type=BOGUS",
        "/api/v1/search?status=failed",
        "/api/v1/search?since=yesterday",
        "/api/v1/search?limit=0",
        "/api/v1/search?limit=lots",
        "/api/v1/search?colour=red",
    ] {
        let r = get(&app, bad).await;
        assert_eq!(
            (r.status, r.code().as_str()),
            (StatusCode::BAD_REQUEST, "invalid_argument"),
            "{bad}"
        );
    }
}

fn rows_of(r: &Reply) -> Vec<Value> {
    assert_eq!(
        r.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    r.json()["rows"].as_array().expect("rows").clone()
}

#[tokio::test]
async fn bearer_token_guards_the_api_but_not_health() {
    let (_dir, app) = app_with(Some("s3cret-token")).await;
    let r = sql(&app, "SELECT 1").await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (StatusCode::UNAUTHORIZED, "unauthorized")
    );
    assert!(r.headers.get(header::WWW_AUTHENTICATE).is_some());
    let wrong = Request::get("/api/v1/search")
        .header(header::AUTHORIZATION, "Bearer nope")
        .body(Body::empty())
        .expect("request");
    let r = send(&app, wrong).await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (StatusCode::UNAUTHORIZED, "unauthorized")
    );
    let right = Request::get("/api/v1/search?limit=1")
        .header(header::AUTHORIZATION, "Bearer s3cret-token")
        .body(Body::empty())
        .expect("request");
    assert_eq!(send(&app, right).await.status, StatusCode::OK);
    assert_eq!(get(&app, "/healthz").await.status, StatusCode::OK);
    assert_eq!(get(&app, "/readyz").await.status, StatusCode::OK);
    assert_eq!(
        get(&app, "/api/v1/openapi.json").await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn health_readiness_and_the_openapi_document() {
    let (_dir, app) = app_with(None).await;
    assert_eq!(get(&app, "/healthz").await.json(), json!({"status": "ok"}));
    let ready = get(&app, "/readyz").await.json();
    assert_eq!(ready["status"], "ready");
    assert!(ready["table_version"].as_u64().is_some(), "{ready}");
    let doc = get(&app, "/api/v1/openapi.json").await.json();
    // The document describes exactly the routes the router mounts (all but the viewer's
    // pages), method by method: the list comes from the router's own construction.
    let mounted: std::collections::BTreeSet<(String, String)> =
        toolspan_serve::http::documented_routes()
            .into_iter()
            .map(|(m, p)| (m.to_string(), p.to_string()))
            .collect();
    let described: std::collections::BTreeSet<(String, String)> = doc["paths"]
        .as_object()
        .expect("paths")
        .iter()
        .flat_map(|(p, ops)| {
            ops.as_object()
                .expect("operations")
                .keys()
                .filter(|m| ["get", "post", "put", "delete", "patch"].contains(&m.as_str()))
                .map(move |m| (m.clone(), p.clone()))
        })
        .collect();
    assert_eq!(
        mounted.difference(&described).collect::<Vec<_>>(),
        Vec::<&(String, String)>::new(),
        "routes the OpenAPI document does not describe"
    );
    assert_eq!(
        described.difference(&mounted).collect::<Vec<_>>(),
        Vec::<&(String, String)>::new(),
        "routes the OpenAPI document describes that are not mounted"
    );
    assert!(mounted.len() >= 20, "{mounted:?}");
    assert!(doc["components"]["schemas"]["ErrorEnvelope"].is_object());
}

/// A query that runs until its timeout: a filtered hundred-billion-row cross join (the
/// filter keeps the optimizer from answering from row-count statistics).
const HEAVY: &str =
    "SELECT count(*) FROM generate_series(1, 1000000) a, generate_series(1, 100000) b \
                     WHERE (a.value + b.value) % 7 = 3";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heavy_query_does_not_starve_the_others() {
    let (_dir, table) = fleet_table().await;
    let options = EngineOptions {
        query_timeout: Duration::from_secs(20),
        ..EngineOptions::default()
    };
    let service = service_over(table, options, 4).await;
    let app = toolspan_serve::http::router(service.clone(), None);
    let heavy = {
        let app = app.clone();
        tokio::spawn(async move { sql(&app, HEAVY).await })
    };
    while service.running() == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Light queries complete while the heavy one still runs.
    for _ in 0..3 {
        assert!(count(&app, "SELECT count(*) FROM calls").await > 0);
        assert_eq!(
            get(&app, "/api/v1/traces/4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b")
                .await
                .status,
            StatusCode::OK
        );
    }
    assert!(!heavy.is_finished(), "the heavy query is still running");
    heavy.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_beyond_the_slots_wait_then_fail_as_overloaded() {
    let (_dir, table) = fleet_table().await;
    let options = EngineOptions {
        query_timeout: Duration::from_secs(20),
        ..EngineOptions::default()
    };
    let engine = Engine::with_table(table, options).await.expect("engine");
    let service = Arc::new(
        QueryService::new(Arc::new(engine), 1).with_queue_wait(Duration::from_millis(300)),
    );
    let app = toolspan_serve::http::router(service.clone(), None);
    let heavy = {
        let app = app.clone();
        tokio::spawn(async move { sql(&app, HEAVY).await })
    };
    while service.running() == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let r = sql(&app, "SELECT 1").await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (StatusCode::TOO_MANY_REQUESTS, "overloaded")
    );
    assert_eq!(r.json()["error"]["retryable"], true);
    assert!(r.headers.get(header::RETRY_AFTER).is_some());
    heavy.abort();
}

#[tokio::test]
async fn timeouts_have_their_status() {
    let (_dir, table) = fleet_table().await;
    let options = EngineOptions {
        query_timeout: Duration::from_millis(200),
        ..EngineOptions::default()
    };
    let service = service_over(table, options, 4).await;
    let app = toolspan_serve::http::router(service, None);
    let r = sql(&app, HEAVY).await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (StatusCode::GATEWAY_TIMEOUT, "query_timeout")
    );
    assert!(count(&app, "SELECT count(*) FROM calls").await > 0);
}

/// A result larger than the memory limit is not refused: it streams, one batch in flight.
#[tokio::test]
async fn results_larger_than_the_memory_limit_stream_within_it() {
    let (_dir, table) = fleet_table().await;
    let options = EngineOptions {
        memory_limit: Some(256 << 10),
        ..EngineOptions::default()
    };
    let service = service_over(table, options, 4).await;
    let app = toolspan_serve::http::router(service, None);
    let r = sql(
        &app,
        "SELECT trace_id, name, input, output, attributes, events FROM spans",
    )
    .await;
    assert!(r.body.len() > 256 << 10, "{} bytes", r.body.len());
    let n = count(&app, "SELECT count(*) FROM spans").await;
    assert!(n > 1_000);
    assert_eq!(rows(&r).len() as i64, n);
}
