//! One validated increment: the unit the write pipeline carries.

use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::actor::{validate_actor, ActorKey, Scope, Unique};
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
    /// Who the event is from (limits per actor; with `unique`, counted once).
    pub actor: Option<&'a str>,
    /// `"ever"` or `"day"`: count once per actor (see [`Scope`]).
    pub unique: Option<&'a str>,
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
    /// Count only if the actor's mark allows (once per actor); the store
    /// decides, in the flush that applies it.
    pub unique: Option<Unique>,
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
        Self::from_event(spec, policy, now, names, &ActorKey::none())
    }

    /// [`Increment::from_spec_in`] with the gateway's actor secret, which
    /// turns `actor` and `unique` into the mark the store checks: the raw
    /// actor goes no further than this.
    pub fn from_event<'a>(
        spec: &IncrementSpec<'a>,
        policy: &TimePolicy,
        now: DateTime<Utc>,
        names: &mut Interner<'a>,
        actors: &ActorKey,
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
        if let Some(actor) = spec.actor {
            validate_actor(actor)?;
        }
        let unique = match (spec.unique, spec.actor) {
            (None, _) => None,
            (Some(raw), actor) => {
                let scope = Scope::parse(raw)?;
                let actor = actor.ok_or_else(|| {
                    format!("unique needs an actor: whom to count once (unique is {raw:?})")
                })?;
                match (scope, delta) {
                    (Scope::Ever, 1 | -1) | (Scope::Day, 1) => {}
                    (Scope::Day, -1) => {
                        return Err("unique \"day\" counts a view once per actor and day, which is not taken back: a decrement with it is refused".into())
                    }
                    _ => {
                        return Err(format!(
                            "count must be 1 with unique (an actor counts once; a decrement of 1 takes it back), not {count}"
                        ))
                    }
                }
                if let Some(raw) = spec.timestamp {
                    policy.accept_unique("timestamp", raw, ts, now)?;
                }
                let mark = actors.mark(&key, actor).ok_or_else(|| {
                    "unique: this gateway has no actor secret, so it cannot count once per actor; start it with --actor-secret (COUNTER_GATEWAY_ACTOR_SECRET), the same on every gateway sharing a store".to_string()
                })?;
                Some(Unique { scope, mark })
            }
        };
        Ok(Increment {
            key,
            delta,
            category,
            ts_ms: ts.timestamp_millis(),
            day: day_of(ts),
            id,
            kind: Kind::Counter,
            unique,
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

    #[test]
    fn unique_needs_an_actor_a_secret_and_a_count_of_one() {
        let p = TimePolicy::default();
        let now = Utc::now();
        let secret = ActorKey::new(b"0123456789abcdef").unwrap();
        let check = |s: IncrementSpec, key: &ActorKey| {
            Increment::from_event(&s, &p, now, &mut Interner::default(), key)
        };
        let like = IncrementSpec {
            actor: Some("alice"),
            unique: Some("ever"),
            ..spec()
        };
        let inc = check(like, &secret).unwrap();
        let u = inc.unique.unwrap();
        assert_eq!(u.scope, Scope::Ever);
        assert_eq!(Some(u.mark), secret.mark(&inc.key, "alice"));
        // An unlike: a decrement of one.
        let unlike = IncrementSpec {
            actor: Some("alice"),
            unique: Some("ever"),
            negate: true,
            ..spec()
        };
        assert_eq!(check(unlike, &secret).unwrap().delta, -1);
        let err = |s: IncrementSpec| check(s, &secret).unwrap_err();
        assert!(err(IncrementSpec {
            unique: Some("ever"),
            ..spec()
        })
        .starts_with("unique needs an actor"));
        assert!(err(IncrementSpec {
            actor: Some("a"),
            unique: Some("week"),
            ..spec()
        })
        .starts_with("unique must be"));
        assert!(err(IncrementSpec {
            actor: Some("a"),
            unique: Some("ever"),
            count: Some(5),
            ..spec()
        })
        .starts_with("count must be 1"));
        assert!(err(IncrementSpec {
            actor: Some("a"),
            unique: Some("day"),
            negate: true,
            ..spec()
        })
        .contains("decrement"));
        assert!(err(IncrementSpec {
            actor: Some("a\n"),
            ..spec()
        })
        .starts_with("actor"));
        let no_secret = check(
            IncrementSpec {
                actor: Some("a"),
                unique: Some("day"),
                ..spec()
            },
            &ActorKey::none(),
        )
        .unwrap_err();
        assert!(no_secret.contains("--actor-secret"), "{no_secret}");
        // An actor alone (for limits) needs no secret and marks nothing.
        let plain = check(
            IncrementSpec {
                actor: Some("a"),
                ..spec()
            },
            &ActorKey::none(),
        )
        .unwrap();
        assert!(plain.unique.is_none());
    }
}
