//! SHA-256 of secrets: API keys and CountAPI's admin keys are kept only as
//! this digest, and a presented key is compared by its digest.

/// SHA-256 of `key`.
pub fn digest(key: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// SHA-256 of `key` in lowercase hex: what a key file holds for it.
pub fn digest_hex(key: &str) -> String {
    digest(key).iter().map(|b| format!("{b:02x}")).collect()
}
