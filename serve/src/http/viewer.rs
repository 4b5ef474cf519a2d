//! The trace viewer (`/`, `/traces/{id}`, `/r/{reference}`, `/tools/{tool}`): pages a person reads, served by the query service.
//!
//! | page | question it answers |
//! |---|---|
//! | `GET /` | [`search`]: which calls failed, where (counts per stage and error type), newest first |
//! | `GET /traces/{trace_id}?span=` | [`trace`]: what happened in this trace, which stage failed, with what arguments and answer, attempt by attempt |
//! | `GET /r/{reference}`, `GET /r?ref=` | [`trace::reference`]: the trace of an error reference, its span selected |
//! | `GET /tools/{tool}` | [`tool`]: how one tool fails over time: charts, latency, top error codes, versions |
//! | `GET /tools/{tool}/evals.jsonl` | the tool's failures as eval cases, the file `toolspan evals export` writes ([`super::evals`]) |
//! | `GET /compare` | [`compare`]: did a change help? two versions of a tool side by side |
//! | `GET /login`, `POST /login`, `GET /logout` | [`login`]: the token as a cookie, when the server has one |
//!
//! Pages are rendered on the server with maud, which escapes every value it interpolates:
//! everything on them comes from agents and tools and is treated as hostile. The only
//! script and stylesheet are [`assets`] compiled into the binary; every page is sent with a
//! Content-Security-Policy that allows nothing else (no inline script or style, no other
//! origin, no framing).

pub mod assets;
pub mod chart;
pub mod compare;
pub mod failed;
pub mod filters;
pub mod login;
pub mod page;
pub mod replays;
pub mod search;
pub mod series;
pub mod shapes;
pub mod tool;
pub mod trace;

use std::sync::Arc;

use axum::extract::Request;
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use axum::routing::get;
use axum::Router;

use super::AppState;

/// The policy every page is sent with: own script and stylesheet only, nothing inline,
/// nothing from elsewhere, no plugins, no framing; forms post only here.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

/// The routes of the pages (login and assets stay open; the rest ask for the token).
pub fn routes(state: Arc<AppState>) -> Router<Arc<AppState>> {
    let pages = Router::new()
        .route("/", get(search::page))
        .route("/traces/{trace_id}", get(trace::page))
        .route("/r", get(trace::reference_box))
        .route("/r/{reference}", get(trace::reference))
        .route("/tools/{tool}", get(tool::page))
        .route("/tools/{tool}/evals.jsonl", get(super::evals::download))
        .route("/compare", get(compare::page))
        .route_layer(axum::middleware::from_fn_with_state(
            state,
            login::require_login,
        ));
    Router::new()
        .route("/login", get(login::form).post(login::submit))
        .route("/logout", get(login::logout))
        .route("/assets/viewer.css", get(assets::css))
        .route("/assets/viewer.js", get(assets::js))
        // Browsers ask for it on every page; no content, rather than a 404 in their console.
        .route(
            "/favicon.ico",
            get(|| async { axum::http::StatusCode::NO_CONTENT }),
        )
        .merge(pages)
        .layer(axum::middleware::from_fn(security_headers))
}

/// Adds the Content-Security-Policy and its companions to every viewer answer.
async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}
