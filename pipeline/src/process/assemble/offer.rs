//! Offering a unit: its spans and facts read before the assembler is reached, the
//! classification and what it releases under it, and the unit's own rows built after.

use std::time::Instant;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;

use super::{Assembler, Offered};
use crate::error::PipelineError;
use crate::otlp::{self, view, Encoding};
use crate::process::classify::extract::Facts;
use crate::process::memory::Seen;
use crate::process::{
    trace_u128, Accumulator, Decided, Gathered, Pipeline, Rejections, Stats, Want,
};

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
        Offered::at_once(tag, own.rejected.clone(), own)
    }
}

impl<T> Assembler<T> {
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
        // Processed at once, as it comes (what [`Prepared::process`] does), when nothing
        // waits or this pipeline never needs relatives.
        let at_once = self.config.wait.is_zero() || Prepared::stands_alone(pipeline);
        let d = &unit.view;
        let mut stats = Stats::default();
        // Trace ids are only read when something waits (the common case costs one pass).
        let mut traces = if at_once || self.units.is_empty() {
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
        let blocked = !at_once && self.groups.get(&group).is_some_and(|q| !q.is_empty());
        if context.is_empty() && !blocked {
            // Nothing of these traces waits: one pass, rows now if settled (or at once).
            let want = if at_once {
                Want::Emit
            } else {
                Want::EmitIfSettled
            };
            let rows = pipeline.decide(
                gathered,
                facts,
                recalled,
                &[want],
                &mut stats,
                &mut Vec::new(),
            );
            if at_once {
                stats.rejected.merge(&rejected);
            }
            if at_once || rows.settled[0] {
                let out = Offered::at_once(tag, rejected, stats);
                return (out, Some(rows));
            }
            drop(rows);
            if self.units.is_empty() {
                traces = trace_ids(d);
            }
            let seq = self.hold(unit.bytes, unit.encoding, group, traces, false, tag, now);
            let mut out = Offered::kept(rejected, stats);
            self.enforce_caps(pipeline, now, acc, &mut out);
            out.held = self.units.contains_key(&seq);
            return (out, None);
        }
        let seq = self.hold(unit.bytes, unit.encoding, group, traces, false, tag, now);
        context.push(seq);
        let mut out = Offered::kept(rejected, stats);
        let first = self.observe(pipeline, &context);
        if let Some(r) = first {
            out.rejected = r;
        }
        self.release(pipeline, now, acc, &mut out);
        self.enforce_caps(pipeline, now, acc, &mut out);
        out.held = self.units.contains_key(&seq);
        (out, None)
    }
}

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

fn trace_ids(d: &view::Decoded<'_>) -> Vec<u128> {
    let events = d.events();
    let mut t: Vec<u128> = d
        .spans(&events)
        .iter()
        .filter(|s| s.trace_id.len() == 16)
        .map(|s| trace_u128(s.trace_id))
        .collect();
    t.sort_unstable();
    t.dedup();
    t
}
