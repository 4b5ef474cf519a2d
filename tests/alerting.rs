//! The alert path end to end, with Debian's real Prometheus and Alertmanager (no Grafana is
//! involved), twice: with the Kafka metrics job (`toolspan metrics` consuming a real broker's
//! topic) and in embedded mode. `toolspan serve --metrics-addr` (or `toolspan metrics`) counts
//! the spans it takes in, Prometheus scrapes
//! it (job `toolspan-metrics`) and evaluates `dashboards/alerts/toolspan.rules.yml` (with every
//! `for:` shortened), Alertmanager routes with `deploy/alertmanager.yml` (waits shortened, the
//! webhook pointed at a receiver this test owns). Failures injected for one tool at one stage
//! must reach the webhook as that tool's and stage's failure-rate alert, and no alert may name
//! the healthy tool. A third run drives the demo fleet's traffic through `toolspan serve` and
//! renames a field of one tool's answer partway: the answer-shape alert must name that tool
//! and no other.
//!
//! The binaries come from Debian's `prometheus` and `prometheus-alertmanager` packages, which
//! `scripts/check-dashboards` installs (`scripts/test` runs it first); without them the test
//! fails and says so.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use prost::Message;

use crate::support::{free_port, repo_root, Server};

const PROMETHEUS: &str = "/usr/bin/prometheus";
const ALERTMANAGER: &str = "/usr/bin/prometheus-alertmanager";
/// Every call of this tool succeeds at its first attempt.
const HEALTHY: &str = "healthy_search";
/// Every call of this tool fails at `send` on its first attempt and recovers on the second:
/// only the (tool, send) failure rate is high; its calls, prepare, execute and parse are clean.
const FLAKY: &str = "flaky_fetch";
/// Bound of every wait.
const WAIT: Duration = Duration::from_secs(120);
/// Contract (METRICS.md): an injected failure shows in /metrics within 5 s. Measured and
/// printed; only a bound far above it is asserted (timing is a benchmark's job).
const FRESHNESS_BOUND: Duration = Duration::from_secs(30);

/// Fails the test, saying how to install it, when `program` is not there.
fn require(program: &str) {
    assert!(
        Path::new(program).exists(),
        "{program} is missing: this test runs Debian's real Prometheus and Alertmanager; install them with \
         `apt-get install -y prometheus prometheus-alertmanager` (scripts/check-dashboards does, and scripts/test runs it)"
    );
}

/// A process killed on drop, with its output in a log file for the failure message.
struct Daemon {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Daemon {
    fn start(name: &'static str, program: &str, args: &[String], log: PathBuf) -> Daemon {
        require(program);
        let out = std::fs::File::create(&log).expect("create a log file");
        let err = out.try_clone().expect("clone the log file handle");
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("start {program}: {e}"));
        Daemon { name, child, log }
    }

    /// The last lines of its output.
    fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        format!(
            "---- {} (last lines of {}) ----\n{}",
            self.name,
            self.log.display(),
            lines[lines.len().saturating_sub(25)..].join("\n")
        )
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A webhook receiver on loopback: every POSTed JSON body goes to the channel.
fn webhook() -> (u16, mpsc::Receiver<serde_json::Value>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the webhook receiver");
    let port = listener.local_addr().expect("local addr").port();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            // One request per connection (the answer says `Connection: close`).
            match read_request(stream) {
                Some(body) => {
                    if tx.send(body).is_err() {
                        return; // the test is over
                    }
                }
                None => continue,
            }
        }
    });
    (port, rx)
}

fn read_request(stream: TcpStream) -> Option<serde_json::Value> {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().ok()?;
            }
        }
    }
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body).ok()?;
    let mut stream = stream;
    let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    serde_json::from_slice(&body).ok()
}

/// `dashboards/alerts/toolspan.rules.yml` with every `for:` at 2 s; the expressions and their
/// lookback windows stay as they are.
fn fast_rules() -> String {
    let src = std::fs::read_to_string(repo_root().join("dashboards/alerts/toolspan.rules.yml"))
        .expect("read the alert rules");
    let mut changed = 0;
    let out: Vec<String> = src
        .lines()
        .map(|l| {
            let t = l.trim_start();
            if t.starts_with("for:") {
                changed += 1;
                format!("{}for: 2s", &l[..l.len() - t.len()])
            } else {
                l.to_string()
            }
        })
        .collect();
    assert!(changed > 0, "the rules have `for:` clauses to shorten");
    out.join("\n") + "\n"
}

/// `deploy/alertmanager.yml` with the group waits at 1 s and the webhook pointed at `url`.
fn fast_alertmanager(url: &str) -> String {
    let src = std::fs::read_to_string(repo_root().join("deploy/alertmanager.yml"))
        .expect("read deploy/alertmanager.yml");
    let mut urls = 0;
    let out: Vec<String> = src
        .lines()
        .map(|l| {
            let t = l.trim_start();
            let indent = &l[..l.len() - t.len()];
            if t.starts_with("group_wait:") {
                format!("{indent}group_wait: 1s")
            } else if t.starts_with("group_interval:") {
                format!("{indent}group_interval: 1s")
            } else if t.starts_with("- url:") {
                urls += 1;
                format!("{indent}- url: {url}")
            } else {
                l.to_string()
            }
        })
        .collect();
    assert!(
        urls > 0,
        "deploy/alertmanager.yml has a webhook receiver (`- url:`) to point at the test's"
    );
    out.join("\n") + "\n"
}

fn kv(key: &str, v: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(Value::StringValue(v.into())),
        }),
        ..Default::default()
    }
}

fn ki(key: &str, v: i64) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(Value::IntValue(v)),
        }),
        ..Default::default()
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos() as u64
}

/// Builds agent runs as agents emit them: call → attempts → prepare/send/execute/parse.
struct Traffic {
    next: u64,
}

impl Traffic {
    fn id(&mut self) -> Vec<u8> {
        self.next += 1;
        self.next.to_be_bytes().to_vec()
    }

    fn span(
        trace: &[u8],
        id: Vec<u8>,
        parent: Vec<u8>,
        name: String,
        t: u64,
        attributes: Vec<KeyValue>,
        failed: bool,
    ) -> Span {
        Span {
            trace_id: trace.to_vec(),
            span_id: id,
            parent_span_id: parent,
            name,
            start_time_unix_nano: t,
            end_time_unix_nano: t + 5_000_000,
            attributes,
            status: Some(Status {
                code: if failed { 2 } else { 1 },
                message: if failed {
                    "connection reset".into()
                } else {
                    String::new()
                },
            }),
            ..Default::default()
        }
    }

    /// One agent run with one call of `tool`; `fail_first_send` makes its first attempt fail at
    /// `send` (NETWORK) and a second attempt succeed.
    fn run(&mut self, tool: &str, fail_first_send: bool, spans: &mut Vec<Span>) {
        let mut trace = vec![0x5a; 16];
        trace[8..].copy_from_slice(&self.next.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_be_bytes());
        let t = now_ns();
        let root = self.id();
        let call = self.id();
        let call_id = format!("call_{}", self.next);
        let attempts = if fail_first_send { 2 } else { 1 };
        for n in 1..=attempts {
            let attempt = self.id();
            let failing = fail_first_send && n == 1;
            for stage in ["prepare", "send", "execute", "parse"] {
                let fails = failing && stage == "send";
                let mut attrs = vec![
                    kv("toolspan.stage", stage),
                    kv("gen_ai.tool.name", tool),
                    kv("gen_ai.tool.call.id", &call_id),
                ];
                if fails {
                    attrs.push(kv("toolspan.error.code", "upstream_unreachable"));
                }
                spans.push(Self::span(
                    &trace,
                    self.id(),
                    attempt.clone(),
                    format!("{stage} {tool}"),
                    t,
                    attrs,
                    fails,
                ));
                if fails {
                    break;
                }
            }
            let mut attrs = vec![
                ki("toolspan.attempt", n),
                kv("gen_ai.tool.name", tool),
                kv("gen_ai.tool.call.id", &call_id),
            ];
            if failing {
                attrs.push(kv("toolspan.error.code", "upstream_unreachable"));
            }
            spans.push(Self::span(
                &trace,
                attempt,
                call.clone(),
                format!("attempt {n} {tool}"),
                t,
                attrs,
                failing,
            ));
        }
        let attrs = vec![
            kv("gen_ai.operation.name", "execute_tool"),
            kv("gen_ai.tool.name", tool),
            kv("gen_ai.tool.call.id", &call_id),
        ];
        spans.push(Self::span(
            &trace,
            call,
            root.clone(),
            format!("execute_tool {tool}"),
            t,
            attrs,
            false,
        ));
        spans.push(Self::span(
            &trace,
            root,
            Vec::new(),
            "invoke_agent checkout-agent".into(),
            t,
            vec![kv("gen_ai.operation.name", "invoke_agent")],
            false,
        ));
    }

    /// `per_tool` healthy runs and `per_tool` flaky runs in one request.
    fn request(&mut self, per_tool: usize) -> Vec<u8> {
        let mut spans = Vec::new();
        for _ in 0..per_tool {
            self.run(HEALTHY, false, &mut spans);
            self.run(FLAKY, true, &mut spans);
        }
        Self::encode(spans)
    }

    /// `n` healthy runs only (warming up a consumer without injecting failures).
    fn healthy_only(&mut self, n: usize) -> Vec<u8> {
        let mut spans = Vec::new();
        for _ in 0..n {
            self.run(HEALTHY, false, &mut spans);
        }
        Self::encode(spans)
    }

    fn encode(spans: Vec<Span>) -> Vec<u8> {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![
                        kv("service.name", "checkout"),
                        kv("service.version", "1.0.0"),
                    ],
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
        .encode_to_vec()
    }
}

async fn get_text(client: &reqwest::Client, url: &str) -> Option<String> {
    let r = client
        .get(url)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .ok()?;
    if !r.status().is_success() {
        return None;
    }
    r.text().await.ok()
}

async fn wait_ready(client: &reqwest::Client, daemon: &mut Daemon, url: &str) {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        if let Some(status) = daemon.exited() {
            panic!(
                "{} exited ({status}) before it was ready\n{}",
                daemon.name,
                daemon.tail()
            );
        }
        if get_text(client, url).await.is_some() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "{} not ready at {url} within {WAIT:?}\n{}",
        daemon.name,
        daemon.tail()
    );
}

/// The value of `toolspan_tool_failures_total` for the flaky tool at stage send, summed.
fn flaky_send_failures(exposition: &str) -> f64 {
    exposition
        .lines()
        .filter(|l| l.starts_with("toolspan_tool_failures_total{"))
        .filter(|l| l.contains(&format!("tool=\"{FLAKY}\"")) && l.contains("stage=\"send\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Where the test's spans go: `toolspan serve` over OTLP/HTTP, or the Kafka topic that
/// `toolspan metrics` consumes.
enum Source {
    Embedded(Server),
    Kafka {
        _broker: crate::kafka_support::Broker,
        producer: rdkafka::producer::FutureProducer,
        _job: KillOnDrop,
    },
}

/// A child process killed when dropped (`Child` alone would be left running).
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Source {
    /// Sends one OTLP request; true when it was accepted.
    async fn send(&self, client: &reqwest::Client, body: Vec<u8>) -> bool {
        match self {
            Source::Embedded(server) => {
                let r = client
                    .post(server.url())
                    .header("content-type", "application/x-protobuf")
                    .body(body)
                    .send()
                    .await;
                matches!(&r, Ok(r) if r.status().as_u16() == 200)
            }
            Source::Kafka { producer, .. } => {
                let rec = rdkafka::producer::FutureRecord::<str, [u8]>::to("otlp_spans")
                    .payload(&body[..]);
                producer.send(rec, Duration::from_secs(10)).await.is_ok()
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_alert_fires_for_injected_tool_and_stage_only_no_grafana() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("spans");
    let metrics_port = free_port();
    let server = Server::start_with(
        &data,
        &["--metrics-addr", &format!("127.0.0.1:{metrics_port}")],
    );
    alert_path(dir, Source::Embedded(server), metrics_port).await;
}

/// The same alert path with the production metrics job: spans on the Kafka topic (a real
/// broker), `toolspan metrics` in its own consumer group, Prometheus scraping it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_alert_fires_from_the_kafka_metrics_job_no_grafana() {
    let dir = tempfile::tempdir().expect("temp dir");
    let broker = crate::kafka_support::Broker::start();
    let producer: rdkafka::producer::FutureProducer = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", broker.addr())
        .set("linger.ms", "5")
        .create()
        .expect("producer");
    // The topic exists before the job subscribes (the collector's topic always does).
    let seed =
        crate::kafka_support::produce(&broker, "otlp_spans", 1, &["--partitions", "2"], None);
    assert!(seed.spans >= 1);
    let metrics_port = free_port();
    let mut cmd = Command::new(crate::support::bin());
    cmd.args([
        "metrics",
        "--log",
        "warn",
        "--brokers",
        &broker.addr(),
        "--metrics-addr",
        &format!("127.0.0.1:{metrics_port}"),
    ]);
    for o in crate::kafka_support::CLIENT_OPTS {
        cmd.args(["-X", o]);
    }
    let job = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start toolspan metrics");
    // Wait for /metrics, then for the group to be assigned (a first marker request counted).
    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{metrics_port}/metrics");
    let source = Source::Kafka {
        _broker: broker,
        producer,
        _job: KillOnDrop(job),
    };
    let deadline = Instant::now() + WAIT;
    loop {
        assert!(
            Instant::now() < deadline,
            "toolspan metrics never consumed the topic"
        );
        let mut warm = Traffic {
            next: now_ns() & 0xffff_ffff,
        };
        source.send(&client, warm.healthy_only(1)).await;
        let text = get_text(&client, &url).await.unwrap_or_default();
        if text.contains(&format!("tool=\"{HEALTHY}\"")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    alert_path(dir, source, metrics_port).await;
}

/// Alertmanager (routing to this test's webhook) and Prometheus (scraping `metrics_port` every
/// second and evaluating the rules with every `for:` shortened), both ready.
struct AlertStack {
    alertmanager: Daemon,
    prometheus: Daemon,
    prom_port: u16,
    alerts: mpsc::Receiver<serde_json::Value>,
}

impl AlertStack {
    async fn start(dir: &Path, client: &reqwest::Client, metrics_port: u16) -> AlertStack {
        // Checked before anything starts: a missing binary fails the test, it never skips it.
        require(PROMETHEUS);
        require(ALERTMANAGER);
        let (hook_port, alerts) = webhook();
        let am_port = free_port();
        std::fs::write(
            dir.join("alertmanager.yml"),
            fast_alertmanager(&format!("http://127.0.0.1:{hook_port}/hooks/toolspan")),
        )
        .expect("write alertmanager.yml");
        std::fs::create_dir_all(dir.join("am-data")).expect("alertmanager storage dir");
        let mut alertmanager = Daemon::start(
            "alertmanager",
            ALERTMANAGER,
            &[
                format!("--config.file={}", dir.join("alertmanager.yml").display()),
                format!("--storage.path={}", dir.join("am-data").display()),
                format!("--web.listen-address=127.0.0.1:{am_port}"),
                "--cluster.listen-address=".into(),
            ],
            dir.join("alertmanager.log"),
        );

        let prom_port = free_port();
        std::fs::write(dir.join("toolspan.rules.yml"), fast_rules()).expect("write the rules");
        let prometheus_yml = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\n\
             alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['127.0.0.1:{am_port}']\n\
             rule_files:\n  - {rules}\n\
             scrape_configs:\n  - job_name: toolspan-metrics\n    static_configs:\n      - targets: ['127.0.0.1:{metrics_port}']\n",
            rules = dir.join("toolspan.rules.yml").display()
        );
        std::fs::write(dir.join("prometheus.yml"), prometheus_yml).expect("write prometheus.yml");
        std::fs::create_dir_all(dir.join("tsdb")).expect("tsdb dir");
        let mut prometheus = Daemon::start(
            "prometheus",
            PROMETHEUS,
            &[
                format!("--config.file={}", dir.join("prometheus.yml").display()),
                format!("--storage.tsdb.path={}", dir.join("tsdb").display()),
                format!("--web.listen-address=127.0.0.1:{prom_port}"),
            ],
            dir.join("prometheus.log"),
        );
        wait_ready(
            client,
            &mut alertmanager,
            &format!("http://127.0.0.1:{am_port}/-/ready"),
        )
        .await;
        wait_ready(
            client,
            &mut prometheus,
            &format!("http://127.0.0.1:{prom_port}/-/ready"),
        )
        .await;
        AlertStack {
            alertmanager,
            prometheus,
            prom_port,
            alerts,
        }
    }

    /// Firing alerts that reached the webhook since the last call.
    fn firing(&self) -> Vec<serde_json::Value> {
        let mut out = Vec::new();
        while let Ok(body) = self.alerts.try_recv() {
            for a in body["alerts"].as_array().cloned().unwrap_or_default() {
                if a["status"] == "firing" {
                    out.push(a);
                }
            }
        }
        out
    }

    /// Panics with both logs when Prometheus or Alertmanager has exited.
    fn check_alive(&mut self) {
        if let Some(status) = self.prometheus.exited().or(self.alertmanager.exited()) {
            panic!(
                "prometheus or alertmanager exited ({status})\n{}\n{}",
                self.prometheus.tail(),
                self.alertmanager.tail()
            );
        }
    }

    /// Prometheus's HTTP API answer at `path`, or "" (for a failure message).
    async fn api(&self, client: &reqwest::Client, path: &str) -> String {
        get_text(
            client,
            &format!("http://127.0.0.1:{}{path}", self.prom_port),
        )
        .await
        .unwrap_or_default()
    }

    fn tails(&self) -> String {
        format!("{}\n{}", self.prometheus.tail(), self.alertmanager.tail())
    }
}

async fn alert_path(dir: tempfile::TempDir, server: Source, metrics_port: u16) {
    let metrics_url = format!("http://127.0.0.1:{metrics_port}/metrics");
    let client = reqwest::Client::new();
    let mut stack = AlertStack::start(dir.path(), &client, metrics_port).await;

    // Freshness: from sending the first failure to seeing it in /metrics.
    let before = get_text(&client, &metrics_url)
        .await
        .expect("toolspan serves /metrics");
    assert_eq!(
        flaky_send_failures(&before),
        0.0,
        "no failure before injection"
    );
    let mut traffic = Traffic {
        next: now_ns() & 0xffff_ffff,
    };
    let first_failure = Instant::now();
    assert!(
        server.send(&client, traffic.request(5)).await,
        "first request accepted"
    );
    let freshness = loop {
        let text = get_text(&client, &metrics_url).await.unwrap_or_default();
        if flaky_send_failures(&text) > 0.0 {
            break first_failure.elapsed();
        }
        assert!(
            first_failure.elapsed() < FRESHNESS_BOUND,
            "the injected failure did not show in /metrics within {FRESHNESS_BOUND:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    eprintln!(
        "alerting: freshness_ms={} (first injected failure to /metrics; contract: <= 5000)",
        freshness.as_millis()
    );
    assert!(freshness < FRESHNESS_BOUND);

    // Steady traffic (20 runs of each tool per second) until the alert arrives.
    let mut received: Vec<serde_json::Value> = Vec::new();
    let mut fired_at: Option<Duration> = None;
    let mut requests = 1;
    while first_failure.elapsed() < WAIT {
        if server.send(&client, traffic.request(5)).await {
            requests += 1;
        }
        received.extend(stack.firing());
        let wanted = received.iter().any(|a| {
            let l = &a["labels"];
            matches!(
                l["alertname"].as_str(),
                Some("ToolspanToolFailureRateHigh" | "ToolspanToolFailureRateCritical")
            ) && l["tool"] == FLAKY
                && l["stage"] == "send"
        });
        match fired_at {
            None if wanted => {
                fired_at = Some(first_failure.elapsed());
                eprintln!(
                    "alerting: alert at the webhook {} ms after the first injected failure",
                    first_failure.elapsed().as_millis()
                );
            }
            // Keep the traffic going a little longer: a wrong alert would show up now too.
            Some(t) if first_failure.elapsed() > t + Duration::from_secs(5) => break,
            _ => {}
        }
        stack.check_alive();
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    let names: BTreeSet<String> = received
        .iter()
        .map(|a| {
            format!(
                "{}{{tool={},stage={}}}",
                a["labels"]["alertname"].as_str().unwrap_or("?"),
                a["labels"]["tool"],
                a["labels"]["stage"]
            )
        })
        .collect();
    if fired_at.is_none() {
        let alerts = stack.api(&client, "/api/v1/alerts").await;
        let targets = stack.api(&client, "/api/v1/targets").await;
        let ratio = stack
            .api(
                &client,
                "/api/v1/query?query=toolspan%3Atool_failure_ratio%3Arate5m",
            )
            .await;
        panic!(
            "no ToolspanToolFailureRate{{High,Critical}} alert for tool {FLAKY} stage send reached the webhook within {WAIT:?} \
             ({requests} requests sent); received: {names:?}\nprometheus alerts: {alerts}\ntargets: {targets}\nratio: {ratio}\n{}",
            stack.tails()
        );
    }
    eprintln!("alerting: {requests} requests sent; alerts received: {names:?}");
    for a in &received {
        let text = a.to_string();
        assert!(
            !text.contains(HEALTHY),
            "an alert names the healthy tool {HEALTHY}: {text}"
        );
        let labels = &a["labels"];
        let name = labels["alertname"].as_str().unwrap_or_default();
        if labels.get("tool").is_some() {
            assert!(
                labels["tool"] == FLAKY && labels["stage"] == "send",
                "only the injected tool and stage alert: {text}"
            );
            assert!(
                name.starts_with("ToolspanToolFailureRate"),
                "only failure-rate alerts for the injected failures: {text}"
            );
        } else {
            // Embedded mode has no Kafka ingest job, so its absence alert is expected; nothing
            // else without a tool may fire (in particular not ToolspanMetricsDown).
            assert_eq!(name, "ToolspanIngestDown", "unexpected alert: {text}");
        }
    }
    drop(stack);
    drop(server);
    drop(dir);
}

/// The answer-shape alert on the demo fleet's traffic, in real time through `toolspan serve`:
/// partway through, the docs service behind `search_docs` renames the field `url` of its
/// answer to `link` and `search_docs`'s parse stage, which still reads `url`, fails with
/// PARSE. `ToolspanAnswerShapeChanged` must reach the webhook for `search_docs` at stage
/// `parse`, and for no other tool (the other tools fail too, at their usual rates, but their
/// answers keep their shape).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_alert_fires_when_a_tool_answer_changes_shape() {
    const DRIFTING: &str = "search_docs";
    const ALERT: &str = "ToolspanAnswerShapeChanged";
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("spans");
    let metrics_port = free_port();
    let server = Server::start_with(
        &data,
        &["--metrics-addr", &format!("127.0.0.1:{metrics_port}")],
    );
    let client = reqwest::Client::new();
    let mut stack = AlertStack::start(dir.path(), &client, metrics_port).await;
    let metrics_url = format!("http://127.0.0.1:{metrics_port}/metrics");
    let source = Source::Embedded(server);

    // The baseline (the tool's first answers) comes before the rename, and Prometheus has
    // scraped the new-shape counter at 0: an increase needs a sample before it (Prometheus
    // applies its first targets a few seconds after it starts).
    let mut fleet = toolspan_gen::Fleet::new(toolspan_gen::FleetConfig::default());
    let baseline = format!(
        "/api/v1/query?query=toolspan_tool_answer_new_shapes_total%7Btool%3D%22{DRIFTING}%22%7D"
    );
    let start = Instant::now();
    loop {
        let body = fleet.request(10, now_ns(), 200_000_000).encode_to_vec();
        assert!(source.send(&client, body).await, "request accepted");
        let seen = stack.api(&client, &baseline).await;
        if seen.contains(r#""0"]"#) {
            break;
        }
        assert!(
            start.elapsed() < WAIT,
            "Prometheus never scraped {DRIFTING}'s new-shape counter: {seen}\n{}",
            stack.tails()
        );
        stack.check_alive();
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    fleet.rename_docs_field_at(now_ns());
    let start = Instant::now();
    let mut received: Vec<serde_json::Value> = Vec::new();
    let mut fired_at: Option<Duration> = None;
    while start.elapsed() < WAIT {
        let body = fleet.request(10, now_ns(), 200_000_000).encode_to_vec();
        assert!(source.send(&client, body).await, "request accepted");
        received.extend(stack.firing());
        let wanted = received.iter().any(|a| {
            a["labels"]["alertname"] == ALERT
                && a["labels"]["tool"] == DRIFTING
                && a["labels"]["stage"] == "parse"
        });
        match fired_at {
            None if wanted => {
                fired_at = Some(start.elapsed());
                eprintln!(
                    "alerting: {ALERT} at the webhook {} ms after the rename",
                    start.elapsed().as_millis()
                );
            }
            // A little longer: a shape alert for another tool would show up now too.
            Some(t) if start.elapsed() > t + Duration::from_secs(5) => break,
            _ => {}
        }
        stack.check_alive();
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let text = get_text(&client, &metrics_url).await.unwrap_or_default();
    let new_shapes: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("toolspan_tool_answer_new_shapes_total{"))
        .collect();
    if fired_at.is_none() {
        let alerts = stack.api(&client, "/api/v1/alerts").await;
        panic!(
            "no {ALERT} for {DRIFTING} at stage parse reached the webhook within {WAIT:?} of the rename; \
             received: {received:?}\nprometheus alerts: {alerts}\nnew shapes: {new_shapes:?}\n{}",
            stack.tails()
        );
    }
    // The rename is one new-shape event of search_docs on /metrics (another tool's rare
    // answer may count as new too; only the alert, which also needs PARSE failures, must not
    // name it).
    let expected = format!("toolspan_tool_answer_new_shapes_total{{tool=\"{DRIFTING}\"}} 1");
    assert!(
        new_shapes.contains(&expected.as_str()),
        "{expected} on /metrics: {new_shapes:?}"
    );
    for a in received
        .iter()
        .filter(|a| a["labels"]["alertname"] == ALERT)
    {
        // The call the parse stage failed in fails with PARSE too (the rule reads stage `call`
        // for instrumentation without stage spans), so both stages may alert.
        assert_eq!(
            a["labels"]["tool"].as_str(),
            Some(DRIFTING),
            "only the drifting tool has a shape alert: {a}"
        );
    }
    drop(stack);
    drop(source);
    drop(dir);
}
