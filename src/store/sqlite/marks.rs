//! Marks of actors: what the embedded store keeps to count an event with
//! `unique` once per actor (see `crate::domain::Unique`).
//!
//! A mark is claimed inside the flush's own transaction, after the event's
//! idempotency id and before the event is coalesced, so counting is exact:
//! the mark and the count commit together or not at all (an overflowing
//! request rolls back both). Two tables, both clustered by their primary key:
//!
//! - `actor_marks (ckey, mark)`: `ever` marks (likes). Present while the
//!   actor's like counts; an unlike deletes it.
//! - `actor_day_marks (day, ckey, mark)`: `day` marks (views), by UTC day
//!   first, so the retention deletes the oldest days as a range, like buckets.
//!
//! `ckey` is 16 bytes of SHA-256 of the counter's document id, so marks need
//! no counter row (the counter may be created by the very flush that claims
//! its first mark) and a counter's marks are found for its delete. `mark` is
//! the keyed hash of the actor on that counter: never the actor itself.
//!
//! `actor_mark_keys (ckey, entity, action, uuid)` names the counter of a
//! `ckey`, one row per counter that was ever marked, written with its first
//! mark: `export` lists marks with their counter's key, and a hash cannot be
//! read back. A store whose marks predate this table gets its rows once, at
//! open ([`backfill_keys`]).
//!
//! `actor_mark_keying (id = 1, tenant)` records which keying the marks have
//! (see `crate::domain::actor`): `NULL`, the first one, without the tenant
//! (what a store written by an earlier version holds); `''`, none yet (the
//! store had no mark when this version first opened it: every mark is of
//! the tenant it serves); else the tenant they are keyed for. The row is
//! written at open ([`note_keying`]), before anything could write a mark;
//! a gateway then brings the marks to its tenant ([`key_for_tenant`]):
//! once, in one transaction, and never again (the row says so).

use std::time::{Duration, Instant};

use rusqlite::{params, Connection};

use super::{internal_msg, sql};
use crate::domain::{ActorKey, CounterKey, Increment, Mark, Scope};
use crate::store::{ActorMark, MarkKeying as Keying, MarkState, StoreError};

/// Created with the rest of the schema when a store opens.
pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS actor_marks (
    ckey BLOB NOT NULL,
    mark BLOB NOT NULL,
    PRIMARY KEY (ckey, mark)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS actor_day_marks (
    day  INTEGER NOT NULL,
    ckey BLOB    NOT NULL,
    mark BLOB    NOT NULL,
    PRIMARY KEY (day, ckey, mark)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS actor_mark_keys (
    ckey   BLOB NOT NULL PRIMARY KEY,
    entity TEXT NOT NULL,
    action TEXT NOT NULL,
    uuid   TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS actor_mark_keying (
    id     INTEGER PRIMARY KEY CHECK (id = 1),
    tenant TEXT
);
";

/// Records, at open, the keying of a store that has no record yet: the
/// first one if it holds marks (only an earlier version can have written
/// them, since this row is written before any write), none otherwise.
pub(super) fn note_keying(tx: &Connection) -> Result<(), StoreError> {
    let any = |stmt: &str| -> Result<bool, StoreError> {
        tx.prepare(stmt)
            .and_then(|mut s| s.exists([]))
            .map_err(sql("marks::note_keying"))
    };
    if any("SELECT 1 FROM actor_mark_keying")? {
        return Ok(());
    }
    let old =
        any("SELECT 1 FROM actor_marks LIMIT 1")? || any("SELECT 1 FROM actor_day_marks LIMIT 1")?;
    tx.execute(
        "INSERT INTO actor_mark_keying (id, tenant) VALUES (1, ?1)",
        [if old { None } else { Some("") }],
    )
    .map_err(sql("marks::note_keying"))?;
    Ok(())
}

/// The keying of the store's marks.
pub(super) fn keying(conn: &Connection) -> Result<Keying, StoreError> {
    let tenant: Option<String> = conn
        .query_row(
            "SELECT tenant FROM actor_mark_keying WHERE id = 1",
            [],
            |r| r.get(0),
        )
        .map_err(sql("marks::keying"))?;
    Ok(match tenant {
        None => Keying::Untenanted,
        Some(t) if t.is_empty() => Keying::Unbound,
        Some(t) => Keying::Tenant(t),
    })
}

/// Brings the marks to the keying of `key`'s tenant, in one transaction
/// (all of them or none) that records it; returns how many were rekeyed.
/// Marks of the first keying are rewritten in place with
/// [`ActorKey::rekey`] (without a secret they are left, and `unique` is
/// refused anyway); a store keyed for the tenant already costs one read.
/// Marks keyed for another tenant (a directory copied under another
/// name) cannot be brought to this one: refused, naming both.
pub(super) fn key_for_tenant(conn: &mut Connection, key: &ActorKey) -> Result<u64, StoreError> {
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(sql("marks::key_for_tenant"))?;
    let tenant = key.tenant();
    let mut rekeyed = 0;
    match keying(&tx)? {
        Keying::Tenant(t) if t == tenant => return Ok(0),
        Keying::Tenant(t) => {
            return Err(StoreError::Internal(format!(
                "the actor marks of this store are keyed for tenant {t:?}, and it is opened as tenant {tenant:?}: under this tenant they would never match an actor again (every actor would count once more). Serve it as tenant {t:?}"
            )))
        }
        Keying::Untenanted if !key.is_set() => return Ok(0),
        Keying::Untenanted => {
            for (table, columns) in [
                ("actor_marks", "ckey, mark"),
                ("actor_day_marks", "day, ckey, mark"),
            ] {
                rekeyed += rekey_table(&tx, key, table, columns)?;
            }
        }
        Keying::Unbound => {}
    }
    tx.execute(
        "UPDATE actor_mark_keying SET tenant = ?1 WHERE id = 1",
        [tenant],
    )
    .map_err(sql("marks::key_for_tenant"))?;
    tx.commit().map_err(sql("marks::key_for_tenant"))?;
    Ok(rekeyed)
}

/// Rewrites every mark of `table` (whose columns are `columns`, the mark
/// last) with [`ActorKey::rekey`]: into a new table of the same schema,
/// which then takes the old one's place, so that no row is read after
/// being rewritten.
fn rekey_table(
    tx: &Connection,
    key: &ActorKey,
    table: &str,
    columns: &str,
) -> Result<u64, StoreError> {
    let old = format!("{table}_untenanted");
    tx.execute_batch(&format!("ALTER TABLE {table} RENAME TO {old};"))
        .map_err(sql("marks::rekey_table"))?;
    tx.execute_batch(SCHEMA)
        .map_err(sql("marks::rekey_table"))?;
    let n = columns.split(", ").count();
    let marks_at = n - 1;
    let placeholders: Vec<String> = (1..=n).map(|i| format!("?{i}")).collect();
    let mut insert = tx
        .prepare(&format!(
            "INSERT OR IGNORE INTO {table} ({columns}) VALUES ({})",
            placeholders.join(", ")
        ))
        .map_err(sql("marks::rekey_table"))?;
    let mut read = tx
        .prepare(&format!("SELECT {columns} FROM {old}"))
        .map_err(sql("marks::rekey_table"))?;
    let mut rows = read.query([]).map_err(sql("marks::rekey_table"))?;
    let mut done = 0;
    while let Some(r) = rows.next().map_err(sql("marks::rekey_table"))? {
        let mut values: Vec<rusqlite::types::Value> = (0..n)
            .map(|i| r.get(i))
            .collect::<Result<_, _>>()
            .map_err(sql("marks::rekey_table"))?;
        let rusqlite::types::Value::Blob(bytes) = &values[marks_at] else {
            return Err(internal_msg(&format!("a mark in {table} is no blob")));
        };
        let old_mark = Mark(
            bytes
                .as_slice()
                .try_into()
                .map_err(|_| internal_msg(&format!("a mark in {table} is not 16 bytes")))?,
        );
        let new_mark = key
            .rekey(old_mark)
            .ok_or_else(|| internal_msg("rekeying marks without a secret"))?;
        values[marks_at] = rusqlite::types::Value::Blob(new_mark.0.to_vec());
        insert
            .execute(rusqlite::params_from_iter(values))
            .map_err(sql("marks::rekey_table"))?;
        done += 1;
    }
    drop(rows);
    drop(read);
    drop(insert);
    tx.execute_batch(&format!("DROP TABLE {old};"))
        .map_err(sql("marks::rekey_table"))?;
    Ok(done)
}

/// Day marks deleted per statement of the background retention, each its
/// own transaction (as buckets are).
const RETAIN_BATCH: i64 = 5_000;

/// The counter part of a mark's key.
fn ckey(key: &CounterKey) -> [u8; 16] {
    ActorMark::counter_hash(key)
}

/// Claims the marks of the events of one request that carry `unique`, in
/// order, inside the caller's transaction. `skip` holds, per event, whether
/// it is already left out (its id was counted before): such an event leaves
/// its mark alone. An event whose mark says its actor was counted already
/// (or, for an unlike, has nothing to take back) is set to be skipped too.
/// Returns how many were, the request's repeats.
///
/// A like inserts the `ever` mark and counts only if it was not there; an
/// unlike deletes it and counts only if it was; a view inserts the mark of
/// its day. Events of one request on one mark see each other in order.
/// A mark made names its counter in `actor_mark_keys` (a lookup when the
/// counter has one already).
pub(super) fn claim(
    tx: &Connection,
    events: &[Increment],
    skip: &mut [bool],
) -> Result<u32, StoreError> {
    if events.iter().all(|e| e.unique.is_none()) {
        return Ok(0);
    }
    let mut like = tx
        .prepare_cached("INSERT OR IGNORE INTO actor_marks (ckey, mark) VALUES (?1, ?2)")
        .map_err(sql("marks::claim"))?;
    let mut unlike = tx
        .prepare_cached("DELETE FROM actor_marks WHERE ckey = ?1 AND mark = ?2")
        .map_err(sql("marks::claim"))?;
    let mut view = tx
        .prepare_cached(
            "INSERT OR IGNORE INTO actor_day_marks (day, ckey, mark) VALUES (?1, ?2, ?3)",
        )
        .map_err(sql("marks::claim"))?;
    let mut named = tx.prepare_cached(NAME_KEY).map_err(sql("marks::claim"))?;
    let mut repeats = 0;
    for (e, skip) in events.iter().zip(skip.iter_mut()) {
        let Some(u) = &e.unique else { continue };
        if *skip {
            continue;
        }
        let (c, m) = (ckey(&e.key), &u.mark.0[..]);
        let changed = match u.scope {
            Scope::Ever if e.delta > 0 => like.execute(params![&c[..], m]),
            Scope::Ever => unlike.execute(params![&c[..], m]),
            Scope::Day => view.execute(params![e.day, &c[..], m]),
        }
        .map_err(sql("marks::claim"))?;
        if changed == 0 {
            *skip = true;
            repeats += 1;
        } else if e.delta > 0 {
            let k = &e.key;
            named
                .execute(params![&c[..], &*k.entity, &*k.action, &*k.uuid])
                .map_err(sql("marks::claim"))?;
        }
    }
    Ok(repeats)
}

/// Names the counter of a `ckey` (nothing when it is named already).
const NAME_KEY: &str =
    "INSERT OR IGNORE INTO actor_mark_keys (ckey, entity, action, uuid) VALUES (?1, ?2, ?3, ?4)";

/// Gives a store whose marks were made before `actor_mark_keys` existed
/// the rows naming their counters: one per counter (a mark's counter is
/// among them; counters without marks cost a row each, once). Runs at
/// open, inside its transaction; does nothing once the table has rows or
/// when there are no marks (two lookups).
pub(super) fn backfill_keys(tx: &Connection) -> Result<u64, StoreError> {
    let any = |stmt: &str| -> Result<bool, StoreError> {
        tx.prepare(stmt)
            .and_then(|mut s| s.exists([]))
            .map_err(sql("marks::backfill_keys"))
    };
    if any("SELECT 1 FROM actor_mark_keys LIMIT 1")?
        || !(any("SELECT 1 FROM actor_marks LIMIT 1")?
            || any("SELECT 1 FROM actor_day_marks LIMIT 1")?)
    {
        return Ok(0);
    }
    let mut read = tx
        .prepare("SELECT entity, action, uuid FROM counters")
        .map_err(sql("marks::backfill_keys"))?;
    let mut rows = read.query([]).map_err(sql("marks::backfill_keys"))?;
    let mut named = tx
        .prepare_cached(NAME_KEY)
        .map_err(sql("marks::backfill_keys"))?;
    let mut n = 0;
    while let Some(r) = rows.next().map_err(sql("marks::backfill_keys"))? {
        let key = CounterKey {
            entity: r
                .get::<_, String>(0)
                .map_err(sql("marks::backfill_keys"))?
                .into(),
            action: r
                .get::<_, String>(1)
                .map_err(sql("marks::backfill_keys"))?
                .into(),
            uuid: r
                .get::<_, String>(2)
                .map_err(sql("marks::backfill_keys"))?
                .into(),
        };
        n += named
            .execute(params![
                &ckey(&key)[..],
                &*key.entity,
                &*key.action,
                &*key.uuid
            ])
            .map_err(sql("marks::backfill_keys"))? as u64;
    }
    Ok(n)
}

/// Export: up to `limit` marks after `after` in the order of
/// [`ActorMark::order`] (`ever` marks by `(ckey, mark)`, then `day` marks
/// from `from_day` on by `(day, ckey, mark)`: each table's own key order,
/// so a page is one range of each), read in one snapshot. A mark whose
/// counter is not named (none should be) is left out.
pub(super) fn page(
    conn: &Connection,
    after: Option<&ActorMark>,
    limit: usize,
    from_day: i64,
) -> Result<Vec<ActorMark>, StoreError> {
    let tx = conn.unchecked_transaction().map_err(sql("marks::page"))?;
    let mut out = Vec::with_capacity(limit.min(10_000));
    let blob16 = |v: Vec<u8>| -> rusqlite::Result<[u8; 16]> {
        v.try_into().map_err(|_| {
            rusqlite::Error::InvalidColumnType(
                0,
                "a 16-byte hash".into(),
                rusqlite::types::Type::Blob,
            )
        })
    };
    let key_at = |r: &rusqlite::Row<'_>, at: usize| -> rusqlite::Result<CounterKey> {
        Ok(CounterKey {
            entity: r.get::<_, String>(at)?.into(),
            action: r.get::<_, String>(at + 1)?.into(),
            uuid: r.get::<_, String>(at + 2)?.into(),
        })
    };
    let (day_from, day_ckey, day_mark) = match after {
        Some(ActorMark {
            day: Some(day),
            key,
            mark,
            ..
        }) => (*day, ckey(key).to_vec(), mark.0.to_vec()),
        _ => {
            let (c, m) = match after {
                Some(a) => (ckey(&a.key).to_vec(), a.mark.0.to_vec()),
                None => (Vec::new(), Vec::new()),
            };
            let mut s = tx
                .prepare_cached(
                    "SELECT m.mark, k.entity, k.action, k.uuid
                     FROM actor_marks m JOIN actor_mark_keys k ON k.ckey = m.ckey
                     WHERE (m.ckey, m.mark) > (?1, ?2)
                     ORDER BY m.ckey, m.mark LIMIT ?3",
                )
                .map_err(sql("marks::page"))?;
            let rows = s
                .query_map(params![c, m, limit as i64], |r| {
                    Ok(ActorMark {
                        mark: Mark(blob16(r.get(0)?)?),
                        key: key_at(r, 1)?,
                        day: None,
                        state: MarkState::Counted,
                    })
                })
                .map_err(sql("marks::page"))?;
            for r in rows {
                out.push(r.map_err(sql("marks::page"))?);
            }
            if out.len() >= limit {
                return Ok(out);
            }
            (from_day, Vec::new(), Vec::new())
        }
    };
    let mut s = tx
        .prepare_cached(
            "SELECT d.day, d.mark, k.entity, k.action, k.uuid
             FROM actor_day_marks d JOIN actor_mark_keys k ON k.ckey = d.ckey
             WHERE (d.day, d.ckey, d.mark) > (?1, ?2, ?3) AND d.day >= ?4
             ORDER BY d.day, d.ckey, d.mark LIMIT ?5",
        )
        .map_err(sql("marks::page"))?;
    let rows = s
        .query_map(
            params![
                day_from,
                day_ckey,
                day_mark,
                from_day,
                (limit - out.len()) as i64
            ],
            |r| {
                Ok(ActorMark {
                    day: Some(r.get(0)?),
                    mark: Mark(blob16(r.get(1)?)?),
                    key: key_at(r, 2)?,
                    state: MarkState::Counted,
                })
            },
        )
        .map_err(sql("marks::page"))?;
    for r in rows {
        out.push(r.map_err(sql("marks::page"))?);
    }
    Ok(out)
}

/// Import: each mark set, inside the import's transaction. Set, not added:
/// a mark there already stays one. A mark `retracting` on Elasticsearch is
/// kept as counted (this store has no such state: it is what Elasticsearch
/// reads it as once stale).
pub(super) fn import(tx: &Connection, marks: &[ActorMark]) -> Result<(), StoreError> {
    if marks.is_empty() {
        return Ok(());
    }
    let mut like = tx
        .prepare_cached("INSERT OR IGNORE INTO actor_marks (ckey, mark) VALUES (?1, ?2)")
        .map_err(sql("marks::import"))?;
    let mut view = tx
        .prepare_cached(
            "INSERT OR IGNORE INTO actor_day_marks (day, ckey, mark) VALUES (?1, ?2, ?3)",
        )
        .map_err(sql("marks::import"))?;
    let mut named = tx.prepare_cached(NAME_KEY).map_err(sql("marks::import"))?;
    for m in marks {
        let c = ckey(&m.key);
        match m.day {
            None => like.execute(params![&c[..], &m.mark.0[..]]),
            Some(day) => view.execute(params![day, &c[..], &m.mark.0[..]]),
        }
        .map_err(sql("marks::import"))?;
        let k = &m.key;
        named
            .execute(params![&c[..], &*k.entity, &*k.action, &*k.uuid])
            .map_err(sql("marks::import"))?;
    }
    Ok(())
}

/// Forgets every mark of a deleted counter, in the delete's transaction:
/// a counter made again starts with no likes and no views.
pub(super) fn forget(tx: &Connection, key: &CounterKey) -> Result<(), StoreError> {
    let c = ckey(key);
    tx.execute("DELETE FROM actor_marks WHERE ckey = ?1", [&c[..]])
        .map_err(sql("marks::forget"))?;
    tx.execute("DELETE FROM actor_mark_keys WHERE ckey = ?1", [&c[..]])
        .map_err(sql("marks::forget"))?;
    // Day marks are clustered by day: one range per kept day, a few hundred
    // seeks, rather than a scan of every view.
    let (first, last): (Option<i64>, Option<i64>) = tx
        .query_row("SELECT min(day), max(day) FROM actor_day_marks", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .map_err(sql("marks::forget"))?;
    if let (Some(first), Some(last)) = (first, last) {
        let mut s = tx
            .prepare_cached("DELETE FROM actor_day_marks WHERE day = ?1 AND ckey = ?2")
            .map_err(sql("marks::forget"))?;
        for day in first..=last {
            s.execute(params![day, &c[..]])
                .map_err(sql("marks::forget"))?;
        }
    }
    Ok(())
}

/// Deletes the day marks of days before `oldest_day` (the oldest day an
/// event is still accepted for: older marks can never decide anything),
/// oldest first, in batches of [`RETAIN_BATCH`] (each its own transaction),
/// until none is left or `budget` is spent. Returns how many were deleted.
pub(super) fn expire(
    conn: &Connection,
    oldest_day: i64,
    budget: Duration,
) -> Result<u64, StoreError> {
    let started = Instant::now();
    let mut s = conn
        .prepare_cached(
            "DELETE FROM actor_day_marks WHERE (day, ckey, mark) IN (
                 SELECT day, ckey, mark FROM actor_day_marks WHERE day < ?1
                 ORDER BY day, ckey, mark LIMIT ?2)",
        )
        .map_err(sql("marks::expire"))?;
    let mut deleted = 0u64;
    loop {
        let n = s
            .execute(params![oldest_day, RETAIN_BATCH])
            .map_err(sql("marks::expire"))?;
        deleted += n as u64;
        if (n as i64) < RETAIN_BATCH || started.elapsed() >= budget {
            return Ok(deleted);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Kind, Unique};

    const DAY: i64 = 21_974;

    fn db() -> Connection {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch(SCHEMA).unwrap();
        c
    }

    fn ev(uuid: &str, actor: &str, scope: Scope, delta: i64, day: i64) -> Increment {
        let key = CounterKey::new("ARTICLE", "like", uuid).unwrap();
        let secret = ActorKey::new(b"0123456789abcdef").unwrap();
        Increment {
            unique: Some(Unique {
                scope,
                mark: secret.mark(&key, actor).unwrap(),
            }),
            key,
            delta,
            category: None,
            ts_ms: day * 86_400_000,
            day,
            id: None,
            kind: Kind::Counter,
        }
    }

    fn claimed(c: &Connection, events: &[Increment]) -> Vec<bool> {
        let mut skip = vec![false; events.len()];
        let repeats = claim(c, events, &mut skip).unwrap();
        assert_eq!(repeats as usize, skip.iter().filter(|s| **s).count());
        skip.iter().map(|s| !s).collect()
    }

    #[test]
    fn marks_of_the_first_keying_are_rekeyed_once_for_one_tenant() {
        let mut c = db();
        let secret = ActorKey::new(b"0123456789abcdef").unwrap();
        let key = CounterKey::new("ARTICLE", "like", "a1").unwrap();
        let old = secret.untenanted_mark(&key, "alice").unwrap();
        c.execute(
            "INSERT INTO actor_marks (ckey, mark) VALUES (?1, ?2)",
            params![&ckey(&key)[..], &old.0[..]],
        )
        .unwrap();
        c.execute(
            "INSERT INTO actor_day_marks (day, ckey, mark) VALUES (?1, ?2, ?3)",
            params![DAY, &ckey(&key)[..], &old.0[..]],
        )
        .unwrap();
        note_keying(&c).unwrap();
        note_keying(&c).unwrap();
        assert_eq!(keying(&c).unwrap(), Keying::Untenanted);
        // Without a secret nothing changes (unique is refused anyway).
        assert_eq!(key_for_tenant(&mut c, &ActorKey::none()).unwrap(), 0);
        assert_eq!(keying(&c).unwrap(), Keying::Untenanted);
        let acme = secret.for_tenant("acme");
        assert_eq!(key_for_tenant(&mut c, &acme).unwrap(), 2);
        assert_eq!(keying(&c).unwrap(), Keying::Tenant("acme".into()));
        assert_eq!(key_for_tenant(&mut c, &acme).unwrap(), 0, "once");
        let stored: Vec<Vec<u8>> = c
            .prepare("SELECT mark FROM actor_marks UNION ALL SELECT mark FROM actor_day_marks")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let new = acme.mark(&key, "alice").unwrap();
        assert_eq!(stored, vec![new.0.to_vec(), new.0.to_vec()]);
        let e = key_for_tenant(&mut c, &secret.for_tenant("globex")).unwrap_err();
        assert!(e.to_string().contains("\"acme\""), "{e}");
        // A store without marks is bound to the first tenant that keys it.
        let mut fresh = db();
        note_keying(&fresh).unwrap();
        assert_eq!(keying(&fresh).unwrap(), Keying::Unbound);
        assert_eq!(key_for_tenant(&mut fresh, &acme).unwrap(), 0);
        assert_eq!(keying(&fresh).unwrap(), Keying::Tenant("acme".into()));
    }

    #[test]
    fn likes_count_once_and_unlikes_take_back_only_a_like() {
        let c = db();
        let like = |a| ev("a1", a, Scope::Ever, 1, DAY);
        let unlike = |a| ev("a1", a, Scope::Ever, -1, DAY);
        // Alice likes twice, Bob unlikes what he never liked, then likes.
        assert_eq!(
            claimed(
                &c,
                &[like("alice"), like("alice"), unlike("bob"), like("bob")]
            ),
            vec![true, false, false, true]
        );
        // Alice unlikes twice (the second has nothing left), then likes again.
        assert_eq!(
            claimed(&c, &[unlike("alice"), unlike("alice"), like("alice")]),
            vec![true, false, true]
        );
        // Another counter is another like.
        assert_eq!(
            claimed(&c, &[ev("a2", "alice", Scope::Ever, 1, DAY)]),
            vec![true]
        );
    }

    #[test]
    fn views_count_once_a_day_and_expire_with_the_retention() {
        let c = db();
        let view = |d| ev("a1", "alice", Scope::Day, 1, d);
        assert_eq!(
            claimed(&c, &[view(DAY), view(DAY), view(DAY + 1)]),
            vec![true, false, true]
        );
        assert_eq!(expire(&c, DAY + 1, Duration::from_secs(5)).unwrap(), 1);
        assert_eq!(claimed(&c, &[view(DAY + 1)]), vec![false]);
    }

    #[test]
    fn a_skipped_event_leaves_its_mark_alone_and_a_delete_forgets_them_all() {
        let c = db();
        let events = [ev("a1", "alice", Scope::Ever, 1, DAY)];
        let mut skip = vec![true];
        assert_eq!(claim(&c, &events, &mut skip).unwrap(), 0);
        assert_eq!(claimed(&c, &events), vec![true]);
        assert_eq!(
            claimed(&c, &[ev("a1", "bob", Scope::Day, 1, DAY - 3)]),
            vec![true]
        );
        assert_eq!(
            claimed(&c, &[ev("a2", "bob", Scope::Day, 1, DAY - 3)]),
            vec![true]
        );
        forget(&c, &CounterKey::new("ARTICLE", "like", "a1").unwrap()).unwrap();
        assert_eq!(claimed(&c, &events), vec![true]);
        assert_eq!(
            claimed(&c, &[ev("a1", "bob", Scope::Day, 1, DAY - 3)]),
            vec![true]
        );
        // The other counter's view stays.
        assert_eq!(
            claimed(&c, &[ev("a2", "bob", Scope::Day, 1, DAY - 3)]),
            vec![false]
        );
    }
}
