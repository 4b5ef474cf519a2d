//! `GET /metrics` of every service: the Prometheus text exposition (format 0.0.4) of its
//! sources — the tool metrics of the metrics job and of embedded mode, ingest's own metrics,
//! the query service's.

use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::prometheus_text;
use toolspan_metrics::Exposition;

/// An exposition as the answer to `GET /metrics`.
pub fn response(text: String) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            prometheus_text::CONTENT_TYPE,
        )],
        text,
    )
        .into_response()
}

/// `GET /metrics` serving the expositions of `sources` one after the other (their metric
/// names are disjoint).
pub fn router(sources: Vec<Arc<dyn Exposition>>) -> axum::Router {
    let sources = Arc::new(sources);
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let sources = sources.clone();
            async move {
                let mut out = String::new();
                for s in sources.iter() {
                    for line in s.exposition().lines() {
                        if line != "# EOF" {
                            out.push_str(line);
                            out.push('\n');
                        }
                    }
                }
                response(out)
            }
        }),
    )
}
