//! The TraceQL subset `GET /api/search?q=` answers, parsed into [`Query`] and turned into SQL
//! over `spans`.
//!
//! ```text
//! query     := spanset (("&&" | "||") spanset)*        && binds tighter than ||
//! spanset   := "{" [ expr ] "}"                        conditions on one span
//! expr      := and ("||" and)*
//! and       := term ("&&" term)*
//! term      := "(" expr ")" | field op value
//! field     := status | duration | name | kind
//!            | resource.service.name | resource.service.version
//!            | span.<attribute> | .<attribute>
//! op        := = | != | > | >= | < | <= | =~ | !~
//! value     := "string" | number | duration (250ms, 1.5s, 2m) | ok | error | unset
//!            | true | false | server | client | internal | producer | consumer
//! ```
//!
//! `{A} && {B}` matches traces with a span matching A and a span matching B; `{A} || {B}`
//! traces with either. Span attributes toolspan keeps in columns (`gen_ai.tool.name`,
//! `toolspan.stage`, `error.type`, `toolspan.error.code`, …, [`COLUMN_ATTRIBUTES`]) take every
//! operator; other span attributes only `=` and `!=` against a string, number or boolean.
//! Regular expressions are anchored at both ends, as in Tempo.

use std::fmt::Write as _;

use toolspan_query::sql::literal;

/// What the parser accepts, for error messages.
pub const SUPPORTED: &str = "toolspan answers a TraceQL subset: spansets `{ … }` joined by \
`&&` or `||`; inside them conditions joined by `&&`, `||` and parentheses; fields `status`, \
`duration`, `name`, `kind`, `resource.service.name`, `resource.service.version`, \
`span.<attribute>` or `.<attribute>`; operators = != > >= < <= =~ !~; values \"strings\", \
numbers, durations (250ms, 1.5s), ok/error/unset, true/false. Example: \
{ span.gen_ai.tool.name = \"search_docs\" && span.error.type = \"PARSE\" }";

/// Span attributes that live in their own column, by their OpenTelemetry / toolspan key.
pub const COLUMN_ATTRIBUTES: [(&str, &str, Kind); 17] = [
    ("gen_ai.tool.name", "tool", Kind::Text),
    ("tool.name", "tool", Kind::Text),
    ("toolspan.stage", "stage", Kind::Text),
    ("error.type", "error_type", Kind::Text),
    ("toolspan.error.type", "error_type", Kind::Text),
    ("toolspan.error.code", "error_code", Kind::Text),
    ("toolspan.error.class", "error_class", Kind::Text),
    ("toolspan.error.reference", "reference", Kind::Text),
    ("toolspan.error.retryable", "retryable", Kind::Bool),
    (
        "toolspan.error.retry_after_ms",
        "retry_after_ms",
        Kind::Number,
    ),
    ("toolspan.attempt", "attempt", Kind::Number),
    ("gen_ai.tool.call.id", "call_id", Kind::Text),
    ("gen_ai.agent.name", "agent", Kind::Text),
    ("gen_ai.request.model", "model", Kind::Text),
    ("http.response.status_code", "http_status", Kind::Number),
    ("toolspan.leaked_internals", "leaked_internals", Kind::Bool),
    ("service.name", "service", Kind::Text),
];

/// The type of a column an attribute maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Text.
    Text,
    /// A number.
    Number,
    /// A boolean.
    Bool,
}

/// A parse failure: what was wrong, at which character.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError(pub String);

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `=`
    Eq,
    /// `!=`
    Ne,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `=~`
    Re,
    /// `!~`
    NotRe,
}

impl Op {
    fn sql(self) -> &'static str {
        match self {
            Op::Eq => "=",
            Op::Ne => "<>",
            Op::Gt => ">",
            Op::Ge => ">=",
            Op::Lt => "<",
            Op::Le => "<=",
            Op::Re => "~",
            Op::NotRe => "!~",
        }
    }
}

/// A literal.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A quoted string.
    Str(String),
    /// A number.
    Num(f64),
    /// A duration, in milliseconds.
    DurationMs(f64),
    /// A bare word: `ok`, `error`, `unset`, `true`, `false`, a span kind.
    Word(String),
}

/// A field a condition compares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    /// `status`
    Status,
    /// `duration`
    Duration,
    /// `name`
    Name,
    /// `kind`
    Kind,
    /// `resource.<key>`
    Resource(String),
    /// `span.<key>` or `.<key>`
    Span(String),
}

impl Field {
    /// The attribute key a search answer reports this field's value under.
    pub fn label(&self) -> String {
        match self {
            Field::Status => "status".into(),
            Field::Duration => "duration".into(),
            Field::Name => "name".into(),
            Field::Kind => "kind".into(),
            Field::Resource(k) | Field::Span(k) => k.clone(),
        }
    }
}

/// Conditions inside one spanset.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// Matches every span (`{ }`).
    True,
    /// `field op value`.
    Cmp(Field, Op, Value),
    /// Both.
    And(Box<Expr>, Box<Expr>),
    /// Either.
    Or(Box<Expr>, Box<Expr>),
}

/// Spansets combined over a trace.
#[derive(Debug, Clone, PartialEq)]
pub enum Query {
    /// One spanset: its conditions.
    Spanset(Expr),
    /// The trace has spans matching both sides.
    And(Box<Query>, Box<Query>),
    /// The trace has spans matching either side.
    Or(Box<Query>, Box<Query>),
}

impl Query {
    /// The spansets, left to right.
    pub fn spansets(&self) -> Vec<&Expr> {
        let mut out = Vec::new();
        let mut stack = vec![self];
        while let Some(q) = stack.pop() {
            match q {
                Query::Spanset(e) => out.push(e),
                Query::And(a, b) | Query::Or(a, b) => {
                    stack.push(b);
                    stack.push(a);
                }
            }
        }
        out
    }

    /// Whether a trace matches, given which spansets (by [`Query::spansets`] index) it has
    /// matching spans for.
    pub fn matches(&self, has: &[bool]) -> bool {
        fn eval(q: &Query, has: &[bool], next: &mut usize) -> bool {
            match q {
                Query::Spanset(_) => {
                    let v = has.get(*next).copied().unwrap_or(false);
                    *next += 1;
                    v
                }
                Query::And(a, b) => {
                    let x = eval(a, has, next);
                    let y = eval(b, has, next);
                    x && y
                }
                Query::Or(a, b) => {
                    let x = eval(a, has, next);
                    let y = eval(b, has, next);
                    x || y
                }
            }
        }
        eval(self, has, &mut 0)
    }

    /// Every field compared anywhere, once each, in order of appearance.
    pub fn fields(&self) -> Vec<Field> {
        let mut out: Vec<Field> = Vec::new();
        for e in self.spansets() {
            let mut stack = vec![e];
            while let Some(e) = stack.pop() {
                match e {
                    Expr::True => {}
                    Expr::Cmp(f, _, _) => {
                        if !out.contains(f) {
                            out.push(f.clone());
                        }
                    }
                    Expr::And(a, b) | Expr::Or(a, b) => {
                        stack.push(b);
                        stack.push(a);
                    }
                }
            }
        }
        out
    }
}

/// The longest query text accepted.
pub const MAX_QUERY_CHARS: usize = 4096;
/// The most conditions in one query.
const MAX_CONDITIONS: usize = 64;
/// The most spansets in one query (each adds a level to the statement's spanset logic).
pub const MAX_SPANSETS: usize = 16;
/// The deepest parenthesis nesting.
const MAX_NESTING: usize = 16;

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    LBrace,
    RBrace,
    LParen,
    RParen,
    AndAnd,
    OrOr,
    Op(Op),
    Ident(String),
    Str(String),
    Num(f64),
    Dur(f64),
}

fn lex(text: &str) -> Result<Vec<(usize, Tok)>, ParseError> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let at = i;
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        let two: String = chars[i..chars.len().min(i + 2)].iter().collect();
        let tok = match two.as_str() {
            "&&" => Some(Tok::AndAnd),
            "||" => Some(Tok::OrOr),
            "!=" => Some(Tok::Op(Op::Ne)),
            ">=" => Some(Tok::Op(Op::Ge)),
            "<=" => Some(Tok::Op(Op::Le)),
            "=~" => Some(Tok::Op(Op::Re)),
            "!~" => Some(Tok::Op(Op::NotRe)),
            _ => None,
        };
        if let Some(t) = tok {
            out.push((at, t));
            i += 2;
            continue;
        }
        let tok = match c {
            '{' => Some(Tok::LBrace),
            '}' => Some(Tok::RBrace),
            '(' => Some(Tok::LParen),
            ')' => Some(Tok::RParen),
            '=' => Some(Tok::Op(Op::Eq)),
            '>' => Some(Tok::Op(Op::Gt)),
            '<' => Some(Tok::Op(Op::Lt)),
            _ => None,
        };
        if let Some(t) = tok {
            out.push((at, t));
            i += 1;
            continue;
        }
        if c == '"' || c == '`' {
            let quote = c;
            let mut s = String::new();
            i += 1;
            loop {
                let Some(&d) = chars.get(i) else {
                    return Err(ParseError(format!(
                        "the string starting at character {at} is not closed"
                    )));
                };
                i += 1;
                if d == quote {
                    break;
                }
                if d == '\\' && quote == '"' {
                    let Some(&e) = chars.get(i) else { continue };
                    i += 1;
                    s.push(match e {
                        'n' => '\n',
                        't' => '\t',
                        other => other,
                    });
                } else {
                    s.push(d);
                }
            }
            out.push((at, Tok::Str(s)));
            continue;
        }
        if c.is_ascii_digit() || (c == '-' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) {
            let start = i;
            i += 1;
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
            let num: String = chars[start..i].iter().collect();
            let unit_start = i;
            while i < chars.len() && chars[i].is_ascii_alphabetic() {
                i += 1;
            }
            let unit: String = chars[unit_start..i].iter().collect();
            let n: f64 = num
                .parse()
                .map_err(|_| ParseError(format!("{num:?} at character {start} is not a number")))?;
            let tok = match unit.as_str() {
                "" => Tok::Num(n),
                "ns" => Tok::Dur(n / 1e6),
                "us" | "µs" => Tok::Dur(n / 1e3),
                "ms" => Tok::Dur(n),
                "s" => Tok::Dur(n * 1e3),
                "m" => Tok::Dur(n * 60e3),
                "h" => Tok::Dur(n * 3600e3),
                other => {
                    return Err(ParseError(format!(
                        "unknown duration unit {other:?} at character {unit_start}: use ns, us, ms, s, m or h"
                    )))
                }
            };
            out.push((start, tok));
            continue;
        }
        if c.is_alphanumeric() || c == '.' || c == '_' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_alphanumeric() || matches!(chars[i], '.' | '_' | '-' | ':' | '/'))
            {
                i += 1;
            }
            out.push((start, Tok::Ident(chars[start..i].iter().collect())));
            continue;
        }
        return Err(ParseError(format!(
            "unexpected character {c:?} at character {at}"
        )));
    }
    Ok(out)
}

struct Parser {
    toks: Vec<(usize, Tok)>,
    pos: usize,
    conditions: usize,
    spansets: usize,
    depth: usize,
    end: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|(_, t)| t)
    }
    fn at(&self) -> usize {
        self.toks.get(self.pos).map_or(self.end, |(a, _)| *a)
    }
    fn next(&mut self) -> Option<Tok> {
        let t = self.toks.get(self.pos).map(|(_, t)| t.clone());
        self.pos += 1;
        t
    }
    fn expect(&mut self, want: Tok, what: &str) -> Result<(), ParseError> {
        let at = self.at();
        match self.next() {
            Some(t) if t == want => Ok(()),
            _ => Err(ParseError(format!("expected {what} at character {at}"))),
        }
    }

    fn query(&mut self) -> Result<Query, ParseError> {
        let mut left = self.query_and()?;
        while self.peek() == Some(&Tok::OrOr) {
            self.pos += 1;
            let right = self.query_and()?;
            left = Query::Or(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn query_and(&mut self) -> Result<Query, ParseError> {
        let mut left = self.spanset()?;
        while self.peek() == Some(&Tok::AndAnd) {
            self.pos += 1;
            let right = self.spanset()?;
            left = Query::And(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn spanset(&mut self) -> Result<Query, ParseError> {
        self.spansets += 1;
        if self.spansets > MAX_SPANSETS {
            return Err(ParseError(format!(
                "more than {MAX_SPANSETS} spansets `{{ … }}`: combine conditions inside one \
                 spanset with && and ||"
            )));
        }
        self.expect(Tok::LBrace, "`{` opening a spanset")?;
        if self.peek() == Some(&Tok::RBrace) {
            self.pos += 1;
            return Ok(Query::Spanset(Expr::True));
        }
        let e = self.expr()?;
        self.expect(Tok::RBrace, "`}` closing the spanset")?;
        Ok(Query::Spanset(e))
    }

    fn expr(&mut self) -> Result<Expr, ParseError> {
        let mut left = self.and()?;
        while self.peek() == Some(&Tok::OrOr) {
            self.pos += 1;
            let right = self.and()?;
            left = Expr::Or(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr, ParseError> {
        let mut left = self.term()?;
        while self.peek() == Some(&Tok::AndAnd) {
            self.pos += 1;
            let right = self.term()?;
            left = Expr::And(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn term(&mut self) -> Result<Expr, ParseError> {
        if self.peek() == Some(&Tok::LParen) {
            self.pos += 1;
            self.depth += 1;
            if self.depth > MAX_NESTING {
                return Err(ParseError(format!(
                    "parentheses nest deeper than {MAX_NESTING} levels"
                )));
            }
            let e = self.expr()?;
            self.depth -= 1;
            self.expect(Tok::RParen, "`)`")?;
            return Ok(e);
        }
        self.conditions += 1;
        if self.conditions > MAX_CONDITIONS {
            return Err(ParseError(format!("more than {MAX_CONDITIONS} conditions")));
        }
        let at = self.at();
        let field = match self.next() {
            Some(Tok::Ident(name)) => field(&name, at)?,
            _ => {
                return Err(ParseError(format!(
                    "expected a field (status, duration, name, kind, resource.…, span.…) at character {at}"
                )))
            }
        };
        let at = self.at();
        let op = match self.next() {
            Some(Tok::Op(op)) => op,
            _ => {
                return Err(ParseError(format!(
                    "expected an operator (= != > >= < <= =~ !~) at character {at}"
                )))
            }
        };
        let at = self.at();
        let value = match self.next() {
            Some(Tok::Str(s)) => Value::Str(s),
            Some(Tok::Num(n)) => Value::Num(n),
            Some(Tok::Dur(d)) => Value::DurationMs(d),
            Some(Tok::Ident(w)) => Value::Word(w),
            _ => return Err(ParseError(format!("expected a value at character {at}"))),
        };
        Ok(Expr::Cmp(field, op, value))
    }
}

/// A field name (`status`, `span.gen_ai.tool.name`, `.service.name`, …); `at` places errors.
pub fn field(name: &str, at: usize) -> Result<Field, ParseError> {
    let f = match name {
        "status" | ".status" => Field::Status,
        "duration" => Field::Duration,
        "name" => Field::Name,
        "kind" => Field::Kind,
        _ => {
            if let Some(k) = name.strip_prefix("resource.") {
                Field::Resource(k.to_string())
            } else if let Some(k) = name.strip_prefix("span.") {
                Field::Span(k.to_string())
            } else if let Some(k) = name.strip_prefix('.') {
                if k == "service.name" {
                    Field::Resource(k.to_string())
                } else {
                    Field::Span(k.to_string())
                }
            } else {
                return Err(ParseError(format!(
                    "unsupported field {name:?} at character {at}: use status, duration, name, \
                     kind, resource.service.name, span.<attribute> or .<attribute>"
                )));
            }
        }
    };
    if let Field::Resource(k) | Field::Span(k) = &f {
        if k.is_empty() {
            return Err(ParseError(format!(
                "an attribute name is missing at character {at}"
            )));
        }
    }
    Ok(f)
}

/// Parses a query. An empty text is `{ }` (every trace).
pub fn parse(text: &str) -> Result<Query, ParseError> {
    if text.chars().count() > MAX_QUERY_CHARS {
        return Err(ParseError(format!(
            "the query is longer than {MAX_QUERY_CHARS} characters"
        )));
    }
    if text.trim().is_empty() {
        return Ok(Query::Spanset(Expr::True));
    }
    let toks = lex(text)?;
    let mut p = Parser {
        toks,
        pos: 0,
        conditions: 0,
        spansets: 0,
        depth: 0,
        end: text.chars().count(),
    };
    let q = p.query()?;
    if p.pos < p.toks.len() {
        let at = p.at();
        let hint = if p.peek() == Some(&Tok::Ident("|".into())) || text[..].contains('|') {
            " (pipelines, aggregates and `>>`/`~` structural operators are not supported)"
        } else {
            ""
        };
        return Err(ParseError(format!(
            "unexpected text at character {at}{hint}"
        )));
    }
    Ok(q)
}

/// The SQL condition one spanset's conditions make over a `spans` row.
pub fn expr_sql(e: &Expr) -> Result<String, ParseError> {
    match e {
        Expr::True => Ok("TRUE".into()),
        Expr::And(a, b) => Ok(format!("({} AND {})", expr_sql(a)?, expr_sql(b)?)),
        Expr::Or(a, b) => Ok(format!("({} OR {})", expr_sql(a)?, expr_sql(b)?)),
        Expr::Cmp(f, op, v) => cmp_sql(f, *op, v),
    }
}

fn word(v: &Value) -> Option<&str> {
    match v {
        Value::Word(w) | Value::Str(w) => Some(w.as_str()),
        _ => None,
    }
}

fn cmp_sql(f: &Field, op: Op, v: &Value) -> Result<String, ParseError> {
    match f {
        Field::Status => {
            let w = word(v)
                .map(str::to_ascii_lowercase)
                .filter(|w| matches!(w.as_str(), "ok" | "error" | "unset"))
                .ok_or_else(|| ParseError("status compares with ok, error or unset".into()))?;
            if !matches!(op, Op::Eq | Op::Ne) {
                return Err(ParseError("status takes = or !=".into()));
            }
            Ok(format!("status {} '{w}'", op.sql()))
        }
        Field::Kind => {
            let w = word(v)
                .map(str::to_ascii_lowercase)
                .filter(|w| {
                    matches!(
                        w.as_str(),
                        "unspecified" | "internal" | "server" | "client" | "producer" | "consumer"
                    )
                })
                .ok_or_else(|| {
                    ParseError(
                        "kind compares with server, client, internal, producer, consumer or unspecified"
                            .into(),
                    )
                })?;
            if !matches!(op, Op::Eq | Op::Ne) {
                return Err(ParseError("kind takes = or !=".into()));
            }
            Ok(format!("kind {} '{w}'", op.sql()))
        }
        Field::Duration => {
            let ms = match v {
                Value::DurationMs(ms) => *ms,
                Value::Num(n) if *n == 0.0 => 0.0,
                _ => {
                    return Err(ParseError(
                        "duration compares with a duration such as 250ms, 1.5s or 2m".into(),
                    ))
                }
            };
            if matches!(op, Op::Re | Op::NotRe) {
                return Err(ParseError("duration takes = != > >= < <=".into()));
            }
            Ok(format!("duration_ms {} {}", op.sql(), number(ms)))
        }
        Field::Name => column_cmp("name", Kind::Text, op, v),
        Field::Resource(k) => match k.as_str() {
            "service.name" => column_cmp("service", Kind::Text, op, v),
            "service.version" => column_cmp("service_version", Kind::Text, op, v),
            _ => json_cmp("resource_attributes", k, op, v),
        },
        Field::Span(k) => match COLUMN_ATTRIBUTES.iter().find(|(key, _, _)| key == k) {
            Some((_, column, kind)) => column_cmp(column, *kind, op, v),
            None => json_cmp("attributes", k, op, v),
        },
    }
}

fn number(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        format!("{n}")
    }
}

fn column_cmp(column: &str, kind: Kind, op: Op, v: &Value) -> Result<String, ParseError> {
    match kind {
        Kind::Text => {
            let s = match v {
                Value::Str(s) | Value::Word(s) => s.clone(),
                Value::Num(n) => number(*n),
                Value::DurationMs(_) => {
                    return Err(ParseError(format!(
                        "{column} is text: compare it with a \"string\""
                    )))
                }
            };
            match op {
                Op::Re | Op::NotRe => Ok(format!(
                    "coalesce({column}, '') {} {}",
                    op.sql(),
                    literal(&format!("^(?:{s})$"))
                )),
                // A missing value is not equal to anything, and unequal to everything.
                Op::Ne => Ok(format!("coalesce({column} <> {}, TRUE)", literal(&s))),
                _ => Ok(format!("{column} {} {}", op.sql(), literal(&s))),
            }
        }
        Kind::Number => {
            let n = match v {
                Value::Num(n) => *n,
                Value::Str(s) => s.trim().parse().map_err(|_| {
                    ParseError(format!("{column} is a number: compare it with a number"))
                })?,
                _ => {
                    return Err(ParseError(format!(
                        "{column} is a number: compare it with a number"
                    )))
                }
            };
            if matches!(op, Op::Re | Op::NotRe) {
                return Err(ParseError(format!(
                    "{column} is a number: use = != > >= < <="
                )));
            }
            Ok(format!("{column} {} {}", op.sql(), number(n)))
        }
        Kind::Bool => {
            let b = word(v)
                .map(str::to_ascii_lowercase)
                .filter(|w| w == "true" || w == "false")
                .ok_or_else(|| ParseError(format!("{column} compares with true or false")))?;
            if !matches!(op, Op::Eq | Op::Ne) {
                return Err(ParseError(format!("{column} takes = or !=")));
            }
            Ok(format!("{column} {} {b}", op.sql()))
        }
    }
}

/// An attribute without a column of its own: equality against its value inside the JSON
/// text (`"key":value` followed by `,` or `}`, exactly as ingest writes it).
fn json_cmp(column: &str, key: &str, op: Op, v: &Value) -> Result<String, ParseError> {
    if !matches!(op, Op::Eq | Op::Ne) {
        return Err(ParseError(format!(
            "attribute {key:?} has no column of its own: toolspan compares it with = and != only \
             (columns with every operator: {})",
            COLUMN_ATTRIBUTES
                .iter()
                .map(|(k, _, _)| *k)
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let mut pair = String::new();
    json_str(&mut pair, key);
    pair.push(':');
    match v {
        Value::Str(s) => json_str(&mut pair, s),
        Value::Num(n) => pair.push_str(&number(*n)),
        Value::Word(w) if w == "true" || w == "false" => pair.push_str(w),
        _ => {
            return Err(ParseError(format!(
                "attribute {key:?} compares with a \"string\", a number, true or false"
            )))
        }
    }
    let found = format!(
        "(strpos(coalesce({column}, ''), {a}) > 0 OR strpos(coalesce({column}, ''), {b}) > 0)",
        a = literal(&format!("{pair},")),
        b = literal(&format!("{pair}}}")),
    );
    Ok(if op == Op::Eq {
        found
    } else {
        format!("NOT {found}")
    })
}

/// Appends `s` as a JSON string literal (the escaping ingest uses).
fn json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests;
