//! The optional per-client rate limit: a token bucket per client (API key,
//! else IP address), refilled at the configured rate, holding up to one
//! second's worth so short bursts pass. IPv4 clients count by address, IPv6
//! clients by their /64 (one host usually holds a whole /64), and an
//! IPv4-mapped IPv6 address as its IPv4 address.
//!
//! Memory stays bounded: at [`MAX_CLIENTS`] buckets, a shard forgets the
//! buckets that are full again (they carry no state), and if that frees
//! fewer than [`EVICT_BATCH`], also the least recently seen ones, down to
//! [`MAX_CLIENTS`] - [`EVICT_BATCH`]. A flood of new addresses so only
//! pushes out clients quieter than the newest thousands of entries of the
//! shard, never an active one, and the O(n) pass runs at most once per
//! [`EVICT_BATCH`] new clients. Forgetting a bucket can only favour its
//! client (it comes back full).

use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Buckets kept per shard.
pub const MAX_CLIENTS: usize = 8_192;
/// Buckets at least forgotten at once when a shard is full.
pub const EVICT_BATCH: usize = MAX_CLIENTS / 8;
const SHARDS: usize = 16;

/// Who a limit applies to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Client {
    /// The non-secret id of an API key.
    Key(String),
    /// A peer address; the limiter counts an IPv6 address by its /64 and an
    /// IPv4-mapped one as its IPv4 address.
    Ip(IpAddr),
    /// Neither known (a router driven without a socket).
    Unknown,
}

impl Client {
    /// The client whose bucket a request of `self` uses: IPv4 addresses
    /// (mapped ones included) whole, IPv6 addresses cut to their /64.
    fn bucket_key(&self) -> Cow<'_, Client> {
        match self {
            Client::Ip(ip) => Cow::Owned(Client::Ip(match ip.to_canonical() {
                IpAddr::V4(v4) => IpAddr::V4(v4),
                IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !(u64::MAX as u128))),
            })),
            other => Cow::Borrowed(other),
        }
    }
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
        let client = client.bucket_key();
        let shard = &self.shards[(self.hasher.hash_one(&*client) as usize) % SHARDS];
        let mut map = shard.lock().expect("rate limit shard");
        let b = match map.get_mut(&*client) {
            Some(b) => b,
            None => {
                if map.len() >= MAX_CLIENTS {
                    self.evict(&mut map, now);
                }
                map.entry(client.into_owned()).or_insert(Bucket {
                    tokens: self.burst,
                    at: now,
                })
            }
        };
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

    /// Seconds after `now` at which `b` is full again (0 or less: it is).
    fn full_in(&self, b: &Bucket, now: Instant) -> f64 {
        let since = now.saturating_duration_since(b.at).as_secs_f64();
        (self.burst - b.tokens) / self.per_second - since
    }

    /// Makes room in a full shard: drops every bucket that is full again,
    /// then, if that freed fewer than [`EVICT_BATCH`], the least recently
    /// seen until [`EVICT_BATCH`] are free. (Not the ones full again soonest:
    /// that is the limited client that keeps asking, drained the longest.)
    fn evict(&self, map: &mut HashMap<Client, Bucket>, now: Instant) {
        map.retain(|_, b| self.full_in(b, now) > 0.0);
        let keep = MAX_CLIENTS - EVICT_BATCH;
        if map.len() <= keep {
            return;
        }
        let mut by_age: Vec<(Instant, &Client)> = map.iter().map(|(c, b)| (b.at, c)).collect();
        let drop = by_age.len() - keep;
        by_age.select_nth_unstable_by_key(drop - 1, |&(at, _)| at);
        let gone: Vec<Client> = by_age[..drop].iter().map(|(_, c)| (*c).clone()).collect();
        for c in &gone {
            map.remove(c);
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

    fn ip(s: &str) -> Client {
        Client::Ip(s.parse().unwrap())
    }

    #[test]
    fn a_limited_client_stays_limited_while_new_addresses_flood_in() {
        let rl = RateLimiter::new(1);
        let victim = Client::Key("victim".into());
        let t0 = Instant::now();
        assert!(rl.check(&victim, t0).is_ok());
        assert!(rl.check(&victim, t0).is_err());
        // Ten times the capacity of new addresses, 100 ns apart (0.13 s in
        // all, well under the second the victim's token takes to come back),
        // each draining its own bucket; the victim keeps asking meanwhile.
        let flood = (MAX_CLIENTS * SHARDS * 10) as u32;
        let step = Duration::from_nanos(100);
        for i in 0..flood {
            let now = t0 + step * i;
            let _ = rl.check(&Client::Ip(IpAddr::from(i.to_be_bytes())), now);
            if i % 64 == 0 {
                assert!(rl.check(&victim, now).is_err(), "reset after {i} addresses");
                let lens: Vec<usize> = rl.shards.iter().map(|s| s.lock().unwrap().len()).collect();
                assert!(lens.iter().all(|&n| n <= MAX_CLIENTS), "{lens:?}");
            }
        }
        let total: usize = rl.shards.iter().map(|s| s.lock().unwrap().len()).sum();
        assert!(total <= MAX_CLIENTS * SHARDS, "{total}");
    }

    #[test]
    fn ipv6_clients_share_a_bucket_per_64() {
        let rl = RateLimiter::new(1);
        let t0 = Instant::now();
        assert!(rl.check(&ip("2001:db8:1:2::1"), t0).is_ok());
        // Same /64, another host part: the same bucket, empty now.
        assert!(rl
            .check(&ip("2001:db8:1:2:ffff:ffff:ffff:ffff"), t0)
            .is_err());
        assert!(rl.check(&ip("2001:db8:1:2:abcd::7"), t0).is_err());
        // Other /64s have their own.
        assert!(rl.check(&ip("2001:db8:1:3::1"), t0).is_ok());
        assert!(rl.check(&ip("2001:db9:1:2::1"), t0).is_ok());
    }

    #[test]
    fn an_ipv4_mapped_address_counts_as_its_ipv4() {
        let rl = RateLimiter::new(1);
        let t0 = Instant::now();
        assert!(rl.check(&ip("192.0.2.7"), t0).is_ok());
        assert!(rl.check(&ip("::ffff:192.0.2.7"), t0).is_err());
        // And the other way round; IPv4 is counted per address, not per prefix.
        assert!(rl.check(&ip("::ffff:192.0.2.8"), t0).is_ok());
        assert!(rl.check(&ip("192.0.2.8"), t0).is_err());
        assert!(rl.check(&ip("192.0.2.9"), t0).is_ok());
    }
}
