//! Integration tests of the store: one binary, one module per concern.

mod common;
mod rollup;
mod table;
mod writer;
