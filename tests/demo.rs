//! `toolspan demo` produces failures of every type at every stage, recovered and exhausted
//! retries, and no planted secret reaches a query result.

use std::path::Path;
use std::process::Command;

use crate::support::{
    bin, free_port, python, repo_root, run_demo, sql_count, sql_json, sql_raw, start_query,
};

/// `toolspan evals export` of search_docs's `bad_answer` failures at `version` (or the
/// latest) into `out`; its stderr.
fn export_evals(data: &Path, out: &Path, version: Option<&str>) -> String {
    let mut cmd = Command::new(bin());
    cmd.args([
        "evals",
        "export",
        "--tool",
        "search_docs",
        "--error-type",
        "PARSE",
        "--code",
        "bad_answer",
    ])
    .arg("--out")
    .arg(out)
    .arg("--data-dir")
    .arg(data);
    if let Some(v) = version {
        cmd.args(["--table-version", v]);
    }
    let o = cmd.output().expect("run toolspan evals export");
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "evals export failed:\n{stderr}");
    stderr
}

fn evals_on_demo_data(data: &Path) {
    let work = tempfile::tempdir().expect("temp dir");
    let (first, again) = (work.path().join("a.jsonl"), work.path().join("b.jsonl"));
    export_evals(data, &first, None);
    let text = std::fs::read_to_string(&first).expect("the evals file");
    let mut lines = text.lines();
    let header: serde_json::Value =
        serde_json::from_str(lines.next().expect("a header")).expect("a JSON header");
    assert_eq!(header["schema"], "toolspan.evals/1", "{header}");
    let version = header["table_version"].to_string();
    let cases: Vec<serde_json::Value> = lines
        .map(|l| serde_json::from_str(l).expect("a JSON case"))
        .collect();
    assert!(!cases.is_empty(), "the rename's failures are cases: {text}");
    // Every case's fingerprint counts what SQL counts for its group at that version.
    let sql_failures = sql_count(
        data,
        "SELECT count(*) FROM calls WHERE tool = 'search_docs' AND error_type = 'PARSE' \
         AND error_code = 'bad_answer'",
    );
    let mut counted = std::collections::BTreeMap::new();
    for c in &cases {
        let f = &c["fingerprint"];
        assert_eq!(f["error_code"], "bad_answer", "{c}");
        counted.insert(
            f["id"].as_str().unwrap_or_default().to_string(),
            f["failures"].as_i64().unwrap_or_default(),
        );
    }
    assert_eq!(
        counted.values().sum::<i64>(),
        sql_failures,
        "the fingerprints' failures add up to SQL's count: {counted:?}"
    );
    export_evals(data, &again, Some(&version));
    assert_eq!(
        std::fs::read(&first).expect("first file"),
        std::fs::read(&again).expect("second file"),
        "the same export at table version {version} gives the same bytes"
    );
    let run = |tools: &str| {
        Command::new(python())
            .current_dir(repo_root().join("sdk/python/examples"))
            .env("PYTHONPATH", repo_root().join("sdk/python/src"))
            .args(["-m", "toolspan", "evals", "run"])
            .arg(&first)
            .args(["--tools", tools, "--recorded-responses"])
            .output()
            .expect("run python -m toolspan evals run")
    };
    let broken = run("fleet_tools.broken");
    let fixed = run("fleet_tools.fixed");
    let said = |o: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    let n = cases.len();
    assert_eq!(broken.status.code(), Some(1), "{}", said(&broken));
    assert!(
        said(&broken).contains(&format!("{n} cases: 0 passed, {n} failed")),
        "every case fails against the tool as it was:\n{}",
        said(&broken)
    );
    assert_eq!(fixed.status.code(), Some(0), "{}", said(&fixed));
    assert!(
        said(&fixed).contains(&format!("{n} cases: {n} passed, 0 failed")),
        "every case passes against the fix:\n{}",
        said(&fixed)
    );
}

/// The body of `GET path` on 127.0.0.1:`port` (HTTP/1.0, so the server closes when done).
fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(std::time::Duration::from_secs(120)))
        .expect("timeout");
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").expect("send");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    let (head, body) = out.split_once("\r\n\r\n").expect("a response");
    assert!(
        head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200"),
        "{out}"
    );
    body.to_string()
}

#[test]
fn demo_shows_every_error_type_and_stage_and_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let http = free_port();
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
        .arg("--http-addr")
        .arg(format!("127.0.0.1:{http}"))
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
    // Where the viewer is, while the demo runs and in what to try after it.
    let viewer = format!("http://127.0.0.1:{http}/");
    assert!(
        stderr.contains(&format!("viewer on {viewer}")),
        "the demo names its viewer:\n{stderr}"
    );
    let (_, tried) = stderr.split_once("Try:").expect("a Try: list");
    assert!(tried.contains(&viewer), "Try: opens the viewer:\n{tried}");
    assert!(
        tried.contains(
            "toolspan compare --tool update_ticket --service support-bot --before 1.4.2 --after 1.5.0"
        ),
        "Try: compares support-bot's two versions:\n{tried}"
    );
    let trace = tried
        .split_once(&format!("{viewer}traces/"))
        .map(|(_, rest)| {
            rest.chars()
                .take_while(char::is_ascii_hexdigit)
                .collect::<String>()
        })
        .unwrap_or_else(|| panic!("Try: opens a failed call's trace:\n{tried}"));
    assert_eq!(trace.len(), 32, "a trace id: {trace}");
    // The model often calls a failed tool again in the same run: one failed call or more.
    assert!(
        sql_count(
            dir.path(),
            &format!("SELECT count(*) FROM calls WHERE trace_id = '{trace}' AND status = 'error'")
        ) >= 1,
        "the trace named holds a failed call"
    );

    let n = sql_count(
        dir.path(),
        "SELECT count(*) FROM spans WHERE tool = 'search_docs' AND error_type = 'PARSE' AND start_time > now() - INTERVAL '1 hour'",
    );
    assert!(n > 0, "PARSE errors on search_docs in the last hour");

    // Halfway through, the docs service renamed `url` to `link`: the summary says so, and
    // `answer_shapes` has the change with the PARSE failures that followed it.
    assert!(
        stderr.contains("drift     search_docs's answer changed shape at")
            && stderr.contains("$.hits[].link added, $.hits[].url removed"),
        "the summary names the renamed field:\n{stderr}"
    );
    let changes = sql_json(
        dir.path(),
        "SELECT tool, previous_shape_doc, shape_doc, sum(calls) AS calls, \
         sum(parse_failures) AS parse_failures FROM answer_shapes WHERE change \
         GROUP BY 1, 2, 3",
    );
    assert_eq!(changes.len(), 1, "one change: {changes:?}");
    let c = &changes[0];
    assert_eq!(c["tool"], "search_docs");
    assert_eq!(
        c["previous_shape_doc"],
        r#"{"hits":[{"title":"string","url":"string"}]}"#
    );
    assert_eq!(
        c["shape_doc"],
        r#"{"hits":[{"link":"string","title":"string"}]}"#
    );
    // Every answer with `link` fails to parse, unless the call failed before its parse stage
    // (at execute, after the answer arrived).
    let (calls, parse) = (
        c["calls"].as_i64().unwrap_or_default(),
        c["parse_failures"].as_i64().unwrap_or_default(),
    );
    assert!(
        calls > 0 && parse * 10 >= calls * 9,
        "the calls with the new shape failed to parse: {c}"
    );
    // The tool page shows the change: the renamed field, beside the PARSE failures; the trace
    // of a call that failed on the renamed answer says its shape was new.
    let failed_on_link = sql_json(
        dir.path(),
        "SELECT max(trace_id) AS t FROM calls WHERE tool = 'search_docs' AND error_code = 'bad_answer'",
    );
    let trace = failed_on_link[0]["t"]
        .as_str()
        .expect("a bad_answer call")
        .to_string();
    let (mut query, http_port, _) = start_query(dir.path(), "u", "p", &[]);
    let page = http_get(http_port, "/tools/search_docs?since=1d");
    let trace_page = http_get(http_port, &format!("/traces/{trace}"));
    let _ = query.kill();
    let (_, note) = trace_page
        .split_once("class=\"answer-shape\"")
        .unwrap_or_else(|| panic!("the trace page has the answer's shape:\n{trace_page}"));
    assert!(
        note.contains("data-new=\"true\"")
            && note.contains("new shape")
            && note.contains("removed <code>$.hits[].url</code>"),
        "the trace page says the answer's shape was new and what changed:\n{note}"
    );
    let (_, change) = page
        .split_once("class=\"shape-change\"")
        .unwrap_or_else(|| panic!("the tool page shows the change:\n{page}"));
    assert!(
        change.contains("<li data-kind=\"removed\">removed <code>$.hits[].url</code>")
            && change.contains("<li data-kind=\"added\">added <code>$.hits[].link</code>"),
        "the diff names the renamed field:\n{change}"
    );
    assert!(
        change.contains(&format!(
            "{parse} of the {calls} calls that got this shape failed with PARSE"
        )),
        "beside the PARSE failures that followed:\n{change}"
    );

    // The README's evals path on this data: the PARSE failures the rename caused, exported
    // (grouped by fingerprint with SQL's count, the same bytes again at the same table
    // version), fail against the tool as it was and pass against the fix.
    evals_on_demo_data(dir.path());

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

    // The embedded writer maintains its table: compacted when the fleet stops, so the viewer
    // and SQL read tens of files, not one per partition per flush (about 1,000 here).
    let files = data_files(&dir.path().join("spans"));
    assert!(
        (1..=60).contains(&files),
        "{files} data files after the demo (compaction keeps them to tens)"
    );
}

/// The data files of the Delta table at `table` now: the files its log adds, less those it
/// removes (every commit is a JSON file; none are cleaned up within a test).
fn data_files(table: &std::path::Path) -> usize {
    let mut logs: Vec<_> = std::fs::read_dir(table.join("_delta_log"))
        .expect("the table's log")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    logs.sort();
    let mut live = std::collections::HashSet::new();
    for log in logs {
        for line in std::fs::read_to_string(&log).expect("a log entry").lines() {
            let action: serde_json::Value = serde_json::from_str(line).expect("a JSON action");
            if let Some(p) = action["add"]["path"].as_str() {
                live.insert(p.to_string());
            }
            if let Some(p) = action["remove"]["path"].as_str() {
                live.remove(p);
            }
        }
    }
    live.len()
}

/// `serve --http-addr` says where the viewer and the query API are; the demo without a
/// viewer says how to start one.
#[test]
fn serve_prints_the_viewer_url() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let http = free_port();
    let mut serve = Command::new(bin())
        .args(["serve", "--log", "warn", "--otlp-addr"])
        .arg(format!("127.0.0.1:{}", free_port()))
        .arg("--http-addr")
        .arg(format!("127.0.0.1:{http}"))
        .arg("--data-dir")
        .arg(dir.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start toolspan serve");
    let stderr = serve.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let wanted = format!("viewer: http://127.0.0.1:{http}/");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut seen = Vec::new();
    while std::time::Instant::now() < deadline && !seen.iter().any(|l: &String| l.contains(&wanted))
    {
        if let Ok(line) = rx.recv_timeout(std::time::Duration::from_millis(500)) {
            seen.push(line);
        }
    }
    let _ = serve.kill();
    let _ = serve.wait();
    assert!(
        seen.iter().any(|l| l.contains(&wanted)),
        "serve names the viewer:\n{}",
        seen.join("\n")
    );

    let quiet = Command::new(bin())
        .args([
            "demo",
            "--duration",
            "1",
            "--runs-per-second",
            "5",
            "--no-viewer",
        ])
        .args(["--log", "warn", "--otlp-addr"])
        .arg(format!("127.0.0.1:{}", free_port()))
        .arg("--data-dir")
        .arg(dir.path())
        .output()
        .expect("run toolspan demo");
    let text = String::from_utf8_lossy(&quiet.stderr);
    assert!(quiet.status.success(), "demo --no-viewer failed:\n{text}");
    assert!(
        !text.contains("viewer on"),
        "--no-viewer runs none:\n{text}"
    );
    assert!(
        text.contains("toolspan query --data-dir") && text.contains("http://127.0.0.1:8080/"),
        "it says how to open one:\n{text}"
    );
}

/// `toolspan compare` of support-bot 1.4.2 and 1.5.0 on a data directory, as JSON, with
/// `extra` arguments.
fn compare_output(dir: &std::path::Path, tool: &str, extra: &[&str]) -> std::process::Output {
    Command::new(bin())
        .args(["compare", "--tool", tool, "--service", "support-bot"])
        .args(["--before", "1.4.2", "--after", "1.5.0", "--format", "json"])
        .args(extra)
        .arg("--data-dir")
        .arg(dir)
        .output()
        .expect("run toolspan compare")
}

/// `toolspan compare` on a data directory, as JSON.
fn compare_with(dir: &std::path::Path, tool: &str, extra: &[&str]) -> serde_json::Value {
    let out = compare_output(dir, tool, extra);
    assert!(
        out.status.success(),
        "compare {extra:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("compare prints JSON")
}

fn compare(dir: &std::path::Path, tool: &str) -> serde_json::Value {
    compare_with(dir, tool, &[])
}

fn verdict(c: &serde_json::Value, metric: &str) -> String {
    c["metrics"]
        .as_array()
        .expect("metrics")
        .iter()
        .find(|m| m["metric"] == metric && m.get("key").is_none())
        .unwrap_or_else(|| panic!("{metric} missing from {c:#}"))["verdict"]
        .as_str()
        .expect("verdict")
        .to_string()
}

/// The demo fleet runs support-bot 1.4.2, whose `update_ticket` answers failures
/// with stack traces, and 1.5.0, whose `update_ticket` answers with envelopes; nothing else
/// differs. `toolspan compare` names 1.5.0 better on recovery and leaks, and finds no
/// significant difference for a tool that did not change.
#[test]
fn compare_on_demo_data_names_the_envelope_version_better_and_finds_no_difference_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    run_demo(dir.path(), 15, 200);

    let changed = compare(dir.path(), "update_ticket");
    println!("{changed:#}");
    for metric in [
        "recovery_rate",
        "leaked_result_share",
        "unmapped_failure_share",
    ] {
        assert_eq!(
            verdict(&changed, metric),
            "better",
            "{metric}: the envelope version is better:\n{changed:#}"
        );
    }
    assert!(
        changed["calls"][0].as_u64() > Some(100)
            && changed["failure_streaks"][0].as_u64() > Some(10),
        "enough data to tell: {changed:#}"
    );

    // A time range: the last week holds every call of the demo, so the same figures; a range
    // that ends before the demo holds none.
    let week = compare_with(dir.path(), "update_ticket", &["--since", "7d"]);
    assert_eq!(week["calls"], changed["calls"], "{week:#}");
    assert_eq!(
        week["failure_streaks"], changed["failure_streaks"],
        "{week:#}"
    );
    assert_eq!(week["summary"], changed["summary"], "{week:#}");
    let until = (chrono::Utc::now() + chrono::Duration::hours(1))
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let bounded = compare_with(
        dir.path(),
        "update_ticket",
        &["--since", "1d", "--until", &until],
    );
    assert_eq!(bounded["calls"], changed["calls"], "{bounded:#}");
    let old = compare_output(dir.path(), "update_ticket", &["--until", "2020-01-01"]);
    let stderr = String::from_utf8_lossy(&old.stderr);
    assert!(
        !old.status.success() && stderr.contains("not_found") && stderr.contains("no calls"),
        "a range before the data has no calls:\n{stderr}"
    );

    let unchanged = compare(dir.path(), "search_docs");
    println!("{unchanged:#}");
    for m in unchanged["metrics"].as_array().expect("metrics") {
        assert!(
            m["verdict"] == "no significant difference"
                || m["verdict"] == "not enough data"
                || m["verdict"] == "not comparable",
            "search_docs did not change between the versions, yet {} says {}:\n{unchanged:#}",
            m["metric"],
            m["verdict"]
        );
    }
    assert!(
        unchanged["summary"]["no significant difference"]
            .as_array()
            .is_some_and(|a| a.len() >= 5),
        "{unchanged:#}"
    );

    // The same comparison over HTTP, from the query service.
    let (mut query, http, _) = start_query(dir.path(), "u", "p", &[]);
    let body = http_get(
        http,
        "/api/v1/compare?tool=update_ticket&service=support-bot&before=1.4.2&after=1.5.0",
    );
    let ranged = http_get(
        http,
        &format!(
            "/api/v1/compare?tool=update_ticket&service=support-bot&before=1.4.2&after=1.5.0\
             &since=7d&until={}",
            until.replace('+', "%2B")
        ),
    );
    let _ = query.kill();
    let _ = query.wait();
    let over_http: serde_json::Value =
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(over_http["summary"], changed["summary"], "{over_http:#}");
    let ranged: serde_json::Value =
        serde_json::from_str(&ranged).unwrap_or_else(|e| panic!("{e}: {ranged}"));
    assert_eq!(ranged["calls"], changed["calls"], "{ranged:#}");
    assert_eq!(ranged["summary"], changed["summary"], "{ranged:#}");

    // The table form names the verdicts for people.
    let table = Command::new(bin())
        .args([
            "compare",
            "--tool",
            "update_ticket",
            "--service",
            "support-bot",
        ])
        .args(["--before", "1.4.2", "--after", "1.5.0", "--data-dir"])
        .arg(dir.path())
        .output()
        .expect("run toolspan compare");
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.status.success() && text.contains("recovery_rate") && text.contains("better"),
        "{text}"
    );
}

/// The duration a failure's message states, in milliseconds ("after 1000 ms", "within 5 s").
fn stated_ms(message: &str) -> Option<f64> {
    let words: Vec<&str> = message.split_whitespace().collect();
    words.windows(3).find_map(|w| {
        if w[0] != "after" && w[0] != "within" {
            return None;
        }
        let n: f64 = w[1].parse().ok()?;
        match w[2] {
            "ms" => Some(n),
            "s" => Some(n * 1000.0),
            _ => None,
        }
    })
}

/// Every failed trace of a demo run tells one story: a stage whose message states a timeout
/// lasted at least that long, and a rejected argument is one the call sent (the value it
/// quotes is in the call's arguments; a missing one is absent from them).
#[test]
fn demo_failures_agree_with_their_traces() {
    let dir = tempfile::tempdir().unwrap();
    run_demo(dir.path(), 8, 120);
    let timed = sql_json(
        dir.path(),
        "SELECT error_message, duration_ms FROM spans \
         WHERE status = 'error' AND stage IN ('send', 'execute', 'attempt')",
    );
    let mut timeouts = 0;
    for r in &timed {
        let message = r["error_message"].as_str().unwrap_or_default();
        if let Some(ms) = stated_ms(message) {
            let took = r["duration_ms"].as_f64().expect("duration");
            assert!(took >= ms, "{message:?} in {took} ms");
            timeouts += 1;
        }
    }
    assert!(timeouts > 0, "the demo shows timeouts");
    let rejected = sql_json(
        dir.path(),
        "SELECT p.error_message, c.input FROM spans p JOIN spans c \
           ON c.trace_id = p.trace_id AND c.call_id = p.call_id AND c.stage = 'call' \
         WHERE p.stage = 'prepare' AND p.status = 'error' AND p.error_code <> 'internal_error'",
    );
    assert!(!rejected.is_empty(), "the demo shows rejected arguments");
    for r in &rejected {
        let message = r["error_message"].as_str().unwrap_or_default();
        let input = r["input"].as_str().unwrap_or_default();
        if let Some(got) = message.split("got ").nth(1) {
            let value = got.trim_matches('\'');
            assert!(
                input.contains(&format!(":\"{value}\"")) || input.contains(&format!(":{value}")),
                "{message:?} but the call sent {input}"
            );
        } else if let Some(name) = message
            .strip_prefix("required argument '")
            .and_then(|m| m.split('\'').next())
        {
            assert!(
                !input.contains(&format!("\"{name}\"")),
                "{message:?} but the call sent {input}"
            );
        } else {
            panic!("a rejected argument the test does not know: {message:?}");
        }
    }
}
