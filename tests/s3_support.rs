//! A real S3-compatible server for the object-storage tests: moto's standalone server
//! (`moto[server]` from PyPI, installed into the test venv by `scripts/test`; it honours
//! conditional writes), reached through a TCP proxy that the tests can take down to play an
//! outage (moto keeps its buckets in memory, so stopping the server itself would lose the
//! table; stopping the proxy refuses connections exactly as a stopped server does).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::{bin, free_port, python};

/// The bucket every test uses (one server per test).
pub const BUCKET: &str = "toolspan-test";
/// A secret access key no log, error or metric may ever show.
pub const SECRET: &str = "s3cr3t-Zq8vX1tW5yKp0-do-not-leak";
/// The access key id; also kept out of logs, errors and metrics.
pub const KEY_ID: &str = "AKIATOOLSPANTEST7Q3";

/// moto's server on a free port behind a [`Proxy`]; both stopped on drop.
pub struct S3Server {
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
    pub proxy: Proxy,
}

impl S3Server {
    pub fn start() -> S3Server {
        let dir = tempfile::tempdir().expect("dir");
        let port = free_port();
        let log = dir.path().join("moto.log");
        let file = std::fs::File::create(&log).expect("moto log");
        let mut child = Command::new(python())
            .args(["-m", "moto.server", "-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log"))
            .stderr(file)
            .spawn()
            .expect("start moto's S3 server (python -m moto.server; scripts/test installs moto[server])");
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "moto's server exited at start ({status}):\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            assert!(Instant::now() < deadline, "moto did not listen within 60 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        // moto accepts unsigned requests: create the bucket with a bare PUT.
        let status = raw_request(port, "PUT", &format!("/{BUCKET}"));
        assert_eq!(status, 200, "creating bucket {BUCKET}");
        let proxy = Proxy::start(port);
        S3Server {
            child,
            log,
            _dir: dir,
            proxy,
        }
    }

    /// `s3://toolspan-test/<prefix>`.
    pub fn uri(&self, prefix: &str) -> String {
        format!("s3://{BUCKET}/{prefix}")
    }

    /// The environment a toolspan process reaches the server with (the standard AWS
    /// variables, as users set them).
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            (
                "AWS_ENDPOINT_URL".into(),
                format!("http://127.0.0.1:{}", self.proxy.port),
            ),
            ("AWS_ALLOW_HTTP".into(), "true".into()),
            ("AWS_REGION".into(), "us-east-1".into()),
            ("AWS_ACCESS_KEY_ID".into(), KEY_ID.into()),
            ("AWS_SECRET_ACCESS_KEY".into(), SECRET.into()),
        ]
    }

    /// The server's request log (one line per request, with its status code).
    pub fn request_log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A `toolspan` command with this server's environment.
    pub fn toolspan(&self) -> Command {
        let mut cmd = Command::new(bin());
        cmd.envs(self.env());
        cmd
    }

    /// `toolspan sql --format F --data-dir DATA SQL` against the server.
    pub fn sql_raw(&self, data_dir: &str, format: &str, sql: &str) -> Output {
        self.toolspan()
            .args([
                "sql",
                "--log",
                "error",
                "--format",
                format,
                "--data-dir",
                data_dir,
            ])
            // Moto answers a few dozen requests a second: a full scan of a table of many
            // small files takes minutes there.
            .args(["--query-timeout-secs", "900"])
            .arg(sql)
            .output()
            .expect("run toolspan sql")
    }

    /// A single number from `SELECT count(*) …`; 0 when the table cannot be read yet.
    pub fn count(&self, data_dir: &str, sql: &str) -> i64 {
        let out = self.sql_raw(data_dir, "json", sql);
        if !out.status.success() {
            return 0;
        }
        serde_json::from_slice::<Vec<serde_json::Value>>(&out.stdout)
            .ok()
            .and_then(|r| {
                r.first()
                    .and_then(|v| v.as_object())
                    .and_then(|o| o.values().next().and_then(|v| v.as_i64()))
            })
            .unwrap_or(0)
    }

    /// The sorted span ids of the table.
    pub fn span_ids(&self, data_dir: &str) -> Vec<String> {
        let out = self.sql_raw(
            data_dir,
            "csv",
            "SELECT span_id FROM spans ORDER BY span_id",
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .skip(1)
            .map(str::to_string)
            .collect()
    }

    /// Waits until the table holds `want` rows (or more), up to `limit`.
    pub fn wait_rows(&self, data_dir: &str, want: i64, limit: Duration) -> i64 {
        let deadline = Instant::now() + limit;
        loop {
            let n = self.count(data_dir, "SELECT count(*) FROM spans");
            if n >= want || Instant::now() >= deadline {
                return n;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Asserts that `text` (a log, an error, a metrics page) shows no credential.
pub fn assert_no_credentials(what: &str, text: &str) {
    for c in [SECRET, KEY_ID] {
        assert!(
            !text.contains(c),
            "{what} shows a credential ({c}):\n{text}"
        );
    }
}

/// One HTTP/1.0 request without a body; the status code (0 when unreachable).
fn raw_request(port: u16, method: &str, path: &str) -> u16 {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return 0;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\n\r\n"
    );
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// A TCP proxy on a free port forwarding to `127.0.0.1:<upstream>`. [`Proxy::stop`] closes
/// every connection and the listening socket (connections are then refused, as by a stopped
/// server); [`Proxy::resume`] listens on the same port again.
pub struct Proxy {
    pub port: u16,
    down: Arc<AtomicBool>,
    quit: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    fn start(upstream: u16) -> Proxy {
        let port = free_port();
        let down = Arc::new(AtomicBool::new(false));
        let quit = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (d, q, c) = (down.clone(), quit.clone(), conns.clone());
        std::thread::spawn(move || accept_loop(port, upstream, d, q, c));
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the proxy did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        Proxy {
            port,
            down,
            quit,
            conns,
        }
    }

    /// The store goes away: open connections are cut, new ones refused.
    pub fn stop(&self) {
        self.down.store(true, Ordering::SeqCst);
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
        // The accept loop drops its listener within its poll interval.
        std::thread::sleep(Duration::from_millis(100));
    }

    /// The store comes back.
    pub fn resume(&self) {
        self.down.store(false, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.quit.store(true, Ordering::SeqCst);
    }
}

fn accept_loop(
    port: u16,
    upstream: u16,
    down: Arc<AtomicBool>,
    quit: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
) {
    let mut listener: Option<TcpListener> = None;
    while !quit.load(Ordering::SeqCst) {
        if down.load(Ordering::SeqCst) {
            listener = None;
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        let Some(l) = listener.as_ref() else {
            // SO_REUSEADDR is the default for std listeners on Unix, so the port is free again
            // at once.
            listener = TcpListener::bind(("127.0.0.1", port)).ok();
            if let Some(l) = &listener {
                let _ = l.set_nonblocking(true);
            } else {
                std::thread::sleep(Duration::from_millis(20));
            }
            continue;
        };
        match l.accept() {
            Ok((client, _)) => {
                let _ = client.set_nonblocking(false);
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let mut held = conns.lock().unwrap();
                held.retain(|c| c.peer_addr().is_ok());
                for s in [&client, &server] {
                    if let Ok(c) = s.try_clone() {
                        held.push(c);
                    }
                }
                drop(held);
                pipe(&client, &server);
                pipe(&server, &client);
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Copies `from` into `to` on a thread until either side closes.
fn pipe(from: &TcpStream, to: &TcpStream) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut from, &mut to);
        let _ = to.shutdown(Shutdown::Write);
    });
}

/// Runs the Python snippet `code` with the test venv's Python and this server's environment;
/// its standard output.
pub fn python_with(server: &S3Server, code: &str) -> String {
    let out = Command::new(python())
        .envs(server.env())
        .args(["-c", code])
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "python failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
