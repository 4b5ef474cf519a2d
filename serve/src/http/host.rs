//! The `Host` check against DNS rebinding. A page on another site can make a browser on
//! this machine resolve the page's own name to 127.0.0.1, and then read whatever a listener
//! on loopback answers, as a same-origin request: without a token, the API, the Tempo API
//! and the viewer would hand it the table. The browser still sends the page's name as
//! `Host`, so a listener bound to loopback answers only requests addressed to `localhost`,
//! `127.0.0.1`, `[::1]` (any port) or its bound address, plus the names given with
//! `--allowed-host`; others get 421 with the `invalid_argument` envelope. A listener bound
//! to another address (a container, a host behind a proxy) checks only when names are given.
//!
//! The check covers the routes that read the table (API, Tempo API, pages and login); the
//! probes, `/metrics` and the OpenAPI document hold nothing from the table and stay open.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;

/// The host names a listener answers.
#[derive(Debug, Clone)]
pub struct Allowed {
    names: Vec<String>,
}

impl Allowed {
    /// The check for a listener bound to `addr` with extra names `extra`; `None` when the
    /// listener answers any `Host` (bound elsewhere than loopback, no names given).
    pub fn for_listener(addr: SocketAddr, extra: &[String]) -> Option<Allowed> {
        let extra: Vec<String> = extra
            .iter()
            .map(|h| normalise(h))
            .filter(|h| !h.is_empty())
            .collect();
        if !addr.ip().is_loopback() && extra.is_empty() {
            return None;
        }
        let bound = match addr.ip() {
            IpAddr::V4(ip) => ip.to_string(),
            IpAddr::V6(ip) => format!("[{ip}]"),
        };
        let mut names: Vec<String> = ["localhost", "127.0.0.1", "[::1]"]
            .into_iter()
            .map(String::from)
            .collect();
        names.push(bound);
        names.extend(extra);
        Some(Allowed { names })
    }

    /// Whether a request with this `Host` value is answered.
    pub fn allows(&self, host: &str) -> bool {
        let name = normalise(strip_port(host));
        self.names.contains(&name)
    }
}

/// Lowercase, without a trailing dot (`localhost.` is `localhost`) or port.
fn normalise(host: &str) -> String {
    strip_port(host.trim())
        .trim_end_matches('.')
        .to_ascii_lowercase()
}

/// `name:port` → `name`; `[::1]:80` → `[::1]`.
fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host.find(']').map_or(host, |end| &host[..=end]);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Refuses requests whose `Host` (HTTP/2: the authority) the listener does not answer.
pub async fn check(request: Request, next: Next) -> Response {
    let Some(allowed) = request.extensions().get::<Arc<Allowed>>().cloned() else {
        return next.run(request).await;
    };
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| request.uri().authority().map(|a| a.as_str().to_string()));
    match host.as_deref() {
        Some(h) if allowed.allows(h) => next.run(request).await,
        other => ApiError::new(
            toolspan_schema::Code::InvalidArgument,
            "this server answers requests addressed to localhost, 127.0.0.1, [::1] or its own \
             address; start it with --allowed-host NAME to answer another name",
            format_args!("host header of {} bytes refused", other.map_or(0, str::len)),
        )
        .with_status(StatusCode::MISDIRECTED_REQUEST)
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_with_any_port_and_extra_names() {
        let a = Allowed::for_listener("127.0.0.1:8080".parse().expect("addr"), &[]).expect("on");
        for ok in [
            "localhost",
            "localhost:8080",
            "LOCALHOST.:1",
            "127.0.0.1:9",
            "[::1]:80",
        ] {
            assert!(a.allows(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8080",
            "127.0.0.2",
            "",
            "[::2]",
        ] {
            assert!(!a.allows(bad), "{bad}");
        }
        let a = Allowed::for_listener(
            "127.0.0.1:8080".parse().expect("addr"),
            &["Toolspan.internal".into()],
        )
        .expect("on");
        assert!(a.allows("toolspan.internal:8080"));
        assert!(Allowed::for_listener("0.0.0.0:8080".parse().expect("addr"), &[]).is_none());
    }
}
