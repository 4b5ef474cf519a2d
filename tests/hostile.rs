//! Hostile input against the query front ends, in one process, as an attacker or a careless
//! dashboard would send it: statements that build huge plans, scalar functions that allocate
//! far more than their input, over-large regular expressions; Postgres clients that vanish
//! mid-query; and the HTTP listeners' own limits (header and body timeouts, long URIs,
//! unknown routes, the embedded query API's token).
//!
//! Every statement of [`corpus`] runs over HTTP and over the Postgres wire (the real `psql`)
//! against one `toolspan query`; each must be refused with its envelope, and the process
//! must still answer at the end, with its peak memory under twice its memory limit.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::{free_port, peak_rss_kib, python, start_query, Server};

mod ingest;

const USER: &str = "grafana";
const PASSWORD: &str = "hostile-test-pw";
const MEMORY_LIMIT_MB: u64 = 512;

/// A `toolspan query` on an empty table, killed on drop.
struct Query {
    child: Child,
    http: u16,
    pg: u16,
}

impl Query {
    fn start(dir: &Path, extra: &[&str]) -> Query {
        let limit = MEMORY_LIMIT_MB.to_string();
        let mut flags = vec!["--memory-limit-mb", limit.as_str()];
        flags.extend_from_slice(extra);
        let (child, http, pg) = start_query(dir, USER, PASSWORD, &flags);
        Query { child, http, pg }
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.http)
    }

    /// Peak resident memory (VmHWM) in MiB.
    fn peak_rss_mb(&self) -> u64 {
        peak_rss_kib(self.child.id()) / 1024
    }

    /// One statement through `psql`, sent on its standard input (long statements do not fit
    /// in an argument list).
    fn psql(&self, sql: &str) -> std::process::Output {
        let mut child = Command::new("psql")
            .args([
                "-X",
                "-h",
                "127.0.0.1",
                "-p",
                &self.pg.to_string(),
                "-U",
                USER,
            ])
            .args([
                "-d",
                "toolspan",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-v",
                "VERBOSITY=verbose",
            ])
            .args(["-f", "-"])
            .env("PGPASSWORD", PASSWORD)
            .env("PGCONNECT_TIMEOUT", "10")
            .env("PGSSLMODE", "disable")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run psql (scripts/test installs postgresql-client)");
        let mut stdin = child.stdin.take().expect("stdin");
        let text = format!("{sql};\n");
        let writer = std::thread::spawn(move || {
            let _ = stdin.write_all(text.as_bytes());
        });
        let out = child.wait_with_output().expect("psql ran");
        let _ = writer.join();
        out
    }
}

impl Drop for Query {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn post_sql(base: &str, sql: &str, timeout: Duration) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{base}/api/v1/sql"))
        .header("content-type", "application/json")
        .body(json!({ "sql": sql }).to_string())
        .timeout(timeout)
        .send()
        .await
        .unwrap_or_else(|e| {
            panic!(
                "POST /api/v1/sql failed ({e}) for {}",
                &sql[..sql.len().min(80)]
            )
        });
    let status = r.status().as_u16();
    let text = r.text().await.expect("body");
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}")),
    )
}

/// (name, statement, the code it must be refused with)
fn corpus() -> Vec<(&'static str, String, &'static str)> {
    let union = vec!["SELECT 1"; 4_000].join(" UNION ALL ");
    let mut cte_chain = String::from("WITH c0 AS (SELECT 1 AS x)");
    for i in 1..5_000 {
        cte_chain.push_str(&format!(", c{i} AS (SELECT x FROM c{})", i - 1));
    }
    cte_chain.push_str(" SELECT * FROM c4999");
    let mut doubling = String::from("WITH c0 AS (SELECT span_id FROM spans)");
    for i in 1..24 {
        doubling.push_str(&format!(
            ", c{i} AS (SELECT a.span_id FROM c{p} a JOIN c{p} b ON a.span_id = b.span_id)",
            p = i - 1
        ));
    }
    doubling.push_str(" SELECT count(*) FROM c23");
    let self_join = format!(
        "SELECT count(*) FROM spans s0 {}",
        (1..200)
            .map(|i| format!("JOIN spans s{i} ON s{i}.span_id = s0.span_id"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let comma_join = format!(
        "SELECT count(*) FROM {}",
        (0..200)
            .map(|i| format!("spans s{i}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    vec![
        ("4,000 UNION ALL branches", union, "invalid_query"),
        ("a chain of 5,000 CTEs", cte_chain, "invalid_query"),
        (
            "24 CTEs each reading the previous twice",
            doubling,
            "invalid_query",
        ),
        ("a 200-way self-join", self_join, "invalid_query"),
        ("a 200-way comma join", comma_join, "invalid_query"),
        (
            "repeat of 2 GB",
            "SELECT length(repeat('x', 2000000000))".into(),
            "resources_exhausted",
        ),
        (
            "lpad to 2 G characters",
            "SELECT length(lpad('x', 2000000000))".into(),
            "resources_exhausted",
        ),
        (
            "rpad to 2 G characters",
            "SELECT length(rpad('x', 2000000000, 'yz'))".into(),
            "resources_exhausted",
        ),
        (
            "replace that multiplies",
            "SELECT length(replace(repeat('x', 100000), 'x', repeat('y', 100000)))".into(),
            "resources_exhausted",
        ),
        (
            "regexp_replace that multiplies",
            "SELECT length(regexp_replace(repeat('x', 100000), 'x', repeat('y', 100000), 'g'))"
                .into(),
            "resources_exhausted",
        ),
        (
            "a 2 G element range",
            "SELECT cardinality(range(0, 2000000000))".into(),
            "resources_exhausted",
        ),
        (
            "array_repeat of 2 G",
            "SELECT cardinality(array_repeat(1, 2000000000))".into(),
            "resources_exhausted",
        ),
        (
            "an over-large regular expression",
            "SELECT regexp_like('a', '(a{1000}){1000}')".into(),
            "invalid_query",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_statements_are_refused_and_the_service_keeps_serving() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut q = Query::start(dir.path(), &["--query-timeout-secs", "20"]);
    let base = q.base();
    for (name, sql, code) in corpus() {
        let (status, body) = post_sql(&base, &sql, Duration::from_secs(120)).await;
        assert!(
            (400..500).contains(&status),
            "{name}: HTTP {status}: {body}"
        );
        assert_eq!(body["error"]["code"], code, "{name}: {body}");
        let message = body["error"]["message"]
            .as_str()
            .expect("message")
            .to_string();
        assert!(q.alive(), "{name} killed toolspan query (HTTP)");

        let out = q.psql(&sql);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}: psql succeeded");
        // Same envelope message over the wire, with the SQLSTATE of the code.
        let sqlstate = if code == "invalid_query" {
            "42000"
        } else {
            "53200"
        };
        assert!(stderr.contains(sqlstate), "{name}: psql said {stderr}");
        assert!(
            stderr.contains(&message[..message.len().min(60)]),
            "{name}: psql said {stderr}, HTTP said {message}"
        );
        assert!(q.alive(), "{name} killed toolspan query (Postgres wire)");
    }
    // Still serving, both ways.
    let (status, body) = post_sql(&base, "SELECT 41 + 1 AS answer", Duration::from_secs(30)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["rows"][0]["answer"], 42);
    let out = q.psql("SELECT 41 + 1");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "42",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let peak = q.peak_rss_mb();
    assert!(
        peak < 2 * MEMORY_LIMIT_MB,
        "peak RSS {peak} MiB over twice the {MEMORY_LIMIT_MB} MiB memory limit"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn statements_longer_than_the_http_cap_are_refused_over_the_postgres_wire_too() {
    let dir = tempfile::tempdir().expect("tempdir");
    let q = Query::start(dir.path(), &[]);
    let long = format!("SELECT '{}'", "x".repeat(2 << 20));
    let out = q.psql(&long);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("at most 1048576"), "{stderr}");
}

/// A psycopg client that starts a long query, shuts its socket down mid-query and exits.
const VANISHING_CLIENT: &str = r#"
import os, socket, sys, threading, time
import psycopg
conn = psycopg.connect(host="127.0.0.1", port=int(sys.argv[1]), user=sys.argv[2], password=sys.argv[3], dbname="toolspan", sslmode="disable", autocommit=True)
def run():
    try:
        conn.execute("SELECT sum(value % 7) FROM range(0, 1000000000000)").fetchall()
    except Exception:
        pass
threading.Thread(target=run, daemon=True).start()
time.sleep(1.5)
s = socket.socket(fileno=os.dup(conn.fileno()))
s.shutdown(socket.SHUT_RDWR)
print("shut down", flush=True)
os._exit(0)
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_vanished_postgres_client_frees_its_query_slot() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Two slots, a long timeout: without cancellation both stay taken for a minute.
    let q = Query::start(
        dir.path(),
        &[
            "--max-concurrent-queries",
            "2",
            "--query-timeout-secs",
            "60",
        ],
    );
    let clients: Vec<Child> = (0..2)
        .map(|_| {
            Command::new(python())
                .args(["-c", VANISHING_CLIENT, &q.pg.to_string(), USER, PASSWORD])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start the psycopg client")
        })
        .collect();
    for c in clients {
        let out = c.wait_with_output().expect("client ran");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("shut down"),
            "client: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Both slots must be free again well before the queries' own timeout; the queue wait is
    // the query timeout, so a held slot would make this wait about a minute.
    let started = Instant::now();
    let (status, body) = post_sql(&q.base(), "SELECT 1 AS one", Duration::from_secs(15)).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = post_sql(&q.base(), "SELECT 2 AS two", Duration::from_secs(15)).await;
    assert_eq!(status, 200, "{body}");
    assert!(started.elapsed() < Duration::from_secs(15));
}

fn raw_http(port: u16, request: &[u8]) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    s.write_all(request).expect("write");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

fn assert_envelope(body: &str, code: &str) {
    let v: Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("not an envelope ({e}): {body:?}"));
    assert_eq!(v["error"]["code"], code, "{v}");
    assert!(
        v["error"]["reference"]
            .as_str()
            .is_some_and(|r| r.starts_with("ts_")),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn http_listeners_time_out_idle_clients_and_answer_every_error_with_the_envelope() {
    let dir = tempfile::tempdir().expect("tempdir");
    let http = free_port();
    let server = Server::start_with_env(
        dir.path(),
        &[
            "--http-addr",
            &format!("127.0.0.1:{http}"),
            "--token",
            "s3cret-token",
        ],
        &[
            ("TOOLSPAN_HTTP_HEADER_TIMEOUT_SECS", "2"),
            ("TOOLSPAN_HTTP_BODY_TIMEOUT_SECS", "2"),
        ],
    );
    for port in [server.port, http] {
        // Unknown route, wrong method, over-long URI: the envelope, not an empty body.
        let (status, body) = raw_http(
            port,
            b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(status, 404);
        assert_envelope(&body, "not_found");
        let (status, body) = raw_http(
            port,
            b"DELETE /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(status, 405);
        assert_envelope(&body, "invalid_argument");
        let long = format!(
            "GET /healthz?q={} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            "a".repeat(20_000)
        );
        let (status, body) = raw_http(port, long.as_bytes());
        assert_eq!(status, 414);
        assert_envelope(&body, "invalid_argument");

        // Half a request head: the server closes the connection after its header timeout.
        let started = Instant::now();
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            .expect("write");
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "half-sent head kept open"
        );

        // Half a body: the request fails and the connection closes after the body timeout.
        let started = Instant::now();
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        let path = if port == http {
            "/api/v1/sql"
        } else {
            "/v1/traces"
        };
        let ct = if port == http {
            "application/json"
        } else {
            "application/x-protobuf"
        };
        s.write_all(format!("POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret-token\r\nContent-Type: {ct}\r\nContent-Length: 1000\r\n\r\n{{").as_bytes()).expect("write");
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "half-sent body kept open"
        );
    }

    // The embedded query API honours --token.
    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{http}/api/v1/sql");
    let r = client
        .post(&url)
        .header("content-type", "application/json")
        .body(r#"{"sql":"SELECT 1"}"#)
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status().as_u16(), 401);
    // A statement that overflowed the stack and took span ingest down with it is refused, and
    // the receiver keeps accepting spans.
    let bomb = vec!["SELECT 1"; 4_000].join(" UNION ALL ");
    let r = client
        .post(&url)
        .bearer_auth("s3cret-token")
        .header("content-type", "application/json")
        .body(json!({ "sql": bomb }).to_string())
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status().as_u16(), 400);
    let r = client
        .post(server.url())
        .header("content-type", "application/json")
        .body(r#"{"resourceSpans":[]}"#)
        .send()
        .await
        .expect("POST spans");
    assert_eq!(r.status().as_u16(), 200);
}
