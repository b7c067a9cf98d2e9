//! `export`: a tenant's counters, then its averages, each with its day
//! buckets, written as NDJSON in key order, a page at a time (memory holds
//! one page, whatever the store's size).

use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::format;
use crate::domain::CounterKey;
use crate::store::Store;

/// Counters (or averages) read per page. A page holds each one's days too
/// (up to the retention's 400), so this bounds memory to some 10 MB.
pub const PAGE: usize = 500;

/// What an export wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Exported {
    pub counters: u64,
    pub averages: u64,
    /// Day buckets of counters and of averages.
    pub days: u64,
}

impl Exported {
    /// Lines written, the header included.
    pub fn lines(&self) -> u64 {
        1 + self.counters + self.averages
    }
}

/// Writes the header and every counter and average of `store` with its
/// days from `from_day` on (older days count in each record's `before`).
/// `progress` is told each record written.
pub async fn write_all<W: AsyncWrite + Unpin>(
    store: &dyn Store,
    out: &mut W,
    from_day: i64,
    progress: &indicatif::ProgressBar,
) -> Result<Exported, String> {
    let io = |e: std::io::Error| format!("writing the export failed: {e}");
    let mut done = Exported::default();
    out.write_all(format::header_line().as_bytes())
        .await
        .map_err(io)?;
    let mut after: Option<CounterKey> = None;
    loop {
        let page = store
            .counter_page(after.clone(), PAGE, from_day)
            .await
            .map_err(|e| format!("reading counters failed: {e}"))?;
        let mut text = String::with_capacity(page.len() * 256);
        for c in &page {
            text.push_str(&format::counter_line(c));
            done.counters += 1;
            done.days += c.days.len() as u64;
        }
        out.write_all(text.as_bytes()).await.map_err(io)?;
        progress.inc(page.len() as u64);
        if page.len() < PAGE {
            break;
        }
        after = page.last().map(|c| c.counter.key.clone());
    }
    let mut after: Option<CounterKey> = None;
    loop {
        let page = store
            .average_page(after.clone(), PAGE, from_day)
            .await
            .map_err(|e| format!("reading averages failed: {e}"))?;
        let mut text = String::with_capacity(page.len() * 256);
        for a in &page {
            text.push_str(&format::average_line(a));
            done.averages += 1;
            done.days += a.days.len() as u64;
        }
        out.write_all(text.as_bytes()).await.map_err(io)?;
        progress.inc(page.len() as u64);
        if page.len() < PAGE {
            break;
        }
        after = page.last().map(|a| a.key.clone());
    }
    out.flush().await.map_err(io)?;
    Ok(done)
}
