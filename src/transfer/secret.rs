//! The actor secret as data moves: a mark is the keyed hash of an actor,
//! so it means something only under the secret it was keyed with. A file
//! names that secret by its fingerprint (`{"kind":"actor_secret"}`, never
//! the secret); an import admits the file's marks only where the gateways
//! that will read them key actors with the same secret, and records it:
//!
//! - an embedded store: its gateway uses `--actor-secret`, else
//!   `<data-dir>/actor-secret`. The file's fingerprint must be theirs; a
//!   data directory with neither gets the secret given to the import
//!   (`--actor-secret`) written to `actor-secret`, so its gateway uses it.
//! - a tenant on Elasticsearch: the fingerprint recorded for the tenant
//!   (by an earlier `migrate` or `import`) and `--actor-secret`, if given,
//!   must be the file's; then it is recorded, and every gateway on the
//!   cluster checks its own secret against it at start.
//!
//! Marks are also keyed for their tenant (`crate::domain::actor`), which
//! the record names (`keyed_for`). Marks keyed for another tenant than the
//! one imported into can never be brought to it (that needs the actors):
//! refused. Marks of a file without `keyed_for` (an export of an earlier
//! version) are of the first keying, and are brought to the tenant as they
//! are imported, with the secret (which the import then needs: the data
//! directory's, or `--actor-secret`).

use std::path::PathBuf;
use std::sync::Arc;

use super::format::ActorSecret;
use crate::actors::{existing_embedded_secret, keep_embedded_secret, SECRET_FILE};
use crate::domain::ActorKey;
use crate::store::elasticsearch::ElasticsearchStore;

/// What an import checks the fingerprint of a file's marks against.
#[derive(Clone)]
pub enum SecretCheck {
    /// Nothing: any fingerprint is admitted (a store whose gateways'
    /// secret is not known here).
    Unchecked,
    /// Tenant `tenant` of the embedded store whose data directory is
    /// `data_dir`; `given` is the import's `--actor-secret`.
    Embedded {
        data_dir: PathBuf,
        tenant: String,
        given: Option<String>,
    },
    /// A tenant on Elasticsearch; `given` is the import's `--actor-secret`,
    /// `key` the secret `migrate` read (to bring marks to the tenant).
    Cluster {
        store: Arc<ElasticsearchStore>,
        given: Option<String>,
        key: Option<ActorKey>,
    },
}

impl std::fmt::Debug for SecretCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        f.write_str(match self {
            SecretCheck::Unchecked => "SecretCheck::Unchecked",
            SecretCheck::Embedded { .. } => "SecretCheck::Embedded",
            SecretCheck::Cluster { .. } => "SecretCheck::Cluster",
        })
    }
}

/// The fingerprint of `--actor-secret`, checked as `serve` checks it.
pub fn given_fingerprint(given: Option<&str>) -> Result<Option<String>, String> {
    given
        .map(|s| {
            ActorKey::new(s.as_bytes())
                .map(|k| k.fingerprint().unwrap_or_default())
                .map_err(|e| format!("--actor-secret: {e}"))
        })
        .transpose()
}

fn mismatch(file: &str, source: &str, theirs: &str) -> String {
    format!(
        "the file's marks were keyed with the actor secret of fingerprint {file}, and {source} has fingerprint {theirs}: under it they would never match an actor again (every actor would count once more); import with the secret they were made with"
    )
}

impl SecretCheck {
    /// Admits the marks of a file whose `actor_secret` record is `file`, or
    /// says why not; may record the fingerprint (see the module doc). The
    /// answer is the key to bring each mark to the tenant with
    /// (`ActorKey::rekey`), for marks of the first keying.
    pub async fn admit(&self, file: &ActorSecret) -> Result<Option<ActorKey>, String> {
        self.admit_secret(&file.fingerprint).await?;
        let tenant = match self {
            SecretCheck::Unchecked => return Ok(None),
            SecretCheck::Embedded { tenant, .. } => tenant.as_str(),
            SecretCheck::Cluster { store, .. } => store.config().names.tenant(),
        };
        match &file.keyed_for {
            Some(t) if t == tenant => Ok(None),
            Some(t) => Err(format!(
                "the file's marks are keyed for tenant {t} (the tenant is in their hash), and this import goes to tenant {tenant}: under it they would never match an actor again (every actor would count once more). Import into tenant {t}"
            )),
            None => self.rekeying_key(tenant).map(Some),
        }
    }

    /// The secret that marks of the first keying are brought to `tenant`
    /// with: the one [`SecretCheck::admit_secret`] checked them against.
    fn rekeying_key(&self, tenant: &str) -> Result<ActorKey, String> {
        let given = |g: &Option<String>| -> Result<Option<ActorKey>, String> {
            g.as_deref()
                .map(|s| ActorKey::new(s.as_bytes()).map_err(|e| format!("--actor-secret: {e}")))
                .transpose()
        };
        let key = match self {
            SecretCheck::Unchecked => None,
            SecretCheck::Embedded {
                data_dir, given: g, ..
            } => match given(g)? {
                Some(k) => Some(k),
                None => existing_embedded_secret(data_dir)?,
            },
            SecretCheck::Cluster { given: g, key, .. } => given(g)?.or_else(|| key.clone()),
        };
        key.map(|k| k.for_tenant(tenant)).ok_or_else(|| {
            "the file's marks were keyed before marks were keyed for their tenant (an export of an earlier version: its actor_secret record has no keyed_for), and bringing them to the tenant needs their secret: give it as --actor-secret".to_string()
        })
    }

    /// Admits marks keyed with the secret of fingerprint `file`, or says
    /// why not. May record it (see the module doc).
    async fn admit_secret(&self, file: &str) -> Result<(), String> {
        match self {
            SecretCheck::Unchecked => Ok(()),
            SecretCheck::Embedded {
                data_dir, given, ..
            } => {
                let path = data_dir.join(SECRET_FILE);
                if let Some(g) = given_fingerprint(given.as_deref())? {
                    if g != file {
                        return Err(mismatch(file, "--actor-secret", &g));
                    }
                    if keep_embedded_secret(data_dir, given.as_deref().unwrap_or_default())? {
                        eprintln!(
                            "kept the actor secret of the imported marks (fingerprint {file}) in {}, for the gateway of this data directory",
                            path.display()
                        );
                    }
                    return Ok(());
                }
                match existing_embedded_secret(data_dir)? {
                    Some(k) => {
                        let mine = k.fingerprint().unwrap_or_default();
                        if mine == file {
                            Ok(())
                        } else {
                            Err(mismatch(file, &path.display().to_string(), &mine))
                        }
                    }
                    None => Err(format!(
                        "the file's marks were keyed with the actor secret of fingerprint {file}, and this data directory has none yet ({} does not exist): give that secret as --actor-secret (COUNTER_GATEWAY_ACTOR_SECRET), and the import keeps it there for the gateway",
                        path.display()
                    )),
                }
            }
            SecretCheck::Cluster { store, given, .. } => {
                if let Some(g) = given_fingerprint(given.as_deref())? {
                    if g != file {
                        return Err(mismatch(file, "--actor-secret", &g));
                    }
                }
                let index = store.config().names.actor_marks();
                match store
                    .recorded_fingerprint()
                    .await
                    .map_err(|e| e.to_string())?
                {
                    Some(r) if r == file => Ok(()),
                    Some(r) => Err(format!(
                        "the marks in {index} are recorded as keyed with the actor secret of fingerprint {r} (by an earlier migrate or import), the file's with {file}: marks of two secrets cannot be mixed (the gateways key actors with one)"
                    )),
                    None => store
                        .record_fingerprint(file)
                        .await
                        .map_err(|e| e.to_string()),
                }
            }
        }
    }
}
