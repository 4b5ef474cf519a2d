//! Integration tests of the query HTTP API through its router: one binary, one module per
//! concern. The span fixtures and the SQL corpus are the engine's own (`query/tests/main`),
//! compiled here with `#[path]`, so both front ends are held to the same data and statements.

#[path = "../../../query/tests/main/common.rs"]
mod common;
#[path = "../../../query/tests/main/sql_corpus.rs"]
mod sql_corpus;

mod http;
mod lookups;
mod memory;
