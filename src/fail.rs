//! CLI errors: the same envelope as every API (DESIGN §6), printed on stderr; the detail goes
//! to the log under the reference.

use std::fmt::Display;
use std::process::ExitCode;

use toolspan_schema::error::new_reference;
use toolspan_schema::Code;

/// A command's failure.
pub struct Failure {
    pub code: Code,
    pub message: String,
    pub reference: String,
}

impl Failure {
    /// A failure with a caller-safe message; `detail` is logged only.
    pub fn new(code: Code, message: impl Into<String>, detail: impl Display) -> Failure {
        let reference = new_reference();
        tracing::debug!(reference, detail = %detail, "command failed");
        Failure { code, message: message.into(), reference }
    }

    /// An internal fault.
    pub fn internal(message: &str, detail: impl Display) -> Failure {
        let f = Failure::new(Code::Internal, message, "");
        tracing::error!(reference = f.reference, detail = %detail, "{message}");
        f
    }
}

impl From<toolspan_query::QueryError> for Failure {
    fn from(e: toolspan_query::QueryError) -> Failure {
        Failure { code: e.code(), message: e.message(), reference: e.reference().to_string() }
    }
}

impl From<toolspan_store::StoreError> for Failure {
    fn from(e: toolspan_store::StoreError) -> Failure {
        Failure { code: e.code(), message: e.to_string(), reference: e.reference().to_string() }
    }
}

impl From<toolspan_schema::SchemaError> for Failure {
    fn from(e: toolspan_schema::SchemaError) -> Failure {
        Failure::new(e.code(), e.to_string(), "")
    }
}

/// Prints the envelope and picks the exit code: 2 for a bad request, 1 otherwise.
pub fn report(f: &Failure) -> ExitCode {
    let retry = if f.code.retryable() { " (retryable)" } else { "" };
    eprintln!("error[{}]: {}{retry}\n  class: {}, reference: {}", f.code.as_str(), f.message, f.code.class().as_str(), f.reference);
    if f.code.class() == toolspan_schema::ErrorClass::InvalidRequest || f.code.class() == toolspan_schema::ErrorClass::Permission {
        ExitCode::from(2)
    } else {
        ExitCode::from(1)
    }
}
