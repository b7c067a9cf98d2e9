//! Backfill: setting one day's bucket of a counter to a value, as daily
//! series from another system are loaded (and loaded again after a
//! correction). A set is not an increment: it replaces the bucket, and the
//! counter moves by the difference, so setting a day to `n` twice leaves
//! the same state as once.

use std::sync::Arc;

use chrono::{DateTime, NaiveDate, Utc};

use super::{day_of, format_day, CounterKey, Interner, Part, TimePolicy};

/// One validated set: the bucket of `key` for UTC `day` becomes `value`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DaySet {
    pub key: CounterKey,
    /// UTC day, days since 1970-01-01.
    pub day: i64,
    pub value: i64,
    /// Stored on the counter when given (the last one given wins, as for
    /// increments); absent leaves the counter's category as it is.
    pub category: Option<Arc<str>>,
}

impl DaySet {
    /// The instant a set counts as a touch of its counter: the start of its
    /// day (00:00 UTC). A backfill of last year thus leaves
    /// `recorded_timestamp` where the real touches put it (it only moves
    /// forward) and does not make a counter look touched today; a counter
    /// created by a backfill looks touched on its latest backfilled day,
    /// so the stale report sees it as the loaded history says.
    pub fn touch_ms(&self) -> i64 {
        self.day.saturating_mul(86_400_000)
    }
}

/// A set as a client described it, before validation.
#[derive(Debug, Default)]
pub struct DaySetSpec<'a> {
    pub entity: &'a str,
    pub action: &'a str,
    pub uuid: &'a str,
    /// `YYYY-MM-DD`, a UTC day.
    pub day: &'a str,
    pub value: i64,
    pub category: Option<&'a str>,
}

impl DaySet {
    /// Validates a spec against the clock: the day must be today or earlier
    /// and no older than the retention. Errors name the field at fault and
    /// the day.
    pub fn from_spec_in<'a>(
        spec: &DaySetSpec<'a>,
        policy: &TimePolicy,
        now: DateTime<Utc>,
        names: &mut Interner<'a>,
    ) -> Result<DaySet, String> {
        let key = CounterKey::new_in(spec.entity, spec.action, spec.uuid, names)?;
        let day = parse_day(spec.day)?;
        let today = day_of(now);
        if day > today {
            return Err(format!(
                "day {} is in the future (today is {} UTC)",
                spec.day,
                format_day(today)
            ));
        }
        let oldest = day_of(policy.oldest_accepted(now));
        if day < oldest {
            return Err(format!(
                "day {} is older than the bucket retention of {} days (the oldest day accepted is {})",
                spec.day,
                policy.retention_days,
                format_day(oldest)
            ));
        }
        let category = match spec.category {
            Some(c) => Some(names.name(Part::Category, c)?.0),
            None => None,
        };
        Ok(DaySet {
            key,
            day,
            value: spec.value,
            category,
        })
    }
}

/// A counter set to a value as a whole (`PUT /v1/counters/{entity}/{action}/{uuid}`):
/// a starting value carried over from another system. Unlike a [`DaySet`]
/// it names no day: the all-time value becomes `value` and every day
/// bucket stays as it is, so windowed lists and histograms, which are made
/// of buckets, say what really happened on each day; the difference lies
/// in the part of the total that no day holds (what an export calls
/// `before`). Setting the same value again changes nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CounterSet {
    pub key: CounterKey,
    pub value: i64,
    /// Stored on the counter when given (the last one given wins);
    /// absent leaves the counter's category as it is.
    pub category: Option<Arc<str>>,
    /// When the set was made (the injected clock): the first and latest
    /// touch of a counter the set creates. A counter that exists keeps
    /// its timestamps: a set corrects a total, it is no use of the
    /// counter, so the stale report keeps reading real touches.
    pub now_ms: i64,
}

impl CounterSet {
    /// Validates the key and the category; any i64 is a value (counters
    /// may be negative, as decrements can make them).
    pub fn new(
        entity: &str,
        action: &str,
        uuid: &str,
        value: i64,
        category: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<CounterSet, String> {
        let mut names = Interner::default();
        let key = CounterKey::new_in(entity, action, uuid, &mut names)?;
        let category = match category {
            Some(c) => Some(names.name(Part::Category, c)?.0),
            None => None,
        };
        Ok(CounterSet {
            key,
            value,
            category,
            now_ms: now.timestamp_millis(),
        })
    }
}

/// A day exactly as `YYYY-MM-DD` (what the histogram answers), nothing
/// looser: a backfill names days, not instants that fall in one.
pub fn parse_day(raw: &str) -> Result<i64, String> {
    let bad = || format!("day {raw:?} is not a day in the form YYYY-MM-DD");
    let date = NaiveDate::parse_from_str(raw, "%Y-%m-%d").map_err(|_| bad())?;
    // chrono accepts `2026-1-5` and padded years; only the canonical form is a day here.
    if date.format("%Y-%m-%d").to_string() != raw {
        return Err(bad());
    }
    Ok(day_of(date.and_hms_opt(0, 0, 0).ok_or_else(bad)?.and_utc()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        "2028-02-29T23:59:59Z".parse().unwrap()
    }

    fn spec(day: &str) -> DaySetSpec<'_> {
        DaySetSpec {
            entity: "VIDEO",
            action: "VIEW",
            uuid: "u1",
            day,
            value: 5,
            category: None,
        }
    }

    fn check(day: &str) -> Result<DaySet, String> {
        DaySet::from_spec_in(
            &spec(day),
            &TimePolicy::default(),
            now(),
            &mut Interner::default(),
        )
    }

    #[test]
    fn today_and_the_oldest_retained_day_are_accepted_their_neighbours_not() {
        let today = check("2028-02-29").unwrap();
        assert_eq!(today.day, day_of(now()));
        assert_eq!(today.touch_ms(), today.day * 86_400_000);
        let oldest = format_day(day_of(now()) - 400);
        assert_eq!(check(&oldest).unwrap().day, day_of(now()) - 400);
        let too_old = format_day(day_of(now()) - 401);
        let e = check(&too_old).unwrap_err();
        assert!(e.contains(&too_old) && e.contains("retention"), "{e}");
        let e = check("2028-03-01").unwrap_err();
        assert!(e.contains("2028-03-01") && e.contains("future"), "{e}");
    }

    #[test]
    fn only_canonical_days_parse() {
        assert_eq!(parse_day("1970-01-02"), Ok(1));
        for bad in [
            "2028-2-29",
            "2027-02-29",
            "2028-02-29T00:00:00Z",
            "yesterday",
            "",
            "+2028-02-29",
        ] {
            let e = parse_day(bad).unwrap_err();
            assert!(e.contains("YYYY-MM-DD"), "{bad}: {e}");
        }
    }
}
