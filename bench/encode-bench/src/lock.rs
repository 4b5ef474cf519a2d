//! `TOOLSPAN_BENCH_LOCK=ab`: the OTLP/HTTP receiver's processing of requests (decode, classify,
//! redact, Arrow; no Parquet, which its writer does apart) from one and from two threads at
//! once through one assembler lock, as `toolspan serve` runs it with assembly on: each thread
//! takes the next request, decodes it outside the lock, offers it and takes its rows. Two ways
//! of holding the lock, in this one process and binary:
//!
//! - `whole`: the whole pass under the lock ([`Assembler::offer_prepared`] on the locked
//!   assembler: what the receiver did until the pass was split);
//! - `split`: only the classification under it ([`Assembler::offer_through`]: the request's
//!   spans are read before and its rows built after).
//!
//! Printed per way: spans/s (wall clock) with 1 and 2 threads and their ratio, the figure the
//! receiver's use of a second core is read from. Each run starts from a fresh pipeline (its
//! trace memory empty), so every run classifies the corpus alike.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use toolspan_pipeline::{Accumulator, Assembler, Encoding, Pipeline, Prepared};

/// Spans per second (wall clock) of processing `corpus` from `threads` threads.
fn run(pipeline: &Pipeline, corpus: &[Vec<u8>], threads: usize, split: bool) -> (usize, f64) {
    let assembler: Mutex<Assembler<usize>> = Mutex::new(Assembler::for_pipeline(pipeline));
    let next = AtomicUsize::new(0);
    let t0 = Instant::now();
    let rows: usize = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                let (assembler, next) = (&assembler, &next);
                s.spawn(move || {
                    let mut rows = 0;
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(body) = corpus.get(i) else {
                            return rows;
                        };
                        let mut acc = Accumulator::new();
                        let mut slot = None;
                        let unit = Prepared::decode(body, Encoding::Protobuf, &mut slot)
                            .expect("corpus decodes");
                        if split {
                            Assembler::offer_through(
                                assembler,
                                pipeline,
                                unit,
                                i as u64,
                                i,
                                &mut acc,
                                || {},
                            );
                        } else {
                            let mut a = assembler.lock().unwrap_or_else(|e| e.into_inner());
                            a.offer_prepared(pipeline, unit, i as u64, i, Instant::now(), &mut acc);
                        }
                        rows += acc.take().expect("batch").map_or(0, |b| b.num_rows());
                    }
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("worker")).sum()
    });
    // What still waits for a relative (a request's trace whole within it: nothing, or little).
    let mut acc = Accumulator::new();
    let mut a = assembler.into_inner().unwrap_or_else(|e| e.into_inner());
    a.release_all(pipeline, &mut acc);
    let rows = rows + acc.take().expect("batch").map_or(0, |b| b.num_rows());
    let secs = t0.elapsed().as_secs_f64().max(1e-9);
    (rows, rows as f64 / secs)
}

/// Runs both ways with 1 and 2 threads, `rounds` times each (alternating the order), and
/// prints every run and the medians.
pub fn ab(pipeline: impl Fn() -> Pipeline, corpus: &[Vec<u8>], rounds: usize) {
    let mut figures: [[Vec<f64>; 2]; 2] = Default::default();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    eprintln!("bench/encode: the receiver's lock, {cores} cores, {rounds} rounds");
    for round in 0..rounds {
        let ways = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for split in ways {
            for threads in [1, 2] {
                let (rows, sps) = run(&pipeline(), corpus, threads, split);
                println!(
                    "round={} way={} threads={threads} rows={rows} spans_per_s={sps:.0}",
                    round + 1,
                    if split { "split" } else { "whole" },
                );
                figures[usize::from(split)][threads - 1].push(sps);
            }
        }
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let [whole, split] = figures.map(|w| w.map(|t| median(&t)));
    println!(
        "whole_1={:.0} whole_2={:.0} whole_speedup_2_over_1={:.3} split_1={:.0} split_2={:.0} split_speedup_2_over_1={:.3} split_over_whole_2={:.3} cores={cores} rounds={rounds}",
        whole[0],
        whole[1],
        whole[1] / whole[0],
        split[0],
        split[1],
        split[1] / split[0],
        split[1] / whole[1],
    );
}
