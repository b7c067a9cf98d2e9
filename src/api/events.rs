//! `POST /v1/events`: a batch of increments, validated whole before any is
//! applied, and applied as one submission.

use super::access::Writer;
use axum::Json;
use chrono::{DateTime, Utc};

use super::extract::{describe, parse_json, JsonBytes};
use super::model::{EventBody, EventsAccepted, EventsBody, Object, RawEventsBody};
use super::AppState;
use crate::domain::Increment;
use crate::error::{ApiError, EventError};

pub async fn post(
    Writer(app): Writer,
    JsonBytes(body): JsonBytes,
) -> Result<Json<EventsAccepted>, ApiError> {
    app.pipeline.admit()?;
    if body.is_empty() {
        return Err(ApiError::BadRequest(
            "the body is empty; send {\"events\": [...]}".into(),
        ));
    }
    let now = app.clock.now();
    let parsed: EventsBody = match parse_json(&body) {
        Ok(b) => b,
        Err(e) => return Err(explain_parse_failure(&body, &app, now).unwrap_or(e)),
    };
    let max = app.limits.max_events_per_request;
    if parsed.events.is_empty() {
        return Err(ApiError::BadRequest(
            "events must hold at least one event".into(),
        ));
    }
    if parsed.events.len() > max {
        return Err(ApiError::BadRequest(format!(
            "events holds {} events, over the limit of {max} per request",
            parsed.events.len()
        )));
    }
    let mut incs = Vec::with_capacity(parsed.events.len());
    let mut errors = Vec::new();
    for (index, event) in parsed.events.iter().enumerate() {
        match Increment::from_spec(&event.spec(), &app.time_policy, now) {
            Ok(inc) => incs.push(inc),
            Err(reason) => errors.push(EventError { index, reason }),
        }
    }
    if !errors.is_empty() {
        return Err(ApiError::InvalidEvents(errors));
    }
    let accepted = incs.len();
    // The increments own their strings: the body and its parse need not be
    // held while the write waits in the queue (its bound counts increments).
    drop(parsed);
    drop(body);
    let applied = app.pipeline.submit(incs, None).await?;
    Ok(Json(EventsAccepted {
        accepted: accepted - applied.duplicates as usize,
        duplicates: applied.duplicates,
    }))
}

/// When a batch does not parse as a whole, finds every bad event (those that
/// do not parse and those that parse but are invalid), so the client learns
/// of all of them at once. `None` when the envelope itself is at fault.
fn explain_parse_failure(body: &[u8], app: &AppState, now: DateTime<Utc>) -> Option<ApiError> {
    let raw: RawEventsBody = serde_json::from_slice(body).ok()?;
    let errors: Vec<EventError> = raw
        .events
        .iter()
        .enumerate()
        .filter_map(|(index, v)| {
            let reason = match serde_path_to_error::deserialize::<_, Object<EventBody>>(v) {
                Err(e) => describe(&e),
                Ok(Object(event)) => {
                    Increment::from_spec(&event.spec(), &app.time_policy, now).err()?
                }
            };
            Some(EventError { index, reason })
        })
        .collect();
    (!errors.is_empty()).then_some(ApiError::InvalidEvents(errors))
}
