//! The model's recovery across turns, as the `recoveries` view computes it
//! (`query/src/views.rs`), counted as calls stream by, with bounded memory.
//!
//! A failure streak is the consecutive failed calls of one tool within one trace. It ends
//! **recovered** when a later call of that tool in the trace does not fail, and
//! **unrecovered** when no such call comes within the window ([`DEFAULT_WINDOW`], the
//! metrics job's `--recovery-window-secs`) or when the streak is evicted to keep at most
//! [`MAX_STREAKS`] open. The view also follows a conversation id across traces and orders
//! calls by start time; here a trace's calls are ordered by start time within each batch and
//! batches are taken in arrival order, so the two agree when a trace's calls arrive together
//! or in order (trace assembly releases a trace's pieces together).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// How long a failure streak waits for the call that recovers it.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(300);

/// Failure streaks open at most; the oldest is closed as unrecovered past it.
pub const MAX_STREAKS: usize = 100_000;

/// The arguments hashes remembered per streak (for hammering).
const MAX_HASHES: usize = 16;

/// Calls with the same failing arguments, past the first, that make a streak hammering (as
/// the view's `hammering`).
pub const HAMMERING_REPEATS: u32 = 2;

/// How a streak ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    /// The tool (label values of the streak's first failure).
    pub tool: String,
    /// The service that made the calls.
    pub service: String,
    /// Its `service.version` (empty when absent).
    pub version: String,
    /// Failed calls in the streak.
    pub failures: u32,
    /// `Some(failures + 1)` when recovered.
    pub calls_to_recovery: Option<u32>,
    /// Two or more calls repeated failing arguments.
    pub hammering: bool,
}

struct Streak {
    tool: String,
    service: String,
    version: String,
    failures: u32,
    hashes: Vec<String>,
    identical: u32,
    generation: u64,
}

/// One call of a tool, in the order the streaks should see it.
pub struct Call<'a> {
    /// The trace (the agent run).
    pub trace_id: &'a str,
    /// The tool.
    pub tool: &'a str,
    /// The service that made the call.
    pub service: &'a str,
    /// Its `service.version` (empty when absent).
    pub version: &'a str,
    /// Status error.
    pub failed: bool,
    /// The hash of the call's arguments.
    pub input_sha256: Option<&'a str>,
}

/// The open failure streaks.
pub struct Streaks {
    open: HashMap<(String, String), Streak>,
    order: VecDeque<(Instant, (String, String), u64)>,
    generation: u64,
    window: Duration,
    max: usize,
}

impl Streaks {
    /// Streaks waiting at most `window` for their recovery, at most `max` open.
    pub fn new(window: Duration, max: usize) -> Streaks {
        Streaks {
            open: HashMap::new(),
            order: VecDeque::new(),
            generation: 0,
            window,
            max: max.max(1),
        }
    }

    /// Streaks open now.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    /// Whether none is open.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// Takes one call; returns the streak it ended, if any.
    pub fn call(&mut self, now: Instant, c: &Call<'_>) -> Option<Ended> {
        let key = (c.trace_id.to_string(), c.tool.to_string());
        if let Some(s) = self.open.get_mut(&key) {
            if let Some(h) = c.input_sha256 {
                if s.hashes.iter().any(|x| x == h) {
                    s.identical += 1;
                } else if c.failed && s.hashes.len() < MAX_HASHES {
                    s.hashes.push(h.to_string());
                }
            }
            if c.failed {
                s.failures += 1;
                return None;
            }
            let s = self.open.remove(&key)?;
            return Some(ended(s, true));
        }
        if !c.failed {
            return None;
        }
        self.generation += 1;
        self.open.insert(
            key.clone(),
            Streak {
                tool: c.tool.to_string(),
                service: c.service.to_string(),
                version: c.version.to_string(),
                failures: 1,
                hashes: c
                    .input_sha256
                    .map(|h| vec![h.to_string()])
                    .unwrap_or_default(),
                identical: 0,
                generation: self.generation,
            },
        );
        self.order.push_back((now, key, self.generation));
        None
    }

    /// Closes, as unrecovered, the streaks older than the window and those past the cap.
    pub fn expire(&mut self, now: Instant) -> Vec<Ended> {
        let mut out = Vec::new();
        while let Some((at, _, _)) = self.order.front() {
            let over = self.open.len() > self.max;
            if !over && now.duration_since(*at) < self.window {
                break;
            }
            let Some((_, key, generation)) = self.order.pop_front() else {
                break;
            };
            if self
                .open
                .get(&key)
                .is_some_and(|s| s.generation == generation)
            {
                if let Some(s) = self.open.remove(&key) {
                    out.push(ended(s, false));
                }
            }
        }
        out
    }
}

fn ended(s: Streak, recovered: bool) -> Ended {
    Ended {
        tool: s.tool,
        service: s.service,
        version: s.version,
        failures: s.failures,
        calls_to_recovery: recovered.then_some(s.failures + 1),
        hammering: s.identical >= HAMMERING_REPEATS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call<'a>(trace: &'a str, tool: &'a str, failed: bool, sha: &'a str) -> Call<'a> {
        Call {
            trace_id: trace,
            tool,
            service: "svc",
            version: "1.0",
            failed,
            input_sha256: Some(sha),
        }
    }

    #[test]
    fn fail_then_succeed_is_recovered_in_two_calls() {
        let mut s = Streaks::new(DEFAULT_WINDOW, 10);
        let t = Instant::now();
        assert_eq!(s.call(t, &call("a", "x", true, "h1")), None);
        let e = s.call(t, &call("a", "x", false, "h2")).unwrap();
        assert_eq!(e.calls_to_recovery, Some(2));
        assert!(!e.hammering);
        assert!(s.is_empty());
        // Another tool or another trace does not recover it.
        assert_eq!(s.call(t, &call("b", "x", true, "h1")), None);
        assert_eq!(s.call(t, &call("b", "y", false, "h1")), None);
        assert_eq!(s.call(t, &call("c", "x", false, "h1")), None);
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn repeated_failing_arguments_are_hammering_and_the_window_closes_streaks() {
        let mut s = Streaks::new(Duration::from_secs(60), 10);
        let t = Instant::now();
        for _ in 0..3 {
            assert_eq!(s.call(t, &call("a", "x", true, "same")), None);
        }
        assert!(s.expire(t + Duration::from_secs(59)).is_empty());
        let e = s.expire(t + Duration::from_secs(61));
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].failures, 3);
        assert_eq!(e[0].calls_to_recovery, None);
        assert!(e[0].hammering);
    }

    #[test]
    fn the_cap_closes_the_oldest_streaks() {
        let mut s = Streaks::new(DEFAULT_WINDOW, 2);
        let t = Instant::now();
        for trace in ["a", "b", "c"] {
            s.call(t, &call(trace, "x", true, "h"));
        }
        let e = s.expire(t);
        assert_eq!(e.len(), 1);
        assert_eq!(s.len(), 2);
        // A streak recovered and re-opened is not closed by its predecessor's deadline.
        let mut s = Streaks::new(Duration::from_secs(10), 10);
        s.call(t, &call("a", "x", true, "h"));
        s.call(t, &call("a", "x", false, "h"));
        s.call(t + Duration::from_secs(9), &call("a", "x", true, "h"));
        assert!(s.expire(t + Duration::from_secs(11)).is_empty());
        assert_eq!(s.expire(t + Duration::from_secs(20)).len(), 1);
    }
}
