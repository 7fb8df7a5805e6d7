//! Identifiers and secrets: `sbx_…` and `snap_…` ids and API keys, from the OS's random source.

const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

/// `len` random characters of a lowercase base32 alphabet.
pub fn random_token(len: usize) -> String {
    let mut bytes = vec![0u8; len];
    getrandom::fill(&mut bytes).expect("the kernel's random source is always available");
    bytes
        .iter()
        .map(|b| ALPHABET[(*b & 31) as usize] as char)
        .collect()
}

/// A new sandbox id, `sbx_` and 16 characters (80 random bits).
pub fn new_sandbox_id() -> String {
    format!("sbx_{}", random_token(16))
}

/// A new snapshot id, `snap_` and 16 characters (80 random bits).
pub fn new_snapshot_id() -> String {
    format!("snap_{}", random_token(16))
}

/// A new volume id.
pub fn new_volume_id() -> String {
    format!("vol_{}", random_token(16))
}

/// Whether `s` looks like a volume id.
pub fn is_volume_id(s: &str) -> bool {
    s.strip_prefix("vol_").is_some_and(|r| {
        !r.is_empty() && r.len() <= 64 && r.bytes().all(|b| b.is_ascii_alphanumeric())
    })
}

/// A new API key (`hk_` and 40 characters, 200 random bits).
pub fn new_api_key() -> String {
    format!("hk_{}", random_token(40))
}

/// A random u32 (for uid slot selection).
pub fn random_u32() -> u32 {
    let mut b = [0u8; 4];
    getrandom::fill(&mut b).expect("the kernel's random source is always available");
    u32::from_le_bytes(b)
}

/// Whether `s` looks like a sandbox id we could have issued.
pub fn is_sandbox_id(s: &str) -> bool {
    s.strip_prefix("sbx_").is_some_and(|r| {
        !r.is_empty() && r.len() <= 64 && r.bytes().all(|b| b.is_ascii_alphanumeric())
    })
}

/// Whether `s` looks like a snapshot id we could have issued.
pub fn is_snapshot_id(s: &str) -> bool {
    s.strip_prefix("snap_").is_some_and(|r| {
        !r.is_empty() && r.len() <= 64 && r.bytes().all(|b| b.is_ascii_alphanumeric())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_distinct_and_well_formed() {
        let a = new_sandbox_id();
        let b = new_sandbox_id();
        assert_ne!(a, b);
        assert!(is_sandbox_id(&a));
        assert!(!is_sandbox_id("sbx_../x"));
        assert!(!is_sandbox_id("snap_abc"));
        assert!(new_api_key().starts_with("hk_"));
        assert!(is_snapshot_id(&new_snapshot_id()));
        assert!(!is_snapshot_id("snap_../x"));
        assert!(!is_snapshot_id(&a));
    }
}
