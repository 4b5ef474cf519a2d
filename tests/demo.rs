//! `toolspan demo` produces failures of every type at every stage, recovered and exhausted
//! retries, and no planted secret reaches a query result.

use std::process::Command;

use crate::support::{bin, free_port, sql_count, sql_json, sql_raw};

#[test]
fn demo_shows_every_error_type_and_stage_and_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let out = Command::new(bin())
        .args([
            "demo",
            "--duration",
            "12",
            "--runs-per-second",
            "80",
            "--log",
            "warn",
            "--otlp-addr",
        ])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--data-dir")
        .arg(dir.path())
        .output()
        .expect("run toolspan demo");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "demo failed:\n{stderr}");
    assert!(
        stderr.contains("Try:") && stderr.contains("toolspan sql"),
        "demo prints example queries:\n{stderr}"
    );

    let n = sql_count(
        dir.path(),
        "SELECT count(*) FROM spans WHERE tool = 'search_docs' AND error_type = 'PARSE' AND start_time > now() - INTERVAL '1 hour'",
    );
    assert!(n > 0, "PARSE errors on search_docs in the last hour");

    let types: Vec<String> = sql_json(
        dir.path(),
        "SELECT DISTINCT error_type FROM spans WHERE error_type IS NOT NULL ORDER BY 1",
    )
    .iter()
    .map(|r| r["error_type"].as_str().unwrap().to_string())
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
    let stages: Vec<String> = sql_json(dir.path(), "SELECT DISTINCT stage FROM spans ORDER BY 1")
        .iter()
        .map(|r| r["stage"].as_str().unwrap().to_string())
        .collect();
    for s in [
        "agent", "attempt", "call", "execute", "llm", "parse", "prepare", "send",
    ] {
        assert!(
            stages.contains(&s.to_string()),
            "stage {s} occurs: {stages:?}"
        );
    }
    assert!(
        sql_count(
            dir.path(),
            "SELECT count(*) FROM calls WHERE recovered_after_retry"
        ) > 0
    );
    assert!(
        sql_count(
            dir.path(),
            "SELECT count(*) FROM calls WHERE error_type = 'RETRY_EXHAUSTED' AND attempts > 1"
        ) > 0
    );
    assert!(
        sql_count(
            dir.path(),
            "SELECT count(*) FROM spans WHERE leaked_internals"
        ) > 0
    );

    let everything = sql_raw(dir.path(), "csv", "SELECT * FROM spans");
    assert!(everything.status.success());
    let text = String::from_utf8_lossy(&everything.stdout);
    assert!(text.len() > 100_000, "the dump holds the demo's rows");
    for secret in toolspan_gen::PLANTED_SECRETS {
        assert!(
            !text.contains(secret),
            "planted secret {secret:?} reached a query result"
        );
    }
    assert!(text.contains("[REDACTED:"), "redactions are visible");
}
