//! Many counters in one read: `POST /v1/counters/get` with up to
//! [`MAX_KEYS`] keys, and `GET /v1/counters?keys=...` with up to
//! [`MAX_GET_KEYS`], for pages and CDNs: a strong `ETag` computed from the
//! answer's bytes, `304` on a matching `If-None-Match`, and `Cache-Control`
//! from `--counters-cache-max-age`. Both answer every key asked, in the
//! order asked (a repeated key at each of its places), a counter never
//! counted as `"found": false, "value": 0`; the whole list is validated
//! before anything is read.

use std::borrow::Cow;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::access::{CounterReader, ACCESS_PARAMS};
use super::extract::{parse_json, JsonBytes};
use super::model::Object;
use super::Gateway;
use crate::domain::{format_ms, validate_name, Counter, CounterKey, Interner};
use crate::error::ApiError;

use super::openapi::NotModified;

/// Keys of one `POST /v1/counters/get`: one `_mget` of this many documents
/// stays well under a megabyte, and one embedded read a few milliseconds.
pub const MAX_KEYS: usize = 1_000;
/// Keys of one `GET /v1/counters`: URLs past about 8 KB are refused by many
/// proxies and CDNs, and a hundred keys of short names fit well below that.
pub const MAX_GET_KEYS: usize = 100;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct KeysBody<'a> {
    #[serde(borrow)]
    #[schema(schema_with = keys_schema)]
    keys: Vec<Object<KeyBody<'a>>>,
}

/// At most [`MAX_KEYS`] keys (attributes take only literals).
fn keys_schema() -> utoipa::openapi::schema::Array {
    use utoipa::PartialSchema;
    utoipa::openapi::schema::ArrayBuilder::new()
        .items(KeyBody::schema())
        .max_items(Some(MAX_KEYS))
        .build()
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct KeyBody<'a> {
    #[serde(borrow)]
    #[schema(schema_with = crate::api::openapi::name)]
    entity: Cow<'a, str>,
    #[serde(borrow)]
    #[schema(schema_with = crate::api::openapi::name)]
    action: Cow<'a, str>,
    #[serde(borrow)]
    #[schema(schema_with = crate::api::openapi::name)]
    uuid: Cow<'a, str>,
}

/// The parts of one asked key, as sent (decoded, not yet validated).
type Parts<'a> = [Cow<'a, str>; 3];

#[utoipa::path(post, path = "/v1/counters/get",
    summary = "Up to 1,000 counters by key in one read, in the order asked, missing ones as found: false and value 0",
    security(("bearer" = ["public"]), ("key" = ["public"])),
    request_body(content((KeysBody = "application/json"), (String = "text/plain"))),
    responses((status = 200, description = "Success", body = Answer)))]
pub async fn post(reader: CounterReader, JsonBytes(body): JsonBytes) -> Result<Response, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::BadRequest(
            "the body is empty; send {\"keys\": [{\"entity\", \"action\", \"uuid\"}, ...]}".into(),
        ));
    }
    let parsed: KeysBody = parse_json(&body)?;
    if parsed.keys.len() > MAX_KEYS {
        return Err(ApiError::BadRequest(format!(
            "keys holds {} keys, over the limit of {MAX_KEYS} per request; nothing was read",
            parsed.keys.len()
        )));
    }
    let parts: Vec<Parts> = parsed
        .keys
        .into_iter()
        .map(|Object(k)| [k.entity, k.action, k.uuid])
        .collect();
    let keys = counter_keys(&parts)?;
    let answer = read(&reader, &keys).await?;
    let mut res = json_response(answer);
    if reader.public {
        public_cors(res.headers_mut());
    }
    Ok(res)
}

#[utoipa::path(get, path = "/v1/counters",
    summary = "Up to 100 counters by key, in the order asked, missing ones as found: false and value 0; cacheable (ETag, 304 on If-None-Match, Cache-Control)",
    params(("keys" = String, Query, description = "entity/action/uuid of each counter, separated by commas, each part percent-encoded (a / or , inside a part as %2F, %2C); at most 100 keys")),
    security(("bearer" = ["public"]), ("key" = ["public"])),
    responses((status = 200, description = "Success", body = Answer, headers(
            ("ETag" = String, description = "Strong; from the answer's bytes"),
            ("Cache-Control" = String, description = "With --counters-cache-max-age: public, max-age=N for a public key or a keyless gateway, private, max-age=N for a read or admin key; else no-cache"))),
        NotModified))]
pub async fn get(
    reader: CounterReader,
    State(gw): State<Arc<Gateway>>,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let keys = keys_of_query(uri.query(), true)?;
    let answer = read(&reader, &keys).await?;
    let tag = etag(&answer);
    let mut res = if none_match(&headers, &tag) {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        json_response(answer)
    };
    let h = res.headers_mut();
    h.insert(
        header::ETAG,
        HeaderValue::from_str(&tag).expect("hex digits in quotes"),
    );
    let cache = match gw.counters_max_age {
        Some(age) => {
            // `public` lets a shared cache keep an answer to a request with
            // `Authorization`; only `Vary` would keep one key's answer from
            // another's, and many CDNs ignore it.
            let scope = if reader.shareable {
                "public"
            } else {
                "private"
            };
            HeaderValue::from_str(&format!("{scope}, max-age={}", age.as_secs())).expect("digits")
        }
        // Caches may keep the answer but must ask each time; with the ETag
        // an unchanged answer costs a 304.
        None => HeaderValue::from_static("no-cache"),
    };
    h.insert(header::CACHE_CONTROL, cache);
    // The key and tenant may come in headers: a shared cache must not give
    // one tenant's answer to a request for another's.
    h.insert(
        header::VARY,
        HeaderValue::from_static("authorization, x-tenant"),
    );
    if reader.public {
        public_cors(h);
    }
    Ok(res)
}

/// Any page may read what a `public` key answers: the key is meant to be in
/// pages, and the request carries it itself (no cookie or other ambient
/// credential a foreign page could borrow).
pub(super) fn public_cors(h: &mut HeaderMap) {
    h.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    h.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static("etag, retry-after"),
    );
}

/// The answer's JSON bytes.
async fn read(reader: &CounterReader, keys: &[CounterKey]) -> Result<Vec<u8>, ApiError> {
    let found = reader.app.store.get_many(keys).await?;
    if found.len() != keys.len() {
        return Err(ApiError::Internal(format!(
            "the store answered {} counters for {} keys",
            found.len(),
            keys.len()
        )));
    }
    let counters: Vec<Entry> = keys
        .iter()
        .zip(&found)
        .map(|(key, counter)| Entry::new(key, counter.as_ref()))
        .collect();
    serde_json::to_vec(&Answer { counters }).map_err(|e| ApiError::Internal(e.to_string()))
}

fn json_response(body: Vec<u8>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

// `deny_unknown_fields` changes nothing in serializing: it tells the
// OpenAPI schema that no other field ever appears.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = CounterValues)]
struct Answer<'a> {
    counters: Vec<Entry<'a>>,
}

/// One asked key: the counter as `GET /v1/counters/{entity}/{action}/{uuid}`
/// answers it plus `found`, or only its key, `found: false` and value 0.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = CounterValue)]
struct Entry<'a> {
    id: String,
    entity: &'a str,
    action: &'a str,
    uuid: &'a str,
    /// false: never counted (value 0, no category nor timestamps).
    found: bool,
    value: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    category: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = crate::api::openapi::timestamp)]
    first_timestamp: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = crate::api::openapi::timestamp)]
    recorded_timestamp: Option<String>,
}

impl<'a> Entry<'a> {
    fn new(key: &'a CounterKey, counter: Option<&'a Counter>) -> Entry<'a> {
        Entry {
            id: key.doc_id(),
            entity: &key.entity,
            action: &key.action,
            uuid: &key.uuid,
            found: counter.is_some(),
            value: counter.map_or(0, |c| c.value),
            category: counter.and_then(|c| c.category.as_deref()),
            first_timestamp: counter.map(|c| format_ms(c.first_ms)),
            recorded_timestamp: counter.map(|c| format_ms(c.recorded_ms)),
        }
    }
}

/// A strong validator: the first 128 bits of the SHA-256 of the answer's
/// bytes. Equal answers (same keys, same counters) have equal bytes on
/// every instance and either store, so they share one tag, and any change
/// of a value, category or timestamp gives another.
pub(super) fn etag(body: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, body);
    let hex: String = d.as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("\"{hex}\"")
}

/// Whether `If-None-Match` matches `tag` (RFC 9110 §13.1.2): `*` (the
/// answer always exists), or a list of entity tags compared weakly (`W/`
/// ignored). Several header lines count as one list; a malformed member
/// matches nothing.
pub(super) fn none_match(headers: &HeaderMap, tag: &str) -> bool {
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.trim() == "*" || entity_tags(v).any(|t| t == tag))
}

/// The entity tags of an `If-None-Match` list, each with its quotes and
/// without `W/`. A member that is not an entity tag is skipped to its comma.
fn entity_tags(list: &str) -> impl Iterator<Item = &str> {
    let mut rest = list;
    std::iter::from_fn(move || loop {
        rest = rest.trim_start_matches([',', ' ', '\t']);
        if rest.is_empty() {
            return None;
        }
        let tagged = rest.strip_prefix("W/").unwrap_or(rest);
        if let Some(end) = tagged.strip_prefix('"').and_then(|t| t.find('"')) {
            let (tag, after) = tagged.split_at(end + 2);
            rest = after;
            return Some(tag);
        }
        rest = rest.find(',').map_or("", |p| &rest[p..]);
    })
}

/// The keys of `?keys=entity/action/uuid,...`: split on `,` and `/` before
/// percent-decoding, so a part may hold either as `%2C` or `%2F`
/// (`encodeURIComponent` writes both so). `key` and `tenant` belong to the
/// access layer; any other parameter is refused.
fn query_keys(query: Option<&str>, post_hint: bool) -> Result<Vec<Parts<'_>>, ApiError> {
    let mut raw = None;
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let name = decode(name, || "a query parameter name".into())?;
        if ACCESS_PARAMS.contains(&&*name) {
            continue;
        }
        if name != "keys" {
            return Err(ApiError::BadRequest(format!(
                "unknown query parameter {name:?}; this endpoint takes keys=entity/action/uuid,..."
            )));
        }
        if raw.replace(value).is_some() {
            return Err(ApiError::BadRequest(
                "keys is given twice; list every key in one keys parameter, separated by commas"
                    .into(),
            ));
        }
    }
    let raw = raw.ok_or_else(|| {
        ApiError::BadRequest(
            "keys is required: keys=entity/action/uuid,... with each part percent-encoded".into(),
        )
    })?;
    if raw.is_empty() {
        return Ok(Vec::new());
    }
    let n = raw.split(',').count();
    if n > MAX_GET_KEYS {
        let over = if post_hint {
            format!("; POST /v1/counters/get takes up to {MAX_KEYS}")
        } else {
            String::new()
        };
        return Err(ApiError::BadRequest(format!(
            "keys holds {n} keys, over the limit of {MAX_GET_KEYS} for GET{over}; nothing was read"
        )));
    }
    raw.split(',')
        .enumerate()
        .map(|(i, item)| {
            let parts: Vec<&str> = item.split('/').collect();
            let [e, a, u] = parts[..] else {
                return Err(ApiError::BadRequest(format!(
                    "keys[{i}] has {} part(s), expected entity/action/uuid (a / or , inside a part percent-encoded, as %2F and %2C)",
                    parts.len()
                )));
            };
            let field = |f: &'static str| move || format!("keys[{i}].{f}");
            Ok([
                decode(e, field("entity"))?,
                decode(a, field("action"))?,
                decode(u, field("uuid"))?,
            ])
        })
        .collect()
}

/// The validated keys of a `?keys=entity/action/uuid,...` query, at most
/// [`MAX_GET_KEYS`], in the order asked: the multi-read's and the live
/// stream's (`GET /v1/stream`) one parsing, so both take and refuse the
/// same lists. `post_hint`: the refusal of too many keys points to the
/// `POST` that takes more.
pub(super) fn keys_of_query(
    query: Option<&str>,
    post_hint: bool,
) -> Result<Vec<CounterKey>, ApiError> {
    let parts = query_keys(query, post_hint)?;
    counter_keys(&parts)
}

/// One counter as the multi-read answers it (`found: false`, value 0 when
/// it does not exist), as JSON: the data of a live stream's event.
pub(super) fn entry_json(key: &CounterKey, counter: Option<&Counter>) -> String {
    serde_json::to_string(&Entry::new(key, counter)).expect("an entry always serializes")
}

/// Percent-decodes a query component (`+` is a space, as in forms).
fn decode(raw: &str, what: impl FnOnce() -> String) -> Result<Cow<'_, str>, ApiError> {
    let bad =
        |what: String| ApiError::BadRequest(format!("{what} is not UTF-8 once percent-decoded"));
    if raw.contains('+') {
        let spaced = raw.replace('+', " ");
        return percent_encoding::percent_decode_str(&spaced)
            .decode_utf8()
            .map(|s| Cow::Owned(s.into_owned()))
            .map_err(|_| bad(what()));
    }
    percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| bad(what()))
}

/// Validates every asked key; the first bad one is named by its index and
/// field (`keys[3].uuid must not be empty`).
fn counter_keys<'a>(parts: &'a [Parts<'a>]) -> Result<Vec<CounterKey>, ApiError> {
    let mut names = Interner::for_batch(parts.len());
    parts
        .iter()
        .enumerate()
        .map(|(i, [e, a, u])| {
            CounterKey::new_in(e, a, u, &mut names).map_err(|reason| {
                for (field, value) in [("entity", e), ("action", a), ("uuid", u)] {
                    if let Err(named) = validate_name(&format!("keys[{i}].{field}"), value) {
                        return ApiError::BadRequest(named);
                    }
                }
                ApiError::BadRequest(format!("keys[{i}]: {reason}"))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inm(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(header::IF_NONE_MATCH, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn if_none_match_takes_lists_weak_tags_and_star() {
        let tag = "\"abc\"";
        for matching in [
            &["\"abc\""][..],
            &["W/\"abc\""],
            &["\"x\", \"abc\""],
            &["\"x\",W/\"abc\" , \"y\""],
            &["\"x\"", "\"abc\""],
            &["*"],
            &[" * "],
            &["garbage, \"abc\""],
            &["\"a,b\", \"abc\""],
        ] {
            assert!(none_match(&inm(matching), tag), "{matching:?}");
        }
        for other in [
            &[][..],
            &["\"abd\""],
            &["abc"],
            &["\"abc"],
            &["\"x\", \"ab\""],
            &["W/abc"],
            &["\"a,\"abc\"\""],
        ] {
            assert!(!none_match(&inm(other), tag), "{other:?}");
        }
    }

    fn query_keys_(query: Option<&str>) -> Result<Vec<Parts<'_>>, ApiError> {
        query_keys(query, true)
    }

    #[test]
    fn query_keys_split_before_decoding() {
        let got = query_keys_(Some("keys=A/V/x,A%2FB/V%2Cw/a+b%20c&key=k&tenant=t")).unwrap();
        let got: Vec<Vec<&str>> = got
            .iter()
            .map(|p| p.iter().map(|s| &**s).collect())
            .collect();
        assert_eq!(got, [vec!["A", "V", "x"], vec!["A/B", "V,w", "a b c"]]);
        assert!(query_keys_(Some("keys=")).unwrap().is_empty());
        for (bad, says) in [
            (None, "keys is required"),
            (Some("key=k"), "keys is required"),
            (Some("keys=A/V/x&keys=A/V/y"), "twice"),
            (
                Some("keys=A/V/x&size=3"),
                "unknown query parameter \"size\"",
            ),
            (Some("keys=A/V/x,A/V"), "keys[1] has 2 part(s)"),
            (Some("keys=A/V/x/y"), "keys[0] has 4 part(s)"),
            (Some("keys=A/V/%FF"), "keys[0].uuid is not UTF-8"),
        ] {
            let e = query_keys_(bad).map(|_| ()).unwrap_err().to_string();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
        let many = format!("keys={}", vec!["A/V/x"; MAX_GET_KEYS + 1].join(","));
        let e = query_keys_(Some(&many))
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(e.contains("101 keys, over the limit of 100"), "{e}");
        let most = format!("keys={}", vec!["A/V/x"; MAX_GET_KEYS].join(","));
        assert_eq!(query_keys_(Some(&most)).unwrap().len(), MAX_GET_KEYS);
    }

    #[test]
    fn a_bad_key_is_named_by_index_and_field() {
        let p = |e: &'static str, a: &'static str, u: &'static str| -> Parts<'static> {
            [e.into(), a.into(), u.into()]
        };
        let long = "u".repeat(500);
        let leaked: &'static str = Box::leak(long.into_boxed_str());
        for (parts, says) in [
            (
                vec![p("A", "V", "x"), p("A", "V", "")],
                "keys[1].uuid must not be empty",
            ),
            (
                vec![p("A\n", "V", "x")],
                "keys[0].entity contains the control character U+000A",
            ),
            (
                vec![p("A", " ", "x")],
                "keys[0].action must contain a visible character",
            ),
            (
                vec![p("A", "V", "x"), p("AAAAAAAAAAAAAAAA", "V", leaked)],
                "keys[1]: the document id",
            ),
        ] {
            let e = counter_keys(&parts).unwrap_err().to_string();
            assert!(e.starts_with(says), "{e}");
        }
        let ok = [p("A", "V", "x"), p("A", "V", "x")];
        assert_eq!(counter_keys(&ok).unwrap().len(), 2);
    }

    #[test]
    fn etags_are_strong_and_follow_the_bytes() {
        let a = etag(b"{\"counters\":[]}");
        assert_eq!(a.len(), 34);
        assert!(a.starts_with('"') && a.ends_with('"') && !a.starts_with("W/"));
        assert_eq!(a, etag(b"{\"counters\":[]}"));
        assert_ne!(a, etag(b"{\"counters\":[ ]}"));
    }
}
