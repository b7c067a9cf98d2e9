//! `migrate`: every tenant of the embedded store into Elasticsearch.
//! Setup first (templates, scripts), then per tenant an export of the
//! embedded store piped in process into an import of the cluster (the same
//! code and format as the two commands), then a verification that reads
//! both stores again side by side, in key order, and compares every
//! counter and average (totals, bucket sums and each day), every target's
//! publication time and every mark.
//!
//! Marks of actors count only under the secret they were keyed with, so
//! `migrate` reads the embedded store's (`--actor-secret`, else
//! `<data-dir>/actor-secret`), refuses a cluster that recorded another one,
//! records its fingerprint on every tenant it copies marks of, and ends by
//! saying what every gateway on the cluster must be started with. With the
//! secret, it first brings each embedded tenant's marks to the tenant's
//! keying, as that tenant's gateway would at its next start.

use std::cmp::Ordering;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::secret::{given_fingerprint, SecretCheck};
use super::{export, format, import, open_elasticsearch, open_embedded, progress, Unit};
use crate::config::{SecretArgs, StoreArgs};
use crate::domain::countapi::KeyRecord;
use crate::domain::{format_day, Clock, CounterKey};
use crate::store::{
    ActorMark, AverageHistory, CounterHistory, MarkState, Store, StoreError, TargetPublished,
};
use crate::tenant::{validate_tenant, DEFAULT_TENANT};

/// Differences printed per tenant; the rest are counted.
const SHOWN: usize = 50;

/// The tenants with an embedded store in `data_dir`, the default first.
pub fn tenants(data_dir: &Path) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    if data_dir.join(crate::store::sqlite::DB_FILE).exists() {
        out.push(DEFAULT_TENANT.to_string());
    }
    let dir = data_dir.join("tenants");
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    };
    let mut others = Vec::new();
    for e in entries {
        let e = e.map_err(|e| format!("{}: {e}", dir.display()))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if validate_tenant(&name).is_ok()
            && name != DEFAULT_TENANT
            && e.path().join(crate::store::sqlite::DB_FILE).exists()
        {
            others.push(name);
        }
    }
    others.sort();
    out.extend(others);
    Ok(out)
}

/// What the two stores disagree on, for one tenant.
#[derive(Debug, Default)]
pub struct Verified {
    /// Counters and averages compared.
    pub compared: u64,
    /// In the cluster only (it held data before): not a difference, the
    /// import merges.
    pub only_in_cluster: u64,
    /// One line per difference, the first [`SHOWN`] of them.
    pub differences: Vec<String>,
    /// All differences, shown or not.
    pub count: u64,
}

impl Verified {
    fn differ(&mut self, what: String) {
        self.count += 1;
        if self.differences.len() < SHOWN {
            self.differences.push(what);
        }
    }
}

fn key_text(k: &CounterKey) -> String {
    format!("{}/{}/{}", k.entity, k.action, k.uuid)
}

/// The order both stores list counters and averages in.
fn key_order(k: &CounterKey) -> (Arc<str>, Arc<str>, Arc<str>) {
    (k.entity.clone(), k.action.clone(), k.uuid.clone())
}

/// The first day two day lists disagree on, and how many do.
fn day_differences<T: PartialEq + std::fmt::Debug + Copy>(
    a: &[(i64, T)],
    b: &[(i64, T)],
) -> Option<String> {
    let mut all: Vec<i64> = a.iter().chain(b).map(|(d, _)| *d).collect();
    all.sort_unstable();
    all.dedup();
    let get = |l: &[(i64, T)], d: i64| l.iter().find(|(x, _)| *x == d).map(|(_, v)| *v);
    let differing: Vec<(i64, Option<T>, Option<T>)> = all
        .into_iter()
        .map(|d| (d, get(a, d), get(b, d)))
        .filter(|(_, x, y)| x != y)
        .collect();
    let (day, x, y) = differing.first()?;
    let show = |v: &Option<T>| v.map_or("none".to_string(), |v| format!("{v:?}"));
    Some(format!(
        "{} day(s) differ, first {}: {} in the embedded store, {} in the cluster",
        differing.len(),
        format_day(*day),
        show(x),
        show(y)
    ))
}

/// The first hour two hour lists (in hour order) disagree on, and how many do.
fn hour_differences(a: &[(i64, i64)], b: &[(i64, i64)]) -> Option<String> {
    let mut all: Vec<i64> = a.iter().chain(b).map(|(h, _)| *h).collect();
    all.sort_unstable();
    all.dedup();
    let get =
        |l: &[(i64, i64)], h: i64| l.binary_search_by_key(&h, |(x, _)| *x).ok().map(|i| l[i].1);
    let differing: Vec<(i64, Option<i64>, Option<i64>)> = all
        .into_iter()
        .map(|h| (h, get(a, h), get(b, h)))
        .filter(|(_, x, y)| x != y)
        .collect();
    let (hour, x, y) = differing.first()?;
    let show = |v: &Option<i64>| v.map_or("none".to_string(), |v| v.to_string());
    Some(format!(
        "{} hour(s) differ, first {}: {} in the embedded store, {} in the cluster",
        differing.len(),
        crate::domain::hours::format_hour(*hour),
        show(x),
        show(y)
    ))
}

fn compare_counters(v: &mut Verified, a: &CounterHistory, b: &CounterHistory) {
    let key = key_text(&a.counter.key);
    if a.counter.value != b.counter.value {
        v.differ(format!(
            "counter {key}: value {} in the embedded store, {} in the cluster",
            a.counter.value, b.counter.value
        ));
    }
    let sum = |h: &CounterHistory| h.days.iter().map(|d| i128::from(d.value)).sum::<i128>();
    if sum(a) != sum(b) {
        v.differ(format!(
            "counter {key}: bucket sum {} in the embedded store, {} in the cluster",
            sum(a),
            sum(b)
        ));
    }
    let days = |h: &CounterHistory| h.days.iter().map(|d| (d.day, d.value)).collect::<Vec<_>>();
    if let Some(d) = day_differences(&days(a), &days(b)) {
        v.differ(format!("counter {key}: {d}"));
    }
    let hours = |h: &CounterHistory| {
        h.hours
            .iter()
            .map(|x| (x.hour, x.value))
            .collect::<Vec<_>>()
    };
    if let Some(d) = hour_differences(&hours(a), &hours(b)) {
        v.differ(format!("counter {key}: {d}"));
    }
    if a.counter.category != b.counter.category
        || a.counter.first_ms != b.counter.first_ms
        || a.counter.recorded_ms != b.counter.recorded_ms
    {
        v.differ(format!(
            "counter {key}: category or timestamps differ ({:?} {} {} in the embedded store, {:?} {} {} in the cluster)",
            a.counter.category,
            crate::domain::format_ms(a.counter.first_ms),
            crate::domain::format_ms(a.counter.recorded_ms),
            b.counter.category,
            crate::domain::format_ms(b.counter.first_ms),
            crate::domain::format_ms(b.counter.recorded_ms),
        ));
    }
}

fn compare_averages(v: &mut Verified, a: &AverageHistory, b: &AverageHistory) {
    let key = key_text(&a.key);
    if (a.sum, a.quantity) != (b.sum, b.quantity) {
        v.differ(format!(
            "average {key}: sum/quantity {}/{} in the embedded store, {}/{} in the cluster",
            a.sum, a.quantity, b.sum, b.quantity
        ));
    }
    let sums = |h: &AverageHistory| {
        h.days.iter().fold((0i128, 0i128), |(s, q), d| {
            (s + i128::from(d.sum), q + i128::from(d.quantity))
        })
    };
    if sums(a) != sums(b) {
        v.differ(format!(
            "average {key}: bucket sums {:?} in the embedded store, {:?} in the cluster",
            sums(a),
            sums(b)
        ));
    }
    let days = |h: &AverageHistory| {
        h.days
            .iter()
            .map(|d| (d.day, (d.sum, d.quantity)))
            .collect::<Vec<_>>()
    };
    if let Some(d) = day_differences(&days(a), &days(b)) {
        v.differ(format!("average {key}: {d}"));
    }
    if a.category != b.category || a.first_ms != b.first_ms || a.recorded_ms != b.recorded_ms {
        v.differ(format!("average {key}: category or timestamps differ"));
    }
}

fn mark_text(m: &ActorMark) -> String {
    let scope = match m.day {
        None => "ever".to_string(),
        Some(d) => format!("day {}", format_day(d)),
    };
    format!("mark {} of {} ({scope})", m.mark.hex(), key_text(&m.key))
}

fn state_text(s: MarkState) -> String {
    match s {
        MarkState::Counted => "counted".into(),
        MarkState::Retracting { since_ms } => {
            format!("retracting since {}", crate::domain::format_ms(since_ms))
        }
    }
}

/// Reads `from` and `to` side by side in key order, a page at a time, and
/// compares each counter, average, publication time, CountAPI record and
/// mark of `from`
/// with the cluster's.
pub async fn verify(
    from: &dyn Store,
    to: &dyn Store,
    rules: &format::Rules,
) -> Result<Verified, String> {
    verify_with(from, to, rules, true).await
}

/// From where [`verify`] reads: days from `days` on, hours of the days from
/// `hours` on (the retention's and the hourly retention's first days, as
/// the copy wrote them).
#[derive(Clone, Copy, Debug)]
struct Since {
    days: i64,
    hours: i64,
}

/// [`verify`], marks compared only when `marks`.
pub async fn verify_with(
    from: &dyn Store,
    to: &dyn Store,
    rules: &format::Rules,
    marks: bool,
) -> Result<Verified, String> {
    let from_day = Since {
        days: rules.oldest_day(),
        hours: rules.oldest_hour_day(),
    };
    let mut v = Verified::default();
    walk::<CounterHistory>(&mut v, from, to, from_day).await?;
    walk::<AverageHistory>(&mut v, from, to, from_day).await?;
    walk::<TargetPublished>(&mut v, from, to, from_day).await?;
    walk::<KeyRecord>(&mut v, from, to, from_day).await?;
    if marks {
        walk::<ActorMark>(&mut v, from, to, from_day).await?;
    }
    Ok(v)
}

/// What [`verify`] reads of both stores, a page at a time, in one order.
trait Listed: Sized {
    /// What a difference's message and a failed read name.
    const WHAT: &'static str;
    const PAGE: usize;
    /// The order both stores list in, computed once per entry.
    type Order: Ord;
    /// Where the next page starts (exclusive).
    type Cursor;
    async fn page(
        store: &dyn Store,
        after: Option<Self::Cursor>,
        from_day: Since,
    ) -> Result<Vec<Self>, StoreError>;
    fn order(&self) -> Self::Order;
    fn cursor(&self) -> Self::Cursor;
    /// How a difference names it.
    fn name(&self) -> String;
    /// Adds to `v` what differs between the copies of both stores.
    fn compare(v: &mut Verified, a: &Self, b: &Self);
}

impl Listed for CounterHistory {
    const WHAT: &'static str = "counters";
    const PAGE: usize = export::PAGE;
    type Order = (Arc<str>, Arc<str>, Arc<str>);
    type Cursor = CounterKey;
    async fn page(
        store: &dyn Store,
        after: Option<CounterKey>,
        from_day: Since,
    ) -> Result<Vec<Self>, StoreError> {
        store
            .counter_page(after, Self::PAGE, from_day.days, from_day.hours)
            .await
    }
    fn order(&self) -> Self::Order {
        key_order(&self.counter.key)
    }
    fn cursor(&self) -> CounterKey {
        self.counter.key.clone()
    }
    fn name(&self) -> String {
        format!("counter {}", key_text(&self.counter.key))
    }
    fn compare(v: &mut Verified, a: &Self, b: &Self) {
        compare_counters(v, a, b);
    }
}

impl Listed for AverageHistory {
    const WHAT: &'static str = "averages";
    const PAGE: usize = export::PAGE;
    type Order = (Arc<str>, Arc<str>, Arc<str>);
    type Cursor = CounterKey;
    async fn page(
        store: &dyn Store,
        after: Option<CounterKey>,
        from_day: Since,
    ) -> Result<Vec<Self>, StoreError> {
        store.average_page(after, Self::PAGE, from_day.days).await
    }
    fn order(&self) -> Self::Order {
        key_order(&self.key)
    }
    fn cursor(&self) -> CounterKey {
        self.key.clone()
    }
    fn name(&self) -> String {
        format!("average {}", key_text(&self.key))
    }
    fn compare(v: &mut Verified, a: &Self, b: &Self) {
        compare_averages(v, a, b);
    }
}

impl Listed for ActorMark {
    const WHAT: &'static str = "marks";
    const PAGE: usize = export::MARK_PAGE;
    type Order = (Option<i64>, [u8; 16], [u8; 16]);
    type Cursor = ActorMark;
    async fn page(
        store: &dyn Store,
        after: Option<ActorMark>,
        from_day: Since,
    ) -> Result<Vec<Self>, StoreError> {
        store.mark_page(after, Self::PAGE, from_day.days).await
    }
    fn order(&self) -> Self::Order {
        ActorMark::order(self)
    }
    fn cursor(&self) -> ActorMark {
        self.clone()
    }
    fn name(&self) -> String {
        mark_text(self)
    }
    fn compare(v: &mut Verified, a: &Self, b: &Self) {
        if a.state != b.state {
            v.differ(format!(
                "{}: {} in the embedded store, {} in the cluster",
                mark_text(a),
                state_text(a.state),
                state_text(b.state)
            ));
        }
    }
}

impl Listed for KeyRecord {
    const WHAT: &'static str = "CountAPI records";
    const PAGE: usize = export::COUNTAPI_PAGE;
    /// `String`s order bytewise, as both stores list keys.
    type Order = (String, String);
    type Cursor = (String, String);
    async fn page(
        store: &dyn Store,
        after: Option<(String, String)>,
        _from_day: Since,
    ) -> Result<Vec<Self>, StoreError> {
        store.countapi_page(after, Self::PAGE).await
    }
    fn order(&self) -> Self::Order {
        self.cursor()
    }
    fn cursor(&self) -> Self::Cursor {
        KeyRecord::cursor(self)
    }
    fn name(&self) -> String {
        format!("CountAPI key {}/{}", self.namespace.name, self.key)
    }
    fn compare(v: &mut Verified, a: &Self, b: &Self) {
        // The digest is not named: it is the admin key's only record.
        if a.namespace.admin_key_sha256 != b.namespace.admin_key_sha256 {
            v.differ(format!(
                "{}: its namespace's admin key differs in the cluster",
                a.name()
            ));
        }
        if a.created != b.created || a.namespace.created_ms != b.namespace.created_ms {
            v.differ(format!(
                "{}: {:?} in the embedded store, {:?} in the cluster",
                a.name(),
                (a.created, a.namespace.created_ms),
                (b.created, b.namespace.created_ms)
            ));
        }
    }
}

impl Listed for TargetPublished {
    const WHAT: &'static str = "publication times";
    const PAGE: usize = export::PUBLISHED_PAGE;
    /// `String`s order bytewise, as both stores list targets.
    type Order = (String, String);
    type Cursor = (String, String);
    async fn page(
        store: &dyn Store,
        after: Option<(String, String)>,
        _from_day: Since,
    ) -> Result<Vec<Self>, StoreError> {
        store.published_page(after, Self::PAGE).await
    }
    fn order(&self) -> Self::Order {
        self.cursor()
    }
    fn cursor(&self) -> Self::Cursor {
        TargetPublished::cursor(self)
    }
    fn name(&self) -> String {
        format!("publication time of {}/{}", self.entity, self.uuid)
    }
    fn compare(v: &mut Verified, a: &Self, b: &Self) {
        if a.at_ms != b.at_ms {
            v.differ(format!(
                "{}: {} in the embedded store, {} in the cluster",
                a.name(),
                crate::domain::format_ms(a.at_ms),
                crate::domain::format_ms(b.at_ms)
            ));
        }
    }
}

/// One store's entries of a [`walk`]: the page read and not yet compared.
struct Pages<T: Listed> {
    ahead: VecDeque<(T::Order, T)>,
    after: Option<T::Cursor>,
    end: bool,
}

impl<T: Listed> Pages<T> {
    fn new() -> Self {
        Pages {
            ahead: VecDeque::new(),
            after: None,
            end: false,
        }
    }

    /// Reads the next page once the last one is used up.
    async fn fill(&mut self, store: &dyn Store, from_day: Since) -> Result<(), String> {
        if !self.ahead.is_empty() || self.end {
            return Ok(());
        }
        let page = T::page(store, self.after.take(), from_day)
            .await
            .map_err(|e| format!("verifying {}: {e}", T::WHAT))?;
        self.end = page.len() < T::PAGE;
        self.after = page.last().map(T::cursor);
        self.ahead.extend(page.into_iter().map(|x| (x.order(), x)));
        Ok(())
    }

    fn front(&self) -> Option<&T::Order> {
        self.ahead.front().map(|(k, _)| k)
    }

    fn pop(&mut self) -> Option<T> {
        self.ahead.pop_front().map(|(_, x)| x)
    }
}

/// Reads the `T`s of both stores side by side: one missing in the cluster
/// is a difference, one only in the cluster is counted, one in both is
/// compared.
async fn walk<T: Listed>(
    v: &mut Verified,
    from: &dyn Store,
    to: &dyn Store,
    from_day: Since,
) -> Result<(), String> {
    let (mut a, mut b) = (Pages::<T>::new(), Pages::<T>::new());
    loop {
        a.fill(from, from_day).await?;
        b.fill(to, from_day).await?;
        let side = match (a.front(), b.front()) {
            (None, None) => return Ok(()),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some(x), Some(y)) => x.cmp(y),
        };
        match side {
            Ordering::Less => {
                if let Some(x) = a.pop() {
                    v.compared += 1;
                    v.differ(format!("{}: missing in the cluster", x.name()));
                }
            }
            Ordering::Greater => {
                b.pop();
                v.only_in_cluster += 1;
            }
            Ordering::Equal => {
                if let (Some(x), Some(y)) = (a.pop(), b.pop()) {
                    v.compared += 1;
                    T::compare(v, &x, &y);
                }
            }
        }
    }
}

/// How a copy carries marks.
#[derive(Clone, Debug)]
pub struct MarkCopy {
    /// Marks are copied (not `--skip-marks`).
    pub marks: bool,
    /// The fingerprint of the embedded store's secret, when known.
    pub fingerprint: Option<String>,
    /// What the cluster's side checks it against (and records it in).
    pub check: SecretCheck,
    /// The tenant copied.
    pub tenant: String,
}

/// Copies one tenant: `from` exported into an in-memory pipe that `to`
/// imports from, the two running together (memory holds a page and a
/// batch, whatever the size).
pub async fn copy(
    from: &dyn Store,
    to: &dyn Store,
    rules: &format::Rules,
    marks: &MarkCopy,
    bar: &indicatif::ProgressBar,
) -> Result<import::Imported, String> {
    let (mut writer, reader) = tokio::io::duplex(1 << 20);
    let hidden = indicatif::ProgressBar::hidden();
    let what = export::Export {
        from_day: rules.oldest_day(),
        hours_from_day: rules.oldest_hour_day(),
        marks: marks.marks,
        fingerprint: marks.fingerprint.clone(),
        tenant: marks.tenant.clone(),
    };
    let exporting = async move {
        let done = export::write(from, &mut writer, &what, &hidden).await;
        // Dropping the writer ends the stream for the import.
        drop(writer);
        done
    };
    let options = import::Options {
        input_name: "the embedded store".into(),
        secret: marks.check.clone(),
        ..import::Options::default()
    };
    let importing = import::read_all(to, tokio::io::BufReader::new(reader), rules, &options, bar);
    let (exported, imported) = tokio::try_join!(exporting, importing)?;
    if imported.counters != exported.counters
        || imported.averages != exported.averages
        || imported.published != exported.published
        || imported.countapi != exported.countapi
        || imported.marks != exported.marks
    {
        return Err(format!(
            "{} counters, {} averages, {} publication times, {} CountAPI keys and {} marks were exported, but {}, {}, {}, {} and {} imported",
            exported.counters,
            exported.averages,
            exported.published,
            exported.countapi,
            exported.marks,
            imported.counters,
            imported.averages,
            imported.published,
            imported.countapi,
            imported.marks
        ));
    }
    Ok(imported)
}

/// What `migrate` did.
#[derive(Debug, Default)]
pub struct Migrated {
    /// Tenants copied and verified.
    pub tenants: usize,
    /// Marks of actors copied, over every tenant.
    pub marks: u64,
    /// What every gateway on the cluster must be started with (printed),
    /// when marks were copied.
    pub gateways_need: Option<String>,
}

/// Where the embedded store's actor secret comes from.
enum Source {
    /// `--actor-secret` (or `COUNTER_GATEWAY_ACTOR_SECRET`).
    Given,
    /// `<data-dir>/actor-secret`.
    File(PathBuf),
}

/// What every gateway on the cluster needs, to key actors as the embedded
/// store's did: the secret named by where it is, never shown (a migration's
/// output ends up in terminals and logs the secret has no business in).
fn gateways_need(source: &Source, fingerprint: &str) -> String {
    match source {
        Source::Given => format!(
            "every gateway on the cluster must be started with the COUNTER_GATEWAY_ACTOR_SECRET given to migrate (fingerprint {fingerprint}); a gateway with another secret refuses to start"
        ),
        Source::File(path) => {
            let shown = path.display().to_string();
            format!(
                "every gateway on the cluster must be started with the embedded store's actor secret (fingerprint {fingerprint}), the content of {shown}:\n  COUNTER_GATEWAY_ACTOR_SECRET=\"$(cat '{}')\" counter-gateway serve --elasticsearch-url ...\n(copy it to each gateway's environment; a gateway with another secret refuses to start)",
                shown.replace('\'', "'\\''")
            )
        }
    }
}

/// `counter-gateway migrate` with no `--actor-secret` and marks copied.
pub async fn run(args: &StoreArgs, clock: Clock) -> Result<Migrated, String> {
    run_with(args, &SecretArgs::default(), clock).await
}

/// `counter-gateway migrate`: every tenant, copied then verified. Fails
/// (non-zero exit) when a copy fails or the verification finds a difference.
pub async fn run_with(
    args: &StoreArgs,
    secret: &SecretArgs,
    clock: Clock,
) -> Result<Migrated, String> {
    args.validate()?;
    if args.elasticsearch.url.is_empty() {
        return Err("migrate needs --elasticsearch-url (or COUNTER_GATEWAY_ELASTICSEARCH_URL): the cluster to copy into".into());
    }
    crate::store::sqlite::set_memory_budget(args.sqlite_memory_budget);
    let names = tenants(&args.data_dir)?;
    if names.is_empty() {
        return Err(format!(
            "no embedded store in {} (no {} there nor under tenants/): check --data-dir",
            args.data_dir.display(),
            crate::store::sqlite::DB_FILE
        ));
    }
    let rules = format::Rules {
        now: clock.now(),
        policy: args.time_policy(),
    };
    // The embedded store's secret: given, else its file (read, never made).
    let marks = !secret.skip_marks;
    let existing = crate::actors::existing_embedded_secret(&args.data_dir)?;
    // What brings marks of the first keying (an embedded store an earlier
    // version wrote) to their tenant as they are copied.
    let key = match secret.actor_secret.as_deref() {
        Some(s) => Some(
            crate::domain::ActorKey::new(s.as_bytes())
                .map_err(|e| format!("--actor-secret: {e}"))?,
        ),
        None => existing.clone(),
    };
    let (fingerprint, source) = match given_fingerprint(secret.actor_secret.as_deref())? {
        Some(fp) => (Some(fp), Some(Source::Given)),
        None => match existing.clone() {
            Some(k) => (
                k.fingerprint(),
                Some(Source::File(
                    std::fs::canonicalize(&args.data_dir)
                        .unwrap_or_else(|_| args.data_dir.clone())
                        .join(crate::actors::SECRET_FILE),
                )),
            ),
            None => (None, None),
        },
    };
    // Setup once (templates and scripts serve every tenant).
    open_elasticsearch(args, DEFAULT_TENANT, true, clock.clone()).await?;
    // Everything that would refuse the marks is checked before anything is
    // copied: marks without a known secret, a cluster keyed with another.
    let mut with_marks = Vec::new();
    for tenant in &names {
        let from = open_embedded(args, tenant, false, clock.clone())?;
        let any = from
            .mark_page(None, 1, rules.oldest_day())
            .await
            .map_err(|e| format!("tenant {tenant}: reading marks: {e}"))?;
        if marks && !any.is_empty() {
            with_marks.push(tenant.clone());
        }
    }
    if let (Some(first), None) = (with_marks.first(), &fingerprint) {
        return Err(format!(
            "tenant {first} holds marks of actors (once per actor), and the secret they were keyed with is unknown here: there is no {} (its gateway ran with --actor-secret?). Give migrate that secret (--actor-secret or COUNTER_GATEWAY_ACTOR_SECRET), or --skip-marks to copy without the marks (every actor would count once more on the cluster)",
            args.data_dir.join(crate::actors::SECRET_FILE).display()
        ));
    }
    if let Some(fp) = &fingerprint {
        for tenant in &with_marks {
            let to = open_elasticsearch(args, tenant, false, clock.clone())
                .await?
                .ok_or("no --elasticsearch-url")?;
            if let Some(r) = to.recorded_fingerprint().await.map_err(|e| e.to_string())? {
                if r != *fp {
                    return Err(format!(
                        "tenant {tenant}: the cluster's marks are recorded as keyed with the actor secret of fingerprint {r}, the embedded store's with {fp}: marks of two secrets cannot be mixed; nothing was copied. Migrate into another --index-prefix, or delete that tenant's actor mark indices first"
                    ));
                }
            }
        }
    }
    let mut failed = 0u64;
    let mut done = Migrated {
        tenants: names.len(),
        ..Migrated::default()
    };
    for tenant in &names {
        let from = open_embedded(args, tenant, false, clock.clone())?;
        // As its gateway would at its next start: marks an earlier version
        // keyed without the tenant are brought to it first, so that what
        // is copied and what is verified are keyed alike.
        if let (true, Some(k)) = (marks, &key) {
            from.key_marks(&k.for_tenant(tenant))
                .await
                .map_err(|e| format!("tenant {tenant}: {e}"))?;
        }
        let to = std::sync::Arc::new(
            open_elasticsearch(args, tenant, false, clock.clone())
                .await?
                .ok_or("no --elasticsearch-url")?,
        );
        let bar = progress(Unit::Bytes(None));
        bar.set_message(format!("tenant {tenant}"));
        let started = std::time::Instant::now();
        let how = MarkCopy {
            marks,
            fingerprint: fingerprint.clone(),
            check: SecretCheck::Cluster {
                store: to.clone(),
                given: None,
                key: key.clone(),
            },
            tenant: tenant.clone(),
        };
        let copied = copy(&from, &*to, &rules, &how, &bar).await;
        bar.finish_and_clear();
        let copied = copied.map_err(|e| {
            format!("tenant {tenant}: {e}\nnothing is lost: the embedded store is untouched; run migrate again (it sets, so what was copied is set to the same values again)")
        })?;
        done.marks += copied.marks;
        let v = verify_with(&from, &*to, &rules, marks).await?;
        eprintln!(
            "tenant {tenant}: copied {} counters and {} averages ({} day buckets, {} hour buckets), {} publication times, {} CountAPI keys and {} marks of actors in {:.1} s; verified {} of them: {}",
            copied.counters,
            copied.averages,
            copied.days,
            copied.hours,
            copied.published,
            copied.countapi,
            copied.marks,
            started.elapsed().as_secs_f64(),
            v.compared,
            if v.count == 0 { "all agree".to_string() } else { format!("{} differences", v.count) }
        );
        if v.only_in_cluster > 0 {
            eprintln!(
                "tenant {tenant}: the cluster also holds {} counters, averages, publication times or marks the embedded store has not (kept: import merges)",
                v.only_in_cluster
            );
        }
        for d in &v.differences {
            eprintln!("tenant {tenant}: {d}");
        }
        if v.count > v.differences.len() as u64 {
            eprintln!(
                "tenant {tenant}: and {} more differences",
                v.count - v.differences.len() as u64
            );
        }
        failed += v.count;
    }
    if failed > 0 {
        return Err(format!(
            "verification found {failed} differences between the embedded store and the cluster (listed above)"
        ));
    }
    eprintln!(
        "migrated {} tenants; every counter, average, publication time and mark agrees",
        names.len()
    );
    if !marks {
        eprintln!("marks of actors were not copied (--skip-marks): on the cluster every actor counts once more");
    } else if let (Some(fp), Some(source)) = (&fingerprint, &source) {
        if done.marks > 0 {
            let need = gateways_need(source, fp);
            eprintln!("{need}");
            done.gateways_need = Some(need);
        }
    }
    Ok(done)
}
