//! Hostile input against ingest: tool names that cannot be a directory name (too long for a
//! path segment as they are, or once percent-encoded). Before, the first such span failed its
//! flush with "File name too long" and the writer retried it forever: every later export got
//! no answer, `/readyz` turned 503 and SIGTERM could not finish.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::{sql_json, Server};

/// One finished tool call span (a root: nothing waits for a relative) named `tool`.
fn export(tool: &str, trace: u64) -> String {
    json!({"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "hostile"}}]},
        "scopeSpans": [{"spans": [{
            "traceId": format!("{trace:032x}"),
            "spanId": format!("{:016x}", trace + 1),
            "name": "execute_tool",
            "kind": 1,
            "startTimeUnixNano": "1764410400000000000",
            "endTimeUnixNano": "1764410400250000000",
            "attributes": [
                {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
                {"key": "gen_ai.tool.name", "value": {"stringValue": tool}},
            ],
        }]}],
    }]})
    .to_string()
}

async fn post(client: &reqwest::Client, url: &str, body: String) -> u16 {
    let r = client
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap_or_else(|e| panic!("the export got no answer: {e}"));
    r.status().as_u16()
}

/// The longest prefix of `s` of at most `n` bytes that ends on a character.
fn first_bytes(s: &str, n: usize) -> &str {
    let mut end = n.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The longest file or directory name under `dir`.
fn longest_name(dir: &Path) -> usize {
    let mut longest = 0;
    for entry in std::fs::read_dir(dir)
        .expect("the table directory")
        .flatten()
    {
        longest = longest.max(entry.file_name().len());
        if entry.path().is_dir() {
            longest = longest.max(longest_name(&entry.path()));
        }
    }
    longest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_names_that_cannot_be_a_directory_stop_nothing_and_keep_their_name() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let client = reqwest::Client::new();
    let hostile = [
        "a".repeat(251),
        "/".repeat(100),
        "検索".repeat(43),
        "x".repeat(10_000),
    ];
    for (k, tool) in hostile.iter().enumerate() {
        let status = post(&client, &server.url(), export(tool, 0x1000 + 16 * k as u64)).await;
        assert_eq!(status, 200, "tool name of {} bytes", tool.len());
    }
    // Later exports are answered and stored; the receiver stays ready.
    for k in 0..5u64 {
        let status = post(
            &client,
            &server.url(),
            export("search_docs", 0x9000 + 16 * k),
        )
        .await;
        assert_eq!(status, 200);
    }
    let ready = client
        .get(format!("{}/readyz", server.base()))
        .send()
        .await
        .expect("the probe answers");
    assert_eq!(ready.status().as_u16(), 200, "ready after hostile names");

    // SIGTERM finishes promptly.
    let mut server = server;
    let pid = server.child.id().to_string();
    let _ = Command::new("kill").args(["-TERM", &pid]).status();
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.is_running() {
        assert!(
            Instant::now() < deadline,
            "serve did not exit within 20 s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // Each hostile span is found by its tool name (names are kept up to 256 bytes, cut on a
    // character), and no directory name is too long.
    for tool in &hostile {
        let name = first_bytes(tool, 256);
        let rows = sql_json(
            dir.path(),
            &format!("SELECT tool, stage FROM spans WHERE tool = '{name}'"),
        );
        assert_eq!(rows.len(), 1, "tool name of {} bytes", tool.len());
        assert_eq!(rows[0]["tool"], Value::String(name.to_string()));
    }
    let normal = sql_json(
        dir.path(),
        "SELECT count(*) AS n FROM spans WHERE tool = 'search_docs'",
    );
    assert_eq!(normal[0]["n"], 5);
    let longest = longest_name(&dir.path().join("spans"));
    assert!(
        longest <= 128,
        "a directory or file name of {longest} bytes"
    );
}
