//! The one source of "now" for everything the gateway decides by the
//! calendar: event timestamps and their bounds, the UTC day of a bucket, the
//! day the named windows end on, report cut-offs, idempotency-id expiry.
//!
//! Why a value instead of `Utc::now()` at each use: a store that reads the
//! wall clock itself cannot be tested across midnight, and a test that pins
//! one calendar day fails on every other day. The server is given the system
//! clock; tests are given a [`ManualClock`] that moves only when told, so a
//! day change (or a clock stepping back) happens exactly where a test says.
//!
//! Timing that is not about the calendar (timeouts, back-off, how long the
//! store has been idle) uses `Instant`, which this clock does not replace.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::time::day_of;

/// Where the time comes from; cheap to clone, shared by every clone.
#[derive(Clone, Debug, Default)]
pub struct Clock(Source);

#[derive(Clone, Debug, Default)]
enum Source {
    #[default]
    System,
    /// Milliseconds since the epoch, set by the [`ManualClock`] that made it.
    Manual(Arc<AtomicI64>),
}

impl Clock {
    /// The system's wall clock: what `serve` runs on.
    pub fn system() -> Clock {
        Clock(Source::System)
    }

    pub fn now(&self) -> DateTime<Utc> {
        match &self.0 {
            Source::System => Utc::now(),
            Source::Manual(ms) => from_ms(ms.load(Ordering::Acquire)),
        }
    }

    pub fn now_ms(&self) -> i64 {
        match &self.0 {
            Source::System => Utc::now().timestamp_millis(),
            Source::Manual(ms) => ms.load(Ordering::Acquire),
        }
    }

    /// The current UTC day, in days since 1970-01-01.
    pub fn today(&self) -> i64 {
        day_of(self.now())
    }
}

/// A clock that stands still until it is set or advanced, for tests: every
/// [`Clock`] it hands out reads the same instant.
#[derive(Clone, Debug)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    pub fn new(at: DateTime<Utc>) -> ManualClock {
        ManualClock(Arc::new(AtomicI64::new(at.timestamp_millis())))
    }

    /// A clock reading this one's time, to give to the code under test.
    pub fn clock(&self) -> Clock {
        Clock(Source::Manual(self.0.clone()))
    }

    pub fn now(&self) -> DateTime<Utc> {
        from_ms(self.0.load(Ordering::Acquire))
    }

    /// Moves to `at`, forwards or backwards (an NTP step back is a case to test).
    pub fn set(&self, at: DateTime<Utc>) {
        self.0.store(at.timestamp_millis(), Ordering::Release);
    }

    pub fn advance(&self, by: chrono::Duration) {
        self.0.fetch_add(by.num_milliseconds(), Ordering::AcqRel);
    }
}

fn from_ms(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or(DateTime::<Utc>::MIN_UTC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told_and_every_clone_sees_it() {
        let start: DateTime<Utc> = "2028-02-29T23:59:59.900Z".parse().unwrap();
        let manual = ManualClock::new(start);
        let clock = manual.clock();
        let copy = clock.clone();
        assert_eq!(clock.now(), start);
        assert_eq!(clock.today(), day_of(start));
        manual.advance(chrono::Duration::milliseconds(100));
        assert_eq!(copy.today(), day_of(start) + 1);
        assert_eq!(copy.now_ms(), start.timestamp_millis() + 100);
        manual.set(start - chrono::Duration::days(1));
        assert_eq!(clock.today(), day_of(start) - 1);
    }

    #[test]
    fn the_system_clock_reads_the_wall_clock() {
        let before = Utc::now();
        let now = Clock::system().now();
        assert!(now >= before && now <= Utc::now());
    }
}
