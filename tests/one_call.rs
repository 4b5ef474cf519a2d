//! One logical call, one call: two instrumentations active in one agent (a framework's own
//! spans with OpenInference's inside, MCP client and server spans under the framework's tool
//! span, overlapping siblings) and a framework that runs a failing tool again, exported by the
//! OpenTelemetry Python SDK one span per request (as a SimpleSpanProcessor sends them), are one
//! row per call in `calls`, one call per call in `failure_rates` and in `/metrics`.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::kafka_support::reqwest::blocking_get;
use crate::support::{free_port, python, repo_root, sql_count, sql_json, Server};

/// The scenarios' spans (tests/otel/scenarios.py).
const SPANS: i64 = 10 + 9;

/// `metric{labels} value` lines of `name` with `stage="call"`, summed per (tool, error_type).
fn call_series(text: &str, name: &str) -> BTreeMap<(String, String), u64> {
    let label = |l: &str, k: &str| -> String {
        let at = l.find(&format!("{k}=\"")).map(|i| i + k.len() + 2);
        at.and_then(|i| l[i..].split('"').next())
            .unwrap_or_default()
            .to_string()
    };
    let mut m = BTreeMap::new();
    for l in text
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains("stage=\"call\""))
    {
        let n: f64 = l
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        if n > 0.0 {
            *m.entry((label(l, "tool"), label(l, "error_type")))
                .or_default() += n as u64;
        }
    }
    m
}

#[test]
fn two_instrumentations_and_a_frameworks_retries_are_one_call_each() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = free_port();
    let server = Server::start_with(
        dir.path(),
        &[
            "--metrics-addr",
            &format!("127.0.0.1:{metrics}"),
            "--flush-ms",
            "50",
        ],
    );
    let out = Command::new(python())
        .arg(repo_root().join("tests/otel/send_otlp_http.py"))
        .args(["--endpoint", &server.base(), "--protocol", "json"])
        .args(["--processor", "simple", "--base-time", "now"])
        .args(["--scenario", "two_instrumentations"])
        .args(["--scenario", "framework_retries"])
        .output()
        .expect("run the Python SDK exporter (scripts/test installs it)");
    assert!(
        out.status.success(),
        "the export failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Spans that wait for a relative are held up to the assembly wait.
    let deadline = Instant::now() + Duration::from_secs(60);
    while sql_count(dir.path(), "SELECT count(*) FROM spans") < SPANS {
        assert!(Instant::now() < deadline, "the table never held the spans");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        sql_count(dir.path(), "SELECT count(*) FROM spans"),
        SPANS,
        "every span is stored"
    );

    let rows = sql_json(
        dir.path(),
        "SELECT tool, status, coalesce(error_type, '') AS error_type, attempts, \
         recovered_after_retry AS recovered FROM calls \
         ORDER BY tool, status, error_type, attempts",
    );
    let got: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{} {} {} {} {}",
                r["tool"].as_str().unwrap_or_default(),
                r["status"].as_str().unwrap_or_default(),
                r["error_type"].as_str().unwrap_or_default(),
                r["attempts"],
                r["recovered"]
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            "fetch_url error PARSE 1 false",
            "lookup_order error PREPARE 1 false",
            "lookup_order ok  2 true",
            "run_sql ok  2 true",
            "search_docs error NETWORK 1 false",
            "search_docs error RETRY_EXHAUSTED 3 false",
            "search_docs ok  1 false",
        ],
        "one row per logical call"
    );

    // failure_rates counts the same calls and failures.
    let rates = sql_json(
        dir.path(),
        "SELECT tool, sum(calls) AS calls, sum(failures) AS failures FROM \
         (SELECT minute, tool, max(calls) AS calls, sum(failures) AS failures \
          FROM failure_rates WHERE stage = 'call' GROUP BY 1, 2) GROUP BY tool ORDER BY tool",
    );
    let rates: Vec<String> = rates
        .iter()
        .map(|r| {
            format!(
                "{} {} {}",
                r["tool"].as_str().unwrap(),
                r["calls"],
                r["failures"]
            )
        })
        .collect();
    assert_eq!(
        rates,
        [
            "fetch_url 1.0 1.0",
            "lookup_order 2.0 1.0",
            "run_sql 1.0 0.0",
            "search_docs 3.0 2.0"
        ]
    );

    // /metrics agrees: calls per tool and failed calls per error type.
    let mut want_calls: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut want_failures: BTreeMap<(String, String), u64> = BTreeMap::new();
    for r in &rows {
        let tool = r["tool"].as_str().unwrap().to_string();
        *want_calls.entry((tool.clone(), String::new())).or_default() += 1;
        if r["status"] == "error" {
            let et = r["error_type"].as_str().unwrap().to_string();
            *want_failures.entry((tool, et)).or_default() += 1;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = blocking_get(&format!("http://127.0.0.1:{metrics}/metrics"));
        let calls = call_series(&text, "toolspan_tool_spans_total");
        let failures = call_series(&text, "toolspan_tool_failures_total");
        if (calls == want_calls && failures == want_failures) || Instant::now() > deadline {
            assert_eq!(calls, want_calls, "calls in /metrics");
            assert_eq!(failures, want_failures, "failed calls in /metrics");
            let recovered: u64 = text
                .lines()
                .filter(|l| l.starts_with("toolspan_calls_recovered_total{"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>() as u64;
            assert_eq!(recovered, 2, "recovered calls in /metrics");
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    drop(server);
}

/// Real frameworks with two instrumentations at once (`tests/frameworks/two_instrumentations.py`):
/// LangGraph under OpenInference's and OpenLLMetry's LangChain instrumentors (two overlapping
/// tool spans per call, under different parents), and pydantic-ai's own spans around toolspan's
/// SDK adapter (toolspan's call span inside pydantic-ai's). One row per call in `calls`.
#[test]
fn real_frameworks_with_two_instrumentations_give_one_row_per_call() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let out = Command::new(python())
        .arg(repo_root().join("tests/frameworks/two_instrumentations.py"))
        .args(["--endpoint", &server.base()])
        .current_dir(repo_root())
        .output()
        .expect("run the venv's Python (scripts/test installs it)");
    assert!(
        out.status.success(),
        "tests/frameworks/two_instrumentations.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every tool span of both instrumentations is stored (4 calls, 2 spans each, at least).
    let deadline = Instant::now() + Duration::from_secs(60);
    let tool_spans = "SELECT count(*) FROM spans WHERE tool IN ('search_docs', 'update_ticket') \
                      AND (name LIKE 'execute_tool%' OR name = 'search_docs')";
    while sql_count(dir.path(), tool_spans) < 8
        || sql_count(
            dir.path(),
            "SELECT count(*) FROM spans WHERE stage = 'agent'",
        ) < 2
    {
        assert!(Instant::now() < deadline, "the table never held the spans");
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(server);
    let rows = sql_json(
        dir.path(),
        "SELECT agent, tool, status, coalesce(error_type, '') AS error_type, attempts FROM calls \
         ORDER BY agent, start_time",
    );
    let got: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{} {} {} {} {}",
                r["agent"].as_str().unwrap_or_default(),
                r["tool"].as_str().unwrap_or_default(),
                r["status"].as_str().unwrap_or_default(),
                r["error_type"].as_str().unwrap_or_default(),
                r["attempts"]
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            "langgraph_agent search_docs error NETWORK 1",
            "langgraph_agent search_docs ok  1",
            "pydantic_agent update_ticket error PREPARE 1",
            "pydantic_agent update_ticket ok  1",
        ],
        "one row per logical call"
    );
    // The second instrumentation's spans are kept, as `other`.
    assert_eq!(
        sql_count(
            dir.path(),
            "SELECT count(*) FROM spans WHERE stage = 'other' AND tool IN ('search_docs', 'update_ticket') \
             AND (name LIKE 'execute_tool%' OR name = 'search_docs')"
        ),
        4
    );
}
