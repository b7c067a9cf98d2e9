//! One validated increment: the unit the write pipeline carries.

use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::{day_of, CounterKey, Interner, Part, TimePolicy};

/// Longest accepted idempotency id, in bytes.
pub const MAX_EVENT_ID_BYTES: usize = 256;

/// An increment as a client described it, before validation. HTTP bodies
/// (single calls and batches) are mapped onto this one shape so that both are
/// validated by the same code.
#[derive(Debug, Default)]
pub struct IncrementSpec<'a> {
    pub entity: &'a str,
    pub action: &'a str,
    pub uuid: &'a str,
    pub count: Option<i64>,
    /// `true` for `/decrement`: the count is subtracted.
    pub negate: bool,
    pub category: Option<&'a str>,
    pub timestamp: Option<&'a str>,
    pub id: Option<&'a str>,
}

/// A validated increment, ready to be coalesced.
#[derive(Clone, Debug)]
pub struct Increment {
    pub key: CounterKey,
    pub delta: i64,
    pub category: Option<Arc<str>>,
    /// When the event happened, in milliseconds since the epoch.
    pub ts_ms: i64,
    /// The UTC day bucket it lands in.
    pub day: i64,
    /// Idempotency id: a second event with the same id is counted once.
    pub id: Option<Arc<str>>,
    /// What `delta` adds to: a counter's value, or an average's sum.
    pub kind: Kind,
}

/// What an increment adds to. Averages ride the same pipeline as counters
/// (same queue, coalescing and group commit) but land in their own table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A counter: `delta` is added to its value.
    Counter,
    /// An average counter: `delta` is added to its sum and `quantity` (1 for
    /// a sample, -1 for a retraction) to its number of samples.
    Sample { quantity: i8 },
}

impl Increment {
    /// Validates a spec; the error names the field at fault.
    pub fn from_spec(
        spec: &IncrementSpec<'_>,
        policy: &TimePolicy,
        now: DateTime<Utc>,
    ) -> Result<Self, String> {
        Self::from_spec_in(spec, policy, now, &mut Interner::default())
    }

    /// [`Increment::from_spec`] for one event of a batch: its names are
    /// shared with the batch's other events through `names`.
    pub fn from_spec_in<'a>(
        spec: &IncrementSpec<'a>,
        policy: &TimePolicy,
        now: DateTime<Utc>,
        names: &mut Interner<'a>,
    ) -> Result<Self, String> {
        let key = CounterKey::new_in(spec.entity, spec.action, spec.uuid, names)?;
        let count = spec.count.unwrap_or(1);
        let delta = if spec.negate {
            count.checked_neg().ok_or_else(|| {
                format!("count {count} cannot be negated within a signed 64-bit integer")
            })?
        } else {
            count
        };
        let category = match spec.category {
            Some(c) => Some(names.name(Part::Category, c)?.0),
            None => None,
        };
        let ts = match spec.timestamp {
            Some(raw) => policy.accept("timestamp", raw, now)?,
            None => now,
        };
        let id = match spec.id {
            Some("") => return Err("id must not be empty".into()),
            Some(id) if id.len() > MAX_EVENT_ID_BYTES => {
                return Err(format!(
                    "id is {} bytes, over the limit of {MAX_EVENT_ID_BYTES}",
                    id.len()
                ))
            }
            Some(id) if id.chars().any(char::is_control) => {
                return Err("id contains a control character".into())
            }
            Some(id) => Some(Arc::from(id)),
            None => None,
        };
        Ok(Increment {
            key,
            delta,
            category,
            ts_ms: ts.timestamp_millis(),
            day: day_of(ts),
            id,
            kind: Kind::Counter,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec<'a>() -> IncrementSpec<'a> {
        IncrementSpec {
            entity: "VIDEO",
            action: "VIEW",
            uuid: "u1",
            ..Default::default()
        }
    }

    #[test]
    fn defaults_to_one_now() {
        let now = Utc::now();
        let inc = Increment::from_spec(&spec(), &TimePolicy::default(), now).unwrap();
        assert_eq!(inc.delta, 1);
        assert_eq!(inc.ts_ms, now.timestamp_millis());
        assert_eq!(inc.day, day_of(now));
    }

    #[test]
    fn decrement_negates_and_refuses_min() {
        let p = TimePolicy::default();
        let inc = Increment::from_spec(
            &IncrementSpec {
                count: Some(5),
                negate: true,
                ..spec()
            },
            &p,
            Utc::now(),
        )
        .unwrap();
        assert_eq!(inc.delta, -5);
        let err = Increment::from_spec(
            &IncrementSpec {
                count: Some(i64::MIN),
                negate: true,
                ..spec()
            },
            &p,
            Utc::now(),
        )
        .unwrap_err();
        assert!(err.contains("negated"));
    }

    #[test]
    fn fields_are_named_in_errors() {
        let p = TimePolicy::default();
        let now = Utc::now();
        let bad = |s: IncrementSpec| Increment::from_spec(&s, &p, now).unwrap_err();
        assert!(bad(IncrementSpec { uuid: "", ..spec() }).starts_with("uuid"));
        assert!(bad(IncrementSpec {
            category: Some("\n"),
            ..spec()
        })
        .starts_with("category"));
        assert!(bad(IncrementSpec {
            timestamp: Some("2999-01-01T00:00:00Z"),
            ..spec()
        })
        .starts_with("timestamp"));
        assert!(bad(IncrementSpec {
            id: Some(""),
            ..spec()
        })
        .starts_with("id"));
    }
}
