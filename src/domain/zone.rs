//! Local days (`tz=<IANA zone>`): which UTC hours make up a day of a zone,
//! so that daily answers can be summed from hour buckets
//! (`crate::domain::hours`) in that zone's days instead of UTC's.
//!
//! The rules (also in src/api/README.md, "Local days"):
//! - A local day is the run of UTC hours from the first hour that starts
//!   on that local date to the first that starts on the next: 24 hours,
//!   23 on the day clocks spring forward, 25 on the day they fall back.
//! - This is exact only when every UTC hour lies in one local day, i.e.
//!   the zone's offset is a whole number of hours and changes only on a
//!   UTC hour. That is judged over the hours asked (Africa/Monrovia was
//!   -00:44:30 until 1972 and is UTC now); a zone failing it (Asia/Kolkata,
//!   Asia/Kathmandu, Australia/Adelaide) is refused, never answered in
//!   shifted days.
//! - `UTC` (and its aliases, `Etc/UTC`, `GMT`...) is no zone here: the
//!   answers without `tz`, from day buckets, byte for byte.
//!
//! Days are counted as everywhere (days since 1970-01-01), but of the
//! local calendar: local day `d` is the date `d` days after 1970-01-01 on
//! the zone's wall clock.

use chrono::{DateTime, Offset, TimeZone};
use chrono_tz::Tz;

use super::hours::{day_of_hour, format_hour, hour_of_ms, HourRange};
use super::window::{Resolved, Window};

/// Names the zone database gives to UTC itself: asking for them is asking
/// for UTC days, answered as without `tz`.
const UTC_NAMES: [&str; 16] = [
    "UTC",
    "Etc/UTC",
    "Etc/UCT",
    "UCT",
    "Etc/Universal",
    "Universal",
    "Etc/Zulu",
    "Zulu",
    "GMT",
    "Etc/GMT",
    "Etc/GMT+0",
    "Etc/GMT-0",
    "Etc/GMT0",
    "GMT0",
    "GMT+0",
    "GMT-0",
];

/// A zone of the IANA database other than UTC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Zone(Tz);

/// Parses `tz`: `None` when absent or UTC, else the zone; an unknown name
/// is an error naming `tz`.
pub fn parse_zone(raw: Option<&str>) -> Result<Option<Zone>, String> {
    let Some(raw) = raw else { return Ok(None) };
    if UTC_NAMES.contains(&raw) {
        return Ok(None);
    }
    raw.parse::<Tz>().map(|tz| Some(Zone(tz))).map_err(|_| {
        format!(
            "tz {raw:?} is not a zone of the IANA time zone database (names are case-sensitive: Europe/Berlin, America/New_York, UTC)"
        )
    })
}

impl Zone {
    /// The zone's IANA name, as answers echo it.
    pub fn name(&self) -> &'static str {
        self.0.name()
    }

    /// The zone's offset from UTC at `secs` (since the epoch), in seconds.
    fn offset_secs(&self, secs: i64) -> i64 {
        let at = DateTime::from_timestamp(secs, 0).unwrap_or_default();
        i64::from(
            self.0
                .offset_from_utc_datetime(&at.naive_utc())
                .fix()
                .local_minus_utc(),
        )
    }

    /// The local day (days since 1970-01-01 on the zone's calendar) of an
    /// instant in seconds.
    fn day_of_secs(&self, secs: i64) -> i64 {
        (secs + self.offset_secs(secs)).div_euclid(86_400)
    }

    /// The local day an instant in milliseconds falls in.
    pub fn day_of_ms(&self, ms: i64) -> i64 {
        self.day_of_secs(ms.div_euclid(1000))
    }

    /// The local day an hour starts in.
    pub fn day_of_hour(&self, hour: i64) -> i64 {
        self.day_of_secs(hour.saturating_mul(3_600))
    }

    /// The first UTC hour starting on local day `day` or later. Offsets
    /// lie within -12..+14 hours (and a change moves them by at most a
    /// few), so it lies within 16 hours of the UTC day's first hour.
    pub fn day_start_hour(&self, day: i64) -> i64 {
        let mut lo = day.saturating_mul(24) - 16;
        let mut hi = day.saturating_mul(24) + 16;
        // The local day of an hour never decreases from one hour to the
        // next (a fall back repeats hours of one date), so bisect.
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.day_of_hour(mid) >= day {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        lo
    }

    /// The UTC hours of local days `w`, both ends' days whole.
    pub fn hours_of_days(&self, w: Window) -> HourRange {
        HourRange {
            from_hour: self.day_start_hour(w.from_day),
            to_hour: self.day_start_hour(w.to_day + 1) - 1,
        }
    }

    /// The UTC hours of the first `days` local days from the local day of
    /// a publication at `published_ms`: its milestone `days` in this zone.
    pub fn first_days_hours(&self, published_ms: i64, days: u32) -> HourRange {
        let from_day = self.day_of_ms(published_ms);
        self.hours_of_days(Window {
            from_day,
            to_day: from_day + i64::from(days) - 1,
        })
    }

    /// Refuses a range some hour of which does not lie in one local day:
    /// an offset that is not a whole number of hours, or one that changes
    /// inside an hour. The range is bounded by the caller (the hourly
    /// retention), so checking hour by hour stays small.
    pub fn check_whole_hours(&self, r: HourRange) -> Result<(), String> {
        for hour in r.from_hour..=r.to_hour {
            let start = hour.saturating_mul(3_600);
            let offset = self.offset_secs(start);
            if offset % 3_600 != 0 {
                return Err(format!(
                    "tz {}: its UTC offset at {} is {}, not a whole number of hours, so its local days do not start on the UTC hours the buckets are kept in; ask in UTC days (without tz) or a zone with whole-hour offsets",
                    self.name(),
                    format_hour(hour),
                    format_offset(offset)
                ));
            }
            if self.offset_secs(start + 3_599) != offset {
                return Err(format!(
                    "tz {}: its UTC offset changes inside the hour {}, so a local day does not start on a UTC hour; ask in UTC days (without tz)",
                    self.name(),
                    format_hour(hour)
                ));
            }
        }
        Ok(())
    }

    /// `interval`, `from` and `to` as local days: named intervals end on
    /// the local day of `now_ms`, `from`/`to` are local dates, or RFC 3339
    /// instants taken as the local day they fall in. Errors start with
    /// the parameter at fault, as `window::resolve`'s do.
    pub fn resolve_days(
        &self,
        interval: Option<&str>,
        from: Option<&str>,
        to: Option<&str>,
        now_ms: i64,
    ) -> Result<Resolved, String> {
        let local = |raw: &str| match DateTime::parse_from_rfc3339(raw) {
            Ok(t) => super::format_day(self.day_of_ms(t.timestamp_millis())),
            Err(_) => raw.to_string(),
        };
        let (from, to) = (from.map(local), to.map(local));
        super::window::resolve(
            interval,
            from.as_deref(),
            to.as_deref(),
            self.day_of_ms(now_ms),
        )
    }

    /// The local days wholly kept as hour buckets on the clock's day
    /// (see [`first_kept_hour`]), up to the local day of `now_ms`.
    pub fn kept_days(&self, now_ms: i64, hourly_retention_days: u32) -> Window {
        let first = first_kept_hour(now_ms, hourly_retention_days);
        let mut from_day = self.day_of_hour(first);
        if self.day_start_hour(from_day) < first {
            from_day += 1;
        }
        Window {
            from_day,
            to_day: self.day_of_ms(now_ms),
        }
    }
}

/// The most hours one local-day answer sums: 400 days, more than any
/// hourly retention kept in practice, so that one counter's hours stay one
/// search of at most 10,000 hits on Elasticsearch.
pub const MAX_LOCAL_HOURS: i64 = 24 * 400;

/// The first hour the hourly retention keeps on the clock's UTC day.
pub fn first_kept_hour(now_ms: i64, hourly_retention_days: u32) -> i64 {
    (day_of_hour(hour_of_ms(now_ms)) - i64::from(hourly_retention_days)) * 24
}

/// Refuses local days starting before the hourly retention: they cannot
/// be summed from hours, and a day bucket is of UTC days.
pub fn check_kept(
    zone: &Zone,
    r: HourRange,
    now_ms: i64,
    hourly_retention_days: u32,
) -> Result<(), String> {
    let first = first_kept_hour(now_ms, hourly_retention_days);
    if r.from_hour < first {
        return Err(format!(
            "tz: local days are summed from hour buckets, kept for {hourly_retention_days} days (--hourly-retention-days), back to {}; the range asked in {} starts at {}: ask for later days, or in UTC days (without tz)",
            format_hour(first),
            zone.name(),
            format_hour(r.from_hour)
        ));
    }
    if r.hours() > MAX_LOCAL_HOURS {
        return Err(format!(
            "tz: the range covers {} hours; local days are summed from at most {MAX_LOCAL_HOURS} hour buckets (400 days): narrow it",
            r.hours()
        ));
    }
    Ok(())
}

/// `+05:30`, `-12:00`.
fn format_offset(secs: i64) -> String {
    let sign = if secs < 0 { '-' } else { '+' };
    let m = secs.abs() / 60;
    format!("{sign}{:02}:{:02}", m / 60, m % 60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{NaiveDate, Utc};

    fn zone(name: &str) -> Zone {
        parse_zone(Some(name)).unwrap().unwrap()
    }

    fn day(s: &str) -> i64 {
        super::super::day_of(
            NaiveDate::parse_from_str(s, "%Y-%m-%d")
                .unwrap()
                .and_hms_opt(0, 0, 0)
                .unwrap()
                .and_utc(),
        )
    }

    fn hour(s: &str) -> i64 {
        hour_of_ms(s.parse::<DateTime<Utc>>().unwrap().timestamp_millis())
    }

    /// The UTC hours of one local day, as `(first, last, count)`.
    fn hours(z: &Zone, d: &str) -> (String, String, i64) {
        let r = z.hours_of_days(Window {
            from_day: day(d),
            to_day: day(d),
        });
        (format_hour(r.from_hour), format_hour(r.to_hour), r.hours())
    }

    #[test]
    fn utc_and_its_aliases_are_no_zone_and_unknown_names_are_refused() {
        assert_eq!(parse_zone(None), Ok(None));
        assert_eq!(parse_zone(Some("UTC")), Ok(None));
        assert_eq!(parse_zone(Some("Etc/UTC")), Ok(None));
        assert_eq!(zone("Europe/Berlin").name(), "Europe/Berlin");
        for bad in ["Europe/Berln", "europe/berlin", "", "+02:00", "CEST"] {
            let e = parse_zone(Some(bad)).unwrap_err();
            assert!(e.starts_with("tz"), "{e}");
        }
    }

    #[test]
    fn a_spring_forward_day_has_23_hours_and_a_fall_back_day_25() {
        let berlin = zone("Europe/Berlin");
        assert_eq!(
            hours(&berlin, "2026-03-28"),
            (
                "2026-03-27T23:00:00Z".into(),
                "2026-03-28T22:00:00Z".into(),
                24
            )
        );
        assert_eq!(
            hours(&berlin, "2026-03-29"),
            (
                "2026-03-28T23:00:00Z".into(),
                "2026-03-29T21:00:00Z".into(),
                23
            )
        );
        assert_eq!(
            hours(&berlin, "2026-10-25"),
            (
                "2026-10-24T22:00:00Z".into(),
                "2026-10-25T22:00:00Z".into(),
                25
            )
        );
        let ny = zone("America/New_York");
        assert_eq!(
            hours(&ny, "2026-03-08"),
            (
                "2026-03-08T05:00:00Z".into(),
                "2026-03-09T03:00:00Z".into(),
                23
            )
        );
        assert_eq!(
            hours(&ny, "2026-11-01"),
            (
                "2026-11-01T04:00:00Z".into(),
                "2026-11-02T04:00:00Z".into(),
                25
            )
        );
        // Several days at once: the sum of their lengths.
        let week = berlin.hours_of_days(Window {
            from_day: day("2026-03-23"),
            to_day: day("2026-03-29"),
        });
        assert_eq!(week.hours(), 7 * 24 - 1);
    }

    #[test]
    fn a_month_ends_on_the_zones_midnight() {
        let berlin = zone("Europe/Berlin");
        // The last hour of November in Berlin is 22:00 UTC on the 30th; the
        // hour after it is already December there.
        assert_eq!(
            hours(&berlin, "2026-11-30").1,
            "2026-11-30T22:00:00Z".to_string()
        );
        assert_eq!(
            berlin.day_of_hour(hour("2026-11-30T23:00:00Z")),
            day("2026-12-01")
        );
        assert_eq!(
            berlin.day_of_ms(hour("2026-11-30T22:59:59Z") * 3_600_000 + 3_599_000),
            day("2026-11-30")
        );
        let ny = zone("America/New_York");
        assert_eq!(
            hours(&ny, "2026-12-31"),
            (
                "2026-12-31T05:00:00Z".into(),
                "2027-01-01T04:00:00Z".into(),
                24
            )
        );
    }

    #[test]
    fn the_zones_furthest_from_utc_have_their_days_half_a_utc_day_away() {
        let kiritimati = zone("Pacific/Kiritimati");
        assert_eq!(
            hours(&kiritimati, "2026-12-01"),
            (
                "2026-11-30T10:00:00Z".into(),
                "2026-12-01T09:00:00Z".into(),
                24
            )
        );
        let minus_12 = zone("Etc/GMT+12");
        assert_eq!(
            hours(&minus_12, "2026-12-01"),
            (
                "2026-12-01T12:00:00Z".into(),
                "2026-12-02T11:00:00Z".into(),
                24
            )
        );
        let r = kiritimati.hours_of_days(Window {
            from_day: day("2026-12-01"),
            to_day: day("2026-12-01"),
        });
        assert!(kiritimati.check_whole_hours(r).is_ok());
        assert!(minus_12.check_whole_hours(r).is_ok());
    }

    #[test]
    fn offsets_that_are_not_whole_hours_are_refused_over_the_range_asked() {
        let range = |d: &str| HourRange {
            from_hour: day(d) * 24,
            to_hour: day(d) * 24 + 47,
        };
        for (name, offset) in [
            ("Asia/Kolkata", "+05:30"),
            ("Asia/Kathmandu", "+05:45"),
            ("Australia/Adelaide", "+10:30"),
        ] {
            let e = zone(name)
                .check_whole_hours(range("2026-12-01"))
                .unwrap_err();
            assert!(
                e.starts_with("tz") && e.contains(name) && e.contains(offset),
                "{e}"
            );
        }
        // Monrovia kept -00:44:30 until 1972, UTC since.
        let monrovia = zone("Africa/Monrovia");
        let e = monrovia.check_whole_hours(range("1971-06-01")).unwrap_err();
        assert!(e.contains("-00:44"), "{e}");
        assert!(monrovia.check_whole_hours(range("2026-06-01")).is_ok());
        // A DST change on a whole UTC hour is whole.
        assert!(zone("Europe/Berlin")
            .check_whole_hours(range("2026-03-28"))
            .is_ok());
    }

    #[test]
    fn intervals_end_on_the_local_day_and_instants_take_their_local_day() {
        let berlin = zone("Europe/Berlin");
        // 23:30 UTC on the 30th is 00:30 on 1 December in Berlin.
        let now = hour("2026-11-30T23:00:00Z") * 3_600_000 + 30 * 60_000;
        let r = berlin
            .resolve_days(Some("last_day"), None, None, now)
            .unwrap();
        assert_eq!(r.window.unwrap().from_day, day("2026-12-01"));
        let r = berlin
            .resolve_days(None, Some("2026-11-30T23:30:00Z"), None, now)
            .unwrap();
        assert_eq!(r.window.unwrap().from_day, day("2026-12-01"));
        // The local day after the clock's: a `from` in the future.
        let tomorrow = crate::domain::format_day(berlin.day_of_ms(now) + 1);
        let e = berlin
            .resolve_days(None, Some(&tomorrow), None, now)
            .unwrap_err();
        assert!(e.starts_with("from"), "{e}");
        // Kept: the local days starting at or after 00:00 UTC of the
        // retention's first day: in Berlin that day starts at 23:00 UTC
        // the day before, so the first whole local day kept is the next.
        let kept = berlin.kept_days(now, 14);
        assert_eq!(kept.from_day, day("2026-11-17"));
        assert_eq!(kept.to_day, day("2026-12-01"));
        let ny = zone("America/New_York");
        assert_eq!(ny.kept_days(now, 14).from_day, day("2026-11-16"));
        let old = berlin.hours_of_days(Window {
            from_day: day("2026-11-16"),
            to_day: day("2026-11-16"),
        });
        let e = check_kept(&berlin, old, now, 14).unwrap_err();
        assert!(e.contains("--hourly-retention-days"), "{e}");
        let fine = berlin.hours_of_days(kept);
        assert!(check_kept(&berlin, fine, now, 14).is_ok());
    }
}
