//! bench/explain: profiling aid for bench/query. Runs one SQL statement against a spans table
//! through toolspan's engine N times (warm) and prints each time, then DataFusion's
//! `EXPLAIN ANALYZE` of it (per-operator time and rows).
//! Usage: [COMPACT=1] [SETS='datafusion.k=v;...'] explain TABLE_DIR "SQL" [RUNS] (COMPACT: Delta-optimize every day first)

/// The allocator `toolspan` runs with (src/main.rs), so the engine is timed as users run it.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::time::Instant;

use toolspan_query::{Engine, EngineOptions};

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
    let mut args = std::env::args().skip(1);
    let (Some(dir), Some(sql)) = (args.next(), args.next()) else {
        eprintln!("usage: explain TABLE_DIR \"SQL\" [RUNS]");
        std::process::exit(2);
    };
    let runs: usize = args.next().and_then(|r| r.parse().ok()).unwrap_or(3);
    if std::env::var_os("COMPACT").is_some() {
        let table = toolspan_store::SpanTable::open_or_create(&dir)
            .await
            .expect("open");
        let t = Instant::now();
        let r = table
            .compact("2999-01-01", 128 << 20)
            .await
            .expect("compact");
        println!("compacted in {:.1} s: {r:?}", t.elapsed().as_secs_f64());
    }
    let engine = Engine::open_with(&dir, EngineOptions::default())
        .await
        .expect("open");
    // SETS="key=value;key=value": DataFusion settings to try (set on the raw context).
    for kv in std::env::var("SETS")
        .unwrap_or_default()
        .split(';')
        .filter(|s| !s.is_empty())
    {
        let (k, v) = kv.split_once('=').expect("SETS wants key=value");
        engine
            .context()
            .sql(&format!("SET {k} = {v}"))
            .await
            .expect("set")
            .collect()
            .await
            .expect("set");
    }
    for i in 0..runs {
        let t = Instant::now();
        let r = engine.query(&sql).await.expect("query");
        println!(
            "run {i}: {:.1} ms, {} rows",
            t.elapsed().as_secs_f64() * 1e3,
            r.num_rows()
        );
    }
    let df = engine
        .context()
        .sql(&format!("EXPLAIN ANALYZE {sql}"))
        .await
        .expect("explain");
    let batches = df.collect().await.expect("collect");
    println!(
        "{}",
        arrow::util::pretty::pretty_format_batches(&batches).expect("format")
    );
}
