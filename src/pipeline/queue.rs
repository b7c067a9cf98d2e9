//! The queue bound, in events and in bytes: one shared by every tenant's
//! pipeline, and inside it each tenant's share, so a tenant whose store is
//! stuck fills its own share and not the whole queue.
//!
//! Nothing here ever waits: a submission takes room at once or is refused
//! (503 `overloaded`), and gives the room back when it is answered.

use std::mem::size_of;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use super::{PipelineConfig, Submission};
use crate::domain::Increment;

/// Bytes the allocator may spend beyond a request: glibc rounds a chunk
/// up to 16 bytes and keeps an 8-byte header, so 16 more than the rounded
/// size covers it.
const ALLOC_OVERHEAD: usize = 16;
/// An `Arc<str>` heap block: two reference counts, then the bytes.
const ARC_HEADER: usize = 2 * size_of::<usize>();
/// A submission's own allocations beside its events: its place in the
/// channel, its oneshot reply, the answer it is held in while its flush
/// is made durable. Measured well under this.
const SUBMISSION_OVERHEAD: usize = 512;
/// Strings one increment can own: entity, action, uuid, category, id.
const STRINGS_PER_EVENT: usize = 5;
/// The most string bytes one increment can own whatever the body (the
/// key parts of `POST .../increment` come from the path, not the body):
/// every string at the name limit, the id (256 bytes at most) counted as one.
const MAX_EVENT_STRING_BYTES: usize = STRINGS_PER_EVENT * crate::domain::MAX_NAME_BYTES;

/// Heap bytes of one `Arc<str>` of `len` bytes, allocator rounding included.
fn arc_str_bytes(len: usize) -> usize {
    (ARC_HEADER + len).next_multiple_of(16) + ALLOC_OVERHEAD
}

/// A conservative estimate of the memory a submission of `events` holds
/// while queued or in flight: the increments (struct and every string they
/// own, counted once per increment even when shared), the vector holding
/// them, and the submission's own allocations.
pub fn estimate_bytes(events: &Vec<Increment>) -> usize {
    let strings: usize = events
        .iter()
        .map(|e| {
            arc_str_bytes(e.key.entity.len())
                + arc_str_bytes(e.key.action.len())
                + arc_str_bytes(e.key.uuid.len())
                + e.category.as_ref().map_or(0, |c| arc_str_bytes(c.len()))
                + e.id.as_ref().map_or(0, |i| arc_str_bytes(i.len()))
        })
        .sum();
    size_of::<Submission>()
        + SUBMISSION_OVERHEAD
        + events.capacity().max(1) * size_of::<Increment>()
        + ALLOC_OVERHEAD
        + strings
}

/// The most [`estimate_bytes`] can answer for a request the edge admits:
/// every increment with all five strings, and string bytes no more than
/// the body holds (a decoded JSON string is never longer than its
/// encoding), plus one increment's worth taken from the path.
pub fn largest_request_bytes(max_body_bytes: usize, max_events: usize) -> usize {
    let per_event = size_of::<Increment>() + STRINGS_PER_EVENT * (ARC_HEADER + 15 + ALLOC_OVERHEAD);
    let strings = max_events
        .saturating_mul(MAX_EVENT_STRING_BYTES)
        .min(max_body_bytes.saturating_add(MAX_EVENT_STRING_BYTES));
    size_of::<Submission>()
        + SUBMISSION_OVERHEAD
        + ALLOC_OVERHEAD
        + max_events.saturating_mul(per_event)
        + strings
}

/// What one tenant may hold of a bound of `total`: `percent` of it.
pub fn share_of(total: usize, percent: u8) -> usize {
    // u128: no overflow for any usize total.
    (total as u128 * u128::from(percent.min(100)) / 100) as usize
}

/// A count taken and given back, never more than `capacity` taken.
struct Budget {
    capacity: usize,
    used: AtomicUsize,
}

impl Budget {
    fn new(capacity: usize) -> Self {
        Budget {
            capacity,
            used: AtomicUsize::new(0),
        }
    }

    fn try_take(&self, n: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|t| *t <= self.capacity)
            })
            .is_ok()
    }

    fn give(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }

    fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

/// Events and bytes, taken together or not at all.
struct Room {
    events: Budget,
    bytes: Budget,
}

impl Room {
    fn new(events: usize, bytes: usize) -> Self {
        Room {
            events: Budget::new(events),
            bytes: Budget::new(bytes),
        }
    }

    fn try_take(&self, events: usize, bytes: usize) -> bool {
        if !self.events.try_take(events) {
            return false;
        }
        if !self.bytes.try_take(bytes) {
            self.events.give(events);
            return false;
        }
        true
    }

    fn give(&self, events: usize, bytes: usize) {
        self.events.give(events);
        self.bytes.give(bytes);
    }

    /// Whether at most `percent` of both budgets is taken.
    fn below(&self, percent: usize) -> bool {
        let under = |b: &Budget| b.used() as u128 * 100 <= b.capacity as u128 * percent as u128;
        under(&self.events) && under(&self.bytes)
    }
}

/// The queue bound of a whole gateway, created once and handed to every
/// tenant's pipeline ([`super::Pipeline::start_sharing`]).
pub struct SharedQueue {
    total: Room,
    /// What each pipeline may hold of `total`, in events and bytes.
    share: (usize, usize),
    closed: AtomicBool,
}

impl SharedQueue {
    /// `config.queue_capacity` events and `config.queue_bytes` bytes in all,
    /// each pipeline at most `config.tenant_queue_share` percent of both.
    pub fn new(config: &PipelineConfig) -> SharedQueue {
        SharedQueue {
            total: Room::new(config.queue_capacity, config.queue_bytes),
            share: (
                share_of(config.queue_capacity, config.tenant_queue_share),
                share_of(config.queue_bytes, config.tenant_queue_share),
            ),
            closed: AtomicBool::new(false),
        }
    }

    /// Events queued or being flushed, over every pipeline.
    pub fn depth(&self) -> usize {
        self.total.events.used()
    }

    /// Estimated bytes of the submissions queued or being flushed, over every pipeline.
    pub fn bytes(&self) -> usize {
        self.total.bytes.used()
    }

    /// Refuses every later submission of every pipeline: only at shutdown.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    pub(super) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// A pipeline's own share of this bound.
    pub(super) fn new_share(&self) -> Arc<Share> {
        Arc::new(Share {
            room: Room::new(self.share.0, self.share.1),
            shedding: AtomicBool::new(false),
        })
    }
}

/// One pipeline's part of a [`SharedQueue`].
pub(super) struct Share {
    room: Room,
    /// Set when a submission of this pipeline found no room; cleared once
    /// its share and the whole bound are back under [`RESUME_PERCENT`].
    /// While set, writes are refused before their bodies are parsed: under
    /// a flood, parsing batches only to refuse them took the CPU the
    /// flusher needed (applied rates fell to a third in the overload
    /// soak), and clients told to back off come back in a second anyway.
    shedding: AtomicBool,
}

/// How full (in percent of each bound, events and bytes) a pipeline that
/// ran out of room may still be when it takes writes again.
pub const RESUME_PERCENT: usize = 75;

impl Share {
    pub(super) fn depth(&self) -> usize {
        self.room.events.used()
    }

    /// Whether writes are parsed and offered now; see [`Share::shedding`].
    pub(super) fn admitting(&self, shared: &SharedQueue) -> bool {
        if !self.shedding.load(Ordering::Acquire) {
            return true;
        }
        let calm = self.room.below(RESUME_PERCENT) && shared.total.below(RESUME_PERCENT);
        if calm {
            self.shedding.store(false, Ordering::Release);
        }
        calm
    }

    /// A submission found no room.
    pub(super) fn shed(&self) {
        self.shedding.store(true, Ordering::Release);
    }
}

/// Room a submission holds in its pipeline's share and in the shared
/// bound, given back to both when it is dropped (once answered).
pub(super) struct Held {
    shared: Arc<SharedQueue>,
    share: Arc<Share>,
    events: usize,
    bytes: usize,
}

impl Held {
    /// Takes room for `events` and `bytes`, first in the share, then in the
    /// whole; `None` when either is full (nothing is held then).
    pub(super) fn try_take(
        shared: &Arc<SharedQueue>,
        share: &Arc<Share>,
        events: usize,
        bytes: usize,
    ) -> Option<Held> {
        if !share.room.try_take(events, bytes) {
            return None;
        }
        if !shared.total.try_take(events, bytes) {
            share.room.give(events, bytes);
            return None;
        }
        Some(Held {
            shared: shared.clone(),
            share: share.clone(),
            events,
            bytes,
        })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.shared.total.give(self.events, self.bytes);
        self.share.room.give(self.events, self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{CounterKey, Kind};

    fn inc(uuid: &str, id: Option<&str>) -> Increment {
        Increment {
            key: CounterKey::new("VIDEO", "VIEW", uuid).unwrap(),
            delta: 1,
            category: None,
            ts_ms: 0,
            day: 0,
            id: id.map(Arc::from),
            kind: Kind::Counter,
            unique: None,
        }
    }

    #[test]
    fn the_estimate_grows_with_strings_and_stays_under_the_largest() {
        let small = estimate_bytes(&vec![inc("u", None)]);
        let long = estimate_bytes(&vec![inc(&"u".repeat(400), Some(&"i".repeat(200)))]);
        assert!(long >= small + 600, "{small} {long}");
        assert!(small >= size_of::<Increment>() + 3 * ARC_HEADER);
        let events: Vec<_> = (0..100)
            .map(|i| inc(&format!("{i:0>500}"), Some(&"i".repeat(256))))
            .collect();
        // 100 events of about 800 string bytes each fit a 100 KiB body.
        assert!(estimate_bytes(&events) <= largest_request_bytes(100 * 1024, 100));
        assert!(estimate_bytes(&vec![inc("u", None)]) <= largest_request_bytes(1024, 1));
    }

    #[test]
    fn a_share_holds_its_part_and_gives_it_back() {
        let shared = Arc::new(SharedQueue::new(&PipelineConfig {
            queue_capacity: 100,
            queue_bytes: 1000,
            tenant_queue_share: 50,
            ..PipelineConfig::default()
        }));
        let (a, b) = (shared.new_share(), shared.new_share());
        let held = Held::try_take(&shared, &a, 50, 10).expect("half fits");
        assert!(
            Held::try_take(&shared, &a, 1, 1).is_none(),
            "a's share is full"
        );
        let other = Held::try_take(&shared, &b, 10, 500).expect("b has its own");
        assert!(
            Held::try_take(&shared, &b, 1, 1).is_none(),
            "b's bytes are full"
        );
        assert_eq!((shared.depth(), shared.bytes()), (60, 510));
        drop(held);
        drop(other);
        assert_eq!((shared.depth(), shared.bytes(), a.depth()), (0, 0, 0));
    }

    #[test]
    fn a_share_that_ran_out_admits_again_once_under_three_quarters() {
        let shared = Arc::new(SharedQueue::new(&PipelineConfig {
            queue_capacity: 100,
            queue_bytes: 1000,
            tenant_queue_share: 100,
            ..PipelineConfig::default()
        }));
        let a = shared.new_share();
        assert!(a.admitting(&shared), "admits until it runs out");
        let full = Held::try_take(&shared, &a, 90, 10).expect("fits");
        assert!(Held::try_take(&shared, &a, 20, 10).is_none());
        a.shed();
        assert!(!a.admitting(&shared), "shedding at 90%");
        drop(full);
        let most = Held::try_take(&shared, &a, 76, 10).expect("fits");
        assert!(!a.admitting(&shared), "still shedding at 76%");
        drop(most);
        let _some = Held::try_take(&shared, &a, 75, 10).expect("fits");
        assert!(a.admitting(&shared), "admits again at 75%");
        assert!(a.admitting(&shared), "and stays so");
    }
}
