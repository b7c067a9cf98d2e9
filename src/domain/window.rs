//! Time windows of the read API: named intervals and `from`/`to` ranges,
//! resolved once, at the edge, into whole UTC days that every store understands.
//!
//! The rule (also in src/store/README.md, "Time windows"): a window is a closed range of
//! UTC days `[from_day, to_day]`, both included. `last_day` is today,
//! `last_week` the last 7 days including today, `last_month` the last 30,
//! `last_year` the last 365. `from`/`to` name days (`2026-11-24`) or instants
//! (RFC 3339, taken as the UTC day they fall in); `to` defaults to today.

use chrono::{DateTime, NaiveDate, Utc};

use super::day_of;

/// A closed range of UTC days (days since 1970-01-01), both ends included.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Window {
    pub from_day: i64,
    pub to_day: i64,
}

impl Window {
    /// How many days the window covers.
    pub fn days(&self) -> i64 {
        self.to_day - self.from_day + 1
    }

    /// Whether the day lies inside the window.
    pub fn contains(&self, day: i64) -> bool {
        (self.from_day..=self.to_day).contains(&day)
    }
}

/// An interval as the API names it, resolved against "today".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// The name echoed in answers: `all`, `last_week`, ..., or `range` for `from`/`to`.
    pub interval: &'static str,
    /// `None` for all time.
    pub window: Option<Window>,
}

/// The named intervals and how many days (including today) each covers;
/// `all` covers every day.
pub const NAMED_INTERVALS: [(&str, Option<i64>); 5] = [
    ("all", None),
    ("last_day", Some(1)),
    ("last_week", Some(7)),
    ("last_month", Some(30)),
    ("last_year", Some(365)),
];

/// Resolves the `interval`, `from` and `to` query parameters against the UTC
/// day `today`. Errors start with the name of the parameter at fault.
pub fn resolve(
    interval: Option<&str>,
    from: Option<&str>,
    to: Option<&str>,
    today: i64,
) -> Result<Resolved, String> {
    if from.is_some() || to.is_some() {
        if let Some(i) = interval {
            return Err(format!(
                "interval {i:?} cannot be combined with from/to; give one or the other"
            ));
        }
        let Some(from) = from else {
            return Err("from is required when to is given".into());
        };
        let from_day = parse_day("from", from)?;
        let to_day = match to {
            Some(t) => parse_day("to", t)?,
            None => today,
        };
        if from_day > today {
            return Err(format!("from {from} is in the future"));
        }
        if to_day > today {
            return Err(format!("to {} is in the future", to.unwrap_or_default()));
        }
        if from_day > to_day {
            return Err(format!(
                "from {from} is after to {}",
                to.unwrap_or("(today)")
            ));
        }
        return Ok(Resolved {
            interval: "range",
            window: Some(Window { from_day, to_day }),
        });
    }
    let name = interval.unwrap_or("all");
    let Some(&(name, days)) = NAMED_INTERVALS.iter().find(|(n, _)| *n == name) else {
        let known: Vec<&str> = NAMED_INTERVALS.iter().map(|(n, _)| *n).collect();
        return Err(format!(
            "interval {name:?} is unknown; use one of {} or from/to",
            known.join(", ")
        ));
    };
    Ok(Resolved {
        interval: name,
        window: days.map(|d| Window {
            from_day: today - d + 1,
            to_day: today,
        }),
    })
}

/// A day as `YYYY-MM-DD`, or an RFC 3339 instant taken as its UTC day.
fn parse_day(field: &str, raw: &str) -> Result<i64, String> {
    if let Ok(d) = NaiveDate::parse_from_str(raw, "%Y-%m-%d") {
        return Ok(day_of(d.and_hms_opt(0, 0, 0).unwrap_or_default().and_utc()));
    }
    DateTime::parse_from_rfc3339(raw)
        .map(|t| day_of(t.with_timezone(&Utc)))
        .map_err(|_| {
            format!("{field} {raw:?} is neither a day (2026-11-24) nor an RFC 3339 timestamp")
        })
}

/// `YYYY-MM-DD` of a UTC day, the form windows are answered in.
pub fn format_day(day: i64) -> String {
    DateTime::<Utc>::from_timestamp(day.saturating_mul(86_400), 0)
        .map(|t| t.format("%Y-%m-%d").to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-11-30
    const GIVEN_DAY: i64 = 20_787;

    fn w(from_day: i64, to_day: i64) -> Option<Window> {
        Some(Window { from_day, to_day })
    }

    #[test]
    fn today_is_what_the_tests_assume() {
        assert_eq!(format_day(GIVEN_DAY), "2026-11-30");
    }

    #[test]
    fn named_intervals_end_today_and_include_it() {
        let r = |i| resolve(Some(i), None, None, GIVEN_DAY).unwrap().window;
        assert_eq!(r("all"), None);
        assert_eq!(r("last_day"), w(GIVEN_DAY, GIVEN_DAY));
        assert_eq!(r("last_week"), w(GIVEN_DAY - 6, GIVEN_DAY));
        assert_eq!(r("last_week").unwrap().days(), 7);
        assert_eq!(r("last_month").unwrap().days(), 30);
        assert_eq!(r("last_year").unwrap().days(), 365);
        assert_eq!(
            resolve(None, None, None, GIVEN_DAY).unwrap().interval,
            "all"
        );
    }

    #[test]
    fn ranges_take_days_or_instants() {
        let r = resolve(
            None,
            Some("2026-11-24"),
            Some("2026-11-26T23:59:59+00:00"),
            GIVEN_DAY,
        )
        .unwrap();
        assert_eq!(r.interval, "range");
        assert_eq!(r.window, w(GIVEN_DAY - 6, GIVEN_DAY - 4));
        // An instant is taken in UTC: 01:00 at +02:00 is the previous UTC day.
        let r = resolve(None, Some("2026-11-25T01:00:00+02:00"), None, GIVEN_DAY).unwrap();
        assert_eq!(r.window, w(GIVEN_DAY - 6, GIVEN_DAY));
    }

    #[test]
    fn bad_parameters_are_named() {
        let e = |i, f, t| resolve(i, f, t, GIVEN_DAY).unwrap_err();
        assert!(e(Some("last_decade"), None, None).starts_with("interval"));
        assert!(e(Some("last_week"), Some("2026-11-01"), None).starts_with("interval"));
        assert!(e(None, None, Some("2026-11-01")).starts_with("from"));
        assert!(e(None, Some("yesterday"), None).starts_with("from"));
        assert!(e(None, Some("2026-11-01"), Some("nope")).starts_with("to"));
        assert!(e(None, Some("2026-12-01"), None).starts_with("from"));
        assert!(e(None, Some("2026-11-01"), Some("2026-12-01")).starts_with("to"));
        let after = e(None, Some("2026-11-20"), Some("2026-11-10"));
        assert!(
            after.starts_with("from") && after.contains("after"),
            "{after}"
        );
    }
}
