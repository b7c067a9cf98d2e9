//! What the gateway knows of actors (the `actor` an event names): the
//! secret their marks are keyed with (see [`crate::domain::ActorKey`]) and
//! the limits per actor from the configuration.
//!
//! A limit is a rule such as `like: 10 per hour per actor` (every entity's
//! `like`) or `ARTICLE/like: 3 per day per actor` (that entity's only; it
//! replaces the rule of the action alone for it). Each (rule, actor) has a
//! token bucket holding the rule's count, refilled at that count per
//! period, on the injected clock. An event with an actor takes as many
//! tokens as its count (at least one, so that repeats and unlikes count
//! against the limit too); a request is checked whole before any token is
//! taken, and refused whole (429 `throttled`) when one actor of it is over.
//!
//! Limits are kept in this process's memory, per gateway instance: N
//! instances behind a balancer let an actor through up to N times the rule.
//! The buckets are [`crate::ratelimit::TokenBuckets`], bounded in memory the
//! same way as the per-client rate limit (a forgotten bucket comes back
//! full, which can only favour its actor). Actors are held as a keyed
//! 64-bit hash of (tenant, actor), never as text.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Duration;

use crate::domain::{validate_name, ActorKey, CounterKey};
use crate::ratelimit::{Rate, TokenBuckets};

/// One configured limit.
#[derive(Clone, Debug, PartialEq)]
pub struct LimitRule {
    /// `None`: every entity's `action` (unless a rule names the entity).
    pub entity: Option<String>,
    pub action: String,
    /// Events allowed per period.
    pub count: u32,
    pub period: Duration,
    /// The rule as configured, to name it in a refusal.
    pub text: String,
}

const RULE_FORM: &str =
    "expected \"[<entity>/]<action>: <n> per [<k>] <second|minute|hour|day> per actor\", e.g. \"like: 10 per hour per actor\" or \"ARTICLE/like: 3 per day per actor\"";

impl LimitRule {
    /// Parses one `--actor-limit`; the error names the rule and says why.
    pub fn parse(text: &str) -> Result<LimitRule, String> {
        let bad = |why: &str| format!("--actor-limit {text:?}: {why}; {RULE_FORM}");
        // Actions may hold `:` (`comments:approved`): the rule's own is the last.
        let (target, spec) = text.rsplit_once(':').ok_or_else(|| bad("no `:`"))?;
        let target = target.trim();
        let (entity, action) = match target.split_once('/') {
            Some((e, a)) => (Some(e.trim()), a.trim()),
            None => (None, target),
        };
        if let Some(e) = entity {
            validate_name("entity", e).map_err(|e| bad(&e))?;
        }
        validate_name("action", action).map_err(|e| bad(&e))?;
        let words: Vec<&str> = spec.split_whitespace().collect();
        let (count, k, unit) = match words.as_slice() {
            [n, "per", unit, "per", "actor"] => (*n, "1", *unit),
            [n, "per", k, unit, "per", "actor"] => (*n, *k, *unit),
            _ => return Err(bad("the limit does not read as one")),
        };
        let count: u32 = count
            .parse()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| bad(&format!("{count:?} is not a whole number of at least 1")))?;
        let k: u64 = k
            .parse()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| bad(&format!("{k:?} is not a whole number of at least 1")))?;
        let seconds = match unit.trim_end_matches('s') {
            "second" => 1,
            "minute" => 60,
            "hour" => 3_600,
            "day" => 86_400,
            _ => return Err(bad(&format!("unknown period {unit:?}"))),
        };
        let period = k
            .checked_mul(seconds)
            .filter(|s| *s <= 366 * 86_400)
            .map(Duration::from_secs)
            .ok_or_else(|| bad("the period is longer than a year"))?;
        Ok(LimitRule {
            entity: entity.map(str::to_string),
            action: action.to_string(),
            count,
            period,
            text: text.trim().to_string(),
        })
    }

    fn rate(&self) -> Rate {
        Rate {
            per_second: f64::from(self.count) / self.period.as_secs_f64(),
            burst: f64::from(self.count),
        }
    }
}

/// The rules, found by (entity, action), and their buckets.
pub struct ActorLimits {
    rules: Vec<LimitRule>,
    /// `(Some(entity), action)` or `(None, action)` -> index in `rules`.
    by_target: HashMap<(Option<String>, String), usize>,
    buckets: TokenBuckets<(u32, u64)>,
    /// Keys the 64-bit hash of (tenant, actor): not guessable from outside,
    /// so nobody can make two actors share a bucket on purpose.
    hasher: std::collections::hash_map::RandomState,
}

impl ActorLimits {
    /// The limits of these rules; a rule given twice for one target is refused.
    pub fn new(rules: Vec<LimitRule>) -> Result<ActorLimits, String> {
        let mut by_target: HashMap<(Option<String>, String), usize> = HashMap::new();
        for (i, r) in rules.iter().enumerate() {
            let target = (r.entity.clone(), r.action.clone());
            if let Some(&j) = by_target.get(&target) {
                return Err(format!(
                    "--actor-limit {:?} and {:?} limit the same action; give one",
                    rules[j].text, r.text
                ));
            }
            by_target.insert(target, i);
        }
        Ok(ActorLimits {
            rules,
            by_target,
            buckets: TokenBuckets::default(),
            hasher: Default::default(),
        })
    }

    /// Parses every `--actor-limit`.
    pub fn parse(texts: &[String]) -> Result<Option<ActorLimits>, String> {
        if texts.is_empty() {
            return Ok(None);
        }
        let rules = texts
            .iter()
            .map(|t| LimitRule::parse(t))
            .collect::<Result<Vec<_>, _>>()?;
        ActorLimits::new(rules).map(Some)
    }

    /// The rule of an event on `key`: its entity's, else its action's.
    fn rule_of(&self, key: &CounterKey) -> Option<usize> {
        if self.by_target.is_empty() {
            return None;
        }
        let action = key.action.to_string();
        self.by_target
            .get(&(Some(key.entity.to_string()), action.clone()))
            .or_else(|| self.by_target.get(&(None, action)))
            .copied()
    }

    pub fn rules(&self) -> &[LimitRule] {
        &self.rules
    }

    /// Buckets held now (bounded; see the module doc).
    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }
}

/// Why a request was refused by a limit per actor.
#[derive(Debug, Clone, PartialEq)]
pub struct Throttled {
    /// The rule, as configured.
    pub rule: String,
    /// The first event (index in the request) of the actor over the limit.
    pub index: usize,
    /// When that actor has room again for what it asked.
    pub retry_after: Duration,
    /// The actor asked for more than the rule allows in a whole period.
    pub never: bool,
}

/// The tokens one request asks of the limits, summed per (rule, actor).
#[derive(Default)]
pub struct Asks {
    wants: Vec<((u32, u64), f64, usize)>,
    at: HashMap<(u32, u64), usize>,
}

/// The actor secret and the limits, for one tenant. Cheap to clone.
#[derive(Clone, Default)]
pub struct Actors {
    pub key: ActorKey,
    limits: Option<Arc<ActorLimits>>,
    /// Mixed into the actor's hash: tenants share the buckets' memory bound,
    /// never an actor's bucket.
    tenant: u64,
}

impl std::fmt::Debug for Actors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Actors")
            .field("key", &self.key)
            .field("rules", &self.limits.as_ref().map_or(0, |l| l.rules.len()))
            .finish()
    }
}

impl Actors {
    pub fn new(key: ActorKey, limits: Option<ActorLimits>) -> Actors {
        Actors {
            key,
            limits: limits.map(Arc::new),
            tenant: 0,
        }
    }

    /// The same secret and rules for `tenant`, whose actors have buckets of
    /// their own (in the same bounded memory) and marks of their own (the
    /// tenant is in their hash).
    pub fn for_tenant(&self, tenant: &str) -> Actors {
        let hashed = self
            .limits
            .as_ref()
            .map_or(0, |l| l.hasher.hash_one(("tenant", tenant)));
        Actors {
            key: self.key.for_tenant(tenant),
            limits: self.limits.clone(),
            tenant: hashed,
        }
    }

    pub fn limits(&self) -> Option<&ActorLimits> {
        self.limits.as_deref()
    }

    /// Adds what event `index` (on `key`, by `actor`, adding `delta`) asks
    /// of the limits; nothing without an actor or a rule for it.
    pub fn ask(
        &self,
        asks: &mut Asks,
        index: usize,
        key: &CounterKey,
        actor: Option<&str>,
        delta: i64,
    ) {
        let (Some(limits), Some(actor)) = (&self.limits, actor) else {
            return;
        };
        let Some(rule) = limits.rule_of(key) else {
            return;
        };
        let who = limits.hasher.hash_one((self.tenant, actor));
        let bucket = (rule as u32, who);
        let tokens = delta.unsigned_abs().max(1) as f64;
        match asks.at.get(&bucket) {
            Some(&i) => asks.wants[i].1 += tokens,
            None => {
                asks.at.insert(bucket, asks.wants.len());
                asks.wants.push((bucket, tokens, index));
            }
        }
    }

    /// Takes every token `asks` holds at `now_ms` (the injected clock), or
    /// none when one actor is over its rule.
    pub fn take(&self, asks: &Asks, now_ms: i64) -> Result<(), Throttled> {
        let Some(limits) = &self.limits else {
            return Ok(());
        };
        if asks.wants.is_empty() {
            return Ok(());
        }
        let wants: Vec<((u32, u64), Rate, f64)> = asks
            .wants
            .iter()
            .map(|(b, n, _)| (*b, limits.rules[b.0 as usize].rate(), *n))
            .collect();
        let now = Duration::from_millis(u64::try_from(now_ms).unwrap_or(0));
        limits.buckets.take_all(&wants, now).map_err(|(w, wait)| {
            let rule = &limits.rules[asks.wants[w].0 .0 as usize];
            Throttled {
                rule: rule.text.clone(),
                index: asks.wants[w].2,
                never: wants[w].2 > f64::from(rule.count),
                retry_after: if wants[w].2 > f64::from(rule.count) {
                    rule.period
                } else {
                    wait
                },
            }
        })
    }
}

/// The file of the generated secret in the embedded store's data directory.
pub const SECRET_FILE: &str = "actor-secret";

/// The actor secret of an embedded store without `--actor-secret`: the one
/// in `<data_dir>/actor-secret`, made on first start (32 random bytes, in
/// hex, readable by the owner only). It lives with the data whose marks it
/// keys, so it stays the same across restarts (a new secret would count
/// every actor again), and a copy of the directory keeps working.
pub fn embedded_secret(data_dir: &std::path::Path) -> Result<ActorKey, String> {
    if let Some(key) = existing_embedded_secret(data_dir)? {
        return Ok(key);
    }
    let mut bytes = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .map_err(|_| "no randomness for a new actor secret".to_string())?;
    let hex = crate::domain::to_hex(&bytes);
    if keep_embedded_secret(data_dir, &hex)? {
        tracing::info!(path = %data_dir.join(SECRET_FILE).display(), "made a new actor secret");
        return ActorKey::new(hex.as_bytes());
    }
    // Another process made it first: use theirs.
    embedded_secret(data_dir)
}

/// The secret in `<data_dir>/actor-secret`, if that file exists (never
/// made here: `export` and `migrate` read it, and must not invent one).
/// An empty file is an error, never taken as absent: it may be what a crash
/// of an earlier version left of a secret marks were keyed with, and a new
/// secret would count every one of those actors again.
pub fn existing_embedded_secret(data_dir: &std::path::Path) -> Result<Option<ActorKey>, String> {
    let path = data_dir.join(SECRET_FILE);
    let shown = path.display();
    match std::fs::read(&path) {
        Ok(bytes) if bytes.trim_ascii().is_empty() => Err(format!(
            "the actor secret {shown} is empty (an earlier version could leave it so when it crashed while writing it): restore it from a backup of this data directory; only if no event with `unique` was ever counted here, delete it and a new one is made"
        )),
        Ok(bytes) => ActorKey::new(&bytes)
            .map(Some)
            .map_err(|e| format!("{shown}: {e}")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read the actor secret {shown}: {e}")),
    }
}

/// Writes `secret` to `<data_dir>/actor-secret` unless that file exists;
/// `false` when it did (left as it is). The one writer of that file: the
/// gateway's first start and `import` (handing the secret of the marks it
/// brings to the gateway that will serve them) write the same bytes, the
/// secret as [`ActorKey::new`] keys with it (without surrounding
/// whitespace), and nothing that it would refuse.
///
/// Atomic: the secret goes to a temporary file in the same directory
/// (readable by the owner only), fsync'd, then linked to its name, which
/// fails when the name exists (a rename would replace the secret another
/// process just made and keyed with), then the directory is fsync'd. A
/// crash leaves either no `actor-secret` or the whole one, at worst with a
/// leftover `.actor-secret.*.tmp` that nothing reads.
pub fn keep_embedded_secret(data_dir: &std::path::Path, secret: &str) -> Result<bool, String> {
    static TEMPORARIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let secret = secret.trim_ascii();
    ActorKey::new(secret.as_bytes())?;
    let path = data_dir.join(SECRET_FILE);
    let shown = path.display();
    let temporary = data_dir.join(format!(
        ".{SECRET_FILE}.{}.{}.tmp",
        std::process::id(),
        TEMPORARIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let written = (|| {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut f = options.open(&temporary)?;
        std::io::Write::write_all(&mut f, secret.as_bytes())?;
        f.sync_all()
    })();
    let linked = written.and_then(|()| std::fs::hard_link(&temporary, &path));
    let _ = std::fs::remove_file(&temporary);
    let kept = match linked {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
        Err(e) => return Err(format!("cannot write the actor secret {shown}: {e}")),
    };
    std::fs::File::open(data_dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| format!("cannot write the actor secret {shown}: {e}"))?;
    Ok(kept)
}

/// A gateway on Elasticsearch at start: `recorded` holds (index,
/// fingerprint) of every tenant whose marks `migrate` or `import` recorded
/// the secret of. A secret of another fingerprint would count every actor
/// of those tenants once more: refused, naming both. Without a secret the
/// gateway refuses `unique` anyway; the answer is then a warning to log,
/// naming the fingerprint to look for.
pub fn check_recorded_secret(
    recorded: &[(String, String)],
    key: &ActorKey,
) -> Result<Option<String>, String> {
    let Some((index, wanted)) = recorded.first() else {
        return Ok(None);
    };
    match key.fingerprint() {
        None => Ok(Some(format!(
            "the actor marks in {index} were keyed with the actor secret of fingerprint {wanted}: give every gateway that secret (COUNTER_GATEWAY_ACTOR_SECRET) to count once per actor"
        ))),
        Some(mine) => match recorded.iter().find(|(_, fp)| *fp != mine) {
            None => Ok(None),
            Some((index, theirs)) => Err(format!(
                "the actor marks in {index} were keyed with the actor secret of fingerprint {theirs} (recorded by migrate or import), and this gateway's COUNTER_GATEWAY_ACTOR_SECRET has fingerprint {mine}: with it every actor would count once more. Start it with the secret `migrate` named (the embedded store's actor-secret file), or, to start counting afresh under this one, delete that tenant's actor mark indices"
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(e: &str, a: &str) -> CounterKey {
        CounterKey::new(e, a, "u1").unwrap()
    }

    #[test]
    fn rules_parse_or_say_why_naming_the_rule() {
        let r = LimitRule::parse("like: 10 per hour per actor").unwrap();
        assert_eq!((r.entity, r.action.as_str(), r.count), (None, "like", 10));
        assert_eq!(r.period, Duration::from_secs(3600));
        let r = LimitRule::parse("ARTICLE/like: 3 per 2 days per actor").unwrap();
        assert_eq!(r.entity.as_deref(), Some("ARTICLE"));
        assert_eq!(r.period, Duration::from_secs(2 * 86_400));
        let r = LimitRule::parse("comments:approved: 5 per minute per actor").unwrap();
        assert_eq!(r.action, "comments:approved");
        for bad in [
            "like 10 per hour per actor",
            "like: ten per hour per actor",
            "like: 0 per hour per actor",
            "like: 10 per fortnight per actor",
            "like: 10 per hour",
            "like: 10 per hour per ip",
            ": 10 per hour per actor",
            "like: 1 per 400 days per actor",
        ] {
            let e = LimitRule::parse(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
        let twice = ActorLimits::parse(&[
            "like: 1 per hour per actor".into(),
            "like: 2 per day per actor".into(),
        ]);
        assert!(twice.err().unwrap().contains("the same action"));
    }

    #[test]
    fn a_limit_is_hit_and_resets_per_actor_and_the_entity_rule_wins() {
        let limits = ActorLimits::parse(&[
            "like: 2 per hour per actor".into(),
            "ARTICLE/like: 1 per day per actor".into(),
        ])
        .unwrap();
        let actors = Actors::new(ActorKey::none(), limits);
        let t0 = 1_000_000_000_000;
        let one = |e: &str, who: &str, at: i64| {
            let mut asks = Asks::default();
            actors.ask(&mut asks, 0, &key(e, "like"), Some(who), 1);
            actors.take(&asks, at)
        };
        assert!(one("VIDEO", "alice", t0).is_ok());
        assert!(one("VIDEO", "alice", t0).is_ok());
        let t = one("VIDEO", "alice", t0).unwrap_err();
        assert_eq!(t.rule, "like: 2 per hour per actor");
        assert_eq!(t.retry_after, Duration::from_secs(1800));
        // Bob has his own bucket; half an hour later Alice has one like again.
        assert!(one("VIDEO", "bob", t0).is_ok());
        assert!(one("VIDEO", "alice", t0 + 1_800_000).is_ok());
        assert!(one("VIDEO", "alice", t0 + 1_800_000).is_err());
        // ARTICLE likes have their own rule.
        assert!(one("ARTICLE", "alice", t0).is_ok());
        let t = one("ARTICLE", "alice", t0).unwrap_err();
        assert_eq!(t.rule, "ARTICLE/like: 1 per day per actor");
        // Another tenant's Alice is another actor.
        let other = actors.for_tenant("acme");
        let mut asks = Asks::default();
        other.ask(&mut asks, 0, &key("ARTICLE", "like"), Some("alice"), 1);
        assert!(other.take(&asks, t0).is_ok());
    }

    #[test]
    fn a_request_over_the_limit_takes_nothing() {
        let limits = ActorLimits::parse(&["like: 3 per hour per actor".into()]).unwrap();
        let actors = Actors::new(ActorKey::none(), limits);
        let t0 = 1_000_000_000_000;
        let mut asks = Asks::default();
        // Bob once, Alice three times, Carol once, then Alice again: over.
        for (i, who) in ["bob", "alice", "alice", "alice", "carol", "alice"]
            .iter()
            .enumerate()
        {
            actors.ask(&mut asks, i, &key("X", "like"), Some(who), 1);
        }
        let t = actors.take(&asks, t0).unwrap_err();
        assert_eq!(t.index, 1);
        // Nothing was taken: Bob and Carol still have three each.
        for who in ["bob", "carol", "alice"] {
            let mut asks = Asks::default();
            actors.ask(&mut asks, 0, &key("X", "like"), Some(who), 3);
            assert!(actors.take(&asks, t0).is_ok(), "{who}");
        }
        // A count over the whole rule can never pass.
        let mut asks = Asks::default();
        actors.ask(&mut asks, 0, &key("X", "like"), Some("dave"), 4);
        let t = actors.take(&asks, t0).unwrap_err();
        assert!(t.never);
        // Events without an actor, or of an action without a rule, ask nothing.
        let mut asks = Asks::default();
        actors.ask(&mut asks, 0, &key("X", "like"), None, 1);
        actors.ask(&mut asks, 1, &key("X", "view"), Some("alice"), 1);
        assert!(asks.wants.is_empty());
    }

    #[test]
    fn the_embedded_secret_is_made_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let k = key("X", "like");
        let first = embedded_secret(dir.path()).unwrap();
        let again = embedded_secret(dir.path()).unwrap();
        assert_eq!(first.mark(&k, "alice"), again.mark(&k, "alice"));
        let text = std::fs::read_to_string(dir.path().join(SECRET_FILE)).unwrap();
        assert_eq!(text.len(), 64);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(dir.path().join(SECRET_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let other = tempfile::tempdir().unwrap();
        let elsewhere = embedded_secret(other.path()).unwrap();
        assert_ne!(first.mark(&k, "alice"), elsewhere.mark(&k, "alice"));
        std::fs::write(dir.path().join(SECRET_FILE), "short").unwrap();
        assert!(embedded_secret(dir.path()).unwrap_err().contains("16"));
    }

    #[test]
    fn a_secret_with_surrounding_whitespace_keys_actors_the_same_after_a_restart() {
        let given = "  0123456789abcdef0123 \n";
        let k = key("X", "like");
        // Before the restart: the key the given secret makes (import's check,
        // a gateway started with it); after: the one read from the file.
        let before = ActorKey::new(given.as_bytes()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        assert!(keep_embedded_secret(dir.path(), given).unwrap());
        let text = std::fs::read_to_string(dir.path().join(SECRET_FILE)).unwrap();
        assert_eq!(text, "0123456789abcdef0123", "the secret as it keys");
        let after = embedded_secret(dir.path()).unwrap();
        assert_eq!(before.mark(&k, "alice"), after.mark(&k, "alice"));
        assert_eq!(before.fingerprint(), after.fingerprint());
        // A file written by hand with a newline keys as the flag without it.
        std::fs::write(dir.path().join(SECRET_FILE), "0123456789abcdef0123\n").unwrap();
        let again = embedded_secret(dir.path()).unwrap();
        assert_eq!(before.mark(&k, "alice"), again.mark(&k, "alice"));
    }

    #[test]
    fn no_empty_or_partial_secret_file_is_ever_left_or_silently_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join(SECRET_FILE);
        // A secret the gateway would refuse is never written: no file that
        // stops the next start.
        for refused in ["", "   \n", "short"] {
            assert!(
                keep_embedded_secret(dir.path(), refused).is_err(),
                "{refused:?}"
            );
            assert!(!secret.exists(), "{refused:?} left a file");
        }
        // What a crash of the writer leaves: a temporary, never read; the
        // secret is made anew (nothing was keyed with the unfinished one),
        // and the temporary of a finished write is gone.
        let leftover = dir.path().join(format!(".{SECRET_FILE}.1.0.tmp"));
        std::fs::write(&leftover, "an unfinished secret, never used").unwrap();
        let made = embedded_secret(dir.path()).unwrap();
        let unfinished = ActorKey::new(b"an unfinished secret, never used").unwrap();
        assert_ne!(made.fingerprint(), unfinished.fingerprint());
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        // An empty secret file (an earlier version's crash) stops start-up,
        // naming the file, and is not replaced by a new secret.
        std::fs::write(&secret, "").unwrap();
        let e = embedded_secret(dir.path()).unwrap_err();
        assert!(
            e.contains(&secret.display().to_string()) && e.contains("empty"),
            "{e}"
        );
        assert!(existing_embedded_secret(dir.path()).is_err());
        assert!(!keep_embedded_secret(dir.path(), "0123456789abcdef0123").unwrap());
        assert_eq!(std::fs::read_to_string(&secret).unwrap(), "");
    }

    #[test]
    fn a_secret_is_read_without_being_made_and_kept_only_where_none_is() {
        let dir = tempfile::tempdir().unwrap();
        assert!(existing_embedded_secret(dir.path()).unwrap().is_none());
        assert!(!dir.path().join(SECRET_FILE).exists());
        assert!(keep_embedded_secret(dir.path(), "0123456789abcdef0123").unwrap());
        assert!(!keep_embedded_secret(dir.path(), "another secret, never written").unwrap());
        let kept = existing_embedded_secret(dir.path()).unwrap().unwrap();
        let given = ActorKey::new(b"0123456789abcdef0123").unwrap();
        assert_eq!(kept.fingerprint(), given.fingerprint());
        assert_eq!(
            embedded_secret(dir.path()).unwrap().fingerprint(),
            given.fingerprint()
        );
    }

    #[test]
    fn a_gateway_refuses_a_secret_other_than_the_recorded_one() {
        let a = ActorKey::new(b"0123456789abcdef").unwrap();
        let b = ActorKey::new(b"fedcba9876543210").unwrap();
        let fa = a.fingerprint().unwrap();
        let recorded = vec![
            ("cg_acme_actor_marks".to_string(), fa.clone()),
            ("cg_default_actor_marks".to_string(), fa.clone()),
        ];
        assert_eq!(check_recorded_secret(&recorded, &a), Ok(None));
        assert_eq!(check_recorded_secret(&[], &b), Ok(None));
        let e = check_recorded_secret(&recorded, &b).unwrap_err();
        assert!(
            e.contains(&fa) && e.contains(&b.fingerprint().unwrap()),
            "{e}"
        );
        assert!(e.contains("cg_acme_actor_marks"), "{e}");
        let warn = check_recorded_secret(&recorded, &ActorKey::none())
            .unwrap()
            .unwrap();
        assert!(warn.contains(&fa), "{warn}");
    }

    #[test]
    fn memory_stays_bounded_under_a_flood_of_actors() {
        let limits = ActorLimits::parse(&["like: 1 per day per actor".into()]).unwrap();
        let actors = Actors::new(ActorKey::none(), limits);
        for i in 0..300_000u32 {
            let mut asks = Asks::default();
            actors.ask(&mut asks, 0, &key("X", "like"), Some(&i.to_string()), 1);
            let _ = actors.take(&asks, 1_000_000_000_000 + i64::from(i));
        }
        let held = actors.limits().unwrap().buckets();
        assert!(held <= crate::ratelimit::MAX_CLIENTS * 16, "{held} buckets");
    }
}
