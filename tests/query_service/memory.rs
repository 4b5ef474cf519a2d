//! The query service's memory as a process, under results far larger than its memory limit:
//! a JSON result streams within the limit, six JSON results whose clients never read keep the
//! process small, and a Postgres `Query` message of forty large statements streams the first
//! one instead of holding all of them. Resident memory is read from `/proc/<pid>/status`.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{peak_rss_kib, post_json, python, start_query};

const USER: &str = "grafana";
const PASSWORD: &str = "memory-test-pw";
/// `--memory-limit-mb` of the server under test.
const LIMIT_MB: u64 = 64;
/// What the process may reach: the limit plus the runtime, caches and buffers around it.
const BOUND_MB: u64 = LIMIT_MB + 256;
/// Two million rows: 16 MB as Arrow, ~32 MB as JSON.
const LARGE: &str = "SELECT value FROM generate_series(1, 2000000)";

/// A `toolspan query` with a 64 MB memory limit on an empty table, killed on drop.
struct Limited {
    child: Child,
    http: u16,
    pg: u16,
    _dir: tempfile::TempDir,
}

impl Limited {
    fn start() -> Limited {
        let dir = tempfile::tempdir().expect("temp dir");
        let limit = LIMIT_MB.to_string();
        let (child, http, pg) = start_query(
            dir.path(),
            USER,
            PASSWORD,
            &[
                "--memory-limit-mb",
                &limit,
                "--max-concurrent-queries",
                "8",
                "--query-timeout-secs",
                "60",
            ],
        );
        Limited {
            child,
            http,
            pg,
            _dir: dir,
        }
    }

    fn rss_mb(&self) -> u64 {
        status_kib(self.child.id(), "VmRSS:") / 1024
    }

    fn peak_mb(&self) -> u64 {
        peak_rss_kib(self.child.id()) / 1024
    }

    /// Watches the resident memory for `length`, failing as soon as it passes the bound.
    fn watch(&self, length: Duration, what: &str) {
        let until = Instant::now() + length;
        while Instant::now() < until {
            let rss = self.rss_mb();
            assert!(
                rss < BOUND_MB,
                "{what}: {rss} MiB resident under a {LIMIT_MB} MiB memory limit"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Limited {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_json_result_larger_than_the_memory_limit_streams_within_it() {
    let q = Limited::start();
    let (status, text) = post_json(
        &format!("http://127.0.0.1:{}/api/v1/sql", q.http),
        serde_json::json!({ "sql": LARGE }).to_string(),
    );
    assert_eq!(status, 200, "{}", &text[..text.len().min(500)]);
    assert!(text.len() > 16 << 20, "{} bytes", text.len());
    assert!(
        text.starts_with(r#"{"columns":[{"name":"value","type":"bigint"}],"rows":[{"value":1},"#),
        "{}",
        &text[..100]
    );
    assert!(text.ends_with(r#"{"value":2000000}],"row_count":2000000}"#));
    assert_eq!(text.matches(r#"{"value":"#).count(), 2_000_000);
    let peak = q.peak_mb();
    assert!(
        peak < BOUND_MB,
        "peak {peak} MiB resident for one JSON result under a {LIMIT_MB} MiB memory limit"
    );
}

#[test]
fn six_json_results_whose_clients_never_read_keep_the_process_small() {
    let q = Limited::start();
    let body = serde_json::json!({ "sql": LARGE }).to_string();
    let clients: Vec<TcpStream> = (0..6)
        .map(|_| {
            let mut s = TcpStream::connect(("127.0.0.1", q.http)).expect("connect");
            write!(
                s,
                "POST /api/v1/sql HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .expect("send the request");
            s
        })
        .collect();
    q.watch(Duration::from_secs(6), "six unread JSON results");
    // The six queries wait for their readers instead of running to the end.
    let (status, metrics) = get_text(&format!("http://127.0.0.1:{}/metrics", q.http));
    assert_eq!(status, 200);
    let running = metrics
        .lines()
        .find_map(|l| l.strip_prefix("toolspan_query_running "))
        .and_then(|v| v.trim().parse::<f64>().ok());
    assert_eq!(running, Some(6.0), "{metrics}");
    drop(clients);
    let peak = q.peak_mb();
    assert!(peak < BOUND_MB, "peak {peak} MiB");
}

/// Logs in over the Postgres protocol (MD5), sends one `Query` message of `argv[5]` copies
/// of `argv[6]`, prints the type of the first message of the answer, then never reads again.
const UNREAD_QUERY_MESSAGE: &str = r#"
import hashlib, socket, struct, sys, time
host, port, user, password, n, sql = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6]
s = socket.create_connection((host, port))
def recv(n):
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            sys.exit("connection closed")
        out += chunk
    return out
def message():
    head = recv(5)
    return head[:1], recv(struct.unpack("!I", head[1:])[0] - 4)
def send(kind, body):
    s.sendall(kind + struct.pack("!I", len(body) + 4) + body)
params = b"user\0" + user.encode() + b"\0database\0toolspan\0\0"
s.sendall(struct.pack("!II", len(params) + 8, 196608) + params)
while True:
    kind, body = message()
    if kind == b"R" and struct.unpack("!I", body[:4])[0] == 5:
        inner = hashlib.md5((password + user).encode()).hexdigest()
        send(b"p", b"md5" + hashlib.md5(inner.encode() + body[4:8]).hexdigest().encode() + b"\0")
    elif kind == b"E":
        sys.exit("login refused: %r" % body)
    elif kind == b"Z":
        break
send(b"Q", ";".join([sql] * n).encode() + b"\0")
kind, _ = message()
print(kind.decode(), flush=True)
time.sleep(120)
"#;

#[test]
fn a_query_message_of_forty_large_statements_streams_the_first_one() {
    let q = Limited::start();
    let mut client = Command::new(python())
        .args([
            "-c",
            UNREAD_QUERY_MESSAGE,
            "127.0.0.1",
            &q.pg.to_string(),
            USER,
            PASSWORD,
        ])
        .args(["40", LARGE])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the Postgres client");
    let stdout = client.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    // The first statement's columns arrive while the others have not run, and the process
    // stays small while the client reads nothing more.
    let started = Instant::now();
    let first = loop {
        if let Ok(line) = rx.try_recv() {
            break line;
        }
        let rss = q.rss_mb();
        assert!(
            rss < BOUND_MB,
            "{rss} MiB resident before the first row was sent"
        );
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no answer to the Query message within 60 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(first.trim(), "T", "the answer began with {first:?}");
    q.watch(Duration::from_secs(4), "forty unread statements");
    let _ = client.kill();
    let _ = client.wait();
    let peak = q.peak_mb();
    assert!(peak < BOUND_MB, "peak {peak} MiB");

    // Read in full, the statements of one message answer in order, and the first error
    // ends the message with the results before it kept.
    let out = psql(
        q.pg,
        "SELECT 1 AS a; SELECT value FROM generate_series(1, 3); SELECT 'x' AS b",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "1\n1\n2\n3\nx\n");
    let out = psql(q.pg, "SELECT 1 AS a; SELECT nope FROM spans; SELECT 3 AS c");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "1\n");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown column"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One `Query` message through `psql -c`, unaligned and without headers.
fn psql(port: u16, sql: &str) -> std::process::Output {
    Command::new("psql")
        .args(["-X", "-h", "127.0.0.1", "-p", &port.to_string(), "-U", USER])
        .args(["-d", "toolspan", "-A", "-t", "-c", sql])
        .env("PGPASSWORD", PASSWORD)
        .env("PGCONNECT_TIMEOUT", "10")
        .env("PGSSLMODE", "disable")
        .output()
        .expect("run psql (scripts/test installs postgresql-client)")
}

/// A blocking `GET`: the status and the answer's text.
fn get_text(url: &str) -> (u16, String) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let r = reqwest::get(url)
            .await
            .unwrap_or_else(|e| panic!("GET {url}: {e}"));
        let status = r.status().as_u16();
        (status, r.text().await.unwrap_or_default())
    })
}
