//! The pipeline's errors, each mapped onto a stable [`Code`].

use toolspan_schema::{Code, EnvelopeError};

/// Errors of the pipeline. Messages name what was wrong and what is allowed; they never
/// carry a dependency's raw error text beyond a short, caller-safe description.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The protobuf body could not be decoded.
    #[error("body is not a valid OTLP ExportTraceServiceRequest protobuf message: {0}")]
    OtlpDecode(String),
    /// The JSON body could not be decoded.
    #[error("body is not valid OTLP/JSON: {0}")]
    OtlpJson(String),
    /// A limit was exceeded.
    #[error("{0}")]
    Limit(String),
    /// A rules file or redaction pattern is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Writing Parquet failed.
    #[error("parquet encoding failed: {0}")]
    Parquet(String),
    /// Building the Arrow batch failed (an internal fault).
    #[error("arrow batch construction failed: {0}")]
    Arrow(String),
}

impl PipelineError {
    /// The stable code of this error.
    pub fn code(&self) -> Code {
        match self {
            PipelineError::OtlpDecode(_) => Code::OtlpDecode,
            PipelineError::OtlpJson(_) => Code::OtlpJson,
            PipelineError::Limit(_) => Code::OtlpLimit,
            PipelineError::Config(_) => Code::InvalidConfig,
            PipelineError::Parquet(_) | PipelineError::Arrow(_) => Code::Internal,
        }
    }
}

impl EnvelopeError for PipelineError {
    fn code(&self) -> Code {
        PipelineError::code(self)
    }

    fn message(&self) -> String {
        self.to_string()
    }

    fn reference(&self) -> Option<&str> {
        None
    }

    fn detail(&self) -> Option<String> {
        Some(format!("{self:?}"))
    }
}
