//! `setup`: finding out which engine answers, then installing what
//! `index-templates/` holds for it, skipping what is current.

use elasticsearch::http::Method;
use serde_json::Value;

use super::templates::{self, Engine, Install};
use super::{response, ElasticsearchStore};
use crate::store::StoreError;

/// What `setup` did with each object.
#[derive(Debug)]
pub struct SetupReport {
    pub engine: Engine,
    pub installed: Vec<String>,
    pub current: Vec<String>,
    pub newer: Vec<String>,
}

impl ElasticsearchStore {
    /// The engine behind the URL, from `GET /` (which needs the `monitor`
    /// cluster privilege) and, on Elasticsearch, `GET /_ilm/status`: the OSS
    /// build of 7.x says `build_flavor: unknown` when assembled from jars,
    /// so only asking ILM tells whether it is there. Remembered for the
    /// store's lifetime.
    pub async fn engine(&self) -> Result<Engine, StoreError> {
        if let Some(e) = self.engine.get() {
            return Ok(*e);
        }
        let (status, root) = self.call(Method::Get, "/", &[], None).await?;
        if status != 200 {
            return Err(privilege_or(status, "GET /", &root, "monitor"));
        }
        let mut engine = Engine::from_root(&root).map_err(StoreError::Internal)?;
        engine.supported().map_err(StoreError::Internal)?;
        if engine.has_ilm() {
            let (status, body) = self.call(Method::Get, "/_ilm/status", &[], None).await?;
            if status == 429 || status >= 500 {
                return Err(privilege_or(status, "GET /_ilm/status", &body, "monitor"));
            }
            engine = engine.with_ilm_probe(status, &body);
        }
        Ok(*self.engine.get_or_init(|| engine))
    }

    /// Installs what `index-templates/` holds for this engine, skipping what
    /// is current. Scripts are stored in their `update` context, which
    /// compiles them: a script the engine cannot compile fails here, named.
    ///
    /// Every object is read before any is written, so an endpoint the
    /// engine lacks or a privilege the user lacks fails setup before it
    /// changed anything (an OSS 7.10 node once took the scripts, then
    /// refused `_ilm`, leaving half a setup).
    pub async fn setup(&self) -> Result<SetupReport, StoreError> {
        let engine = self.engine().await?;
        if !engine.has_ilm() {
            tracing::warn!(
                %engine,
                "no index lifecycle management on this engine: templates go in without a \
                 lifecycle policy, and the gateway deletes expired bucket and day-mark \
                 indices itself, at start and once a day"
            );
        }
        let mut report = SetupReport {
            engine,
            installed: Vec::new(),
            current: Vec::new(),
            newer: Vec::new(),
        };
        let mut plan = Vec::new();
        for step in templates::steps(&self.config.names, engine) {
            let (status, body) = self.call(Method::Get, &step.path, &[], None).await?;
            if status != 200 && status != 404 {
                return Err(privilege_or(status, &step.name, &body, "manage"));
            }
            let install = step.needs_install(status, &body);
            plan.push((step, install));
        }
        for (step, install) in plan {
            match install {
                Install::Current => report.current.push(step.name),
                Install::Newer => {
                    tracing::warn!(name = %step.name, "left alone: installed by a newer gateway");
                    report.newer.push(step.name);
                }
                Install::Missing | Install::Outdated => {
                    let payload = serde_json::to_vec(&step.body)
                        .map_err(|e| StoreError::Internal(e.to_string()))?;
                    let (status, body) = self
                        .call(Method::Put, &step.put_path, &[], Some(payload))
                        .await?;
                    if !(200..300).contains(&status) {
                        return Err(privilege_or(status, &step.name, &body, "manage"));
                    }
                    tracing::info!(name = %step.name, "installed");
                    report.installed.push(step.name);
                }
            }
        }
        // Mark indices made before the mark fields (template version 2).
        self.upgrade_mark_mappings().await?;
        self.upgrade_counter_mappings().await?;
        Ok(report)
    }

    /// Adds `applied_ops` (update scripts v2) to the mapping of counter,
    /// average and bucket indices of every tenant made by an earlier
    /// template: the scripts write it, and strict mappings would refuse
    /// every update. Adding a field is allowed on a live index and
    /// idempotent; no index matching is fine.
    async fn upgrade_counter_mappings(&self) -> Result<(), StoreError> {
        let p = self.config.names.prefix();
        let indices = format!(
            "{p}_*_counters,{p}_*_average_counters,{p}_*_histogram_counters-*,{p}_*_average_histogram_counters-*"
        );
        let body = serde_json::to_vec(&serde_json::json!({"properties": {
            "applied_ops": {"type": "keyword", "index": false, "doc_values": false},
        }}))
        .map_err(|e| StoreError::Internal(e.to_string()))?;
        let (status, answer) = self
            .call(
                Method::Put,
                &format!("/{indices}/_mapping"),
                &[("ignore_unavailable", "true"), ("allow_no_indices", "true")],
                Some(body),
            )
            .await?;
        match status {
            200 => Ok(()),
            404 if response::error_type(&answer) == Some("index_not_found_exception") => Ok(()),
            _ => Err(super::client::status_error(
                status,
                format!(
                    "adding applied_ops to the mapping of {indices} answered {status} {}",
                    response::describe_error(answer.get("error"))
                ),
            )),
        }
    }
}

/// Why a setup call failed: a missing privilege said as such, else the
/// engine's own error (for a script, its compile error and where).
fn privilege_or(status: u16, what: &str, body: &Value, privilege: &str) -> StoreError {
    if status == 401 || status == 403 {
        return StoreError::Internal(format!(
            "{what}: the cluster answered {status}: the gateway's user needs the `{privilege}` \
             cluster privilege for setup (see index-templates/README.md, 'Privileges'): {}",
            response::describe_error(body.get("error"))
        ));
    }
    let stack = body
        .pointer("/error/script_stack")
        .and_then(Value::as_array)
        .map(|lines| {
            let lines: Vec<&str> = lines.iter().filter_map(Value::as_str).collect();
            format!(" at:\n{}", lines.join("\n"))
        })
        .unwrap_or_default();
    let status_error = if status == 429 || status >= 500 {
        StoreError::Unavailable
    } else {
        StoreError::Internal
    };
    status_error(format!(
        "installing {what} failed: {status} {}{stack}",
        response::describe_error(body.get("error"))
    ))
}
