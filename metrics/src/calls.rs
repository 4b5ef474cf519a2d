//! Joining attempt spans to their logical call, as the `calls` view does
//! (`query/src/views.rs`), with bounded memory.
//!
//! Protocol: a call ends after its attempts, so attempt spans arrive in the same batch as
//! their call or earlier. Attempts are remembered per trace for at most [`MAX_AGE`] and
//! [`MAX_ATTEMPTS`] in total (oldest traces go first); a call takes (and so forgets) the
//! attempts that are its children or share its `call_id`.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// How long an attempt waits for its call.
pub const MAX_AGE: Duration = Duration::from_secs(60);

/// Attempts remembered at most.
pub const MAX_ATTEMPTS: usize = 100_000;

/// One attempt span, as far as its call needs it.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// The attempt's parent span id (its call, when the attempt is instrumented as a child
    /// of its call).
    pub parent: Option<String>,
    /// The logical call id.
    pub call_id: Option<String>,
    /// Its attempt number.
    pub number: Option<i32>,
    /// Status error.
    pub failed: bool,
    /// Its result leaked internals.
    pub leaked: bool,
}

/// What a call learns from its attempts.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Joined {
    /// Attempt spans seen.
    pub count: i64,
    /// Highest attempt number seen.
    pub max_number: i64,
    /// Attempts that failed.
    pub failed: i64,
    /// Any attempt leaked internals.
    pub leaked: bool,
}

/// The remembered attempts.
pub struct CallJoin {
    by_trace: HashMap<String, (u64, Vec<Attempt>)>,
    /// Traces in arrival order with the generation of their entry, so an entry that was taken
    /// and re-created is not expired by its predecessor's deadline.
    order: VecDeque<(Instant, String, u64)>,
    generation: u64,
    len: usize,
    max_age: Duration,
    max_attempts: usize,
}

impl Default for CallJoin {
    fn default() -> Self {
        CallJoin::new(MAX_AGE, MAX_ATTEMPTS)
    }
}

impl CallJoin {
    /// A join with the given bounds.
    pub fn new(max_age: Duration, max_attempts: usize) -> CallJoin {
        CallJoin {
            by_trace: HashMap::new(),
            order: VecDeque::new(),
            generation: 0,
            len: 0,
            max_age,
            max_attempts,
        }
    }

    /// Remembers an attempt of `trace`.
    pub fn add(&mut self, now: Instant, trace: &str, attempt: Attempt) {
        let entry = match self.by_trace.get_mut(trace) {
            Some(e) => e,
            None => {
                self.generation += 1;
                self.order
                    .push_back((now, trace.to_string(), self.generation));
                self.by_trace
                    .entry(trace.to_string())
                    .or_insert((self.generation, Vec::new()))
            }
        };
        entry.1.push(attempt);
        self.len += 1;
        self.expire(now);
    }

    /// Takes the attempts of the call `span_id` (with `call_id`) of `trace`.
    pub fn take(&mut self, trace: &str, span_id: &str, call_id: Option<&str>) -> Joined {
        let mut joined = Joined::default();
        let Some((_, attempts)) = self.by_trace.get_mut(trace) else {
            return joined;
        };
        let before = attempts.len();
        attempts.retain(|a| {
            let mine = a.parent.as_deref() == Some(span_id)
                || (call_id.is_some() && a.call_id.as_deref() == call_id);
            if mine {
                joined.count += 1;
                joined.max_number = joined.max_number.max(i64::from(a.number.unwrap_or(0)));
                joined.failed += i64::from(a.failed);
                joined.leaked |= a.leaked;
            }
            !mine
        });
        self.len -= before - attempts.len();
        if attempts.is_empty() {
            self.by_trace.remove(trace);
        }
        joined
    }

    /// Forgets traces older than the age bound, then the oldest until within the size bounds.
    pub fn expire(&mut self, now: Instant) {
        while let Some((at, _, _)) = self.order.front() {
            let too_old = now.saturating_duration_since(*at) > self.max_age;
            // Taken traces leave their `order` entry behind until it ages out; bound those too.
            let crowded = self.order.len() > 2 * self.max_attempts.max(1);
            if !too_old && !crowded && self.len <= self.max_attempts {
                break;
            }
            if let Some((_, trace, generation)) = self.order.pop_front() {
                if self
                    .by_trace
                    .get(&trace)
                    .is_some_and(|(g, _)| *g == generation)
                {
                    if let Some((_, gone)) = self.by_trace.remove(&trace) {
                        self.len -= gone.len();
                    }
                }
            }
        }
    }

    /// Attempts remembered.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(parent: &str, call: Option<&str>, n: i32, failed: bool) -> Attempt {
        Attempt {
            parent: Some(parent.into()),
            call_id: call.map(Into::into),
            number: Some(n),
            failed,
            leaked: false,
        }
    }

    #[test]
    fn a_call_takes_its_children_and_its_call_id() {
        let mut j = CallJoin::default();
        let now = Instant::now();
        j.add(now, "t1", attempt("c1", None, 1, true));
        j.add(
            now,
            "t1",
            Attempt {
                leaked: true,
                ..attempt("elsewhere", Some("call_x"), 2, false)
            },
        );
        j.add(now, "t1", attempt("c2", None, 1, false));
        let got = j.take("t1", "c1", Some("call_x"));
        assert_eq!(
            got,
            Joined {
                count: 2,
                max_number: 2,
                failed: 1,
                leaked: true
            }
        );
        assert_eq!(j.len(), 1, "the other call's attempt stays");
        assert_eq!(
            j.take("t1", "c1", Some("call_x")),
            Joined::default(),
            "taken once"
        );
    }

    #[test]
    fn bounded_in_age_and_size() {
        let mut j = CallJoin::new(Duration::from_secs(60), 3);
        let t0 = Instant::now();
        j.add(t0, "old", attempt("c", None, 1, false));
        j.add(
            t0 + Duration::from_secs(61),
            "new",
            attempt("c", None, 1, false),
        );
        assert_eq!(j.take("old", "c", None).count, 0, "expired after 60 s");
        for k in 0..5 {
            j.add(
                t0 + Duration::from_secs(62),
                &format!("t{k}"),
                attempt("c", None, 1, false),
            );
        }
        assert!(j.len() <= 3);
        assert_eq!(j.take("t4", "c", None).count, 1, "the newest survive");
    }
}
