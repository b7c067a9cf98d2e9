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
//!
//! Export pages the key documents sorted by namespace then key (keywords
//! sort bytewise, as the embedded store's rows) and reads their
//! namespaces' documents beside them; import sets whole documents with
//! one `_bulk` per batch, after counting what it adds against the bounds.

use elasticsearch::http::Method;
use serde_json::{json, Value};

use super::client::status_error;
use super::request::encode_path_segment;
use super::ElasticsearchStore;
use crate::domain::countapi::{
    Created, CreatedKey, Creation, KeyRecord, KeyRules, Namespace, Records, Restored,
    MAX_CREATED_KEYS, MAX_NAMESPACES,
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
    let digest = src["admin_key_sha256"]
        .as_str()
        .and_then(crate::domain::from_hex::<32>)
        .ok_or_else(|| bad("namespace", src))?;
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

/// The documents of a restore, namespaces first: one per namespace (the
/// batch's last record of it wins), then one per key.
fn restore_bulk(index: &str, records: &[KeyRecord]) -> Vec<u8> {
    let mut body = Vec::with_capacity(records.len() * 400);
    let mut line = |v: Value| {
        // Serializing a Value cannot fail.
        let _ = serde_json::to_writer(&mut body, &v);
        body.push(b'\n');
    };
    let mut namespaces: Vec<&Namespace> = Vec::new();
    for r in records {
        match namespaces.iter_mut().find(|n| n.name == r.namespace.name) {
            Some(n) => *n = &r.namespace,
            None => namespaces.push(&r.namespace),
        }
    }
    for n in namespaces {
        line(json!({"index": {"_index": index, "_id": namespace_id(&n.name), "routing": n.name}}));
        line(json!({
            "kind": "namespace",
            "namespace": n.name,
            "admin_key_sha256": crate::domain::to_hex(&n.admin_key_sha256),
            "created": n.created_ms,
        }));
    }
    for r in records {
        let ns = &r.namespace.name;
        line(json!({"index": {"_index": index, "_id": key_id(ns, &r.key), "routing": ns}}));
        line(json!({
            "kind": "key",
            "namespace": ns,
            "key": r.key,
            "enable_reset": r.created.rules.enable_reset,
            "update_lowerbound": r.created.rules.update_lowerbound,
            "update_upperbound": r.created.rules.update_upperbound,
            "created": r.created.created_ms,
        }));
    }
    body
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

    /// Which of `ids` (each with its routing) exist, by one realtime `_mget`.
    async fn countapi_exist(&self, ids: &[(String, String)]) -> Result<Vec<bool>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let docs: Vec<Value> = ids
            .iter()
            .map(|(id, routing)| json!({"_id": id, "routing": routing, "_source": false}))
            .collect();
        let body = serde_json::to_vec(&json!({ "docs": docs }))
            .map_err(|e| StoreError::Internal(e.to_string()))?;
        let answer = self
            .call_ok(
                Method::Post,
                &format!("/{}/_mget", self.countapi_index()),
                &[],
                Some(body),
                "reading CountAPI records",
            )
            .await?;
        let found: Vec<bool> = answer
            .get("docs")
            .and_then(Value::as_array)
            .map(|d| d.iter().map(|doc| doc["found"] == json!(true)).collect())
            .unwrap_or_default();
        if found.len() != ids.len() {
            return Err(StoreError::Internal(format!(
                "reading CountAPI records: {} answered for {} asked",
                found.len(),
                ids.len()
            )));
        }
        Ok(found)
    }

    pub(super) async fn countapi_page_es(
        &self,
        after: Option<(String, String)>,
        limit: usize,
    ) -> Result<Vec<KeyRecord>, StoreError> {
        let index = self.countapi_index();
        if after.is_none() {
            self.refresh_tenant(&index).await?;
        }
        let mut body = json!({
            "size": limit.min(super::transfer::SEARCH_PAGE),
            "track_total_hits": false,
            "query": {"bool": {"filter": [{"term": {"kind": "key"}}]}},
            "sort": [{"namespace": "asc"}, {"key": "asc"}],
        });
        if let Some((ns, key)) = &after {
            body["search_after"] = json!([ns, key]);
        }
        let answer = self
            .search(&format!("/{index}/_search"), &[], &body)
            .await?;
        let keys: Vec<&Value> = super::transfer::hits(&answer)?
            .iter()
            .map(|h| &h["_source"])
            .collect();
        let mut names: Vec<&str> = keys
            .iter()
            .filter_map(|k| k["namespace"].as_str())
            .collect();
        names.dedup();
        let mut namespaces = std::collections::HashMap::new();
        if !names.is_empty() {
            let found = self
                .search(
                    &format!("/{index}/_search"),
                    &[],
                    &json!({
                        "size": names.len(),
                        "track_total_hits": false,
                        "query": {"bool": {"filter": [
                            {"term": {"kind": "namespace"}},
                            {"terms": {"namespace": names}}
                        ]}},
                    }),
                )
                .await?;
            for h in super::transfer::hits(&found)? {
                let src = &h["_source"];
                let name = src["namespace"]
                    .as_str()
                    .ok_or_else(|| bad("namespace", src))?;
                namespaces.insert(name.to_string(), parse_namespace(name, src)?);
            }
        }
        keys.into_iter()
            .map(|src| {
                let ns = src["namespace"].as_str().ok_or_else(|| bad("key", src))?;
                let key = src["key"].as_str().ok_or_else(|| bad("key", src))?;
                let namespace = namespaces.get(ns).cloned().ok_or_else(|| {
                    StoreError::Internal(format!(
                        "CountAPI key {ns}/{key} has no record of its namespace"
                    ))
                })?;
                Ok(KeyRecord {
                    namespace,
                    key: key.to_string(),
                    created: parse_key(src)?,
                })
            })
            .collect()
    }

    /// Counts what the batch adds against the bounds (after a refresh, so
    /// the count sees every record written before), then sets the batch in
    /// one `_bulk`, waiting for its refresh. Not one transaction: a failed
    /// bulk may leave part of the batch set, which setting it again makes
    /// whole (import says so and resumes).
    pub(super) async fn countapi_restore_es(
        &self,
        records: Vec<KeyRecord>,
    ) -> Result<Restored, StoreError> {
        if records.is_empty() {
            return Ok(Restored::Applied);
        }
        let index = self.countapi_index();
        self.create_index(&index)
            .await
            .map_err(|e| StoreError::Unavailable(format!("creating {index}: {e}")))?;
        self.refresh_tenant(&index).await?;
        let mut ids: Vec<(String, String)> = Vec::with_capacity(records.len() * 2);
        for r in &records {
            let ns = &r.namespace.name;
            ids.push((namespace_id(ns), ns.clone()));
            ids.push((key_id(ns, &r.key), ns.clone()));
        }
        let found = self.countapi_exist(&ids).await?;
        let mut namespaces = self.countapi_count("namespace").await?;
        let mut keys = self.countapi_count("key").await?;
        let mut added: std::collections::HashSet<&str> = std::collections::HashSet::new();
        for (i, r) in records.iter().enumerate() {
            if !found[2 * i] && added.insert(r.namespace.name.as_str()) {
                if namespaces >= MAX_NAMESPACES {
                    return Ok(Restored::Full(i, "namespaces"));
                }
                namespaces += 1;
            }
            if !found[2 * i + 1] {
                if keys >= MAX_CREATED_KEYS {
                    return Ok(Restored::Full(i, "keys made by create"));
                }
                keys += 1;
            }
        }
        let timeout = self.config.bulk_timeout_param();
        let (status, answer) = self
            .raw_call(
                Method::Post,
                "/_bulk",
                &[("timeout", &timeout), ("refresh", "wait_for")],
                Some(restore_bulk(&index, &records)),
                Some("application/x-ndjson"),
            )
            .await
            .map_err(|e| StoreError::Unavailable(format!("elasticsearch: {}", e.message)))?;
        if status != 200 {
            return Err(status_error(
                status,
                format!(
                    "setting CountAPI records answered {status} {}",
                    super::response::describe_error(answer.get("error"))
                ),
            ));
        }
        let items = answer
            .get("items")
            .and_then(Value::as_array)
            .ok_or_else(|| StoreError::Internal("a bulk answer without items".into()))?;
        for item in items {
            let result = item.as_object().and_then(|o| o.values().next());
            let status = result
                .and_then(|r| r.get("status"))
                .and_then(Value::as_u64)
                .unwrap_or(0) as u16;
            if !(200..300).contains(&status) {
                return Err(status_error(
                    status,
                    format!(
                        "setting CountAPI records: an item answered {status} {}",
                        super::response::describe_error(result.and_then(|r| r.get("error")))
                    ),
                ));
            }
        }
        Ok(Restored::Applied)
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
