//! Integration tests of the query engine: one binary, one module per concern.

mod answer_shapes;
mod common;
mod errors;
mod explore;
mod freshness;
mod http;
mod lookups;
mod memory;
mod older_table;
mod scan;
mod sql_corpus;
mod views;
