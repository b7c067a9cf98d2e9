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

/// A counter.
// The JSON shape of [`Counter`], and its OpenAPI schema.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = Counter)]
struct CounterJson<'a> {
    /// The document id, `{entity}_{action}_{uuid}` with `_` and `%` escaped.
    id: String,
    entity: &'a str,
    action: &'a str,
    uuid: &'a str,
    value: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    category: Option<&'a str>,
    #[schema(format = DateTime)]
    first_timestamp: String,
    #[schema(format = DateTime)]
    recorded_timestamp: String,
}

impl utoipa::PartialSchema for Counter {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::Schema> {
        CounterJson::schema()
    }
}

impl utoipa::ToSchema for Counter {
    fn name() -> std::borrow::Cow<'static, str> {
        CounterJson::name()
    }
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
