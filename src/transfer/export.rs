//! `export`: a tenant's counters, then its averages, each with its day
//! buckets, then its targets' publication times, then CountAPI's records
//! (keys made by `create`, with their namespaces), then the marks of its
//! actors, written as NDJSON in key order, a page at a time (memory holds
//! one page, whatever the store's size).

use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::format;
use crate::domain::countapi::KeyRecord;
use crate::domain::CounterKey;
use crate::store::{ActorMark, MarkKeying, Store, StoreError};

/// Counters (or averages) read per page. A page holds each one's days too
/// (up to the retention's 400) and its hours (24 a day of the hourly
/// retention, 360 by default), so this bounds memory to some 20 MB.
pub const PAGE: usize = 500;

/// Marks read per page: some 150 bytes each.
pub const MARK_PAGE: usize = 5_000;

/// CountAPI records read per page: some 300 bytes each.
pub const COUNTAPI_PAGE: usize = 1_000;

/// Publication times read per page: some 100 bytes each.
pub const PUBLISHED_PAGE: usize = 5_000;

/// What an export wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Exported {
    pub counters: u64,
    pub averages: u64,
    /// Day buckets of counters and of averages.
    pub days: u64,
    /// Hour buckets of counters.
    pub hours: u64,
    /// Marks of actors.
    pub marks: u64,
    /// Targets' publication times.
    pub published: u64,
    /// CountAPI keys with their namespaces' records.
    pub countapi: u64,
    /// The `actor_secret` line was written (the file holds marks, and
    /// their secret's fingerprint was known).
    pub fingerprint: bool,
}

impl Exported {
    /// Lines written, the header included.
    pub fn lines(&self) -> u64 {
        1 + u64::from(self.fingerprint)
            + self.counters
            + self.averages
            + self.published
            + self.countapi
            + self.marks
    }
}

/// What an export writes.
#[derive(Clone, Debug)]
pub struct Export {
    /// Days from this one on are listed; older ones count in `before`, and
    /// older `day` marks are left out.
    pub from_day: i64,
    /// The hours of the days from this one on are listed (the hourly
    /// retention's first day).
    pub hours_from_day: i64,
    /// The marks of actors too.
    pub marks: bool,
    /// The fingerprint of the secret the store's marks are keyed with,
    /// when known: written after the header if there are marks.
    pub fingerprint: Option<String>,
    /// The tenant exported: its marks are keyed for it unless the store
    /// says otherwise (`Store::mark_keying`), as that line then says.
    pub tenant: String,
}

/// Writes the header and every counter, average, publication time and mark
/// of `store`, with
/// days from `from_day` on (older days count in each record's `before`)
/// and hours of the days from `hours_from_day` on,
/// naming no secret: [`write`] with marks and no fingerprint.
pub async fn write_all<W: AsyncWrite + Unpin>(
    store: &dyn Store,
    out: &mut W,
    from_day: i64,
    hours_from_day: i64,
    progress: &indicatif::ProgressBar,
) -> Result<Exported, String> {
    let what = Export {
        from_day,
        hours_from_day,
        marks: true,
        fingerprint: None,
        tenant: crate::tenant::DEFAULT_TENANT.into(),
    };
    write(store, out, &what, progress).await
}

/// Writes the header, the secret's line when there are marks and a
/// fingerprint, then every counter, average, publication time and (unless
/// left out) mark of `store`. `progress` is told each record written.
pub async fn write<W: AsyncWrite + Unpin>(
    store: &dyn Store,
    out: &mut W,
    what: &Export,
    progress: &indicatif::ProgressBar,
) -> Result<Exported, String> {
    let io = |e: std::io::Error| format!("writing the export failed: {e}");
    let from_day = what.from_day;
    let mut done = Exported::default();
    out.write_all(format::header_line().as_bytes())
        .await
        .map_err(io)?;
    if let (true, Some(fp)) = (what.marks, &what.fingerprint) {
        let any = store
            .mark_page(None, 1, from_day)
            .await
            .map_err(|e| format!("reading marks failed: {e}"))?;
        if !any.is_empty() {
            let keyed_for = match store
                .mark_keying()
                .await
                .map_err(|e| format!("reading how the marks are keyed failed: {e}"))?
            {
                MarkKeying::Tenant(t) => Some(t),
                MarkKeying::Unbound => Some(what.tenant.clone()),
                MarkKeying::Untenanted => None,
            };
            out.write_all(format::actor_secret_line(fp, keyed_for.as_deref()).as_bytes())
                .await
                .map_err(io)?;
            done.fingerprint = true;
        }
    }
    let mut after: Option<CounterKey> = None;
    loop {
        let page = store
            .counter_page(after.clone(), PAGE, from_day, what.hours_from_day)
            .await
            .map_err(|e| format!("reading counters failed: {e}"))?;
        let mut text = String::with_capacity(page.len() * 256);
        for c in &page {
            text.push_str(&format::counter_line(c));
            done.counters += 1;
            done.days += c.days.len() as u64;
            done.hours += c.hours.len() as u64;
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
    done.published = write_named(
        "publication times",
        PUBLISHED_PAGE,
        |after| store.published_page(after, PUBLISHED_PAGE),
        |p: &crate::store::TargetPublished| p.cursor(),
        format::published_line,
        out,
        progress,
    )
    .await?;
    done.countapi = write_named(
        "CountAPI records",
        COUNTAPI_PAGE,
        |after| store.countapi_page(after, COUNTAPI_PAGE),
        KeyRecord::cursor,
        format::countapi_line,
        out,
        progress,
    )
    .await?;
    let mut after: Option<ActorMark> = None;
    if what.marks {
        loop {
            let page = store
                .mark_page(after.take(), MARK_PAGE, from_day)
                .await
                .map_err(|e| format!("reading marks failed: {e}"))?;
            let mut text = String::with_capacity(page.len() * 160);
            for m in &page {
                text.push_str(&format::mark_line(m));
            }
            done.marks += page.len() as u64;
            out.write_all(text.as_bytes()).await.map_err(io)?;
            progress.inc(page.len() as u64);
            if page.len() < MARK_PAGE {
                break;
            }
            after = page.last().cloned();
        }
    }
    out.flush().await.map_err(io)?;
    Ok(done)
}

/// Writes every record a store lists by a (name, name) cursor, a page of
/// `page_size` at a time, as `line` writes each; answers how many. Each
/// record once, in order: a store paging wrongly would otherwise repeat a
/// page for ever.
async fn write_named<T, W, F, Fut>(
    what: &str,
    page_size: usize,
    mut fetch: F,
    cursor: fn(&T) -> (String, String),
    line: fn(&T) -> String,
    out: &mut W,
    progress: &indicatif::ProgressBar,
) -> Result<u64, String>
where
    W: AsyncWrite + Unpin,
    F: FnMut(Option<(String, String)>) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<T>, StoreError>>,
{
    let mut written = 0;
    let mut after: Option<(String, String)> = None;
    loop {
        let page = fetch(after.clone())
            .await
            .map_err(|e| format!("reading {what} failed: {e}"))?;
        let mut last = after.take();
        for r in &page {
            let key = cursor(r);
            if last.as_ref().is_some_and(|l| *l >= key) {
                return Err(format!(
                    "reading {what} failed: the store listed {}/{} out of order",
                    key.0, key.1
                ));
            }
            last = Some(key);
        }
        let text: String = page.iter().map(line).collect();
        written += page.len() as u64;
        out.write_all(text.as_bytes())
            .await
            .map_err(|e| format!("writing the export failed: {e}"))?;
        progress.inc(page.len() as u64);
        if page.len() < page_size {
            return Ok(written);
        }
        after = last;
    }
}
