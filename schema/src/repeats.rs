//! [`Repeats`]: how often a retry loop logs the same failure.
//!
//! A store that cannot be written fails every retry the same way. The loop that retries is
//! the boundary that logs the error (errors are not logged where they are made), and it logs
//! the first failure at once, a different failure at once, and the same failure again at most
//! once per interval, saying how many it left out.

use std::time::{Duration, Instant};

/// Decides which failures of a retry loop are logged.
#[derive(Debug)]
pub struct Repeats {
    every: Duration,
    key: Option<String>,
    last: Option<Instant>,
    left_out: u64,
}

impl Repeats {
    /// The same failure is logged at most once per `every`.
    pub fn new(every: Duration) -> Repeats {
        Repeats {
            every,
            key: None,
            last: None,
            left_out: 0,
        }
    }

    /// Whether this failure (identified by `key`, e.g. its code and message) is logged now:
    /// `Some(n)` with the number of identical failures not logged since the last line, or
    /// `None` to leave it out.
    pub fn admit(&mut self, key: &str) -> Option<u64> {
        self.admit_at(key, Instant::now())
    }

    fn admit_at(&mut self, key: &str, now: Instant) -> Option<u64> {
        let same = self.key.as_deref() == Some(key);
        let due = self
            .last
            .is_none_or(|t| now.saturating_duration_since(t) >= self.every);
        if same && !due {
            self.left_out += 1;
            return None;
        }
        let n = if same { self.left_out } else { 0 };
        self.key = Some(key.to_string());
        self.last = Some(now);
        self.left_out = 0;
        Some(n)
    }

    /// After a recovery: the next failure is logged at once.
    pub fn reset(&mut self) {
        self.key = None;
        self.last = None;
        self.left_out = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_failure_is_logged_once_per_interval_with_the_count_left_out() {
        let mut r = Repeats::new(Duration::from_secs(30));
        let t0 = Instant::now();
        assert_eq!(r.admit_at("store_unavailable", t0), Some(0));
        assert_eq!(
            r.admit_at("store_unavailable", t0 + Duration::from_secs(1)),
            None
        );
        assert_eq!(
            r.admit_at("store_unavailable", t0 + Duration::from_secs(5)),
            None
        );
        assert_eq!(
            r.admit_at("store_unavailable", t0 + Duration::from_secs(31)),
            Some(2)
        );
        // Another failure is logged at once.
        assert_eq!(
            r.admit_at("internal", t0 + Duration::from_secs(32)),
            Some(0)
        );
        // After a recovery, the first failure again.
        r.reset();
        assert_eq!(
            r.admit_at("internal", t0 + Duration::from_secs(33)),
            Some(0)
        );
    }
}
