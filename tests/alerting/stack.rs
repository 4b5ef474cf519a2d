//! Prometheus and Alertmanager as the alert tests run them: Debian's binaries as processes
//! with their output in log files, the project's alert rules and Alertmanager configuration with
//! the waits shortened, and a webhook receiver this test owns.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::WAIT;
use crate::support::{free_port, repo_root};

const PROMETHEUS: &str = "/usr/bin/prometheus";
const ALERTMANAGER: &str = "/usr/bin/prometheus-alertmanager";

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

pub(super) async fn get_text(client: &reqwest::Client, url: &str) -> Option<String> {
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

/// Alertmanager (routing to this test's webhook) and Prometheus (scraping `metrics_port` every
/// second and evaluating the rules with every `for:` shortened), both ready.
pub(super) struct AlertStack {
    alertmanager: Daemon,
    prometheus: Daemon,
    prom_port: u16,
    alerts: mpsc::Receiver<serde_json::Value>,
}

impl AlertStack {
    pub(super) async fn start(
        dir: &Path,
        client: &reqwest::Client,
        metrics_port: u16,
    ) -> AlertStack {
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
    pub(super) fn firing(&self) -> Vec<serde_json::Value> {
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
    pub(super) fn check_alive(&mut self) {
        if let Some(status) = self.prometheus.exited().or(self.alertmanager.exited()) {
            panic!(
                "prometheus or alertmanager exited ({status})\n{}\n{}",
                self.prometheus.tail(),
                self.alertmanager.tail()
            );
        }
    }

    /// Prometheus's HTTP API answer at `path`, or "" (for a failure message).
    pub(super) async fn api(&self, client: &reqwest::Client, path: &str) -> String {
        get_text(
            client,
            &format!("http://127.0.0.1:{}{path}", self.prom_port),
        )
        .await
        .unwrap_or_default()
    }

    pub(super) fn tails(&self) -> String {
        format!("{}\n{}", self.prometheus.tail(), self.alertmanager.tail())
    }
}
