//! Turning the text a Postgres client sends into statements toolspan runs.
//!
//! 1. the complexity guard, on the raw text (before any syntax tree exists);
//! 2. the rewrite of Grafana's `search_path` subquery (see [`rewrite_grafana_search_path`]);
//! 3. parsing with datafusion-pg-catalog's Postgres compatibility parser, which rewrites
//!    client idioms (`::regclass`, `pg_catalog.` prefixes, `ANY(array)`, …) into SQL
//!    DataFusion plans;
//! 4. sorting each statement: a query (run through the engine's read-only gate), a session
//!    command toolspan answers itself (harmless `SET`, `SHOW`, `BEGIN`/`COMMIT`/`ROLLBACK`,
//!    `DISCARD ALL`), or a refusal with the envelope's `forbidden_statement`.

use datafusion::sql::sqlparser::ast::{
    DescribeAlias, DiscardObject, Expr, Set, Statement, TransactionAccessMode, TransactionMode,
    Value,
};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
use datafusion_pg_catalog::sql::PostgresCompatibilityParser;

use super::settings;
use toolspan_query::error::{QueryError, QueryErrorKind};
use toolspan_query::guard;

/// A session command toolspan answers without the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// An accepted `SET name = value`.
    Set {
        /// Canonical setting name.
        name: String,
        /// The value as written.
        value: String,
    },
    /// `SHOW name`.
    Show {
        /// The name as written (the result column is its canonical form).
        name: String,
    },
    /// `SHOW ALL`.
    ShowAll,
    /// `BEGIN` / `START TRANSACTION`.
    Begin,
    /// `COMMIT` / `END`.
    Commit,
    /// `ROLLBACK` / `ABORT`.
    Rollback,
    /// `DISCARD ALL` (connection poolers send it).
    Discard,
}

impl Command {
    /// The command tag Postgres answers with.
    pub fn tag(&self) -> &'static str {
        match self {
            Command::Set { .. } => "SET",
            Command::Show { .. } | Command::ShowAll => "SHOW",
            Command::Begin => "BEGIN",
            Command::Commit => "COMMIT",
            Command::Rollback => "ROLLBACK",
            Command::Discard => "DISCARD ALL",
        }
    }
}

/// One statement of the client's text, sorted.
#[derive(Debug)]
pub enum Prepared {
    /// A query, as SQL for the engine.
    Query(String),
    /// A session command.
    Command(Command),
    /// A refused statement.
    Refused(QueryError),
}

/// The statements of `text` (none for an empty or comment-only text).
pub fn prepare(
    parser: &PostgresCompatibilityParser,
    text: &str,
) -> Result<Vec<Prepared>, QueryError> {
    guard::check(text)?;
    let text = rewrite_grafana_search_path(text).unwrap_or_else(|| text.to_string());
    let statements = match parser.parse(&text) {
        Ok(s) => s,
        // Text the Postgres parser rejects goes to the engine as it is: DataFusion's own
        // dialect may accept it, and otherwise the engine words the syntax error.
        Err(_) => return Ok(vec![Prepared::Query(text)]),
    };
    Ok(statements.into_iter().map(sort).collect())
}

fn sort(statement: Statement) -> Prepared {
    match &statement {
        Statement::Query(_) => Prepared::Query(statement.to_string()),
        // A table's columns, answered by the engine as over HTTP (`EXPLAIN` stays refused).
        Statement::ExplainTable {
            describe_alias: DescribeAlias::Describe | DescribeAlias::Desc,
            hive_format: None,
            ..
        } => Prepared::Query(statement.to_string()),
        Statement::ShowVariable { variable } => {
            let name = variable
                .iter()
                .map(|i| i.value.clone())
                .collect::<Vec<_>>()
                .join(" ");
            if name.eq_ignore_ascii_case("all") {
                Prepared::Command(Command::ShowAll)
            } else {
                Prepared::Command(Command::Show { name })
            }
        }
        Statement::StartTransaction { modes, .. } => {
            if modes.iter().any(|m| {
                matches!(
                    m,
                    TransactionMode::AccessMode(TransactionAccessMode::ReadWrite)
                )
            }) {
                refuse("START TRANSACTION READ WRITE")
            } else {
                Prepared::Command(Command::Begin)
            }
        }
        Statement::Commit { .. } => Prepared::Command(Command::Commit),
        Statement::Rollback {
            savepoint: None, ..
        } => Prepared::Command(Command::Rollback),
        Statement::Discard {
            object_type: DiscardObject::ALL,
        } => Prepared::Command(Command::Discard),
        Statement::Set(set) => sort_set(set, &statement),
        _ => refuse(&leading_keywords(&statement.to_string())),
    }
}

fn sort_set(set: &Set, statement: &Statement) -> Prepared {
    let (name, value) = match set {
        Set::SingleAssignment {
            variable, values, ..
        } => (
            variable.to_string(),
            values.iter().map(value_text).collect::<Vec<_>>().join(", "),
        ),
        Set::SetTimeZone { value, .. } => ("timezone".to_string(), value_text(value)),
        Set::SetNames { charset_name, .. } => ("names".to_string(), charset_name.value.clone()),
        Set::SetTransaction { modes, .. } => {
            return if modes.iter().any(|m| {
                matches!(
                    m,
                    TransactionMode::AccessMode(TransactionAccessMode::ReadWrite)
                )
            }) {
                refuse("SET TRANSACTION READ WRITE")
            } else {
                Prepared::Command(Command::Set {
                    name: "transaction".into(),
                    value: String::new(),
                })
            };
        }
        _ => return refuse(&leading_keywords(&statement.to_string())),
    };
    match settings::check_set(&name, &value) {
        Ok(name) => Prepared::Command(Command::Set { name, value }),
        Err(what) => refuse(&what),
    }
}

/// The text of a `SET` value: strings without their quotes, anything else as written.
fn value_text(e: &Expr) -> String {
    match e {
        Expr::Value(v) => match &v.value {
            Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => s.clone(),
            other => other.to_string(),
        },
        Expr::Identifier(i) => i.value.clone(),
        other => other.to_string(),
    }
}

fn refuse(what: &str) -> Prepared {
    Prepared::Refused(QueryError::new(
        QueryErrorKind::ForbiddenStatement {
            statement: what.to_string(),
        },
        format_args!("refused on the postgres protocol: {what}"),
    ))
}

/// `DROP TABLE spans` → `DROP TABLE`, `COPY spans TO …` → `COPY`.
fn leading_keywords(text: &str) -> String {
    let words: Vec<String> = text
        .split(|c: char| !c.is_ascii_alphabetic())
        .filter(|w| !w.is_empty())
        .take(2)
        .map(|w| w.to_ascii_uppercase())
        .collect();
    match words.first().map(String::as_str) {
        None => "this statement".into(),
        Some("CREATE" | "DROP" | "ALTER" | "TRUNCATE" | "GRANT" | "REVOKE" | "SHOW") => {
            words.join(" ")
        }
        Some(first) => first.to_string(),
    }
}

/// The subquery by which Grafana's table and column pickers find the schemas on the
/// `search_path` (its `buildSchemaConstraint`). It needs `current_setting('search_path')`
/// split into an array and indexed by a generated series: toolspan's only schema on the path
/// is `public`, so the subquery is replaced by that answer.
const GRAFANA_SEARCH_PATH: &str = r#"SELECT
            CASE WHEN trim(s[i]) = '"$user"' THEN user ELSE trim(s[i]) END
          FROM
            generate_series(
              array_lower(string_to_array(current_setting('search_path'),','),1),
              array_upper(string_to_array(current_setting('search_path'),','),1)
            ) as i,
            string_to_array(current_setting('search_path'),',') s"#;

fn tokens(text: &str) -> Option<Vec<Token>> {
    Tokenizer::new(&PostgreSqlDialect {}, text)
        .with_unescape(false)
        .tokenize()
        .ok()
}

fn same(a: &Token, b: &Token) -> bool {
    a.to_string().eq_ignore_ascii_case(&b.to_string())
}

/// `text` with every occurrence of Grafana's search-path subquery replaced by `'public'`
/// (matched token by token, whatever the whitespace), or `None` when there is none.
pub fn rewrite_grafana_search_path(text: &str) -> Option<String> {
    if !text.contains("search_path") {
        return None;
    }
    let pattern: Vec<Token> = tokens(GRAFANA_SEARCH_PATH)?
        .into_iter()
        .filter(|t| !matches!(t, Token::Whitespace(_)))
        .collect();
    let all = tokens(text)?;
    // Positions of the non-whitespace tokens.
    let solid: Vec<usize> = (0..all.len())
        .filter(|i| !matches!(all[*i], Token::Whitespace(_)))
        .collect();
    let mut out = String::with_capacity(text.len());
    let mut next = 0; // next token of `all` to copy
    let mut k = 0; // index into `solid`
    let mut replaced = false;
    while k < solid.len() {
        let fits = k + pattern.len() <= solid.len()
            && pattern
                .iter()
                .enumerate()
                .all(|(j, p)| same(&all[solid[k + j]], p));
        if fits {
            for t in &all[next..solid[k]] {
                out.push_str(&t.to_string());
            }
            out.push_str("'public'");
            next = solid[k + pattern.len() - 1] + 1;
            k += pattern.len();
            replaced = true;
        } else {
            k += 1;
        }
    }
    if !replaced {
        return None;
    }
    for t in &all[next..] {
        out.push_str(&t.to_string());
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(text: &str) -> Vec<String> {
        let parser = PostgresCompatibilityParser::new();
        prepare(&parser, text)
            .expect("prepared")
            .into_iter()
            .map(|p| match p {
                Prepared::Query(q) => format!("query {q}"),
                Prepared::Command(c) => format!("command {}", c.tag()),
                Prepared::Refused(e) => format!("refused {}", e.code()),
            })
            .collect()
    }

    #[test]
    fn statements_are_sorted() {
        assert_eq!(kinds("SELECT 1"), ["query SELECT 1"]);
        assert!(kinds("-- ping").is_empty());
        assert_eq!(kinds("SET extra_float_digits = 3"), ["command SET"]);
        assert_eq!(kinds("SET application_name = 'psql'"), ["command SET"]);
        assert_eq!(kinds("SET DateStyle TO 'ISO'"), ["command SET"]);
        assert_eq!(kinds("SET TIME ZONE 'UTC'"), ["command SET"]);
        assert_eq!(kinds("SHOW server_version_num"), ["command SHOW"]);
        assert_eq!(kinds("DESCRIBE calls"), ["query DESCRIBE calls"]);
        assert_eq!(
            kinds("BEGIN; COMMIT; ROLLBACK"),
            ["command BEGIN", "command COMMIT", "command ROLLBACK"]
        );
        for sql in [
            "SET work_mem = '1GB'",
            "SET TIME ZONE 'Europe/Berlin'",
            "DROP TABLE spans",
            "INSERT INTO spans (tool) VALUES ('x')",
            "DELETE FROM spans",
            "UPDATE spans SET tool = 'x'",
            "COPY spans TO '/tmp/x.csv'",
            "CREATE TABLE t (a int)",
            "TRUNCATE spans",
            "START TRANSACTION READ WRITE",
            "EXPLAIN SELECT 1",
        ] {
            assert_eq!(kinds(sql), ["refused forbidden_statement"], "{sql}");
        }
    }

    #[test]
    fn grafana_search_path_becomes_public() {
        let sql = format!(
            "SELECT quote_ident(table_name) AS \"table\" FROM information_schema.tables \
             WHERE quote_ident(table_schema) IN (\n      {GRAFANA_SEARCH_PATH}\n ) ORDER BY 1"
        );
        let out = rewrite_grafana_search_path(&sql).expect("rewritten");
        assert!(out.contains("IN (\n      'public'\n )"), "{out}");
        assert!(!out.contains("generate_series"), "{out}");
        assert!(rewrite_grafana_search_path("SELECT 1").is_none());
    }

    #[test]
    fn keywords_name_refusals() {
        assert_eq!(leading_keywords("DROP TABLE spans"), "DROP TABLE");
        assert_eq!(leading_keywords("COPY spans TO 'x'"), "COPY");
    }
}
