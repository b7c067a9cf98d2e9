//! Hour buckets: the UTC hours an increment also lands in, kept for a
//! shorter retention than day buckets (`--hourly-retention-days`), and the
//! hour ranges the read API resolves to.
//!
//! An hour is counted in hours since 1970-01-01T00:00Z, so hour `h` lies in
//! UTC day `h.div_euclid(24)` and the hours of a day are `24·d .. 24·d+23`.
//! Why UTC hours and not anything coarser: every zone whose offset is a
//! whole number of hours has its local days made of whole UTC hours, so a
//! local day (23, 24 or 25 hours around a DST change) is a contiguous range
//! of these buckets and sums exactly from them.
//!
//! The named hour intervals follow the daily convention of `window.rs`
//! (`last_day` is today only, the current day included):
//! - `last_hour` is the current clock hour only (`13:00` to now at 13:42),
//!   not the 60 minutes before now: buckets are whole hours, and a rolling
//!   hour would need finer ones.
//! - `last_24_hours` is the last 24 hour buckets including the current one
//!   (from 14:00 yesterday at 13:42 today), so it covers between 23 and 24
//!   hours of wall time.
//!
//! Retention is in whole UTC days, like the day buckets': the hours of day
//! `today - hourly_retention_days` and later are kept, so a day is either
//! covered by its 24 hours or not at all, and "the hours of a day sum to
//! its day bucket" is a statement about whole days.

use chrono::{DateTime, NaiveDate, Utc};

use super::window::Window;

/// Milliseconds in an hour.
pub const HOUR_MS: i64 = 3_600_000;

/// The default of `--hourly-retention-days`.
pub const DEFAULT_HOURLY_RETENTION_DAYS: u32 = 14;

/// The most hour buckets one answer covers: 31 days, so a month of hours
/// (or the default retention, 15 days) is one request, and an answer stays
/// a few tens of kilobytes whatever the retention.
pub const MAX_HOUR_BUCKETS: i64 = 24 * 31;

/// The hour (since the epoch) an instant in ms falls in.
pub fn hour_of_ms(ms: i64) -> i64 {
    ms.div_euclid(HOUR_MS)
}

/// The UTC day an hour lies in.
pub fn day_of_hour(hour: i64) -> i64 {
    hour.div_euclid(24)
}

/// The hour an increment of `day` stamped `ts_ms` lands in: the hour of
/// its timestamp, kept inside its day (an increment's day is the UTC day of
/// its timestamp; a caller that gave it another day keeps the hour's place
/// in that day, so the hours of a day still sum to it).
pub fn hour_in_day(day: i64, ts_ms: i64) -> i64 {
    let hour = hour_of_ms(ts_ms);
    if day_of_hour(hour) == day {
        hour
    } else {
        day.saturating_mul(24) + hour.rem_euclid(24)
    }
}

/// `2026-11-30T13:00:00Z`: an hour as answers give it.
pub fn format_hour(hour: i64) -> String {
    DateTime::<Utc>::from_timestamp(hour.saturating_mul(3_600), 0)
        .map(|t| t.format("%Y-%m-%dT%H:00:00Z").to_string())
        .unwrap_or_default()
}

/// A closed range of hours (since the epoch), both ends included.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HourRange {
    pub from_hour: i64,
    pub to_hour: i64,
}

impl HourRange {
    /// How many hours the range covers.
    pub fn hours(&self) -> i64 {
        self.to_hour - self.from_hour + 1
    }

    /// The UTC days the range touches.
    pub fn days(&self) -> Window {
        Window {
            from_day: day_of_hour(self.from_hour),
            to_day: day_of_hour(self.to_hour),
        }
    }

    /// Every hour of the days of `w`.
    pub fn of_days(w: Window) -> HourRange {
        HourRange {
            from_hour: w.from_day * 24,
            to_hour: w.to_day * 24 + 23,
        }
    }
}

/// An hour range as the API names it, resolved against "now".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResolvedHours {
    /// The name echoed in answers: `last_hour`, `last_24_hours`, a named
    /// day window (`last_day`, `last_week`, ...), `all` or `range`.
    pub interval: &'static str,
    pub hours: HourRange,
}

/// The named hour intervals of top lists and how many hour buckets
/// (including the current one) each covers.
pub const HOUR_INTERVALS: [(&str, i64); 2] = [("last_hour", 1), ("last_24_hours", 24)];

/// Whether `interval` names an hour interval (answered from hour buckets).
pub fn is_hour_interval(interval: Option<&str>) -> bool {
    interval.is_some_and(|i| HOUR_INTERVALS.iter().any(|(n, _)| *n == i))
}

/// Resolves a named hour interval (see [`HOUR_INTERVALS`]) at `now_ms`.
pub fn named_hours(interval: &str, now_ms: i64) -> Option<ResolvedHours> {
    let &(name, n) = HOUR_INTERVALS.iter().find(|(i, _)| *i == interval)?;
    let now = hour_of_ms(now_ms);
    Some(ResolvedHours {
        interval: name,
        hours: HourRange {
            from_hour: now - n + 1,
            to_hour: now,
        },
    })
}

/// The hours a histogram with `bucket=hour` covers: a named hour interval,
/// a named day window (its days' hours up to the current one, `all` the
/// hourly retention), or `from`/`to`, each a day (its first or last hour)
/// or an RFC 3339 instant (the hour it falls in). Without any, the last 24
/// hours. Errors start with the name of the parameter at fault. The range
/// is then checked against the retention with [`check_retained`].
pub fn resolve_hours(
    interval: Option<&str>,
    from: Option<&str>,
    to: Option<&str>,
    now_ms: i64,
    hourly_retention_days: u32,
) -> Result<ResolvedHours, String> {
    let now = hour_of_ms(now_ms);
    let today = day_of_hour(now);
    if from.is_some() || to.is_some() {
        if let Some(i) = interval {
            return Err(format!(
                "interval {i:?} cannot be combined with from/to; give one or the other"
            ));
        }
        let Some(from_raw) = from else {
            return Err("from is required when to is given".into());
        };
        let from_hour = parse_hour("from", from_raw, false)?;
        let to_hour = match to {
            Some(t) => parse_hour("to", t, true)?.min(now),
            None => now,
        };
        if from_hour > now {
            return Err(format!("from {from_raw} is in the future"));
        }
        if let Some(t) = to {
            if parse_hour("to", t, false)? > now {
                return Err(format!("to {t} is in the future"));
            }
        }
        if from_hour > to_hour {
            return Err(format!(
                "from {from_raw} is after to {}",
                to.unwrap_or("(now)")
            ));
        }
        return Ok(ResolvedHours {
            interval: "range",
            hours: HourRange { from_hour, to_hour },
        });
    }
    let name = interval.unwrap_or("last_24_hours");
    if let Some(r) = named_hours(name, now_ms) {
        return Ok(r);
    }
    if name == "all" {
        return Ok(ResolvedHours {
            interval: "all",
            hours: HourRange {
                from_hour: (today - i64::from(hourly_retention_days)) * 24,
                to_hour: now,
            },
        });
    }
    match super::window::resolve(Some(name), None, None, today) {
        Ok(super::window::Resolved {
            interval,
            window: Some(w),
        }) => Ok(ResolvedHours {
            interval,
            hours: HourRange {
                from_hour: w.from_day * 24,
                to_hour: now,
            },
        }),
        _ => {
            let mut known: Vec<&str> = HOUR_INTERVALS.iter().map(|(n, _)| *n).collect();
            known.extend(super::window::NAMED_INTERVALS.iter().map(|(n, _)| *n));
            Err(format!(
                "interval {name:?} is unknown; use one of {} or from/to",
                known.join(", ")
            ))
        }
    }
}

/// Refuses a range reaching before the hourly retention (never a silently
/// partial answer) or covering more than [`MAX_HOUR_BUCKETS`] hours.
pub fn check_retained(
    r: &ResolvedHours,
    now_ms: i64,
    hourly_retention_days: u32,
) -> Result<(), String> {
    let first_day = day_of_hour(hour_of_ms(now_ms)) - i64::from(hourly_retention_days);
    if r.hours.from_hour < first_day * 24 {
        return Err(format!(
            "from: hour buckets are kept for {hourly_retention_days} days (--hourly-retention-days), back to {}; {} is older (ask for day buckets, bucket=day, for older days)",
            format_hour(first_day * 24),
            format_hour(r.hours.from_hour)
        ));
    }
    if r.hours.hours() > MAX_HOUR_BUCKETS {
        return Err(format!(
            "the range covers {} hours; an answer holds at most {MAX_HOUR_BUCKETS} hour buckets: narrow from/to",
            r.hours.hours()
        ));
    }
    Ok(())
}

/// A day (`YYYY-MM-DD`: its first hour, or its last when `end`) or an RFC
/// 3339 instant (the hour it falls in).
fn parse_hour(field: &str, raw: &str, end: bool) -> Result<i64, String> {
    if let Ok(d) = NaiveDate::parse_from_str(raw, "%Y-%m-%d") {
        let day = super::day_of(d.and_hms_opt(0, 0, 0).unwrap_or_default().and_utc());
        return Ok(day * 24 + if end { 23 } else { 0 });
    }
    DateTime::parse_from_rfc3339(raw)
        .map(|t| hour_of_ms(t.with_timezone(&Utc).timestamp_millis()))
        .map_err(|_| {
            format!("{field} {raw:?} is neither a day (2026-11-24) nor an RFC 3339 timestamp")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The day `offset` days from the one holding `now`, as `from`/`to`
    /// take it: ranges are written relative to the clock given, never to
    /// a calendar day.
    fn day(now: i64, offset: i64) -> String {
        super::super::format_day(now.div_euclid(86_400_000) + offset)
    }

    fn ms(s: &str) -> i64 {
        s.parse::<DateTime<Utc>>().unwrap().timestamp_millis()
    }

    #[test]
    fn hours_lie_in_their_utc_day() {
        let h = hour_of_ms(ms("2026-11-30T13:42:00Z"));
        assert_eq!(format_hour(h), "2026-11-30T13:00:00Z");
        assert_eq!(day_of_hour(h), 20_787);
        assert_eq!(hour_of_ms(ms("1969-12-31T23:59:59Z")), -1);
        assert_eq!(day_of_hour(-1), -1);
        // A day given with another timestamp keeps its hours inside it.
        assert_eq!(
            hour_in_day(20_786, ms("2026-11-30T13:42:00Z")),
            20_786 * 24 + 13
        );
        assert_eq!(hour_in_day(20_787, ms("2026-11-30T13:42:00Z")), h);
    }

    #[test]
    fn last_hour_is_the_clock_hour_and_last_24_hours_include_it() {
        let now = ms("2026-12-01T00:10:00Z");
        let r = named_hours("last_hour", now).unwrap();
        assert_eq!(format_hour(r.hours.from_hour), "2026-12-01T00:00:00Z");
        assert_eq!(r.hours.hours(), 1);
        let r = named_hours("last_24_hours", now).unwrap();
        assert_eq!(format_hour(r.hours.from_hour), "2026-11-30T01:00:00Z");
        assert_eq!(format_hour(r.hours.to_hour), "2026-12-01T00:00:00Z");
        assert_eq!(
            r.hours.days(),
            Window {
                from_day: 20_787,
                to_day: 20_788
            }
        );
        assert!(named_hours("last_day", now).is_none());
    }

    #[test]
    fn ranges_take_days_or_instants_and_stop_now() {
        let now = ms("2026-11-30T13:42:00Z");
        let r = resolve_hours(None, Some(&day(now, -1)), Some(&day(now, -1)), now, 14).unwrap();
        assert_eq!(r.hours.hours(), 24);
        let r = resolve_hours(None, Some("2026-11-30T01:30:00+02:00"), None, now, 14).unwrap();
        assert_eq!(format_hour(r.hours.from_hour), "2026-11-29T23:00:00Z");
        assert_eq!(format_hour(r.hours.to_hour), "2026-11-30T13:00:00Z");
        // Today as `to` ends at the current hour, not at 23:00.
        let r = resolve_hours(None, Some(&day(now, 0)), Some(&day(now, 0)), now, 14).unwrap();
        assert_eq!(r.hours.hours(), 14);
        let r = resolve_hours(Some("last_day"), None, None, now, 14).unwrap();
        assert_eq!(r.hours.hours(), 14);
        assert_eq!(
            resolve_hours(None, None, None, now, 14).unwrap().interval,
            "last_24_hours"
        );
        let all = resolve_hours(Some("all"), None, None, now, 14).unwrap();
        assert_eq!(all.hours.from_hour, (20_787 - 14) * 24);
        assert!(check_retained(&all, now, 14).is_ok());
    }

    #[test]
    fn bad_or_old_ranges_are_named() {
        let now = ms("2026-11-30T13:42:00Z");
        let (today, yesterday) = (day(now, 0), day(now, -1));
        let e = |i, f, t| resolve_hours(i, f, t, now, 14).unwrap_err();
        assert!(e(Some("last_decade"), None, None).starts_with("interval"));
        assert!(e(Some("last_hour"), Some(today.as_str()), None).starts_with("interval"));
        assert!(e(None, None, Some(today.as_str())).starts_with("from"));
        assert!(e(None, Some("2026-11-30T14:00:00Z"), None).starts_with("from"));
        assert!(e(None, Some(yesterday.as_str()), Some("2026-11-30T14:00:00Z")).starts_with("to"));
        let old = resolve_hours(None, Some(&day(now, -15)), None, now, 14).unwrap();
        let why = check_retained(&old, now, 14).unwrap_err();
        assert!(why.contains("--hourly-retention-days"), "{why}");
        let kept = resolve_hours(None, Some(&day(now, -14)), None, now, 14).unwrap();
        assert!(check_retained(&kept, now, 14).is_ok());
        let long = resolve_hours(None, Some(&day(now, -60)), None, now, 400).unwrap();
        assert!(check_retained(&long, now, 400)
            .unwrap_err()
            .contains("at most 744"));
    }
}
