//! What a log collector reads on toolspan's stderr: plain lines without terminal escape codes
//! when stderr is not a terminal, one JSON object per line with `--log-format json`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{bin, free_port};

/// Runs `toolspan serve --log info` with stderr in a file until it listens, stops it with
/// SIGTERM (as a service manager does) and returns its stderr and the receiver's address.
fn serve_stderr(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> (String, String) {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let log = dir.join(format!("stderr-{port}"));
    let mut child = Command::new(bin())
        .env_remove("TOOLSPAN_LOG_FORMAT")
        .env_remove("NO_COLOR")
        .env_remove("RUST_LOG")
        .envs(env.iter().copied())
        .args(["serve", "--data-dir"])
        .arg(dir.join("data"))
        .args(["--otlp-addr", &addr, "--log", "info"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("create the stderr file"))
        .spawn()
        .expect("start toolspan serve");
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(Instant::now() < deadline, "serve did not listen on {addr}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid = child.id().to_string();
    Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            assert!(status.success(), "serve exited with {status} after SIGTERM");
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("serve did not stop within 30 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    (std::fs::read_to_string(&log).expect("read stderr"), addr)
}

#[test]
fn logs_to_a_file_are_plain_text_by_default_and_json_when_asked() {
    let dir = tempfile::tempdir().expect("tempdir");

    // Default: text, and no colour codes in a file (journald, a container's log stream).
    let (text, addr) = serve_stderr(dir.path(), &[], &[]);
    assert!(
        !text.contains('\u{1b}'),
        "escape codes in a log file:\n{text}"
    );
    let listening = text
        .lines()
        .find(|l| l.contains("otlp/http receiver listening"))
        .unwrap_or_else(|| panic!("no listening line in:\n{text}"));
    assert!(listening.contains(" INFO "), "{listening}");
    assert!(listening.contains(&format!("addr={addr}")), "{listening}");

    // --log-format json: every line one object; the event's fields at top level.
    let (json, addr) = serve_stderr(dir.path(), &["--log-format", "json"], &[]);
    let events: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(events.len() >= 2, "{json}");
    for e in &events {
        for key in ["timestamp", "level", "target", "message"] {
            assert!(e.get(key).is_some(), "no {key} in {e}");
        }
    }
    let listening = events
        .iter()
        .find(|e| {
            e["message"]
                .as_str()
                .is_some_and(|m| m.contains("otlp/http receiver listening"))
        })
        .unwrap_or_else(|| panic!("no listening event in:\n{json}"));
    assert_eq!(listening["level"], "INFO", "{listening}");
    assert_eq!(listening["addr"], addr.as_str(), "{listening}");
    assert_eq!(listening["target"], "toolspan::cmd::serve", "{listening}");
    // The status lines a person reads in text mode are events too.
    assert!(
        events.iter().any(|e| e["target"] == "toolspan::status"
            && e["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("toolspan serve: OTLP/HTTP on"))),
        "{json}"
    );

    // The same from the environment (a container sets TOOLSPAN_LOG_FORMAT once).
    let (json, _) = serve_stderr(dir.path(), &[], &[("TOOLSPAN_LOG_FORMAT", "json")]);
    let first = json.lines().next().unwrap_or_default();
    assert!(
        serde_json::from_str::<serde_json::Value>(first).is_ok(),
        "TOOLSPAN_LOG_FORMAT=json gave: {first}"
    );

    // A command's failure is one error event carrying the envelope's fields.
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).expect("mkdir");
    let out = Command::new(bin())
        .env_remove("TOOLSPAN_LOG_FORMAT")
        .args(["sql", "--log-format", "json", "--data-dir"])
        .arg(&empty)
        .arg("SELECT 1")
        .output()
        .expect("run toolspan sql");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    let e: serde_json::Value = serde_json::from_str(lines[0]).expect("one JSON object");
    assert_eq!(e["level"], "ERROR", "{e}");
    assert_eq!(e["code"], "not_found", "{e}");
    assert_eq!(e["retryable"], false, "{e}");
    assert!(
        e["reference"]
            .as_str()
            .is_some_and(|r| r.starts_with("ts_")),
        "{e}"
    );

    // A bad value is refused with the choices, before anything starts.
    let out = Command::new(bin())
        .args(["serve", "--log-format", "yaml"])
        .output()
        .expect("run toolspan");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("possible values: text, json"), "{err}");
}
