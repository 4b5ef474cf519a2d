//! [`serve`]: how every toolspan HTTP listener (OTLP receiver, query API, `/metrics`) is
//! served, with the limits a listener facing the network needs.
//!
//! `axum::serve` sets no timer, so hyper enforced no header timeout: a client could open
//! connections and send half a request line, or half a body, and hold them open forever.
//! Here connections are served by hyper directly, with the [`Limits`] of the listener:
//! - a header timeout for each request's head (on HTTP/1.1 it runs from the moment the
//!   connection waits for a request, so it also closes idle keep-alive connections);
//! - a body timeout for the whole body of a request, however it trickles in;
//! - an idle timeout: a connection with no request in flight (from a request's head until
//!   its answer has been sent) for that long is closed, whatever the protocol and whether or
//!   not it ever sent a byte (HTTP/2 connections and connections that never start a request
//!   included);
//! - a cap on connections: one beyond it is answered 503 with the `overloaded` envelope and
//!   `Retry-After` and closed at once;
//! - when bound to loopback, the `Host` check of [`super::host`] on the routes that read
//!   the table;
//! - request URIs of at most [`MAX_URI_BYTES`] (longer ones are answered 414 with the
//!   envelope; hyper itself answers a bodiless 414 beyond 64 KiB, before any handler runs);
//! - the error envelope (code, class, message, retryable, reference) on the 404 and 405 answers of routers that have no fallback of
//!   their own (axum's are empty).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

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

use crate::listener::{Limits, Slots};

/// The longest request URI (path and query) answered; search parameters fit many times over.
pub const MAX_URI_BYTES: usize = 8 << 10;

/// How long a graceful shutdown waits for requests in flight.
const DRAIN: Duration = Duration::from_secs(10);

/// Serves `router` on `listener` with `limits` until `shutdown` completes, then lets
/// requests in flight finish (at most a few seconds).
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    limits: &Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let body_timeout = limits.body_timeout;
    let mut router = router
        .layer(axum::middleware::from_fn(envelope_empty_errors))
        .layer(axum::middleware::from_fn(move |r, n| {
            limit_request(body_timeout, r, n)
        }));
    if let Some(hosts) = listener
        .local_addr()
        .ok()
        .and_then(|a| super::host::Allowed::for_listener(a, &limits.allowed_hosts))
    {
        router = router.layer(axum::Extension(Arc::new(hosts)));
    }
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(Duration::from_secs(30)));
    let slots = Slots::new(limits.max_connections);
    let idle_timeout = limits.idle_timeout;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
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
        let Some(slot) = slots.take() else {
            slots.refuse(stream, too_many(slots.max()));
            continue;
        };
        let _ = stream.set_nodelay(true);
        let activity = Arc::new(Activity::new());
        let service = Tracked {
            inner: hyper_util::service::TowerToHyperService::new(router.clone()),
            activity: activity.clone(),
        };
        let connection = builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let mut connection = std::pin::pin!(connection);
            let mut closing = false;
            loop {
                tokio::select! {
                    r = connection.as_mut() => {
                        if let Err(e) = r {
                            tracing::debug!(%peer, error = %e, "http connection ended with an error");
                        }
                        break;
                    }
                    _ = stop.wait_for(|s| *s), if !closing => {
                        connection.as_mut().graceful_shutdown();
                        closing = true;
                    }
                    () = activity.idle_for(idle_timeout), if !closing => {
                        tracing::debug!(%peer, "closing an idle http connection");
                        connection.as_mut().graceful_shutdown();
                        closing = true;
                    }
                }
            }
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    if !slots.drain(DRAIN).await {
        tracing::info!("http requests still in flight after {DRAIN:?}: closing them");
    }
    Ok(())
}

/// The answer to a connection beyond the cap: 503 with the envelope and `Retry-After`.
fn too_many(max: usize) -> Vec<u8> {
    let e = Envelope::new(
        Code::Overloaded,
        format!(
            "this listener serves at most {max} connections at once and all are taken; retry \
             shortly (the cap is --max-connections)"
        ),
        "connection cap reached",
    );
    e.log();
    let body = e.to_json().to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: {}\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        e.retry_after_secs().unwrap_or(1),
        body.len()
    )
    .into_bytes()
}

/// Whether a connection has a request in flight, and since when it has had none.
struct Activity {
    in_flight: AtomicUsize,
    since: Mutex<Instant>,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            in_flight: AtomicUsize::new(0),
            since: Mutex::new(Instant::now()),
        }
    }

    fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(self.clone())
    }

    /// Completes once the connection has had no request in flight for `timeout`.
    async fn idle_for(&self, timeout: Duration) {
        loop {
            let wait = if self.in_flight.load(Ordering::SeqCst) == 0 {
                let since = *self.since.lock().unwrap_or_else(|e| e.into_inner());
                match timeout.checked_sub(since.elapsed()) {
                    None | Some(Duration::ZERO) => return,
                    Some(left) => left,
                }
            } else {
                timeout
            };
            tokio::time::sleep(wait).await;
        }
    }
}

/// A request in flight, from its head until its answer's body has been sent (or dropped).
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        *self.0.since.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The router as a hyper service that tells the connection's [`Activity`] about each request.
#[derive(Clone)]
struct Tracked {
    inner: hyper_util::service::TowerToHyperService<Router>,
    activity: Arc<Activity>,
}

impl hyper::service::Service<Request<hyper::body::Incoming>> for Tracked {
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Self::Error>> + Send>>;

    fn call(&self, request: Request<hyper::body::Incoming>) -> Self::Future {
        let guard = self.activity.begin();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            Ok(response.map(|body| {
                Body::new(Guarded {
                    inner: body,
                    _guard: guard,
                })
            }))
        })
    }
}

/// An answer's body that keeps its request in flight until it is sent or dropped.
struct Guarded {
    inner: Body,
    _guard: InFlight,
}

impl hyper::body::Body for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
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
        return super::error::response(&e, StatusCode::URI_TOO_LONG);
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
    let mut out = super::error::response(&e, status);
    if let Some(allow) = response.headers().get(header::ALLOW) {
        out.headers_mut().insert(header::ALLOW, allow.clone());
    }
    out
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
