//! The monthly bucket indices: created ahead of the writes that need them,
//! and, on an engine without ILM (OpenSearch), deleted by the gateway once
//! every day they hold is past the retention.
//!
//! Writes must not depend on automatic index creation: a cluster that
//! restricts it (`action.auto_create_index`) would fail every write from
//! the first day of a month. So each tenant's store creates the current and
//! the next month's indices, and any month a flush writes to, once, and
//! remembers which months it made sure of: the common flush costs no round
//! trip. Which months to create and which indices have expired are pure
//! functions of the injected clock's day, tested alone.

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::{Datelike, NaiveDate};
use elasticsearch::http::Method;
use serde_json::Value;

use super::{response, ElasticsearchStore};
use crate::domain::Increment;

/// Most months a store remembers as created; the oldest are forgotten
/// first (a forgotten month costs one more create, answered "exists").
pub const MAX_ENSURED_MONTHS: usize = 24;

/// Months as `year * 12 + month0`, so consecutive months are consecutive numbers.
pub type Month = i64;

/// The month of a UTC day (days since the epoch).
pub fn month_of_day(day: i64) -> Option<Month> {
    let d = chrono::DateTime::from_timestamp(day.checked_mul(86_400)?, 0)?;
    Some(i64::from(d.year()) * 12 + i64::from(d.month0()))
}

/// The first UTC day (days since the epoch) of `month`.
pub fn first_day(month: Month) -> Option<i64> {
    let year = i32::try_from(month.div_euclid(12)).ok()?;
    let month0 = u32::try_from(month.rem_euclid(12)).ok()?;
    let date = NaiveDate::from_ymd_opt(year, month0 + 1, 1)?;
    Some(date.signed_duration_since(NaiveDate::default()).num_days())
}

/// The months to create before writing `days` on `today`: the current and
/// next month (so a month's first writes find their index) and the months
/// of `days`, less those already `ensured`. Ascending.
pub fn months_to_ensure(
    today: i64,
    days: impl IntoIterator<Item = i64>,
    ensured: &BTreeSet<Month>,
) -> Vec<Month> {
    let mut want = BTreeSet::new();
    if let Some(m) = month_of_day(today) {
        want.insert(m);
        want.insert(m + 1);
    }
    want.extend(days.into_iter().filter_map(month_of_day));
    want.difference(ensured).copied().collect()
}

/// Of `indices` (names as the cluster lists them), the monthly bucket
/// indices of `prefix` (any tenant, both bucket collections) whose every day
/// is older than `retention_days` before `today`: the last day of their
/// month is before the oldest day the gateway still accepts and reads.
/// Anything not named exactly like a bucket index is left alone.
pub fn expired_indices<'a>(
    indices: impl IntoIterator<Item = &'a str>,
    prefix: &str,
    today: i64,
    retention_days: u32,
) -> Vec<String> {
    let oldest_kept = today - i64::from(retention_days);
    let mut out: Vec<String> = indices
        .into_iter()
        .filter(|name| {
            bucket_month(name, prefix)
                .and_then(|m| first_day(m + 1))
                .is_some_and(|next_month| next_month <= oldest_kept)
        })
        .map(str::to_string)
        .collect();
    out.sort();
    out
}

/// Of `indices`, the monthly hour indices of `prefix` (any tenant) whose
/// every day is older than `hourly_retention_days` before `today`.
pub fn expired_hour_indices<'a>(
    indices: impl IntoIterator<Item = &'a str>,
    prefix: &str,
    today: i64,
    hourly_retention_days: u32,
) -> Vec<String> {
    let oldest_kept = today - i64::from(hourly_retention_days);
    let mut out: Vec<String> = indices
        .into_iter()
        .filter(|name| {
            month_named(name, prefix, &["hour_counters-"])
                .and_then(|m| first_day(m + 1))
                .is_some_and(|next_month| next_month <= oldest_kept)
        })
        .map(str::to_string)
        .collect();
    out.sort();
    out
}

/// The month of `<prefix>_<tenant>_[average_]histogram_counters-YYYY.MM`
/// or `<prefix>_<tenant>_actor_day_marks-YYYY.MM` (views' marks expire with
/// the buckets: no event older than the retention is accepted).
fn bucket_month(name: &str, prefix: &str) -> Option<Month> {
    month_named(
        name,
        prefix,
        &[
            "histogram_counters-",
            "average_histogram_counters-",
            "actor_day_marks-",
        ],
    )
}

/// The month of `<prefix>_<tenant>_<collection>YYYY.MM` for one of
/// `collections` (each with its `-`).
fn month_named(name: &str, prefix: &str, collections: &[&str]) -> Option<Month> {
    let rest = name.strip_prefix(prefix)?.strip_prefix('_')?;
    let (tenant, rest) = rest.split_once('_')?;
    super::request::validate_index_part("tenant", tenant).ok()?;
    let date = collections.iter().find_map(|c| rest.strip_prefix(c))?;
    let (y, m) = date.split_once('.')?;
    if y.len() != 4 || m.len() != 2 || !(y.bytes().chain(m.bytes())).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (y, m): (i64, i64) = (y.parse().ok()?, m.parse().ok()?);
    (1..=12).contains(&m).then_some(y * 12 + m - 1)
}

impl ElasticsearchStore {
    /// Creates the bucket indices a flush of `increments` needs and this
    /// store has not yet made sure of (see the module doc). A failure is
    /// logged, not returned: where automatic creation is allowed the writes
    /// still succeed, and where it is not they fail with their own error.
    /// The first failure ends the attempt (the rest is tried at the next
    /// flush), so a hung cluster delays a flush by one call, not one per index.
    pub(super) async fn ensure_bucket_indices(&self, increments: &[&[Increment]]) {
        let days: Vec<i64> = increments
            .iter()
            .flat_map(|r| r.iter().map(|i| i.day))
            .collect();
        self.ensure_bucket_months(&days).await;
    }

    /// [`Self::ensure_bucket_indices`] for the days a backfill sets.
    pub(super) async fn ensure_bucket_days(&self, days: &[i64]) {
        self.ensure_bucket_months(days).await;
    }

    async fn ensure_bucket_months(&self, days: &[i64]) {
        let today = self.clock.now_ms().div_euclid(86_400_000);
        let missing = {
            let ensured = self
                .ensured_months
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            months_to_ensure(today, days.iter().copied(), &ensured)
        };
        for month in missing {
            let Some(day) = first_day(month) else {
                continue;
            };
            let names = &self.config.names;
            // Hours only for months that reach into the hourly retention.
            let hours = first_day(month + 1)
                .is_some_and(|next| next > self.hours_from_day())
                .then(|| names.hours(day * 24));
            for index in [names.buckets(day), names.average_buckets(day)]
                .into_iter()
                .chain(hours)
            {
                if let Err(e) = self.create_index(&index).await {
                    tracing::warn!(%index, error = %e, "could not create a bucket index ahead of writes");
                    return;
                }
            }
            let mut ensured = self
                .ensured_months
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            ensured.insert(month);
            while ensured.len() > MAX_ENSURED_MONTHS {
                ensured.pop_first();
            }
        }
    }

    /// `PUT /<index>`; an index that already exists is fine.
    pub(super) async fn create_index(&self, index: &str) -> Result<(), String> {
        let (status, body) = self
            .call(Method::Put, &format!("/{index}"), &[], None)
            .await
            .map_err(|e| e.to_string())?;
        match status {
            200..=299 => Ok(()),
            400 if response::error_type(&body) == Some("resource_already_exists_exception") => {
                Ok(())
            }
            _ => Err(format!(
                "answered {status} {}",
                response::describe_error(body.get("error"))
            )),
        }
    }

    /// Deletes this prefix's monthly bucket and day-mark indices (every tenant) that are
    /// past `retention_days` on the clock's day; returns their names. For an
    /// engine without ILM; never called on the write path.
    pub async fn delete_expired_buckets(&self, retention_days: u32) -> Result<Vec<String>, String> {
        self.delete_expired_indices(retention_days, false).await
    }

    /// Deletes this prefix's monthly indices (every tenant) past
    /// `retention_days`: the hour indices with `hours`, else the day
    /// buckets' and day marks'.
    pub async fn delete_expired_indices(
        &self,
        retention_days: u32,
        hours: bool,
    ) -> Result<Vec<String>, String> {
        let prefix = self.config.names.prefix();
        let (status, body) = self
            .call(
                Method::Get,
                &format!("/_cat/indices/{prefix}_*"),
                &[("format", "json"), ("h", "index")],
                None,
            )
            .await
            .map_err(|e| e.to_string())?;
        if status != 200 {
            return Err(format!(
                "listing indices answered {status} {}",
                response::describe_error(body.get("error"))
            ));
        }
        let listed = body.as_array().cloned().unwrap_or_default();
        let names = listed
            .iter()
            .filter_map(|i| i.get("index").and_then(Value::as_str));
        let today = self.clock.now_ms().div_euclid(86_400_000);
        let expired = if hours {
            expired_hour_indices(names, prefix, today, retention_days)
        } else {
            expired_indices(names, prefix, today, retention_days)
        };
        let mut deleted = Vec::new();
        for index in expired {
            // One name per call: clusters refuse wildcard deletes, and an
            // error names its index.
            let (status, body) = self
                .call(Method::Delete, &format!("/{index}"), &[], None)
                .await
                .map_err(|e| e.to_string())?;
            match status {
                200 | 404 => {
                    tracing::info!(%index, retention_days, "deleted an expired bucket index");
                    deleted.push(index);
                }
                _ => {
                    return Err(format!(
                        "deleting {index} answered {status} {}",
                        response::describe_error(body.get("error"))
                    ))
                }
            }
        }
        Ok(deleted)
    }

    /// Retention the gateway does itself, at start and then once a day, in
    /// the background: expired hour indices on every engine (no ILM policy
    /// retires them, see `templates::NO_LIFECYCLE`), and expired day-bucket
    /// indices on an engine without ILM (OpenSearch, Elasticsearch OSS);
    /// where ILM runs, the policy installed by `setup` retires those.
    pub async fn run_retention(self: std::sync::Arc<Self>, retention_days: u32) {
        loop {
            // Hour indices on every engine: no ILM policy retires them
            // (see `templates::NO_LIFECYCLE`).
            if let Err(e) = self
                .delete_expired_indices(self.config.hourly_retention_days, true)
                .await
            {
                tracing::warn!(error = %e, "deleting expired hour indices failed; retried tomorrow");
            }
            match self.engine().await {
                Ok(engine) if engine.has_ilm() => {}
                Ok(_) => {
                    if let Err(e) = self.delete_expired_buckets(retention_days).await {
                        tracing::warn!(error = %e, "deleting expired bucket indices failed; retried tomorrow");
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "retention: the engine is not known yet; retried tomorrow")
                }
            }
            tokio::time::sleep(until_next_day(self.clock.now_ms())).await;
        }
    }
}

/// Time from `now_ms` to ten minutes past the next UTC midnight.
fn until_next_day(now_ms: i64) -> Duration {
    let next = (now_ms.div_euclid(86_400_000) + 1) * 86_400_000 + 600_000;
    Duration::from_millis(u64::try_from(next - now_ms).unwrap_or(86_400_000))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(y: i32, m: u32, d: u32) -> i64 {
        NaiveDate::from_ymd_opt(y, m, d)
            .unwrap()
            .signed_duration_since(NaiveDate::default())
            .num_days()
    }

    fn month(y: i64, m: i64) -> Month {
        y * 12 + m - 1
    }

    #[test]
    fn months_and_days_convert() {
        assert_eq!(month_of_day(day(2026, 12, 31)), Some(month(2026, 12)));
        assert_eq!(first_day(month(2027, 1)), Some(day(2027, 1, 1)));
        assert_eq!(first_day(month(2026, 12) + 1), Some(day(2027, 1, 1)));
    }

    #[test]
    fn the_current_and_next_month_and_written_months_are_ensured_once() {
        let today = day(2026, 12, 1);
        let mut ensured = BTreeSet::new();
        assert_eq!(
            months_to_ensure(today, [today], &ensured),
            vec![month(2026, 12), month(2027, 1)]
        );
        ensured.extend([month(2026, 12), month(2027, 1)]);
        // The common flush: nothing to create.
        assert!(months_to_ensure(today, [today, today + 30], &ensured).is_empty());
        // A late event of an earlier month.
        assert_eq!(
            months_to_ensure(today, [day(2026, 10, 31)], &ensured),
            vec![month(2026, 10)]
        );
        // The first day of the next month: its index exists, the one after is made.
        assert_eq!(
            months_to_ensure(day(2027, 1, 1), [day(2027, 1, 1)], &ensured),
            vec![month(2027, 2)]
        );
    }

    #[test]
    fn an_index_expires_when_its_last_day_leaves_the_retention() {
        let names = [
            "cg_default_histogram_counters-2025.10",
            "cg_default_histogram_counters-2025.11",
            "cg_t2_average_histogram_counters-2025.10",
            "cg_default_actor_day_marks-2025.10",
            "cg_default_actor_marks",
            "cg_default_counters",
            "cg_default_average_counters",
            "cg-other_default_histogram_counters-2020.01",
            "cgx_default_histogram_counters-2020.01",
            "cg_default_histogram_counters-2020.13",
            "cg_default_histogram_counters-2020.1",
            "cg_default_histogram_counters-2020.01-restored",
            "cg_a_b_histogram_counters-2020.01",
        ];
        // 400 days before 2026-12-01 is 2025-10-27: October 2025 still has
        // kept days (27 to 31); it expires once 2025-10-31 is past, on
        // 2026-12-06.
        assert!(expired_indices(names, "cg", day(2026, 12, 1), 400).is_empty());
        assert!(expired_indices(names, "cg", day(2026, 12, 5), 400).is_empty());
        assert_eq!(
            expired_indices(names, "cg", day(2026, 12, 6), 400),
            vec![
                "cg_default_actor_day_marks-2025.10",
                "cg_default_histogram_counters-2025.10",
                "cg_t2_average_histogram_counters-2025.10"
            ]
        );
        assert_eq!(expired_indices(names, "cg", day(2027, 1, 10), 400).len(), 4);
    }

    #[test]
    fn the_daily_run_waits_for_the_next_day() {
        let d = until_next_day(day(2026, 12, 1) * 86_400_000 + 3_600_000);
        assert_eq!(d, Duration::from_secs(23 * 3600 + 600));
    }
}
