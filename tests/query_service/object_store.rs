//! The table on S3-compatible object storage (moto's server, `crate::s3_support`): written by
//! `toolspan demo`, read by two stateless `toolspan query` replicas over HTTP and the Postgres
//! wire (every dashboard panel), by `toolspan sql`, and by an independent Delta reader (the
//! Python `deltalake` package); no credential in any log, error or metrics page.

use std::process::{Child, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::s3_support::{assert_no_credentials, python_with, S3Server};
use crate::support::free_port;

use super::grafana::dashboard_panels;
use super::psql::{psql_bin, psql_c};
use super::{QueryServer, PASSWORD, USER};

/// `toolspan query --data-dir <s3 prefix>` with the server's environment, debug logs to `log`.
fn start_replica(s3: &S3Server, data: &str, log: &std::path::Path) -> QueryServer {
    let (http, pg) = (free_port(), free_port());
    let file = std::fs::File::create(log).expect("log");
    let mut child: Child = s3
        .toolspan()
        .args(["query", "--log", "debug", "--data-dir", data])
        .args(["--http-addr", &format!("127.0.0.1:{http}")])
        .args(["--pg-addr", &format!("127.0.0.1:{pg}")])
        .env("TOOLSPAN_PG_USER", USER)
        .env("TOOLSPAN_PG_PASSWORD", PASSWORD)
        .env_remove("TOOLSPAN_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file)
        .spawn()
        .expect("start toolspan query");
    let deadline = Instant::now() + Duration::from_secs(120);
    for port in [http, pg] {
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "toolspan query on S3 exited ({status}):\n{}",
                    std::fs::read_to_string(log).unwrap_or_default()
                );
            }
            assert!(Instant::now() < deadline, "query replica did not listen");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    QueryServer {
        child: Mutex::new(child),
        http,
        pg,
    }
}

impl Drop for QueryServer {
    fn drop(&mut self) {
        let mut c = self.child.lock().unwrap_or_else(|e| e.into_inner());
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// `POST /api/v1/sql` as JSON rows.
fn http_sql(server: &QueryServer, sql: &str) -> (u16, String) {
    let body = serde_json::json!({ "sql": sql }).to_string();
    crate::support::post_json(&format!("{}/api/v1/sql", server.base()), body)
}

#[test]
fn a_table_on_s3_is_read_alike_by_two_query_replicas_every_panel_and_an_independent_reader() {
    psql_bin(); // fail first, with the install hint, when psql is missing
    let s3 = S3Server::start();
    let dir = tempfile::tempdir().expect("dir");
    let data = s3.uri("demo");

    // Written by the demo (embedded receiver, its writer and the metrics endpoint on S3).
    let metrics_port = free_port();
    let demo_log = dir.path().join("demo.log");
    let mut demo = s3
        .toolspan()
        .args(["demo", "--duration", "10", "--runs-per-second", "40"])
        .args(["--log", "debug", "--no-viewer", "--data-dir", &data])
        .args(["--otlp-addr", &format!("127.0.0.1:{}", free_port())])
        .args(["--metrics-addr", &format!("127.0.0.1:{metrics_port}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&demo_log).expect("log"))
        .spawn()
        .expect("start toolspan demo");
    // Its /metrics while it runs.
    let mut metrics = String::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_secs(2));
        metrics = crate::kafka_support::reqwest::blocking_get(&format!(
            "http://127.0.0.1:{metrics_port}/metrics"
        ));
        if metrics.contains("toolspan_") {
            break;
        }
    }
    let status = demo.wait().expect("demo");
    let demo_text = std::fs::read_to_string(&demo_log).unwrap_or_default();
    assert!(status.success(), "demo on S3 failed:\n{demo_text}");
    assert!(metrics.contains("toolspan_"), "the demo served /metrics");
    assert!(
        s3.request_log().contains(&format!(
            "PUT /{}/demo/spans/_delta_log/",
            crate::s3_support::BUCKET
        )),
        "the table's log went to the S3 server"
    );

    let total = s3.count(&data, "SELECT count(*) FROM spans");
    assert!(total > 1_000, "the demo wrote spans to S3: {total}");

    // Two stateless replicas answer the same, over HTTP and over the Postgres wire.
    let logs = [dir.path().join("q1.log"), dir.path().join("q2.log")];
    let replicas = [
        start_replica(&s3, &data, &logs[0]),
        start_replica(&s3, &data, &logs[1]),
    ];
    let probe = "SELECT tool, stage, error_type, count(*) AS n FROM spans GROUP BY 1, 2, 3 ORDER BY 1, 2, 3";
    let mut answers = Vec::new();
    for r in &replicas {
        let (status, body) = http_sql(r, "SELECT count(*) AS n FROM spans");
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(
            v["rows"][0]["n"].as_i64(),
            Some(total),
            "HTTP count: {body}"
        );
        let p = psql_c(r, probe);
        assert!(p.ok(), "psql: {}", p.stderr());
        answers.push(p.rows());
    }
    assert!(!answers[0].is_empty());
    assert_eq!(answers[0], answers[1], "both replicas answer the same");

    // A replica keeps the Parquet data it read (the data cache): the same search again reads
    // no data file from the store, only (at most) the log for a newer version.
    let search = "SELECT service, error_code, count(*) AS n FROM spans \
                  WHERE status = 'error' GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2";
    let data_reads = || {
        s3.request_log()
            .lines()
            .filter(|l| l.contains("GET /") && l.contains(".parquet"))
            .count()
    };
    let (status, first) = http_sql(&replicas[0], search);
    assert_eq!(status, 200, "{first}");
    // moto writes a request's log line just after answering it.
    std::thread::sleep(Duration::from_millis(500));
    let before = data_reads();
    assert!(before > 0, "the first run read data files");
    let (status, again) = http_sql(&replicas[0], search);
    assert_eq!(status, 200, "{again}");
    assert_eq!(again, first, "the same answer");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        data_reads(),
        before,
        "the repeated search read data files again"
    );

    // Every SQL panel of the provisioned dashboards, on both replicas: same rows.
    let panels = dashboard_panels(&replicas[0]);
    for p in &panels {
        let a = psql_c(&replicas[0], &p.sql);
        let b = psql_c(&replicas[1], &p.sql);
        assert!(a.ok(), "panel {} on S3: {}\n{}", p.name, a.stderr(), p.sql);
        assert!(b.ok(), "panel {} on replica 2: {}", p.name, b.stderr());
        // As sets: a panel ordered by time alone may list one minute's rows in any order.
        let (mut ra, mut rb) = (a.rows(), b.rows());
        ra.sort();
        rb.sort();
        assert_eq!(ra, rb, "panel {} differs between replicas", p.name);
    }

    // An independent Delta reader (delta-rs's Python package, not toolspan's code path):
    // same row count, same columns. It reads through the package's own query engine
    // (`QueryBuilder`), not `to_pyarrow_table()`: with deltalake 1.6.6 and pyarrow 22 the
    // latter aborts the interpreter at exit about one run in fifteen ("terminate called
    // without an active exception", delta-io/delta-rs#2184), after a correct read.
    let code = format!(
        r#"
import json, os
from deltalake import DeltaTable, QueryBuilder
opts = {{"AWS_ENDPOINT_URL": os.environ["AWS_ENDPOINT_URL"], "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": os.environ["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": os.environ["AWS_SECRET_ACCESS_KEY"]}}
dt = DeltaTable("{data}/spans", storage_options=opts)
t = QueryBuilder().register("spans", dt).execute(
    "SELECT count(*) AS n, count(DISTINCT span_id) AS ids FROM spans").read_all()
print(json.dumps({{"rows": t.column("n")[0].as_py(), "ids": t.column("ids")[0].as_py(),
                  "columns": sorted(f.name for f in dt.schema().fields),
                  "partitions": dt.metadata().partition_columns}}))
"#
    );
    let py: serde_json::Value =
        serde_json::from_str(python_with(&s3, &code).trim()).expect("reader output");
    assert_eq!(
        py["rows"].as_i64(),
        Some(total),
        "Python deltalake row count"
    );
    assert_eq!(
        py["ids"].as_i64(),
        Some(s3.count(&data, "SELECT count(DISTINCT span_id) FROM spans")),
        "Python deltalake distinct span ids"
    );
    // toolspan's columns: the header of a CSV answer.
    let head = s3.sql_raw(&data, "csv", "SELECT * FROM spans LIMIT 1");
    assert!(
        head.status.success(),
        "{}",
        String::from_utf8_lossy(&head.stderr)
    );
    let mut ours: Vec<String> = String::from_utf8_lossy(&head.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .split(',')
        .map(str::to_string)
        .collect();
    ours.sort();
    let theirs: Vec<String> = py["columns"]
        .as_array()
        .expect("columns")
        .iter()
        .map(|v| v.as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(theirs, ours, "same columns");
    assert_eq!(
        py["partitions"],
        serde_json::json!(["tool", "stage", "date"])
    );

    // A failing command (a bucket that does not exist) errs cleanly, without credentials.
    let missing = s3.sql_raw("s3://no-such-bucket-here/x", "json", "SELECT 1");
    assert!(!missing.status.success());
    let err = String::from_utf8_lossy(&missing.stderr).into_owned();
    assert!(err.contains("error["), "an envelope: {err}");
    assert_no_credentials("an error envelope", &err);
    assert_no_credentials("the demo's debug log", &demo_text);
    assert_no_credentials("/metrics", &metrics);
    drop(replicas);
    for l in &logs {
        assert_no_credentials(
            "a query replica's debug log",
            &std::fs::read_to_string(l).unwrap_or_default(),
        );
    }
}
