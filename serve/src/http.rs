//! The HTTP API (port 8080 by default), described by the OpenAPI document it serves:
//!
//! | route | handler |
//! |---|---|
//! | `POST /api/v1/sql` | [`sql`]: one statement; JSON, CSV or Arrow IPC by `Accept` |
//! | `GET /api/v1/search` | [`search`]: structured search; the rows and the SQL it ran |
//! | `GET /api/v1/compare` | [`compare`]: one tool's calls by two versions side by side |
//! | `GET /api/v1/traces/{trace_id}` | [`traces`]: a trace as a tree |
//! | `GET /api/v1/references/{reference}` | [`traces`]: the span with an error reference and its trace |
//! | `GET /api/v1/calls/{id}/replay` | [`replay`]: what a replay of one call needs (`toolspan.replay/1`) |
//! | `GET /api/v1/evals/export` | [`evals`]: a tool's failures as eval cases (`toolspan.evals/1`, JSON Lines) |
//! | `GET /healthz`, `GET /readyz` | [`health`] |
//! | `GET /metrics` | the service's own metrics, Prometheus text ([`toolspan_query::metrics`]) |
//! | `GET /api/v1/openapi.json` | [`openapi`] |
//! | `/`, `/traces/{id}`, `/r/{reference}`, `/tools/{tool}`, `/login` | [`viewer`]: the pages (HTML) |
//! | `/api/echo`, `/api/traces/{id}`, `/api/v2/traces/{id}`, `/api/search`, `/api/v2/search/tags`, … | [`tempo`]: the Tempo-compatible API Grafana's Tempo data source calls |
//!
//! Every error is the error envelope with the status [`toolspan_schema::Code::http_status`]
//! decides ([`error::ApiError`]). With a token configured, `/api/v1/*` (except the OpenAPI
//! document) and the Tempo routes require `Authorization: Bearer <token>` ([`auth`]); `/metrics`,
//! like the health checks, does not (it holds counts, never a value from the table).

pub mod auth;
pub mod compare;
pub mod error;
pub mod evals;
pub mod health;
pub mod host;
pub mod openapi;
pub mod replay;
pub mod search;
pub mod server;
pub mod sql;
pub mod tempo;
pub mod traces;
pub mod viewer;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;

use error::ApiError;
use toolspan_query::service::QueryService;

/// The largest request body accepted (the SQL text of `POST /api/v1/sql`).
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// What every handler shares.
#[derive(Debug)]
pub struct AppState {
    /// The query front.
    pub service: Arc<QueryService>,
    /// The bearer token `/api/v1/*` requires, if any.
    pub token: Option<String>,
    /// Whether the token cookie is marked `Secure` (sent by browsers over HTTPS only), for a
    /// server behind a TLS proxy.
    pub cookie_secure: bool,
}

/// The API's routes over `service`; `token` enables bearer authentication.
pub fn router(service: Arc<QueryService>, token: Option<String>) -> Router {
    router_with(service, token, false)
}

/// [`router`], with the token cookie marked `Secure` when `cookie_secure`.
pub fn router_with(
    service: Arc<QueryService>,
    token: Option<String>,
    cookie_secure: bool,
) -> Router {
    let state = Arc::new(AppState {
        service,
        token: token.filter(|t| !t.is_empty()),
        cookie_secure,
    });
    let (api_routes, open_routes) = (api_routes(), open_routes());
    let api = api_routes
        .router
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_token,
        ))
        .route_layer(axum::middleware::from_fn(host::check));
    open_routes
        .router
        .merge(api)
        .merge(viewer::routes(state.clone()).route_layer(axum::middleware::from_fn(host::check)))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn(no_sniffing))
        .layer(axum::middleware::from_fn_with_state(state.clone(), count))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// Routes as they are mounted, remembering each (method, path template): the OpenAPI
/// document is checked against these lists, taken from the very calls that mount the routes.
pub struct Routes {
    router: Router<Arc<AppState>>,
    paths: Vec<(&'static str, &'static str)>,
}

impl Routes {
    fn new() -> Routes {
        Routes {
            router: Router::new(),
            paths: Vec::new(),
        }
    }

    fn get<H, T>(mut self, path: &'static str, handler: H) -> Routes
    where
        H: axum::handler::Handler<T, Arc<AppState>>,
        T: 'static,
    {
        self.paths.push(("get", path));
        self.router = self.router.route(path, get(handler));
        self
    }

    fn post<H, T>(mut self, path: &'static str, handler: H) -> Routes
    where
        H: axum::handler::Handler<T, Arc<AppState>>,
        T: 'static,
    {
        self.paths.push(("post", path));
        self.router = self.router.route(path, post(handler));
        self
    }

    fn merge(mut self, other: Routes) -> Routes {
        self.paths.extend(other.paths);
        self.router = self.router.merge(other.router);
        self
    }

    /// (method in lower case, path template) of every route, in mounting order.
    pub fn paths(&self) -> &[(&'static str, &'static str)] {
        &self.paths
    }
}

/// The JSON API and the Tempo-compatible API: behind the host check and the token.
fn api_routes() -> Routes {
    Routes::new()
        .post("/api/v1/sql", sql::post_sql)
        .get("/api/v1/search", search::get_search)
        .get("/api/v1/compare", compare::get_compare)
        .get("/api/v1/traces/{trace_id}", traces::get_trace)
        .get("/api/v1/references/{reference}", traces::get_reference)
        .get("/api/v1/calls/{id}/replay", replay::get_replay)
        .get("/api/v1/evals/export", evals::get_export)
        .merge(tempo::routes())
}

/// Probes, the service's metrics and the OpenAPI document: open to every caller.
fn open_routes() -> Routes {
    Routes::new()
        .get("/healthz", health::healthz)
        .get("/readyz", health::readyz)
        .get("/api/v1/openapi.json", openapi::get_openapi)
        .get("/metrics", metrics)
}

/// Every route the OpenAPI document must describe (all but the viewer's HTML pages), as
/// (method in lower case, path template), from the router's own construction.
pub fn documented_routes() -> Vec<(&'static str, &'static str)> {
    let mut out = open_routes().paths().to_vec();
    out.extend_from_slice(api_routes().paths());
    out
}

/// `GET /metrics`: the service's own metrics ([`toolspan_query::metrics`]).
async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    crate::exposition::response(state.service.metrics_text())
}

/// Counts every request by its route template (`unmatched` when no route took it) and status.
async fn count(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let started = std::time::Instant::now();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let response = next.run(request).await;
    state
        .service
        .metrics()
        .http_request(&route, response.status().as_u16(), started.elapsed());
    response
}

/// Every answer, JSON ones included, is sent with `nosniff` and, unless a page set its own,
/// a policy that lets nothing run: a browser that opens an error answer renders inert text.
async fn no_sniffing(request: Request, next: Next) -> Response {
    use axum::http::{header, HeaderValue};
    let mut response = next.run(request).await;
    let h = response.headers_mut();
    if !h.contains_key(header::CONTENT_SECURITY_POLICY) {
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static("default-src 'none'; frame-ancestors 'none'; base-uri 'none'"),
        );
    }
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

// The path is the caller's own input: the answers name its length, never its text.
async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        toolspan_schema::Code::NotFound,
        "no such route: the API is described at /api/v1/openapi.json, the pages at /",
        format_args!("no route for {} bytes of path", uri.path().len()),
    )
}

async fn method_not_allowed(
    method: axum::http::Method,
    uri: axum::http::Uri,
) -> axum::response::Response {
    let e = ApiError::new(
        toolspan_schema::Code::InvalidArgument,
        format!(
            "{method} is not supported on this route: see /api/v1/openapi.json for the methods \
             of each route"
        ),
        format_args!(
            "method {method} not allowed on {} bytes of path",
            uri.path().len()
        ),
    );
    // The envelope's code is `invalid_argument`; the status says what HTTP calls it.
    e.with_status(axum::http::StatusCode::METHOD_NOT_ALLOWED)
}

pub use server::serve;
