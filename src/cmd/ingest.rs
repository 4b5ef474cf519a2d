//! `toolspan ingest`: a Kafka ingest worker: consume the collector's topic and
//! land every span in the table exactly once; run as many as the topic has partitions.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use toolspan_ingest::kafka::{run_worker, KafkaIngestConfig, MessageFormat};
use toolspan_ingest::sampling::SamplingConfig;
use toolspan_pipeline::Pipeline;
use toolspan_schema::Code;
use toolspan_store::{SpanTable, WriterConfig};

use crate::fail::Failure;

/// Arguments of `toolspan ingest`.
#[derive(Args)]
pub struct IngestArgs {
    /// Kafka bootstrap servers, HOST:PORT[,HOST:PORT…].
    #[arg(long, env = "TOOLSPAN_KAFKA_BROKERS", default_value = "localhost:9092")]
    pub brokers: String,
    /// The topic the OpenTelemetry Collector's kafka exporter writes.
    #[arg(long, env = "TOOLSPAN_KAFKA_TOPIC", default_value = "otlp_spans")]
    pub topic: String,
    /// Consumer group; every replica uses the same one.
    #[arg(long, env = "TOOLSPAN_KAFKA_GROUP", default_value = "toolspan-ingest")]
    pub group: String,
    /// Message encoding, as the collector's kafka exporter names it: otlp_proto or otlp_json.
    #[arg(long, env = "TOOLSPAN_KAFKA_FORMAT", default_value = "otlp_proto", value_parser = ["otlp_proto", "otlp_json"])]
    pub format: String,
    /// Dead-letter topic for undecodable messages (default `<topic>.dlq`).
    #[arg(long, env = "TOOLSPAN_KAFKA_DLQ_TOPIC")]
    pub dlq_topic: Option<String>,
    /// A librdkafka setting passed through to the consumer and the dead-letter producer,
    /// applied after toolspan's own (repeatable), e.g. `-X fetch.wait.max.ms=5`,
    /// `-X security.protocol=SASL_SSL`. See librdkafka's CONFIGURATION.md.
    #[arg(short = 'X', long = "kafka-option", value_name = "KEY=VALUE", value_parser = super::parse_kv)]
    pub client_options: Vec<(String, String)>,
    /// The spans table: a local directory or a URI (created if absent).
    #[arg(long, env = "TOOLSPAN_TABLE", default_value = "toolspan-data/spans")]
    pub table: String,
    /// Flush (one Delta commit carrying data and offsets) at least this often, in milliseconds;
    /// while the worker is behind its topic (it reads messages over 10 s after they were
    /// produced), every 5 s if this is less, unless a size limit comes first.
    #[arg(long, env = "TOOLSPAN_FLUSH_MS", default_value_t = WriterConfig::KAFKA.max_age.as_millis() as u64, value_parser = super::listen::millis(1, 3_600_000))]
    pub flush_ms: u64,
    /// Flush at this many buffered spans.
    #[arg(long, default_value_t = WriterConfig::KAFKA.max_rows)]
    pub flush_rows: usize,
    /// Flush at this many buffered bytes (Arrow memory); with the pause on store failures it
    /// bounds the worker's memory (a flush needs about three times this while it sorts and
    /// encodes).
    #[arg(long, default_value_t = WriterConfig::KAFKA.max_bytes)]
    pub flush_bytes: usize,
    /// Tail sampling: keep this share (0 < r ≤ 1) of successful traces and every trace with a
    /// failure, recording `sample_weight`. Off when not given.
    #[arg(long, env = "TOOLSPAN_SAMPLE_RATE")]
    pub sample_rate: Option<f64>,
    /// Serve ingest self-metrics (`/metrics`, dashboards/METRICS.md) here; `off` disables.
    #[arg(long, env = "TOOLSPAN_METRICS_ADDR", default_value = "127.0.0.1:9465")]
    pub metrics_addr: String,
    #[command(flatten)]
    pub maintenance: super::MaintenanceArgs,
    /// A classification rules file, tried before the built-in rules.
    #[arg(long, env = "TOOLSPAN_RULES")]
    pub rules: Option<PathBuf>,
    /// An extra redaction regex (repeatable).
    #[arg(long = "redact", value_name = "REGEX")]
    pub redact: Vec<String>,
    /// Exit once no message arrived for this many seconds and everything is committed (batch
    /// jobs, benchmarks). Runs until SIGTERM/Ctrl-C when not given.
    #[arg(long, value_parser = super::listen::secs(0, 30 * 86_400))]
    pub exit_when_idle_s: Option<u64>,
    #[command(flatten)]
    pub trace_memory: super::TraceMemoryArgs,
    #[command(flatten)]
    pub listen: super::listen::ListenerArgs,
}

pub async fn run(args: IngestArgs) -> Result<(), Failure> {
    let format = MessageFormat::parse(&args.format).ok_or_else(|| {
        Failure::new(
            Code::InvalidArgument,
            "--format must be otlp_proto or otlp_json",
            "",
        )
    })?;
    if let Some(r) = args.sample_rate {
        if !(r > 0.0 && r <= 1.0) {
            return Err(Failure::new(
                Code::InvalidArgument,
                format!("--sample-rate must be in (0, 1], got {r}"),
                "",
            ));
        }
    }
    let rules = super::read_rules(&args.rules)?;
    let pipeline = Arc::new(
        Pipeline::new(rules.as_deref(), &args.redact)?
            .with_memory(args.trace_memory.config())
            .with_assembly(args.trace_memory.assembly()),
    );
    let table = SpanTable::open_or_create(&args.table).await?;
    let metrics = toolspan_ingest::IngestMetrics::kafka(&args.topic);
    metrics.watch_trace_memory(pipeline.clone());
    if args.metrics_addr != "off" {
        let addr: SocketAddr = args.metrics_addr.parse().map_err(|e| {
            Failure::new(
                Code::InvalidArgument,
                format!(
                    "--metrics-addr must be HOST:PORT or off, got {:?}",
                    args.metrics_addr
                ),
                e,
            )
        })?;
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
            Failure::new(
                Code::InvalidArgument,
                format!(
                    "cannot listen on {addr} for metrics: {} (use --metrics-addr)",
                    e.kind()
                ),
                e,
            )
        })?;
        let app = toolspan_serve::exposition::router(vec![metrics.clone()]).merge(
            toolspan_serve::probes::router(
                metrics.clone(),
                "the table cannot be written; consumption is paused until it can",
            ),
        );
        tracing::info!(addr = %addr, "ingest metrics on /metrics, probes on /healthz and /readyz");
        let limits = args.listen.limits(&[]);
        tokio::spawn(async move {
            if let Err(e) =
                toolspan_serve::http::serve(listener, app, &limits, std::future::pending::<()>())
                    .await
            {
                tracing::error!(error = %e, "metrics listener stopped");
            }
        });
    }

    let mut cfg = KafkaIngestConfig::new(&args.brokers, &args.topic);
    cfg.group = args.group.clone();
    cfg.format = format;
    if let Some(d) = &args.dlq_topic {
        cfg.dlq_topic = d.clone();
    }
    cfg.client_options = args.client_options.clone();
    cfg.writer = WriterConfig {
        max_rows: args.flush_rows.max(1),
        max_bytes: args.flush_bytes.max(1 << 20),
        max_age: Duration::from_millis(args.flush_ms.max(10)),
    };
    cfg.sampling = args.sample_rate.map(|r| SamplingConfig {
        keep_rate: r,
        ..SamplingConfig::default()
    });

    let stop = Arc::new(AtomicBool::new(false));
    args.maintenance.spawn(60, &table, &stop);

    say!(
        "toolspan ingest: {} topic {} (group {}, {}) -> {}{}",
        args.brokers,
        args.topic,
        args.group,
        args.format,
        table.location_label(),
        args.sample_rate
            .map(|r| format!(", keeping {:.1}% of successful traces", r * 100.0))
            .unwrap_or_default()
    );
    let started = Instant::now();
    let handle = tokio::runtime::Handle::current();
    let worker_stop = stop.clone();
    let worker_metrics = metrics.clone();
    let worker = std::thread::Builder::new()
        .name("kafka-ingest".into())
        .spawn(move || run_worker(cfg, table, pipeline, worker_metrics, handle, worker_stop))
        .map_err(|e| Failure::internal("cannot start the ingest thread", e))?;

    // Stop on a signal, or when idle long enough (every message committed).
    let idle = args.exit_when_idle_s.map(Duration::from_secs);
    let mut stop_signal = std::pin::pin!(super::serve::shutdown_signal());
    let mut last_messages = 0u64;
    let mut last_change = Instant::now();
    loop {
        tokio::select! {
            _ = &mut stop_signal => {
                say!("toolspan ingest: stopping; flushing buffered spans");
                break;
            }
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
        if worker.is_finished() {
            break;
        }
        if let Some(idle) = idle {
            let text = metrics.encode();
            let messages = metric_value(&text, "toolspan_ingest_messages_total");
            if messages != last_messages {
                last_messages = messages;
                last_change = Instant::now();
            } else if messages > 0
                && last_change.elapsed() >= idle.max(Duration::from_millis(args.flush_ms) * 2)
            {
                say!(
                    "toolspan ingest: idle for {} s; stopping",
                    last_change.elapsed().as_secs()
                );
                break;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let summary = tokio::task::spawn_blocking(move || worker.join())
        .await
        .map_err(|e| Failure::internal("ingest thread lost", e))?
        .map_err(|_| Failure::internal("ingest thread panicked", ""))?
        .map_err(|e| Failure::new(e.code(), e.to_string(), ""))?;
    let secs = started.elapsed().as_secs_f64();
    say!(
        "toolspan ingest: done in {:.1} s; {} messages, {} spans committed in {} commits ({:.0} spans/s), {} dead letters, {} sampled out, {} failed flushes retried, {} spans re-read after revocation",
        secs,
        summary.messages,
        summary.spans,
        summary.commits,
        summary.spans as f64 / secs.max(1e-9),
        summary.dead_letters,
        summary.sampled_out_spans,
        summary.commit_failures,
        summary.discarded_spans
    );
    Ok(())
}

/// The value of an unlabelled series in a text exposition (0 when absent).
fn metric_value(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(name)
                .and_then(|rest| rest.strip_prefix(' '))
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
        .map(|v| v as u64)
        .unwrap_or(0)
}
