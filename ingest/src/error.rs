//! Errors of the ingest crate, mapped onto the shared stable codes.

use toolspan_pipeline::PipelineError;

use toolspan_schema::Code;
use toolspan_store::StoreError;

/// Why a span batch could not be taken in.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// The payload could not be decoded or broke a limit.
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    /// The writer's queue is full: back off and retry (after the code's `Retry-After`).
    #[error(
        "the writer is backed up; retry after {} s",
        retry_after(Code::Overloaded)
    )]
    Overloaded,
    /// The store cannot be written right now; data stays buffered and is retried.
    #[error(
        "the store cannot be written right now; retry after {} s",
        retry_after(Code::StoreUnavailable)
    )]
    StoreUnavailable,
    /// The writer task has stopped (shutdown).
    #[error("the writer has shut down")]
    Closed,
    /// A store error surfaced to a caller.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A setting is not usable (message says which and what is allowed).
    #[error("{0}")]
    Config(String),
    /// The Kafka client failed in a way it cannot recover from.
    #[error("{0}")]
    Kafka(String),
}

impl IngestError {
    /// The stable code.
    pub fn code(&self) -> Code {
        match self {
            IngestError::Pipeline(e) => e.code(),
            IngestError::Overloaded => Code::Overloaded,
            IngestError::StoreUnavailable | IngestError::Closed => Code::StoreUnavailable,
            IngestError::Store(e) => e.code(),
            IngestError::Config(_) => Code::InvalidConfig,
            IngestError::Kafka(_) => Code::StoreUnavailable,
        }
    }
}

/// The seconds a retryable code asks a client to wait.
fn retry_after(code: Code) -> u64 {
    code.retry_after_secs().unwrap_or(1)
}

impl toolspan_schema::EnvelopeError for IngestError {
    fn code(&self) -> Code {
        IngestError::code(self)
    }

    fn message(&self) -> String {
        self.to_string()
    }

    fn reference(&self) -> Option<&str> {
        match self {
            // A store error keeps the reference it was made with (and its detail).
            IngestError::Store(e) => Some(e.reference()),
            _ => None,
        }
    }

    fn detail(&self) -> Option<String> {
        match self {
            IngestError::Store(e) => toolspan_schema::EnvelopeError::detail(e),
            _ => Some(format!("{self:?}")),
        }
    }
}
