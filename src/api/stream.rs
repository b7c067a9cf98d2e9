//! Live values: `GET /v1/stream?keys=entity/action/uuid,...` answers
//! Server-Sent Events, the current value of each key at once, then a key's
//! new value whenever it changed, at most one event per key per
//! `--stream-interval` (the latest value wins). The keys and who may read
//! them are the multi-read's (`GET /v1/counters`): the same parsing, limit
//! and key roles.
//!
//! How a change is found: per tenant, one poller reads every key its
//! streams watch (in reads of [`MAX_KEYS`]) once per interval, and hands
//! each stream watching a key whose counter changed the new entry.
//! - On the embedded store it reads only after the tenant's writes moved
//!   ([`crate::pipeline::Pipeline::changes`], bumped once a write is
//!   answered): idle streams cost no reads.
//! - On a store others write too (Elasticsearch: every gateway of the
//!   cluster) it reads every interval, one `_mget` of up to 1,000 watched
//!   keys per interval and tenant, so writes through other gateways arrive.
//!
//! Bounds: at most `--max-streams` streams (refused with 503 beyond); per
//! stream at most [`MAX_GET_KEYS`] keys and one pending update per key (a
//! newer one replaces it); a stream that has not taken its updates for
//! [`StreamConfig::stall`] (its reader stopped reading, and the buffers on
//! the way are full) is ended and counted, never buffered further.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, HeaderValue, Uri};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};

use super::access::CounterReader;
use super::multiread::{entry_json, keys_of_query, public_cors, MAX_GET_KEYS, MAX_KEYS};
use super::Gateway;
use crate::domain::{Counter, CounterKey};
use crate::error::ApiError;
use crate::tenant::{AppState, Tenants};

/// Default of `--stream-interval`.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);
/// Default of `--max-streams`.
pub const DEFAULT_MAX_STREAMS: usize = 10_000;
/// A comment line this often on an idle stream: proxies commonly cut a
/// response silent for 30 to 60 seconds.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// How long a browser waits before reconnecting a stream that ended.
const RETRY: Duration = Duration::from_secs(3);

/// How the live streams are run; see `--help` of `serve`.
#[derive(Clone, Debug)]
pub struct StreamConfig {
    /// Shortest time between two events of one key, and the poll period.
    pub interval: Duration,
    /// Most streams open at once, over every tenant.
    pub max_streams: usize,
    /// A comment line after this long without an event.
    pub keep_alive: Duration,
    /// A stream whose reader took nothing for this long while an update
    /// waited is ended (a slow reader).
    pub stall: Duration,
}

impl Default for StreamConfig {
    fn default() -> Self {
        StreamConfig {
            interval: DEFAULT_INTERVAL,
            max_streams: DEFAULT_MAX_STREAMS,
            keep_alive: KEEP_ALIVE,
            stall: 2 * KEEP_ALIVE,
        }
    }
}

/// Every live stream of a gateway: the bound, the watched keys per tenant,
/// and the end at shutdown.
pub struct Streams {
    config: StreamConfig,
    permits: Arc<Semaphore>,
    closed: watch::Sender<bool>,
    /// Watched keys by tenant; an entry lives while the tenant has streams.
    tenants: Mutex<HashMap<String, Arc<Watched>>>,
    epoch: Instant,
    refused: AtomicU64,
    dropped: AtomicU64,
    reads: AtomicU64,
}

impl Default for Streams {
    fn default() -> Self {
        Streams::new(StreamConfig::default())
    }
}

impl Streams {
    pub fn new(config: StreamConfig) -> Streams {
        Streams {
            permits: Arc::new(Semaphore::new(config.max_streams)),
            config,
            closed: watch::Sender::new(false),
            tenants: Mutex::default(),
            epoch: Instant::now(),
            refused: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            reads: AtomicU64::new(0),
        }
    }

    /// Ends every stream (after its pending events) and refuses new ones:
    /// at shutdown, before the server waits for its connections to close.
    pub fn close(&self) {
        self.closed.send_replace(true);
    }

    /// Streams open now.
    pub fn open(&self) -> usize {
        self.config.max_streams - self.permits.available_permits()
    }

    /// The streams' lines of `/metrics`.
    pub fn render_metrics(&self) -> String {
        let mut out = String::new();
        for (name, kind, help, value) in [
            (
                "counter_gateway_streams_open",
                "gauge",
                "Live streams (GET /v1/stream) open now (bounded by --max-streams).",
                self.open() as u64,
            ),
            (
                "counter_gateway_streams_refused_total",
                "counter",
                "Live streams refused with 503 because --max-streams were open.",
                self.refused.load(Relaxed),
            ),
            (
                "counter_gateway_streams_dropped_total",
                "counter",
                "Live streams ended because their reader stopped taking events (slow readers).",
                self.dropped.load(Relaxed),
            ),
            (
                "counter_gateway_stream_reads_total",
                "counter",
                "Reads of watched counters by the streams' pollers (one per 1,000 keys).",
                self.reads.load(Relaxed),
            ),
        ] {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
            ));
        }
        out
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Watches `keys` of `tenant` for a new stream; starts the tenant's
    /// poller with its first stream.
    fn register(
        self: &Arc<Self>,
        tenants: &Arc<Tenants>,
        tenant: &str,
        app: &AppState,
        keys: &[CounterKey],
    ) -> Registration {
        let mut all = self.tenants.lock().expect("streams lock");
        let watched = match all.get(tenant) {
            Some(w) => w.clone(),
            None => {
                let w = Arc::new(Watched::default());
                all.insert(tenant.to_string(), w.clone());
                // What the first stream's own first read covers: the poller
                // reads only after the tenant's writes move from here.
                let read = (store_id(app), app.pipeline.changes());
                tokio::spawn(poll(
                    self.clone(),
                    tenants.clone(),
                    tenant.to_string(),
                    w.clone(),
                    read,
                ));
                w
            }
        };
        let mut state = watched.state.lock().expect("watched lock");
        let slot = Arc::new(Slot {
            pending: Mutex::new(vec![None; keys.len()]),
            notify: Notify::new(),
            taken_ms: AtomicU64::new(self.now_ms()),
            dropped: AtomicBool::new(false),
        });
        for (pos, key) in keys.iter().enumerate() {
            state
                .keys
                .entry(key.clone())
                .or_default()
                .watchers
                .push((slot.clone(), pos));
        }
        state.streams += 1;
        drop(state);
        Registration {
            streams: self.clone(),
            tenant: tenant.to_string(),
            watched,
            slot,
            keys: keys.to_vec(),
        }
    }
}

/// One tenant's watched keys.
#[derive(Default)]
struct Watched {
    state: Mutex<WatchState>,
}

#[derive(Default)]
struct WatchState {
    keys: HashMap<CounterKey, KeyWatch>,
    streams: usize,
}

#[derive(Default)]
struct KeyWatch {
    /// The fingerprint of the counter the last poll read; `None` before.
    seen: Option<u64>,
    /// Each stream watching the key, with the key's place in its list.
    watchers: Vec<(Arc<Slot>, usize)>,
}

/// What a poll hands a stream: the key's new entry, once per changed key,
/// shared by every stream watching it.
#[derive(Clone)]
struct Update {
    fingerprint: u64,
    json: Arc<str>,
}

/// A stream's mailbox: at most one update per key (a newer one replaces an
/// untaken one), so a stream never holds more than its keys' entries.
struct Slot {
    pending: Mutex<Vec<Option<Update>>>,
    notify: Notify,
    /// When the response last took an event ([`Streams::now_ms`]).
    taken_ms: AtomicU64,
    /// Ended as a slow reader.
    dropped: AtomicBool,
}

impl Slot {
    /// Leaves `update` for the key at `pos`; `false` when the stream is
    /// found stalled (an update still untaken and nothing taken for
    /// `stall`) and ended instead.
    fn put(&self, pos: usize, update: Update, now_ms: u64, stall: Duration) -> bool {
        if self.dropped.load(Relaxed) {
            return true;
        }
        let mut pending = self.pending.lock().expect("slot lock");
        let waiting = pending.iter().any(Option::is_some);
        let idle_ms = now_ms.saturating_sub(self.taken_ms.load(Relaxed));
        if waiting && u128::from(idle_ms) > stall.as_millis() {
            pending.iter_mut().for_each(|p| *p = None);
            self.dropped.store(true, Relaxed);
            drop(pending);
            self.notify.notify_one();
            return false;
        }
        pending[pos] = Some(update);
        drop(pending);
        self.notify.notify_one();
        true
    }
}

/// A stream's place among the watchers; dropped with the response.
struct Registration {
    streams: Arc<Streams>,
    tenant: String,
    watched: Arc<Watched>,
    slot: Arc<Slot>,
    keys: Vec<CounterKey>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut all = self.streams.tenants.lock().expect("streams lock");
        let mut state = self.watched.state.lock().expect("watched lock");
        for key in &self.keys {
            if let Some(kw) = state.keys.get_mut(key) {
                kw.watchers.retain(|(s, _)| !Arc::ptr_eq(s, &self.slot));
                if kw.watchers.is_empty() {
                    state.keys.remove(key);
                }
            }
        }
        state.streams -= 1;
        if state.streams == 0 {
            // Its poller sees no streams left and stops; a later stream of
            // the tenant starts afresh.
            if all
                .get(&self.tenant)
                .is_some_and(|w| Arc::ptr_eq(w, &self.watched))
            {
                all.remove(&self.tenant);
            }
        }
    }
}

/// A counter's fingerprint: what an event shows of it (found, value,
/// category, timestamps). Equal fingerprints: no event.
fn fingerprint(counter: Option<&Counter>) -> u64 {
    let mut h = DefaultHasher::new();
    match counter {
        None => 0u8.hash(&mut h),
        Some(c) => {
            1u8.hash(&mut h);
            c.value.hash(&mut h);
            c.category.hash(&mut h);
            c.first_ms.hash(&mut h);
            c.recorded_ms.hash(&mut h);
        }
    }
    h.finish()
}

/// The identity of a tenant's store: another one (the tenant was opened or
/// reopened since) is read again.
fn store_id(app: &AppState) -> usize {
    Arc::as_ptr(&app.store).cast::<()>() as usize
}

/// The poller of one tenant's streams; stops once the tenant has none.
/// `read`: the store and write count its streams' first reads covered.
async fn poll(
    streams: Arc<Streams>,
    tenants: Arc<Tenants>,
    tenant: String,
    watched: Arc<Watched>,
    read: (usize, u64),
) {
    let period = streams.config.interval;
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut closed = streams.closed.subscribe();
    // The store read last and the tenant's write count before that read.
    let mut last = read;
    // A store whose writes are not this process's alone (its writes are no
    // local blocking calls: Elasticsearch, which every gateway of the
    // cluster writes) is read every interval. Every tenant's store is of
    // the default's kind.
    let shared = tenants.default_tenant().store.blocking_writes().is_none();
    // On such a store, how a tenant that is not open here is read.
    let mut read_through = None;
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = closed.wait_for(|c| *c) => return,
        }
        if watched.state.lock().expect("watched lock").streams == 0 {
            return;
        }
        let app = match tenants.open_app(&tenant) {
            Some(app) => app,
            // An embedded tenant that is not open: nothing changes it until
            // a write opens it (a new store, read then).
            None if !shared => continue,
            None => match &read_through {
                Some(app) => Arc::clone(app),
                None => match tenants.reader(&tenant).await {
                    Ok(app) => read_through.insert(app).clone(),
                    Err(e) => {
                        tracing::debug!(%tenant, error = %e, "live streams: the tenant cannot be read now");
                        continue;
                    }
                },
            },
        };
        let changes = app.pipeline.changes();
        let store = store_id(&app);
        if !shared && last == (store, changes) {
            continue;
        }
        let keys: Vec<CounterKey> = {
            let state = watched.state.lock().expect("watched lock");
            state.keys.keys().cloned().collect()
        };
        let mut values = Vec::with_capacity(keys.len());
        let mut failed = false;
        for chunk in keys.chunks(MAX_KEYS) {
            streams.reads.fetch_add(1, Relaxed);
            match app.store.get_many(chunk).await {
                Ok(found) if found.len() == chunk.len() => values.extend(found),
                Ok(found) => {
                    tracing::warn!(
                        asked = chunk.len(),
                        answered = found.len(),
                        "live streams: the store answered another number of counters"
                    );
                    failed = true;
                    break;
                }
                Err(e) => {
                    // Read again at the next interval: `last` stays.
                    tracing::warn!(%tenant, error = %e, "live streams: reading the watched counters failed");
                    failed = true;
                    break;
                }
            }
        }
        if failed {
            continue;
        }
        last = (store, changes);
        let now_ms = streams.now_ms();
        let mut state = watched.state.lock().expect("watched lock");
        for (key, value) in keys.iter().zip(&values) {
            let Some(kw) = state.keys.get_mut(key) else {
                continue;
            };
            let fp = fingerprint(value.as_ref());
            if kw.seen == Some(fp) {
                continue;
            }
            kw.seen = Some(fp);
            let update = Update {
                fingerprint: fp,
                json: entry_json(key, value.as_ref()).into(),
            };
            // A stream that joined while this poll read may get an entry
            // older than its own first read: the write between the two
            // moved the tenant's write count, so the next poll sends the
            // newer one, within an interval.
            for (slot, pos) in &kw.watchers {
                if !slot.put(*pos, update.clone(), now_ms, streams.config.stall) {
                    streams.dropped.fetch_add(1, Relaxed);
                    tracing::info!(%tenant, "live streams: a stream's reader stopped taking events; the stream is ended");
                }
            }
        }
    }
}

/// What a waiting stream woke up for.
enum Wake {
    Closing,
    Updates,
    Silence,
}

/// One response's stream of events.
struct Live {
    streams: Arc<Streams>,
    slot: Arc<Slot>,
    _registration: Registration,
    _permit: OwnedSemaphorePermit,
    /// The fingerprint of what was sent last, per key.
    sent: Vec<u64>,
    ready: VecDeque<Event>,
    seq: u64,
    closed: watch::Receiver<bool>,
    ending: bool,
}

impl Live {
    fn counter(&mut self, json: &str) -> Event {
        self.seq += 1;
        Event::default()
            .event("counter")
            .id(self.seq.to_string())
            .data(json)
    }

    /// The next event, waiting for one (or a keep-alive) as long as needed;
    /// `None` ends the response.
    async fn next(mut self) -> Option<(Result<Event, Infallible>, Live)> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                self.slot.taken_ms.store(self.streams.now_ms(), Relaxed);
                return Some((Ok(event), self));
            }
            if self.ending || self.slot.dropped.load(Relaxed) {
                return None;
            }
            let keep_alive = self.streams.config.keep_alive;
            let slot = self.slot.clone();
            let woke = tokio::select! {
                _ = self.closed.wait_for(|c| *c) => Wake::Closing,
                () = slot.notify.notified() => Wake::Updates,
                () = tokio::time::sleep(keep_alive) => Wake::Silence,
            };
            match woke {
                Wake::Closing => {
                    self.ending = true;
                    self.ready
                        .push_back(Event::default().comment("the gateway is shutting down"));
                }
                Wake::Updates => self.take(),
                Wake::Silence => self.ready.push_back(Event::default().comment("keep-alive")),
            }
        }
    }

    /// Turns the slot's updates into events, skipping what was sent already.
    fn take(&mut self) {
        let updates: Vec<(usize, Update)> = {
            let mut pending = self.slot.pending.lock().expect("slot lock");
            pending
                .iter_mut()
                .enumerate()
                .filter_map(|(pos, u)| u.take().map(|u| (pos, u)))
                .collect()
        };
        for (pos, u) in updates {
            if self.sent[pos] != u.fingerprint {
                self.sent[pos] = u.fingerprint;
                let event = self.counter(&u.json);
                self.ready.push_back(event);
            }
        }
    }
}

#[utoipa::path(get, path = "/v1/stream",
    summary = "Live values of up to 100 counters (Server-Sent Events): each one's current value at once, then its new value after each change, at most one event per counter per --stream-interval",
    description = "Events: `counter`, whose data is the counter as the multi-read (GET /v1/counters) answers it, `found: false` and value 0 for one never counted or deleted; `id` numbers the events of one stream. Comment lines (`: keep-alive`) every 15 s of silence. On Elasticsearch the counters are read every interval, so writes through other gateways arrive too. The stream ends at shutdown (browsers reconnect after `retry`).",
    params(("keys" = String, Query, description = "entity/action/uuid of each counter, separated by commas, each part percent-encoded (a / or , inside a part as %2F, %2C); at most 100 keys; a repeated key is streamed once")),
    security(("bearer" = ["public"]), ("key" = ["public"])),
    responses((status = 200, description = "An event stream, open until the client or the gateway ends it", content((String = "text/event-stream")), headers(
            ("Cache-Control" = String, description = "no-cache"),
            ("X-Accel-Buffering" = String, description = "no: proxies that buffer answers (nginx) pass each event at once"))),
        (status = 503, description = "--max-streams streams are open, or the gateway is shutting down (with Retry-After)")))]
pub async fn get(
    reader: CounterReader,
    State(gw): State<Arc<Gateway>>,
    uri: Uri,
) -> Result<Response, ApiError> {
    let mut keys = keys_of_query(uri.query(), false)?;
    let mut seen = std::collections::HashSet::new();
    keys.retain(|k| seen.insert(k.clone()));
    debug_assert!(keys.len() <= MAX_GET_KEYS);
    let streams = &gw.streams;
    if *streams.closed.borrow() {
        return Err(ApiError::Unavailable(
            "the gateway is shutting down; retry on another instance".into(),
        ));
    }
    let permit = streams.permits.clone().try_acquire_owned().map_err(|_| {
        streams.refused.fetch_add(1, Relaxed);
        ApiError::Unavailable(format!(
            "this gateway serves at most {} live streams at once (--max-streams); retry later",
            streams.config.max_streams
        ))
    })?;
    // Watched before the first read: a write answered after that read is
    // seen by the poller, never lost between the two.
    let registration = streams.register(&gw.tenants, &reader.tenant, &reader.app, &keys);
    let found = reader.app.store.get_many(&keys).await?;
    if found.len() != keys.len() {
        return Err(ApiError::Internal(format!(
            "the store answered {} counters for {} keys",
            found.len(),
            keys.len()
        )));
    }
    let mut live = Live {
        streams: streams.clone(),
        slot: registration.slot.clone(),
        _registration: registration,
        _permit: permit,
        sent: found.iter().map(|c| fingerprint(c.as_ref())).collect(),
        ready: VecDeque::with_capacity(keys.len() + 1),
        seq: 0,
        closed: streams.closed.subscribe(),
        ending: false,
    };
    live.ready.push_back(Event::default().retry(RETRY));
    for (key, counter) in keys.iter().zip(&found) {
        let event = live.counter(&entry_json(key, counter.as_ref()));
        live.ready.push_back(event);
    }
    let body = futures_util::stream::unfold(live, Live::next);
    let mut res = Sse::new(body).into_response();
    let h = res.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    if reader.public {
        public_cors(h);
    }
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(fp: u64) -> Update {
        Update {
            fingerprint: fp,
            json: "{}".into(),
        }
    }

    fn slot(taken_ms: u64) -> Slot {
        Slot {
            pending: Mutex::new(vec![None, None]),
            notify: Notify::new(),
            taken_ms: AtomicU64::new(taken_ms),
            dropped: AtomicBool::new(false),
        }
    }

    #[test]
    fn a_newer_update_replaces_an_untaken_one() {
        let s = slot(0);
        let stall = Duration::from_secs(30);
        assert!(s.put(0, update(1), 1_000, stall));
        assert!(s.put(0, update(2), 2_000, stall));
        assert!(s.put(1, update(3), 3_000, stall));
        let p = s.pending.lock().unwrap();
        let fps: Vec<Option<u64>> = p
            .iter()
            .map(|u| u.as_ref().map(|u| u.fingerprint))
            .collect();
        assert_eq!(fps, [Some(2), Some(3)]);
    }

    #[test]
    fn a_reader_that_took_nothing_for_the_stall_time_is_dropped() {
        let stall = Duration::from_secs(30);
        // Nothing waiting: however long since the last event, it is kept.
        let idle = slot(0);
        assert!(idle.put(0, update(1), 100_000, stall));
        assert!(!idle.dropped.load(Relaxed));
        // An update waiting and nothing taken for longer than the stall.
        let stalled = slot(0);
        assert!(stalled.put(0, update(1), 1_000, stall));
        assert!(!stalled.put(1, update(2), 31_001, stall));
        assert!(stalled.dropped.load(Relaxed));
        assert!(stalled.pending.lock().unwrap().iter().all(Option::is_none));
        // Taken recently: kept.
        let busy = slot(20_000);
        assert!(busy.put(0, update(1), 21_000, stall));
        assert!(busy.put(0, update(2), 31_001, stall));
        assert!(!busy.dropped.load(Relaxed));
    }

    #[test]
    fn fingerprints_follow_what_an_event_shows() {
        let key = CounterKey::new("A", "V", "x").unwrap();
        let c = Counter {
            key,
            value: 1,
            category: None,
            first_ms: 10,
            recorded_ms: 20,
        };
        let base = fingerprint(Some(&c));
        assert_ne!(base, fingerprint(None));
        for changed in [
            Counter {
                value: 2,
                ..c.clone()
            },
            Counter {
                category: Some("k".into()),
                ..c.clone()
            },
            Counter {
                recorded_ms: 21,
                ..c.clone()
            },
        ] {
            assert_ne!(base, fingerprint(Some(&changed)));
        }
        assert_eq!(base, fingerprint(Some(&c.clone())));
    }
}
