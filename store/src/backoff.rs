//! [`Backoff`]: how long a writer waits before trying a failed write again. Every write-side
//! retry uses it (the OTLP receiver's sink and its hand-off to the sink, the Kafka worker's
//! flushes, its offset reads), each with its own first delay and ceiling.

use std::time::Duration;

/// A retry delay that doubles after each failure, up to a ceiling, and starts over after a
/// success.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Waits `first` after the first failure, at most `max` after any.
    pub const fn new(first: Duration, max: Duration) -> Backoff {
        Backoff {
            first,
            max,
            next: first,
        }
    }

    /// The wait before the next try; the one after it doubles (up to the ceiling).
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (d * 2).min(self.max);
        d
    }

    /// The wait the next failure will get, without taking it (for a log line).
    pub fn peek(&self) -> Duration {
        self.next
    }

    /// After a success: the next failure waits the first delay again.
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_ceiling_and_starts_over_after_a_success() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(200), ms(1_000));
        let waits: Vec<Duration> = (0..5).map(|_| b.next_delay()).collect();
        assert_eq!(waits, [ms(200), ms(400), ms(800), ms(1_000), ms(1_000)]);
        b.reset();
        assert_eq!((b.peek(), b.next_delay()), (ms(200), ms(200)));
    }
}
