//! `toolspan`: one binary, one subcommand per service.

/// A status line for the person running the command (progress, where things listen, a
/// summary): printed on stderr as written, or a log event under `--log-format json`
/// ([`status::status`]).
macro_rules! say {
    () => {
        $crate::status::status(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::status::status(format_args!($($arg)*))
    };
}

mod cmd;
mod config;
mod fail;
mod status;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// jemalloc rather than the system allocator: queries over a table of many small files (as
/// ingest flushes them, before maintenance merges them) open a Parquet column reader per column
/// and file, each allocating and freeing zstd contexts and buffers; glibc's malloc spent ~20 %
/// of such a query in its own bookkeeping (bench/query "as flushed": Q5 600 -> 466 ms, Q2
/// 437 -> 310 ms on the 2-core machine of bench/RESULTS.md; the maintained table's queries
/// unchanged or faster).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// toolspan: find out where AI-agent tool calls fail (prepare, send, execute, parse, retries),
/// with secrets redacted, searchable by SQL.
#[derive(Parser)]
#[command(name = "toolspan", version, about, long_about = None, propagate_version = true)]
struct Cli {
    /// A TOML file of settings for every command (`deploy/toolspan.example.toml`): the global
    /// flags at the top level, a table per command (`[serve]`, `[ingest]`, …) keyed by the
    /// flags' long names. Flags and `TOOLSPAN_*` variables win over it; unknown keys are an
    /// error.
    #[arg(long, global = true, env = "TOOLSPAN_CONFIG", value_name = "FILE")]
    config: Option<std::path::PathBuf>,
    /// Log filter (also RUST_LOG): a level (`info`, `debug`) applies to toolspan's own logs,
    /// dependencies log warnings; or a full filter such as `info,deltalake_core=debug`.
    /// Default: `info` for services, `error` for `sql` (its errors are printed as envelopes).
    #[arg(long, global = true, env = "TOOLSPAN_LOG")]
    log: Option<String>,
    /// Log line format on stderr: `text` (for people; coloured only when stderr is a terminal
    /// and NO_COLOR is unset) or `json` (one object per line, the event's fields at top level
    /// next to `timestamp`, `level`, `target` and `message`: for Loki, Vector, Fluent Bit or
    /// `kubectl logs | jq`).
    #[arg(long, global = true, env = "TOOLSPAN_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// An object-store option for every table this command opens (repeatable), applied over
    /// the environment (`AWS_REGION`, `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`, the AWS credential
    /// chain), e.g. `--storage-option aws_endpoint=http://minio:9000` or
    /// `--storage-option aws_allow_http=true`. Keys as delta-rs names them (docs/deploy.md,
    /// "Scaling out"); values are never logged.
    #[arg(long = "storage-option", global = true, value_name = "KEY=VALUE", value_parser = cmd::parse_kv)]
    storage_options: Vec<(String, String)>,
    #[command(subcommand)]
    command: Commands,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Commands {
    /// Run everything in one process with a synthetic agent fleet sending traffic, and the
    /// viewer on 127.0.0.1:8080: the first thing to try. Prints the viewer's address,
    /// progress, where the data is and what to try.
    Demo(cmd::demo::DemoArgs),
    /// Embedded mode: an OTLP/HTTP receiver (default :4318) writing the spans table; point
    /// any OpenTelemetry SDK's OTEL_EXPORTER_OTLP_ENDPOINT at it.
    Serve(cmd::serve::ServeArgs),
    /// Run one SQL statement against the spans table (views: calls, recoveries, failure_rates, answer_shapes).
    Sql(cmd::sql::SqlArgs),
    /// The query service: HTTP API (default :8080) and Postgres wire protocol (default :5433,
    /// for psql and Grafana) over the spans table, read-only.
    Query(cmd::query::QueryArgs),
    /// A Kafka ingest worker: consume the collector's topic (default otlp_spans) and land
    /// every span in the table exactly once; run one replica per partition at most.
    Ingest(cmd::ingest::IngestArgs),
    /// The metrics job: its own consumer group on the spans topic; failure rates per tool and
    /// stage as Prometheus metrics (default :9464).
    Metrics(cmd::metrics::MetricsArgs),
    /// Did a change help? One tool's calls by two service versions side by side: failure
    /// rates, unmapped failures, leaked internals, the model's recovery across turns, with a
    /// significance test per metric.
    Compare(cmd::compare::CompareArgs),
    /// Turn failures into test cases: `evals export --tool T` writes a tool's failed calls as
    /// eval cases (JSON Lines), grouped by fingerprint and pinned to the table version read,
    /// for `python -m toolspan evals run`.
    Evals(cmd::evals::EvalsArgs),
    /// Write synthetic agent traffic into a Kafka topic in the collector's format (one trace
    /// per message, keyed by trace id), for trying `ingest` and for benchmarks.
    Produce(cmd::produce::ProduceArgs),
}

/// glibc gives threads that allocate their own malloc arenas (up to 8 per core), each keeping
/// freed flush buffers; with two, bench/ingest's peak RSS was 972 MiB instead of 1,076 MiB at
/// the same CPU per span (bench/RESULTS.md).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)] // the allocator setup: the one place toolspan uses `unsafe`
fn limit_malloc_arenas() {
    // SAFETY: mallopt only changes allocator parameters; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn limit_malloc_arenas() {}

/// A value out of its range or of the wrong kind (from a flag, its environment variable or
/// the configuration file) is an `invalid_argument` envelope naming the flag and what is
/// allowed; help, version and usage errors are clap's own.
fn bad_value(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if !matches!(
        e.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        e.exit();
    }
    // clap's first paragraph: what was wrong, then what is allowed ("[possible values: …]").
    let text = e.render().to_string();
    let message = text
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .map(|l| {
            let l = l.trim();
            let l = l.strip_prefix("error: ").unwrap_or(l);
            l.trim_start_matches('[').trim_end_matches(']')
        })
        .collect::<Vec<_>>()
        .join("; ");
    fail::report(&fail::Failure::new(
        toolspan_schema::Code::InvalidArgument,
        message,
        "invalid command-line value",
    ))
}

fn main() -> ExitCode {
    limit_malloc_arenas();
    let argv = match config::apply(std::env::args_os().collect(), Cli::command()) {
        Ok(argv) => argv,
        Err(f) => return fail::report(&f),
    };
    let cli = match Cli::try_parse_from(argv) {
        Ok(cli) => cli,
        Err(e) => return bad_value(e),
    };
    let level = cli.log.clone().unwrap_or_else(|| match cli.command {
        Commands::Sql(_) | Commands::Compare(_) | Commands::Evals(_) => "error".to_string(),
        _ => "info".to_string(),
    });
    let directive = if level.contains('=') || level.contains(',') {
        level.clone()
    } else {
        let l = &level;
        // Per-commit store logs (every flush) are debug detail unless asked for.
        let store = if l == "info" { "warn" } else { l.as_str() };
        // The delta kernel logs an ERROR while probing a table that does not exist yet (which
        // toolspan then creates): not an error for toolspan's users.
        format!("warn,buoyant_kernel::snapshot::builder=off,toolspan={l},toolspan_schema={l},toolspan_pipeline={l},toolspan_store={store},toolspan_query={l},toolspan_ingest={l},librdkafka={l}")
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(directive));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    status::set_json_logs(matches!(cli.log_format, LogFormat::Json));
    match cli.log_format {
        LogFormat::Json => logs.json().flatten_event(true).with_span_list(false).init(),
        LogFormat::Text => {
            use std::io::IsTerminal;
            // Escape codes only for a person at a terminal: not in files, journald or a
            // container's log stream (https://no-color.org).
            let colour = std::io::stderr().is_terminal()
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
            logs.with_ansi(colour).init()
        }
    }
    // A panic (in toolspan or a dependency) is logged as one line; no stack trace is printed,
    // and dependencies that catch their own panics (delta-rs does) go on.
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let at = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        tracing::error!(reference = %toolspan_schema::error::new_reference(), at, "panic: {msg}");
    }));
    toolspan_store::storage::set_process_options(cli.storage_options.iter().cloned().collect());
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            return fail::report(&fail::Failure::internal(
                "cannot start the async runtime",
                e,
            ))
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Commands::Demo(a) => cmd::demo::run(a).await,
            Commands::Serve(a) => cmd::serve::run(a).await,
            Commands::Sql(a) => cmd::sql::run(a).await,
            Commands::Compare(a) => cmd::compare::run(a).await,
            Commands::Evals(a) => cmd::evals::run(a).await,
            Commands::Query(a) => cmd::query::run(a).await,
            Commands::Ingest(a) => cmd::ingest::run(a).await,
            Commands::Produce(a) => cmd::produce::run(a).await,
            Commands::Metrics(a) => cmd::metrics::run(a).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => fail::report(&f),
    }
}
