//! A CountAPI-compatible surface: the GET endpoints of the hosted hit
//! counter that shut down in 2023, under `/countapi/`, so a page written
//! for it works once its base URL names the gateway:
//! `/countapi/hit/{namespace}/{key}` (and the other verbs), the namespace
//! optional (`default`), answering CountAPI's shapes (`{"value": N}`).
//!
//! Each pair is an ordinary counter, `countapi/<namespace>/<key>`
//! (`crate::domain::countapi`): `hit` and `update` are increments through
//! the write pipeline (durable before the answer, known crawlers left out,
//! limits per actor as for any write), `set` is the set-value path, and
//! every other endpoint reads them. What `create` records (a namespace's
//! admin key, as its SHA-256; a key's rules) is kept by the store.
//!
//! Every answer is `Cache-Control: no-store` (a count must never come
//! from a cache, and every hit must reach the gateway) and readable by any
//! page (`Access-Control-Allow-Origin: *`): CountAPI's counters are
//! public to whoever knows their names, and this surface reaches no other
//! counter. `?callback=` wraps an answer as JSONP, as CountAPI did, for
//! pages that load it with a `<script>` tag. Who may call what is in
//! [`CountReader`], [`CountWriter`] and [`CountCreator`]; the guide's
//! "A CountAPI-compatible surface" says it whole.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::{header, request::Parts, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::access;
use super::crawlers::{self, Crawler};
use super::extract::{PathParams, QueryParams};
use super::openapi::{Exists, NotFound, Overflow};
use super::pixel::{self, Viewed};
use super::{AppState, Gateway};
use crate::auth::Role;
use crate::domain::countapi::{self, Created, Creation, KeyRules, Records, DEFAULT_NAMESPACE};
use crate::domain::{format_ms, CounterKey, CounterSet, IncrementSpec};
use crate::error::ApiError;
use crate::store::StoreError;

/// The tenant's app for `get` and `info`, reads of counters by their
/// names as the multi-read's: a `public`, `read` or `admin` key, or none
/// on a keyless gateway. Opens no tenant.
pub struct CountReader(Arc<AppState>);

impl FromRequestParts<Arc<Gateway>> for CountReader {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, gw: &Arc<Gateway>) -> Result<Self, ApiError> {
        let (tenant, _) = access::authorize_from(parts, gw, Role::Public, true)?;
        let app = gw
            .tenants
            .reader(&tenant)
            .await
            .map_err(access::tenant_error)?;
        Ok(CountReader(app))
    }
}

/// The tenant's app for `hit`, `update` and `set`, which write and answer
/// the counter: as a badge with `count=true`, a key that may both, so an
/// `admin` key, or a `write` key on a gateway run with
/// `--write-keys-read-values` (else a `write` key, which is in pages,
/// would read any CountAPI counter by an `update` of 0); anyone on a
/// keyless gateway, except pages of other sites.
pub struct CountWriter(Arc<AppState>);

impl FromRequestParts<Arc<Gateway>> for CountWriter {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, gw: &Arc<Gateway>) -> Result<Self, ApiError> {
        let (tenant, role) = access::authorize_from(parts, gw, Role::Write, true)?;
        if role == Some(Role::Write) && !gw.write_keys_read_values {
            return Err(ApiError::Forbidden(
                "a write key counts but reads no counter, and CountAPI answers the counter: these take an admin key, or a write key on a gateway run with --write-keys-read-values"
                    .into(),
            ));
        }
        let app = gw
            .tenants
            .writer(&tenant)
            .await
            .map_err(access::tenant_error)?;
        Ok(CountWriter(app))
    }
}

/// The tenant's app for `create`, which makes namespaces and their admin
/// keys: an `admin` key, sent as `Authorization: Bearer` (CountAPI's own
/// `key` parameter names the counter), or anyone on a keyless gateway,
/// bounded by [`countapi::MAX_NAMESPACES`] and
/// [`countapi::MAX_CREATED_KEYS`] per tenant.
pub struct CountCreator(Arc<AppState>);

impl FromRequestParts<Arc<Gateway>> for CountCreator {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, gw: &Arc<Gateway>) -> Result<Self, ApiError> {
        let (tenant, _) = access::authorize_from(parts, gw, Role::Admin, false)?;
        let app = gw
            .tenants
            .writer(&tenant)
            .await
            .map_err(access::tenant_error)?;
        Ok(CountCreator(app))
    }
}

/// A key in a namespace.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct NsKeyPath {
    /// `^[A-Za-z0-9_\-.]{3,64}$`, as CountAPI's.
    #[param(pattern = r"^[A-Za-z0-9_\-.]{3,64}$")]
    namespace: String,
    /// `^[A-Za-z0-9_\-.]{3,64}$`, as CountAPI's.
    #[param(pattern = r"^[A-Za-z0-9_\-.]{3,64}$")]
    key: String,
}

/// A key of the namespace `default`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct KeyPath {
    /// `^[A-Za-z0-9_\-.]{3,64}$`, as CountAPI's.
    #[param(pattern = r"^[A-Za-z0-9_\-.]{3,64}$")]
    key: String,
}

impl From<KeyPath> for NsKeyPath {
    fn from(p: KeyPath) -> NsKeyPath {
        NsKeyPath {
            namespace: DEFAULT_NAMESPACE.into(),
            key: p.key,
        }
    }
}

impl NsKeyPath {
    /// The counter, the names checked by CountAPI's rule (400 naming which).
    fn counter(&self) -> Result<CounterKey, ApiError> {
        countapi::counter_key(&self.namespace, &self.key).map_err(ApiError::BadRequest)
    }
}

/// `get`, `hit` and `info` take only the JSONP callback.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PlainQuery {
    /// JSONP: answer `callback({...});` as JavaScript (a name of letters,
    /// digits, `_` and `$`, dotted parts allowed; at most 64 characters).
    #[param(
        pattern = r"^[A-Za-z_$][A-Za-z0-9_$]*(\.[A-Za-z_$][A-Za-z0-9_$]*)*$",
        max_length = 64
    )]
    callback: Option<String>,
    /// CountAPI's `?img`: answer a 1x1 transparent GIF instead of JSON
    /// (for an `<img>` tag); a refusal stays JSON.
    img: Option<String>,
}

/// `update`'s parameters.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct UpdateQuery {
    /// What to add (negative: subtract), a signed 64-bit integer inside
    /// the key's bounds (`update_lowerbound`..`update_upperbound`, by
    /// default -1..1) unless `admin_key` is the namespace's.
    #[param(value_type = i64)]
    amount: Option<String>,
    /// The namespace's admin key (from `create`): an `amount` outside the bounds.
    admin_key: Option<String>,
    #[param(
        pattern = r"^[A-Za-z_$][A-Za-z0-9_$]*(\.[A-Za-z_$][A-Za-z0-9_$]*)*$",
        max_length = 64
    )]
    callback: Option<String>,
    /// CountAPI's `?img`: answer a 1x1 transparent GIF instead of JSON
    /// (for an `<img>` tag); a refusal stays JSON.
    img: Option<String>,
}

/// `set`'s parameters.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct SetQuery {
    /// The key's new value, a signed 64-bit integer.
    #[param(value_type = i64)]
    value: Option<String>,
    /// The namespace's admin key (from `create`); not needed for a key
    /// created with `enable_reset=1`.
    admin_key: Option<String>,
    #[param(
        pattern = r"^[A-Za-z_$][A-Za-z0-9_$]*(\.[A-Za-z_$][A-Za-z0-9_$]*)*$",
        max_length = 64
    )]
    callback: Option<String>,
    /// CountAPI's `?img`: answer a 1x1 transparent GIF instead of JSON
    /// (for an `<img>` tag); a refusal stays JSON.
    img: Option<String>,
}

/// `create`'s parameters, as CountAPI's.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct CreateQuery {
    /// Default `default`.
    #[param(pattern = r"^[A-Za-z0-9_\-.]{3,64}$")]
    namespace: Option<String>,
    /// The key to make (CountAPI's, not an API key); default a random UUID.
    #[param(pattern = r"^[A-Za-z0-9_\-.]{3,64}$")]
    key: Option<String>,
    /// The initial value, default 0.
    #[param(value_type = Option<i64>)]
    value: Option<String>,
    /// `1` (or `true`): `set` needs no admin key for this key. Default `0`.
    #[param(value_type = Option<String>, pattern = "^(0|1|true|false)$")]
    enable_reset: Option<String>,
    /// The lowest `amount` of an `update` without the admin key, at most 0; default -1.
    #[param(value_type = Option<i64>, maximum = 0)]
    update_lowerbound: Option<String>,
    /// The highest `amount` of an `update` without the admin key, at least 0; default 1.
    #[param(value_type = Option<i64>, minimum = 0)]
    update_upperbound: Option<String>,
    #[param(
        pattern = r"^[A-Za-z_$][A-Za-z0-9_$]*(\.[A-Za-z_$][A-Za-z0-9_$]*)*$",
        max_length = 64
    )]
    callback: Option<String>,
}

/// `{"value": N}`: `get`, `hit`, `update`.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ValueAnswer {
    value: i64,
}

/// `set`: the value before and after.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetAnswer {
    /// The value read just before the set (0 for a key made by `create`
    /// and never counted).
    old_value: i64,
    value: i64,
}

/// `create`: the key made, and the namespace's admin key when this
/// create made the namespace (the only time it is answered).
#[derive(Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateAnswer {
    namespace: String,
    key: String,
    value: i64,
    /// Only from the create that made the namespace: keep it, it is never
    /// shown again (the gateway keeps only its SHA-256).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    admin_key: Option<String>,
}

/// `info`: the key, its rules and value.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InfoAnswer {
    namespace: String,
    key: String,
    /// Always `null`: keys never expire here (CountAPI's expired after
    /// months without a hit).
    #[schema(value_type = Option<i64>)]
    ttl: Option<i64>,
    /// When the key was made (by `create`, or its first `hit`), in
    /// milliseconds since the epoch.
    created: i64,
    /// The same instant, RFC 3339.
    #[schema(format = DateTime)]
    created_at: String,
    update_lowerbound: i64,
    update_upperbound: i64,
    enable_reset: bool,
    value: i64,
}

/// An answer before it is sent: status, JSON, and whether a crawler's
/// write was left out.
struct Answer {
    status: StatusCode,
    body: Value,
    ignored: bool,
}

impl Answer {
    fn ok(body: impl Serialize) -> Result<Answer, ApiError> {
        Ok(Answer {
            status: StatusCode::OK,
            body: serde_json::to_value(body).map_err(|e| ApiError::Internal(e.to_string()))?,
            ignored: false,
        })
    }
}

/// A JSONP callback name, checked: it is written into JavaScript.
fn callback(name: Option<String>) -> Result<Option<String>, ApiError> {
    let Some(name) = name else { return Ok(None) };
    let ident = |p: &str| {
        let mut cs = p.chars();
        cs.next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == '$')
            && cs.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
    };
    if name.len() > 64 || !name.split('.').all(ident) {
        return Err(ApiError::BadRequest(format!(
            "callback must be a JavaScript name (letters, digits, _ and $, dotted parts allowed), at most 64 characters; got {:?}",
            name.chars().take(80).collect::<String>()
        )));
    }
    Ok(Some(name))
}

/// How an answer is sent: JSON, JSONP (`callback`), or CountAPI's GIF (`img`).
enum Output {
    Json,
    Jsonp(String),
    Gif,
}

/// The output the parameters ask for, checked.
fn output(cb: Option<String>, img: Option<String>) -> Result<Output, ApiError> {
    match (callback(cb)?, img) {
        (Some(_), Some(_)) => Err(ApiError::BadRequest(
            "callback and img ask for two kinds of answer; give one".into(),
        )),
        (Some(cb), None) => Ok(Output::Jsonp(cb)),
        (None, Some(_)) => Ok(Output::Gif),
        (None, None) => Ok(Output::Json),
    }
}

/// The answer (or the refusal) with the headers every CountAPI answer
/// has; an answer as JSONP when `out` names a callback, or as the GIF.
/// A refusal stays the API's JSON error with its status, whatever was
/// asked: a 4xx is what a client of any kind must see (a script tag's
/// `onerror`, an image's), and whoever opens the URL reads why.
async fn finish(result: Result<Answer, ApiError>, out: Output) -> Response {
    let ignored = matches!(&result, Ok(a) if a.ignored);
    let mut res = match (result, &out) {
        (Ok(a), Output::Gif) => (
            a.status,
            [(header::CONTENT_TYPE, HeaderValue::from_static("image/gif"))],
            &pixel::GIF[..],
        )
            .into_response(),
        (Ok(a), _) => (a.status, axum::Json(a.body)).into_response(),
        (Err(e), _) => e.into_response(),
    };
    if let (Output::Jsonp(cb), true) = (out, res.status().is_success()) {
        let (mut parts, body) = res.into_parts();
        let bytes = axum::body::to_bytes(body, 64 * 1024)
            .await
            .unwrap_or_default();
        let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        // JSON is JavaScript but for these two, which older engines end
        // a line at: escaped, a reason quoting them stays one string.
        let json = value
            .to_string()
            .replace('\u{2028}', "\\u2028")
            .replace('\u{2029}', "\\u2029");
        let js = format!("/**/ typeof {cb} === 'function' && {cb}({json});");
        parts.headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/javascript; charset=utf-8"),
        );
        parts.headers.remove(header::CONTENT_LENGTH);
        res = Response::from_parts(parts, axum::body::Body::from(js));
    }
    let h = res.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    h.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static("retry-after, x-counter-ignored"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::HeaderName::from_static("cross-origin-resource-policy"),
        HeaderValue::from_static("cross-origin"),
    );
    if ignored {
        h.insert(
            super::edge::IGNORED_HEADER,
            HeaderValue::from_static(crawlers::CRAWLER),
        );
    }
    res
}

/// A signed 64-bit integer parameter, or a 400 naming it.
fn integer(name: &str, given: Option<&str>) -> Result<Option<i64>, ApiError> {
    given
        .map(|v| {
            v.parse::<i64>().map_err(|_| {
                ApiError::BadRequest(format!(
                    "{name} must be an integer from {} to {}; got {v:?}",
                    i64::MIN,
                    i64::MAX
                ))
            })
        })
        .transpose()
}

/// `?admin_key=`, checked against the namespace's record: `true` when it
/// is the admin key, `false` when none was given; a wrong one is a 403
/// (nothing written), whatever the key's rules would allow, so a guess
/// never passes unnoticed.
fn admitted(records: &Records, ns: &str, given: Option<&str>) -> Result<bool, ApiError> {
    let Some(given) = given else { return Ok(false) };
    match &records.namespace {
        Some(n) if n.admits(given) => Ok(true),
        Some(_) => Err(ApiError::Forbidden(format!(
            "admin_key is not the admin key of namespace {ns:?}; nothing was written"
        ))),
        None => Err(ApiError::Forbidden(format!(
            "namespace {ns:?} has no admin key (it was not made by create); nothing was written"
        ))),
    }
}

/// The current value of a pair: the counter's, 0 for a key made by
/// `create` and not counted since (a store that lost the counter), or
/// a 404 when it does not exist.
async fn current(
    app: &AppState,
    path: &NsKeyPath,
    key: &CounterKey,
) -> Result<(i64, Records), ApiError> {
    let counter = app.store.get(key).await?;
    let records = match counter {
        Some(_) => Records::default(),
        None => {
            app.store
                .countapi_records(&path.namespace, &path.key)
                .await?
        }
    };
    match (counter, &records.key) {
        (Some(c), _) => Ok((c.value, records)),
        (None, Some(_)) => Ok((0, records)),
        (None, None) => Err(missing(path)),
    }
}

fn missing(path: &NsKeyPath) -> ApiError {
    ApiError::NotFound(format!(
        "key {:?} of namespace {:?} does not exist (hit or create makes it)",
        path.key, path.namespace
    ))
}

/// Adds `amount` to the pair's counter as a write of the pipeline, as the
/// pixel counts (crawlers left out); a `HEAD` writes nothing and answers
/// the value as it stands.
async fn add(
    app: Arc<AppState>,
    sender: crawlers::Sender,
    method: &Method,
    path: &NsKeyPath,
    amount: i64,
) -> Result<Answer, ApiError> {
    let key = path.counter()?;
    let spec = IncrementSpec {
        entity: countapi::ENTITY,
        action: &path.namespace,
        uuid: &path.key,
        count: Some(amount),
        negate: false,
        category: None,
        timestamp: None,
        id: None,
        actor: None,
        unique: None,
    };
    let inc = pixel::view(&app, &spec)?;
    if *method == Method::HEAD {
        let value = app.store.get(&key).await?.map_or(0, |c| c.value);
        return Answer::ok(ValueAnswer { value });
    }
    match pixel::count_view(app.clone(), sender, inc, None, Some(key.clone())).await? {
        Viewed::Crawler => {
            let value = app.store.get(&key).await?.map_or(0, |c| c.value);
            Ok(Answer {
                status: StatusCode::ACCEPTED,
                body: json!({ "value": value }),
                ignored: true,
            })
        }
        Viewed::Counted { app, applied } => {
            let value = match applied.counter {
                Some(c) => c.value,
                None => app.store.get(&key).await?.map_or(0, |c| c.value),
            };
            Answer::ok(ValueAnswer { value })
        }
    }
}

async fn get_in(app: &AppState, path: NsKeyPath) -> Result<Answer, ApiError> {
    let key = path.counter()?;
    let (value, _) = current(app, &path, &key).await?;
    Answer::ok(ValueAnswer { value })
}

async fn info_in(app: &AppState, path: NsKeyPath) -> Result<Answer, ApiError> {
    let key = path.counter()?;
    let counter = app.store.get(&key).await?;
    let records = app
        .store
        .countapi_records(&path.namespace, &path.key)
        .await?;
    let (created, rules) = match (&records.key, &counter) {
        (Some(k), _) => (k.created_ms, k.rules),
        (None, Some(c)) => (c.first_ms, KeyRules::default()),
        (None, None) => return Err(missing(&path)),
    };
    Answer::ok(InfoAnswer {
        namespace: path.namespace,
        key: path.key,
        ttl: None,
        created,
        created_at: format_ms(created),
        update_lowerbound: rules.update_lowerbound,
        update_upperbound: rules.update_upperbound,
        enable_reset: rules.enable_reset,
        value: counter.map_or(0, |c| c.value),
    })
}

async fn update_in(
    app: Arc<AppState>,
    sender: crawlers::Sender,
    method: &Method,
    path: NsKeyPath,
    query: &UpdateQuery,
) -> Result<Answer, ApiError> {
    path.counter()?;
    let amount = integer("amount", query.amount.as_deref())?.ok_or_else(|| {
        ApiError::BadRequest("amount is missing: /update/{namespace}/{key}?amount=N".into())
    })?;
    let records = app
        .store
        .countapi_records(&path.namespace, &path.key)
        .await?;
    let admin = admitted(&records, &path.namespace, query.admin_key.as_deref())?;
    let rules = records.key.map(|k| k.rules).unwrap_or_default();
    if !admin && !rules.allows(amount) {
        return Err(ApiError::BadRequest(format!(
            "amount {amount} is outside this key's bounds, update_lowerbound {} to update_upperbound {}; nothing was written (the namespace's admin_key allows any amount)",
            rules.update_lowerbound, rules.update_upperbound
        )));
    }
    add(app, sender, method, &path, amount).await
}

async fn set_in(
    app: Arc<AppState>,
    method: &Method,
    path: NsKeyPath,
    query: &SetQuery,
) -> Result<Answer, ApiError> {
    let key = path.counter()?;
    let value = integer("value", query.value.as_deref())?.ok_or_else(|| {
        ApiError::BadRequest("value is missing: /set/{namespace}/{key}?value=N".into())
    })?;
    let (old_value, mut records) = current(&app, &path, &key).await?;
    if records.namespace.is_none() && records.key.is_none() {
        // The counter was found first: its records were not read yet.
        records = app
            .store
            .countapi_records(&path.namespace, &path.key)
            .await?;
    }
    let admin = admitted(&records, &path.namespace, query.admin_key.as_deref())?;
    let reset = records.key.is_some_and(|k| k.rules.enable_reset);
    if !admin && !reset {
        return Err(ApiError::Forbidden(format!(
            "set needs the admin_key of namespace {:?}, or a key created with enable_reset=1; nothing was written",
            path.namespace
        )));
    }
    if *method == Method::HEAD {
        return Answer::ok(SetAnswer {
            old_value,
            value: old_value,
        });
    }
    app.pipeline.admit()?;
    let set = CounterSet::new(
        countapi::ENTITY,
        &path.namespace,
        &path.key,
        value,
        None,
        app.clock.now(),
    )
    .map_err(ApiError::BadRequest)?;
    let app = app.opened().await?;
    let counter = app.store.set_value(set).await.map_err(set_failed)?;
    Answer::ok(SetAnswer {
        old_value,
        value: counter.value,
    })
}

fn set_failed(e: StoreError) -> ApiError {
    match e {
        e @ StoreError::Unavailable(_) => ApiError::store(
            "the store did not take the set; it may or may not be applied, and sending the same set again is safe",
            e,
        ),
        e => e.into(),
    }
}

#[utoipa::path(get, path = "/countapi/get/{namespace}/{key}",
    summary = "CountAPI: a key's value, `{\"value\": N}`",
    params(NsKeyPath, PlainQuery), security(("bearer" = ["public"]), ("key" = ["public"])),
    responses((status = 200, description = "The value; `application/javascript` with `callback`",
        content((ValueAnswer = "application/json"), (String = "application/javascript"), (inline(crate::api::openapi::Gif) = "image/gif")),
        headers(("Cache-Control" = String, description = "`no-store`"))), NotFound))]
pub async fn get(
    CountReader(app): CountReader,
    PathParams(path): PathParams<NsKeyPath>,
    QueryParams(q): QueryParams<PlainQuery>,
) -> Response {
    let cb = output(q.callback, q.img);
    run(cb, get_in(&app, path)).await
}

#[utoipa::path(get, path = "/countapi/get/{key}",
    summary = "CountAPI: a key's value in the namespace `default`",
    params(KeyPath, PlainQuery), security(("bearer" = ["public"]), ("key" = ["public"])),
    responses((status = 200, description = "The value",
        content((ValueAnswer = "application/json"), (String = "application/javascript"), (inline(crate::api::openapi::Gif) = "image/gif"))), NotFound))]
pub async fn get_default(
    CountReader(app): CountReader,
    PathParams(path): PathParams<KeyPath>,
    QueryParams(q): QueryParams<PlainQuery>,
) -> Response {
    let cb = output(q.callback, q.img);
    run(cb, get_in(&app, path.into())).await
}

/// Runs the call (a future: nothing of it runs unless awaited) once the
/// output asked for checked out, and finishes its answer.
async fn run(
    out: Result<Output, ApiError>,
    call: impl std::future::Future<Output = Result<Answer, ApiError>>,
) -> Response {
    match out {
        Err(e) => finish(Err(e), Output::Json).await,
        Ok(out) => finish(call.await, out).await,
    }
}

#[utoipa::path(get, path = "/countapi/hit/{namespace}/{key}",
    summary = "CountAPI: add one to a key (made if new) and answer its value once durable",
    params(NsKeyPath, PlainQuery), security(("bearer" = ["write"]), ("key" = ["write"])),
    responses((status = 200, description = "Counted; the value after it. `HEAD` counts nothing",
        content((ValueAnswer = "application/json"), (String = "application/javascript"), (inline(crate::api::openapi::Gif) = "image/gif")),
        headers(("Cache-Control" = String, description = "`no-store`"))),
        (status = 202, description = crawlers::IGNORED_DESCRIPTION,
            content((ValueAnswer = "application/json"), (inline(crate::api::openapi::Gif) = "image/gif")),
            headers(("X-Counter-Ignored" = String, description = "`crawler`: why nothing was counted"))),
        Overflow))]
pub async fn hit(
    CountWriter(app): CountWriter,
    Crawler(sender): Crawler,
    method: Method,
    PathParams(path): PathParams<NsKeyPath>,
    QueryParams(q): QueryParams<PlainQuery>,
) -> Response {
    let cb = output(q.callback, q.img);
    run(cb, async move { add(app, sender, &method, &path, 1).await }).await
}

#[utoipa::path(get, path = "/countapi/hit/{key}",
    summary = "CountAPI: `hit` in the namespace `default`",
    params(KeyPath, PlainQuery), security(("bearer" = ["write"]), ("key" = ["write"])),
    responses((status = 200, description = "Counted; the value after it",
        content((ValueAnswer = "application/json"), (String = "application/javascript"), (inline(crate::api::openapi::Gif) = "image/gif"))),
        (status = 202, description = crawlers::IGNORED_DESCRIPTION,
            content((ValueAnswer = "application/json"), (inline(crate::api::openapi::Gif) = "image/gif"))),
        Overflow))]
pub async fn hit_default(
    CountWriter(app): CountWriter,
    Crawler(sender): Crawler,
    method: Method,
    PathParams(path): PathParams<KeyPath>,
    QueryParams(q): QueryParams<PlainQuery>,
) -> Response {
    let cb = output(q.callback, q.img);
    let path: NsKeyPath = path.into();
    run(cb, async move { add(app, sender, &method, &path, 1).await }).await
}

#[utoipa::path(get, path = "/countapi/update/{namespace}/{key}",
    summary = "CountAPI: add `amount` (inside the key's bounds, or any with the namespace's admin_key)",
    params(NsKeyPath, UpdateQuery), security(("bearer" = ["write"]), ("key" = ["write"])),
    responses((status = 200, description = "Counted; the value after it",
        content((ValueAnswer = "application/json"), (String = "application/javascript"), (inline(crate::api::openapi::Gif) = "image/gif"))),
        (status = 202, description = crawlers::IGNORED_DESCRIPTION,
            content((ValueAnswer = "application/json"), (inline(crate::api::openapi::Gif) = "image/gif"))),
        Overflow))]
pub async fn update(
    CountWriter(app): CountWriter,
    Crawler(sender): Crawler,
    method: Method,
    PathParams(path): PathParams<NsKeyPath>,
    QueryParams(q): QueryParams<UpdateQuery>,
) -> Response {
    let cb = output(q.callback.clone(), q.img.clone());
    run(cb, async move {
        update_in(app, sender, &method, path, &q).await
    })
    .await
}

#[utoipa::path(get, path = "/countapi/update/{key}",
    summary = "CountAPI: `update` in the namespace `default`",
    params(KeyPath, UpdateQuery), security(("bearer" = ["write"]), ("key" = ["write"])),
    responses((status = 200, description = "Counted; the value after it",
        content((ValueAnswer = "application/json"), (String = "application/javascript"), (inline(crate::api::openapi::Gif) = "image/gif"))),
        (status = 202, description = crawlers::IGNORED_DESCRIPTION,
            content((ValueAnswer = "application/json"), (inline(crate::api::openapi::Gif) = "image/gif"))),
        Overflow))]
pub async fn update_default(
    CountWriter(app): CountWriter,
    Crawler(sender): Crawler,
    method: Method,
    PathParams(path): PathParams<KeyPath>,
    QueryParams(q): QueryParams<UpdateQuery>,
) -> Response {
    let cb = output(q.callback.clone(), q.img.clone());
    run(cb, async move {
        update_in(app, sender, &method, path.into(), &q).await
    })
    .await
}

#[utoipa::path(get, path = "/countapi/set/{namespace}/{key}",
    summary = "CountAPI: set a key's value (the namespace's admin_key, or a key made with enable_reset=1)",
    params(NsKeyPath, SetQuery), security(("bearer" = ["write"]), ("key" = ["write"])),
    responses((status = 200, description = "Set, durably; the value before and after",
        content((SetAnswer = "application/json"), (String = "application/javascript"), (inline(crate::api::openapi::Gif) = "image/gif"))),
        NotFound))]
pub async fn set(
    CountWriter(app): CountWriter,
    method: Method,
    PathParams(path): PathParams<NsKeyPath>,
    QueryParams(q): QueryParams<SetQuery>,
) -> Response {
    let cb = output(q.callback.clone(), q.img.clone());
    run(cb, async move { set_in(app, &method, path, &q).await }).await
}

#[utoipa::path(get, path = "/countapi/set/{key}",
    summary = "CountAPI: `set` in the namespace `default`",
    params(KeyPath, SetQuery), security(("bearer" = ["write"]), ("key" = ["write"])),
    responses((status = 200, description = "Set, durably; the value before and after",
        content((SetAnswer = "application/json"), (String = "application/javascript"), (inline(crate::api::openapi::Gif) = "image/gif"))),
        NotFound))]
pub async fn set_default(
    CountWriter(app): CountWriter,
    method: Method,
    PathParams(path): PathParams<KeyPath>,
    QueryParams(q): QueryParams<SetQuery>,
) -> Response {
    let cb = output(q.callback.clone(), q.img.clone());
    run(
        cb,
        async move { set_in(app, &method, path.into(), &q).await },
    )
    .await
}

#[utoipa::path(get, path = "/countapi/info/{namespace}/{key}",
    summary = "CountAPI: a key's rules, creation time and value",
    params(NsKeyPath, PlainQuery), security(("bearer" = ["public"]), ("key" = ["public"])),
    responses((status = 200, description = "The key",
        content((InfoAnswer = "application/json"), (String = "application/javascript"), (inline(crate::api::openapi::Gif) = "image/gif"))),
        NotFound))]
pub async fn info(
    CountReader(app): CountReader,
    PathParams(path): PathParams<NsKeyPath>,
    QueryParams(q): QueryParams<PlainQuery>,
) -> Response {
    let cb = output(q.callback, q.img);
    run(cb, info_in(&app, path)).await
}

#[utoipa::path(get, path = "/countapi/info/{key}",
    summary = "CountAPI: `info` in the namespace `default`",
    params(KeyPath, PlainQuery), security(("bearer" = ["public"]), ("key" = ["public"])),
    responses((status = 200, description = "The key",
        content((InfoAnswer = "application/json"), (String = "application/javascript"), (inline(crate::api::openapi::Gif) = "image/gif"))),
        NotFound))]
pub async fn info_default(
    CountReader(app): CountReader,
    PathParams(path): PathParams<KeyPath>,
    QueryParams(q): QueryParams<PlainQuery>,
) -> Response {
    let cb = output(q.callback, q.img);
    run(cb, info_in(&app, path.into())).await
}

/// `create`'s query, read whole: its `key` is CountAPI's (the counter's),
/// which the access layer's extractor would leave out; `tenant` is the
/// access layer's.
fn create_query(uri: &axum::http::Uri) -> Result<CreateQuery, ApiError> {
    let query = uri.query().unwrap_or_default();
    let kept: Vec<&str> = query
        .split('&')
        .filter(|p| p.split('=').next() != Some("tenant"))
        .collect();
    let uri: axum::http::Uri = format!("/?{}", kept.join("&"))
        .parse()
        .map_err(|_| ApiError::BadRequest("bad query string".into()))?;
    axum::extract::Query::<CreateQuery>::try_from_uri(&uri)
        .map(|q| q.0)
        .map_err(|e| ApiError::BadRequest(format!("bad query string: {}", e.body_text())))
}

async fn create_in(
    app: Arc<AppState>,
    method: &Method,
    q: CreateQuery,
) -> Result<Answer, ApiError> {
    let namespace = q.namespace.unwrap_or_else(|| DEFAULT_NAMESPACE.into());
    let key = match q.key {
        Some(k) => k,
        None => countapi::random_key().map_err(ApiError::Internal)?,
    };
    let counter = countapi::counter_key(&namespace, &key).map_err(ApiError::BadRequest)?;
    let value = integer("value", q.value.as_deref())?.unwrap_or(0);
    let enable_reset = match q.enable_reset.as_deref() {
        None | Some("0") | Some("false") => false,
        Some("1") | Some("true") => true,
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "enable_reset must be 0 or 1 (or false, true); got {other:?}"
            )))
        }
    };
    let defaults = KeyRules::default();
    let lower = integer("update_lowerbound", q.update_lowerbound.as_deref())?
        .unwrap_or(defaults.update_lowerbound);
    let upper = integer("update_upperbound", q.update_upperbound.as_deref())?
        .unwrap_or(defaults.update_upperbound);
    let rules = KeyRules::new(enable_reset, lower, upper).map_err(ApiError::BadRequest)?;
    let exists = || {
        ApiError::Conflict(format!(
            "key {key:?} of namespace {namespace:?} exists already; nothing was written"
        ))
    };
    if app.store.get(&counter).await?.is_some() {
        return Err(exists());
    }
    if *method == Method::HEAD {
        return Answer::ok(CreateAnswer {
            namespace,
            key,
            value,
            admin_key: None,
        });
    }
    app.pipeline.admit()?;
    let admin_key = countapi::random_hex(16).map_err(ApiError::Internal)?;
    let app = app.opened().await?;
    let made = app
        .store
        .countapi_create(Creation {
            namespace: namespace.clone(),
            key: key.clone(),
            rules,
            admin_key_sha256: crate::auth::digest(&admin_key),
            now_ms: app.clock.now_ms(),
        })
        .await?;
    let made_namespace = match made {
        Created::Made { namespace } => namespace,
        Created::KeyExists => return Err(exists()),
        Created::Full(what) => {
            return Err(ApiError::Forbidden(format!(
                "this tenant holds the most {what} it may ({} namespaces, {} keys made by create); nothing was written",
                countapi::MAX_NAMESPACES,
                countapi::MAX_CREATED_KEYS
            )))
        }
    };
    // The counter itself, so that every endpoint sees the key at once.
    let set = CounterSet::new(
        countapi::ENTITY,
        &namespace,
        &key,
        value,
        None,
        app.clock.now(),
    )
    .map_err(ApiError::BadRequest)?;
    let counter = app.store.set_value(set).await.map_err(|e| {
        ApiError::store(
            "the key was recorded but its counter was not set: the key reads 0 until it is counted or set (the admin key of a namespace this create made is lost: ask the operator)",
            e,
        )
    })?;
    Answer::ok(CreateAnswer {
        namespace,
        key,
        value: counter.value,
        admin_key: made_namespace.then_some(admin_key),
    })
}

#[utoipa::path(get, path = "/countapi/create",
    summary = "CountAPI: make a key (and its namespace, answering the namespace's admin key once)",
    params(CreateQuery), security(("bearer" = ["admin"])),
    responses((status = 200, description = "Made, durably; `admin_key` only when this create made the namespace",
        content((CreateAnswer = "application/json"), (String = "application/javascript"))),
        Exists))]
pub async fn create(
    CountCreator(app): CountCreator,
    method: Method,
    uri: axum::http::Uri,
) -> Response {
    let q = match create_query(&uri) {
        Ok(q) => q,
        Err(e) => return finish(Err(e), Output::Json).await,
    };
    let cb = output(q.callback.clone(), None);
    run(cb, async move { create_in(app, &method, q).await }).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn callbacks_are_javascript_names() {
        for ok in ["cb", "jQuery_123", "$", "a.b.c", "_x$1"] {
            assert_eq!(callback(Some(ok.into())).unwrap().as_deref(), Some(ok));
        }
        for bad in [
            "",
            "1cb",
            "a..b",
            "alert(1)",
            "a b",
            "a;b",
            "a-b",
            "</script>",
            &"x".repeat(65),
        ] {
            assert!(callback(Some(bad.into())).is_err(), "{bad}");
        }
        assert_eq!(callback(None).unwrap(), None);
    }

    #[tokio::test]
    async fn jsonp_escapes_the_line_separators_and_leaves_refusals_json() {
        let answer = Answer {
            status: StatusCode::ACCEPTED,
            body: json!({"value": 1, "note": "a\u{2028}b\u{2029}c"}),
            ignored: true,
        };
        let res = finish(Ok(answer), Output::Jsonp("cb".into())).await;
        assert_eq!(res.status(), StatusCode::ACCEPTED);
        assert_eq!(res.headers()["x-counter-ignored"], "crawler");
        let body = axum::body::to_bytes(res.into_body(), 1 << 16)
            .await
            .unwrap();
        let text = std::str::from_utf8(&body).unwrap();
        assert!(
            text.contains("a\\u2028b\\u2029c") && !text.contains(['\u{2028}', '\u{2029}']),
            "{text}"
        );
        let res = finish(
            Err(ApiError::NotFound("no".into())),
            Output::Jsonp("cb".into()),
        )
        .await;
        assert_eq!(res.status(), StatusCode::NOT_FOUND);
        assert_eq!(res.headers()["content-type"], "application/json");
        assert_eq!(res.headers()["cache-control"], "no-store");
    }

    #[test]
    fn integers_name_their_parameter() {
        assert_eq!(integer("amount", Some("-5")).unwrap(), Some(-5));
        assert_eq!(integer("amount", None).unwrap(), None);
        for bad in ["1.5", "", "x", " 5", "9223372036854775808"] {
            let e = integer("amount", Some(bad)).unwrap_err().to_string();
            assert!(e.starts_with("amount must be an integer"), "{bad}: {e}");
        }
    }
}
