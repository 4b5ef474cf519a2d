//! Integration tests of the store: one binary, one module per concern.

mod common;
mod table;
mod writer;
