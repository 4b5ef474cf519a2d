//! Python psycopg against the demo server (`tests/pg/client.py`): Grafana's metadata
//! queries, every dashboard panel, parameters and types, each in four protocol modes
//! (extended, prepared, binary, simple), and a transaction that outlives a refused statement.

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::{json, Value};

use super::grafana::{dashboard_panels, grafana_metadata};
use super::{demo, PASSWORD, USER};
use crate::support::{python, repo_root};

const OID_INT8: i64 = 20;
const OID_INT4: i64 = 23;
const OID_TEXT: i64 = 25;
const OID_FLOAT8: i64 = 701;
const OID_TIMESTAMPTZ: i64 = 1184;
const OID_BOOL: i64 = 16;
const OID_DATE: i64 = 1082;

/// Runs `tests/pg/client.py` with `jobs` against the demo server and returns its JSON.
pub(super) fn run_client(jobs: &Value) -> Value {
    let scratch = tempfile::tempdir().expect("temp dir");
    let jobs_path = scratch.path().join("jobs.json");
    std::fs::write(&jobs_path, jobs.to_string()).expect("write jobs");
    let out = Command::new(python())
        .arg(repo_root().join("tests/pg/client.py"))
        .args(["127.0.0.1", &demo().server.pg.to_string(), USER, PASSWORD])
        .arg(&jobs_path)
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "psycopg client failed (install tests/pg/requirements.txt into $TOOLSPAN_PYTHON; scripts/test does):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let results: Value = serde_json::from_slice(&out.stdout).expect("client JSON");
    assert_eq!(results["server_version"], 150000);
    results
}

#[test]
fn psycopg_runs_grafanas_queries_in_four_protocol_modes() {
    let panels = dashboard_panels(&demo().server);
    let mut queries: Vec<Value> = grafana_metadata()
        .into_iter()
        .map(|(name, sql)| json!({"name": format!("meta {name}"), "sql": sql}))
        .collect();
    queries.push(json!({"name": "ping", "sql": "-- ping"}));
    queries.push(json!({"name": "select 1", "sql": "SELECT 1"}));
    for p in &panels {
        queries
            .push(json!({"name": format!("panel {}", p.name), "sql": p.sql, "format": p.format}));
    }
    queries.push(json!({
        "name": "parameters",
        "sql": "SELECT count(*) AS n FROM spans WHERE tool = %s AND attempt >= %s AND duration_ms > %s",
        "params": ["search_docs", 1, 0.0]
    }));
    queries.push(json!({
        "name": "types",
        "sql": "SELECT tool, attempt, input_tokens, duration_ms, leaked_internals, start_time, date FROM spans WHERE attempt IS NOT NULL LIMIT 5"
    }));
    let results = run_client(&json!({ "queries": queries }));
    let formats: BTreeMap<String, String> = panels
        .iter()
        .map(|p| (format!("panel {}", p.name), p.format.clone()))
        .collect();
    let answered = results["queries"].as_array().expect("queries");
    assert_eq!(answered.len(), queries.len() * 4, "four modes each");
    for r in answered {
        let name = r["name"].as_str().expect("name");
        let mode = r["mode"].as_str().expect("mode");
        assert_eq!(r["ok"], true, "{name} ({mode}) failed: {r}");
        let cols = r["columns"].as_array().expect("columns");
        let oid = |col: &str| {
            cols.iter()
                .find(|c| c["name"] == col)
                .and_then(|c| c["oid"].as_i64())
        };
        if formats.get(name).is_some_and(|f| f == "time_series") {
            assert_eq!(
                oid("time"),
                Some(OID_FLOAT8),
                "{name} ({mode}): time is float8 epoch seconds: {r}"
            );
            assert!(
                cols.iter()
                    .skip(1)
                    .any(|c| [OID_INT8, OID_INT4, OID_FLOAT8]
                        .contains(&c["oid"].as_i64().unwrap_or(0))),
                "{name} ({mode}) has a numeric value column: {r}"
            );
            assert!(
                r["rows"].as_i64().unwrap_or(0) > 0,
                "{name} ({mode}) has points from the demo: {r}"
            );
        }
        if name.starts_with("panel") && cols.iter().any(|c| c["name"] == "start_time") {
            assert_eq!(oid("start_time"), Some(OID_TIMESTAMPTZ), "{name}: {r}");
        }
        match name {
            "ping" => assert!(cols.is_empty(), "{r}"),
            "parameters" => assert!(r["first"][0].as_str().is_some_and(|n| n != "0"), "{r}"),
            "types" => {
                for (col, want) in [
                    ("tool", OID_TEXT),
                    ("attempt", OID_INT4),
                    ("input_tokens", OID_INT8),
                    ("duration_ms", OID_FLOAT8),
                    ("leaked_internals", OID_BOOL),
                    ("start_time", OID_TIMESTAMPTZ),
                    ("date", OID_DATE),
                ] {
                    assert_eq!(oid(col), Some(want), "{col} ({mode}): {r}");
                }
                assert_eq!(r["types"][0], "str", "{r}");
                assert_eq!(r["types"][5], "datetime", "{r}");
                assert_eq!(r["types"][6], "date", "{r}");
            }
            _ => {}
        }
    }
}

#[test]
fn a_psycopg_transaction_outlives_a_refused_statement() {
    let results = run_client(&json!({ "transaction": true }));
    let tx = &results["transaction"];
    assert_eq!(tx["refused"], "42501", "{tx}");
    assert_eq!(tx["first"], tx["again"], "{tx}");
}
