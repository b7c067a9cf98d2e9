//! Talking to the cluster: one HTTP call (to a node the [`super::pool`]
//! picks) with its failure split by whether the request can have reached
//! the cluster, searches that read missing
//! indices as empty, and the mapping of answers to [`StoreError`].

use elasticsearch::http::headers::{HeaderMap, HeaderValue, CONTENT_TYPE};
use elasticsearch::http::Method;
use serde_json::Value;

use super::{query, ElasticsearchStore};
use crate::store::StoreError;

/// A transport failure, split by whether the request may have reached the cluster.
pub(super) struct TransportError {
    /// Nothing was sent (connection refused, DNS): safe to resend.
    pub not_sent: bool,
    pub message: String,
}

impl ElasticsearchStore {
    /// One HTTP call; the body parsed as JSON (`Null` when empty or not JSON).
    pub(super) async fn call(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Value), StoreError> {
        self.raw_call(method, path, query, body, None)
            .await
            .map_err(|e| StoreError::Unavailable(format!("elasticsearch: {}", e.message)))
    }

    pub(super) async fn raw_call(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<Vec<u8>>,
        content_type: Option<&'static str>,
    ) -> Result<(u16, Value), TransportError> {
        let mut headers = HeaderMap::new();
        if let Some(ct) = content_type {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(ct));
        }
        let query = if query.is_empty() { None } else { Some(query) };
        self.maybe_sniff();
        let res = self
            .pool
            .send(method, path, headers, query, body.as_deref(), None)
            .await?;
        let status = res.status_code().as_u16();
        let bytes = res.bytes().await.map_err(|e| TransportError {
            not_sent: false,
            message: format!("reading the answer failed: {e}"),
        })?;
        Ok((
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        ))
    }

    /// Starts a sniff of the cluster's nodes in the background when one is
    /// due (`--elasticsearch-sniff`); requests meanwhile use the nodes known.
    pub(super) fn maybe_sniff(&self) {
        if self.pool.take_sniff_due(std::time::Instant::now()) {
            let pool = self.pool.clone();
            tokio::spawn(async move {
                match pool.sniff().await {
                    Ok(n) => tracing::debug!(nodes = n, "elasticsearch nodes sniffed"),
                    Err(e) => tracing::warn!("{e}; keeping the nodes known"),
                }
            });
        }
    }

    /// A `_search` of `path`; missing indices read as empty, so a tenant
    /// that never counted gets empty lists rather than errors.
    pub(super) async fn search(
        &self,
        path: &str,
        extra: &[(&str, &str)],
        body: &Value,
    ) -> Result<Value, StoreError> {
        let mut params = vec![("ignore_unavailable", "true"), ("allow_no_indices", "true")];
        params.extend_from_slice(extra);
        self.post_json(path, &params, body).await
    }

    /// A call whose answer must be a 200; any other status is an error
    /// saying `what` answered it, and why (the engine's error).
    pub(super) async fn call_ok(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<Vec<u8>>,
        what: &str,
    ) -> Result<Value, StoreError> {
        let (status, answer) = self.call(method, path, query, body).await?;
        if status != 200 {
            return Err(status_error(
                status,
                format!(
                    "{what} answered {status} {}",
                    super::response::describe_error(answer.get("error"))
                ),
            ));
        }
        Ok(answer)
    }

    /// A POST of a JSON body whose answer must be a 200. Query parameters
    /// are passed as given: Elasticsearch refuses any an API does not know
    /// (`_mget` takes no `ignore_unavailable`).
    pub(super) async fn post_json(
        &self,
        path: &str,
        params: &[(&str, &str)],
        body: &Value,
    ) -> Result<Value, StoreError> {
        let payload = serde_json::to_vec(body).map_err(|e| StoreError::Internal(e.to_string()))?;
        let (status, answer) = self.call(Method::Post, path, params, Some(payload)).await?;
        if status != 200 {
            return Err(status_error(status, query::search_error(status, &answer)));
        }
        Ok(answer)
    }
}

/// Splits a client error by whether the request can have left this process,
/// from the typed errors of its source chain (never their wording, which
/// changes between versions): the HTTP client's `is_connect` (refused, DNS,
/// TLS handshake: no byte of the request was sent) or an I/O error of a
/// connection that never opened. A timeout or a reset after connecting is
/// not proof that nothing was sent.
pub(super) fn transport_error(e: elasticsearch::Error) -> TransportError {
    let mut message = e.to_string();
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(s) = source {
        let text = s.to_string();
        if !message.ends_with(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = s.source();
    }
    TransportError {
        not_sent: never_sent(&e),
        message,
    }
}

/// Whether an error's source chain proves that the request never left.
pub(super) fn never_sent(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(e);
    while let Some(s) = source {
        if let Some(http) = s.downcast_ref::<reqwest::Error>() {
            if http.is_connect() {
                return true;
            }
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::AddrNotAvailable
            ) {
                return true;
            }
        }
        source = s.source();
    }
    false
}

/// The `routing` of a read of one counter's buckets, which were written
/// with `routing=<counter id>`. A read splits its routing on commas (several
/// values), so an id holding a comma would be looked for on the wrong shards:
/// such a read goes to every shard instead (the `counter_id` filter keeps it
/// exact; only slower).
pub(super) fn search_routing(counter_id: &str) -> Vec<(&'static str, &str)> {
    if counter_id.contains(',') {
        Vec::new()
    } else {
        vec![("routing", counter_id)]
    }
}

/// 429 and 5xx mean "try later" (503 to the client); anything else is ours to fix.
pub(super) fn status_error(status: u16, message: String) -> StoreError {
    if status == 429 || status >= 500 {
        StoreError::Unavailable(message)
    } else {
        StoreError::Internal(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Wrapper(std::io::Error);

    impl std::fmt::Display for Wrapper {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            // Worded like nothing the old text match knew.
            f.write_str("transport failed")
        }
    }

    impl std::error::Error for Wrapper {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_refused_connection_is_known_by_its_kind_not_its_wording() {
        let refused = Wrapper(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "nope",
        ));
        assert!(never_sent(&refused));
        let reset = Wrapper(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "error trying to connect: Connection refused",
        ));
        assert!(!never_sent(&reset), "the wording proves nothing");
    }
}
