//! The flusher: gathers submissions into batches and applies them in turn.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;

use super::{Applied, Message, PipelineConfig, Submission, SubmitError};
use crate::metrics::Metrics;
use crate::store::{RequestOutcome, Store, WriteBatch};

pub(super) async fn run(
    store: Arc<dyn Store>,
    mut rx: mpsc::UnboundedReceiver<Message>,
    config: Arc<PipelineConfig>,
    metrics: Arc<Metrics>,
) {
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
            flush(store.as_ref(), subs, &metrics).await;
        }
    }
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

async fn flush(store: &dyn Store, subs: Vec<Submission>, metrics: &Metrics) {
    let started = Instant::now();
    let mut replies = Vec::with_capacity(subs.len());
    let mut batch = WriteBatch {
        requests: Vec::with_capacity(subs.len()),
    };
    for s in subs {
        batch.requests.push(s.events);
        replies.push((s.reply, s.want, s.permit));
    }
    let increments: usize = batch.requests.iter().map(Vec::len).sum();
    let result = store.apply(batch).await;
    match result {
        Ok(mut out) => {
            metrics.record_flush(increments, out.store_writes, started.elapsed());
            for ((reply, want, permit), outcome) in replies.into_iter().zip(out.requests.drain(..))
            {
                let answer = match outcome {
                    RequestOutcome::Applied { duplicates } => Ok(Applied {
                        duplicates,
                        counter: want.and_then(|k| out.counters.get(&k).cloned()),
                    }),
                    RequestOutcome::Overflow { key } => Err(SubmitError::Overflow(key)),
                    RequestOutcome::Failed { reason } => Err(SubmitError::Store(reason)),
                };
                let _ = reply.send(answer);
                drop(permit);
            }
        }
        Err(e) => {
            metrics.record_store_error();
            tracing::error!(error = %e, requests = replies.len(), "flush failed");
            for (reply, _, _) in replies {
                let _ = reply.send(Err(SubmitError::Store(e.to_string())));
            }
        }
    }
}
