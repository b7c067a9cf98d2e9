//! Samples of average counters (ratings): validated into the same
//! [`Increment`] the pipeline carries for counters, with a [`Kind::Sample`].

use chrono::{DateTime, Utc};

use super::{Increment, IncrementSpec, Kind, TimePolicy};

/// A sample as a client described it: a value to add (or, with `retract`,
/// to take back) to the sum of `(entity, action, uuid)`.
#[derive(Debug, Default)]
pub struct SampleSpec<'a> {
    pub entity: &'a str,
    pub action: &'a str,
    pub uuid: &'a str,
    pub value: i64,
    /// Takes back one earlier sample of `value`: sum -= value, quantity -= 1.
    pub retract: bool,
    pub category: Option<&'a str>,
    pub timestamp: Option<&'a str>,
    pub id: Option<&'a str>,
}

impl Increment {
    /// Validates a sample exactly as a counter increment (names, category,
    /// timestamp, id), then marks it as one sample of an average.
    pub fn sample(
        spec: &SampleSpec<'_>,
        policy: &TimePolicy,
        now: DateTime<Utc>,
    ) -> Result<Self, String> {
        let as_increment = IncrementSpec {
            entity: spec.entity,
            action: spec.action,
            uuid: spec.uuid,
            count: Some(spec.value),
            negate: spec.retract,
            category: spec.category,
            timestamp: spec.timestamp,
            id: spec.id,
            actor: None,
            unique: None,
        };
        let mut inc = Increment::from_spec(&as_increment, policy, now)
            .map_err(|e| e.replacen("count", "value", 1))?;
        inc.kind = Kind::Sample {
            quantity: if spec.retract { -1 } else { 1 },
        };
        Ok(inc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec<'a>(value: i64, retract: bool) -> SampleSpec<'a> {
        SampleSpec {
            entity: "ARTICLE",
            action: "rating",
            uuid: "a1",
            value,
            retract,
            ..Default::default()
        }
    }

    #[test]
    fn a_sample_adds_value_and_one() {
        let inc = Increment::sample(&spec(4, false), &TimePolicy::default(), Utc::now()).unwrap();
        assert_eq!(inc.delta, 4);
        assert_eq!(inc.kind, Kind::Sample { quantity: 1 });
    }

    #[test]
    fn a_retraction_takes_back_value_and_one() {
        let inc = Increment::sample(&spec(4, true), &TimePolicy::default(), Utc::now()).unwrap();
        assert_eq!(inc.delta, -4);
        assert_eq!(inc.kind, Kind::Sample { quantity: -1 });
        let err = Increment::sample(&spec(i64::MIN, true), &TimePolicy::default(), Utc::now())
            .unwrap_err();
        assert!(err.starts_with("value"), "{err}");
    }
}
