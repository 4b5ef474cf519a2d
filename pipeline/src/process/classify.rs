//! Stage and error-type classification, in one room: every stored span gets a stage, and a
//! failed one an error type.
//!
//! - [`extract`] reads what one span says of itself: toolspan's own conventions, the
//!   OpenTelemetry GenAI conventions and OpenInference, through one table of attribute keys
//!   (which also decides which keys become columns);
//! - [`body`] recognises failures a tool reported inside its result body;
//! - [`tree`] classifies the spans of a request (and of the trace memory) together, bottom-up:
//!   children tell a failed call where it failed, attempts join their call;
//! - the rules (`rules.rs`) decide what the conventions leave open: a built-in rules file
//!   (`rules/default.toml`, compiled in) and an optional user rules file whose rules are tried
//!   first. Unknown shapes become `other`, never a failure.
//!
//! The vocabulary itself ([`Stage`], [`ErrorType`]) is the table contract's, in
//! `toolspan-schema`.

pub(crate) mod body;
pub(crate) mod extract;
mod rules;
pub(crate) mod tree;

pub use rules::{ErrorRule, ResultPlace, ResultRule, Rules, SpanView, StageRule};
pub use toolspan_schema::{ErrorType, Stage};
