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

use super::classify::extract::Facts;
use super::memory::Seen;
use super::{Accumulator, Decided, Gathered, Pipeline, Rejections, Stats, Want};
use crate::error::PipelineError;
use crate::otlp::{self, view, Encoding};

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
        Offered {
            rejected: Rejections::default(),
            released: Vec::new(),
            stats: Stats::default(),
            held: false,
        }
    }
}

/// A unit decoded, ready to be offered ([`Assembler::offer_prepared`]). Decoding reads
/// nothing shared, so it runs before the assembler is locked, and concurrent requests decode
/// in parallel.
pub struct Prepared<'a> {
    bytes: &'a [u8],
    encoding: Encoding,
    view: view::Decoded<'a>,
}

impl<'a> Prepared<'a> {
    /// Decodes `bytes` (in `encoding`): in place when the fast reader can, else with prost
    /// into `slot`, which the unit borrows. A unit that cannot be decoded is an error.
    pub fn decode(
        bytes: &'a [u8],
        encoding: Encoding,
        slot: &'a mut Option<ExportTraceServiceRequest>,
    ) -> Result<Prepared<'a>, PipelineError> {
        if encoding == Encoding::Protobuf {
            if let Ok(view) = view::Decoded::decode(bytes) {
                return Ok(Prepared {
                    bytes,
                    encoding,
                    view,
                });
            }
        }
        let req = slot.insert(otlp::decode(bytes, encoding)?);
        Ok(Prepared {
            bytes,
            encoding,
            view: view::Decoded::from_prost(req),
        })
    }

    /// Whether units of `pipeline` are processed each on its own, as they come, with nothing
    /// shared between requests (its trace memory is off, so nothing waits either): then
    /// [`Prepared::process`] needs no assembler, and no lock.
    pub fn stands_alone(pipeline: &Pipeline) -> bool {
        pipeline.memory.is_off()
    }

    /// Processes the unit now, on its own, and appends its rows to `acc` (what an assembler
    /// does when assembly is off).
    pub fn process<T>(self, pipeline: &Pipeline, tag: T, acc: &mut Accumulator) -> Offered<T> {
        let mut own = Stats::default();
        pipeline.append_view(&self.view, &mut acc.builder, &mut own);
        acc.rows += own.spans as usize;
        Offered {
            rejected: own.rejected.clone(),
            released: vec![tag],
            stats: own,
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

    /// Offers a unit (`bytes` in `encoding`, in `group`). Rows of every unit it releases go
    /// to `acc`. A unit that cannot be decoded is an error, and nothing is kept of it.
    /// The same as [`Prepared::decode`] then [`Assembler::offer_prepared`].
    #[allow(clippy::too_many_arguments)] // the unit's parts, its tag, the clock and the sink
    pub fn offer(
        &mut self,
        pipeline: &Pipeline,
        bytes: &[u8],
        encoding: Encoding,
        group: u64,
        tag: T,
        now: Instant,
        acc: &mut Accumulator,
    ) -> Result<Offered<T>, PipelineError> {
        let mut slot = None;
        let unit = Prepared::decode(bytes, encoding, &mut slot)?;
        Ok(self.offer_prepared(pipeline, unit, group, tag, now, acc))
    }

    /// Offers a unit decoded beforehand ([`Prepared::decode`], which needs no lock on the
    /// assembler). Rows of every unit it releases go to `acc`.
    pub fn offer_prepared(
        &mut self,
        pipeline: &Pipeline,
        unit: Prepared<'_>,
        group: u64,
        tag: T,
        now: Instant,
        acc: &mut Accumulator,
    ) -> Offered<T> {
        offer_split(
            || self,
            pipeline,
            &unit,
            (group, tag),
            acc,
            move || now,
            || {},
        )
    }

    /// Offers a unit through the lock that guards `assembler`, holding it only while the unit
    /// is classified and waiting units are released: the unit's spans and resources are read
    /// before (they read nothing shared) and its rows are built after, so concurrent callers
    /// spend most of their time outside it. `held` runs under the lock when the unit waits
    /// (before another caller can release it). Rows of every unit it releases go to `acc`.
    pub fn offer_through(
        assembler: &std::sync::Mutex<Assembler<T>>,
        pipeline: &Pipeline,
        unit: Prepared<'_>,
        group: u64,
        tag: T,
        acc: &mut Accumulator,
        held: impl FnOnce(),
    ) -> Offered<T> {
        let lock = || assembler.lock().unwrap_or_else(|e| e.into_inner());
        offer_split(lock, pipeline, &unit, (group, tag), acc, Instant::now, held)
    }

    /// [`Assembler::offer_prepared`] up to the rows of the offered unit when they can be built
    /// at once: those are returned, to be built ([`build_into`]) with or without the lock.
    /// `gathered` is the unit's spans ([`Pipeline::gather`], which counted its invalid spans
    /// in `rejected`) and their facts ([`Pipeline::read_facts`]), which borrow what the memory
    /// recalls for them from `recalled`.
    #[allow(clippy::too_many_arguments)] // the unit read three ways, its place and the sink
    fn offer_gathered<'g>(
        &mut self,
        pipeline: &Pipeline,
        unit: &Prepared<'_>,
        (gathered, facts): (&'g Gathered<'g>, Vec<Facts<'g>>),
        recalled: &'g mut Vec<Option<Seen>>,
        rejected: Rejections,
        (group, tag, now): (u64, T, Instant),
        acc: &mut Accumulator,
    ) -> (Offered<T>, Option<Decided<'g>>) {
        if self.config.wait.is_zero() || Prepared::stands_alone(pipeline) {
            // Processed at once, as it comes (what [`Prepared::process`] does).
            let mut stats = Stats::default();
            let rows = pipeline.decide(
                gathered,
                facts,
                recalled,
                &[Want::Emit],
                &mut stats,
                &mut Vec::new(),
            );
            stats.rejected.merge(&rejected);
            let out = Offered {
                rejected,
                released: vec![tag],
                stats,
                held: false,
            };
            return (out, Some(rows));
        }
        let d = &unit.view;
        let mut stats = Stats::default();
        // Trace ids are only read when something waits (the common case costs one pass).
        let mut traces = if self.units.is_empty() {
            Vec::new()
        } else {
            trace_ids(d)
        };
        let mut context: Vec<u64> = traces
            .iter()
            .filter_map(|t| self.traces.get(t))
            .flatten()
            .copied()
            .collect();
        context.sort_unstable();
        context.dedup();
        let blocked = self.groups.get(&group).is_some_and(|q| !q.is_empty());
        if context.is_empty() && !blocked {
            // Nothing of these traces waits: one pass, rows now if settled.
            let rows = pipeline.decide(
                gathered,
                facts,
                recalled,
                &[Want::EmitIfSettled],
                &mut stats,
                &mut Vec::new(),
            );
            if rows.settled[0] {
                let out = Offered {
                    rejected,
                    released: vec![tag],
                    stats,
                    held: false,
                };
                return (out, Some(rows));
            }
            drop(rows);
            if self.units.is_empty() {
                traces = trace_ids(d);
            }
            let seq = self.hold(unit.bytes, unit.encoding, group, traces, false, tag, now);
            let mut out = Offered {
                rejected,
                released: Vec::new(),
                stats,
                held: false,
            };
            self.enforce_caps(pipeline, now, acc, &mut out);
            out.held = self.units.contains_key(&seq);
            return (out, None);
        }
        let seq = self.hold(unit.bytes, unit.encoding, group, traces, false, tag, now);
        context.push(seq);
        let mut out = Offered {
            rejected,
            released: Vec::new(),
            stats,
            held: false,
        };
        let first = self.observe(pipeline, &context);
        if let Some(r) = first {
            out.rejected = r;
        }
        self.release(pipeline, now, acc, &mut out);
        self.enforce_caps(pipeline, now, acc, &mut out);
        out.held = self.units.contains_key(&seq);
        (out, None)
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
            return Offered {
                rejected: Rejections::default(),
                released: vec![tag],
                stats: Stats::default(),
                held: false,
            };
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

fn trace_ids(d: &view::Decoded<'_>) -> Vec<u128> {
    let events = d.events();
    let mut t: Vec<u128> = d
        .spans(&events)
        .iter()
        .filter(|s| s.trace_id.len() == 16)
        .map(|s| super::trace_u128(s.trace_id))
        .collect();
    t.sort_unstable();
    t.dedup();
    t
}

#[cfg(test)]
mod tests;

/// Appends the rows `pipeline` decided ([`Pipeline::decide`]) to `acc`, counted in `stats`.
fn build_into(pipeline: &Pipeline, rows: Decided<'_>, acc: &mut Accumulator, stats: &mut Stats) {
    let before = stats.spans;
    pipeline.build(rows, &mut acc.builder, stats);
    acc.rows += (stats.spans - before) as usize;
}

/// The offer of a unit in three steps: its spans and facts read before `reach` gives the
/// assembler (a lock, or a plain borrow), the classification and what it releases with it
/// (`now` read once the assembler is in hand; `held` called there if the unit waits), and the
/// unit's own rows built after the assembler is let go.
fn offer_split<T, A: std::ops::DerefMut<Target = Assembler<T>>>(
    reach: impl FnOnce() -> A,
    pipeline: &Pipeline,
    unit: &Prepared<'_>,
    (group, tag): (u64, T),
    acc: &mut Accumulator,
    now: impl FnOnce() -> Instant,
    held: impl FnOnce(),
) -> Offered<T> {
    let events = unit.view.events();
    let mut rejected = [Rejections::default()];
    let gathered = pipeline.gather(
        std::slice::from_ref(&unit.view),
        std::slice::from_ref(&events),
        &mut rejected,
    );
    let [rejected] = rejected;
    let facts = pipeline.read_facts(&gathered);
    let mut recalled = Vec::new();
    let mut a = reach();
    let now = now();
    let (mut out, rows) = a.offer_gathered(
        pipeline,
        unit,
        (&gathered, facts),
        &mut recalled,
        rejected,
        (group, tag, now),
        acc,
    );
    if out.held {
        held();
    }
    drop(a);
    if let Some(rows) = rows {
        build_into(pipeline, rows, acc, &mut out.stats);
    }
    out
}
