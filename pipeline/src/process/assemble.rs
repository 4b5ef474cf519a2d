//! Assembly: requests whose spans still miss a relative wait, bounded, before their rows are
//! built, so that a trace split over requests gets the rows it gets whole.
//!
//! A span is *settled* when nothing still missing could change its row:
//! - its parent is in hand (in the same pass, or remembered by the [`super::memory`]) and
//!   settled itself, or it has no parent, or it carries everything it would inherit (its own
//!   stage, tool and call id) and is not a foreign tool call span (which may be another
//!   instrumentation's span of its parent's call);
//! - when it is a failed call or attempt whose error type comes from its children (no explicit
//!   `error.type`, not a retried call), the failing child is in hand and settled.
//!
//! A request (a *unit*: one OTLP/HTTP request, one Kafka message) is released, all of it,
//! when all its spans are settled, or when it has waited [`AssembleConfig::wait`] (its rows
//! are then built from what is known: an orphan is stored as it is, never dropped), or when
//! the pending units pass the count or byte cap (the oldest go first, counted and logged).
//! Units holding spans of one logical call (two instrumentations' spans of it, a framework's
//! runs of it: `tree::merge`) settle together and are released together, when the first of
//! them goes. Units of one *group* (a Kafka partition) are released in their order, so a recorded
//! offset never passes a unit still waiting. Each unit is processed with the units of the same
//! traces that wait with it, and every pass feeds the memory, so that a unit released on its
//! own later classifies as it did with them.
//!
//! The cost when nothing waits: one classification pass per request, as without assembly.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;

use super::{Accumulator, Pipeline, Rejections, Stats, Want};
use crate::error::PipelineError;
use crate::otlp::{self, view, Encoding};

mod offer;
pub use offer::Prepared;

/// How long and how much assembly holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AssembleConfig {
    /// The longest a unit waits for a missing relative. Zero turns assembly off (every unit
    /// is processed at once, as it comes).
    pub wait: Duration,
    /// At most this many units wait at once.
    pub max_units: usize,
    /// At most about this many payload bytes wait at once.
    pub max_bytes: usize,
}

impl Default for AssembleConfig {
    fn default() -> Self {
        AssembleConfig {
            wait: Duration::from_secs(5),
            max_units: 100_000,
            max_bytes: 128 << 20,
        }
    }
}

/// Figures for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AssemblyStats {
    /// Units waiting now.
    pub units: u64,
    /// Payload bytes waiting now.
    pub bytes: u64,
    /// Units that had to wait (since start).
    pub held: u64,
    /// Units released unsettled because their wait ran out (since start).
    pub expired: u64,
    /// Units released unsettled early because the caps were reached (since start).
    pub evicted: u64,
}

/// The figures of every assembler of one pipeline, for metrics.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    units: AtomicU64,
    bytes: AtomicU64,
    held: AtomicU64,
    expired: AtomicU64,
    evicted: AtomicU64,
}

impl Counters {
    pub(crate) fn read(&self) -> AssemblyStats {
        AssemblyStats {
            units: self.units.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            held: self.held.load(Ordering::Relaxed),
            expired: self.expired.load(Ordering::Relaxed),
            evicted: self.evicted.load(Ordering::Relaxed),
        }
    }
}

/// What offering a unit did.
#[derive(Debug)]
pub struct Offered<T> {
    /// The offered unit's invalid spans (left out of its rows whenever they are built).
    pub rejected: Rejections,
    /// Tags of the units whose rows were appended to the accumulator, in release order (the
    /// offered unit's among them when it did not wait).
    pub released: Vec<T>,
    /// What the appended rows hold.
    pub stats: Stats,
    /// Whether the offered unit waits (its tag is not among `released`).
    pub held: bool,
}

struct Unit<T> {
    /// Empty for a marker (an offset without spans, e.g. a poison message).
    bytes: Vec<u8>,
    encoding: Encoding,
    arrived: Instant,
    traces: Vec<u128>,
    settled: bool,
    forced: bool,
    /// Units holding spans of the same logical calls as this one (their rows depend on each
    /// other): released with it.
    linked: Vec<u64>,
    tag: T,
}

impl<T> Offered<T> {
    /// Nothing rejected, nothing released.
    fn none() -> Offered<T> {
        Offered::kept(Rejections::default(), Stats::default())
    }

    /// The offered unit released at once (its rows built now), with its `rejected` spans and
    /// what its rows hold.
    fn at_once(tag: T, rejected: Rejections, stats: Stats) -> Offered<T> {
        Offered {
            rejected,
            released: vec![tag],
            stats,
            held: false,
        }
    }

    /// The offered unit not released by the offer itself (yet), with its `rejected` spans
    /// and what the rows released with it hold.
    fn kept(rejected: Rejections, stats: Stats) -> Offered<T> {
        Offered {
            rejected,
            released: Vec::new(),
            stats,
            held: false,
        }
    }
}

/// Units waiting for relatives (see the module docs). `T` tags a unit for its caller (an
/// offset, a waiting request).
pub struct Assembler<T> {
    config: AssembleConfig,
    units: BTreeMap<u64, Unit<T>>,
    groups: HashMap<u64, VecDeque<u64>>,
    traces: HashMap<u128, Vec<u64>>,
    bytes: usize,
    next: u64,
    stats: AssemblyStats,
    counters: Arc<Counters>,
    last_log: Option<Instant>,
}

impl<T> Drop for Assembler<T> {
    fn drop(&mut self) {
        self.counters
            .units
            .fetch_sub(self.units.len() as u64, Ordering::Relaxed);
        self.counters
            .bytes
            .fetch_sub(self.bytes as u64, Ordering::Relaxed);
    }
}

impl<T> Assembler<T> {
    /// An empty assembler with `pipeline`'s settings ([`Pipeline::with_assembly`]), counted
    /// in its figures ([`Pipeline::assembly_stats`]).
    pub fn for_pipeline(pipeline: &Pipeline) -> Assembler<T> {
        let mut a = Assembler::new(pipeline.assembly);
        a.counters = pipeline.assembly_counters.clone();
        a
    }

    /// An empty assembler.
    pub fn new(config: AssembleConfig) -> Assembler<T> {
        Assembler {
            counters: Arc::default(),
            config,
            units: BTreeMap::new(),
            groups: HashMap::new(),
            traces: HashMap::new(),
            bytes: 0,
            next: 0,
            stats: AssemblyStats::default(),
            last_log: None,
        }
    }

    /// The settings.
    pub fn config(&self) -> AssembleConfig {
        self.config
    }

    /// Figures for metrics.
    pub fn stats(&self) -> AssemblyStats {
        AssemblyStats {
            units: self.units.len() as u64,
            bytes: self.bytes as u64,
            ..self.stats
        }
    }

    /// Whether no unit waits.
    pub fn is_empty(&self) -> bool {
        self.units.is_empty()
    }

    /// Offers a unit without spans (an offset to record in order, e.g. a poison message's).
    pub fn offer_marker(
        &mut self,
        pipeline: &Pipeline,
        group: u64,
        tag: T,
        now: Instant,
        acc: &mut Accumulator,
    ) -> Offered<T> {
        let blocked = self.groups.get(&group).is_some_and(|q| !q.is_empty());
        if !blocked {
            return Offered::at_once(tag, Rejections::default(), Stats::default());
        }
        let seq = self.hold(&[], Encoding::Protobuf, group, Vec::new(), true, tag, now);
        let mut out = Offered::none();
        self.release(pipeline, now, acc, &mut out);
        out.held = self.units.contains_key(&seq);
        out
    }

    /// Releases the units whose wait ran out (and what they unblock).
    pub fn expire(
        &mut self,
        pipeline: &Pipeline,
        now: Instant,
        acc: &mut Accumulator,
    ) -> Offered<T> {
        let mut out = Offered::none();
        if self.units.is_empty() {
            return out;
        }
        self.release(pipeline, now, acc, &mut out);
        out
    }

    /// Releases every waiting unit as it classifies now (shutdown of a source that must not
    /// keep anything).
    pub fn release_all(&mut self, pipeline: &Pipeline, acc: &mut Accumulator) -> Offered<T> {
        for u in self.units.values_mut() {
            u.forced = true;
        }
        self.expire(pipeline, Instant::now(), acc)
    }

    /// Forgets every waiting unit without building rows (their source re-reads them: a Kafka
    /// revocation); returns their tags.
    pub fn drop_all(&mut self) -> Vec<T> {
        self.groups.clear();
        self.traces.clear();
        self.counters
            .units
            .fetch_sub(self.units.len() as u64, Ordering::Relaxed);
        self.counters
            .bytes
            .fetch_sub(self.bytes as u64, Ordering::Relaxed);
        self.bytes = 0;
        std::mem::take(&mut self.units)
            .into_values()
            .map(|u| u.tag)
            .collect()
    }

    /// The earliest instant a waiting unit's wait runs out.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.units
            .values()
            .next()
            .map(|u| u.arrived + self.config.wait)
    }

    #[allow(clippy::too_many_arguments)]
    fn hold(
        &mut self,
        bytes: &[u8],
        encoding: Encoding,
        group: u64,
        traces: Vec<u128>,
        marker: bool,
        tag: T,
        now: Instant,
    ) -> u64 {
        let seq = self.next;
        self.next += 1;
        for t in &traces {
            self.traces.entry(*t).or_default().push(seq);
        }
        self.groups.entry(group).or_default().push_back(seq);
        self.bytes += bytes.len();
        self.counters.units.fetch_add(1, Ordering::Relaxed);
        self.counters
            .bytes
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        if !marker {
            self.stats.held += 1;
            self.counters.held.fetch_add(1, Ordering::Relaxed);
        }
        self.units.insert(
            seq,
            Unit {
                bytes: bytes.to_vec(),
                encoding,
                arrived: now,
                traces,
                settled: marker,
                forced: false,
                linked: Vec::new(),
                tag,
            },
        );
        seq
    }

    /// One pass over `seqs` (classify and remember, no rows); updates their settledness.
    /// Returns the rejections of the last unit.
    fn observe(&mut self, pipeline: &Pipeline, seqs: &[u64]) -> Option<Rejections> {
        let units: Vec<&Unit<T>> = seqs
            .iter()
            .filter_map(|s| self.units.get(s))
            .filter(|u| !u.bytes.is_empty())
            .collect();
        let (settled, rejected, linked) = with_views(&units, |views| {
            let want = vec![Want::Observe; views.len()];
            let mut rejected = vec![Rejections::default(); views.len()];
            let mut scratch = Stats::default();
            let mut linked = Vec::new();
            let s = pipeline.pass_linked(
                views,
                &want,
                &mut None,
                &mut scratch,
                &mut rejected,
                &mut linked,
            );
            (s, rejected, linked)
        });
        let keys: Vec<u64> = seqs
            .iter()
            .copied()
            .filter(|s| self.units.get(s).is_some_and(|u| !u.bytes.is_empty()))
            .collect();
        for (k, s) in keys.iter().zip(&settled) {
            if let Some(u) = self.units.get_mut(k) {
                u.settled = *s;
            }
        }
        for (a, b) in linked {
            let (Some(&sa), Some(&sb)) = (keys.get(a), keys.get(b)) else {
                continue;
            };
            for (x, y) in [(sa, sb), (sb, sa)] {
                if let Some(u) = self.units.get_mut(&x) {
                    if !u.linked.contains(&y) {
                        u.linked.push(y);
                    }
                }
            }
        }
        rejected.last().cloned()
    }

    /// Releases, group by group in order, every unit at the front that is settled, forced or
    /// past its wait; builds their rows together into `acc`. Units of the same traces that
    /// still wait are then looked at again (what was released may settle them).
    fn release(
        &mut self,
        pipeline: &Pipeline,
        now: Instant,
        acc: &mut Accumulator,
        out: &mut Offered<T>,
    ) {
        for _round in 0..8 {
            let mut ready: Vec<u64> = Vec::new();
            let mut expired_now = 0u64;
            for q in self.groups.values_mut() {
                while let Some(&seq) = q.front() {
                    let Some(u) = self.units.get(&seq) else {
                        q.pop_front();
                        continue;
                    };
                    let late = now.duration_since(u.arrived) >= self.config.wait;
                    if u.settled || u.forced || late {
                        if !u.settled && !u.forced {
                            expired_now += 1;
                        }
                        ready.push(seq);
                        q.pop_front();
                    } else {
                        break;
                    }
                }
            }
            // Units holding spans of the same logical calls as a released one go with it (their
            // rows depend on each other), as far as their groups' order allows.
            if self.units.values().any(|u| !u.linked.is_empty()) {
                loop {
                    let mut more = false;
                    for q in self.groups.values_mut() {
                        while let Some(&seq) = q.front() {
                            let with = self
                                .units
                                .get(&seq)
                                .is_some_and(|u| u.linked.iter().any(|l| ready.contains(l)));
                            if !with {
                                break;
                            }
                            ready.push(seq);
                            q.pop_front();
                            more = true;
                        }
                    }
                    if !more {
                        break;
                    }
                }
            }
            self.groups.retain(|_, q| !q.is_empty());
            if ready.is_empty() {
                return;
            }
            self.stats.expired += expired_now;
            self.counters
                .expired
                .fetch_add(expired_now, Ordering::Relaxed);
            ready.sort_unstable();
            let units: Vec<Unit<T>> = ready.iter().filter_map(|s| self.units.remove(s)).collect();
            let mut touched: Vec<u128> = Vec::new();
            self.counters
                .units
                .fetch_sub(units.len() as u64, Ordering::Relaxed);
            for (seq, u) in ready.iter().zip(&units) {
                self.bytes -= u.bytes.len();
                self.counters
                    .bytes
                    .fetch_sub(u.bytes.len() as u64, Ordering::Relaxed);
                for t in &u.traces {
                    if let Some(v) = self.traces.get_mut(t) {
                        v.retain(|s| s != seq);
                        if v.is_empty() {
                            self.traces.remove(t);
                        } else {
                            touched.push(*t);
                        }
                    }
                }
            }
            let with_spans: Vec<&Unit<T>> = units.iter().filter(|u| !u.bytes.is_empty()).collect();
            if !with_spans.is_empty() {
                let mut rejected = vec![Rejections::default(); with_spans.len()];
                let before = out.stats.spans;
                with_views(&with_spans, |views| {
                    let want = vec![Want::Emit; views.len()];
                    pipeline.pass(
                        views,
                        &want,
                        &mut acc.builder,
                        &mut out.stats,
                        &mut rejected,
                    );
                });
                acc.rows += (out.stats.spans - before) as usize;
                for r in &rejected {
                    out.stats.rejected.merge(r);
                }
            }
            out.released.extend(units.into_iter().map(|u| u.tag));
            // Waiting units of the same traces: what was released may settle them.
            let mut again: Vec<u64> = touched
                .iter()
                .filter_map(|t| self.traces.get(t))
                .flatten()
                .copied()
                .collect();
            again.sort_unstable();
            again.dedup();
            if again.is_empty() {
                // Nothing new can settle; still release what the released units unblocked.
                continue;
            }
            self.observe(pipeline, &again);
        }
    }

    /// Forces the oldest units out while the caps are passed.
    fn enforce_caps(
        &mut self,
        pipeline: &Pipeline,
        now: Instant,
        acc: &mut Accumulator,
        out: &mut Offered<T>,
    ) {
        if self.units.len() <= self.config.max_units && self.bytes <= self.config.max_bytes {
            return;
        }
        let mut units = self.units.len();
        let mut bytes = self.bytes;
        let mut forced = 0u64;
        for u in self.units.values_mut() {
            if units <= self.config.max_units && bytes <= self.config.max_bytes {
                break;
            }
            if !u.forced && !u.settled {
                u.forced = true;
                forced += 1;
            }
            units -= 1;
            bytes -= u.bytes.len();
        }
        self.stats.evicted += forced;
        self.counters.evicted.fetch_add(forced, Ordering::Relaxed);
        if self
            .last_log
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(10))
        {
            self.last_log = Some(now);
            tracing::warn!(
                forced,
                max_units = self.config.max_units,
                max_bytes = self.config.max_bytes,
                "trace assembly is full: releasing the oldest waiting spans before their relatives came (raise --assembly-max-mb or lower --assembly-wait-secs)"
            );
        }
        self.release(pipeline, now, acc, out);
    }
}

/// Decodes with prost when the in-place reader cannot (JSON, or a payload it leaves to
/// prost); `None` when the in-place reader can.
fn decode_fallback(
    bytes: &[u8],
    encoding: Encoding,
) -> Result<Option<ExportTraceServiceRequest>, PipelineError> {
    if encoding == Encoding::Protobuf && view::Decoded::decode(bytes).is_ok() {
        return Ok(None);
    }
    otlp::decode(bytes, encoding).map(Some)
}

/// Runs `f` over the units' decoded views. Units were decoded once when offered, so decoding
/// does not fail here; one that does is left out (logged).
fn with_views<T, R>(units: &[&Unit<T>], f: impl FnOnce(&[view::Decoded<'_>]) -> R) -> R {
    let owned: Vec<Option<ExportTraceServiceRequest>> = units
        .iter()
        .map(|u| decode_fallback(&u.bytes, u.encoding).ok().flatten())
        .collect();
    let views: Vec<view::Decoded<'_>> = units
        .iter()
        .zip(&owned)
        .map(|(u, o)| match o {
            Some(req) => view::Decoded::from_prost(req),
            None => view::Decoded::decode(&u.bytes)
                .unwrap_or_else(|_| view::Decoded::from_prost(&EMPTY)),
        })
        .collect();
    f(&views)
}

static EMPTY: ExportTraceServiceRequest = ExportTraceServiceRequest {
    resource_spans: Vec::new(),
};

#[cfg(test)]
mod tests;
