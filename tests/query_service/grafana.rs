//! Grafana against the demo server: its metadata queries, verbatim from its PostgreSQL data
//! source, and every SQL panel of the provisioned dashboards with Grafana's template
//! variables and macros expanded, through psql. (psycopg runs the same queries in four
//! protocol modes: `psycopg.rs`.)

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use super::psql::{psql_bin, psql_c};
use super::{demo, QueryServer};
use crate::support::{python, repo_root};

// ---- Grafana: its metadata queries, verbatim from its PostgreSQL data source
// (public/app/plugins/datasource/grafana-postgresql-datasource/postgresMetaQuery.ts).

const SCHEMA_CONSTRAINT: &str = r#"
          quote_ident(table_schema) IN (
          SELECT
            CASE WHEN trim(s[i]) = '"$user"' THEN user ELSE trim(s[i]) END
          FROM
            generate_series(
              array_lower(string_to_array(current_setting('search_path'),','),1),
              array_upper(string_to_array(current_setting('search_path'),','),1)
            ) as i,
            string_to_array(current_setting('search_path'),',') s
          )"#;

fn grafana_get_version() -> String {
    "SELECT current_setting('server_version_num')::int/100 as version".into()
}

fn grafana_timescale_version() -> String {
    "SELECT extversion FROM pg_extension WHERE extname = 'timescaledb'".into()
}

fn grafana_show_schemas() -> String {
    r#"SELECT schema_name AS "name"
    FROM information_schema.schemata
    WHERE schema_name NOT IN ('information_schema',
                              'pg_catalog',
                              'pg_toast',
                              '_timescaledb_cache',
                              '_timescaledb_catalog',
                              '_timescaledb_internal',
                              '_timescaledb_config',
                              'timescaledb_information',
                              'timescaledb_experimental')
    ORDER BY schema_name"#
        .into()
}

fn grafana_show_tables(schema: Option<&str>) -> String {
    if let Some(schema) = schema {
        let part = format!("'{}'", schema.replace('\'', "''"));
        return format!(
            "SELECT quote_ident(table_name) AS \"table\"\n      FROM information_schema.tables\n      WHERE quote_ident(table_schema) = {part}\n      ORDER BY 1"
        );
    }
    format!(
        r#"SELECT
    CASE WHEN {c}
      THEN quote_ident(table_name)
      ELSE quote_ident(table_schema) || '.' || quote_ident(table_name)
    END AS "table"
    FROM information_schema.tables
    WHERE quote_ident(table_schema) NOT IN ('information_schema',
                             'pg_catalog',
                             '_timescaledb_cache',
                             '_timescaledb_catalog',
                             '_timescaledb_internal',
                             '_timescaledb_config',
                             'timescaledb_information',
                             'timescaledb_experimental')
    ORDER BY CASE WHEN {c} THEN 0 ELSE 1 END, 1"#,
        c = SCHEMA_CONSTRAINT
    )
}

fn grafana_get_schema(table: &str) -> String {
    let part = format!("'{}'", table.replace('\'', "''"));
    format!(
        r#"SELECT quote_ident(column_name) AS "column", data_type AS "type"
    FROM information_schema.columns
    WHERE
      CASE WHEN array_length(parse_ident({part}),1) = 2
        THEN quote_ident(table_schema) = (parse_ident({part}))[1]
          AND quote_ident(table_name) = (parse_ident({part}))[2]
        ELSE quote_ident(table_name) = {part}
          AND {c}
      END"#,
        c = SCHEMA_CONSTRAINT
    )
}

/// The metadata queries, by name.
pub(super) fn grafana_metadata() -> Vec<(&'static str, String)> {
    vec![
        ("version", grafana_get_version()),
        ("timescaledb", grafana_timescale_version()),
        ("schemas", grafana_show_schemas()),
        ("tables", grafana_show_tables(None)),
        ("tables_in_public", grafana_show_tables(Some("public"))),
        ("columns_of_spans", grafana_get_schema("spans")),
        (
            "columns_of_public_spans",
            grafana_get_schema("public.spans"),
        ),
        ("columns_of_calls", grafana_get_schema("calls")),
    ]
}

// ---- Grafana: template variables and macros, expanded as Grafana expands them.

/// `t` (nanoseconds since the epoch) as Go's `time.RFC3339Nano` in UTC: trailing zeros of
/// the fraction are dropped.
fn rfc3339_nano(t: u128) -> String {
    let secs = (t / 1_000_000_000) as i64;
    let nanos = (t % 1_000_000_000) as u32;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let mut s = format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60
    );
    if nanos > 0 {
        let frac = format!("{nanos:09}");
        s.push('.');
        s.push_str(frac.trim_end_matches('0'));
    }
    s.push('Z');
    s
}

/// Each `(sql, variables)` with the variables interpolated and Grafana's macros expanded for
/// the range `from`..`to`, by `tests/grafana/macros.py`: the one implementation of the
/// expansion, which `scripts/check-dashboards` also uses for its offline checks of the same
/// panels. An `Err` names a macro the dashboards may not use, or a bad interval.
fn expand(
    items: &[(String, BTreeMap<String, String>)],
    from: &str,
    to: &str,
) -> Vec<Result<String, String>> {
    let items: Vec<Value> = items
        .iter()
        .map(|(sql, vars)| json!({"sql": sql, "variables": vars}))
        .collect();
    let input = json!({"from": from, "to": to, "items": items}).to_string();
    let mut child = Command::new(python())
        .arg(repo_root().join("tests/grafana/macros.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python (TOOLSPAN_PYTHON)");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("piped stdin");
        stdin
            .write_all(input.as_bytes())
            .expect("write to macros.py");
    }
    let out = child.wait_with_output().expect("macros.py output");
    assert!(
        out.status.success(),
        "tests/grafana/macros.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let results: Vec<Value> = serde_json::from_slice(&out.stdout).expect("macros.py JSON");
    assert_eq!(results.len(), items.len());
    results
        .into_iter()
        .map(|r| match (r["sql"].as_str(), r["error"].as_str()) {
            (Some(sql), _) => Ok(sql.to_string()),
            (None, Some(e)) => Err(e.to_string()),
            _ => panic!("macros.py answered {r}"),
        })
        .collect()
}

/// A SQL panel target: dashboard, panel title, format and expanded SQL.
pub(super) struct Panel {
    pub(super) name: String,
    pub(super) format: String,
    pub(super) sql: String,
}

fn collect_targets(panels: &[Value], out: &mut Vec<(String, String, String)>) {
    for p in panels {
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(sql) = t["rawSql"].as_str() {
                out.push((
                    p["title"].as_str().unwrap_or("?").to_string(),
                    t["format"].as_str().unwrap_or("table").to_string(),
                    sql.to_string(),
                ));
            }
        }
        if let Some(children) = p["panels"].as_array() {
            collect_targets(children, out);
        }
    }
}

/// Every SQL panel of every dashboard, with variables interpolated as Grafana's SQL data
/// sources do (multi-value and include-all variables become quoted, comma-separated lists;
/// query variables take the values of their query) and macros expanded for the last 6 hours.
pub(super) fn dashboard_panels(server: &QueryServer) -> Vec<Panel> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_nanos();
    // Nanosecond precision on purpose: Grafana sends it.
    let to = rfc3339_nano(now / 1_000 * 1_000 + 789);
    let from = rfc3339_nano(now - 6 * 3_600 * 1_000_000_000 + 123_456_789 - now % 1_000_000_000);
    let dir = repo_root().join("dashboards/grafana/dashboards");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("dashboards directory")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    // (name, format) and (sql, variables) of each target, expanded together below.
    let mut names = Vec::new();
    let mut targets = Vec::new();
    for file in files {
        let dash: Value = serde_json::from_str(&std::fs::read_to_string(&file).expect("read"))
            .expect("dashboard JSON");
        let mut vars: BTreeMap<String, String> = BTreeMap::new();
        // The data source's minimum interval (provisioning: timeInterval 1m).
        vars.insert("__interval".into(), "1m".into());
        for v in dash["templating"]["list"].as_array().into_iter().flatten() {
            let name = v["name"].as_str().expect("variable name").to_string();
            let multi =
                v["multi"].as_bool().unwrap_or(false) || v["includeAll"].as_bool().unwrap_or(false);
            let values: Vec<String> = match v["type"].as_str() {
                Some("query") => {
                    let q = v["query"].as_str().expect("variable query");
                    let r = psql_c(server, q);
                    assert!(r.ok(), "variable {name} query failed: {}", r.stderr());
                    r.rows().into_iter().map(|row| row[0].clone()).collect()
                }
                Some("custom") => v["query"]
                    .as_str()
                    .expect("custom values")
                    .split(',')
                    .map(|s| s.trim().to_string())
                    .collect(),
                Some("textbox") => vec![v["current"]["value"].as_str().unwrap_or("").to_string()],
                _ => continue,
            };
            let value = if multi {
                // Current "All": every value, each quoted.
                values
                    .iter()
                    .map(|s| format!("'{}'", s.replace('\'', "''")))
                    .collect::<Vec<_>>()
                    .join(",")
            } else {
                // A single-value variable: the first option, raw (the SQL quotes it).
                let mut sorted = values.clone();
                sorted.sort();
                sorted
                    .into_iter()
                    .find(|s| s == "search_docs")
                    .or_else(|| values.first().cloned())
                    .unwrap_or_default()
            };
            vars.insert(name, value);
        }
        let mut found = Vec::new();
        collect_targets(dash["panels"].as_array().expect("panels"), &mut found);
        let stem = file
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("?")
            .to_string();
        for (title, format, sql) in found {
            names.push((format!("{stem}: {title}"), format));
            targets.push((sql, vars.clone()));
        }
    }
    let mut panels = Vec::new();
    for ((name, format), sql) in names.into_iter().zip(expand(&targets, &from, &to)) {
        let sql = sql.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            !sql.contains('$'),
            "unexpanded variable or macro in {name}: {sql}"
        );
        panels.push(Panel { name, format, sql });
    }
    assert!(
        panels.len() >= 8,
        "the dashboards have SQL panels: {}",
        panels.len()
    );
    panels
}

#[test]
fn grafana_metadata_queries_answer_in_psql() {
    psql_bin(); // fail first, with the install hint, when psql is missing
    let server = &demo().server;
    for (name, sql) in grafana_metadata() {
        let r = psql_c(server, &sql);
        assert!(
            r.ok(),
            "Grafana metadata query {name} failed: {}\n{sql}",
            r.stderr()
        );
        let rows = r.rows();
        let first: Vec<&str> = rows.iter().map(|row| row[0].as_str()).collect();
        match name {
            "version" => assert_eq!(first, ["1500"]),
            "timescaledb" => assert!(first.is_empty()),
            "schemas" => assert!(first.contains(&"public"), "{first:?}"),
            "tables" | "tables_in_public" => {
                for t in ["spans", "calls", "failure_rates"] {
                    assert!(first.contains(&t), "{name}: {first:?}");
                }
            }
            "columns_of_spans" | "columns_of_public_spans" => {
                assert_eq!(r.header(), ["column", "type"]);
                for c in ["start_time", "tool", "stage", "error_type", "trace_id"] {
                    assert!(first.contains(&c), "{name}: {first:?}");
                }
            }
            "columns_of_calls" => assert!(first.contains(&"recovered_after_retry"), "{first:?}"),
            _ => {}
        }
    }
}

#[test]
fn every_dashboard_sql_panel_runs_in_psql() {
    psql_bin(); // fail first, with the install hint, when psql is missing
    let server = &demo().server;
    for p in &dashboard_panels(server) {
        let r = psql_c(server, &p.sql);
        assert!(
            r.ok(),
            "panel {} failed in psql: {}\n{}",
            p.name,
            r.stderr(),
            p.sql
        );
        if p.format == "time_series" {
            assert_eq!(r.header()[0], "time", "{}", p.name);
        }
    }
}

#[test]
fn grafana_expansions_match_grafana() {
    assert_eq!(
        rfc3339_nano(1_764_410_400_123_456_789),
        "2025-11-29T10:00:00.123456789Z"
    );
    assert_eq!(
        rfc3339_nano(1_764_410_400_500_000_000),
        "2025-11-29T10:00:00.5Z"
    );
    assert_eq!(
        rfc3339_nano(1_764_410_400_000_000_000),
        "2025-11-29T10:00:00Z"
    );
    let sql = "SELECT $__timeGroupAlias(start_time, '5m'), $__timeGroup(start_time, $__interval) FROM spans WHERE $__timeFilter(start_time)";
    let mut vars = BTreeMap::new();
    vars.insert("__interval".to_string(), "1m".to_string());
    let out = expand(&[(sql.to_string(), vars)], "A", "B");
    assert_eq!(
        out,
        [Ok("SELECT floor(extract(epoch from start_time)/300)*300 AS \"time\", floor(extract(epoch from start_time)/60)*60 FROM spans WHERE start_time BETWEEN 'A' AND 'B'".to_string())]
    );
}
