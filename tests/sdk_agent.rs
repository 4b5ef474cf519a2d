//! The agent side end to end: a scripted agent using the toolspan Python SDK
//! (`sdk/python/tests/e2e_agent.py`) exports over OTLP/HTTP to `toolspan serve`; the table
//! classifies every span as the SDK meant it, the `calls` view shows attempts, recovery and
//! exhaustion, the model-facing results leak nothing while the log holds each traceback
//! under its reference. Also runs the SDK's own pytest suite.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use crate::support::{python, repo_root, sql_count, sql_json, Server};

/// The checkout's SDK source, ahead of any installed copy.
fn sdk_src() -> PathBuf {
    repo_root().join("sdk/python/src")
}

fn run_python(args: &[&str], cwd: &Path) -> Output {
    Command::new(python())
        .args(args)
        .current_dir(cwd)
        .env("PYTHONPATH", sdk_src())
        .env("OTEL_SDK_DISABLED", "false")
        .output()
        .expect("run the venv's Python (scripts/test installs it)")
}

fn check(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// (stage, error_type or "", attempt) of every span of one call, in start order.
fn stages_of(dir: &Path, call_id: &str) -> Vec<(String, String, i64)> {
    sql_json(
        dir,
        &format!(
            "SELECT stage, coalesce(error_type, '') AS et, coalesce(attempt, 0) AS attempt FROM spans \
             WHERE service = 'e2e-agent' AND call_id = '{call_id}' ORDER BY start_time_unix_nano, stage"
        ),
    )
    .iter()
    .map(|r| {
        (
            r["stage"].as_str().unwrap_or_default().to_string(),
            r["et"].as_str().unwrap_or_default().to_string(),
            r["attempt"].as_i64().unwrap_or(0),
        )
    })
    .collect()
}

fn s(stage: &str, et: &str, attempt: i64) -> (String, String, i64) {
    (stage.to_string(), et.to_string(), attempt)
}

#[test]
fn sdk_agent_spans_land_classified_and_the_model_sees_only_envelopes() {
    let dir = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let results_path = work.path().join("results.json");
    let log_path = work.path().join("agent.log");
    let server = Server::start(dir.path());
    let agent = repo_root().join("sdk/python/tests/e2e_agent.py");
    let out = run_python(
        &[
            agent.to_str().unwrap(),
            "--endpoint",
            &server.base(),
            "--out",
            results_path.to_str().unwrap(),
            "--log",
            log_path.to_str().unwrap(),
        ],
        work.path(),
    );
    check(&out, "the scripted agent");
    drop(server);

    // Stage and error type per span, as classification derives them from what the SDK emitted.
    // A call with a single permitted attempt has no attempt span: its stages hang off the
    // call and have no attempt number (0 here), the call row counts 1 attempt.
    let expected: BTreeMap<&str, Vec<(String, String, i64)>> = BTreeMap::from([
        (
            "c_prepare",
            vec![s("call", "PREPARE", 1), s("prepare", "PREPARE", 0)],
        ),
        (
            "c_refused",
            vec![
                s("call", "NETWORK", 1),
                s("prepare", "", 0),
                s("send", "NETWORK", 0),
            ],
        ),
        (
            "c_recover",
            vec![
                s("call", "", 2),
                s("attempt", "NETWORK", 1),
                s("prepare", "", 1),
                s("send", "NETWORK", 1),
                s("attempt", "", 2),
                s("prepare", "", 2),
                s("send", "", 2),
                s("parse", "", 2),
            ],
        ),
        (
            "c_exhaust",
            vec![
                s("call", "RETRY_EXHAUSTED", 3),
                s("attempt", "NETWORK", 1),
                s("prepare", "", 1),
                s("send", "NETWORK", 1),
                s("attempt", "NETWORK", 2),
                s("prepare", "", 2),
                s("send", "NETWORK", 2),
                s("attempt", "NETWORK", 3),
                s("prepare", "", 3),
                s("send", "NETWORK", 3),
            ],
        ),
        (
            "c_tool_error",
            vec![
                s("call", "TOOL_ERROR", 1),
                s("prepare", "", 0),
                s("execute", "TOOL_ERROR", 0),
            ],
        ),
        (
            "c_parse",
            vec![
                s("call", "PARSE", 1),
                s("attempt", "PARSE", 1),
                s("prepare", "", 1),
                s("send", "", 1),
                s("parse", "PARSE", 1),
            ],
        ),
        (
            "c_ok",
            vec![s("call", "", 1), s("prepare", "", 0), s("execute", "", 0)],
        ),
    ]);
    for (call_id, want) in &expected {
        assert_eq!(&stages_of(dir.path(), call_id), want, "spans of {call_id}");
    }
    // The agent run is the root; nothing of the SDK's lands in `other`.
    assert_eq!(
        sql_count(
            dir.path(),
            "SELECT count(*) FROM spans WHERE service = 'e2e-agent' AND stage = 'other'"
        ),
        0
    );
    assert_eq!(
        sql_count(
            dir.path(),
            "SELECT count(*) FROM spans WHERE stage = 'agent' AND agent = 'support-agent'"
        ),
        1
    );

    // The `calls` view: attempts, recovery, exhaustion.
    let calls = sql_json(
        dir.path(),
        "SELECT call_id, tool, attempts, status, coalesce(error_type, '') AS et, recovered_after_retry, \
         leaked_internals, coalesce(reference, '') AS reference FROM calls ORDER BY call_id",
    );
    let by_id: BTreeMap<&str, &Value> = calls
        .iter()
        .map(|r| (r["call_id"].as_str().unwrap(), r))
        .collect();
    let view = |id: &str| {
        let r = by_id
            .get(id)
            .unwrap_or_else(|| panic!("no call {id} in {calls:?}"));
        (
            r["attempts"].as_i64().unwrap(),
            r["status"].as_str().unwrap().to_string(),
            r["et"].as_str().unwrap().to_string(),
            r["recovered_after_retry"].as_bool().unwrap(),
        )
    };
    assert_eq!(view("c_recover"), (2, "ok".into(), "".into(), true));
    assert_eq!(
        view("c_exhaust"),
        (3, "error".into(), "RETRY_EXHAUSTED".into(), false)
    );
    assert_eq!(view("c_parse"), (1, "error".into(), "PARSE".into(), false));
    assert_eq!(
        view("c_prepare"),
        (1, "error".into(), "PREPARE".into(), false)
    );
    assert_eq!(
        view("c_refused"),
        (1, "error".into(), "NETWORK".into(), false)
    );
    assert_eq!(
        view("c_tool_error"),
        (1, "error".into(), "TOOL_ERROR".into(), false)
    );
    assert_eq!(view("c_ok"), (1, "ok".into(), "".into(), false));

    // The README's query finds the parse failure (its parse stage, attempt and call).
    let parse = sql_count(
        dir.path(),
        "SELECT count(*) FROM spans WHERE tool = 'search_docs' AND error_type = 'PARSE' AND start_time > now() - INTERVAL '1 hour'",
    );
    assert_eq!(parse, 3);

    // What the model saw: envelopes without frames, paths, SQL or driver text; the
    // unwrapped tool handed it a traceback.
    let results: Value =
        serde_json::from_str(&std::fs::read_to_string(&results_path).unwrap()).unwrap();
    let log = std::fs::read_to_string(&log_path).unwrap();
    for (call_id, r) in results.as_object().unwrap() {
        let content = r["content"].as_str().unwrap();
        if call_id == "c_leak" {
            assert!(content.contains("Traceback (most recent call last)"));
            continue;
        }
        for marker in [
            "Traceback",
            "File \"",
            "/srv/",
            ".py",
            "SELECT",
            "psycopg",
            "tickets_v2",
        ] {
            assert!(
                !content.contains(marker),
                "{call_id}: the model saw {marker:?}: {content}"
            );
        }
        if call_id == "c_ok" || call_id == "c_recover" {
            assert_eq!(r["status"], "ok", "{call_id}");
            continue;
        }
        let envelope: Value = serde_json::from_str(content).unwrap();
        let reference = r["reference"].as_str().unwrap();
        assert_eq!(envelope["error"]["reference"], reference, "{call_id}");
        // The same reference: on the call row, and in the log next to the traceback.
        assert_eq!(by_id[call_id.as_str()]["reference"], reference, "{call_id}");
        let record = log
            .split_inclusive('\n')
            .skip_while(|l| !(l.contains(reference) && l.contains(" ERROR ")))
            .take(40)
            .collect::<String>();
        assert!(
            record.contains("Traceback (most recent call last)"),
            "{call_id}: no traceback logged under {reference}:\n{log}"
        );
    }
    let record = |id: &str| {
        log.lines()
            .find(|l| l.contains(results[id]["reference"].as_str().unwrap()))
            .unwrap()
            .to_string()
    };
    assert!(record("c_tool_error").contains("internal_error"));
    assert!(log.contains("relation \"tickets_v2\" does not exist"));
    let prepare: Value =
        serde_json::from_str(results["c_prepare"]["content"].as_str().unwrap()).unwrap();
    assert_eq!(prepare["error"]["field"], "status");
    assert_eq!(prepare["error"]["received"], "resolved");
    assert_eq!(
        prepare["error"]["permitted"],
        serde_json::json!(["open", "pending", "closed"])
    );

    // leaked_internals: false for every enveloped result, true for the unwrapped tool.
    let leaks = sql_json(
        dir.path(),
        "SELECT call_id, leaked_internals FROM spans WHERE service = 'e2e-agent' AND stage = 'call' ORDER BY call_id",
    );
    assert_eq!(leaks.len(), 8);
    for r in &leaks {
        let leaked = r["leaked_internals"].as_bool().unwrap();
        assert_eq!(leaked, r["call_id"] == "c_leak", "{r}");
    }
    assert_eq!(
        by_id["c_leak"]["leaked_internals"], true,
        "calls view flags the leak"
    );
}

/// A tool service in a second process continues the trace the SDK's send stage
/// propagated and exports its own spans, one request each, before the agent exports its
/// send stage; toolspan attributes them to the calling tool's call and attempt, and the
/// failing service's span counts in the tool's failures.
#[test]
fn a_tool_service_in_a_second_process_is_attributed_to_the_calling_tool() {
    let dir = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let results_path = work.path().join("results.json");
    let server = Server::start(dir.path());
    let agent = repo_root().join("sdk/python/tests/e2e_tool_service.py");
    let out = run_python(
        &[
            agent.to_str().unwrap(),
            "--endpoint",
            &server.base(),
            "--out",
            results_path.to_str().unwrap(),
        ],
        work.path(),
    );
    check(&out, "the agent with a remote tool service");
    let results: Value =
        serde_json::from_str(&std::fs::read_to_string(&results_path).unwrap()).unwrap();
    assert_eq!(results["c_remote_ok"], "ok");
    assert_ne!(results["c_remote_fail"], "ok");
    // Both sides: the agent's 2 calls x (call, prepare, send, execute?, parse) and the
    // service's server and database spans; wait until the service's four have landed.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while sql_count(
        dir.path(),
        "SELECT count(*) FROM spans WHERE service = 'docs-service'",
    ) < 4
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the service's spans did not land"
        );
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    // Let assembly release what waits for the agent's export.
    std::thread::sleep(std::time::Duration::from_secs(1));
    drop(server);
    let rows = sql_json(
        dir.path(),
        "SELECT name, tool, coalesce(call_id, '') AS call_id, stage, status, \
         coalesce(error_type, '') AS et FROM spans WHERE service = 'docs-service' \
         ORDER BY call_id, start_time_unix_nano",
    );
    assert_eq!(rows.len(), 4, "{rows:?}");
    for r in &rows {
        assert_eq!(
            r["tool"], "search_docs",
            "attributed to the calling tool: {r}"
        );
    }
    let of = |call: &str, name: &str| {
        rows.iter()
            .find(|r| r["call_id"] == call && r["name"].as_str().unwrap_or("").starts_with(name))
            .unwrap_or_else(|| panic!("{call} {name} in {rows:?}"))
            .clone()
    };
    // The service's server span is the tool's work: the execute stage of that call.
    let ok = of("c_remote_ok", "GET");
    assert_eq!(
        (ok["stage"].as_str(), ok["status"].as_str()),
        (Some("execute"), Some("unset"))
    );
    let failed = of("c_remote_fail", "GET");
    assert_eq!(
        (
            failed["stage"].as_str(),
            failed["status"].as_str(),
            failed["et"].as_str()
        ),
        (Some("execute"), Some("error"), Some("TOOL_ERROR"))
    );
    assert_eq!(of("c_remote_fail", "db.query")["status"], "error");
    // Counted in the tool's failure rates with the rest of the call.
    assert!(
        sql_count(
            dir.path(),
            "SELECT CAST(coalesce(sum(failures), 0) AS BIGINT) FROM failure_rates \
             WHERE tool = 'search_docs' AND stage = 'execute' AND error_type = 'TOOL_ERROR'"
        ) >= 1
    );
}

#[test]
fn sdk_python_pytest_suite_passes() {
    let sdk = repo_root().join("sdk/python");
    let out = run_python(
        &["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        &sdk,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    check(&out, "the SDK's pytest suite (sdk/python/tests)");
    assert!(
        stdout.contains(" passed") && !stdout.contains(" skipped"),
        "every SDK test ran: {stdout}"
    );
}
