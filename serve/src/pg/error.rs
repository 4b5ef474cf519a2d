//! Envelopes on the Postgres protocol: the message is the envelope's, the SQLSTATE comes from
//! [`toolspan_schema::Code::sqlstate`], and the detail carries code, class, retryable and
//! reference (psql prints it as `DETAIL:`).

use pgwire::error::{ErrorInfo, PgWireError};
use toolspan_schema::{Envelope, EnvelopeError};

use toolspan_query::error::QueryError;

/// The error response for a query error; its detail goes to the log here, once.
pub fn to_pg(e: &QueryError) -> PgWireError {
    PgWireError::UserError(Box::new(info(&EnvelopeError::envelope(e))))
}

/// An `ERROR` with the envelope's fields; the envelope's detail goes to the log.
pub fn info(e: &Envelope) -> ErrorInfo {
    e.log();
    let (code, reference) = (e.code, &e.reference);
    let mut info = ErrorInfo::new("ERROR".into(), code.sqlstate().into(), e.message.clone());
    info.detail = Some(format!(
        "code: {}, class: {}, retryable: {}, reference: {}",
        code.as_str(),
        code.class().as_str(),
        code.retryable(),
        reference
    ));
    info
}
