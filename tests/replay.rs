//! Replays and evals end to end: an SDK agent (`tests/replay/agent.py`, payloads captured)
//! makes failing calls through `toolspan serve --http-addr`; `python -m toolspan replay`
//! fetches each by reference from the query API and runs it against the application's own
//! tools (`sdk/python/examples/fleet_tools`): the same failure against the broken tool, fixed
//! against the corrected one, offline from the recorded answers; the replay is stored and
//! names its original. Arguments with a redacted secret and tools with side effects are
//! refused until the user supplies or allows them. `toolspan evals export` groups the
//! failures by fingerprint with SQL's counts, gives the same bytes at the same table version
//! as `GET /api/v1/evals/export`, and `evals run` fails against the broken tool and passes
//! against the fixed one.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{bin, free_port, python, repo_root, sql_count, sql_json, Server};

/// Where the SDK, the example tools and the test's own tool modules import from.
fn pythonpath() -> String {
    let root = repo_root();
    [
        root.join("sdk/python/src"),
        root.join("sdk/python/examples"),
        root.join("tests/replay"),
    ]
    .iter()
    .map(|p| p.display().to_string())
    .collect::<Vec<_>>()
    .join(":")
}

fn py(args: &[&str], envs: &[(&str, &str)]) -> Output {
    Command::new(python())
        .args(args)
        .env("PYTHONPATH", pythonpath())
        .env("OTEL_SDK_DISABLED", "false")
        .env_remove("TOOLSPAN_TOKEN")
        .env_remove("TOOLSPAN_QUERY_URL")
        .envs(envs.iter().copied())
        .output()
        .expect("run the venv's Python (scripts/test installs it)")
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A blocking GET: status, body.
fn get(url: &str) -> (u16, Vec<u8>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let r = reqwest::get(url)
            .await
            .unwrap_or_else(|e| panic!("GET {url}: {e}"));
        let status = r.status().as_u16();
        (status, r.bytes().await.unwrap_or_default().to_vec())
    })
}

fn get_json(url: &str) -> (u16, Value) {
    let (status, body) = get(url);
    let v = serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("{url} answered no JSON ({e}): {body:?}"));
    (status, v)
}

/// Polls `what` until it holds, for at most 60 s (ingest flushes every 100 ms here; a failed
/// call waits in trace assembly for its failing child a few seconds at most).
fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `toolspan evals export` with `args`, its stdout.
fn export(dir: &Path, args: &[&str]) -> Vec<u8> {
    let out = Command::new(bin())
        .args(["evals", "export", "--log", "error", "--data-dir"])
        .arg(dir)
        .args(args)
        .output()
        .expect("run toolspan evals export");
    assert!(out.status.success(), "evals export: {}", text(&out));
    out.stdout
}

/// The header and the cases of an evals file.
fn lines(file: &[u8]) -> (Value, Vec<Value>) {
    let text = std::str::from_utf8(file).expect("UTF-8");
    let mut it = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("each line is JSON"));
    let header = it.next().expect("a header line");
    (header, it.collect())
}

#[test]
fn failed_calls_replay_and_become_eval_cases() {
    let dir = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let http = free_port();
    let server = Server::start_with(
        dir.path(),
        &[
            "--http-addr",
            &format!("127.0.0.1:{http}"),
            "--assembly-wait-secs",
            "1",
        ],
    );
    let api = format!("http://127.0.0.1:{http}");
    let results_path = work.path().join("results.json");
    let agent = repo_root().join("tests/replay/agent.py");
    let out = py(
        &[
            agent.to_str().unwrap(),
            "--endpoint",
            &server.base(),
            "--out",
            results_path.to_str().unwrap(),
        ],
        &[],
    );
    assert!(out.status.success(), "the agent: {}", text(&out));
    let results: Value =
        serde_json::from_str(&std::fs::read_to_string(&results_path).unwrap()).unwrap();
    let reference = |id: &str| results[id]["reference"].as_str().unwrap().to_string();

    // The replay document of each failed call, once its spans have landed.
    let doc = |id: &str| {
        let url = format!("{api}/api/v1/calls/{id}/replay");
        let mut doc = Value::Null;
        wait_for(&format!("the replay document of {id}"), || {
            let (status, v) = get_json(&url);
            doc = v;
            status == 200 && !doc["call"]["stage"].is_null()
        });
        doc
    };
    let parse1 = doc(&reference("c_parse1"));
    assert_eq!(parse1["schema"], "toolspan.replay/1");
    let call = &parse1["call"];
    assert_eq!(
        (
            call["tool"].as_str(),
            call["service"].as_str(),
            call["service_version"].as_str(),
            call["call_id"].as_str(),
            call["stage"].as_str(),
            call["error_type"].as_str(),
            call["error_code"].as_str(),
            call["attempts"].as_i64(),
        ),
        (
            Some("search_docs"),
            Some("support-bot"),
            Some("1.5.0"),
            Some("c_parse1"),
            Some("parse"),
            Some("PARSE"),
            Some("bad_answer"),
            Some(1)
        ),
        "{parse1}"
    );
    assert_eq!(parse1["exact"], true, "{parse1}");
    assert_eq!(
        parse1["arguments"],
        serde_json::json!({"query": "reset password"})
    );
    assert_eq!(parse1["envelope"]["code"], "bad_answer");
    let recorded = &parse1["recorded_responses"][0];
    assert_eq!(
        (recorded["stage"].as_str(), recorded["exact"].as_bool()),
        (Some("send"), Some(true))
    );
    assert!(
        recorded["body"].as_str().unwrap().contains("\"link\""),
        "the docs service's raw answer: {recorded}"
    );
    let version = parse1["table_version"].as_u64().expect("a table version");

    // The same call by TRACEID:SPANID and by its call id; a call id of two traces is refused
    // with their ids; an unknown one is a 404 envelope.
    let ids = format!(
        "{}:{}",
        call["trace_id"].as_str().unwrap(),
        call["span_id"].as_str().unwrap()
    );
    let (status, by_span) = get_json(&format!(
        "{api}/api/v1/calls/{ids}/replay?version={version}"
    ));
    assert_eq!(status, 200, "{by_span}");
    assert_eq!(by_span["call"], parse1["call"]);
    assert_eq!(by_span["table_version"], version);
    let (status, by_call_id) = get_json(&format!("{api}/api/v1/calls/c_parse1/replay"));
    assert_eq!(
        (status, &by_call_id["call"]["span_id"]),
        (200, &call["span_id"])
    );
    doc(&reference("c_dup"));
    let (status, ambiguous) = get_json(&format!("{api}/api/v1/calls/c_dup/replay"));
    assert_eq!(status, 400, "{ambiguous}");
    let message = ambiguous["error"]["message"].as_str().unwrap();
    assert_eq!(ambiguous["error"]["code"], "invalid_argument");
    assert!(
        message.contains("2 calls")
            && message.contains(results["c_dup"]["trace_id"].as_str().unwrap()),
        "{message}"
    );
    let (status, unknown) = get_json(&format!("{api}/api/v1/calls/err_000000000000/replay"));
    assert_eq!(
        (status, unknown["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    let (status, future) = get_json(&format!(
        "{api}/api/v1/calls/c_parse1/replay?version=999999"
    ));
    assert_eq!(
        (status, future["error"]["code"].as_str()),
        (400, Some("invalid_argument"))
    );

    // Replays, offline from the recorded answer (the agent's docs service is gone), traced
    // to toolspan.
    let replay = |r: &str, tools: &str, extra: &[&str]| {
        let mut args = vec![
            "-m",
            "toolspan",
            "replay",
            r,
            "--query-url",
            api.as_str(),
            "--tools",
            "replay_tracing",
            "--tools",
            tools,
            "--format",
            "json",
        ];
        args.extend_from_slice(extra);
        py(&args, &[("REPLAY_OTLP_ENDPOINT", &server.base())])
    };
    let verdict = |out: &Output| -> Value {
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("no JSON: {}", text(out)))
    };
    let parse_ref = reference("c_parse1");
    let same = replay(&parse_ref, "fleet_tools.broken", &["--recorded-responses"]);
    assert_eq!(same.status.code(), Some(1), "{}", text(&same));
    assert_eq!(verdict(&same)["verdict"], "same_failure", "{}", text(&same));
    let fixed = replay(&parse_ref, "fleet_tools.fixed", &["--recorded-responses"]);
    assert_eq!(fixed.status.code(), Some(0), "{}", text(&fixed));
    let fixed = verdict(&fixed);
    assert_eq!(fixed["verdict"], "fixed");
    assert_eq!(fixed["replay_of"], ids.as_str());
    // Both replays are stored as calls of their own that name the original.
    let of = format!(
        "SELECT count(*) FROM spans WHERE stage = 'call' AND tool = 'search_docs' \
         AND json_get_str(attributes, 'toolspan.replay.of') = '{ids}'"
    );
    wait_for("the replays' call spans", || {
        sql_count(dir.path(), &of) == 2
    });
    let replayed = sql_json(
        dir.path(),
        &format!(
            "SELECT trace_id, status, coalesce(error_type, '') AS et FROM spans WHERE stage = 'call' \
             AND json_get_str(attributes, 'toolspan.replay.of') = '{ids}' ORDER BY status"
        ),
    );
    assert_eq!(replayed[0]["status"], "error");
    assert_eq!(replayed[0]["et"], "PARSE");
    assert_ne!(replayed[1]["status"], "error");
    assert_eq!(replayed[1]["trace_id"], fixed["replay"]["trace_id"]);
    assert_ne!(
        replayed[1]["trace_id"], call["trace_id"],
        "a replay is a trace of its own"
    );
    // The viewer links both ways: the replay's page names the call it re-ran, the original's
    // page lists its replays with their outcome.
    let page = |trace: &Value| {
        let (status, body) = get(&format!("{api}/traces/{}", trace.as_str().unwrap_or("")));
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        String::from_utf8_lossy(&body).into_owned()
    };
    let original_href = format!(
        "/traces/{}?span={}",
        call["trace_id"].as_str().unwrap_or(""),
        call["span_id"].as_str().unwrap_or("")
    );
    let replay_page = page(&replayed[1]["trace_id"]);
    assert!(
        replay_page.contains("is a replay of") && replay_page.contains(&original_href),
        "the replay's page links the call it re-ran ({original_href}):\n{replay_page}"
    );
    let original_page = page(&call["trace_id"]);
    assert!(
        original_page.contains("Replays of this trace")
            && original_page.contains(&format!(
                "/traces/{}?span=",
                replayed[1]["trace_id"].as_str().unwrap_or("")
            )),
        "the original's page lists the replay:\n{original_page}"
    );

    // A secret in the arguments, redacted at ingest: refused until supplied.
    let secret = doc(&reference("c_secret"));
    assert_eq!(secret["exact"], false);
    assert_eq!(
        secret["inexact"]["redacted"],
        serde_json::json!(["$.api_key"]),
        "{secret}"
    );
    assert!(!secret["arguments_text"]
        .as_str()
        .unwrap()
        .contains("sk_live_"));
    let refused = replay(&reference("c_secret"), "replay_tools", &[]);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--arg api_key="),
        "{}",
        text(&refused)
    );
    let supplied = replay(
        &reference("c_secret"),
        "replay_tools",
        &["--arg", "api_key=sk_test_local"],
    );
    assert_eq!(supplied.status.code(), Some(1), "{}", text(&supplied));
    assert_eq!(verdict(&supplied)["verdict"], "same_failure");

    // A tool with side effects runs only when allowed.
    let side = reference("c_side");
    doc(&side);
    let refused = replay(&side, "replay_tools", &[]);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("side effects"),
        "{}",
        text(&refused)
    );
    let allowed = replay(&side, "replay_tools", &["--allow-side-effects"]);
    assert_eq!(allowed.status.code(), Some(1), "{}", text(&allowed));
    assert_eq!(verdict(&allowed)["verdict"], "same_failure");

    // The evals file from the API, pinned to the version it read.
    let (status, from_api) = get(&format!(
        "{api}/api/v1/evals/export?tool=search_docs&error_type=parse"
    ));
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&from_api));
    let (header, _) = lines(&from_api);
    let pinned = header["table_version"].as_u64().unwrap().to_string();
    let (status, viewer) = get(&format!(
        "{api}/tools/search_docs/evals.jsonl?error_type=PARSE&version={pinned}"
    ));
    assert_eq!(status, 200);
    assert_eq!(viewer, from_api, "the viewer's download is the same file");
    // The buttons that download it: on the tool page, and beside the failed call on its trace.
    let (_, tool_page) = get(&format!("{api}/tools/search_docs"));
    let tool_page = String::from_utf8_lossy(&tool_page);
    assert!(
        tool_page.contains("href=\"/tools/search_docs/evals.jsonl\"")
            && tool_page.contains("Export as eval cases"),
        "{tool_page}"
    );
    let (_, trace_page) = get(&format!(
        "{api}/traces/{}",
        call["trace_id"].as_str().unwrap()
    ));
    let trace_page = String::from_utf8_lossy(&trace_page);
    assert!(
        trace_page.contains(
            "href=\"/tools/search_docs/evals.jsonl?error_type=PARSE&amp;code=bad_answer\""
        ),
        "{trace_page}"
    );
    drop(server);

    // The CLI at that version: the same bytes, again and again, whatever landed since.
    let at_version = export(
        dir.path(),
        &[
            "--tool",
            "search_docs",
            "--error-type",
            "PARSE",
            "--table-version",
            &pinned,
        ],
    );
    assert_eq!(at_version, from_api);
    assert_eq!(
        export(
            dir.path(),
            &[
                "--tool",
                "search_docs",
                "--error-type",
                "PARSE",
                "--table-version",
                &pinned
            ]
        ),
        at_version
    );

    // At the latest version: fingerprints with SQL's counts, most common first.
    let file = work.path().join("search_docs.evals.jsonl");
    export(
        dir.path(),
        &[
            "--tool",
            "search_docs",
            "--error-type",
            "PARSE",
            "--per-fingerprint",
            "2",
            "--out",
            file.to_str().unwrap(),
        ],
    );
    let latest = std::fs::read(&file).unwrap();
    let (header, cases) = lines(&latest);
    assert_eq!(header["schema"], "toolspan.evals/1");
    assert_eq!(header["cases"].as_u64(), Some(cases.len() as u64));
    let sql_failures = sql_count(
        dir.path(),
        "SELECT count(*) FROM calls WHERE tool = 'search_docs' AND status = 'error' AND error_type = 'PARSE'",
    );
    // Three by the agent, one by the replay against the broken tool.
    assert_eq!(sql_failures, 4);
    let mut fingerprints: Vec<&Value> = Vec::new();
    for c in &cases {
        if !fingerprints
            .iter()
            .any(|f| f["id"] == c["fingerprint"]["id"])
        {
            fingerprints.push(&c["fingerprint"]);
        }
    }
    assert_eq!(
        header["fingerprints"].as_u64(),
        Some(fingerprints.len() as u64)
    );
    let counted: i64 = fingerprints
        .iter()
        .map(|f| f["failures"].as_i64().unwrap())
        .sum();
    assert_eq!(counted, sql_failures, "{fingerprints:?}");
    let top = fingerprints[0];
    assert_eq!(
        (
            top["stage"].as_str(),
            top["error_code"].as_str(),
            top["arguments_shape"].as_str()
        ),
        (
            Some("parse"),
            Some("bad_answer"),
            Some(r#"{"query":"string"}"#)
        ),
        "arguments of one shape, values ignored: one fingerprint"
    );
    assert_eq!(top["failures"].as_i64(), Some(4));
    assert_eq!(cases.len(), 2, "--per-fingerprint 2");
    for c in &cases {
        assert_eq!(c["exact"], true);
        assert_eq!(c["expect"]["not"]["error_code"], "bad_answer");
    }
    // The agent's calls carry the model's turn before them; the replay's call has none.
    let agents: Vec<&Value> = cases
        .iter()
        .filter(|c| c["call"]["service"] == "support-bot")
        .collect();
    assert!(!agents.is_empty(), "{cases:?}");
    for c in agents {
        let said = c["context"]["model_output"].as_str().unwrap_or_default();
        assert!(said.starts_with("calling search_docs"), "{c}");
    }

    // Run as a regression gate: fails against the broken tool, passes against the fixed one.
    let run = |tools: &str| {
        py(
            &[
                "-m",
                "toolspan",
                "evals",
                "run",
                file.to_str().unwrap(),
                "--tools",
                tools,
                "--recorded-responses",
            ],
            &[],
        )
    };
    let broken = run("fleet_tools.broken");
    assert_eq!(broken.status.code(), Some(1), "{}", text(&broken));
    let fixed = run("fleet_tools.fixed");
    assert_eq!(fixed.status.code(), Some(0), "{}", text(&fixed));
    assert!(
        String::from_utf8_lossy(&fixed.stdout).contains("2 passed"),
        "{}",
        text(&fixed)
    );
}
