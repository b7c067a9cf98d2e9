//! Totals N days after a target's publication: when a target was published
//! (set, or its first touch), what "within N days" means in day buckets, and
//! when such a total stops moving.
//!
//! The rules (also in src/api/README.md, "Milestones"):
//! - A target's publication time is set by an event's `published` or by
//!   `PUT /v1/targets/{entity}/{uuid}`. A value before 2008-01-01T00:00:00Z
//!   or later than the clock plus the allowed skew is implausible (a CMS
//!   default, a typo, an embargo date): it is not kept, and the
//!   publication falls back to the first touch, as when none was given.
//! - The first touch of a counter is its `first_ms`: when it was first
//!   counted (the event's time).
//! - Milestone N of a counter is the sum of its day buckets over the UTC
//!   days `[P, P + N - 1]`, P the UTC day of the publication. Buckets are
//!   daily, so the whole publication day counts, also what was counted on it
//!   before the publication instant. It is complete once the clock reaches
//!   day `P + N` (00:00 UTC), and stays as it is from then on (unless days
//!   are backfilled, or leave the retention).

use chrono::{DateTime, Duration, Utc};

use super::window::Window;

/// 2008-01-01T00:00:00Z: a publication before it is taken as implausible.
pub const EARLIEST_PUBLICATION_MS: i64 = 1_199_145_600_000;

/// At most this many milestones in one `days=` list.
pub const MAX_MILESTONES: usize = 16;

/// What the milestone answer lists when `days` is absent: the totals the
/// systems we learn from collect, 3 and 30 days after publication.
pub const DEFAULT_MILESTONES: [u32; 2] = [3, 30];

/// The `first_<N>_days` lists whose totals the embedded store keeps per
/// counter until `--milestone-days` says otherwise (see
/// `src/store/README.md`, "Milestones"): the milestones the systems we
/// learn from collect (3 and 30 days) and a week.
pub const DEFAULT_KEPT_DAYS: [u32; 3] = [3, 7, 30];

/// At most this many `--milestone-days`: each costs a row per counter and
/// a step per bucket written.
pub const MAX_KEPT_DAYS: usize = 8;

/// Checks a `--milestone-days` list against the retention; the error names
/// the flag.
pub fn check_kept_days(days: &[u32], retention_days: u32) -> Result<(), String> {
    if days.is_empty() || days.len() > MAX_KEPT_DAYS {
        return Err(format!(
            "--milestone-days takes 1 to {MAX_KEPT_DAYS} day counts, got {}",
            days.len()
        ));
    }
    if let Some(d) = days.iter().find(|d| **d == 0 || **d > retention_days) {
        return Err(format!(
            "--milestone-days: {d} is not between 1 and --retention-days ({retention_days})"
        ));
    }
    Ok(())
}

const DAY_MS: i64 = 86_400_000;

/// A `published` value, parsed and judged against the clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Published {
    /// Kept: milliseconds since the epoch.
    At(i64),
    /// Well formed but implausible: not kept, the first touch stands in.
    Implausible(Implausible),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Implausible {
    BeforeEarliest,
    InTheFuture,
}

impl Implausible {
    /// The wording in answers.
    pub fn as_str(self) -> &'static str {
        match self {
            Implausible::BeforeEarliest => "before 2008-01-01",
            Implausible::InTheFuture => "in the future",
        }
    }
}

/// Parses a `published` value (RFC 3339). Malformed is an error naming
/// `field`; implausible is not an error (see the module's rules).
pub fn parse_published(
    field: &str,
    raw: &str,
    now: DateTime<Utc>,
    max_skew: Duration,
) -> Result<Published, String> {
    let at = DateTime::parse_from_rfc3339(raw)
        .map_err(|e| format!("{field} is not an RFC 3339 timestamp ({e}): {raw:?}"))?
        .with_timezone(&Utc);
    let ms = at.timestamp_millis();
    Ok(if ms < EARLIEST_PUBLICATION_MS {
        Published::Implausible(Implausible::BeforeEarliest)
    } else if at > now + max_skew {
        Published::Implausible(Implausible::InTheFuture)
    } else {
        Published::At(ms)
    })
}

/// Where a target's publication time came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Set by an event or a `PUT`.
    Set,
    /// None set (or only implausible ones): the counter's first touch.
    FirstTouch,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Set => "set",
            Source::FirstTouch => "first_touch",
        }
    }
}

/// A counter's publication time as milestones use it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Publication {
    pub at_ms: i64,
    pub source: Source,
}

impl Publication {
    /// The set time if there is one, else the counter's first touch.
    pub fn resolve(set_ms: Option<i64>, first_ms: i64) -> Self {
        match set_ms {
            Some(at_ms) => Publication {
                at_ms,
                source: Source::Set,
            },
            None => Publication {
                at_ms: first_ms,
                source: Source::FirstTouch,
            },
        }
    }

    /// The UTC day milestones count from.
    pub fn day(&self) -> i64 {
        publication_day(self.at_ms)
    }
}

/// The UTC day of an instant in milliseconds (floored, also before 1970).
pub fn publication_day(at_ms: i64) -> i64 {
    at_ms.div_euclid(DAY_MS)
}

/// The days a milestone of `days` days after publication day `day` covers.
pub fn milestone_window(day: i64, days: u32) -> Window {
    Window {
        from_day: day,
        to_day: day + i64::from(days) - 1,
    }
}

/// Whether the milestone is complete on UTC day `today`: its last day is over.
pub fn complete(day: i64, days: u32, today: i64) -> bool {
    today > milestone_window(day, days).to_day
}

/// When the milestone completes: 00:00 UTC of the day after its last.
pub fn completes_ms(day: i64, days: u32) -> i64 {
    (milestone_window(day, days).to_day + 1).saturating_mul(DAY_MS)
}

/// One milestone of one counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Milestone {
    pub days: u32,
    pub window: Window,
    /// `i128`: a sum of several `i64` buckets may leave `i64`.
    pub total: i128,
    pub complete: bool,
    pub completes_ms: i64,
}

/// Each milestone of `days` from a counter's buckets `(day, value)`,
/// publication day `day`, on UTC day `today`.
pub fn milestones(day: i64, days: &[u32], buckets: &[(i64, i64)], today: i64) -> Vec<Milestone> {
    days.iter()
        .map(|&n| {
            let window = milestone_window(day, n);
            Milestone {
                days: n,
                window,
                total: buckets
                    .iter()
                    .filter(|(d, _)| window.contains(*d))
                    .map(|(_, v)| i128::from(*v))
                    .sum(),
                complete: complete(day, n, today),
                completes_ms: completes_ms(day, n),
            }
        })
        .collect()
}

/// Each milestone of `days` in local days of `zone` (`tz=`): P is the local
/// day of the publication `at_ms`, milestone N the sum of the hour buckets
/// `(hour, value)` over the UTC hours of local days `[P, P + N - 1]`
/// (`crate::domain::zone`), complete at the zone's midnight after its
/// last day. The caller has checked those hours (kept, whole-hour offsets).
pub fn local_milestones(
    zone: &super::zone::Zone,
    at_ms: i64,
    days: &[u32],
    hours: &[(i64, i64)],
    now_ms: i64,
) -> Vec<Milestone> {
    let day = zone.day_of_ms(at_ms);
    days.iter()
        .map(|&n| {
            let window = milestone_window(day, n);
            let range = zone.hours_of_days(window);
            let completes_ms = (range.to_hour + 1).saturating_mul(super::hours::HOUR_MS);
            Milestone {
                days: n,
                window,
                total: hours
                    .iter()
                    .filter(|(h, _)| (range.from_hour..=range.to_hour).contains(h))
                    .map(|(_, v)| i128::from(*v))
                    .sum(),
                complete: now_ms >= completes_ms,
                completes_ms,
            }
        })
        .collect()
}

/// Parses a `days` list (`3,30`): integers in `1..=max`, at most
/// [`MAX_MILESTONES`] of them; answered sorted, without repeats.
pub fn parse_days(field: &str, raw: &str, max: u32) -> Result<Vec<u32>, String> {
    let mut out = Vec::new();
    for part in raw.split(',') {
        let n: u32 = part.trim().parse().map_err(|_| {
            format!("{field} must be a comma-separated list of whole days, not {raw:?}")
        })?;
        if n == 0 || n > max {
            return Err(format!(
                "{field} holds {n}; each must be between 1 and {max} (the bucket retention in days)"
            ));
        }
        out.push(n);
    }
    out.sort_unstable();
    out.dedup();
    if out.len() > MAX_MILESTONES {
        return Err(format!(
            "{field} lists {} milestones, over the limit of {MAX_MILESTONES}",
            out.len()
        ));
    }
    Ok(out)
}

/// Reads `first_<N>_days`: `None` when `interval` is not of that form,
/// else N checked against `1..=max` (an error naming `interval`).
pub fn parse_first_days(interval: &str, max: u32) -> Option<Result<u32, String>> {
    let n = interval.strip_prefix("first_")?.strip_suffix("_days")?;
    Some(match n.parse::<u32>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        Ok(n) => Err(format!(
            "interval {interval:?}: N is {n}; it must be between 1 and {max} (the bucket retention in days)"
        )),
        Err(_) => Err(format!(
            "interval {interval:?}: first_<N>_days takes a whole number of days"
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_days_are_checked_against_the_retention() {
        assert!(check_kept_days(&DEFAULT_KEPT_DAYS, 400).is_ok());
        assert!(check_kept_days(&[400], 400).is_ok());
        let e = check_kept_days(&[3, 401], 400).unwrap_err();
        assert!(e.contains("--milestone-days") && e.contains("401"), "{e}");
        assert!(check_kept_days(&[0], 400).is_err());
        assert!(check_kept_days(&[], 400).is_err());
        assert!(check_kept_days(&[1; MAX_KEPT_DAYS + 1], 400).is_err());
    }
    use chrono::TimeZone;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap()
    }

    #[test]
    fn the_earliest_publication_is_2008() {
        assert_eq!(
            DateTime::from_timestamp_millis(EARLIEST_PUBLICATION_MS)
                .unwrap()
                .to_rfc3339(),
            "2008-01-01T00:00:00+00:00"
        );
    }

    #[test]
    fn implausible_publications_fall_back_and_malformed_ones_are_refused() {
        let skew = Duration::minutes(5);
        let p = |raw| parse_published("published", raw, now(), skew);
        assert_eq!(
            p("2008-01-01T00:00:00Z").unwrap(),
            Published::At(EARLIEST_PUBLICATION_MS)
        );
        assert_eq!(
            p("2007-12-31T23:59:59.999Z").unwrap(),
            Published::Implausible(Implausible::BeforeEarliest)
        );
        // Within the skew is accepted, beyond it is the future.
        assert!(matches!(
            p("2026-11-30T12:04:59Z").unwrap(),
            Published::At(_)
        ));
        assert_eq!(
            p("2026-11-30T12:05:01Z").unwrap(),
            Published::Implausible(Implausible::InTheFuture)
        );
        let e = p("yesterday").unwrap_err();
        assert!(e.starts_with("published"), "{e}");
        assert!(p("2026-11-30").is_err(), "a bare day is not RFC 3339");
    }

    #[test]
    fn milestones_count_whole_utc_days_from_the_publication_day() {
        // Published at 23:00 on day 100: day 100 counts whole.
        let pub_ms = 100 * DAY_MS + 23 * 3_600_000;
        let p = Publication::resolve(Some(pub_ms), 5);
        assert_eq!((p.day(), p.source), (100, Source::Set));
        let buckets = [(99, 1000), (100, 1), (101, 10), (102, 100), (103, 10_000)];
        let m = milestones(p.day(), &[1, 3, 30], &buckets, 102);
        assert_eq!(
            m.iter().map(|m| m.total).collect::<Vec<_>>(),
            [1, 111, 10_111]
        );
        assert!(m[0].complete);
        assert!(!m[1].complete, "its last day, 102, is today");
        assert_eq!(m[1].completes_ms, 103 * DAY_MS);
        assert!(complete(100, 3, 103));
        assert_eq!(
            Publication::resolve(None, 7 * DAY_MS).source,
            Source::FirstTouch
        );
        assert_eq!(publication_day(-1), -1);
    }

    #[test]
    fn day_lists_and_first_days_intervals_are_bounded() {
        assert_eq!(parse_days("days", "30,3,3", 400).unwrap(), [3, 30]);
        assert!(parse_days("days", "0", 400)
            .unwrap_err()
            .starts_with("days"));
        assert!(parse_days("days", "401", 400)
            .unwrap_err()
            .contains("between 1 and 400"));
        assert!(parse_days("days", "3,x", 400).is_err());
        assert!(parse_days("days", "", 400).is_err());
        let many: Vec<String> = (1..=17).map(|n| n.to_string()).collect();
        assert!(parse_days("days", &many.join(","), 400).is_err());
        assert_eq!(parse_first_days("first_7_days", 400), Some(Ok(7)));
        assert_eq!(parse_first_days("last_week", 400), None);
        assert!(parse_first_days("first_401_days", 400)
            .unwrap()
            .unwrap_err()
            .starts_with("interval"));
        assert!(parse_first_days("first_0_days", 400).unwrap().is_err());
        assert!(parse_first_days("first_x_days", 400).unwrap().is_err());
    }

    #[test]
    fn local_milestones_count_from_the_local_day_and_complete_at_local_midnight() {
        let berlin = crate::domain::zone::parse_zone(Some("Europe/Berlin"))
            .unwrap()
            .unwrap();
        let ms = |s: &str| s.parse::<DateTime<Utc>>().unwrap().timestamp_millis();
        let hour = |s: &str| ms(s).div_euclid(super::super::hours::HOUR_MS);
        // 00:30 CET on 29 March 2026, the 23-hour day: UTC's 28th.
        let at = ms("2026-03-28T23:30:00Z");
        let hours = [
            (hour("2026-03-28T22:00:00Z"), 100), // the 28th in Berlin: before P
            (hour("2026-03-28T23:00:00Z"), 1),
            (hour("2026-03-29T21:00:00Z"), 2), // 23:00 CEST, the 29th's last hour
            (hour("2026-03-29T22:00:00Z"), 4), // the 30th
        ];
        let now = ms("2026-03-29T22:00:00Z");
        let m = local_milestones(&berlin, at, &[1, 2], &hours, now);
        assert_eq!(
            m[0].window.from_day,
            publication_day(ms("2026-03-29T00:00:00Z"))
        );
        assert_eq!((m[0].total, m[1].total), (3, 7));
        assert_eq!(m[0].completes_ms, now);
        assert!(m[0].complete && !m[1].complete);
        assert_eq!(m[1].completes_ms, ms("2026-03-30T22:00:00Z"));
        // In UTC days the same publication is on the 28th.
        assert_eq!(
            publication_day(at),
            publication_day(ms("2026-03-28T00:00:00Z"))
        );
    }
}
