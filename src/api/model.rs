//! The JSON bodies of the write endpoints, and their mapping onto the
//! domain's [`IncrementSpec`]. Strings borrow from the request body where
//! they can: a batch of a thousand events allocates nothing until validated.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::domain::IncrementSpec;

/// Body of `POST /v1/counters/{entity}/{action}/{uuid}/increment` (and `decrement`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IncrementBody<'a> {
    /// Defaults to 1; may be negative.
    #[serde(default)]
    pub count: Option<i64>,
    #[serde(default, borrow)]
    pub category: Option<Cow<'a, str>>,
    /// RFC 3339; defaults to now.
    #[serde(default, borrow)]
    pub timestamp: Option<Cow<'a, str>>,
    /// Idempotency id: a retry with the same id is counted once.
    #[serde(default, borrow)]
    pub id: Option<Cow<'a, str>>,
}

/// One event of `POST /v1/events`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventBody<'a> {
    #[serde(borrow)]
    pub entity: Cow<'a, str>,
    #[serde(borrow)]
    pub action: Cow<'a, str>,
    #[serde(borrow)]
    pub uuid: Cow<'a, str>,
    #[serde(default)]
    pub count: Option<i64>,
    #[serde(default, borrow)]
    pub category: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub timestamp: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub id: Option<Cow<'a, str>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsBody<'a> {
    #[serde(borrow)]
    pub events: Vec<EventBody<'a>>,
}

/// The same envelope with events left unparsed: used only to explain, event
/// by event, why a batch did not parse.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEventsBody {
    pub events: Vec<serde_json::Value>,
}

#[derive(Debug, Serialize)]
pub struct EventsAccepted {
    /// Events counted by this request.
    pub accepted: usize,
    /// Events skipped because their `id` had been counted before.
    pub duplicates: u32,
}

impl<'a> IncrementBody<'a> {
    pub fn spec(
        &'a self,
        entity: &'a str,
        action: &'a str,
        uuid: &'a str,
        negate: bool,
    ) -> IncrementSpec<'a> {
        IncrementSpec {
            entity,
            action,
            uuid,
            count: self.count,
            negate,
            category: self.category.as_deref(),
            timestamp: self.timestamp.as_deref(),
            id: self.id.as_deref(),
        }
    }
}

impl<'a> EventBody<'a> {
    pub fn spec(&'a self) -> IncrementSpec<'a> {
        IncrementSpec {
            entity: &self.entity,
            action: &self.action,
            uuid: &self.uuid,
            count: self.count,
            negate: false,
            category: self.category.as_deref(),
            timestamp: self.timestamp.as_deref(),
            id: self.id.as_deref(),
        }
    }
}
