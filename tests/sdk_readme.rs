//! The Python SDK's README runs as written: its Python example, with the OpenTelemetry set-up
//! it shows, exports to `toolspan serve` (the exporter's standard endpoint variable points it
//! at the test's port; `DOCS_URL` at a local docs service) once with the docs service up and
//! once with it down; the table holds one successful call and one `RETRY_EXHAUSTED` call
//! whose attempts are `NETWORK`. The README's envelope example is valid JSON.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{free_port, python, repo_root, sql_json, Server};

/// The README's code blocks of `lang`, in order.
fn blocks(readme: &str, lang: &str) -> Vec<String> {
    let fence = format!("```{lang}\n");
    readme
        .split(&fence)
        .skip(1)
        .map(|rest| rest.split("```").next().unwrap_or_default().to_string())
        .collect()
}

/// A docs service answering every GET with `body` (Python's own static file server).
fn docs_service(dir: &Path, body: &str) -> (Child, u16) {
    std::fs::write(dir.join("search"), body).expect("write the answer");
    let port = free_port();
    let child = Command::new(python())
        .args([
            "-m",
            "http.server",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
        ])
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the docs service");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the docs service did not listen");
        std::thread::sleep(Duration::from_millis(100));
    }
    (child, port)
}

fn run_example(script: &Path, otlp: &str, docs_url: &str) -> String {
    let out = Command::new(python())
        .arg(script)
        .env("PYTHONPATH", repo_root().join("sdk/python/src"))
        .env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", otlp)
        .env("DOCS_URL", docs_url)
        .output()
        .expect("run the venv's Python (scripts/test installs it)");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "the README example failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn the_sdk_readme_example_runs_as_written_and_lands_in_the_table() {
    let readme = std::fs::read_to_string(repo_root().join("sdk/python/README.md")).expect("README");
    let python_blocks = blocks(&readme, "python");
    assert_eq!(
        python_blocks.len(),
        1,
        "one runnable example; test any new one"
    );
    for json in blocks(&readme, "json") {
        serde_json::from_str::<serde_json::Value>(&json)
            .unwrap_or_else(|e| panic!("a JSON block of the README is not JSON ({e}):\n{json}"));
    }

    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let docs = dir.path().join("docs");
    std::fs::create_dir_all(&docs).unwrap();
    let script = dir.path().join("example.py");
    std::fs::write(&script, &python_blocks[0]).unwrap();
    let server = Server::start(&data);
    let (mut docs_child, docs_port) = docs_service(
        &docs,
        r#"{"hits": [{"title": "Rotating API keys", "url": "https://docs.example.com/keys"}]}"#,
    );

    let up = run_example(
        &script,
        &server.url(),
        &format!("http://127.0.0.1:{docs_port}/search"),
    );
    assert!(
        up.starts_with("ok ") && up.contains("Rotating API keys"),
        "{up}"
    );
    let _ = docs_child.kill();
    let _ = docs_child.wait();
    let down = run_example(
        &script,
        &server.url(),
        &format!("http://127.0.0.1:{docs_port}/search"),
    );
    assert!(
        down.starts_with("tool_error ") && down.contains("connection_refused"),
        "{down}"
    );

    let calls = |sql: &str| sql_json(&data, sql);
    let deadline = Instant::now() + Duration::from_secs(60);
    let rows = loop {
        let rows = calls(
            "SELECT status, coalesce(error_type, '') AS et, attempts FROM calls \
             WHERE tool = 'search_docs' AND service = 'support-bot' AND service_version = '1.5.0' \
             ORDER BY start_time",
        );
        if rows.len() >= 2 || Instant::now() > deadline {
            break rows;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    let got: Vec<(String, String, i64)> = rows
        .iter()
        .map(|r| {
            (
                r["status"].as_str().unwrap_or_default().to_string(),
                r["et"].as_str().unwrap_or_default().to_string(),
                r["attempts"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("ok".to_string(), String::new(), 1),
            ("error".to_string(), "RETRY_EXHAUSTED".to_string(), 3)
        ]
    );
    let attempts = calls(
        "SELECT DISTINCT error_type FROM spans WHERE tool = 'search_docs' AND stage = 'attempt' \
         AND status = 'error'",
    );
    assert_eq!(attempts, vec![serde_json::json!({"error_type": "NETWORK"})]);
    drop(server);
}
