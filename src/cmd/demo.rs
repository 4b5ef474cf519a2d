//! `toolspan demo`: `serve` plus a synthetic agent fleet sending realistic traffic over
//! OTLP/HTTP, with the viewer (on 127.0.0.1:8080 unless told otherwise), progress, a summary
//! and things to try.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Args;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};
use prost::Message;
use toolspan_gen::{Fleet, FleetConfig};

use super::serve::{self, viewer_url, ServeArgs};
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
    /// Keep serving (the receiver and the viewer) after the fleet stops, until Ctrl-C.
    #[arg(long)]
    pub keep_serving: bool,
    /// Do not run the viewer and the query API (by default on 127.0.0.1:8080; --http-addr
    /// moves them).
    #[arg(long, conflicts_with = "http_addr")]
    pub no_viewer: bool,
}

/// Where the demo's viewer listens unless told otherwise (the query service's own default).
const VIEWER_ADDR: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8080);

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

pub async fn run(args: DemoArgs) -> Result<(), Failure> {
    let mut serve_args = args.serve.clone();
    if serve_args.http_addr.is_none() && !args.no_viewer {
        serve_args.http_addr = Some(VIEWER_ADDR);
    }
    let running = serve::start(&serve_args).await?;
    let url = format!("http://{}/v1/traces", running.addr);
    say!("toolspan demo: fleet of 3 agents (support-bot, research-assistant, ops-copilot) calling search_docs, update_ticket, fetch_url, run_sql");
    say!("toolspan demo: halfway through, the docs service behind search_docs renames 'url' to 'link' in its answer");
    say!(
        "toolspan demo: sending {} agent runs/s over OTLP/HTTP to {url} for {} s; table in {}",
        args.runs_per_second,
        args.duration,
        args.serve.data_dir
    );
    if let Some(v) = running.viewer {
        let until = if args.keep_serving {
            "until Ctrl-C"
        } else {
            "while the demo runs (--keep-serving keeps it after)"
        };
        say!(
            "toolspan demo: viewer on {} {until}{}",
            viewer_url(v),
            if args.serve.token.is_some() {
                "; it asks for the --token once"
            } else {
                ""
            }
        );
    }
    let client = reqwest::Client::new();
    let mut fleet = Fleet::new(FleetConfig {
        seed: args.seed,
        ..FleetConfig::default()
    });
    // Halfway through, the docs service behind search_docs renames a field of its answer.
    fleet.rename_docs_field_at(
        (now_ns() + args.duration * 500_000_000).saturating_sub(RUNS_ENDED_NS),
    );
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.duration);
    let tick = Duration::from_millis(500);
    // Runs are drawn at the rate asked for, by the time that passed since the last tick, so
    // that a tick delayed by a busy machine does not lower the rate (the first tick draws half
    // a second's worth).
    let rate = f64::from(args.runs_per_second.max(1));
    let mut owed = rate / 2.0;
    let mut last_tick = Instant::now();
    let mut next_report = started + Duration::from_secs(5);
    let (mut sent_spans, mut sent_requests, mut refused) = (0u64, 0u64, 0u64);
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stop = std::pin::pin!(serve::shutdown_signal());
    let mut pending = Pending::default();
    while Instant::now() < deadline {
        tokio::select! {
            _ = interval.tick() => {}
            _ = &mut stop => { say!("toolspan demo: interrupted"); break; }
        }
        let elapsed = last_tick.elapsed();
        last_tick = Instant::now();
        owed += rate * elapsed.as_secs_f64();
        let runs = owed.floor();
        owed -= runs;
        let spread_ns = u64::try_from(elapsed.as_nanos())
            .unwrap_or(u64::MAX)
            .max(500_000_000);
        pending.add(fleet.request(
            runs as usize,
            now_ns().saturating_sub(RUNS_ENDED_NS + spread_ns + 500_000_000),
            spread_ns,
        ));
        let req = pending.ended(now_ns());
        if req.resource_spans.is_empty() {
            continue;
        }
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
    let sent = Sent {
        spans: sent_spans,
        requests: sent_requests,
        refused,
        seconds: started.elapsed().as_secs_f64(),
    };
    let table = running.table.clone();
    if args.keep_serving {
        // What was sent is committed within a flush; then the summary can name a trace.
        tokio::time::sleep(Duration::from_millis(2 * args.serve.flush_ms.max(10) + 200)).await;
        compact(&args, &table).await;
        summary(&args, running.viewer, &Counts::of(&running), &sent, true).await;
        say!("toolspan demo: fleet stopped; still serving on {url} until Ctrl-C");
        serve::shutdown_signal().await;
        running.stop().await;
    } else {
        let viewer = running.viewer;
        let stats = running.state.stats.clone();
        let flushed = running.sink.stats().version.load(Ordering::Relaxed);
        running.stop().await;
        compact(&args, &table).await;
        let version = table.latest_version().await.unwrap_or(flushed);
        let counts = Counts {
            spans: stats.spans.load(Ordering::Relaxed),
            span_errors: stats.span_errors.load(Ordering::Relaxed),
            redactions: stats.redactions.load(Ordering::Relaxed),
            leaked: stats.leaked_internals.load(Ordering::Relaxed),
            version,
        };
        summary(&args, viewer, &counts, &sent, false).await;
    }
    Ok(())
}

/// The fleet draws runs that started this long ago, so that nearly every run has ended when it
/// is drawn and goes out at once (see [`Pending`]).
const RUNS_ENDED_NS: u64 = 20_000_000_000;

/// Agent runs waiting to end. An exporter sends a span once it has ended, so a run the fleet
/// drew (which may last longer than the tick it is drawn in: follow-up calls) is sent once its
/// last span has ended; no span reaches the receiver from the future. Runs still going when
/// the fleet stops (longer than [`RUNS_ENDED_NS`], rare) are not sent.
#[derive(Default)]
struct Pending {
    /// (end of the run's last span, the run with its resource and scope).
    runs: Vec<(u64, ResourceSpans)>,
}

impl Pending {
    /// Holds the runs of `req`.
    fn add(&mut self, req: ExportTraceServiceRequest) {
        for rs in req.resource_spans {
            let mut runs: Vec<(Vec<u8>, ScopeSpans)> = Vec::new();
            for ss in rs.scope_spans {
                for span in ss.spans {
                    let i = match runs.iter().position(|(t, _)| *t == span.trace_id) {
                        Some(i) => i,
                        None => {
                            let scope = ScopeSpans {
                                scope: ss.scope.clone(),
                                spans: Vec::new(),
                                schema_url: ss.schema_url.clone(),
                            };
                            runs.push((span.trace_id.clone(), scope));
                            runs.len() - 1
                        }
                    };
                    runs[i].1.spans.push(span);
                }
            }
            for (_, scope) in runs {
                let end = scope
                    .spans
                    .iter()
                    .map(|s| s.end_time_unix_nano)
                    .max()
                    .unwrap_or(0);
                self.runs.push((
                    end,
                    ResourceSpans {
                        resource: rs.resource.clone(),
                        scope_spans: vec![scope],
                        schema_url: rs.schema_url.clone(),
                    },
                ));
            }
        }
    }

    /// The runs that have ended by `now`, as one request.
    fn ended(&mut self, now: u64) -> ExportTraceServiceRequest {
        let (done, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.runs)
            .into_iter()
            .partition(|(end, _)| *end <= now);
        self.runs = waiting;
        ExportTraceServiceRequest {
            resource_spans: done.into_iter().map(|(_, r)| r).collect(),
        }
    }
}

/// What the fleet left is one small file per partition and flush: merge them, as the
/// periodic maintenance would, so that the table a user explores opens a file or two per
/// partition (unless maintenance is off).
async fn compact(args: &DemoArgs, table: &toolspan_store::SpanTable) {
    let Some(mut cfg) = args.serve.maintenance.config(60) else {
        return;
    };
    cfg.crowded_min_files = Some(2);
    let today = chrono::Utc::now().date_naive();
    match toolspan_store::maintenance::periodic::run_once(table, &cfg, today).await {
        Ok(r) => say!(
            "toolspan demo: compacted the table ({} small files merged)",
            r.files_compacted
        ),
        Err(e) => {
            tracing::warn!(code = %e.code(), reference = e.reference(), detail = e.detail_text(), "compaction after the demo failed; the table is complete, only less compact")
        }
    }
}

/// What the fleet sent.
struct Sent {
    spans: u64,
    requests: u64,
    refused: u64,
    seconds: f64,
}

/// What the receiver stored.
struct Counts {
    spans: u64,
    span_errors: u64,
    redactions: u64,
    leaked: u64,
    version: u64,
}

impl Counts {
    fn of(running: &serve::Running) -> Counts {
        let s = &running.state.stats;
        Counts {
            spans: s.spans.load(Ordering::Relaxed),
            span_errors: s.span_errors.load(Ordering::Relaxed),
            redactions: s.redactions.load(Ordering::Relaxed),
            leaked: s.leaked_internals.load(Ordering::Relaxed),
            version: running.sink.stats().version.load(Ordering::Relaxed),
        }
    }
}

/// The summary and what to try: queries, `compare`, the viewer and a failed call's trace.
/// `live`: the viewer still serves.
async fn summary(args: &DemoArgs, viewer: Option<SocketAddr>, c: &Counts, sent: &Sent, live: bool) {
    let dir = &args.serve.data_dir;
    say!();
    say!("toolspan demo: done in {:.0} s", sent.seconds);
    say!(
        "  sent      {} spans in {} OTLP requests ({} refused)",
        sent.spans,
        sent.requests,
        sent.refused
    );
    say!("  stored    {} spans, table version {}", c.spans, c.version);
    say!("  failed    {} spans with status error", c.span_errors);
    say!(
        "  redacted  {} secrets; {} tool results leaked internals to the model",
        c.redactions,
        c.leaked
    );
    say!(
        "  data      {} (a Delta Lake table: Spark, Trino, DuckDB and Polars read it too)",
        dir.spans()
    );
    let failed = failed_trace(args).await;
    let drift = shape_changes(args).await;
    for d in &drift {
        say!("  drift     {d}");
    }
    say!();
    say!("Try:");
    let addr = viewer.unwrap_or(VIEWER_ADDR);
    let base = viewer_url(addr);
    if live && viewer.is_some() {
        say!("  open {base}   (the viewer: failed calls, traces, tools; serving until Ctrl-C)");
    } else {
        say!("  toolspan query --data-dir {dir} --http-addr {addr}   then open {base} (the viewer: failed calls, traces, tools)");
    }
    if let Some(id) = &failed {
        say!("  open {base}traces/{id}   (a failed call of update_ticket)");
    }
    if !drift.is_empty() {
        say!("  open {base}tools/search_docs   (its answer shapes, what changed, and the PARSE failures that followed)");
        say!("  toolspan sql --data-dir {dir} \"{SHAPES_QUERY}\"");
    }
    say!("  toolspan compare --tool update_ticket --service support-bot --before 1.4.2 --after 1.5.0 --data-dir {dir}");
    for q in QUERIES {
        say!("  toolspan sql --data-dir {dir} \"{q}\"");
    }
    if let Some(id) = &failed {
        say!("  toolspan sql --data-dir {dir} \"SELECT stage, status, error_type, error_code, error_message FROM spans WHERE trace_id = '{id}' ORDER BY start_time\"");
    }
}

/// The queries the demo suggests (the README's, which a test runs).
const QUERIES: [&str; 5] = [
    "SELECT count(*) AS calls FROM calls WHERE tool = 'search_docs' AND error_type = 'PARSE' AND start_time > now() - INTERVAL '1 hour'",
    "SELECT tool, stage, error_type, count(*) AS failed_stage_spans FROM spans WHERE status = 'error' AND stage IN ('prepare', 'send', 'execute', 'parse') GROUP BY 1, 2, 3 ORDER BY 4 DESC",
    "SELECT trace_id, tool, attempts, error_type, reference FROM calls WHERE recovered_after_retry OR error_type = 'RETRY_EXHAUSTED' LIMIT 10",
    "SELECT tool, error_code, count(*) AS calls FROM calls WHERE leaked_internals GROUP BY 1, 2",
    "SELECT * FROM failure_rates ORDER BY minute DESC, rate DESC LIMIT 10",
];

/// The trace id of a failed call of `update_ticket` (the tool whose two versions differ), if
/// the table has one.
async fn failed_trace(args: &DemoArgs) -> Option<String> {
    let engine = super::open_engine(&args.serve.data_dir.spans(), None, Default::default())
        .await
        .ok()?;
    let result = engine
        .query(
            "SELECT trace_id FROM spans WHERE tool = 'update_ticket' AND stage = 'call' \
             AND status = 'error' LIMIT 1",
        )
        .await
        .map_err(|e| tracing::debug!(error = %e, "no failed trace to suggest"))
        .ok()?;
    toolspan_query::rows::first_texts(&result)
        .ok()?
        .into_iter()
        .next()
}

/// The answer shapes per tool, in the order they appeared (the demo suggests it when a shape changed).
const SHAPES_QUERY: &str = "SELECT tool, shape, min(first_seen) AS first_seen, sum(calls) AS calls, sum(parse_failures) AS parse_failures, bool_or(change) AS change FROM answer_shapes GROUP BY 1, 2 ORDER BY 1, 3";

/// One line per tool whose answer changed shape (`answer_shapes`): when, what changed, and
/// how many of its calls with the new shape then failed with PARSE.
async fn shape_changes(args: &DemoArgs) -> Vec<String> {
    let Ok(engine) =
        super::open_engine(&args.serve.data_dir.spans(), None, Default::default()).await
    else {
        return Vec::new();
    };
    let result = engine
        .query(
            "SELECT tool, min(shape_first_seen) AS at, max(previous_shape_doc) AS before, \
             max(shape_doc) AS after, sum(calls) AS calls, sum(parse_failures) AS parse_failures \
             FROM answer_shapes WHERE change GROUP BY tool, shape ORDER BY at",
        )
        .await
        .map_err(|e| tracing::debug!(error = %e, "no answer shapes to report"));
    let Ok(result) = result else {
        return Vec::new();
    };
    let mut lines = Vec::new();
    toolspan_query::rows::each_row(&result, |r| {
        lines.push({
            let text = |k: &str| r.text(k).unwrap_or_default();
            let num = |k: &str| r.int(k).unwrap_or_default();
            let changes = toolspan_schema::shape::diff(&text("before"), &text("after"))
                .iter()
                .map(|c| format!("{} {}", c.path, c.kind()))
                .collect::<Vec<_>>()
                .join(", ");
            format!(
                "{}'s answer changed shape at {} ({changes}); {} of its {} calls with the new shape failed with PARSE",
                text("tool"),
                text("at"),
                num("parse_failures"),
                num("calls"),
            )
        });
    });
    lines
}
