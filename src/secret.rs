//! Waitpoint secrets: generated once, handed out once, stored only as SHA-256, compared in
//! constant time. Nothing in this crate writes or logs a plaintext secret.

use rand::Rng;
use sha2::{Digest, Sha256};

/// The environment variable holding the operator token (the spec's `CORTEX_WEBHOOK_TOKEN`):
/// read once by `waitpoint daemon`, kept only as its hash, and removed from every program the
/// daemon runs.
pub const OPERATOR_TOKEN_ENV: &str = "CORTEX_WEBHOOK_TOKEN";

/// The environment variable `cortex-signal` takes a waitpoint's secret from.
pub const SIGNAL_SECRET_ENV: &str = "CORTEX_SIGNAL_SECRET";

/// Every environment variable that can hold one of our secrets: a process the daemon or a
/// wrapper starts for someone else (an `onWake` command, a resumed harness, a job) gets none of
/// them.
pub const SECRET_ENVS: [&str; 2] = [OPERATOR_TOKEN_ENV, SIGNAL_SECRET_ENV];

/// A plaintext secret in hand: a sender's, on its way to being checked. It cannot be printed
/// (no `Display`, and `Debug` says `<redacted>`) nor serialised (no `Serialize`), so it cannot
/// reach a log line, a file or an error text by accident; it can only be checked against a
/// stored hash ([`Secret::verify`], constant time) or fingerprinted. Equality is the same
/// constant-time comparison of hashes.
#[derive(Clone)]
pub struct Secret(Held);

/// What a [`Secret`] holds: the plaintext as a sender sent it, or only its SHA-256, as a host
/// of a shared store hands a signal on to the host that applies it (`store::Forwarded`), so
/// the plaintext never leaves the process that received it.
#[derive(Clone)]
enum Held {
    Plain(String),
    Hashed(String),
}

impl Secret {
    pub fn new(plain: impl Into<String>) -> Self {
        Secret(Held::Plain(plain.into()))
    }

    /// A secret known only by its hex SHA-256 ([`hash`]); it verifies as the plaintext would.
    pub fn from_hash(sha256_hex: impl Into<String>) -> Self {
        Secret(Held::Hashed(sha256_hex.into()))
    }

    /// Its hex SHA-256, the only form of it that may be stored.
    pub fn sha256(&self) -> String {
        match &self.0 {
            Held::Plain(p) => hash(p),
            Held::Hashed(h) => h.clone(),
        }
    }

    /// Whether this is the secret `stored_hash` is the SHA-256 of ([`verify`]).
    pub fn verify(&self, stored_hash: &str) -> bool {
        match &self.0 {
            Held::Plain(p) => verify(p, stored_hash),
            Held::Hashed(h) => hashes_equal(h, stored_hash),
        }
    }

    /// The first 12 hex digits of its hash, for logs ([`fingerprint`]).
    pub fn fingerprint(&self) -> String {
        let mut h = self.sha256();
        h.truncate(12);
        h
    }

    /// The plaintext, for what must read it: parsing the public id a callback token starts
    /// with. Nothing that prints, logs or stores may be handed it. Empty for a secret known
    /// only by its hash.
    pub fn expose_secret(&self) -> &str {
        match &self.0 {
            Held::Plain(p) => p,
            Held::Hashed(_) => "",
        }
    }

    /// Whether it is empty (a request must carry one).
    pub fn is_empty(&self) -> bool {
        match &self.0 {
            Held::Plain(p) => p.is_empty(),
            Held::Hashed(h) => h.is_empty(),
        }
    }
}

/// Whether two hex SHA-256 hashes are the same, in constant time.
fn hashes_equal(a: &str, b: &str) -> bool {
    let (mut x, mut y) = ([0u8; 32], [0u8; 32]);
    hex::decode_to_slice(a, &mut x).is_ok()
        && hex::decode_to_slice(b, &mut y).is_ok()
        && constant_time_eq::constant_time_eq(&x, &y)
}

impl PartialEq for Secret {
    fn eq(&self, other: &Self) -> bool {
        other.verify(&self.sha256())
    }
}

impl Eq for Secret {}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Self {
        Secret::new(s)
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Self {
        Secret::new(s)
    }
}

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

/// Whether `candidate` is the secret whose hash is `stored_hash`. The candidate is hashed, the
/// stored hash decoded from hex (a malformed one matches nothing), and the two digests compared
/// with `constant_time_eq`, so timing reveals neither the secret nor the hash.
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

/// How many hex characters in a row look like a secret (every secret, and every callback
/// token's secret part, is 64 of them).
pub const SECRET_HEX_RUN: usize = 64;

/// The text a run of secret-like hex is replaced with.
pub const REDACTED: &[u8] = b"[redacted]";

/// Removes every run of [`SECRET_HEX_RUN`] or more hex characters from a byte stream, counting a
/// JSON `\u00XX` escape of a hex character as that character, so no secret survives in any
/// spelling. Streams: memory stays bounded however long the input or a run is.
#[derive(Debug, Default)]
pub struct HexRedactor {
    /// The current run's raw bytes, while it is still short of a secret's length.
    run: Vec<u8>,
    tokens: usize,
    /// The current run reached a secret's length: its marker is out, the rest is dropped.
    redacting: bool,
    /// A `\u00XX` escape being read.
    escape: Vec<u8>,
    /// Whether anything was redacted.
    pub redacted: bool,
}

impl HexRedactor {
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<u8>) {
        for &b in bytes {
            if !self.escape.is_empty() {
                self.escape.push(b);
                let e = &self.escape;
                let so_far_ok = match e.len() {
                    2 => b == b'u',
                    3 | 4 => b == b'0',
                    5 | 6 => b.is_ascii_hexdigit(),
                    _ => false,
                };
                if !so_far_ok {
                    let broken = std::mem::take(&mut self.escape);
                    self.end_run(out);
                    out.extend_from_slice(&broken);
                } else if e.len() == 6 {
                    let code =
                        u8::from_str_radix(std::str::from_utf8(&e[4..6]).unwrap_or("zz"), 16);
                    let escaped = std::mem::take(&mut self.escape);
                    match code {
                        Ok(c) if c.is_ascii_hexdigit() => self.token(&escaped, out),
                        _ => {
                            self.end_run(out);
                            out.extend_from_slice(&escaped);
                        }
                    }
                }
                continue;
            }
            if b == b'\\' {
                self.escape.push(b);
            } else if b.is_ascii_hexdigit() {
                self.token(&[b], out);
            } else {
                self.end_run(out);
                out.push(b);
            }
        }
    }

    /// Ends the input: a run still short of a secret's length is passed on.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        self.end_run(out);
        out.append(&mut self.escape);
    }

    fn token(&mut self, raw: &[u8], out: &mut Vec<u8>) {
        if self.redacting {
            return;
        }
        self.run.extend_from_slice(raw);
        self.tokens += 1;
        if self.tokens >= SECRET_HEX_RUN {
            out.extend_from_slice(REDACTED);
            self.run.clear();
            self.redacting = true;
            self.redacted = true;
        }
    }

    fn end_run(&mut self, out: &mut Vec<u8>) {
        if !self.redacting {
            out.append(&mut self.run);
        }
        self.run.clear();
        self.tokens = 0;
        self.redacting = false;
    }
}

/// [`HexRedactor`] over a whole buffer: the redacted bytes, and whether anything was redacted.
pub fn redact_hex_runs(bytes: &[u8]) -> (Vec<u8>, bool) {
    let mut r = HexRedactor::default();
    let mut out = Vec::with_capacity(bytes.len());
    r.feed(bytes, &mut out);
    r.finish(&mut out);
    (out, r.redacted)
}

/// A value from a request as it may be shown back in a refusal (reason, log, HTTP body): at
/// most 40 characters, and not at all when it holds a run of hex long enough to be a pasted
/// secret (16 or more in a row: even a cut-down one gives part of it away).
pub fn echo(value: &str) -> String {
    let mut run = 0;
    for c in value.chars() {
        run = if c.is_ascii_hexdigit() { run + 1 } else { 0 };
        if run >= 16 {
            return "(a value that looks like a secret; not shown)".to_owned();
        }
    }
    if value.chars().count() <= 40 {
        value.to_owned()
    } else {
        let head: String = value.chars().take(40).collect();
        format!("{head}…")
    }
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

#[cfg(test)]
mod redaction_tests {
    use super::*;

    #[test]
    fn a_secret_is_redacted_in_every_spelling_and_short_hex_is_left() {
        let s = generate();
        let escaped: String = s.chars().map(|c| format!("\\u{:04x}", c as u32)).collect();
        let mixed = format!("{}{}", &s[..10], &escaped[60..]);
        for text in [
            format!(r#"{{"secret":"{s}"}}"#),
            format!(r#"{{"\u0073ecret":"{escaped}"}}"#),
            format!(r#"["{s}", "{s}"]"#),
            format!("plain {mixed} text"),
        ] {
            let (out, changed) = redact_hex_runs(text.as_bytes());
            let out = String::from_utf8(out).unwrap();
            assert!(changed, "{text}");
            assert!(!out.contains(&s) && !out.contains(&escaped), "{out}");
            assert!(out.contains("[redacted]"), "{out}");
        }
        let git = "commit 0123456789abcdef0123456789abcdef01234567 and wp_0123456789ab";
        assert_eq!(
            redact_hex_runs(git.as_bytes()),
            (git.as_bytes().to_vec(), false)
        );
        // Streamed in pieces that cut runs and escapes, the same.
        let text = format!(r#"{{"secret":"{escaped}","x":"{s}"}}"#);
        let mut r = HexRedactor::default();
        let mut out = Vec::new();
        for piece in text.as_bytes().chunks(5) {
            r.feed(piece, &mut out);
        }
        r.finish(&mut out);
        assert_eq!(out, redact_hex_runs(text.as_bytes()).0);
    }

    #[test]
    fn echo_hides_a_pasted_secret_and_caps_the_rest() {
        assert_eq!(echo("wp_0123456789ab"), "wp_0123456789ab");
        assert!(echo(&generate()).contains("not shown"));
        assert_eq!(echo(&"x".repeat(50)).chars().count(), 41);
    }
}

#[cfg(test)]
mod secret_type_tests {
    use super::*;

    #[test]
    fn a_secret_checks_against_its_hash_and_never_prints() {
        let plain = generate();
        let s = Secret::new(plain.clone());
        assert!(s.verify(&hash(&plain)));
        assert!(!s.verify(&hash("other")));
        assert!(!s.verify("not hex"));
        assert_eq!(s.fingerprint(), fingerprint(&plain));
        let shown = format!("{s:?} {:?}", Some(&s));
        assert!(!shown.contains(&plain), "{shown}");
        assert_eq!(s, Secret::new(plain));
        assert_ne!(s, Secret::from("other"));
    }

    // Whether a type has a capability, asked without naming it in a bound: the inherent
    // method exists only when the bound holds; otherwise the blanket trait's answers.
    struct Probe<T>(T);
    trait Lacks {
        fn displays(&self) -> bool {
            false
        }
        fn serialises(&self) -> bool {
            false
        }
    }
    impl<T> Lacks for Probe<T> {}
    impl<T: std::fmt::Display> Probe<T> {
        fn displays(&self) -> bool {
            true
        }
    }
    impl<T: serde::Serialize> Probe<T> {
        fn serialises(&self) -> bool {
            true
        }
    }

    #[test]
    fn a_secret_can_be_neither_displayed_nor_serialised() {
        // The probe itself answers truly for a type that can.
        assert!(Probe(String::new()).displays() && Probe(String::new()).serialises());
        let s = Probe(Secret::from("abc"));
        assert!(!s.displays(), "Secret must not implement Display");
        assert!(!s.serialises(), "Secret must not implement Serialize");
    }
}
