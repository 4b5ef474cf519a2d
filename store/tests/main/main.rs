//! Integration tests of the store: one binary, one module per concern.

mod common;
mod maintenance;
mod rollup;
mod table;
mod writer;
