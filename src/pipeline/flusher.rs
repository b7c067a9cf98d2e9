//! The flusher: gathers submissions into batches and applies them in turn;
//! the syncer beside it makes applied batches durable and only then answers.
//!
//! The two run concurrently, so batch N+1 is written while batch N is being
//! fsync'd, and one fsync covers every batch applied before it started.
//!
//! One flush cycle ([`flush_while_busy`]: collect until a deadline, apply,
//! hand the answers to the syncer) and one shutdown (a close takes what is
//! still queued into the last flush; the syncer answers everything applied
//! before it stops), run through one of two [`Writer`]s:
//! - [`run`]: the store's async `apply` and `sync`, awaited on a task (the
//!   Elasticsearch store, whose writes are requests over the network).
//! - [`run_blocking`]: a store whose writes are local blocking calls (the
//!   embedded store, [`BlockingWrites`]). While submissions keep coming,
//!   the flusher and the syncer each stay on one blocking thread and hand
//!   work to each other directly: no task spawned and no thread woken per
//!   flush beyond the one that waits for the work (measured in
//!   scripts/bench/README.md: each wake-up of a thread costs tens of
//!   microseconds of CPU on a virtual machine). A busy period ends when no
//!   submission has come for [`LINGER`]; the threads go back to the pool.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

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
    let mut writer = AsyncWriter { store, to_syncer };
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
    let syncer = handle.spawn_blocking(move || {
        while let Ok(first) = syncer_rx.recv() {
            let answers = with_the_rest(first, || syncer_rx.try_recv().ok());
            answer(w.sync(), answers);
        }
    });
    let mut writer = BlockingWriter { writes, to_syncer };
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

/// How the flusher applies a flush and hands its answers on.
trait Writer {
    async fn apply(&mut self, batch: WriteBatch) -> Result<BatchOutcome, StoreError>;
    /// Gives the syncer a flush's answers, to send once it is durable.
    fn hand_off(&mut self, answers: Vec<Answer>);
}

/// The store's async writes, awaited on the flusher's task.
struct AsyncWriter {
    store: Arc<dyn Store>,
    to_syncer: mpsc::UnboundedSender<Vec<Answer>>,
}

impl Writer for AsyncWriter {
    async fn apply(&mut self, batch: WriteBatch) -> Result<BatchOutcome, StoreError> {
        self.store.apply(batch).await
    }

    fn hand_off(&mut self, answers: Vec<Answer>) {
        // The syncer outlives this writer, so the send cannot fail.
        let _ = self.to_syncer.send(answers);
    }
}

/// The store's blocking writes, on the busy period's thread.
struct BlockingWriter {
    writes: Arc<dyn BlockingWrites>,
    to_syncer: std::sync::mpsc::Sender<Vec<Answer>>,
}

impl Writer for BlockingWriter {
    async fn apply(&mut self, batch: WriteBatch) -> Result<BatchOutcome, StoreError> {
        self.writes.apply(batch)
    }

    fn hand_off(&mut self, answers: Vec<Answer>) {
        // The syncer lives as long as its receiver, to the end of this
        // period: the send cannot fail.
        let _ = self.to_syncer.send(answers);
        // While the syncer fsyncs: the answers do not wait for it.
        self.writes.after_apply();
    }
}

/// The flush cycle, as long as submissions come: collect (from `first`,
/// or the next one queued) until the flush interval's deadline or a full
/// batch, apply, hand off. With `linger`, returns [`End::Idle`] when no
/// submission came for that long. A close ends it after one last flush of
/// everything still queued (accepted, so flushed).
async fn flush_while_busy(
    rx: &mut mpsc::UnboundedReceiver<Message>,
    mut first: Option<Message>,
    linger: Option<Duration>,
    config: &PipelineConfig,
    metrics: &Metrics,
    writer: &mut impl Writer,
) -> End {
    loop {
        let msg = match first.take() {
            Some(msg) => msg,
            None => match next_message(rx, linger).await {
                Ok(msg) => msg,
                Err(end) => return end,
            },
        };
        let mut batch = Gathered::default();
        let mut closing = batch.take(msg);
        closing = closing || collect(rx, config, &mut batch).await;
        if closing {
            batch.take_the_rest(rx);
        }
        if !batch.subs.is_empty() {
            let events = batch.events;
            let flush = Flush::of(batch.subs);
            let started = Instant::now();
            let result = writer.apply(flush.batch).await;
            writer.hand_off(answers(result, flush.waiting, metrics, events, started));
        }
        if closing {
            return End::Ended;
        }
    }
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

/// The submissions of one batch, and what they carry.
#[derive(Default)]
struct Gathered {
    subs: Vec<Submission>,
    events: usize,
}

impl Gathered {
    /// Takes a submission in; `true` for a close.
    fn take(&mut self, msg: Message) -> bool {
        match msg {
            Message::Submit(s) => {
                self.events += s.events.len();
                self.subs.push(s);
                false
            }
            Message::Close => true,
        }
    }

    /// At close: everything still queued was accepted, so it is flushed.
    fn take_the_rest(&mut self, rx: &mut mpsc::UnboundedReceiver<Message>) {
        rx.close();
        while let Ok(msg) = rx.try_recv() {
            self.take(msg);
        }
    }

    fn full(&self, config: &PipelineConfig) -> bool {
        self.events >= config.max_batch_events
    }
}

/// Adds to the batch whatever is queued, lingering up to the flush interval,
/// until the batch holds `max_batch_events`; `true` when a close came.
async fn collect(
    rx: &mut mpsc::UnboundedReceiver<Message>,
    config: &PipelineConfig,
    batch: &mut Gathered,
) -> bool {
    let deadline = tokio::time::Instant::now() + config.flush_interval;
    while !batch.full(config) {
        let msg = match rx.try_recv() {
            Ok(msg) => msg,
            Err(mpsc::error::TryRecvError::Disconnected) => return false,
            Err(mpsc::error::TryRecvError::Empty) => {
                if config.flush_interval.is_zero() {
                    return false;
                }
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(msg)) => msg,
                    Ok(None) | Err(_) => return false,
                }
            }
        };
        if batch.take(msg) {
            return true;
        }
    }
    false
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

/// A batch for the store, and who waits on each of its requests, in order.
struct Flush {
    batch: WriteBatch,
    waiting: Vec<Waiting>,
}

impl Flush {
    fn of(subs: Vec<Submission>) -> Flush {
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
        Flush { batch, waiting }
    }
}

/// Each request's answer from the flush's result (given once durable).
fn answers(
    result: Result<BatchOutcome, StoreError>,
    waiting: Vec<Waiting>,
    metrics: &Metrics,
    increments: usize,
    started: Instant,
) -> Vec<Answer> {
    match result {
        Ok(mut out) => {
            metrics.record_flush(increments, out.store_writes, started.elapsed());
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
            metrics.record_store_error();
            tracing::error!(error = %e, requests = waiting.len(), "flush failed");
            let error = match &e {
                StoreError::Halted(why) => {
                    SubmitError::Halted(format!("{why}; nothing of the request was applied"))
                }
                _ => SubmitError::Store(e.to_string()),
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
