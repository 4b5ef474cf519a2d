//! Decoding OTLP trace payloads: protobuf (`ExportTraceServiceRequest` or `TracesData`, which
//! share a wire format) and OTLP/JSON.
//!
//! Both encodings end as the same prost types, so everything after decoding has one path.

mod json;
pub(crate) mod view;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;

use crate::error::PipelineError;

pub use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest as TraceRequest;

/// The encoding of an OTLP payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Binary protobuf (`application/x-protobuf`, the collector's `otlp_proto`).
    Protobuf,
    /// OTLP/JSON (`application/json`, the collector's `otlp_json`).
    Json,
}

impl Encoding {
    /// The encoding for an HTTP content type, if toolspan accepts it.
    pub fn from_content_type(ct: &str) -> Option<Encoding> {
        let base = ct
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        match base.as_str() {
            "application/x-protobuf" | "application/protobuf" | "application/octet-stream" => {
                Some(Encoding::Protobuf)
            }
            "application/json" => Some(Encoding::Json),
            _ => None,
        }
    }
}

/// Decodes an OTLP trace payload.
pub fn decode(
    bytes: &[u8],
    encoding: Encoding,
) -> Result<ExportTraceServiceRequest, PipelineError> {
    match encoding {
        Encoding::Protobuf => decode_protobuf(bytes),
        Encoding::Json => json::decode_json(bytes),
    }
}

/// Decodes a protobuf `ExportTraceServiceRequest` (or `TracesData`).
pub fn decode_protobuf(bytes: &[u8]) -> Result<ExportTraceServiceRequest, PipelineError> {
    ExportTraceServiceRequest::decode(bytes).map_err(|e| {
        // prost's message names the failing field path and what was wrong (no internal
        // detail); deep nesting makes the path long, so keep its end.
        let text = e.to_string();
        let tail = match text.char_indices().rev().nth(160) {
            Some((i, _)) => format!("…{}", &text[i..]),
            None => text,
        };
        PipelineError::OtlpDecode(tail)
    })
}

/// OTLP's `SpanKind` names, indexed by the enum's value (the `kind` column's values and what
/// rules files match on).
pub const SPAN_KINDS: [&str; 6] = [
    "unspecified",
    "internal",
    "server",
    "client",
    "producer",
    "consumer",
];

/// The name of an OTLP `SpanKind` value; unknown values are `unspecified`.
pub fn span_kind_name(kind: i32) -> &'static str {
    usize::try_from(kind)
        .ok()
        .and_then(|k| SPAN_KINDS.get(k))
        .copied()
        .unwrap_or(SPAN_KINDS[0])
}

/// Decodes OTLP/JSON text.
pub fn decode_json(bytes: &[u8]) -> Result<ExportTraceServiceRequest, PipelineError> {
    json::decode_json(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_kinds_follow_the_enum() {
        assert_eq!(span_kind_name(3), "client");
        assert_eq!(span_kind_name(1), "internal");
        assert_eq!(span_kind_name(99), "unspecified");
        assert_eq!(span_kind_name(-1), "unspecified");
    }

    #[test]
    fn content_types() {
        assert_eq!(
            Encoding::from_content_type("application/x-protobuf"),
            Some(Encoding::Protobuf)
        );
        assert_eq!(
            Encoding::from_content_type("application/json; charset=utf-8"),
            Some(Encoding::Json)
        );
        assert_eq!(Encoding::from_content_type("text/plain"), None);
    }

    #[test]
    fn garbage_protobuf_is_an_error_not_a_panic() {
        let err = decode_protobuf(&[0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f, 1, 2]).unwrap_err();
        assert_eq!(err.code().as_str(), "otlp_decode");
    }
}
