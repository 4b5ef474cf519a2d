//! Liveness and readiness probes for the listeners of `toolspan serve`, `ingest` and
//! `metrics` (Kubernetes `livenessProbe`/`readinessProbe`, compose healthchecks): `GET
//! /healthz` answers while the process serves requests; `GET /readyz` answers 503 with the
//! `store_unavailable` envelope while the table cannot be written (the same condition as
//! `toolspan_ingest_store_failing`), else `{"status":"ready"}`.

use std::sync::Arc;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use toolspan_schema::{Code, Envelope};

use toolspan_ingest::IngestMetrics;

/// The readiness answer: ready, or 503 with `while_failing` as the envelope's message.
pub fn readiness(failing: bool, while_failing: &'static str) -> Response {
    if !failing {
        return (
            [(header::CONTENT_TYPE, "application/json")],
            r#"{"status":"ready"}"#,
        )
            .into_response();
    }
    let e = Envelope::new(
        Code::StoreUnavailable,
        while_failing,
        "readiness probe while commits fail",
    );
    crate::http::error::response(&e, StatusCode::SERVICE_UNAVAILABLE)
}

/// `GET /healthz` and `GET /readyz` for a listener whose process writes through `store`'s
/// sink (merge into the `/metrics` router).
pub fn router(store: Arc<IngestMetrics>, while_failing: &'static str) -> Router {
    Router::new()
        .route(
            "/healthz",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "application/json")],
                    r#"{"status":"ok"}"#,
                )
            }),
        )
        .route(
            "/readyz",
            get(move || {
                let failing = store.store_failing.get() != 0;
                async move { readiness(failing, while_failing) }
            }),
        )
}
