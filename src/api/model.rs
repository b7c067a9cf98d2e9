//! The JSON bodies of the write endpoints, and their mapping onto the
//! domain's [`IncrementSpec`]. Strings borrow from the request body where
//! they can: a batch of a thousand events allocates nothing until validated.

use std::borrow::Cow;

use serde::de::value::MapAccessDeserializer;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};

use crate::domain::IncrementSpec;

/// `T`, read from a JSON object only. serde's derived structs also accept an
/// array of the fields in order (`[7]` as `{"count": 7}`), which would let a
/// malformed body count; every body and event of the API is an object.
pub struct Object<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = T;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_map(V(std::marker::PhantomData)).map(Object)
    }
}

/// Described as `T`: the wrapper changes what parses, not the shape.
impl<T: utoipa::PartialSchema> utoipa::PartialSchema for Object<T> {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::Schema> {
        T::schema()
    }
}

impl<T: utoipa::ToSchema> utoipa::ToSchema for Object<T> {
    fn name() -> Cow<'static, str> {
        T::name()
    }

    fn schemas(schemas: &mut Vec<(String, utoipa::openapi::RefOr<utoipa::openapi::Schema>)>) {
        T::schemas(schemas)
    }
}

/// `Option<Cow<str>>` borrowed from the body when the JSON string has no
/// escape. serde borrows a bare `Cow<str>` field marked `borrow`, but an
/// `Option` of one always allocates; the message for a wrong type is the
/// one serde gives a `String` ("expected a string").
fn borrowed<'de: 'a, 'a, D: Deserializer<'de>>(d: D) -> Result<Option<Cow<'a, str>>, D::Error> {
    struct Str;
    impl<'de> Visitor<'de> for Str {
        type Value = Cow<'de, str>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a string")
        }
        fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
            Ok(Cow::Borrowed(v))
        }
        fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Cow::Owned(v.to_owned()))
        }
        fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
            Ok(Cow::Owned(v))
        }
    }
    struct Opt;
    impl<'de> Visitor<'de> for Opt {
        type Value = Option<Cow<'de, str>>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a string")
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_str(Str).map(Some)
        }
    }
    d.deserialize_option(Opt)
}

fn objects<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    let v = Vec::<Object<T>>::deserialize(d)?;
    Ok(v.into_iter().map(|o| o.0).collect())
}

/// Body of `POST /v1/counters/{entity}/{action}/{uuid}/increment` (and `decrement`).
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IncrementBody<'a> {
    /// Defaults to 1; may be negative.
    #[serde(default)]
    #[schema(schema_with = crate::api::openapi::optional_count)]
    pub count: Option<i64>,
    #[serde(default, borrow, deserialize_with = "borrowed")]
    #[schema(schema_with = crate::api::openapi::optional_name)]
    pub category: Option<Cow<'a, str>>,
    /// RFC 3339; defaults to now.
    #[serde(default, borrow, deserialize_with = "borrowed")]
    #[schema(schema_with = crate::api::openapi::optional_timestamp)]
    pub timestamp: Option<Cow<'a, str>>,
    /// Idempotency id: a retry with the same id is counted once.
    #[serde(default, borrow, deserialize_with = "borrowed")]
    #[schema(schema_with = crate::api::openapi::optional_event_id)]
    pub id: Option<Cow<'a, str>>,
    /// Who the event is from: a user id, or anything stable the page has
    /// (at most 256 bytes, no control characters). Kept only as a keyed
    /// hash. Limits per actor count it; with `unique`, counted once.
    #[serde(default, borrow, deserialize_with = "borrowed")]
    #[schema(schema_with = crate::api::openapi::optional_actor)]
    pub actor: Option<Cow<'a, str>>,
    /// Count once per `actor`: `ever` (a like: once per actor and counter,
    /// until a decrement takes it back) or `day` (a view: once per actor,
    /// counter and UTC day of the event). `count` must then be 1.
    #[serde(default, borrow, deserialize_with = "borrowed")]
    #[schema(schema_with = crate::api::openapi::optional_unique)]
    pub unique: Option<Cow<'a, str>>,
}

/// One event of `POST /v1/events`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EventBody<'a> {
    #[serde(borrow)]
    #[schema(schema_with = crate::api::openapi::name)]
    pub entity: Cow<'a, str>,
    #[serde(borrow)]
    #[schema(schema_with = crate::api::openapi::name)]
    pub action: Cow<'a, str>,
    #[serde(borrow)]
    #[schema(schema_with = crate::api::openapi::name)]
    pub uuid: Cow<'a, str>,
    #[serde(default)]
    #[schema(schema_with = crate::api::openapi::optional_count)]
    pub count: Option<i64>,
    #[serde(default, borrow, deserialize_with = "borrowed")]
    #[schema(schema_with = crate::api::openapi::optional_name)]
    pub category: Option<Cow<'a, str>>,
    #[serde(default, borrow, deserialize_with = "borrowed")]
    #[schema(schema_with = crate::api::openapi::optional_timestamp)]
    pub timestamp: Option<Cow<'a, str>>,
    #[serde(default, borrow, deserialize_with = "borrowed")]
    #[schema(schema_with = crate::api::openapi::optional_event_id)]
    pub id: Option<Cow<'a, str>>,
    /// Who the event is from: a user id, or anything stable the page has
    /// (at most 256 bytes, no control characters). Kept only as a keyed
    /// hash. Limits per actor count it; with `unique`, counted once.
    #[serde(default, borrow, deserialize_with = "borrowed")]
    #[schema(schema_with = crate::api::openapi::optional_actor)]
    pub actor: Option<Cow<'a, str>>,
    /// Count once per `actor`: `ever` (a like: once per actor and counter,
    /// until a decrement takes it back) or `day` (a view: once per actor,
    /// counter and UTC day of the event). `count` must then be 1.
    #[serde(default, borrow, deserialize_with = "borrowed")]
    #[schema(schema_with = crate::api::openapi::optional_unique)]
    pub unique: Option<Cow<'a, str>>,
    /// When the target (entity + uuid) was published, RFC 3339: its
    /// milestones count from that UTC day. Kept only for a target without
    /// one (an admin's `PUT /v1/targets/{entity}/{uuid}` replaces it); an
    /// implausible time (before 2008, in the future) is not kept.
    #[serde(default, borrow, deserialize_with = "borrowed")]
    #[schema(schema_with = crate::api::openapi::optional_timestamp)]
    pub published: Option<Cow<'a, str>>,
}

/// Body of `POST /v1/events`; `maxItems` is the configured batch limit,
/// set when the description is served.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EventsBody<'a> {
    #[serde(borrow, deserialize_with = "objects")]
    #[schema(min_items = 1)]
    pub events: Vec<EventBody<'a>>,
}

/// The same envelope with events left unparsed: used only to explain, event
/// by event, why a batch did not parse.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEventsBody {
    pub events: Vec<serde_json::Value>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EventsAccepted {
    /// Events counted by this request.
    pub accepted: usize,
    /// Events skipped because their `id` had been counted before.
    pub duplicates: u32,
    /// Events skipped because of `unique`: their actor was counted already
    /// (or, for a decrement, had no earlier count to take back). Absent when
    /// none was, so the answer of a batch without `unique` is as it was.
    #[serde(skip_serializing_if = "is_zero")]
    #[schema(minimum = 1)]
    pub repeats: u32,
    /// Events not counted because a known crawler sent them (browser
    /// ingestion; the answer is then a 202 with `X-Counter-Ignored:
    /// crawler`). Absent when none were, as in every 200.
    #[serde(skip_serializing_if = "is_zero")]
    pub ignored: usize,
}

fn is_zero<T: Default + PartialEq>(n: &T) -> bool {
    *n == T::default()
}

/// Which way a single write moves its counter: the increment's and the
/// decrement's one body reads the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// `POST .../increment`: adds `count`.
    Add,
    /// `POST .../decrement`: subtracts `count` (with `unique: ever`, an unlike).
    Subtract,
}

impl<'a> IncrementBody<'a> {
    pub fn spec(
        &'a self,
        entity: &'a str,
        action: &'a str,
        uuid: &'a str,
        direction: Direction,
    ) -> IncrementSpec<'a> {
        IncrementSpec {
            entity,
            action,
            uuid,
            count: self.count,
            negate: direction == Direction::Subtract,
            category: self.category.as_deref(),
            timestamp: self.timestamp.as_deref(),
            id: self.id.as_deref(),
            actor: self.actor.as_deref(),
            unique: self.unique.as_deref(),
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
            actor: self.actor.as_deref(),
            unique: self.unique.as_deref(),
        }
    }
}

/// The path of every endpoint on one counter: `{entity}/{action}/{uuid}`.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct KeyPath {
    #[param(inline, value_type = crate::api::openapi::Name)]
    pub entity: String,
    #[param(inline, value_type = crate::api::openapi::Name)]
    pub action: String,
    #[param(inline, value_type = crate::api::openapi::Name)]
    pub uuid: String,
}

impl KeyPath {
    pub fn key(&self) -> Result<crate::domain::CounterKey, crate::error::ApiError> {
        crate::domain::CounterKey::new(&self.entity, &self.action, &self.uuid)
            .map_err(crate::error::ApiError::BadRequest)
    }
}
