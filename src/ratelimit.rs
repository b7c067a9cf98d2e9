//! The optional per-client rate limit: a token bucket per client (API key,
//! else IP address), refilled at the configured rate, holding up to one
//! second's worth so short bursts pass.
//!
//! Memory stays bounded: past [`MAX_CLIENTS`] buckets in a shard, the shard
//! forgets buckets that are full again (clients that went quiet), and if
//! that frees nothing, all of them (which can only favour clients).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Buckets kept per shard before quiet clients are forgotten.
pub const MAX_CLIENTS: usize = 8_192;
const SHARDS: usize = 16;

/// Who a limit applies to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Client {
    /// The non-secret id of an API key.
    Key(String),
    Ip(IpAddr),
    /// Neither known (a router driven without a socket).
    Unknown,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

pub struct RateLimiter {
    per_second: f64,
    burst: f64,
    shards: Vec<Mutex<HashMap<Client, Bucket>>>,
    hasher: std::collections::hash_map::RandomState,
}

impl RateLimiter {
    /// `per_second` requests a second per client, bursts of as many.
    pub fn new(per_second: u32) -> RateLimiter {
        let per_second = f64::from(per_second.max(1));
        RateLimiter {
            per_second,
            burst: per_second,
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: Default::default(),
        }
    }

    /// Takes one token for `client` at `now`; `Err(wait)` when there is
    /// none, `wait` being how long until there is.
    pub fn check(&self, client: &Client, now: Instant) -> Result<(), Duration> {
        let shard = &self.shards[(self.hasher.hash_one(client) as usize) % SHARDS];
        let mut map = shard.lock().expect("rate limit shard");
        if map.len() >= MAX_CLIENTS && !map.contains_key(client) {
            let (rate, burst) = (self.per_second, self.burst);
            map.retain(|_, b| b.tokens + now.duration_since(b.at).as_secs_f64() * rate < burst);
            if map.len() >= MAX_CLIENTS {
                map.clear();
            }
        }
        let b = map.entry(client.clone()).or_insert(Bucket {
            tokens: self.burst,
            at: now,
        });
        let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + elapsed * self.per_second).min(self.burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - b.tokens) / self.per_second))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_passes_then_waits_for_refill() {
        let rl = RateLimiter::new(2);
        let c = Client::Key("k".into());
        let t0 = Instant::now();
        assert!(rl.check(&c, t0).is_ok());
        assert!(rl.check(&c, t0).is_ok());
        let wait = rl.check(&c, t0).unwrap_err();
        assert!(wait > Duration::ZERO && wait <= Duration::from_millis(500));
        // Another client has its own bucket.
        assert!(rl.check(&Client::Key("other".into()), t0).is_ok());
        assert!(rl.check(&c, t0 + Duration::from_millis(500)).is_ok());
        assert!(rl.check(&c, t0 + Duration::from_millis(500)).is_err());
    }

    #[test]
    fn memory_stays_bounded() {
        let rl = RateLimiter::new(1);
        let t0 = Instant::now();
        for i in 0..(MAX_CLIENTS * SHARDS * 2) as u32 {
            let _ = rl.check(&Client::Ip(IpAddr::from(i.to_be_bytes())), t0);
        }
        let total: usize = rl.shards.iter().map(|s| s.lock().unwrap().len()).sum();
        assert!(total <= MAX_CLIENTS * SHARDS, "{total}");
    }
}
