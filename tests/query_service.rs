//! `toolspan query` over a table written by `toolspan demo`, driven the way people and
//! Grafana drive it: the real `psql` client, Python psycopg (extended, prepared, binary and
//! simple protocol), Grafana's own metadata queries, every SQL panel of the provisioned
//! dashboards with Grafana's macros and variables expanded, and the HTTP trace and reference
//! lookups.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::support::{bin, free_port, python, repo_root};

const USER: &str = "grafana";
const PASSWORD: &str = "query-service-test-pw";

/// The `psql` binary; the test fails (never skips) without it.
fn psql_bin() -> PathBuf {
    for p in ["/usr/bin/psql", "/usr/local/bin/psql"] {
        if Path::new(p).exists() {
            return PathBuf::from(p);
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join("psql");
            if p.exists() {
                return p;
            }
        }
    }
    panic!(
        "psql (the PostgreSQL command-line client) is required by this test and was not found: \
         install it with `apt-get install postgresql-client` (scripts/test installs it when missing)"
    );
}

/// A running `toolspan query`, killed on drop.
struct QueryServer {
    child: Child,
    http: u16,
    pg: u16,
}

impl QueryServer {
    fn start(data_dir: &Path) -> QueryServer {
        let (http, pg) = (free_port(), free_port());
        let child = Command::new(bin())
            .args(["query", "--log", "warn", "--data-dir"])
            .arg(data_dir)
            .args([
                "--http-addr",
                &format!("127.0.0.1:{http}"),
                "--pg-addr",
                &format!("127.0.0.1:{pg}"),
            ])
            .env("TOOLSPAN_PG_USER", USER)
            .env("TOOLSPAN_PG_PASSWORD", PASSWORD)
            .env_remove("TOOLSPAN_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start toolspan query");
        let mut server = QueryServer { child, http, pg };
        let deadline = Instant::now() + Duration::from_secs(60);
        for port in [http, pg] {
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                assert!(
                    matches!(server.child.try_wait(), Ok(None)),
                    "toolspan query exited early"
                );
                assert!(
                    Instant::now() < deadline,
                    "toolspan query did not listen on {port} within 60 s"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        server
    }

    fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.http)
    }
}

impl Drop for QueryServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run_demo(dir: &Path) {
    let out = Command::new(bin())
        .args([
            "demo",
            "--duration",
            "10",
            "--runs-per-second",
            "60",
            "--log",
            "warn",
            "--otlp-addr",
        ])
        .arg(format!("127.0.0.1:{}", free_port()))
        .arg("--data-dir")
        .arg(dir)
        .output()
        .expect("run toolspan demo");
    assert!(
        out.status.success(),
        "demo failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// psql output: the header and rows of an unaligned, tab-separated result.
struct Psql {
    out: Output,
}

impl Psql {
    fn ok(&self) -> bool {
        self.out.status.success()
    }
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }
    fn rows(&self) -> Vec<Vec<String>> {
        assert!(self.ok(), "psql failed: {}", self.stderr());
        self.stdout()
            .lines()
            .skip(1)
            .map(|l| l.split('\t').map(str::to_string).collect())
            .collect()
    }
    fn header(&self) -> Vec<String> {
        self.stdout()
            .lines()
            .next()
            .unwrap_or("")
            .split('\t')
            .map(str::to_string)
            .collect()
    }
}

fn psql(server: &QueryServer, args: &[&str]) -> Psql {
    let out = Command::new(psql_bin())
        .args([
            "-X",
            "-h",
            "127.0.0.1",
            "-p",
            &server.pg.to_string(),
            "-U",
            USER,
            "-d",
            "toolspan",
        ])
        .args([
            "-A",
            "-F",
            "\t",
            "-P",
            "footer=off",
            "-v",
            "VERBOSITY=verbose",
        ])
        .args(args)
        .env("PGPASSWORD", PASSWORD)
        .env("PGCONNECT_TIMEOUT", "10")
        .env("PGSSLMODE", "disable")
        .stdin(Stdio::null())
        .output()
        .expect("run psql");
    Psql { out }
}

fn psql_c(server: &QueryServer, sql: &str) -> Psql {
    psql(server, &["-v", "ON_ERROR_STOP=1", "-c", sql])
}

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
fn grafana_metadata() -> Vec<(&'static str, String)> {
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

/// Go's `%v` of a float64 number of seconds (300 → `300`, 0.5 → `0.5`).
fn go_float(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

fn interval_seconds(s: &str) -> f64 {
    let s = s.trim().trim_matches('\'');
    let (num, unit) = s.split_at(s.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(s.len()));
    let n: f64 = num.parse().unwrap_or_else(|_| panic!("interval {s}"));
    n * match unit {
        "ms" => 0.001,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3_600.0,
        "d" => 86_400.0,
        other => panic!("unit {other}"),
    }
}

/// The macros of Grafana's PostgreSQL data source (pkg/tsdb/grafana-postgresql-datasource/macros.go):
/// `$__name(args)` with the arguments split on commas and trimmed.
fn expand_macros(sql: &str, from: &str, to: &str) -> String {
    let mut out = String::new();
    let mut rest = sql;
    while let Some(i) = rest.find("$__") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let name_len = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        let name = &after[..name_len];
        let tail = &after[name_len..];
        let (Some(body), Some(close)) = (tail.strip_prefix('('), tail.find(')')) else {
            out.push('$');
            rest = after;
            continue;
        };
        let args: Vec<&str> = body[..close - 1].split(',').map(str::trim).collect();
        let expansion = match name {
            "__timeFilter" => format!("{} BETWEEN '{from}' AND '{to}'", args[0]),
            "__timeFrom" => format!("'{from}'"),
            "__timeTo" => format!("'{to}'"),
            "__timeGroup" | "__timeGroupAlias" => {
                let secs = go_float(interval_seconds(args[1]));
                let group = format!("floor(extract(epoch from {})/{secs})*{secs}", args[0]);
                if name == "__timeGroupAlias" {
                    format!("{group} AS \"time\"")
                } else {
                    group
                }
            }
            other => panic!("the dashboards use macro {other}, which this test does not expand"),
        };
        out.push_str(&expansion);
        rest = &tail[close + 1..];
    }
    out.push_str(rest);
    out
}

/// Replaces `$name` and `${name}` with each variable's interpolated value, longest names first.
fn expand_variables(sql: &str, vars: &BTreeMap<String, String>) -> String {
    let mut names: Vec<&String> = vars.keys().collect();
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    let mut out = sql.to_string();
    for n in names {
        out = out
            .replace(&format!("${{{n}}}"), &vars[n])
            .replace(&format!("${n}"), &vars[n]);
    }
    out
}

/// A SQL panel target: dashboard, panel title, format and expanded SQL.
struct Panel {
    name: String,
    format: String,
    sql: String,
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
fn dashboard_panels(server: &QueryServer) -> Vec<Panel> {
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
    let mut panels = Vec::new();
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
        let mut targets = Vec::new();
        collect_targets(dash["panels"].as_array().expect("panels"), &mut targets);
        let stem = file
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("?")
            .to_string();
        for (title, format, sql) in targets {
            let sql = expand_macros(&expand_variables(&sql, &vars), &from, &to);
            assert!(
                !sql.contains('$'),
                "unexpanded variable or macro in {stem}/{title}: {sql}"
            );
            panels.push(Panel {
                name: format!("{stem}: {title}"),
                format,
                sql,
            });
        }
    }
    assert!(
        panels.len() >= 8,
        "the dashboards have SQL panels: {}",
        panels.len()
    );
    panels
}

// ---- HTTP helpers.

async fn http_get(url: &str) -> (u16, Value) {
    let r = reqwest::Client::new().get(url).send().await.expect("GET");
    let status = r.status().as_u16();
    let text = r.text().await.expect("body");
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}")),
    )
}

async fn http_sql(base: &str, sql: &str) -> Vec<Value> {
    let r = reqwest::Client::new()
        .post(format!("{base}/api/v1/sql"))
        .header("content-type", "application/json")
        .body(json!({ "sql": sql }).to_string())
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status().as_u16(), 200, "{sql}");
    let v: Value = serde_json::from_str(&r.text().await.expect("body")).expect("JSON");
    v["rows"].as_array().expect("rows").clone()
}

/// Every node of a trace tree with its parent's id; checks children are in start order.
fn walk(tree: &Value) -> Vec<(Value, Option<String>)> {
    let mut out = Vec::new();
    let mut stack: Vec<(Value, Option<String>)> = tree["roots"]
        .as_array()
        .expect("roots")
        .iter()
        .map(|r| (r.clone(), None))
        .collect();
    while let Some((node, parent)) = stack.pop() {
        let id = node["span_id"].as_str().expect("id").to_string();
        let kids = node["children"].as_array().expect("children").clone();
        let starts: Vec<String> = kids
            .iter()
            .map(|k| k["start_time"].as_str().expect("start").to_string())
            .collect();
        assert!(
            starts.windows(2).all(|w| w[0] <= w[1]),
            "children of {id} in start order"
        );
        stack.extend(kids.into_iter().map(|k| (k, Some(id.clone()))));
        out.push((node, parent));
    }
    out
}

const OID_INT8: i64 = 20;
const OID_INT4: i64 = 23;
const OID_TEXT: i64 = 25;
const OID_FLOAT8: i64 = 701;
const OID_TIMESTAMPTZ: i64 = 1184;
const OID_BOOL: i64 = 16;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psql_psycopg_and_grafana_work_against_a_demo_table() {
    let psql_path = psql_bin(); // fail first, with the install hint, when psql is missing
    let dir = tempfile::tempdir().expect("temp dir");
    run_demo(dir.path());
    let server = QueryServer::start(dir.path());

    // -- psql: Grafana's "Save & test" ping, SELECT 1, versions, session SETs, data.
    let r = psql_c(&server, "-- ping");
    assert!(
        r.ok() && r.stdout().trim().is_empty(),
        "ping: {} {}",
        r.stdout(),
        r.stderr()
    );
    assert_eq!(psql_c(&server, "SELECT 1 AS one").rows(), [["1"]]);
    assert_eq!(
        psql_c(&server, "SHOW server_version_num").rows(),
        [["150000"]]
    );
    assert!(psql_c(&server, "SELECT version()").rows()[0][0].starts_with("PostgreSQL 15"));
    let r = psql(
        &server,
        &[
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            "SET extra_float_digits = 3",
            "-c",
            "SET application_name = 'grafana'",
            "-c",
            "SET datestyle = 'ISO, MDY'",
            "-c",
            "SHOW application_name",
        ],
    );
    assert!(r.ok(), "harmless SETs are accepted: {}", r.stderr());
    assert!(r.stdout().contains("grafana"), "{}", r.stdout());
    let n: i64 = psql_c(
        &server,
        "SELECT count(*) AS n FROM spans WHERE status = 'error'",
    )
    .rows()[0][0]
        .parse()
        .expect("a count");
    assert!(n > 0, "the demo wrote failures");
    let r = psql_c(&server, "\\d spans");
    assert!(
        r.ok() && r.stdout().contains("start_time"),
        "psql describes the table: {}",
        r.stderr()
    );

    // -- psql: every refused statement, in one session that keeps answering.
    let copy_target = dir.path().join("copied.csv");
    let refused = [
        "DROP TABLE spans".to_string(),
        "INSERT INTO spans (tool) VALUES ('x')".to_string(),
        "UPDATE spans SET tool = 'x'".to_string(),
        "DELETE FROM spans".to_string(),
        "TRUNCATE spans".to_string(),
        "CREATE TABLE t (a int)".to_string(),
        "ALTER TABLE spans ADD COLUMN x int".to_string(),
        format!("COPY (SELECT * FROM spans) TO '{}'", copy_target.display()),
        format!("COPY spans TO '{}'", copy_target.display()),
        "SET work_mem = '1GB'".to_string(),
        "SET datafusion.execution.batch_size = 1".to_string(),
        "SET TIME ZONE 'Europe/Berlin'".to_string(),
        "CREATE EXTERNAL TABLE leak STORED AS CSV LOCATION '/tmp'".to_string(),
        "SELECT * INTO t2 FROM spans".to_string(),
    ];
    let mut script = String::new();
    for (i, s) in refused.iter().enumerate() {
        script.push_str(&format!("{s};\nSELECT 'alive{i}' AS check;\n"));
    }
    let script_path = dir.path().join("refused.sql");
    std::fs::write(&script_path, &script).expect("write script");
    let r = psql(
        &server,
        &[
            "-v",
            "ON_ERROR_STOP=0",
            "-f",
            script_path.to_str().expect("utf-8"),
        ],
    );
    let (stdout, stderr) = (r.stdout(), r.stderr());
    for (i, statement) in refused.iter().enumerate() {
        assert!(
            stdout.contains(&format!("alive{i}")),
            "the session answers after {statement}: {stdout}\n{stderr}"
        );
    }
    assert_eq!(
        stderr.matches("ERROR:  42501:").count(),
        refused.len(),
        "each refused with SQLSTATE 42501 (forbidden_statement):\n{stderr}"
    );
    assert_eq!(
        stderr.matches("code: forbidden_statement").count(),
        refused.len(),
        "{stderr}"
    );
    assert!(
        !stderr.contains("DataFusion") && !stderr.contains("datafusion::"),
        "{stderr}"
    );
    assert!(!copy_target.exists(), "COPY wrote a file");
    // Other error codes carry their SQLSTATEs.
    for (sql, state) in [
        ("SELECT nope FROM spans", "42703"),
        ("SELECT * FROM nope", "42P01"),
        ("SELEC 1", "42601"),
    ] {
        let r = psql_c(&server, sql);
        assert!(
            !r.ok() && r.stderr().contains(&format!("ERROR:  {state}:")),
            "{sql}: {}",
            r.stderr()
        );
    }
    let wrong = Command::new(&psql_path)
        .args([
            "-X",
            "-h",
            "127.0.0.1",
            "-p",
            &server.pg.to_string(),
            "-U",
            USER,
            "-d",
            "toolspan",
            "-c",
            "SELECT 1",
        ])
        .env("PGPASSWORD", "wrong")
        .output()
        .expect("psql");
    assert!(!wrong.status.success(), "a wrong password is refused");
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("assword authentication failed"));

    // -- Grafana's metadata queries through psql.
    for (name, sql) in grafana_metadata() {
        let r = psql_c(&server, &sql);
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

    // -- Every dashboard SQL panel through psql.
    let panels = dashboard_panels(&server);
    for p in &panels {
        let r = psql_c(&server, &p.sql);
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

    // -- psycopg: the same queries in four protocol modes, parameters, refusals, transactions.
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
    let jobs = json!({"queries": queries, "refused": refused});
    let jobs_path = dir.path().join("jobs.json");
    std::fs::write(&jobs_path, jobs.to_string()).expect("write jobs");
    let out = Command::new(python())
        .arg(repo_root().join("tests/pg/client.py"))
        .args(["127.0.0.1", &server.pg.to_string(), USER, PASSWORD])
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
    let formats: BTreeMap<String, String> = panels
        .iter()
        .map(|p| (format!("panel {}", p.name), p.format.clone()))
        .collect();
    for r in results["queries"].as_array().expect("queries") {
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
                    ("date", 1082),
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
    for r in results["refused"].as_array().expect("refused") {
        assert_eq!(r["refused"], true, "{r}");
        assert_eq!(r["sqlstate"], "42501", "{r}");
        assert!(
            r["detail"]
                .as_str()
                .is_some_and(|d| d.contains("forbidden_statement")),
            "{r}"
        );
        assert_eq!(r["after"], 1, "the connection keeps answering: {r}");
    }
    let tx = &results["transaction"];
    assert_eq!(tx["refused"], "42501", "{tx}");
    assert_eq!(tx["first"], tx["again"], "{tx}");
    assert!(!copy_target.exists(), "COPY wrote a file");

    // -- HTTP: a demo trace with a retried call as a full tree, and an error reference.
    let base = server.base();
    let rows = http_sql(
        &base,
        "SELECT trace_id FROM calls WHERE attempts > 1 ORDER BY trace_id LIMIT 1",
    )
    .await;
    let trace_id = rows[0]["trace_id"].as_str().expect("trace id").to_string();
    let spans = http_sql(
        &base,
        &format!("SELECT count(*) AS n FROM spans WHERE trace_id = '{trace_id}'"),
    )
    .await[0]["n"]
        .as_i64()
        .expect("n");
    let (status, tree) = http_get(&format!("{base}/api/v1/traces/{trace_id}")).await;
    assert_eq!(status, 200, "{tree}");
    let nodes = walk(&tree);
    assert_eq!(
        nodes.len() as i64,
        spans,
        "every span of the trace is in the tree"
    );
    for (node, parent) in &nodes {
        assert_eq!(
            node["parent_span_id"].as_str().map(str::to_string),
            *parent,
            "{node}"
        );
    }
    let stages: Vec<&str> = nodes
        .iter()
        .filter_map(|(n, _)| n["stage"].as_str())
        .collect();
    for s in ["agent", "call", "attempt", "prepare", "send", "execute"] {
        assert!(stages.contains(&s), "stage {s} in the tree: {stages:?}");
    }
    assert!(
        nodes.iter().any(|(n, _)| n["error"]["type"].is_string()),
        "a failure with its type"
    );

    let rows = http_sql(&base, "SELECT reference, trace_id, span_id FROM spans WHERE reference IS NOT NULL AND stage = 'call' ORDER BY start_time LIMIT 1").await;
    let reference = rows[0]["reference"]
        .as_str()
        .expect("reference")
        .to_string();
    let (status, v) = http_get(&format!("{base}/api/v1/references/{reference}")).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["trace"]["trace_id"], rows[0]["trace_id"]);
    assert_eq!(v["span"]["reference"], reference.as_str());
    assert!(v["span"]["error"]["code"].is_string(), "{v}");
    let in_trace = walk(&v["trace"]);
    let spans = http_sql(
        &base,
        &format!(
            "SELECT count(*) AS n FROM spans WHERE trace_id = '{}'",
            rows[0]["trace_id"].as_str().expect("id")
        ),
    )
    .await[0]["n"]
        .as_i64()
        .expect("n");
    assert_eq!(in_trace.len() as i64, spans, "the reference's whole trace");
    let (status, v) = http_get(&format!("{base}/api/v1/references/err_not_there")).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
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
    let out = expand_macros(&expand_variables(sql, &vars), "A", "B");
    assert_eq!(
        out,
        "SELECT floor(extract(epoch from start_time)/300)*300 AS \"time\", floor(extract(epoch from start_time)/60)*60 FROM spans WHERE start_time BETWEEN 'A' AND 'B'"
    );
}
