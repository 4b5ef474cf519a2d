//! Assembly: the same rows whether a trace comes whole or in pieces, in any order.

use std::time::{Duration, Instant};

use arrow::record_batch::RecordBatch;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use toolspan_gen::{Fleet, FleetConfig};

use super::super::tests::{classified, one_span_per_request};
use super::*;

fn fleet_request(seed: u64, traces: usize) -> ExportTraceServiceRequest {
    let mut fleet = Fleet::new(FleetConfig {
        seed,
        payloads: false,
        failure_scale: 4.0,
    });
    fleet.request(traces, 1_764_410_400_000_000_000, 1_000_000_000)
}

/// Pieces of `n` spans each, in the order of `pieces` flattened.
fn rebatch(pieces: &[ExportTraceServiceRequest], n: usize) -> Vec<ExportTraceServiceRequest> {
    let mut out = Vec::new();
    for chunk in pieces.chunks(n) {
        let mut req = ExportTraceServiceRequest::default();
        for p in chunk {
            req.resource_spans.extend(p.resource_spans.iter().cloned());
        }
        out.push(req);
    }
    out
}

/// Feeds `pieces` through an assembler (all in `group_of(i)`), then lets every wait run out;
/// returns the batches and the release order of the piece indices.
fn assemble(
    p: &Pipeline,
    config: AssembleConfig,
    pieces: &[ExportTraceServiceRequest],
    group_of: impl Fn(usize) -> u64,
) -> (Vec<RecordBatch>, Vec<usize>) {
    let mut a: Assembler<usize> = Assembler::new(config);
    let mut acc = Accumulator::new();
    let mut order = Vec::new();
    let t0 = Instant::now();
    for (i, piece) in pieces.iter().enumerate() {
        let bytes = piece.encode_to_vec();
        let now = t0 + Duration::from_millis(i as u64);
        let out = a
            .offer(p, &bytes, Encoding::Protobuf, group_of(i), i, now, &mut acc)
            .expect("offer");
        order.extend(out.released);
    }
    let out = a.expire(p, t0 + Duration::from_secs(3600), &mut acc);
    order.extend(out.released);
    assert!(a.is_empty());
    let batch = acc.take().expect("batch").into_iter().collect();
    (batch, order)
}

fn assert_same_rows(
    whole: &std::collections::BTreeMap<String, Vec<String>>,
    split: &std::collections::BTreeMap<String, Vec<String>>,
    what: &str,
) {
    assert_eq!(split.len(), whole.len(), "{what}: row count");
    // A failed agent run takes the type of its latest failing call; when its failing calls
    // arrive after it and apart, it can settle on an earlier one (docs/ingest.md: traces in pieces).
    let same = |w: &Vec<String>, s: &Vec<String>| {
        if w[1] == "agent" {
            w[..5] == s[..5]
        } else {
            w == s
        }
    };
    let differ: Vec<_> = whole
        .iter()
        .filter(|(id, w)| split.get(*id).is_none_or(|s| !same(w, s)))
        .map(|(id, w)| format!("{id}: whole {w:?}, split {:?}", split.get(id)))
        .collect();
    assert!(
        differ.is_empty(),
        "{what}: {} rows differ, e.g. {:?}",
        differ.len(),
        &differ[..differ.len().min(3)]
    );
}

/// The shapes exporters send: one span per request in random order, batches of 2 splitting traces
/// (children first), and the same with every piece in one group (a Kafka partition, released
/// in order) — all give the rows of the whole trace for tool, stage, call id, attempt,
/// status and error type. Without assembly the random order differs (the test can fail).
#[test]
fn pieces_in_any_order_give_the_rows_of_the_whole_trace() {
    let req = fleet_request(11, 40);
    let whole = classified(&[Pipeline::builtin().process(&req).expect("whole").batch]);
    let config = AssembleConfig {
        wait: Duration::from_secs(60),
        ..AssembleConfig::default()
    };
    let mut shuffled = one_span_per_request(&req, true);
    shuffled.shuffle(&mut rand::rngs::StdRng::seed_from_u64(7));
    let children_first_pairs = rebatch(&one_span_per_request(&req, true), 2);
    for (what, pieces) in [
        ("one span per request, random order", &shuffled),
        ("batches of 2, children first", &children_first_pairs),
    ] {
        for grouped in [false, true] {
            let p = Pipeline::builtin();
            let (batches, order) =
                assemble(&p, config, pieces, |i| if grouped { 0 } else { i as u64 });
            assert_same_rows(&whole, &classified(&batches), what);
            assert_eq!(
                order.len(),
                pieces.len(),
                "{what}: every piece released once"
            );
            if grouped {
                assert!(order.windows(2).all(|w| w[0] < w[1]), "{what}: in order");
            }
        }
    }
    // Without the wait (memory only), random order loses information.
    let p = Pipeline::builtin();
    let off = AssembleConfig {
        wait: Duration::ZERO,
        ..config
    };
    let (batches, _) = assemble(&p, off, &shuffled, |i| i as u64);
    let split = classified(&batches);
    assert!(
        whole.iter().any(|(id, w)| split.get(id) != Some(w)),
        "without assembly the random order must differ (else the test proves nothing)"
    );
}

/// Spans whose parents never come wait their time, then are stored as they are; the caps
/// bound what waits, and forcing out is counted.
#[test]
fn orphans_are_stored_after_the_wait_and_the_caps_bound_what_waits() {
    let req = fleet_request(5, 30);
    let mut orphans: Vec<ExportTraceServiceRequest> = one_span_per_request(&req, true)
        .into_iter()
        .filter(|r| {
            let s = &r.resource_spans[0].scope_spans[0].spans[0];
            !s.parent_span_id.is_empty()
        })
        .collect();
    // Drop every root and call, and the tool name the fleet also puts on attempts and
    // stages: the rest (attempts, stages, model calls) are orphans that need their parents.
    orphans.retain(|r| {
        let s = &r.resource_spans[0].scope_spans[0].spans[0];
        !s.attributes
            .iter()
            .any(|kv| kv.key == "gen_ai.operation.name")
    });
    for r in &mut orphans {
        let s = &mut r.resource_spans[0].scope_spans[0].spans[0];
        s.attributes.retain(|kv| kv.key != "gen_ai.tool.name");
    }
    assert!(orphans.len() > 50);
    let p = Pipeline::builtin();
    let config = AssembleConfig {
        wait: Duration::from_secs(5),
        max_units: 20,
        max_bytes: 1 << 20,
    };
    let mut a: Assembler<usize> = Assembler::new(config);
    let mut acc = Accumulator::new();
    let t0 = Instant::now();
    let mut released = 0;
    for (i, piece) in orphans.iter().enumerate() {
        let out = a
            .offer(
                &p,
                &piece.encode_to_vec(),
                Encoding::Protobuf,
                i as u64,
                i,
                t0,
                &mut acc,
            )
            .expect("offer");
        released += out.released.len();
        assert!(a.stats().units <= 20, "the count cap holds");
    }
    assert!(a.stats().evicted > 0, "the cap forced units out");
    // Not yet their time: the rest waits.
    released += a
        .expire(&p, t0 + Duration::from_secs(1), &mut acc)
        .released
        .len();
    assert!(!a.is_empty());
    released += a
        .expire(&p, t0 + Duration::from_secs(5), &mut acc)
        .released
        .len();
    assert!(a.is_empty());
    assert_eq!(released, orphans.len(), "every orphan is stored");
    assert!(a.stats().expired > 0);
    let batch = acc.take().expect("batch").expect("rows");
    assert_eq!(batch.num_rows(), orphans.len());
}

/// Offers `pieces` in order at the given offsets from a start (each with its group), letting
/// the clock run between offers as a receiver's polls do; then every wait runs out.
fn assemble_timed(
    p: &Pipeline,
    config: AssembleConfig,
    pieces: &[(Duration, u64, ExportTraceServiceRequest)],
) -> Vec<RecordBatch> {
    let mut a: Assembler<usize> = Assembler::new(config);
    let mut acc = Accumulator::new();
    let mut released = 0;
    let t0 = Instant::now();
    for (i, (at, group, piece)) in pieces.iter().enumerate() {
        let now = t0 + *at;
        released += a.expire(p, now, &mut acc).released.len();
        let out = a
            .offer(
                p,
                &piece.encode_to_vec(),
                Encoding::Protobuf,
                *group,
                i,
                now,
                &mut acc,
            )
            .expect("offer");
        released += out.released.len();
    }
    released += a.expire(p, t0 + config.wait * 4, &mut acc).released.len();
    assert_eq!(released, pieces.len(), "every piece released once");
    acc.take().expect("batch").into_iter().collect()
}

/// Random arrival: one span per request, shuffled, each offered at a random time within 90 %
/// of the assembly wait (so every relative comes within the wait, as the receivers promise to
/// handle), in one group or in four (Kafka partitions, a trace's pieces spread over them).
fn random_arrival(
    req: &ExportTraceServiceRequest,
    wait: Duration,
    rng: &mut rand::rngs::StdRng,
) -> Vec<(Duration, u64, ExportTraceServiceRequest)> {
    use rand::Rng;
    let groups: u64 = if rng.random_bool(0.5) { 1 } else { 4 };
    let span = wait.mul_f64(0.9).as_micros() as u64;
    let mut pieces: Vec<(Duration, u64, ExportTraceServiceRequest)> =
        one_span_per_request(req, rng.random_bool(0.5))
            .into_iter()
            .map(|p| {
                let at = Duration::from_micros(rng.random_range(0..span.max(1)));
                (at, rng.random_range(0..groups), p)
            })
            .collect();
    pieces.shuffle(rng);
    pieces.sort_by_key(|(at, _, _)| *at);
    pieces
}

/// The property: for any arrival order and any gaps within the wait, the rows (tool, stage,
/// call id, attempt, status, error type) are those of the whole trace. 120 random arrivals
/// of the demo fleet's traffic (12 fleets, 10 orders each) and 15 of every framework trace of
/// the corpus (`tests/frameworks/corpus/*.json`, each in its own instrumentation's shapes:
/// nine files today, so 255 orders; at least 100 whatever the corpus holds).
#[test]
fn any_arrival_order_within_the_wait_gives_the_rows_of_the_whole_trace() {
    let config = AssembleConfig {
        wait: Duration::from_secs(5),
        ..AssembleConfig::default()
    };
    let mut inputs: Vec<(String, ExportTraceServiceRequest, usize)> = (0..12)
        .map(|s| (format!("fleet seed {s}"), fleet_request(100 + s, 8), 10))
        .collect();
    let corpus =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/frameworks/corpus");
    let mut frameworks = 0;
    for entry in std::fs::read_dir(&corpus).expect("the framework corpus") {
        let path = entry.expect("an entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("")
            .to_string();
        if !name.ends_with(".json") || name == "cases.json" || name == "labels.json" {
            continue;
        }
        let bytes = std::fs::read(&path).expect("a corpus file");
        let req = crate::otlp::decode_json(&bytes).expect("the corpus decodes");
        inputs.push((name, req, 15));
        frameworks += 1;
    }
    assert!(
        frameworks >= 6,
        "{frameworks} framework traces in the corpus"
    );
    let mut orders = 0;
    for (what, req, n) in &inputs {
        let whole = classified(&[Pipeline::builtin().process(req).expect("whole").batch]);
        for k in 0..*n {
            let mut rng = rand::rngs::StdRng::seed_from_u64(1_000 + k as u64);
            let pieces = random_arrival(req, config.wait, &mut rng);
            let batches = assemble_timed(&Pipeline::builtin(), config, &pieces);
            assert_same_rows(&whole, &classified(&batches), &format!("{what}, order {k}"));
            orders += 1;
        }
    }
    assert!(orders >= 100, "{orders} orders");
}

/// What the OTLP/HTTP receiver does: requests offered from several threads at once through the
/// one lock ([`Assembler::offer_through`], which reads a request's spans before the lock and
/// builds its rows after it) give the rows of the whole trace, every piece released once.
#[test]
fn pieces_offered_through_the_lock_from_two_threads_give_the_rows_of_the_whole_trace() {
    let req = fleet_request(23, 40);
    let whole_batch = Pipeline::builtin().process(&req).expect("whole").batch;
    let whole = classified(std::slice::from_ref(&whole_batch));
    let mut pieces = one_span_per_request(&req, true);
    pieces.shuffle(&mut rand::rngs::StdRng::seed_from_u64(5));
    let p = Pipeline::builtin().with_assembly(AssembleConfig {
        wait: Duration::from_secs(60),
        ..AssembleConfig::default()
    });
    let a: std::sync::Mutex<Assembler<usize>> = std::sync::Mutex::new(Assembler::for_pipeline(&p));
    let held = std::sync::atomic::AtomicUsize::new(0);
    let (mut batches, mut order) = (Vec::new(), Vec::new());
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|t| {
                let (p, a, held, pieces) = (&p, &a, &held, &pieces);
                s.spawn(move || {
                    let mut acc = Accumulator::new();
                    let mut order = Vec::new();
                    for (i, piece) in pieces.iter().enumerate().skip(t).step_by(2) {
                        let bytes = piece.encode_to_vec();
                        let mut slot = None;
                        let unit = Prepared::decode(&bytes, Encoding::Protobuf, &mut slot)
                            .expect("decode");
                        let out =
                            Assembler::offer_through(a, p, unit, i as u64, i, &mut acc, || {
                                held.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            });
                        assert_eq!(out.held, !out.released.contains(&i), "piece {i}");
                        order.extend(out.released);
                    }
                    (acc.take().expect("batch"), order)
                })
            })
            .collect();
        for w in workers {
            let (batch, released) = w.join().expect("worker");
            batches.extend(batch);
            order.extend(released);
        }
    });
    let mut acc = Accumulator::new();
    let mut a = a.into_inner().expect("lock");
    order.extend(
        a.expire(&p, Instant::now() + Duration::from_secs(3600), &mut acc)
            .released,
    );
    batches.extend(acc.take().expect("batch"));
    assert!(a.is_empty());
    assert!(
        held.into_inner() > 0,
        "some pieces waited (else the test proves little)"
    );
    order.sort_unstable();
    assert_eq!(
        order,
        (0..pieces.len()).collect::<Vec<_>>(),
        "every piece released once"
    );
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    assert_eq!(rows, whole_batch.num_rows(), "one row per span, none twice");
    assert_same_rows(
        &whole,
        &classified(&batches),
        "two threads through one lock",
    );
}
