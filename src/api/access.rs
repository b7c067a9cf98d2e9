//! Who may call a handler, and on which tenant's data: the extractors
//! [`Writer`], [`Reader`] and [`Admin`] check the API key (when keys are
//! configured), apply the per-client rate limit, and hand the handler the
//! [`AppState`] of the request's tenant, so handlers stay thin and can only
//! reach the data of that one tenant.
//!
//! The key comes from `Authorization: Bearer <key>`, else the `key` query
//! parameter (a `navigator.sendBeacon` cannot set headers). The tenant is the
//! key's own when it is bound to one; else `X-Tenant` or the `tenant` query
//! parameter; else `default`.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::{header, request::Parts};

use super::{AppState, Gateway};
use crate::auth::{Grant, Role};
use crate::error::ApiError;
use crate::ratelimit::Client;
use crate::tenant::{validate_tenant, TenantError, DEFAULT_TENANT};

/// The query parameters this layer reads; handlers never see them.
pub const ACCESS_PARAMS: [&str; 2] = ["key", "tenant"];

/// The tenant's app, for a request allowed to add (increments, events, samples).
pub struct Writer(pub Arc<AppState>);
/// The tenant's app, for a request allowed to read.
pub struct Reader(pub Arc<AppState>);
/// The tenant's app, for a request allowed to delete.
pub struct Admin(pub Arc<AppState>);
/// The tenant's app, opened if needed, for an admin request that writes
/// (a backfill: it can lower counters, so it is no public write key's).
pub struct AdminWriter(pub Arc<AppState>);

/// A writer opens its tenant when it is not open; a reader (and a delete,
/// which has nothing to remove in a tenant without data) never creates one.
macro_rules! role_extractor {
    ($name:ident, $role:expr, $open:ident) => {
        impl FromRequestParts<Arc<Gateway>> for $name {
            type Rejection = ApiError;

            async fn from_request_parts(
                parts: &mut Parts,
                gw: &Arc<Gateway>,
            ) -> Result<Self, ApiError> {
                let (tenant, _) = authorize(parts, gw, $role)?;
                gw.tenants
                    .$open(&tenant)
                    .await
                    .map($name)
                    .map_err(tenant_error)
            }
        }
    };
}

role_extractor!(Writer, Role::Write, writer);
role_extractor!(Reader, Role::Read, reader);
role_extractor!(Admin, Role::Admin, reader);
role_extractor!(AdminWriter, Role::Admin, writer);

/// What the answer to a single counting write (increment, decrement,
/// average sample) may show of its counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disclosure {
    /// The counter as it stands after the write (value, category,
    /// timestamps): for a keyless gateway, `read` and `admin` keys, and
    /// `write` keys with `--write-keys-read-values`.
    Counter,
    /// Only whether the write was counted: a `write` key is in public
    /// pages, and with the counter in its answers any visitor could read
    /// any counter (a decrement that changes nothing is a free read).
    Outcome,
}

/// [`Writer`] for a single counting write (increment, decrement, average
/// sample), with what its answer may show.
pub struct CounterWriter {
    pub app: Arc<AppState>,
    pub disclosure: Disclosure,
}

impl FromRequestParts<Arc<Gateway>> for CounterWriter {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, gw: &Arc<Gateway>) -> Result<Self, ApiError> {
        CounterWriter::from_parts(parts, gw).await
    }
}

impl CounterWriter {
    /// The extractor's work, for the increment's fast path too (`super::fast`).
    pub(super) async fn from_parts(parts: &Parts, gw: &Gateway) -> Result<Self, ApiError> {
        let (tenant, role) = authorize(parts, gw, Role::Write)?;
        let app = gw.tenants.writer(&tenant).await.map_err(tenant_error)?;
        let disclosure = if role == Some(Role::Write) && !gw.write_keys_read_values {
            Disclosure::Outcome
        } else {
            Disclosure::Counter
        };
        Ok(CounterWriter { app, disclosure })
    }
}

/// The tenant's app, for a request allowed to read counters by their keys
/// (the multi-read): a `public` key, or any key that may read. `public`
/// says the key was a `public` one, whose answers any web page may read
/// (CORS), since the key is meant to be in pages. `shareable` says a
/// shared cache may keep the answer for everyone: a `public` key's (it is
/// in pages anyway) or a keyless gateway's, never one made with a private
/// (`read`, `admin`) key, which a CDN ignoring `Vary` would hand out.
pub struct CounterReader {
    pub app: Arc<AppState>,
    /// The tenant's name: a live stream finds the tenant's app again by it.
    pub tenant: String,
    pub public: bool,
    pub shareable: bool,
}

impl FromRequestParts<Arc<Gateway>> for CounterReader {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, gw: &Arc<Gateway>) -> Result<Self, ApiError> {
        let (tenant, role) = authorize(parts, gw, Role::Public)?;
        let app = gw.tenants.reader(&tenant).await.map_err(tenant_error)?;
        Ok(CounterReader {
            app,
            tenant,
            public: role == Some(Role::Public),
            shareable: matches!(role, None | Some(Role::Public)),
        })
    }
}

/// The tenant's app for a badge (`GET /v1/badge/...`, `/v1/shields/...`),
/// which shows one counter by its key. Without `count=true` it is a read
/// of that counter as the multi-read makes one ([`CounterReader`]: a
/// `public`, `read` or `admin` key, or none on a keyless gateway), and
/// opens no tenant. With `count=true` it counts one, then shows the count:
/// a key that may both write and read what it shows, so an `admin` key, or
/// a `write` key when `--write-keys-read-values` says counters may be
/// public (else a `write` key's badge would be a read of any counter); on
/// a keyless gateway, anyone.
pub struct BadgeReader {
    pub app: Arc<AppState>,
    /// As [`CounterReader::public`]: any page may read the answer.
    pub public: bool,
    /// As [`CounterReader::shareable`]: a shared cache may keep it.
    pub shareable: bool,
}

impl FromRequestParts<Arc<Gateway>> for BadgeReader {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, gw: &Arc<Gateway>) -> Result<Self, ApiError> {
        // Exactly what the query's `count` parses to `true` (any other
        // value is refused by the handler's parameters, and counts nothing).
        if query_param(parts, "count").as_deref() != Some("true") {
            let r = CounterReader::from_request_parts(parts, gw).await?;
            return Ok(BadgeReader {
                app: r.app,
                public: r.public,
                shareable: r.shareable,
            });
        }
        let (tenant, role) = authorize(parts, gw, Role::Write)?;
        if role == Some(Role::Write) && !gw.write_keys_read_values {
            return Err(ApiError::Forbidden(
                "a write key counts but reads no counter, and a badge shows its counter: count=true takes an admin key, or a write key on a gateway run with --write-keys-read-values"
                    .into(),
            ));
        }
        let app = gw.tenants.writer(&tenant).await.map_err(tenant_error)?;
        Ok(BadgeReader {
            app,
            public: false,
            shareable: role != Some(Role::Admin),
        })
    }
}

/// For endpoints that span every tenant (`/metrics`): with keys configured,
/// only an admin key of every tenant (`*`) may call them.
pub struct Operator;

impl FromRequestParts<Arc<Gateway>> for Operator {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, gw: &Arc<Gateway>) -> Result<Self, ApiError> {
        if gw.keys.is_empty() {
            return Ok(Operator);
        }
        match limited_grant(parts, gw)? {
            None => Err(missing_key()),
            Some(g) if g.role == Role::Admin && g.tenant.is_none() => Ok(Operator),
            Some(_) => Err(ApiError::Forbidden(
                "metrics span every tenant: they need an admin key of tenant *".into(),
            )),
        }
    }
}

/// Checks the request may do what needs `needed` and answers its tenant
/// and the role of the key it presented (`None` without keys).
fn authorize(
    parts: &Parts,
    gw: &Gateway,
    needed: Role,
) -> Result<(String, Option<Role>), ApiError> {
    authorize_from(parts, gw, needed, true)
}

/// [`authorize`], with the key read from the `key` query parameter too
/// when `key_in_query`; CountAPI's `create` has a `key` parameter of its
/// own (the counter's), so its API key comes in `Authorization` only.
pub(super) fn authorize_from(
    parts: &Parts,
    gw: &Gateway,
    needed: Role,
    key_in_query: bool,
) -> Result<(String, Option<Role>), ApiError> {
    let asked = asked_tenant(parts)?;
    if gw.keys.is_empty() {
        limit(parts, gw, None)?;
        let tenant = asked.map_or(Cow::Borrowed(DEFAULT_TENANT), |t| t);
        return Ok((tenant.into_owned(), None));
    }
    let grant = limited_grant_from(parts, gw, key_in_query)?.ok_or_else(missing_key)?;
    if !grant.role.allows(needed) {
        let needs = match needed {
            Role::Public => "a public or read",
            Role::Write => "a write",
            Role::Read => "a read",
            Role::Admin => "an admin",
        };
        return Err(ApiError::Forbidden(format!(
            "this is a {} key; this request needs {needs} key",
            grant.role
        )));
    }
    let tenant = match (&grant.tenant, asked) {
        (Some(own), Some(asked)) if *own != asked => {
            return Err(ApiError::Forbidden(format!(
                "this key is bound to another tenant than {asked:?}"
            )))
        }
        (Some(own), _) => own.clone(),
        (None, asked) => asked.map_or(DEFAULT_TENANT.to_string(), Cow::into_owned),
    };
    Ok((tenant, Some(grant.role)))
}

/// The key's grant after the rate limit: a client sending bad keys is
/// limited (by IP) like any other, so keys cannot be guessed at full speed.
fn limited_grant<'g>(parts: &Parts, gw: &'g Gateway) -> Result<Option<&'g Grant>, ApiError> {
    limited_grant_from(parts, gw, true)
}

fn limited_grant_from<'g>(
    parts: &Parts,
    gw: &'g Gateway,
    key_in_query: bool,
) -> Result<Option<&'g Grant>, ApiError> {
    let grant = authenticate_from(parts, gw, key_in_query);
    limit(parts, gw, grant.as_ref().ok().copied().flatten())?;
    grant
}

/// The configured key the request presents, `None` when it presents none;
/// a malformed or unknown key is a 401. Without configured keys, `None`.
fn authenticate<'g>(parts: &Parts, gw: &'g Gateway) -> Result<Option<&'g Grant>, ApiError> {
    authenticate_from(parts, gw, true)
}

fn authenticate_from<'g>(
    parts: &Parts,
    gw: &'g Gateway,
    key_in_query: bool,
) -> Result<Option<&'g Grant>, ApiError> {
    if gw.keys.is_empty() {
        return Ok(None);
    }
    let presented = match parts.headers.get(header::AUTHORIZATION) {
        Some(h) => {
            let bad = || {
                ApiError::Unauthorized(
                    "malformed Authorization header: send `Authorization: Bearer <key>`".into(),
                )
            };
            let h = h.to_str().map_err(|_| bad())?;
            let (scheme, token) = h.trim().split_once(' ').ok_or_else(bad)?;
            let token = token.trim();
            if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
                return Err(bad());
            }
            Some(Cow::Borrowed(token))
        }
        None if key_in_query => query_param(parts, "key"),
        None => None,
    };
    match presented {
        None => Ok(None),
        Some(k) => gw
            .keys
            .check(&k)
            .map(Some)
            .ok_or_else(|| ApiError::Unauthorized("the API key is not valid".into())),
    }
}

/// The role of the configured key the request presents, if any: the
/// crawler check asks whether a write comes with a page's (`write`) key.
pub(crate) fn presented_role(parts: &Parts, gw: &Gateway) -> Option<Role> {
    authenticate(parts, gw).ok().flatten().map(|g| g.role)
}

/// Applies the per-client rate limit, by key when one checked out, else by
/// the peer's IP address (the limiter counts IPv6 peers by their /64).
fn limit(parts: &Parts, gw: &Gateway, grant: Option<&Grant>) -> Result<(), ApiError> {
    let Some(rl) = &gw.rate_limit else {
        return Ok(());
    };
    let client = match (grant, parts.extensions.get::<ConnectInfo<SocketAddr>>()) {
        (Some(g), _) => Client::Key(g.id.clone()),
        (None, Some(ConnectInfo(addr))) => Client::Ip(addr.ip()),
        (None, None) => Client::Unknown,
    };
    rl.check(&client, Instant::now())
        .map_err(|wait| ApiError::RateLimited(wait.as_secs_f64().ceil().max(1.0) as u64))
}

fn missing_key() -> ApiError {
    ApiError::Unauthorized(
        "an API key is required: send `Authorization: Bearer <key>` or a `key` query parameter"
            .into(),
    )
}

/// The tenant the request names (`X-Tenant`, else `?tenant=`), validated.
fn asked_tenant(parts: &Parts) -> Result<Option<Cow<'_, str>>, ApiError> {
    let header = match parts.headers.get("x-tenant") {
        Some(h) => Some(Cow::Borrowed(h.to_str().map_err(|_| {
            ApiError::BadRequest("X-Tenant is not a valid tenant name".into())
        })?)),
        None => None,
    };
    let query = query_param(parts, "tenant");
    let asked = match (header, query) {
        (Some(h), Some(q)) if h != q => {
            return Err(ApiError::BadRequest(format!(
                "X-Tenant {h:?} and the tenant parameter {q:?} disagree"
            )))
        }
        (Some(h), _) => Some(h),
        (None, q) => q,
    };
    if let Some(t) = &asked {
        validate_tenant(t).map_err(ApiError::BadRequest)?;
    }
    Ok(asked)
}

/// One query parameter, decoded; `None` when absent (the hot path has no
/// query string and allocates nothing here).
fn query_param<'a>(parts: &'a Parts, name: &str) -> Option<Cow<'a, str>> {
    let q = parts.uri.query()?;
    form_urlencoded::parse(q.as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
}

pub(super) fn tenant_error(e: TenantError) -> ApiError {
    match e {
        TenantError::BadName(m) => ApiError::BadRequest(m),
        TenantError::Disabled => ApiError::BadRequest(e.to_string()),
        TenantError::TooMany(_) | TenantError::Closed => ApiError::Unavailable(e.to_string()),
        TenantError::Open { .. } => ApiError::Unavailable(e.to_string()),
    }
}
