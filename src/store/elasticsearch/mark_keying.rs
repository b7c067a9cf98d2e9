//! Which keying a tenant's actor marks have on Elasticsearch (see
//! `crate::domain::actor`): recorded as the tenant's name under
//! [`KEYING_META`] in the `_meta` of its `actor_marks` index, beside the
//! secret's fingerprint, before this version writes or imports a mark.
//!
//! Marks are document ids (`<counter>@<mark>`, `...@<day>`, and the
//! `@ids` registry documents), so marks an earlier version keyed without
//! the tenant cannot be rewritten in place, and this version does not
//! re-key them on a live cluster: a tenant whose mark indices hold
//! documents and no keying record is refused (the gateway does not start;
//! an import stops before its first mark), naming the indices and the way
//! on: export the tenant, delete its actor mark indices, import the file
//! with the secret (an export without `keyed_for` is re-keyed as it is
//! imported). See src/store/README.md ("Marks keyed for their tenant").

use elasticsearch::http::Method;
use serde_json::{json, Map, Value};

use super::client::status_error;
use super::response;
use super::ElasticsearchStore;
use crate::store::{MarkKeying, StoreError};

/// The key of the keying record in the `_meta` of an `actor_marks` index.
pub const KEYING_META: &str = "actor_marks_keyed_for";

/// The `actor_marks` index of the tenant a mark index belongs to: itself,
/// or for a monthly `<prefix>_<tenant>_actor_day_marks-YYYY.MM`, the
/// tenant's `<prefix>_<tenant>_actor_marks`.
fn ever_index_of(index: &str) -> String {
    match index.rsplit_once("_actor_day_marks-") {
        Some((tenant, _)) => format!("{tenant}_actor_marks"),
        None => index.to_string(),
    }
}

/// How to go on with a tenant whose marks predate the keying.
fn refusal(indices: &[String]) -> String {
    format!(
        "the actor marks in {} were keyed by an earlier version, without their tenant, and this version keys them for it (so that two tenants sharing a secret share no mark): on Elasticsearch they are not re-keyed in place. Per tenant: `counter-gateway export --tenant T --actor-secret S` (with this version, the gateways stopped), delete that tenant's actor mark indices (<prefix>_T_actor_marks, <prefix>_T_actor_day_marks-*), then `counter-gateway import --tenant T --actor-secret S` of that file: its marks are re-keyed as they are imported. Or delete those indices to start counting actors afresh",
        indices.join(", ")
    )
}

impl ElasticsearchStore {
    /// The `_meta` of this tenant's `actor_marks` index (empty when the
    /// index does not exist or has none).
    pub(super) async fn marks_meta(&self) -> Result<Map<String, Value>, StoreError> {
        let index = self.config.names.actor_marks();
        let (status, answer) = self
            .call(Method::Get, &format!("/{index}/_mapping"), &[], None)
            .await?;
        match status {
            200 => Ok(answer
                .get(&index)
                .and_then(|i| i.pointer("/mappings/_meta"))
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default()),
            404 => Ok(Map::new()),
            _ => Err(status_error(
                status,
                format!(
                    "reading the mapping of {index} answered {status} {}",
                    response::describe_error(answer.get("error"))
                ),
            )),
        }
    }

    /// Sets `key` to `value` in the `_meta` of this tenant's `actor_marks`
    /// index (made if missing), keeping the rest: a mapping update replaces
    /// the whole `_meta`.
    pub(super) async fn set_marks_meta(&self, key: &str, value: &str) -> Result<(), StoreError> {
        self.ensure_marks_index().await?;
        let mut meta = self.marks_meta().await?;
        meta.insert(key.to_string(), Value::String(value.to_string()));
        let index = self.config.names.actor_marks();
        let body = serde_json::to_vec(&json!({ "_meta": meta }))
            .map_err(|e| StoreError::Internal(e.to_string()))?;
        self.call_ok(
            Method::Put,
            &format!("/{index}/_mapping"),
            &[],
            Some(body),
            &format!("recording {key} on {index}"),
        )
        .await?;
        Ok(())
    }

    /// The mark indices of this tenant that hold documents.
    async fn tenant_mark_indices_with_docs(&self) -> Result<Vec<String>, StoreError> {
        self.mark_indices_with_docs(&self.config.names.actor_marks_pattern())
            .await
    }

    /// The indices among `pattern` (comma-separated names and patterns)
    /// holding a document, by name.
    async fn mark_indices_with_docs(&self, pattern: &str) -> Result<Vec<String>, StoreError> {
        let body = serde_json::to_vec(&json!({
            "size": 0,
            "track_total_hits": false,
            "aggs": {"indices": {"terms": {"field": "_index", "size": 10_000}}}
        }))
        .map_err(|e| StoreError::Internal(e.to_string()))?;
        let answer = self
            .call_ok(
                Method::Post,
                &format!("/{pattern}/_search"),
                &[("ignore_unavailable", "true"), ("allow_no_indices", "true")],
                Some(body),
                &format!("counting the documents of {pattern}"),
            )
            .await?;
        let mut out: Vec<String> = answer
            .pointer("/aggregations/indices/buckets")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|b| b.get("doc_count").and_then(Value::as_u64).unwrap_or(0) > 0)
            .filter_map(|b| b.get("key").and_then(Value::as_str).map(str::to_string))
            .collect();
        out.sort();
        Ok(out)
    }

    /// Which keying this tenant's marks have.
    pub(super) async fn mark_keying_es(&self) -> Result<MarkKeying, StoreError> {
        if let Some(t) = self
            .marks_meta()
            .await?
            .get(KEYING_META)
            .and_then(Value::as_str)
        {
            return Ok(MarkKeying::Tenant(t.to_string()));
        }
        Ok(if self.tenant_mark_indices_with_docs().await?.is_empty() {
            MarkKeying::Unbound
        } else {
            MarkKeying::Untenanted
        })
    }

    /// Records that this tenant's marks are keyed for it, before the first
    /// is written by this version (a flush of the gateway, an import);
    /// refuses a tenant whose marks predate the keying, or are recorded as
    /// another tenant's. Costs one read once recorded.
    pub(super) async fn ensure_marks_keyed(&self) -> Result<(), StoreError> {
        if self.check_marks_keyed().await? == MarkKeying::Unbound {
            self.set_marks_meta(KEYING_META, self.config.names.tenant())
                .await?;
        }
        Ok(())
    }

    /// [`ElasticsearchStore::ensure_marks_keyed`] without recording: the
    /// keying when it is this tenant's or none yet, else the refusal.
    pub(super) async fn check_marks_keyed(&self) -> Result<MarkKeying, StoreError> {
        let tenant = self.config.names.tenant();
        let index = self.config.names.actor_marks();
        match self.mark_keying_es().await? {
            MarkKeying::Tenant(t) if t != tenant => Err(StoreError::Internal(format!(
                "the actor marks in {index} are recorded as keyed for tenant {t:?}, not {tenant:?}: they would never match an actor of this tenant"
            ))),
            MarkKeying::Untenanted => Err(StoreError::Internal(refusal(
                &self.tenant_mark_indices_with_docs().await?,
            ))),
            keying => Ok(keying),
        }
    }

    /// The mark indices of every tenant of this prefix whose marks predate
    /// the keying (documents, and no keying record on their tenant's
    /// `actor_marks`): what a gateway refuses to start with.
    pub async fn untenanted_mark_indices(&self) -> Result<Vec<String>, StoreError> {
        let (ever, day) = self.config.names.all_actor_marks();
        let with_docs = self
            .mark_indices_with_docs(&format!("{ever},{day}"))
            .await?;
        if with_docs.is_empty() {
            return Ok(Vec::new());
        }
        let mappings = self
            .call_ok(
                Method::Get,
                &format!("/{ever}/_mapping"),
                &[("ignore_unavailable", "true"), ("allow_no_indices", "true")],
                None,
                &format!("reading the mappings of {ever}"),
            )
            .await?;
        let keyed = |index: &str| {
            mappings
                .get(index)
                .and_then(|m| m.pointer(&format!("/mappings/_meta/{KEYING_META}")))
                .is_some()
        };
        Ok(with_docs
            .into_iter()
            .filter(|i| !keyed(&ever_index_of(i)))
            .collect())
    }

    /// [`ElasticsearchStore::untenanted_mark_indices`] as a start-up check:
    /// the refusal, naming them. Reading them may fail (a user without
    /// `view_index_metadata`): then a warning, and each tenant is still
    /// checked before its first mark is written.
    pub async fn check_mark_keying(&self) -> Result<(), String> {
        match self.untenanted_mark_indices().await {
            Ok(old) if old.is_empty() => Ok(()),
            Ok(old) => Err(refusal(&old)),
            Err(e) => {
                tracing::warn!(error = %e, "could not read how the actor marks of every tenant are keyed: each tenant is checked before its first mark is written");
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_day_mark_index_names_its_tenants_ever_index() {
        assert_eq!(
            ever_index_of("cg_acme_actor_day_marks-2026.11"),
            "cg_acme_actor_marks"
        );
        assert_eq!(ever_index_of("cg_acme_actor_marks"), "cg_acme_actor_marks");
        let r = refusal(&["cg_acme_actor_marks".into()]);
        assert!(
            r.contains("cg_acme_actor_marks") && r.contains("import"),
            "{r}"
        );
    }
}
