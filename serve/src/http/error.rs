//! [`ApiError`]: every HTTP error as the envelope every toolspan API returns, with the status that
//! [`Code::http_status`] decides.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use toolspan_schema::{Code, Envelope, EnvelopeError};

use toolspan_query::error::QueryError;

/// An error of the HTTP API: the error envelope ([`Envelope`]) as an HTTP response.
#[derive(Debug, Clone)]
pub struct ApiError(Envelope);

impl ApiError {
    /// An error with a caller-safe `message`; `detail` goes to the log under a new reference.
    pub fn new(code: Code, message: impl Into<String>, detail: impl std::fmt::Display) -> ApiError {
        ApiError(Envelope::new(code, message, detail))
    }

    /// A bad parameter or body (`invalid_argument`, 400).
    pub fn invalid_argument(message: impl Into<String>) -> ApiError {
        let message = message.into();
        ApiError::new(Code::InvalidArgument, message.clone(), message)
    }

    /// Something asked for that does not exist (`not_found`, 404).
    pub fn not_found(message: impl Into<String>) -> ApiError {
        let message = message.into();
        ApiError::new(Code::NotFound, message.clone(), message)
    }

    /// The stable code.
    pub fn code(&self) -> Code {
        self.0.code
    }

    /// The HTTP status the code maps to.
    pub fn status(&self) -> u16 {
        self.0.http_status()
    }

    /// The envelope `{"error": {code, class, message, retryable, reference}}`.
    pub fn envelope(&self) -> serde_json::Value {
        self.0.to_json()
    }

    /// Writes the detail to the log: what a page that shows this error does when it answers
    /// ([`response`] does it for the API).
    pub fn log(&self) {
        self.0.log();
    }

    /// The response with `status` instead of the code's own (405 for a wrong method, 414
    /// for a long URI: HTTP's words for what the envelope calls `invalid_argument`).
    pub fn with_status(&self, status: StatusCode) -> Response {
        response(&self.0, status)
    }
}

impl From<QueryError> for ApiError {
    /// Keeps the query error's code, message, reference and detail.
    fn from(e: QueryError) -> ApiError {
        ApiError(EnvelopeError::envelope(&e))
    }
}

impl From<Envelope> for ApiError {
    fn from(e: Envelope) -> ApiError {
        ApiError(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.0.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        response(&self.0, status)
    }
}

/// The one way an envelope becomes an HTTP answer (every listener: the query API, the viewer,
/// the OTLP/HTTP receiver, the probes): the envelope as JSON with `status`,
/// `WWW-Authenticate` on `unauthorized`, and `Retry-After` as the code decides
/// ([`toolspan_schema::Code::retry_after_secs`]); its detail goes to the log here, once.
pub fn response(e: &Envelope, status: StatusCode) -> Response {
    e.log();
    let mut response = (status, axum::Json(e.to_json())).into_response();
    let headers = response.headers_mut();
    if e.code == Code::Unauthorized {
        headers.insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"toolspan\""),
        );
    }
    if let Some(s) = e.retry_after_secs() {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    response
}
