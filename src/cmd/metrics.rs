//! `toolspan metrics`: the metrics job. Its own consumer group (`toolspan-metrics`) on the
//! spans topic, so the store's tail sampling never biases it; failure rates per tool and stage
//! as Prometheus metrics on :9464 (contract: dashboards/METRICS.md).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::Args;
use toolspan_ingest::kafka::MessageFormat;
use toolspan_ingest::tap::{run_tap, TapConfig};
use toolspan_schema::{Code, Pipeline};

use crate::fail::Failure;

/// Arguments of `toolspan metrics`.
#[derive(Args)]
pub struct MetricsArgs {
    /// Kafka bootstrap servers.
    #[arg(long, env = "TOOLSPAN_KAFKA_BROKERS", default_value = "localhost:9092")]
    pub brokers: String,
    /// The spans topic.
    #[arg(long, env = "TOOLSPAN_KAFKA_TOPIC", default_value = "otlp_spans")]
    pub topic: String,
    /// Consumer group of the metrics job.
    #[arg(long, env = "TOOLSPAN_METRICS_GROUP", default_value = "toolspan-metrics")]
    pub group: String,
    /// Message encoding: otlp_proto or otlp_json.
    #[arg(long, env = "TOOLSPAN_KAFKA_FORMAT", default_value = "otlp_proto", value_parser = ["otlp_proto", "otlp_json"])]
    pub format: String,
    /// A librdkafka consumer setting (repeatable), e.g. `-X auto.offset.reset=earliest` to
    /// count the topic's history on a new group.
    #[arg(short = 'X', value_name = "KEY=VALUE", value_parser = super::parse_kv)]
    pub client_options: Vec<(String, String)>,
    /// Where `/metrics` is served.
    #[arg(long, env = "TOOLSPAN_METRICS_ADDR", default_value = "127.0.0.1:9464")]
    pub metrics_addr: SocketAddr,
    /// Distinct tools kept as label values before `__other__`.
    #[arg(long, env = "TOOLSPAN_METRICS_MAX_TOOLS", default_value_t = 100)]
    pub max_tools: usize,
    /// Distinct services kept before `__other__`.
    #[arg(long, env = "TOOLSPAN_METRICS_MAX_SERVICES", default_value_t = 50)]
    pub max_services: usize,
    /// Versions kept per service (the least recently seen is dropped).
    #[arg(long, env = "TOOLSPAN_METRICS_MAX_VERSIONS", default_value_t = 5)]
    pub max_versions_per_service: usize,
    /// Series kept per metric family.
    #[arg(long, env = "TOOLSPAN_METRICS_MAX_SERIES", default_value_t = 10_000)]
    pub max_series: usize,
    /// A classification rules file, tried before the built-in rules (use the same as ingest).
    #[arg(long, env = "TOOLSPAN_RULES")]
    pub rules: Option<PathBuf>,
}


struct Tap(Arc<toolspan_metrics::ToolMetrics>);

impl toolspan_ingest::BatchObserver for Tap {
    fn observe(&self, batch: &arrow::record_batch::RecordBatch, stats: &toolspan_schema::Stats) {
        self.0.observe(batch, stats);
    }
}

pub async fn run(args: MetricsArgs) -> Result<(), Failure> {
    let format = MessageFormat::parse(&args.format)
        .ok_or_else(|| Failure::new(Code::InvalidArgument, "--format must be otlp_proto or otlp_json", ""))?;
    let rules = super::read_rules(&args.rules)?;
    let pipeline = Arc::new(Pipeline::new(rules.as_deref(), &[])?);
    let metrics = toolspan_metrics::ToolMetrics::new(toolspan_metrics::MetricsConfig {
        max_tools: args.max_tools,
        max_services: args.max_services,
        max_versions_per_service: args.max_versions_per_service,
        max_series: args.max_series,
    });
    let listener = tokio::net::TcpListener::bind(args.metrics_addr).await.map_err(|e| {
        Failure::new(Code::InvalidArgument, format!("cannot listen on {} for metrics: {} (use --metrics-addr)", args.metrics_addr, e.kind()), e)
    })?;
    let app = toolspan_metrics::router(metrics.clone());
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics listener stopped");
        }
    });
    eprintln!(
        "toolspan metrics: {} topic {} (group {}) -> http://{}/metrics",
        args.brokers, args.topic, args.group, args.metrics_addr
    );
    let stop = Arc::new(AtomicBool::new(false));
    let cfg = TapConfig {
        brokers: args.brokers.clone(),
        topic: args.topic.clone(),
        group: args.group.clone(),
        format,
        client_options: args.client_options.clone(),
    };
    let tap_stop = stop.clone();
    let observer: Arc<dyn toolspan_ingest::BatchObserver> = Arc::new(Tap(metrics));
    let worker = std::thread::Builder::new()
        .name("metrics-tap".into())
        .spawn(move || run_tap(cfg, pipeline, observer, tap_stop))
        .map_err(|e| Failure::internal("cannot start the metrics thread", e))?;
    let mut stop_signal = std::pin::pin!(super::serve::shutdown_signal());
    loop {
        tokio::select! {
            _ = &mut stop_signal => break,
            _ = tokio::time::sleep(std::time::Duration::from_millis(250)) => {}
        }
        if worker.is_finished() {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let summary = tokio::task::spawn_blocking(move || worker.join())
        .await
        .map_err(|e| Failure::internal("metrics thread lost", e))?
        .map_err(|_| Failure::internal("metrics thread panicked", ""))?
        .map_err(|e| Failure::new(e.code(), e.to_string(), ""))?;
    eprintln!(
        "toolspan metrics: done; {} messages, {} spans observed, {} undecodable skipped",
        summary.messages, summary.spans, summary.undecodable
    );
    Ok(())
}
