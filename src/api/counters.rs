//! Handlers for one counter and for the counters of one target.

use super::access::{Admin, CounterWriter, Disclosure, Reader};
use super::crawlers::{self, Crawler, Ignored, Sender};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

use super::extract::{parse_json, JsonBytes, PathParams};
use super::model::{Direction, IncrementBody, KeyPath};
use super::openapi::{NotFound, Overflow};
use super::AppState;
use crate::actors::Asks;
use crate::domain::{format_ms, Counter, CounterKey, Increment, Interner};
use crate::error::ApiError;

/// Whether an increment or decrement was counted, and the counter after
/// it. The counter (value, category, timestamps) is left out of the answer
/// to a `write` key, unless the gateway runs with
/// `--write-keys-read-values`: such a key is in public pages and may count,
/// not read. A request that was not counted may find no counter (an
/// unlike of a counter nobody liked; on Elasticsearch, a repeat while the
/// actor's first like is still on its way): the answer is then the key at
/// value 0, without category and timestamps.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Incremented {
    /// The document id, `{entity}_{action}_{uuid}` with `_` and `%` escaped.
    id: String,
    entity: String,
    action: String,
    uuid: String,
    /// The counter's value after the write; absent in the answer to a
    /// `write` key unless the gateway runs with `--write-keys-read-values`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    value: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    category: Option<String>,
    /// Absent when no counter exists (see above), or to a `write` key.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, format = DateTime)]
    first_timestamp: Option<String>,
    /// Absent when no counter exists (see above), or to a `write` key.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, format = DateTime)]
    recorded_timestamp: Option<String>,
    /// `false` when this request was not counted: its `id` was counted
    /// before, or (`unique`) its actor was counted already or, for a
    /// decrement, had no earlier count to take back.
    counted: bool,
    /// Why it was not counted; absent when it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    skipped: Option<Skipped>,
}

impl Incremented {
    /// `counter`: `None` when there is none, or when the answer may not
    /// show it ([`Disclosure::Outcome`]). The handlers answer through
    /// [`answer`]; this is its reference, in a unit test.
    #[cfg(test)]
    fn new(
        key: &CounterKey,
        counter: Option<Counter>,
        skipped: Option<Skipped>,
        disclosure: Disclosure,
    ) -> Incremented {
        let (value, category, first, recorded) = match (counter, disclosure) {
            (_, Disclosure::Outcome) => (None, None, None, None),
            (Some(c), Disclosure::Counter) => (
                Some(c.value),
                c.category,
                Some(format_ms(c.first_ms)),
                Some(format_ms(c.recorded_ms)),
            ),
            (None, Disclosure::Counter) => (Some(0), None, None, None),
        };
        Incremented {
            id: key.doc_id(),
            entity: key.entity.to_string(),
            action: key.action.to_string(),
            uuid: key.uuid.to_string(),
            value,
            category,
            first_timestamp: first,
            recorded_timestamp: recorded,
            counted: skipped.is_none(),
            skipped,
        }
    }
}

/// Why a write was not counted.
#[derive(Clone, Copy, Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Skipped {
    /// Its idempotency `id` was counted before.
    Duplicate,
    /// `unique`: its actor was counted already (or had nothing to take back).
    Repeat,
}

/// The one order of every counting write, once its request is validated
/// whole: a crawler's request is answered as ignored ([`Applying::Crawler`],
/// which hands the app back for the answer's metric) and spends
/// nothing, neither an actor's budget nor a tenant (none is created for
/// it); then the tenant is opened (created by its first applied write);
/// then what the request asks of the limits per actor is taken, or it is
/// refused whole (429 `throttled`) before anything of it is queued.
pub(super) async fn applying(
    app: Arc<AppState>,
    sender: Sender,
    asks: &Asks,
) -> Result<Applying, ApiError> {
    if sender == Sender::Crawler {
        return Ok(Applying::Crawler(app));
    }
    let app = app.opened().await?;
    app.actors.take(asks, app.clock.now_ms()).map_err(|t| {
        app.metrics.record_throttled();
        ApiError::from(t)
    })?;
    Ok(Applying::Write(app))
}

/// What [`applying`] decided: the request is a crawler's, ignored, or a
/// write to apply through the (opened) tenant's app.
pub(super) enum Applying {
    Crawler(Arc<AppState>),
    Write(Arc<AppState>),
}

#[utoipa::path(post, path = "/v1/counters/{entity}/{action}/{uuid}/increment",
    summary = "Add `count` (default 1) to a counter; answers it after the write is durable",
    params(KeyPath), security(("bearer" = ["write"]), ("key" = ["write"])),
    request_body(content(
        (Option<IncrementBody> = "application/json"), (String = "text/plain"))),
    responses((status = 200, description = "Success", body = Incremented), Ignored, Overflow))]
pub async fn increment(
    writer: CounterWriter,
    Crawler(sender): Crawler,
    PathParams(path): PathParams<KeyPath>,
    JsonBytes(body): JsonBytes,
) -> Result<Response, ApiError> {
    add(writer, path, body, Direction::Add, sender).await
}

#[utoipa::path(post, path = "/v1/counters/{entity}/{action}/{uuid}/decrement",
    summary = "Subtract `count` (default 1) from a counter; with `unique: ever`, take back the actor's like",
    params(KeyPath), security(("bearer" = ["write"]), ("key" = ["write"])),
    request_body(content(
        (Option<IncrementBody> = "application/json"), (String = "text/plain"))),
    responses((status = 200, description = "Success", body = Incremented), Ignored, Overflow))]
pub async fn decrement(
    writer: CounterWriter,
    Crawler(sender): Crawler,
    PathParams(path): PathParams<KeyPath>,
    JsonBytes(body): JsonBytes,
) -> Result<Response, ApiError> {
    add(writer, path, body, Direction::Subtract, sender).await
}

pub(super) async fn add(
    CounterWriter { app, disclosure }: CounterWriter,
    path: KeyPath,
    body: axum::body::Bytes,
    direction: Direction,
    sender: Sender,
) -> Result<Response, ApiError> {
    app.pipeline.admit()?;
    let parsed: IncrementBody = if body.iter().all(u8::is_ascii_whitespace) {
        IncrementBody::default()
    } else {
        parse_json(&body)?
    };
    let spec = parsed.spec(&path.entity, &path.action, &path.uuid, direction);
    let inc = Increment::from_event(
        &spec,
        &app.time_policy,
        app.clock.now(),
        &mut Interner::default(),
        &app.actors.key,
    )
    .map_err(ApiError::BadRequest)?;
    let mut asks = Asks::default();
    app.actors
        .ask(&mut asks, 0, &inc.key, spec.actor, inc.delta);
    let app = match applying(app, sender, &asks).await? {
        Applying::Crawler(app) => return Ok(crawlers::ignored(&app.metrics, 1)),
        Applying::Write(app) => app,
    };
    let key = inc.key.clone();
    // The queue's bound in bytes counts the increment, not the body (up to
    // --max-body-bytes of white space): it is not held while the write waits.
    drop(parsed);
    drop(body);
    let applied = app.pipeline.submit(vec![inc], Some(key.clone())).await?;
    app.metrics.record_repeats(applied.repeats);
    let skipped = if applied.duplicates > 0 {
        Some(Skipped::Duplicate)
    } else if applied.repeats > 0 {
        Some(Skipped::Repeat)
    } else {
        None
    };
    let counter = match (applied.counter, disclosure) {
        (_, Disclosure::Outcome) => None,
        (Some(c), Disclosure::Counter) => Some(c),
        // Not read back by the flush (not counted, or a store that could
        // not): the counter as it stands, if there is one.
        (None, Disclosure::Counter) => app.store.get(&key).await?,
    };
    Ok(answer(&key, counter.as_ref(), skipped, disclosure))
}

/// The 200 answer to an increment or decrement: what
/// `Json(Incremented::new(..))` answers, byte for byte (a unit test
/// compares them), written straight into one buffer: no `Incremented` with
/// its six strings, no timestamp formatted through a `String`.
fn answer(
    key: &CounterKey,
    counter: Option<&Counter>,
    skipped: Option<Skipped>,
    disclosure: Disclosure,
) -> Response {
    let mut out = Vec::with_capacity(192);
    write_answer(&mut out, key, counter, skipped, disclosure);
    (
        [(
            axum::http::header::CONTENT_TYPE,
            axum::http::HeaderValue::from_static("application/json"),
        )],
        axum::body::Bytes::from(out),
    )
        .into_response()
}

fn write_answer(
    out: &mut Vec<u8>,
    key: &CounterKey,
    counter: Option<&Counter>,
    skipped: Option<Skipped>,
    disclosure: Disclosure,
) {
    // Strings through serde_json, as `Json` escapes them; writing to a
    // vector cannot fail.
    let string = |out: &mut Vec<u8>, s: &str| {
        let _ = serde_json::to_writer(&mut *out, s);
    };
    out.extend_from_slice(b"{\"id\":");
    string(out, &key.doc_id());
    out.extend_from_slice(b",\"entity\":");
    string(out, &key.entity);
    out.extend_from_slice(b",\"action\":");
    string(out, &key.action);
    out.extend_from_slice(b",\"uuid\":");
    string(out, &key.uuid);
    if disclosure == Disclosure::Counter {
        out.extend_from_slice(b",\"value\":");
        let value = counter.map_or(0, |c| c.value);
        out.extend_from_slice(itoa_i64(value, &mut [0; 20]));
        if let Some(c) = counter {
            if let Some(category) = &c.category {
                out.extend_from_slice(b",\"category\":");
                string(out, category);
            }
            out.extend_from_slice(b",\"first_timestamp\":\"");
            write_ms(out, c.first_ms);
            out.extend_from_slice(b"\",\"recorded_timestamp\":\"");
            write_ms(out, c.recorded_ms);
            out.push(b'"');
        }
    }
    out.extend_from_slice(match skipped {
        None => b",\"counted\":true}",
        Some(Skipped::Duplicate) => b",\"counted\":false,\"skipped\":\"duplicate\"}",
        Some(Skipped::Repeat) => b",\"counted\":false,\"skipped\":\"repeat\"}",
    });
}

/// `value` in decimal, in `buf`.
fn itoa_i64(value: i64, buf: &mut [u8; 20]) -> &[u8] {
    let mut n = value.unsigned_abs();
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if value < 0 {
        at -= 1;
        buf[at] = b'-';
    }
    &buf[at..]
}

/// [`format_ms`] of `ms` (`2026-12-05T15:16:25.625Z`), without a `String`
/// for years 0 to 9999 (the others through it).
fn write_ms(out: &mut Vec<u8>, ms: i64) {
    use chrono::{Datelike, Timelike};
    let t = chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms).unwrap_or_default();
    if !(0..=9999).contains(&t.year()) {
        out.extend_from_slice(format_ms(ms).as_bytes());
        return;
    }
    let digits = |out: &mut Vec<u8>, n: u32, width: usize| {
        let mut buf = [b'0'; 4];
        let mut n = n;
        for d in buf[..width].iter_mut().rev() {
            *d = b'0' + (n % 10) as u8;
            n /= 10;
        }
        out.extend_from_slice(&buf[..width]);
    };
    digits(out, t.year() as u32, 4);
    out.push(b'-');
    digits(out, t.month(), 2);
    out.push(b'-');
    digits(out, t.day(), 2);
    out.push(b'T');
    digits(out, t.hour(), 2);
    out.push(b':');
    digits(out, t.minute(), 2);
    out.push(b':');
    digits(out, t.second(), 2);
    out.push(b'.');
    digits(out, t.timestamp_subsec_millis(), 3);
    out.push(b'Z');
}

#[utoipa::path(get, path = "/v1/counters/{entity}/{action}/{uuid}",
    summary = "One counter",
    params(KeyPath), security(("bearer" = ["read"]), ("key" = ["read"])),
    responses((status = 200, description = "Success", body = Counter), NotFound))]
pub async fn get(
    Reader(app): Reader,
    PathParams(path): PathParams<KeyPath>,
) -> Result<Json<Counter>, ApiError> {
    let key = path.key()?;
    app.store
        .get(&key)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("counter {key} has never been counted")))
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct Deleted {
    deleted: bool,
}

#[utoipa::path(delete, path = "/v1/counters/{entity}/{action}/{uuid}",
    summary = "Remove a counter and its histogram buckets",
    params(KeyPath), security(("bearer" = ["admin"]), ("key" = ["admin"])),
    responses((status = 200, description = "Success", body = Deleted), NotFound))]
pub async fn delete(
    Admin(app): Admin,
    PathParams(path): PathParams<KeyPath>,
) -> Result<Json<Deleted>, ApiError> {
    let key = path.key()?;
    let deleted = app.store.delete(&key).await;
    app.pipeline.note_change();
    if deleted? {
        Ok(Json(Deleted { deleted: true }))
    } else {
        Err(ApiError::NotFound(format!("counter {key} does not exist")))
    }
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TargetPath {
    #[param(inline, value_type = crate::api::openapi::Name)]
    entity: String,
    #[param(inline, value_type = crate::api::openapi::Name)]
    uuid: String,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct TargetCounters {
    entity: String,
    uuid: String,
    counters: Vec<Counter>,
}

#[utoipa::path(get, path = "/v1/targets/{entity}/{uuid}/counters",
    summary = "Every counter of one target",
    params(TargetPath), security(("bearer" = ["read"]), ("key" = ["read"])),
    responses((status = 200, description = "Success", body = TargetCounters)))]
pub async fn target(
    Reader(app): Reader,
    PathParams(path): PathParams<TargetPath>,
) -> Result<Json<TargetCounters>, ApiError> {
    crate::domain::validate_name("entity", &path.entity).map_err(ApiError::BadRequest)?;
    crate::domain::validate_name("uuid", &path.uuid).map_err(ApiError::BadRequest)?;
    let counters = app.store.target_counters(&path.entity, &path.uuid).await?;
    Ok(Json(TargetCounters {
        entity: path.entity,
        uuid: path.uuid,
        counters,
    }))
}

#[cfg(test)]
mod tests {
    use super::{write_answer, Disclosure, Incremented, Skipped};
    use crate::domain::{Counter, CounterKey};

    /// The answer written by hand is `Json(Incremented)`'s, byte for byte.
    #[test]
    fn the_answer_is_the_serialized_one() {
        let keys = [
            CounterKey::new("VIDEO", "VIEW", "item-1").unwrap(),
            CounterKey::new("a_b", "c%d", "é\"q\\")
                .unwrap_or_else(|_| CounterKey::new("a_b", "c%d", "x").unwrap()),
        ];
        let times = [
            0,
            1_764_946_585_625,
            -1,
            -62_135_596_800_000,
            253_402_300_799_999,
            253_402_300_800_000,
            i64::MAX,
        ];
        for key in &keys {
            for (i, &ms) in times.iter().enumerate() {
                let counter = Counter {
                    key: key.clone(),
                    value: [0, 1, -7, i64::MAX, i64::MIN, 42, 1_234_567][i],
                    category: [None, Some("sport\n\u{1}\"x\"é".to_owned())][i % 2].clone(),
                    first_ms: ms,
                    recorded_ms: ms.saturating_add(1),
                };
                for counter in [Some(&counter), None] {
                    for skipped in [None, Some(Skipped::Duplicate), Some(Skipped::Repeat)] {
                        for disclosure in [Disclosure::Counter, Disclosure::Outcome] {
                            let mut mine = Vec::new();
                            write_answer(&mut mine, key, counter, skipped, disclosure);
                            let theirs = serde_json::to_vec(&Incremented::new(
                                key,
                                counter.cloned(),
                                skipped,
                                disclosure,
                            ))
                            .unwrap();
                            assert_eq!(
                                String::from_utf8_lossy(&mine),
                                String::from_utf8_lossy(&theirs),
                                "{key} {ms} {skipped:?} {disclosure:?}"
                            );
                        }
                    }
                }
            }
        }
    }
}
