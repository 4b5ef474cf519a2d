//! The configuration file (`--config`, `TOOLSPAN_CONFIG`): what a user writes in it is what
//! the service does, the environment and the command line win over it, and a misspelt key
//! stops the command with a message that names it.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::kafka_support::reqwest::blocking_get_status;
use crate::support::{bin, free_port};

/// A plain `toolspan` with none of the settings a developer's shell might hold.
fn toolspan() -> Command {
    let mut c = Command::new(bin());
    for k in [
        "TOOLSPAN_CONFIG",
        "TOOLSPAN_LOG",
        "TOOLSPAN_LOG_FORMAT",
        "TOOLSPAN_DATA_DIR",
        "TOOLSPAN_OTLP_ADDR",
        "TOOLSPAN_METRICS_ADDR",
        "RUST_LOG",
    ] {
        c.env_remove(k);
    }
    c
}

fn listening(addr: &str) -> bool {
    std::net::TcpStream::connect(addr).is_ok()
}

/// One span whose attribute holds an account number the file's `redact` pattern covers.
fn post_span(url: &str) {
    let body = serde_json::json!({"resourceSpans": [{
        "resource": {"attributes": [
            {"key": "service.name", "value": {"stringValue": "config-test"}}]},
        "scopeSpans": [{"spans": [{
            "traceId": "5b8efff798038103d269b633813fc60c",
            "spanId": "eee19b7ec3c1b174",
            "name": "execute_tool lookup_account",
            "kind": 1,
            "startTimeUnixNano": "1700000000000000000",
            "endTimeUnixNano": "1700000000200000000",
            "attributes": [
                {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
                {"key": "gen_ai.tool.name", "value": {"stringValue": "lookup_account"}},
                {"key": "customer", "value": {"stringValue": "acct-12345678"}}],
            "status": {"code": 1}}]}]}]});
    let (status, answer) = crate::support::post_json(url, body.to_string());
    assert_eq!(status, 200, "{answer}");
}

fn write_config(dir: &Path, otlp: &str, metrics: &str) -> std::path::PathBuf {
    let data = dir.join("data");
    let text = format!(
        r#"log = "info"
log-format = "json"

[serve]
data-dir = {data:?}
otlp-addr = "{otlp}"
metrics-addr = "{metrics}"
flush-ms = 100
redact = ["acct-[0-9]{{8}}"]

[sql]
data-dir = {data:?}
format = "csv"
"#,
        data = data.to_string_lossy()
    );
    let path = dir.join("toolspan.toml");
    std::fs::write(&path, text).expect("write the config file");
    path
}

#[test]
fn a_config_file_runs_serve_and_sql_and_the_environment_and_flags_win() {
    let dir = tempfile::tempdir().expect("tempdir");
    let otlp = format!("127.0.0.1:{}", free_port());
    let file_metrics = format!("127.0.0.1:{}", free_port());
    let env_metrics = format!("127.0.0.1:{}", free_port());
    let config = write_config(dir.path(), &otlp, &file_metrics);

    // `serve` with nothing on the command line but the file; the metrics address also in the
    // environment, which wins.
    let log = dir.path().join("serve.log");
    let mut serve = toolspan()
        .env("TOOLSPAN_METRICS_ADDR", &env_metrics)
        .arg("--config")
        .arg(&config)
        .arg("serve")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("start toolspan serve");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !listening(&otlp) || !listening(&env_metrics) {
        assert!(
            Instant::now() < deadline && matches!(serve.try_wait(), Ok(None)),
            "serve did not listen on the file's OTLP address and the environment's metrics address:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !listening(&file_metrics),
        "the environment's metrics address wins over the file's"
    );
    let (status, _) = blocking_get_status(&format!("http://{env_metrics}/healthz"));
    assert_eq!(status, 200);
    post_span(&format!("http://{otlp}/v1/traces"));

    // The file's log format: every stderr line is one JSON object.
    let text = std::fs::read_to_string(&log).expect("read the log");
    assert!(!text.is_empty(), "serve logged at info");
    for line in text.lines() {
        serde_json::from_str::<serde_json::Value>(line)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    }
    let _ = Command::new("kill")
        .args(["-TERM", &serve.id().to_string()])
        .status();
    let _ = serve.wait();

    // `sql` reads the file's data directory in the file's format (CSV), and the file's redact
    // pattern was applied before the span was stored.
    let out = toolspan()
        .arg("--config")
        .arg(&config)
        .args(["sql", "--log", "error"])
        .arg("SELECT tool, attributes FROM spans")
        .output()
        .expect("run toolspan sql");
    let csv = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        csv.starts_with("tool,attributes\n"),
        "CSV from the file: {csv}"
    );
    assert!(csv.contains("lookup_account"), "{csv}");
    assert!(
        csv.contains("[REDACTED:custom]") && !csv.contains("acct-12345678"),
        "the file's redact pattern: {csv}"
    );

    // A flag wins over the file: JSON instead of CSV.
    let out = toolspan()
        .env("TOOLSPAN_CONFIG", &config)
        .args(["sql", "--log", "error", "--format", "json"])
        .arg("SELECT count(*) AS n FROM spans")
        .output()
        .expect("run toolspan sql");
    let json: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("JSON: the flag won over the file");
    assert_eq!(json, serde_json::json!([{"n": 1}]));
}

#[test]
fn a_misspelt_key_stops_the_command_and_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("toolspan.toml");
    std::fs::write(&path, "[serve]\nflush_msec = 100\n").expect("write");
    let out = toolspan()
        .arg("--config")
        .arg(&path)
        .args(["serve", "--data-dir"])
        .arg(dir.path().join("data"))
        .output()
        .expect("run toolspan serve");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("error[invalid_argument]")
            && err.contains("unknown setting `flush_msec` in [serve]")
            && err.contains("flush-ms"),
        "{err}"
    );
    assert!(!dir.path().join("data").exists(), "nothing started");
}
