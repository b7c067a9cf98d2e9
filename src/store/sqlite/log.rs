//! The change log's row format: every delta a flush adds to counters that
//! already exist, packed into one blob per flush (`counter_log.entries`).
//!
//! Why one blob and not a row per delta: a flush over 10,000 counters is
//! then one insert of ~200 KB instead of 10,000 inserts, each a trip
//! through SQLite's VDBE (measured: 0.7 µs per row, most of what a flush
//! of a batch would cost). Nothing reads the log but the fold
//! (`fold.rs`), which decodes it whole; reads answer from the counters'
//! rows and the writer's in-memory state of what is not folded yet.
//!
//! Layout: a version byte, then entries back to back, each
//! `cid, day, delta, first_ms, last_ms` as LEB128 varints (the signed ones
//! zigzag-encoded), then the category as a varint `len + 1` (0: none)
//! followed by its UTF-8 bytes, then (version 2) the hour of the day the
//! delta also lands in, as a varint `hour + 1` (0: none, a day outside the
//! hourly retention). Version 1 blobs (written before hour buckets) are
//! still read, as entries without an hour.

use super::internal_msg;
use crate::store::StoreError;

const VERSION: u8 = 2;
/// The format before hour buckets: entries without an hour.
const VERSION_1: u8 = 1;

/// One delta of one counter on one day, as a flush logs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Entry<'a> {
    pub cid: i64,
    pub day: i64,
    pub delta: i64,
    pub first_ms: i64,
    pub last_ms: i64,
    pub category: Option<&'a str>,
    /// The hour of `day` (0..=23) the delta also lands in, if kept.
    pub hour: Option<u8>,
}

/// A log blob being written.
pub(super) struct Writer {
    buf: Vec<u8>,
    entries: usize,
}

impl Writer {
    pub fn new() -> Writer {
        Writer {
            buf: vec![VERSION],
            entries: 0,
        }
    }

    pub fn push(&mut self, e: &Entry<'_>) {
        put(&mut self.buf, e.cid as u64);
        put(&mut self.buf, zigzag(e.day));
        put(&mut self.buf, zigzag(e.delta));
        put(&mut self.buf, zigzag(e.first_ms));
        put(&mut self.buf, zigzag(e.last_ms));
        match e.category {
            None => self.buf.push(0),
            Some(c) => {
                put(&mut self.buf, c.len() as u64 + 1);
                self.buf.extend_from_slice(c.as_bytes());
            }
        }
        self.buf.push(e.hour.map_or(0, |h| h + 1));
        self.entries += 1;
    }

    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    #[cfg(test)]
    pub fn entries(&self) -> usize {
        self.entries
    }

    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }
}

/// Calls `f` with every entry of `blob`, in order.
pub(super) fn decode(blob: &[u8], mut f: impl FnMut(Entry<'_>)) -> Result<(), StoreError> {
    let bad = || internal_msg("the change log holds a malformed entry");
    let (&version, mut rest) = blob.split_first().ok_or_else(bad)?;
    if version != VERSION && version != VERSION_1 {
        return Err(internal_msg(&format!(
            "the change log holds entries of format {version}, which this build does not read"
        )));
    }
    while !rest.is_empty() {
        let cid = i64::try_from(get(&mut rest).ok_or_else(bad)?).map_err(|_| bad())?;
        let day = unzigzag(get(&mut rest).ok_or_else(bad)?);
        let delta = unzigzag(get(&mut rest).ok_or_else(bad)?);
        let first_ms = unzigzag(get(&mut rest).ok_or_else(bad)?);
        let last_ms = unzigzag(get(&mut rest).ok_or_else(bad)?);
        let category = match get(&mut rest).ok_or_else(bad)? {
            0 => None,
            n => {
                let len = usize::try_from(n - 1).map_err(|_| bad())?;
                if len > rest.len() {
                    return Err(bad());
                }
                let (text, tail) = rest.split_at(len);
                rest = tail;
                Some(std::str::from_utf8(text).map_err(|_| bad())?)
            }
        };
        let hour = if version == VERSION_1 {
            None
        } else {
            match get(&mut rest).ok_or_else(bad)? {
                0 => None,
                h @ 1..=24 => Some(h as u8 - 1),
                _ => return Err(bad()),
            }
        };
        f(Entry {
            cid,
            day,
            delta,
            first_ms,
            last_ms,
            category,
            hour,
        });
    }
    Ok(())
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

fn put(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

fn get(rest: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, tail) = rest.split_first()?;
        *rest = tail;
        v |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return Some(v);
        }
    }
    None
}

/// A difference of two i64 values as log deltas that each fit i64: one
/// almost always, up to three when it leaves the range (`MAX - MIN` is
/// `MAX + MAX + 1`); the fold sums them exactly.
pub(super) fn split(diff: i128) -> Vec<i64> {
    let mut parts = Vec::with_capacity(1);
    let mut rest = diff;
    loop {
        let part = rest.clamp(i128::from(i64::MIN), i128::from(i64::MAX));
        parts.push(part as i64);
        rest -= part;
        if rest == 0 {
            return parts;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_come_back_as_written_at_every_edge() {
        let edges = [0, 1, -1, 63, 64, -64, -65, i64::MAX, i64::MIN, 1 << 62];
        let mut written = Vec::new();
        for (i, &v) in edges.iter().enumerate() {
            written.push(Entry {
                cid: v.unsigned_abs().min(i64::MAX as u64) as i64,
                day: v.wrapping_neg(),
                delta: v,
                first_ms: v.wrapping_mul(3),
                last_ms: v / 7,
                category: [None, Some(""), Some("sports"), Some("é\u{1F600}")][i % 4],
                hour: [None, Some(0), Some(23), Some(7)][(i / 2) % 4],
            });
        }
        let mut w = Writer::new();
        for e in &written {
            w.push(e);
        }
        assert_eq!(w.entries(), written.len());
        let mut read = Vec::new();
        decode(w.bytes(), |e| {
            read.push((
                e.cid,
                e.day,
                e.delta,
                e.first_ms,
                e.last_ms,
                e.category.map(String::from),
                e.hour,
            ))
        })
        .unwrap();
        let want: Vec<_> = written
            .iter()
            .map(|e| {
                (
                    e.cid,
                    e.day,
                    e.delta,
                    e.first_ms,
                    e.last_ms,
                    e.category.map(String::from),
                    e.hour,
                )
            })
            .collect();
        assert_eq!(read, want);
    }

    #[test]
    fn a_cut_or_foreign_blob_is_an_error_not_a_panic() {
        let mut w = Writer::new();
        w.push(&Entry {
            cid: 300,
            day: 20_000,
            delta: -5,
            first_ms: 1,
            last_ms: 2,
            category: Some("news"),
            hour: Some(5),
        });
        let full = w.bytes().to_vec();
        for cut in 0..full.len() - 1 {
            assert!(
                decode(&full[..cut], |_| {}).is_err() || cut == 1,
                "cut at {cut}"
            );
        }
        assert!(decode(&[3, 0], |_| {}).is_err());
        assert!(decode(&[VERSION, 0xff, 0xff], |_| {}).is_err());
        assert!(decode(&[VERSION], |_| {}).is_ok());
    }

    #[test]
    fn blobs_of_the_first_format_read_as_entries_without_an_hour() {
        // cid 300, day 20000, delta -5, first 1, last 2, no category.
        let mut v1 = vec![VERSION_1];
        for v in [300, zigzag(20_000), zigzag(-5), zigzag(1), zigzag(2), 0] {
            put(&mut v1, v);
        }
        let mut read = Vec::new();
        decode(&v1, |e| read.push((e.cid, e.day, e.delta, e.hour))).unwrap();
        assert_eq!(read, vec![(300, 20_000, -5, None)]);
    }

    #[test]
    fn differences_past_i64_are_logged_in_parts_that_sum_to_them() {
        for diff in [
            0i128,
            -5,
            i128::from(i64::MAX),
            i128::from(i64::MAX) - i128::from(i64::MIN),
            i128::from(i64::MIN) - i128::from(i64::MAX),
        ] {
            let parts = split(diff);
            assert_eq!(parts.iter().map(|&p| i128::from(p)).sum::<i128>(), diff);
            assert_eq!(parts.len() == 1, i64::try_from(diff).is_ok(), "{diff}");
            assert!(parts.len() <= 3, "{diff}");
        }
    }
}
