//! decode → classify → redact/truncate → Arrow: the one path every source uses.
//!
//! [`Pipeline::process`] takes a decoded OTLP request and returns a [`RecordBatch`] with the
//! columns of [`toolspan_schema::columns::spans_schema`], plus [`Stats`]. Spans are classified
//! with the context of the whole request (children tell a failed call where it failed) and of
//! what the pipeline's [`memory`] holds of recent requests: a parent seen earlier passes on its
//! tool, call id and attempt, and children seen earlier tell a late call or attempt its error
//! type and attempt count, so a trace split over requests classifies as a whole.

pub mod assemble;
mod body;
mod builder;
mod extract;
pub mod memory;
mod values;

use std::collections::HashMap;

use arrow::record_batch::RecordBatch;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;

use crate::classify::{ErrorType, Rules, Stage};
use crate::error::PipelineError;
use crate::otlp::{self, view, Encoding};
use crate::redact::{RedactionCounts, Redactor};
use builder::{Builder, ResourceCtx};
use extract::Facts;
use memory::{Ids, Key, MemoryConfig, Seen, Told, TraceMemory};

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

/// Ancestor walks stop here, so a cyclic or absurdly deep parent chain cannot loop.
const MAX_DEPTH: u32 = 256;

impl Pipeline {
    /// Built-in rules and redaction patterns.
    pub fn builtin() -> Pipeline {
        Pipeline {
            redactor: Redactor::builtin(),
            rules: Rules::builtin(),
            memory: TraceMemory::new(MemoryConfig::default()),
            assembly: assemble::AssembleConfig::default(),
            assembly_counters: Default::default(),
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
        })
    }

    /// This pipeline with another trace memory ([`memory`]): how long and how much it
    /// remembers of recent spans, so that a trace split over requests classifies as a whole.
    pub fn with_memory(mut self, config: MemoryConfig) -> Pipeline {
        self.memory = TraceMemory::new(config);
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
            None => Builder::with_capacity(0, 0),
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
        let events: Vec<Vec<view::Event<'_>>> = views.iter().map(|d| d.events()).collect();
        let mut spans: Vec<view::Span<'_>> = Vec::new();
        let mut view_of: Vec<usize> = Vec::new();
        let mut res_counts = RedactionCounts::default();
        let mut resources: Vec<ResourceCtx> = Vec::new();
        for (v, d) in views.iter().enumerate() {
            let base = resources.len();
            resources.extend(
                d.resources()
                    .into_iter()
                    .map(|attrs| ResourceCtx::new(attrs, &self.redactor, &mut res_counts)),
            );
            for mut span in d.spans(&events[v]) {
                span.resource += base;
                spans.push(span);
                view_of.push(v);
            }
        }
        let mut valid = Vec::with_capacity(spans.len());
        for (i, span) in spans.iter().enumerate() {
            if let Some((sid, pid)) = validate(span, &mut rejected[view_of[i]]) {
                valid.push((i, sid, pid));
            }
        }
        // What the memory knows of parents missing here, and what earlier children told the
        // spans here (both need the keys before the facts borrow the answers).
        // Each valid span's key and its index among the facts (built in the same order).
        let in_batch: HashMap<Key, usize, foldhash::fast::RandomState> = valid
            .iter()
            .enumerate()
            .map(|(k, &(i, sid, _))| ((trace_u128(spans[i].trace_id), sid), k))
            .collect();
        let mut missing: Vec<Key> = Vec::new();
        let mut missing_of: Vec<Option<usize>> = Vec::with_capacity(valid.len());
        for &(i, _, pid) in &valid {
            let key = pid.map(|p| (trace_u128(spans[i].trace_id), p));
            match key.filter(|k| !in_batch.contains_key(k)) {
                Some(k) => {
                    missing_of.push(Some(missing.len()));
                    missing.push(k);
                }
                None => missing_of.push(None),
            }
        }
        let recalled = self.memory.recall(&missing);
        let mut facts: Vec<Facts<'_>> = Vec::with_capacity(valid.len());
        let mut fact_view: Vec<usize> = Vec::with_capacity(valid.len());
        for (k, &(i, sid, pid)) in valid.iter().enumerate() {
            let span = &spans[i];
            let mut f = Facts::read(span, span.resource, sid, pid);
            f.remembered_parent = missing_of[k].and_then(|m| recalled[m].as_ref());
            facts.push(f);
            fact_view.push(view_of[i]);
        }
        stats.redactions.merge(&res_counts);
        let (settled_span, told) = self.classify(&mut facts);
        let mut settled = vec![true; views.len()];
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
            // A call's attempts and stages share its tool, call id and agent: one allocation
            // per call, not one per span and field.
            let mut shared = Shared::default();
            let seen = facts
                .iter()
                .zip(&fact_view)
                .map(|(f, &v)| {
                    let key = (trace_u128(f.span.trace_id), f.span_id);
                    let seen = Seen {
                        stage: f.stage.unwrap_or(Stage::Other),
                        pending: !(settled[v] || emit[v]),
                        attempt: f.attempt,
                        ids: shared.get((f.tool, f.call_id, f.agent)),
                    };
                    (key, seen)
                })
                .collect();
            // What children told parents is kept for parents still to come: not for a parent
            // here whose row is written now (it is never processed again).
            let told = told
                .into_iter()
                .filter(|(key, _)| in_batch.get(key).is_none_or(|&k| !emit[fact_view[k]]))
                .collect();
            self.memory.remember(seen, told);
        }
        if !emit.iter().any(|&e| e) {
            return settled;
        }
        let builder = builder.get_or_insert_with(|| {
            let resource_bytes = facts
                .iter()
                .map(|f| resources[f.resource].attributes_len())
                .sum();
            Builder::with_capacity(facts.len(), resource_bytes)
        });
        for (f, &v) in facts.iter().zip(&fact_view) {
            if emit[v] {
                builder.append(f, &resources[f.resource], &self.redactor, stats);
                stats.spans += 1;
            }
        }
        settled
    }

    /// Classifies `facts` in place; returns, per span, whether it is settled (see
    /// [`assemble`]): its parent is here or remembered and settled itself (or it needs nothing
    /// from a parent), and, for a failed call or attempt, the failing child that decides its
    /// error type is known and settled (or the type needs no child).
    ///
    /// Also returns what children told their parents (error types, attempts), for the memory.
    fn classify(&self, facts: &mut [Facts<'_>]) -> (Vec<bool>, Vec<(Key, Told)>) {
        // Link parents (by span id within the request; trace ids must agree).
        let mut by_id: HashMap<u64, usize, foldhash::fast::RandomState> =
            HashMap::with_capacity_and_hasher(facts.len(), foldhash::fast::RandomState::default());
        for (i, f) in facts.iter().enumerate() {
            by_id.insert(f.span_id, i);
        }
        for i in 0..facts.len() {
            if let Some(pid) = facts[i].parent_id {
                if let Some(&p) = by_id.get(&pid) {
                    if p != i && facts[p].span.trace_id == facts[i].span.trace_id {
                        facts[i].parent = Some(p);
                    }
                }
            }
        }
        // Depths, so parents are handled before children (and children before parents).
        let mut depth: Vec<u32> = vec![u32::MAX; facts.len()];
        let mut chain = Vec::new();
        for i in 0..facts.len() {
            let mut cur = i;
            chain.clear();
            let mut base = 0;
            while depth[cur] == u32::MAX {
                chain.push(cur);
                if chain.len() as u32 > MAX_DEPTH {
                    base = MAX_DEPTH;
                    break;
                }
                match facts[cur].parent {
                    Some(p) => cur = p,
                    None => break,
                }
            }
            if depth[cur] != u32::MAX && !chain.contains(&cur) {
                base = depth[cur] + 1;
            }
            for (k, &c) in chain.iter().rev().enumerate() {
                depth[c] = (base + k as u32).min(MAX_DEPTH);
            }
        }
        let mut order: Vec<usize> = (0..facts.len()).collect();
        order.sort_unstable_by_key(|&i| (depth[i], i));

        // Top-down: stages that need rules or the parent, then inherited tool/call/attempt.
        for &i in &order {
            facts[i].depth = depth[i];
            let parent = facts[i].parent;
            facts[i].parent_stage = parent
                .and_then(|p| facts[p].stage)
                .or(facts[i].remembered_parent.map(|s| s.stage));
            if facts[i].stage.is_none() {
                if let Some(rule) = self.rules.match_stage(&facts[i], true) {
                    let (set, tool_attr) = (rule.set, rule.tool_attribute.clone());
                    facts[i].stage = Some(set);
                    if facts[i].tool.is_none() {
                        if let Some(key) = tool_attr {
                            let span = facts[i].span;
                            facts[i].tool = span
                                .attributes
                                .iter()
                                .find(|kv| kv.key == key)
                                .and_then(|kv| values::as_str(kv.value))
                                .filter(|s| !s.is_empty());
                        }
                    }
                } else if facts[i].span.parent_span_id.is_empty() {
                    facts[i].stage = Some(Stage::Agent);
                } else {
                    facts[i].stage = Some(Stage::Other);
                }
            }
            let inherited = match (parent, facts[i].remembered_parent) {
                (Some(p), _) => Some((
                    facts[p].tool,
                    facts[p].call_id,
                    facts[p].attempt,
                    facts[p].agent,
                    facts[p].stage,
                )),
                (None, Some(s)) => {
                    Some((s.tool(), s.call_id(), s.attempt, s.agent(), Some(s.stage)))
                }
                (None, None) => None,
            };
            if let Some((ptool, pcall, pattempt, pagent, pstage)) = inherited {
                let f = &mut facts[i];
                if f.tool.is_none() && pstage != Some(Stage::Agent) {
                    f.tool = ptool;
                }
                if f.call_id.is_none() {
                    f.call_id = pcall;
                }
                if f.agent.is_none() {
                    f.agent = pagent;
                }
                let is_stage = matches!(
                    f.stage,
                    Some(
                        Stage::Prepare | Stage::Send | Stage::Execute | Stage::Parse | Stage::Other
                    )
                );
                if f.attempt.is_none() && is_stage && pstage != Some(Stage::Call) {
                    f.attempt = pattempt;
                }
            }
        }

        // What children processed earlier told the spans that use it: calls and attempts (the
        // attempts seen, a failing child) and failed spans (a failing child). Looked up only
        // for those, and only when the memory holds anything told.
        let wanted: Vec<usize> = (0..facts.len())
            .filter(|&i| {
                facts[i].failed || matches!(facts[i].stage, Some(Stage::Call | Stage::Attempt))
            })
            .collect();
        if !wanted.is_empty() {
            let keys: Vec<Key> = wanted
                .iter()
                .map(|&i| (trace_u128(facts[i].span.trace_id), facts[i].span_id))
                .collect();
            for (&i, t) in wanted.iter().zip(self.memory.recall_told(&keys)) {
                if let Some(t) = t {
                    facts[i].child_error = t.child_error;
                    facts[i].attempts_seen = t.attempts_seen;
                }
            }
        }

        // Attempts counted on their call (the parent, or the call with the same call id).
        let mut call_by_id: HashMap<&str, usize, foldhash::fast::RandomState> = HashMap::default();
        for (i, f) in facts.iter().enumerate() {
            if f.stage == Some(Stage::Call) {
                if let Some(c) = f.call_id {
                    call_by_id.insert(c, i);
                }
            }
        }
        let logical_parent = |facts: &[Facts<'_>], i: usize| -> Option<usize> {
            let f = &facts[i];
            match f.parent {
                Some(p) if facts[p].stage == Some(Stage::Call) => Some(p),
                _ if f.stage == Some(Stage::Attempt) => {
                    f.call_id.and_then(|c| call_by_id.get(c).copied())
                }
                p => p,
            }
        };
        // What failing children and attempts tell their parents, also kept in the memory (a
        // parent processed later, without them, reads it).
        let mut told_mem: HashMap<Key, Told, foldhash::fast::RandomState> = HashMap::default();
        for i in 0..facts.len() {
            if facts[i].stage == Some(Stage::Call) {
                if let Some(n) = facts[i].declared_attempts {
                    facts[i].attempts_seen = facts[i].attempts_seen.max(n);
                }
            }
            if facts[i].stage == Some(Stage::Attempt) {
                let n = facts[i].attempt.unwrap_or(1).max(1);
                if let Some(c) = logical_parent(facts, i) {
                    let call = &mut facts[c];
                    call.attempts_seen = call.attempts_seen.max(n);
                }
                if let Some(pid) = facts[i].parent_id {
                    let key = (trace_u128(facts[i].span.trace_id), pid);
                    let t = told_mem.entry(key).or_default();
                    t.attempts_seen = t.attempts_seen.max(n);
                }
            }
        }
        // Which child decided each span's error type (an index here), for settledness.
        let mut error_from: Vec<Option<usize>> = vec![None; facts.len()];
        let mut down_ok: Vec<bool> = vec![true; facts.len()];

        // Bottom-up: error types, each failing span telling its parent.
        for &i in order.iter().rev() {
            let stage = facts[i].stage.unwrap_or(Stage::Other);
            if facts[i].failed {
                let f = &facts[i];
                // Only spans that have (or announce) children wait for the failing one: an
                // attempt, and a call that declares its attempts or has attempts in hand. A
                // failed tool span of a framework without stage spans is classified at once.
                let has_children = stage == Stage::Attempt
                    || (stage == Stage::Call
                        && (f.declared_attempts.is_some() || f.attempts_seen > 0));
                let needs_child = has_children
                    && f.explicit_error.is_none()
                    && !(stage == Stage::Call && f.attempts_seen > 1);
                if needs_child {
                    down_ok[i] = match (f.child_error, error_from[i]) {
                        (None, _) => false,
                        (Some(_), Some(c)) => down_ok[c],
                        // Told by a child processed earlier, settled then.
                        (Some(_), None) => true,
                    };
                }
                let et = f
                    .explicit_error
                    .or_else(|| stage.implied_error())
                    .or_else(|| {
                        (stage == Stage::Call && f.attempts_seen > 1)
                            .then_some(ErrorType::RetryExhausted)
                    })
                    .or_else(|| f.child_error.map(|(_, e)| e))
                    .or_else(|| self.rules.match_error(f, stage).map(|r| r.set))
                    .unwrap_or(ErrorType::ToolError);
                facts[i].error_type = Some(et);
                let end = facts[i].span.end_time_unix_nano;
                if let Some(p) = logical_parent(facts, i) {
                    let parent = &mut facts[p];
                    if parent.child_error.is_none_or(|(t, _)| end >= t) {
                        parent.child_error = Some((end, et));
                        error_from[p] = Some(i);
                    }
                }
                if let Some(pid) = facts[i].parent_id {
                    // Only a settled child's word is kept: a pending one tells again.
                    if down_ok[i] {
                        let key = (trace_u128(facts[i].span.trace_id), pid);
                        let t = told_mem.entry(key).or_default();
                        if t.child_error.is_none_or(|(e, _)| end >= e) {
                            t.child_error = Some((end, et));
                        }
                    }
                }
            }
            if stage == Stage::Call {
                let f = &mut facts[i];
                f.attempt = Some(f.attempts_seen.max(f.attempt.unwrap_or(0)).max(1));
            }
        }

        // Top-down: a span needs its parent unless it carries all it would inherit.
        let mut settled = down_ok;
        let mut up_ok = vec![true; facts.len()];
        for &i in &order {
            let f = &facts[i];
            let is_stage = matches!(
                f.stage,
                Some(Stage::Prepare | Stage::Send | Stage::Execute | Stage::Parse | Stage::Other)
            );
            let self_sufficient = f.own_stage
                && f.tool.is_some()
                && f.call_id.is_some()
                && f.agent.is_some()
                && (!is_stage || f.attempt.is_some());
            up_ok[i] = match (f.parent_id, f.parent, f.remembered_parent) {
                (None, _, _) => true,
                (Some(_), Some(p), _) => up_ok[p] || self_sufficient,
                (Some(_), None, Some(s)) => !s.pending || self_sufficient,
                (Some(_), None, None) => self_sufficient,
            };
            settled[i] = settled[i] && up_ok[i];
        }
        (settled, told_mem.into_iter().collect())
    }
}

/// The strings of the last few spans remembered, shared between spans that repeat them (a
/// call's attempts and stages carry its tool, call id and agent).
#[derive(Default)]
struct Shared<'a> {
    recent: Vec<(IdsRef<'a>, Ids)>,
}

/// A span's tool, call id and agent, borrowed.
type IdsRef<'a> = (Option<&'a str>, Option<&'a str>, Option<&'a str>);

impl<'a> Shared<'a> {
    const KEEP: usize = 8;

    fn get(&mut self, ids: IdsRef<'a>) -> Option<Ids> {
        if ids == (None, None, None) {
            return None;
        }
        if let Some((_, a)) = self.recent.iter().rev().find(|(k, _)| *k == ids) {
            return Some(a.clone());
        }
        let a = Ids::new(ids.0, ids.1, ids.2);
        if self.recent.len() == Self::KEEP {
            self.recent.remove(0);
        }
        self.recent.push((ids, a.clone()));
        Some(a)
    }
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
