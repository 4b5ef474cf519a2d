//! The real `psql` client against the demo server: Grafana's "Save & test" ping, SELECT 1,
//! versions, session SETs, data, `\d`, and a wrong password.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use super::{demo, QueryServer, PASSWORD, USER};

/// The `psql` binary; the test fails (never skips) without it.
pub(super) fn psql_bin() -> PathBuf {
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

/// psql output: the header and rows of an unaligned, tab-separated result.
pub(super) struct Psql {
    out: Output,
}

impl Psql {
    pub(super) fn ok(&self) -> bool {
        self.out.status.success()
    }
    pub(super) fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }
    pub(super) fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }
    pub(super) fn rows(&self) -> Vec<Vec<String>> {
        assert!(self.ok(), "psql failed: {}", self.stderr());
        self.stdout()
            .lines()
            .skip(1)
            .map(|l| l.split('\t').map(str::to_string).collect())
            .collect()
    }
    pub(super) fn header(&self) -> Vec<String> {
        self.stdout()
            .lines()
            .next()
            .unwrap_or("")
            .split('\t')
            .map(str::to_string)
            .collect()
    }
}

/// psql with verbose errors and unaligned, tab-separated output, then `args`.
pub(super) fn psql(server: &QueryServer, args: &[&str]) -> Psql {
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

/// One command, stopping at its error.
pub(super) fn psql_c(server: &QueryServer, sql: &str) -> Psql {
    psql(server, &["-v", "ON_ERROR_STOP=1", "-c", sql])
}

#[test]
fn psql_pings_reads_versions_sets_and_describes_the_table() {
    psql_bin(); // fail first, with the install hint, when psql is missing
    let server = &demo().server;
    // Grafana's "Save & test" ping, SELECT 1, versions, session SETs, data.
    let r = psql_c(server, "-- ping");
    assert!(
        r.ok() && r.stdout().trim().is_empty(),
        "ping: {} {}",
        r.stdout(),
        r.stderr()
    );
    assert_eq!(psql_c(server, "SELECT 1 AS one").rows(), [["1"]]);
    assert_eq!(
        psql_c(server, "SHOW server_version_num").rows(),
        [["150000"]]
    );
    assert!(psql_c(server, "SELECT version()").rows()[0][0].starts_with("PostgreSQL 15"));
    let r = psql(
        server,
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
        server,
        "SELECT count(*) AS n FROM spans WHERE status = 'error'",
    )
    .rows()[0][0]
        .parse()
        .expect("a count");
    assert!(n > 0, "the demo wrote failures");
    // JSON functions and operators over the wire as in the CLI (docs/table.md).
    assert_eq!(
        psql_c(
            server,
            "SELECT '{\"app.region\":\"eu\"}'->>'app.region' AS r"
        )
        .rows(),
        [["eu"]]
    );
    assert_eq!(
        psql_c(server, "SELECT json_get_int('{\"n\":7}', 'n') AS n").rows(),
        [["7"]]
    );
    let r = psql_c(
        server,
        "SELECT count(*) FROM spans WHERE json_contains(attributes, 'app.nothing')",
    );
    assert_eq!(r.rows(), [["0"]], "{}", r.stderr());
    let r = psql_c(server, "\\d spans");
    assert!(
        r.ok() && r.stdout().contains("start_time"),
        "psql describes the table: {}",
        r.stderr()
    );
}

#[test]
fn psql_with_a_wrong_password_is_refused() {
    let server = &demo().server;
    let wrong = Command::new(psql_bin())
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
}
