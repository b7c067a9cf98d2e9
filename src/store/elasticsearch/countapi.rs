//! CountAPI's records on Elasticsearch: one index per tenant,
//! `<prefix>_<tenant>_countapi` (strict mapping,
//! `index-templates/component/countapi-mappings.json`), holding a document
//! per namespace made by `create` (`_id` `ns:<namespace>`: the SHA-256 of
//! its admin key) and per key made by it (`_id` `key:<namespace>/<key>`:
//! its rules), both routed by the namespace. Names hold neither `:` nor
//! `/`, so the ids never collide.
//!
//! Each record is written once, with `op_type=create`: of two gateways
//! making the same namespace at once, one makes it (and answers its admin
//! key) and the other finds it made (409), so a namespace has one admin
//! key, whoever asked. The namespace is written before the key, so a key
//! never has a record without its namespace's; two documents are not one
//! transaction, so a create that fails between them leaves the namespace
//! made and the key not (its admin key was never answered: see the HTTP
//! guide). The bounds on the tenant's records are counted with a search,
//! which sees records after the refresh (`refresh=wait_for` on every
//! create makes that the next one): creates racing each other may pass
//! the bound by their number. Reads are realtime GETs.

use elasticsearch::http::Method;
use serde_json::{json, Value};

use super::client::status_error;
use super::request::encode_path_segment;
use super::ElasticsearchStore;
use crate::domain::countapi::{
    Created, CreatedKey, Creation, KeyRules, Namespace, Records, MAX_CREATED_KEYS, MAX_NAMESPACES,
};
use crate::store::StoreError;

fn namespace_id(ns: &str) -> String {
    format!("ns:{ns}")
}

fn key_id(ns: &str, key: &str) -> String {
    format!("key:{ns}/{key}")
}

/// The namespace's document as `create` writes it.
fn namespace_doc(c: &Creation) -> Value {
    json!({
        "kind": "namespace",
        "namespace": c.namespace,
        "admin_key_sha256": crate::domain::to_hex(&c.admin_key_sha256),
        "created": c.now_ms,
    })
}

/// The key's document as `create` writes it.
fn key_doc(c: &Creation) -> Value {
    json!({
        "kind": "key",
        "namespace": c.namespace,
        "key": c.key,
        "enable_reset": c.rules.enable_reset,
        "update_lowerbound": c.rules.update_lowerbound,
        "update_upperbound": c.rules.update_upperbound,
        "created": c.now_ms,
    })
}

fn bad(what: &str, src: &Value) -> StoreError {
    StoreError::Internal(format!(
        "a CountAPI {what} document without its fields: {src}"
    ))
}

fn parse_namespace(name: &str, src: &Value) -> Result<Namespace, StoreError> {
    let hex = src["admin_key_sha256"]
        .as_str()
        .ok_or_else(|| bad("namespace", src))?;
    let mut digest = [0u8; 32];
    if hex.len() != 64 {
        return Err(bad("namespace", src));
    }
    for (i, chunk) in hex.as_bytes().chunks(2).enumerate() {
        let s = std::str::from_utf8(chunk).map_err(|_| bad("namespace", src))?;
        digest[i] = u8::from_str_radix(s, 16).map_err(|_| bad("namespace", src))?;
    }
    Ok(Namespace {
        name: name.to_string(),
        admin_key_sha256: digest,
        created_ms: src["created"]
            .as_i64()
            .ok_or_else(|| bad("namespace", src))?,
    })
}

fn parse_key(src: &Value) -> Result<CreatedKey, StoreError> {
    let rules = KeyRules {
        enable_reset: src["enable_reset"]
            .as_bool()
            .ok_or_else(|| bad("key", src))?,
        update_lowerbound: src["update_lowerbound"]
            .as_i64()
            .ok_or_else(|| bad("key", src))?,
        update_upperbound: src["update_upperbound"]
            .as_i64()
            .ok_or_else(|| bad("key", src))?,
    };
    Ok(CreatedKey {
        rules,
        created_ms: src["created"].as_i64().ok_or_else(|| bad("key", src))?,
    })
}

impl ElasticsearchStore {
    fn countapi_index(&self) -> String {
        let names = &self.config.names;
        format!("{}_{}_countapi", names.prefix(), names.tenant())
    }

    /// One record's `_source` by a realtime GET; `None` when it (or the
    /// index) does not exist.
    async fn countapi_doc(&self, ns: &str, id: &str) -> Result<Option<Value>, StoreError> {
        let path = format!(
            "/{}/_doc/{}",
            self.countapi_index(),
            encode_path_segment(id)
        );
        // A read changes nothing: a 429 or 503 (a shard still recovering)
        // is asked again within the back-off budget, as a counter's GET is.
        let (mut attempt, mut waited) = (0, std::time::Duration::ZERO);
        let (status, body) = loop {
            let (status, body) = self
                .call(Method::Get, &path, &[("routing", ns)], None)
                .await?;
            let delay = self.config.backoff.delay(attempt, &self.jitter);
            if (status == 429 || status == 503) && waited + delay <= self.config.backoff.budget {
                tokio::time::sleep(delay).await;
                waited += delay;
                attempt += 1;
                continue;
            }
            break (status, body);
        };
        match status {
            200 if body["found"] == json!(true) => Ok(Some(body["_source"].clone())),
            200 | 404 => Ok(None),
            _ => Err(status_error(
                status,
                format!(
                    "reading CountAPI record {id} answered {status} {}",
                    super::response::describe_error(body.get("error"))
                ),
            )),
        }
    }

    /// How many records of `kind` the tenant holds, as the last refresh saw them.
    async fn countapi_count(&self, kind: &str) -> Result<u64, StoreError> {
        let answer = self
            .search(
                &format!("/{}/_search", self.countapi_index()),
                &[],
                &json!({"size": 0, "track_total_hits": true,
                        "query": {"bool": {"filter": [{"term": {"kind": kind}}]}}}),
            )
            .await?;
        Ok(answer
            .pointer("/hits/total/value")
            .and_then(Value::as_u64)
            .unwrap_or(0))
    }

    /// Writes a record unless its id exists: `true` when written, `false`
    /// when another write made it first. The index is made by the first
    /// write that finds none, so writes do not depend on automatic index
    /// creation (`action.auto_create_index` may exclude it).
    async fn countapi_put_new(&self, ns: &str, id: &str, doc: &Value) -> Result<bool, StoreError> {
        let index = self.countapi_index();
        let path = format!("/{index}/_create/{}", encode_path_segment(id));
        let body = serde_json::to_vec(doc).map_err(|e| StoreError::Internal(e.to_string()))?;
        let params = [("routing", ns), ("refresh", "wait_for")];
        let put = || self.call(Method::Put, &path, &params, Some(body.clone()));
        let (mut status, mut answer) = put().await?;
        if status == 404 {
            self.create_index(&index)
                .await
                .map_err(|e| StoreError::Unavailable(format!("creating {index}: {e}")))?;
            (status, answer) = put().await?;
        }
        match status {
            200 | 201 => Ok(true),
            409 => Ok(false),
            _ => Err(status_error(
                status,
                format!(
                    "writing CountAPI record {id} answered {status} {}",
                    super::response::describe_error(answer.get("error"))
                ),
            )),
        }
    }

    pub(super) async fn countapi_records_es(
        &self,
        ns: &str,
        key: &str,
    ) -> Result<Records, StoreError> {
        let namespace = match self.countapi_doc(ns, &namespace_id(ns)).await? {
            Some(src) => Some(parse_namespace(ns, &src)?),
            None => None,
        };
        let key = match self.countapi_doc(ns, &key_id(ns, key)).await? {
            Some(src) => Some(parse_key(&src)?),
            None => None,
        };
        Ok(Records { namespace, key })
    }

    pub(super) async fn countapi_create_es(&self, c: Creation) -> Result<Created, StoreError> {
        let ns = c.namespace.as_str();
        if self.countapi_doc(ns, &key_id(ns, &c.key)).await?.is_some() {
            return Ok(Created::KeyExists);
        }
        let mut made_namespace = false;
        if self.countapi_doc(ns, &namespace_id(ns)).await?.is_none() {
            if self.countapi_count("namespace").await? >= MAX_NAMESPACES {
                return Ok(Created::Full("namespaces"));
            }
            made_namespace = self
                .countapi_put_new(ns, &namespace_id(ns), &namespace_doc(&c))
                .await?;
        }
        if self.countapi_count("key").await? >= MAX_CREATED_KEYS {
            return Ok(Created::Full("keys made by create"));
        }
        if !self
            .countapi_put_new(ns, &key_id(ns, &c.key), &key_doc(&c))
            .await?
        {
            return Ok(Created::KeyExists);
        }
        Ok(Created::Made {
            namespace: made_namespace,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_back_what_create_writes() {
        let c = Creation {
            namespace: "site.com".into(),
            key: "visits".into(),
            rules: KeyRules::new(true, -3, 7).unwrap(),
            admin_key_sha256: crate::auth::digest("admin"),
            now_ms: 1_700_000_000_000,
        };
        let ns = parse_namespace("site.com", &namespace_doc(&c)).unwrap();
        assert!(ns.admits("admin") && !ns.admits("other"));
        assert_eq!(ns.created_ms, 1_700_000_000_000);
        let k = parse_key(&key_doc(&c)).unwrap();
        assert_eq!(k.rules, c.rules);
        assert!(parse_key(&json!({"kind": "key"})).is_err());
        assert!(parse_namespace("x", &json!({"admin_key_sha256": "zz"})).is_err());
        assert_eq!(key_id("a.b", "c_d"), "key:a.b/c_d");
        assert_ne!(namespace_id("key"), key_id("", ""));
    }
}
