//! `GET /openapi.json`: the API described as OpenAPI 3.0, built from one
//! table of operations ([`OPERATIONS`]) that names, for each, the role it
//! needs, its parameters, its body and every status it can answer, errors
//! included. `tests/openapi.rs` checks the table against the router, and
//! `scripts/schemathesis.sh` checks live answers against the description.
//!
//! Written out rather than derived (utoipa) to keep the build lean: the
//! handlers parse bodies by hand to name bad fields, so derived schemas
//! would need as many annotations as this table has lines.

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use serde_json::{json, Map, Value};

use super::Gateway;
use crate::auth::Role;

/// How a parameter or body part is described.
#[derive(Clone, Copy)]
pub enum Param {
    /// A counter name part in the path (entity, action, uuid).
    Name(&'static str),
    /// An optional query parameter with its schema.
    Query(&'static str, &'static str),
    /// A required query parameter with its schema.
    Required(&'static str, &'static str),
    /// A UTC day in the path, `YYYY-MM-DD`.
    Day(&'static str),
}

/// The body an operation takes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Body {
    None,
    Increment,
    Events,
    Sample,
    /// The keys of a multi-read.
    Keys,
    /// One backfilled day: `{"value", "category"}`.
    Day,
    /// Many: `{"days": [...]}`.
    Days,
}

pub struct Operation {
    pub method: &'static str,
    pub path: &'static str,
    pub summary: &'static str,
    /// `None`: open, no key needed.
    pub role: Option<Role>,
    pub params: &'static [Param],
    pub body: Body,
    /// The success status and the name of its schema.
    pub ok: (u16, &'static str),
    /// Error statuses beyond those every keyed operation can answer.
    pub errors: &'static [u16],
}

const KEY: &[Param] = &[
    Param::Name("entity"),
    Param::Name("action"),
    Param::Name("uuid"),
];
const TARGET: &[Param] = &[Param::Name("entity"), Param::Name("uuid")];
const WINDOW: &[Param] = &[
    Param::Name("entity"),
    Param::Name("action"),
    Param::Name("uuid"),
    Param::Query("interval", "interval"),
    Param::Query("from", "day"),
    Param::Query("to", "day"),
];
const TOP: &[Param] = &[
    Param::Name("entity"),
    Param::Name("action"),
    Param::Query("interval", "interval"),
    Param::Query("from", "day"),
    Param::Query("to", "day"),
    Param::Query("category", "name"),
    Param::Query("size", "size"),
];
const TOP_AVERAGES: &[Param] = &[
    Param::Name("entity"),
    Param::Name("action"),
    Param::Query("interval", "interval"),
    Param::Query("from", "day"),
    Param::Query("to", "day"),
    Param::Query("category", "name"),
    Param::Query("size", "size"),
    Param::Query("min_quantity", "positive"),
];
const STALE: &[Param] = &[
    Param::Query("days", "days"),
    Param::Query("entity", "name"),
    Param::Query("action", "name"),
    Param::Query("size", "size"),
    Param::Query("cursor", "string"),
];
const UNUSED: &[Param] = &[Param::Query("days", "days")];
const KEY_DAY: &[Param] = &[
    Param::Name("entity"),
    Param::Name("action"),
    Param::Name("uuid"),
    Param::Day("day"),
];

/// Every operation of the API.
pub const OPERATIONS: &[Operation] = &[
    Operation {
        method: "post",
        path: "/v1/counters/{entity}/{action}/{uuid}/increment",
        summary: "Add `count` (default 1) to a counter; answers it after the write is durable",
        role: Some(Role::Write),
        params: KEY,
        body: Body::Increment,
        ok: (200, "Counter"),
        errors: &[404, 409, 413, 415],
    },
    Operation {
        method: "post",
        path: "/v1/counters/{entity}/{action}/{uuid}/decrement",
        summary: "Subtract `count` (default 1) from a counter",
        role: Some(Role::Write),
        params: KEY,
        body: Body::Increment,
        ok: (200, "Counter"),
        errors: &[404, 409, 413, 415],
    },
    Operation {
        method: "post",
        path: "/v1/events",
        summary: "A batch of increments, all validated before any is applied (JSON or text/plain from sendBeacon)",
        role: Some(Role::Write),
        params: &[],
        body: Body::Events,
        ok: (200, "EventsAccepted"),
        errors: &[409, 413, 415],
    },
    Operation {
        method: "post",
        path: "/v1/averages/{entity}/{action}/{uuid}",
        summary: "Add (or retract) one sample of an average counter",
        role: Some(Role::Write),
        params: KEY,
        body: Body::Sample,
        ok: (200, "Average"),
        errors: &[404, 409, 413, 415],
    },
    Operation {
        method: "get",
        path: "/v1/counters/{entity}/{action}/{uuid}",
        summary: "One counter",
        role: Some(Role::Read),
        params: KEY,
        body: Body::None,
        ok: (200, "Counter"),
        errors: &[404],
    },
    Operation {
        method: "delete",
        path: "/v1/counters/{entity}/{action}/{uuid}",
        summary: "Remove a counter and its histogram buckets",
        role: Some(Role::Admin),
        params: KEY,
        body: Body::None,
        ok: (200, "Deleted"),
        errors: &[404],
    },
    Operation {
        method: "get",
        path: "/v1/counters/{entity}/{action}/{uuid}/histogram",
        summary: "Day buckets of a counter and their total inside a window",
        role: Some(Role::Read),
        params: WINDOW,
        body: Body::None,
        ok: (200, "Histogram"),
        errors: &[404],
    },
    Operation {
        method: "get",
        path: "/v1/targets/{entity}/{uuid}/counters",
        summary: "Every counter of one target",
        role: Some(Role::Read),
        params: TARGET,
        body: Body::None,
        ok: (200, "TargetCounters"),
        errors: &[],
    },
    Operation {
        method: "get",
        path: "/v1/averages/{entity}/{action}/{uuid}",
        summary: "Sum, quantity and average, all time or inside a window",
        role: Some(Role::Read),
        params: WINDOW,
        body: Body::None,
        ok: (200, "Average"),
        errors: &[404],
    },
    Operation {
        method: "get",
        path: "/v1/top/{entity}/{action}",
        summary: "The highest counters, all time or inside a window",
        role: Some(Role::Read),
        params: TOP,
        body: Body::None,
        ok: (200, "Object"),
        errors: &[],
    },
    Operation {
        method: "get",
        path: "/v1/top-averages/{entity}/{action}",
        summary: "The highest averages",
        role: Some(Role::Read),
        params: TOP_AVERAGES,
        body: Body::None,
        ok: (200, "Object"),
        errors: &[],
    },
    Operation {
        method: "get",
        path: "/v1/reports/stale",
        summary: "Counters untouched for `days`, oldest first, paged with a cursor (CSV with Accept: text/csv)",
        role: Some(Role::Read),
        params: STALE,
        body: Body::None,
        ok: (200, "Object"),
        errors: &[],
    },
    Operation {
        method: "get",
        path: "/v1/reports/unused",
        summary: "Entity/action pairs with no touch in `days`",
        role: Some(Role::Read),
        params: UNUSED,
        body: Body::None,
        ok: (200, "Object"),
        errors: &[],
    },
    Operation {
        method: "get",
        path: "/healthz",
        summary: "The process is alive",
        role: None,
        params: &[],
        body: Body::None,
        ok: (200, "Status"),
        errors: &[],
    },
    Operation {
        method: "get",
        path: "/readyz",
        summary: "The store answers",
        role: None,
        params: &[],
        body: Body::None,
        ok: (200, "Status"),
        errors: &[503],
    },
    Operation {
        method: "get",
        path: "/metrics",
        summary: "Prometheus metrics of every tenant (admin key of tenant * when keys are configured)",
        role: None,
        params: &[],
        body: Body::None,
        ok: (200, "Metrics"),
        errors: &[401, 403, 429],
    },
    Operation {
        method: "get",
        path: "/openapi.json",
        summary: "This description",
        role: None,
        params: &[],
        body: Body::None,
        ok: (200, "Object"),
        errors: &[],
    },
    Operation {
        method: "get",
        path: "/dashboard",
        summary: "The built-in dashboard page (it reads /v1 with a read key entered on the page)",
        role: None,
        params: &[],
        body: Body::None,
        ok: (200, "Html"),
        errors: &[304],
    },
    Operation {
        method: "get",
        path: "/dashboard/dashboard.js",
        summary: "The dashboard's script",
        role: None,
        params: &[],
        body: Body::None,
        ok: (200, "Script"),
        errors: &[304],
    },
    Operation {
        method: "get",
        path: "/dashboard/dashboard.css",
        summary: "The dashboard's style sheet",
        role: None,
        params: &[],
        body: Body::None,
        ok: (200, "Style"),
        errors: &[304],
    },
    Operation {
        method: "get",
        path: "/v1/counters",
        summary: "Up to 100 counters by key, in the order asked, missing ones as found: false and value 0; cacheable (ETag, 304 on If-None-Match, Cache-Control)",
        role: Some(Role::Public),
        params: &[Param::Required("keys", "keys")],
        body: Body::None,
        ok: (200, "CounterValues"),
        errors: &[304],
    },
    Operation {
        method: "post",
        path: "/v1/counters/get",
        summary: "Up to 1,000 counters by key in one read, in the order asked, missing ones as found: false and value 0",
        role: Some(Role::Public),
        params: &[],
        body: Body::Keys,
        ok: (200, "CounterValues"),
        errors: &[413, 415],
    },
    Operation {
        method: "put",
        path: "/v1/counters/{entity}/{action}/{uuid}/days/{day}",
        summary: "Backfill: set one UTC day's bucket to `value`, moving the counter by the difference (created if absent); setting it twice is the same as once",
        role: Some(Role::Admin),
        params: KEY_DAY,
        body: Body::Day,
        ok: (200, "DaySet"),
        errors: &[409],
    },
    Operation {
        method: "put",
        path: "/v1/days",
        summary: "Backfill many days of many counters, all validated before any is set, all or nothing",
        role: Some(Role::Admin),
        params: &[],
        body: Body::Days,
        ok: (200, "DaysSet"),
        errors: &[409],
    },
];

/// Statuses every operation that takes a key can answer.
const KEYED_ERRORS: &[u16] = &[400, 429, 500, 503];

/// The media type of an answer that is not JSON, by its schema name.
fn static_media_type(schema: &str) -> Option<&'static str> {
    match schema {
        "Metrics" => Some("text/plain"),
        "Html" => Some("text/html"),
        "Script" => Some("text/javascript"),
        "Style" => Some("text/css"),
        _ => None,
    }
}

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
        429 => "Rate limit of this client reached; see Retry-After",
        500 => "Internal error",
        503 => "Queue full, store unavailable, request timeout, or shutting down; see Retry-After",
        _ => "Answer",
    }
}

/// A counter name part or category: UTF-8 without control characters, at
/// most 512 bytes. JSON Schema counts characters, not bytes, so the schema
/// admits a few names the gateway refuses (multi-byte ones past 512 bytes,
/// white space only, document ids past 512 bytes), never the reverse.
fn name_schema() -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": crate::domain::MAX_NAME_BYTES,
           "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f]+$"})
}

/// An event idempotency id: as a name, at most 256 bytes.
fn id_schema() -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": 256,
           "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f]+$"})
}

fn query_schema(kind: &str) -> Value {
    match kind {
        "interval" => {
            json!({"type": "string", "enum": ["all", "last_day", "last_week", "last_month", "last_year"]})
        }
        "day" => json!({"type": "string", "format": "date"}),
        "size" => json!({"type": "integer", "minimum": 1, "maximum": super::queries::MAX_TOP_SIZE}),
        "days" => json!({"type": "integer", "minimum": 1, "maximum": 100_000}),
        "positive" => json!({"type": "integer", "format": "int64", "minimum": 1}),
        "name" => name_schema(),
        "keys" => json!({"type": "string", "description": format!(
            "entity/action/uuid of each counter, separated by commas, each part percent-encoded (a / or , inside a part as %2F, %2C); at most {} keys",
            super::multiread::MAX_GET_KEYS)}),
        _ => json!({"type": "string"}),
    }
}

fn body_schema(body: Body, max_events: usize) -> Option<Value> {
    // Optional fields may also be sent as `null`, which means absent.
    let nullable = |mut v: Value| {
        v["nullable"] = json!(true);
        v
    };
    let common = json!({
        "category": nullable(name_schema()),
        "timestamp": nullable(json!({"type": "string", "format": "date-time"})),
        "id": nullable(id_schema()),
    });
    let with = |mut base: Map<String, Value>| {
        if let Value::Object(c) = &common {
            for (k, v) in c {
                base.insert(k.clone(), v.clone());
            }
        }
        Value::Object(base)
    };
    let int = nullable(json!({"type": "integer", "format": "int64"}));
    match body {
        Body::None => None,
        Body::Increment => Some(json!({
            "type": "object", "additionalProperties": false,
            "properties": with(Map::from_iter([("count".to_string(), int)])),
        })),
        Body::Sample => Some(json!({
            "type": "object", "additionalProperties": false, "required": ["value"],
            "properties": with(Map::from_iter([
                ("value".to_string(), json!({"type": "integer", "format": "int64"})),
                ("retract".to_string(), json!({"type": "boolean"})),
            ])),
        })),
        Body::Day => Some(json!({
            "type": "object", "additionalProperties": false, "required": ["value"],
            "properties": {
                "value": {"type": "integer", "format": "int64"},
                "category": nullable(name_schema()),
            },
        })),
        Body::Days => {
            let day = json!({
                "type": "object", "additionalProperties": false,
                "required": ["entity", "action", "uuid", "day", "value"],
                "properties": {
                    "entity": name_schema(), "action": name_schema(), "uuid": name_schema(),
                    "day": {"type": "string", "format": "date"},
                    "value": {"type": "integer", "format": "int64"},
                    "category": nullable(name_schema()),
                },
            });
            Some(json!({
                "type": "object", "additionalProperties": false, "required": ["days"],
                "properties": {"days": {"type": "array", "minItems": 1, "maxItems": max_events, "items": day}},
            }))
        }
        Body::Events => {
            let event = json!({
                "type": "object", "additionalProperties": false,
                "required": ["entity", "action", "uuid"],
                "properties": with(Map::from_iter([
                    ("entity".to_string(), name_schema()),
                    ("action".to_string(), name_schema()),
                    ("uuid".to_string(), name_schema()),
                    ("count".to_string(), int),
                ])),
            });
            Some(json!({
                "type": "object", "additionalProperties": false, "required": ["events"],
                "properties": {"events": {"type": "array", "minItems": 1, "maxItems": max_events, "items": event}},
            }))
        }
        Body::Keys => {
            let key = json!({
                "type": "object", "additionalProperties": false,
                "required": ["entity", "action", "uuid"],
                "properties": {"entity": name_schema(), "action": name_schema(), "uuid": name_schema()},
            });
            Some(json!({
                "type": "object", "additionalProperties": false, "required": ["keys"],
                "properties": {"keys": {"type": "array", "maxItems": super::multiread::MAX_KEYS, "items": key}},
            }))
        }
    }
}

fn schemas() -> Value {
    let ts = json!({"type": "string", "format": "date-time"});
    json!({
        "Error": {
            "type": "object", "required": ["error"], "additionalProperties": false,
            "properties": {"error": {
                "type": "object", "required": ["type", "reason"], "additionalProperties": false,
                "properties": {
                    "type": {"type": "string"},
                    "reason": {"type": "string"},
                    "details": {"type": "array", "items": {
                        "type": "object", "required": ["index", "reason"],
                        "properties": {"index": {"type": "integer"}, "reason": {"type": "string"}},
                    }},
                },
            }},
        },
        "Counter": {
            "type": "object",
            "required": ["id", "entity", "action", "uuid", "value", "first_timestamp", "recorded_timestamp"],
            "properties": {
                "id": {"type": "string"}, "entity": {"type": "string"}, "action": {"type": "string"},
                "uuid": {"type": "string"}, "value": {"type": "integer", "format": "int64"},
                "category": {"type": "string"}, "first_timestamp": ts, "recorded_timestamp": ts,
            },
        },
        "TargetCounters": {
            "type": "object", "required": ["entity", "uuid", "counters"],
            "properties": {"counters": {"type": "array", "items": {"$ref": "#/components/schemas/Counter"}}},
        },
        "EventsAccepted": {
            "type": "object", "required": ["accepted", "duplicates"],
            "properties": {"accepted": {"type": "integer"}, "duplicates": {"type": "integer"}},
        },
        "Average": {
            "type": "object", "required": ["sum", "quantity", "average"],
            "properties": {
                "sum": {"type": "integer"}, "quantity": {"type": "integer"},
                "average": {"type": "number", "nullable": true},
            },
        },
        "Histogram": {
            "type": "object", "required": ["total", "buckets"],
            "properties": {"total": {"type": "integer"}, "buckets": {"type": "array", "items": {
                "type": "object", "required": ["day", "value"],
                "properties": {"day": {"type": "string"}, "value": {"type": "integer"}},
            }}},
        },
        "DaySet": {
            "type": "object", "required": ["day", "value", "previous"],
            "properties": {
                "day": {"type": "string", "format": "date"},
                "value": {"type": "integer", "format": "int64"},
                "previous": {"type": "integer", "format": "int64"},
                "counter": {"$ref": "#/components/schemas/Counter"},
            },
        },
        "DaysSet": {
            "type": "object", "required": ["set", "changed"],
            "properties": {"set": {"type": "integer"}, "changed": {"type": "integer"}},
        },
        "Deleted": {"type": "object", "required": ["deleted"], "properties": {"deleted": {"type": "boolean"}}},
        "Status": {"type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}},
        "Object": {"type": "object"},
        "Metrics": {"type": "string"},
        "CounterValues": {
            "type": "object", "required": ["counters"], "additionalProperties": false,
            "properties": {"counters": {"type": "array", "items": {
                "type": "object", "additionalProperties": false,
                "required": ["id", "entity", "action", "uuid", "found", "value"],
                "properties": {
                    "id": {"type": "string"}, "entity": {"type": "string"}, "action": {"type": "string"},
                    "uuid": {"type": "string"},
                    "found": {"type": "boolean", "description": "false: never counted (value 0, no category nor timestamps)"},
                    "value": {"type": "integer", "format": "int64"},
                    "category": {"type": "string"}, "first_timestamp": ts, "recorded_timestamp": ts,
                },
            }}},
        },
    })
}

/// The description, for a gateway with (`keyed`) or without API keys and
/// `max_events` events per batch.
pub fn document(keyed: bool, max_events: usize) -> Value {
    let mut paths = Map::new();
    for op in OPERATIONS {
        let mut params = Vec::new();
        for p in op.params {
            params.push(match p {
                Param::Name(n) => json!({"name": n, "in": "path", "required": true, "schema": name_schema()}),
                Param::Query(n, kind) => json!({"name": n, "in": "query", "required": false, "schema": query_schema(kind)}),
                Param::Required(n, kind) => json!({"name": n, "in": "query", "required": true, "schema": query_schema(kind)}),
                Param::Day(n) => json!({"name": n, "in": "path", "required": true, "schema": query_schema("day")}),
            });
        }
        if op.role.is_some() {
            params.push(
                json!({"name": "X-Tenant", "in": "header", "required": false,
                "description": "The tenant, when the key is not bound to one",
                "schema": {"type": "string", "pattern": "^[a-z0-9][a-z0-9-]{0,63}$"}}),
            );
        }
        let mut responses = Map::new();
        let (ok, schema) = op.ok;
        let content = if let Some(media) = static_media_type(schema) {
            json!({media: {"schema": {"type": "string"}}})
        } else if op.path == "/v1/reports/stale" {
            json!({"application/json": {"schema": {"$ref": "#/components/schemas/Object"}},
                   "text/csv": {"schema": {"type": "string"}}})
        } else {
            json!({"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}})
        };
        let mut success = json!({"description": "Success", "content": content});
        if op.path == "/v1/counters" {
            success["headers"] = json!({
                "ETag": {"schema": {"type": "string"}, "description": "Strong; from the answer's bytes"},
                "Cache-Control": {"schema": {"type": "string"}, "description": "public, max-age=N with --counters-cache-max-age, else no-cache"},
            });
        }
        responses.insert(ok.to_string(), success);
        let mut errors: Vec<u16> = op.errors.to_vec();
        if op.role.is_some() {
            errors.extend_from_slice(KEYED_ERRORS);
            if keyed {
                errors.extend_from_slice(&[401, 403]);
            }
        }
        if op.body != Body::None {
            errors.extend_from_slice(&[400, 413, 415]);
        }
        // Any request may be refused by the request timeout.
        errors.push(503);
        errors.sort_unstable();
        errors.dedup();
        for s in errors {
            if s == 304 {
                responses.insert(s.to_string(), json!({"description": reason(s)}));
                continue;
            }
            let mut r = json!({"description": reason(s),
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}});
            if matches!(s, 429 | 503) {
                r["headers"] = json!({"Retry-After": {"schema": {"type": "integer"}}});
            }
            if s == 401 {
                r["headers"] = json!({"WWW-Authenticate": {"schema": {"type": "string"}}});
            }
            responses.insert(s.to_string(), r);
        }
        let mut o = json!({
            "summary": op.summary,
            "operationId": format!("{}{}", op.method, op.path.replace(['/', '{', '}', '.', '-'], "_")),
            "parameters": params,
            "responses": responses,
        });
        if let Some(role) = op.role {
            o["description"] = json!(if role == Role::Public {
                "Needs a `public` key (or `read`, `admin`) when keys are configured; answers to a `public` key carry `Access-Control-Allow-Origin: *`.".to_string()
            } else {
                format!("Needs a `{role}` key (or `admin`) when keys are configured.")
            });
            if keyed {
                o["security"] = json!([{"bearer": []}, {"key": []}]);
            }
        }
        if let Some(schema) = body_schema(op.body, max_events) {
            let required = matches!(
                op.body,
                Body::Events | Body::Sample | Body::Keys | Body::Day | Body::Days
            );
            o["requestBody"] = json!({"required": required, "content": {
                "application/json": {"schema": schema},
                "text/plain": {"schema": {"type": "string"}},
            }});
        }
        let entry = paths
            .entry(op.path.to_string())
            .or_insert_with(|| json!({}));
        entry[op.method] = o;
    }
    let mut doc = json!({
        "openapi": "3.0.3",
        "info": {
            "title": "counter-gateway",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Counts views, likes, logins and ratings over HTTP, exactly. Errors: {\"error\": {\"type\", \"reason\"}}.",
        },
        "paths": paths,
        "components": {"schemas": schemas()},
    });
    if keyed {
        doc["components"]["securitySchemes"] = json!({
            "bearer": {"type": "http", "scheme": "bearer"},
            "key": {"type": "apiKey", "in": "query", "name": "key"},
        });
    }
    doc
}

pub async fn openapi(State(gw): State<Gateway>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        document(
            !gw.keys.is_empty(),
            gw.tenants.default_tenant().limits.max_events_per_request,
        )
        .to_string(),
    )
}
