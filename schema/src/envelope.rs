//! [`Envelope`]: the error every toolspan API returns (HTTP, Postgres wire, CLI), in one shape.
//!
//! A stable `code` (and its `class`), a caller-safe `message` that names what was wrong and
//! what is allowed, `retryable`, and a `reference` under which toolspan's log holds the
//! internal detail. An error is not logged where it is made, nor on its way up: it carries
//! its detail to the front end that answers with it, which renders it (HTTP as JSON with
//! [`Envelope::http_status`] and [`Envelope::retry_after_secs`], Postgres with
//! [`Code::sqlstate`], the CLI on stderr) and writes it to the log once ([`Envelope::log`]).

use crate::error::{new_reference, Code};

/// What every toolspan error type tells about itself, so that every front end (HTTP, Postgres
/// wire, CLI) renders it as the same [`Envelope`].
pub trait EnvelopeError {
    /// The stable code.
    fn code(&self) -> Code;
    /// What was wrong and what is allowed, safe to show a caller.
    fn message(&self) -> String;
    /// The error's own reference, if it has one (kept through every layer, so that what a
    /// caller is shown and what the log holds agree).
    fn reference(&self) -> Option<&str>;
    /// Internal detail for the log (never returned to a caller); `None` when the error is in
    /// the log already (the loop that handled it logged it before passing it on).
    fn detail(&self) -> Option<String>;

    /// The envelope: the error's own reference when it has one, otherwise a new one, with the
    /// detail the front end logs when it answers ([`Envelope::log`]).
    fn envelope(&self) -> Envelope {
        let reference = match self.reference() {
            Some(r) => r.to_string(),
            None => new_reference(),
        };
        Envelope {
            code: self.code(),
            message: self.message(),
            reference,
            detail: self.detail(),
        }
    }
}

/// One error as a caller sees it, and the detail the log keeps under its reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// The stable code.
    pub code: Code,
    /// What was wrong and what is allowed; never the caller's input or internal detail.
    pub message: String,
    /// The id under which the detail is in the log.
    pub reference: String,
    /// Internal detail (paths, dependency text): for the log only, never rendered; `None` when
    /// it is in the log already.
    detail: Option<String>,
}

impl Envelope {
    /// An envelope with a new reference; `detail` is kept for [`Envelope::log`].
    pub fn new(code: Code, message: impl Into<String>, detail: impl std::fmt::Display) -> Envelope {
        Envelope {
            code,
            message: message.into(),
            reference: new_reference(),
            detail: Some(detail.to_string()),
        }
    }

    /// Writes the detail to the log under the reference (at error level for `internal`, warn
    /// otherwise), unless it is there already. Called once, by the front end that answers
    /// with the envelope.
    pub fn log(&self) {
        let Some(detail) = &self.detail else {
            return;
        };
        let (reference, code, message) = (&self.reference, self.code.as_str(), &self.message);
        if self.code == Code::Internal {
            tracing::error!(%reference, code, error = %message, %detail, "request failed");
        } else {
            tracing::warn!(%reference, code, error = %message, %detail, "request failed");
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
