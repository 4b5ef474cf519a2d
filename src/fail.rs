//! CLI errors: the same envelope as every API, printed on stderr; the detail goes
//! to the log under the reference.

use std::fmt::Display;
use std::process::ExitCode;

use toolspan_schema::{Code, Envelope, EnvelopeError};

/// A command's failure: an [`Envelope`], its reference logged once with the detail.
pub struct Failure {
    pub code: Code,
    pub message: String,
    pub reference: String,
}

impl Failure {
    /// A failure with a caller-safe message; `detail` is logged under the reference.
    pub fn new(code: Code, message: impl Into<String>, detail: impl Display) -> Failure {
        Envelope::new(code, message, detail).into()
    }

    /// An internal fault.
    pub fn internal(message: &str, detail: impl Display) -> Failure {
        Failure::new(Code::Internal, message, detail)
    }

    /// Any toolspan error, keeping its reference.
    pub fn from_error(e: &impl EnvelopeError) -> Failure {
        e.envelope().into()
    }
}

impl From<Envelope> for Failure {
    /// A command answers with this envelope: its detail goes to the log here, once.
    fn from(e: Envelope) -> Failure {
        e.log();
        Failure {
            code: e.code,
            message: e.message,
            reference: e.reference,
        }
    }
}

impl From<toolspan_query::QueryError> for Failure {
    fn from(e: toolspan_query::QueryError) -> Failure {
        Failure::from_error(&e)
    }
}

impl From<toolspan_store::StoreError> for Failure {
    fn from(e: toolspan_store::StoreError) -> Failure {
        Failure::from_error(&e)
    }
}

impl From<toolspan_pipeline::PipelineError> for Failure {
    fn from(e: toolspan_pipeline::PipelineError) -> Failure {
        Failure::from_error(&e)
    }
}

/// Prints the envelope (under `--log-format json` as one error event with `code`, `class`,
/// `retryable` and `reference` fields) and picks the exit code: 2 for a bad request, 1 otherwise.
pub fn report(f: &Failure) -> ExitCode {
    let retry = if f.code.retryable() {
        " (retryable)"
    } else {
        ""
    };
    if crate::status::json_logs() {
        tracing::error!(
            target: "toolspan::status",
            code = f.code.as_str(),
            class = f.code.class().as_str(),
            retryable = f.code.retryable(),
            reference = %f.reference,
            "{}",
            f.message
        );
    } else {
        eprintln!(
            "error[{}]: {}{retry}\n  class: {}, reference: {}",
            f.code.as_str(),
            f.message,
            f.code.class().as_str(),
            f.reference
        );
    }
    if f.code.class() == toolspan_schema::ErrorClass::InvalidRequest
        || f.code.class() == toolspan_schema::ErrorClass::Permission
    {
        ExitCode::from(2)
    } else {
        ExitCode::from(1)
    }
}
