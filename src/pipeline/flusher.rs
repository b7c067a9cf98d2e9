//! The flusher: gathers submissions into batches and applies them in turn;
//! the syncer beside it makes applied batches durable and only then answers.
//!
//! The two run concurrently, so batch N+1 is written while batch N is being
//! fsync'd, and one fsync covers every batch applied before it started.
//!
//! Two ways to run them, the same steps either way:
//! - [`run`]: as tasks calling the store's async `apply` and `sync` (the
//!   Elasticsearch store, whose writes are requests over the network).
//! - [`run_blocking`]: for a store whose writes are local blocking calls
//!   (the embedded store, [`BlockingWrites`]). While submissions keep
//!   coming, the flusher and the syncer each stay on one blocking thread
//!   and hand work to each other directly: no task spawned and no thread
//!   woken per flush beyond the one that waits for the work (measured in
//!   scripts/bench/README.md: each wake-up of a thread costs tens of microseconds of
//!   CPU on a virtual machine). A busy period ends when no submission has
//!   come for [`LINGER`]; the threads go back to the pool.

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
    let mut closing = false;
    while !closing {
        let Some(first) = rx.recv().await else { break };
        let mut batch = Gathered::default();
        batch.take(first, &mut closing);
        gather(&mut rx, &config, &mut batch, &mut closing).await;
        if closing {
            batch.take_the_rest(&mut rx);
        }
        if !batch.subs.is_empty() {
            let (write, replies) = prepare(batch.subs);
            let started = Instant::now();
            let result = store.apply(write).await;
            let answers = answers(result, replies, &metrics, batch.events, started);
            // The syncer outlives this loop, so the send cannot fail.
            let _ = to_syncer.send(answers);
        }
    }
    drop(to_syncer);
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
        if period.ended {
            break;
        }
    }
    for s in syncers {
        let _ = s.await;
    }
    tracing::debug!("flusher stopped");
}

/// What a busy period hands back: the queue, its syncer (still answering
/// the last flushes), and whether the pipeline has ended (closed, or every
/// handle to it dropped).
struct Period {
    rx: mpsc::UnboundedReceiver<Message>,
    syncer: JoinHandle<()>,
    ended: bool,
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
    let (to_syncer, syncer_rx) = std::sync::mpsc::channel::<Answers>();
    let w = writes.clone();
    let syncer = handle.spawn_blocking(move || {
        while let Ok(first) = syncer_rx.recv() {
            let mut answers = first;
            while let Ok(more) = syncer_rx.try_recv() {
                answers.extend(more);
            }
            answer(w.sync(), answers);
        }
    });
    let mut next = Some(first);
    let mut closing = false;
    let mut ended = false;
    while let Some(first) = next.take() {
        let mut batch = Gathered::default();
        batch.take(first, &mut closing);
        gather_blocking(&mut rx, config, &mut batch, &mut closing, handle);
        if closing {
            batch.take_the_rest(&mut rx);
        }
        if !batch.subs.is_empty() {
            let (write, replies) = prepare(batch.subs);
            let started = Instant::now();
            let result = writes.apply(write);
            let answers = answers(result, replies, metrics, batch.events, started);
            // The syncer lives as long as its receiver, to the end of this
            // period: the send cannot fail.
            let _ = to_syncer.send(answers);
            // While the syncer fsyncs: the answers do not wait for it.
            writes.after_apply();
        }
        if closing {
            ended = true;
            break;
        }
        next = match rx.try_recv() {
            Ok(m) => Some(m),
            Err(mpsc::error::TryRecvError::Disconnected) => {
                ended = true;
                None
            }
            Err(mpsc::error::TryRecvError::Empty) => {
                match handle.block_on(tokio::time::timeout(LINGER, rx.recv())) {
                    Ok(Some(m)) => Some(m),
                    Ok(None) => {
                        ended = true;
                        None
                    }
                    Err(_) => None,
                }
            }
        };
    }
    drop(to_syncer);
    Period { rx, syncer, ended }
}

/// The submissions of one batch, and what they carry.
#[derive(Default)]
struct Gathered {
    subs: Vec<Submission>,
    events: usize,
}

impl Gathered {
    fn take(&mut self, msg: Message, closing: &mut bool) {
        match msg {
            Message::Submit(s) => {
                self.events += s.events.len();
                self.subs.push(s);
            }
            Message::Close => *closing = true,
        }
    }

    /// At close: everything still queued was accepted, so it is flushed.
    fn take_the_rest(&mut self, rx: &mut mpsc::UnboundedReceiver<Message>) {
        rx.close();
        while let Ok(msg) = rx.try_recv() {
            if let Message::Submit(s) = msg {
                self.events += s.events.len();
                self.subs.push(s);
            }
        }
    }

    fn full(&self, config: &PipelineConfig, closing: bool) -> bool {
        closing || self.events >= config.max_batch_events
    }
}

/// Adds to the batch whatever is queued, lingering up to the flush interval,
/// until the batch holds `max_batch_events`.
async fn gather(
    rx: &mut mpsc::UnboundedReceiver<Message>,
    config: &PipelineConfig,
    batch: &mut Gathered,
    closing: &mut bool,
) {
    let deadline = tokio::time::Instant::now() + config.flush_interval;
    while !batch.full(config, *closing) {
        let msg = match rx.try_recv() {
            Ok(msg) => msg,
            Err(mpsc::error::TryRecvError::Disconnected) => return,
            Err(mpsc::error::TryRecvError::Empty) => {
                if config.flush_interval.is_zero() {
                    return;
                }
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(msg)) => msg,
                    Ok(None) | Err(_) => return,
                }
            }
        };
        batch.take(msg, closing);
    }
}

/// [`gather`] on a blocking thread.
fn gather_blocking(
    rx: &mut mpsc::UnboundedReceiver<Message>,
    config: &PipelineConfig,
    batch: &mut Gathered,
    closing: &mut bool,
    handle: &Handle,
) {
    let deadline = tokio::time::Instant::now() + config.flush_interval;
    while !batch.full(config, *closing) {
        let msg = match rx.try_recv() {
            Ok(msg) => msg,
            Err(mpsc::error::TryRecvError::Disconnected) => return,
            Err(mpsc::error::TryRecvError::Empty) => {
                if config.flush_interval.is_zero() {
                    return;
                }
                match handle.block_on(tokio::time::timeout_at(deadline, rx.recv())) {
                    Ok(Some(msg)) => msg,
                    Ok(None) | Err(_) => return,
                }
            }
        };
        batch.take(msg, closing);
    }
}

/// Answers decided by a flush, held until the flush is durable. Each holds
/// its room in the queue, so the bounds on queued events and bytes cover
/// these too.
type Answers = Vec<(
    oneshot::Sender<Result<Applied, SubmitError>>,
    Result<Applied, SubmitError>,
    Held,
)>;

/// What each submission waits on, in the order of the batch's requests.
type Replies = Vec<(
    oneshot::Sender<Result<Applied, SubmitError>>,
    Option<CounterKey>,
    Held,
)>;

fn prepare(subs: Vec<Submission>) -> (WriteBatch, Replies) {
    let mut replies = Vec::with_capacity(subs.len());
    let mut batch = WriteBatch {
        requests: Vec::with_capacity(subs.len()),
        wanted: Default::default(),
    };
    for s in subs {
        batch.requests.push(s.events);
        if let Some(k) = &s.want {
            batch.wanted.insert(k.clone());
        }
        replies.push((s.reply, s.want, s.held));
    }
    (batch, replies)
}

/// Each request's answer from the flush's result (given once durable).
fn answers(
    result: Result<BatchOutcome, StoreError>,
    replies: Replies,
    metrics: &Metrics,
    increments: usize,
    started: Instant,
) -> Answers {
    match result {
        Ok(mut out) => {
            metrics.record_flush(increments, out.store_writes, started.elapsed());
            replies
                .into_iter()
                .zip(out.requests.drain(..))
                .enumerate()
                .map(|(i, ((reply, want, held), outcome))| {
                    let answer = match outcome {
                        RequestOutcome::Applied { duplicates } => Ok(Applied {
                            duplicates,
                            repeats: out.repeats.get(i).copied().unwrap_or(0),
                            counter: want.and_then(|k| out.counters.get(&k).cloned()),
                        }),
                        RequestOutcome::Overflow { key } => Err(SubmitError::Overflow(key)),
                        RequestOutcome::Failed { reason } => Err(SubmitError::Incomplete(reason)),
                    };
                    (reply, answer, held)
                })
                .collect()
        }
        Err(e) => {
            metrics.record_store_error();
            tracing::error!(error = %e, requests = replies.len(), "flush failed");
            let answer = match &e {
                StoreError::Halted(why) => {
                    SubmitError::Halted(format!("{why}; nothing of the request was applied"))
                }
                _ => SubmitError::Store(e.to_string()),
            };
            replies
                .into_iter()
                .map(|(reply, _, held)| (reply, Err(answer.clone()), held))
                .collect()
        }
    }
}

/// Makes flushes durable and answers their requests: takes every flush
/// applied so far, syncs once, answers them all.
async fn sync_loop(store: Arc<dyn Store>, mut rx: mpsc::UnboundedReceiver<Answers>) {
    while let Some(first) = rx.recv().await {
        let mut answers = first;
        while let Ok(more) = rx.try_recv() {
            answers.extend(more);
        }
        answer(store.sync().await, answers);
    }
}

/// Sends each answer of flushes that `synced` covered.
fn answer(synced: Result<(), StoreError>, answers: Answers) {
    if let Err(e) = &synced {
        tracing::error!(error = %e, requests = answers.len(), "sync failed");
    }
    for (reply, answer, held) in answers {
        let answer = match (&synced, answer) {
            (Err(StoreError::Halted(why)), Ok(_)) => Err(SubmitError::Halted(format!(
                "{why}; the write reached the store but may or may not survive a crash"
            ))),
            (Err(e), Ok(_)) => Err(SubmitError::NotDurable(e.to_string())),
            (_, answer) => answer,
        };
        // Room given back first: once answered, a client sees it free.
        drop(held);
        let _ = reply.send(answer);
    }
}
