//! Stable error codes shared by every toolspan crate.
//!
//! toolspan practises what it stores: every error that reaches a caller is an
//! envelope with a stable `code`, a `class`, a `retryable` hint and a `reference`. The codes
//! live here, in the leaf crate, so that each crate's `thiserror` enum maps onto one small
//! shared set and one function per protocol decides the HTTP status or SQLSTATE.

use std::fmt;

/// Error classes, the same vocabulary toolspan asks tools to use in their
/// envelopes (`toolspan.error.class`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// The caller sent something that can never succeed as sent.
    InvalidRequest,
    /// Try again later; nothing is wrong with the request.
    Transient,
    /// The caller may not do this.
    Permission,
    /// The thing asked for does not exist.
    NotFound,
    /// The request conflicts with the current state.
    Conflict,
    /// A fault inside toolspan; details are in its log under the reference.
    Internal,
}

impl ErrorClass {
    /// The snake_case name used in envelopes.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::InvalidRequest => "invalid_request",
            ErrorClass::Transient => "transient",
            ErrorClass::Permission => "permission",
            ErrorClass::NotFound => "not_found",
            ErrorClass::Conflict => "conflict",
            ErrorClass::Internal => "internal",
        }
    }
}

/// A stable error code. The string form is part of toolspan's public interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    /// The body is not a decodable OTLP protobuf message.
    OtlpDecode,
    /// The body is not valid OTLP/JSON.
    OtlpJson,
    /// The payload decoded but breaks a limit (too many spans, attributes, nesting).
    OtlpLimit,
    /// A classification rules file or a redaction pattern is invalid.
    InvalidConfig,
    /// A request body exceeds the size limit.
    PayloadTooLarge,
    /// The content type is not one toolspan accepts.
    UnsupportedMediaType,
    /// The writer is backed up; retry after the hinted delay.
    Overloaded,
    /// The store could not be read or written.
    StoreUnavailable,
    /// The SQL text does not parse.
    SqlSyntax,
    /// The SQL names a column that does not exist.
    UnknownColumn,
    /// The SQL names a table that does not exist.
    UnknownTable,
    /// The statement is not allowed (toolspan is read-only).
    ForbiddenStatement,
    /// The SQL is valid but cannot be planned or run as written.
    InvalidQuery,
    /// The query ran past its time limit.
    QueryTimeout,
    /// The query ran past its memory or size limit.
    ResourcesExhausted,
    /// The thing asked for does not exist.
    NotFound,
    /// Missing or wrong credentials.
    Unauthorized,
    /// A bad argument to an API or the CLI.
    InvalidArgument,
    /// A fault inside toolspan.
    Internal,
}

impl Code {
    /// The stable snake_case string of the code.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::OtlpDecode => "otlp_decode",
            Code::OtlpJson => "otlp_json",
            Code::OtlpLimit => "otlp_limit",
            Code::InvalidConfig => "invalid_config",
            Code::PayloadTooLarge => "payload_too_large",
            Code::UnsupportedMediaType => "unsupported_media_type",
            Code::Overloaded => "overloaded",
            Code::StoreUnavailable => "store_unavailable",
            Code::SqlSyntax => "sql_syntax",
            Code::UnknownColumn => "unknown_column",
            Code::UnknownTable => "unknown_table",
            Code::ForbiddenStatement => "forbidden_statement",
            Code::InvalidQuery => "invalid_query",
            Code::QueryTimeout => "query_timeout",
            Code::ResourcesExhausted => "resources_exhausted",
            Code::NotFound => "not_found",
            Code::Unauthorized => "unauthorized",
            Code::InvalidArgument => "invalid_argument",
            Code::Internal => "internal",
        }
    }

    /// The class of the code.
    pub fn class(self) -> ErrorClass {
        match self {
            Code::OtlpDecode
            | Code::OtlpJson
            | Code::OtlpLimit
            | Code::InvalidConfig
            | Code::PayloadTooLarge
            | Code::UnsupportedMediaType
            | Code::SqlSyntax
            | Code::UnknownColumn
            | Code::UnknownTable
            | Code::InvalidQuery
            | Code::InvalidArgument => ErrorClass::InvalidRequest,
            Code::ForbiddenStatement | Code::Unauthorized => ErrorClass::Permission,
            Code::Overloaded | Code::StoreUnavailable | Code::QueryTimeout => ErrorClass::Transient,
            Code::ResourcesExhausted => ErrorClass::Transient,
            Code::NotFound => ErrorClass::NotFound,
            Code::Internal => ErrorClass::Internal,
        }
    }

    /// Whether retrying the same request may succeed. Defaults to no.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            Code::Overloaded
                | Code::StoreUnavailable
                | Code::QueryTimeout
                | Code::ResourcesExhausted
        )
    }

    /// The `Retry-After` hint, in seconds, for a retryable code: the one place that decides
    /// it. A backed-up writer or a busy query service clears quickly, an unavailable store
    /// takes longer.
    pub fn retry_after_secs(self) -> Option<u64> {
        match self {
            Code::StoreUnavailable => Some(5),
            c if c.retryable() => Some(1),
            _ => None,
        }
    }

    /// The HTTP status for this code: the one place that decides it.
    pub fn http_status(self) -> u16 {
        match self {
            Code::OtlpDecode | Code::OtlpJson | Code::OtlpLimit | Code::InvalidArgument => 400,
            Code::SqlSyntax | Code::UnknownColumn | Code::UnknownTable | Code::InvalidQuery => 400,
            Code::InvalidConfig => 400,
            Code::PayloadTooLarge => 413,
            Code::UnsupportedMediaType => 415,
            Code::Overloaded => 429,
            Code::StoreUnavailable => 503,
            Code::ForbiddenStatement => 403,
            Code::Unauthorized => 401,
            Code::QueryTimeout => 504,
            Code::ResourcesExhausted => 422,
            Code::NotFound => 404,
            Code::Internal => 500,
        }
    }

    /// The PostgreSQL SQLSTATE for this code: the one place that decides it.
    pub fn sqlstate(self) -> &'static str {
        match self {
            Code::SqlSyntax => "42601",
            Code::UnknownColumn => "42703",
            Code::UnknownTable => "42P01",
            Code::ForbiddenStatement => "42501",
            Code::InvalidQuery | Code::InvalidArgument => "42000",
            Code::QueryTimeout => "57014",
            Code::ResourcesExhausted => "53200",
            Code::NotFound => "02000",
            Code::Unauthorized => "28P01",
            Code::Overloaded | Code::StoreUnavailable => "57P03",
            _ => "XX000",
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Makes a short reference id such as `ts_7c1f9a0b2d`, written to toolspan's log next to the
/// full internal detail and returned to the caller in the envelope.
pub fn new_reference() -> String {
    use rand::Rng;
    let n: u64 = rand::rng().random();
    format!("ts_{:010x}", n & 0xff_ffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_stable_snake_case() {
        for c in [
            Code::OtlpDecode,
            Code::SqlSyntax,
            Code::ForbiddenStatement,
            Code::Internal,
        ] {
            assert!(c
                .as_str()
                .chars()
                .all(|ch| ch.is_ascii_lowercase() || ch == '_'));
        }
        assert_eq!(Code::UnknownColumn.sqlstate(), "42703");
        assert_eq!(Code::PayloadTooLarge.http_status(), 413);
        assert!(Code::Overloaded.retryable());
        assert!(!Code::SqlSyntax.retryable());
    }

    #[test]
    fn references_look_like_ids() {
        let r = new_reference();
        assert!(r.starts_with("ts_") && r.len() == 13, "{r}");
    }
}
