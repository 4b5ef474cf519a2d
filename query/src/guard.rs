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
//!
//! Expressions are not the only thing that grows a plan: every `SELECT` of a
//! `UNION ALL` chain, every table a statement joins and every reference to a CTE or view
//! adds plan nodes, and planning and optimising walk those recursively and repeatedly
//! (4,000 `UNION ALL` branches overflowed a 16 MiB stack; a 200-way self-join took 48 s
//! to plan). So the guard also counts query blocks in the token stream ([`MAX_QUERY_BLOCKS`])
//! and, once the statement has parsed, the relations the plan will hold after CTEs and
//! views are expanded ([`check_relations`], [`MAX_RELATIONS`]): a CTE referenced twice
//! counts twice, with everything it reads, so chains of CTEs that each read the previous
//! one twice (an exponential plan from a linear text) are refused before planning.

use std::ops::ControlFlow;

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::logical_expr::LogicalPlan;
use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{ObjectName, Query, Visit, Visitor};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};

use crate::error::{QueryError, QueryErrorKind};

/// Operators (AND, OR, NOT, comparisons, arithmetic, `||`) one statement may hold.
pub const MAX_OPERATORS: usize = 1_000;

/// Bracket nesting one statement may reach (the parser stops at 50 levels of expression
/// nesting on its own; this also covers brackets the parser handles iteratively).
pub const MAX_NESTING: usize = 64;

/// Query blocks (`SELECT` keywords: set-operation branches, subqueries, CTE bodies) one
/// statement may hold.
pub const MAX_QUERY_BLOCKS: usize = 128;

/// Relations (tables, views, table functions) one statement's plan may read, counted after
/// CTE references are expanded and with each view weighted by the relations of its definition.
pub const MAX_RELATIONS: usize = 32;

/// Nodes one statement's logical plan may hold (a last check after planning: the token and
/// relation counts keep real statements far below it).
pub const MAX_PLAN_NODES: usize = 5_000;

/// What the guard measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Complexity {
    /// Operators in the statement.
    pub operators: usize,
    /// Deepest bracket nesting.
    pub nesting: usize,
    /// `SELECT` keywords in the statement.
    pub query_blocks: usize,
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
            Token::Word(w) if w.keyword == Keyword::SELECT => c.query_blocks += 1,
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

/// Refuses `text` when it holds more than [`MAX_OPERATORS`] operators, nests brackets
/// deeper than [`MAX_NESTING`] or holds more than [`MAX_QUERY_BLOCKS`] query blocks.
pub fn check(text: &str) -> Result<(), QueryError> {
    let c = measure(text);
    if c.query_blocks > MAX_QUERY_BLOCKS {
        return Err(QueryError::new(
            QueryErrorKind::InvalidQuery {
                message: format!(
                    "the statement is too complex to run safely: it has {} SELECT blocks \
                     (UNION branches, subqueries, CTEs) and toolspan accepts at most \
                     {MAX_QUERY_BLOCKS} in one statement; use VALUES (…), (…) for lists of \
                     rows, or split the query",
                    c.query_blocks
                ),
            },
            format_args!("complexity guard: {} query blocks", c.query_blocks),
        ));
    }
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

/// The relations each view reads (its definition's `FROM` and `JOIN` items), so that a
/// reference to a view counts as what it expands to.
fn view_weight(name: &str) -> usize {
    match name {
        "calls" => {
            crate::views::CALLS_SQL.matches("FROM spans").count()
                + crate::views::CALLS_SQL.matches("JOIN spans").count()
        }
        "recoveries" => {
            view_weight("calls") + crate::views::RECOVERIES_SQL.matches("FROM spans").count()
        }
        "answer_shapes" => crate::views::ANSWER_SHAPES_SQL
            .matches("FROM spans")
            .count(),
        _ => 1,
    }
}

/// Counts relations per query, with CTE names in scope (see [`check_relations`]).
#[derive(Default)]
struct RelationCounter {
    frames: Vec<Frame>,
    total: usize,
}

/// One query being visited: its CTEs (in order, with the weight of each once its body has
/// been visited) and the relations its body read so far.
struct Frame {
    ctes: Vec<String>,
    weights: Vec<usize>,
    relations: usize,
}

impl RelationCounter {
    fn weight(&self, name: &ObjectName) -> usize {
        if name.0.len() == 1 {
            if let Some(ident) = name.0[0].as_ident() {
                let n = ident.value.to_ascii_lowercase();
                for f in self.frames.iter().rev() {
                    // A CTE is in scope once its own body has been visited (a recursive CTE's
                    // reference to itself counts as one relation).
                    if let Some(i) = f.ctes[..f.weights.len()].iter().position(|c| *c == n) {
                        return f.weights[i].max(1);
                    }
                }
                return view_weight(&n);
            }
        }
        1
    }
}

impl Visitor for RelationCounter {
    type Break = ();

    fn pre_visit_query(&mut self, q: &Query) -> ControlFlow<()> {
        let ctes = q
            .with
            .as_ref()
            .map(|w| {
                w.cte_tables
                    .iter()
                    .map(|c| c.alias.name.value.to_ascii_lowercase())
                    .collect()
            })
            .unwrap_or_default();
        self.frames.push(Frame {
            ctes,
            weights: Vec::new(),
            relations: 0,
        });
        ControlFlow::Continue(())
    }

    fn post_visit_query(&mut self, _q: &Query) -> ControlFlow<()> {
        let Some(done) = self.frames.pop() else {
            return ControlFlow::Continue(());
        };
        match self.frames.last_mut() {
            // The CTE bodies of a query are the first queries visited inside it, in order.
            Some(parent) if parent.weights.len() < parent.ctes.len() => {
                parent.weights.push(done.relations)
            }
            Some(parent) => parent.relations = parent.relations.saturating_add(done.relations),
            None => self.total = self.total.saturating_add(done.relations),
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_relation(&mut self, name: &ObjectName) -> ControlFlow<()> {
        let w = self.weight(name);
        match self.frames.last_mut() {
            Some(f) => f.relations = f.relations.saturating_add(w),
            None => self.total = self.total.saturating_add(w),
        }
        ControlFlow::Continue(())
    }
}

/// The relations a parsed statement's plan will read: tables, views (weighted by what they
/// read) and table functions, with every CTE reference expanded to what the CTE reads.
pub fn relations(statement: &DfStatement) -> usize {
    let DfStatement::Statement(s) = statement else {
        return 0;
    };
    let mut counter = RelationCounter::default();
    let _ = s.visit(&mut counter);
    counter.total
}

/// Refuses a parsed statement whose plan would read more than [`MAX_RELATIONS`] relations
/// (see [`relations`]). Call it after [`check`], which bounds how deep the syntax tree is.
pub fn check_relations(statement: &DfStatement) -> Result<(), QueryError> {
    let n = relations(statement);
    if n > MAX_RELATIONS {
        return Err(QueryError::new(
            QueryErrorKind::InvalidQuery {
                message: format!(
                    "the statement is too complex to run safely: with its CTEs and views \
                     expanded it reads {n} tables and toolspan accepts at most {MAX_RELATIONS} \
                     in one statement (the calls view counts as {}); join fewer tables, or \
                     split the query",
                    view_weight("calls")
                ),
            },
            format_args!("complexity guard: {n} relations"),
        ));
    }
    Ok(())
}

/// Refuses a plan of more than [`MAX_PLAN_NODES`] nodes (subqueries included).
pub fn check_plan(plan: &LogicalPlan) -> Result<(), QueryError> {
    let mut nodes = 0usize;
    let _ = plan.apply_with_subqueries(|_| {
        nodes += 1;
        Ok(if nodes > MAX_PLAN_NODES {
            TreeNodeRecursion::Stop
        } else {
            TreeNodeRecursion::Continue
        })
    });
    if nodes > MAX_PLAN_NODES {
        return Err(QueryError::new(
            QueryErrorKind::InvalidQuery {
                message: format!(
                    "the statement is too complex to run safely: its plan has more than \
                     {MAX_PLAN_NODES} operators; split the query"
                ),
            },
            format_args!("complexity guard: more than {MAX_PLAN_NODES} plan nodes"),
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

    fn parse(sql: &str) -> DfStatement {
        datafusion::sql::parser::DFParser::parse_sql(sql)
            .expect("parses")
            .pop_front()
            .expect("one statement")
    }

    #[test]
    fn union_chains_are_refused_before_parsing() {
        let chain = vec!["SELECT 1"; 4_000].join(" UNION ALL ");
        let e = check(&chain).expect_err("refused");
        assert!(e.message().contains("SELECT blocks"), "{}", e.message());
        assert!(check(&vec!["SELECT 1"; 100].join(" UNION ALL ")).is_ok());
    }

    #[test]
    fn relations_count_expanded_ctes_and_views() {
        assert_eq!(relations(&parse("SELECT * FROM spans")), 1);
        assert_eq!(
            relations(&parse(
                "SELECT * FROM spans a JOIN spans b ON a.trace_id = b.trace_id"
            )),
            2
        );
        assert_eq!(
            relations(&parse("SELECT * FROM calls")),
            view_weight("calls")
        );
        assert!(view_weight("calls") >= 3);
        // b reads a twice, c reads b twice: 4 scans of spans.
        let doubling =
            "WITH a AS (SELECT * FROM spans), b AS (SELECT * FROM a x JOIN a y ON true), \
                        c AS (SELECT * FROM b x JOIN b y ON true) SELECT * FROM c";
        assert_eq!(relations(&parse(doubling)), 4);
        // A subquery in WHERE counts, and a nested WITH scopes its own names.
        let nested =
            "SELECT * FROM spans WHERE trace_id IN (WITH t AS (SELECT trace_id FROM spans) \
                      SELECT trace_id FROM t JOIN t u USING (trace_id))";
        assert_eq!(relations(&parse(nested)), 3);
        // Twenty CTEs that each read the previous one twice: 2^20 scans from 1 KB of text.
        let mut sql = String::from("WITH c0 AS (SELECT * FROM spans)");
        for i in 1..20 {
            sql.push_str(&format!(
                ", c{i} AS (SELECT * FROM c{p} x JOIN c{p} y ON true)",
                p = i - 1
            ));
        }
        sql.push_str(" SELECT count(*) FROM c19");
        assert!(check(&sql).is_ok(), "few enough blocks");
        let e = check_relations(&parse(&sql)).expect_err("refused");
        assert!(e.message().contains("tables"), "{}", e.message());
        let joins = (0..40)
            .map(|i| format!("spans s{i}"))
            .collect::<Vec<_>>()
            .join(", ");
        assert!(check_relations(&parse(&format!("SELECT count(*) FROM {joins}"))).is_err());
    }
}
