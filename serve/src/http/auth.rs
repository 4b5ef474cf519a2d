//! The optional bearer token: when configured, every `/api/v1/*` request must carry
//! `Authorization: Bearer <token>` (health checks and the OpenAPI document stay open).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use toolspan_schema::Code;

use super::error::ApiError;
use super::AppState;

/// Refuses requests without the configured token with an `unauthorized` envelope (401).
pub async fn require_token(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(expected) = state.token.as_deref() else {
        return next.run(request).await;
    };
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        });
    match given {
        Some(t) if constant_time_eq(t.as_bytes(), expected.as_bytes()) => next.run(request).await,
        Some(_) => ApiError::new(
            Code::Unauthorized,
            "the bearer token is not valid for this server",
            "wrong bearer token",
        )
        .into_response(),
        None => ApiError::new(
            Code::Unauthorized,
            "this server requires a bearer token: send `Authorization: Bearer <token>`",
            "missing bearer token",
        )
        .into_response(),
    }
}

/// Compares without stopping at the first difference, so timing does not reveal a prefix.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= usize::from(x ^ y);
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    #[test]
    fn compares_whole_tokens() {
        assert!(super::constant_time_eq(b"abc", b"abc"));
        assert!(!super::constant_time_eq(b"abc", b"abd"));
        assert!(!super::constant_time_eq(b"abc", b"abcd"));
        assert!(!super::constant_time_eq(b"", b"a"));
    }
}
