//! `toolspan metrics`: the metrics job. Its own consumer group (`toolspan-metrics`) on the
//! spans topic, so the store's tail sampling never biases it; failure rates per tool and stage
//! as Prometheus metrics on :9464 (contract: dashboards/METRICS.md) and, with
//! `--rollup-table`, as the per-minute rollup `failure_rates_1m` that the `failure_rates`
//! view reads, committed exactly once with the topic's offsets (the ingest protocol).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use toolspan_ingest::kafka::{KafkaIngestConfig, MessageFormat};
use toolspan_ingest::metrics_job::{run_rollup_worker, run_tap, TapConfig, TapSummary};
use toolspan_pipeline::Pipeline;
use toolspan_schema::Code;
use toolspan_store::maintenance::periodic::MaintenanceConfig;
use toolspan_store::{SpanTable, TableKind, WriterConfig};

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
    #[arg(
        long,
        env = "TOOLSPAN_METRICS_GROUP",
        default_value = "toolspan-metrics"
    )]
    pub group: String,
    /// Message encoding: otlp_proto or otlp_json.
    #[arg(long, env = "TOOLSPAN_KAFKA_FORMAT", default_value = "otlp_proto", value_parser = ["otlp_proto", "otlp_json"])]
    pub format: String,
    /// A librdkafka consumer setting (repeatable), e.g. `-X auto.offset.reset=earliest` to
    /// count the topic's history on a new group.
    #[arg(short = 'X', long = "kafka-option", value_name = "KEY=VALUE", value_parser = super::parse_kv)]
    pub client_options: Vec<(String, String)>,
    /// Where `/metrics` is served.
    #[arg(long, env = "TOOLSPAN_METRICS_ADDR", default_value = "127.0.0.1:9464")]
    pub metrics_addr: SocketAddr,
    #[command(flatten)]
    pub label_caps: super::LabelCapArgs,
    #[command(flatten)]
    pub trace_memory: super::TraceMemoryArgs,
    #[command(flatten)]
    pub listen: super::listen::ListenerArgs,
    /// A classification rules file, tried before the built-in rules (use the same as ingest).
    #[arg(long, env = "TOOLSPAN_RULES")]
    pub rules: Option<PathBuf>,
    /// Also write the per-minute rollup here (a local directory or URI, created if absent;
    /// conventionally `<data-dir>/failure_rates_1m` next to `<data-dir>/spans`, where `toolspan
    /// query` finds it). Each partition then resumes from the offsets the rollup records, so
    /// every span is counted once in it; a partition it has no offset for starts at the end
    /// of the topic (or its beginning with `-X auto.offset.reset=earliest`). Without it, only
    /// /metrics, and the group's position is kept by Kafka's auto-commit.
    #[arg(long, env = "TOOLSPAN_ROLLUP_TABLE")]
    pub rollup_table: Option<String>,
    /// Commit the rollup at least this often, in milliseconds (how fresh `failure_rates` is).
    #[arg(long, env = "TOOLSPAN_ROLLUP_FLUSH_MS", default_value_t = WriterConfig::ROLLUP.max_age.as_millis() as u64, value_parser = super::listen::millis(1, 3_600_000))]
    pub rollup_flush_ms: u64,
    /// Merge the rollup's small files (today's included) every this many seconds; 0 disables.
    #[arg(long, env = "TOOLSPAN_MAINTENANCE_EVERY_S", default_value_t = 600, value_parser = super::listen::secs(0, 30 * 86_400))]
    pub maintenance_every_s: u64,
    /// Delete rollup rows older than this many days. Off when not given.
    #[arg(long, env = "TOOLSPAN_RETENTION_DAYS")]
    pub retention_days: Option<u32>,
}

pub async fn run(args: MetricsArgs) -> Result<(), Failure> {
    let format = MessageFormat::parse(&args.format).ok_or_else(|| {
        Failure::new(
            Code::InvalidArgument,
            "--format must be otlp_proto or otlp_json",
            "",
        )
    })?;
    let rules = super::read_rules(&args.rules)?;
    let pipeline = Arc::new(
        Pipeline::new(rules.as_deref(), &[])?
            .with_memory(args.trace_memory.config())
            .with_assembly(args.trace_memory.assembly()),
    );
    let metrics = toolspan_metrics::ToolMetrics::new(args.label_caps.config());
    let listener = tokio::net::TcpListener::bind(args.metrics_addr)
        .await
        .map_err(|e| {
            Failure::new(
                Code::InvalidArgument,
                format!(
                    "cannot listen on {} for metrics: {} (use --metrics-addr)",
                    args.metrics_addr,
                    e.kind()
                ),
                e,
            )
        })?;
    let rollup = match &args.rollup_table {
        Some(location) => Some(
            SpanTable::open_or_create_kind(location, TableKind::FailureRates, HashMap::new())
                .await?,
        ),
        None => None,
    };
    // The rollup writer's own flush and commit counters are not exported: under the
    // `toolspan_ingest_*` names they would mix with the ingest workers' in the dashboards (its
    // health is in its log; its group's advisory offsets show its lag in Kafka tools).
    let writer_metrics = toolspan_ingest::IngestMetrics::embedded();
    let app = toolspan_serve::exposition::router(vec![metrics.clone()]).merge(
        toolspan_serve::probes::router(
            writer_metrics.clone(),
            "the rollup table cannot be written; its rows wait in memory until it can",
        ),
    );
    let limits = args.listen.limits(&[]);
    tokio::spawn(async move {
        if let Err(e) =
            toolspan_serve::http::serve(listener, app, &limits, std::future::pending::<()>()).await
        {
            tracing::error!(error = %e, "metrics listener stopped");
        }
    });
    say!(
        "toolspan metrics: {} topic {} (group {}) -> http://{}/metrics{}",
        args.brokers,
        args.topic,
        args.group,
        args.metrics_addr,
        rollup
            .as_ref()
            .map(|t| format!(" and rollup {}", t.location_label()))
            .unwrap_or_default()
    );
    let stop = Arc::new(AtomicBool::new(false));
    let tap_stop = stop.clone();
    let observer: Arc<dyn toolspan_ingest::BatchObserver> = metrics;
    let worker = match rollup {
        None => {
            let cfg = TapConfig {
                brokers: args.brokers.clone(),
                topic: args.topic.clone(),
                group: args.group.clone(),
                format,
                client_options: args.client_options.clone(),
            };
            std::thread::Builder::new()
                .name("metrics-tap".into())
                .spawn(move || run_tap(cfg, pipeline, observer, tap_stop).map(Summary::Tap))
        }
        Some(table) => {
            if args.maintenance_every_s > 0 {
                let m = MaintenanceConfig {
                    every: Duration::from_secs(args.maintenance_every_s),
                    retention_days: args.retention_days,
                    // The rollup is small: merge today's files as soon as there are two.
                    crowded_min_files: Some(2),
                    crowded_target_bytes: 16 << 20,
                    target_file_bytes: 16 << 20,
                    ..MaintenanceConfig::default()
                };
                tokio::spawn(toolspan_store::maintenance::periodic::run(
                    table.clone(),
                    m,
                    stop.clone(),
                ));
            }
            let mut cfg = KafkaIngestConfig::new(&args.brokers, &args.topic);
            cfg.group = args.group.clone();
            cfg.format = format;
            cfg.client_options = args.client_options.clone();
            cfg.writer = WriterConfig {
                max_age: Duration::from_millis(args.rollup_flush_ms.max(10)),
                ..WriterConfig::ROLLUP
            };
            let handle = tokio::runtime::Handle::current();
            std::thread::Builder::new()
                .name("metrics-rollup".into())
                .spawn(move || {
                    run_rollup_worker(
                        cfg,
                        table,
                        pipeline,
                        writer_metrics,
                        observer,
                        handle,
                        tap_stop,
                    )
                    .map(Summary::Rollup)
                })
        }
    }
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
    match summary {
        Summary::Tap(s) => say!(
            "toolspan metrics: done; {} messages, {} spans observed, {} undecodable skipped",
            s.messages, s.spans, s.undecodable
        ),
        Summary::Rollup(s) => say!(
            "toolspan metrics: done; {} messages, {} spans rolled up in {} commits, {} failed flushes retried, {} spans re-read after revocation",
            s.messages, s.spans, s.commits, s.commit_failures, s.discarded_spans
        ),
    }
    Ok(())
}

enum Summary {
    Tap(TapSummary),
    Rollup(toolspan_ingest::kafka::IngestSummary),
}
