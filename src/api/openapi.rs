//! `GET /openapi.json`: the API described as OpenAPI 3.1, generated from the
//! table of routes ([`super::table`]). Each handler's `#[utoipa::path]` names
//! its path, method, parameters, body, the key it needs (as `security`) and the
//! answers particular to it; the schemas derive (`ToSchema`, `IntoParams`)
//! from the very structs the handlers parse and serialize, so a field added to
//! an answer is described without another edit.
//!
//! What the layers around every handler add is written here once, in
//! [`shared`] and [`document`], rather than on each handler: the role extractors (`X-Tenant`,
//! 400/401/403/429/500/503 and the role's description, for every operation
//! with `security`), the body extractor (400/413/415 for every operation with a
//! body), the request timeout (503 everywhere), and what depends on the
//! configuration (security schemes and 401/403 only with keys, the batch limit).
//!
//! `tests/openapi.rs` checks the description against the live router and
//! `scripts/schemathesis.sh` checks live answers against it.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::OnceLock;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use serde_json::{json, Value};
use utoipa::openapi::schema::{KnownFormat, Object, ObjectBuilder, SchemaFormat, SchemaType, Type};
use utoipa::openapi::{RefOr, Response, ResponseBuilder, Schema};
use utoipa::{IntoResponses, PartialSchema, ToSchema};

use super::Gateway;

/// A counter name part or category: UTF-8 without control characters, at
/// most 512 bytes. JSON Schema counts characters, not bytes, so the schema
/// admits a few names the gateway refuses (multi-byte ones past 512 bytes,
/// white space only, document ids past 512 bytes), never the reverse.
pub fn name() -> Object {
    name_of(string(false), crate::domain::MAX_NAME_BYTES)
}

/// An optional name, which may also be sent as `null` (absent).
pub fn optional_name() -> Object {
    name_of(string(true), crate::domain::MAX_NAME_BYTES)
}

/// An event idempotency id: as a name, at most 256 bytes; `null` is absent.
pub fn optional_event_id() -> Object {
    name_of(string(true), 256)
}

/// An event's actor: as a name, at most 256 bytes; `null` is absent.
pub fn optional_actor() -> Object {
    name_of(
        string(true).description(Some(
            "Who the event is from (a user id, or anything stable the page has); kept only as a keyed hash. Limits per actor (--actor-limit) count it; with `unique`, the event counts once per actor.",
        )),
        crate::domain::MAX_ACTOR_BYTES,
    )
}

/// The uniqueness scope of an event; `null` is absent.
pub fn optional_unique() -> Object {
    string(true)
        .description(Some(
            "Count once per `actor` (required with it): `ever` (a like: once per actor and counter; a decrement of 1 takes the actor's like back, never more) or `day` (a view: once per actor, counter and UTC day of the event; not taken back). `count` must be 1 (or -1 in a batch, for an unlike). An event not counted for it is a repeat, answered as such, not an error.",
        ))
        .enum_values(Some([Value::from("ever"), Value::from("day"), Value::Null]))
        .build()
}

/// An event idempotency id given as a query parameter (the pixel's `id`).
pub fn event_id() -> Object {
    name_of(string(false), 256)
}

fn name_of(b: ObjectBuilder, max: usize) -> Object {
    b.min_length(Some(1))
        .max_length(Some(max))
        .pattern(Some("^[^\\u0000-\\u001f\\u007f-\\u009f]+$"))
        .build()
}

/// A string, or with `nullable` also `null` (which the bodies read as absent).
fn string(nullable: bool) -> ObjectBuilder {
    ObjectBuilder::new().schema_type(if nullable {
        SchemaType::from_iter([Type::String, Type::Null])
    } else {
        SchemaType::Type(Type::String)
    })
}

fn formatted(b: ObjectBuilder, format: KnownFormat) -> Object {
    b.format(Some(SchemaFormat::KnownFormat(format))).build()
}

/// An RFC 3339 instant, as answers write them (UTC, milliseconds).
pub fn timestamp() -> Object {
    formatted(string(false), KnownFormat::DateTime)
}

/// An RFC 3339 instant; `null` is absent (now).
pub fn optional_timestamp() -> Object {
    formatted(string(true), KnownFormat::DateTime)
}

/// A UTC day, `2026-11-24`.
pub fn day() -> Object {
    formatted(string(false), KnownFormat::Date)
}

/// An optional 64-bit count; `null` is absent (1).
pub fn optional_count() -> Object {
    formatted(
        ObjectBuilder::new().schema_type(SchemaType::from_iter([Type::Integer, Type::Null])),
        KnownFormat::Int64,
    )
}

/// The `interval` parameter: one of the named intervals.
pub fn interval() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(crate::domain::NAMED_INTERVALS.iter().map(|(n, _)| *n)))
        .build()
}

/// The `interval` of a histogram: a named day window, or with
/// `bucket=hour` also `last_hour` (the current UTC clock hour) and
/// `last_24_hours` (the last 24 hour buckets including the current one).
pub fn histogram_interval() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(
            crate::domain::NAMED_INTERVALS
                .iter()
                .map(|(n, _)| *n)
                .chain(crate::domain::hours::HOUR_INTERVALS.iter().map(|(n, _)| *n)),
        ))
        .build()
}

/// The `bucket` of a histogram: `day` (the default) or `hour`.
pub fn bucket() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(["day", "hour"]))
        .build()
}

/// The first or last day of a window (`2026-11-30`), or the first or last
/// hour of a range of hour buckets (`2026-11-30T13:00:00Z`).
pub fn day_or_hour() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(
            "^[0-9]{4}-[0-9]{2}-[0-9]{2}(T[0-9]{2}:00:00Z)?$".to_string(),
        ))
        .build()
}

/// An hour bucket's start, `2026-11-30T13:00:00Z`.
pub fn hour() -> Object {
    formatted(string(false), KnownFormat::DateTime)
}

/// The `interval` an answer echoes: a named one, `range` for `from`/`to`,
/// or `first_<N>_days` (a top list by milestone).
pub fn answered_interval() -> Object {
    let named: Vec<&str> = crate::domain::NAMED_INTERVALS
        .iter()
        .map(|(n, _)| *n)
        .chain(crate::domain::hours::HOUR_INTERVALS.iter().map(|(n, _)| *n))
        .chain(["range"])
        .collect();
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(format!("^({}|first_[0-9]+_days)$", named.join("|"))))
        .build()
}

/// The `interval` of a top list: a named one, `last_hour` or
/// `last_24_hours` (summed from hour buckets: the current UTC clock hour,
/// the last 24 hour buckets including it), or `first_<N>_days` (N from
/// 1 to the bucket retention): the totals of each target's first N days
/// from its publication.
pub fn top_interval() -> Object {
    let named: Vec<&str> = crate::domain::NAMED_INTERVALS
        .iter()
        .map(|(n, _)| *n)
        .chain(crate::domain::hours::HOUR_INTERVALS.iter().map(|(n, _)| *n))
        .collect();
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(format!(
            "^({}|first_[1-9][0-9]*_days)$",
            named.join("|")
        )))
        .build()
}

/// The `tz` parameter: an IANA zone name, `Europe/Berlin`.
pub fn zone() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .examples(["Europe/Berlin"])
        .build()
}

/// Where a publication time came from.
pub fn published_source() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(["set", "first_touch"]))
        .build()
}

/// A page or list size, `1..=1000`.
pub fn size() -> Object {
    bounded(1, crate::store::MAX_TOP_SIZE as i64)
}

/// A number of days for the reports.
pub fn days() -> Object {
    bounded(1, 100_000)
}

/// A positive 64-bit integer.
pub fn positive() -> Object {
    bounded(1, i64::MAX)
}

fn bounded(min: i64, max: i64) -> Object {
    let mut b = ObjectBuilder::new()
        .schema_type(Type::Integer)
        .minimum(Some(min as f64));
    if max == i64::MAX {
        b = b.format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)));
    } else {
        b = b.maximum(Some(max as f64));
    }
    b.build()
}

/// Schemas of parameters that the handlers take as strings and parse
/// themselves (to name the field in a refusal): `#[param(inline, value_type
/// = ...)]` names one of these.
macro_rules! param_schema {
    ($($(#[$doc:meta])* $t:ident = $f:ident;)*) => {$(
        $(#[$doc])*
        pub struct $t;
        impl PartialSchema for $t {
            fn schema() -> RefOr<Schema> {
                $f().into()
            }
        }
        impl ToSchema for $t {
            fn name() -> Cow<'static, str> {
                stringify!($t).into()
            }
        }
    )*};
}

param_schema! {
    /// See [`name`].
    Name = name;
    /// See [`interval`].
    Interval = interval;
    /// See [`top_interval`].
    TopInterval = top_interval;
    /// See [`histogram_interval`].
    HistogramInterval = histogram_interval;
    /// See [`bucket`].
    BucketKind = bucket;
    /// See [`day`].
    Day = day;
    /// See [`zone`].
    ZoneName = zone;
    /// See [`size`].
    Size = size;
    /// See [`days`].
    Days = days;
    /// See [`positive`].
    Positive = positive;
    /// See [`stale_csv`].
    StaleCsv = stale_csv;
    /// See [`metrics_text`].
    MetricsText = metrics_text;
    /// See [`event_id`].
    EventId = event_id;
    /// See [`gif`].
    Gif = gif;
    /// See [`svg`].
    Svg = svg;
}

/// An integer that may leave 64 bits (a sum of day buckets): JSON carries
/// every digit, so no `format` bounds it.
pub fn wide_integer() -> Object {
    ObjectBuilder::new().schema_type(Type::Integer).build()
}

/// The error shape of every refusal; see `src/error.rs`.
fn error_ref() -> RefOr<Schema> {
    RefOr::Ref(utoipa::openapi::Ref::from_schema_name(
        crate::error::ErrorJson::name(),
    ))
}

/// Why an operation answers `status`, as every operation words it.
fn reason(status: u16) -> &'static str {
    match status {
        304 => "Not modified: If-None-Match names the current ETag",
        400 => "Invalid input; the reason names the field",
        401 => "No API key, or not a valid one",
        403 => "The key's role or tenant does not allow this",
        404 => "Not found",
        409 => "The counter would leave the signed 64-bit range; nothing applied",
        413 => "The body is larger than the limit",
        415 => "Send application/json (or text/plain from sendBeacon)",
        429 => "Rate limit of this client (`rate_limited`) or a limit per actor (`throttled`, naming the rule; nothing applied) reached; see Retry-After",
        500 => "Internal error (`store_read_only`, `store_corrupt`: the embedded store's database cannot be written or is damaged)",
        507 => "The store's disk is full (`store_full`)",
        503 => "Queue full, store unavailable, request timeout, or shutting down; see Retry-After",
        _ => "Answer",
    }
}

/// An error answer for `status`, with the headers the error type sets.
fn error_response(status: u16) -> Response {
    let mut r = ResponseBuilder::new().description(reason(status));
    if status == 304 {
        return r.build();
    }
    r = r.content(
        "application/json",
        utoipa::openapi::ContentBuilder::new()
            .schema(Some(error_ref()))
            .build(),
    );
    let header = |kind: Type| {
        utoipa::openapi::HeaderBuilder::new()
            .schema(ObjectBuilder::new().schema_type(kind))
            .build()
    };
    match status {
        429 | 503 => r = r.header("Retry-After", header(Type::Integer)),
        401 => r = r.header("WWW-Authenticate", header(Type::String)),
        _ => {}
    }
    r.build()
}

fn errors(statuses: &[u16]) -> BTreeMap<String, RefOr<Response>> {
    statuses
        .iter()
        .map(|s| (s.to_string(), RefOr::T(error_response(*s))))
        .collect()
}

/// 404: the counter (or average) has never been counted.
pub struct NotFound;
impl IntoResponses for NotFound {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        errors(&[404])
    }
}

/// 409: the write would leave the signed 64-bit range.
pub struct Overflow;
impl IntoResponses for Overflow {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        errors(&[409])
    }
}

/// 409 of CountAPI's `create`: the key exists already.
pub struct Exists;
impl IntoResponses for Exists {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        let mut r = error_response(409);
        r.description = "The key exists already (`conflict`); nothing written".into();
        [("409".to_string(), RefOr::T(r))].into()
    }
}

/// 304: the asset is unchanged (`If-None-Match`).
pub struct NotModified;
impl IntoResponses for NotModified {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        errors(&[304])
    }
}

/// `/metrics` checks its own key: 401, 403 and 429 without `security`.
pub struct OperatorErrors;
impl IntoResponses for OperatorErrors {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        errors(&[401, 403, 429])
    }
}

/// The answer of `/healthz` and `/readyz`.
pub struct Status;
impl PartialSchema for Status {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .property(
                "status",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some(["ok", "ready"])),
            )
            .required("status")
            .into()
    }
}
impl ToSchema for Status {
    fn name() -> Cow<'static, str> {
        "Status".into()
    }
}

/// This very document, as far as a client relies on it.
pub struct Description;
impl PartialSchema for Description {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .property("openapi", ObjectBuilder::new().schema_type(Type::String))
            .property("info", ObjectBuilder::new().schema_type(Type::Object))
            .property("paths", ObjectBuilder::new().schema_type(Type::Object))
            .required("openapi")
            .required("info")
            .required("paths")
            .into()
    }
}
impl ToSchema for Description {
    fn name() -> Cow<'static, str> {
        "OpenApi".into()
    }
}

/// The CSV form of the stale report: its header line, then one line per counter.
pub fn stale_csv() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(
            "^id,entity,action,uuid,value,category,first_timestamp,recorded_timestamp\r\n",
        ))
        .build()
}

/// An image, `image/gif` (the pixel's answer).
pub fn gif() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .content_media_type("image/gif")
        .build()
}

/// A badge: an SVG document.
pub fn svg() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .content_media_type("image/svg+xml")
        .build()
}

/// The Prometheus text exposition of `/metrics`.
pub fn metrics_text() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some("^# HELP counter_gateway_"))
        .build()
}

#[utoipa::path(
    get,
    path = "/openapi.json",
    summary = "This description",
    responses((status = 200, description = "Success", body = Description)),
)]
pub async fn openapi(State(gw): State<Arc<Gateway>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        document(
            if gw.keys.is_empty() {
                Access::Keyless
            } else {
                Access::Keyed
            },
            gw.tenants.default_tenant().limits.max_events_per_request,
        )
        .to_string(),
    )
}

/// The table's description with what every operation shares, and its route
/// patterns in the table's order; built once.
fn generated() -> &'static (Value, Vec<String>) {
    static DOC: OnceLock<(Value, Vec<String>)> = OnceLock::new();
    DOC.get_or_init(|| {
        let mut api = super::table().into_openapi();
        let routes = api.paths.paths.keys().cloned().collect();
        api.info = utoipa::openapi::InfoBuilder::new()
            .title("counter-gateway")
            .version(env!("CARGO_PKG_VERSION"))
            .description(Some(
                "Counts views, likes, logins and ratings over HTTP, exactly. Errors: {\"error\": {\"type\", \"reason\"}}.",
            ))
            .build();
        let components = api
            .components
            .get_or_insert_with(utoipa::openapi::Components::new);
        let mut schemas = Vec::new();
        <crate::error::ErrorJson as ToSchema>::schemas(&mut schemas);
        schemas.push((
            crate::error::ErrorJson::name().into_owned(),
            crate::error::ErrorJson::schema(),
        ));
        components.schemas.extend(schemas);
        let mut doc = serde_json::to_value(&api).expect("the description serializes");
        shared(&mut doc);
        (doc, routes)
    })
}

/// The route patterns of the table, in its order: the metrics' route labels.
pub fn route_patterns() -> Vec<String> {
    generated().1.clone()
}

const METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

/// The role an operation's `security` names, if it has one.
fn role(op: &Value) -> Option<String> {
    op["security"]
        .as_array()?
        .iter()
        .find_map(|req| req.as_object()?.values().next()?.get(0)?.as_str())
        .map(str::to_string)
}

/// The description of an operation that needs a `role` key.
fn role_needed(role: &str) -> String {
    match role {
        "admin" => "Needs an `admin` key when keys are configured.".into(),
        "public" => "Needs a `public` key (or `read`, `admin`) when keys are configured; answers to a `public` key carry `Access-Control-Allow-Origin: *`.".into(),
        role => format!("Needs a `{role}` key (or `admin`) when keys are configured."),
    }
}

/// What the layers around the handlers add, the same for any configuration.
fn shared(doc: &mut Value) {
    let Some(paths) = doc["paths"].as_object_mut() else {
        return;
    };
    for (path, item) in paths.iter_mut() {
        for method in METHODS {
            let Some(op) = item.get_mut(method) else {
                continue;
            };
            // From the method and path, as before utoipa: its default, the
            // handler's name, repeats (`get` in several modules), and
            // clients generated from the description keep their names.
            op["operationId"] = json!(format!(
                "{method}{}",
                path.replace(['/', '{', '}', '.', '-'], "_")
            ));
            let mut extra: Vec<u16> = Vec::new();
            if let Some(role) = role(op) {
                let params = op["parameters"].as_array_mut().map(std::mem::take);
                let mut params = params.unwrap_or_default();
                params.push(
                    json!({"name": "X-Tenant", "in": "header", "required": false,
                    "description": "The tenant, when the key is not bound to one",
                    "schema": {"type": "string", "pattern": "^[a-z0-9][a-z0-9-]{0,63}$"}}),
                );
                op["parameters"] = Value::Array(params);
                op["description"] = json!(role_needed(&role));
                extra.extend([400, 401, 403, 429, 500, 503, 507]);
            }
            if let Some(body) = op.get_mut("requestBody") {
                optional_body(body);
                extra.extend([400, 413, 415]);
            }
            // Any request may be refused by the request timeout.
            extra.push(503);
            let responses = op["responses"]
                .as_object_mut()
                .expect("every operation declares its success");
            for s in extra {
                responses.entry(s.to_string()).or_insert_with(|| {
                    serde_json::to_value(error_response(s)).expect("a response serializes")
                });
            }
        }
    }
}

/// A handler's `Option<Body>` means the body may be empty (utoipa writes it
/// as a JSON `null` or the body): an empty body, not `null`, is what the
/// handler accepts.
fn optional_body(body: &mut Value) {
    let json = &mut body["content"]["application/json"]["schema"];
    let Some(one_of) = json.get("oneOf").and_then(Value::as_array) else {
        return;
    };
    let mut rest = one_of
        .iter()
        .filter(|s| s.get("type") != Some(&json!("null")));
    if let (Some(schema), None, 2) = (rest.next().cloned(), rest.next(), one_of.len()) {
        *json = schema;
        body["required"] = json!(false);
    }
}

/// The arrays of a batch body, whose `maxItems` is the configured
/// `--max-events-per-request`, known only when the description is served.
const BATCHES: &[&str] = &[
    "/components/schemas/EventsBody/properties/events",
    "/components/schemas/DaysBody/properties/days",
];

/// The 403 of a keyless gateway's writes.
const CROSS_SITE: &str = "A page of another site (by its Origin, Referer or Sec-Fetch-Site) may not write on a gateway without API keys (`cross_site_write`); nothing written";

/// Whether the gateway that serves the description has API keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Keyed,
    Keyless,
}

/// The description, for a gateway with or without API keys and
/// `max_events` events per batch.
pub fn document(access: Access, max_events: usize) -> Value {
    let mut doc = generated().0.clone();
    for batch in BATCHES {
        let array = doc.pointer_mut(batch).and_then(Value::as_object_mut);
        array
            .expect("a batch array of the description")
            .insert("maxItems".into(), json!(max_events));
    }
    if access == Access::Keyed {
        doc["components"]["securitySchemes"] = json!({
            "bearer": {"type": "http", "scheme": "bearer"},
            "key": {"type": "apiKey", "in": "query", "name": "key"},
        });
        return doc;
    }
    // Without keys, no operation asks for one nor refuses one; a write
    // from a page of another site is refused (`edge::check_site`).
    if let Some(paths) = doc["paths"].as_object_mut() {
        for (path, item) in paths.iter_mut() {
            for method in METHODS {
                let Some(op) = item.get_mut(method).and_then(Value::as_object_mut) else {
                    continue;
                };
                if op.remove("security").is_some() {
                    if let Some(r) = op.get_mut("responses").and_then(Value::as_object_mut) {
                        r.remove("401");
                        let method =
                            axum::http::Method::from_bytes(method.to_ascii_uppercase().as_bytes())
                                .expect("an HTTP method");
                        if super::edge::writes(&method, path) {
                            r["403"]["description"] = json!(CROSS_SITE);
                        } else {
                            r.remove("403");
                        }
                    }
                }
            }
        }
    }
    doc
}
