//! The flusher: gathers submissions into batches and applies them in turn;
//! the syncer beside it makes applied batches durable and only then answers.
//!
//! The two run concurrently, so batch N+1 is written while batch N is being
//! fsync'd, and one fsync covers every batch applied before it started.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, oneshot};

use super::{Applied, Held, Message, PipelineConfig, Submission, SubmitError};
use crate::metrics::Metrics;
use crate::store::{RequestOutcome, Store, StoreError, WriteBatch};

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
        let mut subs = Vec::new();
        let mut events = 0;
        match first {
            Message::Submit(s) => {
                events += s.events.len();
                subs.push(s);
            }
            Message::Close => closing = true,
        }
        gather(&mut rx, &config, &mut subs, &mut events, &mut closing).await;
        if closing {
            // Take everything that is still queued: it was accepted, so it is flushed.
            rx.close();
            while let Ok(msg) = rx.try_recv() {
                if let Message::Submit(s) = msg {
                    subs.push(s);
                }
            }
        }
        if !subs.is_empty() {
            let answers = flush(store.as_ref(), subs, &metrics).await;
            // The syncer outlives this loop, so the send cannot fail.
            let _ = to_syncer.send(answers);
        }
    }
    drop(to_syncer);
    let _ = syncer.await;
    tracing::debug!("flusher stopped");
}

/// Adds to the batch whatever is queued, lingering up to the flush interval,
/// until the batch holds `max_batch_events`.
async fn gather(
    rx: &mut mpsc::UnboundedReceiver<Message>,
    config: &PipelineConfig,
    subs: &mut Vec<Submission>,
    events: &mut usize,
    closing: &mut bool,
) {
    let deadline = tokio::time::Instant::now() + config.flush_interval;
    while !*closing && *events < config.max_batch_events {
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
        match msg {
            Message::Submit(s) => {
                *events += s.events.len();
                subs.push(s);
            }
            Message::Close => *closing = true,
        }
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

async fn flush(store: &dyn Store, subs: Vec<Submission>, metrics: &Metrics) -> Answers {
    let started = Instant::now();
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
    let increments: usize = batch.requests.iter().map(Vec::len).sum();
    match store.apply(batch).await {
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
        let synced = store.sync().await;
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
}
