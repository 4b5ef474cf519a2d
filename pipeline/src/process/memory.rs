//! What the pipeline remembers of recent spans, so that a trace split over many requests (or
//! Kafka messages, or flushes) is classified as if it had arrived whole (issue 15).
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
use std::sync::{Arc, Mutex};
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

/// A span seen earlier: what its children inherit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Seen {
    pub stage: Stage,
    pub tool: Option<Arc<str>>,
    pub call_id: Option<Arc<str>>,
    pub attempt: Option<i64>,
    pub agent: Option<Arc<str>>,
    /// Whether this may still change: the span waits in an [`super::assemble::Assembler`]
    /// for a relative, so what it passes on is provisional.
    pub pending: bool,
}

/// What the children seen so far told a parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Told {
    /// The latest failing child's (end time, error type).
    pub child_error: Option<(u64, ErrorType)>,
    /// The highest attempt number among its attempt children.
    pub attempts_seen: i64,
}

impl Told {
    fn merge(&mut self, o: Told) {
        if let Some((end, et)) = o.child_error {
            if self.child_error.is_none_or(|(t, _)| end >= t) {
                self.child_error = Some((end, et));
            }
        }
        self.attempts_seen = self.attempts_seen.max(o.attempts_seen);
    }
}

/// (trace id, span id).
pub(crate) type Key = (u128, u64);

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

enum Entry {
    Seen(Seen),
    Told(Told),
}

const ENTRY_OVERHEAD: usize = 96;

fn entry_bytes(e: &Entry) -> usize {
    ENTRY_OVERHEAD
        + match e {
            Entry::Seen(s) => [&s.tool, &s.call_id, &s.agent]
                .iter()
                .map(|v| v.as_ref().map_or(0, |v| v.len()))
                .sum(),
            Entry::Told(_) => 0,
        }
}

/// One generation of entries ([`TraceMemory`]).
struct Generation {
    map: HashMap<(u128, u64, bool), Entry, foldhash::fast::RandomState>,
    born: Instant,
    /// When the newest entry went in.
    last_insert: Instant,
    bytes: usize,
}

impl Generation {
    fn new(now: Instant) -> Generation {
        Generation {
            map: HashMap::default(),
            born: now,
            last_insert: now,
            bytes: 0,
        }
    }

    fn get(&self, key: &(u128, u64, bool)) -> Option<&Entry> {
        self.map.get(key)
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
    fn get(&self, key: &(u128, u64, bool)) -> Option<&Entry> {
        self.current.get(key).or_else(|| self.previous.get(key))
    }
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
            entries: (g.current.map.len() + g.previous.map.len()) as u64,
            bytes: (g.current.bytes + g.previous.bytes) as u64,
            evicted: g.evicted,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The memory only adds context; a panic elsewhere while it was held leaves it usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The spans seen with these keys, and what the children seen so far told the spans with
    /// those keys.
    pub(crate) fn recall(
        &self,
        parents: &[Key],
        told: &[Key],
    ) -> (Vec<Option<Seen>>, Vec<Option<Told>>) {
        if self.is_off() {
            return (vec![None; parents.len()], vec![None; told.len()]);
        }
        let now = Instant::now();
        let mut g = self.lock();
        self.expire(&mut g, now);
        let seen = parents
            .iter()
            .map(|&(t, s)| match g.get(&(t, s, false)) {
                Some(Entry::Seen(v)) => Some(v.clone()),
                _ => None,
            })
            .collect();
        let told = told
            .iter()
            .map(|&(t, s)| match g.get(&(t, s, true)) {
                Some(Entry::Told(v)) => Some(*v),
                _ => None,
            })
            .collect();
        (seen, told)
    }

    /// Remembers spans seen and what children told parents not (yet) seen with them.
    pub(crate) fn remember(&self, seen: Vec<(Key, Seen)>, told: Vec<(Key, Told)>) {
        if self.is_off() || (seen.is_empty() && told.is_empty()) {
            return;
        }
        let now = Instant::now();
        let mut g = self.lock();
        self.expire(&mut g, now);
        for ((t, s), v) in seen {
            self.insert(&mut g, now, (t, s, false), Entry::Seen(v));
        }
        for ((t, s), v) in told {
            let key = (t, s, true);
            let merged = match g.get(&key) {
                Some(Entry::Told(old)) => {
                    let mut m = *old;
                    m.merge(v);
                    m
                }
                _ => v,
            };
            self.insert(&mut g, now, key, Entry::Told(merged));
        }
    }

    fn insert(&self, g: &mut Inner, now: Instant, key: (u128, u64, bool), e: Entry) {
        let half_entries = self.config.max_entries.div_ceil(2);
        let half_bytes = self.config.max_bytes / 2;
        if g.current.map.len() >= half_entries || g.current.bytes > half_bytes {
            self.rotate(g, now, true);
        }
        let b = entry_bytes(&e);
        if let Some(old) = g.current.map.insert(key, e) {
            g.current.bytes -= entry_bytes(&old);
        }
        g.current.bytes += b;
        g.current.last_insert = now;
    }

    /// Rotates once the current generation is a TTL old, and drops the previous one once
    /// even its newest entry is (after an idle spell), so that no entry outlives about twice
    /// the TTL and every entry lives at least the TTL unless a cap evicts it.
    fn expire(&self, g: &mut Inner, now: Instant) {
        if now.duration_since(g.current.born) >= self.config.ttl {
            self.rotate(g, now, false);
        }
        if !g.previous.map.is_empty()
            && now.duration_since(g.previous.last_insert) >= self.config.ttl
        {
            g.previous.map.clear();
            g.previous.bytes = 0;
        }
    }

    /// The current generation becomes the previous one; the previous one is dropped. `forced`
    /// by a cap: the dropped entries younger than the TTL count as evicted.
    fn rotate(&self, g: &mut Inner, now: Instant, forced: bool) {
        let mut dropped = std::mem::replace(&mut g.current, Generation::new(now));
        std::mem::swap(&mut dropped, &mut g.previous);
        let evicted = if forced && now.duration_since(dropped.born) < self.config.ttl {
            dropped.map.len() as u64
        } else {
            0
        };
        // The next generation will likely hold as many entries: reuse the dropped table.
        dropped.map.clear();
        g.current.map = dropped.map;
        if evicted > 0 {
            g.evicted += evicted;
            if g.last_log
                .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(60))
            {
                g.last_log = Some(now);
                tracing::warn!(
                    evicted_total = g.evicted,
                    entries = g.current.map.len() + g.previous.map.len(),
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
mod tests {
    use super::*;

    fn seen(tool: &str) -> Seen {
        Seen {
            stage: Stage::Call,
            tool: Some(tool.into()),
            call_id: Some("c1".into()),
            attempt: None,
            agent: None,
            pending: false,
        }
    }

    #[test]
    fn recalls_what_it_was_told_and_merges_children() {
        let m = TraceMemory::new(MemoryConfig::default());
        m.remember(vec![((1, 10), seen("search"))], vec![]);
        m.remember(
            vec![],
            vec![(
                (1, 10),
                Told {
                    child_error: Some((5, ErrorType::Parse)),
                    attempts_seen: 1,
                },
            )],
        );
        m.remember(
            vec![],
            vec![(
                (1, 10),
                Told {
                    child_error: Some((3, ErrorType::Network)),
                    attempts_seen: 2,
                },
            )],
        );
        let (s, t) = m.recall(&[(1, 10), (2, 10)], &[(1, 10)]);
        assert_eq!(
            s[0].as_ref().and_then(|s| s.tool.as_deref()),
            Some("search")
        );
        assert!(s[1].is_none(), "another trace's span id must not match");
        assert_eq!(
            t[0],
            Some(Told {
                child_error: Some((5, ErrorType::Parse)),
                attempts_seen: 2
            }),
            "the latest failing child wins, attempts take the maximum"
        );
    }

    #[test]
    fn caps_evict_the_oldest_and_count_them() {
        let m = TraceMemory::new(MemoryConfig {
            ttl: Duration::from_secs(60),
            max_entries: 100,
            max_bytes: usize::MAX,
        });
        for i in 0..1_000u64 {
            m.remember(vec![((7, i), seen("t"))], vec![]);
        }
        let st = m.stats();
        assert!(st.entries <= 100 && st.entries >= 50, "{st:?}");
        assert_eq!(st.evicted + st.entries, 1_000);
        let (s, _) = m.recall(&[(7, 0), (7, 999)], &[]);
        assert!(
            s[0].is_none() && s[1].is_some(),
            "oldest forgotten, newest kept"
        );

        let b = TraceMemory::new(MemoryConfig {
            ttl: Duration::from_secs(60),
            max_entries: usize::MAX,
            max_bytes: 10_000,
        });
        for i in 0..1_000u64 {
            b.remember(vec![((7, i), seen(&"x".repeat(100)))], vec![]);
        }
        assert!(b.stats().bytes <= 10_000 + 300);
        assert!(b.stats().evicted > 900);
    }

    #[test]
    fn entries_expire() {
        let m = TraceMemory::new(MemoryConfig {
            ttl: Duration::from_millis(20),
            ..MemoryConfig::default()
        });
        m.remember(vec![((1, 1), seen("t"))], vec![]);
        let (s, _) = m.recall(&[(1, 1)], &[]);
        assert!(s[0].is_some(), "kept for at least the TTL");
        std::thread::sleep(Duration::from_millis(50));
        let (s, _) = m.recall(&[(1, 1)], &[]);
        assert!(s[0].is_none());
        assert_eq!(m.stats().entries, 0);
        assert_eq!(m.stats().evicted, 0, "expiry is not eviction");
    }
}
