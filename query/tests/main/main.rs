//! Integration tests of the query engine: one binary, one module per concern. The HTTP API's
//! tests, which drive the engine through its router, are `serve/tests/main`.

mod answer_shapes;
mod common;
mod errors;
mod explore;
mod freshness;
mod older_table;
mod scan;
mod sql_corpus;
mod views;
