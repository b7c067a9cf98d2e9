//! Back-off for retryable bulk items: parameters as a value (a standard and a
//! fast variant for tests), exponential growth with jitter, a bounded total.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How failed bulk items are retried.
///
/// The total budget is what bounds a flush: past it, the requests whose items
/// never succeeded are answered as failed, well before the pipeline's ack
/// timeout, so a client is never left waiting on an unreachable cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// Delay before the first retry.
    pub initial: Duration,
    /// Longest delay between two attempts.
    pub max_delay: Duration,
    /// Most time spent waiting between attempts, summed over one flush.
    pub budget: Duration,
}

impl Backoff {
    /// For production: 50 ms doubling up to 2 s, at most 10 s of waiting.
    pub const fn standard() -> Self {
        Backoff {
            initial: Duration::from_millis(50),
            max_delay: Duration::from_secs(2),
            budget: Duration::from_secs(10),
        }
    }

    /// For tests: the same shape in milliseconds, so a test never sleeps long.
    pub const fn for_test() -> Self {
        Backoff {
            initial: Duration::from_millis(1),
            max_delay: Duration::from_millis(4),
            budget: Duration::from_millis(40),
        }
    }

    /// The delay before retry number `attempt` (0-based): the exponential
    /// step, capped, with "equal jitter" (half fixed, half random) so that
    /// gateways that failed together do not retry together.
    pub fn delay(&self, attempt: u32, jitter: &Jitter) -> Duration {
        let step = self
            .initial
            .saturating_mul(1u32 << attempt.min(20))
            .min(self.max_delay);
        let half = step / 2;
        let nanos = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        let extra = if nanos == 0 {
            0
        } else {
            jitter.next() % (nanos + 1)
        };
        half + Duration::from_nanos(extra)
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::standard()
    }
}

/// A tiny xorshift generator: jitter needs spread, not cryptographic quality,
/// and this keeps the crate free of another dependency.
#[derive(Debug)]
pub struct Jitter(AtomicU64);

impl Jitter {
    pub fn seeded(seed: u64) -> Self {
        Jitter(AtomicU64::new(seed | 1))
    }

    pub fn from_clock() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x9E37_79B9_7F4A_7C15);
        Jitter::seeded(nanos ^ u64::from(std::process::id()).rotate_left(32))
    }

    pub fn next(&self) -> u64 {
        let mut x = self.0.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0.store(x, Ordering::Relaxed);
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_exponentially_within_jitter_and_cap() {
        let b = Backoff::standard();
        let j = Jitter::seeded(42);
        for attempt in 0..12 {
            let step = (b.initial * (1 << attempt)).min(b.max_delay);
            let d = b.delay(attempt, &j);
            assert!(
                d >= step / 2 && d <= step,
                "attempt {attempt}: {d:?} vs {step:?}"
            );
        }
        assert!(b.delay(40, &j) <= b.max_delay);
    }

    #[test]
    fn jitter_spreads_delays() {
        let b = Backoff::standard();
        let j = Jitter::seeded(7);
        let ds: std::collections::HashSet<_> = (0..20).map(|_| b.delay(3, &j)).collect();
        assert!(ds.len() > 10);
    }

    #[test]
    fn the_test_variant_is_fast() {
        let b = Backoff::for_test();
        assert!(b.budget <= Duration::from_millis(50));
        assert!(b.delay(10, &Jitter::seeded(1)) <= Duration::from_millis(4));
    }
}
