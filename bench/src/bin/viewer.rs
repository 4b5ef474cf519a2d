//! `bench/viewer`: server render time of the viewer's pages, measured through the page
//! handlers themselves (statements, rows, HTML), warm, best of 5 and median.
//!
//! 1. the trace page of one trace of 1,000 spans (demo fleet traffic with payloads, every
//!    agent run of one request re-parented under the first, so one trace holds them all),
//!    written to a table of its own;
//! 2. the search page (failed calls of the last 24 hours: the page of 50, counts per stage
//!    and per error type), unfiltered and filtered to PARSE failures of search_docs, over
//!    the bench table of `bench/query` (10,000,000 spans; built here the same way when the
//!    directory holds none), and each of its statements alone (to stderr);
//! 3. the tool page of search_docs (24 hours) and the compare page of support-bot's
//!    update_ticket, 1.4.2 against 1.5.0, over the same table, and each statement of both
//!    pages alone (to stderr, after the search page's). Target: every page ≤ 300 ms.
//!
//! Usage: viewer [--dir DIR] [--spans N] [--payloads]
//!   --dir DIR    where bench/query's table lives (default $TMPDIR/toolspan-bench-query)
//!   --spans N    spans to write when building that table (default 10,000,000)
//!   --payloads   build it with the tools' arguments and results captured (answer shapes,
//!                leaked stack traces), as a deployment that records them has; bench/query's
//!                table has none
//!
//! Or: viewer --demo-table DATA_DIR — the table a `toolspan demo` left in DATA_DIR (bench/viewer
//! --demo runs one first): its data files, and the trace page of its failed traces as a user
//! opens them (the newest 20 traces with a failed call, each rendered 10 times after one warm
//! render): p50, p95 and max over the 200 renders.
//! Last line: key=value pairs.

#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::{Path, Query, State};
use toolspan_gen::{Fleet, FleetConfig};
use toolspan_pipeline::Pipeline;
use toolspan_query::{Engine, EngineOptions, QueryService};
use toolspan_serve::http::viewer::{compare, search, series, shapes, tool, trace};
use toolspan_serve::http::AppState;
use toolspan_store::SpanTable;

const RUNS: usize = 5;
const USAGE: &str =
    "usage: viewer [--dir DIR] [--spans N] [--payloads] | viewer --demo-table DATA_DIR\n  \
     --dir DIR    where bench/query's table lives (default $TMPDIR/toolspan-bench-query)\n  \
     --spans N    spans to write when building that table (default 10,000,000)\n  \
     --payloads   build it with the tools' arguments and results captured\n  \
     --demo-table DATA_DIR  the table a `toolspan demo` left there: its files and trace pages";
const TRACE_SPANS: usize = 1_000;

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Best and median of RUNS timings of `f` (after one warm-up run).
async fn time<F, Fut>(mut f: F) -> (f64, f64)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = usize>,
{
    let bytes = f().await;
    assert!(bytes > 0, "the page rendered");
    let mut t: Vec<f64> = Vec::new();
    for _ in 0..RUNS {
        let s = Instant::now();
        f().await;
        t.push(s.elapsed().as_secs_f64() * 1e3);
    }
    t.sort_by(f64::total_cmp);
    (t[0], t[RUNS / 2])
}

fn state(engine: Engine) -> Arc<AppState> {
    Arc::new(AppState {
        service: Arc::new(QueryService::new(Arc::new(engine), 4)),
        token: None,
        cookie_secure: false,
    })
}

fn options() -> EngineOptions {
    EngineOptions {
        query_timeout: Duration::from_secs(600),
        ..EngineOptions::default()
    }
}

/// One trace of exactly TRACE_SPANS spans, through the ingest pipeline into a table.
async fn thousand_span_trace(dir: &std::path::Path) -> (SpanTable, String) {
    let mut fleet = Fleet::new(FleetConfig {
        seed: 11,
        payloads: true,
        failure_scale: 1.0,
    });
    let mut req = fleet.request(200, now_ns() - 600_000_000_000, 60_000_000_000);
    let trace_id: Vec<u8> = (1..=16).collect();
    let mut root: Option<Vec<u8>> = None;
    let mut kept = 0usize;
    for rs in &mut req.resource_spans {
        for ss in &mut rs.scope_spans {
            ss.spans.retain(|_| {
                kept += 1;
                kept <= TRACE_SPANS
            });
            for sp in &mut ss.spans {
                sp.trace_id = trace_id.clone();
                if sp.parent_span_id.is_empty() {
                    match &root {
                        None => root = Some(sp.span_id.clone()),
                        Some(r) => sp.parent_span_id = r.clone(),
                    }
                }
            }
        }
    }
    assert!(kept >= TRACE_SPANS, "the fleet request holds {kept} spans");
    let out = Pipeline::builtin().process(&req).expect("pipeline");
    let table = SpanTable::open_or_create(dir.join("spans").to_str().expect("utf-8"))
        .await
        .expect("table");
    table.commit(vec![out.batch], &[]).await.expect("commit");
    (table, trace_id.iter().map(|b| format!("{b:02x}")).collect())
}

/// bench/query's table: the demo fleet's traffic without payloads over the last 24 hours,
/// one commit per 100,000 rows.
async fn bench_table(location: &str, spans: usize, payloads: bool) -> SpanTable {
    let table = SpanTable::open_or_create(location).await.expect("table");
    if table.file_count().await.expect("files") > 0 {
        return table;
    }
    eprintln!(
        "building a {spans}-span table at {location} (as bench/query does; payloads: {payloads})"
    );
    let mut fleet = Fleet::new(FleetConfig {
        seed: 7,
        payloads,
        failure_scale: 1.0,
    });
    let pipeline = Pipeline::builtin();
    let day = 86_400_000_000_000u128;
    let end = now_ns();
    let start = end - day as u64;
    let (mut written, mut buffered, mut batches, mut last) =
        (0usize, 0usize, Vec::new(), 1_500usize);
    while written + buffered < spans {
        let at = start + (day * (written + buffered) as u128 / spans as u128) as u64;
        let spread = (day * last as u128 / spans as u128).max(1) as u64;
        let out = pipeline
            .process(&fleet.request(100, at, spread))
            .expect("pipeline");
        last = out.batch.num_rows();
        buffered += last;
        batches.push(out.batch);
        if buffered >= 100_000 {
            table
                .commit(std::mem::take(&mut batches), &[])
                .await
                .expect("commit");
            written += buffered;
            buffered = 0;
        }
    }
    if buffered > 0 {
        table.commit(batches, &[]).await.expect("commit");
    }
    table
}

/// The trace page of `id` rendered by its handler; returns the bytes of HTML.
async fn trace_page(st: &Arc<AppState>, id: &str) -> usize {
    let page = trace::page(
        State(st.clone()),
        Path(id.to_string()),
        Ok(Query(trace::TraceParams::default())),
    )
    .await
    .unwrap_or_else(|_| panic!("trace page of {id}"));
    page.body.into_string().len()
}

/// The trace page over a demo's table (see the module docs).
async fn demo_table(data_dir: &std::path::Path) {
    let location = data_dir.join("spans");
    let table = SpanTable::open_or_create(location.to_str().expect("utf-8"))
        .await
        .expect("the demo's spans table");
    let files = table.file_count().await.expect("files");
    let st = state(Engine::with_table(table, options()).await.expect("engine"));
    let out = st
        .service
        .query(
            "SELECT trace_id FROM calls WHERE status = 'error' \
             GROUP BY trace_id ORDER BY max(start_time) DESC LIMIT 20",
        )
        .await
        .expect("failed traces");
    let csv = toolspan_query::render(&out.batches, toolspan_query::Format::Csv).expect("csv");
    let traces: Vec<String> = csv.lines().skip(1).map(str::to_string).collect();
    assert!(!traces.is_empty(), "the demo's table holds failed calls");
    let mut ms: Vec<f64> = Vec::new();
    for id in &traces {
        for i in 0..11 {
            let s = Instant::now();
            assert!(trace_page(&st, id).await > 0);
            if i > 0 {
                ms.push(s.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() as f64 * q).ceil() as usize).clamp(1, ms.len()) - 1];
    let (p50, p95, max) = (at(0.50), at(0.95), ms[ms.len() - 1]);
    eprintln!(
        "demo table: {files} data files; trace page of {} failed traces x 10: p50 {p50:.1} ms, p95 {p95:.1} ms, max {max:.1} ms",
        traces.len()
    );
    println!(
        "demo_files={files} traces={} renders={} trace_page_p50_ms={p50:.1} trace_page_p95_ms={p95:.1} trace_page_max_ms={max:.1}",
        traces.len(),
        ms.len()
    );
}

/// Times one statement alone, best of RUNS, and prints it (to stderr) under `page`.
/// With `BENCH_PRINT_SQL` set, the statement itself is printed too (to study with bench/explain).
async fn statement(st: &Arc<AppState>, page: &str, name: &str, sql: String) {
    if std::env::var_os("BENCH_PRINT_SQL").is_some() {
        eprintln!("{page}, {name}:\n{sql}");
    }
    let (best, median) = time(|| {
        let (st, sql) = (st.clone(), sql.clone());
        async move {
            let out = st.service.query(&sql).await.expect("statement");
            out.batches.len().max(1)
        }
    })
    .await;
    eprintln!("  {page} statement, {name}: best {best:.0} ms (median {median:.0})");
}

/// Each statement of the default search page and of the tool page of search_docs alone, best
/// of RUNS (to stderr): where the pages' time goes.
async fn statements(st: &Arc<AppState>) {
    let now = chrono::Utc::now();
    let f = search::Filters::new(search::Params::default(), now).expect("filters");
    let (buckets, scope) = (f.buckets(now), f.chart_scope());
    let keys = st.service.query(&f.calls_sql()).await.expect("page keys");
    let keys = search::PageKey::read(&keys).unwrap_or_else(|_| panic!("page keys"));
    for (name, sql) in [
        ("page keys", f.calls_sql()),
        (
            "page rows",
            search::page_rows_sql(&keys).expect("a page of calls"),
        ),
        ("error type counts", f.error_type_counts_sql()),
        ("stage counts", f.stage_counts_sql()),
        ("chart counts", series::counts_sql(&buckets, &scope)),
        ("chart latency", series::latency_sql(&buckets, &scope)),
    ] {
        statement(st, "search page", name, sql).await;
    }
    let (since, until) = tool::range(None, None, now).expect("range");
    let t = tool::statements("search_docs", since, until);
    let tool_buckets = series::Buckets::new(since, until);
    for (name, sql) in [
        ("chart counts", series::counts_sql(&tool_buckets, &t.scope)),
        (
            "chart latency",
            series::latency_sql(&tool_buckets, &t.scope),
        ),
        ("codes", t.codes),
        ("totals", t.totals),
        ("latency", t.latency),
        ("versions", t.versions),
        ("leaks", t.leaks),
        (
            "answers recorded",
            toolspan_query::views::answers_recorded_query("search_docs"),
        ),
        (
            "answer shapes",
            shapes::sql("search_docs", &since.to_rfc3339()),
        ),
    ] {
        statement(st, "tool page", name, sql).await;
    }
    let c = toolspan_query::compare::statements(&compare_request()).expect("a valid comparison");
    for (name, sql) in [
        ("calls", c.calls),
        ("stages", c.stages),
        ("codes", c.codes),
        ("streaks", c.streaks),
    ] {
        statement(st, "compare page", name, sql).await;
    }
}

/// The comparison the compare page is timed on: support-bot's update_ticket, 1.4.2 against
/// 1.5.0, every call in the table.
fn compare_request() -> toolspan_query::compare::CompareRequest {
    toolspan_query::compare::CompareRequest {
        tool: "update_ticket".into(),
        before: "1.4.2".into(),
        after: "1.5.0".into(),
        service: Some("support-bot".into()),
        since: None,
        until: None,
    }
}

#[tokio::main]
async fn main() {
    if let Some(d) = std::env::args().skip_while(|a| a != "--demo-table").nth(1) {
        demo_table(std::path::Path::new(&d)).await;
        return;
    }
    let mut dir = std::env::temp_dir().join("toolspan-bench-query");
    let mut spans = 10_000_000usize;
    let mut payloads = false;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--dir" => dir = it.next().expect("--dir DIR").into(),
            "--spans" => spans = it.next().and_then(|v| v.parse().ok()).expect("--spans N"),
            "--payloads" => payloads = true,
            "--help" | "-h" => {
                println!("{USAGE}");
                return;
            }
            other => {
                eprintln!("viewer: unknown argument {other}\n{USAGE}");
                std::process::exit(2);
            }
        }
    }

    // 1. The trace page of a 1,000-span trace.
    let tmp = std::env::temp_dir().join(format!("toolspan-bench-viewer-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let (table, trace_id) = thousand_span_trace(&tmp).await;
    let st = state(Engine::with_table(table, options()).await.expect("engine"));
    let (trace_best, trace_median) = time(|| {
        let (st, id) = (st.clone(), trace_id.clone());
        async move { trace_page(&st, &id).await }
    })
    .await;
    let html_bytes = trace_page(&st, &trace_id).await;
    eprintln!(
        "trace page, {TRACE_SPANS} spans: best {trace_best:.1} ms, median {trace_median:.1} ms, {html_bytes} bytes of HTML"
    );
    let _ = std::fs::remove_dir_all(&tmp);

    // 2. The search page over the bench table.
    let location = dir.join("spans");
    std::fs::create_dir_all(&dir).expect("bench directory");
    let table = bench_table(location.to_str().expect("utf-8"), spans, payloads).await;
    let st = state(Engine::with_table(table, options()).await.expect("engine"));
    let total = st
        .service
        .query("SELECT count(*) FROM spans")
        .await
        .expect("count");
    let total = toolspan_query::render(&total.batches, toolspan_query::Format::Csv)
        .expect("csv")
        .lines()
        .nth(1)
        .unwrap_or_default()
        .to_string();
    let search_page = |params: search::Params| {
        let st = st.clone();
        move || {
            let st = st.clone();
            let p = params.clone();
            async move {
                let page = search::page(State(st), Ok(Query(p)))
                    .await
                    .unwrap_or_else(|_| panic!("search page"));
                page.body.into_string().len()
            }
        }
    };
    let (all_best, all_median) = time(search_page(search::Params::default())).await;
    let (parse_best, parse_median) = time(search_page(search::Params {
        tool: Some("search_docs".into()),
        stage: Some("parse".into()),
        error_type: Some("PARSE".into()),
        ..search::Params::default()
    }))
    .await;
    eprintln!("search page over {total} spans: failed calls of 24 h best {all_best:.0} ms (median {all_median:.0}); PARSE of search_docs best {parse_best:.0} ms (median {parse_median:.0})");
    statements(&st).await;

    // 3. The tool page of search_docs (24 h) and the compare page of support-bot's
    //    update_ticket, 1.4.2 against 1.5.0 (every call in the table).
    let (tool_best, tool_median) = time(|| {
        let st = st.clone();
        async move {
            tool::page(
                State(st),
                Path("search_docs".to_string()),
                Ok(Query(tool::ToolParams::default())),
            )
            .await
            .unwrap_or_else(|_| panic!("tool page"))
            .body
            .into_string()
            .len()
        }
    })
    .await;
    let (compare_best, compare_median) = time(|| {
        let st = st.clone();
        async move {
            let p = compare::CompareParams {
                tool: Some("update_ticket".into()),
                service: Some("support-bot".into()),
                before: Some("1.4.2".into()),
                after: Some("1.5.0".into()),
                ..compare::CompareParams::default()
            };
            compare::page(State(st), Ok(Query(p)))
                .await
                .unwrap_or_else(|_| panic!("compare page"))
                .body
                .into_string()
                .len()
        }
    })
    .await;
    eprintln!("tool page of search_docs (24 h): best {tool_best:.0} ms (median {tool_median:.0}); compare page of update_ticket 1.4.2 -> 1.5.0: best {compare_best:.0} ms (median {compare_median:.0})");
    println!(
        "trace_spans={TRACE_SPANS} trace_page_ms={trace_best:.1} trace_page_median_ms={trace_median:.1} \
         trace_html_bytes={html_bytes} table_spans={total} search_page_ms={all_best:.0} \
         search_page_median_ms={all_median:.0} search_parse_ms={parse_best:.0} search_parse_median_ms={parse_median:.0} \
         tool_page_ms={tool_best:.0} tool_page_median_ms={tool_median:.0} compare_page_ms={compare_best:.0} \
         compare_page_median_ms={compare_median:.0} target_ms=300"
    );
}
