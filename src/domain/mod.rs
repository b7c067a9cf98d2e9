//! The typed domain: what a counter is, what a valid name is, and what an
//! increment means, independent of HTTP and of any store.

mod actor;
mod average;
mod backfill;
pub mod badge;
mod clock;
mod coalesce;
pub mod countapi;
mod counter;
mod digest;
mod event;
pub mod hours;
mod key;
pub mod milestone;
pub mod rank;
mod time;
pub mod trending;
mod window;
pub mod zone;

pub use actor::{
    from_hex, to_hex, validate_actor, ActorKey, Mark, Scope, Unique, FINGERPRINT_HEX,
    MAX_ACTOR_BYTES, MIN_ACTOR_SECRET_BYTES,
};
pub use average::SampleSpec;
pub use backfill::{parse_day, CounterSet, DaySet, DaySetSpec};
pub use clock::{Clock, ManualClock};
pub use coalesce::{coalesce, AverageDelta, Coalesced, Hours, KeyDelta};
pub use counter::{format_ms, Counter};
pub use digest::{digest, digest_hex};
pub use event::{Increment, IncrementSpec, Kind};
pub use hours::{format_hour, HourRange, ResolvedHours};
pub use key::{
    decode_doc_id, validate_name, CounterKey, Interner, Part, MAX_DOC_ID_BYTES, MAX_NAME_BYTES,
};
pub use time::{day_of, TimePolicy, DEFAULT_UNIQUE_MAX_AGE};
pub use window::{format_day, resolve as resolve_window, Resolved, Window, NAMED_INTERVALS};
