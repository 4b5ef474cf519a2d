//! The classification passes over the spans of one [`crate::process::Pipeline::pass`] (which links
//! parents): depths, stages and inherited ids top-down, attempts counted, error types
//! bottom-up, and settledness (see [`crate::process::assemble`]).
//!
//! The passes run over [`Node`]s — the at most 208 bytes of a span that they read and write
//! (checked below) — not over the ~400-byte [`Facts`]: the nodes of a batch export of ~1,800
//! spans (~370 KB) fit a core's 512 KB L2 cache through the ten passes, its facts (~700 KB) do
//! not (bench/RESULTS.md, bench/encode, session 16: decode→Arrow 5 to 10 % faster on such
//! requests). The facts are visited only where the rules read a span's attributes, and once at
//! the end, when the results are copied into them; what only [`merge`] reads of the few calls
//! it groups (start time, scope, run counts) it reads from the facts.

use std::borrow::Cow;
use std::collections::HashMap;

use super::extract::{Facts, ResultFailure};
use super::{ErrorType, ResultPlace, Rules, SpanView, Stage};
use crate::otlp::view::Val;
use crate::process::memory::{tool_hash, Key, Seen, Told, TraceMemory};
use crate::process::values;

mod merge;

/// Ancestor walks stop here, so a cyclic or absurdly deep parent chain cannot loop.
const MAX_DEPTH: u32 = 256;

/// [`Node::merged_into`] and [`Node::same_call`] of a span not merged (they are indices kept
/// in 4 bytes, not an `Option<u32>`'s 8: the passes read every node many times).
const NO_SPAN: u32 = u32::MAX;

/// A span's index as [`Node::merged_into`] and [`Node::same_call`] keep it.
fn span_index(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(NO_SPAN)
}

type Hasher = foldhash::fast::RandomState;

// The nodes stay small (see the module's text): a field added here costs every pass.
const _: () = assert!(std::mem::size_of::<Node<'static>>() <= 208);

/// What the classification passes know of one span.
pub(crate) struct Node<'a> {
    pub trace: u128,
    pub span_id: u64,
    parent_id: Option<u64>,
    end: u64,
    pub tool: Option<&'a str>,
    pub call_id: Option<&'a str>,
    pub agent: Option<&'a str>,
    pub attempt: Option<i64>,
    /// For calls: the attempts seen (highest attempt number or count of attempt spans).
    attempts_seen: i64,
    /// The attempts a call declares it made (`toolspan.attempts`).
    declared_attempts: Option<i64>,
    /// The latest failing child's end time and error type.
    child_error: Option<(u64, ErrorType)>,
    /// The parent, when it is not among these spans but was seen earlier.
    remembered: Option<&'a Seen>,
    /// The parent's index among these spans.
    parent: Option<u32>,
    pub stage: Option<Stage>,
    explicit_error: Option<ErrorType>,
    /// A taxonomy name in `error.type` without toolspan's conventions: the last resort.
    weak_error: Option<ErrorType>,
    /// The error type a result rule set, for a failure inferred from the result.
    result_error: Option<ErrorType>,
    error_type: Option<ErrorType>,
    failed: bool,
    /// Whether the stage came from the span's own attributes.
    own_stage: bool,
    /// Whether the span has no parent span id at all (an agent's root by default).
    root: bool,
    /// The span carries toolspan's own conventions.
    toolspan: bool,
    /// The logical call this span was merged into ([`merge`]), by index ([`NO_SPAN`]: none):
    /// another instrumentation's span of that call, or an earlier run of it. Its failure
    /// tells that call.
    merged_into: u32,
    /// Whether [`merge`] changed this span's role (a call span that is another's mirror or
    /// an earlier attempt): it waits for no child.
    merged: bool,
    /// Whether this span was a tool call span made another's mirror: the memory keeps it as a
    /// call, so that spans under it arriving later classify as under a call.
    mirror: bool,
    /// The call span this one was merged with ([`merge`]), by index ([`NO_SPAN`]: none): they
    /// settle together.
    same_call: u32,
}

impl<'a> Node<'a> {
    /// The node of `f`, whose parent is the node at index `parent` among the spans classified
    /// with it, or, when not among them, may be `remembered`.
    pub fn new(
        f: &Facts<'a>,
        trace: u128,
        parent: Option<u32>,
        remembered: Option<&'a Seen>,
    ) -> Node<'a> {
        Node {
            trace,
            span_id: f.span_id,
            parent_id: f.parent_id,
            end: f.span.end_time_unix_nano,
            tool: f.tool,
            call_id: f.call_id,
            agent: f.agent,
            attempt: f.attempt,
            attempts_seen: 0,
            declared_attempts: f.declared_attempts,
            child_error: None,
            remembered,
            parent,
            stage: f.stage,
            explicit_error: f.explicit_error,
            weak_error: f.weak_error,
            result_error: None,
            error_type: None,
            failed: f.failed,
            own_stage: f.own_stage,
            root: f.span.parent_span_id.is_empty(),
            toolspan: f.toolspan_conventions,
            merged_into: NO_SPAN,
            merged: false,
            mirror: false,
            same_call: NO_SPAN,
        }
    }

    /// [`Node::merged_into`], if any.
    fn merged_into(&self) -> Option<usize> {
        (self.merged_into != NO_SPAN).then_some(self.merged_into as usize)
    }

    /// [`Node::same_call`], if any.
    fn same_call(&self) -> Option<usize> {
        (self.same_call != NO_SPAN).then_some(self.same_call as usize)
    }

    /// The stage the memory keeps for this span, for spans arriving after it: a mirror of a
    /// tool call is still a call to its children.
    pub fn remembered_stage(&self) -> Stage {
        if self.mirror {
            Stage::Call
        } else {
            self.stage.unwrap_or(Stage::Other)
        }
    }

    fn is_stage(&self) -> bool {
        matches!(
            self.stage,
            Some(Stage::Prepare | Stage::Send | Stage::Execute | Stage::Parse | Stage::Other)
        )
    }
}

/// What [`classify`] found besides the rows.
pub(crate) struct Classified {
    /// Per span, whether it is settled.
    pub settled: Vec<bool>,
    /// What children told their parents, for the memory.
    pub told: Vec<(Key, Told)>,
    /// Pairs of spans (indices) merged into one logical call: they settle together.
    pub same_call: Vec<(usize, usize)>,
}

/// Classifies `nodes` (one per fact, in the same order, parents linked) and copies the results (stage, tool,
/// call id, attempt, agent, error type) into `facts`. Returns, per span, whether it is
/// settled: its parent is here or remembered and settled itself (or it needs nothing from a
/// parent), and, for a failed call or attempt, the failing child that decides its error type
/// is known and settled (or the type needs no child).
///
/// Also returns what children told their parents (error types, attempts), for the memory,
/// and the pairs of spans merged into one logical call (indices), which settle together.
pub(crate) fn classify<'a>(
    rules: &Rules,
    memory: &TraceMemory,
    facts: &mut [Facts<'a>],
    nodes: &mut [Node<'a>],
) -> Classified {
    let n = nodes.len();
    let parent_of = |nodes: &[Node<'_>], i: usize| nodes[i].parent.map(|p| p as usize);
    // Depths, so parents are handled before children (and children before parents).
    let mut depth: Vec<u32> = vec![u32::MAX; n];
    let mut chain = Vec::new();
    for i in 0..n {
        let mut cur = i;
        chain.clear();
        let mut base = 0;
        while depth[cur] == u32::MAX {
            chain.push(cur);
            if chain.len() as u32 > MAX_DEPTH {
                base = MAX_DEPTH;
                break;
            }
            match parent_of(nodes, cur) {
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
    let mut order: Vec<u32> = (0..n as u32).collect();
    order.sort_unstable_by_key(|&i| (depth[i as usize], i));
    drop(depth);

    // Top-down: stages that need rules or the parent, then inherited tool/call/attempt.
    for &i in &order {
        let i = i as usize;
        let parent = parent_of(nodes, i);
        let remembered = nodes[i].remembered;
        if nodes[i].stage.is_none() {
            let f = &mut facts[i];
            f.parent_stage = parent
                .and_then(|p| nodes[p].stage)
                .or(remembered.map(|s| s.stage));
            let node = &mut nodes[i];
            if let Some(rule) = rules.match_stage(&*f, true) {
                node.stage = Some(rule.set);
                if node.tool.is_none() {
                    if let Some(key) = &rule.tool_attribute {
                        node.tool = f
                            .span
                            .attributes
                            .iter()
                            .find(|kv| kv.key == key)
                            .and_then(|kv| values::as_str(kv.value))
                            .filter(|s| !s.is_empty());
                    }
                    node.tool = node.tool.or_else(|| rule.tool_in_name(f.span.name));
                }
            } else if node.root {
                node.stage = Some(Stage::Agent);
            } else {
                node.stage = Some(Stage::Other);
            }
        }
        // A tool call whose status is not ERROR and whose result says it failed, failed.
        if nodes[i].stage == Some(Stage::Call) && !nodes[i].failed {
            infer_from_result(rules, &mut facts[i], &mut nodes[i]);
        }
        let inherited = match (parent, remembered) {
            (Some(p), _) => {
                let p = &nodes[p];
                Some((p.tool, p.call_id, p.attempt, p.agent, p.stage))
            }
            (None, Some(s)) => Some((s.tool(), s.call_id(), s.attempt, s.agent(), Some(s.stage))),
            (None, None) => None,
        };
        if let Some((ptool, pcall, pattempt, pagent, pstage)) = inherited {
            let node = &mut nodes[i];
            if node.tool.is_none() && pstage != Some(Stage::Agent) {
                node.tool = ptool;
            }
            if node.call_id.is_none() {
                node.call_id = pcall;
            }
            if node.agent.is_none() {
                node.agent = pagent;
            }
            if node.attempt.is_none() && node.is_stage() && pstage != Some(Stage::Call) {
                node.attempt = pattempt;
            }
        }
    }

    // One logical call, one call span: other instrumentations' spans of it and its earlier runs
    // take other roles.
    merge::merge_calls(facts, nodes);

    // What children processed earlier told the spans that use it: calls and attempts (the
    // attempts seen, a failing child) and failed spans (a failing child). Looked up only for
    // those, and only when the memory holds anything told.
    let wanted: Vec<usize> = (0..n)
        .filter(|&i| {
            nodes[i].failed || matches!(nodes[i].stage, Some(Stage::Call | Stage::Attempt))
        })
        .collect();
    if !wanted.is_empty() {
        let keys: Vec<Key> = wanted
            .iter()
            .map(|&i| (nodes[i].trace, nodes[i].span_id))
            .collect();
        for (&i, t) in wanted.iter().zip(memory.recall_told(&keys)) {
            if let Some(t) = t {
                nodes[i].child_error = t.child_error;
                nodes[i].attempts_seen = t.attempts_seen;
                // A foreign call span over toolspan's span of its call, which came earlier:
                // that span is the call.
                let node = &mut nodes[i];
                if node.stage == Some(Stage::Call)
                    && !node.toolspan
                    && t.toolspan_call.is_some()
                    && node.tool.map(tool_hash) == t.toolspan_call
                {
                    node.stage = Some(Stage::Other);
                    node.merged = true;
                    node.mirror = true;
                }
                // Another instrumentation's span of this call, which came earlier, failed.
                if node.stage == Some(Stage::Call)
                    && t.mirror_failed
                    && !node.failed
                    && !node.toolspan
                {
                    node.failed = true;
                    facts[i].failed = true;
                    facts[i].status_from_result = true;
                }
            }
        }
    }

    // Attempts counted on their call (the parent, or the call with the same call id).
    let mut call_by_id: HashMap<&str, usize, Hasher> = HashMap::default();
    for (i, node) in nodes.iter().enumerate() {
        if node.stage == Some(Stage::Call) {
            if let Some(c) = node.call_id {
                call_by_id.insert(c, i);
            }
        }
    }
    let logical_parent = |nodes: &[Node<'_>], i: usize| -> Option<usize> {
        let node = &nodes[i];
        if let Some(c) = node.merged_into() {
            return Some(c);
        }
        match parent_of(nodes, i) {
            Some(p) if nodes[p].stage == Some(Stage::Call) => Some(p),
            _ if node.stage == Some(Stage::Attempt) => {
                node.call_id.and_then(|c| call_by_id.get(c).copied())
            }
            p => p,
        }
    };
    // What failing children and attempts tell their parents, also kept in the memory (a
    // parent processed later, without them, reads it).
    let mut told_mem: HashMap<Key, Told, Hasher> = HashMap::default();
    for i in 0..n {
        if nodes[i].stage == Some(Stage::Call) {
            if let Some(d) = nodes[i].declared_attempts {
                nodes[i].attempts_seen = nodes[i].attempts_seen.max(d);
            }
        }
        if nodes[i].stage == Some(Stage::Call) && nodes[i].toolspan {
            if let (Some(pid), Some(tool)) = (nodes[i].parent_id, nodes[i].tool) {
                let t = told_mem.entry((nodes[i].trace, pid)).or_default();
                t.toolspan_call = Some(tool_hash(tool));
            }
        }
        if nodes[i].stage == Some(Stage::Attempt) {
            let a = nodes[i].attempt.unwrap_or(1).max(1);
            if let Some(c) = logical_parent(nodes, i) {
                let call = &mut nodes[c];
                call.attempts_seen = call.attempts_seen.max(a);
            }
            if let Some(pid) = nodes[i].parent_id {
                let t = told_mem.entry((nodes[i].trace, pid)).or_default();
                t.attempts_seen = t.attempts_seen.max(a);
            }
        }
    }
    // Which child decided each span's error type (an index here), for settledness.
    let mut error_from: Vec<Option<usize>> = vec![None; n];
    let mut down_ok: Vec<bool> = vec![true; n];

    // Bottom-up: error types, each failing span telling its parent.
    for &i in order.iter().rev() {
        let i = i as usize;
        let stage = nodes[i].stage.unwrap_or(Stage::Other);
        if nodes[i].failed {
            let node = &nodes[i];
            // Spans whose error type a child decides wait for the failing one: an attempt,
            // and a call (its attempts, or the client span of a framework without stage
            // spans, an HTTP request under the tool span, say, may come after it). A failed
            // call that has none is released when its wait runs out, classified as it is.
            let has_children = (stage == Stage::Attempt || stage == Stage::Call) && !node.merged;
            let needs_child = has_children
                && node.explicit_error.is_none()
                && !(stage == Stage::Call && node.attempts_seen > 1);
            if needs_child {
                down_ok[i] = match (node.child_error, error_from[i]) {
                    (None, _) => false,
                    (Some(_), Some(c)) => down_ok[c],
                    // Told by a child processed earlier, settled then.
                    (Some(_), None) => true,
                };
            }
            let et = node
                .explicit_error
                .or(node.result_error)
                .or_else(|| stage.implied_error())
                .or_else(|| {
                    (stage == Stage::Call && node.attempts_seen > 1)
                        .then_some(ErrorType::RetryExhausted)
                })
                .or_else(|| node.child_error.map(|(_, e)| e))
                .or_else(|| rules.match_error(&facts[i], stage).map(|r| r.set))
                .or(node.weak_error)
                .unwrap_or(ErrorType::ToolError);
            nodes[i].error_type = Some(et);
            let end = nodes[i].end;
            if let Some(p) = logical_parent(nodes, i) {
                let parent = &mut nodes[p];
                if parent.child_error.is_none_or(|(t, _)| end >= t) {
                    parent.child_error = Some((end, et));
                    error_from[p] = Some(i);
                }
            }
            if let Some(pid) = nodes[i].parent_id {
                // Only a settled child's word is kept: a pending one tells again.
                if down_ok[i] {
                    let t = told_mem.entry((nodes[i].trace, pid)).or_default();
                    t.mirror_failed |= nodes[i].mirror;
                    if t.child_error.is_none_or(|(e, _)| end >= e) {
                        t.child_error = Some((end, et));
                    }
                }
            }
        }
        if stage == Stage::Call {
            let node = &mut nodes[i];
            node.attempt = Some(node.attempts_seen.max(node.attempt.unwrap_or(0)).max(1));
        }
    }

    // Top-down: a span needs its parent unless it carries all it would inherit.
    let mut settled = down_ok;
    let mut up_ok = vec![true; n];
    for &i in &order {
        let i = i as usize;
        let node = &nodes[i];
        // A foreign tool call span may be another instrumentation's span of its parent's call
        // (a mirror): it needs its parent.
        let self_sufficient = node.own_stage
            && (node.toolspan || node.stage != Some(Stage::Call))
            && node.tool.is_some()
            && node.call_id.is_some()
            && node.agent.is_some()
            && (!node.is_stage() || node.attempt.is_some());
        up_ok[i] = match (node.parent_id, parent_of(nodes, i), node.remembered) {
            (None, _, _) => true,
            (Some(_), Some(p), _) => up_ok[p] || self_sufficient,
            (Some(_), None, Some(s)) => !s.pending || self_sufficient,
            (Some(_), None, None) => self_sufficient,
        };
        settled[i] = settled[i] && up_ok[i];
    }

    // The spans of one logical call settle together: a row depends on which span is the call.
    let mut same_call: Vec<(usize, usize)> = Vec::new();
    if nodes.iter().any(|n| n.same_call().is_some()) {
        let mut together: HashMap<usize, bool, Hasher> = HashMap::default();
        for (i, node) in nodes.iter().enumerate() {
            if let Some(c) = node.same_call() {
                *together.entry(c).or_insert(settled[c]) &= settled[i];
            }
        }
        for i in 0..n {
            if let Some(c) = nodes[i].same_call() {
                let ok = together.get(&c).copied().unwrap_or(true);
                settled[i] = ok;
                settled[c] = ok;
                same_call.push((i, c));
            }
        }
    }

    // The results, into the facts the rows are built from.
    for (f, node) in facts.iter_mut().zip(nodes.iter()) {
        f.stage = node.stage;
        f.tool = node.tool;
        f.call_id = node.call_id;
        f.attempt = node.attempt;
        f.agent = node.agent;
        f.error_type = node.error_type;
    }
    Classified {
        settled,
        told: told_mem.into_iter().collect(),
        same_call,
    }
}

/// Marks a tool call failed when its result says so: a result rule (user rules first, then
/// the built-in ones) or one of the body forms [`super::body::read`] recognises.
fn infer_from_result<'a>(rules: &Rules, f: &mut Facts<'a>, node: &mut Node<'a>) {
    let verdict = match_result_rules(rules, f).or_else(|| f.result_failure.take());
    if let Some(v) = verdict {
        node.failed = true;
        node.result_error = v.set;
        f.failed = true;
        f.status_from_result = true;
        f.result_failure = Some(v);
    }
}

fn match_result_rules<'a>(rules: &Rules, f: &Facts<'a>) -> Option<Box<ResultFailure<'a>>> {
    let mut body: Option<Option<serde_json::Value>> = None;
    for rule in rules.result_rules() {
        let failed = match &rule.place {
            ResultPlace::Attribute(key) => f
                .attribute(key)
                .is_some_and(|v| rule.text_means_failure(&v)),
            ResultPlace::Pointer(p) => {
                let value = body.get_or_insert_with(|| match f.output {
                    Some(Val::Str(text)) => super::body::value(text),
                    _ => None,
                });
                value
                    .as_ref()
                    .and_then(|v| v.pointer(p))
                    .is_some_and(|found| rule.means_failure(found))
            }
        };
        if !failed {
            continue;
        }
        let message = rule.message_pointer.as_deref().and_then(|p| {
            let value = body.get_or_insert_with(|| match f.output {
                Some(Val::Str(text)) => super::body::value(text),
                _ => None,
            });
            match value.as_ref()?.pointer(p)? {
                serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
                serde_json::Value::Null | serde_json::Value::String(_) => None,
                other => Some(other.to_string()),
            }
        });
        // Without a pointer to it, the error's text is the body's (a recognised form's), or a
        // result that is plain text.
        let message = message.map(Cow::Owned).or_else(|| {
            f.result_failure
                .as_ref()
                .and_then(|r| r.message.clone())
                .or(match f.output {
                    Some(Val::Str(text))
                        if !text.trim().is_empty()
                            && !text.trim_start().starts_with(['{', '[']) =>
                    {
                        Some(Cow::Borrowed(text))
                    }
                    _ => None,
                })
        });
        return Some(Box::new(ResultFailure {
            message,
            set: rule.set,
        }));
    }
    None
}
