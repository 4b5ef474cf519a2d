//! Detection of internal details leaked to the model in tool results.
//!
//! A tool should hand the model a small stable error envelope and log the details under a
//! reference id. [`detect_leak`] flags results that instead carry stack frames (Python, Java,
//! Node, Go, Rust, Ruby, .NET), absolute server file paths, SQL statements or database-driver
//! error text; the ingest path stores the answer as the `leaked_internals` column.
//!
//! How it stays fast: one case-insensitive SIMD pass (see `TriggerSearch`) finds trigger
//! substrings (`traceback (most recent`, `.java:`, `goroutine `, `/home/`, `select `,
//! `sqlstate`, ...). A string with no trigger is clean. Each occurrence is then confirmed where
//! it stands: a byte or two around it, then a regex anchored at it over a bounded window, most
//! specific kind first. No regex ever scans the whole input.

use std::sync::LazyLock;

use crate::trigger::TriggerSearch;
use regex::Regex;

/// What kind of internal detail a tool result leaked to the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeakKind {
    /// Stack frames or a backtrace: Python, Java/Kotlin, Node, Go, Rust, Ruby, .NET.
    StackFrames,
    /// An absolute server-side file path, or a `site-packages/` / `node_modules/` path.
    FilePath,
    /// An SQL statement.
    SqlText,
    /// Error text from a database driver or ORM.
    DriverError,
}

impl LeakKind {
    /// Stable snake_case name, e.g. for metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            LeakKind::StackFrames => "stack_frames",
            LeakKind::FilePath => "file_path",
            LeakKind::SqlText => "sql_text",
            LeakKind::DriverError => "driver_error",
        }
    }
}

/// True (`Some(kind)`) when text returned to the model carries stack frames (Python, Java,
/// Node, Go, Rust), absolute file paths, SQL text or database-driver error text. When several
/// are present the most specific is reported, in the order stack frames, driver error, SQL
/// text, file path.
pub fn detect_leak(s: &str) -> Option<LeakKind> {
    let d = &*DETECTOR;
    let b = s.as_bytes();
    // (rank of the kind, position, trigger): most specific kind first, so the first
    // occurrence that checks out is the answer.
    let mut hits: Vec<(u8, usize, usize)> = Vec::new();
    d.triggers
        .for_each(b, |pos, t| hits.push((rank(TRIGGERS[t].1), pos, t)));
    hits.sort_unstable();
    if let Some(&(_, _, t)) = hits.iter().find(|&&(_, p, t)| d.check(s, p, t)) {
        return Some(TRIGGERS[t].1);
    }
    // Windows paths, `C:\Users\...` (also with JSON-escaped backslashes), found from the `:\`.
    let windows = d.drive.find_iter(b).any(|at| {
        at > 0
            && b[at - 1].is_ascii_alphabetic()
            && (at < 2 || !is_ident(b[at - 2]))
            && d.windows_path.is_match(&s[at - 1..])
    });
    windows.then_some(LeakKind::FilePath)
}

/// True when [`detect_leak`] finds anything.
pub fn leaked_internals(s: &str) -> bool {
    detect_leak(s).is_some()
}

fn rank(kind: LeakKind) -> u8 {
    match kind {
        LeakKind::StackFrames => 0,
        LeakKind::DriverError => 1,
        LeakKind::SqlText => 2,
        LeakKind::FilePath => 3,
    }
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'$'
}

/// What the bytes at a trigger occurrence must look like.
#[derive(Clone, Copy)]
enum Check {
    /// This exact text (case-sensitive) starts at the trigger.
    Exact(&'static str),
    /// `Exact`, and the trigger does not continue a word.
    ExactWord(&'static str),
    /// The anchored regex `Pattern` matches at the trigger. `before` constrains the byte before
    /// the trigger, `after` the byte right after it; both are checked first, as they are cheap.
    Regex(Pattern, Before, After),
}

#[derive(Clone, Copy)]
enum Before {
    Any,
    /// Not a letter, digit, `_` or `$`.
    NotWord,
    /// A letter, digit, `_` or `$` (a file name before `.java:`).
    Word,
    /// Start of text, whitespace, a quote, or `(=:[,<>|`: a path starts a token, so `/app/`
    /// in `https://docs.example.com/app/guide` does not count.
    PathStart,
}

#[derive(Clone, Copy)]
enum After {
    Any,
    Digit,
    /// `"` or `\` (an escaped quote).
    Quote,
}

/// The anchored regexes, indexes into `Detector::regexes`.
#[derive(Clone, Copy)]
enum Pattern {
    PyFrame,
    JvmFrame,
    CausedBy,
    NodeAsync,
    NodeLocation,
    NodeInternal,
    Goroutine,
    GoFrame,
    RustPanic,
    RubyFrame,
    DotnetFrame,
    Psycopg,
    Oracle,
    Mysql,
    Sqlite,
    Violates,
    DoesNotExist,
    JavaSql,
    Sequelize,
    Prisma,
    Sql,
    HomePath,
    SystemPath,
    FileUrl,
    Packages,
    NodeModules,
}

/// The source of each [`Pattern`], in declaration order. Each is anchored with `^` at its
/// trigger, except `DoesNotExist`, which ends at its trigger (see `Detector::matches_at`).
const PATTERNS: &[&str] = &[
    // Python frame, also with JSON-escaped quotes.
    r#"^File \\?"[^"\n]+\\?", line \d+"#,
    // JVM frame location: `Foo.java:42)`.
    r#"^\.(?:java|kt):\d+\)"#,
    r#"^Caused by: (?:[A-Za-z0-9_$]+\.)+[A-Za-z0-9_$]*(?:Exception|Error|Throwable)"#,
    r#"^at async [A-Za-z0-9_$.<>\[\]]+ \("#,
    // Node frame location: `index.js:10:5`.
    r#"^\.(?:js|mjs|cjs|ts):\d+:\d+"#,
    r#"^node:internal/[^\s()]+:\d+:\d+"#,
    r#"^goroutine \d+ \[[^\]\n]+\]:"#,
    r#"^\.go:\d+ \+0x[0-9a-f]+"#,
    // Old `panicked at 'msg', src/x.rs:1:2` and new `panicked at src/x.rs:1:2` forms.
    r#"^panicked at (?:'[^'\n]*', )?[^\s:]+\.rs:\d+:\d+"#,
    r#"^\.rb:\d+:in [`']"#,
    r#"^\.cs:line \d+"#,
    r#"^psycopg2?\.(?:errors\.|[A-Za-z]*Error)"#,
    r#"^ORA-\d{5}(?-u:\b)"#,
    r#"^ERROR \d{4} \([0-9A-Z]{5}\)"#,
    r#"^(?:sqlite3\.[A-Za-z]*Error|SQLITE_(?:ERROR|CONSTRAINT|BUSY|LOCKED|READONLY|CORRUPT))"#,
    r#"^violates (?:foreign key|not-null|check|exclusion) constraint"#,
    r#"(?:relation|column|table|schema|database) \\?"[^"\\\n]+\\?" does not exist$"#,
    r#"^java\.sql\.[A-Za-z]+"#,
    r#"^Sequelize[A-Za-z]*Error"#,
    r#"^PrismaClient[A-Za-z]*Error"#,
    // SQL statements, case-insensitive. Each form needs SQL structure around the keyword, so
    // English such as "select a file from the list" or "update your settings" does not count.
    // `Detector::new` widens `\s` to take JSON-escaped `\n`, `\r` and `\t` as blanks too:
    // statements often sit in JSON strings.
    concat!(
        r#"(?im)\A(?:"#,
        // SELECT with a column list only SQL has: `*`, a call, `t.col`, or a comma list.
        r#"select\s+(?:distinct\s+|top\s+\d+\s+)?(?:\*|[A-Za-z0-9_"`\[\]]+\s*\(|[A-Za-z0-9_"`\[\]]+\.[A-Za-z0-9_"`\[\]*]+|[A-Za-z0-9_"`\[\]]+\s*,)[^;]*?(?-u:\b)from\s+[A-Za-z0-9_."`\[\]]+"#,
        // SELECT col FROM table, then a clause keyword or the end of the statement.
        r#"|select\s+[A-Za-z0-9_."`\[\]]+\s+from\s+[A-Za-z0-9_."`\[\]]+(?:\s+(?:where|join|inner|left|right|full|cross|natural|limit|order|group|having|union|offset|fetch)(?-u:\b)|\s*(?:;|\)|$|"|\\n))"#,
        r#"|insert\s+(?:ignore\s+)?into\s+[A-Za-z0-9_."`\[\]]+\s*(?:\(|values(?-u:\b)|select(?-u:\b)|default\s+values|set\s)"#,
        r#"|update\s+[A-Za-z0-9_."`\[\]]+\s+set\s+[A-Za-z0-9_."`\[\]]+\s*="#,
        r#"|delete\s+from\s+[A-Za-z0-9_."`\[\]]+(?:\s+(?:where|using|returning)(?-u:\b)|\s*(?:;|\)|$|"|\\n))"#,
        r#"|create\s+(?:or\s+replace\s+)?(?:(?:global\s+|local\s+)?temp(?:orary)?\s+|unlogged\s+)?table\s+(?:if\s+not\s+exists\s+)?[A-Za-z0-9_."`\[\]]+\s*\("#,
        r#"|(?:drop|truncate)\s+table\s+(?:if\s+exists\s+)?[A-Za-z0-9_."`\[\]]+\s*(?:;|$|"|\\n|cascade(?-u:\b))"#,
        r#"|alter\s+table\s+[A-Za-z0-9_."`\[\]]+\s+(?:add|drop|alter|rename|modify)(?-u:\b)"#,
        r#")"#,
    ),
    // A directory under a home directory or /etc counts as it is.
    r#"^/(?:home|Users|root|etc)/[A-Za-z0-9_.@+-]+"#,
    // Under system directories only a file with an extension counts (`/app/x.py`), so API
    // routes such as `/app/settings` do not.
    r#"^/(?:usr|var|srv|app|opt|tmp)/(?:[A-Za-z0-9_.@+-]+/)*[A-Za-z0-9_@+-]+\.[A-Za-z][A-Za-z0-9]{0,7}(?-u:\b)"#,
    r#"^file:///[^\s"']+"#,
    r#"^-packages[/\\]"#,
    r#"^node_modules[/\\]"#,
];

/// Windows path with at least two components, anchored at the drive letter.
const WINDOWS_PATH: &str = r#"^[A-Za-z]:\\{1,2}[A-Za-z0-9_ .$()-]+\\{1,2}[A-Za-z0-9_.$-]"#;

use Check::{Exact, ExactWord, Regex as Re};
use LeakKind::{DriverError as Drv, FilePath as Path, SqlText as Sql, StackFrames as Stack};

/// Trigger strings (ASCII case-insensitive), the kind each one signals and how to confirm it.
/// At most 64, so that one Teddy pass covers them. SQL keywords carry the blank after them, so
/// that `created_at` and `updated_at`, in nearly every JSON record, are not occurrences at
/// all; under the case fold `select*` also stands for `select` and a newline, and `select|`
/// for `select\` (a JSON-escaped `\n`).
#[rustfmt::skip]
const TRIGGERS: &[(&str, LeakKind, Check)] = &[
    // Python
    ("traceback (most recent call last)", Stack, Exact("Traceback (most recent call last)")),
    ("file ", Stack, Re(Pattern::PyFrame, Before::NotWord, After::Quote)),
    // JVM
    (".java:", Stack, Re(Pattern::JvmFrame, Before::Word, After::Digit)),
    (".kt:", Stack, Re(Pattern::JvmFrame, Before::Word, After::Digit)),
    ("(native method)", Stack, Exact("(Native Method)")),
    ("exception in thread \"", Stack, Exact("Exception in thread \"")),
    ("caused by: ", Stack, Re(Pattern::CausedBy, Before::Any, After::Any)),
    // Node
    ("at object.<anonymous>", Stack, ExactWord("at Object.<anonymous>")),
    ("at async ", Stack, Re(Pattern::NodeAsync, Before::NotWord, After::Any)),
    (".js:", Stack, Re(Pattern::NodeLocation, Before::Word, After::Digit)),
    (".mjs:", Stack, Re(Pattern::NodeLocation, Before::Word, After::Digit)),
    (".cjs:", Stack, Re(Pattern::NodeLocation, Before::Word, After::Digit)),
    (".ts:", Stack, Re(Pattern::NodeLocation, Before::Word, After::Digit)),
    ("node:internal/", Stack, Re(Pattern::NodeInternal, Before::Any, After::Any)),
    // Go
    ("goroutine ", Stack, Re(Pattern::Goroutine, Before::NotWord, After::Digit)),
    (".go:", Stack, Re(Pattern::GoFrame, Before::Word, After::Digit)),
    // Rust
    ("panicked at ", Stack, Re(Pattern::RustPanic, Before::Any, After::Any)),
    ("stack backtrace:", Stack, Exact("stack backtrace:")),
    ("rust_backtrace", Stack, Exact("RUST_BACKTRACE")),
    // Ruby, .NET
    (".rb:", Stack, Re(Pattern::RubyFrame, Before::Word, After::Digit)),
    (".cs:line ", Stack, Re(Pattern::DotnetFrame, Before::Word, After::Digit)),
    // Drivers and ORMs
    ("psycopg", Drv, Re(Pattern::Psycopg, Before::NotWord, After::Any)),
    ("sqlstate", Drv, Exact("SQLSTATE")),
    ("ora-", Drv, Re(Pattern::Oracle, Before::NotWord, After::Digit)),
    ("error ", Drv, Re(Pattern::Mysql, Before::NotWord, After::Digit)),
    ("pq: ", Drv, ExactWord("pq: ")),
    ("sqlite", Drv, Re(Pattern::Sqlite, Before::NotWord, After::Any)),
    ("duplicate key value violates unique constraint", Drv, Exact("duplicate key value violates unique constraint")),
    ("violates ", Drv, Re(Pattern::Violates, Before::Any, After::Any)),
    ("\" does not exist", Drv, Re(Pattern::DoesNotExist, Before::Any, After::Any)),
    ("syntax error at or near", Drv, Exact("syntax error at or near")),
    ("java.sql.", Drv, Re(Pattern::JavaSql, Before::Any, After::Any)),
    ("mysqldb", Drv, Exact("MySQLdb")),
    ("pymysql.err", Drv, Exact("pymysql.err")),
    ("mysql.connector.errors", Drv, Exact("mysql.connector.errors")),
    ("sqlalchemy.exc.", Drv, Exact("sqlalchemy.exc.")),
    ("sequelize", Drv, Re(Pattern::Sequelize, Before::Any, After::Any)),
    ("prismaclient", Drv, Re(Pattern::Prisma, Before::Any, After::Any)),
    ("mongoservererror", Drv, Exact("MongoServerError")),
    ("er_dup_entry", Drv, ExactWord("ER_DUP_ENTRY")),
    ("er_parse_error", Drv, ExactWord("ER_PARSE_ERROR")),
    // SQL
    ("select ", Sql, Re(Pattern::Sql, Before::NotWord, After::Any)),
    ("select*", Sql, Re(Pattern::Sql, Before::NotWord, After::Any)),
    ("select|", Sql, Re(Pattern::Sql, Before::NotWord, After::Any)),
    ("insert ", Sql, Re(Pattern::Sql, Before::NotWord, After::Any)),
    ("update ", Sql, Re(Pattern::Sql, Before::NotWord, After::Any)),
    ("delete ", Sql, Re(Pattern::Sql, Before::NotWord, After::Any)),
    ("create ", Sql, Re(Pattern::Sql, Before::NotWord, After::Any)),
    ("drop ", Sql, Re(Pattern::Sql, Before::NotWord, After::Any)),
    ("truncate ", Sql, Re(Pattern::Sql, Before::NotWord, After::Any)),
    ("alter ", Sql, Re(Pattern::Sql, Before::NotWord, After::Any)),
    // Paths
    ("/home/", Path, Re(Pattern::HomePath, Before::PathStart, After::Any)),
    ("/users/", Path, Re(Pattern::HomePath, Before::PathStart, After::Any)),
    ("/root/", Path, Re(Pattern::HomePath, Before::PathStart, After::Any)),
    ("/etc/", Path, Re(Pattern::HomePath, Before::PathStart, After::Any)),
    ("/usr/", Path, Re(Pattern::SystemPath, Before::PathStart, After::Any)),
    ("/var/", Path, Re(Pattern::SystemPath, Before::PathStart, After::Any)),
    ("/srv/", Path, Re(Pattern::SystemPath, Before::PathStart, After::Any)),
    ("/app/", Path, Re(Pattern::SystemPath, Before::PathStart, After::Any)),
    ("/opt/", Path, Re(Pattern::SystemPath, Before::PathStart, After::Any)),
    ("/tmp/", Path, Re(Pattern::SystemPath, Before::PathStart, After::Any)),
    ("file:///", Path, Re(Pattern::FileUrl, Before::Any, After::Any)),
    ("-packages", Path, Re(Pattern::Packages, Before::Any, After::Any)),
    ("node_modules", Path, Re(Pattern::NodeModules, Before::Any, After::Any)),
];

/// How far from a trigger a leak pattern may reach.
const WINDOW: usize = 1024;

struct Detector {
    triggers: TriggerSearch,
    drive: memchr::memmem::Finder<'static>,
    regexes: Vec<Regex>,
    windows_path: Regex,
}

static DETECTOR: LazyLock<Detector> = LazyLock::new(Detector::new);

/// Compiles a built-in pattern. The patterns are literals in this file and every one is
/// exercised by the unit tests, so failing here is a programming error caught by `cargo test`.
fn builtin_regex(pattern: &str) -> Regex {
    #[allow(clippy::expect_used)]
    Regex::new(pattern).expect("built-in leak pattern compiles (covered by tests)")
}

impl Detector {
    fn new() -> Detector {
        let patterns: Vec<&str> = TRIGGERS.iter().map(|(t, _, _)| *t).collect();
        Detector {
            triggers: TriggerSearch::new(&patterns),
            drive: memchr::memmem::Finder::new(br":\"),
            regexes: PATTERNS
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    if i == Pattern::Sql as usize {
                        builtin_regex(&p.replace(r"\s", r"(?:\s|\\[nrt])"))
                    } else {
                        builtin_regex(p)
                    }
                })
                .collect(),
            windows_path: builtin_regex(WINDOWS_PATH),
        }
    }

    /// Confirms the occurrence of trigger `t` at `p`.
    fn check(&self, s: &str, p: usize, t: usize) -> bool {
        let (trigger, _, check) = TRIGGERS[t];
        let b = s.as_bytes();
        let word_before = p > 0 && is_ident(b[p - 1]);
        match check {
            Check::Exact(text) => s[p..].starts_with(text),
            Check::ExactWord(text) => !word_before && s[p..].starts_with(text),
            Check::Regex(pattern, before, after) => {
                let before_ok = match before {
                    Before::Any => true,
                    Before::NotWord => !word_before,
                    Before::Word => word_before,
                    Before::PathStart => p == 0 || b" \t\r\n\"'(=:[,`<>|".contains(&b[p - 1]),
                };
                let next = b.get(p + trigger.len());
                let after_ok = match after {
                    After::Any => true,
                    After::Digit => next.is_some_and(u8::is_ascii_digit),
                    After::Quote => next.is_some_and(|c| *c == b'"' || *c == b'\\'),
                };
                before_ok && after_ok && self.matches_at(s, p, trigger.len(), pattern)
            }
        }
    }

    fn matches_at(&self, s: &str, p: usize, trigger_len: usize, pattern: Pattern) -> bool {
        let regex = &self.regexes[pattern as usize];
        if let Pattern::DoesNotExist = pattern {
            // The match ends with the trigger: search a bounded window before it.
            let end = p + trigger_len;
            let mut lo = p.saturating_sub(WINDOW);
            while !s.is_char_boundary(lo) {
                lo += 1;
            }
            return regex.is_match(&s[lo..end]);
        }
        if let Pattern::Packages = pattern {
            // `site-packages/` or `dist-packages/`.
            let b = s.as_bytes();
            if p < 4 || !(&b[p - 4..p] == b"site" || &b[p - 4..p] == b"dist") {
                return false;
            }
        }
        // Every leak pattern is local: search a bounded window so that a miss costs little.
        let mut end = (p + WINDOW).min(s.len());
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        regex.is_match(&s[p..end])
    }
}

// ---------------------------------------------------------------------------------------------
// Trigger search
// The same prefilter as in `redact.rs`, kept local so that each module stands alone.

#[cfg(test)]
mod tests {
    use super::*;

    /// Checks `s` alone (short inputs take the automaton path) and inside longer text (the
    /// Teddy path, across a chunk boundary).
    fn assert_kind(s: &str, kind: LeakKind) {
        assert_eq!(detect_leak(s), Some(kind), "input: {s:?}");
        assert!(leaked_internals(s));
        for pad in [40, 2040] {
            let long = format!("{}\n{s}\n{}", "ok. ".repeat(pad / 4), "fine ".repeat(10));
            assert_eq!(detect_leak(&long), Some(kind), "padded by {pad}: {s:?}");
        }
    }

    fn assert_clean(s: &str) {
        assert_eq!(detect_leak(s), None, "input: {s:?}");
        assert!(!leaked_internals(s));
        let long = format!("{}{s}{}", "ok. ".repeat(20), " fine".repeat(20));
        assert_eq!(detect_leak(&long), None, "padded: {s:?}");
    }

    #[test]
    fn python_tracebacks() {
        assert_kind(
            "Traceback (most recent call last):\n  File \"/app/x.py\", line 12, in f\n    g()\nValueError: bad",
            LeakKind::StackFrames,
        );
        assert_kind(
            r#"{"error":"  File \"/app/x.py\", line 12, in f"}"#,
            LeakKind::StackFrames,
        );
        assert_kind(
            "File \"main.py\", line 3, in <module>",
            LeakKind::StackFrames,
        );
    }

    #[test]
    fn java_traces() {
        assert_kind("\tat com.acme.Foo.bar(Foo.java:42)", LeakKind::StackFrames);
        assert_kind(
            "at java.base/java.lang.Thread.run(Thread.java:829)",
            LeakKind::StackFrames,
        );
        assert_kind(
            "at sun.reflect.NativeMethodAccessorImpl.invoke0(Native Method)",
            LeakKind::StackFrames,
        );
        assert_kind(
            "Exception in thread \"main\" java.lang.NullPointerException",
            LeakKind::StackFrames,
        );
        assert_kind(
            "Caused by: java.io.IOException: broken pipe",
            LeakKind::StackFrames,
        );
        assert_kind(
            "at com.acme.KtThing.run(KtThing.kt:7)",
            LeakKind::StackFrames,
        );
    }

    #[test]
    fn node_traces() {
        assert_kind(
            "TypeError: x is undefined\n    at fn (/srv/app/index.js:10:5)",
            LeakKind::StackFrames,
        );
        assert_kind("    at async Promise.all (index 0)", LeakKind::StackFrames);
        assert_kind(
            "    at Object.<anonymous> (index.js:1:1)",
            LeakKind::StackFrames,
        );
        assert_kind(
            "    at /srv/app/lib/handler.ts:88:13",
            LeakKind::StackFrames,
        );
        assert_kind(
            "    at process.processTicksAndRejections (node:internal/process/task_queues:95:5)",
            LeakKind::StackFrames,
        );
        assert_kind(
            "at new Client (file:///srv/app/client.mjs:3:9)",
            LeakKind::StackFrames,
        );
    }

    #[test]
    fn go_traces() {
        assert_kind("goroutine 1 [running]:\nmain.main()", LeakKind::StackFrames);
        assert_kind("panic: boom\n\t/x/y.go:123 +0x1d", LeakKind::StackFrames);
    }

    #[test]
    fn rust_traces() {
        assert_kind(
            "thread 'main' panicked at src/main.rs:10:5:\nboom",
            LeakKind::StackFrames,
        );
        assert_kind(
            "thread 'main' panicked at 'boom', src/main.rs:10:5",
            LeakKind::StackFrames,
        );
        assert_kind(
            "stack backtrace:\n   0: rust_begin_unwind",
            LeakKind::StackFrames,
        );
        assert_kind(
            "note: run with `RUST_BACKTRACE=1` environment variable",
            LeakKind::StackFrames,
        );
    }

    #[test]
    fn ruby_and_dotnet_traces() {
        assert_kind("app.rb:10:in `block in <main>'", LeakKind::StackFrames);
        assert_kind(
            "   at Acme.Api.Handler.Run() in C:\\src\\Handler.cs:line 42",
            LeakKind::StackFrames,
        );
    }

    #[test]
    fn file_paths() {
        for s in [
            "cannot open /home/alice/project",
            "config at /etc/acme/settings.toml",
            "wrote /tmp/upload-1234.csv",
            "see /usr/lib/python3.11/json/decoder.py",
            "log: /var/log/app.log",
            r#"{"path":"/srv/data/export.parquet"}"#,
            "loaded /opt/acme/bin/server.so",
            "error in /app/handlers/search.py",
            "C:\\Users\\bob\\app\\main.py",
            r#"{"file":"C:\\Users\\bob\\main.py"}"#,
            "from venv/lib/site-packages/requests",
            "in ./node_modules/express/index",
            "open file:///srv/app/x",
        ] {
            assert_kind(s, LeakKind::FilePath);
        }
    }

    #[test]
    fn sql_text() {
        for s in [
            "SELECT id, name FROM users WHERE id = 1",
            "select * from orders",
            "select count(*) from t",
            "SELECT\n  id,\n  name\nFROM users\nWHERE id = 1",
            r#"{"query":"SELECT\n  id\nFROM users;"}"#,
            "SELECT u.email FROM users u",
            "query: select name from users",
            r#"{"sql":"select name from users"}"#,
            "INSERT INTO users (id, name) VALUES (1, 'a')",
            "insert into t values (1)",
            "UPDATE accounts SET balance = 0 WHERE id = 2",
            "DELETE FROM sessions WHERE expired",
            "delete from sessions;",
            "CREATE TABLE users (id int)",
            "create table if not exists t(x int)",
            "DROP TABLE users;",
            "ALTER TABLE users ADD COLUMN x int",
        ] {
            assert_kind(s, LeakKind::SqlText);
        }
    }

    #[test]
    fn driver_errors() {
        for s in [
            "psycopg2.errors.UniqueViolation: duplicate",
            "psycopg.errors.UndefinedTable",
            "psycopg2.OperationalError: could not connect",
            "SQLSTATE[23000]: Integrity constraint violation",
            "ORA-00942: table or view does not exist",
            "ERROR 1064 (42000): You have an error in your SQL syntax",
            "pq: password authentication failed",
            "sqlite3.OperationalError: no such table: t",
            "duplicate key value violates unique constraint \"users_pkey\"",
            "relation \"users\" does not exist",
            r#"{"e":"relation \"users\" does not exist"}"#,
            "syntax error at or near \"FROM\"",
            "java.sql.SQLException: Connection refused",
            "_mysql_exceptions via MySQLdb",
            "SequelizeDatabaseError: column x",
            "PrismaClientKnownRequestError: Unique constraint failed",
            "MongoServerError: E11000 duplicate key error collection",
            "Error: ER_DUP_ENTRY: Duplicate entry '1' for key 'PRIMARY'",
            "sqlalchemy.exc.IntegrityError: (x)",
        ] {
            assert_kind(s, LeakKind::DriverError);
        }
    }

    #[test]
    fn most_specific_kind_wins() {
        // A traceback carries paths too: frames are reported.
        assert_kind(
            "Traceback (most recent call last):\n  File \"/usr/lib/python3/x.py\", line 1, in f",
            LeakKind::StackFrames,
        );
        // Driver text that quotes SQL is a driver error.
        assert_kind(
            "ERROR 1064 (42000): near 'SELECT * FROM users'",
            LeakKind::DriverError,
        );
    }

    #[test]
    fn ordinary_tool_output_is_clean() {
        for s in [
            "",
            "ok",
            r#"{"results":[{"title":"Select a file","url":"https://docs.example.com/app/guide","snippet":"Select a file from the list, then update your settings."}]}"#,
            "Please select a file from the list.",
            "Select all from the dropdown menu",
            "select one, then continue",
            "update your settings and create a table of contents",
            "Delete from your account the items you no longer need",
            "insert into the form your name",
            "https://docs.example.com/app/guide",
            "https://example.com/home/index.html",
            "GET /app/settings returned 200",
            r#"{"error":{"code":"invalid_status","class":"invalid_request","retryable":false,"reference":"err_7c1f9a"}}"#,
            "meet at 10:30:00 in room 4",
            "the outage was caused by: a network failure",
            "error 404 not found",
            "the relation between x and y does not exist",
            r#"{"created_at":"2025-11-29T12:00:00Z","updated_at":"2025-11-29T12:00:01Z","status":"done"}"#,
            "panic: out of coffee",
            "look at async iterators in the guide",
            "rotate keys with the main.go tool",
        ] {
            assert_clean(s);
        }
    }

    #[test]
    fn fast_path_is_under_test() {
        // Teddy needs SSSE3, which every x86_64 machine this runs on has; the padded cases in
        // `assert_kind` then exercise it.
        #[cfg(target_arch = "x86_64")]
        assert!(!DETECTOR.triggers.packed.is_empty());
        assert!(
            TRIGGERS.len() <= 64,
            "one Teddy pass holds at most 64 triggers"
        );
        assert_eq!(
            PATTERNS.len(),
            Pattern::NodeModules as usize + 1,
            "one source per Pattern"
        );
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn never_panics(s in "\\PC*") {
                let _ = detect_leak(&s);
            }

            #[test]
            fn never_panics_near_triggers(parts in proptest::collection::vec(
                prop_oneof![
                    "\\PC{0,8}",
                    proptest::sample::select(vec![
                        "é", "ORA-", "C:\\", ":\\", "select ", "update x set ", "/app/", "File \"",
                        "\" does not exist", "site-packages/", ".js:1", "goroutine 1 [", "at async ",
                        "panicked at ", "error 1", "\n", " ",
                    ]).prop_map(str::to_string),
                ],
                0..60,
            )) {
                let _ = detect_leak(&parts.concat());
            }
        }
    }

    #[test]
    fn kind_names() {
        assert_eq!(LeakKind::StackFrames.as_str(), "stack_frames");
        assert_eq!(LeakKind::FilePath.as_str(), "file_path");
        assert_eq!(LeakKind::SqlText.as_str(), "sql_text");
        assert_eq!(LeakKind::DriverError.as_str(), "driver_error");
    }
}
