//! `GET /api/v1/openapi.json`: the hand-written OpenAPI 3 description of the API
//! (`openapi.json` beside this file; tests check it names every route and the envelope).

use axum::http::{header, HeaderValue};
use axum::response::IntoResponse;

/// The OpenAPI document, as served.
pub const OPENAPI_JSON: &str = include_str!("openapi.json");

/// Serves the document.
pub async fn get_openapi() -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        OPENAPI_JSON,
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn document_is_valid_json_with_every_route() {
        let doc: serde_json::Value =
            serde_json::from_str(super::OPENAPI_JSON).expect("openapi.json parses");
        assert!(doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")));
        for path in [
            "/api/v1/sql",
            "/api/v1/search",
            "/api/v1/compare",
            "/api/v1/traces/{trace_id}",
            "/api/v1/references/{reference}",
            "/api/v1/calls/{id}/replay",
            "/api/v1/evals/export",
            "/healthz",
            "/readyz",
            "/api/v1/openapi.json",
            "/api/echo",
            "/api/status/buildinfo",
            "/api/v2/traces/{trace_id}",
            "/api/traces/{trace_id}",
            "/api/search",
            "/api/v2/search/tags",
            "/api/search/tags",
            "/api/v2/search/tag/{tag}/values",
            "/api/search/tag/{tag}/values",
        ] {
            assert!(doc["paths"][path].is_object(), "missing {path}");
        }
        let envelope = &doc["components"]["schemas"]["ErrorEnvelope"];
        assert_eq!(
            envelope["properties"]["error"]["required"],
            serde_json::json!(["code", "class", "message", "retryable", "reference"])
        );
    }
}
