//! [`serve`]: how every toolspan HTTP listener (OTLP receiver, query API, `/metrics`) is
//! served, with the limits a listener facing the network needs.
//!
//! `axum::serve` sets no timer, so hyper enforced no header timeout: a client could open
//! connections and send half a request line, or half a body, and hold them open forever.
//! Here connections are served by hyper directly, with
//! - a [`HEADER_READ_TIMEOUT`] for each request's head (idle keep-alive connections are closed
//!   when no new request arrives within it);
//! - a [`BODY_READ_TIMEOUT`] for the whole body of a request, however it trickles in;
//! - request URIs of at most [`MAX_URI_BYTES`] (longer ones are answered 414 with the
//!   envelope; hyper itself answers a bodiless 414 beyond 64 KiB, before any handler runs);
//! - the envelope of DESIGN §6 on the 404 and 405 answers of routers that have no fallback of
//!   their own (axum's are empty).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use axum::Router;
use hyper::body::{Frame, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use toolspan_schema::{Code, Envelope};

/// Time a client has to send a request's head, and to start a new request on a kept-alive
/// connection (`TOOLSPAN_HTTP_HEADER_TIMEOUT_SECS` overrides it).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Time a client has to send a request's whole body (`TOOLSPAN_HTTP_BODY_TIMEOUT_SECS`
/// overrides it).
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// A timeout from the environment variable `var` (whole seconds, at least 1), else `default`.
fn timeout_from_env(var: &str, default: Duration) -> Duration {
    std::env::var(var)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(default, |s| Duration::from_secs(s.max(1)))
}

/// The longest request URI (path and query) answered; search parameters fit many times over.
pub const MAX_URI_BYTES: usize = 8 << 10;

/// How long a graceful shutdown waits for requests in flight.
const DRAIN: Duration = Duration::from_secs(10);

/// Serves `router` on `listener` until `shutdown` completes, then lets requests in flight
/// finish (at most a few seconds).
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let header_timeout = timeout_from_env("TOOLSPAN_HTTP_HEADER_TIMEOUT_SECS", HEADER_READ_TIMEOUT);
    let body_timeout = timeout_from_env("TOOLSPAN_HTTP_BODY_TIMEOUT_SECS", BODY_READ_TIMEOUT);
    let router = router
        .layer(axum::middleware::from_fn(envelope_empty_errors))
        .layer(axum::middleware::from_fn(move |r, n| {
            limit_request(body_timeout, r, n)
        }));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(Duration::from_secs(30)));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accepting an http connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        let connection = builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(%peer, error = %e, "http connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::info!("http requests still in flight after {DRAIN:?}: closing them");
    }
    Ok(())
}

/// Refuses over-long URIs, and bounds the time the body may take to arrive.
async fn limit_request(body_timeout: Duration, request: Request, next: Next) -> Response {
    let uri_len = request
        .uri()
        .path_and_query()
        .map_or(0, |p| p.as_str().len());
    if uri_len > MAX_URI_BYTES {
        let e = Envelope::new(
            Code::InvalidArgument,
            format!(
                "the request URI is {uri_len} bytes long and toolspan accepts at most \
                 {MAX_URI_BYTES}; send long SQL as the body of POST /api/v1/sql"
            ),
            format_args!("uri of {uri_len} bytes"),
        );
        return envelope_response(&e, StatusCode::URI_TOO_LONG);
    }
    let (parts, body) = request.into_parts();
    let body = Body::new(DeadlineBody {
        inner: body,
        deadline: Box::pin(tokio::time::sleep(body_timeout)),
    });
    next.run(Request::from_parts(parts, body)).await
}

/// Gives 404 and 405 answers without a body (axum's own fallbacks) the envelope.
async fn envelope_empty_errors(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let response = next.run(request).await;
    let status = response.status();
    if !matches!(
        status,
        StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED
    ) || response.headers().contains_key(header::CONTENT_TYPE)
    {
        return response;
    }
    // The path is the caller's own input: name its length, not its text.
    let e = if status == StatusCode::NOT_FOUND {
        Envelope::new(
            Code::NotFound,
            "no such route on this listener: see the README for its endpoints",
            format_args!("no route for {} bytes of path", path.len()),
        )
    } else {
        Envelope::new(
            Code::InvalidArgument,
            format!("{method} is not supported on this route"),
            format_args!("method {method} not allowed"),
        )
    };
    let mut out = envelope_response(&e, status);
    if let Some(allow) = response.headers().get(header::ALLOW) {
        out.headers_mut().insert(header::ALLOW, allow.clone());
    }
    out
}

/// The envelope as a JSON response with `status`.
fn envelope_response(e: &Envelope, status: StatusCode) -> Response {
    super::error::response(e, status)
}

/// A request body that fails once its deadline has passed, however its bytes trickle in.
struct DeadlineBody {
    inner: Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl hyper::body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        if self.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(axum::Error::new(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "request body not received in time",
            )))));
        }
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
