//! Envelopes on the Postgres protocol: the message is the envelope's, the SQLSTATE comes from
//! [`toolspan_schema::Code::sqlstate`], and the detail carries code, class, retryable and
//! reference (psql prints it as `DETAIL:`).

use pgwire::error::{ErrorInfo, PgWireError};
use toolspan_schema::Code;

use toolspan_query::error::QueryError;

/// The error response for a query error.
pub fn to_pg(e: &QueryError) -> PgWireError {
    PgWireError::UserError(Box::new(info(e.code(), &e.message(), e.reference())))
}

/// An `ERROR` with the envelope's fields.
pub fn info(code: Code, message: &str, reference: &str) -> ErrorInfo {
    let mut info = ErrorInfo::new("ERROR".into(), code.sqlstate().into(), message.into());
    info.detail = Some(format!(
        "code: {}, class: {}, retryable: {}, reference: {}",
        code.as_str(),
        code.class().as_str(),
        code.retryable(),
        reference
    ));
    info
}
