//! `POST /v1/events`: a batch of increments, validated whole before any is
//! applied, and applied as one submission.

use super::access::Writer;
use super::counters::Applying;
use super::crawlers::{self, Crawler, Ignored};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};

use super::extract::{describe, parse_json, JsonBytes};
use super::model::{EventBody, EventsAccepted, EventsBody, Object, RawEventsBody};
use crate::actors::{Actors, Asks};
use crate::domain::milestone::{parse_published, Published};
use crate::domain::{Increment, Interner, TimePolicy};
use crate::error::{ApiError, EventError};
use crate::store::PublishedSet;

use super::openapi::Overflow;

#[utoipa::path(post, path = "/v1/events",
    summary = "A batch of increments, all validated before any is applied (JSON or text/plain from sendBeacon)",
    security(("bearer" = ["write"]), ("key" = ["write"])),
    request_body(content((EventsBody = "application/json"), (String = "text/plain"))),
    responses((status = 200, description = "Success", body = EventsAccepted), Ignored, Overflow))]
pub async fn post(
    Writer(app): Writer,
    Crawler(sender): Crawler,
    JsonBytes(body): JsonBytes,
) -> Result<Response, ApiError> {
    app.pipeline.admit()?;
    let Events {
        incs,
        asks,
        published,
    } = read_events(
        &body,
        &app.time_policy,
        app.clock.now(),
        app.limits.max_events_per_request,
        &app.actors,
    )?;
    // Every event of the batch checked before any token is taken.
    let accepted = incs.len();
    let app = match super::counters::applying(app, sender, &asks).await? {
        Applying::Crawler(app) => return Ok(crawlers::ignored(&app.metrics, accepted)),
        Applying::Write(app) => app,
    };
    // The increments own their strings: the body and its parse need not be
    // held while the write waits in the queue (its bound counts increments).
    drop(body);
    // Kept before the increments: a failure here applies nothing, and a
    // retry after a failed submit sets the same again (nothing moves).
    if !published.is_empty() {
        app.store.set_published(published).await?;
    }
    let applied = app.pipeline.submit(incs, None).await?;
    app.metrics.record_repeats(applied.repeats);
    Ok(Json(EventsAccepted {
        accepted: accepted - applied.duplicates as usize - applied.repeats as usize,
        duplicates: applied.duplicates,
        repeats: applied.repeats,
        ignored: 0,
    })
    .into_response())
}

/// A batch body parsed, its strings still borrowed from the body.
pub struct ParsedBatch<'a>(EventsBody<'a>);

/// Reads a `POST /v1/events` body into its increments, validated whole:
/// every bad event is named by its index, or the envelope's fault is.
/// Public (with its two stages) for `tests/bench_parse.rs`.
pub fn read_batch(
    body: &[u8],
    policy: &TimePolicy,
    now: DateTime<Utc>,
    max_events: usize,
) -> Result<Vec<Increment>, ApiError> {
    read_events(body, policy, now, max_events, &Actors::default()).map(|e| e.incs)
}

/// What a valid batch asks: its increments, what they ask of the limits
/// per actor, and the publication times its events send.
pub struct Events {
    pub incs: Vec<Increment>,
    pub asks: Asks,
    pub published: Vec<PublishedSet>,
}

/// [`read_batch`] with the gateway's actor secret and limits: also what
/// the batch asks of the limits per actor.
pub fn read_events(
    body: &[u8],
    policy: &TimePolicy,
    now: DateTime<Utc>,
    max_events: usize,
    actors: &Actors,
) -> Result<Events, ApiError> {
    if body.is_empty() {
        return Err(ApiError::BadRequest(
            "the body is empty; send {\"events\": [...]}".into(),
        ));
    }
    let parsed = match parse_batch(body) {
        Ok(b) => b,
        Err(e) => return Err(explain_parse_failure(body, policy, now, actors).unwrap_or(e)),
    };
    let (incs, asks) = parsed.events(policy, now, max_events, actors)?;
    // Read once the events are valid (a bad `published` is named like any
    // bad field), from the same parse; nothing is kept before every event
    // is checked.
    let published = parsed.publications(policy, now)?;
    Ok(Events {
        incs,
        asks,
        published,
    })
}

/// The first stage of [`read_batch`]: the JSON alone.
pub fn parse_batch(body: &[u8]) -> Result<ParsedBatch<'_>, ApiError> {
    parse_json(body).map(ParsedBatch)
}

impl ParsedBatch<'_> {
    /// The publication times the events send (`published`), each judged
    /// against the clock: malformed is a 400 naming the event; implausible
    /// ones are left out (the first touch stands in).
    fn publications(
        &self,
        policy: &TimePolicy,
        now: DateTime<Utc>,
    ) -> Result<Vec<PublishedSet>, ApiError> {
        let mut out = Vec::new();
        let mut errors = Vec::new();
        for (index, e) in self.0.events.iter().enumerate() {
            let Some(raw) = e.published.as_deref() else {
                continue;
            };
            match parse_published("published", raw, now, policy.max_skew) {
                Ok(Published::At(ms)) => out.push(PublishedSet {
                    entity: e.entity.to_string(),
                    uuid: e.uuid.to_string(),
                    at_ms: Some(ms),
                    replace: false,
                }),
                Ok(Published::Implausible(_)) => {}
                Err(reason) => errors.push(EventError { index, reason }),
            }
        }
        if !errors.is_empty() {
            return Err(ApiError::InvalidEvents(errors));
        }
        Ok(out)
    }

    /// The second stage of [`read_batch`]: counts the events and validates each.
    pub fn increments(
        &self,
        policy: &TimePolicy,
        now: DateTime<Utc>,
        max: usize,
    ) -> Result<Vec<Increment>, ApiError> {
        self.events(policy, now, max, &Actors::default())
            .map(|(incs, _)| incs)
    }

    /// [`ParsedBatch::increments`] with the actor secret, and what the
    /// events ask of the limits per actor.
    pub fn events(
        &self,
        policy: &TimePolicy,
        now: DateTime<Utc>,
        max: usize,
        actors: &Actors,
    ) -> Result<(Vec<Increment>, Asks), ApiError> {
        let events = &self.0.events;
        if events.is_empty() {
            return Err(ApiError::BadRequest(
                "events must hold at least one event".into(),
            ));
        }
        if events.len() > max {
            return Err(ApiError::BadRequest(format!(
                "events holds {} events, over the limit of {max} per request",
                events.len()
            )));
        }
        let mut incs = Vec::with_capacity(events.len());
        let mut errors = Vec::new();
        let mut names = Interner::for_batch(events.len());
        let mut asks = Asks::default();
        for (index, event) in events.iter().enumerate() {
            let spec = event.spec();
            match Increment::from_event(&spec, policy, now, &mut names, &actors.key) {
                Ok(inc) => {
                    actors.ask(&mut asks, index, &inc.key, spec.actor, inc.delta);
                    incs.push(inc);
                }
                Err(reason) => errors.push(EventError { index, reason }),
            }
        }
        if !errors.is_empty() {
            return Err(ApiError::InvalidEvents(errors));
        }
        Ok((incs, asks))
    }
}

/// When a batch does not parse as a whole, finds every bad event (those that
/// do not parse and those that parse but are invalid), so the client learns
/// of all of them at once. `None` when the envelope itself is at fault.
fn explain_parse_failure(
    body: &[u8],
    policy: &TimePolicy,
    now: DateTime<Utc>,
    actors: &Actors,
) -> Option<ApiError> {
    let raw: RawEventsBody = serde_json::from_slice(body).ok()?;
    let errors: Vec<EventError> = raw
        .events
        .iter()
        .enumerate()
        .filter_map(|(index, v)| {
            let reason = match serde_path_to_error::deserialize::<_, Object<EventBody>>(v) {
                Err(e) => describe(&e),
                Ok(Object(event)) => Increment::from_event(
                    &event.spec(),
                    policy,
                    now,
                    &mut Interner::default(),
                    &actors.key,
                )
                .err()?,
            };
            Some(EventError { index, reason })
        })
        .collect();
    (!errors.is_empty()).then_some(ApiError::InvalidEvents(errors))
}
