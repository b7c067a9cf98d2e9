//! Trending (issue 24, item 3): a target's score is the sum of its
//! buckets' counts, each weighed `2^(-age / half_life)`, `age` measured
//! from the bucket's end to now (a bucket not yet ended weighs 1). The
//! rules live here as pure functions, so both stores score with the same
//! numbers the API documents and a test can check them by hand.
//!
//! Which buckets: hourly ones for the days the hourly retention covers
//! whole, daily ones before them, never both for one day (so nothing
//! counts twice), and none older than [`HORIZON_HALF_LIVES`] half-lives:
//! a count that old weighs under a millionth, and leaving it out bounds
//! what a list reads, whatever the retention.
//!
//! Unlike Hacker News' gravity, `(P - 1) / (T + 2)^1.8`, which ranks a
//! post by its points and its age since posting, this score decays each
//! count by its own age, so a target that was busy a week ago and is busy
//! again now ranks by what happens now; and unlike Reddit's hot,
//! `log10(score) + t / 45000`, it needs no epoch and stays proportional to
//! the counts (a target with twice the recent counts scores twice).

use std::ops::Range;

/// Milliseconds in an hour and in a day.
const HOUR_MS: i64 = 3_600_000;
const DAY_MS: i64 = 86_400_000;

/// Buckets older than this many half-lives are left out: they weigh under
/// `2^-20`, about one millionth.
pub const HORIZON_HALF_LIVES: i64 = 20;
/// The shortest half-life: an hour, the finest bucket.
pub const MIN_HALF_LIFE_MS: i64 = HOUR_MS;
/// The longest half-life: a year.
pub const MAX_HALF_LIFE_MS: i64 = 365 * DAY_MS;
/// The half-life when none is given.
pub const DEFAULT_HALF_LIFE_MS: i64 = 24 * HOUR_MS;

/// `half_life=24h` (any `humantime` duration: `90m`, `36h`, `7d`), from
/// an hour to a year.
pub fn parse_half_life(text: &str) -> Result<i64, String> {
    let d = humantime::parse_duration(text.trim()).map_err(|e| {
        format!("half_life: expected a duration such as 24h, 90m or 7d, got `{text}` ({e})")
    })?;
    let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    if !(MIN_HALF_LIFE_MS..=MAX_HALF_LIFE_MS).contains(&ms) {
        return Err(format!(
            "half_life: must be from 1h to 365d (hourly buckets are the finest), got `{text}`"
        ));
    }
    Ok(ms)
}

/// What a trending list reads: the days whose daily buckets count and the
/// hours whose hourly buckets count, adjoining and never overlapping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Days (since the epoch, UTC) read from daily buckets.
    pub days: Range<i64>,
    /// Hours (since the epoch, UTC) read from hourly buckets.
    pub hours: Range<i64>,
}

/// The buckets a list at `now_ms` with `half_life_ms` reads, when hourly
/// buckets are kept for `hourly_days` days (today included) and daily
/// ones for `retention_days`.
pub fn plan(now_ms: i64, half_life_ms: i64, hourly_days: u32, retention_days: u32) -> Plan {
    let today = now_ms.div_euclid(DAY_MS);
    let this_hour = now_ms.div_euclid(HOUR_MS);
    let horizon_ms = half_life_ms.saturating_mul(HORIZON_HALF_LIVES);
    // The first hour and day worth reading: the bucket that ends at or
    // after now - horizon.
    let oldest_hour = (now_ms - horizon_ms).div_euclid(HOUR_MS);
    let oldest_day = (now_ms - horizon_ms)
        .div_euclid(DAY_MS)
        .max(today - i64::from(retention_days.max(1)) + 1);
    // Hourly buckets cover whole days from this one on.
    let first_hourly_day = today - i64::from(hourly_days) + 1;
    let hours_from = oldest_hour.max(first_hourly_day * 24);
    Plan {
        days: oldest_day.min(first_hourly_day)..first_hourly_day,
        hours: hours_from.min(this_hour + 1)..this_hour + 1,
    }
}

/// The weight of a count in a bucket ending at `end_ms`.
pub fn weight(end_ms: i64, now_ms: i64, half_life_ms: i64) -> f64 {
    let age = now_ms.saturating_sub(end_ms).max(0) as f64;
    (-age / half_life_ms as f64).exp2()
}

/// The end of hour `hour`'s bucket.
pub fn hour_end(hour: i64) -> i64 {
    (hour + 1) * HOUR_MS
}

/// The end of day `day`'s bucket.
pub fn day_end(day: i64) -> i64 {
    (day + 1) * DAY_MS
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-03-29 13:20 UTC.
    const NOW: i64 = 20_541 * DAY_MS + 13 * HOUR_MS + 20 * 60_000;

    #[test]
    fn half_lives_parse_within_bounds() {
        assert_eq!(parse_half_life("24h"), Ok(24 * HOUR_MS));
        assert_eq!(parse_half_life("90m"), Ok(90 * 60_000));
        assert_eq!(parse_half_life(" 7d "), Ok(7 * DAY_MS));
        for (bad, says) in [
            ("59m", "from 1h to 365d"),
            ("366d", "from 1h to 365d"),
            ("soon", "expected a duration"),
            ("", "expected a duration"),
        ] {
            let e = parse_half_life(bad).unwrap_err();
            assert!(e.contains(says) && e.starts_with("half_life"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_count_weighs_half_after_each_half_life_and_whole_until_its_bucket_ends() {
        let h = 24 * HOUR_MS;
        assert_eq!(weight(NOW + HOUR_MS, NOW, h), 1.0);
        assert_eq!(weight(NOW, NOW, h), 1.0);
        assert_eq!(weight(NOW - h, NOW, h), 0.5);
        assert_eq!(weight(NOW - 3 * h, NOW, h), 0.125);
        assert!((weight(NOW - h / 2, NOW, h) - 0.5f64.sqrt()).abs() < 1e-15);
        // The current hour's bucket ends in the future: weight 1.
        assert_eq!(weight(hour_end(NOW / HOUR_MS), NOW, h), 1.0);
        assert_eq!(day_end(NOW / DAY_MS), (NOW / DAY_MS + 1) * DAY_MS);
    }

    #[test]
    fn a_plan_reads_hours_for_the_days_they_cover_and_days_before_never_both() {
        let today = NOW / DAY_MS;
        let this_hour = NOW / HOUR_MS;
        // 24h: a horizon of 20 days; hours for the 14 days kept, days before.
        let p = plan(NOW, 24 * HOUR_MS, 14, 400);
        assert_eq!(p.hours, (today - 13) * 24..this_hour + 1);
        assert_eq!(p.days, today - 20..today - 13);
        // 1h: a horizon of 20 hours, all of it hourly; no day.
        let p = plan(NOW, HOUR_MS, 14, 400);
        assert_eq!(p.hours, this_hour - 20..this_hour + 1);
        assert!(p.days.is_empty());
        // 30d: the horizon passes the retention, which bounds it.
        let p = plan(NOW, 30 * DAY_MS, 14, 400);
        assert_eq!(p.days, today - 399..today - 13);
        // No hourly buckets kept: days only, today included.
        let p = plan(NOW, 24 * HOUR_MS, 0, 400);
        assert!(p.hours.is_empty());
        assert_eq!(p.days, today - 20..today + 1);
    }
}
