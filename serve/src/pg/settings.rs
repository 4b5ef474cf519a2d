//! Session settings as Postgres clients see them: the values `SHOW` and `current_setting()`
//! report, and the `SET`s clients send at connect that are harmless to accept.
//!
//! toolspan has no session state that changes query results: a `SET` is accepted when it
//! names a setting that cannot change what a query returns (or sets it to the one value
//! toolspan implements, e.g. UTC), remembered for `SHOW`, and otherwise refused.

use std::collections::BTreeMap;

/// The Postgres version toolspan presents (Grafana reads `server_version_num` to pick SQL
/// features; 15 matches the data source's provisioned `postgresVersion: 1500`).
pub const SERVER_VERSION: &str = "15.0 (toolspan)";
/// `server_version_num` for [`SERVER_VERSION`].
pub const SERVER_VERSION_NUM: &str = "150000";

/// Every setting with its default value and a description, as `SHOW ALL` lists them.
pub const DEFAULTS: &[(&str, &str, &str)] = &[
    (
        "application_name",
        "",
        "Sets the application name reported in statistics and logs.",
    ),
    (
        "client_encoding",
        "UTF8",
        "The client's character set encoding (UTF8 only).",
    ),
    (
        "client_min_messages",
        "notice",
        "Message levels sent to the client.",
    ),
    (
        "datestyle",
        "ISO, MDY",
        "Display format for date and time values.",
    ),
    (
        "default_transaction_isolation",
        "read committed",
        "Every query reads one committed table version.",
    ),
    (
        "default_transaction_read_only",
        "on",
        "toolspan's SQL interface is read-only.",
    ),
    (
        "extra_float_digits",
        "1",
        "Extra digits for floating-point output.",
    ),
    (
        "idle_in_transaction_session_timeout",
        "0",
        "Accepted for compatibility; no effect.",
    ),
    ("integer_datetimes", "on", "Datetimes are integer based."),
    (
        "intervalstyle",
        "postgres",
        "Display format for interval values.",
    ),
    (
        "is_superuser",
        "off",
        "The session user is not a superuser.",
    ),
    ("lc_collate", "C", "Collation order of strings."),
    ("lc_ctype", "C", "Character classification."),
    (
        "lock_timeout",
        "0",
        "Accepted for compatibility; toolspan takes no locks.",
    ),
    ("max_identifier_length", "63", "Longest identifier."),
    (
        "search_path",
        "\"$user\", public",
        "Schema search order; the tables live in public.",
    ),
    (
        "server_encoding",
        "UTF8",
        "The server's character set encoding.",
    ),
    (
        "server_version",
        SERVER_VERSION,
        "The Postgres version toolspan presents.",
    ),
    (
        "server_version_num",
        SERVER_VERSION_NUM,
        "The Postgres version toolspan presents, as a number.",
    ),
    (
        "standard_conforming_strings",
        "on",
        "Backslashes in ordinary string literals are literal.",
    ),
    (
        "statement_timeout",
        "0",
        "Accepted for compatibility; the server's own query timeout applies.",
    ),
    (
        "timezone",
        "UTC",
        "Timestamps are stored and returned in UTC.",
    ),
    (
        "transaction_isolation",
        "read committed",
        "Every query reads one committed table version.",
    ),
    (
        "transaction_read_only",
        "on",
        "toolspan's SQL interface is read-only.",
    ),
];

/// The default value of a setting (`None` for an unknown name). Names are case-insensitive;
/// `time zone` and `transaction isolation level` are the SQL spellings of two of them.
pub fn default_value(name: &str) -> Option<&'static str> {
    let name = canonical(name);
    DEFAULTS
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, v, _)| *v)
}

/// `TIME ZONE` → `timezone`, `transaction isolation level` → `transaction_isolation`,
/// anything else lowercased.
pub fn canonical(name: &str) -> String {
    let lower = name.trim().to_ascii_lowercase();
    let words: Vec<&str> = lower.split_whitespace().collect();
    match words.as_slice() {
        ["time", "zone"] => "timezone".into(),
        ["transaction", "isolation", "level"] => "transaction_isolation".into(),
        _ => words.join(" "),
    }
}

/// Why a `SET` is refused, or `Ok(canonical name)` when it is accepted.
pub fn check_set(name: &str, value: &str) -> Result<String, String> {
    let name = canonical(name);
    let v = value
        .trim()
        .trim_matches('\'')
        .trim_matches('"')
        .to_ascii_lowercase();
    let utc = [
        "utc",
        "etc/utc",
        "gmt",
        "z",
        "zulu",
        "universal",
        "+00",
        "+00:00",
        "0",
        "default",
        "local",
    ];
    let ok = match name.as_str() {
        "application_name"
        | "extra_float_digits"
        | "client_min_messages"
        | "search_path"
        | "statement_timeout"
        | "lock_timeout"
        | "idle_in_transaction_session_timeout"
        | "default_transaction_isolation"
        | "transaction_isolation"
        | "intervalstyle"
        | "bytea_output"
        | "escape_string_warning"
        | "jit"
        | "synchronous_commit"
        | "row_security"
        | "default_transaction_read_only"
        | "transaction_read_only" => true,
        "client_encoding" | "names" => {
            matches!(v.as_str(), "utf8" | "utf-8" | "unicode" | "default")
        }
        "standard_conforming_strings" => matches!(v.as_str(), "on" | "true" | "1" | "default"),
        "timezone" => utc.contains(&v.as_str()),
        "datestyle" => v.starts_with("iso") || v == "default",
        _ => false,
    };
    if ok {
        Ok(name)
    } else {
        Err(match name.as_str() {
            "timezone" => {
                "SET timezone to anything but UTC (toolspan returns timestamps in UTC)".into()
            }
            "client_encoding" | "names" => "SET client_encoding to anything but UTF8".into(),
            "datestyle" => "SET datestyle to anything but ISO".into(),
            "standard_conforming_strings" => "SET standard_conforming_strings = off".into(),
            other => format!("SET {other}"),
        })
    }
}

/// A connection's settings: the defaults, overridden by the `SET`s it made.
#[derive(Debug, Default)]
pub struct Session {
    set: BTreeMap<String, String>,
}

impl Session {
    /// Remembers an accepted `SET`.
    pub fn set(&mut self, name: &str, value: &str) {
        let v = value.trim().trim_matches('\'').to_string();
        self.set.insert(canonical(name), v);
    }

    /// The value `SHOW name` reports.
    pub fn show(&self, name: &str) -> Option<String> {
        let name = canonical(name);
        self.set
            .get(&name)
            .cloned()
            .or_else(|| default_value(&name).map(str::to_string))
    }

    /// Every setting: name, value, description.
    pub fn all(&self) -> Vec<(String, String, String)> {
        DEFAULTS
            .iter()
            .map(|(n, v, d)| {
                let value = self.set.get(*n).cloned().unwrap_or_else(|| v.to_string());
                (n.to_string(), value, d.to_string())
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_time_sets_are_accepted() {
        for (n, v) in [
            ("extra_float_digits", "3"),
            ("application_name", "'psql'"),
            ("DateStyle", "ISO"),
            ("datestyle", "'ISO, MDY'"),
            ("TIME ZONE", "'UTC'"),
            ("client_encoding", "'UTF8'"),
            ("search_path", "public"),
        ] {
            assert!(check_set(n, v).is_ok(), "{n} = {v}");
        }
        for (n, v) in [
            ("timezone", "'Europe/Berlin'"),
            ("datafusion.execution.batch_size", "1"),
            ("work_mem", "'1GB'"),
            ("standard_conforming_strings", "off"),
        ] {
            assert!(check_set(n, v).is_err(), "{n} = {v}");
        }
    }

    #[test]
    fn show_reports_defaults_and_sets() {
        let mut s = Session::default();
        assert_eq!(s.show("server_version_num").as_deref(), Some("150000"));
        assert_eq!(
            s.show("Transaction Isolation Level").as_deref(),
            Some("read committed")
        );
        s.set("application_name", "'grafana'");
        assert_eq!(s.show("application_name").as_deref(), Some("grafana"));
        assert!(s.show("nope").is_none());
    }
}
