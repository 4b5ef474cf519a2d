//! The viewer's stylesheet and script, compiled into the binary (no CDN, no npm build): the
//! only resources the Content-Security-Policy admits.

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

/// The stylesheet.
pub const CSS: &str = include_str!("assets/viewer.css");
/// The script: local times, collapsible subtrees, filters that apply on change.
pub const JS: &str = include_str!("assets/viewer.js");

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=3600"),
    );
    r
}

/// `GET /assets/viewer.css`
pub async fn css() -> Response {
    asset(CSS, "text/css; charset=utf-8")
}

/// `GET /assets/viewer.js`
pub async fn js() -> Response {
    asset(JS, "text/javascript; charset=utf-8")
}
