//! Which event timestamps are accepted, and the UTC day a timestamp falls in.

use chrono::{DateTime, Duration, Utc};

/// Bounds for client-supplied event timestamps.
///
/// Histories may be loaded back to the bucket retention, but a client with a
/// wrong clock must not write into the future (where it would pin
/// `recorded_timestamp` ahead of every real touch) nor behind the retention
/// (where an Elasticsearch backend would recreate an index ILM already deleted).
#[derive(Clone, Copy, Debug)]
pub struct TimePolicy {
    pub retention_days: u32,
    /// How many days hour buckets are kept (`crate::domain::hours`): hour
    /// answers reaching further back are refused.
    pub hourly_retention_days: u32,
    pub max_skew: Duration,
    /// How far back a `unique` event may be dated. A `unique: day` mark is
    /// per actor and day, so without this bound one actor could add a
    /// "unique" view for every day of the retention (about 400) in one
    /// batch, only by backdating.
    pub unique_max_age: Duration,
}

/// The default of `--unique-max-age`: a client's queue of beacons held
/// over a night still lands, and one actor adds at most three days' views.
pub const DEFAULT_UNIQUE_MAX_AGE: Duration = Duration::days(2);

impl Default for TimePolicy {
    fn default() -> Self {
        TimePolicy {
            retention_days: 400,
            hourly_retention_days: super::hours::DEFAULT_HOURLY_RETENTION_DAYS,
            max_skew: Duration::minutes(5),
            unique_max_age: DEFAULT_UNIQUE_MAX_AGE,
        }
    }
}

impl TimePolicy {
    /// Parses an RFC 3339 timestamp and checks it against `now`.
    pub fn accept(
        &self,
        field: &str,
        raw: &str,
        now: DateTime<Utc>,
    ) -> Result<DateTime<Utc>, String> {
        let ts = DateTime::parse_from_rfc3339(raw)
            .map_err(|e| format!("{field} is not an RFC 3339 timestamp ({e}): {raw:?}"))?
            .with_timezone(&Utc);
        if ts > now + self.max_skew {
            return Err(format!(
                "{field} {raw} is in the future (more than {}s ahead of the server clock)",
                self.max_skew.num_seconds()
            ));
        }
        if ts < self.oldest_accepted(now) {
            return Err(format!(
                "{field} {raw} is older than the bucket retention of {} days",
                self.retention_days
            ));
        }
        Ok(ts)
    }

    /// Refuses a `unique` event dated more than `unique_max_age` before
    /// `now` (`raw` is its timestamp as sent, for the message).
    pub fn accept_unique(
        &self,
        field: &str,
        raw: &str,
        ts: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<(), String> {
        if ts < now - self.unique_max_age {
            return Err(format!(
                "{field} {raw} is more than {} before the server clock: a `unique` event may be dated at most that far back (--unique-max-age)",
                humanize(self.unique_max_age)
            ));
        }
        Ok(())
    }

    /// Start of the oldest UTC day still inside the retention.
    pub fn oldest_accepted(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        let day = day_of(now) - i64::from(self.retention_days);
        DateTime::from_timestamp(day * 86_400, 0).unwrap_or(DateTime::<Utc>::MIN_UTC)
    }
}

/// `2 days`, `36 hours`, `90 minutes`, `45 seconds`: the largest unit
/// that divides the span.
fn humanize(d: Duration) -> String {
    let secs = d.num_seconds();
    let (n, unit) = match secs {
        s if s > 0 && s % 86_400 == 0 => (s / 86_400, "day"),
        s if s > 0 && s % 3_600 == 0 => (s / 3_600, "hour"),
        s if s > 0 && s % 60 == 0 => (s / 60, "minute"),
        s => (s, "second"),
    };
    format!("{n} {unit}{}", if n == 1 { "" } else { "s" })
}

/// Days since 1970-01-01 (UTC) of a timestamp: the histogram bucket it lands in.
pub fn day_of(ts: DateTime<Utc>) -> i64 {
    ts.timestamp().div_euclid(86_400)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        "2026-11-30T12:00:00Z".parse().unwrap()
    }

    #[test]
    fn accepts_past_within_retention_and_small_skew() {
        let p = TimePolicy::default();
        assert!(p.accept("timestamp", "2026-11-30T12:04:00Z", now()).is_ok());
        assert!(p.accept("timestamp", "2025-10-27T00:00:00Z", now()).is_ok());
        assert!(p
            .accept("timestamp", "2026-11-30T13:00:00+01:00", now())
            .is_ok());
    }

    #[test]
    fn refuses_future_old_and_malformed() {
        let p = TimePolicy::default();
        assert!(p
            .accept("timestamp", "2026-11-30T12:06:00Z", now())
            .unwrap_err()
            .contains("future"));
        assert!(p
            .accept("timestamp", "2025-10-25T23:59:59Z", now())
            .unwrap_err()
            .contains("retention"));
        assert!(p
            .accept("timestamp", "yesterday", now())
            .unwrap_err()
            .contains("RFC 3339"));
    }

    #[test]
    fn days_are_utc() {
        assert_eq!(day_of("1970-01-01T23:59:59Z".parse().unwrap()), 0);
        assert_eq!(day_of("1970-01-02T00:00:00Z".parse().unwrap()), 1);
        assert_eq!(day_of("1969-12-31T23:00:00Z".parse().unwrap()), -1);
    }
}
