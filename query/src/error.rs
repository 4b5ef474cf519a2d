//! The query service's errors and their envelope.
//!
//! A [`QueryError`] carries a [`QueryErrorKind`] (the stable code and a message toolspan
//! writes itself) and a reference. The full internal detail (DataFusion's or delta-rs's error
//! text, which may hold file paths and plan fragments) travels with it and is never returned:
//! the front end that answers with the error logs the detail once under the reference
//! ([`toolspan_schema::Envelope::log`]); [`QueryError::envelope`] is what callers see.

use std::fmt;

use datafusion::arrow::error::ArrowError;
use datafusion::common::SchemaError;
use datafusion::error::DataFusionError;
use datafusion::sql::sqlparser::parser::ParserError;
use toolspan_schema::error::{new_reference, Code, ErrorClass};
use toolspan_store::StoreError;

/// The tables and views a query may read, in the order messages list them.
pub const TABLES: [&str; 5] = [
    "spans",
    "calls",
    "recoveries",
    "failure_rates",
    "answer_shapes",
];

/// What was wrong with a query, as the caller should read it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryErrorKind {
    /// The text does not parse.
    #[error("{message}")]
    SqlSyntax {
        /// Where and what, in toolspan's words.
        message: String,
    },
    /// A column that does not exist.
    #[error("{}", unknown_column_message(.column, .available, .suggestion.as_deref()))]
    UnknownColumn {
        /// The column as the query wrote it.
        column: String,
        /// Columns of the tables in scope.
        available: Vec<String>,
        /// A close match among `available`, if any.
        suggestion: Option<String>,
    },
    /// A table that does not exist.
    #[error(
        "unknown table `{table}`: the tables are {}",
        TABLES.join(", ")
    )]
    UnknownTable {
        /// The table as the query wrote it.
        table: String,
    },
    /// A statement other than a query.
    #[error(
        "{statement} is not allowed: toolspan's SQL interface is read-only and runs one \
         SELECT statement (WITH, UNION and VALUES included), or DESCRIBE of a table, over {}",
        TABLES.join(", ")
    )]
    ForbiddenStatement {
        /// The statement's leading keywords, e.g. `DROP TABLE`.
        statement: String,
    },
    /// Valid SQL that cannot be planned or evaluated as written.
    #[error("{message}")]
    InvalidQuery {
        /// What to change, in toolspan's words.
        message: String,
    },
    /// The query ran longer than allowed.
    #[error(
        "the query ran longer than {seconds} s and was cancelled: narrow it with a time range \
         (start_time or date) and a tool, or add LIMIT"
    )]
    Timeout {
        /// The limit.
        seconds: u64,
    },
    /// The query needed more memory than allowed.
    #[error(
        "the query needed more memory than the server allows: narrow it with a time range \
         (start_time or date), a tool, fewer GROUP BY keys, or LIMIT"
    )]
    ResourcesExhausted,
    /// The table's storage could not be read.
    #[error("the spans table could not be read right now; retry shortly")]
    StoreUnavailable,
    /// Too many queries are running; this one waited for its turn and gave up.
    #[error(
        "the query service is busy: {limit} queries are already running and this one waited \
         {waited_seconds} s for its turn; retry shortly"
    )]
    Overloaded {
        /// Queries allowed to run at once.
        limit: usize,
        /// How long the query waited.
        waited_seconds: u64,
    },
    /// A fault inside toolspan.
    #[error(
        "internal error while running the query; the reference identifies it in toolspan's log"
    )]
    Internal,
}

fn unknown_column_message(column: &str, available: &[String], suggestion: Option<&str>) -> String {
    let mut m = format!("unknown column `{column}`");
    if let Some(s) = suggestion {
        m.push_str(&format!(" (did you mean `{s}`?)"));
    }
    if available.is_empty() {
        m.push_str(&format!(
            ": no table is in scope here; select FROM one of {}",
            TABLES.join(", ")
        ));
    } else {
        m.push_str(&format!(
            "; columns available here: {}",
            available.join(", ")
        ));
    }
    m
}

impl QueryErrorKind {
    /// The stable code.
    pub fn code(&self) -> Code {
        match self {
            QueryErrorKind::SqlSyntax { .. } => Code::SqlSyntax,
            QueryErrorKind::UnknownColumn { .. } => Code::UnknownColumn,
            QueryErrorKind::UnknownTable { .. } => Code::UnknownTable,
            QueryErrorKind::ForbiddenStatement { .. } => Code::ForbiddenStatement,
            QueryErrorKind::InvalidQuery { .. } => Code::InvalidQuery,
            QueryErrorKind::Timeout { .. } => Code::QueryTimeout,
            QueryErrorKind::ResourcesExhausted => Code::ResourcesExhausted,
            QueryErrorKind::StoreUnavailable => Code::StoreUnavailable,
            QueryErrorKind::Overloaded { .. } => Code::Overloaded,
            QueryErrorKind::Internal => Code::Internal,
        }
    }
}

/// An error of the query service: what was wrong, a reference, and the internal detail that
/// the front end answering with it logs under that reference ([`toolspan_schema::Envelope::log`]).
#[derive(Debug, Clone)]
pub struct QueryError {
    kind: QueryErrorKind,
    reference: String,
    /// `None` when the detail is in the log already (a store error its handler logged).
    detail: Option<String>,
}

impl QueryError {
    /// Makes an error under a new reference, keeping `detail` (which may hold paths and
    /// dependency text) for the log; nothing is logged here.
    pub fn new(kind: QueryErrorKind, detail: impl fmt::Display) -> QueryError {
        QueryError {
            kind,
            reference: new_reference(),
            detail: Some(detail.to_string()),
        }
    }

    /// Classifies a DataFusion error (planning or execution), keeping its text as the detail.
    pub fn from_datafusion(err: &DataFusionError) -> QueryError {
        // A store error raised inside a scan keeps its reference and its detail.
        if let DataFusionError::External(e) = err.find_root() {
            if let Some(s) = e.downcast_ref::<StoreError>() {
                return QueryError::from_store(s);
            }
        }
        QueryError::new(classify(err), err)
    }

    /// Wraps a store error, keeping its reference and its detail.
    pub fn from_store(err: &StoreError) -> QueryError {
        let kind = if err.retryable() {
            QueryErrorKind::StoreUnavailable
        } else {
            QueryErrorKind::Internal
        };
        QueryError {
            kind,
            reference: err.reference().to_string(),
            detail: toolspan_schema::EnvelopeError::detail(err),
        }
    }

    /// What was wrong.
    pub fn kind(&self) -> &QueryErrorKind {
        &self.kind
    }

    /// The stable code.
    pub fn code(&self) -> Code {
        self.kind.code()
    }

    /// The class of the code.
    pub fn class(&self) -> ErrorClass {
        self.code().class()
    }

    /// Whether the same query may succeed later.
    pub fn retryable(&self) -> bool {
        self.code().retryable()
    }

    /// The reference under which the front end that answers logs the detail.
    pub fn reference(&self) -> &str {
        &self.reference
    }

    /// The human message (also the `Display` form).
    pub fn message(&self) -> String {
        self.kind.to_string()
    }

    /// `{"error":{"code","class","message","retryable","reference"}}`, what every API returns.
    pub fn envelope(&self) -> serde_json::Value {
        toolspan_schema::EnvelopeError::envelope(self).to_json()
    }
}

impl toolspan_schema::EnvelopeError for QueryError {
    fn code(&self) -> Code {
        self.kind.code()
    }

    fn message(&self) -> String {
        self.kind.to_string()
    }

    fn reference(&self) -> Option<&str> {
        Some(&self.reference)
    }

    fn detail(&self) -> Option<String> {
        self.detail.clone()
    }
}

impl fmt::Display for QueryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.kind.fmt(f)
    }
}

impl std::error::Error for QueryError {}

/// Decides the kind of a DataFusion error from its structure; where DataFusion only gives
/// text, recognises a few planning failures and words the message itself.
pub(crate) fn classify(err: &DataFusionError) -> QueryErrorKind {
    use DataFusionError as D;
    // A pattern that does not compile is the caller's error wherever it surfaces: while
    // planning (a literal), or while evaluating a column inside a scan, where the Parquet
    // reader, a function or arrow wraps it in errors of their own.
    if let Some(kind) = regex_error(err) {
        return kind;
    }
    match err {
        D::Context(msg, _) if msg.contains("regex") => invalid_regex(false),
        D::Context(_, inner) | D::Diagnostic(_, inner) => classify(inner),
        D::Shared(inner) => classify(inner),
        D::Collection(errs) => errs.first().map_or(QueryErrorKind::Internal, classify),
        D::SQL(parser, _) => syntax(parser),
        D::SchemaError(schema, _) => schema_error(schema),
        D::ResourcesExhausted(_) => QueryErrorKind::ResourcesExhausted,
        D::ObjectStore(_) | D::IoError(_) => QueryErrorKind::StoreUnavailable,
        D::ArrowError(a, _) => arrow_error(a),
        D::Plan(msg) => plan_error(msg),
        D::NotImplemented(msg) if msg.contains("single SQL statement") => {
            QueryErrorKind::InvalidQuery {
                message: "send one statement at a time: the text holds more than one".into(),
            }
        }
        D::NotImplemented(_) => QueryErrorKind::InvalidQuery {
            message: "the query uses SQL that toolspan's engine does not support; rewrite it \
                      with standard SELECT syntax"
                .into(),
        },
        D::Execution(_) => QueryErrorKind::InvalidQuery {
            message: "the query failed while running: an expression could not be evaluated \
                      (check casts, regular expressions and function arguments)"
                .into(),
        },
        D::External(e) => external(e.as_ref()),
        _ => QueryErrorKind::Internal,
    }
}

/// The message of a regular expression that does not compile (`too_big`: one that parses
/// but compiles past the regex engine's size limit).
fn invalid_regex(too_big: bool) -> QueryErrorKind {
    let message = if too_big {
        "the regular expression is too large to compile: nested repetitions such as \
         (a{100}){100} multiply; simplify the pattern"
    } else {
        "invalid regular expression: check the pattern's brackets and escapes"
    };
    QueryErrorKind::InvalidQuery {
        message: message.into(),
    }
}

/// Recognises the regex engine's compile errors by their text, in whatever error DataFusion,
/// arrow or the Parquet reader wrapped them (the text is matched, never returned).
fn regex_error(err: &DataFusionError) -> Option<QueryErrorKind> {
    let text = err.to_string();
    let mut chain = vec![text];
    let mut cur: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(err);
    while let Some(e) = cur {
        chain.push(e.to_string());
        cur = e.source();
    }
    let text = chain.join(" ").to_ascii_lowercase();
    let too_big =
        text.contains("compiled regex exceeds size limit") || text.contains("compiledtoobig");
    let invalid = too_big
        || text.contains("regular expression did not compile")
        || text.contains("regex parse error");
    invalid.then(|| invalid_regex(too_big))
}

fn external(e: &(dyn std::error::Error + Send + Sync + 'static)) -> QueryErrorKind {
    if let Some(q) = e.downcast_ref::<QueryError>() {
        return q.kind.clone();
    }
    if let Some(s) = e.downcast_ref::<StoreError>() {
        return if s.retryable() {
            QueryErrorKind::StoreUnavailable
        } else {
            QueryErrorKind::Internal
        };
    }
    if let Some(df) = e.downcast_ref::<DataFusionError>() {
        return classify(df);
    }
    if let Some(a) = e.downcast_ref::<ArrowError>() {
        return arrow_error(a);
    }
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if err.downcast_ref::<std::io::Error>().is_some()
            || err.downcast_ref::<deltalake::ObjectStoreError>().is_some()
        {
            return QueryErrorKind::StoreUnavailable;
        }
        cur = err.source();
    }
    QueryErrorKind::Internal
}

fn arrow_error(e: &ArrowError) -> QueryErrorKind {
    let message = match e {
        ArrowError::DivideByZero => "division by zero: guard the divisor, e.g. NULLIF(x, 0)",
        ArrowError::CastError(_) | ArrowError::ParseError(_) => {
            "a value could not be converted to the requested type: check CAST and literal formats \
             (timestamps as TIMESTAMP '2025-01-31T12:00:00Z')"
        }
        ArrowError::ArithmeticOverflow(_) => {
            "an arithmetic result overflowed its type: CAST to a wider type"
        }
        ArrowError::MemoryError(_) => return QueryErrorKind::ResourcesExhausted,
        ArrowError::IoError(_, _) => return QueryErrorKind::StoreUnavailable,
        ArrowError::ComputeError(_) | ArrowError::InvalidArgumentError(_) => {
            "an expression could not be evaluated with these arguments: check function arguments \
             and types"
        }
        _ => return QueryErrorKind::Internal,
    };
    QueryErrorKind::InvalidQuery {
        message: message.into(),
    }
}

/// `sql parser error: Expected: an expression, found: FROM at Line: 1, Column: 8` becomes
/// `SQL syntax error at line 1, column 8: expected an expression, found FROM`.
fn syntax(e: &ParserError) -> QueryErrorKind {
    let tail = " toolspan runs one SELECT statement (WITH, UNION and VALUES included).";
    let text = match e {
        ParserError::ParserError(s) | ParserError::TokenizerError(s) => s.as_str(),
        ParserError::RecursionLimitExceeded => {
            return QueryErrorKind::SqlSyntax {
                message: format!("SQL syntax error: the statement nests too deeply.{tail}"),
            };
        }
    };
    let (body, position) = match text.rfind(" at Line: ") {
        Some(i) => {
            let pos = &text[i + " at Line: ".len()..];
            let position = pos
                .split_once(", Column: ")
                .map(|(l, c)| format!(" at line {l}, column {c}"))
                .unwrap_or_default();
            (&text[..i], position)
        }
        None => (text, String::new()),
    };
    let detail = match body
        .strip_prefix("Expected: ")
        .and_then(|r| r.split_once(", found: "))
    {
        Some((expected, found)) => format!("expected {expected}, found {found}"),
        None => shorten(body, 200),
    };
    QueryErrorKind::SqlSyntax {
        message: format!("SQL syntax error{position}: {detail}.{tail}"),
    }
}

fn shorten(s: &str, max: usize) -> String {
    let line = s.lines().next().unwrap_or("").trim();
    if line.len() <= max {
        return line.to_string();
    }
    let mut end = max;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &line[..end])
}

fn schema_error(e: &SchemaError) -> QueryErrorKind {
    match e {
        SchemaError::FieldNotFound {
            field,
            valid_fields,
        } => {
            let mut available: Vec<String> = Vec::new();
            for f in valid_fields {
                if !available.iter().any(|a| a == f.name()) {
                    available.push(f.name().to_string());
                }
            }
            let column = field.name().to_string();
            let suggestion = closest(&column, &available);
            QueryErrorKind::UnknownColumn {
                column,
                available,
                suggestion,
            }
        }
        SchemaError::AmbiguousReference { field } => QueryErrorKind::InvalidQuery {
            message: format!(
                "column `{}` is ambiguous: qualify it with its table name or alias",
                field.name()
            ),
        },
        SchemaError::DuplicateQualifiedField { name, .. }
        | SchemaError::DuplicateUnqualifiedField { name } => QueryErrorKind::InvalidQuery {
            message: format!(
                "column `{name}` appears twice in the result: give one of them an alias with AS"
            ),
        },
    }
}

/// Planning errors DataFusion reports only as text. The text is matched, never returned.
fn plan_error(msg: &str) -> QueryErrorKind {
    if let Some(name) = quoted_after(msg, "Invalid function '") {
        return QueryErrorKind::InvalidQuery {
            message: format!("unknown function `{name}`: use a built-in SQL function"),
        };
    }
    if let Some(name) = quoted_after(msg, "table '") {
        if msg.contains("not found") {
            return QueryErrorKind::UnknownTable { table: name };
        }
    }
    if msg.contains("DDL not supported")
        || msg.contains("DML not supported")
        || msg.contains("Statement not supported")
    {
        return QueryErrorKind::ForbiddenStatement {
            statement: "this statement".into(),
        };
    }
    let message = if msg.contains("GROUP BY")
        || msg.contains("non-aggregate")
        || msg.contains("aggregate")
    {
        "every selected column must appear in GROUP BY or inside an aggregate function \
         (count, sum, avg, min, max, …)"
    } else if msg.contains("oerc") || msg.contains("Cannot infer common") || msg.contains("type") {
        "type mismatch: compare and combine values of the same type (CAST where needed; \
         timestamps as TIMESTAMP '2025-01-31T12:00:00Z', intervals as INTERVAL '1 hour')"
    } else if msg.contains("argument") {
        "a function was called with the wrong number or types of arguments"
    } else {
        "the query cannot be planned as written: check function names, argument types, \
         GROUP BY and JOIN conditions"
    };
    QueryErrorKind::InvalidQuery {
        message: message.into(),
    }
}

/// The text between `prefix` and the next `'`.
fn quoted_after(msg: &str, prefix: &str) -> Option<String> {
    let start = msg.find(prefix)? + prefix.len();
    let end = msg[start..].find('\'')?;
    let name = &msg[start..start + end];
    (!name.is_empty() && name.len() <= 128).then(|| name.to_string())
}

/// The closest name by edit distance, if it is close enough to be a typo.
fn closest(name: &str, candidates: &[String]) -> Option<String> {
    let lower = name.to_lowercase();
    candidates
        .iter()
        .map(|c| (edit_distance(&lower, &c.to_lowercase()), c))
        .filter(|(d, c)| *d <= (c.len() / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c.clone())
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parser_messages_are_reworded() {
        let e = ParserError::ParserError(
            "Expected: an expression, found: FROM at Line: 1, Column: 8".into(),
        );
        let QueryErrorKind::SqlSyntax { message } = syntax(&e) else {
            panic!("not syntax")
        };
        assert!(
            message.starts_with(
                "SQL syntax error at line 1, column 8: expected an expression, found FROM"
            ),
            "{message}"
        );
        assert!(!message.contains("sql parser error"));
    }

    #[test]
    fn suggestions_catch_typos() {
        let cols = vec!["error_type".to_string(), "tool".to_string()];
        assert_eq!(closest("error_typ", &cols).as_deref(), Some("error_type"));
        assert_eq!(closest("nope", &cols), None);
    }

    #[test]
    fn envelopes_have_the_five_fields() {
        let e = QueryError::new(
            QueryErrorKind::UnknownTable { table: "x".into() },
            "detail /tmp/secret",
        );
        let v = e.envelope();
        let err = &v["error"];
        assert_eq!(err["code"], "unknown_table");
        assert_eq!(err["class"], "invalid_request");
        assert_eq!(err["retryable"], false);
        assert!(err["reference"]
            .as_str()
            .is_some_and(|r| r.starts_with("ts_")));
        let msg = err["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains("spans, calls, recoveries, failure_rates, answer_shapes")
                && !msg.contains("/tmp"),
            "{msg}"
        );
    }

    #[test]
    fn regex_compile_errors_are_the_callers_wherever_they_are_wrapped() {
        let too_big = DataFusionError::ArrowError(
            Box::new(ArrowError::ExternalError(Box::new(
                DataFusionError::External(
                    "Compiled regex exceeds size limit of 10485760 bytes.".into(),
                ),
            ))),
            None,
        );
        let QueryErrorKind::InvalidQuery { message } = classify(&too_big) else {
            panic!("not invalid_query: {:?}", classify(&too_big))
        };
        assert!(message.contains("too large"), "{message}");
        let syntax = DataFusionError::External(Box::new(std::io::Error::other(
            "regex parse error:\n    (a\n    ^\nerror: unclosed group",
        )));
        assert!(matches!(
            classify(&syntax),
            QueryErrorKind::InvalidQuery { .. }
        ));
    }

    #[test]
    fn function_names_are_extracted() {
        let k = plan_error("Invalid function 'lenn'.\nDid you mean 'length'?");
        assert_eq!(
            k,
            QueryErrorKind::InvalidQuery {
                message: "unknown function `lenn`: use a built-in SQL function".into()
            }
        );
    }
}
