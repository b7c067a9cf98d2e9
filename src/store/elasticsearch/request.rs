//! Building what is sent to Elasticsearch, as pure functions: the plan of a
//! flush (one scripted upsert per counter document and per day bucket
//! document), its `_bulk` NDJSON body, and the bodies of reads and deletes.
//! Contract tests compare these byte for byte (as JSON) with files under
//! `tests/fixtures/es/`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use crate::domain::{CounterKey, Increment, Kind, Window, MAX_DOC_ID_BYTES};

/// Index names of one tenant: `<prefix>_<tenant>_<collection>`.
///
/// The tenant is a value carried here rather than a constant, so that a
/// later multi-tenant gateway only builds one `IndexNames` per tenant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexNames {
    prefix: String,
    tenant: String,
}

/// Why a prefix or tenant cannot name indices.
pub fn validate_index_part(what: &str, s: &str) -> Result<(), String> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-');
    if ok {
        Ok(())
    } else {
        // `_` separates prefix, tenant and collection; allowing it would let
        // two tenants' index names collide.
        Err(format!(
            "{what} {s:?} must be 1-64 characters of a-z, 0-9 and '-', not starting with '-'"
        ))
    }
}

impl IndexNames {
    pub fn new(prefix: &str, tenant: &str) -> Result<Self, String> {
        validate_index_part("index prefix", prefix)?;
        validate_index_part("tenant", tenant)?;
        Ok(IndexNames {
            prefix: prefix.into(),
            tenant: tenant.into(),
        })
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    fn collection(&self, name: &str) -> String {
        format!("{}_{}_{}", self.prefix, self.tenant, name)
    }

    pub fn counters(&self) -> String {
        self.collection("counters")
    }

    /// The monthly bucket index holding UTC day `day` (days since the epoch).
    pub fn buckets(&self, day: i64) -> String {
        format!(
            "{}-{}",
            self.collection("histogram_counters"),
            month_of(day)
        )
    }

    /// The monthly hour-bucket index holding UTC hour `hour` (hours since
    /// the epoch).
    ///
    /// Monthly, like the day buckets, and not weekly or daily: with the
    /// default 14 days kept, one or two hour indices (one or two shards per
    /// tenant) are alive at a time, and they share the day buckets'
    /// machinery (created ahead of writes, one name per month, deleted
    /// whole once their last day is past the retention). The cost: a
    /// month's hours stay on disk until its last day leaves the retention,
    /// up to 14 + 31 days of hours instead of 14; a daily index would cost
    /// 15 shards per tenant to save that.
    pub fn hours(&self, hour: i64) -> String {
        format!(
            "{}-{}",
            self.collection("hour_counters"),
            month_of(hour.div_euclid(24))
        )
    }

    /// Every hour index of this tenant (a counter's delete).
    pub fn hours_pattern(&self) -> String {
        format!("{}-*", self.collection("hour_counters"))
    }

    /// The hour indices a read of `range` searches (as [`Self::window_buckets`]).
    pub fn hour_window(&self, range: crate::domain::HourRange) -> WindowIndices {
        let base = self.collection("hour_counters");
        let (months, names) = months_of(range.days());
        if names.is_empty() {
            return WindowIndices {
                path: format!("{base}-*"),
                months,
            };
        }
        let names: Vec<String> = names.iter().map(|m| format!("{base}-{m}")).collect();
        WindowIndices {
            path: names.join(","),
            months,
        }
    }

    /// Every bucket index of this tenant (for deletes and, later, queries).
    pub fn buckets_pattern(&self) -> String {
        format!("{}-*", self.collection("histogram_counters"))
    }

    /// Every average bucket index of this tenant.
    pub fn average_buckets_pattern(&self) -> String {
        format!("{}-*", self.collection("average_histogram_counters"))
    }

    /// Every index of this tenant (`<prefix>_<tenant>_*`: `_` ends the
    /// tenant, so another tenant's indices never match).
    pub fn tenant_pattern(&self) -> String {
        format!("{}_{}_*", self.prefix, self.tenant)
    }

    /// The index of average counters (sum, quantity, average per document).
    pub fn averages(&self) -> String {
        self.collection("average_counters")
    }

    /// The monthly index of average day buckets holding UTC day `day`.
    pub fn average_buckets(&self, day: i64) -> String {
        format!(
            "{}-{}",
            self.collection("average_histogram_counters"),
            month_of(day)
        )
    }

    /// The index of targets' publication times (`publication.rs`).
    pub fn targets(&self) -> String {
        self.collection("targets")
    }

    /// The index of `ever` actor marks (likes).
    pub fn actor_marks(&self) -> String {
        self.collection("actor_marks")
    }

    /// The monthly index of `day` actor marks (views) of UTC day `day`.
    pub fn actor_day_marks(&self, day: i64) -> String {
        format!("{}-{}", self.collection("actor_day_marks"), month_of(day))
    }

    /// Every monthly index of `day` actor marks of this tenant.
    pub fn actor_day_marks_pattern(&self) -> String {
        format!("{}-*", self.collection("actor_day_marks"))
    }

    /// The `ever` and the monthly `day` mark indices of every tenant of
    /// this prefix (setup's mapping upgrade, the gateway's secret check).
    pub fn all_actor_marks(&self) -> (String, String) {
        (
            format!("{}_*_actor_marks", self.prefix),
            format!("{}_*_actor_day_marks-*", self.prefix),
        )
    }

    /// Every index of actor marks of this tenant (a counter's delete).
    pub fn actor_marks_pattern(&self) -> String {
        format!(
            "{},{}-*",
            self.collection("actor_marks"),
            self.collection("actor_day_marks")
        )
    }

    /// The bucket indices a read of `window` must search: the monthly
    /// indices it overlaps, comma-separated, so a week reads one or two
    /// indices rather than every month kept. Past [`MAX_NAMED_MONTHS`] months
    /// the `-*` pattern is shorter than the list (and the day range filter
    /// still holds). `averages` picks the average buckets.
    pub fn window_buckets(&self, window: Window, averages: bool) -> WindowIndices {
        let base = self.collection(if averages {
            "average_histogram_counters"
        } else {
            "histogram_counters"
        });
        let (months, names) = months_of(window);
        if names.is_empty() {
            return WindowIndices {
                path: format!("{base}-*"),
                months,
            };
        }
        let names: Vec<String> = names.iter().map(|m| format!("{base}-{m}")).collect();
        WindowIndices {
            path: names.join(","),
            months,
        }
    }
}

/// Most monthly indices named one by one in a search path.
pub const MAX_NAMED_MONTHS: usize = 15;

/// The indices of a windowed read, and how many months the window spans
/// (one month means each counter's buckets in the window lie on one shard).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowIndices {
    pub path: String,
    pub months: usize,
}

/// How many calendar months the window overlaps, and their `YYYY.MM`
/// names, oldest first, when there are at most [`MAX_NAMED_MONTHS`].
fn months_of(window: Window) -> (usize, Vec<String>) {
    use chrono::Datelike;
    let month_index =
        |day: i64| day_start(day).map(|d| i64::from(d.year()) * 12 + i64::from(d.month0()));
    let (Some(first), Some(last)) = (month_index(window.from_day), month_index(window.to_day))
    else {
        return (usize::MAX, Vec::new());
    };
    let count = usize::try_from(last - first + 1).unwrap_or(0);
    if count > MAX_NAMED_MONTHS {
        return (count, Vec::new());
    }
    let names = (first..=last)
        .map(|m| format!("{:04}.{:02}", m.div_euclid(12), m.rem_euclid(12) + 1))
        .collect();
    (count, names)
}

/// `YYYY.MM` of a UTC day.
fn month_of(day: i64) -> String {
    day_start(day)
        .map(|d| d.format("%Y.%m").to_string())
        .unwrap_or_else(|| "0000.00".into())
}

fn day_start(day: i64) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::from_timestamp(day.checked_mul(86_400)?, 0)
}

/// The `_id` of the bucket document of `counter_id` for `day`.
///
/// `<counter id>@YYYY-MM-DD`, readable in Kibana. A counter id may already
/// use all 512 bytes Elasticsearch allows, so when the suffix would not fit
/// the counter id is replaced by its SHA-256 (still injective in practice,
/// and the document carries the plain `counter_id` field anyway).
pub fn bucket_doc_id(counter_id: &str, day: i64) -> String {
    let date = day_start(day)
        .map(|d| d.format("%Y-%m-%d").to_string())
        .unwrap_or_else(|| day.to_string());
    if counter_id.len() + 1 + date.len() <= MAX_DOC_ID_BYTES {
        format!("{counter_id}@{date}")
    } else {
        let mut hex = String::with_capacity(64);
        for b in sha256(counter_id.as_bytes()) {
            let _ = write!(hex, "{b:02x}");
        }
        format!("sha256:{hex}@{date}")
    }
}

/// The `_id` of the hour document of `counter_id` for `hour`:
/// `<counter id>@YYYY-MM-DDTHH`, with the same SHA-256 fallback as
/// [`bucket_doc_id`].
pub fn hour_doc_id(counter_id: &str, hour: i64) -> String {
    let stamp = chrono::DateTime::from_timestamp(hour.saturating_mul(3_600), 0)
        .map(|d| d.format("%Y-%m-%dT%H").to_string())
        .unwrap_or_else(|| hour.to_string());
    if counter_id.len() + 1 + stamp.len() <= MAX_DOC_ID_BYTES {
        format!("{counter_id}@{stamp}")
    } else {
        let mut hex = String::with_capacity(64);
        for b in sha256(counter_id.as_bytes()) {
            let _ = write!(hex, "{b:02x}");
        }
        format!("sha256:{hex}@{stamp}")
    }
}

/// The `_id` of an actor mark: `<counter id>@<mark>` (`ever`), with
/// `@YYYY-MM-DD` for a day mark; as for buckets, the counter id is replaced
/// by its SHA-256 when the id would pass 512 bytes.
pub fn mark_doc_id(counter_id: &str, mark: &str, day: Option<i64>) -> String {
    let date = day.map(|d| {
        day_start(d)
            .map(|t| t.format("%Y-%m-%d").to_string())
            .unwrap_or_else(|| d.to_string())
    });
    let suffix = match &date {
        Some(d) => format!("@{mark}@{d}"),
        None => format!("@{mark}"),
    };
    if counter_id.len() + suffix.len() <= MAX_DOC_ID_BYTES {
        format!("{counter_id}{suffix}")
    } else {
        let mut hex = String::with_capacity(64);
        for b in sha256(counter_id.as_bytes()) {
            let _ = write!(hex, "{b:02x}");
        }
        format!("sha256:{hex}{suffix}")
    }
}

/// Which document a write goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Counter,
    /// The bucket of one UTC day (days since the epoch).
    Bucket(i64),
    /// An average counter: `delta` adds to its sum, `quantity` to its samples.
    Average,
    /// The day bucket of an average counter.
    AverageBucket(i64),
    /// The bucket of one UTC hour (hours since the epoch): a document of
    /// the bucket mapping whose `day` holds the hour's start, written by
    /// the bucket script.
    HourBucket(i64),
}

impl Target {
    fn is_average(self) -> bool {
        matches!(self, Target::Average | Target::AverageBucket(_))
    }
}

/// One event carrying an idempotency id, passed to the script on its own
/// (`[id, delta, ts_ms, category, position]`, plus `quantity` for average
/// samples) so the script can skip it when the document has already counted
/// that id.
#[derive(Clone, Debug, PartialEq)]
pub struct IdEvent {
    pub id: Arc<str>,
    pub delta: i64,
    pub ts_ms: i64,
    pub category: Option<Arc<str>>,
    /// Arrival position in the flush, so "last category wins" holds across
    /// the summed part and the events with ids.
    pub pos: u64,
    /// Samples only: 1 for a sample, -1 for a retraction; 0 for counters.
    pub quantity: i64,
}

/// The scripted upsert of one document in one flush.
#[derive(Clone, Debug, PartialEq)]
pub struct DocWrite {
    pub key: CounterKey,
    pub target: Target,
    /// Sum of the events without an id.
    pub delta: i64,
    /// Averages only: sum of the quantities of the events without an id.
    pub quantity: i64,
    pub first_ms: Option<i64>,
    pub last_ms: Option<i64>,
    /// Last category given by an event without an id, with its position.
    pub category: Option<(Arc<str>, u64)>,
    pub events: Vec<IdEvent>,
    /// Ids to forget (used when undoing a write: see `mod.rs`).
    pub forget: Vec<Arc<str>>,
}

impl DocWrite {
    fn new(key: CounterKey, target: Target) -> Self {
        DocWrite {
            key,
            target,
            delta: 0,
            quantity: 0,
            first_ms: None,
            last_ms: None,
            category: None,
            events: Vec::new(),
            forget: Vec::new(),
        }
    }

    /// The write that takes back what this one applied, given the event
    /// positions the script skipped as already counted. Timestamps and the
    /// category are not taken back: max, min and last-wins have no inverse.
    pub fn undo(&self, skipped: &[usize]) -> DocWrite {
        let mut delta = -i128::from(self.delta);
        let mut quantity = -i128::from(self.quantity);
        let mut forget = Vec::new();
        for (i, e) in self.events.iter().enumerate() {
            if !skipped.contains(&i) {
                delta -= i128::from(e.delta);
                quantity -= i128::from(e.quantity);
                forget.push(e.id.clone());
            }
        }
        let mut u = DocWrite::new(self.key.clone(), self.target);
        // Fits: it is the negation of what the document accepted.
        u.delta = i64::try_from(delta).unwrap_or(0);
        u.quantity = i64::try_from(quantity).unwrap_or(0);
        u.forget = forget;
        u
    }
}

/// The writes of a flush, and which writes each request depends on.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    /// Per key: its counter write, then its bucket writes, keys in first-seen order.
    pub writes: Vec<DocWrite>,
    /// For each request, the writes it touches.
    pub touches: Vec<Vec<usize>>,
    /// For each request, its id events as (counter write, position in its events).
    pub id_events: Vec<Vec<(usize, usize)>>,
}

/// A request whose summed deltas leave the i64 range before any document is
/// read: it goes to the one-request-at-a-time path.
#[derive(Debug, PartialEq, Eq)]
pub struct PlanOverflow(pub CounterKey);

/// Plans one `_bulk` for `requests`: events without an id are summed per
/// document (coalescing); events with an id are passed one by one. Average
/// samples go to the average document and its day bucket (a key may name
/// both a counter and an average: they are different documents). Counter
/// increments of days from `hours_from_day` on also go to their hour
/// document (`crate::domain::hours`), ids and all, so the hours of a day
/// sum to it.
pub fn plan(requests: &[&[Increment]], hours_from_day: i64) -> Result<Plan, PlanOverflow> {
    let mut plan = Plan::default();
    // (is average, key) -> (main write, [(day, bucket write)],
    // [(hour, hour write)]) while building.
    let mut by_key: HashMap<(bool, CounterKey), usize> = HashMap::new();
    #[allow(clippy::type_complexity)]
    let mut groups: Vec<(usize, Vec<(i64, usize)>, Vec<(i64, usize)>)> = Vec::new();
    let mut writes: Vec<DocWrite> = Vec::new();
    let mut sums: Vec<(i128, i128)> = Vec::new();
    let mut pos = 0u64;
    for events in requests {
        let mut touches = Vec::new();
        let mut ids = Vec::new();
        for inc in events.iter() {
            let (sample, quantity) = match inc.kind {
                Kind::Counter => (false, 0i64),
                Kind::Sample { quantity } => (true, i64::from(quantity)),
            };
            let (main_target, bucket_target) = if sample {
                (Target::Average, Target::AverageBucket(inc.day))
            } else {
                (Target::Counter, Target::Bucket(inc.day))
            };
            let g = *by_key.entry((sample, inc.key.clone())).or_insert_with(|| {
                writes.push(DocWrite::new(inc.key.clone(), main_target));
                sums.push((0, 0));
                groups.push((writes.len() - 1, Vec::new(), Vec::new()));
                groups.len() - 1
            });
            let counter = groups[g].0;
            let bucket = match groups[g].1.iter().find(|(d, _)| *d == inc.day) {
                Some(&(_, w)) => w,
                None => {
                    writes.push(DocWrite::new(inc.key.clone(), bucket_target));
                    sums.push((0, 0));
                    groups[g].1.push((inc.day, writes.len() - 1));
                    writes.len() - 1
                }
            };
            let hour = (!sample && inc.day >= hours_from_day)
                .then(|| crate::domain::hours::hour_in_day(inc.day, inc.ts_ms))
                .map(|h| match groups[g].2.iter().find(|(x, _)| *x == h) {
                    Some(&(_, w)) => w,
                    None => {
                        writes.push(DocWrite::new(inc.key.clone(), Target::HourBucket(h)));
                        sums.push((0, 0));
                        groups[g].2.push((h, writes.len() - 1));
                        writes.len() - 1
                    }
                });
            for w in [counter, bucket].into_iter().chain(hour) {
                let dw = &mut writes[w];
                match &inc.id {
                    Some(id) => {
                        if w == counter {
                            ids.push((w, dw.events.len()));
                        }
                        dw.events.push(IdEvent {
                            id: id.clone(),
                            delta: inc.delta,
                            ts_ms: inc.ts_ms,
                            category: inc.category.clone(),
                            pos,
                            quantity,
                        });
                    }
                    None => {
                        sums[w].0 += i128::from(inc.delta);
                        sums[w].1 += i128::from(quantity);
                        dw.first_ms = Some(dw.first_ms.map_or(inc.ts_ms, |m| m.min(inc.ts_ms)));
                        dw.last_ms = Some(dw.last_ms.map_or(inc.ts_ms, |m| m.max(inc.ts_ms)));
                        if let Some(c) = &inc.category {
                            dw.category = Some((c.clone(), pos));
                        }
                    }
                }
                if !touches.contains(&w) {
                    touches.push(w);
                }
            }
            pos += 1;
        }
        plan.touches.push(touches);
        plan.id_events.push(ids);
    }
    for (w, (sum, quantity)) in writes.iter_mut().zip(&sums) {
        w.delta = i64::try_from(*sum).map_err(|_| PlanOverflow(w.key.clone()))?;
        w.quantity = i64::try_from(*quantity).map_err(|_| PlanOverflow(w.key.clone()))?;
    }
    // Lay writes out key by key: counter, then its buckets.
    let mut order = Vec::with_capacity(writes.len());
    for (c, buckets, hours) in &groups {
        order.push(*c);
        order.extend(buckets.iter().map(|(_, w)| *w));
        order.extend(hours.iter().map(|(_, w)| *w));
    }
    let mut new_index = vec![0; writes.len()];
    for (new, &old) in order.iter().enumerate() {
        new_index[old] = new;
    }
    let mut slots: Vec<Option<DocWrite>> = writes.into_iter().map(Some).collect();
    plan.writes = order
        .iter()
        .map(|&o| slots[o].take().unwrap_or_else(|| unreachable!()))
        .collect();
    for t in &mut plan.touches {
        for w in t.iter_mut() {
            *w = new_index[*w];
        }
    }
    for ids in &mut plan.id_events {
        for (w, _) in ids.iter_mut() {
            *w = new_index[*w];
        }
    }
    Ok(plan)
}

/// What every write of one flush shares.
#[derive(Clone, Debug)]
pub struct WriteSettings {
    pub counter_script: String,
    pub bucket_script: String,
    pub average_script: String,
    pub average_bucket_script: String,
    pub retry_on_conflict: u32,
    /// The clock of this flush: when ids are marked seen.
    pub now_ms: i64,
    /// How long a seen id is remembered.
    pub id_window_ms: i64,
    /// Most ids remembered per document; the oldest are forgotten first.
    pub max_ids: u32,
}

/// How many of the last writes (bulk items, named by [`OpIds`]) a counter
/// or bucket document remembers, so the engine's replay of one on a new
/// primary, or a resend of ours, is taken once. A replay runs while the
/// other writes in flight on the document are also replayed: at most one
/// per gateway (a gateway never has a counter in two bulks at once), so 16
/// covers 16 gateways writing one counter at the same moment.
pub const MAX_OPS_PER_DOC: u32 = 16;

/// Bulk items of counter, average and bucket writes that their document
/// had already taken (`noop`): the engine's run of a bulk again on a new
/// primary, or a resend of an item whose answer was lost. Counted once;
/// shown in `/metrics`.
pub static WRITES_TAKEN_ALREADY: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

/// Names for the writes of one store: a random prefix drawn when the store
/// is made (so gateways and restarts never share one) and a sequence.
#[derive(Debug)]
pub struct OpIds {
    prefix: String,
    next: std::sync::atomic::AtomicU64,
}

impl OpIds {
    pub fn new() -> Self {
        use ring::rand::SecureRandom;
        let mut bytes = [0u8; 8];
        if ring::rand::SystemRandom::new().fill(&mut bytes).is_err() {
            // No system randomness: the time in nanoseconds still differs
            // between two stores made on one machine.
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            bytes = t.to_le_bytes();
        }
        OpIds {
            prefix: bytes.iter().map(|b| format!("{b:02x}")).collect(),
            next: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// A name no other write of any gateway has.
    pub fn next(&self) -> String {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("{}-{n:x}", self.prefix)
    }
}

impl Default for OpIds {
    fn default() -> Self {
        Self::new()
    }
}

/// Fields of a counter document answered after an update.
pub const COUNTER_FIELDS: &[&str] = &[
    "entity",
    "action",
    "uuid",
    "value",
    "category",
    "first_timestamp",
    "recorded_timestamp",
    "skipped_events",
];

/// Fields of an average document answered after an update and read by get.
pub const AVERAGE_FIELDS: &[&str] = &[
    "entity",
    "action",
    "uuid",
    "sum",
    "quantity",
    "category",
    "first_timestamp",
    "recorded_timestamp",
    "skipped_events",
];

/// One `update` action of a `_bulk` body.
#[derive(Clone, Debug, PartialEq)]
pub struct BulkAction {
    pub index: String,
    pub id: String,
    pub routing: Option<String>,
    pub body: Value,
}

/// The fields of a document the gateway never reads back after a write:
/// the bookkeeping the scripts keep (recent event ids, bulk names, the days
/// a set touched), which can be most of a document's size.
const NOT_READ_BACK: &[&str] = &["event_ids", "applied_ops", "set_days", "last_set"];

/// The `update` action for one write: a scripted upsert calling a stored
/// script by id with params only. `op` names the write: a document that
/// took it already does nothing.
///
/// The document comes back in the answer only when the gateway reads it:
/// the counter's state when `want_state` (a single increment answers with
/// it), the events skipped when the write carries event ids. And it comes
/// back whole but for [`NOT_READ_BACK`]: measured on OpenSearch 2.19
/// (scripts/bench/README.md), asking for a list of included fields cost
/// the node more than the update itself, while an exclusion is almost free.
pub fn action(
    w: &DocWrite,
    names: &IndexNames,
    s: &WriteSettings,
    op: &str,
    want_state: bool,
) -> BulkAction {
    let counter_id = w.key.doc_id();
    let mut p = Map::new();
    p.insert("counter_id".into(), json!(counter_id));
    p.insert("entity".into(), json!(&*w.key.entity));
    p.insert("action".into(), json!(&*w.key.action));
    p.insert("uuid".into(), json!(&*w.key.uuid));
    if let Target::Bucket(day) | Target::AverageBucket(day) = w.target {
        p.insert("day".into(), json!(day * 86_400_000));
    }
    if let Target::HourBucket(hour) = w.target {
        p.insert("day".into(), json!(hour * 3_600_000));
    }
    p.insert("delta".into(), json!(w.delta));
    if w.target.is_average() {
        p.insert("quantity".into(), json!(w.quantity));
    }
    if let (Some(first), Some(last)) = (w.first_ms, w.last_ms) {
        p.insert("first_ms".into(), json!(first));
        p.insert("last_ms".into(), json!(last));
    }
    if let Some((c, pos)) = &w.category {
        p.insert("category".into(), json!(&**c));
        p.insert("category_pos".into(), json!(pos));
    }
    if !w.events.is_empty() {
        let events: Vec<Value> = w
            .events
            .iter()
            .map(|e| {
                if w.target.is_average() {
                    json!([
                        &*e.id,
                        e.delta,
                        e.ts_ms,
                        e.category.as_deref(),
                        e.pos,
                        e.quantity
                    ])
                } else {
                    json!([&*e.id, e.delta, e.ts_ms, e.category.as_deref(), e.pos])
                }
            })
            .collect();
        p.insert("events".into(), Value::Array(events));
    }
    if !w.forget.is_empty() {
        let ids: Vec<&str> = w.forget.iter().map(|i| &**i).collect();
        p.insert("forget".into(), json!(ids));
    }
    if !w.events.is_empty() || !w.forget.is_empty() {
        p.insert("now_ms".into(), json!(s.now_ms));
        p.insert("id_window_ms".into(), json!(s.id_window_ms));
        p.insert("max_ids".into(), json!(s.max_ids));
    }
    p.insert("op".into(), json!(op));
    p.insert("max_ops".into(), json!(MAX_OPS_PER_DOC));
    let read_back = !w.events.is_empty() || (want_state && w.target == Target::Counter);
    let (index, id, routing, script) = match w.target {
        Target::Counter => (names.counters(), counter_id, None, &s.counter_script),
        Target::Bucket(day) => (
            names.buckets(day),
            bucket_doc_id(&counter_id, day),
            Some(counter_id),
            &s.bucket_script,
        ),
        Target::HourBucket(hour) => (
            names.hours(hour),
            hour_doc_id(&counter_id, hour),
            Some(counter_id),
            &s.bucket_script,
        ),
        Target::Average => (names.averages(), counter_id, None, &s.average_script),
        Target::AverageBucket(day) => (
            names.average_buckets(day),
            bucket_doc_id(&counter_id, day),
            Some(counter_id),
            &s.average_bucket_script,
        ),
    };
    let mut body = json!({
        "scripted_upsert": true,
        "upsert": {},
        "script": {"id": script, "params": Value::Object(p)},
    });
    if read_back {
        body["_source"] = json!({ "excludes": NOT_READ_BACK });
    }
    BulkAction {
        index,
        id,
        routing,
        body,
    }
}

/// The NDJSON body of a `_bulk` request: an action line and a payload line
/// per update, each ending in a newline (the last one included).
pub fn bulk_body(actions: &[&BulkAction], retry_on_conflict: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(actions.len() * 512);
    for a in actions {
        let mut meta = Map::new();
        meta.insert("_index".into(), json!(a.index));
        meta.insert("_id".into(), json!(a.id));
        if let Some(r) = &a.routing {
            meta.insert("routing".into(), json!(r));
        }
        meta.insert("retry_on_conflict".into(), json!(retry_on_conflict));
        let line = json!({ "update": Value::Object(meta) });
        // Serializing a Value cannot fail.
        let _ = serde_json::to_writer(&mut out, &line);
        out.push(b'\n');
        let _ = serde_json::to_writer(&mut out, &a.body);
        out.push(b'\n');
    }
    out
}

/// The search for every counter of one target, ordered by action.
///
/// Capped at 10,000 (Elasticsearch's default result window): one target has
/// a handful of counters, never thousands.
pub fn target_query(entity: &str, uuid: &str) -> Value {
    json!({
        "size": 10000,
        "query": {"bool": {"filter": [
            {"term": {"entity": entity}},
            {"term": {"uuid": uuid}}
        ]}},
        "sort": [{"action": "asc"}],
        "_source": {"includes": &COUNTER_FIELDS[..7]}
    })
}

/// The delete-by-query of every bucket of one counter (sent with
/// `routing=<counter id>`, so it visits one shard per bucket index).
pub fn buckets_of_counter_query(counter_id: &str) -> Value {
    json!({"query": {"term": {"counter_id": counter_id}}})
}

/// Percent-encodes one path segment (a document id may hold `/`, `?`, `%`, ...).
pub fn encode_path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// SHA-256 (FIPS 180-4), only for over-long bucket ids; small enough to keep
/// here rather than pull in a crate.
pub fn sha256(data: &[u8]) -> [u8; 32] {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut h: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
        0x5be0cd19,
    ];
    let mut msg = data.to_vec();
    let bit_len = (data.len() as u64).wrapping_mul(8);
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&bit_len.to_be_bytes());
    for chunk in msg.chunks(64) {
        let mut w = [0u32; 64];
        for i in 0..16 {
            w[i] = u32::from_be_bytes([
                chunk[4 * i],
                chunk[4 * i + 1],
                chunk[4 * i + 2],
                chunk[4 * i + 3],
            ]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16]
                .wrapping_add(s0)
                .wrapping_add(w[i - 7])
                .wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(K[i])
                .wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            hh = g;
            g = f;
            f = e;
            e = d.wrapping_add(t1);
            d = c;
            c = b;
            b = a;
            a = t1.wrapping_add(t2);
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 32];
    for (i, v) in h.iter().enumerate() {
        out[4 * i..4 * i + 4].copy_from_slice(&v.to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: [u8; 32]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn sha256_matches_the_standard_vectors() {
        assert_eq!(
            hex(sha256(b"")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            hex(sha256(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            hex(sha256(
                b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"
            )),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
    }

    #[test]
    fn index_names_follow_the_layout() {
        let n = IndexNames::new("counter-gateway", "default").unwrap();
        assert_eq!(n.counters(), "counter-gateway_default_counters");
        // 2026-11-30 is day 20_787.
        assert_eq!(
            n.buckets(20_787),
            "counter-gateway_default_histogram_counters-2026.11"
        );
        assert!(IndexNames::new("Counter", "default").is_err());
        assert!(IndexNames::new("cg", "a_b").is_err());
    }

    #[test]
    fn bucket_ids_stay_within_512_bytes() {
        assert_eq!(
            bucket_doc_id("VIDEO_VIEW_x", 20_787),
            "VIDEO_VIEW_x@2026-11-30"
        );
        let long = "x".repeat(510);
        let id = bucket_doc_id(&long, 20_787);
        assert!(id.starts_with("sha256:") && id.len() <= 512, "{id}");
        assert_ne!(id, bucket_doc_id(&"y".repeat(510), 20_787));
    }

    #[test]
    fn hour_writes_go_to_their_monthly_index_beside_the_day() {
        let n = IndexNames::new("cg", "default").unwrap();
        // 2026-11-30T13:00Z and 2026-12-01T00:00Z.
        let (h13, h24) = (20_787 * 24 + 13, 20_788 * 24);
        assert_eq!(n.hours(h13), "cg_default_hour_counters-2026.11");
        assert_eq!(n.hours(h24), "cg_default_hour_counters-2026.12");
        assert_eq!(
            hour_doc_id("VIDEO_VIEW_x", h13),
            "VIDEO_VIEW_x@2026-11-30T13"
        );
        let long = "x".repeat(505);
        assert!(hour_doc_id(&long, h13).starts_with("sha256:"));
        let inc = |ts: &str, id: Option<&str>| Increment {
            key: CounterKey::new("VIDEO", "VIEW", "x").unwrap(),
            delta: 2,
            category: None,
            ts_ms: chrono::DateTime::parse_from_rfc3339(ts)
                .unwrap()
                .timestamp_millis(),
            day: crate::domain::day_of(chrono::DateTime::parse_from_rfc3339(ts).unwrap().into()),
            id: id.map(Arc::from),
            kind: Kind::Counter,
            unique: None,
        };
        let events = [
            inc("2026-11-30T13:10:00Z", None),
            inc("2026-11-30T13:50:00Z", Some("e1")),
            inc("2026-11-30T14:00:00Z", None),
            inc("2026-10-01T14:00:00Z", None),
        ];
        let slices: Vec<&[Increment]> = vec![&events];
        let p = plan(&slices, 20_787 - 14).unwrap();
        let targets: Vec<Target> = p.writes.iter().map(|w| w.target).collect();
        assert_eq!(
            targets,
            vec![
                Target::Counter,
                Target::Bucket(20_787),
                Target::Bucket(20_727),
                Target::HourBucket(h13),
                Target::HourBucket(h13 + 1),
            ]
        );
        // The hour takes the id event as its day does.
        assert_eq!((p.writes[3].delta, p.writes[3].events.len()), (2, 1));
        assert_eq!(p.writes[4].delta, 2);
        let s = WriteSettings {
            counter_script: "c".into(),
            bucket_script: "b".into(),
            average_script: "a".into(),
            average_bucket_script: "ab".into(),
            retry_on_conflict: 5,
            now_ms: 0,
            id_window_ms: 1,
            max_ids: 10,
        };
        let a = action(&p.writes[3], &n, &s, "op", false);
        assert_eq!(a.index, "cg_default_hour_counters-2026.11");
        assert_eq!(a.routing.as_deref(), Some("VIDEO_VIEW_x"));
        assert_eq!(a.body["script"]["id"], "b");
        assert_eq!(a.body["script"]["params"]["day"], h13 * 3_600_000);
        // Without hours kept, the plan is the day buckets' alone.
        assert_eq!(plan(&slices, i64::MAX).unwrap().writes.len(), 3);
    }

    #[test]
    fn mark_ids_stay_within_512_bytes_and_never_hold_the_actor() {
        let mark = "0123456789abcdef0123456789abcdef";
        assert_eq!(
            mark_doc_id("ARTICLE_like_a1", mark, None),
            format!("ARTICLE_like_a1@{mark}")
        );
        assert_eq!(
            mark_doc_id("ARTICLE_VIEW_a1", mark, Some(20_787)),
            format!("ARTICLE_VIEW_a1@{mark}@2026-11-30")
        );
        let long = "x".repeat(500);
        let id = mark_doc_id(&long, mark, Some(20_787));
        assert!(id.starts_with("sha256:") && id.len() <= 512, "{id}");
        assert!(id.ends_with(&format!("@{mark}@2026-11-30")));
        assert_ne!(id, mark_doc_id(&"y".repeat(500), mark, Some(20_787)));
    }

    #[test]
    fn path_segments_are_escaped() {
        assert_eq!(encode_path_segment("a/b?c%5F d"), "a%2Fb%3Fc%255F%20d");
        assert_eq!(encode_path_segment("VIDEO_VIEW_1-2"), "VIDEO_VIEW_1-2");
    }
}
