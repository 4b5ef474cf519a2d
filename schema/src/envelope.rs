//! [`Envelope`]: the error every toolspan API returns (HTTP, Postgres wire, CLI), in one shape.
//!
//! A stable `code` (and its `class`), a caller-safe `message` that names what was wrong and
//! what is allowed, `retryable`, and a `reference` that is written to toolspan's log together
//! with the internal detail when the envelope is made. Front ends only render it: HTTP as
//! JSON with [`Envelope::http_status`] and [`Envelope::retry_after_secs`], Postgres with
//! [`Code::sqlstate`].

use crate::error::{new_reference, Code};

/// What every toolspan error type tells about itself, so that every front end (HTTP, Postgres
/// wire, CLI) renders it as the same [`Envelope`] and its reference is logged exactly once,
/// with its detail.
pub trait EnvelopeError {
    /// The stable code.
    fn code(&self) -> Code;
    /// What was wrong and what is allowed, safe to show a caller.
    fn message(&self) -> String;
    /// The error's own reference, if it has one: one its detail was logged under when it was
    /// made, or (the store's errors) one it carries with its detail to the boundary that
    /// handles it and logs it there.
    fn reference(&self) -> Option<&str>;
    /// Internal detail for the log (never returned to a caller); empty when it was logged
    /// already.
    fn detail(&self) -> String;

    /// The envelope: the error's own reference when it has one, otherwise a new one, logged
    /// now with the detail.
    fn envelope(&self) -> Envelope {
        match self.reference() {
            Some(r) => Envelope {
                code: self.code(),
                message: self.message(),
                reference: r.to_string(),
            },
            None => Envelope::new(self.code(), self.message(), self.detail()),
        }
    }
}

/// One error as a caller sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// The stable code.
    pub code: Code,
    /// What was wrong and what is allowed; never the caller's input or internal detail.
    pub message: String,
    /// The id under which the detail is in the log.
    pub reference: String,
}

impl Envelope {
    /// An envelope with a new reference; logs `detail` under it (at error level for
    /// `internal`, warn otherwise).
    pub fn new(code: Code, message: impl Into<String>, detail: impl std::fmt::Display) -> Envelope {
        let reference = new_reference();
        let message = message.into();
        if code == Code::Internal {
            tracing::error!(reference = %reference, code = code.as_str(), error = %message, detail = %detail, "request failed");
        } else {
            tracing::warn!(reference = %reference, code = code.as_str(), error = %message, detail = %detail, "request failed");
        }
        Envelope {
            code,
            message,
            reference,
        }
    }

    /// `{"error":{"code","class","message","retryable","reference"}}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "code": self.code.as_str(),
                "class": self.code.class().as_str(),
                "message": self.message,
                "retryable": self.code.retryable(),
                "reference": self.reference,
            }
        })
    }

    /// The HTTP status of the code.
    pub fn http_status(&self) -> u16 {
        self.code.http_status()
    }

    /// The `Retry-After` hint, in seconds, of the code ([`Code::retry_after_secs`]).
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.code.retry_after_secs()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_the_five_fields_and_no_detail() {
        let e = Envelope::new(Code::NotFound, "no route /x", "secret internal detail");
        let j = e.to_json();
        let o = j["error"].as_object().expect("object");
        assert_eq!(o.len(), 5);
        assert_eq!(o["code"], "not_found");
        assert!(!j.to_string().contains("secret internal detail"));
        assert_eq!(e.retry_after_secs(), None);
        assert_eq!(
            Envelope::new(Code::Overloaded, "busy", "").retry_after_secs(),
            Some(1)
        );
    }
}
