//! Many counters read at once (the multi-read), on a reader connection.
//!
//! One deferred transaction around one cached statement run per key: every
//! key is read from one snapshot, so a flush committing meanwhile is seen
//! for all of the keys or for none. The statement is the single get's own,
//! so the two share one prepared statement per connection.
//!
//! The other way, one statement joining `json_each` of the keys against
//! `counters`, is kept in the tests as a benchmark; it was slower at 50 keys
//! and at 1,000 (see `multi_read_by_key_against_one_join` for the figures
//! and the command).

use rusqlite::{params, Connection, OptionalExtension};

use super::hot::Hot;
use super::{read_counter, sql};
use crate::domain::{Counter, CounterKey};
use crate::store::StoreError;

/// The single get's statement (`SqliteStore::get`), shared on purpose.
pub(super) const BY_KEY: &str = "SELECT value, category, first_ts, recorded_ts FROM counters
                 WHERE entity = ?1 AND action = ?2 AND uuid = ?3";

/// Adds to `counters` the wanted ones a flush did not write (a single
/// increment that was a repeat of its actor, or a duplicate id), from
/// memory (`hot`, which holds every counter with deltas not folded yet)
/// or else its row, read in the flush's own transaction: the request then answers from the flush,
/// instead of a read of its own afterwards on a reader connection (which
/// under load is often a new one: measured about 110 µs of CPU per such
/// request with 256 connections, see src/api/README.md, "Once per actor").
pub(super) fn unwritten_wanted(
    tx: &Connection,
    wanted: &std::collections::HashSet<CounterKey>,
    counters: &mut std::collections::HashMap<CounterKey, Counter>,
    hot: &Hot,
) -> Result<(), StoreError> {
    if wanted.len() == counters.len() {
        return Ok(());
    }
    let mut s = tx
        .prepare_cached(BY_KEY)
        .map_err(sql("multiget::unwritten_wanted"))?;
    for k in wanted {
        if counters.contains_key(k) {
            continue;
        }
        if let Some(e) = hot.get(k) {
            counters.insert(k.clone(), e.counter(k));
            continue;
        }
        let found = s
            .query_row(params![&*k.entity, &*k.action, &*k.uuid], |r| {
                read_counter(r, k.clone())
            })
            .optional()
            .map_err(sql("multiget::unwritten_wanted"))?;
        if let Some(c) = found {
            counters.insert(k.clone(), c);
        }
    }
    Ok(())
}

/// The counter of each key, in order, when memory holds every one of them
/// (`None` otherwise: a key not there is read from its row, and all keys
/// must then come from one snapshot, [`counters`]).
pub(super) fn all_in_memory(keys: &[CounterKey], hot: &Hot) -> Option<Vec<Option<Counter>>> {
    keys.iter()
        .map(|k| hot.get(k).map(|e| Some(e.counter(k))))
        .collect()
}

/// The counter of each key, in order (`None`: never counted): from the
/// store's memory (locked by the caller) when it holds the key (every
/// counter with deltas not folded yet is there), else from its row.
pub(super) fn counters(
    conn: &Connection,
    keys: &[CounterKey],
    hot: &Hot,
) -> Result<Vec<Option<Counter>>, StoreError> {
    let tx = conn
        .unchecked_transaction()
        .map_err(sql("multiget::counters"))?;
    let found = {
        let mut s = tx
            .prepare_cached(BY_KEY)
            .map_err(sql("multiget::counters"))?;
        keys.iter()
            .map(|k| {
                if let Some(e) = hot.get(k) {
                    return Ok(Some(e.counter(k)));
                }
                s.query_row(params![&*k.entity, &*k.action, &*k.uuid], |r| {
                    read_counter(r, k.clone())
                })
                .optional()
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(sql("multiget::counters"))?
    };
    // Read only: the commit just ends the snapshot.
    tx.commit().map_err(sql("multiget::counters"))?;
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// The alternative measured against [`counters`]: one statement for all
    /// keys, the keys passed as one JSON array and joined on the key index.
    const JOINED: &str = "SELECT k.key, c.value, c.category, c.first_ts, c.recorded_ts
        FROM json_each(?1) AS k
        JOIN counters AS c
          ON c.entity = k.value ->> 0 AND c.action = k.value ->> 1 AND c.uuid = k.value ->> 2";

    fn joined(conn: &Connection, keys: &[CounterKey]) -> Vec<Option<Counter>> {
        let json = serde_json::to_string(
            &keys
                .iter()
                .map(|k| [&*k.entity, &*k.action, &*k.uuid])
                .collect::<Vec<_>>(),
        )
        .unwrap();
        let mut out = vec![None; keys.len()];
        let mut s = conn.prepare_cached(JOINED).unwrap();
        let mut rows = s.query([json]).unwrap();
        while let Some(r) = rows.next().unwrap() {
            let i: usize = r.get(0).unwrap();
            out[i] = Some(read_counter(r, keys[i].clone()).unwrap());
        }
        out
    }

    /// A database file in WAL mode (as the store's) with `n` counters
    /// `VIDEO/VIEW/u<i>` of value `i`, and a reader on it.
    fn filled(n: usize) -> (tempfile::TempDir, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.sqlite3");
        let mut w = Connection::open(&path).unwrap();
        w.execute_batch("PRAGMA journal_mode = WAL;").unwrap();
        w.execute_batch(super::super::schema::SCHEMA).unwrap();
        let tx = w.transaction().unwrap();
        {
            let mut ins = tx
                .prepare(
                    "INSERT INTO counters (entity, action, uuid, value, category, first_ts, recorded_ts)
                     VALUES ('VIDEO', 'VIEW', ?1, ?2, CASE WHEN ?2 % 2 = 0 THEN 'news' END, 1000, ?2 + 1000)",
                )
                .unwrap();
            for i in 0..n {
                ins.execute(params![format!("u{i}"), i as i64]).unwrap();
            }
        }
        tx.commit().unwrap();
        (dir, Connection::open(&path).unwrap())
    }

    fn key(uuid: &str) -> CounterKey {
        CounterKey::new("VIDEO", "VIEW", uuid).unwrap()
    }

    #[test]
    fn each_key_is_answered_in_order_missing_and_repeated_ones_too() {
        let (_dir, c) = filled(10);
        let keys = [key("u3"), key("nope"), key("u0"), key("u3")];
        let got = counters(&c, &keys, &Hot::default()).unwrap();
        let values: Vec<Option<i64>> = got.iter().map(|c| c.as_ref().map(|c| c.value)).collect();
        assert_eq!(values, [Some(3), None, Some(0), Some(3)]);
        let first = got[0].as_ref().unwrap();
        assert_eq!(first.key, keys[0]);
        assert_eq!((first.first_ms, first.recorded_ms), (1000, 1003));
        assert_eq!(got[2].as_ref().unwrap().category.as_deref(), Some("news"));
        assert_eq!(got, joined(&c, &keys), "both ways answer the same");
        assert!(counters(&c, &[], &Hot::default()).unwrap().is_empty());
    }

    /// Memory answers alone only when it holds every key: one key it lacks
    /// sends the whole read to the rows (one snapshot), since memory
    /// cannot say whether a key it lacks was never counted.
    #[test]
    fn memory_answers_only_when_it_holds_every_key() {
        use super::super::hot::Entry;
        let mut hot = Hot::default();
        for (uuid, value) in [("u3", 42), ("u0", 7)] {
            let entry = Entry {
                cid: value,
                value,
                category: None,
                first_ms: 1,
                recorded_ms: 2,
                days: Vec::new(),
                pending_seq: 1,
            };
            hot.put(None, key(uuid), entry);
        }
        let values = |got: Option<Vec<Option<Counter>>>| {
            got.map(|v| {
                v.iter()
                    .map(|c| c.as_ref().map(|c| c.value))
                    .collect::<Vec<_>>()
            })
        };
        assert_eq!(
            values(all_in_memory(&[key("u3"), key("u0"), key("u3")], &hot)),
            Some(vec![Some(42), Some(7), Some(42)])
        );
        assert_eq!(values(all_in_memory(&[key("u3"), key("u1")], &hot)), None);
        // The rows' path gives memory's value for the keys it holds.
        let (_dir, c) = filled(10);
        let got = counters(&c, &[key("u3"), key("u1")], &hot).unwrap();
        let got: Vec<_> = got.iter().map(|c| c.as_ref().map(|c| c.value)).collect();
        assert_eq!(got, vec![Some(42), Some(1)]);
    }

    /// Not a test: the figures behind the choice in the module comment.
    /// `cargo test --release --lib multi_read_by_key -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn multi_read_by_key_against_one_join() {
        let total = 100_000;
        let (_dir, c) = filled(total);
        for n in [50usize, 1_000] {
            // Spread over the table, a few missing.
            let keys: Vec<CounterKey> = (0..n)
                .map(|i| key(&format!("u{}", (i * 7919) % (total + total / 10))))
                .collect();
            assert_eq!(
                counters(&c, &keys, &Hot::default()).unwrap(),
                joined(&c, &keys)
            );
            let rounds = 200_000 / n;
            let mut by_key = std::time::Duration::ZERO;
            let mut one_join = std::time::Duration::ZERO;
            for _ in 0..rounds {
                let t = Instant::now();
                std::hint::black_box(counters(&c, &keys, &Hot::default()).unwrap());
                by_key += t.elapsed();
                let t = Instant::now();
                std::hint::black_box(joined(&c, &keys));
                one_join += t.elapsed();
            }
            let per = |d: std::time::Duration| d.as_secs_f64() * 1e6 / rounds as f64;
            println!(
                "{n} keys of {total} counters, {rounds} rounds: per read, statement per key {:.1} µs, one join {:.1} µs (join/by-key {:.2})",
                per(by_key),
                per(one_join),
                one_join.as_secs_f64() / by_key.as_secs_f64()
            );
        }
    }
}
