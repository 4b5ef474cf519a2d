//! A SIMD-friendly ASCII case-insensitive search for many short trigger strings: the
//! prefilter shared by redaction and leak detection.

use aho_corasick::{packed, AhoCorasick, AhoCorasickBuilder, AhoCorasickKind};

/// ASCII case-insensitive search for many short trigger strings at once.
///
/// The haystack is case-folded into a stack buffer a chunk at a time (`b | 0x20`, which
/// vectorises) and searched with the SIMD "Teddy" packed searcher of `aho-corasick`, several
/// times faster than an automaton over the original bytes. Folding also maps a few non-letters
/// onto each other (`_` and DEL, `\` and `|`): harmless for a prefilter whose hits are checked
/// against the original text. Short haystacks, and all haystacks where Teddy is unavailable
/// (no SSSE3/NEON), go through a case-insensitive Aho-Corasick automaton instead.
pub(crate) struct TriggerSearch {
    /// Searchers of up to 64 folded patterns each, with the index of their first pattern.
    /// Empty when Teddy is unavailable.
    pub(crate) packed: Vec<(usize, packed::Searcher)>,
    /// Case-insensitive automaton over the original bytes: used for short haystacks, where
    /// Teddy's fixed cost dominates, and when Teddy is unavailable.
    pub(crate) automaton: AhoCorasick,
    pub(crate) max_len: usize,
}

/// Below this length the automaton is faster than folding and Teddy.
const SHORT: usize = 32;

/// The case fold used by [`TriggerSearch`].
#[inline]
fn fold(b: u8) -> u8 {
    b | 0x20
}

impl TriggerSearch {
    pub(crate) fn new(patterns: &[&str]) -> TriggerSearch {
        #[allow(clippy::expect_used)]
        let automaton = AhoCorasickBuilder::new()
            .ascii_case_insensitive(true)
            .kind(Some(AhoCorasickKind::DFA))
            .build(patterns)
            // A few dozen short literals: far below any automaton size limit.
            .expect("trigger automaton builds (covered by tests)");
        let folded: Vec<Vec<u8>> = patterns
            .iter()
            .map(|p| p.bytes().map(fold).collect())
            .collect();
        let max_len = patterns.iter().map(|p| p.len()).max().unwrap_or(1).max(1);
        let mut packed = Vec::new();
        for (i, group) in folded.chunks(64).enumerate() {
            let searcher = packed::Config::new()
                .match_kind(packed::MatchKind::LeftmostFirst)
                .builder()
                .extend(group)
                .build();
            match searcher {
                Some(searcher) => packed.push((i * 64, searcher)),
                None => {
                    packed.clear();
                    break;
                }
            }
        }
        TriggerSearch {
            packed,
            automaton,
            max_len,
        }
    }

    /// Calls `f(position, pattern index)` for trigger occurrences in `hay`. Occurrences that
    /// overlap an earlier reported one may be skipped; one may be reported twice.
    pub(crate) fn for_each(&self, hay: &[u8], mut f: impl FnMut(usize, usize)) {
        if hay.len() < SHORT || self.packed.is_empty() {
            if hay.len() >= SHORT || self.automaton.is_match(hay) {
                for m in self.automaton.find_overlapping_iter(hay) {
                    f(m.start(), m.pattern().as_usize());
                }
            }
            return;
        }
        let mut small = [0u8; 256];
        let mut large;
        let buf: &mut [u8] = if hay.len() <= small.len() {
            &mut small
        } else {
            large = [0u8; 2048];
            &mut large
        };
        let mut start = 0;
        // Matches ending at or before this offset were reported while searching the previous
        // chunk; chunks overlap by `max_len - 1` so that no occurrence is cut in two.
        let mut reported_until = 0;
        loop {
            let end = (start + buf.len()).min(hay.len());
            let folded = &mut buf[..end - start];
            for (d, c) in folded.iter_mut().zip(&hay[start..end]) {
                *d = fold(*c);
            }
            for (first, searcher) in &self.packed {
                for m in searcher.find_iter(&*folded) {
                    if start + m.end() > reported_until {
                        f(start + m.start(), first + m.pattern().as_usize());
                    }
                }
            }
            if end == hay.len() {
                break;
            }
            reported_until = end;
            start = end - (self.max_len - 1);
        }
    }
}
