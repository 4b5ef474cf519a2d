//! decode → classify → redact/truncate → Arrow: the one path every source uses.
//!
//! [`Pipeline::process`] takes a decoded OTLP request and returns a [`RecordBatch`] with the
//! columns of [`toolspan_schema::columns::spans_schema`], plus [`Stats`]. Spans are classified
//! with the context of the whole request (children tell a failed call where it failed) and of
//! what the pipeline's [`memory`] holds of recent requests: a parent seen earlier passes on its
//! tool, call id and attempt, and children seen earlier tell a late call or attempt its error
//! type and attempt count, so a trace split over requests classifies as a whole.

pub mod assemble;
mod builder;
pub mod classify;
pub mod memory;
mod shapes;
mod values;

use std::collections::HashMap;

use arrow::record_batch::RecordBatch;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;

use crate::error::PipelineError;
use crate::otlp::{self, view, Encoding};
use crate::redact::{RedactionCounts, Redactor};
use builder::{Builder, ResourceCtx};
use classify::extract::Facts;
use classify::tree::{self, Node};
use classify::Rules;
use memory::{Key, MemoryConfig, Remember, TraceMemory};

/// Why spans were rejected, for the partial-success answer and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rejections {
    /// The trace id is not 16 bytes or is all zero.
    pub bad_trace_id: u64,
    /// The span id is not 8 bytes or is all zero.
    pub bad_span_id: u64,
    /// The parent span id is neither empty nor 8 bytes.
    pub bad_parent_id: u64,
    /// The start time is zero.
    pub bad_time: u64,
}

impl Rejections {
    /// All rejected spans.
    pub fn total(&self) -> u64 {
        self.bad_trace_id + self.bad_span_id + self.bad_parent_id + self.bad_time
    }

    /// A message naming the reasons, as OTLP's partial success carries.
    pub fn message(&self) -> String {
        let mut parts = Vec::new();
        for (n, what) in [
            (self.bad_trace_id, "trace id not 16 non-zero bytes"),
            (self.bad_span_id, "span id not 8 non-zero bytes"),
            (
                self.bad_parent_id,
                "parent span id neither empty nor 8 bytes",
            ),
            (self.bad_time, "start time missing"),
        ] {
            if n > 0 {
                parts.push(format!("{n} span(s) rejected: {what}"));
            }
        }
        parts.join("; ")
    }

    /// Adds another request's rejections.
    pub fn merge(&mut self, o: &Rejections) {
        self.bad_trace_id += o.bad_trace_id;
        self.bad_span_id += o.bad_span_id;
        self.bad_parent_id += o.bad_parent_id;
        self.bad_time += o.bad_time;
    }
}

/// What processing one request did.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// Spans accepted into the batch.
    pub spans: u64,
    /// Spans rejected, by reason.
    pub rejected: Rejections,
    /// Secrets redacted, by kind.
    pub redactions: RedactionCounts,
    /// Spans whose tool result leaked internals.
    pub leaked_internals: u64,
    /// Spans with status error.
    pub errors: u64,
}

impl Stats {
    /// Adds another request's stats.
    pub fn merge(&mut self, o: &Stats) {
        self.spans += o.spans;
        self.rejected.merge(&o.rejected);
        self.redactions.merge(&o.redactions);
        self.leaked_internals += o.leaked_internals;
        self.errors += o.errors;
    }
}

/// A processed request.
#[derive(Debug)]
pub struct Processed {
    /// The spans, one row each.
    pub batch: RecordBatch,
    /// What happened.
    pub stats: Stats,
}

/// Several requests processed into one batch: each is decoded, classified and redacted on its
/// own (exactly as [`Pipeline::process_bytes`] would), and their rows are appended to shared
/// Arrow builders until [`Accumulator::take`].
#[derive(Default)]
pub struct Accumulator {
    builder: Option<Builder>,
    rows: usize,
}

impl Accumulator {
    /// An empty accumulator.
    pub fn new() -> Accumulator {
        Accumulator::default()
    }

    /// Processes one encoded request with `pipeline` and appends its rows. Returns that
    /// request's stats; on a decoding error nothing is appended.
    pub fn add_bytes(
        &mut self,
        pipeline: &Pipeline,
        bytes: &[u8],
        encoding: Encoding,
    ) -> Result<Stats, PipelineError> {
        let mut stats = Stats::default();
        if encoding == Encoding::Protobuf {
            if let Ok(d) = view::Decoded::decode(bytes) {
                pipeline.append_view(&d, &mut self.builder, &mut stats);
                self.rows += stats.spans as usize;
                return Ok(stats);
            }
        }
        let req = otlp::decode(bytes, encoding)?;
        pipeline.append_view(
            &view::Decoded::from_prost(&req),
            &mut self.builder,
            &mut stats,
        );
        self.rows += stats.spans as usize;
        Ok(stats)
    }

    /// Rows appended so far.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The rows appended so far as one batch (`None` when there are none); the accumulator is
    /// empty again afterwards.
    pub fn take(&mut self) -> Result<Option<RecordBatch>, PipelineError> {
        self.rows = 0;
        match self.builder.take() {
            Some(b) => b.finish().map(Some),
            None => Ok(None),
        }
    }
}

/// The configured pipeline. Cheap to share (`Arc`) across workers.
pub struct Pipeline {
    redactor: Redactor,
    rules: Rules,
    memory: TraceMemory,
    assembly: assemble::AssembleConfig,
    assembly_counters: std::sync::Arc<assemble::Counters>,
    /// Whether payload shapes are taken ([`Pipeline::with_shapes`]).
    shapes: bool,
}

/// What a [`Pipeline::pass`] does with a request's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Want {
    /// Classify and remember only.
    Observe,
    /// Emit the rows if every span of the request is settled.
    EmitIfSettled,
    /// Emit the rows as they classify now.
    Emit,
}

impl Pipeline {
    /// Built-in rules and redaction patterns.
    pub fn builtin() -> Pipeline {
        Pipeline {
            redactor: Redactor::builtin(),
            rules: Rules::builtin(),
            memory: TraceMemory::new(MemoryConfig::default()),
            assembly: assemble::AssembleConfig::default(),
            assembly_counters: Default::default(),
            shapes: true,
        }
    }

    /// A pipeline with a user rules file's text and extra redaction regexes.
    pub fn new(
        rules_text: Option<&str>,
        redact_patterns: &[String],
    ) -> Result<Pipeline, PipelineError> {
        let rules = match rules_text {
            Some(t) => Rules::with_user_rules(t)?,
            None => Rules::builtin(),
        };
        let redactor = Redactor::new(redact_patterns).map_err(|e| {
            PipelineError::Config(format!("redaction pattern {:?}: {}", e.pattern, e.message))
        })?;
        Ok(Pipeline {
            redactor,
            rules,
            memory: TraceMemory::new(MemoryConfig::default()),
            assembly: assemble::AssembleConfig::default(),
            assembly_counters: Default::default(),
            shapes: true,
        })
    }

    /// This pipeline with another trace memory ([`memory`]): how long and how much it
    /// remembers of recent spans, so that a trace split over requests classifies as a whole.
    pub fn with_memory(mut self, config: MemoryConfig) -> Pipeline {
        self.memory = TraceMemory::new(config);
        self
    }

    /// This pipeline with or without the payload shape columns (`input_shape`, `output_shape`,
    /// `input_shape_doc`, `output_shape_doc`; on by default). Off, no payload's shape is taken
    /// and the four columns are left null; every other column is the same. Only for measuring
    /// what the shapes cost (`bench/encode` with `TOOLSPAN_BENCH_SHAPES=off` or `ab`): the
    /// `answer_shapes` view, the shape metrics and the tool page's shape diff read them.
    pub fn with_shapes(mut self, on: bool) -> Pipeline {
        self.shapes = on;
        self
    }

    /// This pipeline with other assembly settings ([`assemble`]): how long and how much the
    /// sources using it hold requests whose spans miss a relative.
    pub fn with_assembly(mut self, config: assemble::AssembleConfig) -> Pipeline {
        self.assembly = config;
        self
    }

    /// The assembly settings.
    pub fn assembly(&self) -> assemble::AssembleConfig {
        self.assembly
    }

    /// The figures of every assembler made with [`assemble::Assembler::for_pipeline`].
    pub fn assembly_stats(&self) -> assemble::AssemblyStats {
        self.assembly_counters.read()
    }

    /// The trace memory's figures (entries, bytes, evictions), for metrics.
    pub fn memory_stats(&self) -> memory::MemoryStats {
        self.memory.stats()
    }

    /// The redactor, for sources that keep other text (e.g. dead-letter reasons).
    pub fn redactor(&self) -> &Redactor {
        &self.redactor
    }

    /// Decodes and processes an encoded payload.
    ///
    /// Protobuf is read in place ([`view`]: strings and ids borrowed from `bytes`); payloads
    /// that reader leaves to prost, and OTLP/JSON, go through prost's types. Both give the
    /// same result.
    pub fn process_bytes(
        &self,
        bytes: &[u8],
        encoding: Encoding,
    ) -> Result<Processed, PipelineError> {
        if encoding == Encoding::Protobuf {
            if let Ok(d) = view::Decoded::decode(bytes) {
                return self.process_view(&d);
            }
        }
        let req = otlp::decode(bytes, encoding)?;
        self.process(&req)
    }

    /// Classifies, redacts and converts a decoded request.
    pub fn process(&self, req: &ExportTraceServiceRequest) -> Result<Processed, PipelineError> {
        self.process_view(&view::Decoded::from_prost(req))
    }

    fn process_view(&self, d: &view::Decoded<'_>) -> Result<Processed, PipelineError> {
        let mut stats = Stats::default();
        let mut builder = None;
        self.append_view(d, &mut builder, &mut stats);
        let builder = match builder {
            Some(b) => b,
            None => Builder::with_capacity(0, 0, self.shapes),
        };
        let batch = builder.finish()?;
        Ok(Processed { batch, stats })
    }

    /// Processes one decoded request into `builder` (created, sized for this request, when
    /// `None`). Nothing here fails: invalid spans are counted in `stats` and left out.
    fn append_view(&self, d: &view::Decoded<'_>, builder: &mut Option<Builder>, stats: &mut Stats) {
        let mut rejected = [Rejections::default()];
        self.pass(
            std::slice::from_ref(d),
            &[Want::Emit],
            builder,
            stats,
            &mut rejected,
        );
        stats.rejected.merge(&rejected[0]);
    }

    /// One classification pass over several requests at once (they classify as one request
    /// would), with the memory for what is not among them. Returns, per request, whether all
    /// its spans are *settled*: nothing still missing could change their rows (see
    /// [`assemble`]). Rows of the requests `want` says are appended to `builder` and counted
    /// in `stats`; every request's rejections go to `rejected[v]`. Everything seen is
    /// remembered, spans of requests neither settled nor emitted as pending.
    pub(crate) fn pass(
        &self,
        views: &[view::Decoded<'_>],
        want: &[Want],
        builder: &mut Option<Builder>,
        stats: &mut Stats,
        rejected: &mut [Rejections],
    ) -> Vec<bool> {
        self.pass_linked(views, want, builder, stats, rejected, &mut Vec::new())
    }

    /// [`Pipeline::pass`], also telling which requests hold spans of one logical call
    /// (`linked`, pairs of request indices): their rows depend on each other, so they are
    /// released together.
    pub(crate) fn pass_linked(
        &self,
        views: &[view::Decoded<'_>],
        want: &[Want],
        builder: &mut Option<Builder>,
        stats: &mut Stats,
        rejected: &mut [Rejections],
        linked: &mut Vec<(usize, usize)>,
    ) -> Vec<bool> {
        let events: Vec<Vec<view::Event<'_>>> = views.iter().map(|d| d.events()).collect();
        let gathered = self.gather(views, &events, rejected);
        let facts = self.read_facts(&gathered);
        let mut recalled = Vec::new();
        let decided = self.decide(&gathered, facts, &mut recalled, want, stats, linked);
        let settled = decided.settled.clone();
        self.build(decided, builder, stats);
        settled
    }

    /// The first part of a pass, which reads nothing shared and may run before a lock: the
    /// requests' spans in one list, their resources read and redacted, invalid spans counted
    /// in `rejected[v]` and left out. `events[v]` is `views[v]`'s [`view::Decoded::events`].
    pub(crate) fn gather<'s>(
        &self,
        views: &'s [view::Decoded<'_>],
        events: &'s [Vec<view::Event<'s>>],
        rejected: &mut [Rejections],
    ) -> Gathered<'s> {
        let mut spans: Vec<view::Span<'s>> = Vec::new();
        let mut view_of: Vec<usize> = Vec::new();
        let mut res_counts = RedactionCounts::default();
        let mut resources: Vec<ResourceCtx> = Vec::new();
        // Each resource's `telemetry.sdk.name`, for taxonomy declarations.
        let mut sdks: Vec<Option<&'s str>> = Vec::new();
        for (v, d) in views.iter().enumerate() {
            let base = resources.len();
            for attrs in d.resources() {
                resources.push(ResourceCtx::new(attrs, &self.redactor, &mut res_counts));
                sdks.push(
                    attrs
                        .iter()
                        .find(|kv| kv.key == "telemetry.sdk.name")
                        .and_then(|kv| values::as_str(kv.value)),
                );
            }
            // One request (the usual pass) keeps its vector of spans as it is; more are
            // appended to it.
            let mut more = d.spans(&events[v]);
            for span in &mut more {
                span.resource += base;
            }
            view_of.resize(view_of.len() + more.len(), v);
            if spans.is_empty() {
                spans = more;
            } else {
                spans.append(&mut more);
            }
        }
        let mut valid = Vec::with_capacity(spans.len());
        // A framework's reruns of a tool call that names no call id share the first run's
        // span id as theirs (tree::merge), so that attempts join their call: rendered here
        // for the spans that count their runs (rare), and lent to their facts.
        let mut rerun_ids: HashMap<usize, String> = HashMap::new();
        for (i, span) in spans.iter().enumerate() {
            if let Some((sid, pid)) = validate(span, &mut rejected[view_of[i]]) {
                if classify::extract::counts_runs(span) {
                    rerun_ids.insert(valid.len(), format!("{sid:016x}"));
                }
                valid.push((i, trace_u128(span.trace_id), sid, pid));
            }
        }
        // Each valid span's key and its index among the facts (built in the same order).
        let in_batch: HashMap<Key, usize, foldhash::fast::RandomState> = valid
            .iter()
            .enumerate()
            .map(|(k, &(_, trace, sid, _))| ((trace, sid), k))
            .collect();
        // Each span's parent: here (its index), or missing here and asked of the memory (its
        // index in `missing`; the keys are needed before the facts borrow the answers).
        let mut missing: Vec<Key> = Vec::new();
        let mut parents: Vec<(Option<u32>, Option<usize>)> = Vec::with_capacity(valid.len());
        for (k, &(_, trace, _, pid)) in valid.iter().enumerate() {
            let parent = match pid.map(|p| (trace, p)) {
                None => (None, None),
                Some(key) => match in_batch.get(&key) {
                    // A span that names itself as its parent has none.
                    Some(&p) if p == k => (None, None),
                    Some(&p) => (u32::try_from(p).ok(), None),
                    None => {
                        missing.push(key);
                        (None, Some(missing.len() - 1))
                    }
                },
            };
            parents.push(parent);
        }
        Gathered {
            views: views.len(),
            spans,
            view_of,
            resources,
            sdks,
            res_counts,
            valid,
            rerun_ids,
            in_batch,
            parents,
            missing,
        }
    }

    /// Each valid span's facts ([`Facts::read`]: its attributes, and its result's body): what
    /// a pass reads of every span on its own, before classification, which needs no lock.
    pub(crate) fn read_facts<'g>(&self, g: &'g Gathered<'g>) -> Vec<Facts<'g>> {
        g.valid
            .iter()
            .enumerate()
            .map(|(k, &(i, _, sid, pid))| {
                let span = &g.spans[i];
                let mut f = Facts::read(span, span.resource, sid, pid);
                f.rerun_id = g.rerun_ids.get(&k).map(String::as_str);
                if f.weak_error.is_some()
                    && self
                        .rules
                        .declares_taxonomy(span.scope, g.sdks[span.resource])
                {
                    f.explicit_error = f.weak_error.take();
                }
                f
            })
            .collect()
    }

    /// The classification of a pass, which reads and feeds the trace memory (where requests
    /// must come one at a time): which requests are settled and which are to be emitted
    /// (`want`, per request), with the valid spans' `facts` ([`Pipeline::read_facts`])
    /// completed. What the memory recalls goes to `recalled`, which the facts borrow.
    /// Redactions of the resources are counted in `stats`; `linked` as in
    /// [`Pipeline::pass_linked`].
    pub(crate) fn decide<'g>(
        &self,
        g: &'g Gathered<'g>,
        mut facts: Vec<Facts<'g>>,
        recalled: &'g mut Vec<Option<memory::Seen>>,
        want: &[Want],
        stats: &mut Stats,
        linked: &mut Vec<(usize, usize)>,
    ) -> Decided<'g> {
        let (valid, in_batch, parents) = (&g.valid, &g.in_batch, &g.parents);
        *recalled = self.memory.recall(&g.missing);
        let recalled: &'g [Option<memory::Seen>] = recalled;
        let mut nodes: Vec<Node<'_>> = Vec::with_capacity(valid.len());
        let mut fact_view: Vec<usize> = Vec::with_capacity(valid.len());
        for ((&(i, trace, _, _), &(parent, m)), f) in valid.iter().zip(parents).zip(&facts) {
            let remembered = m.and_then(|m| recalled[m].as_ref());
            nodes.push(Node::new(f, trace, parent, remembered));
            fact_view.push(g.view_of[i]);
        }
        stats.redactions.merge(&g.res_counts);
        let tree::Classified {
            settled: settled_span,
            told,
            same_call,
        } = tree::classify(&self.rules, &self.memory, &mut facts, &mut nodes);
        for (a, b) in same_call {
            let (va, vb) = (fact_view[a], fact_view[b]);
            if va != vb {
                linked.push((va, vb));
            }
        }
        let mut settled = vec![true; g.views];
        for (k, &v) in fact_view.iter().enumerate() {
            if !settled_span[k] {
                settled[v] = false;
            }
        }
        let emit: Vec<bool> = want
            .iter()
            .zip(&settled)
            .map(|(w, &s)| match w {
                Want::Observe => false,
                Want::EmitIfSettled => s,
                Want::Emit => true,
            })
            .collect();
        if !self.memory.is_off() {
            let seen = nodes.iter().zip(&fact_view).map(|(n, &v)| {
                let seen = Remember {
                    stage: n.remembered_stage(),
                    pending: !(settled[v] || emit[v]),
                    attempt: n.attempt,
                    ids: (n.tool, n.call_id, n.agent),
                };
                ((n.trace, n.span_id), seen)
            });
            // What children told parents is kept for parents still to come: not for a parent
            // here whose row is written now (it is never processed again).
            let told = told
                .into_iter()
                .filter(|(key, _)| in_batch.get(key).is_none_or(|&k| !emit[fact_view[k]]))
                .collect();
            self.memory.remember(seen, told);
        }
        Decided {
            facts,
            fact_view,
            emit,
            settled,
            resources: &g.resources,
        }
    }

    /// The last part of a pass, which reads nothing shared and may run after a lock: the rows
    /// of the requests `decided` emits, appended to `builder` (created, sized for them, when
    /// `None`) and counted in `stats`.
    pub(crate) fn build(
        &self,
        decided: Decided<'_>,
        builder: &mut Option<Builder>,
        stats: &mut Stats,
    ) {
        let Decided {
            facts,
            fact_view,
            emit,
            resources,
            ..
        } = decided;
        if !emit.iter().any(|&e| e) {
            return;
        }
        let builder = builder.get_or_insert_with(|| {
            let resource_bytes = facts
                .iter()
                .map(|f| resources[f.resource].attributes_len())
                .sum();
            Builder::with_capacity(facts.len(), resource_bytes, self.shapes)
        });
        for (f, &v) in facts.iter().zip(&fact_view) {
            if emit[v] {
                builder.append(f, &resources[f.resource], &self.redactor, stats);
                stats.spans += 1;
            }
        }
    }
}

/// The spans of a pass's requests, read and checked before classification
/// ([`Pipeline::gather`]).
pub(crate) struct Gathered<'s> {
    /// How many requests.
    views: usize,
    spans: Vec<view::Span<'s>>,
    /// Each span's request.
    view_of: Vec<usize>,
    resources: Vec<ResourceCtx>,
    sdks: Vec<Option<&'s str>>,
    res_counts: RedactionCounts,
    /// The valid spans: index in `spans`, trace, span id, parent id.
    valid: Vec<(usize, u128, u64, Option<u64>)>,
    /// By index in `valid`, the rerun id of the spans that count a framework's runs.
    rerun_ids: HashMap<usize, String>,
    /// Each valid span's key and its index in `valid`.
    in_batch: HashMap<Key, usize, foldhash::fast::RandomState>,
    /// Each valid span's parent: here (its index in `valid`), or missing here and asked of
    /// the memory (its index in `missing`).
    parents: Vec<(Option<u32>, Option<usize>)>,
    /// The parents to ask the memory for.
    missing: Vec<Key>,
}

/// What a pass decided: each valid span's facts and request, and which requests are settled
/// and emitted ([`Pipeline::decide`]); their rows are built by [`Pipeline::build`].
pub(crate) struct Decided<'g> {
    facts: Vec<Facts<'g>>,
    fact_view: Vec<usize>,
    emit: Vec<bool>,
    /// Per request, whether every span of it is settled.
    pub(crate) settled: Vec<bool>,
    resources: &'g [ResourceCtx],
}

/// A trace id (16 bytes, checked by [`validate`]) as a number.
fn trace_u128(b: &[u8]) -> u128 {
    let mut a = [0u8; 16];
    let n = b.len().min(16);
    a[..n].copy_from_slice(&b[..n]);
    u128::from_be_bytes(a)
}

fn id_u64(b: &[u8]) -> Option<u64> {
    let arr: [u8; 8] = b.try_into().ok()?;
    let v = u64::from_be_bytes(arr);
    (v != 0).then_some(v)
}

/// Checks ids and times; returns (span id, parent id) or counts the rejection.
fn validate(span: &view::Span<'_>, rej: &mut Rejections) -> Option<(u64, Option<u64>)> {
    if span.trace_id.len() != 16 || span.trace_id.iter().all(|&b| b == 0) {
        rej.bad_trace_id += 1;
        return None;
    }
    let Some(sid) = id_u64(span.span_id) else {
        rej.bad_span_id += 1;
        return None;
    };
    let pid = if span.parent_span_id.is_empty() {
        None
    } else {
        match span.parent_span_id.len() {
            8 => id_u64(span.parent_span_id),
            _ => {
                rej.bad_parent_id += 1;
                return None;
            }
        }
    };
    if span.start_time_unix_nano == 0 {
        rej.bad_time += 1;
        return None;
    }
    Some((sid, pid))
}

#[cfg(test)]
mod tests;
