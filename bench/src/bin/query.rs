//! `bench/query`: the six searches users run most in toolspan's query engine and in DuckDB, on the
//! same Parquet files.
//!
//! The table is built through the normal write path: the demo fleet's traffic (seed 7, no
//! payloads) spread over the last 24 hours, each request through the ingest pipeline, and
//! one `SpanTable::commit` per 100,000 rows (the writer's flush). DuckDB (from PyPI, run by
//! `$TOOLSPAN_PYTHON`) reads the table's Parquet files with hive partitioning (tool, stage,
//! date). Every query runs once to warm caches, then five times; the best time counts. Each
//! engine answers in a process of its own that only queries, as `toolspan query` does next to
//! the ingest workers (this process, which wrote the table, re-runs itself with `--measure`;
//! DuckDB runs in Python).
//!
//! The queries run twice: on the table as flushed (one file per partition and commit), then
//! after one round of the maintenance a running ingest worker does every 10 minutes
//! (`toolspan_store::maintenance::periodic::run_once` with its defaults: the closed day merged into
//! ~128 MiB files, the open day's crowded partitions into ~32 MiB files), with unreferenced
//! files vacuumed at once so that DuckDB's glob reads exactly the live files. The last line's
//! `qN_ms`/`qN_ratio` are the latter, `qN_flushed_*` the former.
//!
//! Usage: query [--spans N] [--huge] [--dir DIR] [--reuse] [--table s3://BUCKET/PREFIX]
//!   --spans N  spans to write (default 10,000,000); --huge writes 100,000,000
//!   --dir DIR  where the table lives (default $TMPDIR/toolspan-bench-query)
//!   --reuse    query the table already in DIR instead of rebuilding it
//!   --table URI  also copy the maintained table to this object-store location (configured by
//!              the AWS_* environment, as toolspan is) and time the queries there next to the
//!              same queries on the local table, in the same run (bench/query starts an S3
//!              server behind a latency proxy for it)
//!   --measure TABLE  (internal) run the queries read from stdin on TABLE, print JSON timings
//! Last line: key=value pairs, with `query_rss_flushed_mib` and `query_rss_mib`: the peak RSS of
//! toolspan's query process while it answered the six queries in each table state.

/// The allocator `toolspan` runs with (src/main.rs), so the engine is timed as users run it.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use toolspan_gen::{Fleet, FleetConfig};
use toolspan_pipeline::Pipeline;
use toolspan_query::{Engine, EngineOptions};
use toolspan_store::maintenance::periodic::MaintenanceConfig;
use toolspan_store::SpanTable;

const FLUSH_ROWS: usize = 100_000;
const RUNS: usize = 5;

const USAGE: &str = "usage: query [--spans N | --huge] [--dir DIR] [--reuse] [--table URI]\n  \
     --spans N    spans to write (default 10,000,000); --huge writes 100,000,000\n  \
     --dir DIR    where the table lives (default $TMPDIR/toolspan-bench-query)\n  \
     --reuse      query the table already in DIR instead of rebuilding it\n  \
     --table URI  also time the maintained table copied to this object-store location";

struct Args {
    spans: usize,
    dir: std::path::PathBuf,
    reuse: bool,
    measure: Option<String>,
    remote: Option<String>,
}

fn args() -> Args {
    let mut a = Args {
        spans: 10_000_000,
        dir: std::env::temp_dir().join("toolspan-bench-query"),
        reuse: false,
        measure: None,
        remote: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--spans" => a.spans = it.next().and_then(|v| v.parse().ok()).expect("--spans N"),
            "--huge" => a.spans = 100_000_000,
            "--dir" => a.dir = it.next().expect("--dir DIR").into(),
            "--reuse" => a.reuse = true,
            "--measure" => a.measure = Some(it.next().expect("--measure TABLE")),
            "--table" => a.remote = Some(it.next().expect("--table URI")),
            "--help" | "-h" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => {
                eprintln!("query: unknown argument {other}\n{USAGE}");
                std::process::exit(2);
            }
        }
    }
    a
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Writes `spans` spans over the 24 hours before `end_ns`, committing every FLUSH_ROWS rows.
async fn build(table: &SpanTable, spans: usize, end_ns: u64) -> usize {
    let mut fleet = Fleet::new(FleetConfig {
        seed: 7,
        payloads: false,
        failure_scale: 1.0,
    });
    let pipeline = Pipeline::builtin();
    // Each request of 100 agent runs starts where its share of the day begins, so the spans
    // cover the 24 hours before `end_ns` evenly whatever the spans per run.
    let day = 86_400_000_000_000u128;
    let start = end_ns - day as u64;
    let (mut written, mut buffered, mut batches) = (0usize, 0usize, Vec::new());
    let t0 = Instant::now();
    let mut last = 1_500usize;
    while written + buffered < spans {
        let at = start + (day * (written + buffered) as u128 / spans as u128) as u64;
        let spread = (day * last as u128 / spans as u128).max(1) as u64;
        let req = fleet.request(100, at, spread);
        let out = pipeline
            .process(&req)
            .expect("fleet traffic goes through the pipeline");
        last = out.batch.num_rows();
        buffered += last;
        batches.push(out.batch);
        if buffered >= FLUSH_ROWS {
            table
                .commit(std::mem::take(&mut batches), &[])
                .await
                .expect("commit");
            written += buffered;
            buffered = 0;
            if written % 1_000_000 < FLUSH_ROWS {
                eprintln!(
                    "  {written} spans committed ({:.0} spans/s)",
                    written as f64 / t0.elapsed().as_secs_f64()
                );
            }
        }
    }
    if buffered > 0 {
        table.commit(batches, &[]).await.expect("commit");
        written += buffered;
    }
    eprintln!(
        "table: {written} spans in {:.0} s",
        t0.elapsed().as_secs_f64()
    );
    written
}

fn ts(ns: u64) -> String {
    let secs = (ns / 1_000_000_000) as i64;
    chrono_like(secs, (ns % 1_000_000_000) as u32)
}

/// RFC 3339 UTC with microseconds, without a date library.
fn chrono_like(secs: i64, nanos: u32) -> String {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60,
        nanos / 1_000
    )
}

/// The six queries, for toolspan and for DuckDB (same semantics; DuckDB has no `calls` view,
/// so Q6 inlines the view's definition).
fn queries(
    hour_ago: &str,
    day_ago: &str,
    trace_id: &str,
    reference: &str,
) -> Vec<(&'static str, String, String)> {
    let calls_body = toolspan_query::views::CALLS_SQL
        .trim()
        .trim_start_matches("CREATE VIEW calls AS")
        .to_string();
    let day_ts = |engine_duck: bool| {
        if engine_duck {
            format!("TIMESTAMPTZ '{day_ago}'")
        } else {
            format!("'{day_ago}'")
        }
    };
    let hour_ts = |engine_duck: bool| {
        if engine_duck {
            format!("TIMESTAMPTZ '{hour_ago}'")
        } else {
            format!("'{hour_ago}'")
        }
    };
    let q = |duck: bool| -> Vec<(&'static str, String)> {
        vec![
            (
                "q1",
                format!(
                    "SELECT trace_id, span_id, start_time, error_code, error_message FROM spans \
                 WHERE tool = 'search_docs' AND error_type = 'PARSE' AND start_time >= {} \
                 ORDER BY start_time DESC LIMIT 100",
                    hour_ts(duck)
                ),
            ),
            (
                "q2",
                format!(
                    "SELECT tool, stage, count(*) AS spans, \
                 sum(CASE WHEN status = 'error' THEN 1 ELSE 0 END) AS failures, \
                 avg(CASE WHEN status = 'error' THEN 1.0 ELSE 0.0 END) AS rate \
                 FROM spans WHERE start_time >= {} GROUP BY tool, stage ORDER BY tool, stage",
                    day_ts(duck)
                ),
            ),
            (
                "q3",
                format!("SELECT * FROM spans WHERE trace_id = '{trace_id}' ORDER BY start_time"),
            ),
            (
                "q4",
                format!("SELECT * FROM spans WHERE reference = '{reference}'"),
            ),
            (
                "q5",
                format!(
                    "SELECT tool, error_code, n FROM (SELECT tool, error_code, count(*) AS n, \
                 row_number() OVER (PARTITION BY tool ORDER BY count(*) DESC, error_code) AS r \
                 FROM spans WHERE status = 'error' AND error_code IS NOT NULL AND start_time >= {} \
                 GROUP BY tool, error_code) t WHERE r <= 10 ORDER BY tool, n DESC",
                    day_ts(duck)
                ),
            ),
            (
                "q6",
                if duck {
                    format!(
                        "WITH calls AS ({calls_body}) SELECT count(*) AS n FROM calls \
                         WHERE recovered_after_retry AND start_time >= {}",
                        day_ts(true)
                    )
                } else {
                    format!("SELECT count(*) AS n FROM calls WHERE recovered_after_retry AND start_time >= {}", day_ts(false))
                },
            ),
        ]
    };
    q(false)
        .into_iter()
        .zip(q(true))
        .map(|((name, ts_sql), (_, duck_sql))| (name, ts_sql, duck_sql))
        .collect()
}

const DUCKDB_SCRIPT: &str = r#"
import json, sys, time
import duckdb
root, runs = sys.argv[1], int(sys.argv[2])
queries = json.load(sys.stdin)
con = duckdb.connect()
# its progress bar (queries over 2 s) writes to stdout, where the timings go
con.execute("SET enable_progress_bar = false")
con.execute(f"CREATE VIEW spans AS SELECT * FROM read_parquet('{root}/tool=*/**/*.parquet', hive_partitioning = true)")
out = {}
for name, sql in queries:
    rows = len(con.execute(sql).fetchall())
    best = None
    for _ in range(runs):
        t = time.perf_counter()
        con.execute(sql).fetchall()
        ms = (time.perf_counter() - t) * 1000
        best = ms if best is None else min(best, ms)
    out[name] = {"ms": best, "rows": rows}
print(json.dumps(out))
"#;

fn engine_options() -> EngineOptions {
    EngineOptions {
        query_timeout: Duration::from_secs(600),
        memory_limit: Some(8 << 30),
        // `TOOLSPAN_BENCH_DATA_CACHE=off`: remote tables without the data cache.
        data_cache_bytes: match std::env::var("TOOLSPAN_BENCH_DATA_CACHE").as_deref() {
            Ok("off") => 0,
            _ => EngineOptions::default().data_cache_bytes,
        },
        ..EngineOptions::default()
    }
}

/// `--measure TABLE`: each query of stdin (`[[name, sql], ...]`) warm, best of RUNS, in a
/// fresh engine on TABLE; prints `{name: {"ms": …, "rows": …}}`.
async fn measure_child(table: &str) {
    let mut input = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut input).expect("queries on stdin");
    let queries: Vec<(String, String)> = serde_json::from_str(&input).expect("queries json");
    let engine = Engine::open_with(table, engine_options())
        .await
        .expect("engine");
    let mut out = serde_json::Map::new();
    for (name, sql) in queries {
        let t = Instant::now();
        let rows = engine
            .query(&sql)
            .await
            .unwrap_or_else(|e| panic!("{name}: {}", e.envelope()))
            .num_rows();
        let first = t.elapsed().as_secs_f64() * 1e3;
        let mut best = f64::MAX;
        for _ in 0..RUNS {
            let t = Instant::now();
            engine.query(&sql).await.expect("query");
            best = best.min(t.elapsed().as_secs_f64() * 1e3);
        }
        out.insert(
            name,
            serde_json::json!({"ms": best, "first_ms": first, "rows": rows}),
        );
    }
    // The query process's peak resident memory over all the queries (Linux; 0 elsewhere).
    out.insert(PEAK_RSS_KEY.into(), serde_json::json!(peak_rss_mib()));
    println!("{}", serde_json::Value::Object(out));
}

/// The key of `--measure`'s answer that holds its peak RSS (not a query name).
const PEAK_RSS_KEY: &str = "_peak_rss_mib";

/// This process's peak resident set size in MiB (`VmHWM` of /proc/self/status), 0 if unknown.
fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// Runs `program args` with `queries` as JSON on stdin; returns its JSON answer.
fn run_measuring(
    program: &std::path::Path,
    args: &[&str],
    queries: &[(&str, &str)],
    env: &[(&str, &str)],
) -> serde_json::Value {
    let mut child = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()));
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin
            .write_all(serde_json::to_string(queries).expect("json").as_bytes())
            .expect("write queries");
    }
    let res = child.wait_with_output().expect("measuring output");
    assert!(res.status.success(), "{} failed", program.display());
    serde_json::from_slice(&res.stdout).expect("timings json")
}

#[tokio::main]
async fn main() {
    // Logs of the engine under test, off unless asked for (`TOOLSPAN_BENCH_LOG=info`), on stderr
    // so the figures on stdout stay parseable.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env(
            "TOOLSPAN_BENCH_LOG",
        ))
        .with_writer(std::io::stderr)
        .init();
    let a = args();
    if let Some(table) = &a.measure {
        measure_child(table).await;
        return;
    }
    let location = a.dir.join("spans");
    let location_str = location.to_str().expect("utf-8 path").to_string();
    let end = now_ns();
    if !a.reuse {
        let _ = std::fs::remove_dir_all(&location);
        std::fs::create_dir_all(&a.dir).expect("bench directory");
    }
    let table = SpanTable::open_or_create(&location_str)
        .await
        .expect("table");
    let spans = if a.reuse {
        0
    } else {
        build(&table, a.spans, end).await
    };

    let handle = table.clone();
    let engine = Engine::with_table(table, engine_options())
        .await
        .expect("engine");
    let pick = |sql: &'static str| {
        let engine = &engine;
        async move {
            let r = engine.query(sql).await.expect("pick query");
            let v = toolspan_query::render(&r.batches, toolspan_query::Format::Csv).expect("csv");
            v.lines().nth(1).unwrap_or_default().to_string()
        }
    };
    let total = pick("SELECT count(*) FROM spans").await;
    let trace_id =
        pick("SELECT trace_id FROM calls WHERE attempts > 1 ORDER BY trace_id LIMIT 1").await;
    let reference =
        pick("SELECT reference FROM spans WHERE reference IS NOT NULL ORDER BY reference LIMIT 1")
            .await;
    let hour_ago = ts(end - 3_600_000_000_000);
    let day_ago = ts(end - 86_400_000_000_000);
    let qs = queries(&hour_ago, &day_ago, &trace_id, &reference);
    eprintln!("table has {total} spans; trace {trace_id}, reference {reference}");

    let flushed_files = handle.file_count().await.expect("files");
    eprintln!("as flushed: {flushed_files} data files");
    let (flushed, flushed_rss) = measure(&engine, &qs, &location_str).await;

    // What a running ingest worker does every 10 minutes (its default maintenance): merge the
    // closed day's files and the open day's crowded partitions. Unreferenced files are vacuumed
    // at once (not after the default hour) so that DuckDB's glob reads only the live ones.
    let t = Instant::now();
    let cfg = MaintenanceConfig {
        vacuum_retention: Duration::ZERO,
        ..MaintenanceConfig::default()
    };
    let today = chrono::DateTime::from_timestamp_nanos(end as i64).date_naive();
    let round = toolspan_store::maintenance::periodic::run_once(&handle, &cfg, today)
        .await
        .expect("maintenance round");
    engine.refresh().await.expect("refresh");
    let files = handle.file_count().await.expect("files");
    eprintln!(
        "maintenance round in {:.1} s: {} files merged, {} vacuumed; {files} data files",
        t.elapsed().as_secs_f64(),
        round.files_compacted,
        round.files_vacuumed
    );
    let (maintained, rss) = measure(&engine, &qs, &location_str).await;

    println!("spans: {total}");
    let mut kv = vec![
        format!("spans={total}"),
        format!("written={spans}"),
        format!("files_flushed={flushed_files}"),
        format!("files={files}"),
        format!("query_rss_flushed_mib={flushed_rss:.0}"),
        format!("query_rss_mib={rss:.0}"),
    ];
    for (title, results, suffix) in [
        (
            format!("as flushed ({flushed_files} files)"),
            &flushed,
            "_flushed",
        ),
        (
            format!("after one ingest maintenance round ({files} files)"),
            &maintained,
            "",
        ),
    ] {
        println!("{title}");
        println!(
            "{:<4} {:>12} {:>12} {:>8} {:>10} {:>10}",
            "", "toolspan ms", "duckdb ms", "ratio", "rows", "duck rows"
        );
        for r in results {
            let ratio = r.ms / r.duck_ms;
            println!(
                "{:<4} {:>12.1} {:>12.1} {ratio:>8.2} {:>10} {:>10}",
                r.name, r.ms, r.duck_ms, r.rows, r.duck_rows
            );
            kv.push(format!(
                "{n}{suffix}_ms={:.1} {n}{suffix}_duckdb_ms={:.1} {n}{suffix}_ratio={ratio:.2}",
                r.ms,
                r.duck_ms,
                n = r.name
            ));
        }
    }
    if let Some(remote) = &a.remote {
        let t = Instant::now();
        let (files, bytes) = upload(&location, remote).await;
        eprintln!(
            "copied {files} files ({:.0} MiB) to {remote} in {:.0} s",
            bytes as f64 / (1 << 20) as f64,
            t.elapsed().as_secs_f64()
        );
        let ours: Vec<(&str, &str)> = qs.iter().map(|(n, s, _)| (*n, s.as_str())).collect();
        let exe = std::env::current_exe().expect("this program");
        let table = format!("{remote}/spans");
        let on_remote = run_measuring(&exe, &["--measure", &table], &ours, &[]);
        let uncached = run_measuring(
            &exe,
            &["--measure", &table],
            &ours,
            &[("TOOLSPAN_BENCH_DATA_CACHE", "off")],
        );
        let on_local = run_measuring(&exe, &["--measure", &location_str], &ours, &[]);
        let latency = std::env::var("TOOLSPAN_BENCH_LATENCY_MS").unwrap_or_else(|_| "?".into());
        println!("object store ({latency} ms per request) vs local disk, same {files}-file table");
        println!("(first: the query's first run in a fresh process, nothing cached; warm: best of {RUNS} after it)");
        println!(
            "{:<4} {:>14} {:>14} {:>17} {:>12} {:>8} {:>10}",
            "", "remote first", "remote warm", "warm, no cache", "local warm", "ratio", "rows"
        );
        for (name, _, _) in &qs {
            let r = on_remote[*name]["ms"].as_f64().unwrap_or(f64::NAN);
            let first = on_remote[*name]["first_ms"].as_f64().unwrap_or(f64::NAN);
            let nc = uncached[*name]["ms"].as_f64().unwrap_or(f64::NAN);
            let l = on_local[*name]["ms"].as_f64().unwrap_or(f64::NAN);
            let rows = on_remote[*name]["rows"].as_u64().unwrap_or(0);
            assert_eq!(
                Some(rows),
                on_local[*name]["rows"].as_u64(),
                "{name}: same rows on both"
            );
            assert_eq!(
                Some(rows),
                uncached[*name]["rows"].as_u64(),
                "{name}: same rows with and without the data cache"
            );
            println!(
                "{name:<4} {first:>14.1} {r:>14.1} {nc:>17.1} {l:>12.1} {:>8.2} {rows:>10}",
                r / l
            );
            kv.push(format!(
                "{name}_remote_ms={r:.1} {name}_remote_first_ms={first:.1} \
                 {name}_remote_uncached_ms={nc:.1} {name}_local_ms={l:.1} {name}_remote_ratio={:.2}",
                r / l
            ));
        }
    }
    println!("{}", kv.join(" "));
}

/// Copies every file of the local table directory `local` to `<remote>/spans`, 16 at a time.
async fn upload(local: &std::path::Path, remote: &str) -> (usize, u64) {
    use deltalake::logstore::object_store::{ObjectStore, PutOptions};
    toolspan_store::storage::register_handlers();
    let url = url::Url::parse(&format!("{remote}/spans")).expect("--table URI");
    let store = deltalake::DeltaTableBuilder::from_url(url)
        .expect("table URI")
        .build_storage()
        .expect("object store")
        .object_store(None);
    let mut files = Vec::new();
    let mut stack = vec![local.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).expect("table directory") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                stack.push(p);
            } else {
                files.push(p);
            }
        }
    }
    let n = files.len();
    let mut bytes = 0u64;
    let mut tasks = tokio::task::JoinSet::new();
    for p in files {
        while tasks.len() >= 16 {
            bytes += tasks.join_next().await.expect("task").expect("upload");
        }
        let rel = p
            .strip_prefix(local)
            .expect("inside")
            .to_string_lossy()
            .into_owned();
        let store = store.clone();
        tasks.spawn(async move {
            let data = tokio::fs::read(&p).await.expect("read file");
            let len = data.len() as u64;
            store
                .put_opts(
                    &deltalake::Path::from(rel.as_str()),
                    data.into(),
                    PutOptions::default(),
                )
                .await
                .expect("put");
            len
        });
    }
    while let Some(r) = tasks.join_next().await {
        bytes += r.expect("upload");
    }
    (n, bytes)
}

struct Measured {
    name: &'static str,
    ms: f64,
    rows: usize,
    duck_ms: f64,
    duck_rows: u64,
}

/// Each query in toolspan (warm, best of RUNS, in a fresh query-only process) and in DuckDB
/// over the same files.
async fn measure(
    engine: &Engine,
    qs: &[(&'static str, String, String)],
    location: &str,
) -> (Vec<Measured>, f64) {
    // The parent's engine checks that every query runs before anything is timed.
    for (name, sql, _) in qs {
        engine
            .query(sql)
            .await
            .unwrap_or_else(|e| panic!("{name}: {}", e.envelope()));
    }
    let ours: Vec<(&str, &str)> = qs.iter().map(|(n, s, _)| (*n, s.as_str())).collect();
    let exe = std::env::current_exe().expect("this program");
    let toolspan = run_measuring(&exe, &["--measure", location], &ours, &[]);
    eprintln!(
        "toolspan's query process: peak RSS {:.0} MiB",
        toolspan[PEAK_RSS_KEY].as_f64().unwrap_or(0.0)
    );

    let python = std::env::var("TOOLSPAN_PYTHON").unwrap_or_else(|_| "python3".into());
    let duck_input: Vec<(&str, &str)> = qs.iter().map(|(n, _, d)| (*n, d.as_str())).collect();
    let duck = run_measuring(
        std::path::Path::new(&python),
        &["-c", DUCKDB_SCRIPT, location, &RUNS.to_string()],
        &duck_input,
        &[],
    );
    let mut out = Vec::new();
    for (name, _, _) in qs {
        let m = Measured {
            name,
            ms: toolspan[*name]["ms"].as_f64().unwrap_or(f64::NAN),
            rows: toolspan[*name]["rows"].as_u64().unwrap_or(0) as usize,
            duck_ms: duck[*name]["ms"].as_f64().unwrap_or(f64::NAN),
            duck_rows: duck[*name]["rows"].as_u64().unwrap_or(0),
        };
        eprintln!(
            "toolspan {name}: {:.1} ms ({} rows); duckdb {:.1} ms ({} rows)",
            m.ms, m.rows, m.duck_ms, m.duck_rows
        );
        out.push(m);
    }
    (out, toolspan[PEAK_RSS_KEY].as_f64().unwrap_or(0.0))
}
