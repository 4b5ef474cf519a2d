//! The README's queries, run as written (the debug binary in place of `cargo run --release
//! --`) against a short demo's table: each answers, and the first counts what it says.

use std::process::Command;

use crate::support::{bin, repo_root, run_demo, sql_count};

/// The commands of the README's `sh` blocks that start with `prefix`, continuation lines
/// joined, each with the comment line above it.
fn commands(readme: &str, prefix: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut in_sh = false;
    let (mut comment, mut command) = (String::new(), String::new());
    for line in readme.lines() {
        let t = line.trim();
        if !in_sh {
            in_sh = t == "```sh";
            continue;
        }
        if t == "```" {
            in_sh = false;
            continue;
        }
        if command.is_empty() && t.starts_with('#') {
            comment = t.to_string();
            continue;
        }
        if command.is_empty() && t.is_empty() {
            continue;
        }
        match t.strip_suffix('\\') {
            Some(part) => {
                command.push_str(part);
                command.push(' ');
            }
            None => {
                command.push_str(t);
                let c = std::mem::take(&mut command);
                if c.starts_with(prefix) {
                    out.push((comment.clone(), c));
                }
            }
        }
    }
    out
}

#[test]
fn every_readme_query_answers_and_the_parse_query_counts_calls() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).expect("README.md");
    let prefix = "cargo run --release -- sql";
    let queries = commands(&readme, prefix);
    assert!(
        queries.len() >= 4,
        "the README's queries are found: {queries:?}"
    );
    let dir = tempfile::tempdir().expect("dir");
    run_demo(dir.path(), 5, 60);

    let mut parse_count = None;
    for (comment, command) in &queries {
        // As a shell runs it, with this checkout's binary and the demo's table.
        let script = command.replacen(
            "cargo run --release --",
            &format!("'{}' --log error", bin()),
            1,
        );
        let out = Command::new("sh")
            .args(["-c", &script])
            .env("TOOLSPAN_DATA_DIR", dir.path())
            .output()
            .expect("run sh");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{comment}\n{command}\nfailed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!stdout.trim().is_empty(), "{command} printed nothing");
        // The recovered/exhausted query gives the trace to open; "where do calls fail" lists
        // tool stages only (no `_none` tool, no agent runs).
        if command.contains("recovered_after_retry") {
            assert!(
                stdout.lines().take(3).any(|h| h.contains("trace_id")),
                "{command}: no trace_id column:\n{stdout}"
            );
        }
        if command.contains("failed_stage_spans") {
            assert!(
                !stdout.contains("_none") && !stdout.contains(" agent "),
                "{command}: rows that are not a tool's stages:\n{stdout}"
            );
        }
        if command.contains("error_type = 'PARSE'") && command.contains("search_docs") {
            let last = stdout.trim().lines().last().unwrap_or("").trim();
            parse_count = Some(
                last.parse::<i64>()
                    .unwrap_or_else(|e| panic!("{command}: {e}: {stdout}")),
            );
        }
    }
    let parse_count = parse_count.expect("the README asks for PARSE errors on search_docs");
    let calls = sql_count(
        dir.path(),
        "SELECT count(*) FROM spans WHERE stage = 'call' AND tool = 'search_docs' \
         AND status = 'error' AND error_type = 'PARSE'",
    );
    assert!(calls > 0, "the demo has failed PARSE calls of search_docs");
    assert_eq!(
        parse_count, calls,
        "the README's PARSE query counts failed calls, each once"
    );
}
