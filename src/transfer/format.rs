//! The NDJSON format of `export` and `import`, version 5: one JSON object a
//! line, its kind in `kind`; the first line is the header. What each record
//! means when imported is in src/transfer/README.md ("Export and import"); this file
//! writes records and turns a line into what a store sets, or into the
//! reason it is refused.
//!
//! ```text
//! {"kind":"header","format":"counter-gateway","version":5}
//! {"kind":"actor_secret","fingerprint":"3f2a9c0e1b7d4a55","keyed_for":"default"}
//! {"kind":"counter","entity":"ARTICLE","action":"VIEW","uuid":"a1","value":1023,"before":23,"category":"news","first_timestamp":"...","recorded_timestamp":"...","days":{"2026-11-02":120,...,"2026-11-30":8},"hours":{"2026-11-30T09":5,"2026-11-30T10":3}}
//! {"kind":"average","entity":"ARTICLE","action":"rating","uuid":"a1","sum":40,"quantity":10,"before_sum":0,"before_quantity":0,...,"days":{"2026-11-02":{"sum":9,"quantity":2}}}
//! {"kind":"day","entity":"ARTICLE","action":"VIEW","uuid":"a2","day":"2026-11-03","value":8,"category":"news"}
//! {"kind":"published","entity":"ARTICLE","uuid":"a1","published":"2026-11-20T08:30:00.000Z"}
//! {"kind":"mark","entity":"ARTICLE","action":"like","uuid":"a1","scope":"ever","mark":"<32 hex>","state":"counted"}
//! {"kind":"mark","entity":"ARTICLE","action":"VIEW","uuid":"a1","scope":"day","day":"2026-11-30","mark":"<32 hex>","state":"counted"}
//! {"kind":"countapi","namespace":"site.com","key":"visits","admin_key_sha256":"<64 hex>","namespace_created":"...","enable_reset":false,"update_lowerbound":-1,"update_upperbound":1,"created":"..."}
//! ```
//!
//! `keyed_for` names the tenant the marks are keyed for (the tenant is in
//! their hash, see `crate::domain::actor`); a file written before that has
//! none, and its marks are of the first keying, which `import` brings to
//! the tenant it imports into. A build that predates `keyed_for` refuses
//! it (an unknown field) at that line, before any mark.
//!
//! Version 2 added `mark` and `actor_secret` records; a version 1 file is
//! read as it was (it has neither). Version 1 readers refuse a version 2
//! file at its header, naming the version, rather than stopping at its
//! first mark with the file half imported: the header holds nothing else a
//! version 1 reader does not know.
//!
//! Version 3 added `published` records (a target's publication time, see
//! `crate::domain::milestone`); version 1 and 2 files are read as they
//! were (they have none). For the same reason as above, a version 2 reader
//! refuses a version 3 file at its header ("this build reads versions 1
//! and 2") instead of importing its counters and stopping at its first
//! `published` line, or with `--skip-bad` setting every publication time
//! aside: a file of this build goes into an older gateway not at all,
//! rather than without its publication times.
//!
//! Version 4 added `countapi` records: a key made by CountAPI's `create`
//! (its rules) with its namespace's record (the SHA-256 of its admin key,
//! never the key), so a namespace moved to another store keeps its admin
//! key and its keys their bounds. Earlier versions are read as they were;
//! a version 3 reader refuses a version 4 file at its header, as above.
//!
//! Version 5 added `hours` to `counter` records: the counter's hour
//! buckets (`YYYY-MM-DDTHH`, UTC) of its listed days inside the hourly
//! retention, so that hour answers (`bucket=hour`, `tz=`, `last_hour`,
//! trending) over the moved days stay true. A record with `hours` gives
//! the whole hours of each of its days from the importing side's hourly
//! retention on: a day's hours not listed are none, and what the day holds
//! beyond its hours is its rest (a backfilled day's, or a day whose hours
//! the exporting store did not keep), which makes hour answers over it say
//! `exact: false`, as on the exporting store. A record without `hours` (any
//! file of version 4 or older) sets its days with their hours unknown, as
//! before: hour answers over them say `exact: false`. Every hour must lie
//! in a day the record lists; hours of days before the hourly retention
//! are left out (the store would delete them). A version 4 reader refuses
//! a version 5 file at its header, as above, rather than importing its
//! counters without their hours.

use std::collections::HashSet;
use std::fmt;

use chrono::{DateTime, Utc};
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use crate::domain::countapi::{CreatedKey, KeyRecord, KeyRules, Namespace};
use crate::domain::milestone::{parse_published, Published};
use crate::domain::{
    day_of, format_day, format_ms, parse_day, validate_name, CounterKey, DaySet, DaySetSpec,
    Interner, Mark, TimePolicy, FINGERPRINT_HEX,
};
use crate::store::{
    ActorMark, AverageBucket, AverageHistory, AverageImport, Bucket, CounterHistory, CounterImport,
    HourBucket, ImportHours, MarkState, TargetPublished,
};

/// The `format` of the header line.
pub const FORMAT: &str = "counter-gateway";
/// The version this build writes.
pub const VERSION: u32 = 5;

/// The versions this build reads.
pub const READS: [u32; 5] = [1, 2, 3, 4, 5];

/// The header line, with its newline.
pub fn header_line() -> String {
    format!("{{\"kind\":\"header\",\"format\":\"{FORMAT}\",\"version\":{VERSION}}}\n")
}

/// The line naming, by its fingerprint (`ActorKey::fingerprint`), the
/// secret the file's marks were keyed with, and the tenant they are keyed
/// for (`None`: the first keying, without the tenant); written after the
/// header when the file holds marks and the exporting side knows its secret.
pub fn actor_secret_line(fingerprint: &str, keyed_for: Option<&str>) -> String {
    match keyed_for {
        // Tenant names are index-name safe: nothing to escape.
        Some(t) => format!(
            "{{\"kind\":\"actor_secret\",\"fingerprint\":\"{fingerprint}\",\"keyed_for\":\"{t}\"}}\n"
        ),
        None => format!("{{\"kind\":\"actor_secret\",\"fingerprint\":\"{fingerprint}\"}}\n"),
    }
}

/// What an `actor_secret` record says of the file's marks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActorSecret {
    /// The fingerprint of the secret they were keyed with.
    pub fingerprint: String,
    /// The tenant they are keyed for; `None`: the first keying, without.
    pub keyed_for: Option<String>,
}

#[derive(Serialize)]
struct MarkOut<'a> {
    kind: &'static str,
    entity: &'a str,
    action: &'a str,
    uuid: &'a str,
    scope: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    day: Option<String>,
    mark: String,
    state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    since: Option<String>,
}

/// The line of an actor's mark (with its newline).
pub fn mark_line(m: &ActorMark) -> String {
    let (state, since) = match m.state {
        MarkState::Counted => ("counted", None),
        MarkState::Retracting { since_ms } => ("retracting", Some(format_ms(since_ms))),
    };
    line(&MarkOut {
        kind: "mark",
        entity: &m.key.entity,
        action: &m.key.action,
        uuid: &m.key.uuid,
        scope: if m.day.is_some() { "day" } else { "ever" },
        day: m.day.map(format_day),
        mark: m.mark.hex(),
        state,
        since,
    })
}

#[derive(Serialize)]
struct PublishedOut<'a> {
    kind: &'static str,
    entity: &'a str,
    uuid: &'a str,
    published: String,
}

#[derive(Serialize)]
struct CountapiOut<'a> {
    kind: &'static str,
    namespace: &'a str,
    key: &'a str,
    admin_key_sha256: String,
    namespace_created: String,
    enable_reset: bool,
    update_lowerbound: i64,
    update_upperbound: i64,
    created: String,
}

/// The line of a key made by CountAPI's `create`, with its namespace's
/// record (with its newline).
pub fn countapi_line(r: &KeyRecord) -> String {
    let rules = r.created.rules;
    line(&CountapiOut {
        kind: "countapi",
        namespace: &r.namespace.name,
        key: &r.key,
        admin_key_sha256: crate::domain::to_hex(&r.namespace.admin_key_sha256),
        namespace_created: format_ms(r.namespace.created_ms),
        enable_reset: rules.enable_reset,
        update_lowerbound: rules.update_lowerbound,
        update_upperbound: rules.update_upperbound,
        created: format_ms(r.created.created_ms),
    })
}

/// The line of a target's publication time (with its newline).
pub fn published_line(p: &TargetPublished) -> String {
    line(&PublishedOut {
        kind: "published",
        entity: &p.entity,
        uuid: &p.uuid,
        published: format_ms(p.at_ms),
    })
}

/// Day buckets written as an object `{"YYYY-MM-DD": v, ...}` in day order.
struct DaysOut<'a, T>(&'a [(i64, T)]);

impl<T: Serialize> Serialize for DaysOut<'_, T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (day, v) in self.0 {
            m.serialize_entry(&format_day(*day), v)?;
        }
        m.end()
    }
}

/// `2026-11-30T09`: an hour as a record names it (UTC; the form of the
/// hour documents' ids on Elasticsearch).
pub fn format_hour_key(hour: i64) -> String {
    chrono::DateTime::<Utc>::from_timestamp(hour.saturating_mul(3_600), 0)
        .map(|t| t.format("%Y-%m-%dT%H").to_string())
        .unwrap_or_default()
}

/// The hour a record's key names: `YYYY-MM-DDTHH`, nothing else.
fn parse_hour_key(raw: &str) -> Result<i64, String> {
    let bad = || format!("hour {raw:?} is not an hour in the form YYYY-MM-DDTHH (UTC)");
    let (day, hh) = raw.split_once('T').ok_or_else(bad)?;
    let day = parse_day(day).map_err(|_| bad())?;
    if hh.len() != 2 || !hh.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let hh: i64 = hh.parse().map_err(|_| bad())?;
    if hh > 23 {
        return Err(bad());
    }
    Ok(day * 24 + hh)
}

/// Hour buckets written as an object `{"YYYY-MM-DDTHH": v, ...}` in hour order.
struct HoursOut<'a>(&'a [HourBucket]);

impl Serialize for HoursOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for h in self.0 {
            m.serialize_entry(&format_hour_key(h.hour), &h.value)?;
        }
        m.end()
    }
}

#[derive(Serialize)]
struct SumQuantity {
    sum: i64,
    quantity: i64,
}

#[derive(Serialize)]
struct CounterOut<'a> {
    kind: &'static str,
    entity: &'a str,
    action: &'a str,
    uuid: &'a str,
    value: i64,
    before: i128,
    #[serde(skip_serializing_if = "Option::is_none")]
    category: Option<&'a str>,
    first_timestamp: String,
    recorded_timestamp: String,
    days: DaysOut<'a, i64>,
    hours: HoursOut<'a>,
}

#[derive(Serialize)]
struct AverageOut<'a> {
    kind: &'static str,
    entity: &'a str,
    action: &'a str,
    uuid: &'a str,
    sum: i64,
    quantity: i64,
    before_sum: i128,
    before_quantity: i128,
    #[serde(skip_serializing_if = "Option::is_none")]
    category: Option<&'a str>,
    first_timestamp: String,
    recorded_timestamp: String,
    days: DaysOut<'a, SumQuantity>,
}

/// The line of a counter (with its newline). `before` is the part of its
/// value that no listed day holds (days past the retention). `hours` is
/// always written (empty when none), so the record says its hours are
/// given: their absence would mean they are unknown.
pub fn counter_line(c: &CounterHistory) -> String {
    let days: Vec<(i64, i64)> = c.days.iter().map(|b| (b.day, b.value)).collect();
    // An hour of a day not listed would be refused by the import (a day's
    // hours sum into it); no store keeps one, as an hour's increment makes
    // its day's bucket too.
    let named: HashSet<i64> = days.iter().map(|(d, _)| *d).collect();
    let hours: Vec<HourBucket> = c
        .hours
        .iter()
        .filter(|h| named.contains(&h.hour.div_euclid(24)))
        .copied()
        .collect();
    let listed: i128 = days.iter().map(|(_, v)| i128::from(*v)).sum();
    let k = &c.counter.key;
    let out = CounterOut {
        kind: "counter",
        entity: &k.entity,
        action: &k.action,
        uuid: &k.uuid,
        value: c.counter.value,
        before: i128::from(c.counter.value) - listed,
        category: c.counter.category.as_deref(),
        first_timestamp: format_ms(c.counter.first_ms),
        recorded_timestamp: format_ms(c.counter.recorded_ms),
        days: DaysOut(&days),
        hours: HoursOut(&hours),
    };
    line(&out)
}

/// The line of an average counter (with its newline).
pub fn average_line(a: &AverageHistory) -> String {
    let days: Vec<(i64, SumQuantity)> = a
        .days
        .iter()
        .map(|b| {
            (
                b.day,
                SumQuantity {
                    sum: b.sum,
                    quantity: b.quantity,
                },
            )
        })
        .collect();
    let sum: i128 = a.days.iter().map(|b| i128::from(b.sum)).sum();
    let quantity: i128 = a.days.iter().map(|b| i128::from(b.quantity)).sum();
    let out = AverageOut {
        kind: "average",
        entity: &a.key.entity,
        action: &a.key.action,
        uuid: &a.key.uuid,
        sum: a.sum,
        quantity: a.quantity,
        before_sum: i128::from(a.sum) - sum,
        before_quantity: i128::from(a.quantity) - quantity,
        category: a.category.as_deref(),
        first_timestamp: format_ms(a.first_ms),
        recorded_timestamp: format_ms(a.recorded_ms),
        days: DaysOut(&days),
    };
    line(&out)
}

fn line<T: Serialize>(record: &T) -> String {
    // Strings and integers only: serializing cannot fail.
    let mut s = serde_json::to_string(record).unwrap_or_default();
    s.push('\n');
    s
}

/// Days as read: `(day text, value)` in file order; a day named twice is refused.
#[derive(Debug, Default)]
struct DaysIn(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for DaysIn {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = DaysIn;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object of days, {\"YYYY-MM-DD\": value, ...}")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<DaysIn, A::Error> {
                let mut seen = HashSet::new();
                let mut out = Vec::new();
                while let Some((day, v)) = map.next_entry::<String, Value>()? {
                    if !seen.insert(day.clone()) {
                        return Err(serde::de::Error::custom(format!("{day} is named twice")));
                    }
                    out.push((day, v));
                }
                Ok(DaysIn(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// Every field any record has; which belong to which kind is checked after.
/// One flat struct (rather than an enum tagged by `kind`) so that integers
/// past i64 (`before` may be one) parse exactly.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Fields {
    kind: String,
    format: Option<String>,
    version: Option<Value>,
    entity: Option<String>,
    action: Option<String>,
    uuid: Option<String>,
    value: Option<i64>,
    before: Option<i128>,
    sum: Option<i64>,
    quantity: Option<i64>,
    before_sum: Option<i128>,
    before_quantity: Option<i128>,
    category: Option<String>,
    first_timestamp: Option<String>,
    recorded_timestamp: Option<String>,
    day: Option<String>,
    days: Option<DaysIn>,
    hours: Option<DaysIn>,
    scope: Option<String>,
    mark: Option<String>,
    state: Option<String>,
    since: Option<String>,
    fingerprint: Option<String>,
    keyed_for: Option<String>,
    published: Option<String>,
    namespace: Option<String>,
    key: Option<String>,
    admin_key_sha256: Option<String>,
    namespace_created: Option<String>,
    enable_reset: Option<bool>,
    update_lowerbound: Option<i64>,
    update_upperbound: Option<i64>,
    created: Option<String>,
}

impl Fields {
    /// Names the first field given that a record of this kind does not have.
    fn only(&self, allowed: &[&str]) -> Result<(), String> {
        let given = [
            ("format", self.format.is_some()),
            ("version", self.version.is_some()),
            ("entity", self.entity.is_some()),
            ("action", self.action.is_some()),
            ("uuid", self.uuid.is_some()),
            ("value", self.value.is_some()),
            ("before", self.before.is_some()),
            ("sum", self.sum.is_some()),
            ("quantity", self.quantity.is_some()),
            ("before_sum", self.before_sum.is_some()),
            ("before_quantity", self.before_quantity.is_some()),
            ("category", self.category.is_some()),
            ("first_timestamp", self.first_timestamp.is_some()),
            ("recorded_timestamp", self.recorded_timestamp.is_some()),
            ("day", self.day.is_some()),
            ("days", self.days.is_some()),
            ("hours", self.hours.is_some()),
            ("scope", self.scope.is_some()),
            ("mark", self.mark.is_some()),
            ("state", self.state.is_some()),
            ("since", self.since.is_some()),
            ("fingerprint", self.fingerprint.is_some()),
            ("keyed_for", self.keyed_for.is_some()),
            ("published", self.published.is_some()),
            ("namespace", self.namespace.is_some()),
            ("key", self.key.is_some()),
            ("admin_key_sha256", self.admin_key_sha256.is_some()),
            ("namespace_created", self.namespace_created.is_some()),
            ("enable_reset", self.enable_reset.is_some()),
            ("update_lowerbound", self.update_lowerbound.is_some()),
            ("update_upperbound", self.update_upperbound.is_some()),
            ("created", self.created.is_some()),
        ];
        match given
            .iter()
            .find(|(name, present)| *present && !allowed.contains(name))
        {
            Some((name, _)) => Err(format!(
                "field `{name}` is not part of a {} record",
                self.kind
            )),
            None => Ok(()),
        }
    }
}

/// A line turned into what a store sets.
#[derive(Debug, PartialEq)]
pub enum Record {
    /// The first line, with the file's version.
    Header(u32),
    /// The secret the file's marks were keyed with, and their tenant.
    ActorSecret(ActorSecret),
    Counter(CounterImport),
    Average(AverageImport),
    Day(DaySet),
    Mark(ActorMark),
    /// A target's publication time, set as an admin's `PUT` sets it
    /// (replacing what is there).
    Published(TargetPublished),
    /// A key made by CountAPI's `create` with its namespace's record, set
    /// as they are (importing sets).
    Countapi(KeyRecord),
    /// A `day` mark of a day past the retention: left out (the store would
    /// delete it, and no event of that day is accepted any more), so that a
    /// file exported yesterday still imports today.
    ExpiredMark,
}

/// What a line is checked against: the clock and the time rules.
#[derive(Clone, Copy, Debug)]
pub struct Rules {
    pub now: DateTime<Utc>,
    pub policy: TimePolicy,
}

impl Rules {
    /// The oldest day the retention keeps.
    pub fn oldest_day(&self) -> i64 {
        day_of(self.policy.oldest_accepted(self.now))
    }

    /// The newest day a bucket may have: the day of now plus the clock
    /// skew events may have (so an export just before midnight, holding
    /// tomorrow's first events, imports at once).
    fn newest_day(&self) -> i64 {
        day_of(self.now + self.policy.max_skew)
    }

    /// The first day whose hours the hourly retention keeps (the hours of
    /// older days are left out of an import: the store would delete them).
    pub fn oldest_hour_day(&self) -> i64 {
        day_of(self.now) - i64::from(self.policy.hourly_retention_days)
    }

    fn latest_ms(&self) -> i64 {
        (self.now + self.policy.max_skew).timestamp_millis()
    }
}

/// Parses one line (without its newline).
pub fn parse(line: &str, rules: &Rules) -> Result<Record, String> {
    if !line.trim_start().starts_with('{') {
        return Err("not a JSON object (one record a line)".into());
    }
    let fields: Fields = serde_json::from_str(line).map_err(|e| {
        let msg = e.to_string();
        if msg.contains("i64") || msg.contains("i128") {
            format!("{msg} (values are signed 64-bit integers)")
        } else {
            msg
        }
    })?;
    match fields.kind.as_str() {
        "header" => header(&fields),
        "counter" => counter(fields, rules).map(Record::Counter),
        "average" => average(fields, rules).map(Record::Average),
        "day" => day(&fields, rules).map(Record::Day),
        "mark" => mark(&fields, rules),
        "actor_secret" => actor_secret(&fields),
        "published" => published(&fields, rules).map(Record::Published),
        "countapi" => countapi(&fields, rules).map(Record::Countapi),
        other => Err(format!(
            "unknown record kind {:?}: expected header, actor_secret, counter, average, day, published, mark or countapi",
            other.chars().take(40).collect::<String>()
        )),
    }
}

fn header(f: &Fields) -> Result<Record, String> {
    f.only(&["format", "version"])?;
    if f.format.as_deref() != Some(FORMAT) {
        return Err(format!(
            "the header's format is {:?}, not {FORMAT:?}",
            f.format.as_deref().unwrap_or("")
        ));
    }
    match f.version.as_ref().and_then(Value::as_u64) {
        Some(v) if READS.iter().any(|&r| u64::from(r) == v) => Ok(Record::Header(v as u32)),
        _ => Err(format!(
            "the header's version is {}; this build reads versions 1 to {VERSION}",
            f.version
                .as_ref()
                .map_or("missing".into(), Value::to_string)
        )),
    }
}

fn actor_secret(f: &Fields) -> Result<Record, String> {
    f.only(&["fingerprint", "keyed_for"])?;
    let fp = f
        .fingerprint
        .as_deref()
        .ok_or("missing field `fingerprint`")?;
    if fp.len() != FINGERPRINT_HEX || !fp.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(format!(
            "fingerprint must be {FINGERPRINT_HEX} lower-case hex digits (as export writes it), not {fp:?}"
        ));
    }
    let keyed_for = match f.keyed_for.as_deref() {
        None => None,
        Some(t) => {
            crate::tenant::validate_tenant(t).map_err(|e| format!("keyed_for: {e}"))?;
            Some(t.to_string())
        }
    };
    Ok(Record::ActorSecret(ActorSecret {
        fingerprint: fp.to_string(),
        keyed_for,
    }))
}

/// A mark: `ever` (no day; `counted`, or `retracting` since a time) or
/// `day` (its day; `counted`). A day past the retention is left out, a day
/// ahead of the clock refused.
fn mark(f: &Fields, rules: &Rules) -> Result<Record, String> {
    f.only(&[
        "entity", "action", "uuid", "scope", "day", "mark", "state", "since",
    ])?;
    let key = key(f)?;
    let raw = f.mark.as_deref().ok_or("missing field `mark`")?;
    let mark = Mark::from_hex(raw).ok_or_else(|| {
        format!("mark must be 32 lower-case hex digits (the keyed hash export writes), not {raw:?}")
    })?;
    let day = match (f.scope.as_deref(), f.day.as_deref()) {
        (Some("ever"), None) => None,
        (Some("ever"), Some(_)) => {
            return Err("field `day` is not part of an `ever` mark (a like is for good)".into())
        }
        (Some("day"), Some(raw)) => {
            let day = parse_day(raw).map_err(|e| format!("day: {e}"))?;
            if day > rules.newest_day() {
                return Err(format!(
                    "day {raw} is in the future (today is {} UTC)",
                    format_day(day_of(rules.now))
                ));
            }
            if day < rules.oldest_day() {
                return Ok(Record::ExpiredMark);
            }
            Some(day)
        }
        (Some("day"), None) => {
            return Err("missing field `day` (a `day` mark is for one day)".into())
        }
        (Some(other), _) => {
            return Err(format!(
                "scope must be \"ever\" (a like) or \"day\" (a view), not {other:?}"
            ))
        }
        (None, _) => return Err("missing field `scope`".into()),
    };
    let state = match (f.state.as_deref(), &f.since) {
        (None | Some("counted"), None) => MarkState::Counted,
        (None | Some("counted"), Some(_)) => {
            return Err("field `since` belongs to a `retracting` mark only".into())
        }
        (Some("retracting"), _) if day.is_some() => {
            return Err("a `day` mark is never `retracting` (a view is not taken back)".into())
        }
        (Some("retracting"), Some(since)) => {
            let ms = DateTime::parse_from_rfc3339(since)
                .map_err(|e| format!("since is not an RFC 3339 timestamp ({e}): {since:?}"))?
                .timestamp_millis();
            if ms > rules.latest_ms() {
                return Err(format!("since {since} is in the future"));
            }
            MarkState::Retracting { since_ms: ms }
        }
        (Some("retracting"), None) => {
            return Err("missing field `since` (when the retraction began)".into())
        }
        (Some(other), _) => {
            return Err(format!(
                "state must be \"counted\" or \"retracting\", not {other:?}"
            ))
        }
    };
    Ok(Record::Mark(ActorMark {
        key,
        mark,
        day,
        state,
    }))
}

/// A target's publication time: RFC 3339 (export writes milliseconds, in
/// UTC), plausible as the gateway judges one (from 2008 on, not ahead of
/// the clock plus the allowed skew). An implausible one, which the gateway
/// never keeps, is refused rather than dropped: the file says to set it.
fn published(f: &Fields, rules: &Rules) -> Result<TargetPublished, String> {
    f.only(&["entity", "uuid", "published"])?;
    let part = |name: &str, v: &Option<String>| -> Result<String, String> {
        let v = v.clone().ok_or_else(|| format!("missing field `{name}`"))?;
        validate_name(name, &v)?;
        Ok(v)
    };
    let entity = part("entity", &f.entity)?;
    let uuid = part("uuid", &f.uuid)?;
    let raw = f
        .published
        .as_deref()
        .ok_or("missing field `published` (an RFC 3339 time)")?;
    match parse_published("published", raw, rules.now, rules.policy.max_skew)? {
        Published::At(at_ms) => Ok(TargetPublished {
            entity,
            uuid,
            at_ms,
        }),
        Published::Implausible(why) => Err(format!(
            "published {raw} is {}: a gateway keeps no such publication time (from 2008-01-01 to its clock plus the allowed skew)",
            why.as_str()
        )),
    }
}

/// A CountAPI key with its namespace's record: names by CountAPI's rule,
/// the digest as export writes it, rules `create` would take, times that
/// are RFC 3339 and not ahead of the clock plus the allowed skew.
fn countapi(f: &Fields, rules: &Rules) -> Result<KeyRecord, String> {
    f.only(&[
        "namespace",
        "key",
        "admin_key_sha256",
        "namespace_created",
        "enable_reset",
        "update_lowerbound",
        "update_upperbound",
        "created",
    ])?;
    let text = |name: &str, v: &Option<String>| -> Result<String, String> {
        v.clone().ok_or_else(|| format!("missing field `{name}`"))
    };
    let namespace = text("namespace", &f.namespace)?;
    let key = text("key", &f.key)?;
    crate::domain::countapi::validate("namespace", &namespace)?;
    crate::domain::countapi::validate("key", &key)?;
    let hex = text("admin_key_sha256", &f.admin_key_sha256)?;
    let digest = crate::domain::from_hex::<32>(&hex).ok_or_else(|| {
        format!(
            "admin_key_sha256 must be 64 hex digits (a SHA-256, as export writes it), not {hex:?}"
        )
    })?;
    let time = |name: &str, v: &Option<String>| -> Result<i64, String> {
        let raw = text(name, v)?;
        let at = DateTime::parse_from_rfc3339(&raw)
            .map_err(|e| format!("{name} {raw:?} is not an RFC 3339 time: {e}"))?
            .timestamp_millis();
        if at > rules.latest_ms() {
            return Err(format!(
                "{name} {raw} is ahead of the clock (plus the allowed skew)"
            ));
        }
        Ok(at)
    };
    let bool_field =
        |name: &str, v: Option<bool>| v.ok_or_else(|| format!("missing field `{name}`"));
    let int_field = |name: &str, v: Option<i64>| v.ok_or_else(|| format!("missing field `{name}`"));
    let key_rules = KeyRules::new(
        bool_field("enable_reset", f.enable_reset)?,
        int_field("update_lowerbound", f.update_lowerbound)?,
        int_field("update_upperbound", f.update_upperbound)?,
    )?;
    Ok(KeyRecord {
        namespace: Namespace {
            name: namespace,
            admin_key_sha256: digest,
            created_ms: time("namespace_created", &f.namespace_created)?,
        },
        key,
        created: CreatedKey {
            rules: key_rules,
            created_ms: time("created", &f.created)?,
        },
    })
}

fn key(f: &Fields) -> Result<CounterKey, String> {
    let part = |name: &str, v: &Option<String>| -> Result<String, String> {
        v.clone().ok_or_else(|| format!("missing field `{name}`"))
    };
    CounterKey::new(
        &part("entity", &f.entity)?,
        &part("action", &f.action)?,
        &part("uuid", &f.uuid)?,
    )
}

fn category(f: &Fields) -> Result<Option<String>, String> {
    if let Some(c) = &f.category {
        validate_name("category", c)?;
    }
    Ok(f.category.clone())
}

/// The timestamps of a record: as given (not ahead of the clock, first not
/// after recorded), else the start of its earliest and latest day (as a
/// backfill touches), else now.
fn timestamps(f: &Fields, days: &[i64], rules: &Rules) -> Result<(i64, i64), String> {
    let parse = |name: &str, raw: &Option<String>| -> Result<Option<i64>, String> {
        let Some(raw) = raw else { return Ok(None) };
        let ms = DateTime::parse_from_rfc3339(raw)
            .map_err(|e| format!("{name} is not an RFC 3339 timestamp ({e}): {raw:?}"))?
            .timestamp_millis();
        if ms > rules.latest_ms() {
            return Err(format!("{name} {raw} is in the future"));
        }
        Ok(Some(ms))
    };
    let first = parse("first_timestamp", &f.first_timestamp)?;
    let recorded = parse("recorded_timestamp", &f.recorded_timestamp)?;
    let touch = |d: i64| d.saturating_mul(86_400_000);
    let now = rules.now.timestamp_millis();
    let first = first.unwrap_or_else(|| days.iter().min().map_or(now, |&d| touch(d)));
    let recorded = recorded.unwrap_or_else(|| days.iter().max().map_or(now, |&d| touch(d)));
    if first > recorded {
        return Err("first_timestamp is after recorded_timestamp".into());
    }
    Ok((first, recorded))
}

/// Values by day.
type Dated<T> = Vec<(i64, T)>;

/// The days of a record, each parsed with `value`; days past the retention
/// are answered apart (they count in `before`), days ahead of the clock
/// are refused.
fn days<T>(
    f: &Fields,
    rules: &Rules,
    value: impl Fn(&Value) -> Option<T>,
    expected: &str,
) -> Result<(Dated<T>, Dated<T>), String> {
    let (mut kept, mut old) = (Vec::new(), Vec::new());
    for (raw, v) in f.days.as_ref().map_or(&[][..], |d| &d.0[..]) {
        let day = parse_day(raw).map_err(|e| format!("days: {e}"))?;
        if day > rules.newest_day() {
            return Err(format!(
                "days: day {raw} is in the future (today is {} UTC)",
                format_day(day_of(rules.now))
            ));
        }
        let v = value(v).ok_or_else(|| format!("days.{raw}: expected {expected}"))?;
        if day < rules.oldest_day() {
            old.push((day, v));
        } else {
            kept.push((day, v));
        }
    }
    kept.sort_by_key(|(d, _)| *d);
    Ok((kept, old))
}

/// `before` as given or derived from `total`, checked against `total`
/// when both are given; `field`/`total_field` name them in errors.
fn before(
    given: Option<i128>,
    total: Option<i64>,
    listed: i128,
    field: &str,
    total_field: &str,
) -> Result<i128, String> {
    match (given, total) {
        (Some(b), Some(t)) if b + listed != i128::from(t) => Err(format!(
            "{total_field} {t} is not {field} ({b}) plus the sum of the days ({listed}): correct one, or leave {total_field} out"
        )),
        (Some(b), _) => Ok(b),
        (None, Some(t)) => Ok(i128::from(t) - listed),
        (None, None) => Err(format!(
            "missing field `{total_field}` (or `{field}`)"
        )),
    }
}

fn counter(f: Fields, rules: &Rules) -> Result<CounterImport, String> {
    f.only(&[
        "entity",
        "action",
        "uuid",
        "value",
        "before",
        "category",
        "first_timestamp",
        "recorded_timestamp",
        "days",
        "hours",
    ])?;
    let key = key(&f)?;
    let category = category(&f)?;
    let (kept, old) = days(&f, rules, Value::as_i64, "a signed 64-bit integer")?;
    let hours = hours(&f, &kept, &old, rules)?;
    let sum = |d: &[(i64, i64)]| d.iter().map(|(_, v)| i128::from(*v)).sum::<i128>();
    let all = sum(&kept) + sum(&old);
    let before = before(f.before, f.value, all, "before", "value")?;
    let touched: Vec<i64> = kept.iter().chain(&old).map(|(d, _)| *d).collect();
    let (first_ms, recorded_ms) = timestamps(&f, &touched, rules)?;
    Ok(CounterImport {
        key,
        // Days past the retention would be deleted: they count in `before`.
        before: before + sum(&old),
        days: kept
            .into_iter()
            .map(|(day, value)| Bucket { day, value })
            .collect(),
        category,
        first_ms,
        recorded_ms,
        hours,
    })
}

/// The hours of a counter record, when it has them: each of a day the
/// record lists, values signed 64-bit; those of days before the hourly
/// retention are left out.
fn hours(
    f: &Fields,
    kept: &[(i64, i64)],
    old: &[(i64, i64)],
    rules: &Rules,
) -> Result<Option<ImportHours>, String> {
    let Some(raw) = &f.hours else {
        return Ok(None);
    };
    let from_day = rules.oldest_hour_day();
    let listed: HashSet<i64> = kept.iter().chain(old).map(|(d, _)| *d).collect();
    let mut buckets = Vec::new();
    for (key, v) in &raw.0 {
        let hour = parse_hour_key(key).map_err(|e| format!("hours: {e}"))?;
        let day = hour.div_euclid(24);
        if !listed.contains(&day) {
            return Err(format!(
                "hours: hour {key} lies in day {}, which `days` does not list (a day's hours sum into its day bucket)",
                format_day(day)
            ));
        }
        let value = v
            .as_i64()
            .ok_or_else(|| format!("hours.{key}: expected a signed 64-bit integer"))?;
        if day >= from_day {
            buckets.push(HourBucket { hour, value });
        }
    }
    buckets.sort_by_key(|h| h.hour);
    Ok(Some(ImportHours { from_day, buckets }))
}

fn average(f: Fields, rules: &Rules) -> Result<AverageImport, String> {
    f.only(&[
        "entity",
        "action",
        "uuid",
        "sum",
        "quantity",
        "before_sum",
        "before_quantity",
        "category",
        "first_timestamp",
        "recorded_timestamp",
        "days",
    ])?;
    let key = key(&f)?;
    let category = category(&f)?;
    let pair = |v: &Value| -> Option<(i64, i64)> {
        let o = v.as_object()?;
        if o.len() != 2 {
            return None;
        }
        Some((o.get("sum")?.as_i64()?, o.get("quantity")?.as_i64()?))
    };
    let (kept, old) = days(
        &f,
        rules,
        pair,
        "{\"sum\": n, \"quantity\": n} of signed 64-bit integers",
    )?;
    let sums = |d: &[(i64, (i64, i64))]| {
        d.iter().fold((0i128, 0i128), |(s, q), (_, (a, b))| {
            (s + i128::from(*a), q + i128::from(*b))
        })
    };
    let (ks, kq) = sums(&kept);
    let (os, oq) = sums(&old);
    let before_sum = before(f.before_sum, f.sum, ks + os, "before_sum", "sum")?;
    let before_quantity = before(
        f.before_quantity,
        f.quantity,
        kq + oq,
        "before_quantity",
        "quantity",
    )?;
    let touched: Vec<i64> = kept.iter().chain(&old).map(|(d, _)| *d).collect();
    let (first_ms, recorded_ms) = timestamps(&f, &touched, rules)?;
    Ok(AverageImport {
        key,
        before_sum: before_sum + os,
        before_quantity: before_quantity + oq,
        days: kept
            .into_iter()
            .map(|(day, (sum, quantity))| AverageBucket { day, sum, quantity })
            .collect(),
        category,
        first_ms,
        recorded_ms,
    })
}

/// A day record: a backfill's set, validated exactly as `PUT .../days/{day}`.
fn day(f: &Fields, rules: &Rules) -> Result<DaySet, String> {
    f.only(&["entity", "action", "uuid", "day", "value", "category"])?;
    let need = |name: &str, v: &Option<String>| -> Result<String, String> {
        v.clone().ok_or_else(|| format!("missing field `{name}`"))
    };
    let (entity, action, uuid) = (
        need("entity", &f.entity)?,
        need("action", &f.action)?,
        need("uuid", &f.uuid)?,
    );
    let day = need("day", &f.day)?;
    let spec = DaySetSpec {
        entity: &entity,
        action: &action,
        uuid: &uuid,
        day: &day,
        value: f.value.ok_or("missing field `value`")?,
        category: f.category.as_deref(),
    };
    DaySet::from_spec_in(&spec, &rules.policy, rules.now, &mut Interner::default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Counter;
    use serde_json::json;

    fn rules() -> Rules {
        Rules {
            now: "2028-02-29T12:00:00Z".parse().unwrap(),
            policy: TimePolicy::default(),
        }
    }

    fn today() -> i64 {
        day_of(rules().now)
    }

    fn history() -> CounterHistory {
        CounterHistory {
            counter: Counter {
                key: CounterKey::new("ARTICLE", "VIEW", "a_1").unwrap(),
                value: 130,
                category: Some("news".into()),
                first_ms: (today() - 500) * 86_400_000,
                recorded_ms: today() * 86_400_000 + 5,
            },
            days: vec![
                Bucket {
                    day: today() - 3,
                    value: 120,
                },
                Bucket {
                    day: today(),
                    value: 8,
                },
            ],
            hours: vec![
                HourBucket {
                    hour: today() * 24 + 9,
                    value: 5,
                },
                HourBucket {
                    hour: today() * 24 + 11,
                    value: 2,
                },
            ],
        }
    }

    #[test]
    fn a_written_counter_reads_back_as_what_wrote_it() {
        let line = counter_line(&history());
        assert!(line.ends_with('\n') && !line[..line.len() - 1].contains('\n'));
        assert!(
            line.starts_with(r#"{"kind":"counter","entity":"ARTICLE","action":"VIEW","uuid":"a_1","value":130,"before":2,"category":"news""#),
            "{line}"
        );
        let Record::Counter(c) = parse(line.trim_end(), &rules()).unwrap() else {
            panic!("not a counter")
        };
        let h = history();
        assert_eq!(c.key, h.counter.key);
        assert_eq!(c.before, 2);
        assert_eq!(c.days, h.days);
        assert_eq!(
            (c.first_ms, c.recorded_ms),
            (h.counter.first_ms, h.counter.recorded_ms)
        );
        assert_eq!(c.category.as_deref(), Some("news"));
        assert_eq!(
            c.hours,
            Some(ImportHours {
                from_day: today() - 14,
                buckets: h.hours.clone(),
            })
        );
        assert!(
            line.ends_with(
                r#""hours":{"2028-02-29T09":5,"2028-02-29T11":2}}
"#
            ),
            "{line}"
        );
        assert_eq!(
            header_line(),
            "{\"kind\":\"header\",\"format\":\"counter-gateway\",\"version\":5}\n"
        );
        assert_eq!(
            parse(header_line().trim_end(), &rules()),
            Ok(Record::Header(5))
        );
        // Version 4 files (no hours) are read as they were.
        assert_eq!(
            parse(
                r#"{"kind":"header","format":"counter-gateway","version":4}"#,
                &rules()
            ),
            Ok(Record::Header(4))
        );
        // Version 2 files (no publication times) are read as they were.
        assert_eq!(
            parse(
                r#"{"kind":"header","format":"counter-gateway","version":2}"#,
                &rules()
            ),
            Ok(Record::Header(2))
        );
        // Version 1 files (no marks) are read as they were.
        assert_eq!(
            parse(
                r#"{"kind":"header","format":"counter-gateway","version":1}"#,
                &rules()
            ),
            Ok(Record::Header(1))
        );
    }

    #[test]
    fn before_is_given_or_derived_and_checked_against_value() {
        let day = format_day(today() - 1);
        let rec = |extra: &str| {
            format!(
                r#"{{"kind":"counter","entity":"E","action":"A","uuid":"u","days":{{"{day}":10}}{extra}}}"#
            )
        };
        let get = |extra: &str| match parse(&rec(extra), &rules()) {
            Ok(Record::Counter(c)) => Ok(c.before),
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e),
        };
        assert_eq!(get(r#","value":15"#), Ok(5));
        assert_eq!(get(r#","before":-3"#), Ok(-3));
        assert_eq!(get(r#","before":5,"value":15"#), Ok(5));
        let e = get(r#","before":5,"value":16"#).unwrap_err();
        assert!(e.contains("value 16") && e.contains("before (5)"), "{e}");
        assert!(get("").unwrap_err().contains("`value`"));
        // Past i64 the value is refused, `before` is not (days may sum past it).
        let e = get(r#","value":9223372036854775808"#).unwrap_err();
        assert!(e.contains("64-bit"), "{e}");
        assert_eq!(
            get(r#","before":-9223372036854775809"#),
            Ok(-9_223_372_036_854_775_809)
        );
    }

    #[test]
    fn days_past_the_retention_count_in_before_and_future_days_are_refused() {
        let old = format_day(today() - 401);
        let kept = format_day(today() - 400);
        let line = format!(
            r#"{{"kind":"counter","entity":"E","action":"A","uuid":"u","value":10,"days":{{"{old}":4,"{kept}":5}}}}"#
        );
        let Ok(Record::Counter(c)) = parse(&line, &rules()) else {
            panic!("{line}")
        };
        assert_eq!(c.before, 5);
        assert_eq!(
            c.days,
            vec![Bucket {
                day: today() - 400,
                value: 5
            }]
        );
        // Without timestamps: the starts of the earliest and latest day.
        assert_eq!(c.first_ms, (today() - 401) * 86_400_000);
        assert_eq!(c.recorded_ms, (today() - 400) * 86_400_000);
        let future = format_day(today() + 1);
        let line = format!(
            r#"{{"kind":"counter","entity":"E","action":"A","uuid":"u","value":1,"days":{{"{future}":1}}}}"#
        );
        assert!(parse(&line, &rules()).unwrap_err().contains("future"));
    }

    #[test]
    fn bad_lines_say_why() {
        let today = format_day(today());
        for (line, why) in [
            ("{", "EOF"),
            ("[]", "not a JSON object"),
            (r#"{"kind":"counters"}"#, "unknown record kind"),
            (
                r#"{"kind":"counter","entity":"E","action":"A","uuid":"u","vlaue":1}"#,
                "unknown field `vlaue`",
            ),
            (
                r#"{"kind":"counter","entity":"E","action":"A","uuid":"u","value":1,"sum":1}"#,
                "field `sum` is not part of a counter record",
            ),
            (
                r#"{"kind":"counter","entity":"","action":"A","uuid":"u","value":1}"#,
                "entity must not be empty",
            ),
            (
                r#"{"kind":"counter","entity":"E","action":"A","uuid":"u","value":1.5}"#,
                "floating point",
            ),
            (
                r#"{"kind":"counter","entity":"E","action":"A","uuid":"u","value":1,"days":{"2028-2-1":1}}"#,
                "YYYY-MM-DD",
            ),
            (
                r#"{"kind":"counter","entity":"E","action":"A","uuid":"u","value":1,"first_timestamp":"2028-02-29T11:00:00Z","recorded_timestamp":"2028-02-28T00:00:00Z"}"#,
                "after recorded",
            ),
            (
                r#"{"kind":"average","entity":"E","action":"A","uuid":"u","sum":1,"quantity":1,"days":{"2028-02-29":{"sum":1}}}"#,
                "quantity",
            ),
            (
                r#"{"kind":"header","format":"counter-gateway","version":6}"#,
                "versions 1 to 5",
            ),
            (
                r#"{"kind":"day","entity":"E","action":"A","uuid":"u","day":"2026-01-01","value":1}"#,
                "retention",
            ),
        ] {
            let e = parse(line, &rules()).unwrap_err();
            assert!(e.contains(why), "{line}: {e}");
        }
        let twice = format!(
            r#"{{"kind":"counter","entity":"E","action":"A","uuid":"u","value":1,"days":{{"{today}":1,"{today}":1}}}}"#
        );
        assert!(parse(&twice, &rules()).unwrap_err().contains("named twice"));
    }

    #[test]
    fn a_counters_hours_are_written_whatever_the_order_of_its_days() {
        let mut h = history();
        h.days.reverse();
        h.hours.push(HourBucket {
            hour: (today() - 1) * 24,
            value: 4,
        });
        let line = counter_line(&h);
        // Those of a listed day, in hour order; none of a day not listed.
        assert!(
            line.ends_with(
                r#""hours":{"2028-02-29T09":5,"2028-02-29T11":2}}
"#
            ),
            "{line}"
        );
    }

    #[test]
    fn hours_are_given_or_unknown_and_bad_ones_say_why() {
        let (d1, d2) = (format_day(today() - 20), format_day(today()));
        let rec = |hours: &str| {
            format!(
                r#"{{"kind":"counter","entity":"E","action":"A","uuid":"u","value":30,"days":{{"{d1}":10,"{d2}":20}}{hours}}}"#
            )
        };
        let get = |hours: &str| match parse(&rec(hours), &rules()) {
            Ok(Record::Counter(c)) => Ok(c.hours),
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e),
        };
        // A record of version 4 or older: hours unknown.
        assert_eq!(get(""), Ok(None));
        // Given: in hour order; those of a day before the hourly retention
        // (14 days) left out, its day still set.
        assert_eq!(
            get(&format!(
                r#","hours":{{"{d2}T23":4,"{d1}T05":10,"{d2}T00":16}}"#
            )),
            Ok(Some(ImportHours {
                from_day: today() - 14,
                buckets: vec![
                    HourBucket {
                        hour: today() * 24,
                        value: 16
                    },
                    HourBucket {
                        hour: today() * 24 + 23,
                        value: 4
                    },
                ],
            }))
        );
        assert_eq!(
            get(r#","hours":{}"#).unwrap().unwrap().buckets,
            Vec::<HourBucket>::new()
        );
        let other = format_day(today() - 1);
        for (hours, why) in [
            (format!(r#","hours":{{"{other}T05":1}}"#), "does not list"),
            (format!(r#","hours":{{"{d2}T24":1}}"#), "YYYY-MM-DDTHH"),
            (format!(r#","hours":{{"{d2}T5":1}}"#), "YYYY-MM-DDTHH"),
            (format!(r#","hours":{{"{d2}":1}}"#), "YYYY-MM-DDTHH"),
            (format!(r#","hours":{{"{d2}T05":1.5}}"#), "64-bit"),
            (
                format!(r#","hours":{{"{d2}T05":1,"{d2}T05":2}}"#),
                "named twice",
            ),
            (r#","hours":[1]"#.to_string(), "an object"),
        ] {
            let e = get(&hours).unwrap_err();
            assert!(e.contains(why), "{hours}: {e}");
        }
        // Hours belong to counters only.
        let e = parse(
            &format!(
                r#"{{"kind":"average","entity":"E","action":"A","uuid":"u","sum":1,"quantity":1,"hours":{{"{d2}T05":1}}}}"#
            ),
            &rules(),
        )
        .unwrap_err();
        assert!(
            e.contains("field `hours` is not part of a average record"),
            "{e}"
        );
    }

    #[test]
    fn an_average_round_trips() {
        let a = AverageHistory {
            key: CounterKey::new("ARTICLE", "rating", "a1").unwrap(),
            sum: 40,
            quantity: 10,
            category: None,
            first_ms: 1,
            recorded_ms: today() * 86_400_000,
            days: vec![AverageBucket {
                day: today(),
                sum: 9,
                quantity: 2,
            }],
        };
        let line = average_line(&a);
        assert!(
            line.contains(r#""days":{"2028-02-29":{"sum":9,"quantity":2}}"#),
            "{line}"
        );
        let Ok(Record::Average(i)) = parse(line.trim_end(), &rules()) else {
            panic!("{line}")
        };
        assert_eq!((i.before_sum, i.before_quantity), (31, 8));
        assert_eq!(i.days, a.days);
    }

    #[test]
    fn a_publication_time_round_trips_and_bad_ones_say_why() {
        let p = TargetPublished {
            entity: "ARTICLE".into(),
            uuid: "ü \"1\"".into(),
            at_ms: today() * 86_400_000 - 1,
        };
        let line = published_line(&p);
        assert_eq!(
            line,
            "{\"kind\":\"published\",\"entity\":\"ARTICLE\",\"uuid\":\"ü \\\"1\\\"\",\"published\":\"2028-02-28T23:59:59.999Z\"}\n"
        );
        assert_eq!(parse(line.trim_end(), &rules()), Ok(Record::Published(p)));
        // Any RFC 3339 offset, read as the instant it names.
        assert!(matches!(
            parse(
                r#"{"kind":"published","entity":"A","uuid":"u","published":"2028-02-29T13:00:00+01:00"}"#,
                &rules()
            ),
            Ok(Record::Published(TargetPublished { at_ms, .. })) if at_ms == today() * 86_400_000 + 12 * 3_600_000
        ));
        for (rest, why) in [
            (
                r#""uuid":"u","published":"2026-01-01T00:00:00Z""#,
                "missing field `entity`",
            ),
            (r#""entity":"A","uuid":"u""#, "missing field `published`"),
            (
                r#""entity":"A","uuid":"","published":"2026-01-01T00:00:00Z""#,
                "uuid must not be empty",
            ),
            (
                r#""entity":"A","uuid":"u","published":"2026-01-01""#,
                "not an RFC 3339",
            ),
            (
                r#""entity":"A","uuid":"u","published":"2007-12-31T23:59:59Z""#,
                "before 2008-01-01",
            ),
            (
                r#""entity":"A","uuid":"u","published":"2028-02-29T12:05:01Z""#,
                "in the future",
            ),
            (
                r#""entity":"A","uuid":"u","published":null"#,
                "missing field `published`",
            ),
            (
                r#""entity":"A","action":"VIEW","uuid":"u","published":"2026-01-01T00:00:00Z""#,
                "field `action` is not part of a published record",
            ),
        ] {
            let line = format!(r#"{{"kind":"published",{rest}}}"#);
            let e = parse(&line, &rules()).unwrap_err();
            assert!(e.contains(why), "{line}: {e}");
        }
        // The clock's skew is allowed, as for an event.
        assert!(parse(
            r#"{"kind":"published","entity":"A","uuid":"u","published":"2028-02-29T12:05:00Z"}"#,
            &rules()
        )
        .is_ok());
    }

    fn mark_rec(extra: &str) -> String {
        format!(
            r#"{{"kind":"mark","entity":"ARTICLE","action":"like","uuid":"a1","mark":"00112233445566778899aabbccddeeff"{extra}}}"#
        )
    }

    #[test]
    fn marks_round_trip_in_each_scope_and_state() {
        let key = CounterKey::new("ARTICLE", "like", "a_1").unwrap();
        let m = Mark::from_hex("00112233445566778899aabbccddeeff").unwrap();
        for (day, state) in [
            (None, MarkState::Counted),
            (
                None,
                MarkState::Retracting {
                    since_ms: today() * 86_400_000 + 1_234,
                },
            ),
            (Some(today() - 400), MarkState::Counted),
            (Some(today()), MarkState::Counted),
        ] {
            let mark = ActorMark {
                key: key.clone(),
                mark: m,
                day,
                state,
            };
            let line = mark_line(&mark);
            assert!(line.ends_with('\n'));
            assert_eq!(
                parse(line.trim_end(), &rules()),
                Ok(Record::Mark(mark)),
                "{line}"
            );
        }
        let like = mark_line(&ActorMark {
            key: key.clone(),
            mark: m,
            day: None,
            state: MarkState::Counted,
        });
        assert_eq!(
            like,
            "{\"kind\":\"mark\",\"entity\":\"ARTICLE\",\"action\":\"like\",\"uuid\":\"a_1\",\"scope\":\"ever\",\"mark\":\"00112233445566778899aabbccddeeff\",\"state\":\"counted\"}\n"
        );
        // `state` may be left out: counted.
        assert!(matches!(
            parse(&mark_rec(r#","scope":"ever""#), &rules()),
            Ok(Record::Mark(ActorMark {
                state: MarkState::Counted,
                day: None,
                ..
            }))
        ));
        for keyed_for in [None, Some("acme")] {
            let fp = actor_secret_line("0123456789abcdef", keyed_for);
            assert_eq!(
                parse(fp.trim_end(), &rules()),
                Ok(Record::ActorSecret(ActorSecret {
                    fingerprint: "0123456789abcdef".into(),
                    keyed_for: keyed_for.map(str::to_string),
                }))
            );
        }
        let bad = r#"{"kind":"actor_secret","fingerprint":"0123456789abcdef","keyed_for":"No Such/Tenant"}"#;
        assert!(parse(bad, &rules()).unwrap_err().starts_with("keyed_for"));
    }

    #[test]
    fn a_mark_past_the_retention_is_left_out_and_bad_marks_say_why() {
        let old = format_day(today() - 401);
        assert_eq!(
            parse(
                &mark_rec(&format!(r#","scope":"day","day":"{old}""#)),
                &rules()
            ),
            Ok(Record::ExpiredMark)
        );
        let tomorrow = format_day(today() + 1);
        let kept = format_day(today() - 400);
        for (extra, why) in [
            (
                r#","scope":"ever","day":"2028-02-29""#,
                "not part of an `ever` mark",
            ),
            (r#","scope":"day""#, "missing field `day`"),
            (r#","scope":"week""#, "scope must be"),
            ("", "missing field `scope`"),
            (
                &format!(r#","scope":"day","day":"{tomorrow}""#),
                "in the future",
            ),
            (
                &format!(
                    r#","scope":"day","day":"{kept}","state":"retracting","since":"2028-02-29T00:00:00Z""#
                ),
                "never `retracting`",
            ),
            (
                r#","scope":"ever","state":"retracting""#,
                "missing field `since`",
            ),
            (
                r#","scope":"ever","since":"2028-02-29T00:00:00Z""#,
                "`retracting` mark only",
            ),
            (r#","scope":"ever","state":"liked""#, "state must be"),
            (
                r#","scope":"ever","value":1"#,
                "field `value` is not part of a mark record",
            ),
        ] {
            let e = parse(&mark_rec(extra), &rules()).unwrap_err();
            assert!(e.contains(why), "{extra}: {e}");
        }
        let e = parse(
            r#"{"kind":"mark","entity":"A","action":"like","uuid":"a1","scope":"ever","mark":"00112233445566778899AABBCCDDEEFF"}"#,
            &rules(),
        )
        .unwrap_err();
        assert!(e.contains("32 lower-case hex"), "{e}");
        for bad in ["0123", "0123456789ABCDEF", "0123456789abcdeg"] {
            let e = parse(
                &format!(r#"{{"kind":"actor_secret","fingerprint":"{bad}"}}"#),
                &rules(),
            )
            .unwrap_err();
            assert!(e.contains("16 lower-case hex"), "{e}");
        }
    }

    #[test]
    fn a_countapi_record_round_trips_and_bad_ones_are_named() {
        let r = KeyRecord {
            namespace: Namespace {
                name: "site.com".into(),
                admin_key_sha256: [0xab; 32],
                created_ms: (today() - 3) * 86_400_000 + 17,
            },
            key: "visits".into(),
            created: CreatedKey {
                rules: KeyRules::new(true, -2, 5).unwrap(),
                created_ms: today() * 86_400_000,
            },
        };
        let line = countapi_line(&r);
        assert!(line.contains(&"ab".repeat(32)), "{line}");
        assert_eq!(parse(line.trim_end(), &rules()), Ok(Record::Countapi(r)));
        let good: Value = serde_json::from_str(&line).unwrap();
        for (field, value, says) in [
            ("namespace", json!("ab"), "3 to 64 characters"),
            ("key", json!("a/b/c"), "may hold only"),
            ("admin_key_sha256", json!("AB".repeat(32)), "64 hex digits"),
            ("admin_key_sha256", json!("ab".repeat(31)), "64 hex digits"),
            ("update_lowerbound", json!(1), "update_lowerbound"),
            ("update_upperbound", json!(-1), "update_upperbound"),
            ("created", json!("yesterday"), "not an RFC 3339 time"),
            (
                "namespace_created",
                json!("2028-03-02T00:00:00Z"),
                "ahead of the clock",
            ),
            ("enable_reset", json!(null), "missing field `enable_reset`"),
            (
                "value",
                json!(3),
                "field `value` is not part of a countapi record",
            ),
        ] {
            let mut bad = good.clone();
            bad[field] = value;
            let e = parse(&bad.to_string(), &rules()).unwrap_err();
            assert!(e.contains(says), "{field}: {e}");
        }
    }
}
