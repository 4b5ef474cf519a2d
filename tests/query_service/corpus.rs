//! The SQL corpus (`query/tests/sql`, shared with the engine and HTTP tests of the query
//! crate) over the Postgres wire: through psql in one session and through psycopg on one
//! connection. Every error has its SQLSTATE, its code and class in the detail and its
//! message; the session keeps answering after each statement; nothing is written.

use std::path::Path;

use serde_json::json;

use super::psql::{psql, psql_bin, psql_c};
use super::psycopg::run_client;
use super::sql_corpus::{self, Case, Runner};
use super::{corpus_dir, demo, QueryServer};

/// The cases for the Postgres wire, with a COPY target and an external directory in `scratch`.
fn pg_cases(scratch: &Path) -> Vec<Case> {
    let (target, external) = (scratch.join("copied.csv"), scratch.join("external"));
    std::fs::create_dir_all(&external).expect("dir");
    sql_corpus::load(
        &corpus_dir(),
        Runner::Pg,
        &[
            ("copy_target", target.to_str().expect("utf-8 temp path")),
            ("external_dir", external.to_str().expect("utf-8 temp path")),
        ],
    )
}

fn span_count(server: &QueryServer) -> String {
    psql_c(server, "SELECT count(*) FROM spans").rows()[0][0].clone()
}

/// Nothing the corpus ran wrote a file or a row.
fn assert_nothing_written(scratch: &Path, server: &QueryServer, spans_before: &str) {
    assert!(!scratch.join("copied.csv").exists(), "COPY wrote a file");
    assert_eq!(
        std::fs::read_dir(scratch.join("external"))
            .expect("dir")
            .count(),
        0
    );
    assert_eq!(span_count(server), spans_before);
}

#[test]
fn the_sql_corpus_through_psql_in_one_session() {
    psql_bin(); // fail first, with the install hint, when psql is missing
    let server = &demo().server;
    let scratch = tempfile::tempdir().expect("temp dir");
    let cases = pg_cases(scratch.path());
    let before = span_count(server);
    // One script, one session: `\warn` marks where each statement's errors start in stderr;
    // `\g` sends the statement as written (a `;` would be sent along).
    let mut script = String::new();
    for (i, case) in cases.iter().enumerate() {
        script.push_str(&format!(
            "\\warn @@case {i}\n{}\n\\g\nSELECT 'alive{i}' AS check;\n",
            case.sql
        ));
    }
    let script_path = scratch.path().join("corpus.sql");
    std::fs::write(&script_path, &script).expect("write script");
    let r = psql(
        server,
        &[
            "-v",
            "ON_ERROR_STOP=0",
            "-f",
            script_path.to_str().expect("utf-8"),
        ],
    );
    let (stdout, stderr) = (r.stdout(), r.stderr());
    let chunks: Vec<&str> = stderr.split("@@case ").skip(1).collect();
    assert_eq!(chunks.len(), cases.len(), "{stderr}");
    for (i, case) in cases.iter().enumerate() {
        let chunk = chunks[i]
            .strip_prefix(&format!("{i}\n"))
            .unwrap_or_else(|| panic!("stderr out of order at case {i}: {stderr}"));
        assert!(
            stdout.lines().any(|l| l == format!("alive{i}")),
            "the session answers after {}: {stdout}\n{stderr}",
            case.name()
        );
        let Some(code) = case.code() else {
            assert!(!chunk.contains("ERROR:"), "{}: {chunk}", case.name());
            continue;
        };
        let state = case.sqlstate().expect("an error has a SQLSTATE");
        assert_eq!(
            chunk.matches("ERROR:  ").count(),
            1,
            "{}: {chunk}",
            case.name()
        );
        let Some((_, rest)) = chunk.split_once(&format!("ERROR:  {state}: ")) else {
            panic!(
                "{}: not refused with SQLSTATE {state}: {chunk}",
                case.name()
            );
        };
        for detail in [
            format!("code: {code}"),
            format!("class: {}", case.class().expect("class")),
            "retryable: false".to_string(),
        ] {
            assert!(chunk.contains(&detail), "{}: {chunk}", case.name());
        }
        case.check_message(rest.lines().next().unwrap_or(""), chunk);
    }
    assert!(
        !stderr.contains("DataFusion") && !stderr.contains("datafusion::"),
        "{stderr}"
    );
    assert_nothing_written(scratch.path(), server, &before);
}

#[test]
fn the_sql_corpus_through_psycopg_on_one_connection() {
    let server = &demo().server;
    let scratch = tempfile::tempdir().expect("temp dir");
    let cases = pg_cases(scratch.path());
    let before = span_count(server);
    let statements: Vec<&str> = cases.iter().map(|c| c.sql.as_str()).collect();
    let results = run_client(&json!({ "statements": statements }));
    let answered = results["statements"].as_array().expect("statements");
    assert_eq!(answered.len(), cases.len());
    for (case, r) in cases.iter().zip(answered) {
        assert_eq!(r["after"], 1, "the connection keeps answering: {r}");
        let Some(code) = case.code() else {
            assert_eq!(r["ok"], true, "{}: {r}", case.name());
            continue;
        };
        assert_eq!(r["ok"], false, "{}: {r}", case.name());
        assert_eq!(
            r["sqlstate"].as_str(),
            case.sqlstate(),
            "{}: {r}",
            case.name()
        );
        let detail = r["detail"].as_str().unwrap_or("");
        for want in [
            format!("code: {code}"),
            format!("class: {}", case.class().expect("class")),
            "retryable: false".to_string(),
        ] {
            assert!(detail.contains(&want), "{}: {r}", case.name());
        }
        case.check_message(r["message"].as_str().unwrap_or(""), &r.to_string());
    }
    assert_nothing_written(scratch.path(), server, &before);
}
