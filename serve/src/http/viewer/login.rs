//! The token for browsers. A browser cannot add `Authorization: Bearer` to a link it
//! follows, so with `--token` the pages accept the token from a cookie:
//!
//! - `GET /login` shows a form; `POST /login` with the right token sets the cookie
//!   `toolspan_token` (`HttpOnly`, `SameSite=Strict`, path `/`) and goes on to `next`;
//! - any page opened with `?token=T` (a link from a dashboard that carries it) sets the same
//!   cookie and redirects to the address without it, so the token leaves the address bar and
//!   the history;
//! - a page without a valid token redirects to `/login?next=<the page>`;
//! - `Authorization: Bearer T` works on pages too (curl);
//! - `GET /logout` clears the cookie.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Form, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;

use super::page::{layout, query, Page};
use crate::http::AppState;

/// The cookie holding the token.
pub const COOKIE: &str = "toolspan_token";

/// Whether `given` is the token (compared without stopping at the first difference).
fn matches(given: &str, expected: &str) -> bool {
    let (a, b) = (given.as_bytes(), expected.as_bytes());
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        diff |= usize::from(a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0));
    }
    diff == 0
}

fn cookie_token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| {
            let (k, v) = c.trim().split_once('=')?;
            (k == COOKIE).then_some(v)
        })
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// The `Set-Cookie` value carrying `token` (`Secure` with `--cookie-secure`). The token is
/// sent back as given; a token with characters a cookie cannot hold is refused at login.
fn set_cookie(token: &str, secure: bool) -> Option<HeaderValue> {
    let secure = if secure { "; Secure" } else { "" };
    HeaderValue::from_str(&format!(
        "{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict{secure}"
    ))
    .ok()
}

fn cookie_safe(token: &str) -> bool {
    !token.is_empty()
        && token
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b';' | b',' | b'"' | b'\\'))
}

/// Where to go after login: a path on this server, never another origin, else `/`.
///
/// Browsers drop tabs and newlines from a URL and read `\\` as `/`, so `/\t/evil.example/`
/// is `//evil.example/` to them: a target with a control character or a backslash is
/// refused outright. What remains is resolved against a placeholder origin, as a browser
/// would resolve it against this server; it must stay on that origin, and its normalised
/// path and query (percent-encoded, so always a valid `Location`) are the answer.
fn safe_next(next: Option<&str>) -> String {
    const BASE: &str = "http://toolspan.invalid/";
    let Some(n) = next else {
        return "/".into();
    };
    if !n.starts_with('/') || n.starts_with("//") || n.chars().any(|c| c.is_control() || c == '\\')
    {
        return "/".into();
    }
    let Ok(base) = url::Url::parse(BASE) else {
        return "/".into();
    };
    match base.join(n) {
        Ok(u) if u.origin() == base.origin() => u[url::Position::BeforePath..].to_string(),
        _ => "/".into(),
    }
}

/// Lets a request with the token through; exchanges `?token=` for the cookie; sends others
/// to the login form.
pub async fn require_login(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(expected) = state.token.as_deref() else {
        return next.run(request).await;
    };
    let uri = request.uri().clone();
    // `?token=` from a link: set the cookie and come back without it.
    let mut given_in_query = None;
    let mut rest: Vec<(String, String)> = Vec::new();
    if let Some(q) = uri.query() {
        for (k, v) in url::form_urlencoded::parse(q.as_bytes()) {
            if k == "token" {
                given_in_query = Some(v.into_owned());
            } else {
                rest.push((k.into_owned(), v.into_owned()));
            }
        }
    }
    if let Some(t) = given_in_query {
        if matches(&t, expected) && cookie_safe(&t) {
            let pairs: Vec<(&str, &str)> =
                rest.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let target = format!("{}{}", uri.path(), query(&pairs));
            let mut r = Redirect::to(&target).into_response();
            if let Some(c) = set_cookie(&t, state.cookie_secure) {
                r.headers_mut().insert(header::SET_COOKIE, c);
            }
            return r;
        }
    }
    let headers = request.headers();
    let ok = cookie_token(headers).is_some_and(|t| matches(t, expected))
        || bearer(headers).is_some_and(|t| matches(t, expected));
    if ok {
        return next.run(request).await;
    }
    let here = match uri.query() {
        Some(_) => {
            let pairs: Vec<(&str, &str)> =
                rest.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            format!("{}{}", uri.path(), query(&pairs))
        }
        None => uri.path().to_string(),
    };
    Redirect::to(&format!("/login{}", query(&[("next", &here)]))).into_response()
}

/// The parameters of the login form.
#[derive(Debug, Default, serde::Deserialize)]
pub struct LoginParams {
    /// Where to go afterwards.
    pub next: Option<String>,
}

fn login_page(status: StatusCode, next: &str, problem: Option<&str>) -> Page {
    Page {
        status,
        body: layout(
            "sign in",
            html! {
                section.login {
                    h1 { "Sign in" }
                    p.muted { "This toolspan server was started with " code { "--token" } ". Enter it to read traces; it is kept in a cookie for this site only." }
                    @if let Some(p) = problem { p.errline { (p) } }
                    form method="post" action="/login" {
                        input type="hidden" name="next" value=(next);
                        label for="token" { "token" }
                        input #token type="password" name="token" autocomplete="current-password" required;
                        p { button type="submit" { "sign in" } }
                    }
                }
            },
        ),
    }
}

/// `GET /login`
pub async fn form(params: Result<Query<LoginParams>, QueryRejection>) -> Page {
    let params = params.ok();
    let next = safe_next(params.as_ref().and_then(|p| p.next.as_deref()));
    login_page(StatusCode::OK, &next, None)
}

/// The login form's fields.
#[derive(Debug, serde::Deserialize)]
pub struct LoginForm {
    /// The token.
    pub token: String,
    /// Where to go afterwards.
    pub next: Option<String>,
}

/// `POST /login`
pub async fn submit(State(state): State<Arc<AppState>>, Form(f): Form<LoginForm>) -> Response {
    let next = safe_next(f.next.as_deref());
    let Some(expected) = state.token.as_deref() else {
        return Redirect::to(&next).into_response();
    };
    if !matches(f.token.trim(), expected) || !cookie_safe(f.token.trim()) {
        return login_page(
            StatusCode::UNAUTHORIZED,
            &next,
            Some("that token is not valid for this server"),
        )
        .into_response();
    }
    let mut r = Redirect::to(&next).into_response();
    if let Some(c) = set_cookie(f.token.trim(), state.cookie_secure) {
        r.headers_mut().insert(header::SET_COOKIE, c);
    }
    r
}

/// `GET /logout`
pub async fn logout(State(state): State<Arc<AppState>>) -> Response {
    let mut r = Redirect::to("/login").into_response();
    let cleared = if state.cookie_secure {
        "toolspan_token=; Path=/; HttpOnly; SameSite=Strict; Secure; Max-Age=0"
    } else {
        "toolspan_token=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"
    };
    r.headers_mut()
        .insert(header::SET_COOKIE, HeaderValue::from_static(cleared));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_stays_on_this_server() {
        assert_eq!(safe_next(Some("/traces/ab?span=1")), "/traces/ab?span=1");
        assert_eq!(safe_next(Some("//evil.example/")), "/");
        assert_eq!(safe_next(Some("https://evil.example/")), "/");
        assert_eq!(safe_next(Some("/\\evil.example")), "/");
        assert_eq!(safe_next(None), "/");
        for hostile in [
            "/\t/evil.example/",
            "/%09/evil.example/",
            "/\n/evil.example",
            "/a\r\nSet-Cookie: x=1",
            "/\x0b/evil.example",
            "/\u{7f}",
        ] {
            let to = safe_next(Some(hostile));
            assert!(
                to == "/" || (to.starts_with('/') && !to.starts_with("//")),
                "{hostile:?} -> {to:?}"
            );
            assert!(!to.chars().any(|c| c.is_control()), "{hostile:?} -> {to:?}");
        }
        assert_eq!(safe_next(Some("/\t/evil.example/")), "/");
        assert_eq!(safe_next(Some("/tools/a b")), "/tools/a%20b");
    }

    #[test]
    fn cookies_are_read_among_others() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; toolspan_token=s3cret; b=2"),
        );
        assert_eq!(cookie_token(&h), Some("s3cret"));
        assert!(matches("s3cret", "s3cret"));
        assert!(!matches("s3cre", "s3cret"));
    }
}
