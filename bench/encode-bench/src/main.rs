//! `bench/encode`: decode + classify + redact + Arrow + Parquet on a fixed synthetic corpus.
//!
//! Single-threaded, so spans/s is per core. The corpus is the demo fleet's traffic without
//! payloads (seed 7), encoded as OTLP protobuf requests of 100 agent runs each, as an SDK's
//! batch exporter would send them. Parquet is written as the store writes it: one file per
//! (tool, stage) partition, partition columns left out of the file.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{AsArray, RecordBatch, UInt32Array};
use arrow::compute::{concat_batches, take_record_batch};
use arrow::datatypes::TimestampMicrosecondType;
use parquet::arrow::ArrowWriter;
use prost::Message;
use toolspan_gen::{Fleet, FleetConfig};
use toolspan_pipeline::{Encoding, Pipeline};
use toolspan_schema::parquet_props;

mod lock;

/// The allocator of the `toolspan` binary (src/main.rs), so that the pipeline is timed as
/// `toolspan ingest` and `toolspan serve` run it (glibc's malloc behaves differently with the
/// pipeline's many short-lived allocations: bench/RESULTS.md, bench/encode, session 16).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    // Logs of the engine under test, off unless asked for (`TOOLSPAN_BENCH_LOG=info`), on stderr
    // so the figures on stdout stay parseable.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env(
            "TOOLSPAN_BENCH_LOG",
        ))
        .with_writer(std::io::stderr)
        .init();
    let target_spans: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let corpus = corpus(target_spans);

    // `TOOLSPAN_BENCH_MEMORY=off`: without the trace memory (the split-trace classification),
    // to read its cost.
    let memory_off = std::env::var("TOOLSPAN_BENCH_MEMORY").is_ok_and(|v| v == "off");
    let pipeline = |shapes: bool| {
        let p = Pipeline::builtin().with_shapes(shapes);
        if memory_off {
            p.with_memory(toolspan_pipeline::MemoryConfig::off())
        } else {
            p
        }
    };
    // `TOOLSPAN_BENCH_SHAPES=off`: without the payload shape columns (left null), to read
    // their cost; `ab`: runs with and without them alternately in this one process
    // (`TOOLSPAN_BENCH_ROUNDS` of each, default 3) and prints both figures and their ratio.
    // `TOOLSPAN_BENCH_LOCK=ab`: the receiver's processing from one and two threads through
    // its lock, whole pass under it against classification only (see `lock`).
    if std::env::var("TOOLSPAN_BENCH_LOCK").is_ok_and(|v| v == "ab") {
        lock::ab(|| pipeline(true), &corpus, rounds());
        return;
    }
    match std::env::var("TOOLSPAN_BENCH_SHAPES").as_deref() {
        Ok("ab") => {
            let rounds = rounds();
            let (mut on, mut off) = (Vec::new(), Vec::new());
            for round in 0..rounds {
                // Alternating which goes first, so that neither always runs on a warmer heap.
                let order = if round % 2 == 0 {
                    [true, false]
                } else {
                    [false, true]
                };
                for shapes in order {
                    let r = run(&pipeline(shapes), &corpus);
                    println!(
                        "round={} shapes={} {}",
                        round + 1,
                        if shapes { "on" } else { "off" },
                        r.figures()
                    );
                    if shapes { &mut on } else { &mut off }.push(r);
                }
            }
            let (on_sps, off_sps) = (median(&on, Run::sps), median(&off, Run::sps));
            let (on_bps, off_bps) = (median(&on, Run::bps), median(&off, Run::bps));
            println!(
                "shapes on vs off, medians of {rounds} runs each: {on_sps:.0} vs {off_sps:.0} spans per CPU-second ({:+.1} %), {on_bps:.1} vs {off_bps:.1} bytes/span",
                (on_sps / off_sps - 1.0) * 100.0
            );
            println!(
                "spans_per_s_per_core={on_sps:.0} spans_per_s_per_core_shapes_off={off_sps:.0} on_off_ratio={:.4} bytes_per_span={on_bps:.1} bytes_per_span_shapes_off={off_bps:.1} process_cpu_s={:.3} process_cpu_s_shapes_off={:.3} parquet_cpu_s={:.3} parquet_cpu_s_shapes_off={:.3} rounds={rounds}",
                on_sps / off_sps,
                median(&on, |r| r.c_process.as_secs_f64()),
                median(&off, |r| r.c_process.as_secs_f64()),
                median(&on, |r| r.c_parquet.as_secs_f64()),
                median(&off, |r| r.c_parquet.as_secs_f64()),
            );
        }
        v => {
            let r = run(&pipeline(v != Ok("off")), &corpus);
            r.sizes.report(r.rows);
            r.print();
        }
    }
}

/// The requests to process: the demo fleet's traffic (seed 7) encoded as OTLP protobuf, or
/// the requests of `TOOLSPAN_BENCH_CORPUS`.
fn corpus(target_spans: usize) -> Vec<Vec<u8>> {
    // `TOOLSPAN_BENCH_PAYLOADS=on`: with the tools' arguments and answers (what the shape
    // columns read); by default without, as the corpus has always been.
    let payloads = std::env::var("TOOLSPAN_BENCH_PAYLOADS").is_ok_and(|v| v == "on");
    let mut fleet = Fleet::new(FleetConfig {
        seed: 7,
        payloads,
        failure_scale: 1.0,
    });
    // `TOOLSPAN_BENCH_TRACES=N`: agent runs per request (default 100, an SDK's batch export);
    // 1 is what Kafka ingest sees (one trace per message, keyed by trace id).
    let traces: usize = std::env::var("TOOLSPAN_BENCH_TRACES")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(100);
    let base = 1_764_410_400_000_000_000u64;
    let mut corpus = Vec::new();
    let mut spans = 0usize;
    let mut k = 0u64;
    while spans < target_spans {
        let spread = 10_000_000 * traces as u64;
        let req = fleet.request(traces, base + k * spread, spread);
        spans += req
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .map(|s| s.spans.len())
            .sum::<usize>();
        corpus.push(req.encode_to_vec());
        k += 1;
    }
    let otlp_bytes: usize = corpus.iter().map(Vec::len).sum();
    eprintln!(
        "corpus: {spans} spans in {} requests, {:.1} MB of OTLP protobuf",
        corpus.len(),
        otlp_bytes as f64 / 1e6
    );
    // `TOOLSPAN_BENCH_CORPUS=FILE`: the corpus is read from FILE when it exists, else written
    // there, so that two builds (an A/B across commits) process the very same requests. (Still
    // generated first, as it always was: the heap the timed part starts with stays the same.)
    if let Ok(path) = std::env::var("TOOLSPAN_BENCH_CORPUS") {
        match std::fs::read(&path) {
            Ok(bytes) => {
                corpus.clear();
                let mut rest = &bytes[..];
                while rest.len() >= 4 {
                    let n = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
                    corpus.push(rest[4..4 + n].to_vec());
                    rest = &rest[4 + n..];
                }
                eprintln!("corpus read from {path}: {} requests", corpus.len());
            }
            Err(_) => {
                let mut out = Vec::new();
                for r in &corpus {
                    out.extend_from_slice(&(r.len() as u32).to_le_bytes());
                    out.extend_from_slice(r);
                }
                std::fs::write(&path, out).expect("write the corpus");
            }
        }
    }
    corpus
}

/// What one timed pass over the corpus measured.
struct Run {
    rows: usize,
    c_process: Duration,
    c_parquet: Duration,
    wall: Duration,
    sizes: Sizes,
}

impl Run {
    fn sps(&self) -> f64 {
        rate(self.rows, self.c_process + self.c_parquet)
    }

    fn bps(&self) -> f64 {
        self.sizes.bytes as f64 / self.rows as f64
    }

    /// The figures as key=value pairs.
    fn figures(&self) -> String {
        format!(
            "spans_per_s_per_core={:.0} bytes_per_span={:.1} spans={} process_cpu_s={:.3} parquet_cpu_s={:.3} wall_spans_per_s={:.0}",
            self.sps(),
            self.bps(),
            self.rows,
            self.c_process.as_secs_f64(),
            self.c_parquet.as_secs_f64(),
            rate(self.rows, self.wall)
        )
    }

    fn print(&self) {
        let (rows, files) = (self.rows, self.sizes.files);
        println!("spans:                      {rows}");
        println!(
            "decode+classify+redact+arrow: {:.2} s CPU ({:.0} spans/s)",
            self.c_process.as_secs_f64(),
            rate(rows, self.c_process)
        );
        println!(
            "parquet ({files} files, flushes of 100k rows): {:.2} s CPU ({:.0} spans/s)",
            self.c_parquet.as_secs_f64(),
            rate(rows, self.c_parquet)
        );
        println!("end to end, one core:       {:.0} spans per CPU-second ({:.0} spans/s wall clock)   (target >= 300000; an OpenTelemetry Collector does ~12000)", self.sps(), rate(rows, self.wall));
        println!(
            "parquet size:               {} bytes = {:.1} bytes/span   (target <= 60; Tempo's Parquet ~58)",
            self.sizes.bytes,
            self.bps()
        );
        println!("{}", self.figures());
    }
}

/// The median of `f` over `runs`.
fn median(runs: &[Run], f: impl Fn(&Run) -> f64) -> f64 {
    let mut v: Vec<f64> = runs.iter().map(f).collect();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// One timed pass of `pipeline` over `corpus`.
fn run(pipeline: &Pipeline, corpus: &[Vec<u8>]) -> Run {
    // Warm-up pass (page faults, lazy regexes), not timed.
    for body in corpus.iter().take(20) {
        let _ = pipeline.process_bytes(body, Encoding::Protobuf);
    }

    // Streaming, as the writer works: process requests, and every FLUSH_ROWS rows (the
    // store writer's default batch) write the buffered rows as partition files.
    const FLUSH_ROWS: usize = 100_000;
    let t0 = Instant::now();
    let (mut c_process, mut c_parquet) = (Duration::ZERO, Duration::ZERO);
    let mut sizes = Sizes::default();
    let mut batches = Vec::new();
    let (mut buffered, mut rows) = (0usize, 0usize);
    for (i, body) in corpus.iter().enumerate() {
        let c = thread_cpu();
        let out = pipeline
            .process_bytes(body, Encoding::Protobuf)
            .expect("corpus decodes");
        c_process += thread_cpu() - c;
        buffered += out.batch.num_rows();
        rows += out.batch.num_rows();
        batches.push(out.batch);
        if buffered >= FLUSH_ROWS || i + 1 == corpus.len() {
            let c = thread_cpu();
            let files = write_partitioned(&batches);
            c_parquet += thread_cpu() - c;
            files.into_iter().for_each(|f| sizes.add(f));
            batches.clear();
            buffered = 0;
        }
        if i % 200 == 199 {
            eprintln!(
                "  processed {} of {} requests ({:.0} spans/s wall clock)",
                i + 1,
                corpus.len(),
                rate(rows, t0.elapsed())
            );
        }
    }
    Run {
        rows,
        c_process,
        c_parquet,
        wall: t0.elapsed(),
        sizes,
    }
}

/// CPU time this thread has used: "per core" means per CPU-second, whatever else the
/// machine is doing (wall-clock rates are printed too).
fn thread_cpu() -> Duration {
    cpu_time::ThreadTime::now().as_duration()
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64().max(1e-9)
}

/// Sizes of the written files.
#[derive(Default)]
struct Sizes {
    bytes: usize,
    files: usize,
    by_column: BTreeMap<String, i64>,
    bloom: i64,
}

impl Sizes {
    /// Adds a written file: its size, and its column chunks' and bloom filters' sizes from
    /// the footer (read back outside the timed part).
    fn add(&mut self, file: Vec<u8>) {
        use parquet::file::reader::FileReader;
        self.bytes += file.len();
        self.files += 1;
        let reader = parquet::file::reader::SerializedFileReader::new(bytes::Bytes::from(file))
            .expect("read back");
        for rg in reader.metadata().row_groups() {
            for c in rg.columns() {
                *self.by_column.entry(c.column_path().string()).or_default() += c.compressed_size();
                self.bloom += i64::from(c.bloom_filter_length().unwrap_or(0));
            }
        }
    }

    fn report(&self, rows: usize) {
        let rows = rows as f64;
        let mut cols: Vec<_> = self.by_column.iter().collect();
        cols.sort_by_key(|(_, b)| -**b);
        eprintln!("bytes per span by column (compressed pages):");
        for (name, b) in cols.iter() {
            eprintln!("  {name:<22} {:>6.2}", **b as f64 / rows);
        }
        eprintln!("  bloom filters          {:>6.2}", self.bloom as f64 / rows);
    }
}

/// Writes one Parquet file per (tool, stage) into memory, rows ordered within each file as
/// the store writes them (failed spans first, each part by start time); returns the files.
///
/// One sort of (partition, not failed, start time, row) keys, one take of the concatenated
/// rows, then a slice per partition.
fn write_partitioned(batches: &[RecordBatch]) -> Vec<Vec<u8>> {
    let schema = toolspan_schema::spans_schema();
    let keep: Vec<usize> = schema
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| !toolspan_schema::columns::PARTITION_COLUMNS.contains(&f.name().as_str()))
        .map(|(i, _)| i)
        .collect();
    let file_schema = Arc::new(schema.project(&keep).expect("projection"));
    let all = concat_batches(&schema, batches).expect("same schema");
    let tool = all.column(index_of(&schema, "tool")).as_string::<i32>();
    let stage = all.column(index_of(&schema, "stage")).as_string::<i32>();
    let start = all
        .column(index_of(&schema, "start_time"))
        .as_primitive::<TimestampMicrosecondType>();
    let status = all.column(index_of(&schema, "status")).as_string::<i32>();
    // (partition, not failed, start time, row): sorting these orders rows by partition, then
    // failures first, then start time, ties in arrival order.
    let mut ids: HashMap<(&str, &str), u32> = HashMap::new();
    let mut keys: Vec<(u32, bool, i64, u32)> = (0..all.num_rows())
        .map(|r| {
            let n = ids.len() as u32;
            (
                *ids.entry((tool.value(r), stage.value(r))).or_insert(n),
                status.value(r) != "error",
                start.value(r),
                r as u32,
            )
        })
        .collect();
    keys.sort_unstable();
    let order: UInt32Array = keys.iter().map(|k| k.3).collect();
    let sorted = take_record_batch(&all.project(&keep).expect("project"), &order).expect("take");
    let mut files = Vec::with_capacity(ids.len());
    let mut offset = 0;
    for part in keys.chunk_by(|a, b| a.0 == b.0) {
        let rows = sorted.slice(offset, part.len());
        offset += part.len();
        let mut buf = Vec::new();
        let mut w = ArrowWriter::try_new(
            &mut buf,
            file_schema.clone(),
            Some(parquet_props::writer_properties()),
        )
        .expect("writer");
        w.write(&rows).expect("write");
        w.close().expect("close");
        files.push(buf);
    }
    files
}

fn index_of(schema: &arrow::datatypes::Schema, name: &str) -> usize {
    schema.index_of(name).expect("spans schema column")
}

/// The rounds of each side of an A/B: `TOOLSPAN_BENCH_ROUNDS`, default 3.
fn rounds() -> usize {
    std::env::var("TOOLSPAN_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(3)
}
