//! `toolspan query`: the query service. The HTTP API (default :8080) and the Postgres wire
//! protocol (default :5433) over one engine, sharing its read-only gate, limits and
//! admission slots.

use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use toolspan_query::service::{default_concurrency, QueryService};
use toolspan_query::EngineOptions;
use toolspan_schema::Code;
use toolspan_serve::http;
use toolspan_serve::pg::{self, Credentials};

use super::serve::shutdown_signal;
use crate::fail::Failure;

/// Arguments of `toolspan query`.
#[derive(Args)]
pub struct QueryArgs {
    /// Directory or object-store prefix holding the spans table (as given to `serve`/`demo`);
    /// the table is `<dir>/spans`.
    #[arg(long, env = "TOOLSPAN_DATA_DIR", default_value = super::DEFAULT_DATA_DIR)]
    pub data_dir: super::DataDir,
    /// The table's location itself (a path or an object-store URI such as s3://bucket/spans);
    /// overrides --data-dir.
    #[arg(long, env = "TOOLSPAN_TABLE")]
    pub table: Option<String>,
    /// The metrics job's per-minute rollup, which the `failure_rates` view then reads (a path
    /// or URI; default: `<data-dir>/failure_rates_1m` when it exists and --table is not
    /// given). Without one, `failure_rates` is computed from `spans`.
    #[arg(long, env = "TOOLSPAN_ROLLUP_TABLE")]
    pub rollup_table: Option<String>,
    /// Address of the HTTP API (`off` disables it).
    #[arg(long, env = "TOOLSPAN_HTTP_ADDR", default_value = "127.0.0.1:8080")]
    pub http_addr: String,
    /// Address of the Postgres wire protocol (`off` disables it).
    #[arg(long, env = "TOOLSPAN_PG_ADDR", default_value = "127.0.0.1:5433")]
    pub pg_addr: String,
    /// The role Postgres clients log in as.
    #[arg(long, env = "TOOLSPAN_PG_USER", default_value = "grafana")]
    pub pg_user: String,
    /// The role's password (MD5 authentication); required unless --pg-addr is off.
    #[arg(long, env = "TOOLSPAN_PG_PASSWORD", hide_env_values = true)]
    pub pg_password: Option<String>,
    /// Token required on /api/v1/* and the Tempo API (as a bearer token) and on the viewer pages
    /// (a cookie set at /login or from ?token=); health checks and the OpenAPI document stay open.
    #[arg(long, env = "TOOLSPAN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Queries running longer are cancelled with `query_timeout`.
    #[arg(long, env = "TOOLSPAN_QUERY_TIMEOUT_SECS", default_value_t = 30, value_parser = super::listen::secs(1, 86_400))]
    pub query_timeout_secs: u64,
    /// Memory all running queries may use together, in MiB (0: unlimited).
    #[arg(long, env = "TOOLSPAN_QUERY_MEMORY_MB", default_value_t = 1024)]
    pub memory_limit_mb: usize,
    /// Queries that may run at once (default: twice the cores, at least 4); others wait.
    #[arg(long, env = "TOOLSPAN_MAX_CONCURRENT_QUERIES")]
    pub max_concurrent_queries: Option<usize>,
    /// How stale the table version a query reads may be, in milliseconds.
    #[arg(long, default_value_t = 1000, value_parser = super::listen::millis(0, 3_600_000))]
    pub refresh_ms: u64,
    /// MiB of Parquet data of a table on object storage kept in memory between queries, so
    /// that repeated searches and dashboard refreshes do not fetch the same bytes again (data
    /// files never change once written). 0 turns it off; local tables rely on the OS page
    /// cache instead.
    #[arg(long, env = "TOOLSPAN_DATA_CACHE_MB", default_value_t = 1024)]
    pub data_cache_mb: u64,
    #[command(flatten)]
    pub browser: super::listen::BrowserArgs,
    #[command(flatten)]
    pub listen: super::listen::ListenerArgs,
}

fn enabled(addr: &str) -> Option<&str> {
    let a = addr.trim();
    (!a.is_empty() && !a.eq_ignore_ascii_case("off")).then_some(a)
}

async fn listen(addr: &str, what: &str, flag: &str) -> Result<tokio::net::TcpListener, Failure> {
    tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        Failure::new(
            Code::InvalidArgument,
            format!("cannot listen on {addr} for the {what}: {} (is another toolspan query running? use {flag})", e.kind()),
            e,
        )
    })
}

pub async fn run(args: QueryArgs) -> Result<(), Failure> {
    let http_addr = enabled(&args.http_addr);
    let pg_addr = enabled(&args.pg_addr);
    if http_addr.is_none() && pg_addr.is_none() {
        return Err(Failure::new(
            Code::InvalidArgument,
            "both --http-addr and --pg-addr are off: enable at least one",
            "",
        ));
    }
    let credentials = match (pg_addr, args.pg_password.as_deref().filter(|p| !p.is_empty())) {
        (Some(_), None) => {
            return Err(Failure::new(
                Code::InvalidArgument,
                "the Postgres protocol needs a password: set --pg-password or TOOLSPAN_PG_PASSWORD (or --pg-addr off)",
                "",
            ))
        }
        (Some(_), Some(p)) => Some(Credentials { user: args.pg_user.clone(), password: p.to_string() }),
        (None, _) => None,
    };
    // Listen first, so that a taken port fails before the table is opened.
    let http_listener = match http_addr {
        Some(a) => Some(listen(a, "HTTP API", "--http-addr").await?),
        None => None,
    };
    let pg_listener = match pg_addr {
        Some(a) => Some(listen(a, "Postgres protocol", "--pg-addr").await?),
        None => None,
    };

    let location = args.table.clone().unwrap_or_else(|| args.data_dir.spans());
    let options = EngineOptions {
        refresh_interval: Duration::from_millis(args.refresh_ms),
        query_timeout: Duration::from_secs(args.query_timeout_secs.max(1)),
        memory_limit: (args.memory_limit_mb > 0).then_some(args.memory_limit_mb << 20),
        data_cache_bytes: args.data_cache_mb << 20,
        ..EngineOptions::default()
    };
    let data_dir = args.table.is_none().then_some(&args.data_dir);
    let rollup = super::rollup_location(data_dir, args.rollup_table.as_deref()).await?;
    let engine = super::open_engine(&location, rollup, options).await?;
    pg::catalog::install(&engine).await?;
    let slots = args
        .max_concurrent_queries
        .unwrap_or_else(default_concurrency);
    let service = Arc::new(QueryService::new(Arc::new(engine), slots));

    let limits = args.listen.limits(&args.browser.allowed_hosts);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let mut tasks = tokio::task::JoinSet::new();
    if let Some(listener) = http_listener {
        let addr = listener
            .local_addr()
            .map_err(|e| Failure::internal("listener has no address", e))?;
        say!("toolspan query: trace viewer on http://{addr}/, HTTP API (POST /api/v1/sql, GET /api/v1/search, /api/v1/traces/{{id}}, /api/v1/references/{{ref}}; described at /api/v1/openapi.json), Tempo API for Grafana (/api/search, /api/v2/traces/{{id}}){}", if args.token.is_some() { ", bearer token required" } else { "" });
        let router = http::router_with(
            service.clone(),
            args.token.clone(),
            args.browser.cookie_secure,
        );
        let stop = stopped();
        let limits = limits.clone();
        tasks.spawn(async move {
            (
                "HTTP API",
                http::serve(listener, router, &limits, stop).await,
            )
        });
    }
    if let (Some(listener), Some(credentials)) = (pg_listener, credentials) {
        let addr = listener
            .local_addr()
            .map_err(|e| Failure::internal("listener has no address", e))?;
        say!("toolspan query: Postgres protocol on {addr} (user {}): psql -h {} -p {} -U {} toolspan", credentials.user, addr.ip(), addr.port(), credentials.user);
        let svc = service.clone();
        let stop = stopped();
        let limits = limits.clone();
        tasks.spawn(async move {
            (
                "Postgres protocol",
                pg::serve(listener, svc, credentials, &limits, stop).await,
            )
        });
    }
    say!(
        "toolspan query: serving table {location} (version {}), {} queries at once, {} s timeout",
        service.engine().version(),
        service.limit(),
        args.query_timeout_secs.max(1)
    );

    let failure = tokio::select! {
        _ = shutdown_signal() => None,
        Some(done) = tasks.join_next() => Some(done),
    };
    let _ = stop_tx.send(true);
    match failure {
        None => {
            say!("toolspan query: shutting down");
            while tasks.join_next().await.is_some() {}
            Ok(())
        }
        Some(Ok((what, Ok(())))) => Err(Failure::internal(
            &format!("the {what} stopped unexpectedly"),
            "",
        )),
        Some(Ok((what, Err(e)))) => Err(Failure::new(
            Code::Internal,
            format!("the {what} failed: {}", e.kind()),
            e,
        )),
        Some(Err(e)) => Err(Failure::internal("a listener task panicked", e)),
    }
}
