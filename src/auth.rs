//! API keys: who may do what, on which tenant.
//!
//! A key has a role and is bound to one tenant (or `*`, every tenant). Keys
//! are configured by their SHA-256 digest, never in clear, so a leaked key
//! file or environment does not leak a key. One entry per line (or separated
//! by `;` in `COUNTER_GATEWAY_API_KEYS`):
//!
//! ```text
//! # role   tenant   sha256 of the key, hex
//! write    acme     9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
//! admin    *        60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752
//! ```

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use subtle::ConstantTimeEq;

use crate::tenant::validate_tenant;

/// What a key may do. `write` keys end up in public web pages, so they can
/// only add (increments, events, average samples); `read` keys read;
/// `admin` keys can do everything, deletes included. `public` keys end up
/// in web pages too, so they can only read counters whose keys they name
/// (the multi-read): they cannot list anything (top lists, targets,
/// reports), so a page learns nothing through one it could not already
/// name. A `read` key may do what a `public` key may.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    Write,
    Read,
    Admin,
    Public,
}

impl Role {
    /// Whether a key of this role may do what needs `needed`.
    pub fn allows(self, needed: Role) -> bool {
        self == needed || self == Role::Admin || (self == Role::Read && needed == Role::Public)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Write => "write",
            Role::Read => "read",
            Role::Admin => "admin",
            Role::Public => "public",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a configured key grants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub role: Role,
    /// `None`: every tenant (`*`).
    pub tenant: Option<String>,
    /// A short, non-secret name for logs and rate limits: the first 8 hex
    /// digits of the digest.
    pub id: String,
}

/// Every configured key, by the SHA-256 of the key.
#[derive(Default)]
pub struct Keys {
    by_digest: HashMap<[u8; 32], Grant>,
}

impl fmt::Debug for Keys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Keys({} configured)", self.by_digest.len())
    }
}

pub use crate::domain::{digest, digest_hex};

impl Keys {
    /// Parses entries `<role> <tenant|*> <sha256-hex>`, one per line or
    /// separated by `;`; blank lines and `#` comments are skipped. `source`
    /// names where they came from in errors.
    pub fn parse(text: &str, source: &str) -> Result<Keys, String> {
        let mut keys = Keys::default();
        keys.add(text, source)?;
        Ok(keys)
    }

    /// Adds the entries of `text` (see [`Keys::parse`]).
    pub fn add(&mut self, text: &str, source: &str) -> Result<(), String> {
        for (n, entry) in text.split(['\n', ';']).enumerate() {
            let entry = entry.split('#').next().unwrap_or_default().trim();
            if entry.is_empty() {
                continue;
            }
            let at = format!("{source}, entry {}", n + 1);
            let parts: Vec<&str> = entry.split_whitespace().collect();
            let [role, tenant, hex] = parts[..] else {
                return Err(format!(
                    "{at}: expected `<role> <tenant|*> <sha256-hex>`, got {} fields",
                    parts.len()
                ));
            };
            let role = match role {
                "write" => Role::Write,
                "read" => Role::Read,
                "admin" => Role::Admin,
                "public" => Role::Public,
                other => {
                    return Err(format!(
                        "{at}: role {other:?} is not one of write, read, admin, public"
                    ))
                }
            };
            let tenant = if tenant == "*" {
                None
            } else {
                validate_tenant(tenant).map_err(|e| format!("{at}: {e}"))?;
                Some(tenant.to_string())
            };
            let digest = parse_hex(hex).ok_or_else(|| {
                format!(
                    "{at}: the key must be given as its SHA-256, 64 hex digits (see `sha256sum`)"
                )
            })?;
            let grant = Grant {
                role,
                tenant,
                id: hex[..8].to_ascii_lowercase(),
            };
            if self.by_digest.insert(digest, grant).is_some() {
                return Err(format!("{at}: this key is configured twice"));
            }
        }
        Ok(())
    }

    /// Reads a key file (see [`Keys::parse`]).
    pub fn add_file(&mut self, path: &Path) -> Result<(), String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read --api-keys-file {}: {e}", path.display()))?;
        self.add(&text, &path.display().to_string())
    }

    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }

    pub fn len(&self) -> usize {
        self.by_digest.len()
    }

    /// What `presented` grants, if it is a configured key.
    ///
    /// The map is searched by the key's digest: timing can at most reveal
    /// something about a digest, from which no key can be learnt; the final
    /// comparison is constant-time all the same.
    pub fn check(&self, presented: &str) -> Option<&Grant> {
        let d = digest(presented);
        let (stored, grant) = self.by_digest.get_key_value(&d)?;
        bool::from(stored.ct_eq(&d)).then_some(grant)
    }
}

fn parse_hex(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, chunk) in s.as_bytes().chunks(2).enumerate() {
        let hi = (chunk[0] as char).to_digit(16)?;
        let lo = (chunk[1] as char).to_digit(16)?;
        out[i] = (hi * 16 + lo) as u8;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_is_sha256() {
        // `printf %s test | sha256sum`
        assert_eq!(
            digest_hex("test"),
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        );
    }

    #[test]
    fn keys_parse_check_and_refuse_bad_entries() {
        let text = format!(
            "# comment\nwrite acme {}\n\nadmin * {}  # ops\n",
            digest_hex("w-key"),
            digest_hex("a-key").to_uppercase()
        );
        let keys = Keys::parse(&text, "test").unwrap();
        assert_eq!(keys.len(), 2);
        let w = keys.check("w-key").unwrap();
        assert_eq!((w.role, w.tenant.as_deref()), (Role::Write, Some("acme")));
        assert_eq!(keys.check("a-key").unwrap().tenant, None);
        assert!(keys.check("w-key ").is_none());
        assert!(keys.check("").is_none());
        let semi = format!("read b {};write c {}", digest_hex("1"), digest_hex("2"));
        assert_eq!(Keys::parse(&semi, "env").unwrap().len(), 2);

        for (bad, says) in [
            ("write acme".to_string(), "fields"),
            (format!("owner acme {}", digest_hex("x")), "role"),
            (format!("write Acme {}", digest_hex("x")), "tenant"),
            ("write acme plaintext-key".to_string(), "SHA-256"),
            (format!("write a {0}\nread b {0}", digest_hex("x")), "twice"),
        ] {
            let e = Keys::parse(&bad, "f").unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn roles_allow_their_own_and_admin_everything() {
        assert!(Role::Write.allows(Role::Write));
        assert!(!Role::Write.allows(Role::Read));
        assert!(!Role::Read.allows(Role::Write));
        assert!(!Role::Read.allows(Role::Admin));
        for r in [Role::Write, Role::Read, Role::Admin] {
            assert!(Role::Admin.allows(r));
        }
    }

    #[test]
    fn a_public_key_reads_counters_by_key_and_nothing_else() {
        for needed in [Role::Write, Role::Read, Role::Admin] {
            assert!(!Role::Public.allows(needed), "{needed}");
        }
        assert!(Role::Public.allows(Role::Public));
        assert!(Role::Read.allows(Role::Public));
        assert!(Role::Admin.allows(Role::Public));
        assert!(!Role::Write.allows(Role::Public));
        let keys = Keys::parse(&format!("public acme {}", digest_hex("p")), "t").unwrap();
        assert_eq!(keys.check("p").unwrap().role, Role::Public);
    }
}
