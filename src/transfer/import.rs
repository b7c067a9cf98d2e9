//! `import`: NDJSON read line by line, checked, gathered into batches and
//! set in the store a batch at a time (`Store::import`: one transaction
//! and one fsync on the embedded store, `_bulk` on Elasticsearch).
//!
//! A batch is applied whole or not at all, and after each one a checkpoint
//! (when asked for) records the last line applied, so an interrupted import
//! goes on from there. Importing sets, so replaying a batch that was
//! applied (or half applied, on Elasticsearch) before an interruption
//! leaves the same state: resuming a little early is harmless.
//!
//! A bad line (it does not parse, names an unknown kind, a value past i64,
//! a day outside the retention, or would take a counter out of range) stops
//! the import with its line number and reason, before anything of its batch
//! is applied; with `--skip-bad` it is written to that file instead (after
//! a header, so the file can be corrected and imported) and the import goes on.
//!
//! Publication times (`published` records) are set after the rest of
//! their batch with `Store::set_published`, replacing what is there as an
//! admin's `PUT` does (import sets, it does not add); durable when it
//! returns, like `Store::import`, so the checkpoint written after the two
//! covers both, and a batch replayed sets the same times again.
//!
//! CountAPI's records (`countapi`: a key made by `create` with its
//! namespace's admin key digest) are set before the rest of their batch
//! with `Store::countapi_restore`, all of them or, past the tenant's
//! bounds on namespaces and keys, none: the line past the bound is then
//! bad, and nothing of its batch was applied.
//!
//! Marks of actors are set like the rest, after the file's `actor_secret`
//! record (if any) was admitted by [`SecretCheck`]: a file whose marks were
//! keyed with another secret than the store's gateways use is refused
//! there, before anything is applied (`--skip-marks` imports it without
//! its marks). `day` marks past the retention are left out and counted.
//! Marks of a file from before marks were keyed for their tenant (its
//! record has no `keyed_for`) are brought to the tenant as they are read
//! (`ActorKey::rekey`); a resumed import does so again from the record,
//! which it reads again whatever line it resumes after.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt};

use super::format::{self, Record, Rules};
use super::secret::SecretCheck;
use crate::domain::countapi::Restored;
use crate::domain::{CounterKey, Mark};
use crate::store::{ImportBatch, ImportEntry, ImportOutcome, PublishedSet, Store};

/// Longest line read: a counter with 400 days is some 10 KB.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// How an import runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// Records per batch.
    pub batch_records: usize,
    /// Day buckets per batch (of records and day records together), so a
    /// batch of long histories stays a bounded `_bulk`.
    pub batch_days: usize,
    /// File recording the last line applied; read at start to resume.
    pub checkpoint: Option<PathBuf>,
    /// File bad lines go to (after a header line), instead of stopping.
    pub skip_bad: Option<PathBuf>,
    /// Lines before this one (the header aside) are skipped.
    pub from_line: u64,
    /// How the input is named in messages and in the checkpoint.
    pub input_name: String,
    /// Leave the file's marks out (and its secret unchecked).
    pub skip_marks: bool,
    /// What the file's `actor_secret` record is checked against.
    pub secret: SecretCheck,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            batch_records: 1_000,
            batch_days: 20_000,
            checkpoint: None,
            skip_bad: None,
            from_line: 1,
            input_name: "-".into(),
            skip_marks: false,
            secret: SecretCheck::Unchecked,
        }
    }
}

/// What an import did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Imported {
    /// Lines read, the header and skipped lines included.
    pub lines: u64,
    pub counters: u64,
    pub averages: u64,
    /// Day records.
    pub day_records: u64,
    /// Day buckets set: those of counters and averages, and day records.
    pub days: u64,
    /// Hour buckets set with counters' days.
    pub hours: u64,
    /// Lines written to `--skip-bad`.
    pub bad: u64,
    /// Lines skipped as already applied (checkpoint, `--from-line`).
    pub resumed_after: u64,
    /// Marks of actors set.
    pub marks: u64,
    /// `day` marks of days past the retention, left out.
    pub marks_expired: u64,
    /// Marks left out by `--skip-marks`.
    pub marks_skipped: u64,
    /// Targets' publication times set.
    pub published: u64,
    /// CountAPI keys (with their namespaces' records) set.
    pub countapi: u64,
}

/// The buckets a counter record sets: its days and its hours, which count
/// against the batch's bound alike (each is a row, or a document, written).
fn buckets_of(c: &crate::store::CounterImport) -> usize {
    c.days.len() + c.hours.as_ref().map_or(0, |h| h.buckets.len())
}

/// The batch being gathered, with the line each entry came from.
#[derive(Default)]
struct Pending {
    batch: ImportBatch,
    counter_lines: Vec<(u64, String)>,
    average_lines: Vec<(u64, String)>,
    day_lines: Vec<(u64, String)>,
    mark_lines: Vec<(u64, String)>,
    /// Publication times, set after the batch's import.
    published: Vec<PublishedSet>,
    published_lines: Vec<(u64, String)>,
    targets: HashSet<(String, String)>,
    /// CountAPI's records, set before the batch's import.
    countapi: Vec<crate::domain::countapi::KeyRecord>,
    countapi_lines: Vec<(u64, String)>,
    countapi_keys: HashSet<(String, String)>,
    marks: HashSet<(CounterKey, Option<i64>, Mark)>,
    with_record: HashSet<CounterKey>,
    with_days: HashSet<CounterKey>,
    day_pairs: HashSet<(CounterKey, i64)>,
    averages: HashSet<CounterKey>,
    days: usize,
    first_line: u64,
}

impl Pending {
    fn records(&self) -> usize {
        self.counter_lines.len()
            + self.average_lines.len()
            + self.day_lines.len()
            + self.mark_lines.len()
            + self.published_lines.len()
            + self.countapi_lines.len()
    }

    /// Whether `r` names what the batch names already (the same counter or
    /// average, or the same day of a counter): then it goes in the next
    /// batch, so a batch never sets one thing twice.
    fn clashes(&self, r: &Record) -> bool {
        match r {
            Record::Counter(c) => {
                self.with_record.contains(&c.key) || self.with_days.contains(&c.key)
            }
            Record::Average(a) => self.averages.contains(&a.key),
            Record::Day(d) => {
                self.with_record.contains(&d.key)
                    || self.day_pairs.contains(&(d.key.clone(), d.day))
            }
            Record::Mark(m) => self.marks.contains(&(m.key.clone(), m.day, m.mark)),
            Record::Published(p) => self.targets.contains(&p.cursor()),
            Record::Countapi(c) => self.countapi_keys.contains(&c.cursor()),
            Record::Header(_) | Record::ActorSecret(_) | Record::ExpiredMark => false,
        }
    }

    fn push(&mut self, r: Record, line: u64, raw: String) {
        if self.records() == 0 {
            self.first_line = line;
        }
        match r {
            Record::Counter(c) => {
                self.days += buckets_of(&c);
                self.with_record.insert(c.key.clone());
                self.batch.counters.push(c);
                self.counter_lines.push((line, raw));
            }
            Record::Average(a) => {
                self.days += a.days.len();
                self.averages.insert(a.key.clone());
                self.batch.averages.push(a);
                self.average_lines.push((line, raw));
            }
            Record::Day(d) => {
                self.days += 1;
                self.with_days.insert(d.key.clone());
                self.day_pairs.insert((d.key.clone(), d.day));
                self.batch.days.push(d);
                self.day_lines.push((line, raw));
            }
            Record::Mark(m) => {
                self.marks.insert((m.key.clone(), m.day, m.mark));
                self.batch.marks.push(m);
                self.mark_lines.push((line, raw));
            }
            Record::Published(p) => {
                self.targets.insert(p.cursor());
                self.published.push(PublishedSet {
                    entity: p.entity,
                    uuid: p.uuid,
                    at_ms: Some(p.at_ms),
                    replace: true,
                });
                self.published_lines.push((line, raw));
            }
            Record::Countapi(c) => {
                self.countapi_keys.insert(c.cursor());
                self.countapi.push(c);
                self.countapi_lines.push((line, raw));
            }
            Record::Header(_) | Record::ActorSecret(_) | Record::ExpiredMark => {}
        }
    }

    /// Takes an entry out (it is set aside as bad); answers its line.
    fn remove(&mut self, entry: ImportEntry) -> (u64, String) {
        match entry {
            ImportEntry::Counter(i) => {
                self.days -= buckets_of(&self.batch.counters.remove(i));
                self.counter_lines.remove(i)
            }
            ImportEntry::Average(i) => {
                self.days -= self.batch.averages.remove(i).days.len();
                self.average_lines.remove(i)
            }
            ImportEntry::Day(i) => {
                self.days -= 1;
                self.batch.days.remove(i);
                self.day_lines.remove(i)
            }
        }
    }

    fn line_of(&self, entry: ImportEntry) -> u64 {
        match entry {
            ImportEntry::Counter(i) => self.counter_lines[i].0,
            ImportEntry::Average(i) => self.average_lines[i].0,
            ImportEntry::Day(i) => self.day_lines[i].0,
        }
    }
}

/// Where bad lines go with `--skip-bad`.
struct SkipFile {
    path: PathBuf,
    file: std::fs::File,
}

impl SkipFile {
    fn open(path: &Path, append: bool) -> Result<SkipFile, String> {
        use std::io::Write;
        let err = |e: std::io::Error| format!("--skip-bad {}: {e}", path.display());
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(append)
            .write(true)
            .truncate(!append)
            .open(path)
            .map_err(err)?;
        if file.metadata().map_err(err)?.len() == 0 {
            file.write_all(format::header_line().as_bytes())
                .map_err(err)?;
        }
        Ok(SkipFile {
            path: path.to_path_buf(),
            file,
        })
    }

    fn put(&mut self, raw: &str) -> Result<(), String> {
        use std::io::Write;
        writeln!(self.file, "{raw}").map_err(|e| format!("--skip-bad {}: {e}", self.path.display()))
    }
}

/// The checkpoint: the input's name and the last line applied.
#[derive(serde::Serialize, serde::Deserialize)]
struct Checkpoint {
    input: String,
    line: u64,
}

fn read_checkpoint(path: &Path, input: &str) -> Result<Option<u64>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("--checkpoint {}: {e}", path.display())),
    };
    let c: Checkpoint = serde_json::from_str(&text)
        .map_err(|e| format!("--checkpoint {}: not a checkpoint ({e})", path.display()))?;
    if c.input != input {
        return Err(format!(
            "--checkpoint {} is for input {:?}, not {input:?}: remove it to start over",
            path.display(),
            c.input
        ));
    }
    Ok(Some(c.line))
}

/// Written to a temporary file, fsync'd and renamed over the old one, so a
/// crash leaves the old checkpoint or the new one, never half of one.
fn write_checkpoint(path: &Path, input: &str, line: u64) -> Result<(), String> {
    use std::io::Write;
    let err = |e: std::io::Error| format!("--checkpoint {}: {e}", path.display());
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let text = serde_json::to_string(&Checkpoint {
        input: input.to_string(),
        line,
    })
    .map_err(|e| e.to_string())?;
    let mut f = std::fs::File::create(&tmp).map_err(err)?;
    f.write_all(text.as_bytes()).map_err(err)?;
    f.sync_all().map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

/// The state of a running import.
struct Run<'a> {
    store: &'a dyn Store,
    options: &'a Options,
    skip: Option<SkipFile>,
    done: Imported,
    /// The last line known applied (every line before it too).
    applied: u64,
    progress: &'a indicatif::ProgressBar,
}

impl Run<'_> {
    /// How to go on after a stop, with lines up to `self.applied` applied.
    fn resume_hint(&self, first_unapplied: u64) -> String {
        let how = match &self.options.checkpoint {
            Some(c) => format!(
                "run the same command again: --checkpoint {} resumes after line {}",
                c.display(),
                self.applied
            ),
            None => format!("run it again with --from-line {first_unapplied}"),
        };
        format!(
            "lines up to {} are applied, nothing from line {first_unapplied} on; {how} (importing sets: a line applied twice leaves the same state)",
            self.applied
        )
    }

    fn bad(
        &mut self,
        line: u64,
        reason: &str,
        raw: &str,
        first_unapplied: u64,
    ) -> Result<(), String> {
        match &mut self.skip {
            Some(f) => {
                f.put(raw)?;
                self.done.bad += 1;
                self.progress
                    .suspend(|| eprintln!("line {line}: {reason} (set aside in {})", f.path.display()));
                Ok(())
            }
            None => Err(format!(
                "line {line}: {reason}\n{}; correct or remove line {line} first, or pass --skip-bad FILE to set bad lines aside and go on",
                self.resume_hint(first_unapplied)
            )),
        }
    }

    async fn flush(&mut self, mut p: Pending) -> Result<(), String> {
        if p.records() == 0 {
            return Ok(());
        }
        let last_line = p
            .counter_lines
            .iter()
            .chain(&p.average_lines)
            .chain(&p.day_lines)
            .chain(&p.mark_lines)
            .chain(&p.published_lines)
            .chain(&p.countapi_lines)
            .map(|(l, _)| *l)
            .max()
            .unwrap_or(p.first_line);
        let failed = |e: crate::store::StoreError, run: &Self, first: u64| {
            format!(
                "the store failed on the batch of lines {first}-{last_line}: {e}\n{}",
                run.resume_hint(first)
            )
        };
        while !p.countapi.is_empty() {
            match self.store.countapi_restore(p.countapi.clone()).await {
                Ok(Restored::Applied) => break,
                Ok(Restored::Full(i, what)) => {
                    let reason = format!(
                        "setting it would make the tenant hold more {what} than a gateway keeps ({} namespaces, {} keys)",
                        crate::domain::countapi::MAX_NAMESPACES,
                        crate::domain::countapi::MAX_CREATED_KEYS
                    );
                    let line = p.countapi_lines[i].0;
                    if self.skip.is_none() {
                        return Err(format!(
                            "line {line}: {reason}\n{}; correct or remove line {line} first, or pass --skip-bad FILE to set bad lines aside and go on",
                            self.resume_hint(p.first_line)
                        ));
                    }
                    p.countapi.remove(i);
                    let (line, raw) = p.countapi_lines.remove(i);
                    self.bad(line, &reason, &raw, p.first_line)?;
                }
                Err(e) => return Err(failed(e, self, p.first_line)),
            }
        }
        // A batch of publication times only has nothing to import.
        while !p.batch.is_empty() {
            match self.store.import(p.batch.clone()).await {
                Ok(ImportOutcome::Applied) => break,
                Ok(ImportOutcome::Overflow(entry)) => {
                    let line = p.line_of(entry);
                    let reason = "setting it would take its counter outside the signed 64-bit range (with what the store holds)";
                    if self.skip.is_none() {
                        return Err(format!(
                            "line {line}: {reason}\n{}; correct or remove line {line} first, or pass --skip-bad FILE to set bad lines aside and go on",
                            self.resume_hint(p.first_line)
                        ));
                    }
                    let (line, raw) = p.remove(entry);
                    self.bad(line, reason, &raw, p.first_line)?;
                }
                Err(e) => return Err(failed(e, self, p.first_line)),
            }
        }
        if !p.published.is_empty() {
            self.store
                .set_published(std::mem::take(&mut p.published))
                .await
                .map_err(|e| failed(e, self, p.first_line))?;
        }
        self.done.counters += p.counter_lines.len() as u64;
        self.done.averages += p.average_lines.len() as u64;
        self.done.day_records += p.day_lines.len() as u64;
        self.done.marks += p.mark_lines.len() as u64;
        self.done.published += p.published_lines.len() as u64;
        self.done.countapi += p.countapi_lines.len() as u64;
        let hours: usize = p
            .batch
            .counters
            .iter()
            .map(|c| c.hours.as_ref().map_or(0, |h| h.buckets.len()))
            .sum();
        self.done.days += (p.days - hours) as u64;
        self.done.hours += hours as u64;
        self.applied = last_line;
        if let Some(c) = &self.options.checkpoint {
            write_checkpoint(c, &self.options.input_name, last_line)?;
        }
        self.progress.set_message(format!(
            "{} records",
            self.done.counters
                + self.done.averages
                + self.done.day_records
                + self.done.marks
                + self.done.published
                + self.done.countapi
        ));
        Ok(())
    }
}

/// What the import has seen of marks and of their secret.
#[derive(Default)]
struct Marks {
    /// The `actor_secret` record admitted.
    fingerprint: Option<format::ActorSecret>,
    /// What brings the file's marks to the tenant, when they are of the
    /// first keying.
    rekey: Option<crate::domain::ActorKey>,
    /// A mark was read.
    any: bool,
    /// The warning for marks without a fingerprint was given.
    warned: bool,
}

impl Marks {
    /// The file's `actor_secret` record at `line`: checked once (a second
    /// one must say the same), before any mark.
    async fn admit(
        &mut self,
        fp: &format::ActorSecret,
        line: u64,
        raw: &str,
        options: &Options,
        run: &mut Run<'_>,
        first_unapplied: u64,
    ) -> Result<(), String> {
        if options.skip_marks {
            return Ok(());
        }
        let refuse = |why: String, run: &Run<'_>| {
            format!(
                "line {line}: {why}\n{}; or pass --skip-marks to import without the marks",
                run.resume_hint(first_unapplied)
            )
        };
        match &self.fingerprint {
            Some(seen) if seen == fp => return Ok(()),
            Some(seen) => {
                return Err(refuse(
                    format!(
                        "a second actor_secret record names fingerprint {} (keyed for {:?}), the first {} (keyed for {:?}): the marks of one file are keyed one way",
                        fp.fingerprint, fp.keyed_for, seen.fingerprint, seen.keyed_for
                    ),
                    run,
                ))
            }
            None if self.any => {
                return Err(refuse(
                    "the actor_secret record comes after marks; it must come before them (export writes it after the header)".into(),
                    run,
                ))
            }
            None => {}
        }
        self.rekey = options
            .secret
            .admit(fp)
            .await
            .map_err(|why| refuse(why, run))?;
        if let Some(skip) = &mut run.skip {
            // A file of set-aside marks is checked as this one was.
            skip.put(raw)?;
        }
        self.fingerprint = Some(fp.clone());
        Ok(())
    }

    /// A mark at `line`: the first without an admitted fingerprint warns.
    fn seen(&mut self, line: u64, run: &Run<'_>) {
        self.any = true;
        if self.fingerprint.is_none() && !self.warned {
            self.warned = true;
            run.progress.suspend(|| {
                eprintln!(
                    "line {line}: marks without an actor_secret record before them: nothing tells which secret they were keyed with; they count only if the gateways of this store use that same secret"
                )
            });
        }
    }
}

/// Imports every line of `input` into `store`. On success the checkpoint
/// (if any) is removed: the next run starts from the top.
pub async fn read_all<R: AsyncBufRead + Unpin>(
    store: &dyn Store,
    mut input: R,
    rules: &Rules,
    options: &Options,
    progress: &indicatif::ProgressBar,
) -> Result<Imported, String> {
    let resumed = match &options.checkpoint {
        Some(c) => read_checkpoint(c, &options.input_name)?,
        None => None,
    };
    let skip_before = resumed.map(|l| l + 1).unwrap_or(1).max(options.from_line);
    if let (Some(l), Some(c)) = (resumed, &options.checkpoint) {
        progress.suspend(|| {
            eprintln!(
                "resuming after line {l} (checkpoint {}): lines up to it were applied",
                c.display()
            )
        });
    }
    let skip = match &options.skip_bad {
        Some(p) => Some(SkipFile::open(p, resumed.is_some())?),
        None => None,
    };
    let mut run = Run {
        store,
        options,
        skip,
        done: Imported::default(),
        applied: skip_before - 1,
        progress,
    };
    let mut pending = Pending::default();
    let mut marks = Marks::default();
    let mut buf = Vec::with_capacity(4096);
    let mut line_no = 0u64;
    loop {
        buf.clear();
        let n = (&mut input)
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut buf)
            .await
            .map_err(|e| {
                format!(
                    "reading {} failed after line {line_no}: {e}",
                    options.input_name
                )
            })?;
        if n == 0 {
            break;
        }
        progress.inc(n as u64);
        line_no += 1;
        let too_long = buf.len() > MAX_LINE_BYTES && buf.last() != Some(&b'\n');
        if too_long {
            // Read past the rest of the line, keeping none of it.
            let mut rest = Vec::new();
            loop {
                rest.clear();
                let m = (&mut input)
                    .take(64 * 1024)
                    .read_until(b'\n', &mut rest)
                    .await
                    .map_err(|e| format!("reading {} failed: {e}", options.input_name))?;
                progress.inc(m as u64);
                if m == 0 || rest.last() == Some(&b'\n') {
                    break;
                }
            }
        }
        if line_no > 1 && line_no < skip_before {
            // The secret's record is checked again (it applies nothing), so
            // that a resumed import checks what it imports.
            if too_long || !is_actor_secret_record(&buf, rules) {
                continue;
            }
        }
        let text = String::from_utf8_lossy(&buf);
        let raw = text.trim_end_matches(['\n', '\r']).to_string();
        let parsed = if too_long {
            Err(format!("the line is longer than {MAX_LINE_BYTES} bytes"))
        } else if std::str::from_utf8(&buf).is_err() {
            Err("the line is not UTF-8".into())
        } else if raw.trim().is_empty() {
            if line_no == 1 {
                Err("the line is empty".into())
            } else {
                continue;
            }
        } else {
            format::parse(&raw, rules)
        };
        if line_no == 1 {
            match parsed {
                Ok(Record::Header(_)) => continue,
                Ok(_) => {
                    return Err(format!(
                        "line 1: the first line must be the header {}",
                        format::header_line().trim_end()
                    ))
                }
                Err(e) => {
                    return Err(format!(
                        "line 1: not the header {}: {e}",
                        format::header_line().trim_end()
                    ))
                }
            }
        }
        let record = match parsed {
            Ok(Record::Header(_)) => {
                Err("a header inside the file (only the first line is one)".to_string())
            }
            other => other,
        };
        let mut record = match record {
            Ok(r) => r,
            Err(reason) => {
                let first = if pending.records() == 0 {
                    line_no
                } else {
                    pending.first_line
                };
                run.bad(line_no, &reason, &raw, first)?;
                continue;
            }
        };
        let first = if pending.records() == 0 {
            line_no
        } else {
            pending.first_line
        };
        match &record {
            Record::ActorSecret(fp) => {
                marks
                    .admit(fp, line_no, &raw, options, &mut run, first)
                    .await?;
                continue;
            }
            Record::ExpiredMark => {
                run.done.marks_expired += 1;
                continue;
            }
            Record::Mark(_) if options.skip_marks => {
                run.done.marks_skipped += 1;
                continue;
            }
            Record::Mark(_) => marks.seen(line_no, &run),
            _ => {}
        }
        if let (Record::Mark(m), Some(k)) = (&mut record, &marks.rekey) {
            m.mark = k
                .rekey(m.mark)
                .ok_or("bringing marks to the tenant without a secret")?;
        }
        let days = match &record {
            Record::Counter(c) => buckets_of(c),
            Record::Average(a) => a.days.len(),
            _ => 1,
        };
        if pending.clashes(&record)
            || pending.records() >= options.batch_records
            || (pending.records() > 0 && pending.days + days > options.batch_days)
        {
            let full = std::mem::take(&mut pending);
            run.flush(full).await?;
        }
        if pending.records() == 0 {
            pending.batch.oldest_day = rules.oldest_day();
        }
        pending.push(record, line_no, raw);
    }
    if line_no == 0 {
        return Err(format!(
            "{} is empty: the first line must be the header {}",
            options.input_name,
            format::header_line().trim_end()
        ));
    }
    run.flush(pending).await?;
    run.done.lines = line_no;
    run.done.resumed_after = skip_before - 1;
    if let Some(c) = &options.checkpoint {
        match std::fs::remove_file(c) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("--checkpoint {}: {e}", c.display())),
        }
    }
    Ok(run.done)
}

/// Whether a skipped line of a resumed import is the file's `actor_secret`
/// record, however it is written (keys reordered or spaced, as jq writes
/// them): parsed, not matched by its prefix. Only a line that could name
/// that kind (the word, or a JSON escape that could spell it) is parsed, so
/// that skipping the rest stays cheap.
fn is_actor_secret_record(line: &[u8], rules: &Rules) -> bool {
    let could_be = |needle: &[u8]| line.windows(needle.len()).any(|w| w == needle);
    if !could_be(b"actor_secret") && !could_be(b"\\u") {
        return false;
    }
    std::str::from_utf8(line).is_ok_and(|text| {
        matches!(
            format::parse(text.trim_end_matches(['\n', '\r']), rules),
            Ok(Record::ActorSecret(_))
        )
    })
}
