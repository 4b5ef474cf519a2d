//! `toolspan demo`: `serve` plus a synthetic agent fleet sending realistic traffic over
//! OTLP/HTTP, with progress, a summary and example queries.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Args;
use prost::Message;
use toolspan_gen::{Fleet, FleetConfig};

use super::serve::{self, ServeArgs};
use crate::fail::Failure;

/// Arguments of `toolspan demo`.
#[derive(Args)]
pub struct DemoArgs {
    #[command(flatten)]
    pub serve: ServeArgs,
    /// Stop after this many seconds.
    #[arg(long, default_value_t = 30, value_parser = super::listen::secs(0, 366 * 86_400))]
    pub duration: u64,
    /// Agent runs per second the fleet sends.
    #[arg(long, default_value_t = 50)]
    pub runs_per_second: u32,
    /// Fleet seed (same seed, same traffic shape).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Keep serving after the fleet stops, until Ctrl-C.
    #[arg(long)]
    pub keep_serving: bool,
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

pub async fn run(args: DemoArgs) -> Result<(), Failure> {
    let running = serve::start(&args.serve).await?;
    let url = format!("http://{}/v1/traces", running.addr);
    say!("toolspan demo: fleet of 3 agents (support-bot, research-assistant, ops-copilot) calling search_docs, update_ticket, fetch_url, run_sql");
    say!(
        "toolspan demo: sending {} agent runs/s over OTLP/HTTP to {url} for {} s; table in {}",
        args.runs_per_second,
        args.duration,
        args.serve.data_dir
    );
    let client = reqwest::Client::new();
    let mut fleet = Fleet::new(FleetConfig {
        seed: args.seed,
        ..FleetConfig::default()
    });
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.duration);
    let tick = Duration::from_millis(500);
    let per_tick = (args.runs_per_second as usize).div_ceil(2).max(1);
    let mut next_report = started + Duration::from_secs(5);
    let (mut sent_spans, mut sent_requests, mut refused) = (0u64, 0u64, 0u64);
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stop = std::pin::pin!(serve::shutdown_signal());
    while Instant::now() < deadline {
        tokio::select! {
            _ = interval.tick() => {}
            _ = &mut stop => { say!("toolspan demo: interrupted"); break; }
        }
        let req = fleet.request(
            per_tick,
            now_ns().saturating_sub(1_000_000_000),
            500_000_000,
        );
        let spans: u64 = req
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .map(|s| s.spans.len() as u64)
            .sum();
        let resp = client
            .post(&url)
            .header("content-type", "application/x-protobuf")
            .body(req.encode_to_vec())
            .send()
            .await;
        match resp {
            Ok(r) if r.status().is_success() => {
                sent_spans += spans;
                sent_requests += 1;
            }
            Ok(r) => {
                refused += 1;
                tracing::warn!(status = r.status().as_u16(), "export refused");
            }
            Err(e) => {
                refused += 1;
                tracing::warn!(error = %e, "export failed");
            }
        }
        if Instant::now() >= next_report {
            next_report += Duration::from_secs(5);
            let s = &running.state.stats;
            say!(
                "  {:>3}s  {} spans committed ({:.0}/s), {} failed spans, {} secrets redacted, {} leaked stack traces, table v{}",
                started.elapsed().as_secs(),
                s.spans.load(Ordering::Relaxed),
                s.spans.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64(),
                s.span_errors.load(Ordering::Relaxed),
                s.redactions.load(Ordering::Relaxed),
                s.leaked_internals.load(Ordering::Relaxed),
                running.sink.stats().version.load(Ordering::Relaxed),
            );
        }
    }
    if args.keep_serving {
        say!("toolspan demo: fleet stopped; still serving on {url} until Ctrl-C");
        serve::shutdown_signal().await;
    }
    let stats = running.state.stats.clone();
    let flushed = running.sink.stats().version.load(Ordering::Relaxed);
    let table = running.table.clone();
    running.stop().await;
    // What the fleet left is one small file per partition and flush: merge them, as the
    // periodic maintenance would, so that the table a user explores opens a file or two per
    // partition.
    if let Some(mut cfg) = args.serve.maintenance.config(60) {
        cfg.crowded_min_files = Some(2);
        let today = chrono::Utc::now().date_naive();
        match toolspan_store::maintenance::periodic::run_once(&table, &cfg, today).await {
            Ok(r) => say!(
                "toolspan demo: compacted the table ({} small files merged)",
                r.files_compacted
            ),
            Err(e) => {
                tracing::warn!(code = %e.code(), reference = e.reference(), "compaction after the demo failed; the table is complete, only less compact")
            }
        }
    }
    let version = table
        .latest_version()
        .await
        .unwrap_or(flushed);
    let dir = &args.serve.data_dir;
    say!();
    say!(
        "toolspan demo: done in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    say!("  sent      {sent_spans} spans in {sent_requests} OTLP requests ({refused} refused)");
    say!(
        "  stored    {} spans, table version {version}",
        stats.spans.load(Ordering::Relaxed)
    );
    say!(
        "  failed    {} spans with status error",
        stats.span_errors.load(Ordering::Relaxed)
    );
    say!(
        "  redacted  {} secrets; {} tool results leaked internals to the model",
        stats.redactions.load(Ordering::Relaxed),
        stats.leaked_internals.load(Ordering::Relaxed)
    );
    say!(
        "  data      {} (a Delta Lake table: Spark, Trino, DuckDB and Polars read it too)",
        dir.spans()
    );
    say!();
    say!("Try:");
    say!("  toolspan sql --data-dir {dir} \"SELECT count(*) FROM spans WHERE tool = 'search_docs' AND error_type = 'PARSE' AND start_time > now() - INTERVAL '1 hour'\"");
    say!("  toolspan sql --data-dir {dir} \"SELECT tool, stage, error_type, count(*) AS n FROM spans WHERE status = 'error' GROUP BY 1, 2, 3 ORDER BY n DESC\"");
    say!("  toolspan sql --data-dir {dir} \"SELECT tool, attempts, error_type, reference FROM calls WHERE recovered_after_retry OR error_type = 'RETRY_EXHAUSTED' LIMIT 10\"");
    say!("  toolspan sql --data-dir {dir} \"SELECT tool, error_code, count(*) FROM spans WHERE stage = 'call' AND leaked_internals GROUP BY 1, 2\"");
    say!("  toolspan sql --data-dir {dir} \"SELECT * FROM failure_rates ORDER BY minute DESC, rate DESC LIMIT 10\"");
    Ok(())
}
