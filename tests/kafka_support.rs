//! A real Kafka-compatible broker (tansu, installed by `scripts/test`) and `toolspan ingest` /
//! `toolspan produce` processes for the Kafka tests.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{bin, free_port, sql_count, sql_raw};

/// The tansu binary: `TOOLSPAN_TANSU`, else `~/.cargo/bin/tansu`, else `tansu` on PATH.
fn tansu() -> PathBuf {
    if let Some(p) = std::env::var_os("TOOLSPAN_TANSU") {
        return PathBuf::from(p);
    }
    let home = PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cargo/bin/tansu");
    if home.exists() {
        home
    } else {
        PathBuf::from("tansu")
    }
}

/// A tansu broker on a free port with sqlite storage in its own directory; killed on drop.
pub struct Broker {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Broker {
    pub fn start() -> Broker {
        let dir = tempfile::tempdir().expect("broker dir");
        let port = free_port();
        let child = Broker::spawn(dir.path(), port);
        Broker {
            child,
            port,
            _dir: dir,
        }
    }

    /// Kills the broker (SIGKILL): an outage.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts it again on the same port and storage.
    pub fn restart(&mut self) {
        self.kill();
        self.child = Broker::spawn(self._dir.path(), self.port);
    }

    fn spawn(dir: &Path, port: u16) -> Child {
        let url = format!("tcp://127.0.0.1:{port}");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("broker.log"))
            .expect("broker log");
        let child = Command::new(tansu())
            .current_dir(dir)
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
                "--storage-engine",
                "sqlite://tansu.db",
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start tansu ({e}); scripts/test installs it with cargo install tansu"
                )
            });
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "tansu did not listen on {port} within 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        child
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Client settings every test passes with `-X`: tansu holds each fetch for
/// `fetch.wait.max.ms` even when data is ready. The session timeout is librdkafka's 45 s cut
/// to 10 s: long enough that a member on a loaded machine does not time out its own session
/// (tansu 0.6 can then leave that member's partitions assigned to nobody: a test waits
/// forever; bench/RESULTS.md "Notes on the test broker"), short enough for a stopped test.
/// Plain librdkafka settings, nothing tansu-specific in toolspan itself.
pub const CLIENT_OPTS: [&str; 3] = [
    "fetch.wait.max.ms=5",
    "session.timeout.ms=10000",
    "heartbeat.interval.ms=1000",
];

/// Extra arguments of the tests that SIGKILL members and restart them: the broker expires a
/// killed member after 3 s, so its partitions move on quickly (passed after [`CLIENT_OPTS`],
/// which they override).
pub const QUICK_EXPIRY: [&str; 4] = [
    "-X",
    "session.timeout.ms=3000",
    "-X",
    "heartbeat.interval.ms=300",
];

/// The Kafka settings of the tests (`tests/kafka_settings.json`), which
/// `scripts/check-dashboards` compares with the collector's and compose's.
pub struct Settings {
    pub topic: String,
    pub dlq_topic: String,
    pub encoding: String,
    pub partitions: String,
    pub group: String,
}

pub fn settings() -> Settings {
    let v: serde_json::Value =
        serde_json::from_str(include_str!("kafka_settings.json")).expect("kafka_settings.json");
    assert_eq!(
        v["keyed_by_trace_id"], true,
        "toolspan produce keys by trace id, as the collector with partition_traces_by_id"
    );
    let s = |k: &str| {
        v[k].as_str()
            .map(str::to_string)
            .unwrap_or_else(|| v[k].to_string())
    };
    Settings {
        topic: s("topic"),
        dlq_topic: s("dlq_topic"),
        encoding: s("encoding"),
        partitions: s("partitions"),
        group: s("group"),
    }
}

/// What `toolspan produce` reported.
#[derive(Debug, Default)]
pub struct Produced {
    pub messages: u64,
    pub garbage: u64,
    pub spans: u64,
}

/// Runs `toolspan produce` to completion.
pub fn produce(
    broker: &Broker,
    topic: &str,
    spans: u64,
    extra: &[&str],
    manifest: Option<&Path>,
) -> Produced {
    let mut cmd = Command::new(bin());
    cmd.args([
        "produce",
        "--log",
        "warn",
        "--brokers",
        &broker.addr(),
        "--topic",
        topic,
        "--spans",
        &spans.to_string(),
    ]);
    cmd.args(["--format", &settings().encoding]);
    if let Some(m) = manifest {
        cmd.arg("--manifest").arg(m);
    }
    let out = cmd.args(extra).output().expect("run toolspan produce");
    assert!(
        out.status.success(),
        "produce failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut p = Produced::default();
    for kv in text.split_whitespace() {
        if let Some((k, v)) = kv.split_once('=') {
            let v: u64 = v.parse().unwrap_or(0);
            match k {
                "messages" => p.messages = v,
                "garbage" => p.garbage = v,
                "spans" => p.spans = v,
                _ => {}
            }
        }
    }
    p
}

/// A `toolspan ingest` worker; killed (SIGKILL) on drop.
pub struct Worker {
    pub child: Child,
    pub metrics_port: u16,
    pub log: PathBuf,
}

impl Worker {
    pub fn start(
        broker: &Broker,
        topic: &str,
        group: &str,
        data_dir: &Path,
        extra: &[&str],
    ) -> Worker {
        let table = data_dir.join("spans").to_string_lossy().into_owned();
        Worker::start_at(broker, topic, group, &table, &[], extra)
    }

    /// A worker writing the table at `table` (a path or URI), with `env` added to its
    /// environment (an object store's endpoint and credentials).
    pub fn start_at(
        broker: &Broker,
        topic: &str,
        group: &str,
        table: &str,
        env: &[(String, String)],
        extra: &[&str],
    ) -> Worker {
        let metrics_port = free_port();
        // Each worker in a working directory of its own: nothing but the table is shared.
        let cwd = std::env::temp_dir().join(format!("toolspan-worker-{metrics_port}"));
        std::fs::create_dir_all(&cwd).expect("worker directory");
        let mut cmd = Command::new(bin());
        cmd.current_dir(&cwd);
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        cmd.args([
            "ingest",
            "--log",
            "warn",
            "--brokers",
            &broker.addr(),
            "--topic",
            topic,
            "--group",
            group,
            "--format",
            &settings().encoding,
            "--table",
            table,
        ])
        .args(["--metrics-addr", &format!("127.0.0.1:{metrics_port}")]);
        if !extra.contains(&"--flush-ms") {
            cmd.args(["--flush-ms", "1000"]);
        }
        for o in CLIENT_OPTS {
            cmd.args(["-X", o]);
        }
        // Logs outside the data directory (which may be a full filesystem in a test).
        let log_path =
            std::env::temp_dir().join(format!("toolspan-ingest-{group}-{metrics_port}.log"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("worker log");
        let mut child = cmd
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start toolspan ingest");
        // A worker that cannot start (bad flag, port taken) fails the test with its output.
        std::thread::sleep(Duration::from_millis(300));
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "toolspan ingest exited at start ({status}):\n{}",
                std::fs::read_to_string(&log_path).unwrap_or_default()
            );
        }
        Worker {
            child,
            metrics_port,
            log: log_path,
        }
    }

    /// The last lines of the worker's log (see [`log_tail`]).
    pub fn log_tail(&self) -> String {
        log_tail(&self.log, 30)
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// `/metrics` text, empty when not reachable.
    pub fn metrics(&self) -> String {
        let url = format!("http://127.0.0.1:{}/metrics", self.metrics_port);
        reqwest::blocking_get(&url)
    }

    /// GET `path` (`/readyz`) on the metrics listener: status and body.
    pub fn probe(&self, path: &str) -> (u16, String) {
        reqwest::blocking_get_status(&format!("http://127.0.0.1:{}{path}", self.metrics_port))
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A `toolspan metrics` process writing the rollup; SIGKILLed on drop.
pub struct MetricsJob {
    child: Child,
    log: PathBuf,
    /// Its `/metrics` port.
    pub port: u16,
}

impl MetricsJob {
    pub fn start(broker: &Broker, topic: &str, rollup: &Path, extra: &[&str]) -> MetricsJob {
        MetricsJob::start_at(broker, topic, &rollup.to_string_lossy(), &[], extra)
    }

    /// A metrics job without a rollup table (its tap only).
    pub fn start_tap(broker: &Broker, topic: &str, extra: &[&str]) -> MetricsJob {
        MetricsJob::start_at(broker, topic, "", &[], extra)
    }

    /// A metrics job writing its rollup at `rollup` (a path or URI; none when empty), with
    /// `env` added to its environment (an object store's endpoint and credentials).
    pub fn start_at(
        broker: &Broker,
        topic: &str,
        rollup: &str,
        env: &[(String, String)],
        extra: &[&str],
    ) -> MetricsJob {
        let port = free_port();
        let log = std::env::temp_dir().join(format!("toolspan-metrics-rollup-{port}.log"));
        let file = std::fs::File::create(&log).expect("log");
        let mut cmd = Command::new(bin());
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        cmd.args([
            "metrics",
            "--log",
            "info",
            "--brokers",
            &broker.addr(),
            "--topic",
            topic,
            "--format",
            &settings().encoding,
        ])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .args(["-X", "auto.offset.reset=earliest"]);
        if !rollup.is_empty() {
            cmd.args(["--rollup-flush-ms", "300", "--rollup-table", rollup]);
        }
        // A consumer group of its own for every start: tansu 0.6 can leave the partitions of a
        // member that died (or timed out) in a group assigned to nobody (bench/RESULTS.md, "Notes
        // on the test broker"). The rollup resumes from the offsets recorded in its table, not
        // from the group's, so a new group changes nothing else.
        if !extra.contains(&"--group") {
            cmd.args(["--group", &format!("toolspan-metrics-{port}")]);
        }
        for o in CLIENT_OPTS {
            cmd.args(["-X", o]);
        }
        cmd.args(extra);
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("start toolspan metrics");
        std::thread::sleep(Duration::from_millis(300));
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "toolspan metrics exited at start ({status}):\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        MetricsJob { child, log, port }
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The last lines of the job's log (see [`log_tail`]).
    pub fn log_tail(&self) -> String {
        log_tail(&self.log, 20)
    }
}

impl MetricsJob {
    /// `/metrics` text, empty when not reachable.
    pub fn metrics(&self) -> String {
        reqwest::blocking_get(&format!("http://127.0.0.1:{}/metrics", self.port))
    }

    /// GET `path` (`/healthz`) on its listener: status and body.
    pub fn probe(&self, path: &str) -> (u16, String) {
        reqwest::blocking_get_status(&format!("http://127.0.0.1:{}{path}", self.port))
    }
}

impl Drop for MetricsJob {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last `n` lines of a log at `path` other than the periodic progress lines, then the
/// last progress line: what went wrong stays in view when a stalled process repeats itself.
fn log_tail(path: &std::path::Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let progress = |l: &&str| l.contains(" progress");
    let events: Vec<&str> = text.lines().filter(|l| !progress(l)).collect();
    let mut tail = events[events.len().saturating_sub(n)..].to_vec();
    tail.extend(text.lines().rfind(progress));
    tail.join("\n")
}

/// A tiny blocking GET (the tests avoid an async runtime here).
pub mod reqwest {
    use std::io::{Read, Write};

    pub fn blocking_get(url: &str) -> String {
        blocking_get_status(url).1
    }

    /// The status (0 when unreachable) and the body.
    pub fn blocking_get_status(url: &str) -> (u16, String) {
        let Some(rest) = url.strip_prefix("http://") else {
            return (0, String::new());
        };
        let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
        let Ok(mut s) = std::net::TcpStream::connect(host) else {
            return (0, String::new());
        };
        let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(5)));
        let _ = write!(s, "GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        let status = out
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = out
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        (status, body)
    }
}

/// Rows in the table (0 before it exists).
pub fn table_rows(data_dir: &Path) -> i64 {
    if !data_dir.join("spans/_delta_log").exists() {
        return 0;
    }
    let out = sql_raw(data_dir, "json", "SELECT count(*) AS n FROM spans");
    if !out.status.success() {
        return 0;
    }
    serde_json::from_slice::<Vec<serde_json::Value>>(&out.stdout)
        .ok()
        .and_then(|r| r.first().and_then(|v| v["n"].as_i64()))
        .unwrap_or(0)
}

/// Waits until the table holds `want` rows (or more), up to `limit`.
pub fn wait_rows(data_dir: &Path, want: i64, limit: Duration) -> i64 {
    let deadline = Instant::now() + limit;
    loop {
        let n = table_rows(data_dir);
        if n >= want || Instant::now() >= deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(1000));
    }
}

/// The span ids in the manifest `toolspan produce` wrote.
pub fn manifest_ids(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).expect("manifest");
    let mut v: Vec<String> = text.lines().map(str::to_string).collect();
    v.sort_unstable();
    v
}

/// Asserts the table holds exactly the manifest's spans: same count, no duplicates, same ids.
pub fn assert_exactly(data_dir: &Path, expected: &[String]) {
    let total = sql_count(data_dir, "SELECT count(*) FROM spans");
    let distinct = sql_count(data_dir, "SELECT count(DISTINCT span_id) FROM spans");
    let out = sql_raw(
        data_dir,
        "csv",
        "SELECT span_id FROM spans ORDER BY span_id",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(1)
        .map(str::to_string)
        .collect();
    assert_same_set(total, distinct, &ids, expected);
}

/// Asserts a table's `total` rows, `distinct` span ids and `ids` are exactly `expected`: no
/// loss, no duplicates (wherever the table lives).
pub fn assert_same_set(total: i64, distinct: i64, ids: &[String], expected: &[String]) {
    let exp: BTreeSet<&String> = expected.iter().collect();
    let got: BTreeSet<&String> = ids.iter().collect();
    let missing = exp.difference(&got).count();
    let extra = got.difference(&exp).count();
    assert_eq!(
        (total, distinct, missing, extra),
        (expected.len() as i64, expected.len() as i64, 0, 0),
        "table: {total} rows, {distinct} distinct span ids; {missing} produced spans missing, {extra} unexpected"
    );
}

/// Reads `topic` from the beginning with a plain rdkafka consumer until `want` messages arrived
/// (or `limit` passed); returns each message's headers.
pub fn read_topic_headers(
    broker: &Broker,
    topic: &str,
    want: usize,
    limit: Duration,
) -> Vec<Vec<(String, String)>> {
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker.addr())
        .set("group.id", format!("test-reader-{}", std::process::id()))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "5")
        .create()
        .expect("consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    let deadline = Instant::now() + limit;
    let mut out = Vec::new();
    // Keep reading a little past `want` so that duplicates would show.
    let mut quiet_since = Instant::now();
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                out.push(toolspan_ingest::kafka::headers_of(&m));
                quiet_since = Instant::now();
            }
            Some(Err(_)) | None => {
                if out.len() >= want && quiet_since.elapsed() > Duration::from_secs(3) {
                    break;
                }
            }
        }
    }
    out
}
