//! Talking to the cluster: one HTTP call with its failure split by whether
//! the request can have reached the cluster, searches that read missing
//! indices as empty, and the mapping of answers to [`StoreError`].

use elasticsearch::http::headers::{HeaderMap, HeaderValue, CONTENT_TYPE};
use elasticsearch::http::Method;
use serde_json::Value;

use super::{query, ElasticsearchStore};
use crate::store::StoreError;

/// A transport failure, split by whether the request may have reached the cluster.
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
        let res = self
            .client
            .send(method, path, headers, query, body, None)
            .await
            .map_err(transport_error)?;
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

/// Splits a client error by whether the request can have left this process.
pub(super) fn transport_error(e: elasticsearch::Error) -> TransportError {
    let mut message = e.to_string();
    let mut not_sent = false;
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(s) = source {
        let text = s.to_string();
        if !message.ends_with(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::AddrNotAvailable
            ) {
                not_sent = true;
            }
        }
        if text.contains("error trying to connect") || text.contains("Connection refused") {
            not_sent = true;
        }
        source = s.source();
    }
    TransportError { not_sent, message }
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
