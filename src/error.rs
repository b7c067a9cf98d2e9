//! The one error type of the HTTP API and its one JSON shape:
//! `{"error": {"type": "...", "reason": "...", "details": [...]}}`.
//!
//! Each variant has one status. Client mistakes say what was wrong with which
//! field; internal failures are logged in full and answered without detail.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::pipeline::SubmitError;
use crate::store::{StoreError, StoreErrorKind};

/// One bad event of a batch: where it is and what is wrong with it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct EventError {
    pub index: usize,
    pub reason: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Malformed or invalid input; the reason names the field.
    #[error("{0}")]
    BadRequest(String),
    /// A batch with bad events; nothing of it was applied.
    #[error("{} invalid event(s) in the batch; none of its events was applied", .0.len())]
    InvalidEvents(Vec<EventError>),
    /// A backfill batch with bad days; nothing of it was applied.
    #[error("{} invalid day(s) in the batch; none of its days was set", .0.len())]
    InvalidDays(Vec<EventError>),
    /// No API key, or not a configured one (401 with `WWW-Authenticate`).
    #[error("{0}")]
    Unauthorized(String),
    /// A valid key of the wrong role or tenant.
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    /// A keyless gateway was asked under a `Host` that is neither loopback
    /// nor listed with `--allowed-hosts` (421: a DNS-rebinding page's
    /// request, or a proxy that forwards a name we were not told of).
    #[error("the Host {0:?} is not a loopback name or address; a gateway without API keys answers only those and the hosts listed with --allowed-hosts")]
    HostNotAllowed(String),
    /// A keyless gateway was asked to write by a page of another site (the
    /// header that says so, quoted): a form post, a beacon or an image of
    /// any page a developer opens would otherwise count on their gateway.
    #[error("a gateway without API keys takes no writes from pages of other sites: {0} is not a loopback origin nor one of --allowed-hosts; nothing was written")]
    CrossSite(String),
    #[error("method not allowed")]
    MethodNotAllowed,
    /// The addition would leave the signed 64-bit range; nothing was applied.
    #[error("{0}")]
    Overflow(String),
    /// What the request would create exists already (CountAPI's `create`
    /// of a key that exists); nothing was written.
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// The write queue is full.
    #[error("the write queue is full; retry after a moment")]
    Overloaded,
    #[error("{0}")]
    Unavailable(String),
    /// The store failed. `reason` (ours) says what became of the request,
    /// exactly: clients rely on "nothing applied" versus "may have been
    /// applied". `detail` (the store's own words: SQLite or Elasticsearch
    /// messages, paths) goes to the log only, under a request id that the
    /// answer names. `kind` gives the status and `type`: busy 503
    /// `store_busy`, full 507 `store_full`, read-only 500
    /// `store_read_only`, corrupt 500 `store_corrupt`, any other 503
    /// `unavailable`.
    #[error("{reason}")]
    Store {
        kind: StoreErrorKind,
        reason: String,
        detail: String,
    },
    /// Too many requests from this client; retry after this many seconds.
    #[error("too many requests from this client; retry after {0} second(s)")]
    RateLimited(u64),
    /// An actor of the request is over a limit per actor (the reason names
    /// the rule); nothing of the request was applied. Retry after `retry_after` seconds.
    #[error("{reason}")]
    Throttled { reason: String, retry_after: u64 },
    /// The request took longer than `--request-timeout`.
    #[error("the request did not finish within {0:?}; a write may or may not have been applied (send an event id to retry safely)")]
    Timeout(std::time::Duration),
    #[error("internal error")]
    Internal(String),
}

impl ApiError {
    fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) | ApiError::InvalidEvents(_) | ApiError::InvalidDays(_) => {
                StatusCode::BAD_REQUEST
            }
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) | ApiError::CrossSite(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::HostNotAllowed(_) => StatusCode::MISDIRECTED_REQUEST,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Overflow(_) | ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Store {
                kind: StoreErrorKind::Full,
                ..
            } => StatusCode::INSUFFICIENT_STORAGE,
            ApiError::Store {
                kind: StoreErrorKind::ReadOnly | StoreErrorKind::Corrupt,
                ..
            } => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Overloaded
            | ApiError::Unavailable(_)
            | ApiError::Store { .. }
            | ApiError::Timeout(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::RateLimited(_) | ApiError::Throttled { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_) => "invalid_request",
            ApiError::InvalidEvents(_) => "invalid_events",
            ApiError::InvalidDays(_) => "invalid_days",
            ApiError::Unauthorized(_) => "unauthorized",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::NotFound(_) => "not_found",
            ApiError::HostNotAllowed(_) => "host_not_allowed",
            ApiError::CrossSite(_) => "cross_site_write",
            ApiError::MethodNotAllowed => "method_not_allowed",
            ApiError::Overflow(_) => "counter_overflow",
            ApiError::Conflict(_) => "conflict",
            ApiError::PayloadTooLarge(_) => "payload_too_large",
            ApiError::UnsupportedMediaType(_) => "unsupported_media_type",
            ApiError::Overloaded => "overloaded",
            ApiError::Store { kind, .. } => match kind {
                StoreErrorKind::Busy => "store_busy",
                StoreErrorKind::Full => "store_full",
                StoreErrorKind::ReadOnly => "store_read_only",
                StoreErrorKind::Corrupt => "store_corrupt",
                _ => "unavailable",
            },
            ApiError::Unavailable(_) => "unavailable",
            ApiError::RateLimited(_) => "rate_limited",
            ApiError::Throttled { .. } => "throttled",
            ApiError::Timeout(_) => "timeout",
            ApiError::Internal(_) => "internal_error",
        }
    }
}

/// Every refusal of the API.
// `deny_unknown_fields` changes nothing in serializing: it tells the
// OpenAPI schema that no other field ever appears.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = Error)]
pub(crate) struct ErrorJson<'a> {
    #[schema(inline)]
    error: Inner<'a>,
}

#[derive(Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct Inner<'a> {
    /// What went wrong, in one stable word: `invalid_request`, `not_found`, ...
    #[serde(rename = "type")]
    kind: &'static str,
    reason: String,
    /// For a batch, every bad event.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(inline, nullable = false)]
    details: Option<&'a [EventError]>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let reason = match &self {
            ApiError::Internal(detail) => {
                let id = request_id();
                tracing::error!(request_id = %id, detail = %detail, "internal error");
                format!("internal error; it was logged as {id}")
            }
            ApiError::Store {
                kind,
                reason,
                detail,
            } => {
                let id = request_id();
                tracing::error!(request_id = %id, kind = kind.as_str(), detail = %detail, "store error");
                format!("{reason}; the cause was logged as {id}")
            }
            other => other.to_string(),
        };
        let details = match &self {
            ApiError::InvalidEvents(d) | ApiError::InvalidDays(d) => Some(d.as_slice()),
            _ => None,
        };
        let body = ErrorJson {
            error: Inner {
                kind: self.kind(),
                reason,
                details,
            },
        };
        let mut res = (status, axum::Json(body)).into_response();
        match self {
            // Every 503 says when to come back, so that clients (and the
            // proxies in front of them) back off instead of hammering.
            ApiError::Store { .. } if status != StatusCode::SERVICE_UNAVAILABLE => {}
            ApiError::Overloaded
            | ApiError::Unavailable(_)
            | ApiError::Store { .. }
            | ApiError::Timeout(_) => {
                res.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            ApiError::RateLimited(secs)
            | ApiError::Throttled {
                retry_after: secs, ..
            } => {
                res.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
            }
            ApiError::Unauthorized(_) => {
                res.headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            _ => {}
        }
        res
    }
}

/// An id for one logged failure, unique in this process and unlikely to
/// repeat across restarts: the start time and a sequence number, in hex.
fn request_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static STARTED: std::sync::OnceLock<u128> = std::sync::OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let started = STARTED.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis())
    });
    format!("req-{started:x}-{:x}", NEXT.fetch_add(1, Ordering::Relaxed))
}

impl ApiError {
    /// A store failure: `reason` for the client, `detail` for the log.
    pub fn store(reason: &str, detail: impl std::fmt::Display) -> ApiError {
        ApiError::store_of(StoreErrorKind::Unavailable, reason.into(), detail)
    }

    /// A store failure of `kind`; the reason names a kind the client can
    /// act on (busy: retry; the others: the operator's).
    fn store_of(kind: StoreErrorKind, reason: String, detail: impl std::fmt::Display) -> ApiError {
        let why = match kind {
            StoreErrorKind::Busy => " (its database is busy)",
            StoreErrorKind::Full => " (its disk is full)",
            StoreErrorKind::ReadOnly => " (its database is read-only)",
            StoreErrorKind::Corrupt => " (its database is damaged)",
            _ => "",
        };
        ApiError::Store {
            kind,
            reason: match reason.split_once(';') {
                Some((head, tail)) => format!("{head}{why};{tail}"),
                None => format!("{reason}{why}"),
            },
            detail: detail.to_string(),
        }
    }
}

impl From<crate::actors::Throttled> for ApiError {
    fn from(t: crate::actors::Throttled) -> Self {
        let secs = t.retry_after.as_secs_f64().ceil().max(1.0) as u64;
        let reason = if t.never {
            format!(
                "the actor of event {} asks more at once than the limit {:?} allows in a whole period; nothing of the request was applied",
                t.index, t.rule
            )
        } else {
            format!(
                "the actor of event {} is over the limit {:?}; nothing of the request was applied; retry after {secs} second(s)",
                t.index, t.rule
            )
        };
        ApiError::Throttled {
            reason,
            retry_after: secs,
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(m) => ApiError::store("the store did not answer", m),
            StoreError::Internal(m) => ApiError::Internal(m),
            StoreError::Halted(m) => ApiError::Unavailable(m),
            StoreError::Sqlite {
                kind: StoreErrorKind::Other,
                ..
            } => ApiError::Internal(e.to_string()),
            StoreError::Sqlite { kind, .. } => {
                ApiError::store_of(kind, "the store failed".into(), e)
            }
        }
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::Overloaded => ApiError::Overloaded,
            SubmitError::ShuttingDown => ApiError::Unavailable("the gateway is shutting down; retry on another instance".into()),
            SubmitError::TimedOut => ApiError::Unavailable(
                "the store did not confirm the write in time; it may or may not have been applied (send an event id to retry safely)".into(),
            ),
            SubmitError::NotDurable(m) => ApiError::store(
                "the write reached the store but could not be made durable; it may or may not survive a crash (send an event id to retry safely)",
                m,
            ),
            SubmitError::Halted(m) => ApiError::Unavailable(m),
            SubmitError::Overflow(key) => ApiError::Overflow(format!(
                "counter {key} would leave the signed 64-bit range; nothing of the request was applied"
            )),
            SubmitError::Store { kind, detail } => ApiError::store_of(
                // What is not one of the kinds clients tell apart stays 503.
                if kind == StoreErrorKind::Other { StoreErrorKind::Unavailable } else { kind },
                "the store could not apply the request; nothing of the request was applied".into(),
                detail,
            ),
            SubmitError::Incomplete(m) => ApiError::store(
                "the store could not apply all of the request; part of it may have been applied, so retry with event ids to count each event once",
                m,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_503_says_when_to_retry() {
        let unavailable = [
            ApiError::Overloaded,
            ApiError::Unavailable("down".into()),
            ApiError::store("the store did not answer", "connection refused"),
            ApiError::Timeout(std::time::Duration::from_secs(1)),
            SubmitError::TimedOut.into(),
            SubmitError::ShuttingDown.into(),
            SubmitError::Halted("halted".into()).into(),
        ];
        for e in unavailable {
            let kind = e.kind();
            let res = e.into_response();
            assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE, "{kind}");
            assert_eq!(
                res.headers().get(header::RETRY_AFTER).map(|v| v.as_bytes()),
                Some(&b"1"[..]),
                "{kind}"
            );
        }
    }

    /// SQLite's own error, as a store of ours would return it, with text a
    /// client must never see.
    fn sqlite(kind: StoreErrorKind) -> StoreError {
        StoreError::Sqlite {
            op: "test::op",
            kind,
            source: rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
                Some("SECRET /var/lib/db.sqlite".into()),
            ),
        }
    }

    async fn answer(e: ApiError) -> (StatusCode, Option<HeaderValue>, serde_json::Value) {
        use http_body_util::BodyExt;
        let res = e.into_response();
        let status = res.status();
        let retry = res.headers().get(header::RETRY_AFTER).cloned();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        (status, retry, serde_json::from_slice(&body).unwrap())
    }

    /// Each kind has its status and type, on a direct store call and on a
    /// flush through the queue; only a busy database (which passes by
    /// itself) says when to retry; no answer carries SQLite's text.
    #[tokio::test]
    async fn each_store_error_kind_has_its_answer() {
        use StoreErrorKind::*;
        let cases = [
            (Busy, 503, "store_busy", "busy", true),
            (Full, 507, "store_full", "disk is full", false),
            (ReadOnly, 500, "store_read_only", "read-only", false),
            (Corrupt, 500, "store_corrupt", "damaged", false),
        ];
        for (kind, status, ty, says, retry) in cases {
            let direct = ApiError::from(sqlite(kind));
            let flushed = ApiError::from(SubmitError::Store {
                kind,
                detail: sqlite(kind).to_string(),
            });
            for e in [direct, flushed] {
                let (got, retry_after, json) = answer(e).await;
                assert_eq!(got.as_u16(), status, "{kind:?}");
                assert_eq!(json["error"]["type"], ty, "{kind:?}");
                let reason = json["error"]["reason"].as_str().unwrap();
                assert!(reason.contains(says), "{kind:?}: {reason}");
                assert!(reason.contains("logged as"), "{kind:?}: {reason}");
                assert!(!reason.contains("SECRET"), "{kind:?}: {reason}");
                assert!(!reason.contains("test::op"), "{kind:?}: {reason}");
                assert_eq!(retry_after.is_some(), retry, "{kind:?}");
            }
        }
        // Any other SQLite failure: as before, 500 on a direct call, 503
        // (nothing applied) on a flush; neither with SQLite's text.
        let (got, _, json) = answer(sqlite(Other).into()).await;
        assert_eq!(
            (got.as_u16(), json["error"]["type"].as_str()),
            (500, Some("internal_error"))
        );
        assert!(!json.to_string().contains("SECRET"), "{json}");
        let flushed = SubmitError::Store {
            kind: Other,
            detail: sqlite(Other).to_string(),
        };
        let (got, retry_after, json) = answer(flushed.into()).await;
        assert_eq!(
            (got.as_u16(), json["error"]["type"].as_str()),
            (503, Some("unavailable"))
        );
        assert!(retry_after.is_some());
        assert!(!json.to_string().contains("SECRET"), "{json}");
    }
}
