//! What the pipeline remembers of recent spans, so that a trace split over many requests (or
//! Kafka messages, or flushes) is classified as if it had arrived whole.
//!
//! Two kinds of entries, both keyed by trace id and span id:
//! - **a span seen** (its stage, tool, call id, attempt, agent): a child that arrives after
//!   its parent inherits from it exactly as from a parent in the same request;
//! - **what a parent's children told it** (the latest failing child's error type, the
//!   attempts seen): a call or attempt that arrives after its failed stage or its attempts —
//!   the usual order, since spans are exported when they end and children end first — takes
//!   its error type (`PARSE`, `RETRY_EXHAUSTED`, …) from them as if they were in its request.
//!
//! Bounded three ways: entries are forgotten between one and two [`MemoryConfig::ttl`] after
//! they went in (two generations, [`TraceMemory`]), and past [`MemoryConfig::max_entries`] or
//! [`MemoryConfig::max_bytes`] the older generation is evicted first;
//! evictions by the caps are counted ([`MemoryStats::evicted`]) and logged (at most once a
//! minute), since they mean pieces further apart than the memory reaches may be misclassified.
//! Nothing is ever dropped from the table because of the memory: it only adds context.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use toolspan_schema::{ErrorType, Stage};

/// How much the memory keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryConfig {
    /// How long an entry is kept at least (at most about twice as long): the longest gap
    /// between two pieces of a trace that still classify as one.
    pub ttl: Duration,
    /// At most this many entries.
    pub max_entries: usize,
    /// At most about this many bytes (entries and their strings).
    pub max_bytes: usize,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            ttl: Duration::from_secs(300),
            max_entries: 1_000_000,
            max_bytes: 256 << 20,
        }
    }
}

impl MemoryConfig {
    /// A memory that keeps nothing (every request classified on its own).
    pub fn off() -> MemoryConfig {
        MemoryConfig {
            ttl: Duration::ZERO,
            max_entries: 0,
            max_bytes: 0,
        }
    }
}

/// A span seen earlier, as [`TraceMemory::recall`] answers: what its children inherit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Seen {
    pub stage: Stage,
    /// Whether this may still change: the span waits in an [`super::assemble::Assembler`]
    /// for a relative, so what it passes on is provisional.
    pub pending: bool,
    pub attempt: Option<i64>,
    /// Tool, call id and agent (`None`: none of the three).
    pub ids: Option<Ids>,
}

/// A span to remember ([`TraceMemory::remember`]), its strings borrowed from the request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Remember<'a> {
    pub stage: Stage,
    /// See [`Seen::pending`].
    pub pending: bool,
    pub attempt: Option<i64>,
    /// Tool, call id and agent.
    pub ids: IdsRef<'a>,
}

/// A span's tool, call id and agent, borrowed.
pub(crate) type IdsRef<'a> = (Option<&'a str>, Option<&'a str>, Option<&'a str>);

/// The strings a recalled span passes on (tool, call id, agent): one allocation holding
/// three lengths and the bytes, a copy of the record in the memory's arena.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Ids(Box<[u8]>);

/// The length stored for an absent string.
const ABSENT: u32 = u32::MAX;

impl Ids {
    /// The record of three strings written by [`write_record`], copied out of an arena.
    fn from_record(record: &[u8]) -> Ids {
        Ids(record.into())
    }

    /// Part `i` (0 tool, 1 call id, 2 agent).
    fn part(&self, i: usize) -> Option<&str> {
        record_part(&self.0, i)
    }
}

/// Appends the record of three strings to `buf`: their three lengths (`ABSENT` for a missing
/// one), then their bytes. [`Ids`] holds one; a generation's arena holds many back to back.
fn write_record(buf: &mut Vec<u8>, ids: IdsRef<'_>) {
    // A string longer than 4 GiB (impossible in a request) is kept as absent.
    let parts = [ids.0, ids.1, ids.2].map(|p| p.filter(|s| u32::try_from(s.len()).is_ok()));
    for p in parts {
        let n = p.map_or(ABSENT, |s| s.len() as u32);
        buf.extend_from_slice(&n.to_le_bytes());
    }
    for p in parts.into_iter().flatten() {
        buf.extend_from_slice(p.as_bytes());
    }
}

/// The length field `k` of the record starting at `b` (`ABSENT` when `b` is too short, which
/// a record written by [`write_record`] never is).
fn record_len(b: &[u8], k: usize) -> u32 {
    let at = 4 * k;
    match b.get(at..at + 4) {
        Some(&[a, b2, c, d]) => u32::from_le_bytes([a, b2, c, d]),
        _ => ABSENT,
    }
}

/// Where part `i` of the record starting at `b` begins (`i == 3`: the record's length).
fn part_start(b: &[u8], i: usize) -> usize {
    12 + (0..i)
        .map(|k| record_len(b, k))
        .filter(|&n| n != ABSENT)
        .map(|n| n as usize)
        .sum::<usize>()
}

/// The length of the record starting at `b`.
fn record_size(b: &[u8]) -> usize {
    part_start(b, 3)
}

/// Part `i` (0 tool, 1 call id, 2 agent) of the record starting at `b`.
fn record_part(b: &[u8], i: usize) -> Option<&str> {
    let start = part_start(b, i);
    let n = record_len(b, i);
    if n == ABSENT {
        return None;
    }
    // Written from `&str` parts by `write_record`: always valid, and never a panic on a bad
    // slice.
    b.get(start..start + n as usize)
        .and_then(|s| std::str::from_utf8(s).ok())
}

impl std::fmt::Debug for Ids {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ids")
            .field("tool", &self.part(0))
            .field("call_id", &self.part(1))
            .field("agent", &self.part(2))
            .finish()
    }
}

impl Seen {
    pub fn tool(&self) -> Option<&str> {
        self.ids.as_ref().and_then(|i| i.part(0))
    }
    pub fn call_id(&self) -> Option<&str> {
        self.ids.as_ref().and_then(|i| i.part(1))
    }
    pub fn agent(&self) -> Option<&str> {
        self.ids.as_ref().and_then(|i| i.part(2))
    }
}

/// What the children seen so far told a parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Told {
    /// The latest failing child's (end time, error type).
    pub child_error: Option<(u64, ErrorType)>,
    /// The highest attempt number among its attempt children.
    pub attempts_seen: i64,
    /// A child is a tool call span of toolspan's conventions: the hash of its tool
    /// ([`tool_hash`]). A foreign call span of that tool above it is its mirror.
    pub toolspan_call: Option<u64>,
    /// A child that is another instrumentation's span of this call failed: the call failed.
    pub mirror_failed: bool,
}

/// A tool name's hash, as [`Told::toolspan_call`] keeps it.
pub(crate) fn tool_hash(tool: &str) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = foldhash::fast::FixedState::with_seed(0x7c1f_9a00).build_hasher();
    h.write(tool.as_bytes());
    h.finish()
}

impl Told {
    fn merge(&mut self, o: Told) {
        if let Some((end, et)) = o.child_error {
            if self.child_error.is_none_or(|(t, _)| end >= t) {
                self.child_error = Some((end, et));
            }
        }
        self.attempts_seen = self.attempts_seen.max(o.attempts_seen);
        self.toolspan_call = self.toolspan_call.or(o.toolspan_call);
        self.mirror_failed |= o.mirror_failed;
    }
}

/// (trace id, span id).
pub(crate) type Key = (u128, u64);

/// How many recent calls' strings [`TraceMemory::remember`] looks back on to share them.
const RECENT: usize = 8;

/// Figures for metrics and logs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Entries held now.
    pub entries: u64,
    /// Approximate bytes held now.
    pub bytes: u64,
    /// Entries evicted by the count or byte cap before their time (since start).
    pub evicted: u64,
}

/// The key inside the memory: the trace id folded to 64 bits (trace ids are random; two
/// spans collide only if their span ids are equal too) and the span id.
type MemKey = (u64, u64);

fn mem_key((t, s): Key) -> MemKey {
    ((t >> 64) as u64 ^ t as u64, s)
}

/// Bytes an entry costs besides its strings (entry, hash-table slot, vector slack).
const SEEN_OVERHEAD: usize = 40;
const TOLD_OVERHEAD: usize = 48;

/// A span seen, as a generation keeps it: 24 bytes, its strings in the generation's arena.
#[derive(Debug, Clone, Copy)]
struct Entry {
    span: u64,
    attempt: i64,
    /// Where the span's strings start in [`Generation::arena`]; [`NO_IDS`] for none.
    ids: u32,
    stage: Stage,
    pending: bool,
    has_attempt: bool,
}

/// [`Entry::ids`] of a span without tool, call id and agent.
const NO_IDS: u32 = u32::MAX;

/// An arena never grows past this (offsets are `u32`): a rotation comes first.
const MAX_ARENA: usize = (u32::MAX / 2) as usize;

/// Spans of one trace seen in a generation. Most traces hold a few dozen spans: a vector in
/// the order they went in (a later entry for a span id replaces the earlier one). Past
/// [`FEW`] spans, a hash table, so that a huge trace (or a flood of one trace's orphans)
/// costs no more per span than a small one.
enum TraceSeen {
    Few(Vec<Entry>),
    Many(HashMap<u64, Entry, foldhash::fast::RandomState>),
}

const FEW: usize = 64;

impl TraceSeen {
    fn get(&self, span: u64) -> Option<&Entry> {
        match self {
            TraceSeen::Few(v) => v.iter().rev().find(|e| e.span == span),
            TraceSeen::Many(m) => m.get(&span),
        }
    }

    /// Puts a span; returns whether it was new.
    fn put(&mut self, entry: Entry) -> bool {
        match self {
            TraceSeen::Few(v) => {
                if let Some(slot) = v.iter_mut().find(|e| e.span == entry.span) {
                    *slot = entry;
                    return false;
                }
                if v.len() < FEW {
                    v.push(entry);
                    return true;
                }
                let mut m: HashMap<u64, Entry, foldhash::fast::RandomState> =
                    std::mem::take(v).into_iter().map(|e| (e.span, e)).collect();
                let new = m.insert(entry.span, entry).is_none();
                *self = TraceSeen::Many(m);
                new
            }
            TraceSeen::Many(m) => m.insert(entry.span, entry).is_none(),
        }
    }
}

/// One generation of entries ([`TraceMemory`]). Spans seen are grouped by trace: a request
/// holds a trace's spans together, so remembering them costs one hash-table lookup per trace
/// and a short scan and push per span, not a hash-table insert per span. Their strings go
/// into one arena, a call's once (its attempts and stages repeat them): no allocation per
/// span or call, and dropping a generation frees a few large buffers.
struct Generation {
    seen: HashMap<u64, TraceSeen, foldhash::fast::RandomState>,
    /// Spans in `seen`.
    seen_len: usize,
    /// The records of tool, call id and agent ([`write_record`]) that entries point into.
    arena: Vec<u8>,
    told: HashMap<MemKey, Told, foldhash::fast::RandomState>,
    born: Instant,
    /// When the newest entry went in.
    last_insert: Instant,
}

impl Generation {
    fn new(now: Instant) -> Generation {
        Generation {
            seen: HashMap::default(),
            seen_len: 0,
            arena: Vec::new(),
            told: HashMap::default(),
            born: now,
            last_insert: now,
        }
    }

    fn len(&self) -> usize {
        self.seen_len + self.told.len()
    }

    /// Approximate bytes held.
    fn bytes(&self) -> usize {
        self.seen_len * SEEN_OVERHEAD + self.told.len() * TOLD_OVERHEAD + self.arena.len()
    }

    fn clear(&mut self) {
        self.seen.clear();
        self.seen_len = 0;
        self.arena.clear();
        self.told.clear();
    }

    /// What `e` (an entry of this generation) tells a child.
    fn recalled(&self, e: &Entry) -> Seen {
        let ids = (e.ids != NO_IDS)
            .then(|| self.arena.get(e.ids as usize..))
            .flatten()
            .map(|b| Ids::from_record(&b[..record_size(b).min(b.len())]));
        Seen {
            stage: e.stage,
            pending: e.pending,
            attempt: e.has_attempt.then_some(e.attempt),
            ids,
        }
    }
}

struct Inner {
    /// Where new entries go.
    current: Generation,
    /// The generation before: still read, dropped whole at the next rotation.
    previous: Generation,
    evicted: u64,
    last_log: Option<Instant>,
}

impl Inner {
    fn seen(&self, (trace, span): MemKey) -> Option<Seen> {
        find_seen(&self.current, trace, span).or_else(|| find_seen(&self.previous, trace, span))
    }

    fn told(&self, key: &MemKey) -> Option<&Told> {
        self.current
            .told
            .get(key)
            .or_else(|| self.previous.told.get(key))
    }

    fn has_told(&self) -> bool {
        !self.current.told.is_empty() || !self.previous.told.is_empty()
    }
}

fn find_seen(g: &Generation, trace: u64, span: u64) -> Option<Seen> {
    let e = g.seen.get(&trace)?.get(span)?;
    Some(g.recalled(e))
}

/// The memory, shared by every request a [`super::Pipeline`] processes.
///
/// Two generations: entries go into the current one; when it is [`MemoryConfig::ttl`] old,
/// or holds half of a cap, it becomes the previous one and the previous one is dropped whole.
/// So an entry is kept at least the TTL (unless the caps force a rotation sooner, which is
/// counted as eviction) and at most twice it, and no entry is ever removed one by one: a
/// remembered span costs one hash-table insert, not an insert, a queue entry and a removal.
pub struct TraceMemory {
    config: MemoryConfig,
    inner: Mutex<Inner>,
}

impl TraceMemory {
    /// An empty memory.
    pub fn new(config: MemoryConfig) -> TraceMemory {
        let now = Instant::now();
        TraceMemory {
            config,
            inner: Mutex::new(Inner {
                current: Generation::new(now),
                previous: Generation::new(now),
                evicted: 0,
                last_log: None,
            }),
        }
    }

    /// True when the memory keeps nothing.
    pub fn is_off(&self) -> bool {
        self.config.max_entries == 0 || self.config.ttl.is_zero()
    }

    /// Current figures.
    pub fn stats(&self) -> MemoryStats {
        let g = self.lock();
        MemoryStats {
            entries: (g.current.len() + g.previous.len()) as u64,
            bytes: (g.current.bytes() + g.previous.bytes()) as u64,
            evicted: g.evicted,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The memory only adds context; a panic elsewhere while it was held leaves it usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The spans seen with these keys.
    pub(crate) fn recall(&self, parents: &[Key]) -> Vec<Option<Seen>> {
        if self.is_off() || parents.is_empty() {
            return vec![None; parents.len()];
        }
        let now = Instant::now();
        let mut g = self.lock();
        self.expire(&mut g, now);
        parents.iter().map(|&k| g.seen(mem_key(k))).collect()
    }

    /// What the children seen so far told the spans with these keys.
    pub(crate) fn recall_told(&self, keys: &[Key]) -> Vec<Option<Told>> {
        if self.is_off() || keys.is_empty() {
            return vec![None; keys.len()];
        }
        let mut g = self.lock();
        self.expire(&mut g, Instant::now());
        if !g.has_told() {
            return vec![None; keys.len()];
        }
        keys.iter().map(|&k| g.told(&mem_key(k)).copied()).collect()
    }

    /// Remembers spans seen (consecutive spans of one trace are filed together) and what
    /// children told parents not (yet) seen with them.
    pub(crate) fn remember<'a>(
        &self,
        seen: impl IntoIterator<Item = (Key, Remember<'a>)>,
        told: Vec<(Key, Told)>,
    ) {
        if self.is_off() {
            return;
        }
        let mut seen = seen.into_iter().peekable();
        if seen.peek().is_none() && told.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut g = self.lock();
        self.expire(&mut g, now);
        // The strings of the last few spans filed, with their place in the arena: a call's
        // attempts and stages repeat its tool, call id and agent.
        let mut recent: Vec<(IdsRef<'a>, u32)> = Vec::with_capacity(RECENT);
        while let Some((k, v)) = seen.next() {
            // One run: consecutive spans of one trace.
            if self.make_room(&mut g, now) {
                recent.clear();
            }
            let (trace, _) = mem_key(k);
            let gen = &mut g.current;
            let arena = &mut gen.arena;
            let mut entry = |span: u64, v: Remember<'a>| {
                let ids = if v.ids == (None, None, None) {
                    NO_IDS
                } else if let Some(&(_, at)) = recent.iter().rev().find(|(r, _)| *r == v.ids) {
                    at
                } else {
                    let at = arena.len() as u32;
                    write_record(arena, v.ids);
                    if recent.len() == RECENT {
                        recent.remove(0);
                    }
                    recent.push((v.ids, at));
                    at
                };
                Entry {
                    span,
                    attempt: v.attempt.unwrap_or(0),
                    ids,
                    stage: v.stage,
                    pending: v.pending,
                    has_attempt: v.attempt.is_some(),
                }
            };
            // A request holds a trace's spans together: room for a few dozen (at most the
            // spans left to file) from the start, not four, then eight, then sixteen; what a
            // short trace leaves unused is given back below.
            let room = seen.size_hint().0.saturating_add(1).min(32);
            let spans = gen
                .seen
                .entry(trace)
                .or_insert_with(|| TraceSeen::Few(Vec::with_capacity(room)));
            let mut added = usize::from(spans.put(entry(k.1, v)));
            while let Some((k2, _)) = seen.peek() {
                if mem_key(*k2).0 != trace {
                    break;
                }
                let Some((k2, v2)) = seen.next() else { break };
                added += usize::from(spans.put(entry(k2.1, v2)));
            }
            if let TraceSeen::Few(v) = spans {
                if v.capacity() > 2 * v.len() {
                    v.shrink_to_fit();
                }
            }
            gen.seen_len += added;
        }
        for (k, v) in told {
            let key = mem_key(k);
            let merged = match g.told(&key) {
                Some(old) => {
                    let mut m = *old;
                    m.merge(v);
                    m
                }
                None => v,
            };
            self.make_room(&mut g, now);
            g.current.told.insert(key, merged);
        }
        g.current.last_insert = now;
    }

    /// Rotates before an insert when the current generation holds half of a cap; returns
    /// whether it did.
    fn make_room(&self, g: &mut Inner, now: Instant) -> bool {
        let half_entries = self.config.max_entries.div_ceil(2);
        let half_bytes = self.config.max_bytes / 2;
        let full = g.current.len() >= half_entries
            || g.current.bytes() > half_bytes
            || g.current.arena.len() > MAX_ARENA;
        if full {
            self.rotate(g, now, true);
        }
        full
    }

    /// Rotates once the current generation is a TTL old, and drops the previous one once
    /// even its newest entry is (after an idle spell), so that no entry outlives about twice
    /// the TTL and every entry lives at least the TTL unless a cap evicts it.
    fn expire(&self, g: &mut Inner, now: Instant) {
        if now.duration_since(g.current.born) >= self.config.ttl {
            self.rotate(g, now, false);
        }
        if g.previous.len() > 0 && now.duration_since(g.previous.last_insert) >= self.config.ttl {
            g.previous.clear();
        }
    }

    /// The current generation becomes the previous one; the previous one is dropped. `forced`
    /// by a cap: the dropped entries younger than the TTL count as evicted.
    fn rotate(&self, g: &mut Inner, now: Instant, forced: bool) {
        let mut dropped = std::mem::replace(&mut g.current, Generation::new(now));
        std::mem::swap(&mut dropped, &mut g.previous);
        let evicted = if forced && now.duration_since(dropped.born) < self.config.ttl {
            dropped.len() as u64
        } else {
            0
        };
        // The next generation will likely hold as many entries: reuse the dropped tables.
        dropped.clear();
        g.current.seen = dropped.seen;
        g.current.arena = dropped.arena;
        g.current.told = dropped.told;
        if evicted > 0 {
            g.evicted += evicted;
            if g.last_log
                .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(60))
            {
                g.last_log = Some(now);
                tracing::warn!(
                    evicted_total = g.evicted,
                    entries = g.current.len() + g.previous.len(),
                    max_entries = self.config.max_entries,
                    max_bytes = self.config.max_bytes,
                    "trace assembly memory full: older spans forgotten before their time; \
                     pieces of a trace further apart may be classified without their relatives"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests;
