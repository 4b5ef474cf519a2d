//! What every page shares: the layout, the error page, links and number formats.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, SecondsFormat, Utc};
use maud::{html, Markup, DOCTYPE};

use crate::http::error::ApiError;

/// A rendered page.
pub struct Page {
    /// The status it is sent with.
    pub status: StatusCode,
    /// The document.
    pub body: Markup,
}

impl IntoResponse for Page {
    fn into_response(self) -> Response {
        let mut r = (self.status, self.body.into_string()).into_response();
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        );
        r
    }
}

/// A page: the header with the search box, then `main`.
pub fn layout(title: &str, main: Markup) -> Markup {
    layout_with(title, html! {}, main)
}

/// [`layout`] with more elements in `head` (a `meta` refresh).
pub fn layout_with(title: &str, head: Markup, main: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · toolspan" }
                link rel="stylesheet" href="/assets/viewer.css";
                script src="/assets/viewer.js" defer {}
                (head)
            }
            body {
                header.top {
                    a.brand href="/" { "toolspan" }
                    nav {
                        a href="/" { "failed calls" }
                        a href="/compare" { "compare versions" }
                    }
                    form.lookup method="get" action="/r" {
                        label for="ref" { "error reference" }
                        input #ref type="search" name="ref" placeholder="err_7c1f9a or a trace id" maxlength="128";
                        button type="submit" { "open" }
                    }
                }
                main { (main) }
            }
        }
    }
}

/// An error as a page: the envelope's code, message and reference (its detail goes to the log).
pub fn error_page(e: &ApiError) -> Page {
    e.log();
    let env = e.envelope();
    let err = &env["error"];
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = layout(
        "error",
        html! {
            section.error-page {
                h1 { (status.as_u16()) " " (status.canonical_reason().unwrap_or("")) }
                p.message { (err["message"].as_str().unwrap_or("")) }
                dl.kv {
                    dt { "code" } dd { code { (err["code"].as_str().unwrap_or("")) } }
                    dt { "reference" } dd { code { (err["reference"].as_str().unwrap_or("")) } }
                    dt { "retryable" } dd { (err["retryable"].as_bool().unwrap_or(false)) }
                }
            }
        },
    );
    Page { status, body }
}

/// Page handlers answer a page either way.
pub type PageResult = Result<Page, PageError>;

/// An [`ApiError`] rendered as a page.
pub struct PageError(pub ApiError);

impl<E: Into<ApiError>> From<E> for PageError {
    fn from(e: E) -> PageError {
        PageError(e.into())
    }
}

impl IntoResponse for PageError {
    /// The error page, with `Retry-After` as the code decides (a busy query service, an
    /// unavailable store), like the API's envelope.
    fn into_response(self) -> Response {
        let mut response = error_page(&self.0).into_response();
        if let Some(s) = self.0.code().retry_after_secs() {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, s.into());
        }
        response
    }
}

/// An OK page.
pub fn ok(title: &str, main: Markup) -> PageResult {
    Ok(Page {
        status: StatusCode::OK,
        body: layout(title, main),
    })
}

/// `s` as one URL path segment (everything but unreserved characters percent-encoded).
pub fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A query string (`?a=1&b=2`) of the non-empty pairs, or nothing.
pub fn query(pairs: &[(&str, &str)]) -> String {
    let mut s = url::form_urlencoded::Serializer::new(String::new());
    let mut any = false;
    for (k, v) in pairs {
        if !v.is_empty() {
            s.append_pair(k, v);
            any = true;
        }
    }
    if any {
        format!("?{}", s.finish())
    } else {
        String::new()
    }
}

/// The trace page of `trace_id`, with `span_id` selected.
pub fn trace_href(trace_id: &str, span_id: Option<&str>) -> String {
    match span_id {
        Some(s) => format!(
            "/traces/{}{}#span-{}",
            segment(trace_id),
            query(&[("span", s)]),
            segment(s)
        ),
        None => format!("/traces/{}", segment(trace_id)),
    }
}

/// The tool page of `tool`.
pub fn tool_href(tool: &str) -> String {
    format!("/tools/{}", segment(tool))
}

/// The reference lookup of `reference`.
pub fn reference_href(reference: &str) -> String {
    format!("/r/{}", segment(reference))
}

/// A time from nanoseconds since the epoch, as a `<time>` element (UTC, to the millisecond).
pub fn time(unix_nano: i64) -> Markup {
    let t = DateTime::<Utc>::from_timestamp(
        unix_nano.div_euclid(1_000_000_000),
        u32::try_from(unix_nano.rem_euclid(1_000_000_000)).unwrap_or(0),
    )
    .unwrap_or_default();
    html! {
        time datetime=(t.to_rfc3339_opts(SecondsFormat::Millis, true)) {
            (t.format("%Y-%m-%d %H:%M:%S%.3f UTC"))
        }
    }
}

/// A duration in milliseconds, in the unit that reads best.
pub fn duration(ms: f64) -> String {
    if ms < 1.0 {
        format!("{:.0} µs", ms * 1000.0)
    } else if ms < 1000.0 {
        format!("{ms:.1} ms")
    } else if ms < 60_000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else {
        format!("{:.1} min", ms / 60_000.0)
    }
}

/// A byte count.
pub fn bytes(n: i64) -> String {
    if n < 1024 {
        format!("{n} B")
    } else if n < 1 << 20 {
        format!("{:.1} KiB", n as f64 / 1024.0)
    } else {
        format!("{:.1} MiB", n as f64 / (1 << 20) as f64)
    }
}

/// A badge for an error type (`PARSE`, …) or status.
pub fn badge(kind: &str, text: &str) -> Markup {
    html! { span class=(format!("badge {kind}")) { (text) } }
}

/// The badge of a span's status and error type.
pub fn status_badge(status: &str, error_type: Option<&str>) -> Markup {
    match (status, error_type) {
        ("error", Some(t)) => badge(&format!("err t-{}", t.to_ascii_lowercase()), t),
        ("error", None) => badge("err", "ERROR"),
        ("ok", _) => badge("ok", "ok"),
        _ => badge("unset", "unset"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_encode_what_they_carry() {
        assert_eq!(segment("a b/<c>"), "a%20b%2F%3Cc%3E");
        assert_eq!(query(&[("tool", "x&y"), ("stage", "")]), "?tool=x%26y");
        assert_eq!(query(&[("stage", "")]), "");
        assert_eq!(trace_href("ab", Some("cd")), "/traces/ab?span=cd#span-cd");
    }

    #[test]
    fn markup_escapes_hostile_text() {
        let m = html! { p { ("<script>alert(1)</script>") } a href=("\" onmouseover=\"x") { "l" } };
        let s = m.into_string();
        assert!(!s.contains("<script>"), "{s}");
        assert!(s.contains("&lt;script&gt;"), "{s}");
        assert!(s.contains("href=\"&quot; onmouseover=&quot;x\""), "{s}");
    }

    /// A page that failed because the service is busy or the store is down says when to come
    /// back, as the API does; other errors do not.
    #[test]
    fn an_error_page_carries_retry_after_for_retryable_codes() {
        let header = |code: toolspan_schema::Code| {
            PageError(ApiError::new(code, "what happened", ""))
                .into_response()
                .headers()
                .get(axum::http::header::RETRY_AFTER)
                .map(|v| v.to_str().unwrap_or("").to_string())
        };
        assert_eq!(
            header(toolspan_schema::Code::Overloaded).as_deref(),
            Some("1")
        );
        assert_eq!(
            header(toolspan_schema::Code::StoreUnavailable).as_deref(),
            Some("5")
        );
        assert_eq!(header(toolspan_schema::Code::NotFound), None);
    }
}
