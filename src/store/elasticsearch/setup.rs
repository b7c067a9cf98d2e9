//! `setup`: installing what `index-templates/` holds, skipping what is current.

use elasticsearch::http::Method;

use super::templates::{self, Install};
use super::{response, ElasticsearchStore};
use crate::store::StoreError;

/// What `setup` did with each object.
#[derive(Debug, Default)]
pub struct SetupReport {
    pub installed: Vec<String>,
    pub current: Vec<String>,
    pub newer: Vec<String>,
}

impl ElasticsearchStore {
    /// Installs what `index-templates/` holds, skipping what is current.
    pub async fn setup(&self) -> Result<SetupReport, StoreError> {
        let mut report = SetupReport::default();
        for step in templates::steps(&self.config.names) {
            let (status, body) = self.call(Method::Get, &step.path, &[], None).await?;
            match step.needs_install(status, &body) {
                Install::Current => report.current.push(step.name),
                Install::Newer => {
                    tracing::warn!(name = %step.name, "left alone: installed by a newer gateway");
                    report.newer.push(step.name);
                }
                Install::Missing | Install::Outdated => {
                    let payload = serde_json::to_vec(&step.body)
                        .map_err(|e| StoreError::Internal(e.to_string()))?;
                    let (status, body) = self
                        .call(Method::Put, &step.path, &[], Some(payload))
                        .await?;
                    if !(200..300).contains(&status) {
                        return Err(StoreError::Internal(format!(
                            "installing {} failed: {status} {}",
                            step.name,
                            response::describe_error(body.get("error"))
                        )));
                    }
                    tracing::info!(name = %step.name, "installed");
                    report.installed.push(step.name);
                }
            }
        }
        Ok(report)
    }
}
