//! The official OpenTelemetry JS SDK end to end: `tests/js/agent.mjs`, a
//! JavaScript agent with a `SimpleSpanProcessor` and the OTLP/HTTP exporter, sends every span
//! in its own request to `toolspan serve`, children before parents (a span is exported when
//! it ends). Only the tool call spans carry the tool's name and call id, and no span carries
//! `error.type`: the table must still give every span of a call its tool and call id, and the
//! failed parse stage, its attempt and its call the type `PARSE`. Node.js must be installed;
//! `scripts/test` installs the npm packages (`tests/js/package-lock.json`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{repo_root, sql_count, sql_json, Server};

/// Node.js: `TOOLSPAN_NODE`, else `node` on the PATH.
fn node() -> PathBuf {
    std::env::var_os("TOOLSPAN_NODE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("node"))
}

/// Runs the agent against `base` and returns the JSON line it prints: the trace id, the
/// requests it made, and per tool the call id and the span id of each span of the call.
fn run_agent(base: &str) -> Value {
    let js = repo_root().join("tests/js");
    assert!(
        js.join("node_modules/@opentelemetry/sdk-trace-base")
            .is_dir(),
        "{}/node_modules is missing: scripts/test installs it (npm ci --prefix tests/js)",
        js.display()
    );
    let mut cmd = Command::new(node());
    cmd.arg(js.join("agent.mjs")).arg(base).current_dir(&js);
    // The SDK reads OTEL_* variables (sampler, limits, headers, SDK disabled): what the test
    // sends must not depend on the environment it runs in.
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("OTEL_") {
            cmd.env_remove(key);
        }
    }
    let out = cmd.output().unwrap_or_else(|e| {
        panic!(
            "cannot run {:?} ({e}): this test needs Node.js >= 20.6 on the PATH (or TOOLSPAN_NODE)",
            node()
        )
    });
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tests/js/agent.mjs failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("agent.mjs printed no JSON line ({e}): {stdout}"))
}

/// Every span of the trace, once all `n` are in the table (each arrived in its own request;
/// waits while any is still held for its relatives).
fn spans_of_trace(server: &Server, dir: &Path, trace: &str, n: usize) -> Vec<Value> {
    let sql = format!(
        "SELECT span_id, stage, tool, coalesce(call_id, '') AS call_id, coalesce(attempt, 0) AS attempt, \
         status, coalesce(error_type, '') AS et, agent FROM spans WHERE trace_id = '{trace}'"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let rows = sql_json(dir, &sql);
        if rows.len() >= n {
            return rows;
        }
        assert!(
            Instant::now() < deadline,
            "{} of the trace's {n} spans in the table after 60 s (toolspan serve on port {}): {rows:?}",
            rows.len(),
            server.port
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn js_sdk_simple_processor_split_trace_gets_tools_and_derived_parse() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let agent = run_agent(&server.base());

    // One request per span: the trace reached toolspan in 12 pieces.
    assert_eq!(agent["requests"], 12, "{agent}");
    assert_eq!(agent["spans"], 12, "{agent}");
    let trace = agent["trace_id"].as_str().unwrap();
    let rows = spans_of_trace(&server, dir.path(), trace, 12);
    drop(server);
    assert_eq!(rows.len(), 12, "{rows:?}");
    let by_span: BTreeMap<&str, &Value> = rows
        .iter()
        .map(|r| (r["span_id"].as_str().unwrap(), r))
        .collect();
    let row = |span: &Value| {
        let id = span.as_str().unwrap();
        *by_span
            .get(id)
            .unwrap_or_else(|| panic!("span {id} not stored: {rows:?}"))
    };

    // The agent run: the root, outside any tool call.
    let root = row(&agent["agent"]);
    let got =
        ["stage", "tool", "agent", "status", "et"].map(|c| root[c].as_str().unwrap_or("null"));
    assert_eq!(got, ["agent", "_none", "js-agent", "unset", ""], "{root}");

    // (span, status, error type, attempt) per span of each call; every one of them has the
    // call's tool and call id, whether it carried them (the call) or not (the rest).
    // js_search's stages hang off its attempt 1; js_lookup's off the call itself (one attempt,
    // no attempt span), so they have no attempt number.
    let expected = [
        (
            "js_search",
            vec![
                ("call", "error", "PARSE", 1),
                ("attempt", "error", "PARSE", 1),
                ("prepare", "ok", "", 1),
                ("send", "ok", "", 1),
                ("execute", "ok", "", 1),
                ("parse", "error", "PARSE", 1),
            ],
        ),
        (
            "js_lookup",
            vec![
                ("call", "ok", "", 1),
                ("prepare", "ok", "", 0),
                ("send", "ok", "", 0),
                ("execute", "ok", "", 0),
                ("parse", "ok", "", 0),
            ],
        ),
    ];
    for (tool, spans) in &expected {
        let call = &agent["calls"][tool];
        let call_id = call["call_id"].as_str().unwrap();
        assert!(call_id.starts_with("call_"), "{agent}");
        assert_eq!(call["spans"].as_object().unwrap().len(), spans.len());
        for &(stage, status, et, attempt) in spans {
            let r = row(&call["spans"][stage]);
            let got = (
                r["stage"].as_str().unwrap(),
                r["tool"].as_str().unwrap(),
                r["call_id"].as_str().unwrap(),
                r["status"].as_str().unwrap(),
                r["et"].as_str().unwrap(),
                r["attempt"].as_i64().unwrap(),
            );
            assert_eq!(
                got,
                (stage, *tool, call_id, status, et, attempt),
                "{tool} {stage}: {r}"
            );
        }
    }

    // What a user asks of it: the README's query finds the parse failure (stage, attempt and
    // call), and the `calls` view shows js_search failed in parsing, js_lookup succeeded.
    assert_eq!(
        sql_count(
            dir.path(),
            "SELECT count(*) FROM spans WHERE tool = 'js_search' AND error_type = 'PARSE'"
        ),
        3
    );
    let calls = sql_json(
        dir.path(),
        "SELECT tool, call_id, attempts, status, coalesce(error_type, '') AS et FROM calls ORDER BY tool",
    );
    let view: Vec<(&str, &str, i64, &str, &str)> = calls
        .iter()
        .map(|r| {
            (
                r["tool"].as_str().unwrap(),
                r["call_id"].as_str().unwrap(),
                r["attempts"].as_i64().unwrap(),
                r["status"].as_str().unwrap(),
                r["et"].as_str().unwrap(),
            )
        })
        .collect();
    let id = |tool: &str| agent["calls"][tool]["call_id"].as_str().unwrap();
    assert_eq!(
        view,
        vec![
            ("js_lookup", id("js_lookup"), 1, "ok", ""),
            ("js_search", id("js_search"), 1, "error", "PARSE"),
        ]
    );
}
