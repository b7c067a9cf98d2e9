//! The flusher: gathers submissions into batches and applies them; the
//! syncer beside it makes applied batches durable and only then answers.
//!
//! The two run concurrently, so batch N+1 is written while batch N is being
//! fsync'd, and one fsync covers every batch applied before it started.
//!
//! One flush cycle ([`flush_while_busy`]: collect until a deadline, apply,
//! hand the answers to the syncer) and one shutdown (a close takes what is
//! still queued; every flush started is finished and answered before the
//! flusher stops), run through one of two [`Writer`]s:
//! - [`run`]: the store's async `apply` and `sync`, each flush a task (the
//!   Elasticsearch store, whose writes are requests over the network). Up to
//!   [`Store::bulks_in_flight`] flushes apply at once, no counter in two of
//!   them (see [`Queue`]).
//! - [`run_blocking`]: a store whose writes are local blocking calls (the
//!   embedded store, [`BlockingWrites`]), one flush at a time. While
//!   submissions keep coming, the flusher and the syncer each stay on one
//!   blocking thread and hand work to each other directly: no task spawned
//!   and no thread woken per flush beyond the one that waits for the work
//!   (measured in scripts/bench/README.md: each wake-up of a thread costs
//!   tens of microseconds of CPU on a virtual machine). A busy period ends
//!   when no submission has come for [`LINGER`]; the threads go back to the
//!   pool.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};
use tokio::task::{JoinHandle, JoinSet};

use super::{Applied, Held, Message, PipelineConfig, Submission, SubmitError};
use crate::domain::CounterKey;
use crate::metrics::Metrics;
use crate::store::{BatchOutcome, BlockingWrites, RequestOutcome, Store, StoreError, WriteBatch};

/// How long the flusher's thread waits for a submission before a busy
/// period ends (and its thread goes back to the pool).
const LINGER: Duration = Duration::from_millis(50);

pub(super) async fn run(
    store: Arc<dyn Store>,
    mut rx: mpsc::UnboundedReceiver<Message>,
    config: Arc<PipelineConfig>,
    metrics: Arc<Metrics>,
) {
    let (to_syncer, syncer_rx) = mpsc::unbounded_channel();
    let syncer = tokio::spawn(sync_loop(store.clone(), syncer_rx));
    let mut writer = AsyncWriter {
        limit: store.bulks_in_flight().max(1),
        store,
        to_syncer,
        running: JoinSet::new(),
    };
    flush_while_busy(&mut rx, None, None, &config, &metrics, &mut writer).await;
    // The syncer ends once it answered every flush handed to it.
    drop(writer);
    let _ = syncer.await;
    tracing::debug!("flusher stopped");
}

/// [`run`] for a store with blocking writes: waits for a submission here,
/// then runs a busy period ([`busy`]) on a blocking thread.
pub(super) async fn run_blocking(
    writes: Arc<dyn BlockingWrites>,
    mut rx: mpsc::UnboundedReceiver<Message>,
    config: Arc<PipelineConfig>,
    metrics: Arc<Metrics>,
) {
    let handle = Handle::current();
    let mut syncers: Vec<JoinHandle<()>> = Vec::new();
    loop {
        let Some(first) = rx.recv().await else { break };
        let (w, c, m, h) = (
            writes.clone(),
            config.clone(),
            metrics.clone(),
            handle.clone(),
        );
        let period = tokio::task::spawn_blocking(move || busy(w, rx, first, &c, &m, &h)).await;
        let Ok(period) = period else {
            // A panic in the store: its submissions get their replies
            // dropped (answered as "shutting down"), nothing more is taken.
            tracing::error!("the flusher's thread panicked; the pipeline stops");
            break;
        };
        rx = period.rx;
        syncers.retain(|s| !s.is_finished());
        syncers.push(period.syncer);
        if period.end == End::Ended {
            break;
        }
    }
    for s in syncers {
        let _ = s.await;
    }
    tracing::debug!("flusher stopped");
}

/// What a busy period hands back: the queue, its syncer (still answering
/// the last flushes), and how it ended.
struct Period {
    rx: mpsc::UnboundedReceiver<Message>,
    syncer: JoinHandle<()>,
    end: End,
}

/// Flushes as long as submissions come, starting with `first`, on this
/// (blocking) thread, with a syncer on another for the same time.
fn busy(
    writes: Arc<dyn BlockingWrites>,
    mut rx: mpsc::UnboundedReceiver<Message>,
    first: Message,
    config: &PipelineConfig,
    metrics: &Metrics,
    handle: &Handle,
) -> Period {
    let (to_syncer, syncer_rx) = std::sync::mpsc::channel::<Vec<Answer>>();
    let w = writes.clone();
    let gate = Arc::new(SyncGate::default());
    let g = gate.clone();
    let syncer = handle.spawn_blocking(move || {
        // However the syncer ends (a panic in the store's sync too), the
        // flusher is never left waiting for it.
        let _open = OpenOnExit(g.clone());
        while let Ok(first) = syncer_rx.recv() {
            let answers = with_the_rest(first, || syncer_rx.try_recv().ok());
            // Taken before the sync starts: the flusher may apply the
            // next flush while this one syncs.
            g.taken();
            answer(w.sync(), answers);
        }
    });
    let mut writer = BlockingWriter {
        writes,
        to_syncer,
        done: None,
        gate,
    };
    // The store's writes are blocking calls: they run on this thread,
    // inside the one future the cycle is.
    let end = handle.block_on(flush_while_busy(
        &mut rx,
        Some(first),
        Some(LINGER),
        config,
        metrics,
        &mut writer,
    ));
    // The syncer ends with its channel, once it answered what it holds.
    drop(writer);
    Period { rx, syncer, end }
}

/// How a run of flush cycles ended.
#[derive(Debug, PartialEq, Eq)]
enum End {
    /// No submission came for the linger time; more may come later.
    Idle,
    /// The pipeline closed, or every handle to it was dropped.
    Ended,
}

/// How the flusher applies flushes and hands their answers on.
trait Writer {
    /// Most flushes applying at once.
    fn limit(&self) -> usize;
    /// Whether a flush started when none runs waits for the clients the
    /// last one answered (see [`Wave`]). Worth it where a flush is a round
    /// trip whose cost grows slower than its size (a bulk request); not for
    /// the embedded store, whose flushes are cheap and whose group commit
    /// already gathers what came during an fsync.
    fn gathers(&self) -> bool;
    /// Flushes started and not yet taken back by [`Writer::next_done`].
    fn running(&self) -> usize;
    fn start(&mut self, flush: Flush);
    /// The next started flush to end (`Err`: its task panicked). Only
    /// called while one runs.
    async fn next_done(&mut self) -> Result<Done, String>;
    /// Gives the syncer a flush's answers, to send once it is durable.
    fn hand_off(&mut self, answers: Vec<Answer>);
    /// Whether a flush may start now as far as the syncer goes (see
    /// [`SyncGate`]); [`Writer::synced`] waits until it may.
    fn may_start(&self) -> bool {
        true
    }
    async fn synced(&mut self) {}
}

/// At most one applied flush waits for the syncer to start its sync.
///
/// Under load, submissions trickle in one by one while the syncer's fsync
/// runs, and a flusher that applied whatever was queued as soon as it was
/// free made mostly flushes of one increment (62 % of them, measured at
/// 256 connections), each a transaction of its own, all covered by the
/// same next fsync. Holding them until the syncer takes the flush already
/// waiting for it gathers everything that came during one fsync into one
/// flush: one flush per fsync, still applied while the previous fsync
/// runs, and no acknowledgement sooner than its own sync.
#[derive(Default)]
struct SyncGate {
    /// Flushes handed to the syncer whose sync has not started.
    waiting: std::sync::atomic::AtomicUsize,
    /// Wakes the flusher when the syncer takes them.
    taken: tokio::sync::Notify,
    /// The syncer's thread ended: nothing waits for it any more.
    ended: std::sync::atomic::AtomicBool,
}

impl SyncGate {
    fn handed(&self) {
        self.waiting
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// The syncer took every flush handed to it so far.
    fn taken(&self) {
        self.waiting.store(0, std::sync::atomic::Ordering::Release);
        self.taken.notify_one();
    }

    fn open(&self) -> bool {
        self.ended.load(std::sync::atomic::Ordering::Acquire)
            || self.waiting.load(std::sync::atomic::Ordering::Acquire) == 0
    }
}

/// Opens the gate for good when the syncer's thread ends, as a panic
/// unwinds too: what the flusher then hands off is dropped with the
/// channel, its requests answered "shutting down", as before the gate.
struct OpenOnExit(Arc<SyncGate>);

impl Drop for OpenOnExit {
    fn drop(&mut self) {
        self.0
            .ended
            .store(true, std::sync::atomic::Ordering::Release);
        self.0.taken.notify_one();
    }
}

/// A flush applied: its result, and what waits on it.
struct Done {
    result: Result<BatchOutcome, StoreError>,
    took: Duration,
    waiting: Waiters,
}

/// The store's async writes: each flush a task, up to `limit` at once.
struct AsyncWriter {
    store: Arc<dyn Store>,
    to_syncer: mpsc::UnboundedSender<Vec<Answer>>,
    limit: usize,
    running: JoinSet<Done>,
}

impl Writer for AsyncWriter {
    fn limit(&self) -> usize {
        self.limit
    }

    fn gathers(&self) -> bool {
        true
    }

    fn running(&self) -> usize {
        self.running.len()
    }

    fn start(&mut self, flush: Flush) {
        let store = self.store.clone();
        self.running.spawn(async move {
            // Tokio's clock, which a test can pause (the wait for a wave
            // is measured from it); the same as std's otherwise.
            let started = tokio::time::Instant::now();
            let result = store.apply(flush.batch).await;
            Done {
                result,
                took: started.elapsed(),
                waiting: flush.waiting,
            }
        });
    }

    async fn next_done(&mut self) -> Result<Done, String> {
        match self.running.join_next().await {
            Some(Ok(done)) => Ok(done),
            Some(Err(e)) => Err(e.to_string()),
            None => Err("no flush was running".into()),
        }
    }

    fn hand_off(&mut self, answers: Vec<Answer>) {
        // The syncer outlives this writer, so the send cannot fail.
        let _ = self.to_syncer.send(answers);
    }
}

/// The store's blocking writes, on the busy period's thread: a flush is
/// applied as it starts.
struct BlockingWriter {
    writes: Arc<dyn BlockingWrites>,
    to_syncer: std::sync::mpsc::Sender<Vec<Answer>>,
    done: Option<Done>,
    gate: Arc<SyncGate>,
}

impl Writer for BlockingWriter {
    fn limit(&self) -> usize {
        1
    }

    fn gathers(&self) -> bool {
        false
    }

    fn running(&self) -> usize {
        usize::from(self.done.is_some())
    }

    fn start(&mut self, flush: Flush) {
        let started = Instant::now();
        let result = self.writes.apply(flush.batch);
        self.done = Some(Done {
            result,
            took: started.elapsed(),
            waiting: flush.waiting,
        });
    }

    async fn next_done(&mut self) -> Result<Done, String> {
        self.done
            .take()
            .ok_or_else(|| "no flush was running".into())
    }

    fn hand_off(&mut self, answers: Vec<Answer>) {
        // Counted before it is sent: the syncer's `taken` comes after.
        self.gate.handed();
        // The syncer lives as long as its receiver, to the end of this
        // period: the send cannot fail.
        let _ = self.to_syncer.send(answers);
        // While the syncer fsyncs: the answers do not wait for it.
        self.writes.after_apply();
    }

    fn may_start(&self) -> bool {
        self.gate.open()
    }

    async fn synced(&mut self) {
        // A `taken` between the check and the wait leaves a permit: no
        // wake-up is lost.
        while !self.gate.open() {
            self.gate.taken.notified().await;
        }
    }
}

/// The flush cycle, as long as submissions come: collect (from `first`,
/// or the next one queued) until the flush interval's deadline or a full
/// batch, start the flush, hand its answers off once it is applied. With
/// `linger`, returns [`End::Idle`] when no submission came for that long
/// and nothing runs. A close takes everything still queued (accepted, so
/// flushed) and ends once every flush started has been handed off.
///
/// With more than one flush at a time ([`Writer::limit`]), a new flush
/// starts while others run, but no sooner after the last start than the
/// last flush took divided by the limit: the flushes are spread over a
/// flush's time and each gathers about as much, instead of many small
/// ones. The [`Queue`] keeps each counter in one running flush at most.
async fn flush_while_busy(
    rx: &mut mpsc::UnboundedReceiver<Message>,
    first: Option<Message>,
    linger: Option<Duration>,
    config: &PipelineConfig,
    metrics: &Metrics,
    writer: &mut impl Writer,
) -> End {
    let mut queue = Queue::new(writer.limit() > 1);
    let mut closing = false;
    let mut last = Pace::default();
    if let Some(msg) = first {
        closing = queue.push(msg, rx);
    }
    let limit = writer.limit();
    loop {
        let running = writer.running();
        let paced = running == 0 || Instant::now() >= last.next(limit);
        if running == 0 && queue.has_ready() && !writer.may_start() {
            // Only the gate: what comes meanwhile is taken with the rest
            // once it opens, without waking this thread per submission.
            writer.synced().await;
            continue;
        }
        if running < limit && paced && queue.has_ready() {
            let until = tokio::time::Instant::now() + config.flush_interval;
            // A wave comes back once: the next flush takes it.
            let wave = (running == 0 && writer.gathers())
                .then(|| std::mem::take(&mut last.answered))
                .and_then(|answered| last.wave(answered));
            closing = queue.collect(rx, config, until, wave, closing).await;
            if let Some(flush) = queue.next_flush(config, closing) {
                last.started = Some(Instant::now());
                writer.start(flush);
            }
            continue;
        }
        if running == 0 {
            if closing {
                debug_assert!(queue.is_empty(), "nothing waits once nothing runs");
                return End::Ended;
            }
            match next_message(rx, linger).await {
                Ok(msg) => closing = queue.push(msg, rx),
                Err(end) => return end,
            }
            continue;
        }
        let hold = (!paced && queue.has_ready()).then(|| last.next(limit));
        tokio::select! {
            biased;
            done = writer.next_done() => match done {
                Ok(done) => {
                    last.took = done.took;
                    last.answered = done.waiting.subs.len();
                    queue.release(&done.waiting.keys);
                    let answers = answers(done.result, done.waiting.subs, metrics, done.waiting.events, done.took);
                    writer.hand_off(answers);
                }
                Err(e) => {
                    // As a panic on the blocking path: what is queued is
                    // dropped (answered "shutting down"); what runs is
                    // finished and answered.
                    tracing::error!(error = %e, "a flush panicked; the pipeline stops");
                    drop(std::mem::replace(&mut queue, Queue::new(false)));
                    rx.close();
                    closing = true;
                }
            },
            msg = rx.recv(), if !closing && running < limit => match msg {
                Some(msg) => closing = queue.push(msg, rx),
                None => closing = true,
            },
            _ = tokio::time::sleep_until(hold.unwrap_or_else(Instant::now).into()), if hold.is_some() => {}
        }
    }
}

/// When the last flush started, how long the last one to end took, and
/// how many requests it answered.
#[derive(Default)]
struct Pace {
    started: Option<Instant>,
    took: Duration,
    answered: usize,
}

impl Pace {
    /// The wave of requests that `answered` answers will bring back, if
    /// more than one.
    fn wave(&self, answered: usize) -> Option<Wave> {
        (answered > 1).then(|| Wave {
            requests: answered,
            until: tokio::time::Instant::now() + (self.took / 2).min(WAVE_MAX_WAIT),
        })
    }

    /// The earliest start of the next flush while others run.
    fn next(&self, limit: usize) -> Instant {
        let spread = self.took / u32::try_from(limit).unwrap_or(u32::MAX).max(1);
        self.started.map_or_else(Instant::now, |s| s + spread)
    }
}

/// The longest a flush waits for a wave ([`Wave`]), however long the last
/// flush took.
const WAVE_MAX_WAIT: Duration = Duration::from_millis(100);
/// A wave has ended when no request came for this long: more than a
/// scheduler's time slice on a machine whose cores are busy (measured
/// under load: 2 ms cut waves short).
const WAVE_GAP: Duration = Duration::from_millis(5);

/// The clients a flush answered, coming back.
///
/// Under load most requests wait in their flush, and a client sends its
/// next request once answered. Started at once, the next flush would take
/// only the few requests that came while the last one ran, and the many it
/// answered would arrive during that small flush: flushes alternate large
/// and small (measured on a real node at 2,048 connections: about 1,700
/// and 100-300 bulk items), and each small one costs a round trip and
/// coalesces little. Waiting only until as many requests are ready as the
/// last flush answered is not enough: those that came during it count too,
/// and flushes settle into a milder alternation (measured: about 1,300 and
/// 800 items). So a flush started when none runs waits until the requests
/// ready when it started plus as many as the last flush answered are
/// ready, until none came for [`WAVE_GAP`], or for half the last flush's
/// time at most ([`WAVE_MAX_WAIT`] at most): a lone client waits one gap,
/// never more; steady traffic that does not wait for its answers (beacons)
/// makes a flush wait for the same number of new requests, which is
/// coalescing at no more than half a flush's time.
#[derive(Clone, Copy, Debug)]
struct Wave {
    /// How many requests it brings back.
    requests: usize,
    until: tokio::time::Instant,
}

/// The next message: one queued now, else one within `linger` (forever
/// without).
async fn next_message(
    rx: &mut mpsc::UnboundedReceiver<Message>,
    linger: Option<Duration>,
) -> Result<Message, End> {
    match rx.try_recv() {
        Ok(msg) => return Ok(msg),
        Err(mpsc::error::TryRecvError::Disconnected) => return Err(End::Ended),
        Err(mpsc::error::TryRecvError::Empty) => {}
    }
    let next = match linger {
        Some(linger) => match tokio::time::timeout(linger, rx.recv()).await {
            Ok(next) => next,
            Err(_) => return Err(End::Idle),
        },
        None => rx.recv().await,
    };
    next.ok_or(End::Ended)
}

/// The submissions taken from the channel and not yet in a flush.
///
/// When flushes run side by side (`tracked`), no counter is in two running
/// flushes: two bulks updating one document would conflict on it (each
/// re-run of the script by `retry_on_conflict` is another get and
/// reindex), and a flush's overflow check and its undo assume nothing else
/// moves its counters meanwhile. A submission touching a counter of a
/// running flush waits for it to end; so does any later submission sharing
/// a counter with a waiting one, so each counter's submissions are applied
/// in the order they came. Every submission holds its room in the queue's
/// bound while it waits, so the waiting are bounded too.
struct Queue {
    tracked: bool,
    /// Free to go into the next flush, in order.
    ready: VecDeque<Keyed>,
    /// Waiting for a running flush, in order.
    waiting: VecDeque<Keyed>,
    /// The counters of the running flushes.
    running: HashSet<CounterKey>,
    /// The counters of `waiting`, with how many of them touch each.
    reserved: HashMap<CounterKey, usize>,
}

/// A submission and its distinct counters (only when tracked).
struct Keyed {
    sub: Submission,
    keys: Vec<CounterKey>,
}

impl Queue {
    fn new(tracked: bool) -> Queue {
        Queue {
            tracked,
            ready: VecDeque::new(),
            waiting: VecDeque::new(),
            running: HashSet::new(),
            reserved: HashMap::new(),
        }
    }

    fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    fn is_empty(&self) -> bool {
        self.ready.is_empty() && self.waiting.is_empty()
    }

    /// Takes a message in; `true` for a close, which also takes in
    /// everything still queued (accepted, so flushed) and closes the channel.
    fn push(&mut self, msg: Message, rx: &mut mpsc::UnboundedReceiver<Message>) -> bool {
        match msg {
            Message::Submit(sub) => {
                let keys = if self.tracked {
                    let mut seen = HashSet::new();
                    sub.events
                        .iter()
                        .filter(|e| seen.insert(&e.key))
                        .map(|e| e.key.clone())
                        .collect()
                } else {
                    Vec::new()
                };
                self.place(Keyed { sub, keys });
                false
            }
            Message::Close => {
                rx.close();
                while let Ok(msg) = rx.try_recv() {
                    if let Message::Submit(sub) = msg {
                        self.push(Message::Submit(sub), rx);
                    }
                }
                true
            }
        }
    }

    /// Into `ready`, or into `waiting` if one of its counters is running or
    /// waiting already.
    fn place(&mut self, k: Keyed) {
        let blocked = k
            .keys
            .iter()
            .any(|key| self.running.contains(key) || self.reserved.contains_key(key));
        if blocked {
            for key in &k.keys {
                *self.reserved.entry(key.clone()).or_default() += 1;
            }
            self.waiting.push_back(k);
        } else {
            self.ready.push_back(k);
        }
    }

    /// A flush ended: its counters are free, and the submissions that
    /// waited only for it are ready, in their order.
    fn release(&mut self, keys: &[CounterKey]) {
        if !self.tracked || keys.is_empty() {
            return;
        }
        for key in keys {
            self.running.remove(key);
        }
        self.reserved.clear();
        for k in std::mem::take(&mut self.waiting) {
            self.place(k);
        }
    }

    /// Adds to `ready` whatever is queued, lingering until `until` (and
    /// for a `wave` while it comes), until the ready hold
    /// `max_batch_events`; returns `closing`, set when a close came.
    async fn collect(
        &mut self,
        rx: &mut mpsc::UnboundedReceiver<Message>,
        config: &PipelineConfig,
        until: tokio::time::Instant,
        wave: Option<Wave>,
        mut closing: bool,
    ) -> bool {
        let mut events: usize = self.ready.iter().map(|k| k.sub.events.len()).sum();
        let wave_ready = wave.map(|w| self.ready.len() + w.requests);
        while !closing && events < config.max_batch_events {
            let msg = match rx.try_recv() {
                Ok(msg) => msg,
                Err(mpsc::error::TryRecvError::Disconnected) => break,
                Err(mpsc::error::TryRecvError::Empty) => {
                    let now = tokio::time::Instant::now();
                    let deadline = match (wave, wave_ready) {
                        (Some(w), Some(wanted)) if self.ready.len() < wanted && now < w.until => {
                            until.max((now + WAVE_GAP).min(w.until))
                        }
                        _ if config.flush_interval.is_zero() => break,
                        _ => until,
                    };
                    match tokio::time::timeout_at(deadline, rx.recv()).await {
                        Ok(Some(msg)) => msg,
                        Ok(None) | Err(_) => break,
                    }
                }
            };
            let before = self.ready.len();
            closing = self.push(msg, rx);
            if self.ready.len() > before {
                events += self.ready.back().map_or(0, |k| k.sub.events.len());
            }
        }
        closing
    }

    /// The next flush: the ready submissions in order, up to
    /// `max_batch_events` (all of them at close). Its counters are running
    /// from now on; a ready submission left out that shares one waits.
    fn next_flush(&mut self, config: &PipelineConfig, closing: bool) -> Option<Flush> {
        let mut subs = Vec::new();
        let mut keys = Vec::new();
        let mut events = 0;
        while let Some(k) = self.ready.pop_front() {
            events += k.sub.events.len();
            subs.push(k.sub);
            keys.extend(k.keys);
            if !closing && events >= config.max_batch_events {
                break;
            }
        }
        if subs.is_empty() {
            return None;
        }
        if self.tracked {
            keys.sort_unstable();
            keys.dedup();
            self.running.extend(keys.iter().cloned());
            for k in std::mem::take(&mut self.ready) {
                self.place(k);
            }
        }
        Some(Flush::of(subs, keys, events))
    }
}

/// A submission's answer, decided by its flush, sent once the flush is
/// durable. It holds its room in the queue until then, so the bounds on
/// queued events and bytes cover these too.
struct Answer {
    reply: oneshot::Sender<Result<Applied, SubmitError>>,
    result: Result<Applied, SubmitError>,
    held: Held,
}

/// What a submission of a flush waits on.
struct Waiting {
    reply: oneshot::Sender<Result<Applied, SubmitError>>,
    /// The counter whose state after the flush it asked for.
    want: Option<CounterKey>,
    held: Held,
}

/// Who waits on a flush, in the order of its requests, and what it holds.
struct Waiters {
    subs: Vec<Waiting>,
    /// Its counters, when the [`Queue`] tracks them.
    keys: Vec<CounterKey>,
    events: usize,
}

/// A batch for the store, and who waits on it.
struct Flush {
    batch: WriteBatch,
    waiting: Waiters,
}

impl Flush {
    fn of(subs: Vec<Submission>, keys: Vec<CounterKey>, events: usize) -> Flush {
        let mut waiting = Vec::with_capacity(subs.len());
        let mut batch = WriteBatch {
            requests: Vec::with_capacity(subs.len()),
            wanted: Default::default(),
        };
        for s in subs {
            batch.requests.push(s.events);
            if let Some(k) = &s.want {
                batch.wanted.insert(k.clone());
            }
            waiting.push(Waiting {
                reply: s.reply,
                want: s.want,
                held: s.held,
            });
        }
        Flush {
            batch,
            waiting: Waiters {
                subs: waiting,
                keys,
                events,
            },
        }
    }
}

/// Each request's answer from the flush's result (given once durable).
fn answers(
    result: Result<BatchOutcome, StoreError>,
    waiting: Vec<Waiting>,
    metrics: &Metrics,
    increments: usize,
    took: Duration,
) -> Vec<Answer> {
    match result {
        Ok(mut out) => {
            metrics.record_flush(increments, out.store_writes, took);
            waiting
                .into_iter()
                .zip(out.requests.drain(..))
                .enumerate()
                .map(|(i, (w, outcome))| {
                    let result = match outcome {
                        RequestOutcome::Applied { duplicates } => Ok(Applied {
                            duplicates,
                            repeats: out.repeats.get(i).copied().unwrap_or(0),
                            counter: w.want.and_then(|k| out.counters.get(&k).cloned()),
                        }),
                        RequestOutcome::Overflow { key } => Err(SubmitError::Overflow(key)),
                        RequestOutcome::Failed { reason } => Err(SubmitError::Incomplete(reason)),
                    };
                    Answer {
                        reply: w.reply,
                        result,
                        held: w.held,
                    }
                })
                .collect()
        }
        Err(e) => {
            metrics.record_store_error(e.kind());
            tracing::error!(error = %e, requests = waiting.len(), "flush failed");
            let error = match &e {
                StoreError::Halted(why) => {
                    SubmitError::Halted(format!("{why}; nothing of the request was applied"))
                }
                _ => SubmitError::Store {
                    kind: e.kind(),
                    detail: e.to_string(),
                },
            };
            waiting
                .into_iter()
                .map(|w| Answer {
                    reply: w.reply,
                    result: Err(error.clone()),
                    held: w.held,
                })
                .collect()
        }
    }
}

/// `first` and every flush's answers queued behind it: one sync covers them all.
fn with_the_rest(
    mut first: Vec<Answer>,
    mut more: impl FnMut() -> Option<Vec<Answer>>,
) -> Vec<Answer> {
    while let Some(next) = more() {
        first.extend(next);
    }
    first
}

/// Makes flushes durable and answers their requests: takes every flush
/// applied so far, syncs once, answers them all.
async fn sync_loop(store: Arc<dyn Store>, mut rx: mpsc::UnboundedReceiver<Vec<Answer>>) {
    while let Some(first) = rx.recv().await {
        let answers = with_the_rest(first, || rx.try_recv().ok());
        answer(store.sync().await, answers);
    }
}

/// Sends each answer of flushes that `synced` covered.
fn answer(synced: Result<(), StoreError>, answers: Vec<Answer>) {
    if let Err(e) = &synced {
        tracing::error!(error = %e, requests = answers.len(), "sync failed");
    }
    for a in answers {
        let result = match (&synced, a.result) {
            (Err(StoreError::Halted(why)), Ok(_)) => Err(SubmitError::Halted(format!(
                "{why}; the write reached the store but may or may not survive a crash"
            ))),
            (Err(e), Ok(_)) => Err(SubmitError::NotDurable(e.to_string())),
            (_, result) => result,
        };
        // Room given back first: once answered, a client sees it free.
        drop(a.held);
        let _ = a.reply.send(result);
    }
}
