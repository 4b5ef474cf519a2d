//! [`ApiError`]: every HTTP error as the envelope of DESIGN §6, with the status that
//! [`Code::http_status`] decides.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use toolspan_schema::error::new_reference;
use toolspan_schema::Code;

use crate::error::QueryError;

/// An error of the HTTP API: a stable code, a caller-safe message and a reference.
#[derive(Debug, Clone)]
pub struct ApiError {
    code: Code,
    message: String,
    reference: String,
}

impl ApiError {
    /// An error with a caller-safe `message`; `detail` goes to the log under a new reference.
    pub fn new(code: Code, message: impl Into<String>, detail: impl std::fmt::Display) -> ApiError {
        let reference = new_reference();
        let message = message.into();
        tracing::warn!(reference = %reference, code = %code, detail = %detail, "request failed: {message}");
        ApiError {
            code,
            message,
            reference,
        }
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
        self.code
    }

    /// The envelope `{"error": {code, class, message, retryable, reference}}`.
    pub fn envelope(&self) -> serde_json::Value {
        json!({
            "error": {
                "code": self.code.as_str(),
                "class": self.code.class().as_str(),
                "message": self.message,
                "retryable": self.code.retryable(),
                "reference": self.reference,
            }
        })
    }
}

impl From<QueryError> for ApiError {
    /// Keeps the query error's code, message and reference (its detail is logged already).
    fn from(e: QueryError) -> ApiError {
        ApiError {
            code: e.code(),
            message: e.message(),
            reference: e.reference().to_string(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.code.http_status())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (status, axum::Json(self.envelope())).into_response();
        let headers = response.headers_mut();
        if self.code == Code::Unauthorized {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"toolspan\""),
            );
        }
        if self.code.retryable() {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}
