//! The official OpenTelemetry Python SDK's OTLP/HTTP exporters (protobuf and JSON) send to
//! `toolspan serve`, and their spans are found by SQL.

use std::process::Command;

use crate::support::{python, repo_root, sql_count, sql_json, Server};

fn export(server: &Server, protocol: &str, marker: &str) {
    let out = Command::new(python())
        .arg(repo_root().join("tests/otel/send_otlp_http.py"))
        .args([
            "--endpoint",
            &server.base(),
            "--protocol",
            protocol,
            "--marker",
            marker,
            "--base-time",
            "now",
        ])
        .output()
        .expect("run the Python SDK exporter (scripts/test installs it)");
    assert!(
        out.status.success(),
        "the SDK's {protocol} export failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn python_sdk_otlp_http_exports_are_searchable_by_sql() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    export(&server, "protobuf", "pb7f3a");
    export(&server, "json", "js9c1e");
    drop(server);

    // The scenarios hold 154 spans; each encoding must land all of them.
    for marker in ["pb7f3a", "js9c1e"] {
        let n = sql_count(
            dir.path(),
            &format!("SELECT count(*) FROM spans WHERE name LIKE '%#{marker}'"),
        );
        assert_eq!(n, 154, "spans exported with marker {marker}");
        let parse = sql_count(
            dir.path(),
            &format!("SELECT count(*) FROM spans WHERE name LIKE '%#{marker}' AND error_type = 'PARSE' AND start_time > now() - INTERVAL '1 hour'"),
        );
        assert!(
            parse >= 2,
            "PARSE errors of the last hour are found ({parse})"
        );
    }
    // Both encodings classify identically.
    let by_type = sql_json(
        dir.path(),
        "SELECT error_type, count(*) AS n, count(DISTINCT CASE WHEN name LIKE '%#pb7f3a' THEN span_id END) AS pb, count(DISTINCT CASE WHEN name LIKE '%#js9c1e' THEN span_id END) AS js FROM spans WHERE error_type IS NOT NULL GROUP BY error_type ORDER BY error_type",
    );
    let types: Vec<&str> = by_type
        .iter()
        .filter_map(|r| r["error_type"].as_str())
        .collect();
    assert_eq!(
        types,
        [
            "NETWORK",
            "PARSE",
            "PREPARE",
            "RETRY_EXHAUSTED",
            "TOOL_ERROR"
        ]
    );
    for r in &by_type {
        assert_eq!(
            r["pb"], r["js"],
            "same classification from protobuf and JSON: {r}"
        );
    }
}
