//! Waitpoint secrets: generated once, handed out once, stored only as SHA-256, compared in
//! constant time. Nothing in this crate writes or logs a plaintext secret.

use rand::Rng;
use sha2::{Digest, Sha256};

/// A fresh secret: 32 random bytes as 64 lowercase hex characters.
pub fn generate() -> String {
    random_hex(32)
}

/// `n` random bytes as lowercase hex (also used for idempotency keys, which need no secrecy
/// but must not collide).
pub fn random_hex(n: usize) -> String {
    let mut bytes = vec![0u8; n];
    rand::rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// The stored form of a secret: hex SHA-256 of its text.
pub fn hash(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Whether `candidate` is the secret whose hash is `stored_hash`. Both sides are hashed first and
/// compared with `constant_time_eq`, so timing reveals neither the secret nor the hash.
pub fn verify(candidate: &str, stored_hash: &str) -> bool {
    let candidate = Sha256::digest(candidate.as_bytes());
    let mut stored = [0u8; 32];
    if hex::decode_to_slice(stored_hash, &mut stored).is_err() {
        return false;
    }
    constant_time_eq::constant_time_eq(candidate.as_slice(), &stored)
}

/// A short, safe fingerprint for logs and reasons: the first 12 hex characters of the hash.
pub fn fingerprint(secret: &str) -> String {
    hash(secret)[..12].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_accepts_the_secret_and_nothing_else() {
        let s = generate();
        assert_eq!(s.len(), 64);
        let h = hash(&s);
        assert!(verify(&s, &h));
        assert!(!verify(&generate(), &h));
        assert!(!verify(&s, "not hex"));
    }
}
