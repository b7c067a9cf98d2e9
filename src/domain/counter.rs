//! The state of one counter as the API answers it.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;

use super::CounterKey;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counter {
    pub key: CounterKey,
    pub value: i64,
    pub category: Option<String>,
    /// Milliseconds since the epoch; the earliest touch.
    pub first_ms: i64,
    /// Milliseconds since the epoch; the latest touch, never moving backwards.
    pub recorded_ms: i64,
}

/// The JSON shape of a counter.
#[derive(Serialize)]
struct CounterJson<'a> {
    id: String,
    entity: &'a str,
    action: &'a str,
    uuid: &'a str,
    value: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    category: Option<&'a str>,
    first_timestamp: String,
    recorded_timestamp: String,
}

pub fn format_ms(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(SecondsFormat::Millis, true)
}

impl Serialize for Counter {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        CounterJson {
            id: self.key.doc_id(),
            entity: &self.key.entity,
            action: &self.key.action,
            uuid: &self.key.uuid,
            value: self.value,
            category: self.category.as_deref(),
            first_timestamp: format_ms(self.first_ms),
            recorded_timestamp: format_ms(self.recorded_ms),
        }
        .serialize(s)
    }
}
