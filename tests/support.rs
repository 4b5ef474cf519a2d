//! Starting `toolspan` processes and talking to them.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_toolspan")
}

/// A free TCP port on loopback for a child process to listen on.
///
/// Taken below the kernel's ephemeral range (32768 and up), from a per-process counter: a
/// port the kernel handed out with `bind(0)` and that was then released is the next one it
/// gives to some outgoing connection, and with a dozen processes talking to each other in
/// a run, one such collision stopped a server from starting in a clean-clone CI run.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    // Each test process starts at its own place in the range, so that two runs side by
    // side (two checkouts) rarely try the same ports.
    let seed = std::process::id().wrapping_mul(7919)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
    let _ = NEXT.compare_exchange(u32::MAX, seed % SPAN, Ordering::SeqCst, Ordering::SeqCst);
    for _ in 0..SPAN {
        let port = (LOW + NEXT.fetch_add(1, Ordering::SeqCst) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {LOW}..{}", LOW + SPAN);
}

/// Held by the million-span runs (two Kafka workers, twenty SIGKILLs, the same on S3) for
/// their whole length, so that at most one of them runs at a time: each needs most of a
/// 2-core machine for minutes, and two together (plus the S3 server) starved the SIGKILL run
/// in a clean-clone CI run (411,529 of 1,000,013 rows after 900 s).
pub fn heavy_run() -> std::sync::MutexGuard<'static, ()> {
    static HEAVY: std::sync::Mutex<()> = std::sync::Mutex::new(());
    HEAVY.lock().unwrap_or_else(|e| e.into_inner())
}

/// The Python with the OpenTelemetry SDK (see `scripts/test`).
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("TOOLSPAN_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = Path::new(&std::env::var("HOME").unwrap_or_default())
        .join(".cache/toolspan/venv/bin/python");
    if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    }
}

/// The checkout the tests run in: cargo sets CARGO_MANIFEST_DIR when it runs them; the
/// compile-time value is only a fallback (a test binary reused from a cache shared by two
/// checkouts would otherwise use the other checkout's files).
pub fn repo_root() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// A running `toolspan serve`, killed on drop.
pub struct Server {
    pub child: Child,
    pub port: u16,
}

impl Server {
    pub fn start(data_dir: &Path) -> Server {
        Server::start_with(data_dir, &[])
    }

    pub fn start_with(data_dir: &Path, extra: &[&str]) -> Server {
        Server::start_with_env(data_dir, extra, &[])
    }

    pub fn start_with_env(data_dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
        Server::spawn(data_dir, extra, env, Stdio::null())
    }

    /// A server whose log (stderr) goes to the file `log`.
    pub fn start_logging(data_dir: &Path, extra: &[&str], log: &Path) -> Server {
        let file = std::fs::File::create(log).expect("create the server's log file");
        Server::spawn(data_dir, extra, &[], Stdio::from(file))
    }

    fn spawn(data_dir: &Path, extra: &[&str], env: &[(&str, &str)], stderr: Stdio) -> Server {
        let port = free_port();
        let child = Command::new(bin())
            .envs(env.iter().copied())
            .args(["serve", "--data-dir"])
            .arg(data_dir)
            .args(["--otlp-addr", &format!("127.0.0.1:{port}"), "--log", "warn"])
            .args(if extra.contains(&"--flush-ms") {
                &[][..]
            } else {
                &["--flush-ms", "100"][..]
            })
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start toolspan serve");
        let mut s = Server { child, port };
        s.wait_ready();
        s
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/v1/traces", self.port)
    }

    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "toolspan serve exited ({status}) before listening on {}",
                    self.port
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("toolspan serve did not listen on {} within 60 s", self.port);
    }

    /// Peak resident memory (VmHWM) in KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        peak_rss_kib(self.child.id())
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    /// A graceful stop (SIGTERM, as a service manager sends): the server commits what it
    /// holds, including spans still waiting in trace assembly. SIGKILL after 30 s.
    fn drop(&mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Peak resident memory (VmHWM) of process `pid` in KiB (0 when unreadable).
pub fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Starts `toolspan query` on `data_dir` with the HTTP API and the Postgres wire on free
/// ports (Postgres role `user`/`password`, no token, plus `extra` flags) and waits until both
/// listen. Returns the process and the two ports.
pub fn start_query(
    data_dir: &Path,
    user: &str,
    password: &str,
    extra: &[&str],
) -> (Child, u16, u16) {
    let (http, pg) = (free_port(), free_port());
    let mut child = Command::new(bin())
        .args(["query", "--log", "warn", "--data-dir"])
        .arg(data_dir)
        .args([
            "--http-addr",
            &format!("127.0.0.1:{http}"),
            "--pg-addr",
            &format!("127.0.0.1:{pg}"),
        ])
        .args(extra)
        .env("TOOLSPAN_PG_USER", user)
        .env("TOOLSPAN_PG_PASSWORD", password)
        .env_remove("TOOLSPAN_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start toolspan query");
    let deadline = Instant::now() + Duration::from_secs(60);
    for port in [http, pg] {
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                matches!(child.try_wait(), Ok(None)),
                "toolspan query exited early"
            );
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("toolspan query did not listen on {port} within 60 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    (child, http, pg)
}

/// `toolspan sql --format json`, parsed.
pub fn sql_json(data_dir: &Path, sql: &str) -> Vec<serde_json::Value> {
    let out = sql_raw(data_dir, "json", sql);
    assert!(
        out.status.success(),
        "sql failed: {sql}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("sql output is not JSON ({e}): {text}"))
}

pub fn sql_raw(data_dir: &Path, format: &str, sql: &str) -> Output {
    Command::new(bin())
        .args(["sql", "--log", "error", "--format", format, "--data-dir"])
        .arg(data_dir)
        .arg(sql)
        .output()
        .expect("run toolspan sql")
}

/// A single number from `SELECT count(*) ...`.
pub fn sql_count(data_dir: &Path, sql: &str) -> i64 {
    let rows = sql_json(data_dir, sql);
    let row = rows
        .first()
        .and_then(|r| r.as_object())
        .unwrap_or_else(|| panic!("no row from {sql}"));
    row.values()
        .next()
        .and_then(|v| v.as_i64())
        .unwrap_or_else(|| panic!("no number from {sql}: {row:?}"))
}

/// For fixtures kept in a static (never dropped): a shell that waits for end of file on its stdin, then kills `pid` and removes `dir`. The
/// write end lives in a static, so the kernel closes it when the test binary exits — however
/// it exits (normal return, `process::exit`, a panic or a signal) — without a destructor.
pub fn reaper(pid: u32, dir: &Path) -> Child {
    Command::new("sh")
        .args([
            "-c",
            r#"read _ignored; kill "$1" 2>/dev/null; sleep 1; rm -rf "$2""#,
            "reaper",
        ])
        .arg(pid.to_string())
        .arg(dir)
        .stdin(Stdio::piped())
        .spawn()
        .expect("start the reaper shell")
}

/// Runs `toolspan demo` for `seconds` at `runs_per_second` into `data_dir` (OTLP on a free
/// port, the viewer on another, logs at warn) and returns its output; fails the test when the demo fails.
pub fn run_demo(data_dir: &Path, seconds: u32, runs_per_second: u32) -> Output {
    let out = Command::new(bin())
        .args(["demo", "--duration", &seconds.to_string()])
        .args(["--runs-per-second", &runs_per_second.to_string()])
        .args(["--log", "warn", "--otlp-addr"])
        .arg(format!("127.0.0.1:{}", free_port()))
        // Its viewer on a free port too (never the default 8080).
        .arg("--http-addr")
        .arg(format!("127.0.0.1:{}", free_port()))
        .arg("--data-dir")
        .arg(data_dir)
        .output()
        .expect("run toolspan demo");
    assert!(
        out.status.success(),
        "demo failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A blocking `POST` of a JSON body: the status and the answer's text.
pub fn post_json(url: &str, body: String) -> (u16, String) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let r = reqwest::Client::new()
            .post(url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {url}: {e}"));
        let status = r.status().as_u16();
        (status, r.text().await.unwrap_or_default())
    })
}
