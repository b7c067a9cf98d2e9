//! The write pipeline: bounded queue, then the flusher, which takes everything
//! that queued while the previous flush ran, hands it to the store as one
//! batch (coalesced there, see [`crate::domain::coalesce`]), and answers each waiting request
//! only once its flush is durable.
//!
//! ```text
//! handler ──submit──▶ queue (bounded, in events) ──▶ flusher ──apply──▶ Store
//!    ▲                                                   │
//!    └────────────── reply after commit ◀────────────────┘
//! ```

mod flusher;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

use crate::domain::{Counter, CounterKey, Increment};
use crate::metrics::Metrics;
use crate::store::Store;

/// Tuning of the pipeline; see `--help` of `serve` for each field.
#[derive(Clone, Debug)]
pub struct PipelineConfig {
    /// How long the flusher lingers for more requests once one arrived.
    /// Zero: flush at once; requests still gather while a flush runs.
    pub flush_interval: Duration,
    /// Most events in one flush.
    pub max_batch_events: usize,
    /// Most events queued or being flushed; beyond it requests get 503.
    pub queue_capacity: usize,
    /// How long a request waits for its flush before it gets 503.
    pub ack_timeout: Duration,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            flush_interval: Duration::ZERO,
            max_batch_events: 100_000,
            queue_capacity: 1_000_000,
            ack_timeout: Duration::from_secs(30),
        }
    }
}

/// Why a submission was not acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubmitError {
    /// The queue is full: back off and retry (503 with `Retry-After`).
    Overloaded,
    /// The gateway is shutting down and takes no more writes.
    ShuttingDown,
    /// The flush did not finish within the ack timeout; the increments may or
    /// may not be applied (an `id` makes the retry safe).
    TimedOut,
    /// Written, but the fsync that would make it durable failed: it may or
    /// may not survive a crash. The text is the store's, for the log.
    NotDurable(String),
    /// The store acknowledges nothing more until restart; the text, meant
    /// for the client, says why and what became of this request.
    Halted(String),
    /// Applying it would overflow this counter; nothing of the request was applied.
    Overflow(CounterKey),
    /// The flush failed as a whole; nothing of the request was applied.
    /// The text is the store's, for the log.
    Store(String),
    /// The store gave up on this request; part of it may have been applied.
    /// The text is the store's, for the log.
    Incomplete(String),
}

/// What a successful submission tells its request.
#[derive(Debug)]
pub struct Applied {
    /// Events skipped because their `id` was already counted.
    pub duplicates: u32,
    /// The state after the flush of the counter, when one was asked for.
    pub counter: Option<Counter>,
}

pub(crate) struct Submission {
    events: Vec<Increment>,
    /// Answer with the state of this counter after the flush.
    want: Option<CounterKey>,
    reply: oneshot::Sender<Result<Applied, SubmitError>>,
    /// Held until answered: the queue bound covers in-flight flushes too.
    permit: OwnedSemaphorePermit,
}

pub(crate) enum Message {
    Submit(Submission),
    /// Flush what is queued, then stop.
    Close,
}

/// The handle handlers submit through; cheap to clone.
#[derive(Clone)]
pub struct Pipeline {
    tx: mpsc::UnboundedSender<Message>,
    permits: Arc<Semaphore>,
    config: Arc<PipelineConfig>,
    /// Counts the submissions refused because the queue was full.
    metrics: Arc<Metrics>,
}

impl Pipeline {
    /// Starts the flusher task over `store`.
    pub fn start(
        store: Arc<dyn Store>,
        config: PipelineConfig,
        metrics: Arc<Metrics>,
    ) -> (Pipeline, JoinHandle<()>) {
        let permits = Arc::new(Semaphore::new(config.queue_capacity));
        Self::start_sharing(store, config, metrics, permits)
    }

    /// Like [`Pipeline::start`], but bounded by `permits`, shared with other
    /// pipelines (one per tenant), so all of them together hold at most
    /// `config.queue_capacity` events. Closing one closes the bound for all:
    /// only done at shutdown.
    pub fn start_sharing(
        store: Arc<dyn Store>,
        config: PipelineConfig,
        metrics: Arc<Metrics>,
        permits: Arc<Semaphore>,
    ) -> (Pipeline, JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let config = Arc::new(config);
        let task = tokio::spawn(flusher::run(store, rx, config.clone(), metrics.clone()));
        (
            Pipeline {
                tx,
                permits,
                config,
                metrics,
            },
            task,
        )
    }

    /// Queues `events` and waits until they are durable.
    pub async fn submit(
        &self,
        events: Vec<Increment>,
        want: Option<CounterKey>,
    ) -> Result<Applied, SubmitError> {
        let n = u32::try_from(events.len().max(1)).map_err(|_| SubmitError::Overloaded)?;
        let permit = self
            .permits
            .clone()
            .try_acquire_many_owned(n)
            .map_err(|e| match e {
                tokio::sync::TryAcquireError::Closed => SubmitError::ShuttingDown,
                tokio::sync::TryAcquireError::NoPermits => {
                    self.metrics.record_overloaded();
                    SubmitError::Overloaded
                }
            })?;
        let (reply, answer) = oneshot::channel();
        let sub = Submission {
            events,
            want,
            reply,
            permit,
        };
        self.tx
            .send(Message::Submit(sub))
            .map_err(|_| SubmitError::ShuttingDown)?;
        match tokio::time::timeout(self.config.ack_timeout, answer).await {
            Ok(Ok(result)) => result,
            // The flusher dropped the reply: it stopped before reaching us.
            Ok(Err(_)) => Err(SubmitError::ShuttingDown),
            Err(_) => Err(SubmitError::TimedOut),
        }
    }

    /// Events queued or in flight right now.
    pub fn depth(&self) -> usize {
        self.config.queue_capacity - self.permits.available_permits()
    }

    /// Asks this pipeline's flusher to flush what is queued and stop,
    /// leaving the queue bound it shares with other tenants open (closing
    /// an idle tenant; [`Pipeline::close`] is for shutdown).
    pub fn stop(&self) {
        let _ = self.tx.send(Message::Close);
    }

    /// How many handles to this pipeline exist, this one included: one
    /// means nobody else can submit to it.
    pub fn handles(&self) -> usize {
        self.tx.strong_count()
    }

    /// Asks the flusher to flush what is queued and stop; later submissions
    /// are refused. Await the task returned by [`Pipeline::start`] to know it is done.
    pub fn close(&self) {
        self.permits.close();
        let _ = self.tx.send(Message::Close);
    }
}
