//! The complexity guard: refuses statements whose expressions are too large to plan safely,
//! before anything builds a syntax tree from them.
//!
//! SQL parsers build `a OR b OR c …` as a left-deep tree without recursing, but everything
//! after parsing (planning, optimising, evaluating, even dropping the tree) walks it
//! recursively: a 10,000-term OR chain overflows a thread's stack. The guard works on the
//! token stream, which is flat, so it costs one linear pass and never recurses: it counts
//! the operators of the statement (each one adds a level to some expression tree) and the
//! deepest bracket nesting. Long lists of values belong in `IN (…)`, whose items are
//! separated by commas and are not counted.

use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};

use crate::error::{QueryError, QueryErrorKind};

/// Operators (AND, OR, NOT, comparisons, arithmetic, `||`) one statement may hold.
pub const MAX_OPERATORS: usize = 1_000;

/// Bracket nesting one statement may reach (the parser stops at 50 levels of expression
/// nesting on its own; this also covers brackets the parser handles iteratively).
pub const MAX_NESTING: usize = 64;

/// What the guard measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Complexity {
    /// Operators in the statement.
    pub operators: usize,
    /// Deepest bracket nesting.
    pub nesting: usize,
}

/// Measures `text`. Text that does not tokenize measures zero: the parser reports it.
pub fn measure(text: &str) -> Complexity {
    let dialect = GenericDialect {};
    let Ok(tokens) = Tokenizer::new(&dialect, text).tokenize() else {
        return Complexity::default();
    };
    let mut c = Complexity::default();
    let mut depth = 0usize;
    let mut prev: Option<&Token> = None;
    for t in tokens.iter().filter(|t| !matches!(t, Token::Whitespace(_))) {
        // `*` after `(`, `,`, `.` or SELECT is a wildcard (count(*), t.*), not a product.
        let wildcard = matches!(t, Token::Mul)
            && match prev {
                None | Some(Token::LParen | Token::Comma | Token::Period) => true,
                Some(Token::Word(w)) => w.keyword == Keyword::SELECT,
                _ => false,
            };
        prev = Some(t);
        if wildcard {
            continue;
        }
        match t {
            Token::LParen | Token::LBracket => {
                depth += 1;
                c.nesting = c.nesting.max(depth);
            }
            Token::RParen | Token::RBracket => depth = depth.saturating_sub(1),
            Token::Word(w) if matches!(w.keyword, Keyword::AND | Keyword::OR | Keyword::NOT) => {
                c.operators += 1
            }
            Token::Plus
            | Token::Minus
            | Token::Mul
            | Token::Div
            | Token::Mod
            | Token::StringConcat
            | Token::Eq
            | Token::DoubleEq
            | Token::Neq
            | Token::Lt
            | Token::Gt
            | Token::LtEq
            | Token::GtEq
            | Token::Spaceship
            | Token::Ampersand
            | Token::Pipe
            | Token::Caret
            | Token::ShiftLeft
            | Token::ShiftRight => c.operators += 1,
            _ => {}
        }
    }
    c
}

/// Refuses `text` when it holds more than [`MAX_OPERATORS`] operators or nests brackets
/// deeper than [`MAX_NESTING`].
pub fn check(text: &str) -> Result<(), QueryError> {
    let c = measure(text);
    if c.operators > MAX_OPERATORS {
        return Err(QueryError::new(
            QueryErrorKind::InvalidQuery {
                message: format!(
                    "the statement is too complex to run safely: it has {} operators (AND, OR, \
                     comparisons, arithmetic) and toolspan accepts at most {MAX_OPERATORS} in one \
                     statement; write lists of values as IN ('a', 'b', …), or split the query",
                    c.operators
                ),
            },
            format_args!("complexity guard: {} operators", c.operators),
        ));
    }
    if c.nesting > MAX_NESTING {
        return Err(QueryError::new(
            QueryErrorKind::InvalidQuery {
                message: format!(
                    "the statement is too complex to run safely: its brackets nest {} levels \
                     deep and toolspan accepts at most {MAX_NESTING}; flatten the expression",
                    c.nesting
                ),
            },
            format_args!("complexity guard: nesting {}", c.nesting),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_operators_not_list_items() {
        let c = measure("SELECT * FROM spans WHERE a = 1 AND (b = 2 OR c + 1 > 3)");
        assert_eq!(c.operators, 6);
        assert_eq!(measure("SELECT count(*), s.* FROM spans s").operators, 0);
        assert_eq!(measure("SELECT 2 * 3").operators, 1);
        assert_eq!(c.nesting, 1);
        let list = format!(
            "SELECT * FROM spans WHERE tool IN ({})",
            (0..5000)
                .map(|i| format!("'t{i}'"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        assert_eq!(measure(&list).operators, 0);
        assert!(check(&list).is_ok());
    }

    #[test]
    fn long_chains_are_refused_with_a_clear_message() {
        let or_chain = format!(
            "SELECT count(*) FROM spans WHERE {}",
            (0..10_000)
                .map(|i| format!("attempt = {i}"))
                .collect::<Vec<_>>()
                .join(" OR ")
        );
        let e = check(&or_chain).expect_err("refused");
        assert_eq!(e.code(), toolspan_schema::Code::InvalidQuery);
        assert!(e.message().contains("IN ("), "{}", e.message());
        let sum = format!("SELECT {}", vec!["1"; 5_000].join(" + "));
        assert!(check(&sum).is_err());
        let nested = format!("SELECT {}1{}", "(".repeat(100), ")".repeat(100));
        assert!(check(&nested).is_err());
    }

    #[test]
    fn strings_and_comments_do_not_count() {
        let c = measure("SELECT 'a OR b = c' -- x OR y\n FROM spans");
        assert_eq!(c.operators, 0);
    }
}
