//! CountAPI's names, keys and rules, mapped onto ordinary counters.
//!
//! A CountAPI counter is `(namespace, key)`, both of 3 to 64 characters of
//! `A-Z a-z 0-9 _ - .`. It is the counter `countapi/<namespace>/<key>`
//! (entity [`ENTITY`], action the namespace, uuid the key): one counter per
//! pair and one pair per counter (the parts are taken whole, and the
//! document id escapes `_`), so every other endpoint reads them, and
//! `GET /v1/top/countapi/<namespace>` lists a namespace's keys.
//!
//! What CountAPI kept besides the value is kept apart, per tenant: a
//! namespace made by `create` has an admin key, stored only as its
//! SHA-256 (as API keys are), and a key made by `create` its rules
//! ([`KeyRules`]: `enable_reset` and the bounds of `update`). A key first
//! counted by `hit` has the default rules.

use subtle::ConstantTimeEq;

use super::CounterKey;

/// The entity of every CountAPI counter.
pub const ENTITY: &str = "countapi";
/// The namespace of a key named without one, as CountAPI's.
pub const DEFAULT_NAMESPACE: &str = "default";
/// Namespaces a tenant may hold: `create` on a keyless gateway is open to
/// anyone, and each namespace is a record kept for good.
pub const MAX_NAMESPACES: u64 = 10_000;
/// Keys made by `create` (each a record of its rules) a tenant may hold.
pub const MAX_CREATED_KEYS: u64 = 100_000;

/// CountAPI's rule for a namespace or a key: `^[A-Za-z0-9_\-.]{3,64}$`.
pub fn validate(field: &str, value: &str) -> Result<(), String> {
    let len = value.chars().count();
    if !(3..=64).contains(&len) {
        return Err(format!(
            "{field} must be 3 to 64 characters of A-Z, a-z, 0-9, _, - and . (CountAPI's rule); {value:?} has {len}"
        ));
    }
    if let Some(c) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(format!(
            "{field} may hold only A-Z, a-z, 0-9, _, - and . (CountAPI's rule); {value:?} holds {c:?}"
        ));
    }
    Ok(())
}

/// The ordinary counter of `namespace`/`key`, both checked by CountAPI's rule.
pub fn counter_key(namespace: &str, key: &str) -> Result<CounterKey, String> {
    validate("namespace", namespace)?;
    validate("key", key)?;
    CounterKey::new(ENTITY, namespace, key)
}

/// The rules of a key, as `create` set them; a key first counted by `hit`
/// has the defaults (CountAPI's: no reset, `update` by -1 to 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyRules {
    /// `set` without the namespace's admin key.
    pub enable_reset: bool,
    /// The lowest `amount` of an `update`, at most 0.
    pub update_lowerbound: i64,
    /// The highest `amount` of an `update`, at least 0.
    pub update_upperbound: i64,
}

impl Default for KeyRules {
    fn default() -> Self {
        KeyRules {
            enable_reset: false,
            update_lowerbound: -1,
            update_upperbound: 1,
        }
    }
}

impl KeyRules {
    /// Checks the bounds as CountAPI did: the lower one at most 0, the
    /// upper one at least 0.
    pub fn new(enable_reset: bool, lower: i64, upper: i64) -> Result<KeyRules, String> {
        if lower > 0 {
            return Err(format!(
                "update_lowerbound must be 0 or less (an update may subtract at most its size); got {lower}"
            ));
        }
        if upper < 0 {
            return Err(format!(
                "update_upperbound must be 0 or more (an update may add at most it); got {upper}"
            ));
        }
        Ok(KeyRules {
            enable_reset,
            update_lowerbound: lower,
            update_upperbound: upper,
        })
    }

    /// Whether an `update` by `amount` is inside the bounds.
    pub fn allows(&self, amount: i64) -> bool {
        (self.update_lowerbound..=self.update_upperbound).contains(&amount)
    }
}

/// A namespace made by `create`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Namespace {
    pub name: String,
    /// SHA-256 of the admin key; the key itself is answered once, by the
    /// `create` that made the namespace, and kept nowhere.
    pub admin_key_sha256: [u8; 32],
    pub created_ms: i64,
}

impl Namespace {
    /// Whether `presented` is this namespace's admin key, compared as
    /// digests in constant time.
    pub fn admits(&self, presented: &str) -> bool {
        bool::from(super::digest(presented).ct_eq(&self.admin_key_sha256))
    }
}

/// A key made by `create`: its rules and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CreatedKey {
    pub rules: KeyRules,
    pub created_ms: i64,
}

/// What the store keeps of a CountAPI pair: its namespace's record and
/// its own, each absent when `create` did not make it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Records {
    pub namespace: Option<Namespace>,
    pub key: Option<CreatedKey>,
}

/// A key made by `create` with its namespace's record: what export writes
/// and import restores of CountAPI (`countapi` records), so a move to
/// another store keeps who may `set` and what `update` allows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRecord {
    pub namespace: Namespace,
    pub key: String,
    pub created: CreatedKey,
}

impl KeyRecord {
    /// Where export pages resume: (namespace, key), bytewise.
    pub fn cursor(&self) -> (String, String) {
        (self.namespace.name.clone(), self.key.clone())
    }
}

/// What a restore of [`KeyRecord`]s did, or why it did nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Restored {
    /// Every record is set: the namespace takes the record's admin key and
    /// the key its rules and times (importing sets, as it does counters).
    Applied,
    /// The record at this index would make the tenant hold more than
    /// [`MAX_NAMESPACES`] namespaces or [`MAX_CREATED_KEYS`] keys, as its
    /// `&str` says: nothing of the call was written.
    Full(usize, &'static str),
}

/// What a `create` asks the store to record, at once: the namespace (when
/// it has none: with this admin key's digest) and the key's rules.
#[derive(Clone, Debug)]
pub struct Creation {
    pub namespace: String,
    pub key: String,
    pub rules: KeyRules,
    /// Recorded only if the namespace has no record yet.
    pub admin_key_sha256: [u8; 32],
    pub now_ms: i64,
}

/// What became of a [`Creation`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Created {
    /// The key is recorded; `namespace` says whether its namespace was
    /// made by this creation (then its admin key is to be answered).
    Made { namespace: bool },
    /// The key has a record already: nothing was written.
    KeyExists,
    /// The tenant holds [`MAX_NAMESPACES`] namespaces (or
    /// [`MAX_CREATED_KEYS`] keys): nothing was written.
    Full(&'static str),
}

/// A new secret of 128 random bits in hex: an admin key, or a key `create`
/// names when none is given (then in UUID form, as CountAPI's were).
pub fn random_hex(bytes: usize) -> Result<String, String> {
    use ring::rand::SecureRandom;
    let mut buf = vec![0u8; bytes];
    ring::rand::SystemRandom::new()
        .fill(&mut buf)
        .map_err(|_| "the system's random source failed".to_string())?;
    Ok(super::to_hex(&buf))
}

/// A random key in UUID form (version 4), for a `create` that names none.
pub fn random_key() -> Result<String, String> {
    let h = random_hex(16)?;
    let mut b = h.into_bytes();
    b[12] = b'4';
    b[16] = b"89ab"[usize::from(b[16]) % 4];
    let s = String::from_utf8(b).expect("hex digits");
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &s[..8],
        &s[8..12],
        &s[12..16],
        &s[16..20],
        &s[20..]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_countapis_rule() {
        for ok in ["abc", "mysite.com", "a_b-c.d", &"x".repeat(64)] {
            assert!(validate("key", ok).is_ok(), "{ok}");
        }
        for (bad, says) in [
            ("ab", "has 2"),
            (&"x".repeat(65) as &str, "has 65"),
            ("a b", "' '"),
            ("a/b", "'/'"),
            ("vidé", "'é'"),
            ("a%5F", "'%'"),
        ] {
            let e = validate("key", bad).unwrap_err();
            assert!(e.contains(says) && e.starts_with("key"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_pair_is_one_counter_and_one_counter_one_pair() {
        let k = counter_key("mysite.com", "visits").unwrap();
        assert_eq!(
            (&*k.entity, &*k.action, &*k.uuid),
            ("countapi", "mysite.com", "visits")
        );
        assert_eq!(k.doc_id(), "countapi_mysite.com_visits");
        // `_` is escaped in the id: a_b/c and a/b_c stay apart.
        assert_ne!(
            counter_key("a_bb", "ccc").unwrap().doc_id(),
            counter_key("a", "bb_ccc")
                .map(|k| k.doc_id())
                .unwrap_or_default()
        );
        assert_ne!(
            counter_key("aaa_b", "ccc").unwrap().doc_id(),
            counter_key("aaa", "b_ccc").unwrap().doc_id()
        );
        assert!(counter_key("ab", "visits")
            .unwrap_err()
            .starts_with("namespace"));
    }

    #[test]
    fn rules_and_bounds() {
        let d = KeyRules::default();
        assert!(d.allows(1) && d.allows(-1) && d.allows(0) && !d.allows(2) && !d.allows(-2));
        assert!(KeyRules::new(false, 1, 5)
            .unwrap_err()
            .contains("update_lowerbound"));
        assert!(KeyRules::new(false, 0, -1)
            .unwrap_err()
            .contains("update_upperbound"));
        let r = KeyRules::new(true, 0, 10).unwrap();
        assert!(r.allows(10) && !r.allows(11) && !r.allows(-1));
    }

    #[test]
    fn the_admin_key_is_checked_by_its_digest() {
        let ns = Namespace {
            name: "mysite.com".into(),
            admin_key_sha256: crate::domain::digest("secret-1"),
            created_ms: 0,
        };
        assert!(ns.admits("secret-1"));
        assert!(!ns.admits("secret-2") && !ns.admits(""));
    }

    #[test]
    fn random_keys_are_valid_uuids_and_differ() {
        let a = random_key().unwrap();
        let b = random_key().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert!(validate("key", &a).is_ok());
        assert_eq!(&a[14..15], "4");
        assert_eq!(random_hex(16).unwrap().len(), 32);
    }
}
