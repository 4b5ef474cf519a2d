//! One logical tool call, one `call` span.
//!
//! Two instrumentations active in one agent (a framework's own spans and OpenInference's, an
//! MCP client's and server's spans under the framework's tool span, toolspan's SDK adapter
//! inside a framework's tool span) each open a tool call span for the same call; a framework
//! that runs a failed tool again opens one per run. Left alone, each would be a row of
//! `calls` and a call in the metrics. This pass, run once the stages are known, gives every
//! logical call one span of stage `call` and the others their role:
//!
//! - **mirrors** (another instrumentation's span of the same run of the call) become `other`,
//!   and tell the call their failure: a call span under a call span of the same tool whose
//!   call ids do not differ; or two call spans of the same tool in the same trace (in the same
//!   call or model call, if in one), from different instrumentation scopes (or
//!   with the same call id), that overlap in time and are each other's closest such span (so
//!   that parallel calls of one tool stay apart). The call is the span with toolspan's
//!   conventions, else the outer one (nested), else the failed one, else the first
//!   (overlapping); when a mirror inside it failed, the call failed (`status_from_result`); a
//!   call span without a call id takes its mirror's.
//! - **earlier runs** become `attempt`s of the last run, numbered in start order, and the last
//!   run is the call, with that many attempts (`RETRY_EXHAUSTED` when it failed): call spans of
//!   one tool that follow each other without overlapping and carry the same call id, or, under
//!   one parent, a rising `tool.run_attempts` after a failed run. Runs that name no call id
//!   take the first run's span id as theirs, so that the attempts join their call.
//!
//! Every span is still stored; only its stage (and an earlier run's attempt number and call id)
//! change.

use std::collections::HashMap;
use std::hash::BuildHasher;

use super::{span_index, Hasher, Node, MAX_DEPTH};
use crate::process::classify::extract::Facts;
use crate::process::classify::Stage;

/// Whether two call ids can name the same call (equal, or at least one absent).
fn compatible(a: Option<&str>, b: Option<&str>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a == b,
        _ => true,
    }
}

/// Whether two call spans describe the same tool (both name it, the same).
fn same_tool(a: &Node<'_>, b: &Node<'_>) -> bool {
    matches!((a.tool, b.tool), (Some(x), Some(y)) if x == y)
}

/// When span `i` started (its facts keep it: the nodes leave out what only this pass reads).
fn start(facts: &[Facts<'_>], i: usize) -> u64 {
    facts[i].span.start_time_unix_nano
}

/// Whether spans `a` and `b` overlap in time.
fn overlap(facts: &[Facts<'_>], nodes: &[Node<'_>], a: usize, b: usize) -> bool {
    start(facts, a) < nodes[b].end && start(facts, b) < nodes[a].end
}

/// Hashes (trace, call id) pairs to look for a repeated call id.
const ID_HASH: foldhash::fast::FixedState = foldhash::fast::FixedState::with_seed(0x5eed);

/// Groups larger than this (calls of one tool in one agent run) are not searched for mirrors.
const MAX_GROUP: usize = 64;

/// Whether two call spans, not nested, may be two instrumentations' spans of one call: they
/// overlap in time, name the same tool (or the same call id) with call ids that do not differ,
/// and come from different instrumentation scopes (or carry the same call id); toolspan's SDK
/// never opens two.
fn may_mirror(facts: &[Facts<'_>], nodes: &[Node<'_>], i: usize, j: usize) -> bool {
    let (a, b) = (&nodes[i], &nodes[j]);
    let same_id = matches!((a.call_id, b.call_id), (Some(x), Some(y)) if x == y);
    overlap(facts, nodes, i, j)
        && compatible(a.call_id, b.call_id)
        && (same_tool(a, b) || same_id)
        && (same_id || facts[i].span.scope != facts[j].span.scope)
        && !(a.toolspan && b.toolspan)
}

/// A small union-find over span indices.
struct Sets(Vec<u32>);

impl Sets {
    fn new(n: usize) -> Sets {
        Sets((0..n as u32).collect())
    }

    fn find(&mut self, mut i: usize) -> usize {
        while self.0[i] as usize != i {
            let up = self.0[self.0[i] as usize];
            self.0[i] = up;
            i = up as usize;
        }
        i
    }

    fn union(&mut self, a: usize, b: usize) {
        let (a, b) = (self.find(a), self.find(b));
        if a != b {
            self.0[a.max(b)] = a.min(b) as u32;
        }
    }
}

/// Gives each logical call among `nodes` one call span (see the module's text).
pub(super) fn merge_calls<'a>(facts: &mut [Facts<'a>], nodes: &mut [Node<'a>]) {
    let calls: Vec<usize> = (0..nodes.len())
        .filter(|&i| nodes[i].stage == Some(Stage::Call))
        .collect();
    if calls.is_empty() {
        return;
    }
    // Each mirror's call (an index), before chains are followed.
    let mut mirror_of: HashMap<usize, usize, Hasher> = HashMap::default();

    // Each call's anchor (by its place in `calls`): the call span or model call it is in (its
    // span id), through agent spans (two instrumentations each open one for the same run),
    // else none (the trace).
    let mut anchor: Vec<Option<u64>> = Vec::with_capacity(calls.len());
    // Nested: the nearest call span above, in this request, below any agent or model call.
    for &c in &calls {
        let mut cur = c;
        let mut outer = None;
        let mut above = None;
        let mut in_agent = false;
        for _ in 0..MAX_DEPTH {
            let Some(p) = nodes[cur].parent.map(|p| p as usize) else {
                break;
            };
            match nodes[p].stage {
                Some(Stage::Llm) => {
                    above = Some(p);
                    break;
                }
                Some(Stage::Call) => {
                    if !in_agent {
                        outer = Some(p);
                    }
                    above = Some(p);
                    break;
                }
                Some(Stage::Agent) => {
                    in_agent = true;
                    cur = p;
                }
                _ => cur = p,
            }
        }
        // Above the spans at hand, only a remembered parent's stage is known: the anchor is
        // that parent when it is a call or model call, else the trace (whole or in pieces,
        // the same anchor).
        let top = &nodes[cur];
        let remembered_anchor = top
            .remembered
            .filter(|s| top.parent.is_none() && matches!(s.stage, Stage::Call | Stage::Llm))
            .and(top.parent_id);
        anchor.push(match above {
            Some(p) => Some(nodes[p].span_id),
            None => remembered_anchor,
        });
        match outer {
            Some(p) => {
                let (inner, outer) = (&nodes[c], &nodes[p]);
                if !same_tool(inner, outer) || !compatible(inner.call_id, outer.call_id) {
                    continue;
                }
                match (inner.toolspan, outer.toolspan) {
                    // toolspan's SDK opens one call span per logical call: never two.
                    (true, true) => {}
                    // toolspan's span describes the call best (attempts, stages, envelope).
                    (true, false) => {
                        mirror_of.insert(p, c);
                    }
                    _ => {
                        mirror_of.insert(c, p);
                    }
                }
            }
            None => {
                // The span at the top of the walk has its parent in the memory: a call span
                // of an earlier request.
                let top = &nodes[cur];
                let Some(seen) = top
                    .remembered
                    .filter(|_| top.parent.is_none() && above.is_none() && !in_agent)
                else {
                    continue;
                };
                let node = &nodes[c];
                if seen.stage == Stage::Call
                    && !node.toolspan
                    && node.tool.is_some()
                    && seen.tool() == node.tool
                    && compatible(seen.call_id(), node.call_id)
                {
                    let node = &mut nodes[c];
                    node.stage = Some(Stage::Other);
                    node.merged = true;
                    node.mirror = true;
                }
            }
        }
    }

    // Siblings and repeated call ids, among the spans still calls: groups of calls of one tool
    // under one anchor, and of one call id, in a trace. Two calls pair (as mirrors or as runs)
    // only if their call ids do not differ, so when every call names a call id of its own
    // (the usual case), no group can pair anything: that is checked first, with a hash set,
    // and the groups are only formed (by sorting) otherwise.
    let mut open: Vec<usize> = Vec::with_capacity(calls.len());
    // Hashes of (trace, call id): two equal ones may be a repeated call id (or a collision,
    // which only costs forming the groups).
    let mut ids: Vec<u64> = Vec::with_capacity(calls.len());
    let mut unnamed = false;
    for &c in &calls {
        let n = &nodes[c];
        if mirror_of.contains_key(&c) || n.stage != Some(Stage::Call) {
            continue;
        }
        open.push(c);
        match n.call_id {
            Some(id) => ids.push(ID_HASH.hash_one((n.trace, id))),
            None => unnamed = true,
        }
    }
    ids.sort_unstable();
    let repeated = ids.windows(2).any(|w| w[0] == w[1]);
    drop(ids);
    let mut groups: Vec<Vec<usize>> = Vec::new();
    if unnamed || repeated {
        let mut by_anchor: Vec<(u128, Option<u64>, &str, usize)> = Vec::new();
        let mut by_call_id: Vec<(u128, &str, usize)> = Vec::new();
        for (k, &c) in calls.iter().enumerate() {
            let n = &nodes[c];
            if mirror_of.contains_key(&c) || n.stage != Some(Stage::Call) {
                continue;
            }
            if let Some(tool) = n.tool {
                by_anchor.push((n.trace, anchor[k], tool, c));
            }
            if let Some(id) = n.call_id {
                by_call_id.push((n.trace, id, c));
            }
        }
        by_anchor.sort_unstable();
        by_call_id.sort_unstable();
        for g in by_anchor.chunk_by(|a, b| (a.0, a.1, a.2) == (b.0, b.1, b.2)) {
            if g.len() > 1 {
                groups.push(g.iter().map(|e| e.3).collect());
            }
        }
        for g in by_call_id.chunk_by(|a, b| (a.0, a.1) == (b.0, b.1)) {
            if g.len() > 1 {
                groups.push(g.iter().map(|e| e.2).collect());
            }
        }
    }
    if groups.is_empty() && mirror_of.is_empty() {
        return;
    }
    let mut mirrors = Sets::new(nodes.len());
    let mut unions = false;
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for mut g in groups {
        g.sort_unstable_by_key(|&i| (start(facts, i), nodes[i].span_id));
        // Mirrors: each span's closest overlapping span of another instrumentation (or with
        // its call id), when that span's closest is it. Matching pairs, not chaining overlaps,
        // keeps parallel calls of one tool apart.
        if g.len() <= MAX_GROUP {
            let best: Vec<Option<usize>> = g
                .iter()
                .map(|&a| {
                    g.iter()
                        .copied()
                        .filter(|&b| b != a && may_mirror(facts, nodes, a, b))
                        .min_by_key(|&b| {
                            let (x, y) = (&nodes[a], &nodes[b]);
                            let starts = start(facts, a).abs_diff(start(facts, b));
                            (starts + x.end.abs_diff(y.end), y.span_id)
                        })
                })
                .collect();
            for (k, &a) in g.iter().enumerate() {
                if let Some(b) = best[k] {
                    let back = g.iter().position(|&x| x == b).and_then(|kb| best[kb]);
                    if back == Some(a) {
                        mirrors.union(a, b);
                        unions = true;
                    }
                }
            }
        }
        // Runs: consecutive spans that do not overlap.
        for w in g.windows(2) {
            let (a, b) = (&nodes[w[0]], &nodes[w[1]]);
            if overlap(facts, nodes, w[0], w[1])
                || !compatible(a.call_id, b.call_id)
                || a.toolspan
                || b.toolspan
            {
                continue;
            }
            let same_id = matches!((a.call_id, b.call_id), (Some(x), Some(y)) if x == y);
            let runs_of = (facts[w[0]].run_attempts, facts[w[1]].run_attempts);
            let rerun = matches!(runs_of, (Some(x), Some(y)) if y > x)
                && a.failed
                && a.parent_id == b.parent_id
                && same_tool(a, b);
            if same_id || rerun {
                runs.push((w[0], w[1]));
            }
        }
    }
    // Each set of overlapping mirrors: its call span.
    let mut members: Vec<(usize, usize)> = Vec::new();
    if unions {
        members = open.iter().map(|&c| (mirrors.find(c), c)).collect();
        members.sort_unstable();
    }
    for set in members
        .chunk_by(|a, b| a.0 == b.0)
        .filter(|m| m.len() > 1)
        .map(|m| m.iter().map(|e| e.1).collect::<Vec<_>>())
    {
        let Some(&call) = set.iter().min_by_key(|&&i| {
            let n = &nodes[i];
            (
                !n.toolspan,
                !n.failed,
                start(facts, i),
                u64::MAX - n.end,
                n.span_id,
            )
        }) else {
            continue;
        };
        for &m in &set {
            if m != call {
                mirror_of.insert(m, call);
            }
        }
    }
    // Mirrors: follow chains to the call span that stays, pass on failures.
    let keys: Vec<usize> = mirror_of.keys().copied().collect();
    for m in keys {
        let call = mirror_of_final(&mirror_of, m);
        if call == m {
            continue;
        }
        let (failed, mirror_call_id) = (nodes[m].failed, nodes[m].call_id);
        // The call keeps the call id one of its instrumentations recorded.
        if nodes[call].call_id.is_none() {
            nodes[call].call_id = mirror_call_id;
        }
        // A mirror inside the call tells it its failure, as a failing child does; one beside
        // or above it does not (the call's own signals decide, whatever order spans come in).
        let inside = is_below(nodes, m, call);
        let node = &mut nodes[m];
        node.stage = Some(Stage::Other);
        node.merged = true;
        node.mirror = true;
        node.same_call = span_index(call);
        if !inside {
            continue;
        }
        node.merged_into = span_index(call);
        let target = &mut nodes[call];
        if failed && !target.failed && !target.toolspan {
            target.failed = true;
            facts[call].failed = true;
            facts[call].status_from_result = true;
        }
    }

    // Runs of one call: chains of call spans (each set of mirrors by the span that stays).
    if runs.is_empty() {
        return;
    }
    let stays = |i: usize| -> usize { mirror_of_final(&mirror_of, i) };
    let mut chains = Sets::new(nodes.len());
    for &(a, b) in &runs {
        chains.union(stays(a), stays(b));
    }
    let mut chain_of: Vec<(usize, usize)> = Vec::new();
    for &c in &open {
        let s = stays(c);
        if s == c && nodes[c].stage == Some(Stage::Call) {
            chain_of.push((chains.find(c), c));
        }
    }
    chain_of.sort_unstable();
    for mut chain in chain_of
        .chunk_by(|a, b| a.0 == b.0)
        .filter(|c| c.len() > 1)
        .map(|c| c.iter().map(|e| e.1).collect::<Vec<_>>())
    {
        chain.sort_unstable_by_key(|&i| (start(facts, i), nodes[i].span_id));
        let Some(&last) = chain.last() else {
            continue;
        };
        let n = chain.len() as i64;
        // The runs' call id: the last run's, else the first run's span id.
        let call_id = nodes[last].call_id.or(facts[chain[0]].rerun_id);
        for (k, &run) in chain[..chain.len() - 1].iter().enumerate() {
            let node = &mut nodes[run];
            node.stage = Some(Stage::Attempt);
            node.attempt = Some(k as i64 + 1);
            node.merged = true;
            node.merged_into = span_index(last);
            node.same_call = node.merged_into;
            if node.call_id.is_none() {
                node.call_id = call_id;
            }
        }
        let call = &mut nodes[last];
        call.declared_attempts = Some(call.declared_attempts.unwrap_or(0).max(n));
        if call.call_id.is_none() {
            call.call_id = call_id;
        }
    }
}

/// Whether span `i` is below span `above` (its parent, or further up).
fn is_below(nodes: &[Node<'_>], i: usize, above: usize) -> bool {
    let mut cur = i;
    for _ in 0..MAX_DEPTH {
        match nodes[cur].parent {
            Some(p) if p as usize == above => return true,
            Some(p) => cur = p as usize,
            None => return false,
        }
    }
    false
}

/// The span that stays for `i`: itself, or the end of its chain of mirrors.
fn mirror_of_final(mirror_of: &HashMap<usize, usize, Hasher>, i: usize) -> usize {
    let mut cur = i;
    for _ in 0..MAX_DEPTH {
        match mirror_of.get(&cur) {
            Some(&next) if next != i => cur = next,
            _ => break,
        }
    }
    cur
}
