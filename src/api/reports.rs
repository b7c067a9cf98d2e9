//! Staleness reports: counters untouched for N days (paged, JSON or CSV) and
//! entity/action pairs nobody touched for N days.

use std::fmt::Write as _;

use super::access::Reader;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::extract::QueryParams;
use super::queries::positive;
use super::AppState;
use crate::domain::{decode_doc_id, format_ms, validate_name, Counter, CounterKey};
use crate::error::ApiError;
use crate::store::StaleQuery;

/// Largest `days`: far past any retention, small enough to never overflow.
const MAX_DAYS: i64 = 100_000;
const DEFAULT_DAYS: i64 = 30;
const DEFAULT_PAGE: i64 = 100;
const MAX_PAGE: i64 = 1000;
/// Response header carrying the next page's cursor (for CSV, which has no envelope).
const NEXT_CURSOR: &str = "x-next-cursor";

/// The cut-off: `days` × 24 h before the app's now.
fn before_ms(app: &AppState, days: i64) -> i64 {
    app.clock.now_ms() - days * 86_400_000
}

/// A cursor is the last row of a page, `(recorded_ms, doc id)`, hex-encoded
/// behind a version tag so clients treat it as opaque.
fn encode_cursor(c: &Counter) -> String {
    let raw = format!("{}:{}", c.recorded_ms, c.key.doc_id());
    let mut out = String::with_capacity(3 + 2 * raw.len());
    out.push_str("c1.");
    for b in raw.bytes() {
        let _ = write!(out, "{b:02x}");
    }
    out
}

fn decode_cursor(raw: &str) -> Result<(i64, CounterKey), ApiError> {
    let bad = || {
        ApiError::BadRequest(format!(
            "cursor {raw:?} is malformed; pass the next_cursor of the previous page unchanged"
        ))
    };
    let hex = raw.strip_prefix("c1.").ok_or_else(bad)?;
    if hex.len() % 2 != 0 || !hex.is_ascii() {
        return Err(bad());
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
        .collect::<Result<Vec<u8>, _>>()
        .map_err(|_| bad())?;
    let text = String::from_utf8(bytes).map_err(|_| bad())?;
    let (ms, id) = text.split_once(':').ok_or_else(bad)?;
    let ms: i64 = ms.parse().map_err(|_| bad())?;
    let (e, a, u) = decode_doc_id(id).ok_or_else(bad)?;
    let key = CounterKey::new(&e, &a, &u).map_err(|_| bad())?;
    Ok((ms, key))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct StaleParams {
    #[param(inline, value_type = Option<crate::api::openapi::Days>)]
    days: Option<String>,
    #[param(inline, value_type = Option<crate::api::openapi::Name>)]
    entity: Option<String>,
    #[param(inline, value_type = Option<crate::api::openapi::Name>)]
    action: Option<String>,
    #[param(inline, value_type = Option<crate::api::openapi::Size>)]
    size: Option<String>,
    cursor: Option<String>,
}

#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = Stale)]
pub struct StaleJson {
    days: i64,
    /// Counters last touched before this instant are in the report.
    #[schema(schema_with = crate::api::openapi::timestamp)]
    before: String,
    counters: Vec<Counter>,
    /// The `cursor` of the next page; `null` on the last.
    #[schema(required = true)]
    next_cursor: Option<String>,
}

fn name(field: &str, raw: Option<String>) -> Result<Option<String>, ApiError> {
    if let Some(v) = &raw {
        validate_name(field, v).map_err(ApiError::BadRequest)?;
    }
    Ok(raw)
}

fn wants_csv(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.to_ascii_lowercase().contains("text/csv"))
}

/// `GET /v1/reports/stale`: counters untouched for `days` (default 30),
/// oldest first, then by entity, action, uuid; `size` rows a page (default
/// 100) and a `next_cursor` while more may follow.
#[utoipa::path(get, path = "/v1/reports/stale",
    summary = "Counters untouched for `days`, oldest first, paged with a cursor (CSV with Accept: text/csv)",
    params(StaleParams), security(("bearer" = ["read"]), ("key" = ["read"])),
    responses((status = 200, description = "Success",
        headers(("X-Next-Cursor" = String,
            description = "CSV only: the `cursor` of the next page, absent on the last")),
        content((StaleJson = "application/json"),
            (inline(crate::api::openapi::StaleCsv) = "text/csv")))))]
pub async fn stale(
    Reader(app): Reader,
    headers: HeaderMap,
    QueryParams(p): QueryParams<StaleParams>,
) -> Result<Response, ApiError> {
    let days = positive("days", p.days.as_deref(), DEFAULT_DAYS, MAX_DAYS)?;
    let size = positive("size", p.size.as_deref(), DEFAULT_PAGE, MAX_PAGE)? as usize;
    let after = p.cursor.as_deref().map(decode_cursor).transpose()?;
    let query = StaleQuery {
        entity: name("entity", p.entity)?,
        action: name("action", p.action)?,
        before_ms: before_ms(&app, days),
        after,
        // One more than a page tells whether another page follows.
        limit: size + 1,
    };
    let mut counters = app.store.stale(&query).await?;
    let next_cursor = if counters.len() > size {
        counters.truncate(size);
        counters.last().map(encode_cursor)
    } else {
        None
    };
    if wants_csv(&headers) {
        let mut res = (
            [(header::CONTENT_TYPE, "text/csv; charset=utf-8")],
            to_csv(&counters),
        )
            .into_response();
        if let Some(c) = next_cursor
            .as_deref()
            .and_then(|c| HeaderValue::from_str(c).ok())
        {
            res.headers_mut().insert(NEXT_CURSOR, c);
        }
        return Ok(res);
    }
    Ok(Json(StaleJson {
        days,
        before: format_ms(query.before_ms),
        counters,
        next_cursor,
    })
    .into_response())
}

/// Leading characters that make a spreadsheet read a cell as a formula
/// (OWASP's list for CSV injection).
const FORMULA_STARTS: [char; 6] = ['=', '+', '-', '@', '\t', '\r'];

/// RFC 4180: a field holding a comma, quote or line break is quoted, with
/// quotes doubled. A field that a spreadsheet would evaluate (a name such
/// as `=HYPERLINK(...)`, sent by anyone with a write key, opened by an
/// operator from the dashboard's "Download CSV") gets a `'` in front,
/// inside the quotes, as OWASP recommends: the cell then shows the text.
fn csv_field(out: &mut String, v: &str) {
    let formula = v.starts_with(FORMULA_STARTS);
    if formula || v.contains([',', '"', '\n', '\r']) {
        out.push('"');
        if formula {
            out.push('\'');
        }
        out.push_str(&v.replace('"', "\"\""));
        out.push('"');
    } else {
        out.push_str(v);
    }
}

fn to_csv(counters: &[Counter]) -> String {
    let mut out =
        String::from("id,entity,action,uuid,value,category,first_timestamp,recorded_timestamp\r\n");
    for c in counters {
        for (i, f) in [
            c.key.doc_id().as_str(),
            &c.key.entity,
            &c.key.action,
            &c.key.uuid,
        ]
        .into_iter()
        .enumerate()
        {
            if i > 0 {
                out.push(',');
            }
            csv_field(&mut out, f);
        }
        let _ = write!(out, ",{},", c.value);
        csv_field(&mut out, c.category.as_deref().unwrap_or(""));
        let _ = write!(
            out,
            ",{},{}\r\n",
            format_ms(c.first_ms),
            format_ms(c.recorded_ms)
        );
    }
    out
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct UnusedParams {
    #[param(inline, value_type = Option<crate::api::openapi::Days>)]
    days: Option<String>,
}

#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = UnusedPair)]
pub struct UnusedPairJson {
    entity: String,
    action: String,
    #[schema(schema_with = crate::api::openapi::timestamp)]
    last_touch: String,
    #[schema(schema_with = crate::api::openapi::wide_integer)]
    total: i128,
    counters: u64,
}

#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = Unused)]
pub struct UnusedJson {
    days: i64,
    #[schema(schema_with = crate::api::openapi::timestamp)]
    before: String,
    pairs: Vec<UnusedPairJson>,
}

/// `GET /v1/reports/unused`: the entity/action pairs none of whose counters
/// was touched for `days` (default 30), least recently touched first, with
/// their last touch, the total of their values and how many counters they have.
#[utoipa::path(get, path = "/v1/reports/unused",
    summary = "Entity/action pairs with no touch in `days`",
    params(UnusedParams), security(("bearer" = ["read"]), ("key" = ["read"])),
    responses((status = 200, description = "Success", body = UnusedJson)))]
pub async fn unused(
    Reader(app): Reader,
    QueryParams(p): QueryParams<UnusedParams>,
) -> Result<Json<UnusedJson>, ApiError> {
    let days = positive("days", p.days.as_deref(), DEFAULT_DAYS, MAX_DAYS)?;
    let before = before_ms(&app, days);
    let pairs = app.store.unused(before).await?;
    Ok(Json(UnusedJson {
        days,
        before: format_ms(before),
        pairs: pairs
            .into_iter()
            .map(|p| UnusedPairJson {
                entity: p.entity,
                action: p.action,
                last_touch: format_ms(p.last_ms),
                total: p.total,
                counters: p.counters,
            })
            .collect(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_reject_tampering() {
        let c = Counter {
            key: CounterKey::new("VIDEO", "user:number_of_logins", "a:b%c").unwrap(),
            value: 1,
            category: None,
            first_ms: 5,
            recorded_ms: 1_700_000_000_000,
        };
        let cursor = encode_cursor(&c);
        assert_eq!(
            decode_cursor(&cursor).unwrap(),
            (c.recorded_ms, c.key.clone())
        );
        // No colon; a doc id of two parts; bad hex; odd length; wrong tag.
        for bad in [
            "",
            "c1.",
            "c1.6162",
            "c1.31323a615f62",
            "c1.zz",
            "c1.3",
            "x1.3a",
        ] {
            assert!(decode_cursor(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn csv_neutralises_every_formula_start_and_only_those() {
        for c in FORMULA_STARTS {
            let v = format!("{c}1+1");
            let mut out = String::new();
            csv_field(&mut out, &v);
            assert_eq!(out, format!("\"'{c}1+1\""), "{c:?}");
            // Inside a field, they are text already.
            let mut out = String::new();
            csv_field(&mut out, &format!("a{c}b"));
            let quoted = c == '\r';
            assert_eq!(out.starts_with('"'), quoted, "{c:?}: {out}");
            assert!(!out.contains('\''), "{c:?}: {out}");
        }
        // A formula with quotes and commas: one field, quotes doubled.
        let mut out = String::new();
        csv_field(&mut out, "=HYPERLINK(\"http://x\",\"y\")");
        assert_eq!(out, "\"'=HYPERLINK(\"\"http://x\"\",\"\"y\"\")\"");
        let mut out = String::new();
        csv_field(&mut out, "plain");
        assert_eq!(out, "plain");
    }

    #[test]
    fn csv_quotes_what_needs_it() {
        let c = Counter {
            key: CounterKey::new("A", "b", "say \"hi\", x").unwrap(),
            value: -3,
            category: Some("news".into()),
            first_ms: 0,
            recorded_ms: 0,
        };
        let csv = to_csv(&[c]);
        let line = csv.lines().nth(1).unwrap();
        assert!(
            line.starts_with("\"A_b_say \"\"hi\"\", x\",A,b,\"say \"\"hi\"\", x\",-3,news,"),
            "{line}"
        );
    }
}
