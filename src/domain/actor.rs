//! Counting once per person: the `actor` an event names (a user id, or
//! anything stable the page has) and the scope of its uniqueness, `ever` (a
//! like) or `day` (a view).
//!
//! The raw actor never leaves the edge. What the stores keep is a [`Mark`]:
//! HMAC-SHA256, keyed with the gateway's actor secret, over the counter's
//! document id and the actor, cut to 128 bits, then once more over the
//! tenant and that (see [`ActorKey::mark`]). Keyed, so that the stored
//! marks cannot be matched against a list of likely actors (e-mail
//! addresses, user ids) without the secret; over the counter too, so that
//! even with the store in hand one cannot tell that the same actor liked two
//! different counters (no profile across counters can be read from it);
//! over the tenant, so that the operator of two tenants sharing a secret
//! (and a counter id) cannot link one person across them by equal marks.
//!
//! The tenant is hashed over the earlier mark (which the first versions
//! stored, without the tenant) rather than beside the actor, so that a
//! store's existing marks are brought to it in place, without knowing a
//! single actor: [`ActorKey::rekey`] (the embedded store's migration,
//! `import` of an older file).

use std::sync::Arc;

use super::CounterKey;

/// Longest accepted actor, in bytes.
pub const MAX_ACTOR_BYTES: usize = 256;

/// Shortest accepted actor secret, in bytes: 128 bits of a random one.
pub const MIN_ACTOR_SECRET_BYTES: usize = 16;

/// How long an actor's uniqueness lasts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Once per actor and counter, for good: a like. A decrement takes it
    /// back (an unlike), after which the actor may count again.
    Ever,
    /// Once per actor, counter and UTC day of the event: a view. Not taken
    /// back.
    Day,
}

impl Scope {
    pub fn parse(raw: &str) -> Result<Scope, String> {
        match raw {
            "ever" => Ok(Scope::Ever),
            "day" => Ok(Scope::Day),
            other => Err(format!(
                "unique must be \"ever\" (once per actor and counter) or \"day\" (once per actor, counter and UTC day), not {other:?}"
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Ever => "ever",
            Scope::Day => "day",
        }
    }
}

/// The keyed hash of one actor on one counter: all a store keeps of the actor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Mark(pub [u8; 16]);

impl Mark {
    /// Lower-case hex, 32 characters (document ids on Elasticsearch).
    pub fn hex(&self) -> String {
        to_hex(&self.0)
    }

    /// A mark from its [`Mark::hex`] form: exactly 32 lower-case hex
    /// digits (what `export` writes), so one mark has one spelling.
    pub fn from_hex(text: &str) -> Option<Mark> {
        from_hex::<16>(text).map(Mark)
    }
}

/// `N` bytes from exactly `2 * N` lower-case hex digits ([`to_hex`]'s
/// form, so a value has one spelling); `None` otherwise.
pub fn from_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N
        || !text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Lower-case hex of `bytes`.
pub fn to_hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// What an event with `unique` asks of the store: count it only if this
/// mark (in this scope, and for `day` on the event's day) allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unique {
    pub scope: Scope,
    pub mark: Mark,
}

/// The actor secret the marks are keyed with (`None`: the gateway has
/// none, and events with `unique` are refused), for one tenant.
#[derive(Clone)]
pub struct ActorKey {
    secret: Option<Arc<ring::hmac::Key>>,
    /// Hashed into every mark: see the module doc.
    tenant: Arc<str>,
}

impl Default for ActorKey {
    fn default() -> Self {
        ActorKey::none()
    }
}

impl std::fmt::Debug for ActorKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret, not even in a debug print.
        f.write_str(if self.secret.is_some() {
            "ActorKey(set)"
        } else {
            "ActorKey(none)"
        })
    }
}

/// Keeps the marks of one version apart from any other use of the secret.
const MARK_CONTEXT: &[u8] = b"counter-gateway actor mark v1\0";

/// What the second HMAC of a mark (the tenant over the first) begins with:
/// a use of its own, so no mark of one step is ever one of the other.
const TENANT_CONTEXT: &[u8] = b"counter-gateway actor mark of a tenant v2\0";

/// What a secret's fingerprint is the HMAC of: a use of its own, so the
/// fingerprint is no mark of any actor on any counter.
const FINGERPRINT_CONTEXT: &[u8] = b"counter-gateway actor secret fingerprint v1\0";

/// Hex digits of a fingerprint: 64 bits, enough to tell two secrets apart
/// (by accident they agree once in 2^64), too few to stand for the secret.
pub const FINGERPRINT_HEX: usize = 16;

impl ActorKey {
    /// A key from `secret`, which must hold at least
    /// [`MIN_ACTOR_SECRET_BYTES`] bytes. ASCII whitespace at either end is
    /// not part of it, wherever it comes from (a flag, the environment, the
    /// data directory's file, which `echo` ends with a newline): one secret
    /// keys actors one way whichever path it took, and what is written to
    /// the file is what is read back.
    /// The key is the default tenant's; [`ActorKey::for_tenant`] gives
    /// another's.
    pub fn new(secret: &[u8]) -> Result<ActorKey, String> {
        let secret = secret.trim_ascii();
        if secret.len() < MIN_ACTOR_SECRET_BYTES {
            return Err(format!(
                "the actor secret is {} bytes; it needs at least {MIN_ACTOR_SECRET_BYTES} (e.g. `head -c 32 /dev/urandom | base64`)",
                secret.len()
            ));
        }
        Ok(ActorKey {
            secret: Some(Arc::new(ring::hmac::Key::new(
                ring::hmac::HMAC_SHA256,
                secret,
            ))),
            tenant: Arc::from(crate::tenant::DEFAULT_TENANT),
        })
    }

    /// No secret: `unique` is refused.
    pub fn none() -> ActorKey {
        ActorKey {
            secret: None,
            tenant: Arc::from(crate::tenant::DEFAULT_TENANT),
        }
    }

    /// The same secret, keying the marks of `tenant`.
    pub fn for_tenant(&self, tenant: &str) -> ActorKey {
        ActorKey {
            secret: self.secret.clone(),
            tenant: Arc::from(tenant),
        }
    }

    /// The tenant whose marks this key makes.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    pub fn is_set(&self) -> bool {
        self.secret.is_some()
    }

    /// What names the secret without giving it away: 16 hex digits of
    /// HMAC-SHA256 keyed with it over a fixed text; `None` without a secret.
    /// Written where marks travel (`export`) and recorded where they land
    /// (Elasticsearch), so that marks are never mixed with, or read under,
    /// another secret unnoticed. Like every mark, it lets one test a guess
    /// of the secret offline: secrets are random (the generated one is 32
    /// random bytes), never a word.
    pub fn fingerprint(&self) -> Option<String> {
        let k = self.secret.as_ref()?;
        let tag = ring::hmac::sign(k, FINGERPRINT_CONTEXT);
        Some(to_hex(&tag.as_ref()[..FINGERPRINT_HEX / 2]))
    }

    /// The mark of `actor` on `key` in this key's tenant, `None` without a
    /// secret: [`ActorKey::rekey`] of [`ActorKey::untenanted_mark`].
    pub fn mark(&self, key: &CounterKey, actor: &str) -> Option<Mark> {
        self.rekey(self.untenanted_mark(key, actor)?)
    }

    /// The mark of this tenant that `old`, a mark of the first keying
    /// ([`ActorKey::untenanted_mark`]), becomes: HMAC-SHA256 over a context
    /// of its own, the tenant, a NUL (no tenant name holds one) and the 16
    /// bytes of `old`, cut to 128 bits. A keyed function of a keyed
    /// function: without the secret it tells nothing, and with it, marks of
    /// two tenants are linked only by guessing the actor (as any mark is
    /// tested against a guess). `None` without a secret.
    pub fn rekey(&self, old: Mark) -> Option<Mark> {
        let k = self.secret.as_ref()?;
        let mut ctx = ring::hmac::Context::with_key(k);
        ctx.update(TENANT_CONTEXT);
        ctx.update(self.tenant.as_bytes());
        ctx.update(b"\0");
        ctx.update(&old.0);
        let tag = ctx.sign();
        let mut out = [0u8; 16];
        out.copy_from_slice(&tag.as_ref()[..16]);
        Some(Mark(out))
    }

    /// The mark of the first keying, without the tenant: what stores
    /// written before the tenant was hashed in hold, and what
    /// [`ActorKey::rekey`] brings to the tenant. Never stored by this build.
    pub fn untenanted_mark(&self, key: &CounterKey, actor: &str) -> Option<Mark> {
        let k = self.secret.as_ref()?;
        let mut ctx = ring::hmac::Context::with_key(k);
        ctx.update(MARK_CONTEXT);
        // The document id is injective, and an actor holds no control
        // character: the NUL between them cannot be shifted.
        ctx.update(key.doc_id().as_bytes());
        ctx.update(b"\0");
        ctx.update(actor.as_bytes());
        let tag = ctx.sign();
        let mut out = [0u8; 16];
        out.copy_from_slice(&tag.as_ref()[..16]);
        Some(Mark(out))
    }
}

/// Checks an actor as the API accepts it; the error names the field.
pub fn validate_actor(actor: &str) -> Result<(), String> {
    if actor.is_empty() {
        return Err("actor must not be empty".into());
    }
    if actor.len() > MAX_ACTOR_BYTES {
        return Err(format!(
            "actor is {} bytes, over the limit of {MAX_ACTOR_BYTES}",
            actor.len()
        ));
    }
    if actor.chars().any(char::is_control) {
        return Err("actor contains a control character".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(u: &str) -> CounterKey {
        CounterKey::new("ARTICLE", "like", u).unwrap()
    }

    #[test]
    fn marks_are_keyed_and_differ_per_counter_and_actor() {
        let a = ActorKey::new(b"0123456789abcdef").unwrap();
        let b = ActorKey::new(b"fedcba9876543210").unwrap();
        let m = a.mark(&key("a1"), "alice").unwrap();
        assert_eq!(m, a.mark(&key("a1"), "alice").unwrap());
        assert_ne!(m, a.mark(&key("a2"), "alice").unwrap());
        assert_ne!(m, a.mark(&key("a1"), "bob").unwrap());
        assert_ne!(m, b.mark(&key("a1"), "alice").unwrap());
        assert_eq!(m.hex().len(), 32);
        assert!(ActorKey::none().mark(&key("a1"), "alice").is_none());
        assert!(ActorKey::new(b"short").unwrap_err().contains("16"));
        assert_eq!(format!("{a:?}"), "ActorKey(set)");
        assert_eq!(Mark::from_hex(&m.hex()), Some(m));
        for bad in [
            "",
            "0123",
            &m.hex().to_uppercase(),
            &format!("{}0", m.hex()),
            &"g".repeat(32),
        ] {
            assert_eq!(Mark::from_hex(bad), None, "{bad}");
        }
    }

    #[test]
    fn marks_differ_per_tenant_and_come_from_the_first_keying() {
        let a = ActorKey::new(b"0123456789abcdef").unwrap();
        assert_eq!(a.tenant(), "default");
        let acme = a.for_tenant("acme");
        let k = key("a1");
        let m = a.mark(&k, "alice").unwrap();
        assert_ne!(m, acme.mark(&k, "alice").unwrap());
        assert_ne!(m, a.untenanted_mark(&k, "alice").unwrap());
        // What the migration relies on: the new mark from the old alone.
        let old = acme.untenanted_mark(&k, "alice").unwrap();
        assert_eq!(old, a.untenanted_mark(&k, "alice").unwrap());
        assert_eq!(acme.rekey(old), acme.mark(&k, "alice"));
        assert_eq!(a.rekey(old), Some(m));
        // The fingerprint names the secret, whatever the tenant.
        assert_eq!(a.fingerprint(), acme.fingerprint());
        assert_eq!(ActorKey::none().for_tenant("acme").rekey(old), None);
    }

    #[test]
    fn a_fingerprint_tells_secrets_apart_and_is_no_mark() {
        let a = ActorKey::new(b"0123456789abcdef").unwrap();
        let fp = a.fingerprint().unwrap();
        assert_eq!(fp.len(), FINGERPRINT_HEX);
        assert_eq!(
            Some(fp.clone()),
            ActorKey::new(b"0123456789abcdef").unwrap().fingerprint()
        );
        assert_ne!(
            Some(fp.clone()),
            ActorKey::new(b"0123456789abcdeg").unwrap().fingerprint()
        );
        assert!(!fp.contains("0123456789abcdef"));
        assert_eq!(ActorKey::none().fingerprint(), None);
    }

    #[test]
    fn actors_and_scopes_are_checked() {
        assert!(validate_actor("user-42").is_ok());
        assert!(validate_actor("").unwrap_err().starts_with("actor"));
        assert!(validate_actor(&"x".repeat(257))
            .unwrap_err()
            .contains("257 bytes"));
        assert!(validate_actor(&"é".repeat(128)).is_ok());
        assert!(validate_actor("a\tb").unwrap_err().contains("control"));
        assert_eq!(Scope::parse("ever"), Ok(Scope::Ever));
        assert_eq!(Scope::parse("day"), Ok(Scope::Day));
        assert!(Scope::parse("week").unwrap_err().starts_with("unique"));
    }
}
