//! `bench/encode`: decode + classify + redact + Arrow + Parquet on a fixed synthetic corpus.
//!
//! Single-threaded, so spans/s is per core. The corpus is the demo fleet's traffic without
//! payloads (seed 7), encoded as OTLP protobuf requests of 100 agent runs each, as an SDK's
//! batch exporter would send them. Parquet is written as the store writes it: one file per
//! (tool, stage) partition, partition columns left out of the file.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use arrow::array::{Array, RecordBatch, StringArray};
use arrow::compute::{concat_batches, filter_record_batch};
use parquet::arrow::ArrowWriter;
use prost::Message;
use toolspan_gen::{Fleet, FleetConfig};
use toolspan_schema::{parquet_props, Encoding, Pipeline};

fn main() {
    let target_spans: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let mut fleet = Fleet::new(FleetConfig { seed: 7, payloads: false, failure_scale: 1.0 });
    let base = 1_764_410_400_000_000_000u64;
    let mut corpus = Vec::new();
    let mut spans = 0usize;
    let mut k = 0u64;
    while spans < target_spans {
        let req = fleet.request(100, base + k * 1_000_000_000, 1_000_000_000);
        spans += req.resource_spans.iter().flat_map(|r| &r.scope_spans).map(|s| s.spans.len()).sum::<usize>();
        corpus.push(req.encode_to_vec());
        k += 1;
    }
    let otlp_bytes: usize = corpus.iter().map(Vec::len).sum();
    eprintln!("corpus: {spans} spans in {} requests, {:.1} MB of OTLP protobuf", corpus.len(), otlp_bytes as f64 / 1e6);

    let pipeline = Pipeline::builtin();
    // Warm-up pass (page faults, lazy regexes), not timed.
    for body in corpus.iter().take(20) {
        let _ = pipeline.process_bytes(body, Encoding::Protobuf);
    }

    let t0 = Instant::now();
    let mut batches = Vec::with_capacity(corpus.len());
    for (i, body) in corpus.iter().enumerate() {
        let out = pipeline.process_bytes(body, Encoding::Protobuf).expect("corpus decodes");
        batches.push(out.batch);
        if i % 200 == 199 {
            eprintln!("  processed {} of {} requests ({:.0} spans/s)", i + 1, corpus.len(), rate(batches.iter().map(|b| b.num_rows()).sum(), t0.elapsed()));
        }
    }
    let t_process = t0.elapsed();
    let t1 = Instant::now();
    let (parquet_bytes, files) = write_partitioned(&batches);
    let t_parquet = t1.elapsed();
    let total = t_process + t_parquet;
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();

    let sps = rate(rows, total);
    let bps = parquet_bytes as f64 / rows as f64;
    println!("spans:                      {rows}");
    println!("decode+classify+redact+arrow: {:.2} s ({:.0} spans/s)", t_process.as_secs_f64(), rate(rows, t_process));
    println!("parquet ({files} partition files): {:.2} s ({:.0} spans/s)", t_parquet.as_secs_f64(), rate(rows, t_parquet));
    println!("end to end, one core:       {sps:.0} spans/s   (target >= 300000; an OpenTelemetry Collector does ~12000)");
    println!("parquet size:               {parquet_bytes} bytes = {bps:.1} bytes/span   (target <= 60; Tempo's Parquet ~58)");
    println!("spans_per_s_per_core={sps:.0} bytes_per_span={bps:.1} spans={rows} process_s={:.3} parquet_s={:.3}", t_process.as_secs_f64(), t_parquet.as_secs_f64());
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64().max(1e-9)
}

/// Writes one Parquet file per (tool, stage) into memory; returns total bytes and file count.
fn write_partitioned(batches: &[RecordBatch]) -> (usize, usize) {
    let schema = toolspan_schema::spans_schema();
    let all = concat_batches(&schema, batches).expect("same schema");
    let tool = all.column_by_name("tool").and_then(|c| c.as_any().downcast_ref::<StringArray>()).expect("tool");
    let stage = all.column_by_name("stage").and_then(|c| c.as_any().downcast_ref::<StringArray>()).expect("stage");
    let mut parts: BTreeMap<(String, String), Vec<bool>> = BTreeMap::new();
    for i in 0..all.num_rows() {
        let key = (tool.value(i).to_string(), stage.value(i).to_string());
        let mask = parts.entry(key).or_insert_with(|| vec![false; all.num_rows()]);
        mask[i] = true;
    }
    let keep: Vec<usize> = schema
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| !toolspan_schema::columns::PARTITION_COLUMNS.contains(&f.name().as_str()))
        .map(|(i, _)| i)
        .collect();
    let file_schema = std::sync::Arc::new(schema.project(&keep).expect("projection"));
    let mut total = 0;
    for mask in parts.values() {
        let part = filter_record_batch(&all, &arrow::array::BooleanArray::from(mask.clone())).expect("filter");
        let part = part.project(&keep).expect("project");
        let mut buf = Vec::new();
        let mut w = ArrowWriter::try_new(&mut buf, file_schema.clone(), Some(parquet_props::writer_properties())).expect("writer");
        w.write(&part).expect("write");
        w.close().expect("close");
        total += buf.len();
        let _ = part.column(0).len();
    }
    (total, parts.len())
}
