//! `toolspan serve`: embedded mode, an OTLP/HTTP receiver writing the spans table.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use toolspan_ingest::{SinkConfig, SinkHandle};
use toolspan_pipeline::Pipeline;
use toolspan_schema::Code;
use toolspan_serve::otlp_http;
use toolspan_serve::{ReceiverConfig, ReceiverState};
use toolspan_store::SpanTable;

use crate::fail::Failure;

/// Arguments shared by `serve` and `demo`.
#[derive(Args, Clone)]
pub struct ServeArgs {
    /// Where the spans table lives: a local directory (created if absent) or an object-store
    /// prefix such as s3://bucket/toolspan (see --storage-option); the table is `<dir>/spans`.
    #[arg(long, env = "TOOLSPAN_DATA_DIR", default_value = super::DEFAULT_DATA_DIR)]
    pub data_dir: super::DataDir,
    /// Address of the OTLP/HTTP receiver (`POST /v1/traces`).
    #[arg(long, env = "TOOLSPAN_OTLP_ADDR", default_value = "127.0.0.1:4318")]
    pub otlp_addr: SocketAddr,
    /// A classification rules file, tried before the built-in rules (see pipeline/rules/default.toml).
    #[arg(long, env = "TOOLSPAN_RULES")]
    pub rules: Option<PathBuf>,
    /// An extra redaction regex (repeatable); matches become [REDACTED:custom].
    #[arg(long = "redact", value_name = "REGEX")]
    pub redact: Vec<String>,
    /// Flush to the table at least this often, in milliseconds (each flush is one commit).
    #[arg(long, default_value_t = toolspan_store::WriterConfig::RECEIVER.max_age.as_millis() as u64, value_parser = super::listen::millis(1, 3_600_000))]
    pub flush_ms: u64,
    /// Batches that may wait for the writer; past this, requests get 429 (writer busy) or
    /// 503 (store failing) with Retry-After.
    #[arg(long, default_value_t = 256)]
    pub writer_queue: usize,
    /// Largest accepted request body in bytes (compressed or not).
    #[arg(long, default_value_t = 20 << 20)]
    pub max_body_bytes: usize,
    /// Bytes of request bodies held at once across all requests, from before a body is read
    /// until it is decoded (default 64 MiB, at least twice --max-body-bytes); a request that
    /// finds no room within a second is answered 429 with Retry-After.
    #[arg(long, env = "TOOLSPAN_MAX_INFLIGHT_BYTES")]
    pub max_inflight_bytes: Option<usize>,
    /// Serve Prometheus metrics (failure rates per tool and stage, dashboards/METRICS.md) on
    /// this address, e.g. 127.0.0.1:9464. Off when not given.
    #[arg(long, env = "TOOLSPAN_METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,
    /// Also serve the query HTTP API (`toolspan query`'s /api/v1/*) on this address, e.g.
    /// 127.0.0.1:8080, in this process. Off when not given.
    #[arg(long, env = "TOOLSPAN_SERVE_HTTP_ADDR")]
    pub http_addr: Option<SocketAddr>,
    /// Token the query API (--http-addr) requires, as `toolspan query --token`: a bearer token
    /// on /api/v1/* and the Tempo API, a cookie on the viewer pages (health checks and the
    /// OpenAPI document stay open).
    #[arg(long, env = "TOOLSPAN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    #[command(flatten)]
    pub browser: super::listen::BrowserArgs,
    #[command(flatten)]
    pub listen: super::listen::ListenerArgs,
    #[command(flatten)]
    pub label_caps: super::LabelCapArgs,
    #[command(flatten)]
    pub trace_memory: super::TraceMemoryArgs,
    #[command(flatten)]
    pub maintenance: super::MaintenanceArgs,
}

/// A running receiver.
pub struct Running {
    pub state: ReceiverState,
    pub sink: SinkHandle,
    pub addr: SocketAddr,
    /// Where the query HTTP API and the viewer listen (`--http-addr`), when they run.
    pub viewer: Option<SocketAddr>,
    shutdown: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<()>,
    sink_task: tokio::task::JoinHandle<()>,
    /// The table the receiver writes.
    pub table: SpanTable,
    maintenance_stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Running {
    /// Stops accepting requests, lets in-flight ones finish and flushes the writer.
    pub async fn stop(self) {
        self.maintenance_stop
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = self.shutdown.send(());
        let _ = self.server.await;
        drop(self.state);
        drop(self.sink);
        let _ = self.sink_task.await;
    }
}

/// Opens the table and starts the receiver.
pub async fn start(args: &ServeArgs) -> Result<Running, Failure> {
    let inflight = match args.max_inflight_bytes {
        None => toolspan_serve::MAX_INFLIGHT_BYTES.max(args.max_body_bytes.saturating_mul(2)),
        Some(n) if n >= args.max_body_bytes.saturating_mul(2) => n,
        Some(n) => {
            return Err(Failure::new(
                Code::InvalidArgument,
                format!(
                    "--max-inflight-bytes {n} is less than twice --max-body-bytes ({}): one \
                     compressed body and its decompressed bytes must fit",
                    args.max_body_bytes.saturating_mul(2)
                ),
                "",
            ))
        }
    };
    let limits = args.listen.limits(&args.browser.allowed_hosts);
    let rules = super::read_rules(&args.rules)?;
    let pipeline = Arc::new(
        Pipeline::new(rules.as_deref(), &args.redact)?
            .with_memory(args.trace_memory.config())
            .with_assembly(args.trace_memory.assembly()),
    );
    args.data_dir.create()?;
    let table = SpanTable::open_or_create(&args.data_dir.spans()).await?;
    let mut sink_cfg = SinkConfig::default();
    sink_cfg.writer.max_age = std::time::Duration::from_millis(args.flush_ms.max(10));
    sink_cfg.queue = args.writer_queue.max(1);
    let ingest_metrics = args
        .metrics_addr
        .map(|_| toolspan_ingest::IngestMetrics::embedded());
    if let Some(m) = &ingest_metrics {
        m.watch_trace_memory(pipeline.clone());
    }
    let (sink, sink_task) = SinkHandle::start(table.clone(), sink_cfg, ingest_metrics.clone());
    let mut state = ReceiverState::new(
        pipeline,
        sink.clone(),
        ReceiverConfig {
            max_body_bytes: args.max_body_bytes,
            max_inflight_bytes: inflight,
        },
    );
    if let (Some(maddr), Some(ingest_metrics)) = (args.metrics_addr, ingest_metrics) {
        let metrics = toolspan_metrics::ToolMetrics::new(args.label_caps.config());
        state = state.with_observer(metrics.clone());
        let listener = tokio::net::TcpListener::bind(maddr).await.map_err(|e| {
            Failure::new(
                Code::InvalidArgument,
                format!("cannot listen on {maddr} for metrics: {}", e.kind()),
                e,
            )
        })?;
        tracing::info!(addr = %maddr, "prometheus metrics on /metrics, probes on /healthz and /readyz");
        let limits = limits.clone();
        tokio::spawn(async move {
            let app = toolspan_serve::exposition::router(vec![metrics, ingest_metrics.clone()])
                .merge(toolspan_serve::probes::router(
                    ingest_metrics,
                    "the table cannot be written; requests are queued, then refused, until it can",
                ));
            if let Err(e) =
                toolspan_serve::http::serve(listener, app, &limits, std::future::pending::<()>())
                    .await
            {
                tracing::error!(error = %e, "metrics listener stopped");
            }
        });
    }
    let mut viewer = None;
    if let Some(haddr) = args.http_addr {
        let listener = tokio::net::TcpListener::bind(haddr).await.map_err(|e| {
            Failure::new(
                Code::InvalidArgument,
                format!(
                    "cannot listen on {haddr} for the query API and the viewer: {} (use --http-addr)",
                    e.kind()
                ),
                e,
            )
        })?;
        viewer = Some(
            listener
                .local_addr()
                .map_err(|e| Failure::internal("listener has no address", e))?,
        );
        let engine = toolspan_query::Engine::with_table(
            table.clone(),
            toolspan_query::EngineOptions::default(),
        )
        .await?;
        let service = Arc::new(toolspan_query::service::QueryService::new(
            Arc::new(engine),
            toolspan_query::service::default_concurrency(),
        ));
        let api = toolspan_serve::http::router_with(
            service,
            args.token.clone(),
            args.browser.cookie_secure,
        );
        tracing::info!(addr = %haddr, "query http api on /api/v1");
        let limits = limits.clone();
        tokio::spawn(async move {
            if let Err(e) =
                toolspan_serve::http::serve(listener, api, &limits, std::future::pending::<()>())
                    .await
            {
                tracing::error!(error = %e, "query http api stopped");
            }
        });
    }
    let app = otlp_http::router(state.clone());
    let listener = tokio::net::TcpListener::bind(args.otlp_addr)
        .await
        .map_err(|e| {
            Failure::new(
                Code::InvalidArgument,
                format!(
                    "cannot listen on {}: {} (is another toolspan running? use --otlp-addr)",
                    args.otlp_addr,
                    e.kind()
                ),
                e,
            )
        })?;
    let addr = listener
        .local_addr()
        .map_err(|e| Failure::internal("listener has no address", e))?;
    let (shutdown, rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        let r = toolspan_serve::http::serve(listener, app, &limits, async move {
            let _ = rx.await;
        });
        if let Err(e) = r.await {
            tracing::error!(error = %e, "otlp receiver stopped");
        }
    });
    tracing::info!(%addr, table = table.location_label(), "otlp/http receiver listening on /v1/traces");
    let maintenance_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    args.maintenance.spawn(60, &table, &maintenance_stop);
    Ok(Running {
        table,
        maintenance_stop,
        state,
        sink,
        addr,
        viewer,
        shutdown,
        server,
        sink_task,
    })
}

pub async fn run(args: ServeArgs) -> Result<(), Failure> {
    let running = start(&args).await?;
    say!(
        "toolspan serve: OTLP/HTTP on http://{}/v1/traces, table in {}\n  export OTEL_EXPORTER_OTLP_ENDPOINT=http://{}\n  query: toolspan sql --data-dir {} \"SELECT tool, stage, error_type, count(*) FROM spans GROUP BY 1,2,3\"",
        running.addr,
        args.data_dir,
        running.addr,
        args.data_dir
    );
    if let Some(v) = running.viewer {
        say!("{}", viewer_line(v, args.token.is_some()));
    }
    shutdown_signal().await;
    say!("toolspan serve: shutting down, flushing buffered spans");
    let stats = running.state.stats.clone();
    running.stop().await;
    say!(
        "toolspan serve: done; {} spans accepted, {} rejected, {} redactions",
        stats.spans.load(std::sync::atomic::Ordering::Relaxed),
        stats
            .spans_rejected
            .load(std::sync::atomic::Ordering::Relaxed),
        stats.redactions.load(std::sync::atomic::Ordering::Relaxed)
    );
    Ok(())
}

/// The status line naming where the viewer and the query API are.
pub fn viewer_line(addr: SocketAddr, token: bool) -> String {
    let ask = if token {
        " (it asks for the --token once)"
    } else {
        ""
    };
    format!(
        "  viewer: {}{ask}; query API on {}api/v1",
        viewer_url(addr),
        viewer_url(addr)
    )
}

/// The viewer's address for a browser (an unspecified listen address is opened on localhost).
pub fn viewer_url(addr: SocketAddr) -> String {
    let host = match addr.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => "127.0.0.1".to_string(),
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => "[::1]".to_string(),
        _ => addr.ip().to_string(),
    };
    let host = if addr.is_ipv6() && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host
    };
    format!("http://{host}:{}/", addr.port())
}

/// Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
