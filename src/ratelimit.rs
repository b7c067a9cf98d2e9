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
    /// When `tokens` was last brought up to date, as time since the origin
    /// of the clock the caller measures with.
    at: Duration,
    /// Its rate: buckets of several rates share one map (actor limits).
    rate: Rate,
}

/// How fast a bucket fills, and how much it holds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rate {
    pub per_second: f64,
    pub burst: f64,
}

impl Bucket {
    fn refill(&mut self, now: Duration) {
        let elapsed = now.saturating_sub(self.at).as_secs_f64();
        let tokens = (self.tokens + elapsed * self.rate.per_second).min(self.rate.burst);
        // Rounded to a billionth: 1,200 s at 3 an hour is one whole token,
        // not 0.9999999999999999 of one.
        self.tokens = (tokens * 1e9).round() / 1e9;
        self.at = self.at.max(now);
    }

    /// Seconds after `now` at which it is full again (0 or less: it is).
    fn full_in(&self, now: Duration) -> f64 {
        let since = now.saturating_sub(self.at).as_secs_f64();
        (self.rate.burst - self.tokens) / self.rate.per_second - since
    }

    /// How long until `n` tokens are there (zero: they are).
    fn wait_for(&self, n: f64) -> Duration {
        if self.tokens >= n {
            return Duration::ZERO;
        }
        // To the microsecond, so a whole wait reads whole (1,200 s, not 1,200.0000000000002).
        let secs = ((n - self.tokens) / self.rate.per_second * 1e6).round() / 1e6;
        Duration::from_secs_f64(secs)
    }
}

/// Token buckets by key, in shards, with bounded memory (see the module
/// doc): the core of the per-client rate limit and of the limits per actor
/// (`crate::actors`). Time is passed in as time since an origin the caller
/// picks, so a limit can run on `Instant` or on the injected clock.
pub struct TokenBuckets<K> {
    shards: Vec<Mutex<HashMap<K, Bucket>>>,
    hasher: std::collections::hash_map::RandomState,
}

impl<K: Hash + Eq + Clone> Default for TokenBuckets<K> {
    fn default() -> Self {
        TokenBuckets {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: Default::default(),
        }
    }
}

impl<K: Hash + Eq + Clone> TokenBuckets<K> {
    fn shard_of(&self, key: &K) -> usize {
        (self.hasher.hash_one(key) as usize) % SHARDS
    }

    /// Takes `n` tokens of `key`'s bucket (a new one starts full) at
    /// `now`; `Err(wait)` when there are not enough, `wait` being how long
    /// until there are.
    pub fn take(&self, key: &K, rate: Rate, n: f64, now: Duration) -> Result<(), Duration> {
        self.take_all(&[(key.clone(), rate, n)], now)
            .map_err(|(_, wait)| wait)
    }

    /// Takes the tokens of every `(key, rate, n)` or of none: `Err((i,
    /// wait))` names the first that has too few and how long until it has
    /// enough. The shards involved are locked in ascending order for the
    /// whole check-then-take, so a concurrent call cannot slip in between.
    /// A key appears once in `wants` (sum its tokens first).
    pub fn take_all(
        &self,
        wants: &[(K, Rate, f64)],
        now: Duration,
    ) -> Result<(), (usize, Duration)> {
        let of_want: Vec<usize> = wants.iter().map(|(k, _, _)| self.shard_of(k)).collect();
        let mut shards = of_want.clone();
        shards.sort_unstable();
        shards.dedup();
        let mut guards: Vec<std::sync::MutexGuard<'_, HashMap<K, Bucket>>> = shards
            .iter()
            .map(|&i| self.shards[i].lock().expect("token bucket shard"))
            .collect();
        // Where each want's shard is among the guards.
        let slot: Vec<usize> = of_want
            .iter()
            .map(|s| shards.binary_search(s).unwrap_or_default())
            .collect();
        // Check all first, without creating buckets or taking tokens: a
        // refused call takes nothing. (A bucket checked is brought up to
        // date, which changes no count but marks it as recently seen, so a
        // client refused while it keeps asking is not the one evicted.)
        for (w, (key, rate, n)) in wants.iter().enumerate() {
            let wait = match guards[slot[w]].get_mut(key) {
                Some(b) => {
                    b.rate = *rate;
                    b.refill(now);
                    b.wait_for(*n)
                }
                None => Bucket {
                    tokens: rate.burst,
                    at: now,
                    rate: *rate,
                }
                .wait_for(*n),
            };
            if !wait.is_zero() {
                return Err((w, wait));
            }
        }
        for (w, (key, rate, n)) in wants.iter().enumerate() {
            let map = &mut guards[slot[w]];
            if !map.contains_key(key) && map.len() >= MAX_CLIENTS {
                evict(map, now);
            }
            let b = map.entry(key.clone()).or_insert(Bucket {
                tokens: rate.burst,
                at: now,
                rate: *rate,
            });
            b.rate = *rate;
            b.refill(now);
            b.tokens -= n;
        }
        Ok(())
    }

    /// Buckets held, over every shard.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().expect("token bucket shard").len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Makes room in a full shard: drops every bucket that is full again,
/// then, if that freed fewer than [`EVICT_BATCH`], the least recently
/// seen until [`EVICT_BATCH`] are free. (Not the ones full again soonest:
/// that is the limited client that keeps asking, drained the longest.)
fn evict<K: Hash + Eq + Clone>(map: &mut HashMap<K, Bucket>, now: Duration) {
    map.retain(|_, b| b.full_in(now) > 0.0);
    let keep = MAX_CLIENTS - EVICT_BATCH;
    if map.len() <= keep {
        return;
    }
    let mut by_age: Vec<(Duration, &K)> = map.iter().map(|(c, b)| (b.at, c)).collect();
    let drop = by_age.len() - keep;
    by_age.select_nth_unstable_by_key(drop - 1, |&(at, _)| at);
    let gone: Vec<K> = by_age[..drop].iter().map(|(_, c)| (*c).clone()).collect();
    for c in &gone {
        map.remove(c);
    }
}

/// The per-client rate limit: one token per request.
pub struct RateLimiter {
    rate: Rate,
    buckets: TokenBuckets<Client>,
    /// The origin of the limiter's time (`Instant` has no epoch).
    origin: Instant,
}

impl RateLimiter {
    /// `per_second` requests a second per client, bursts of as many.
    pub fn new(per_second: u32) -> RateLimiter {
        let per_second = f64::from(per_second.max(1));
        RateLimiter {
            rate: Rate {
                per_second,
                burst: per_second,
            },
            buckets: TokenBuckets::default(),
            origin: Instant::now(),
        }
    }

    /// Takes one token for `client` at `now`; `Err(wait)` when there is
    /// none, `wait` being how long until there is.
    pub fn check(&self, client: &Client, now: Instant) -> Result<(), Duration> {
        let client = client.bucket_key().into_owned();
        let since = now.saturating_duration_since(self.origin);
        self.buckets.take(&client, self.rate, 1.0, since)
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
        let total = rl.buckets.len();
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
                let lens: Vec<usize> = rl
                    .buckets
                    .shards
                    .iter()
                    .map(|s| s.lock().unwrap().len())
                    .collect();
                assert!(lens.iter().all(|&n| n <= MAX_CLIENTS), "{lens:?}");
            }
        }
        let total = rl.buckets.len();
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
