//! The write pipeline: bounded queue, then the flusher, which takes everything
//! that queued while the last flush ran, hands it to the store as one
//! batch (coalesced there, see [`crate::domain::coalesce`]), and answers each waiting request
//! only once its flush is durable. A store that asks for it
//! ([`Store::bulks_in_flight`]) gets several flushes at once, never with a
//! counter in two of them.
//!
//! ```text
//! handler ──submit──▶ queue (bounded, in events and bytes) ──▶ flusher ──apply──▶ Store
//!    ▲                                                   │
//!    └────────────── reply after commit ◀────────────────┘
//! ```

mod flusher;
mod queue;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::domain::{Counter, CounterKey, Increment};
use crate::metrics::Metrics;
use crate::store::Store;
pub use queue::{estimate_bytes, largest_request_bytes, share_of, SharedQueue};
use queue::{Held, Share};

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
    /// Most bytes (estimated, see [`estimate_bytes`]) queued or being
    /// flushed; beyond it requests get 503.
    pub queue_bytes: usize,
    /// Percent of `queue_capacity` and of `queue_bytes` one pipeline (one
    /// tenant) may hold, so a stuck tenant leaves room for the others.
    pub tenant_queue_share: u8,
    /// How long a request waits for its flush before it gets 503.
    pub ack_timeout: Duration,
}

/// Default of `--queue-bytes`: 256 MiB.
pub const DEFAULT_QUEUE_BYTES: usize = 256 * 1024 * 1024;
/// Default of `--tenant-queue-share`, in percent.
pub const DEFAULT_TENANT_QUEUE_SHARE: u8 = 50;

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            flush_interval: Duration::ZERO,
            max_batch_events: 100_000,
            queue_capacity: 1_000_000,
            queue_bytes: DEFAULT_QUEUE_BYTES,
            tenant_queue_share: DEFAULT_TENANT_QUEUE_SHARE,
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
    /// The text is the store's, for the log; the kind gives the answer's type.
    Store {
        kind: crate::store::StoreErrorKind,
        detail: String,
    },
    /// The store gave up on this request; part of it may have been applied.
    /// The text is the store's, for the log.
    Incomplete(String),
}

/// What a successful submission tells its request.
#[derive(Debug)]
pub struct Applied {
    /// Events skipped because their `id` was already counted.
    pub duplicates: u32,
    /// Events skipped because `unique` said their actor was counted
    /// already (or, for an unlike, had nothing to take back).
    pub repeats: u32,
    /// The state after the flush of the counter, when one was asked for.
    pub counter: Option<Counter>,
}

pub(crate) struct Submission {
    events: Vec<Increment>,
    /// Answer with the state of this counter after the flush.
    want: Option<CounterKey>,
    reply: oneshot::Sender<Result<Applied, SubmitError>>,
    /// Held until answered: the queue bound covers in-flight flushes too.
    held: Held,
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
    /// The bound of every pipeline together.
    shared: Arc<SharedQueue>,
    /// This pipeline's part of `shared`.
    share: Arc<Share>,
    /// Set by [`Pipeline::stop`]: this pipeline takes no more submissions.
    stopped: Arc<AtomicBool>,
    config: Arc<PipelineConfig>,
    /// Counts the submissions refused because the queue was full.
    metrics: Arc<Metrics>,
    /// Bumped once each queued submission is answered (and by
    /// [`Pipeline::note_change`]): the live streams (`GET /v1/stream`)
    /// read their counters again only when it moved, so an idle tenant's
    /// streams cost no reads.
    changes: Arc<AtomicU64>,
}

impl Pipeline {
    /// Starts the flusher task over `store`, alone under its bound: all of
    /// `config.queue_capacity` and `config.queue_bytes` are its own.
    pub fn start(
        store: Arc<dyn Store>,
        config: PipelineConfig,
        metrics: Arc<Metrics>,
    ) -> (Pipeline, JoinHandle<()>) {
        let shared = Arc::new(SharedQueue::new(&PipelineConfig {
            tenant_queue_share: 100,
            ..config.clone()
        }));
        Self::start_sharing(store, config, metrics, shared)
    }

    /// Like [`Pipeline::start`], but bounded by `shared`, the one bound of
    /// every pipeline (one per tenant), so all of them together hold at most
    /// `config.queue_capacity` events and `config.queue_bytes` bytes, and
    /// this one at most its share of both. [`SharedQueue::close`] closes the
    /// bound for all: only done at shutdown.
    pub fn start_sharing(
        store: Arc<dyn Store>,
        config: PipelineConfig,
        metrics: Arc<Metrics>,
        shared: Arc<SharedQueue>,
    ) -> (Pipeline, JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let config = Arc::new(config);
        let task = match store.blocking_writes() {
            Some(writes) => tokio::spawn(flusher::run_blocking(
                writes,
                rx,
                config.clone(),
                metrics.clone(),
            )),
            None => tokio::spawn(flusher::run(store, rx, config.clone(), metrics.clone())),
        };
        (
            Pipeline {
                tx,
                share: shared.new_share(),
                shared,
                stopped: Arc::default(),
                config,
                metrics,
                changes: Arc::default(),
            },
            task,
        )
    }

    /// Whether this pipeline takes writes now: `Err(Overloaded)` from the
    /// moment one found its queue full until the queue has drained to
    /// three quarters. Handlers ask before parsing a body, so a flood of
    /// writes that would be refused costs little more than reading them.
    pub fn admit(&self) -> Result<(), SubmitError> {
        if self.share.admitting(&self.shared) {
            Ok(())
        } else {
            self.metrics.record_overloaded();
            Err(SubmitError::Overloaded)
        }
    }

    /// Queues `events` and waits until they are durable.
    pub async fn submit(
        &self,
        events: Vec<Increment>,
        want: Option<CounterKey>,
    ) -> Result<Applied, SubmitError> {
        if self.shared.is_closed() || self.stopped.load(Ordering::Acquire) {
            return Err(SubmitError::ShuttingDown);
        }
        let bytes = estimate_bytes(&events);
        let Some(held) = Held::try_take(&self.shared, &self.share, events.len().max(1), bytes)
        else {
            self.share.shed();
            self.metrics.record_overloaded();
            return Err(SubmitError::Overloaded);
        };
        let (reply, answer) = oneshot::channel();
        let sub = Submission {
            events,
            want,
            reply,
            held,
        };
        self.tx
            .send(Message::Submit(sub))
            .map_err(|_| SubmitError::ShuttingDown)?;
        let answered = tokio::time::timeout(self.config.ack_timeout, answer).await;
        // Whatever the answer: a failed flush changed nothing, which a
        // stream's read finds out; one that gave up may have changed some.
        self.note_change();
        match answered {
            Ok(Ok(result)) => result,
            // The flusher dropped the reply: it stopped before reaching us.
            Ok(Err(_)) => Err(SubmitError::ShuttingDown),
            Err(_) => Err(SubmitError::TimedOut),
        }
    }

    /// How many writes of this tenant were answered so far (see
    /// [`Pipeline::note_change`]); only its moves matter.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// Says the tenant's counters may have changed by a write that does not
    /// go through the queue (a set value, a delete, a backfill): the live
    /// streams read them again.
    pub fn note_change(&self) {
        self.changes.fetch_add(1, Ordering::Release);
    }

    /// Events queued or in flight right now, over every pipeline sharing
    /// this one's bound.
    pub fn depth(&self) -> usize {
        self.shared.depth()
    }

    /// Estimated bytes queued or in flight right now, over every pipeline
    /// sharing this one's bound.
    pub fn queued_bytes(&self) -> usize {
        self.shared.bytes()
    }

    /// Events queued or in flight in this pipeline alone.
    pub fn own_depth(&self) -> usize {
        self.share.depth()
    }

    /// How many handles to this pipeline exist, this one included: one
    /// means nobody else can submit to it (an idle tenant can be closed).
    pub fn handles(&self) -> usize {
        self.tx.strong_count()
    }

    /// Asks this pipeline's flusher to flush what it holds and stop; its
    /// later submissions are refused, the other pipelines sharing its bound
    /// go on. Await the task returned by [`Pipeline::start_sharing`] to
    /// know it is done.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        let _ = self.tx.send(Message::Close);
    }

    /// Shutdown: closes the bound shared with every other pipeline (their
    /// later submissions are refused too), then stops this one as
    /// [`Pipeline::stop`] does.
    pub fn close(&self) {
        self.shared.close();
        self.stop();
    }
}
