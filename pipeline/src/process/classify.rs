//! Stage and error-type classification: every stored span gets a stage, and a failed one an
//! error type.
//!
//! toolspan's own conventions, the OpenTelemetry GenAI conventions and OpenInference decide
//! most spans directly (see [`crate::process`]). What they leave open is decided by rules:
//! a built-in rules file (`rules/default.toml`, compiled in) and an optional user rules file
//! whose rules are tried first. Unknown shapes become `other`, never a failure. The
//! vocabulary itself ([`Stage`], [`ErrorType`]) is the table contract's, in `toolspan-schema`.

mod rules;

pub use rules::{ErrorRule, ResultPlace, ResultRule, Rules, SpanView, StageRule};
pub use toolspan_schema::{ErrorType, Stage};
