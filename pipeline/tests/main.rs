//! Integration tests of the schema crate: one binary, one module per concern.

mod common;
mod golden;
mod malformed;
mod meaning;
mod secrets;
