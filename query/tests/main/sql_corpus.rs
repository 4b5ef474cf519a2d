//! The SQL corpus (`query/tests/sql/*.slt`): statements and the outcome every entry point
//! must give them, in the manner of DataFusion's sqllogictest. One corpus, three runners:
//! the engine (`query/tests/main/errors.rs`), the HTTP API (`serve/tests/main/http.rs`) and
//! the Postgres wire protocol through psql and psycopg (`tests/query_service/corpus.rs`, which
//! compiles this same file with `#[path]`).
//!
//! A file is a list of blocks separated by blank lines; `#` starts a comment line.
//!
//! ```text
//! # why the case is here
//! skipif pg                       zero or more conditions: `onlyif RUNNER` / `skipif RUNNER`,
//!                                 RUNNER one of engine, http, pg (psql and psycopg)
//! statement error unknown_column  `statement ok`, or `statement error CODE`
//! SELECT nope                     the statement: one or more lines, no trailing `;`
//! FROM spans
//! ----                            then, for an error, one expectation a line:
//! `nope`                            the message contains the text
//! ^unknown column                   the message starts with the text
//! !root:                            the whole response (message, detail, body) lacks the text
//! ```
//!
//! `{copy_target}` and `{external_dir}` in a statement are replaced by the runner's paths (a
//! file that must not appear, a directory that must stay empty). Every error case is also
//! held to its code's class, HTTP status and SQLSTATE ([`Case::class`], [`Case::http_status`],
//! [`Case::sqlstate`]) and must not be retryable.

// Compiled into three test crates; each uses the part for its own protocols.
#![allow(dead_code)]

use std::path::Path;

/// The entry point a corpus runs through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runner {
    /// `Engine::sql`.
    Engine,
    /// `POST /api/v1/sql`.
    Http,
    /// The Postgres wire protocol (psql and psycopg).
    Pg,
}

impl Runner {
    fn label(self) -> &'static str {
        match self {
            Runner::Engine => "engine",
            Runner::Http => "http",
            Runner::Pg => "pg",
        }
    }
}

/// What the statement must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// It runs.
    Ok,
    /// It fails with the code, and the message meets the expectations.
    Error {
        /// The envelope code (`forbidden_statement`, ...).
        code: String,
        /// What the message must and must not say.
        fragments: Vec<Fragment>,
    },
}

/// One expectation on an error's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fragment {
    /// The message contains the text.
    Contains(String),
    /// The message starts with the text.
    StartsWith(String),
    /// The whole response does not contain the text.
    Absent(String),
}

/// One statement of the corpus with its expected outcome.
#[derive(Debug, Clone)]
pub struct Case {
    /// `file.slt:line`, for failure messages.
    pub at: String,
    /// The statement, placeholders replaced.
    pub sql: String,
    /// Its outcome.
    pub expect: Expect,
}

/// The class, HTTP status and SQLSTATE each error code of the corpus must have. Written out
/// here, not taken from `Code`, so the tests pin the public mapping instead of repeating it.
const CODES: [(&str, &str, u16, &str); 5] = [
    ("forbidden_statement", "permission", 403, "42501"),
    ("sql_syntax", "invalid_request", 400, "42601"),
    ("unknown_column", "invalid_request", 400, "42703"),
    ("unknown_table", "invalid_request", 400, "42P01"),
    ("invalid_query", "invalid_request", 400, "42000"),
];

impl Case {
    /// `file.slt:line: first line of the statement`.
    pub fn name(&self) -> String {
        format!("{}: {}", self.at, self.sql.lines().next().unwrap_or(""))
    }

    /// The expected error code; `None` for `statement ok`.
    pub fn code(&self) -> Option<&str> {
        match &self.expect {
            Expect::Ok => None,
            Expect::Error { code, .. } => Some(code),
        }
    }

    fn row(&self) -> Option<(&'static str, &'static str, u16, &'static str)> {
        let code = self.code()?;
        let row = CODES.iter().find(|r| r.0 == code).copied();
        // Checked when the corpus is loaded.
        Some(row.expect("a known code"))
    }

    /// The envelope class of the expected error.
    pub fn class(&self) -> Option<&'static str> {
        self.row().map(|r| r.1)
    }

    /// The HTTP status of the expected outcome (200 for `statement ok`).
    pub fn http_status(&self) -> u16 {
        self.row().map_or(200, |r| r.2)
    }

    /// The SQLSTATE of the expected error.
    pub fn sqlstate(&self) -> Option<&'static str> {
        self.row().map(|r| r.3)
    }

    /// Panics unless `message` meets the case's expectations and `response` (everything the
    /// client received: message, detail, body) contains none of the absent texts.
    pub fn check_message(&self, message: &str, response: &str) {
        let Expect::Error { fragments, .. } = &self.expect else {
            return;
        };
        for f in fragments {
            match f {
                Fragment::Contains(t) => assert!(
                    message.contains(t.as_str()),
                    "{}: the message lacks {t:?}: {message}",
                    self.name()
                ),
                Fragment::StartsWith(t) => assert!(
                    message.starts_with(t.as_str()),
                    "{}: the message does not start with {t:?}: {message}",
                    self.name()
                ),
                Fragment::Absent(t) => assert!(
                    !response.contains(t.as_str()),
                    "{}: the response contains {t:?}: {response}",
                    self.name()
                ),
            }
        }
    }
}

/// The cases of every `*.slt` file in `dir` (in file-name order) that apply to `runner`,
/// with `{name}` placeholders replaced from `vars`.
pub fn load(dir: &Path, runner: Runner, vars: &[(&str, &str)]) -> Vec<Case> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("the SQL corpus {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "slt"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no *.slt files in {}", dir.display());
    let mut cases = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read a corpus file");
        let name = file
            .file_name()
            .and_then(|n| n.to_str())
            .expect("utf-8 file name");
        cases.extend(parse(name, &text, runner, vars));
    }
    cases
}

fn parse(file: &str, text: &str, runner: Runner, vars: &[(&str, &str)]) -> Vec<Case> {
    let lines: Vec<&str> = text.lines().collect();
    let mut cases = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim_end();
        if line.is_empty() || line.starts_with('#') {
            i += 1;
            continue;
        }
        // A block: conditions, the statement line, SQL lines, then `----` and expectations.
        let start = i + 1;
        let mut applies = true;
        let mut header = line;
        loop {
            let mut words = header.split_whitespace();
            match (words.next(), words.next(), words.next()) {
                (Some("onlyif"), Some(r), None) => applies &= known_runner(file, i, r) == runner,
                (Some("skipif"), Some(r), None) => applies &= known_runner(file, i, r) != runner,
                _ => break,
            }
            i += 1;
            header = lines.get(i).map_or("", |l| l.trim_end());
        }
        let at = format!("{file}:{}", i + 1);
        let words: Vec<&str> = header.split_whitespace().collect();
        // `None` for `statement ok`, the code for `statement error CODE`.
        let code = match words[..] {
            ["statement", "ok"] => None,
            ["statement", "error", code] => {
                assert!(
                    CODES.iter().any(|r| r.0 == code),
                    "{at}: code {code} has no class, status and SQLSTATE in sql_corpus.rs"
                );
                Some(code.to_string())
            }
            _ => panic!(
                "{at}: expected `statement ok` or `statement error CODE`, found {header:?} \
                 (block from line {start})"
            ),
        };
        i += 1;
        let mut sql = Vec::new();
        while i < lines.len() && !lines[i].trim().is_empty() && lines[i].trim_end() != "----" {
            sql.push(lines[i].trim_end());
            i += 1;
        }
        assert!(!sql.is_empty(), "{at}: a statement without SQL");
        let mut fragments = Vec::new();
        if lines.get(i).is_some_and(|l| l.trim_end() == "----") {
            assert!(code.is_some(), "{at}: `statement ok` takes no expectations");
            i += 1;
            while i < lines.len() && !lines[i].trim().is_empty() {
                let l = lines[i].trim_end();
                fragments.push(if let Some(t) = l.strip_prefix('^') {
                    Fragment::StartsWith(t.to_string())
                } else if let Some(t) = l.strip_prefix('!') {
                    Fragment::Absent(t.to_string())
                } else {
                    Fragment::Contains(l.to_string())
                });
                i += 1;
            }
        }
        if !applies {
            continue;
        }
        let mut sql = sql.join("\n");
        for (name, value) in vars {
            sql = sql.replace(&format!("{{{name}}}"), value);
        }
        assert!(
            !sql.contains("{copy_target}") && !sql.contains("{external_dir}"),
            "{at}: the runner gave no value for a placeholder: {sql}"
        );
        let expect = match code {
            None => Expect::Ok,
            Some(code) => Expect::Error { code, fragments },
        };
        cases.push(Case { at, sql, expect });
    }
    cases
}

fn known_runner(file: &str, i: usize, label: &str) -> Runner {
    [Runner::Engine, Runner::Http, Runner::Pg]
        .into_iter()
        .find(|r| r.label() == label)
        .unwrap_or_else(|| {
            panic!(
                "{file}:{}: unknown runner {label:?} (engine, http, pg)",
                i + 1
            )
        })
}

#[test]
fn the_format_parses_conditions_statements_and_expectations() {
    let text = concat!(
        "# c\n",
        "statement error forbidden_statement\n",
        "DROP TABLE spans\n",
        "----\n",
        "read-only\n",
        "^DROP\n",
        "!root:\n",
        "\n",
        "skipif pg\n",
        "statement ok\n",
        "SELECT\n",
        "  1\n",
        "\n",
        "onlyif pg\n",
        "statement ok\n",
        "COPY x TO '{copy_target}'\n",
    );
    let engine = parse("t.slt", text, Runner::Engine, &[("copy_target", "/x")]);
    assert_eq!(engine.len(), 2);
    assert_eq!(engine[0].at, "t.slt:2");
    assert_eq!(engine[0].sqlstate(), Some("42501"));
    assert_eq!(
        engine[0].expect,
        Expect::Error {
            code: "forbidden_statement".into(),
            fragments: vec![
                Fragment::Contains("read-only".into()),
                Fragment::StartsWith("DROP".into()),
                Fragment::Absent("root:".into()),
            ],
        }
    );
    assert_eq!(engine[1].sql, "SELECT\n  1");
    assert_eq!(engine[1].http_status(), 200);
    let pg = parse("t.slt", text, Runner::Pg, &[("copy_target", "/x")]);
    assert_eq!(pg.len(), 2);
    assert_eq!(pg[1].sql, "COPY x TO '/x'");
}
