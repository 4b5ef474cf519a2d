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
//! Bounded three ways: entries older than [`MemoryConfig::ttl`] are forgotten, and past
//! [`MemoryConfig::max_entries`] or [`MemoryConfig::max_bytes`] the oldest are evicted first;
//! evictions by the caps are counted ([`MemoryStats::evicted`]) and logged (at most once a
//! minute), since they mean pieces further apart than the memory reaches may be misclassified.
//! Nothing is ever dropped from the table because of the memory: it only adds context.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use toolspan_schema::{ErrorType, Stage};

/// How much the memory keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryConfig {
    /// How long an entry is kept: the longest gap between two pieces of a trace that still
    /// classify as one.
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
    pub tool: Option<Box<str>>,
    pub call_id: Option<Box<str>>,
    pub attempt: Option<i64>,
    pub agent: Option<Box<str>>,
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

struct Inner {
    /// `true` in the key's third place: a [`Told`] entry.
    map: HashMap<(u128, u64, bool), (Instant, Entry), foldhash::fast::RandomState>,
    /// Insertion order, for expiry and eviction (an entry re-inserted later leaves a stale
    /// element here, recognised by its older instant).
    order: VecDeque<(Instant, (u128, u64, bool))>,
    bytes: usize,
    evicted: u64,
    last_log: Option<Instant>,
}

/// The memory, shared by every request a [`super::Pipeline`] processes.
pub struct TraceMemory {
    config: MemoryConfig,
    inner: Mutex<Inner>,
}

impl TraceMemory {
    /// An empty memory.
    pub fn new(config: MemoryConfig) -> TraceMemory {
        TraceMemory {
            config,
            inner: Mutex::new(Inner {
                map: HashMap::default(),
                order: VecDeque::new(),
                bytes: 0,
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
            entries: g.map.len() as u64,
            bytes: g.bytes as u64,
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
            .map(|&(t, s)| match g.map.get(&(t, s, false)) {
                Some((_, Entry::Seen(v))) => Some(v.clone()),
                _ => None,
            })
            .collect();
        let told = told
            .iter()
            .map(|&(t, s)| match g.map.get(&(t, s, true)) {
                Some((_, Entry::Told(v))) => Some(*v),
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
        for ((t, s), v) in seen {
            self.insert(&mut g, now, (t, s, false), Entry::Seen(v));
        }
        for ((t, s), v) in told {
            let key = (t, s, true);
            let merged = match g.map.get(&key) {
                Some((_, Entry::Told(old))) => {
                    let mut m = *old;
                    m.merge(v);
                    m
                }
                _ => v,
            };
            self.insert(&mut g, now, key, Entry::Told(merged));
        }
        self.evict(&mut g, now);
    }

    fn insert(&self, g: &mut Inner, now: Instant, key: (u128, u64, bool), e: Entry) {
        let b = entry_bytes(&e);
        if let Some((_, old)) = g.map.insert(key, (now, e)) {
            g.bytes -= entry_bytes(&old);
        }
        g.bytes += b;
        g.order.push_back((now, key));
    }

    /// Forgets entries past their time.
    fn expire(&self, g: &mut Inner, now: Instant) {
        while let Some(&(at, key)) = g.order.front() {
            if now.duration_since(at) < self.config.ttl {
                break;
            }
            g.order.pop_front();
            Self::remove_if_at(g, key, at);
        }
    }

    /// Expires, then evicts the oldest entries while a cap is exceeded.
    fn evict(&self, g: &mut Inner, now: Instant) {
        self.expire(g, now);
        let mut evicted = 0u64;
        while g.map.len() > self.config.max_entries || g.bytes > self.config.max_bytes {
            let Some((at, key)) = g.order.pop_front() else {
                break;
            };
            if Self::remove_if_at(g, key, at) {
                evicted += 1;
            }
        }
        // Stale order elements (keys re-inserted later) would otherwise accumulate.
        if g.order.len() > 2 * g.map.len() + 1024 {
            let map = &g.map;
            g.order
                .retain(|(at, key)| map.get(key).is_some_and(|(t, _)| t == at));
        }
        if evicted > 0 {
            g.evicted += evicted;
            if g.last_log
                .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(60))
            {
                g.last_log = Some(now);
                tracing::warn!(
                    evicted_total = g.evicted,
                    entries = g.map.len(),
                    bytes = g.bytes,
                    max_entries = self.config.max_entries,
                    max_bytes = self.config.max_bytes,
                    "trace assembly memory full: oldest spans forgotten before their time; \
                     pieces of a trace further apart may be classified without their relatives"
                );
            }
        }
    }

    /// Removes `key` if it is still the entry inserted at `at`; true if it was removed.
    fn remove_if_at(g: &mut Inner, key: (u128, u64, bool), at: Instant) -> bool {
        if g.map.get(&key).is_some_and(|(t, _)| *t == at) {
            if let Some((_, e)) = g.map.remove(&key) {
                g.bytes -= entry_bytes(&e);
                return true;
            }
        }
        false
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
        assert_eq!(st.entries, 100);
        assert_eq!(st.evicted, 900);
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
        assert!(b.stats().bytes <= 10_000);
        assert!(b.stats().evicted > 900);
    }

    #[test]
    fn entries_expire() {
        let m = TraceMemory::new(MemoryConfig {
            ttl: Duration::from_millis(20),
            ..MemoryConfig::default()
        });
        m.remember(vec![((1, 1), seen("t"))], vec![]);
        std::thread::sleep(Duration::from_millis(40));
        let (s, _) = m.recall(&[(1, 1)], &[]);
        assert!(s[0].is_none());
        assert_eq!(m.stats().entries, 0);
        assert_eq!(m.stats().evicted, 0, "expiry is not eviction");
    }
}
