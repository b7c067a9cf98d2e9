//! CountAPI's records on the embedded store: each namespace made by
//! `create` (its admin key's SHA-256) and each key made by it (its rules),
//! in two tables of the tenant's database. The counters themselves are
//! ordinary counters (`crate::domain::countapi`).
//!
//! A creation is one transaction on the writer, between two flushes, and
//! fsync'd before it is answered, as a set is: the admin key answered
//! once must never belong to a namespace a crash forgot.

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::{sql, SqliteStore};
use crate::domain::countapi::{
    Created, CreatedKey, Creation, KeyRecord, KeyRules, Namespace, Records, Restored,
    MAX_CREATED_KEYS, MAX_NAMESPACES,
};
use crate::store::StoreError;

/// Created with the rest of the schema; an earlier build ignores them.
pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS countapi_namespaces (
    namespace        TEXT    PRIMARY KEY,
    admin_key_sha256 BLOB    NOT NULL,
    created_ms       INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS countapi_keys (
    namespace         TEXT    NOT NULL,
    key               TEXT    NOT NULL,
    enable_reset      INTEGER NOT NULL,
    update_lowerbound INTEGER NOT NULL,
    update_upperbound INTEGER NOT NULL,
    created_ms        INTEGER NOT NULL,
    PRIMARY KEY (namespace, key)
) WITHOUT ROWID;
";

fn namespace(conn: &Connection, name: &str) -> Result<Option<Namespace>, StoreError> {
    conn.prepare_cached(
        "SELECT admin_key_sha256, created_ms FROM countapi_namespaces WHERE namespace = ?1",
    )
    .and_then(|mut s| {
        s.query_row(params![name], |r| {
            let digest: Vec<u8> = r.get(0)?;
            Ok((digest, r.get::<_, i64>(1)?))
        })
        .optional()
    })
    .map_err(sql("countapi::namespace"))?
    .map(|(digest, created_ms)| {
        let admin_key_sha256 = <[u8; 32]>::try_from(digest.as_slice()).map_err(|_| {
            StoreError::Internal(format!(
                "countapi namespace {name:?}: a stored admin key digest of {} bytes",
                digest.len()
            ))
        })?;
        Ok(Namespace {
            name: name.to_string(),
            admin_key_sha256,
            created_ms,
        })
    })
    .transpose()
}

fn key(conn: &Connection, ns: &str, key: &str) -> Result<Option<CreatedKey>, StoreError> {
    conn.prepare_cached(
        "SELECT enable_reset, update_lowerbound, update_upperbound, created_ms
         FROM countapi_keys WHERE namespace = ?1 AND key = ?2",
    )
    .and_then(|mut s| {
        s.query_row(params![ns, key], |r| {
            Ok(CreatedKey {
                rules: KeyRules {
                    enable_reset: r.get(0)?,
                    update_lowerbound: r.get(1)?,
                    update_upperbound: r.get(2)?,
                },
                created_ms: r.get(3)?,
            })
        })
        .optional()
    })
    .map_err(sql("countapi::key"))
}

/// Up to `limit` created keys after `after`, each with its namespace's
/// record, in (namespace, key) order: `TEXT` compares bytewise, as the
/// Elasticsearch store's keywords sort, so both export the same file.
fn page(
    conn: &Connection,
    after: Option<&(String, String)>,
    limit: usize,
) -> Result<Vec<KeyRecord>, StoreError> {
    // Every name has 3 characters or more: ("", "") is before them all.
    let (ns, k) = after.map_or(("", ""), |(n, k)| (n.as_str(), k.as_str()));
    let mut stmt = conn
        .prepare_cached(
            "SELECT k.namespace, k.key, k.enable_reset, k.update_lowerbound,
                    k.update_upperbound, k.created_ms, n.admin_key_sha256, n.created_ms
             FROM countapi_keys k JOIN countapi_namespaces n ON n.namespace = k.namespace
             WHERE (k.namespace, k.key) > (?1, ?2)
             ORDER BY k.namespace, k.key LIMIT ?3",
        )
        .map_err(sql("countapi::page"))?;
    let rows = stmt
        .query_map(
            params![ns, k, i64::try_from(limit).unwrap_or(i64::MAX)],
            |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    KeyRules {
                        enable_reset: r.get(2)?,
                        update_lowerbound: r.get(3)?,
                        update_upperbound: r.get(4)?,
                    },
                    r.get::<_, i64>(5)?,
                    r.get::<_, Vec<u8>>(6)?,
                    r.get::<_, i64>(7)?,
                ))
            },
        )
        .map_err(sql("countapi::page"))?;
    let mut out = Vec::new();
    for row in rows {
        let (name, key, rules, created_ms, digest, ns_created_ms) =
            row.map_err(sql("countapi::page"))?;
        let admin_key_sha256 = <[u8; 32]>::try_from(digest.as_slice()).map_err(|_| {
            StoreError::Internal(format!(
                "countapi namespace {name:?}: a stored admin key digest of {} bytes",
                digest.len()
            ))
        })?;
        out.push(KeyRecord {
            namespace: Namespace {
                name,
                admin_key_sha256,
                created_ms: ns_created_ms,
            },
            key,
            created: CreatedKey { rules, created_ms },
        });
    }
    Ok(out)
}

/// Sets `records` inside `conn`'s open transaction: each namespace takes
/// its record's admin key and time, each key its rules and time. Stops at
/// the first record past a bound (the caller then rolls back).
fn restore_in(conn: &Connection, records: &[KeyRecord]) -> Result<Restored, StoreError> {
    let mut namespaces = count(conn, "countapi_namespaces")?;
    let mut keys = count(conn, "countapi_keys")?;
    for (i, r) in records.iter().enumerate() {
        let ns = &r.namespace;
        if namespace(conn, &ns.name)?.is_none() {
            if namespaces >= MAX_NAMESPACES {
                return Ok(Restored::Full(i, "namespaces"));
            }
            namespaces += 1;
        }
        if key(conn, &ns.name, &r.key)?.is_none() {
            if keys >= MAX_CREATED_KEYS {
                return Ok(Restored::Full(i, "keys made by create"));
            }
            keys += 1;
        }
        conn.prepare_cached(
            "INSERT INTO countapi_namespaces (namespace, admin_key_sha256, created_ms)
             VALUES (?1, ?2, ?3)
             ON CONFLICT (namespace) DO UPDATE
             SET admin_key_sha256 = excluded.admin_key_sha256, created_ms = excluded.created_ms",
        )
        .and_then(|mut s| s.execute(params![ns.name, &ns.admin_key_sha256[..], ns.created_ms]))
        .map_err(sql("countapi::restore"))?;
        let rules = r.created.rules;
        conn.prepare_cached(
            "INSERT INTO countapi_keys
             (namespace, key, enable_reset, update_lowerbound, update_upperbound, created_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (namespace, key) DO UPDATE
             SET enable_reset = excluded.enable_reset,
                 update_lowerbound = excluded.update_lowerbound,
                 update_upperbound = excluded.update_upperbound,
                 created_ms = excluded.created_ms",
        )
        .and_then(|mut s| {
            s.execute(params![
                ns.name,
                r.key,
                rules.enable_reset,
                rules.update_lowerbound,
                rules.update_upperbound,
                r.created.created_ms
            ])
        })
        .map_err(sql("countapi::restore"))?;
    }
    Ok(Restored::Applied)
}

fn count(conn: &Connection, table: &str) -> Result<u64, StoreError> {
    conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| {
        r.get::<_, i64>(0)
    })
    .map(|n| n.max(0) as u64)
    .map_err(sql("countapi::count"))
}

/// The creation inside `conn`'s open transaction; nothing written unless
/// [`Created::Made`].
fn create_in(conn: &Connection, c: &Creation) -> Result<Created, StoreError> {
    if key(conn, &c.namespace, &c.key)?.is_some() {
        return Ok(Created::KeyExists);
    }
    let new_namespace = namespace(conn, &c.namespace)?.is_none();
    if new_namespace && count(conn, "countapi_namespaces")? >= MAX_NAMESPACES {
        return Ok(Created::Full("namespaces"));
    }
    if count(conn, "countapi_keys")? >= MAX_CREATED_KEYS {
        return Ok(Created::Full("keys made by create"));
    }
    if new_namespace {
        conn.execute(
            "INSERT INTO countapi_namespaces (namespace, admin_key_sha256, created_ms)
             VALUES (?1, ?2, ?3)",
            params![c.namespace, &c.admin_key_sha256[..], c.now_ms],
        )
        .map_err(sql("countapi::create"))?;
    }
    conn.execute(
        "INSERT INTO countapi_keys
         (namespace, key, enable_reset, update_lowerbound, update_upperbound, created_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            c.namespace,
            c.key,
            c.rules.enable_reset,
            c.rules.update_lowerbound,
            c.rules.update_upperbound,
            c.now_ms
        ],
    )
    .map_err(sql("countapi::create"))?;
    Ok(Created::Made {
        namespace: new_namespace,
    })
}

impl SqliteStore {
    pub(super) async fn countapi_records_sql(
        &self,
        ns: &str,
        k: &str,
    ) -> Result<Records, StoreError> {
        let (ns, k) = (ns.to_string(), k.to_string());
        self.with_reader(move |conn| {
            Ok(Records {
                namespace: namespace(conn, &ns)?,
                key: key(conn, &ns, &k)?,
            })
        })
        .await
    }

    pub(super) async fn countapi_page_sql(
        &self,
        after: Option<(String, String)>,
        limit: usize,
    ) -> Result<Vec<KeyRecord>, StoreError> {
        self.with_reader(move |conn| page(conn, after.as_ref(), limit))
            .await
    }

    /// One transaction, fsync'd before it answers, as a create is: all of
    /// `records` or, past a bound, none.
    pub(super) async fn countapi_restore_sql(
        &self,
        records: Vec<KeyRecord>,
    ) -> Result<Restored, StoreError> {
        self.check_halted()?;
        if records.is_empty() {
            return Ok(Restored::Applied);
        }
        let last_write = self.last_write.clone();
        let restored = self
            .with_writer(move |w| {
                let tx = w
                    .conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(sql("countapi::restore"))?;
                let restored = restore_in(&tx, &records)?;
                if restored == Restored::Applied {
                    tx.commit().map_err(sql("countapi::restore"))?;
                    last_write.wrote();
                }
                Ok(restored)
            })
            .await?;
        if restored == Restored::Applied {
            crate::store::Store::sync(self).await?;
        }
        Ok(restored)
    }

    pub(super) async fn countapi_create_sql(&self, c: Creation) -> Result<Created, StoreError> {
        self.check_halted()?;
        let last_write = self.last_write.clone();
        let created = self
            .with_writer(move |w| {
                let tx = w
                    .conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(sql("countapi::create"))?;
                let created = create_in(&tx, &c)?;
                if matches!(created, Created::Made { .. }) {
                    tx.commit().map_err(sql("countapi::create"))?;
                    last_write.wrote();
                }
                Ok(created)
            })
            .await?;
        if matches!(created, Created::Made { .. }) {
            if let Err(e) = crate::store::Store::sync(self).await {
                tracing::error!(error = %e, "sync after a CountAPI create failed");
                return Err(StoreError::Halted(format!(
                    "{}; the key was recorded but may not survive a crash",
                    crate::store::HALTED_AFTER_FSYNC
                )));
            }
        }
        Ok(created)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db() -> Connection {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch(SCHEMA).unwrap();
        c
    }

    fn creation(ns: &str, key: &str, admin: &str) -> Creation {
        Creation {
            namespace: ns.into(),
            key: key.into(),
            rules: KeyRules::new(true, -2, 5).unwrap(),
            admin_key_sha256: crate::auth::digest(admin),
            now_ms: 1_000,
        }
    }

    #[test]
    fn a_namespace_is_made_once_and_a_key_once() {
        let c = db();
        assert_eq!(
            create_in(&c, &creation("site.com", "visits", "a1")).unwrap(),
            Created::Made { namespace: true }
        );
        // The second key keeps the first admin key.
        assert_eq!(
            create_in(&c, &creation("site.com", "clicks", "a2")).unwrap(),
            Created::Made { namespace: false }
        );
        assert_eq!(
            create_in(&c, &creation("site.com", "visits", "a3")).unwrap(),
            Created::KeyExists
        );
        let ns = namespace(&c, "site.com").unwrap().unwrap();
        assert!(ns.admits("a1") && !ns.admits("a2"));
        let k = key(&c, "site.com", "visits").unwrap().unwrap();
        assert_eq!(k.rules, KeyRules::new(true, -2, 5).unwrap());
        assert_eq!(k.created_ms, 1_000);
        assert!(key(&c, "site.com", "other").unwrap().is_none());
        assert!(namespace(&c, "other.com").unwrap().is_none());
    }

    #[test]
    fn namespaces_are_bounded() {
        let c = db();
        c.execute_batch(&format!(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {MAX_NAMESPACES})
             INSERT INTO countapi_namespaces SELECT 'ns' || i, zeroblob(32), 0 FROM n;"
        ))
        .unwrap();
        assert_eq!(
            create_in(&c, &creation("one-more", "key", "a")).unwrap(),
            Created::Full("namespaces")
        );
        assert!(namespace(&c, "one-more").unwrap().is_none());
        // A namespace that exists still takes keys.
        assert_eq!(
            create_in(&c, &creation("ns7", "key", "a")).unwrap(),
            Created::Made { namespace: false }
        );
    }

    fn record(ns: &str, key: &str, digest: u8, lower: i64) -> KeyRecord {
        KeyRecord {
            namespace: Namespace {
                name: ns.into(),
                admin_key_sha256: [digest; 32],
                created_ms: 5,
            },
            key: key.into(),
            created: CreatedKey {
                rules: KeyRules::new(false, lower, 1).unwrap(),
                created_ms: 7,
            },
        }
    }

    #[test]
    fn a_restore_sets_records_pages_them_in_order_and_stops_whole_at_a_bound() {
        let c = db();
        create_in(&c, &creation("site.com", "visits", "a1")).unwrap();
        let restored = [
            record("site.com", "visits", 1, -3),
            record("b.org", "zzz", 2, -1),
            record("b.org", "aaa", 2, -1),
        ];
        assert_eq!(restore_in(&c, &restored).unwrap(), Restored::Applied);
        // Sets: the namespace takes the record's admin key, the key its rules.
        let all = page(&c, None, 10).unwrap();
        assert_eq!(
            all,
            vec![
                restored[2].clone(),
                restored[1].clone(),
                restored[0].clone()
            ]
        );
        assert_eq!(
            page(&c, Some(&all[0].cursor()), 1).unwrap(),
            vec![all[1].clone()]
        );
        assert!(page(&c, Some(&all[2].cursor()), 10).unwrap().is_empty());
        // Setting again changes nothing.
        assert_eq!(restore_in(&c, &restored).unwrap(), Restored::Applied);
        assert_eq!(page(&c, None, 10).unwrap(), all);
        // Past the bound on namespaces: the index of the first record past it.
        c.execute_batch(&format!(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {})
             INSERT INTO countapi_namespaces SELECT 'ns' || i, zeroblob(32), 0 FROM n;",
            MAX_NAMESPACES - 2
        ))
        .unwrap();
        let more = [
            record("b.org", "new", 2, -1),
            record("one-more", "k1k", 3, 0),
        ];
        assert_eq!(
            restore_in(&c, &more).unwrap(),
            Restored::Full(1, "namespaces")
        );
    }
}
